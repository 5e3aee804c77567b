//! `SyntheticExec`: streams synthetic rows from a sampling plan, in chunks,
//! partition-parallel. Memory is one chunk per partition, whatever the row count.
//!
//! The work is data, not a partition count: the operator's input is a small
//! in-memory table of chunk ranges, one row per partition, and partition `p`
//! generates the chunks its input partition names. A distributed scheduler
//! (Ballista) that restricts a task's plan to its partitions restricts that
//! table like any scan, so each task generates its own chunks and no other;
//! chunk `k` is always rows `[k·chunk, (k+1)·chunk)` drawn from a stream
//! seeded by its first row, so the rows do not depend on the partitioning
//! and a retried task regenerates the same rows.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use super::sampler::Sampler;
use crate::domain::decoded_schema;
use crate::noise::DpRng;

/// Operator generating `rows` synthetic rows, over its table of chunk ranges.
#[derive(Debug)]
pub struct SyntheticExec {
    plan: Arc<Sampler>,
    rows: u64,
    chunk_rows: usize,
    seed: u64,
    work: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

/// The schema of the chunk-range table: chunks `[first, end)`.
fn work_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("first_chunk", DataType::UInt64, false),
        Field::new("end_chunk", DataType::UInt64, false),
    ]))
}

impl SyntheticExec {
    /// `rows` rows in `partitions` streams of chunks of `chunk_rows`: whole
    /// chunks spread evenly over the partitions. The seed drives sampling
    /// only (post-processing of DP outputs: it has no privacy role).
    pub fn try_new(plan: Arc<Sampler>, rows: u64, partitions: usize, chunk_rows: usize, seed: u64) -> Result<Self> {
        if chunk_rows == 0 || partitions == 0 {
            return Err(DataFusionError::Plan("chunk size and partitions must be positive".into()));
        }
        let chunks = rows.div_ceil(chunk_rows as u64);
        let parts = partitions as u64;
        let schema = work_schema();
        let batches = (0..parts)
            .map(|p| {
                let range = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(UInt64Array::from(vec![p * chunks / parts])),
                        Arc::new(UInt64Array::from(vec![(p + 1) * chunks / parts])),
                    ],
                )?;
                Ok(vec![range])
            })
            .collect::<Result<Vec<_>>>()?;
        let work = MemorySourceConfig::try_new_exec(&batches, schema, None)?;
        Self::with_work(plan, rows, chunk_rows, seed, work)
    }

    /// Over an existing chunk-range table (a plan decoded, or restricted to
    /// some partitions by a scheduler).
    pub fn with_work(
        plan: Arc<Sampler>,
        rows: u64,
        chunk_rows: usize,
        seed: u64,
        work: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        plan.validate().map_err(|e| DataFusionError::Plan(e.to_string()))?;
        if chunk_rows == 0 {
            return Err(DataFusionError::Plan("chunk size must be positive".into()));
        }
        if work.schema() != work_schema() {
            return Err(DataFusionError::Plan("SyntheticExec: its input is not a chunk-range table".into()));
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(decoded_schema(plan.domain())),
            work.properties().output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self { plan, rows, chunk_rows, seed, work, properties })
    }

    /// What it samples from.
    pub fn plan(&self) -> &Arc<Sampler> {
        &self.plan
    }

    /// (rows, partitions, chunk rows, seed).
    pub fn params(&self) -> (u64, usize, usize, u64) {
        (self.rows, self.properties.partitioning.partition_count(), self.chunk_rows, self.seed)
    }
}

