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
//! They are seeded (reproducible) and hold the data in memory: evaluation
//! tools, not release mechanisms; nothing they output is private.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{concat_batches, nullif};
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::collect;
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

/// Masks of one run: per domain column, `true` = make null.
pub(crate) struct Masks {
    pub(crate) masks: Vec<Option<Vec<bool>>>,
    pub(crate) masked_columns: Vec<usize>,
    pub(crate) inputs: Vec<usize>,
}

/// The logistic function 1 / (1 + e^(−z)).
pub fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Exactly `k` of `n` positions, uniformly without replacement (Algorithm S).
fn select_exact(rng: &mut DpRng, n: u64, k: u64) -> impl FnMut() -> bool + '_ {
    let mut seen = 0u64;
    let mut chosen = 0u64;
    move || {
        let left = n - seen;
        let need = k - chosen;
        seen += 1;
        if need > 0 && rng.random_range(0..left) < need {
            chosen += 1;
            true
        } else {
            false
        }
    }
}

/// MCAR masks over `columns` of an n-row table: exactly round(rate·n·|columns|) cells.
fn mcar(rng: &mut DpRng, n: usize, columns: &[usize], d: usize, rate: f64) -> Vec<Option<Vec<bool>>> {
    let cells = (n * columns.len()) as u64;
    let k = (rate * cells as f64).round() as u64;
    let mut masks: Vec<Option<Vec<bool>>> = vec![None; d];
    for &c in columns {
        masks[c] = Some(vec![false; n]);
    }
    let mut pick = select_exact(rng, cells, k);
    // Cell order: row-major over the chosen columns.
    for r in 0..n {
        for &c in columns {
            if pick() {
                masks[c].as_mut().expect("allocated")[r] = true;
            }
        }
    }
    masks
}

/// Bias b with mean sigmoid(z + b) = rate (bisection; the mean is increasing in b).
pub fn fit_bias(z: &[f64], rate: f64) -> f64 {
    let mean = |b: f64| z.iter().map(|&x| sigmoid(x + b)).sum::<f64>() / z.len() as f64;
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

/// Standardised input features (codes, mean 0, sd 1; constant columns are 0).
fn features(codes: &[Vec<u32>], inputs: &[usize], n: usize) -> Vec<Vec<f64>> {
    inputs
        .iter()
        .map(|&c| {
            let col = &codes[c];
            let mean = col.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = col.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let sd = if var > 0.0 { var.sqrt() } else { 1.0 };
            col.iter().map(|&v| (v as f64 - mean) / sd).collect()
        })
        .collect()
}

/// The masks for `codes` (one vector of codes per domain column).
pub(crate) fn masks_for(spec: &InjectSpec, names: &[&str], codes: &[Vec<u32>]) -> Result<Masks> {
    let d = names.len();
    let n = codes.first().map_or(0, Vec::len);
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
    match spec.mechanism {
        InjectMechanism::Mcar => {
            let cols = chosen.unwrap_or_else(|| (0..d).collect());
            Ok(Masks { masks: mcar(&mut rng, n, &cols, d, spec.rate), masked_columns: cols, inputs: vec![] })
        }
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
            let x = features(codes, &inputs, n);
            let mut masks: Vec<Option<Vec<bool>>> = vec![None; d];
            for &j in &masked {
                let w: Vec<f64> =
                    (0..inputs.len()).map(|_| dpflow_udfs::noise::cauchy::standard_normal_sample(&mut rng)).collect();
                let mut z: Vec<f64> = (0..n).map(|r| w.iter().zip(&x).map(|(wk, xk)| wk * xk[r]).sum()).collect();
                let mean = z.iter().sum::<f64>() / n.max(1) as f64;
                let sd = (z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n.max(1) as f64).sqrt();
                if sd > 0.0 {
                    z.iter_mut().for_each(|v| *v /= sd);
                }
                let b = fit_bias(&z, spec.rate);
                masks[j] = Some(z.iter().map(|&zi| rng.random_bool(sigmoid(zi + b).clamp(0.0, 1.0))).collect());
            }
            if spec.mechanism == InjectMechanism::Mnar {
                let m = mcar(&mut rng, n, &inputs, d, spec.rate);
                for c in &inputs {
                    masks[*c] = m[*c].clone();
                }
            }
            Ok(Masks { masks, masked_columns: masked, inputs })
        }
    }
}

