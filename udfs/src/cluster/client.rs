//! The client side: connecting to a scheduler (or starting one in this
//! process) and submitting physical plans to it.

use std::sync::Arc;
use std::time::Duration;

use ballista_core::extension::SessionConfigExt;
use datafusion::common::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;

use super::codec::ClusterPhysicalCodec;
use super::{Cluster, ClusterError, ClusterTarget, DEFAULT_CLUSTER_PARTITIONS};

/// How long a scheduler has to answer [`connect`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn connect(cluster: &Cluster, partitions: Option<usize>) -> Result<ClusterTarget, ClusterError> {
    let scheduler_url = match cluster {
        Cluster::Remote { host, port } => {
            let url = format!("http://{host}:{port}");
            let reach = async {
                let endpoint = tonic::transport::Endpoint::from_shared(url.clone()).ok()?;
                endpoint.connect_timeout(CONNECT_TIMEOUT).connect().await.ok()
            };
            match tokio::time::timeout(CONNECT_TIMEOUT, reach).await {
                Ok(Some(_)) => url,
                _ => return Err(ClusterError::Unreachable { url: cluster.to_string() }),
            }
        }
        Cluster::Standalone => super::process::start_standalone(standalone_executor_cores())
            .await
            .map_err(|e| ClusterError::Standalone(e.to_string()))?,
    };
    Ok(ClusterTarget::new(scheduler_url, cluster.clone(), partitions.unwrap_or(DEFAULT_CLUSTER_PARTITIONS)))
}

fn standalone_executor_cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Submits `plan` to `target`'s scheduler and streams the final stage's
/// partitions back, one after the other.
pub(super) async fn submit(
    plan: Arc<dyn ExecutionPlan>,
    ctx: &SessionContext,
    target: &ClusterTarget,
) -> Result<SendableRecordBatchStream> {
    let config = ctx.copied_config();
    let ballista = config.ballista_config();
    ballista_core::execution_plans::execute_physical_plan::<PhysicalPlanNode>(
        target.scheduler_url.clone(),
        &ballista,
        plan,
        &ClusterPhysicalCodec::default(),
        ctx.session_id(),
        config,
    )
    .await
}
