//! Predicted error of each DP aggregate of a query, from its plan alone
//! (issue 20, item 4; see `privacy::accuracy`): the noise `costing::plan_costs`
//! calibrates is public, so
//!
//! - `dp_count` and `dp_sum`: the exact quantile and RMSE of the integer
//!   noise ([`integer_abs_quantile`]; no assumption about the data);
//! - `dp_avg` and `dp_var`: the released value is a ratio of noisy sums
//!   (release.rs), so its error depends on the group's row count (a public
//!   estimate the user gives) and, more weakly, on where the values lie in
//!   the bounds. The forecast simulates the release's own arithmetic
//!   (denominator noise and clamping included) with the mean at the bounds'
//!   midpoint (and, for variances, values spread evenly over the bounds),
//!   and reports the worst case over the data's mean and spread beside it;
//! - `dp_quantile`: the exponential mechanism's utility theorem bounds the
//!   error in rank, P[score ≤ OPT − (2Δ/ε)(ln|R| + t)] ≤ e^{−t} (McSherry &
//!   Talwar 2007, Thm 6; Dwork & Roth Thm 3.11), so at level 1 − β the rank
//!   error is at most (2Δ/ε)·ln(|R|/β) rows beyond the optimal bin's own; the
//!   error in value depends on the data's density and is not predicted;
//! - DP partition selection: how many privacy units a key needs to be kept
//!   with probability 1/2 and `level`.

use super::costing::{Kind, Planned, Selection};
use crate::privacy::Prediction;
use crate::privacy::accuracy::{fmt_num, forecast_draw, integer_abs_quantile, integer_noise_rmse, simulate};

/// Public inputs of a forecast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assumptions {
    /// A public estimate of the table's row count.
    pub rows: Option<f64>,
    /// A public estimate of the rows of each released group (default: an
    /// even split of `rows` over the GROUP BY's public keys).
    pub group_rows: Option<f64>,
    /// Confidence level of the predicted intervals.
    pub level: f64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Self { rows: None, group_rows: None, level: 0.95 }
    }
}

/// Predictions for every DP aggregate of a planned query (and its partition
/// selection). `keys`: the number of public GROUP BY keys when the domain
/// enumerates them (1 for an ungrouped query).
pub(super) fn predict(
    planned: &[Planned],
    selection: Option<&Selection>,
    keys: Option<usize>,
    a: &Assumptions,
) -> Vec<Prediction> {
    let (rows, rows_basis) = match (a.group_rows, a.rows, keys) {
        (Some(g), _, _) => (Some(g), format!("{} rows per group (given)", fmt_num(g))),
        (None, Some(n), Some(1)) => (Some(n), format!("{} rows (given)", fmt_num(n))),
        (None, Some(n), Some(k)) => (
            Some(n / k as f64),
            format!("{} rows per group: {} rows split evenly over {k} public keys", fmt_num(n / k as f64), fmt_num(n)),
        ),
        _ => (None, String::new()),
    };
    let mut out: Vec<Prediction> = planned.iter().map(|p| predict_one(p, rows, &rows_basis, a.level)).collect();
    if let Some((_, b, tau)) = selection {
        out.push(selection_prediction(*b, *tau, a.level));
    }
    out
}

