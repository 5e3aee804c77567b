//! Posterior draws by the No-U-Turn Sampler (`nuts-rs`), with convergence
//! diagnostics (003 §4 and App. D; NOTES §6).
//!
//! Defaults as 003's Adult experiment: 4 chains, 800 warm-up and 2,000 kept
//! draws per chain, maximum tree depth 12. The posterior is first
//! normalised with the Laplace approximation (θ = m + L z, with m the mode
//! and LLᵀ its covariance), as 003 does, so the sampler sees a roughly
//! standard normal. Chains run on their own threads, each with its own
//! stream of a ChaCha20 generator ([`DpRng::fork`]).
//!
//! **Diagnostics** (Gelman et al., BDA3 §11.4–11.5): split-R̂ over the
//! chains cut in halves, and the effective sample size from the chains'
//! combined autocorrelations truncated by Geyer's initial positive sequence.
//! Draws whose largest R̂ exceeds 1.05 are refused unless the caller
//! overrides it: the decision is made on draws that are post-processing of
//! the DP statistics, so refusing or publishing spends nothing. The release
//! ([`super::release`]) decides on R̂ of the mean parameters μ(θ) and
//! records θ's too: R̂ is not invariant under reparametrisation, and θ's
//! directions held only by the N(0, 10²) prior wander to −40 where a rare
//! cell's probability is 0 either way, so θ's R̂ flags runs whose released
//! distributions have mixed (`benches/results/napsu/twinify.md`).

use std::collections::HashMap;

use dpflow_udfs::noise::DpRng;
use nuts_rs::{Chain, CpuLogpFunc, CpuMath, CpuMathError, DiagNutsSettings, HasDims, LogpError, Settings};

use rayon::prelude::*;

use super::NapsuError;
use super::laplace::{Laplace, LogDensity};

/// NUTS settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NutsOptions {
    /// Chains (each on its own thread).
    pub chains: usize,
    /// Warm-up draws per chain (discarded).
    pub warmup: u64,
    /// Kept draws per chain.
    pub draws: u64,
    /// Maximum tree depth.
    pub max_depth: u64,
    /// Largest R̂ accepted.
    pub max_rhat: f64,
    /// How warm-up estimates the diagonal mass matrix.
    pub mass: MassAdaptation,
}

impl Default for NutsOptions {
    fn default() -> Self {
        NutsOptions {
            chains: 4,
            warmup: 800,
            draws: 2000,
            max_depth: 12,
            max_rhat: 1.05,
            mass: MassAdaptation::default(),
        }
    }
}

/// How warm-up estimates the diagonal mass matrix (in the coordinates the
/// Laplace approximation normalised).
///
/// Measured on the 19-parameter Adult model (`benches/results/napsu/twinify.md`,
/// 20 repeats per ε): both leave R̂ above 1.05 in 3–4 of 20 runs, on
/// directions held by a rare cell's wall on one side and only by the
/// N(0, 10²) prior on the other; the draws-only estimate takes 2.2–2.7× the
/// gradients for it. So the default stays nuts-rs's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MassAdaptation {
    /// The variance of the warm-up draws (Stan's and NumPyro's estimate,
    /// which twinify uses).
    Draws,
    /// nuts-rs's default, √(Var draws / Var gradients): exact for a
    /// Gaussian and quick to settle.
    #[default]
    DrawsAndGradients,
}

/// Most chains: each runs on its own thread.
pub const MAX_CHAINS: usize = 64;

/// Most memory the kept draws may take (they are held twice while the
/// chains are joined).
pub const MAX_DRAW_BYTES: u64 = 4 << 30;

