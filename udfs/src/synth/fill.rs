//! `FillNullsExec`: imputation-first for synthesizers (000 §4.1) on encoded
//! codes. Each null code is replaced according to its column's rule: a
//! constant (a DP mode), a uniform draw from the column's values (random
//! imputation, data-independent), or a draw from a DP model's conditional
//! p(x_j | parents) given the row's (observed or already filled) parent codes,
//! following the model's sampling-plan order.
//!
//! Every rule is post-processing of DP outputs (or data-independent), so the
//! filled table may be measured by a synthesizer with no extra *noise*
//! budget; what imputation costs in stability is accounted by the caller
//! (000 Lemma 4.2 / Thm 4.3).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::plan::{PlanError, SamplingPlan};
use crate::domain::Domain;
use crate::noise::exact::uniform_below_u64;

/// How one column's nulls are filled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnFill {
    /// Left as is (non-nullable columns, or not imputed).
    Keep,
    /// Every null becomes this code.
    Constant(u32),
    /// Uniform over the column's value codes.
    Uniform,
    /// From the fill plan's step for this column.
    Model,
}

/// The imputation of every column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FillPlan {
    /// The data's domain (nullable columns have a null code).
    pub domain: Domain,
    /// One rule per domain column.
    pub fills: Vec<ColumnFill>,
    /// A model's sampling plan over the same columns *without* null codes
    /// (needed by [`ColumnFill::Model`]).
    pub model: Option<SamplingPlan>,
    /// Seed of the fill draws (post-processing; no privacy role).
    pub seed: u64,
}

impl FillPlan {
    /// Checks that the rules fit the domain.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.fills.len() != self.domain.len() {
            return Err(PlanError::FillRules { rules: self.fills.len(), columns: self.domain.len() });
        }
        for (c, f) in self.domain.columns().iter().zip(&self.fills) {
            match f {
                ColumnFill::Constant(v) if *v as usize >= c.size() => {
                    return Err(PlanError::FillConstant { code: *v, column: c.name.clone() });
                }
                ColumnFill::Model => {
                    let m = self.model.as_ref().ok_or(PlanError::FillModelMissing)?;
                    if m.domain.cardinalities() != self.domain.columns().iter().map(|c| c.size()).collect::<Vec<_>>() {
                        return Err(PlanError::FillModelDomain);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Fills one batch of codes (columns in domain order). `rng` drives the draws.
    pub fn fill<R: Rng + ?Sized>(&self, batch: &RecordBatch, rng: &mut R) -> Result<RecordBatch> {
        let mut cols: Vec<Vec<u32>> = (0..batch.num_columns())
            .map(|i| {
                batch
                    .column(i)
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .map(|a| a.values().to_vec())
                    .ok_or_else(|| DataFusionError::Internal("FillNullsExec expects code columns".into()))
            })
            .collect::<Result<_>>()?;
        let columns = self.domain.columns();
        for (j, f) in self.fills.iter().enumerate() {
            let Some(null) = columns[j].null_code() else { continue };
            let size = columns[j].size() as u64;
            match f {
                ColumnFill::Constant(v) => cols[j].iter_mut().filter(|c| **c == null).for_each(|c| *c = *v),
                ColumnFill::Uniform => {
                    for c in cols[j].iter_mut().filter(|c| **c == null) {
                        *c = uniform_below_u64(rng, size) as u32;
                    }
                }
                ColumnFill::Keep | ColumnFill::Model => {}
            }
        }
        if let Some(model) = &self.model {
            for step in &model.steps {
                let j = step.column;
                if self.fills[j] != ColumnFill::Model {
                    continue;
                }
                let Some(null) = columns[j].null_code() else { continue };
                let size = columns[j].size();
                let psizes: Vec<usize> = step.parents.iter().map(|&p| columns[p].size()).collect();
                for r in 0..cols[j].len() {
                    if cols[j][r] != null {
                        continue;
                    }
                    // Parents come earlier in the plan, so their codes are filled
                    // (or observed); a parent still null (kept) falls back to its first row.
                    let mut idx = 0usize;
                    for (&p, &ps) in step.parents.iter().zip(&psizes) {
                        let v = cols[p][r] as usize;
                        idx = idx * ps + if v < ps { v } else { 0 };
                    }
                    let probs = &step.table[idx * size..(idx + 1) * size];
                    cols[j][r] = draw(rng, probs) as u32;
                }
            }
        }
        let arrays: Vec<ArrayRef> = cols.into_iter().map(|c| Arc::new(UInt32Array::from(c)) as ArrayRef).collect();
        Ok(RecordBatch::try_new(batch.schema(), arrays)?)
    }
}

/// Inverse-CDF draw from unnormalised probabilities (uniform if all zero).
fn draw<R: Rng + ?Sized>(rng: &mut R, probs: &[f64]) -> usize {
    let total: f64 = probs.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return uniform_below_u64(rng, probs.len() as u64) as usize;
    }
    let u = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * total;
    let mut acc = 0.0;
    for (k, &p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return k;
        }
    }
    probs.iter().rposition(|&p| p > 0.0).unwrap_or(0)
}

/// Fills null codes of its input (codes of every domain column).
#[derive(Debug)]
pub struct FillNullsExec {
    input: Arc<dyn ExecutionPlan>,
    plan: Arc<FillPlan>,
}

impl FillNullsExec {
    /// A fill operator over `input` (an encoder's code output).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, plan: Arc<FillPlan>) -> Result<Self> {
        plan.validate().map_err(|e| DataFusionError::Plan(e.to_string()))?;
        if input.schema().fields().len() != plan.domain.len() {
            return Err(DataFusionError::Plan(format!(
                "FillNullsExec: input has {} columns, the domain {}",
                input.schema().fields().len(),
                plan.domain.len()
            )));
        }
        Ok(Self { input, plan })
    }

    /// The fill plan.
    pub fn plan(&self) -> &Arc<FillPlan> {
        &self.plan
    }
}

