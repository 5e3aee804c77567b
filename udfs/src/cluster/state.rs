//! The session a dpflow scheduler and its executors decode and run plans
//! with: DataFusion's defaults, dpflow's planner and functions, the cluster
//! codecs, and object stores from the environment ([`super::stores`]).

use std::sync::Arc;

use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use datafusion::common::Result;
use datafusion::execution::SessionState;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use super::codec::{ClusterLogicalCodec, ClusterPhysicalCodec};
use super::stores::EnvStores;
use crate::session::DpflowQueryPlanner;

/// A Ballista session config carrying the cluster codecs.
pub fn cluster_config() -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_ballista_logical_extension_codec(Arc::new(ClusterLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(ClusterPhysicalCodec::default()))
}

/// Object stores from the environment (`file://`, `s3://` on first use).
pub fn cluster_runtime(_config: &SessionConfig) -> Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(EnvStores::default())).build_arc()
}

/// [`cluster_runtime`] whose spill files go to `work_dir` (an executor's
/// owner-only directory: spilled batches hold protected rows).
pub fn cluster_runtime_in(work_dir: &str) -> Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(EnvStores::default()))
        .with_temp_file_path(work_dir)
        .build_arc()
}

/// The functions dpflow's plans call beyond DataFusion's own.
pub fn dpflow_functions() -> Vec<ScalarUDF> {
    vec![ScalarUDF::from(crate::dp::KeyedHash::default())]
}

/// A session state for the scheduler (and the functions of the executors).
pub fn cluster_state(config: SessionConfig) -> Result<SessionState> {
    let runtime = cluster_runtime(&config)?;
    let mut functions: Vec<Arc<ScalarUDF>> = dpflow_functions().into_iter().map(Arc::new).collect();
    functions.extend(ballista_core::extension::ballista_scalar_functions());
    Ok(SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_query_planner(Arc::new(DpflowQueryPlanner))
        .with_scalar_functions(functions)
        .build())
}

/// The function registry executors decode task plans with.
pub fn cluster_functions() -> Result<BallistaFunctionRegistry> {
    Ok((&cluster_state(cluster_config())?).into())
}
