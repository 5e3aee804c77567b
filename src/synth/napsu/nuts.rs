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
//! **Diagnostics**: rank-normalised split-R̂ ([`rank_diagnostics`]: Vehtari
//! et al. 2021 §4, on top of BDA3 §11.4's split-R̂), and the effective
//! sample size from the chains' combined autocorrelations truncated by
//! Geyer's initial monotone sequence (BDA3 §11.5; Stan's and ArviZ's). Draws whose largest R̂
//! exceeds 1.05 are refused unless the caller overrides it: the decision
//! is made on draws that are post-processing of the DP statistics, so
//! refusing or publishing spends nothing. The release ([`super::release`])
//! decides on R̂ of the mean parameters μ(θ) and records θ's too: R̂ is not
//! invariant under reparametrisation, and θ's directions held only by the
//! N(0, 10²) prior wander to −40 where a rare cell's probability is 0 either
//! way, so θ's R̂ flags runs whose released distributions have mixed
//! (`benches/results/napsu/twinify.md`). μ's R̂ uses ranks for cells with
//! at least one expected row in some half chain, so chains that disagree on
//! a rare cell's typical count are seen even when its excursions dominate
//! the variance; below that floor it uses plain split-R̂ with one row's
//! variance added, which chains apart by much less than a row in θ's tails
//! do not move ([`NutsDraws::convergence_of`]).
//!
//! **Longer chains on demand** ([`sample`]): while that R̂ is over the
//! limit, the chains go on (adaptation frozen) until their kept draws
//! double, up to [`NutsOptions::max_draws`] (4 × 2,000 by default). On
//! Adult-reduced at 003's 2,000 draws, a third of the runs at ε = 1 were
//! over 1.05 with bulk ESS 13–36 (`benches/results/napsu/twinify.md`):
//! rare cells' chains that mix slowly, not chains stuck apart. Stopping
//! once R̂ passes is the standard "run longer" advice made automatic; the
//! draws and the decision are post-processing of the DP statistics.

use std::collections::HashMap;

use dpflow_udfs::noise::DpRng;
use nuts_rs::{Chain, CpuLogpFunc, CpuMath, CpuMathError, DiagNutsSettings, HasDims, LogpError, Settings};

use rayon::prelude::*;
use rustfft::FftPlanner;
use rustfft::num_complex::Complex;
use statrs::distribution::{ContinuousCDF, Normal};

use super::NapsuError;
use super::laplace::{Laplace, LogDensity, Normalisation};

/// NUTS settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NutsOptions {
    /// Chains (each on its own thread).
    pub chains: usize,
    /// Warm-up draws per chain (discarded).
    pub warmup: u64,
    /// Kept draws per chain.
    pub draws: u64,
    /// Most kept draws per chain: while the largest R̂ exceeds `max_rhat`,
    /// the chains go on until their draws double, up to this ([`sample`]).
    /// `None`: 4 × `draws`; equal to `draws` for no longer chains.
    pub max_draws: Option<u64>,
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
            max_draws: None,
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
/// chains are joined, and the mean parameters of each once for R̂).
pub const MAX_DRAW_BYTES: u64 = 4 << 30;

impl NutsOptions {
    /// The most kept draws per chain ([`NutsOptions::max_draws`]; 4 × `draws` unless set).
    pub fn most_draws(&self) -> u64 {
        self.max_draws.unwrap_or(self.draws.saturating_mul(4))
    }

