//! Utility metrics (NOTES §10): workload error (001 Def. 2 as coded: mean over
//! workload marginals of ½‖M_r(D)/|D| − M_r(D̂)/|D̂|‖₁), the k-way marginal
//! distance (000 §6.1: the same over all k-attribute combinations) and the
//! NIST CRC k-marginal score ([`kmarginal`]).
//!
//! These compare against the real data: they are curator-side evaluation
//! tools, not private releases.

mod error;
pub mod inspect;
pub mod kmarginal;
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
    /// The NIST CRC k-marginal score (SDNist), when a column is left after
    /// SDNist's exclusions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kmarginal: Option<kmarginal::KMarginal>,
    /// Rows of each input.
    pub rows_real: f64,
    /// Rows of the synthetic data.
    pub rows_synthetic: f64,
    /// Per-attribute and per-pair detail (the curator report's heat maps).
    pub detail: TvdDetail,
}

/// TVDs per attribute and per pair of attributes.
#[derive(Debug, Clone, Serialize)]
pub struct TvdDetail {
    /// Column names, in domain order.
    pub columns: Vec<String>,
    /// The 1-way TVD of each column.
    pub one_way: Vec<f64>,
    /// `two_way[i][j]`: the TVD of the (i, j) marginal (`None` on the diagonal).
    pub two_way: Vec<Vec<Option<f64>>>,
    /// `three_way[i][j]`: the mean TVD of the 3-way marginals holding i and j
    /// (`None` on the diagonal, or with fewer than 3 columns).
    pub three_way: Vec<Vec<Option<f64>>>,
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
    // All 1/2/3-way marginals: the TVDs, and the k-marginal's pairs and
    // (group, pair) triples among them.
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
    let kmarginal = kmarginal_of(real.domain(), &a, &b)?;
    let mut detail = TvdDetail {
        columns: real.domain().names().iter().map(|n| n.to_string()).collect(),
        one_way: Vec::with_capacity(d),
        two_way: vec![vec![None; d]; d],
        three_way: vec![vec![None; d]; d],
    };
    for i in 0..d {
        detail.one_way.push(tvd(a.get(&[i])?, b.get(&[i])?));
    }
    for p in combos(d, 2) {
        let t = tvd(a.get(&p)?, b.get(&p)?);
        (detail.two_way[p[0]][p[1]], detail.two_way[p[1]][p[0]]) = (Some(t), Some(t));
    }
    if d >= 3 {
        let mut sum = vec![vec![(0.0, 0usize); d]; d];
        for t in combos(d, 3) {
            let v = tvd(a.get(&t)?, b.get(&t)?);
            for (x, y) in [(t[0], t[1]), (t[0], t[2]), (t[1], t[2])] {
                for (i, j) in [(x, y), (y, x)] {
                    sum[i][j].0 += v;
                    sum[i][j].1 += 1;
                }
            }
        }
        for (out, row) in detail.three_way.iter_mut().zip(&sum) {
            for (o, &(total, count)) in out.iter_mut().zip(row) {
                if count > 0 {
                    *o = Some(total / count as f64);
                }
            }
        }
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
        kmarginal,
        detail,
    })
}

/// The k-marginal score ([`kmarginal`]) from the all-2/3-way answers of the
/// real (`a`) and synthetic (`b`) data: pairs of the columns SDNist keeps
/// (one column alone is its own pair), grouped by `PUMA` when present.
fn kmarginal_of(
    domain: &crate::domain::Domain,
    a: &crate::synth::Answers,
    b: &crate::synth::Answers,
) -> Result<Option<kmarginal::KMarginal>> {
    let names = domain.names();
    let kept: Vec<usize> = (0..names.len()).filter(|&i| !kmarginal::EXCLUDED.contains(&names[i])).collect();
    let pairs: Vec<Vec<usize>> = match kept.len() {
        0 => return Ok(None),
        1 => vec![kept.clone()],
        _ => kept.iter().copied().combinations(2).collect(),
    };
    let mut counts = Vec::with_capacity(pairs.len());
    for p in &pairs {
        counts.push((a.get(p)?, b.get(p)?));
    }
    let mut report = kmarginal::KMarginal {
        score: kmarginal::score(&counts),
        pairs: pairs.len(),
        group_column: None,
        groups: vec![],
    };
    if let Some(g) = domain.position(kmarginal::GROUP_COLUMN) {
        let sizes = domain.cardinalities();
        let mut triples = Vec::with_capacity(pairs.len());
        for p in &pairs {
            let mut t: Vec<usize> = p.iter().copied().chain([g]).collect();
            t.sort_unstable();
            t.dedup();
            triples.push(t);
        }
        let mut grouped = Vec::with_capacity(triples.len());
        let shapes: Vec<Vec<usize>> = triples.iter().map(|t| t.iter().map(|&i| sizes[i]).collect()).collect();
        for (t, shape) in triples.iter().zip(&shapes) {
            grouped.push(kmarginal::GroupedPair {
                target: a.get(t)?,
                synthetic: b.get(t)?,
                shape,
                group_axis: t.iter().position(|&i| i == g).expect("the group column is in the triple"),
            });
        }
        // SDNist grouped: the score is over the (group, pair) marginals.
        let triple_counts: Vec<(&[f64], &[f64])> = grouped.iter().map(|p| (p.target, p.synthetic)).collect();
        report.score = kmarginal::score(&triple_counts);
        let column = &domain.columns()[g];
        report.group_column = Some(column.name.clone());
        report.groups = kmarginal::group_scores(&grouped, sizes[g])
            .into_iter()
            .enumerate()
            .filter_map(|(code, s)| s.map(|score| kmarginal::GroupScore { group: column.label(code as u32), score }))
            .collect();
    }
    Ok(Some(report))
}
