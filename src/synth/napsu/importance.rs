//! NUTS on the fixed-covariance surrogate, corrected to the exact posterior
//! by importance weights, with the Pareto k̂ diagnostic.
//!
//! **Method.** NUTS draws θ_1 … θ_S from π_s ([`super::surrogate`]); each
//! gets the weight w_i = π(θ_i)/π_s(θ_i) with π the exact posterior
//! ([`super::likelihood`]), and the m posterior draws the synthetic sets are
//! made from are sampled from the θ_i with probabilities w_i/Σw
//! (sampling–importance resampling, Rubin 1988). Expectations under the
//! weighted draws converge to the exact posterior's as S grows, like the
//! draws of NUTS on π itself; the cost is one exact log-density (no
//! gradient) per kept draw instead of ~350 exact gradients per iteration.
//!
//! **Diagnostic** (Vehtari, Simpson, Gelman, Yao, Gabry 2024, "Pareto
//! smoothed importance sampling", JMLR 25, §3): a generalised Pareto
//! distribution is fitted to the M = min(S/5, 3√S) largest weights; its
//! shape k̂ says how many moments the weights have. k̂ < 0.7 (for S ≥ 2,200;
//! min(1 − 1/log₁₀ S, 0.7) in general) means the importance-sampling
//! estimate is reliable; above it the correction is refused (unless the
//! caller overrides, as for R̂: post-processing of DP output, so refusing
//! or publishing spends nothing). The fit is Zhang & Stephens (2009,
//! Technometrics 51) with the weakly informative prior of Vehtari et al.
//! App. C. The weights' effective sample size (Σw)²/Σw² is reported too.

use dpflow_udfs::noise::DpRng;
use rand::distr::Distribution;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::NapsuError;
use super::laplace::{Laplace, LogDensity};
use super::likelihood::Posterior;
use super::nuts::{NutsDraws, NutsOptions, sample};
use super::surrogate::FixedCovariance;

/// The importance correction of surrogate draws, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// Pareto k̂ of the weights' tail; `None` when the weights are all
    /// equal (no tail to fit: the surrogate was exact on the draws); ∞ for a
    /// tail that cannot be fitted (written `"inf"`: [`super::record_float`]).
    #[serde(default, with = "super::record_float")]
    pub pareto_k: Option<f64>,
    /// The threshold k̂ was compared with: min(1 − 1/log₁₀ S, 0.7).
    pub k_threshold: f64,
    /// (Σw)²/Σw²: how many independent exact draws the weighted ones would
    /// be worth if the NUTS draws were independent (an upper bound: they are
    /// autocorrelated; the chains' own ESS is in the inference report).
    pub ess: f64,
    /// Draws whose exact log-density could not be evaluated (weight 0).
    pub failed: usize,
}

/// NUTS draws of the surrogate with their log-weights log π − log π_s.
pub struct CorrectedDraws {
    /// The surrogate chains' draws and diagnostics.
    pub nuts: NutsDraws,
    /// log w_i, one per draw (−∞ where π could not be evaluated).
    pub log_weights: Vec<f64>,
    /// The diagnostic.
    pub correction: Correction,
}

/// NUTS on π_s (C frozen at the Laplace mode), then the weights against
/// `post`. `judge` decides whether the chains go on ([`sample`]).
pub fn sample_corrected(
    post: &Posterior,
    fit: &Laplace,
    opts: &NutsOptions,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
    judge: &mut dyn FnMut(&NutsDraws) -> f64,
) -> Result<CorrectedDraws, NapsuError> {
    let surrogate = FixedCovariance::new(post, &fit.mean)?;
    let nuts = sample(&surrogate, fit, opts, rng, progress, judge)?;
    progress(&format!("napsu-mq: importance weights of {} draws against the exact posterior", nuts.draws.len()));
    let log_weights: Vec<f64> = nuts
        .draws
        .par_iter()
        .map(|theta| match (post.log_density(theta), surrogate.value(theta)) {
            (Ok(p), Ok(s)) if (p - s).is_finite() => p - s,
            _ => f64::NEG_INFINITY,
        })
        .collect();
    let correction = diagnose(&log_weights)?;
    Ok(CorrectedDraws { nuts, log_weights, correction })
}