    /// Checks the settings for a posterior of `dim` parameters whose
    /// convergence is judged on `judged` numbers per draw (μ(θ)'s width,
    /// [`NutsDraws::convergence_of`]): public inputs, checked before
    /// anything is charged, so that a setting cannot fail the run (a thread
    /// that cannot start, memory that runs out) after the statistics were
    /// measured.
    pub fn check(&self, dim: usize, judged: usize) -> Result<(), NapsuError> {
        let bad = |what: String| Err(NapsuError::Query(what));
        if self.chains == 0 || self.chains > MAX_CHAINS {
            return bad(format!("NUTS chains must be between 1 and {MAX_CHAINS}, not {}", self.chains));
        }
        if self.draws < 4 {
            return bad(format!("NUTS needs at least four draws per chain, not {}", self.draws));
        }
        let most = self.most_draws();
        // Said when the user did not set the most draws, which checks below use.
        let implied = if self.max_draws.is_none() { " (4 × the draws unless set)" } else { "" };
        if most < self.draws {
            return bad(format!(
                "the most NUTS draws per chain ({most}) must be at least the draws per chain ({})",
                self.draws
            ));
        }
        if self.max_depth == 0 || self.max_depth > 16 {
            return bad(format!("the NUTS tree depth must be between 1 and 16, not {}", self.max_depth));
        }
        // θ's draws twice (while the chains are joined), then f(θ) of each once.
        let per_draw = (dim as u64).saturating_mul(2).saturating_add(judged as u64);
        let bytes = (self.chains as u64)
            .saturating_mul(most)
            .saturating_mul(per_draw)
            .saturating_mul(std::mem::size_of::<f64>() as u64);
        if bytes > MAX_DRAW_BYTES {
            return bad(format!(
                "{} chains × {most} draws (the most per chain{implied}, when R̂ asks for longer chains) × ({dim} \
                 parameters, {judged} mean parameters) would hold {:.1} GiB of draws (at most {} GiB): lower the most \
                 draws, the draws or the chains",
                self.chains,
                bytes as f64 / (1u64 << 30) as f64,
                MAX_DRAW_BYTES >> 30
            ));
        }
        if self.warmup.checked_add(most).is_none_or(|t| t > 10_000_000) {
            return bad(format!(
                "NUTS warm-up plus the most draws per chain ({most}{implied}) must be at most 10,000,000"
            ));
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
    /// Rank-normalised split-R̂ per parameter ([`rank_diagnostics`]).
    pub rhat: Vec<f64>,
    /// Effective sample size per parameter (of the draws themselves: the
    /// Monte Carlo error of their means).
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
        // NaN if any is (f64::min would drop it) or there are none.
        if self.ess.is_empty() || self.ess.iter().any(|e| e.is_nan()) {
            return f64::NAN;
        }
        self.ess.iter().cloned().fold(f64::INFINITY, f64::min)
    }
    /// The convergence of `f`, a vector function of θ, over the draws
    /// (chain by chain, as θ's): the largest R̂ that decides and the
    /// smallest bulk ESS over its components ([`Convergence`]; R̂ NaN if any
    /// component's is). A component with a half chain whose median is at
    /// least `floor` is judged by its rank-normalised R̂
    /// ([`rank_diagnostics`]); one below it in every half by plain split-R̂
    /// with floor² added to the within-half variance, so halves apart by
    /// much less than `floor` agree. [`super::release`] decides on μ(θ),
    /// what the synthetic data depend on, with the floor at one expected row
    /// (1/n̂): ranks see the same disagreement in a cell's count whatever its
    /// scale, but they also see θ's prior-held tails, which move a cell
    /// whose probability is ~0 between values no synthetic set can tell
    /// apart, and which θ's R̂ flags (module doc). A cell some chain holds
    /// at a few rows while others hold it at 0 is judged by ranks. Holds f of every draw
    /// once (each chain's rows, then one component at a time): the check
    /// before the charge ([`NutsOptions::check`]) counts that memory.
    pub fn convergence_of<F: Fn(&[f64]) -> Vec<f64> + Sync>(&self, f: F, floor: f64) -> Convergence {
        let per = self.draws.len() / self.chains.max(1);
        if per / 2 < 2 || self.draws.len() != per * self.chains {
            return Convergence::NAN;
        }
        // Each chain's f(θ) rows, flat (row-major), computed on all cores.
        let width = self.draws.first().map_or(0, |t| f(t).len());
        let rows: Vec<Vec<f64>> = self
            .draws
            .par_chunks(per)
            .map(|chain| {
                let mut flat = Vec::with_capacity(per * width);
                chain.iter().for_each(|t| flat.extend(f(t)));
                flat
            })
            .collect();
        if width == 0 || rows.iter().any(|r| r.len() != width * per) {
            return Convergence::NAN;
        }
        // Below the floor: plain split-R̂ with one row's variance (floor²) added
        // within halves, so chains apart by much less than a row agree.
        let extra = if floor.is_finite() { floor * floor } else { 0.0 };
        let each: Vec<(Diagnostics, f64)> = (0..width)
            .into_par_iter()
            .map(|j| {
                let chains: Vec<Vec<f64>> =
                    rows.iter().map(|r| r.iter().skip(j).step_by(width).copied().collect()).collect();
                (rank_diagnostics(&chains), rhat_of_halves_plus(&split(&chains), extra))
            })
            .collect();
        // A NaN anywhere (rank_diagnostics checks every draw) refuses.
        if each.iter().any(|(d, _)| d.rank_rhat.is_nan()) {
            return Convergence::NAN;
        }
        // The largest, NaN if any is.
        fn worst(mut v: impl Iterator<Item = f64>) -> f64 {
            v.try_fold(f64::NEG_INFINITY, |m, x| if x.is_nan() { None } else { Some(m.max(x)) }).unwrap_or(f64::NAN)
        }
        let above: Vec<&Diagnostics> = each.iter().map(|e| &e.0).filter(|d| d.largest_half_median >= floor).collect();
        let judged = |e: &(Diagnostics, f64)| if e.0.largest_half_median >= floor { e.0.rank_rhat } else { e.1 };
        // Bulk ESS of the ranked components (of all when none is); NaN if any is.
        let ess_of: Vec<&Diagnostics> =
            if above.is_empty() { each.iter().map(|e| &e.0).collect() } else { above.clone() };
        let bulk_ess = ess_of
            .iter()
            .try_fold(f64::INFINITY, |m, d| if d.bulk_ess.is_nan() { None } else { Some(m.min(d.bulk_ess)) })
            .unwrap_or(f64::NAN);
        Convergence {
            rhat: worst(each.iter().map(judged)),
            bulk_ess,
            rank_rhat: worst(each.iter().map(|e| e.0.rank_rhat)),
            split_rhat: worst(each.iter().map(|e| e.0.split_rhat)),
            ranked: above.len(),
            components: width,
        }
    }
    /// Posterior mean of each parameter.
    pub fn mean(&self) -> Vec<f64> {
        let d = self.draws.first().map_or(0, Vec::len);
        let n = self.draws.len() as f64;
        (0..d).map(|j| self.draws.iter().map(|x| x[j]).sum::<f64>() / n).collect()
    }
}

/// One quantity's convergence diagnostics ([`rank_diagnostics`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diagnostics {
    /// Rank-normalised split-R̂: the larger of bulk and folded.
    pub rank_rhat: f64,
    /// Plain split-R̂ (BDA3 §11.4).
    pub split_rhat: f64,
    /// Bulk effective sample size (of the normal scores).
    pub bulk_ess: f64,
    /// The largest median of a half chain (what the floor of
    /// [`NutsDraws::convergence_of`] is compared with).
    pub largest_half_median: f64,
}

