//! `KnnPassExec`: one pass of the partitioned kNN imputation
//! ([`super::pass`]) over each partition of a raw scan, on the engine (in
//! this process or as one task per partition on a cluster executor).
//!
//! Each partition outputs one batch of donee intervals per 64 Ki of them
//! (pass 2 only) and last one row holding its counts (pass 1) or partial
//! (pass 2) as JSON; [`KnnPassExec::decode`] reads them back. Its output is a
//! pure function of the partition's rows, so a retried task returns the same.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Float64Array, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef, UInt32Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{
    Boundedness, ChildrenPropertiesMode, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::pass::{
    ClassCount, ClassCounter, ClassCounts, Compiled, FirstDonor, GroupId, Imputer, Interval, KnnIndex, KnnRead,
    Partial, Reader, Rule, Waiting,
};

/// Which pass a [`KnnPassExec`] runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum KnnStage {
    /// Pass 1: per class, donors, donees and the first donor.
    Classes,
    /// Pass 2: impute, aggregate, and report what crosses partitions.
    Impute(Arc<KnnIndex>),
}

/// What the partitions of a [`KnnPassExec`] returned, gathered batch by
/// batch ([`KnnPassExec::decode`]); the donees' intervals go to a sink as
/// they arrive.
#[derive(Default)]
pub struct KnnPassOutput {
    /// Pass 1: per partition, its rows and its classes' chunks (by sequence number).
    rows: std::collections::BTreeMap<usize, u64>,
    classes: Vec<(usize, u32, Vec<ClassCount>)>,
    /// Pass 2: per partition, its partial (without firsts and carried donees).
    partials: Vec<Partial>,
    firsts: Vec<(usize, Vec<FirstDonor>)>,
    carried: Vec<(usize, Vec<Waiting>)>,
}

crate::protected_debug!(KnnPassOutput);

impl KnnPassOutput {
    /// Pass 1: per partition in partition order, its counts (`partitions`
    /// of them, each reported once).
    pub fn classes(mut self, partitions: usize) -> Result<Vec<ClassCounts>> {
        if self.rows.len() != partitions || self.rows.keys().enumerate().any(|(i, &p)| p != i) {
            return Err(internal("a partition of the imputation's first pass is missing"));
        }
        self.classes.sort_by_key(|(p, seq, _)| (*p, *seq));
        let mut out: Vec<ClassCounts> =
            self.rows.values().map(|&rows| ClassCounts { rows, classes: Vec::new() }).collect();
        for (p, _, chunk) in self.classes {
            out.get_mut(p).ok_or_else(|| internal("a class chunk of an unknown partition"))?.classes.extend(chunk);
        }
        Ok(out)
    }

    /// Pass 2: the partitions' partials, with their first donors and carried donees in row order.
    pub fn partials(self) -> Result<Vec<Partial>> {
        let mut partials = self.partials;
        let at = |partials: &mut Vec<Partial>, p: usize| -> Result<usize> {
            partials.iter().position(|x| x.partition == p).ok_or_else(|| internal("a chunk of an unknown partition"))
        };
        for (p, chunk) in self.firsts {
            let i = at(&mut partials, p)?;
            partials[i].firsts.extend(chunk);
        }
        for (p, chunk) in self.carried {
            let i = at(&mut partials, p)?;
            partials[i].carried.extend(chunk);
        }
        for x in &mut partials {
            x.firsts.sort_by_key(|f| f.row);
            x.carried.sort_by_key(|w| w.row);
        }
        Ok(partials)
    }
}

/// A partition's rows other than intervals: JSON, in chunks of at most
/// [`CHUNK`] items, so that no value of the binary column nears a message
/// limit (Ballista's Flight messages: 16 MiB by default).
#[derive(Serialize, Deserialize)]
enum Meta {
    /// Pass 1: the partition's rows.
    Rows(u64),
    /// Pass 1: a chunk of its classes, in order.
    Classes(u32, Vec<ClassCount>),
    /// Pass 2: its partial, without first donors and carried donees.
    Partial(Partial),
    /// Pass 2: a chunk of its first donors.
    Firsts(Vec<FirstDonor>),
    /// Pass 2: a chunk of its carried donees.
    Carried(Vec<Waiting>),
}

