//! `KnnDonorExec`: imputes the attributes A of every incomplete row from its
//! k donors (004 Def. 4.1, Ex. 4.2), in two passes over its input: the first
//! builds the donor index (classes, identifiers, donor values), the second
//! streams the rows out with imputed values, each row's first donor id and its
//! donee count. Memory holds the index and the donors' A values, not the rows.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, concat};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef, UInt32Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::index::{Assignment, KnnConfig, KnnRecords};

/// How the k donors' values become the imputed value (004 Ex. 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ImputeScheme {
    /// Copy the (first) donor's values (k = 1).
    #[default]
    Copy,
    /// Mean of the donors' numeric values.
    Mean,
    /// Most common value among the donors (ties: the nearest donor's).
    Majority,
}

/// What to impute and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnnSpec {
    /// Distance configuration; `attrs[i].name` are UInt32 code columns of the input.
    pub config: KnnConfig,
    /// The attributes A to impute (a row is complete when none of them is null).
    pub imputed: Vec<String>,
    /// Stable row identifier column (numeric, unique).
    pub rid: String,
    /// Imputation scheme.
    pub scheme: ImputeScheme,
}

/// The donor-search operator.
#[derive(Debug)]
pub struct KnnDonorExec {
    input: Arc<dyn ExecutionPlan>,
    spec: KnnSpec,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl KnnDonorExec {
    /// Creates the operator (input must be a single partition).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, spec: KnnSpec) -> Result<Self> {
        let in_schema = input.schema();
        for a in &spec.config.attrs {
            let f = in_schema.field_with_name(&a.name)?;
            if f.data_type() != &DataType::UInt32 {
                return Err(DataFusionError::Plan(format!("matching column {} must hold UInt32 codes", a.name)));
            }
        }
        for a in &spec.imputed {
            in_schema.field_with_name(a)?;
        }
        in_schema.field_with_name(&spec.rid)?;
        if spec.scheme == ImputeScheme::Copy && spec.config.k != 1 {
            return Err(DataFusionError::Plan("the copy scheme needs k = 1".into()));
        }
        let mut fields: Vec<Field> = in_schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        if spec.scheme == ImputeScheme::Mean {
            for f in fields.iter_mut() {
                if spec.imputed.contains(f.name()) {
                    *f = Field::new(f.name(), DataType::Float64, true);
                }
            }
        }
        fields.push(Field::new("donor_rid", DataType::Float64, true));
        fields.push(Field::new("donee_count", DataType::UInt32, false));
        let schema = Arc::new(Schema::new(fields));
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self { input, spec, schema, properties })
    }

    /// The spec.
    pub fn spec(&self) -> &KnnSpec {
        &self.spec
    }
}

impl DisplayAs for KnnDonorExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "KnnDonorExec: k={}, impute=[{}], scheme={:?}",
            self.spec.config.k,
            self.spec.imputed.join(", "),
            self.spec.scheme
        )
    }
}

fn rid_values(a: &ArrayRef) -> Result<Vec<f64>> {
    let f = cast(a, &DataType::Float64)?;
    let f = f.as_primitive::<Float64Type>();
    if f.null_count() > 0 {
        return Err(DataFusionError::Execution("the row identifier must not be null".into()));
    }
    Ok(f.values().to_vec())
}

