//! Predicted accuracy of a release from public inputs only (issue 20, item 4):
//! what `dpflow plan`, `dpflow run --dry-run` and `dpflow sql --dry-run`
//! print before anything is read.
//!
//! A prediction is made from the noise a mechanism will add (its
//! distribution is fixed by the budget, the bounds and the contribution
//! limits, all public) and, where the released number is a ratio of noisy
//! statistics (means, variances), from an assumed row count and an assumed
//! shape of the data that the prediction states in [`Prediction::basis`].
//! Nothing here reads protected data, so nothing here is a release: the
//! simulations below draw ordinary floating-point noise from a fixed seed,
//! which is fine for a forecast and never used for a released number.

use dpflow_udfs::noise::{DpRng, NoiseDistribution};
use rand::RngExt;
use serde::{Deserialize, Serialize};

/// Draws of each simulated prediction: the 95% quantile of |error| from
/// 20 000 draws has a relative standard error below 1%.
pub const SIMULATION_DRAWS: usize = 20_000;

/// The predicted accuracy of one released number (or of one kind of
/// released number, e.g. every cell of a synthesizer's 2-way marginals).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// What is released (a query's output column, a marginal, ...).
    pub target: String,
    /// The statistic: `count`, `sum`, `mean`, `variance`, `quantile`,
    /// `partition selection` or `marginal`.
    pub statistic: String,
    /// The confidence level of [`Prediction::half_width`].
    pub level: f64,
    /// Predicted half-width of the `level` interval around the released
    /// number, on the answer's scale: the `level` quantile of |released −
    /// exact| (noise only: clamping to the public bounds is not included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_width: Option<f64>,
    /// The half-width of the interval the release itself states around each
    /// value when its noise does not depend on the data (counts and sums:
    /// value ± this, rounded up to cover at least `level`, as `dp_ci_low`
    /// and `dp_ci_high` print); the release report shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stated_half_width: Option<f64>,
    /// Predicted root-mean-square error (same scale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
    /// The half-width when the data is shaped worst for this statistic
    /// (e.g. a mean at one of its bounds), where that differs from
    /// [`Prediction::half_width`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_half_width: Option<f64>,
    /// Quantiles: a bound, at `level`, on the error in rank (rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_error: Option<f64>,
    /// Synthesizers: the expected total variation distance of a workload
    /// marginal from noise alone (a floor, see `synth::predict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_tvd: Option<f64>,
    /// The row count (per released group) the prediction assumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<f64>,
    /// How the prediction was made, what it assumes, or why there is none.
    pub basis: String,
}

impl Prediction {
    /// A prediction with only a target, statistic, level and basis (fill in the rest).
    pub fn new(target: impl Into<String>, statistic: &str, level: f64, basis: impl Into<String>) -> Self {
        Self {
            target: target.into(),
            statistic: statistic.to_string(),
            level,
            half_width: None,
            stated_half_width: None,
            rmse: None,
            worst_half_width: None,
            rank_error: None,
            expected_tvd: None,
            rows: None,
            basis: basis.into(),
        }
    }

    /// The number a target error is compared with: the half-width, or the
    /// worst-case one when asked for.
    pub fn error(&self, worst: bool) -> Option<f64> {
        if worst { self.worst_half_width.or(self.half_width) } else { self.half_width }
    }

    /// A one-line human summary, e.g. `±12 (95%), rmse 6.1`.
    pub fn describe(&self) -> String {
        let pct = format!("{}%", fmt_num(self.level * 100.0));
        let mut s = match (self.half_width, self.rank_error, self.expected_tvd) {
            (Some(h), _, _) => format!("±{} ({pct})", fmt_num(h)),
            (None, Some(r), _) => format!("rank error ≤ {} rows ({pct})", fmt_num(r)),
            (None, None, Some(t)) => format!("expected TVD ≥ {}", fmt_num(t)),
            _ => "no forecast".to_string(),
        };
        if let Some(r) = self.rmse {
            s += &format!(", rmse {}", fmt_num(r));
        }
        if let Some(w) = self.worst_half_width {
            s += &format!(", worst case ±{}", fmt_num(w));
        }
        if let Some(n) = self.rows {
            s += &format!(", at {} rows", fmt_num(n));
        }
        s
    }
}

/// Four significant digits, no exponent for everyday magnitudes.
pub fn fmt_num(x: f64) -> String {
    fmt_sig(x, 4)
}