/// Items per JSON chunk.
const CHUNK: usize = 2048;

/// The operator.
#[derive(Debug)]
pub struct KnnPassExec {
    input: Arc<dyn ExecutionPlan>,
    read: Arc<KnnRead>,
    rules: Vec<Rule>,
    stage: KnnStage,
    properties: Arc<PlanProperties>,
}

/// Intervals per output batch.
const BATCH: usize = 1 << 16;

fn output_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("partition", DataType::UInt32, false),
        Field::new("number", DataType::UInt32, true),
        Field::new("class", DataType::UInt32, true),
        Field::new("donee", DataType::Float64, true),
        Field::new("donor", DataType::Float64, true),
        Field::new("meta", DataType::Binary, true),
    ]))
}

impl KnnPassExec {
    /// One pass over `input`, a raw scan whose partitions are contiguous
    /// stretches of the file in order (the caller checks).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, read: KnnRead, rules: Vec<Rule>, stage: KnnStage) -> Result<Self> {
        // Fail at plan time if a column is missing.
        Reader::new(&read, &rules, &input.schema())?;
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(output_schema()),
            input.output_partitioning().clone(),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(KnnPassExec { input, read: Arc::new(read), rules, stage, properties })
    }

    /// What it reads.
    pub fn read(&self) -> &KnnRead {
        &self.read
    }

    /// The imputed columns' rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Its pass.
    pub fn stage(&self) -> &KnnStage {
        &self.stage
    }

    /// Reads one output batch into `out`; its intervals go to `intervals`.
    pub fn decode(
        batch: &RecordBatch,
        out: &mut KnnPassOutput,
        intervals: &mut dyn FnMut(Interval) -> Result<()>,
    ) -> Result<()> {
        let bad = || internal("a kNN pass returned a batch it does not write");
        if batch.num_columns() != 6 {
            return Err(bad());
        }
        let part = batch.column(0).as_primitive_opt::<UInt32Type>().ok_or_else(bad)?;
        let number = batch.column(1).as_primitive_opt::<UInt32Type>().ok_or_else(bad)?;
        let class = batch.column(2).as_primitive_opt::<UInt32Type>().ok_or_else(bad)?;
        let donee = batch.column(3).as_primitive_opt::<Float64Type>().ok_or_else(bad)?;
        let donor = batch.column(4).as_primitive_opt::<Float64Type>().ok_or_else(bad)?;
        let meta = batch.column(5).as_binary_opt::<i32>().ok_or_else(bad)?;
        for r in 0..batch.num_rows() {
            if !meta.is_valid(r) {
                intervals((number.value(r), class.value(r), donee.value(r), donor.value(r)))?;
                continue;
            }
            let p = part.value(r) as usize;
            // The parser's message can quote the text: withheld.
            let parsed = serde_json::from_slice::<Meta>(meta.value(r)).map_err(|_| bad())?;
            match parsed {
                Meta::Rows(rows) => {
                    if out.rows.insert(p, rows).is_some() {
                        return Err(internal("a partition of the imputation's first pass came twice"));
                    }
                }
                Meta::Classes(seq, chunk) => out.classes.push((p, seq, chunk)),
                Meta::Partial(partial) => {
                    if partial.partition != p || out.partials.iter().any(|x| x.partition == p) {
                        return Err(internal("a partition of the imputation's second pass came twice"));
                    }
                    out.partials.push(partial)
                }
                Meta::Firsts(chunk) => out.firsts.push((p, chunk)),
                Meta::Carried(chunk) => out.carried.push((p, chunk)),
            }
        }
        Ok(())
    }
}