fn predict_one(p: &Planned, rows: Option<f64>, rows_basis: &str, level: f64) -> Prediction {
    let g = 2f64.powi(p.grid);
    let exact = "exact: the noise does not depend on the data (dp_ci_low/dp_ci_high print an interval at most one \
                 unit wider, rounded up to guarantee its coverage)";
    match &p.kind {
        Kind::Count { .. } => {
            let mut pr = Prediction::new(&p.field, "count", level, exact);
            pr.half_width = Some(integer_abs_quantile(&p.noise[0], level));
            pr.stated_half_width = Some(p.noise[0].integer_ci_half_width(level));
            pr.rmse = Some(integer_noise_rmse(&p.noise[0]));
            pr
        }
        Kind::Sum { .. } => {
            let mut pr = Prediction::new(
                &p.field,
                "sum",
                level,
                format!("{exact}; values outside the bounds are clamped (that bias is not included)"),
            );
            pr.half_width = Some(integer_abs_quantile(&p.noise[0], level) * g);
            pr.stated_half_width = Some(p.noise[0].integer_ci_half_width(level) * g);
            pr.rmse = Some(integer_noise_rmse(&p.noise[0]) * g);
            pr
        }
        Kind::Avg { lo, hi, .. } | Kind::Var { lo, hi, .. } => {
            let is_avg = matches!(p.kind, Kind::Avg { .. });
            let stat = if is_avg { "mean" } else { "variance" };
            let Some(n) = rows else {
                return Prediction::new(
                    &p.field,
                    stat,
                    level,
                    "depends on the group's row count: give a public estimate (--rows, or --group-rows when the \
                     GROUP BY keys are not enumerable from the domain)",
                );
            };
            let c = (hi - lo) / 2.0;
            let mut pr = if is_avg {
                let sim = |m: f64| simulate(level, |r| avg_error(p, n, c, m, g, r));
                let (hw, rmse) = sim(0.0);
                let worst = [0.25, 0.5, 0.75, 1.0].iter().map(|f| sim(f * c).0).fold(hw, f64::max);
                let mut pr = Prediction::new(
                    &p.field,
                    stat,
                    level,
                    format!(
                        "simulated release arithmetic at {rows_basis}, the mean at the bounds' midpoint; the worst \
                         case moves the mean towards a bound"
                    ),
                );
                (pr.half_width, pr.rmse, pr.worst_half_width) = (Some(hw), Some(rmse), Some(worst));
                pr
            } else {
                let sim = |m: f64, e2: f64| simulate(level, |r| var_error(p, n, c, m, e2, g, r));
                let (hw, rmse) = sim(0.0, c * c / 3.0);
                let mut worst = hw;
                for m in [0.0, 0.5 * c, c] {
                    for e2 in [m * m, (m * m + c * c) / 2.0, c * c] {
                        worst = worst.max(sim(m, e2).0);
                    }
                }
                let mut pr = Prediction::new(
                    &p.field,
                    stat,
                    level,
                    format!(
                        "simulated release arithmetic at {rows_basis}, values spread evenly over the bounds; the \
                         worst case varies the data's mean and spread"
                    ),
                );
                (pr.half_width, pr.rmse, pr.worst_half_width) = (Some(hw), Some(rmse), Some(worst));
                pr
            };
            pr.rows = Some(n);
            pr
        }
        Kind::Quantile { lo, hi, .. } => {
            let (eps, bins, sensitivity) = p.quantile.expect("planned quantile");
            let rank = 2.0 * sensitivity / eps * (bins as f64 / (1.0 - level)).ln();
            let mut pr = Prediction::new(
                &p.field,
                "quantile",
                level,
                format!(
                    "exponential mechanism over {bins} bins of width {}: a bound on the rank error beyond the \
                     optimal bin's own rows (utility theorem); the error in value depends on how dense the data \
                     is near the quantile, so no interval is predicted. dp_ci_low/dp_ci_high release one (an \
                     interval holding the exact sample quantile, whose ends aim {} ranks beyond q·n), each at a \
                     share of the call's budget",
                    fmt_num((hi - lo) / bins as f64),
                    fmt_num(super::quantile_interval::endpoint_shift(eps, sensitivity, bins, level)),
                ),
            );
            pr.rank_error = Some(rank);
            pr
        }
    }
}

/// One draw of a released mean's error (release.rs `Kind::Avg`): n rows
/// whose clamped values have centered mean `m` (in [−c, c]).
fn avg_error(p: &Planned, n: f64, c: f64, m: f64, g: f64, r: &mut dpflow_udfs::noise::DpRng) -> f64 {
    let cnt = n + forecast_draw(&p.noise[0], r).round();
    let s = n * m + forecast_draw(&p.noise[1], r) * g;
    if cnt < 1.0 { 2.0 * c } else { (s / cnt).clamp(-c, c) - m }
}

/// One draw of a released variance's error (release.rs `Kind::Var`): n rows
/// with centered mean `m` and mean centered square `e2` (≥ m²).
fn var_error(p: &Planned, n: f64, c: f64, m: f64, e2: f64, g: f64, r: &mut dpflow_udfs::noise::DpRng) -> f64 {
    let cnt = n + forecast_draw(&p.noise[0], r).round();
    let s1 = n * m + forecast_draw(&p.noise[1], r) * g;
    let s2 = n * e2 + forecast_draw(&p.noise[2], r) * g * g;
    let truth = e2 - m * m;
    if cnt > 1.0 { (s2 / cnt - (s1 / cnt).powi(2)).clamp(0.0, c * c) - truth } else { c * c }
}