impl CorrectedDraws {
    /// m draws sampled with probabilities ∝ w (with replacement).
    pub fn resample(&self, m: usize, rng: &mut DpRng) -> Result<Vec<Vec<f64>>, NapsuError> {
        let weights = normalised(&self.log_weights);
        let pick = rand::distr::weighted::WeightedIndex::new(&weights)
            .map_err(|e| NapsuError::Numerical(format!("the importance weights cannot be sampled: {e}")))?;
        Ok((0..m).map(|_| self.nuts.draws[pick.sample(rng)].clone()).collect())
    }
}

/// Refuses a correction whose k̂ exceeds its threshold (an unfittable
/// tail counts as k̂ = ∞), or with draws where the exact posterior could
/// not be evaluated (their region would silently lose its mass), unless
/// `allow`.
pub fn check_reliable(c: &Correction, allow: bool) -> Result<(), NapsuError> {
    if allow {
        return Ok(());
    }
    if let Some(k) = c.pareto_k
        && k.partial_cmp(&c.k_threshold).is_none_or(|o| o.is_gt())
    {
        return Err(NapsuError::Numerical(format!(
            "the importance correction from the fast NUTS target to the exact posterior is unreliable (Pareto k̂ \
             {k:.2} > {:.2}); run `--inference nuts-exact` (slower: exact gradients), or accept the draws \
             explicitly",
            c.k_threshold
        )));
    }
    if c.failed > 0 {
        return Err(NapsuError::Numerical(format!(
            "the exact posterior could not be evaluated at {} NUTS draws, so the importance correction would drop \
             their region; run `--inference nuts-exact`, or accept the draws explicitly",
            c.failed
        )));
    }
    Ok(())
}

/// Refuses weighted draws worth fewer than `m` independent ones, even when
/// the user accepts unreliable ones: the m sets would repeat a few θ, their
/// between-set variance would collapse and Rubin's rules break.
pub fn check_enough(c: &Correction, m: usize) -> Result<(), NapsuError> {
    if c.ess.partial_cmp(&(m as f64)).is_none_or(|o| o.is_lt()) {
        return Err(NapsuError::Numerical(format!(
            "the importance-weighted NUTS draws are worth {:.0} independent draws, fewer than the {m} synthetic \
             sets; ask for more NUTS draws or fewer sets, or run `--inference nuts-exact`",
            c.ess
        )));
    }
    Ok(())
}

/// w_i / max w (0 for −∞).
fn normalised(log_weights: &[f64]) -> Vec<f64> {
    let max = log_weights.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    log_weights.iter().map(|l| if max.is_finite() { (l - max).exp() } else { 0.0 }).collect()
}

/// The weights' k̂, threshold and effective sample size.
pub fn diagnose(log_weights: &[f64]) -> Result<Correction, NapsuError> {
    let s = log_weights.len();
    let failed = log_weights.iter().filter(|l| !l.is_finite()).count();
    if s == 0 || failed == s {
        return Err(NapsuError::Numerical(
            "the exact posterior could not be evaluated at any draw; run `--inference nuts-exact`".into(),
        ));
    }
    let w = normalised(log_weights);
    let (sum, sum2) = w.iter().fold((0.0, 0.0), |(a, b), x| (a + x, b + x * x));
    let k_threshold = (1.0 - 1.0 / (s as f64).log10()).min(0.7);
    Ok(Correction { pareto_k: pareto_k(&w), k_threshold, ess: sum * sum / sum2, failed })
}