/// Builds the donor index from batches (pass 1).
pub fn index_from_batches(spec: &KnnSpec, batches: &[RecordBatch]) -> Result<(KnnRecords, Vec<ArrayRef>)> {
    let mut rec = KnnRecords::default();
    let mut a_cols: Vec<Vec<ArrayRef>> = vec![Vec::new(); spec.imputed.len()];
    for b in batches {
        let schema = b.schema();
        let codes: Vec<&UInt32Array> = spec
            .config
            .attrs
            .iter()
            .map(|a| b.column(schema.index_of(&a.name).expect("checked")).as_primitive::<UInt32Type>())
            .collect();
        let rids = rid_values(b.column(schema.index_of(&spec.rid).expect("checked")))?;
        let a: Vec<&ArrayRef> = spec.imputed.iter().map(|n| b.column(schema.index_of(n).expect("checked"))).collect();
        for (r, &rid) in rids.iter().enumerate().take(b.num_rows()) {
            rec.keys.push(codes.iter().map(|c| c.value(r)).collect());
            rec.rid.push(rid);
            rec.complete.push(a.iter().all(|c| c.is_valid(r)));
        }
        for (i, c) in a.iter().enumerate() {
            a_cols[i].push((*c).clone());
        }
    }
    let values = a_cols
        .into_iter()
        .map(|parts| {
            let refs: Vec<&dyn Array> = parts.iter().map(|p| p.as_ref()).collect();
            if refs.is_empty() {
                Ok(datafusion::arrow::array::new_empty_array(&DataType::Null))
            } else {
                Ok(concat(&refs)?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let mut seen = std::collections::HashSet::new();
    for &r in &rec.rid {
        if !seen.insert(r.to_bits()) {
            return Err(DataFusionError::Execution(format!("row identifier {r} is not unique")));
        }
    }
    Ok((rec, values))
}

/// Imputed value of one donee from its donors (row indices into `values`).
fn impute_one(values: &ArrayRef, donors: &[usize], scheme: ImputeScheme) -> Result<ScalarValue> {
    if donors.is_empty() {
        return ScalarValue::try_from(values.data_type());
    }
    match scheme {
        ImputeScheme::Copy => ScalarValue::try_from_array(values, donors[0]),
        ImputeScheme::Mean => {
            let f = cast(values, &DataType::Float64)?;
            let f = f.as_primitive::<Float64Type>();
            let s: f64 = donors.iter().map(|&d| f.value(d)).sum();
            Ok(ScalarValue::Float64(Some(s / donors.len() as f64)))
        }
        ImputeScheme::Majority => {
            let vals: Vec<ScalarValue> =
                donors.iter().map(|&d| ScalarValue::try_from_array(values, d)).collect::<Result<_>>()?;
            let mut best = (0usize, 0usize);
            for (i, v) in vals.iter().enumerate() {
                let c = vals.iter().filter(|w| *w == v).count();
                if c > best.1 {
                    best = (i, c);
                }
            }
            Ok(vals[best.0].clone())
        }
    }
}

/// Output batch for input batch `b` whose first row is global row `row0`.
fn impute_batch(
    spec: &KnnSpec,
    schema: &SchemaRef,
    rec: &KnnRecords,
    asg: &Assignment,
    values: &[ArrayRef],
    b: &RecordBatch,
    row0: usize,
) -> Result<RecordBatch> {
    let n = b.num_rows();
    if row0 + n > rec.rid.len() {
        return Err(DataFusionError::Execution("the input changed between the two passes".into()));
    }
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (ci, f) in b.schema().fields().iter().enumerate() {
        if let Some(ai) = spec.imputed.iter().position(|x| x == f.name()) {
            let col = b.column(ci);
            let target = schema.field_with_name(f.name())?.data_type().clone();
            let mut vals = Vec::with_capacity(n);
            for r in 0..n {
                let global = row0 + r;
                if rec.complete[global] {
                    vals.push(ScalarValue::try_from_array(col, r)?.cast_to(&target)?);
                } else {
                    vals.push(impute_one(&values[ai], &asg.donors[global], spec.scheme)?.cast_to(&target)?);
                }
            }
            cols.push(ScalarValue::iter_to_array(vals)?);
        } else {
            cols.push(b.column(ci).clone());
        }
    }
    cols.push(Arc::new(Float64Array::from(
        (0..n).map(|r| asg.donors[row0 + r].first().map(|&d| rec.rid[d])).collect::<Vec<_>>(),
    )));
    cols.push(Arc::new(UInt32Array::from((0..n).map(|r| asg.donee_count[row0 + r]).collect::<Vec<_>>())));
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

impl ExecutionPlan for KnnDonorExec {
    fn name(&self) -> &str {
        "KnnDonorExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(KnnDonorExec::try_new(children.swap_remove(0), self.spec.clone())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.clone();
        let spec = self.spec.clone();
        let schema = self.schema.clone();
        let ctx = context.clone();
        let fut = async move {
            // Pass 1: index (only compact per-row data and the A columns are kept).
            let mut s1 = input.execute(partition, ctx.clone())?;
            let mut batches = Vec::new();
            while let Some(b) = s1.next().await {
                let b = b?;
                // Keep only what the index needs.
                let mut cols: Vec<ArrayRef> = Vec::new();
                let mut fields = Vec::new();
                for n in spec
                    .config
                    .attrs
                    .iter()
                    .map(|a| &a.name)
                    .chain(spec.imputed.iter())
                    .chain(std::iter::once(&spec.rid))
                {
                    let i = b.schema().index_of(n)?;
                    cols.push(b.column(i).clone());
                    fields.push(b.schema().field(i).clone());
                }
                batches.push(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?);
            }
            let (rec, values) = index_from_batches(&spec, &batches)?;
            drop(batches);
            let asg = Assignment::build(&spec.config, &rec);
            // Pass 2: stream rows out with imputed values.
            let s2 = input.execute(partition, ctx)?;
            let rec = Arc::new(rec);
            let asg = Arc::new(asg);
            let values = Arc::new(values);
            let stream = s2.scan(0usize, move |row0, b| {
                let start = *row0;
                let r = b.and_then(|b| {
                    *row0 += b.num_rows();
                    impute_batch(&spec, &schema, &rec, &asg, &values, &b, start)
                });
                futures::future::ready(Some(r))
            });
            Ok::<_, DataFusionError>(stream)
        };
        let stream = futures::stream::once(fut).map(|r| match r {
            Ok(s) => s.boxed(),
            Err(e) => futures::stream::iter(vec![Err(e)]).boxed(),
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream.flatten())))
    }
}