impl DisplayAs for SyntheticExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SyntheticExec: rows={}, columns={}", self.rows, self.plan.domain().len())
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
        vec![&self.work]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let [work] = children.as_slice() else {
            return Err(DataFusionError::Internal("SyntheticExec has one input".into()));
        };
        Ok(Arc::new(Self::with_work(self.plan.clone(), self.rows, self.chunk_rows, self.seed, work.clone())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let chunk = self.chunk_rows as u64;
        let rows = self.rows;
        let last = rows.div_ceil(chunk);
        let plan = self.plan.clone();
        let seed = self.seed;
        let schema = decoded_schema(plan.domain());
        let ranges = self.work.execute(partition, context)?;
        // The chunk indices this partition's ranges name, in order.
        let chunks = ranges
            .map_ok(move |b: RecordBatch| {
                let (first, end) = (b.column(0).as_primitive::<UInt64Type>(), b.column(1).as_primitive::<UInt64Type>());
                let ranges: Vec<(u64, u64)> =
                    first.values().iter().zip(end.values().iter()).map(|(&f, &e)| (f, e.min(last))).collect();
                futures::stream::iter(ranges.into_iter().flat_map(|(f, e)| f..e).map(Ok::<u64, DataFusionError>))
            })
            .try_flatten();
        // Chunk k covers rows [k·chunk, (k+1)·chunk) and its random stream is
        // seeded by its first row alone: the rows (as a multiset) depend on
        // the seed, not on the partitioning, and a partition that runs twice
        // (a task retried on a cluster) yields the same rows.
        let stream = chunks.and_then(move |k| {
            let plan = plan.clone();
            async move {
                let first = k * chunk;
                let n = chunk.min(rows - first) as usize;
                tokio::task::spawn_blocking(move || {
                    let mut rng = DpRng::unsafe_seeded(chunk_seed(seed, first));
                    plan.sample_batch(n, &mut rng)
                })
                .await
                .map_err(|e| DataFusionError::Execution(format!("sampling task failed: {e}")))?
                .map_err(|e| DataFusionError::Execution(e.to_string()))
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream.boxed())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DecodeMode;
    use crate::domain::{Column, Domain};
    use crate::synth::plan::{SamplingPlan, SamplingStep};
    use datafusion::arrow::util::pretty::pretty_format_batches;

    fn plan() -> Arc<Sampler> {
        let col = Column::categorical;
        let domain = Domain::new(vec![col("a", &["x", "y", "z"]), col("b", &["u", "v"])]).unwrap();
        Arc::new(Sampler::Marginal(SamplingPlan {
            domain,
            steps: vec![
                SamplingStep { column: 0, parents: vec![], table: vec![0.2, 0.3, 0.5] },
                SamplingStep { column: 1, parents: vec![0], table: vec![0.9, 0.1, 0.5, 0.5, 0.1, 0.9] },
            ],
            decode: DecodeMode::Uniform,
        }))
    }

    /// Every row, as text, sorted: the multiset of rows.
    async fn rows(parts: usize, chunk: usize, rows: u64) -> Vec<String> {
        seeded_rows(parts, chunk, rows, 7).await
    }

    async fn seeded_rows(parts: usize, chunk: usize, rows: u64, seed: u64) -> Vec<String> {
        let exec = Arc::new(SyntheticExec::try_new(plan(), rows, parts, chunk, seed).unwrap());
        let ctx = datafusion::prelude::SessionContext::new();
        let mut all = Vec::new();
        for p in 0..parts {
            let batches: Vec<_> =
                futures::TryStreamExt::try_collect(exec.execute(p, ctx.task_ctx()).unwrap()).await.unwrap();
            let text = pretty_format_batches(&batches).unwrap().to_string();
            all.extend(text.lines().filter(|l| l.starts_with("| ") && !l.contains(" a ")).map(String::from));
        }
        all.sort();
        all
    }

    #[tokio::test]
    async fn the_rows_do_not_depend_on_the_partitioning() {
        for (total, chunk) in [(1000u64, 64usize), (1024, 64), (5, 64), (130, 7)] {
            let one = rows(1, chunk, total).await;
            assert_eq!(one.len() as u64, total);
            for parts in [2, 3, 16] {
                assert_eq!(
                    rows(parts, chunk, total).await,
                    one,
                    "{total} rows in chunks of {chunk}, {parts} partitions"
                );
            }
        }
        // A partition run twice (a retried task) gives the same rows.
        let exec = Arc::new(SyntheticExec::try_new(plan(), 500, 3, 16, 9).unwrap());
        let ctx = datafusion::prelude::SessionContext::new();
        let run = || async {
            let b: Vec<_> = futures::TryStreamExt::try_collect(exec.execute(1, ctx.task_ctx()).unwrap()).await.unwrap();
            pretty_format_batches(&b).unwrap().to_string()
        };
        assert_eq!(run().await, run().await);
        // Another seed gives other rows.
        assert_ne!(rows(2, 64, 1000).await, seeded_rows(2, 64, 1000, 8).await);
    }
}