/// Reads the dataset (typed through its domain), injects missingness and
/// writes the result to `out` (Parquet or CSV by extension). Returns what was done.
pub async fn inject(ctx: &SessionContext, dataset: &Dataset, spec: &InjectSpec, out: &str) -> Result<InjectReport> {
    let domain = Arc::new(dataset.domain().clone());
    let names: Vec<&str> = domain.names();
    let read_err = |source| MissingError::Read { location: dataset.location.clone(), source };
    let encode_err = |source| MissingError::Encode { location: dataset.location.clone(), source };
    let raw = dataset.raw(ctx).await?.select_columns(&names).map_err(read_err)?;
    let plan = raw.create_physical_plan().await.map_err(read_err)?;
    let typed: Arc<dyn datafusion::physical_plan::ExecutionPlan> =
        Arc::new(EncodeExec::typed(plan, domain.clone()).map_err(read_err)?);
    let schema = typed.schema();
    let batches = collect(typed, ctx.task_ctx()).await.map_err(read_err)?;
    let batch = concat_batches(&schema, &batches)?;
    drop(batches);
    let n = batch.num_rows();
    let mut encoder = BatchEncoder::new(domain.clone(), &schema).map_err(encode_err)?;
    let encoded = encoder.encode(&batch).map_err(encode_err)?;
    let codes: Vec<Vec<u32>> = (0..encoded.num_columns())
        .map(|c| {
            let a = encoded.column(c).as_any().downcast_ref::<datafusion::arrow::array::UInt32Array>().expect("codes");
            a.values().to_vec()
        })
        .collect();
    let masks = masks_for(spec, &names, &codes)?;

    // Apply: nullif(column, mask) keeps existing nulls and adds the new ones.
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    let mut per_column = Vec::new();
    let mut masked_cells = 0u64;
    for (c, array) in batch.columns().iter().enumerate() {
        match &masks.masks[c] {
            Some(m) => {
                let newly = m.iter().zip(0..n).filter(|(b, r)| **b && array.is_valid(*r)).count() as u64;
                if masks.masked_columns.contains(&c) {
                    masked_cells += m.iter().filter(|b| **b).count() as u64;
                }
                per_column.push((names[c].to_string(), newly, newly as f64 / n.max(1) as f64));
                columns.push(nullif(array, &BooleanArray::from(m.clone()))?);
            }
            None => columns.push(array.clone()),
        }
    }
    // Columns that can now hold nulls must be nullable in the output schema.
    let fields: Vec<_> = schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
    let out_schema = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
    let result = RecordBatch::try_new(out_schema.clone(), columns)?;
    let complete = (0..n).filter(|&r| result.columns().iter().all(|a| a.is_valid(r))).count();
    let stream = datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        out_schema,
        futures::stream::iter(vec![Ok(result)]),
    );
    crate::io::write_stream(ctx, out, Box::pin(stream)).await?;
    Ok(InjectReport {
        mechanism: spec.mechanism,
        rate: spec.rate,
        rows: n as u64,
        masked_columns: masks.masked_columns.iter().map(|&c| names[c].to_string()).collect(),
        inputs: masks.inputs.iter().map(|&c| names[c].to_string()).collect(),
        per_column,
        achieved_rate: masked_cells as f64 / (n * masks.masked_columns.len()).max(1) as f64,
        complete_rows: complete as f64 / n.max(1) as f64,
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
    fn bad_input_is_refused() {
        let codes = table(10);
        assert!(masks_for(&spec(InjectMechanism::Mcar, 1.5, None), &NAMES, &codes).is_err());
        let e = masks_for(&spec(InjectMechanism::Mar, 0.1, Some(vec!["nope"])), &NAMES, &codes).err().unwrap();
        assert!(e.to_string().contains("nope"));
        assert!(masks_for(&spec(InjectMechanism::Mar, 0.1, Some(NAMES.to_vec())), &NAMES, &codes).is_err());
    }
}