/// DP partition selection (costing.rs `selection_threshold`): a key with u
/// units is kept when u + Z > τ, Z discrete Laplace (p = e^{−1/b}) with
/// P(Z ≥ k) = p^k/(1 + p) for k ≥ 1 and 1 − p^{1−k}/(1 + p) for k ≤ 0.
fn selection_prediction(b: f64, tau: i128, level: f64) -> Prediction {
    let p = (-1.0 / b).exp();
    let kept = |u: i128| {
        let k = tau - u + 1;
        if k >= 1 { p.powf(k as f64) / (1.0 + p) } else { 1.0 - p.powf((1 - k) as f64) / (1.0 + p) }
    };
    let units_for = |prob: f64| (1..).find(|&u| kept(u) >= prob).unwrap_or(i128::MAX);
    let (half, sure) = (units_for(0.5), units_for(level));
    let mut pr = Prediction::new(
        "GROUP BY keys",
        "partition selection",
        level,
        format!(
            "a key is released when its noisy count of units exceeds {tau}: kept with probability 1/2 at {half} \
             units and {} at {sure} units; smaller keys are likely missing from the result",
            fmt_num(level)
        ),
    );
    pr.rows = Some(sure as f64);
    pr
}

/// The worst-case |error| of a mean for a released noise pair, in closed
/// form where both parts are Gaussian (tests only).
#[cfg(test)]
fn gaussian_avg_half_width(noise: &[dpflow_udfs::noise::NoiseDistribution], g: f64, n: f64, m: f64, level: f64) -> f64 {
    use dpflow_udfs::noise::NoiseDistribution;
    let (NoiseDistribution::Gaussian { sigma: sc }, NoiseDistribution::Gaussian { sigma: ss }) = (noise[0], noise[1])
    else {
        panic!("Gaussian noise expected")
    };
    let sd = ((ss * g).powi(2) + (m * sc).powi(2)).sqrt() / n;
    sd * dpflow_udfs::calibrate::normal_quantile(1.0 - (1.0 - level) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpflow_udfs::noise::NoiseDistribution;

    fn planned(kind: Kind, noise: Vec<NoiseDistribution>, grid: i32) -> Planned {
        Planned {
            field: "x".into(),
            kind,
            noise,
            grid,
            records: vec![],
            helpers: vec![],
            quantile: Some((1.0, 1024, 1.0)),
        }
    }

    #[test]
    fn a_mean_at_large_n_matches_the_delta_method() {
        // n = 10 000: the denominator's noise is negligible; the error is
        // (Z_s − m·Z_c)/n, Gaussian with sd √(σ_s² + m²σ_c²)/n.
        let noise = vec![NoiseDistribution::Gaussian { sigma: 20.0 }, NoiseDistribution::Gaussian { sigma: 4000.0 }];
        let p = planned(Kind::Avg { arg: datafusion::logical_expr::lit(1), lo: 0.0, hi: 100.0 }, noise.clone(), -3);
        let g = 2f64.powi(-3);
        let preds = predict(&[p], None, Some(1), &Assumptions { rows: Some(10_000.0), ..Default::default() });
        let hw = preds[0].half_width.unwrap();
        let want = gaussian_avg_half_width(&noise, g, 10_000.0, 0.0, 0.95);
        assert!((hw / want - 1.0).abs() < 0.03, "{hw} vs {want}");
        // Worst case: at a bound the clamp cuts one side, so it is at most the
        // unclamped m = c value and at least the midpoint one.
        let worst = preds[0].worst_half_width.unwrap();
        let at_bound = gaussian_avg_half_width(&noise, g, 10_000.0, 50.0, 0.95);
        assert!(worst >= hw && worst <= at_bound * 1.03, "{worst} vs [{hw}, {at_bound}]");
    }

    #[test]
    fn partition_selection_thresholds_are_exact() {
        // b = 1/ε with ε = 1, τ = 12: a key with 12 units is kept iff Z ≥ 1,
        // probability p/(1 + p) < 1/2; with 13 units iff Z ≥ 0: 1 − p/(1 + p) > 1/2.
        let pr = selection_prediction(1.0, 12, 0.95);
        assert!(pr.basis.contains("1/2 at 13 units"), "{}", pr.basis);
        // 95%: 1 − p^{u−12}/(1 + p) ≥ 0.95 ⇔ p^{u−12} ≤ 0.05(1 + p) ⇔ u ≥ 12 + 2.68: 15.
        assert_eq!(pr.rows, Some(15.0));
    }

    #[test]
    fn a_quantile_gets_a_rank_bound_and_no_interval() {
        let p = planned(Kind::Quantile { arg: datafusion::logical_expr::lit(1), q: 0.5, lo: 0.0, hi: 1.0 }, vec![], 0);
        let pr = &predict(&[p], None, Some(1), &Assumptions::default())[0];
        assert_eq!(pr.half_width, None);
        // 2Δ/ε · ln(1024/0.05) with ε = Δ = 1.
        assert!((pr.rank_error.unwrap() - 2.0 * (1024.0f64 / 0.05).ln()).abs() < 1e-9);
    }
}