/// k̂ of the largest M = ⌈min(S/5, 3√S)⌉ weights (exceedances over the
/// (M+1)-th largest); `None` when all positive weights are equal (no tail:
/// the surrogate was exact on the draws); ∞ when the tail cannot be fitted
/// (fewer than 5 draws in it, or its top weights tied: a stuck chain), as
/// loo does.
pub fn pareto_k(weights: &[f64]) -> Option<f64> {
    let positive: Vec<f64> = weights.iter().copied().filter(|w| *w > 0.0).collect();
    if positive.iter().all(|w| *w == positive[0]) {
        return None;
    }
    let s = weights.len();
    let m = ((s as f64 / 5.0).min(3.0 * (s as f64).sqrt()).ceil() as usize).min(s.saturating_sub(1));
    if m < 5 {
        return Some(f64::INFINITY);
    }
    let mut sorted = weights.to_vec();
    sorted.sort_by(f64::total_cmp);
    let threshold = sorted[s - m - 1];
    let tail: Vec<f64> = sorted[s - m..].iter().map(|w| w - threshold).collect();
    if tail[m - 1] <= 0.0 {
        return Some(f64::INFINITY);
    }
    let k = gpd_shape(&tail);
    Some(if k.is_nan() { f64::INFINITY } else { k })
}