/// `x` to `digits` significant digits, trailing zeros dropped; an exponent
/// outside [10⁻³, 10⁷).
pub fn fmt_sig(x: f64, digits: i32) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if (1e-3..1e7).contains(&a) {
        let decimals = (digits - 1 - a.log10().floor() as i32).max(0) as usize;
        let s = format!("{x:.decimals$}");
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
    } else {
        let s = format!("{x:.*e}", (digits - 1).max(0) as usize);
        match s.split_once('e') {
            Some((m, e)) if m.contains('.') => format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.')),
            _ => s,
        }
    }
}

/// Root-mean-square of exact integer noise of this scale: the discrete
/// Laplace with q = e^{−1/b} has variance 2q/(1 − q)²; the discrete
/// Gaussian's variance is within 10⁻⁹ relative of σ² once σ ≥ 1 (CKS20,
/// Fact 19), and is summed exactly below that.
pub fn integer_noise_rmse(noise: &NoiseDistribution) -> f64 {
    match *noise {
        NoiseDistribution::Laplace { scale } => {
            let q = (-1.0 / scale).exp();
            // 1 − q without cancellation (q rounds to 1 for a huge scale).
            (2.0 * q).sqrt() / -(-1.0 / scale).exp_m1()
        }
        NoiseDistribution::Gaussian { sigma } if sigma >= 1.0 => sigma,
        NoiseDistribution::Gaussian { sigma } => {
            let w = |z: f64| (-z * z / (2.0 * sigma * sigma)).exp();
            let (mut num, mut den) = (0.0, w(0.0));
            for z in 1..=64 {
                let z = z as f64;
                num += 2.0 * z * z * w(z);
                den += 2.0 * w(z);
            }
            (num / den).sqrt()
        }
    }
}

/// The `level` quantile of |Z| for exact integer noise Z of this scale: the
/// smallest integer m with P(|Z| ≤ m) ≥ level. The discrete Laplace
/// (q = e^{−1/b}) has P(|Z| > m) = 2q^{m+1}/(1 + q); the discrete Gaussian
/// is summed exactly up to σ = 10⁴ and beyond that (where a unit is below
/// 10⁻⁴σ) is the continuous z·σ rounded up. This is the forecast of the error;
/// the interval a release prints ([`NoiseDistribution::integer_ci_half_width`])
/// rounds the continuous half-width up instead, which can be one unit wider.
pub fn integer_abs_quantile(noise: &NoiseDistribution, level: f64) -> f64 {
    let alpha = 1.0 - level;
    match *noise {
        NoiseDistribution::Laplace { scale } => {
            // ln q = −1/b exactly (q.ln() loses its digits when b is large).
            let q = (-1.0 / scale).exp();
            let tail = |m: f64| 2.0 * (-(m + 1.0) / scale).exp() / (1.0 + q);
            let mut m = (-(alpha * (1.0 + q) / 2.0).ln() * scale - 1.0).ceil().max(0.0);
            // Settle floating-point rounding at the boundary (a few steps at most;
            // bounded, since beyond 2⁵³ a step of 1 no longer moves m).
            for _ in 0..4 {
                if m > 0.0 && tail(m - 1.0) <= alpha {
                    m -= 1.0;
                }
            }
            for _ in 0..4 {
                if tail(m) > alpha {
                    m += 1.0;
                }
            }
            m
        }
        NoiseDistribution::Gaussian { sigma } if sigma <= 1e4 => {
            let w = |z: f64| (-z * z / (2.0 * sigma * sigma)).exp();
            let top = (14.0 * sigma).ceil() as i64 + 2;
            let total: f64 = w(0.0) + 2.0 * (1..=top).map(|z| w(z as f64)).sum::<f64>();
            let mut inside = w(0.0);
            let mut m = 0i64;
            while inside / total < level && m < top {
                m += 1;
                inside += 2.0 * w(m as f64);
            }
            m as f64
        }
        NoiseDistribution::Gaussian { .. } => noise.ci_half_width(level).ceil(),
    }
}

/// One continuous draw with this distribution (forecasts only, never a release).
pub fn forecast_draw(noise: &NoiseDistribution, rng: &mut DpRng) -> f64 {
    match *noise {
        NoiseDistribution::Laplace { scale } => {
            let u: f64 = rng.random::<f64>() - 0.5;
            -scale * u.signum() * (1.0 - 2.0 * u.abs()).max(f64::MIN_POSITIVE).ln()
        }
        NoiseDistribution::Gaussian { sigma } => {
            // Box–Muller.
            let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
            let u2: f64 = rng.random();
            sigma * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        }
    }
}