impl NutsOptions {
    /// Checks the settings for a posterior of `dim` parameters: public
    /// inputs, checked before anything is charged, so that a setting cannot
    /// fail the run (a thread that cannot start, memory that runs out) after
    /// the statistics were measured.
    pub fn check(&self, dim: usize) -> Result<(), NapsuError> {
        let bad = |what: String| Err(NapsuError::Query(what));
        if self.chains == 0 || self.chains > MAX_CHAINS {
            return bad(format!("NUTS chains must be between 1 and {MAX_CHAINS}, not {}", self.chains));
        }
        if self.draws < 4 {
            return bad(format!("NUTS needs at least four draws per chain, not {}", self.draws));
        }
        if self.max_depth == 0 || self.max_depth > 16 {
            return bad(format!("the NUTS tree depth must be between 1 and 16, not {}", self.max_depth));
        }
        let bytes = (self.chains as u64)
            .saturating_mul(self.draws)
            .saturating_mul(dim as u64)
            .saturating_mul(2 * std::mem::size_of::<f64>() as u64);
        if bytes > MAX_DRAW_BYTES {
            return bad(format!(
                "{} chains × {} draws × {dim} parameters would hold {:.1} GiB of draws (at most {} GiB): lower the \
                 draws or the chains",
                self.chains,
                self.draws,
                bytes as f64 / (1u64 << 30) as f64,
                MAX_DRAW_BYTES >> 30
            ));
        }
        if self.warmup.checked_add(self.draws).is_none_or(|t| t > 10_000_000) {
            return bad("NUTS warm-up plus draws must be at most 10,000,000 per chain".into());
        }
        Ok(())
    }
}

/// Draws and their diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct NutsDraws {
    /// Kept draws, chain after chain (θ space).
    pub draws: Vec<Vec<f64>>,
    /// Chains.
    pub chains: usize,
    /// Split-R̂ per parameter.
    pub rhat: Vec<f64>,
    /// Effective sample size per parameter.
    pub ess: Vec<f64>,
    /// Divergent transitions after warm-up.
    pub divergences: u64,
    /// Gradient evaluations, warm-up included, over all chains: the cost.
    pub gradients: u64,
    /// Mean leapfrog steps per kept draw (a tree of depth k takes up to
    /// 2^k − 1).
    pub mean_steps: f64,
    /// Each chain's step size after warm-up.
    pub step_sizes: Vec<f64>,
}

impl NutsDraws {
    /// The largest R̂.
    pub fn max_rhat(&self) -> f64 {
        // NaN if any is (f64::max would drop it) or there are none.
        if self.rhat.is_empty() || self.rhat.iter().any(|r| r.is_nan()) {
            return f64::NAN;
        }
        self.rhat.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
    }
    /// The smallest effective sample size.
    pub fn min_ess(&self) -> f64 {
        self.ess.iter().cloned().fold(f64::NAN, f64::min)
    }
    /// The largest split-R̂ of `f`, a vector function of θ, over the draws
    /// (chain by chain, as θ's; NaN if any component's is). [`super::release`]
    /// decides on R̂ of the mean parameters μ(θ), what the synthetic data
    /// depend on. Streams: it keeps a running mean and variance per half
    /// chain (Welford), not f of every draw, so it needs no more memory than
    /// the checks before the charge allowed for.
    pub fn max_rhat_of<F: Fn(&[f64]) -> Vec<f64> + Sync>(&self, f: F) -> f64 {
        let per = self.draws.len() / self.chains.max(1);
        let half = per / 2;
        if half < 2 {
            return f64::NAN;
        }
        // Per chain, as `split_rhat`: its first and its last `half` draws.
        let halves: Vec<Running> = self
            .draws
            .par_chunks(per)
            .flat_map_iter(|chain| {
                [&chain[..half], &chain[per - half..]].map(|part| {
                    let mut acc = Running::default();
                    part.iter().for_each(|t| acc.push(&f(t)));
                    acc
                })
            })
            .collect();
        let width = halves.first().map_or(0, |h| h.mean.len());
        let n = half as f64;
        let mut worst = f64::NEG_INFINITY;
        for j in 0..width {
            let means: Vec<f64> = halves.iter().map(|h| h.mean[j]).collect();
            let w = mean(&halves.iter().map(|h| h.m2[j] / (n - 1.0)).collect::<Vec<_>>());
            let r = rhat_from(n, w, n * variance(&means));
            if r.is_nan() {
                return f64::NAN;
            }
            worst = worst.max(r);
        }
        if width == 0 { f64::NAN } else { worst }
    }
    /// Posterior mean of each parameter.
    pub fn mean(&self) -> Vec<f64> {
        let d = self.draws.first().map_or(0, Vec::len);
        let n = self.draws.len() as f64;
        (0..d).map(|j| self.draws.iter().map(|x| x[j]).sum::<f64>() / n).collect()
    }
}

