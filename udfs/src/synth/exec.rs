//! `SyntheticExec`: streams synthetic rows from a sampling plan, in chunks,
//! partition-parallel. Memory is one chunk per partition, whatever the row count.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};

use super::plan::SamplingPlan;
use crate::domain::decoded_schema;
use crate::noise::DpRng;

/// Leaf operator generating `rows` synthetic rows.
#[derive(Debug)]
pub struct SyntheticExec {
    plan: Arc<SamplingPlan>,
    rows: u64,
    chunk_rows: usize,
    seed: u64,
    properties: Arc<PlanProperties>,
}

impl SyntheticExec {
    /// `rows` rows in `partitions` streams of chunks of `chunk_rows`. The seed
    /// drives sampling only (post-processing of DP outputs: it has no privacy role).
    pub fn try_new(
        plan: Arc<SamplingPlan>,
        rows: u64,
        partitions: usize,
        chunk_rows: usize,
        seed: u64,
    ) -> Result<Self> {
        plan.validate().map_err(|e| DataFusionError::Plan(e.to_string()))?;
        if chunk_rows == 0 || partitions == 0 {
            return Err(DataFusionError::Plan("chunk size and partitions must be positive".into()));
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(decoded_schema(&plan.domain)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self { plan, rows, chunk_rows, seed, properties })
    }

    /// The sampling plan.
    pub fn plan(&self) -> &Arc<SamplingPlan> {
        &self.plan
    }

    /// (rows, partitions, chunk rows, seed).
    pub fn params(&self) -> (u64, usize, usize, u64) {
        (self.rows, self.properties.partitioning.partition_count(), self.chunk_rows, self.seed)
    }

    /// Rows of partition `p`.
    fn partition_rows(&self, p: usize) -> (u64, u64) {
        let parts = self.properties.partitioning.partition_count() as u64;
        let base = self.rows / parts;
        let extra = self.rows % parts;
        let p = p as u64;
        let start = p * base + p.min(extra);
        let len = base + u64::from(p < extra);
        (start, len)
    }
}

impl DisplayAs for SyntheticExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SyntheticExec: rows={}, columns={}", self.rows, self.plan.domain.len())
    }
}

fn chunk_seed(seed: u64, chunk: u64) -> u64 {
    // SplitMix64 of (seed, chunk).
    let mut z = seed ^ chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl ExecutionPlan for SyntheticExec {
    fn name(&self) -> &str {
        "SyntheticExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return Err(DataFusionError::Internal("SyntheticExec has no children".into()));
        }
        Ok(self)
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let (start, len) = self.partition_rows(partition);
        let chunk = self.chunk_rows as u64;
        let plan = self.plan.clone();
        let seed = self.seed;
        let schema = decoded_schema(&plan.domain);
        // Chunk k covers rows [start + k·chunk, ...): its RNG depends only on the
        // global chunk position, so results do not depend on the partitioning.
        let chunks = len.div_ceil(chunk);
        let stream = futures::stream::iter(0..chunks).then(move |k| {
            let plan = plan.clone();
            async move {
                let first = start + k * chunk;
                let n = chunk.min(start + len - first) as usize;
                tokio::task::spawn_blocking(move || {
                    let mut rng = DpRng::unsafe_seeded(chunk_seed(seed, first));
                    plan.sample_batch(n, &mut rng)
                })
                .await
                .map_err(|e| DataFusionError::Execution(format!("sampling task failed: {e}")))?
                .map_err(|e| DataFusionError::Execution(e.to_string()))
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

use futures::StreamExt;