fn meta_batch(partition: usize, meta: &Meta) -> Result<RecordBatch> {
    let json = serde_json::to_vec(meta).map_err(|_| internal("a kNN pass's partial could not be written"))?;
    meta_row(partition, json)
}

fn meta_row(partition: usize, json: Vec<u8>) -> Result<RecordBatch> {
    let p = partition as u32;
    let cols: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from(vec![p])),
        Arc::new(UInt32Array::from(vec![None::<u32>])),
        Arc::new(UInt32Array::from(vec![None::<u32>])),
        Arc::new(Float64Array::from(vec![None::<f64>])),
        Arc::new(Float64Array::from(vec![None::<f64>])),
        Arc::new(BinaryArray::from(vec![Some(json.as_slice())])),
    ];
    Ok(RecordBatch::try_new(output_schema(), cols)?)
}

fn interval_batch(partition: usize, ivs: &[Interval]) -> Result<RecordBatch> {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from(vec![partition as u32; ivs.len()])),
        Arc::new(UInt32Array::from_iter_values(ivs.iter().map(|i| i.0))),
        Arc::new(UInt32Array::from_iter_values(ivs.iter().map(|i| i.1))),
        Arc::new(Float64Array::from_iter_values(ivs.iter().map(|i| i.2))),
        Arc::new(Float64Array::from_iter_values(ivs.iter().map(|i| i.3))),
        Arc::new(BinaryArray::from(vec![None::<&[u8]>; ivs.len()])),
    ];
    Ok(RecordBatch::try_new(output_schema(), cols)?)
}

fn internal(msg: &str) -> DataFusionError {
    DataFusionError::Internal(msg.into())
}

/// The file scan under `plan` (through single-child operators), or None.
fn file_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<&FileScanConfig> {
    if let Some(scan) = plan.downcast_ref::<DataSourceExec>() {
        return scan.data_source().downcast_ref::<FileScanConfig>();
    }
    match plan.children().as_slice() {
        [child] => file_scan(child),
        _ => None,
    }
}

fn group_id(group: &FileGroup) -> GroupId {
    group.files().first().map(|f| (f.object_meta.location.to_string(), f.range.as_ref().map_or(0, |r| r.start)))
}

/// The ids of the file groups of the scan under `plan`, in partition order
/// (empty when it does not scan files).
pub fn file_groups(plan: &Arc<dyn ExecutionPlan>) -> Vec<GroupId> {
    file_scan(plan).map_or_else(Vec::new, |c| c.file_groups.iter().map(group_id).collect())
}

/// `plan` re-planned to read only file group `partition` of its file scan,
/// as one partition, with that group's id; None when it does not scan files.
fn one_group(plan: &Arc<dyn ExecutionPlan>, partition: usize) -> Result<Option<(Arc<dyn ExecutionPlan>, GroupId)>> {
    if let Some(scan) = plan.downcast_ref::<DataSourceExec>() {
        let Some(conf) = scan.data_source().downcast_ref::<FileScanConfig>() else { return Ok(None) };
        let group =
            conf.file_groups.get(partition).cloned().ok_or_else(|| internal("a scan partition out of range"))?;
        let id = group_id(&group);
        let conf = FileScanConfigBuilder::from(conf.clone()).with_file_groups(vec![group]).build();
        let one: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(conf);
        return Ok(Some((one, id)));
    }
    let children = plan.children();
    let [child] = children.as_slice() else { return Ok(None) };
    let keeps = child.output_partitioning().partition_count() == plan.output_partitioning().partition_count()
        && plan.maintains_input_order().first().copied().unwrap_or(false);
    Ok(match one_group(child, partition)? {
        Some(_) if !keeps => {
            return Err(internal("a kNN pass reads its scan through an operator that merges or reorders partitions"));
        }
        Some((c, id)) => {
            let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
            Some((plan.clone().replace_children(vec![c], keep)?, id))
        }
        None => None,
    })
}

