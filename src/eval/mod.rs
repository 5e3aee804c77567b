//! Utility metrics (NOTES §10): workload error (001 Def. 2 as coded: mean over
//! workload marginals of ½‖M_r(D)/|D| − M_r(D̂)/|D̂|‖₁) and the k-way marginal
//! distance (000 §6.1: the same over all k-attribute combinations).
//!
//! These compare against the real data: they are curator-side evaluation
//! tools, not private releases.

mod error;
pub mod inspect;
pub mod ml;

use datafusion::execution::context::SessionContext;
pub use error::{EvalError, Result};
use itertools::Itertools;
use serde::Serialize;

use crate::dataset::Dataset;
use crate::synth::Workload;
use crate::synth::run::exact_answers;

/// An evaluation report.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// Always present.
    pub notice: &'static str,
    /// Workload spec.
    pub workload: String,
    /// Mean ½-L1 (TVD) over the workload's marginals.
    pub workload_error: f64,
    /// Mean TVD over all 1-way marginals.
    pub tvd_1way: f64,
    /// Mean TVD over all 2-way marginals.
    pub tvd_2way: f64,
    /// Mean TVD over all 3-way marginals (if there are ≥ 3 columns).
    pub tvd_3way: Option<f64>,
    /// Rows of each input.
    pub rows_real: f64,
    /// Rows of the synthetic data.
    pub rows_synthetic: f64,
}

/// Total variation distance of two count vectors after normalising each.
pub fn tvd(a: &[f64], b: &[f64]) -> f64 {
    let sa: f64 = a.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let sb: f64 = b.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    0.5 * a.iter().zip(b).map(|(x, y)| (x / sa - y / sb).abs()).sum::<f64>()
}

/// All k-subsets of 0..d in lexicographic order.
fn combos(d: usize, k: usize) -> Vec<Vec<usize>> {
    (0..d).combinations(k).collect()
}

/// Evaluates synthetic against real data on a workload and on all 1/2/3-way marginals.
pub async fn evaluate(ctx: &SessionContext, real: &Dataset, synth: &Dataset, workload: &str) -> Result<EvalReport> {
    let d = real.domain().len();
    let w = Workload::parse(workload, real.domain())?;
    let mut sets: Vec<Vec<usize>> = w.queries.iter().map(|q| q.attrs.clone()).collect();
    for k in 1..=3.min(d) {
        for c in combos(d, k) {
            if !sets.contains(&c) {
                sets.push(c);
            }
        }
    }
    let a = exact_answers(ctx, real, &sets).await?;
    let b = exact_answers(ctx, synth, &sets).await?;
    let mean = |qs: &[Vec<usize>]| -> Result<f64> {
        let mut s = 0.0;
        for q in qs {
            s += tvd(a.get(q)?, b.get(q)?);
        }
        Ok(s / qs.len().max(1) as f64)
    };
    let wq: Vec<Vec<usize>> = w.queries.iter().map(|q| q.attrs.clone()).collect();
    let weights: Vec<f64> = w.queries.iter().map(|q| q.weight).collect();
    let wsum: f64 = weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let mut werr = 0.0;
    for (q, c) in wq.iter().zip(&weights) {
        werr += c * tvd(a.get(q)?, b.get(q)?);
    }
    Ok(EvalReport {
        notice: inspect::CURATOR_NOTICE,
        workload: workload.to_string(),
        workload_error: werr / wsum,
        tvd_1way: mean(&combos(d, 1))?,
        tvd_2way: mean(&combos(d, 2))?,
        tvd_3way: if d >= 3 { Some(mean(&combos(d, 3))?) } else { None },
        rows_real: a.get(&[0])?.iter().sum(),
        rows_synthetic: b.get(&[0])?.iter().sum(),
    })
}
