//! The release: exact integer helpers plus exact integer noise, drawn once
//! per group in our own code, then post-processed into the answer (averages,
//! variances, clamped to the public bounds) and its requested confidence
//! bounds; quantiles by the exponential mechanism over a public grid.

use super::error::Result;
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, LogicalPlan};
use dpflow_udfs::noise::{DpRng, ExponentialMechanism, NoiseDistribution};

use super::args::parse_f64;
use super::costing::{Kind, Planned};

/// A requested confidence bound.
#[derive(Debug, Clone)]
pub(super) struct CiRequest {
    pub(super) side_high: bool,
    pub(super) agg: usize,
    pub(super) level: f64,
    pub(super) field: String,
    pub(super) level_arg: Option<Expr>,
    pub(super) hidden: String,
}

impl CiRequest {
    pub(super) fn matches(&self, func: &str, args: &[Expr]) -> bool {
        (func == "dp_ci_high") == self.side_high
            && matches!(args.first(), Some(Expr::Column(c)) if c.name == self.field)
            && args.get(1) == self.level_arg.as_ref()
    }
}

pub(super) fn ci_requests(plan: &LogicalPlan, planned: &[Planned], default_level: f64) -> Vec<CiRequest> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut out: Vec<CiRequest> = Vec::new();
    let _ = plan.apply(|node| {
        for e in node.expressions() {
            let _ = e.apply(|x| {
                if let Expr::ScalarFunction(ScalarFunction { func, args }) = x
                    && (func.name() == "dp_ci_low" || func.name() == "dp_ci_high")
                    && let Some(Expr::Column(c)) = args.first()
                    && let Some(agg) = planned.iter().position(|p| p.field == c.name)
                {
                    let level = args
                        .get(1)
                        .and_then(|l| parse_f64(l, "level", func.name()).ok())
                        .filter(|l| *l > 0.0 && *l < 1.0)
                        .unwrap_or(default_level);
                    let side_high = func.name() == "dp_ci_high";
                    if !out
                        .iter()
                        .any(|r| r.side_high == side_high && r.agg == agg && r.level_arg.as_ref() == args.get(1))
                    {
                        let hidden = format!("__ci_{}_{agg}_{}", if side_high { "hi" } else { "lo" }, out.len());
                        out.push(CiRequest {
                            side_high,
                            agg,
                            level,
                            field: c.name.clone(),
                            level_arg: args.get(1).cloned(),
                            hidden,
                        });
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// Every `dp_ci_low`/`dp_ci_high` in the plan (subqueries too) must be one
/// of `cis` — a DP aggregate of this query, with a level in (0, 1) if one is
/// given — or the query is refused before the charge (an unmatched marker
/// would only fail after the read).
pub(super) fn check_markers(plan: &LogicalPlan, cis: &[CiRequest]) -> Result<()> {
    use super::refusal::{Refusal, RefusalKind as K};
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut bad: Option<String> = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|x| {
                if let Expr::ScalarFunction(ScalarFunction { func, args }) = x
                    && (func.name() == "dp_ci_low" || func.name() == "dp_ci_high")
                {
                    if let Some(l) = args.get(1)
                        && !parse_f64(l, "level", func.name()).is_ok_and(|l| l > 0.0 && l < 1.0)
                    {
                        bad = Some(format!("{}: the level must be a number between 0 and 1, e.g. 0.9", func.name()));
                    } else if !cis.iter().any(|r| r.matches(func.name(), args)) {
                        bad = Some(format!(
                            "{} takes a DP aggregate of the same SELECT, e.g. dp_ci_low(dp_count(*)) or \
                             dp_ci_high(dp_avg(x, 0, 100), 0.9)",
                            func.name()
                        ));
                    }
                    if bad.is_some() {
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    match bad {
        Some(m) => Err(Refusal::new(K::Arguments, m).into()),
        None => Ok(()),
    }
}

/// Noises one aggregate for one group; returns the value and requested CI bounds.
pub(super) fn release_one(
    p: &Planned,
    h: &[i128],
    histogram: &[f64],
    cis: &[CiRequest],
    pi: usize,
    rng: &mut DpRng,
) -> Result<(ScalarValue, Vec<(usize, ScalarValue)>)> {
    // Exact integer + exact integer noise; only the noisy value becomes a float.
    let noisy_int =
        |x: i128, n: &NoiseDistribution, rng: &mut DpRng| -> f64 { x.saturating_add(n.sample_integer(rng)) as f64 };
    let g = 2f64.powi(p.grid);
    let mine: Vec<(usize, &CiRequest)> = cis.iter().enumerate().filter(|(_, r)| r.agg == pi).collect();
    let mut out_cis = Vec::new();
    let value = match &p.kind {
        Kind::Count { .. } => {
            let v = noisy_int(h[0], &p.noise[0], rng);
            for (k, r) in &mine {
                let hw = p.noise[0].integer_ci_half_width(r.level);
                out_cis.push((*k, ScalarValue::Float64(Some(if r.side_high { v + hw } else { v - hw }))));
            }
            ScalarValue::Int64(Some(v as i64))
        }
        Kind::Sum { .. } => {
            let v = noisy_int(h[0], &p.noise[0], rng) * g;
            for (k, r) in &mine {
                let hw = p.noise[0].integer_ci_half_width(r.level) * g;
                out_cis.push((*k, ScalarValue::Float64(Some(if r.side_high { v + hw } else { v - hw }))));
            }
            ScalarValue::Float64(Some(v))
        }
        Kind::Avg { lo, hi, .. } => {
            let mid = (lo + hi) / 2.0;
            let c = noisy_int(h[0], &p.noise[0], rng);
            let s = noisy_int(h[1], &p.noise[1], rng) * g;
            for (k, r) in &mine {
                // Conservative: each part at level 1 − (1 − level)/2, interval arithmetic.
                let lvl = 1.0 - (1.0 - r.level) / 2.0;
                let hc = p.noise[0].integer_ci_half_width(lvl);
                let hs = p.noise[1].integer_ci_half_width(lvl) * g;
                let bound = if c - hc > 0.0 {
                    let cands = [(s - hs) / (c - hc), (s - hs) / (c + hc), (s + hs) / (c - hc), (s + hs) / (c + hc)];
                    let b = if r.side_high {
                        cands.iter().copied().fold(f64::MIN, f64::max)
                    } else {
                        cands.iter().copied().fold(f64::MAX, f64::min)
                    };
                    (b + mid).clamp(*lo, *hi)
                } else if r.side_high {
                    *hi
                } else {
                    *lo
                };
                out_cis.push((*k, ScalarValue::Float64(Some(bound))));
            }
            if c >= 1.0 {
                ScalarValue::Float64(Some((s / c + mid).clamp(*lo, *hi)))
            } else {
                ScalarValue::Float64(None)
            }
        }
        Kind::Var { lo, hi, .. } => {
            let c = noisy_int(h[0], &p.noise[0], rng);
            let s1 = noisy_int(h[1], &p.noise[1], rng) * g;
            let s2 = noisy_int(h[2], &p.noise[2], rng) * g * g;
            let max_var = ((hi - lo) / 2.0).powi(2);
            let var = |c: f64, s1: f64, s2: f64| (s2 / c - (s1 / c).powi(2)).clamp(0.0, max_var);
            for (k, r) in &mine {
                let lvl = 1.0 - (1.0 - r.level) / 3.0;
                let (hc, h1, h2) = (
                    p.noise[0].integer_ci_half_width(lvl),
                    p.noise[1].integer_ci_half_width(lvl) * g,
                    p.noise[2].integer_ci_half_width(lvl) * g * g,
                );
                let bound = if c - hc > 1.0 {
                    let mut vals = Vec::new();
                    for cc in [c - hc, c + hc] {
                        for a in [s1 - h1, s1 + h1, 0.0f64.clamp(s1 - h1, s1 + h1)] {
                            for b in [s2 - h2, s2 + h2] {
                                vals.push(var(cc, a, b));
                            }
                        }
                    }
                    if r.side_high {
                        vals.iter().copied().fold(0.0, f64::max)
                    } else {
                        vals.iter().copied().fold(max_var, f64::min)
                    }
                } else if r.side_high {
                    max_var
                } else {
                    0.0
                };
                out_cis.push((*k, ScalarValue::Float64(Some(bound))));
            }
            if c > 1.0 { ScalarValue::Float64(Some(var(c, s1, s2))) } else { ScalarValue::Float64(None) }
        }
        Kind::Quantile { q, lo, hi, .. } => {
            let (eps, bins, sensitivity) = p.quantile.expect("quantile");
            let n: f64 = histogram.iter().sum();
            // Score of bin b: −|#{x below b's upper edge} − q·n| (sensitivity 1 per row, l∞ per unit).
            let mut cum = 0.0;
            let scores: Vec<f64> = (0..bins)
                .map(|b| {
                    cum += histogram.get(b).copied().unwrap_or(0.0);
                    -(cum - q * n).abs()
                })
                .collect();
            let mech = ExponentialMechanism::new(eps, sensitivity)?;
            let b = mech.select(rng, &scores)?;
            let width = (hi - lo) / bins as f64;
            // Each requested end is a selection of its own, charged at plan time
            // (`costing::split_quantile_for_intervals`; proof in `quantile_interval`).
            for (k, r) in &mine {
                let shift = super::quantile_interval::endpoint_shift(eps, sensitivity, bins, r.level);
                let s = super::quantile_interval::endpoint_scores(histogram, bins, *q, shift, r.side_high);
                let e = mech.select(rng, &s)?;
                // A value lands in bin ⌊(x − lo)/w⌋ computed in floating point, so the
                // bin's edges are rounded outward by a few ulps of the bounds' magnitude;
                // the first and last bins end exactly at lo and hi.
                let margin = 8.0 * f64::EPSILON * lo.abs().max(hi.abs()).max(hi - lo);
                let edge = match (r.side_high, e) {
                    (false, 0) => *lo,
                    (false, e) => lo + e as f64 * width - margin,
                    (true, e) if e + 1 >= bins => *hi,
                    (true, e) => lo + (e + 1) as f64 * width + margin,
                };
                out_cis.push((*k, ScalarValue::Float64(Some(edge.clamp(*lo, *hi)))));
            }
            ScalarValue::Float64(Some(lo + (b as f64 + 0.5) * width))
        }
    };
    Ok((value, out_cis))
}