impl Diagnostics {
    const NAN: Diagnostics =
        Diagnostics { rank_rhat: f64::NAN, split_rhat: f64::NAN, bulk_ess: f64::NAN, largest_half_median: f64::NAN };
}

/// The convergence of a vector function of the draws
/// ([`NutsDraws::convergence_of`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Convergence {
    /// The largest R̂ that decides: rank-normalised for components with a
    /// half chain's median at least the floor, plain split-R̂ with the
    /// floor's square added to the within-half variance below it.
    pub rhat: f64,
    /// The smallest bulk effective sample size of the components judged by
    /// rank (of all components when none is).
    pub bulk_ess: f64,
    /// The largest rank-normalised R̂ of any component (for comparison).
    pub rank_rhat: f64,
    /// The largest plain split-R̂ of any component (for comparison).
    pub split_rhat: f64,
    /// Components judged by rank (a half chain's median at least the floor).
    pub ranked: usize,
    /// Components.
    pub components: usize,
}

impl Convergence {
    /// Not judged (too few draws, or a draw that is not finite).
    pub const NAN: Convergence = Convergence {
        rhat: f64::NAN,
        bulk_ess: f64::NAN,
        rank_rhat: f64::NAN,
        split_rhat: f64::NAN,
        ranked: 0,
        components: 0,
    };
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
    norm: &'a Normalisation,
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
        let theta = self.norm.theta(z);
        let (lp, g) = self.density.value_and_gradient(&theta).map_err(|e| DensityError(e.to_string()))?;
        if !lp.is_finite() {
            return Err(DensityError("log-density is not finite".into()));
        }
        // ∂/∂z = Lᵀ ∂/∂θ.
        self.norm.gradient(&g, gradient);
        Ok(lp)
    }

    fn expand_vector<R: rand::Rng + ?Sized>(&mut self, _rng: &mut R, z: &[f64]) -> Result<Vec<f64>, CpuMathError> {
        Ok(self.norm.theta(z))
    }
}

/// What a chain thread sends: progress, or a batch of kept draws.
enum FromChain {
    Progress(String),
    Batch(usize, Result<ChainDraws, NapsuError>),
}