/// Running means and sums of squared deviations of a vector (Welford).
#[derive(Default)]
struct Running {
    n: f64,
    mean: Vec<f64>,
    m2: Vec<f64>,
}

impl Running {
    fn push(&mut self, v: &[f64]) {
        if self.mean.is_empty() {
            self.mean = vec![0.0; v.len()];
            self.m2 = vec![0.0; v.len()];
        }
        self.n += 1.0;
        for ((x, m), s) in v.iter().zip(self.mean.iter_mut()).zip(self.m2.iter_mut()) {
            let d = x - *m;
            *m += d / self.n;
            *s += d * (x - *m);
        }
    }
}

/// One chain's kept draws and what it cost.
struct ChainDraws {
    kept: Vec<Vec<f64>>,
    divergences: u64,
    gradients: u64,
    kept_steps: u64,
    step_size: f64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct DensityError(String);

impl LogpError for DensityError {
    fn is_recoverable(&self) -> bool {
        // A failure at one point (a covariance that is not positive definite
        // far in the tails) is treated as a divergence there.
        true
    }
}

/// The density in normalised coordinates z (θ = m + L z).
struct Normalised<'a, D: LogDensity> {
    density: &'a D,
    laplace: &'a Laplace,
}

impl<D: LogDensity> HasDims for Normalised<'_, D> {
    fn dim_sizes(&self) -> HashMap<String, u64> {
        HashMap::from([("theta".to_string(), self.density.dim() as u64)])
    }
}

impl<D: LogDensity> CpuLogpFunc for Normalised<'_, D> {
    type LogpError = DensityError;
    type FlowParameters = ();
    type ExpandedVector = Vec<f64>;

    fn dim(&self) -> usize {
        self.density.dim()
    }

    fn logp(&mut self, z: &[f64], gradient: &mut [f64]) -> Result<f64, DensityError> {
        let theta = self.laplace.at(z);
        let (lp, g) = self.density.value_and_gradient(&theta).map_err(|e| DensityError(e.to_string()))?;
        if !lp.is_finite() {
            return Err(DensityError("log-density is not finite".into()));
        }
        // ∂/∂z = Lᵀ ∂/∂θ.
        let l = &self.laplace.cov_chol;
        for (j, out) in gradient.iter_mut().enumerate() {
            *out = (j..g.len()).map(|i| l[(i, j)] * g[i]).sum();
        }
        Ok(lp)
    }

    fn expand_vector<R: rand::Rng + ?Sized>(&mut self, _rng: &mut R, z: &[f64]) -> Result<Vec<f64>, CpuMathError> {
        Ok(self.laplace.at(z))
    }
}

