//! Missingness simulators (000 §6.1 following Muzellec et al. 2020; NOTES §8):
//! evaluation tools that turn a complete dataset into an incomplete one with a
//! known mechanism, so strategies can be compared against the ground truth.
//!
//! - **MCAR**: exactly ⌊rate·cells⌉ of the chosen columns' cells are masked,
//!   chosen uniformly without replacement (selection sampling, Knuth's
//!   Algorithm S, so no index array is held).
//! - **MAR** (logistic): half of the attributes stay observed and are the
//!   inputs x (standardised codes); every other attribute j is masked with
//!   probability sigmoid(w_jᵀx + b_j), w_j ~ N(0, 1) rescaled so the logits
//!   have unit standard deviation, and b_j fitted by bisection so that the
//!   mean probability equals the rate.
//! - **MNAR**: MAR as above (the logits use the inputs' true values), then the
//!   inputs themselves are masked MCAR at the same rate, so whether a cell is
//!   missing can depend on values that are not observed.
//!
//! They are seeded (reproducible for a seed and an input) and stream: memory
//! holds a batch and the MAR inputs' sums, not the table (issue 19). MAR's
//! bias is fitted on a histogram of its logits (8192 bins over ±12 standard
//! deviations: the achieved rate is within about 10⁻³ of the bias on the
//! exact logits). Evaluation tools, not release mechanisms; nothing they
//! output is private.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::nullif;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dpflow_udfs::domain::{BatchEncoder, EncodeExec};
use dpflow_udfs::noise::DpRng;
use rand::RngExt;
use serde::Serialize;

use super::{MissingError, Result};
use crate::dataset::Dataset;

/// Which mechanism to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum InjectMechanism {
    /// Missing completely at random.
    Mcar,
    /// Missing at random (logistic on the observed half of the attributes).
    Mar,
    /// Missing not at random (MAR, then the inputs masked MCAR).
    Mnar,
}

/// What to inject.
#[derive(Debug, Clone)]
pub struct InjectSpec {
    /// Mechanism.
    pub mechanism: InjectMechanism,
    /// Target fraction of masked cells among the masked columns.
    pub rate: f64,
    /// Columns to mask (MCAR: default all; MAR/MNAR: default a random half,
    /// the rest being the inputs).
    pub columns: Option<Vec<String>>,
    /// Seed (these are evaluation tools).
    pub seed: u64,
}

/// What was injected.
#[derive(Debug, Clone, Serialize)]
pub struct InjectReport {
    /// Mechanism.
    pub mechanism: InjectMechanism,
    /// Target rate.
    pub rate: f64,
    /// Rows.
    pub rows: u64,
    /// Columns masked by the mechanism proper.
    pub masked_columns: Vec<String>,
    /// MAR/MNAR inputs.
    pub inputs: Vec<String>,
    /// Newly masked cells per column (name, cells, fraction of rows).
    pub per_column: Vec<(String, u64, f64)>,
    /// Fraction of masked cells among `masked_columns`.
    pub achieved_rate: f64,
    /// Fraction of rows with no null in any domain column afterwards.
    pub complete_rows: f64,
}

/// The logistic function 1 / (1 + e^(−z)).
pub fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Exactly `k` of `n` positions in order, uniformly without replacement
/// (Knuth's Algorithm S): the state of a selection that runs across batches.
#[derive(Debug, Clone)]
struct Selection {
    n: u64,
    k: u64,
    seen: u64,
    chosen: u64,
}

impl Selection {
    fn new(n: u64, k: u64) -> Self {
        Self { n, k, seen: 0, chosen: 0 }
    }

    fn next(&mut self, rng: &mut DpRng) -> bool {
        let left = self.n - self.seen;
        let need = self.k - self.chosen;
        self.seen += 1;
        if need > 0 && rng.random_range(0..left) < need {
            self.chosen += 1;
            true
        } else {
            false
        }
    }
}

/// Streaming sums of the MAR inputs' codes: n, Σx_k and Σx_k·x_l (first pass).
#[derive(Debug, Clone)]
struct InputStats {
    n: u64,
    sum: Vec<f64>,
    cross: Vec<Vec<f64>>,
}

impl InputStats {
    fn new(k: usize) -> Self {
        Self { n: 0, sum: vec![0.0; k], cross: vec![vec![0.0; k]; k] }
    }