/// The shape ξ of a generalised Pareto fitted to `x` (ascending, ≥ 0) by
/// Zhang & Stephens (2009) §3: the posterior mean of θ = −b over a grid
/// of m = 30 + ⌊√n⌋ values weighted by the profile likelihood, then
/// ξ̂ = mean log(1 + θ̂x), shrunk towards 0.5 by Vehtari et al.'s prior
/// (as if 10 more observations had ξ = 0.5).
fn gpd_shape(x: &[f64]) -> f64 {
    let n = x.len();
    let nf = n as f64;
    let grid = 30 + nf.sqrt() as usize;
    let prior = 3.0;
    let quartile = x[((nf / 4.0 + 0.5) as usize).clamp(1, n) - 1].max(f64::MIN_POSITIVE);
    let xmax = x[n - 1];
    let xi_at = |b: f64| x.iter().map(|v| (-b * v).ln_1p()).sum::<f64>() / nf;
    let bs: Vec<f64> =
        (1..=grid).map(|j| 1.0 / xmax + (1.0 - (grid as f64 / (j as f64 - 0.5)).sqrt()) / (prior * quartile)).collect();
    let ls: Vec<f64> = bs
        .iter()
        .map(|&b| {
            let xi = xi_at(b);
            let l = nf * ((-b / xi).ln() - xi - 1.0);
            if l.is_finite() { l } else { f64::NEG_INFINITY }
        })
        .collect();
    let lmax = ls.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ws: Vec<f64> = ls.iter().map(|l| (l - lmax).exp()).collect();
    let total: f64 = ws.iter().sum();
    let b = bs.iter().zip(&ws).map(|(b, w)| b * w).sum::<f64>() / total;
    let xi = xi_at(b);
    (xi * nf + 10.0 * 0.5) / (nf + 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    fn normal(rng: &mut rand::rngs::SmallRng) -> f64 {
        // Box–Muller (a test's reference draws).
        let (u, v): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Generalised Pareto draws of known shape are fitted to within 0.1
    /// (n = 4,000: the estimate's sd is about 0.02–0.03).
    #[test]
    fn the_fit_recovers_a_generalised_paretos_shape() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for xi in [0.0f64, 0.3, 0.5, 0.9] {
            let mut x: Vec<f64> = (0..4000)
                .map(|_| {
                    let u: f64 = rng.random_range(0.0..1.0);
                    if xi == 0.0 { -(1.0 - u).ln() } else { ((1.0 - u).powf(-xi) - 1.0) / xi }
                })
                .collect();
            x.sort_by(f64::total_cmp);
            let k = gpd_shape(&x);
            assert!((k - xi).abs() < 0.1, "ξ = {xi}: k̂ = {k}");
        }
    }

    /// Proposal N(0, 1), target N(0, s²): the weights' tail has shape
    /// 1 − 1/s² (P(w > t) ~ t^(−1/(1−1/s²))). s² = 1.25 is reliable
    /// (k = 0.2), s² = 10 is not (k = 0.9); equal weights have no tail.
    #[test]
    fn pareto_k_of_normal_importance_ratios_follows_the_variance_ratio() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
        for (s2, want) in [(1.25f64, 0.2), (2.0, 0.5), (10.0, 0.9)] {
            let lw: Vec<f64> = (0..8000)
                .map(|_| {
                    let x = normal(&mut rng);
                    0.5 * x * x * (1.0 - 1.0 / s2) - 0.5 * s2.ln()
                })
                .collect();
            let c = diagnose(&lw).unwrap();
            let k = c.pareto_k.unwrap();
            eprintln!("s² = {s2}: k̂ = {k}");
            assert!((k - want).abs() < 0.15, "s² = {s2}: k̂ = {k}, want {want}");
            assert_eq!(check_reliable(&c, false).is_ok(), want < 0.7, "s² = {s2}");
            assert!(check_reliable(&c, true).is_ok());
        }
        let flat = diagnose(&[0.5; 1000]).unwrap();
        assert_eq!(flat.pareto_k, None);
        assert!(check_enough(&flat, 1000).is_ok() && check_enough(&flat, 1001).is_err());
        // Too few draws for a tail, or a tied top (a stuck chain): k̂ = ∞, refused unless accepted.
        let mut few = vec![-30.0; 20];
        few[0] = 0.0;
        let few = diagnose(&few).unwrap();
        assert_eq!(few.pareto_k, Some(f64::INFINITY));
        assert!(check_reliable(&few, false).is_err() && check_reliable(&few, true).is_ok());
        let mut tied = vec![-5.0; 1000];
        tied.iter_mut().take(500).for_each(|l| *l = 0.0);
        assert_eq!(diagnose(&tied).unwrap().pareto_k, Some(f64::INFINITY));
        // Draws the exact posterior could not score: refused unless accepted.
        let mut lost = vec![0.0; 1000];
        lost[3] = f64::NEG_INFINITY;
        let lost = diagnose(&lost).unwrap();
        assert_eq!((lost.pareto_k, lost.failed), (None, 1));
        assert!(check_reliable(&lost, false).is_err() && check_reliable(&lost, true).is_ok());
        assert!((flat.ess - 1000.0).abs() < 1e-9);
        assert!(diagnose(&[f64::NEG_INFINITY; 10]).is_err());
    }

    /// A small, strongly non-Gaussian NAPSU posterior (n = 300, σ = 2, so
    /// C(θ) moves with θ): NUTS on the exact posterior and corrected NUTS on
    /// the surrogate agree on the posterior mean within 4 Monte Carlo
    /// standard errors plus 0.05 sd. And the weights do the work: draws of
    /// a wider posterior, weighted, give the exact posterior's variances.
    #[test]
    fn corrected_nuts_matches_exact_nuts() {
        use crate::synth::napsu::laplace::{LaplaceOptions, laplace};
        use crate::synth::napsu::{CanonicalFeatures, MaxEnt};
        let mut noise = rand::rngs::SmallRng::seed_from_u64(9);
        let scopes = vec![vec![0, 1], vec![0, 2], vec![1, 2]];
        let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &[2, 2, 2], 100).unwrap());
        let truth = [0.4, -1.5, 0.8, 0.5, -0.6, 0.2];
        let (n, sigma) = (300.0, 2.0);
        let (mu, _) = me.moments(&truth);
        let stats: Vec<f64> = mu.iter().map(|m| m * n + sigma * noise.random_range(-1.5..1.5)).collect();
        let post = Posterior::new(me, stats, n, sigma).unwrap();
        let l = laplace(&post, &LaplaceOptions::default()).unwrap();
        let opts = NutsOptions { chains: 2, warmup: 400, draws: 2000, ..Default::default() };
        let exact = sample(&post, &l, &opts, &mut DpRng::unsafe_seeded(1), &|_| {}, &mut |_| 1.0).unwrap();
        let weighted_mean = |draws: &[Vec<f64>], lw: &[f64]| -> Vec<f64> {
            let w = normalised(lw);
            let total: f64 = w.iter().sum();
            (0..l.mean.len()).map(|j| draws.iter().zip(&w).map(|(x, w)| x[j] * w).sum::<f64>() / total).collect()
        };
        let agree = |got: &[f64], ess: f64, what: &str| {
            for (j, g) in got.iter().enumerate() {
                let sd = l.cov[(j, j)].sqrt();
                let se = sd * (1.0 / ess + 1.0 / exact.ess[j]).sqrt();
                let want = exact.mean()[j];
                assert!((g - want).abs() < 4.0 * se + 0.05 * sd, "{what} θ_{j}: {g} vs exact {want} (sd {sd})");
            }
        };
        let c = sample_corrected(&post, &l, &opts, &mut DpRng::unsafe_seeded(2), &|_| {}, &mut |_| 1.0).unwrap();
        check_reliable(&c.correction, false).unwrap();
        let ess = c.correction.ess.min(c.nuts.min_ess());
        agree(&weighted_mean(&c.nuts.draws, &c.log_weights), ess, "corrected");
        // The weights themselves: NUTS on the posterior of noise 1.6σ (wider)
        // weighted by π/π' gives the exact posterior's variances, which the
        // raw draws overstate.
        let wide = Posterior::new(post.me.clone(), post.stats.iter().copied().collect(), n, 1.6 * sigma).unwrap();
        let d = sample(&wide, &l, &opts, &mut DpRng::unsafe_seeded(3), &|_| {}, &mut |_| 1.0).unwrap();
        let lw: Vec<f64> =
            d.draws.iter().map(|t| post.log_density(t).unwrap() - wide.log_density(t).unwrap()).collect();
        let corr = diagnose(&lw).unwrap();
        check_reliable(&corr, false).unwrap();
        let variance = |draws: &[Vec<f64>], w: &[f64], j: usize| {
            let total: f64 = w.iter().sum();
            let mean = draws.iter().zip(w).map(|(x, w)| x[j] * w).sum::<f64>() / total;
            draws.iter().zip(w).map(|(x, w)| (x[j] - mean).powi(2) * w).sum::<f64>() / total
        };
        let (ones, ew) = (vec![1.0; d.draws.len()], vec![1.0; exact.draws.len()]);
        let w = normalised(&lw);
        let mut overstated = 0;
        for j in 0..l.mean.len() {
            let want = variance(&exact.draws, &ew, j);
            let (raw, weighted) = (variance(&d.draws, &ones, j), variance(&d.draws, &w, j));
            // A variance estimate's relative sd is about √(2/ESS).
            let tol = 4.0 * (2.0 / corr.ess.min(d.ess[j]) + 2.0 / exact.ess[j]).sqrt() + 0.05;
            assert!((weighted / want - 1.0).abs() < tol, "θ_{j}: weighted variance {weighted} vs exact {want}");
            overstated += usize::from(raw / want - 1.0 > tol);
        }
        assert!(overstated > 0, "the wider posterior's raw draws should overstate some variance");
    }

    /// Resampling follows the weights: two draws with weights 1 and 3 are
    /// picked 1/4 and 3/4 of the time (4 SE at n = 20,000), and a draw of
    /// weight 0 never.
    #[test]
    fn resampling_follows_the_weights() {
        let nuts = NutsDraws {
            draws: vec![vec![0.0], vec![1.0], vec![2.0]],
            chains: 1,
            rhat: vec![1.0],
            ess: vec![3.0],
            divergences: 0,
            gradients: 0,
            mean_steps: 1.0,
            step_sizes: vec![0.1],
        };
        let c = CorrectedDraws {
            nuts,
            log_weights: vec![0.0, 3f64.ln(), f64::NEG_INFINITY],
            correction: diagnose(&[0.0, 3f64.ln(), f64::NEG_INFINITY]).unwrap(),
        };
        assert_eq!(c.correction.failed, 1);
        let mut rng = DpRng::unsafe_seeded(5);
        let picks = c.resample(20_000, &mut rng).unwrap();
        let ones = picks.iter().filter(|t| t[0] == 1.0).count() as f64 / 20_000.0;
        assert!((ones - 0.75).abs() < 4.0 * (0.75f64 * 0.25 / 20_000.0).sqrt(), "{ones}");
        assert!(picks.iter().all(|t| t[0] != 2.0));
    }
}