impl DisplayAs for FillNullsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let rules: Vec<String> = self
            .plan
            .domain
            .columns()
            .iter()
            .zip(&self.plan.fills)
            .filter(|(_, r)| **r != ColumnFill::Keep)
            .map(|(c, r)| format!("{}={r:?}", c.name))
            .collect();
        write!(f, "FillNullsExec: {}", rules.join(", "))
    }
}

impl ExecutionPlan for FillNullsExec {
    fn name(&self) -> &str {
        "FillNullsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
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

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("FillNullsExec has one child".into()));
        }
        Ok(Arc::new(FillNullsExec::try_new(children.swap_remove(0), self.plan.clone())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let plan = self.plan.clone();
        // One stream of draws per partition, derived from the plan's seed.
        let mut rng =
            rand::rngs::ChaCha20Rng::seed_from_u64(plan.seed ^ (partition as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let stream = input.map(move |b| plan.fill(&b?, &mut rng));
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Column, ColumnKind, OutOfDomain, encoded_schema};
    use crate::synth::SamplingStep;

    fn col(name: &str, n: usize, nullable: bool) -> Column {
        Column {
            name: name.into(),
            kind: ColumnKind::Categorical {
                values: (0..n).map(|i| format!("v{i}")).collect(),
                aliases: Default::default(),
            },
            nullable,
            null_tokens: vec![],
            out_of_domain: OutOfDomain::Error,
            not_applicable_when: None,
        }
    }

    fn batch(domain: &Domain, cols: Vec<Vec<u32>>) -> RecordBatch {
        let arrays: Vec<ArrayRef> = cols.into_iter().map(|c| Arc::new(UInt32Array::from(c)) as ArrayRef).collect();
        RecordBatch::try_new(encoded_schema(domain), arrays).unwrap()
    }

    #[test]
    fn constant_uniform_and_model_fills() {
        let domain = Domain::new(vec![col("a", 2, false), col("b", 3, true), col("c", 2, true)]).unwrap();
        let plain = Domain::new(vec![col("a", 2, false), col("b", 3, false), col("c", 2, false)]).unwrap();
        // c | a: a=0 → c=1 always; a=1 → c=0 always.
        let model = SamplingPlan {
            domain: plain,
            steps: vec![
                SamplingStep { column: 0, parents: vec![], table: vec![0.5, 0.5] },
                SamplingStep { column: 2, parents: vec![0], table: vec![0.0, 1.0, 1.0, 0.0] },
                SamplingStep { column: 1, parents: vec![], table: vec![1.0, 1.0, 1.0] },
            ],
            decode: Default::default(),
        };
        let n = 3000;
        let a: Vec<u32> = (0..n).map(|i| (i % 2) as u32).collect();
        let b: Vec<u32> = (0..n).map(|i| if i % 3 == 0 { 3 } else { 1 }).collect();
        let c: Vec<u32> = (0..n).map(|i| if i % 5 == 0 { 2 } else { (i % 2) as u32 }).collect();
        let input = batch(&domain, vec![a.clone(), b.clone(), c.clone()]);
        let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(1);
        for (fills, check) in [
            (vec![ColumnFill::Keep, ColumnFill::Constant(2), ColumnFill::Model], 0),
            (vec![ColumnFill::Keep, ColumnFill::Uniform, ColumnFill::Keep], 1),
        ] {
            let plan = FillPlan { domain: domain.clone(), fills, model: Some(model.clone()), seed: 0 };
            plan.validate().unwrap();
            let out = plan.fill(&input, &mut rng).unwrap();
            let get = |k: usize| out.column(k).as_any().downcast_ref::<UInt32Array>().unwrap().values().to_vec();
            let (ob, oc) = (get(1), get(2));
            // Observed cells never change.
            for i in 0..n {
                if b[i] != 3 {
                    assert_eq!(ob[i], b[i]);
                }
                if c[i] != 2 {
                    assert_eq!(oc[i], c[i]);
                }
            }
            if check == 0 {
                for i in 0..n {
                    if b[i] == 3 {
                        assert_eq!(ob[i], 2);
                    }
                    if c[i] == 2 {
                        assert_eq!(oc[i], 1 - a[i], "model fill follows p(c | a)");
                    }
                }
            } else {
                // Uniform over 3 values: 1000 nulls, chi-square with 2 df < 13.8 (p = 0.001).
                let mut h = [0f64; 3];
                for i in (0..n).filter(|i| b[*i] == 3) {
                    h[ob[i] as usize] += 1.0;
                }
                let e = 1000.0 / 3.0;
                let chi2: f64 = h.iter().map(|x| (x - e) * (x - e) / e).sum();
                assert!(chi2 < 13.8, "{h:?}");
                assert!(oc.contains(&2), "kept column keeps its nulls");
            }
        }
        let bad = FillPlan { domain: domain.clone(), fills: vec![ColumnFill::Keep; 2], model: None, seed: 0 };
        assert!(bad.validate().is_err());
        let bad = FillPlan {
            domain,
            fills: vec![ColumnFill::Keep, ColumnFill::Constant(3), ColumnFill::Keep],
            model: None,
            seed: 0,
        };
        assert!(bad.validate().is_err(), "the null code is not a value");
    }
}