/// Draws from `density` by NUTS, normalised with `laplace`. `progress`
/// hears each chain ten times (draws done, step size, tree size).
pub fn sample<D: LogDensity + Sync>(
    density: &D,
    laplace: &Laplace,
    opts: &NutsOptions,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
) -> Result<NutsDraws, NapsuError> {
    opts.check(density.dim())?;
    let mut settings = DiagNutsSettings {
        num_tune: opts.warmup,
        num_draws: opts.draws,
        maxdepth: opts.max_depth,
        ..Default::default()
    };
    settings.adapt_options.mass_matrix_options.use_grad_based_estimate = opts.mass == MassAdaptation::DrawsAndGradients;
    let d = density.dim();
    let rngs: Vec<DpRng> = (0..opts.chains).map(|_| rng.fork()).collect();
    // Chains report through a channel that this thread drains, so that
    // `progress` need not be shareable between threads.
    let (tell, heard) = std::sync::mpsc::channel::<String>();
    let results: Vec<Result<ChainDraws, NapsuError>> = std::thread::scope(|s| {
        let handles: Vec<_> = rngs
            .into_iter()
            .enumerate()
            .map(|(c, mut r)| {
                let settings = &settings;
                let tell = tell.clone();
                // A thread the OS refuses is an error, not a panic.
                std::thread::Builder::new().name(format!("nuts-chain-{c}")).spawn_scoped(
                    s,
                    move || -> Result<ChainDraws, NapsuError> {
                        let math = CpuMath::new(Normalised { density, laplace });
                        let fail = |e: String| NapsuError::Numerical(format!("NUTS chain {c}: {e}"));
                        let mut chain = settings.new_chain(c as u64, math, &mut r).map_err(|e| fail(e.to_string()))?;
                        // Start near the mode, jittered so chains differ.
                        let start: Vec<f64> =
                            (0..d).map(|j| 0.1 * (((c * 31 + j * 17) % 13) as f64 / 6.0 - 1.0)).collect();
                        chain.set_position(&start).map_err(|e| fail(e.to_string()))?;
                        let mut out = ChainDraws {
                            kept: Vec::with_capacity(opts.draws as usize),
                            divergences: 0,
                            gradients: 0,
                            kept_steps: 0,
                            step_size: f64::NAN,
                        };
                        let total = opts.warmup + opts.draws;
                        let started = std::time::Instant::now();
                        let every = (total / 10).max(1);
                        for i in 0..total {
                            let (z, info) = chain.draw().map_err(|e| fail(e.to_string()))?;
                            out.gradients += info.num_gradients;
                            if (i + 1) % every == 0 {
                                // Post-processing of the DP statistics: safe to show.
                                // The pace so far gives a rough end time (warm-up
                                // trees are often the larger ones). A closed
                                // channel only loses the message.
                                let spent = started.elapsed().as_secs_f64();
                                let left = spent * (total - i - 1) as f64 / (i + 1) as f64;
                                let _ = tell.send(format!(
                                    "napsu-mq: NUTS chain {c}: {} of {total} draws, step size {:.3}, {} leapfrog steps; \
                                     {:.0}s so far, about {:.0}s to go at this pace",
                                    i + 1,
                                    info.step_size,
                                    info.num_steps,
                                    spent,
                                    left
                                ));
                            }
                            if !info.tuning {
                                out.divergences += u64::from(info.diverging);
                                out.kept_steps += info.num_steps;
                                out.step_size = info.step_size;
                                out.kept.push(laplace.at(&z));
                            }
                        }
                        Ok(out)
                    },
                )
            })
            .collect();
        drop(tell);
        for message in heard {
            progress(&message);
        }
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(NapsuError::Numerical("a NUTS chain panicked".into()))),
                Err(e) => Err(NapsuError::Numerical(format!("a NUTS chain's thread could not start: {e}"))),
            })
            .collect()
    });
    let mut per_chain = Vec::with_capacity(opts.chains);
    let (mut divergences, mut gradients, mut kept_steps, mut step_sizes) = (0, 0, 0, Vec::new());
    for r in results {
        let c = r?;
        per_chain.push(c.kept);
        divergences += c.divergences;
        gradients += c.gradients;
        kept_steps += c.kept_steps;
        step_sizes.push(c.step_size);
    }
    let rhat = (0..d).map(|j| split_rhat(&column(&per_chain, j))).collect();
    let ess = (0..d).map(|j| effective_sample_size(&column(&per_chain, j))).collect();
    let kept = per_chain.iter().map(Vec::len).sum::<usize>().max(1);
    Ok(NutsDraws {
        chains: opts.chains,
        draws: per_chain.concat(),
        rhat,
        ess,
        divergences,
        gradients,
        mean_steps: kept_steps as f64 / kept as f64,
        step_sizes,
    })
}

/// Refuses draws whose largest R̂, `r`, exceeds `max_rhat` (unless `allow`).
pub fn check_converged(r: f64, max_rhat: f64, allow: bool) -> Result<(), NapsuError> {
    // A NaN R̂ (a log-density that gave NaN somewhere) is not convergence either.
    if !allow && r.partial_cmp(&max_rhat).is_none_or(|o| o == std::cmp::Ordering::Greater) {
        return Err(NapsuError::Numerical(format!(
            "the NUTS chains did not converge (largest R̂ {r:.3} > {max_rhat}); run longer chains (more warm-up and \
             draws), or accept the draws explicitly"
        )));
    }
    Ok(())
}

fn column(chains: &[Vec<Vec<f64>>], j: usize) -> Vec<Vec<f64>> {
    chains.iter().map(|c| c.iter().map(|x| x[j]).collect()).collect()
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

fn variance(x: &[f64]) -> f64 {
    let m = mean(x);
    x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() as f64 - 1.0)
}