/// The `level` quantile of |e| and the root-mean-square of `e` over
/// [`SIMULATION_DRAWS`] draws of `error` (seeded: the same call gives the same
/// forecast).
pub fn simulate(level: f64, mut error: impl FnMut(&mut DpRng) -> f64) -> (f64, f64) {
    let mut rng = DpRng::unsafe_seeded(0x0d1f_f10e);
    let mut abs: Vec<f64> = Vec::with_capacity(SIMULATION_DRAWS);
    let mut sq = 0.0;
    for _ in 0..SIMULATION_DRAWS {
        let e = error(&mut rng);
        sq += e * e;
        abs.push(e.abs());
    }
    abs.sort_by(f64::total_cmp);
    let k = ((level * SIMULATION_DRAWS as f64).ceil() as usize).clamp(1, SIMULATION_DRAWS) - 1;
    (abs[k], (sq / SIMULATION_DRAWS as f64).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_their_significant_digits() {
        assert_eq!(fmt_num(0.28447883), "0.2845");
        assert_eq!(fmt_num(48842.0), "48842");
        assert_eq!(fmt_sig(0.000123456, 3), "1.23e-4");
        assert_eq!(fmt_sig(2.5e9, 6), "2.5e9");
    }

    #[test]
    fn discrete_laplace_rmse_matches_a_brute_force_sum() {
        for b in [0.3, 1.0, 2.5, 10.0] {
            let q: f64 = (-1.0f64 / b).exp();
            let p = |z: i64| (1.0 - q) / (1.0 + q) * q.powi(z.abs() as i32);
            let var: f64 = (-2000..=2000).map(|z| p(z) * (z * z) as f64).sum();
            let got = integer_noise_rmse(&NoiseDistribution::Laplace { scale: b });
            assert!((got - var.sqrt()).abs() < 1e-9 * var.sqrt().max(1.0), "b={b}: {got} vs {}", var.sqrt());
        }
    }

    #[test]
    fn discrete_gaussian_rmse_matches_a_brute_force_sum() {
        for s in [0.4f64, 0.9, 1.0, 3.0] {
            let w = |z: i64| (-(z * z) as f64 / (2.0 * s * s)).exp();
            let den: f64 = (-200..=200).map(w).sum();
            let var: f64 = (-200..=200).map(|z| w(z) * (z * z) as f64).sum::<f64>() / den;
            let got = integer_noise_rmse(&NoiseDistribution::Gaussian { sigma: s });
            assert!((got - var.sqrt()).abs() < 1e-6, "σ={s}: {got} vs {}", var.sqrt());
        }
    }

    #[test]
    fn integer_quantiles_match_brute_force() {
        for noise in [
            NoiseDistribution::Laplace { scale: 0.7 },
            NoiseDistribution::Laplace { scale: 2.5 },
            NoiseDistribution::Laplace { scale: 40.0 },
            NoiseDistribution::Gaussian { sigma: 0.6 },
            NoiseDistribution::Gaussian { sigma: 4.08 },
            NoiseDistribution::Gaussian { sigma: 31.0 },
        ] {
            let pmf: Vec<f64> = match noise {
                NoiseDistribution::Laplace { scale } => {
                    let q = (-1.0 / scale).exp();
                    (0..5000).map(|z| (1.0 - q) / (1.0 + q) * q.powi(z) * if z == 0 { 1.0 } else { 2.0 }).collect()
                }
                NoiseDistribution::Gaussian { sigma } => {
                    let w: Vec<f64> = (0..5000)
                        .map(|z| (-(z * z) as f64 / (2.0 * sigma * sigma)).exp() * if z == 0 { 1.0 } else { 2.0 })
                        .collect();
                    let t: f64 = w.iter().sum();
                    w.iter().map(|x| x / t).collect()
                }
            };
            for level in [0.5, 0.9, 0.95, 0.99] {
                let mut acc = 0.0;
                let want = pmf.iter().position(|p| {
                    acc += p;
                    acc >= level
                });
                assert_eq!(integer_abs_quantile(&noise, level), want.unwrap() as f64, "{noise:?} at {level}");
                assert!(integer_abs_quantile(&noise, level) <= noise.integer_ci_half_width(level));
            }
        }
    }

    #[test]
    fn simulated_quantiles_match_the_closed_forms() {
        // Laplace b: P(|L| > t) = e^{−t/b}; Gaussian: z·σ. 20 000 draws: within 3%.
        for noise in [NoiseDistribution::Laplace { scale: 3.0 }, NoiseDistribution::Gaussian { sigma: 5.0 }] {
            let (q, rmse) = simulate(0.95, |r| forecast_draw(&noise, r));
            let want = noise.ci_half_width(0.95);
            assert!((q / want - 1.0).abs() < 0.03, "{noise:?}: {q} vs {want}");
            assert!((rmse / noise.std_dev() - 1.0).abs() < 0.03, "{noise:?}: rmse {rmse}");
        }
    }
}