/// Draws from `density` by NUTS, normalised with `laplace`. `progress`
/// hears each chain ten times per round (draws done, step size, tree size).
///
/// **Longer chains when R̂ says so.** After `opts.draws` kept draws per
/// chain, `judge` gives the largest R̂ of what the caller publishes
/// ([`super::release`]: μ(θ), [`NutsDraws::convergence_of`]). While it is
/// over `opts.max_rhat` (or NaN), each chain goes on from where it stopped,
/// with the adaptation frozen, until its kept draws have doubled, up to
/// `opts.max_draws`; every kept draw stays (the warm-up was already
/// discarded, so they all target the posterior). This is what a user would
/// do after a refusal ("run longer chains"), without a second run; deciding
/// on the draws is post-processing of the DP statistics, so it spends
/// nothing. Pass `&mut |_| 1.0` for exactly `opts.draws`.
pub fn sample<D: LogDensity + Sync>(
    density: &D,
    laplace: &Laplace,
    opts: &NutsOptions,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
    judge: &mut dyn FnMut(&NutsDraws) -> f64,
) -> Result<NutsDraws, NapsuError> {
    // The caller checked what judging convergence takes too.
    opts.check(density.dim(), 0)?;
    let mut settings = DiagNutsSettings {
        num_tune: opts.warmup,
        num_draws: opts.most_draws(),
        maxdepth: opts.max_depth,
        ..Default::default()
    };
    settings.adapt_options.mass_matrix_options.use_grad_based_estimate = opts.mass == MassAdaptation::DrawsAndGradients;
    let d = density.dim();
    // Built once (a packed copy of L), shared by the chains.
    let norm = &laplace.normalisation();
    let rngs: Vec<DpRng> = (0..opts.chains).map(|_| rng.fork()).collect();
    // Chains report through one channel that this thread drains, so that
    // `progress` and `judge` need not be shareable between threads; each
    // chain hears how many more draws to make on its own channel (closed:
    // stop).
    let (tell, heard) = std::sync::mpsc::channel::<FromChain>();
    // Set when the run has failed, so that the other chains stop drawing.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stop = &stop;
    std::thread::scope(|s| {
        let mut more_to = Vec::with_capacity(opts.chains);
        for (c, mut r) in rngs.into_iter().enumerate() {
            let (settings, report) = (&settings, tell.clone());
            let (more, asked) = std::sync::mpsc::channel::<u64>();
            more_to.push(more);
            let body = move || {
                let math = CpuMath::new(Normalised { density, norm });
                let fail = |e: String| NapsuError::Numerical(format!("NUTS chain {c}: {e}"));
                let mut chain = settings.new_chain(c as u64, math, &mut r).map_err(|e| fail(e.to_string()))?;
                // Start near the mode, jittered so chains differ.
                let start: Vec<f64> = (0..d).map(|j| 0.1 * (((c * 31 + j * 17) % 13) as f64 / 6.0 - 1.0)).collect();
                chain.set_position(&start).map_err(|e| fail(e.to_string()))?;
                // The first round runs warm-up and draws; later ones, the draws asked for.
                let mut round = opts.warmup + opts.draws;
                loop {
                    let mut out = ChainDraws {
                        kept: Vec::with_capacity(round as usize),
                        divergences: 0,
                        gradients: 0,
                        kept_steps: 0,
                        step_size: f64::NAN,
                    };
                    let started = std::time::Instant::now();
                    let every = (round / 10).max(1);
                    for i in 0..round {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(());
                        }
                        let (z, info) = chain.draw().map_err(|e| fail(e.to_string()))?;
                        out.gradients += info.num_gradients;
                        if (i + 1) % every == 0 {
                            // Post-processing of the DP statistics: safe to show.
                            // The pace so far gives a rough end time (warm-up
                            // trees are often the larger ones). A closed
                            // channel only loses the message.
                            let spent = started.elapsed().as_secs_f64();
                            let left = spent * (round - i - 1) as f64 / (i + 1) as f64;
                            let _ = report.send(FromChain::Progress(format!(
                                "napsu-mq: NUTS chain {c}: {} of {round} draws, step size {:.3}, {} leapfrog steps; \
                                 {:.0}s so far, about {:.0}s to go at this pace",
                                i + 1,
                                info.step_size,
                                info.num_steps,
                                spent,
                                left
                            )));
                        }
                        if !info.tuning {
                            out.divergences += u64::from(info.diverging);
                            out.kept_steps += info.num_steps;
                            out.step_size = info.step_size;
                            out.kept.push(norm.theta(&z));
                        }
                    }
                    let _ = report.send(FromChain::Batch(c, Ok(out)));
                    match asked.recv() {
                        Ok(n) => round = n,
                        Err(_) => return Ok(()),
                    }
                }
            };
            let report = tell.clone();
            // A thread the OS refuses is an error, not a panic; a chain that
            // fails or panics still reports, so that this thread never waits
            // for a batch that will not come.
            let spawned = std::thread::Builder::new().name(format!("nuts-chain-{c}")).spawn_scoped(s, move || {
                let failed = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e,
                    Err(_) => NapsuError::Numerical(format!("NUTS chain {c} panicked")),
                };
                let _ = report.send(FromChain::Batch(c, Err(failed)));
            });
            if let Err(e) = spawned {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                return Err(NapsuError::Numerical(format!("a NUTS chain's thread could not start: {e}")));
            }
        }
        drop(tell);
        // However this thread leaves (a result, an error, a panic in `progress`
        // or `judge`), the chains stop at their next draw.
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _stop_on_drop = StopOnDrop(stop);
        let mut per_chain: Vec<Vec<Vec<f64>>> = vec![Vec::new(); opts.chains];
        let (mut divergences, mut gradients, mut kept_steps) = (0, 0, 0);
        let mut step_sizes = vec![f64::NAN; opts.chains];
        let mut waiting = opts.chains;
        loop {
            // Every chain holds a sender until it has reported its failure or
            // been told to stop, so this cannot run dry while one is waited for.
            let message =
                heard.recv().map_err(|_| NapsuError::Numerical("a NUTS chain stopped without reporting".into()))?;
            match message {
                FromChain::Progress(m) => progress(&m),
                // Dropping `more_to` and `_stop_on_drop` stops the others.
                FromChain::Batch(_, Err(e)) => return Err(e),
                FromChain::Batch(c, Ok(b)) => {
                    per_chain[c].extend(b.kept);
                    divergences += b.divergences;
                    gradients += b.gradients;
                    kept_steps += b.kept_steps;
                    step_sizes[c] = b.step_size;
                    waiting -= 1;
                }
            }
            if waiting > 0 {
                continue;
            }
            let draws = diagnosed(&per_chain, d, opts.chains, divergences, gradients, kept_steps, &step_sizes);
            let per = per_chain[0].len() as u64;
            let r = judge(&draws);
            let over = r.partial_cmp(&opts.max_rhat).is_none_or(|o| o.is_gt());
            if !over || per >= opts.most_draws() {
                return Ok(draws);
            }
            let more = per.min(opts.most_draws() - per);
            progress(&format!(
                "napsu-mq: largest R̂ {r:.3} > {} after {per} draws per chain: {more} more per chain (at most {})",
                opts.max_rhat,
                opts.most_draws()
            ));
            for m in &more_to {
                // A chain that has gone has sent its error, which the next receive reads.
                let _ = m.send(more);
            }
            waiting = opts.chains;
        }
    })
}

/// The pooled draws of `per_chain` with θ's diagnostics.
fn diagnosed(
    per_chain: &[Vec<Vec<f64>>],
    d: usize,
    chains: usize,
    divergences: u64,
    gradients: u64,
    kept_steps: u64,
    step_sizes: &[f64],
) -> NutsDraws {
    let (rhat, ess) = (0..d)
        .into_par_iter()
        .map(|j| {
            let c = column(per_chain, j);
            (rank_diagnostics(&c).rank_rhat, effective_sample_size(&c))
        })
        .unzip();
    let kept = per_chain.iter().map(Vec::len).sum::<usize>().max(1);
    NutsDraws {
        chains,
        draws: per_chain.concat(),
        rhat,
        ess,
        divergences,
        gradients,
        mean_steps: kept_steps as f64 / kept as f64,
        step_sizes: step_sizes.to_vec(),
    }
}

