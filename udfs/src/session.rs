//! Session wiring: a DataFusion session whose physical planner knows dpflow's
//! logical extension nodes.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::{QueryPlanner, SessionContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;

use crate::marginal::MarginalPlanner;

/// A query planner that adds dpflow's extension planners to DataFusion's.
#[derive(Debug, Default)]
pub struct DpflowQueryPlanner;

#[async_trait]
impl QueryPlanner for DpflowQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(MarginalPlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// A session context with dpflow's planner and the given config.
pub fn dpflow_context(config: SessionConfig) -> SessionContext {
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_query_planner(Arc::new(DpflowQueryPlanner))
        .build();
    SessionContext::new_with_state(state)
}
