//! `MarginalExec`: many marginals from one streaming scan, partition-parallel
//! (`Partial`, one accumulator per input partition) with a final merge
//! (`Final`, over the coalesced partial results) — the same two-phase shape as
//! DataFusion's `AggregateExec`, so a distributed executor can run it.

use std::fmt;
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, AsArray, ListArray, RecordBatch, StringArray, UInt32Array, UInt64Array};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::kernel::{FinishedCounts, MarginalAccumulator, MarginalConfig};

/// Phase of a marginal operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MarginalMode {
    /// Count one input partition.
    Partial,
    /// Merge partial results (single input partition).
    Final,
}

static OUTPUT_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("set_index", DataType::UInt32, false),
        Field::new("attributes", DataType::Utf8, false),
        Field::new("null_mode", DataType::Utf8, false),
        Field::new("observed_rows", DataType::UInt64, false),
        Field::new("counts", DataType::List(Arc::new(Field::new_list_field(DataType::UInt64, false))), false),
    ]))
});

/// The output schema of marginal operators: one row per marginal with its
/// dense count vector (first attribute varies slowest).
pub fn marginal_output_schema() -> SchemaRef {
    OUTPUT_SCHEMA.clone()
}

/// Physical operator computing dense marginal counts.
#[derive(Debug)]
pub struct MarginalExec {
    input: Arc<dyn ExecutionPlan>,
    config: MarginalConfig,
    mode: MarginalMode,
    properties: Arc<PlanProperties>,
}

impl MarginalExec {
    /// Creates the operator; `Final` needs a single-partition input in the output schema.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, config: MarginalConfig, mode: MarginalMode) -> Result<Self> {
        config.validate()?;
        if mode == MarginalMode::Partial {
            let schema = input.schema();
            for c in &config.columns {
                let f = schema
                    .field_with_name(&c.name)
                    .map_err(|_| DataFusionError::Plan(format!("marginal input has no encoded column {:?}", c.name)))?;
                if f.data_type() != &DataType::UInt32 {
                    return Err(DataFusionError::Plan(format!(
                        "marginal input column {:?} must be UInt32 codes, found {}",
                        c.name,
                        f.data_type()
                    )));
                }
            }
        }
        let partitions = match mode {
            MarginalMode::Partial => input.output_partitioning().partition_count(),
            MarginalMode::Final => 1,
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(marginal_output_schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self { input, config, mode, properties })
    }

    /// The configuration.
    pub fn config(&self) -> &MarginalConfig {
        &self.config
    }

    /// The phase.
    pub fn mode(&self) -> MarginalMode {
        self.mode
    }

    /// The input plan.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for MarginalExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let sets: Vec<String> = (0..self.config.sets.len())
            .map(|i| {
                format!(
                    "({}){}",
                    self.config.set_label(i),
                    match self.config.sets[i].mode {
                        super::NullMode::Cells => "",
                        super::NullMode::Observed => "[observed]",
                    }
                )
            })
            .collect();
        write!(f, "MarginalExec: mode={:?}, marginals=[{}]", self.mode, sets.join(", "))
    }
}

/// Builds the output batch from finished counts; the counts buffer becomes
/// the list values without a copy.
pub fn counts_to_batch(config: &MarginalConfig, results: FinishedCounts) -> Result<RecordBatch> {
    let FinishedCounts { values, offsets, observed } = results;
    let n = observed.len();
    if values.len() > i32::MAX as usize {
        return Err(DataFusionError::Execution("too many marginal cells for one batch".into()));
    }
    let offsets: Vec<i32> = offsets.iter().map(|&o| o as i32).collect();
    let list = ListArray::try_new(
        Arc::new(Field::new_list_field(DataType::UInt64, false)),
        OffsetBuffer::new(offsets.into()),
        Arc::new(UInt64Array::from(values)),
        None,
    )?;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(0..n as u32)),
        Arc::new(StringArray::from_iter_values((0..n).map(|i| config.set_label(i)))),
        Arc::new(StringArray::from_iter_values(config.sets.iter().map(|s| s.mode.as_str()))),
        Arc::new(UInt64Array::from(observed)),
        Arc::new(list),
    ];
    Ok(RecordBatch::try_new(marginal_output_schema(), columns)?)
}

/// Calls `f(set index, counts, observed)` for each row of an output batch,
/// with the counts borrowed from the batch (no copy).
pub fn for_each_counts(batch: &RecordBatch, mut f: impl FnMut(u32, &[u64], u64) -> Result<()>) -> Result<()> {
    let idx = batch.column(0).as_primitive::<UInt32Type>();
    let obs = batch.column(3).as_primitive::<UInt64Type>();
    let lists = batch.column(4).as_list::<i32>();
    let values = lists.values().as_primitive::<UInt64Type>().values();
    let offsets = lists.value_offsets();
    for r in 0..batch.num_rows() {
        f(idx.value(r), &values[offsets[r] as usize..offsets[r + 1] as usize], obs.value(r))?;
    }
    Ok(())
}

/// Reads an output batch back into (counts, observed) per set index.
pub fn batch_to_counts(batch: &RecordBatch) -> Result<Vec<(u32, Vec<u64>, u64)>> {
    let mut out = Vec::with_capacity(batch.num_rows());
    for_each_counts(batch, |i, counts, observed| {
        out.push((i, counts.to_vec(), observed));
        Ok(())
    })?;
    Ok(out)
}

impl ExecutionPlan for MarginalExec {
    fn name(&self) -> &str {
        "MarginalExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("MarginalExec has one child".into()));
        }
        Ok(Arc::new(MarginalExec::try_new(children.swap_remove(0), self.config.clone(), self.mode)?))
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        match self.mode {
            MarginalMode::Partial => vec![Distribution::UnspecifiedDistribution],
            MarginalMode::Final => vec![Distribution::SinglePartition],
        }
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![self.mode == MarginalMode::Partial]
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, context)?;
        let config = self.config.clone();
        let mode = self.mode;
        let input_schema = self.input.schema();
        let fut = async move {
            match mode {
                MarginalMode::Partial => {
                    let pos = config
                        .columns
                        .iter()
                        .map(|c| input_schema.index_of(&c.name))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    let mut acc = MarginalAccumulator::new(config.clone(), pos)?;
                    while let Some(batch) = input.next().await {
                        acc.update(&batch?)?;
                    }
                    counts_to_batch(&config, acc.finish_flat())
                }
                MarginalMode::Final => {
                    let mut acc = MarginalAccumulator::new(config.clone(), vec![])?;
                    while let Some(batch) = input.next().await {
                        // Merged from the partial batch's buffer, which is
                        // dropped before the next one is read.
                        for_each_counts(&batch?, |set, counts, observed| {
                            acc.merge_counts(set as usize, counts, observed)
                        })?;
                    }
                    counts_to_batch(&config, acc.finish_flat())
                }
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(marginal_output_schema(), futures::stream::once(fut))))
    }
}