/// Refuses draws whose largest R̂, `r`, exceeds `max_rhat` (unless `allow`).
pub fn check_converged(r: f64, max_rhat: f64, allow: bool) -> Result<(), NapsuError> {
    // A NaN R̂ (a log-density that gave NaN somewhere) is not convergence either.
    if !allow && r.partial_cmp(&max_rhat).is_none_or(|o| o == std::cmp::Ordering::Greater) {
        return Err(NapsuError::Numerical(format!(
            "the NUTS chains did not converge (largest R̂ {r:.3} > {max_rhat}) by the most draws per chain; \
             run longer chains (more warm-up, or a larger most: `--nuts-max-draws`, `nuts_max_draws`), or accept \
             the draws explicitly"
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
    rhat_of_halves(&split(chains))
}

/// Each chain's first and last ⌊len/2⌋ draws (the middle one of an odd
/// chain is dropped).
fn split(chains: &[Vec<f64>]) -> Vec<&[f64]> {
    chains
        .iter()
        .flat_map(|c| {
            let h = c.len() / 2;
            [&c[..h], &c[c.len() - h..]]
        })
        .collect()
}

/// R̂ of half chains of equal length.
fn rhat_of_halves(halves: &[&[f64]]) -> f64 {
    rhat_of_halves_plus(halves, 0.0)
}

/// R̂ of half chains with `extra` added to the within-half variance: a
/// scale below which the halves' disagreement does not count.
fn rhat_of_halves_plus(halves: &[&[f64]], extra: f64) -> f64 {
    let n = halves[0].len() as f64;
    let means: Vec<f64> = halves.iter().map(|h| mean(h)).collect();
    let b = n * variance(&means);
    let w = mean(&halves.iter().map(|h| variance(h)).collect::<Vec<_>>());
    rhat_from(n, w + extra, b)
}

/// The median (no NaN in `x`).
fn median(x: &[f64]) -> f64 {
    let mut sorted = x.to_vec();
    sorted.sort_by(f64::total_cmp);
    let s = sorted.len();
    if s == 0 {
        return f64::NAN;
    }
    if s % 2 == 1 { sorted[s / 2] } else { 0.5 * (sorted[s / 2 - 1] + sorted[s / 2]) }
}

/// Rank-normalised split-R̂ and bulk effective sample size of one
/// quantity's chains (Vehtari, Gelman, Simpson, Carpenter and Bürkner 2021,
/// "Rank-normalization, folding, and localization: an improved R̂",
/// Bayesian Analysis 16(2), §4.1–4.2; what Stan, ArviZ and posterior
/// report). The chains are cut in halves; the S pooled draws are replaced
/// by the normal scores of their ranks, z = Φ⁻¹((r − 3/8)/(S + 1/4)) (tied
/// draws share their mean rank), and split-R̂ is computed on z (the bulk)
/// and on the scores of |x − median x| (folded: the scale); R̂ is the
/// larger. The bulk part is invariant under monotone maps of x, the folded
/// part under affine ones: R̂ of a cell's probability μ is that of its
/// count nμ, so a rare cell whose excursions dominate the within-chain
/// variance cannot hide chains that disagree on its typical value (the
/// blind spot of plain R̂ on μ, `benches/results/napsu/twinify.md`). Bulk
/// ESS is [`effective_sample_size`] of the halves' z; plain split-R̂ and
/// the largest half chain's median come along. All NaN if any draw is not finite, the chains
/// differ in length, or a half has fewer than two draws.
pub fn rank_diagnostics(chains: &[Vec<f64>]) -> Diagnostics {
    let halves = split(chains);
    let n = halves.first().map_or(0, |h| h.len());
    let equal = chains.iter().all(|c| c.len() == chains[0].len());
    if n < 2 || !equal || chains.iter().flatten().any(|x| !x.is_finite()) {
        return Diagnostics::NAN;
    }
    let pooled: Vec<f64> = halves.concat();
    let z = normal_scores(&pooled);
    let z_halves: Vec<&[f64]> = z.chunks(n).collect();
    let bulk = rhat_of_halves(&z_halves);
    let centre = median(&pooled);
    let folded: Vec<f64> = pooled.iter().map(|x| (x - centre).abs()).collect();
    let zf = normal_scores(&folded);
    let tail = rhat_of_halves(&zf.chunks(n).collect::<Vec<_>>());
    let bulk_ess = effective_sample_size(&z_halves.iter().map(|h| h.to_vec()).collect::<Vec<_>>());
    // max, but NaN-propagating.
    let rank_rhat = if bulk.is_nan() || tail.is_nan() { f64::NAN } else { bulk.max(tail) };
    let largest_half_median = halves.iter().map(|h| median(h)).fold(f64::NEG_INFINITY, f64::max);
    Diagnostics { rank_rhat, split_rhat: rhat_of_halves(&halves), bulk_ess, largest_half_median }
}

/// Φ⁻¹((r − 3/8)/(S + 1/4)) for each value's rank r among the S values
/// (Blom's offset; ties get their mean rank). No NaN in `x`.
fn normal_scores(x: &[f64]) -> Vec<f64> {
    let s = x.len();
    let mut order: Vec<usize> = (0..s).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let normal = Normal::standard();
    let mut z = vec![0.0; s];
    let mut i = 0;
    while i < s {
        let mut j = i + 1;
        while j < s && x[order[j]] == x[order[i]] {
            j += 1;
        }
        // Ranks i+1 ..= j share their mean.
        let r = (i + 1 + j) as f64 / 2.0;
        let score = normal.inverse_cdf((r - 0.375) / (s as f64 + 0.25));
        order[i..j].iter().for_each(|&k| z[k] = score);
        i = j;
    }
    z
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

/// Effective sample size over chains (BDA3 §11.5; Vehtari et al. 2021
/// §3.2, as Stan and ArviZ compute it): autocorrelations
/// ρ_t = 1 − (W − mean autocovariance_t)/var⁺, summed in pairs
/// (ρ_0 + ρ_1, ρ_2 + ρ_3, …) while the pair sums stay positive (Geyer's
/// initial positive sequence), each pair capped by the one before (his
/// initial monotone sequence); S/τ with τ = −1 + 2Σρ_t, τ at least
/// 1/log₁₀ S.
pub fn effective_sample_size(chains: &[Vec<f64>]) -> f64 {
    let m = chains.len() as f64;
    let n = chains.iter().map(Vec::len).min().unwrap_or(0);
    if n < 2 || chains.iter().any(|c| c.len() != n || c.iter().any(|x| !x.is_finite())) {
        return f64::NAN;
    }
    let total = m * n as f64;
    let means: Vec<f64> = chains.iter().map(|c| mean(c)).collect();
    let w = mean(&chains.iter().map(|c| variance(c)).collect::<Vec<_>>());
    let b = if chains.len() > 1 { n as f64 * variance(&means) } else { 0.0 };
    let var_plus = (n as f64 - 1.0) / n as f64 * w + b / n as f64;
    if !var_plus.is_finite() {
        return f64::NAN;
    }
    if var_plus <= 0.0 {
        return total;
    }
    // Each chain's autocovariances at every lag (divided by n), by FFT.
    let acov = autocovariances(chains, &means);
    let autocov = |t: usize| mean(&acov.iter().map(|a| a[t]).collect::<Vec<_>>());
    let rho = |t: usize| 1.0 - (w - autocov(t)) / var_plus;
    // ρ_0 = 1; pairs (ρ_{t+1}, ρ_{t+2}) for odd t while the last pair's sum is positive.
    let mut r = vec![1.0, rho(1)];
    let (mut even, mut odd) = (r[0], r[1]);
    let mut t = 1;
    while t + 3 < n && even + odd > 0.0 {
        (even, odd) = (rho(t + 1), rho(t + 2));
        if even + odd >= 0.0 {
            r.extend([even, odd]);
        }
        t += 2;
    }
    // The autocorrelations summed in full: ρ_0 ..= ρ_{t−2} (none if no pair was read).
    let kept = t - 1;
    let next = r.get(kept).copied().unwrap_or(0.0);
    r.truncate(kept);
    // ρ_{t−1} is added once: the last even autocorrelation if positive (it
    // improves the estimate), else what was kept there.
    r.push(if even > 0.0 { even } else { next });
    // Initial monotone sequence: no pair sum above the one before.
    let mut t = 1;
    while t + 3 <= kept {
        let before = r[t - 1] + r[t];
        if r[t + 1] + r[t + 2] > before {
            r[t + 1] = before / 2.0;
            r[t + 2] = before / 2.0;
        }
        t += 2;
    }
    let tau = -1.0 + 2.0 * r[..kept].iter().sum::<f64>() + r[kept];
    total / tau.max(1.0 / total.log10())
}

/// Σ_{i<n−t} (x_i − x̄)(x_{i+t} − x̄)/n for every lag t of each chain: the
/// inverse FFT of |FFT(x − x̄)|², zero-padded to a power of two ≥ 2n so
/// the circular products do not wrap (as ArviZ's `autocov`).
fn autocovariances(chains: &[Vec<f64>], means: &[f64]) -> Vec<Vec<f64>> {
    let n = chains.first().map_or(0, Vec::len);
    let size = (2 * n).next_power_of_two();
    let mut planner = FftPlanner::<f64>::new();
    let (forward, inverse) = (planner.plan_fft_forward(size), planner.plan_fft_inverse(size));
    chains
        .iter()
        .zip(means)
        .map(|(c, mu)| {
            let mut buf: Vec<Complex<f64>> = c.iter().map(|x| Complex::new(x - mu, 0.0)).collect();
            buf.resize(size, Complex::new(0.0, 0.0));
            forward.process(&mut buf);
            buf.iter_mut().for_each(|v| *v = Complex::new(v.norm_sqr(), 0.0));
            inverse.process(&mut buf);
            // rustfft's inverse is not normalised: divide by its size too.
            buf[..n].iter().map(|v| v.re / (size as f64 * n as f64)).collect()
        })
        .collect()
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
    /// θ's, a monotone function of the well-mixed coordinate alone gives
    /// that coordinate's, and a constant has nothing to disagree on.
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
            rhat: (0..2).map(|j| rank_diagnostics(&column(&per_chain, j)).rank_rhat).collect(),
            ess: vec![1.0, 1.0],
            draws: per_chain.concat(),
            chains: 4,
            divergences: 0,
            gradients: 0,
            mean_steps: 1.0,
            step_sizes: vec![0.1; 4],
        };
        // Ranks bound R̂ (normal scores lie within ±4), but well above 1.05.
        assert!(d.max_rhat() > 1.2, "{}", d.max_rhat());
        let all = f64::NEG_INFINITY; // no floor: every component judged by rank
        assert!((d.convergence_of(|t| t.to_vec(), all).rhat - d.max_rhat()).abs() < 1e-12);
        // Affine maps, increasing or not, leave the ranks of x and of |x − median| as they were.
        for (a, b) in [(2.0, 0.0), (-3.0, 1.0)] {
            assert!((d.convergence_of(|t| vec![a * t[0] + b], all).rhat - d.rhat[0]).abs() < 1e-12);
        }
        // Other monotone maps keep the bulk's ranks only; mixed chains stay mixed.
        assert!(d.convergence_of(|t| vec![t[0].exp()], all).rhat < 1.01);
        assert!(d.convergence_of(|t| vec![t[0], f64::NAN], all).rhat.is_nan());
        assert!(d.convergence_of(|t| vec![t[0], f64::INFINITY], all).rhat.is_nan());
        assert!(d.rhat[0] < 1.01, "{}", d.rhat[0]);
        // Independent draws: bulk ESS near all 2,000.
        let ess = d.convergence_of(|t| vec![t[0]], all).bulk_ess;
        assert!(ess > 1500.0 && ess < 2600.0, "{ess}");
        let constant = d.convergence_of(|_| vec![1.0], all);
        assert_eq!((constant.rhat, constant.bulk_ess), (1.0, 2000.0));
    }

    /// The chains of `benches/napsu/arviz_rhat_reference.py`: an LCG
    /// (glibc's constants) driving an AR(1) process, chain c shifted by
    /// `shift`·c, computed bit for bit as the script does.
    fn lcg_chains(shift: f64, draws: usize) -> Vec<Vec<f64>> {
        (0..4u64)
            .map(|c| {
                let (mut state, mut x) = (12345 + 1000 * c, 0.0);
                (0..draws)
                    .map(|_| {
                        state = (1103515245 * state + 12345) % (1 << 31);
                        x = 0.8 * x + (state as f64 / (1u64 << 31) as f64 - 0.5);
                        x + shift * c as f64
                    })
                    .collect()
            })
            .collect()
    }

    /// The script's rare cell: chains 2 and 3 at twice the level of 0 and
    /// 1 (3–6 expected rows of 30,162), spikes every 25 draws.
    fn rare_cell() -> Vec<Vec<f64>> {
        lcg_chains(0.0, 400)
            .iter()
            .enumerate()
            .map(|(c, ch)| {
                let level = if c >= 2 { 2e-4 } else { 1e-4 };
                ch.iter()
                    .enumerate()
                    .map(|(i, x)| level * (0.5 * x).exp() + if (i + 37 * c) % 25 == 0 { 3e-3 } else { 0.0 })
                    .collect()
            })
            .collect()
    }

    /// The floor of one expected row: a cell whose probability is ~0 in
    /// every draw (θ in a prior-held tail, its chains apart there) is judged
    /// by plain split-R̂ with a row's variance added, which it passes though
    /// its ranks (and, for tails at different depths, its plain R̂) are far
    /// apart; the rare cell above the floor, and one held at 5 rows by one
    /// chain and at 0 by the others, are judged by ranks and refused;
    /// without a floor all are.
    #[test]
    fn cells_below_one_expected_row_are_judged_by_plain_rhat() {
        let floor = 1.0 / 30162.0;
        let tail: Vec<Vec<f64>> =
            lcg_chains(0.4, 400).iter().map(|c| c.iter().map(|x| (-40.0 + 8.0 * x).exp()).collect()).collect();
        let rare = rare_cell();
        let draws_of = |parts: &[&Vec<Vec<f64>>]| NutsDraws {
            draws: (0..4).flat_map(|c| (0..400).map(move |i| parts.iter().map(|p| p[c][i]).collect())).collect(),
            chains: 4,
            rhat: vec![],
            ess: vec![],
            divergences: 0,
            gradients: 0,
            mean_steps: 1.0,
            step_sizes: vec![0.1; 4],
        };
        let c = draws_of(&[&tail]).convergence_of(|t| t.to_vec(), floor);
        assert_eq!((c.ranked, c.components), (0, 1));
        assert!(c.rhat < 1.05 && c.rhat <= c.split_rhat && c.rank_rhat > 1.3, "{c:?}");
        // Tails whose chains sit at different depths: plain split-R̂ alone would refuse them.
        let deep: Vec<Vec<f64>> = lcg_chains(0.0, 400)
            .iter()
            .enumerate()
            .map(|(k, ch)| ch.iter().map(|x| (-40.0 + 3.0 * k as f64 + 0.5 * x).exp()).collect())
            .collect();
        let c = draws_of(&[&deep]).convergence_of(|t| t.to_vec(), floor);
        assert!(c.ranked == 0 && c.split_rhat > 2.0 && c.rhat < 1.001, "{c:?}");
        // One chain at 5 expected rows, three at ~0, spikes in all: the pooled median is ~0
        // rows, but chain 0's halves are above the floor, so ranks judge and refuse it.
        let split_apart: Vec<Vec<f64>> = rare_cell()
            .iter()
            .enumerate()
            .map(|(k, ch)| {
                let scale = if k == 0 { 1.0 } else { 1e-8 };
                ch.iter().enumerate().map(|(i, x)| if (i + 37 * k) % 25 == 0 { *x } else { x * scale }).collect()
            })
            .collect();
        let c = draws_of(&[&split_apart]).convergence_of(|t| t.to_vec(), floor);
        assert!(c.ranked == 1 && c.rhat > 1.05, "{c:?}");
        let both = draws_of(&[&tail, &rare]);
        let c = both.convergence_of(|t| t.to_vec(), floor);
        assert_eq!((c.ranked, c.components), (1, 2));
        let r = rank_diagnostics(&rare);
        assert!(c.rhat == r.rank_rhat && c.rhat > 1.4 && c.bulk_ess == r.bulk_ess, "{c:?}");
        let unfloored = both.convergence_of(|t| t.to_vec(), f64::NEG_INFINITY);
        assert_eq!(unfloored.ranked, 2);
        assert!(unfloored.rhat == unfloored.rank_rhat && unfloored.rhat >= c.rhat);
    }

    /// Rank-normalised R̂ equals ArviZ 0.23.4's `rhat(method="rank")`
    /// (Vehtari et al. 2021) and plain split-R̂ its `method="split"`, on
    /// chains that mix, chains apart, tied values under a monotone map, and
    /// a rare cell whose spikes hide chains at twice each other's level
    /// from plain split-R̂ but not from ranks; bulk ESS equals ArviZ's
    /// `ess(method="bulk")`.
    #[test]
    fn rank_rhat_and_bulk_ess_match_arviz() {
        let rare = rare_cell();
        let grid: Vec<Vec<f64>> =
            lcg_chains(0.1, 201).iter().map(|c| c.iter().map(|x| ((x * 4.0).floor() / 4.0).exp()).collect()).collect();
        // (chains, ArviZ rank R̂, ArviZ split R̂, ArviZ bulk ESS)
        let cases = [
            (lcg_chains(0.0, 201), 1.0410887173325045, 1.041592070186077, 100.57533206620666),
            (lcg_chains(0.4, 201), 1.502402450889266, 1.5247306330576522, 8.058739341241669),
            (grid, 1.0837712192060918, 1.0881777368247043, 51.870525234510296),
            (rare, 1.4395549872764855, 1.0017204151781691, 8.197117264994674),
        ];
        for (k, (chains, rank, split, bulk)) in cases.iter().enumerate() {
            let Diagnostics { rank_rhat: r, bulk_ess: ess, split_rhat: plain, .. } = rank_diagnostics(chains);
            assert!((r - rank).abs() < 1e-9, "case {k}: rank R̂ {r} vs ArviZ {rank}");
            assert!(
                (plain - split).abs() < 1e-9 && (split_rhat(chains) - split).abs() < 1e-9,
                "case {k}: {plain} vs {split}"
            );
            assert!((ess - bulk).abs() < 1e-9 * bulk, "case {k}: bulk ESS {ess} vs ArviZ {bulk}");
        }
        // The blind spot, named: plain split-R̂ passes the rare cell, ranks refuse it.
        assert!(split_rhat(&cases[3].0) < 1.05 && rank_diagnostics(&cases[3].0).rank_rhat > 1.05);
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
        let draws = sample(&post, &l, &opts, &mut rng, &|_| {}, &mut |_| 1.0).unwrap();
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

    /// A standard normal in two dimensions; panics after `panic_after`
    /// evaluations when that is set (failure injection).
    struct Normal2 {
        calls: std::sync::atomic::AtomicU64,
        panic_after: Option<u64>,
    }

    impl LogDensity for Normal2 {
        fn dim(&self) -> usize {
            2
        }
        fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
            let k = self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.panic_after.is_some_and(|p| k >= p) {
                panic!("injected");
            }
            Ok((-0.5 * x.iter().map(|v| v * v).sum::<f64>(), x.iter().map(|v| -v).collect()))
        }
    }

    fn normal2(panic_after: Option<u64>) -> (Normal2, Laplace) {
        let d = Normal2 { calls: 0.into(), panic_after };
        let l = laplace(&d, &LaplaceOptions::default()).unwrap();
        (d, l)
    }

    /// While the judge says "unconverged" (over the limit, or NaN) the
    /// chains go on from where they stopped, doubling their kept draws up to
    /// the most: 50 → 100 → 170. A judge that is satisfied stops them; the
    /// first round is the same draws either way (one stream per chain), so
    /// later rounds continue the chains rather than restart them.
    #[test]
    fn chains_go_on_while_the_judge_says_unconverged() {
        let opts = NutsOptions { chains: 2, warmup: 100, draws: 50, max_draws: Some(170), ..Default::default() };
        let run = |verdicts: &[f64]| {
            let (d, l) = normal2(None);
            let mut seen = Vec::new();
            let mut judge = |n: &NutsDraws| {
                seen.push(n.draws.len() / n.chains);
                verdicts.get(seen.len() - 1).copied().unwrap_or(1.0)
            };
            let draws = sample(&d, &l, &opts, &mut DpRng::unsafe_seeded(11), &|_| {}, &mut judge).unwrap();
            (draws, seen)
        };
        let (once, seen) = run(&[1.0]);
        assert_eq!((once.draws.len(), seen), (100, vec![50]));
        let (twice, seen) = run(&[2.0, 1.05]);
        assert_eq!((twice.draws.len(), seen), (200, vec![50, 100]));
        let (most, seen) = run(&[f64::NAN, 2.0, 2.0, 2.0]);
        assert_eq!((most.draws.len(), seen), (340, vec![50, 100, 170]));
        // Chain after chain: chain 0's first 50 draws, then chain 1's.
        assert_eq!(&twice.draws[..50], &once.draws[..50]);
        assert_eq!(&twice.draws[100..150], &once.draws[50..100]);
        assert_eq!(&most.draws[..100], &twice.draws[..100]);
        assert!(most.gradients > twice.gradients && twice.gradients > once.gradients);
        assert_eq!(most.rhat.len(), 2);
        // Longer than the most is refused before anything runs.
        let bad = NutsOptions { max_draws: Some(49), ..opts };
        let (d, l) = normal2(None);
        let e = sample(&d, &l, &bad, &mut DpRng::unsafe_seeded(11), &|_| {}, &mut |_| 1.0).unwrap_err();
        assert!(e.to_string().contains("at least the draws per chain"), "{e}");
    }

    /// A chain that panics in a later round is an error, not a hang: the
    /// other chains are stopped and joined.
    #[test]
    fn a_chain_that_panics_while_extending_is_an_error() {
        let opts = NutsOptions { chains: 2, warmup: 50, draws: 20, max_draws: Some(10_000), ..Default::default() };
        let (d, l) = normal2(None);
        d.calls.store(0, std::sync::atomic::Ordering::Relaxed);
        sample(&d, &l, &opts, &mut DpRng::unsafe_seeded(4), &|_| {}, &mut |_| 1.0).unwrap();
        // The same first round (same streams), then a panic early in the second.
        let first = d.calls.load(std::sync::atomic::Ordering::Relaxed);
        let d = Normal2 { calls: 0.into(), panic_after: Some(first + 20) };
        let e = sample(&d, &l, &opts, &mut DpRng::unsafe_seeded(4), &|_| {}, &mut |_| 2.0).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
    }
}