    fn add(&mut self, codes: &[&[u32]], inputs: &[usize]) {
        let rows = codes.first().map_or(0, |c| c.len());
        self.n += rows as u64;
        for (a, &ca) in inputs.iter().enumerate() {
            let xa = codes[ca];
            self.sum[a] += xa.iter().map(|&v| v as f64).sum::<f64>();
            for (b, &cb) in inputs.iter().enumerate().skip(a) {
                let xb = codes[cb];
                let s: f64 = xa.iter().zip(xb).map(|(&u, &v)| u as f64 * v as f64).sum();
                self.cross[a][b] += s;
            }
        }
    }

    /// Means and standard deviations (constant columns: sd 1), and the
    /// covariance of the standardised inputs.
    fn standardised(&self) -> (Vec<f64>, Vec<f64>, Vec<Vec<f64>>) {
        let n = self.n.max(1) as f64;
        let k = self.sum.len();
        let mean: Vec<f64> = self.sum.iter().map(|s| s / n).collect();
        let cov = |a: usize, b: usize| {
            let (a, b) = (a.min(b), a.max(b));
            self.cross[a][b] / n - mean[a] * mean[b]
        };
        let sd: Vec<f64> = (0..k).map(|a| if cov(a, a) > 0.0 { cov(a, a).sqrt() } else { 1.0 }).collect();
        let c = (0..k).map(|a| (0..k).map(|b| cov(a, b) / (sd[a] * sd[b])).collect()).collect();
        (mean, sd, c)
    }
}

/// Bins of the histogram of standardised logits that the bias is fitted on.
const Z_BINS: usize = 8192;
/// Logits beyond ±Z_RANGE standard deviations count in the end bins.
const Z_RANGE: f64 = 12.0;

/// One MAR/MNAR-masked column: the logit of row r is Σ_k w_k·x_k[r] + c
/// (the standardised inputs' weights folded into the codes), scaled to unit
/// standard deviation, plus the fitted bias.
#[derive(Debug, Clone)]
struct Logistic {
    column: usize,
    weights: Vec<f64>,
    offset: f64,
    bias: f64,
    histogram: Vec<f64>,
}

impl Logistic {
    fn logit(&self, codes: &[&[u32]], inputs: &[usize], r: usize) -> f64 {
        self.offset + self.weights.iter().zip(inputs).map(|(w, &c)| w * codes[c][r] as f64).sum::<f64>()
    }

    fn count(&mut self, codes: &[&[u32]], inputs: &[usize]) {
        let rows = codes.first().map_or(0, |c| c.len());
        for r in 0..rows {
            let z = self.logit(codes, inputs, r);
            let b = ((z + Z_RANGE) / (2.0 * Z_RANGE) * Z_BINS as f64).floor().clamp(0.0, (Z_BINS - 1) as f64);
            self.histogram[b as usize] += 1.0;
        }
    }

    /// The bias b with mean sigmoid(z + b) = rate over the histogram's bin centres.
    fn fit(&mut self, rate: f64) {
        let w = 2.0 * Z_RANGE / Z_BINS as f64;
        let centres: Vec<(f64, f64)> = self
            .histogram
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0.0)
            .map(|(i, n)| (-Z_RANGE + (i as f64 + 0.5) * w, *n))
            .collect();
        self.bias = fit_bias_weighted(&centres, rate);
        self.histogram = Vec::new();
    }
}

/// A run's decisions and state: which columns are masked, MCAR selections
/// (exact counts across batches) and the MAR logits. Masks are drawn row by
/// row in the stream's order, so a run is reproducible for a seed and a
/// fixed input order.
pub(crate) struct Masker {
    rng: DpRng,
    d: usize,
    rate: f64,
    mechanism: InjectMechanism,
    pub(crate) masked_columns: Vec<usize>,
    pub(crate) inputs: Vec<usize>,
    /// MCAR columns (MNAR: the inputs) and one selection over their cells, row-major.
    mcar: Option<(Vec<usize>, Selection)>,
    logistic: Vec<Logistic>,
}