impl DisplayAs for KnnPassExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let pass = match self.stage {
            KnnStage::Classes => "classes",
            KnnStage::Impute(_) => "impute",
        };
        write!(f, "KnnPassExec: pass={pass}, imputed=[{}]", self.read.imputed.join(", "))
    }
}

impl ExecutionPlan for KnnPassExec {
    fn name(&self) -> &str {
        "KnnPassExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for (_, r) in &self.rules {
            if f(r)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .into_iter()
            .next()
            .ok_or_else(|| DataFusionError::Internal("KnnPassExec needs an input".into()))?;
        Ok(Arc::new(KnnPassExec::try_new(input, self.read.as_ref().clone(), self.rules.clone(), self.stage.clone())?))
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        // A file scan reads only this partition's file group (no sibling can
        // take its files: DataFusion's work stealing would reorder rows), and
        // the group says which partition of the plan this is: on a cluster a
        // task's scan holds only its own groups, numbered from 0.
        let (mut input, partition) = match one_group(&self.input, partition)? {
            Some((plan, id)) => {
                let global = match id {
                    Some(id) => self.read.groups.iter().position(|g| g.as_ref() == Some(&id)),
                    None => None,
                }
                .ok_or_else(|| internal("a partition of the scan is not one the plan was built for"))?;
                (plan.execute(0, context)?, global)
            }
            None => (self.input.execute(partition, context)?, partition),
        };
        let mut reader = Reader::new(&self.read, &self.rules, &self.input.schema())?;
        let read = self.read.clone();
        let stage = self.stage.clone();
        let run = async move {
            let mut out = Vec::new();
            match stage {
                KnnStage::Classes => {
                    let mut counter = ClassCounter::default();
                    while let Some(raw) = input.next().await {
                        let b = reader.read(&raw?)?;
                        counter.add(&reader, &b);
                    }
                    let counts = counter.finish();
                    out.push(meta_batch(partition, &Meta::Rows(counts.rows))?);
                    for (seq, chunk) in counts.classes.chunks(CHUNK).enumerate() {
                        out.push(meta_batch(partition, &Meta::Classes(seq as u32, chunk.to_vec()))?);
                    }
                }
                KnnStage::Impute(index) => {
                    let compiled = Compiled::new(&index.queries, &read);
                    let mut imputer = Imputer::new(&index, &compiled, partition)?;
                    let mut ivs: Vec<Interval> = Vec::new();
                    while let Some(raw) = input.next().await {
                        let b = reader.read(&raw?)?;
                        imputer.add(&reader, &b, &mut |iv| ivs.push(iv))?;
                        if ivs.len() >= BATCH {
                            out.push(interval_batch(partition, &ivs)?);
                            ivs.clear();
                        }
                    }
                    if !ivs.is_empty() {
                        out.push(interval_batch(partition, &ivs)?);
                    }
                    let mut partial = imputer.finish()?;
                    let (firsts, carried) = (std::mem::take(&mut partial.firsts), std::mem::take(&mut partial.carried));
                    out.push(meta_batch(partition, &Meta::Partial(partial))?);
                    for chunk in firsts.chunks(CHUNK) {
                        out.push(meta_batch(partition, &Meta::Firsts(chunk.to_vec()))?);
                    }
                    for chunk in carried.chunks(CHUNK) {
                        out.push(meta_batch(partition, &Meta::Carried(chunk.to_vec()))?);
                    }
                }
            }
            Ok::<_, DataFusionError>(futures::stream::iter(out.into_iter().map(Ok)))
        };
        let stream = futures::stream::once(run).try_flatten();
        // The scan under this operator decodes the input (Parquet, CSV):
        // a decoder's panic on a corrupt file ends the stream with an error.
        Ok(crate::unwind::catch_unwind(Box::pin(RecordBatchStreamAdapter::new(output_schema(), stream))))
    }
}