/// Split-R̂ (BDA3 §11.4): each chain cut in two halves.
pub fn split_rhat(chains: &[Vec<f64>]) -> f64 {
    let halves: Vec<&[f64]> = chains
        .iter()
        .flat_map(|c| {
            let h = c.len() / 2;
            [&c[..h], &c[c.len() - h..]]
        })
        .collect();
    let n = halves[0].len() as f64;
    let means: Vec<f64> = halves.iter().map(|h| mean(h)).collect();
    let b = n * variance(&means);
    let w = mean(&halves.iter().map(|h| variance(h)).collect::<Vec<_>>());
    rhat_from(n, w, b)
}

/// R̂ from n draws per half chain, the mean within-half variance `w` and
/// the between-half variance `b` (n times the variance of the half means).
fn rhat_from(n: f64, w: f64, b: f64) -> f64 {
    if w <= 0.0 {
        return if b <= 0.0 { 1.0 } else { f64::INFINITY };
    }
    let var_plus = (n - 1.0) / n * w + b / n;
    (var_plus / w).sqrt()
}

/// Effective sample size over chains (BDA3 §11.5): autocorrelations
/// ρ_t = 1 − (W − mean autocovariance_t)/var⁺, summed in pairs while the
/// pair sums stay positive (Geyer's initial positive sequence).
pub fn effective_sample_size(chains: &[Vec<f64>]) -> f64 {
    let m = chains.len() as f64;
    let n = chains.iter().map(Vec::len).min().unwrap_or(0);
    if n < 4 {
        return f64::NAN;
    }
    let chains: Vec<&[f64]> = chains.iter().map(|c| &c[..n]).collect();
    let means: Vec<f64> = chains.iter().map(|c| mean(c)).collect();
    let w = mean(&chains.iter().map(|c| variance(c)).collect::<Vec<_>>());
    let b = if chains.len() > 1 { n as f64 * variance(&means) } else { 0.0 };
    let var_plus = (n as f64 - 1.0) / n as f64 * w + b / n as f64;
    if var_plus <= 0.0 {
        return m * n as f64;
    }
    let autocov = |t: usize| -> f64 {
        mean(
            &chains
                .iter()
                .zip(&means)
                .map(|(c, mu)| (0..n - t).map(|i| (c[i] - mu) * (c[i + t] - mu)).sum::<f64>() / n as f64)
                .collect::<Vec<_>>(),
        )
    };
    let rho = |t: usize| 1.0 - (w - autocov(t)) / var_plus;
    let mut sum = 0.0;
    let mut t = 1;
    while t + 1 < n {
        let pair = rho(t) + rho(t + 1);
        if pair <= 0.0 {
            break;
        }
        sum += pair;
        t += 2;
    }
    m * n as f64 / (1.0 + 2.0 * sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::napsu::laplace::{LaplaceOptions, laplace};
    use crate::synth::napsu::likelihood::Posterior;
    use crate::synth::napsu::{CanonicalFeatures, MaxEnt};
    use rand::{RngExt, SeedableRng};

    #[test]
    fn rhat_and_ess_on_known_chains() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        // Independent draws: R̂ ≈ 1, ESS ≈ all draws.
        let iid: Vec<Vec<f64>> = (0..4).map(|_| (0..1000).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
        assert!((split_rhat(&iid) - 1.0).abs() < 0.01, "{}", split_rhat(&iid));
        let ess = effective_sample_size(&iid);
        assert!(ess > 3000.0 && ess < 5000.0, "{ess}");
        // Chains stuck at different places: R̂ far above 1.
        let stuck: Vec<Vec<f64>> =
            (0..4).map(|c| (0..1000).map(|_| c as f64 + rng.random_range(-0.1..0.1)).collect()).collect();
        assert!(split_rhat(&stuck) > 5.0);
        // An AR(1) chain with φ = 0.9: ESS ≈ n(1 − φ)/(1 + φ) ≈ 5.3% of draws.
        let ar: Vec<Vec<f64>> = (0..4)
            .map(|_| {
                let mut x = 0.0;
                (0..20_000)
                    .map(|_| {
                        x = 0.9 * x + rng.random_range(-1.0..1.0);
                        x
                    })
                    .collect()
            })
            .collect();
        let ess = effective_sample_size(&ar) / 80_000.0;
        assert!((ess - 0.1 / 1.9).abs() < 0.015, "{ess}");
    }

    /// R̂ of a function of the draws, chain by chain: the identity gives
    /// θ's, a function of the well-mixed coordinate alone gives that
    /// coordinate's, and a constant has nothing to disagree on.
    #[test]
    fn rhat_of_a_function_of_the_draws() {
        // Two coordinates; chain 3 sits at −30 in the second for its last half.
        let per_chain: Vec<Vec<Vec<f64>>> = (0..4u64)
            .map(|c| {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(c);
                (0..500)
                    .map(|i| {
                        let away = if c == 3 && i >= 250 { -30.0 } else { 0.0 };
                        vec![rng.random_range(-1.0..1.0), away + rng.random_range(-1.0..1.0)]
                    })
                    .collect()
            })
            .collect();
        let d = NutsDraws {
            rhat: (0..2).map(|j| split_rhat(&column(&per_chain, j))).collect(),
            ess: vec![1.0, 1.0],
            draws: per_chain.concat(),
            chains: 4,
            divergences: 0,
            gradients: 0,
            mean_steps: 1.0,
            step_sizes: vec![0.1; 4],
        };
        assert!(d.max_rhat() > 2.0, "{}", d.max_rhat());
        // The streamed (Welford) R̂ equals `split_rhat` on the stored draws.
        assert!((d.max_rhat_of(|t| t.to_vec()) - d.max_rhat()).abs() < 1e-9);
        assert!((d.max_rhat_of(|t| vec![2.0 * t[0]]) - d.rhat[0]).abs() < 1e-9);
        assert!(d.max_rhat_of(|t| vec![t[0], f64::NAN]).is_nan());
        assert!(d.rhat[0] < 1.01, "{}", d.rhat[0]);
        assert_eq!(d.max_rhat_of(|_| vec![1.0]), 1.0);
    }

    /// 003 §5's toy shape with noisy statistics: NUTS and Laplace agree on
    /// the posterior mean within Monte Carlo error (4 standard errors) plus a
    /// tenth of a posterior standard deviation (Laplace centres on the mode).
    #[test]
    fn nuts_and_laplace_agree_on_a_small_napsu_posterior() {
        let mut noise = rand::rngs::SmallRng::seed_from_u64(9);
        let scopes = vec![vec![0, 1], vec![0, 2], vec![1, 2]];
        let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &[2, 2, 2], 100).unwrap());
        let truth = [0.4, -0.3, 0.8, 0.5, -0.6, 0.2];
        let n = 2000.0;
        let sigma = 20.0;
        let (mu, _) = me.moments(&truth);
        let stats: Vec<f64> = mu.iter().map(|m| m * n + sigma * (noise.random_range(-1.0..1.0) * 1.7)).collect();
        let post = Posterior::new(me, stats, n, sigma).unwrap();
        let l = laplace(&post, &LaplaceOptions::default()).unwrap();
        let mut rng = DpRng::unsafe_seeded(5);
        let opts = NutsOptions { chains: 2, warmup: 300, draws: 600, ..Default::default() };
        let draws = sample(&post, &l, &opts, &mut rng, &|_| {}).unwrap();
        check_converged(draws.max_rhat(), 1.05, false).unwrap();
        // The cost figures: every iteration takes at least one gradient, and
        // a kept draw's tree at most 2^depth − 1 leapfrog steps.
        assert!(draws.gradients >= 2 * 900, "{}", draws.gradients);
        assert!(draws.mean_steps >= 1.0 && draws.mean_steps <= 4095.0, "{}", draws.mean_steps);
        assert_eq!(draws.step_sizes.len(), 2);
        assert!(draws.step_sizes.iter().all(|e| *e > 0.0 && e.is_finite()));
        let m = draws.mean();
        for (j, mj) in m.iter().enumerate() {
            let sd = l.cov[(j, j)].sqrt();
            let se = sd / draws.ess[j].sqrt();
            assert!(
                (mj - l.mean[j]).abs() < 4.0 * se + 0.1 * sd,
                "θ_{j}: NUTS mean {} vs Laplace {} (sd {sd}, ESS {})",
                mj,
                l.mean[j],
                draws.ess[j]
            );
        }
    }
}