impl Masker {
    /// Checks `spec` against the column names and chooses the masked columns
    /// and (MAR/MNAR) the inputs and their weights: nothing read yet.
    pub(crate) fn new(spec: &InjectSpec, names: &[&str]) -> Result<Self> {
        let d = names.len();
        if !(0.0..1.0).contains(&spec.rate) {
            return Err(MissingError::InjectRate(spec.rate));
        }
        let chosen: Option<Vec<usize>> = spec
            .columns
            .as_ref()
            .map(|cols| {
                cols.iter()
                    .map(|c| names.iter().position(|n| n == c).ok_or_else(|| MissingError::InjectColumn(c.clone())))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?;
        let mut rng = DpRng::unsafe_seeded(spec.seed);
        let (masked_columns, inputs) = match spec.mechanism {
            InjectMechanism::Mcar => (chosen.unwrap_or_else(|| (0..d).collect()), vec![]),
            InjectMechanism::Mar | InjectMechanism::Mnar => {
                if d < 2 {
                    return Err(MissingError::TooFewColumns);
                }
                let masked: Vec<usize> = match chosen {
                    Some(c) => c,
                    None => {
                        // A random half (rounded down) is masked; the rest are inputs.
                        let mut idx: Vec<usize> = (0..d).collect();
                        for i in (1..d).rev() {
                            let j = rng.random_range(0..=i);
                            idx.swap(i, j);
                        }
                        let mut m = idx[..d / 2].to_vec();
                        m.sort_unstable();
                        m
                    }
                };
                let inputs: Vec<usize> = (0..d).filter(|c| !masked.contains(c)).collect();
                if inputs.is_empty() {
                    return Err(MissingError::NoInputColumn);
                }
                (masked, inputs)
            }
        };
        let logistic = if inputs.is_empty() {
            vec![]
        } else {
            masked_columns
                .iter()
                .map(|&column| Logistic {
                    column,
                    weights: (0..inputs.len())
                        .map(|_| dpflow_udfs::noise::cauchy::standard_normal_sample(&mut rng))
                        .collect(),
                    offset: 0.0,
                    bias: 0.0,
                    histogram: vec![0.0; Z_BINS],
                })
                .collect()
        };
        Ok(Self { rng, d, rate: spec.rate, mechanism: spec.mechanism, masked_columns, inputs, mcar: None, logistic })
    }

    /// Whether the logits need the inputs' statistics (passes 1 and 2).
    fn needs_passes(&self) -> bool {
        !self.logistic.is_empty()
    }

    /// After the first pass: the weights on raw codes with the logits scaled
    /// to unit standard deviation (000 §6.1: w ~ N(0, 1) on standardised
    /// inputs), and the MCAR selections sized to the row count.
    fn prepare(&mut self, stats: &InputStats) {
        let n = stats.n;
        let (mean, sd, cov) = stats.standardised();
        for l in &mut self.logistic {
            let w = &l.weights;
            let var: f64 = (0..w.len()).map(|a| (0..w.len()).map(|b| w[a] * w[b] * cov[a][b]).sum::<f64>()).sum();
            let scale = if var > 0.0 { var.sqrt() } else { 1.0 };
            let raw: Vec<f64> = w.iter().zip(&sd).map(|(w, s)| w / s / scale).collect();
            l.offset = -raw.iter().zip(&mean).map(|(w, m)| w * m).sum::<f64>();
            l.weights = raw;
        }
        let mcar_cols: Vec<usize> = match self.mechanism {
            InjectMechanism::Mcar => self.masked_columns.clone(),
            InjectMechanism::Mnar => self.inputs.clone(),
            InjectMechanism::Mar => vec![],
        };
        if !mcar_cols.is_empty() {
            let cells = n * mcar_cols.len() as u64;
            let k = (self.rate * cells as f64).round() as u64;
            // One selection over the chosen columns' cells in row-major order.
            self.mcar = Some((mcar_cols, Selection::new(cells, k)));
        }
    }

    /// The masks of one batch of codes (`true` = make null), drawn row by row.
    fn masks(&mut self, codes: &[&[u32]]) -> Vec<Option<Vec<bool>>> {
        let rows = codes.first().map_or(0, |c| c.len());
        let mut out: Vec<Option<Vec<bool>>> = vec![None; self.d];
        if let Some((cols, _)) = &self.mcar {
            for &c in cols {
                out[c] = Some(vec![false; rows]);
            }
        }
        for l in &self.logistic {
            out[l.column] = Some(vec![false; rows]);
        }
        for r in 0..rows {
            if let Some((cols, sel)) = &mut self.mcar {
                for &c in cols.iter() {
                    if sel.next(&mut self.rng) {
                        out[c].as_mut().expect("allocated")[r] = true;
                    }
                }
            }
            for l in &self.logistic {
                let p = sigmoid(l.logit(codes, &self.inputs, r) + l.bias).clamp(0.0, 1.0);
                if self.rng.random_bool(p) {
                    out[l.column].as_mut().expect("allocated")[r] = true;
                }
            }
        }
        out
    }
}

/// Masks of one run: per domain column, `true` = make null.
#[cfg(test)]
pub(crate) struct Masks {
    pub(crate) masks: Vec<Option<Vec<bool>>>,
    pub(crate) masked_columns: Vec<usize>,
    pub(crate) inputs: Vec<usize>,
}

/// The masks for `codes` (one vector of codes per domain column), through
/// the same passes as a streamed run (the whole table as one batch).
#[cfg(test)]
pub(crate) fn masks_for(spec: &InjectSpec, names: &[&str], codes: &[Vec<u32>]) -> Result<Masks> {
    let mut m = Masker::new(spec, names)?;
    let view: Vec<&[u32]> = codes.iter().map(Vec::as_slice).collect();
    let mut stats = InputStats::new(m.inputs.len());
    stats.add(&view, &m.inputs);
    m.prepare(&stats);
    if m.needs_passes() {
        let inputs = m.inputs.clone();
        for l in &mut m.logistic {
            l.count(&view, &inputs);
            l.fit(spec.rate);
        }
    }
    let masks = m.masks(&view);
    Ok(Masks { masks, masked_columns: m.masked_columns.clone(), inputs: m.inputs.clone() })
}

/// The bias b with mean sigmoid(z + b) = rate over `z` (bisection; the mean
/// is increasing in b).
pub fn fit_bias(z: &[f64], rate: f64) -> f64 {
    let points: Vec<(f64, f64)> = z.iter().map(|&x| (x, 1.0)).collect();
    fit_bias_weighted(&points, rate)
}

/// [`fit_bias`] over weighted logits (z, weight), e.g. a histogram's bin
/// centres and counts.
pub fn fit_bias_weighted(points: &[(f64, f64)], rate: f64) -> f64 {
    let total: f64 = points.iter().map(|p| p.1).sum();
    let mean = |b: f64| points.iter().map(|(z, w)| w * sigmoid(z + b)).sum::<f64>() / total.max(f64::MIN_POSITIVE);
    let (mut lo, mut hi) = (-50.0, 50.0);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if mean(mid) < rate {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The domain-typed plan of the dataset's columns.
async fn typed_plan(
    ctx: &SessionContext,
    dataset: &Dataset,
    domain: &Arc<dpflow_udfs::domain::Domain>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let names: Vec<&str> = domain.names();
    let read_err = |source| MissingError::Read { location: dataset.location.clone(), source };
    let raw = dataset.raw(ctx).await?.select_columns(&names).map_err(read_err)?;
    let plan = raw.create_physical_plan().await.map_err(read_err)?;
    Ok(Arc::new(EncodeExec::typed(plan, domain.clone()).map_err(read_err)?))
}

/// Every batch of `plan`, partition after partition (a fixed order, so a
/// seeded run reproduces), each with its domain codes.
fn coded_batches(
    plan: Arc<dyn ExecutionPlan>,
    ctx: &SessionContext,
    domain: Arc<dpflow_udfs::domain::Domain>,
) -> impl futures::Stream<Item = datafusion::common::Result<(RecordBatch, RecordBatch)>> + Send + use<> {
    use futures::{StreamExt, TryStreamExt};
    let task = ctx.task_ctx();
    let parts = plan.output_partitioning().partition_count();
    let schema = plan.schema();
    let mut encoder = BatchEncoder::new(domain, &schema);
    futures::stream::iter(0..parts).map(move |p| plan.execute(p, task.clone())).try_flatten().map(move |b| {
        let b = b?;
        let e = match &mut encoder {
            Ok(e) => e.encode(&b).map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?,
            Err(e) => return Err(datafusion::error::DataFusionError::Execution(e.to_string())),
        };
        Ok((b, e))
    })
}

fn code_columns(encoded: &RecordBatch) -> Vec<&[u32]> {
    (0..encoded.num_columns())
        .map(|c| {
            encoded.column(c).as_any().downcast_ref::<datafusion::arrow::array::UInt32Array>().expect("codes").values()
                as &[u32]
        })
        .collect()
}

/// What the writing pass counted.
#[derive(Default)]
struct Counts {
    rows: u64,
    newly: Vec<u64>,
    masked: u64,
    complete: u64,
}

/// Reads the dataset (typed through its domain), injects missingness and
/// writes the result to `out` (Parquet or CSV by extension), streaming:
/// memory holds one batch and the MAR statistics, not the table. MCAR and
/// MNAR's input masks need the row count (a first pass); MAR needs the
/// inputs' means and covariance (the same pass) and the distribution of its
/// logits (a second pass, binned in 8192 bins to fit the bias). The
/// masks are drawn in a third pass, which writes. Returns what was done.
pub async fn inject(ctx: &SessionContext, dataset: &Dataset, spec: &InjectSpec, out: &str) -> Result<InjectReport> {
    use futures::{StreamExt, TryStreamExt};
    let domain = Arc::new(dataset.domain().clone());
    let names: Vec<&str> = domain.names();
    // Public checks before anything is read.
    let mut masker = Masker::new(spec, &names)?;
    let read_err = |source| MissingError::Read { location: dataset.location.clone(), source };
    // A plan per pass: a physical plan is not guaranteed to run twice.
    let plan = typed_plan(ctx, dataset, &domain).await?;
    // Pass 1: rows and the inputs' sums.
    let mut stats = InputStats::new(masker.inputs.len());
    let inputs = masker.inputs.clone();
    let schema = plan.schema();
    let mut s = std::pin::pin!(coded_batches(plan, ctx, domain.clone()));
    while let Some((_, e)) = s.try_next().await.map_err(read_err)? {
        stats.add(&code_columns(&e), &inputs);
    }
    masker.prepare(&stats);
    // Pass 2 (MAR/MNAR): the logits' histogram, then the bias.
    if masker.needs_passes() {
        let plan = typed_plan(ctx, dataset, &domain).await?;
        let mut s = std::pin::pin!(coded_batches(plan, ctx, domain.clone()));
        while let Some((_, e)) = s.try_next().await.map_err(read_err)? {
            let codes = code_columns(&e);
            for l in &mut masker.logistic {
                l.count(&codes, &inputs);
            }
        }
        for l in &mut masker.logistic {
            l.fit(spec.rate);
        }
    }
    // Pass 3: mask and write. Columns that can now hold nulls are nullable.
    let fields: Vec<_> = schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
    let out_schema = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
    let counts = Arc::new(parking_lot::Mutex::new(Counts { newly: vec![0; names.len()], ..Default::default() }));
    let masked_set = masker.masked_columns.clone();
    let report_masked = masked_set.clone();
    let (schema2, counts2) = (out_schema.clone(), counts.clone());
    let plan = typed_plan(ctx, dataset, &domain).await?;
    let masked = coded_batches(plan, ctx, domain.clone()).map(move |r| {
        let (b, e) = r?;
        let masks = masker.masks(&code_columns(&e));
        let mut c = counts2.lock();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(b.num_columns());
        for (i, array) in b.columns().iter().enumerate() {
            match &masks[i] {
                Some(m) => {
                    c.newly[i] += m.iter().enumerate().filter(|(r, x)| **x && array.is_valid(*r)).count() as u64;
                    if masked_set.contains(&i) {
                        c.masked += m.iter().filter(|x| **x).count() as u64;
                    }
                    columns.push(nullif(array, &BooleanArray::from(m.clone()))?);
                }
                None => columns.push(array.clone()),
            }
        }
        let result = RecordBatch::try_new(schema2.clone(), columns)?;
        c.rows += result.num_rows() as u64;
        c.complete += (0..result.num_rows()).filter(|&r| result.columns().iter().all(|a| a.is_valid(r))).count() as u64;
        Ok(result)
    });
    let stream = datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(out_schema, masked.boxed());
    crate::io::write_stream(ctx, out, Box::pin(stream)).await?;
    let c = counts.lock();
    let n = c.rows;
    Ok(InjectReport {
        mechanism: spec.mechanism,
        rate: spec.rate,
        rows: n,
        masked_columns: report_masked.iter().map(|&i| names[i].to_string()).collect(),
        inputs: inputs.iter().map(|&i| names[i].to_string()).collect(),
        per_column: (0..names.len())
            .filter(|&i| report_masked.contains(&i) || (spec.mechanism == InjectMechanism::Mnar && inputs.contains(&i)))
            .map(|i| (names[i].to_string(), c.newly[i], c.newly[i] as f64 / n.max(1) as f64))
            .collect(),
        achieved_rate: c.masked as f64 / (n * report_masked.len() as u64).max(1) as f64,
        complete_rows: c.complete as f64 / n.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mechanism: InjectMechanism, rate: f64, columns: Option<Vec<&str>>) -> InjectSpec {
        InjectSpec { mechanism, rate, columns: columns.map(|c| c.iter().map(|s| s.to_string()).collect()), seed: 3 }
    }

    /// x0, x1 inputs (sizes 3 and 4), y strongly dependent on them (size 5), z noise.
    fn table(n: usize) -> Vec<Vec<u32>> {
        let mut rng = DpRng::unsafe_seeded(11);
        let mut cols: Vec<Vec<u32>> = (0..4).map(|_| Vec::with_capacity(n)).collect();
        for _ in 0..n {
            let x0 = rng.random_range(0..3u32);
            let x1 = rng.random_range(0..4u32);
            let y = if rng.random_bool(0.7) { (x0 + x1) % 5 } else { rng.random_range(0..5u32) };
            cols[0].push(x0);
            cols[1].push(x1);
            cols[2].push(y);
            cols[3].push(rng.random_range(0..2u32));
        }
        cols
    }

    const NAMES: [&str; 4] = ["x0", "x1", "y", "z"];

    #[test]
    fn mcar_rate_is_exact() {
        for &(n, rate) in &[(1000usize, 0.1), (997, 0.3), (100_000, 0.2), (50, 0.0)] {
            let codes = table(n);
            let m = masks_for(&spec(InjectMechanism::Mcar, rate, None), &NAMES, &codes).unwrap();
            let masked: usize = m.masks.iter().flatten().map(|v| v.iter().filter(|b| **b).count()).sum();
            assert_eq!(masked as u64, (rate * (n * 4) as f64).round() as u64, "n={n} rate={rate}");
        }
        // Only the chosen columns.
        let codes = table(1000);
        let m = masks_for(&spec(InjectMechanism::Mcar, 0.25, Some(vec!["y"])), &NAMES, &codes).unwrap();
        assert!(m.masks[0].is_none() && m.masks[3].is_none());
        assert_eq!(m.masks[2].as_ref().unwrap().iter().filter(|b| **b).count(), 250);
    }

    #[test]
    fn mcar_cells_are_uniform() {
        // Each of 40 cells masked with probability k/40 over many seeds (chi-square on positions).
        let mut hits = vec![0u64; 40];
        let codes: Vec<Vec<u32>> = vec![vec![0; 10]; 4];
        let trials = 4000;
        for seed in 0..trials {
            let s = InjectSpec { mechanism: InjectMechanism::Mcar, rate: 0.25, columns: None, seed };
            let m = masks_for(&s, &NAMES, &codes).unwrap();
            for (c, mask) in m.masks.iter().enumerate() {
                for (r, &b) in mask.as_ref().unwrap().iter().enumerate() {
                    hits[r * 4 + c] += u64::from(b);
                }
            }
        }
        let expected = trials as f64 * 10.0 / 40.0;
        let chi2: f64 = hits.iter().map(|&h| (h as f64 - expected).powi(2) / expected).sum();
        // 39 df: P(χ² > 72.1) ≈ 0.001.
        assert!(chi2 < 72.1, "chi2={chi2}");
    }

    #[test]
    fn mar_and_mnar_rates_within_one_percent() {
        let n = 100_000;
        let codes = table(n);
        for mech in [InjectMechanism::Mar, InjectMechanism::Mnar] {
            for &rate in &[0.1, 0.2, 0.3] {
                let m = masks_for(&spec(mech, rate, Some(vec!["y", "z"])), &NAMES, &codes).unwrap();
                assert_eq!(m.inputs, vec![0, 1]);
                for &c in &m.masked_columns {
                    let f = m.masks[c].as_ref().unwrap().iter().filter(|b| **b).count() as f64 / n as f64;
                    assert!((f - rate).abs() < 0.01, "{mech:?} rate {rate}: column {c} has {f}");
                }
                if mech == InjectMechanism::Mnar {
                    // The inputs are masked MCAR at the same rate (exactly).
                    let k: usize =
                        m.inputs.iter().map(|&c| m.masks[c].as_ref().unwrap().iter().filter(|b| **b).count()).sum();
                    assert_eq!(k as u64, (rate * (2 * n) as f64).round() as u64);
                } else {
                    assert!(m.inputs.iter().all(|&c| m.masks[c].is_none()), "MAR inputs stay observed");
                }
            }
        }
    }

    /// Pearson χ² of independence of `mask` and `values` within each stratum,
    /// summed over strata (df summed too). Returns (χ², df).
    fn stratified_chi2(strata: &[u32], values: &[u32], mask: &[bool], k: usize) -> (f64, usize) {
        let s_max = *strata.iter().max().unwrap() as usize + 1;
        let mut table = vec![[0f64; 2]; s_max * k];
        for ((&s, &v), &m) in strata.iter().zip(values).zip(mask) {
            table[s as usize * k + v as usize][usize::from(m)] += 1.0;
        }
        let (mut chi2, mut df) = (0.0, 0);
        for s in 0..s_max {
            let rows = &table[s * k..(s + 1) * k];
            let n: f64 = rows.iter().map(|r| r[0] + r[1]).sum();
            if n == 0.0 {
                continue;
            }
            let col = [rows.iter().map(|r| r[0]).sum::<f64>(), rows.iter().map(|r| r[1]).sum::<f64>()];
            let used: Vec<&[f64; 2]> = rows.iter().filter(|r| r[0] + r[1] > 0.0).collect();
            for r in &used {
                let rn = r[0] + r[1];
                for j in 0..2 {
                    let e = rn * col[j] / n;
                    if e > 0.0 {
                        chi2 += (r[j] - e).powi(2) / e;
                    }
                }
            }
            df += used.len().saturating_sub(1);
        }
        (chi2, df)
    }

    #[test]
    fn mar_missingness_is_independent_of_the_masked_value_given_the_inputs() {
        let n = 100_000;
        let codes = table(n);
        let m = masks_for(&spec(InjectMechanism::Mar, 0.3, Some(vec!["y", "z"])), &NAMES, &codes).unwrap();
        let strata: Vec<u32> = (0..n).map(|r| codes[0][r] * 4 + codes[1][r]).collect();
        let mask = m.masks[2].as_ref().unwrap();
        let (chi2, df) = stratified_chi2(&strata, &codes[2], mask, 5);
        // Under independence χ² ~ χ²(df) (df = 12·4 = 48): mean 48, sd ≈ 9.8; 99.9% point ≈ 84.
        assert_eq!(df, 48);
        assert!(chi2 < 84.0, "MAR mask depends on y given the inputs: χ²={chi2} on {df} df");
        // Yet the mask does depend on y marginally (through the inputs): a real MAR, not MCAR.
        let (chi2_marginal, df_m) = stratified_chi2(&vec![0; n], &codes[2], mask, 5);
        assert!(chi2_marginal > 200.0, "expected marginal dependence, χ²={chi2_marginal} on {df_m} df");
    }

    #[test]
    fn bias_bisection_hits_the_rate() {
        let z: Vec<f64> = (0..1000).map(|i| (i as f64 / 100.0).sin() * 2.0).collect();
        for &rate in &[0.01, 0.2, 0.5, 0.9] {
            let b = fit_bias(&z, rate);
            let m = z.iter().map(|&x| sigmoid(x + b)).sum::<f64>() / z.len() as f64;
            assert!((m - rate).abs() < 1e-9);
        }
    }

    #[test]
    fn masks_carry_their_state_across_batches() {
        // The same run over one batch and over batches of 7 rows: identical masks (the MCAR
        // selection keeps its count across batches; the MAR draws go row by row).
        let n = 1000;
        let codes = table(n);
        for (mech, cols) in [
            (InjectMechanism::Mcar, None),
            (InjectMechanism::Mar, Some(vec!["y", "z"])),
            (InjectMechanism::Mnar, Some(vec!["y"])),
        ] {
            let sp = spec(mech, 0.3, cols);
            let whole = masks_for(&sp, &NAMES, &codes).unwrap();
            let mut m = Masker::new(&sp, &NAMES).unwrap();
            let view: Vec<&[u32]> = codes.iter().map(Vec::as_slice).collect();
            let mut stats = InputStats::new(m.inputs.len());
            for start in (0..n).step_by(7) {
                let end = (start + 7).min(n);
                let chunk: Vec<&[u32]> = view.iter().map(|c| &c[start..end]).collect();
                stats.add(&chunk, &m.inputs);
            }
            m.prepare(&stats);
            let inputs = m.inputs.clone();
            for l in &mut m.logistic {
                for start in (0..n).step_by(7) {
                    let chunk: Vec<&[u32]> = view.iter().map(|c| &c[start..(start + 7).min(n)]).collect();
                    l.count(&chunk, &inputs);
                }
                l.fit(0.3);
            }
            let mut joined: Vec<Option<Vec<bool>>> = vec![None; NAMES.len()];
            for start in (0..n).step_by(7) {
                let chunk: Vec<&[u32]> = view.iter().map(|c| &c[start..(start + 7).min(n)]).collect();
                for (c, mask) in m.masks(&chunk).into_iter().enumerate() {
                    if let Some(mask) = mask {
                        joined[c].get_or_insert_with(Vec::new).extend(mask);
                    }
                }
            }
            assert_eq!(joined, whole.masks, "{mech:?}");
        }
    }

    /// Nulls per column, rows, and the file's bytes.
    async fn nulls(ctx: &SessionContext, out: String) -> (Vec<usize>, usize, Vec<u8>) {
        let b = ctx.read_parquet(out.clone(), Default::default()).await.unwrap().collect().await.unwrap();
        let per: Vec<usize> = (0..4).map(|c| b.iter().map(|b| b.column(c).null_count()).sum()).collect();
        (per, b.iter().map(|b| b.num_rows()).sum(), std::fs::read(out).unwrap())
    }

    #[tokio::test]
    async fn inject_streams_batches_and_reproduces_for_a_seed() {
        use datafusion::prelude::SessionConfig;
        let dir = tempfile::tempdir().unwrap();
        let mut csv = String::from("x0,x1,y,z\n");
        let codes = table(5000);
        for ((x0, x1), (y, z)) in codes[0].iter().zip(&codes[1]).zip(codes[2].iter().zip(&codes[3])) {
            csv += &format!("{x0},{x1},{y},{z}\n");
        }
        std::fs::write(dir.path().join("t.csv"), csv).unwrap();
        std::fs::write(
            dir.path().join("t.yaml"),
            "columns:\n  - {name: x0, kind: integer, bounds: [0, 2]}\n  - {name: x1, kind: integer, bounds: [0, 3]}\n  \
             - {name: y, kind: integer, bounds: [0, 4]}\n  - {name: z, kind: integer, bounds: [0, 1]}\n",
        )
        .unwrap();
        let p = |f: &str| dir.path().join(f).display().to_string();
        let ds = Dataset::open("t", &p("t.csv"), None, &p("t.yaml")).unwrap();
        // Small batches over two partitions: the run streams, in a fixed partition order.
        let ctx =
            dpflow_udfs::session::dpflow_context(SessionConfig::new().with_batch_size(256).with_target_partitions(2));
        let sp = spec(InjectMechanism::Mcar, 0.2, None);
        let r = inject(&ctx, &ds, &sp, &p("a.parquet")).await.unwrap();
        assert_eq!(r.rows, 5000);
        let (per, rows, first) = nulls(&ctx, p("a.parquet")).await;
        assert_eq!(rows, 5000);
        assert_eq!(per.iter().sum::<usize>(), 4000, "exactly 20% of 20,000 cells");
        inject(&ctx, &ds, &sp, &p("a.parquet")).await.unwrap();
        let (per2, _, second) = nulls(&ctx, p("a.parquet")).await;
        assert_eq!((per, first), (per2, second), "the same seed writes the same file");
        // MAR: the inputs stay observed, the masked columns near the rate.
        let r =
            inject(&ctx, &ds, &spec(InjectMechanism::Mar, 0.3, Some(vec!["y", "z"])), &p("b.parquet")).await.unwrap();
        let (per, _, _) = nulls(&ctx, p("b.parquet")).await;
        assert_eq!((per[0], per[1]), (0, 0));
        for c in [2, 3] {
            assert!((per[c] as f64 / 5000.0 - 0.3).abs() < 0.03, "{per:?}");
        }
        assert!((r.achieved_rate - 0.3).abs() < 0.02, "{}", r.achieved_rate);
    }

    #[test]
    fn bad_input_is_refused() {
        let codes = table(10);
        assert!(masks_for(&spec(InjectMechanism::Mcar, 1.5, None), &NAMES, &codes).is_err());
        let e = masks_for(&spec(InjectMechanism::Mar, 0.1, Some(vec!["nope"])), &NAMES, &codes).err().unwrap();
        assert!(e.to_string().contains("nope"));
        assert!(masks_for(&spec(InjectMechanism::Mar, 0.1, Some(NAMES.to_vec())), &NAMES, &codes).is_err());
    }
}
