//! The NAPSU-MQ release: the one charged measurement, and the
//! post-processing that turns its noisy statistics into m synthetic sets
//! (003 Alg. 1).
//!
//! **Measurement and its privacy.** The k query marginals are released once
//! with the discrete Gaussian mechanism. dpflow's ledger counts add/remove-one
//! neighbours (one person's row present or absent), under which each full
//! marginal changes by 1 in one cell, so the stacked statistic a(D) has L2
//! sensitivity √k and noise σ on every cell costs ρ = k/(2σ²) (Bun–Steinke
//! Prop. 1.6; discrete: Canonne et al. Thm 4). 003 §4 and NOTES §6 use
//! substitute-one neighbours with Δ₂ = √(2k); the issue asks for the
//! relation this system uses, and add/remove is that relation everywhere
//! else in dpflow, so charges compose in one ledger.
//!
//! **n.** 003 treats n as public. Under add/remove it is not, so the
//! likelihood uses n̂, the inverse-variance-weighted mean of the k noisy
//! marginals' sums (each sum is n plus noise of variance |cells|·σ²):
//! post-processing, no extra charge.
//!
//! **Post-processing.** Everything after [`NoisyStatistics`] — the
//! canonical model, the Laplace approximation or NUTS, the m posterior
//! draws, the synthetic rows — reads only the noisy statistics and public
//! inputs, so it may be re-run with other settings (`--from-record`) for
//! free, and its failures may say what went wrong.

use std::time::Instant;

use dpflow_udfs::noise::DpRng;
use serde::{Deserialize, Serialize};

use super::NapsuError;
use super::canonical::CanonicalFeatures;
use super::importance::{Correction, check_enough, check_reliable, sample_corrected};
use super::laplace::{LaplaceOptions, laplace};
use super::likelihood::Posterior;
use super::moments::MaxEnt;
use super::nuts::{NutsDraws, NutsOptions, check_converged, sample};
use crate::domain::Domain;
use crate::pgm::GraphicalModel;

/// Format tag of the saved noisy statistics.
pub const FORMAT: &str = "dpflow-napsu-statistics-v1";

/// The neighbour relation the measurement is private under.
pub const NEIGHBOURS: &str = "add/remove one row";

/// The noisy statistics of a NAPSU-MQ release: everything inference needs,
/// all of it public (DP output or public input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoisyStatistics {
    /// [`FORMAT`].
    pub format: String,
    /// The public domain of the model (nulls as a value under `reproduce`).
    pub domain: Domain,
    /// The query marginals, by column, each in domain order.
    pub queries: Vec<Vec<String>>,
    /// Discrete Gaussian σ added to every cell.
    pub sigma: f64,
    /// [`NEIGHBOURS`].
    pub neighbours: String,
    /// L2 sensitivity of the stacked marginals under `neighbours` (√k).
    pub l2_sensitivity: f64,
    /// ρ charged: (Δ₂/σ)²/2.
    pub rho: f64,
    /// The noisy marginals, stacked in query order, each row-major over its
    /// columns in domain order.
    pub statistics: Vec<f64>,
    /// n̂: the weighted mean of the noisy marginals' sums (post-processing).
    pub rows: f64,
}

impl NoisyStatistics {
    /// The statistics of `queries` (attribute ids, sorted) with noise σ;
    /// `statistics` stacked as documented on the field.
    pub fn new(domain: &Domain, scopes: &[Vec<usize>], sigma: f64, statistics: Vec<f64>) -> Self {
        let names = domain.names();
        let sizes = domain.cardinalities();
        let k = scopes.len() as f64;
        let mut offset = 0;
        let (mut num, mut den) = (0.0, 0.0);
        for s in scopes {
            let cells: usize = s.iter().map(|&a| sizes[a]).product();
            let sum: f64 = statistics[offset..offset + cells].iter().sum();
            num += sum / cells as f64;
            den += 1.0 / cells as f64;
            offset += cells;
        }
        Self {
            format: FORMAT.into(),
            domain: domain.clone(),
            queries: scopes.iter().map(|s| s.iter().map(|&a| names[a].to_string()).collect()).collect(),
            sigma,
            neighbours: NEIGHBOURS.into(),
            l2_sensitivity: k.sqrt(),
            rho: k / (2.0 * sigma * sigma),
            statistics,
            rows: (num / den).max(1.0),
        }
    }

    /// The query scopes as attribute ids, checked against the domain and the
    /// statistics' length (a record edited by hand is caught here).
    pub fn scopes(&self) -> Result<Vec<Vec<usize>>, NapsuError> {
        if self.format != FORMAT {
            return Err(NapsuError::Query(format!(
                "noisy statistics of format {:?}; this dpflow reads {FORMAT}",
                self.format
            )));
        }
        let sizes = self.domain.cardinalities();
        let mut width = 0usize;
        let mut scopes = Vec::with_capacity(self.queries.len());
        for q in &self.queries {
            let mut s = Vec::with_capacity(q.len());
            for c in q {
                s.push(self.domain.position(c).ok_or_else(|| {
                    NapsuError::Query(format!("the query column {c:?} is not in the statistics' domain"))
                })?);
            }
            if s.windows(2).any(|w| w[0] >= w[1]) {
                return Err(NapsuError::Query(format!("the query {q:?} is not in domain order")));
            }
            width += s.iter().map(|&a| sizes[a]).product::<usize>();
            scopes.push(s);
        }
        if width != self.statistics.len() || !self.statistics.iter().all(|v| v.is_finite()) {
            return Err(NapsuError::Query(format!(
                "{} statistics for queries with {width} cells (or a value that is not finite)",
                self.statistics.len()
            )));
        }
        if !(self.sigma > 0.0 && self.sigma.is_finite() && self.rows >= 1.0 && self.rows.is_finite()) {
            return Err(NapsuError::Query("σ and the row estimate must be positive and finite".into()));
        }
        Ok(scopes)
    }
}

/// How the posterior is approximated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Inference {
    /// Normal at the mode with the inverse negative Hessian (003 §4.2): seconds.
    #[default]
    Laplace,
    /// No-U-Turn sampling, normalised by the Laplace fit (003 §4.2, NOTES §6),
    /// of the posterior with the likelihood's covariance frozen at the mode
    /// ([`super::surrogate`]), corrected to the exact posterior by
    /// importance weights with the Pareto k̂ check ([`super::importance`]):
    /// minutes.
    Nuts,
    /// No-U-Turn sampling of the exact posterior (every gradient through
    /// ∂Σ/∂θ): the reference, hours at Adult's size. Records written before
    /// 2026-11-28 say `nuts` for this sampler; they have no `importance`
    /// field.
    #[serde(rename = "nuts-exact")]
    #[cfg_attr(feature = "cli", value(name = "nuts-exact"))]
    NutsExact,
}

impl Inference {
    /// NUTS of either kind.
    pub fn is_nuts(self) -> bool {
        matches!(self, Inference::Nuts | Inference::NutsExact)
    }
}

/// Settings of NAPSU-MQ's post-processing.
#[derive(Debug, Clone, PartialEq)]
pub struct NapsuOptions {
    /// Laplace or NUTS.
    pub inference: Inference,
    /// Most canonical features (θ's dimension) allowed.
    pub max_features: usize,
    /// Publish NUTS draws even when R̂ of the mean parameters exceeds `nuts.max_rhat`, or the
    /// importance correction's k̂ its threshold.
    pub allow_unconverged: bool,
    /// The mode search.
    pub laplace: LaplaceOptions,
    /// The sampler.
    pub nuts: NutsOptions,
}

impl Default for NapsuOptions {
    fn default() -> Self {
        Self {
            inference: Inference::Laplace,
            max_features: 1000,
            allow_unconverged: false,
            laplace: LaplaceOptions::default(),
            nuts: NutsOptions::default(),
        }
    }
}

/// What inference did (in the release record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferenceReport {
    /// `laplace` or `nuts`.
    pub method: Inference,
    /// θ's dimension (canonical features).
    pub parameters: usize,
    /// Iterations of the mode search (Fisher scoring, or L-BFGS when it
    /// fell back).
    pub mode_iterations: u64,
    /// Posterior draws made (NUTS: chains × kept draws per chain, more than
    /// `--nuts-draws` when R̂ asked for longer chains; Laplace: m).
    pub draws: usize,
    /// NUTS: the largest rank-normalised split-R̂ of θ (canonical
    /// parameters; [`super::nuts::rank_diagnostics`]). Records written
    /// before 2026-11-29 hold the plain split-R̂.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::record_float")]
    pub max_rhat: Option<f64>,
    /// NUTS: the largest R̂ of the mean parameters μ(θ) (the query
    /// marginals as probabilities, which fix each synthetic set's
    /// distribution): the one compared with the limit. Rank-normalised for
    /// cells with a half chain's median of at least one expected row of n̂,
    /// plain split-R̂ with a row's variance added below
    /// ([`super::nuts::NutsDraws::convergence_of`]). Absent
    /// in records written before it existed; plain split-R̂ for every cell
    /// in those written before 2026-11-29.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::record_float")]
    pub max_rhat_mean: Option<f64>,
    /// NUTS: μ(θ)'s cells judged by rank (a half chain's median of at least
    /// one expected row); the others by plain split-R̂.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranked_cells: Option<usize>,
    /// NUTS: μ(θ)'s cells (the query marginals' cells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cells: Option<usize>,
    /// NUTS: the smallest effective sample size of θ's components.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::record_float")]
    pub min_ess: Option<f64>,
    /// NUTS: the smallest bulk effective sample size of μ(θ)'s components
    /// judged by rank (of their normal scores; of all components when none
    /// is). Absent in records written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::record_float")]
    pub min_ess_mean: Option<f64>,
    /// NUTS: kept draws per chain, more than asked for (`--nuts-draws`)
    /// when R̂ was over the limit and the chains went on
    /// ([`super::nuts::sample`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draws_per_chain: Option<usize>,
    /// NUTS: divergent transitions after warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergences: Option<u64>,
    /// NUTS: gradient evaluations over all chains, warm-up included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradients: Option<u64>,
    /// NUTS: mean leapfrog steps per kept draw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_steps: Option<f64>,
    /// NUTS draws published although R̂ exceeded the limit (or k̂ its threshold).
    #[serde(default)]
    pub accepted_unconverged: bool,
    /// `nuts`: the importance correction from the surrogate to the exact
    /// posterior (Pareto k̂, effective sample size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importance: Option<Correction>,
    /// Seconds spent.
    pub seconds: f64,
}

/// The model of the statistics' queries, checked against the feature cap:
/// the check that runs before anything is charged.
pub fn max_ent(domain: &Domain, scopes: &[Vec<usize>], max_features: usize) -> Result<MaxEnt, NapsuError> {
    Ok(MaxEnt::new(CanonicalFeatures::new(scopes, &domain.cardinalities(), max_features)?))
}

/// The model of `scopes` with every inference setting in `opts` checked
/// against its size: all public inputs, so callers run this before
/// anything is charged.
pub fn checked_model(domain: &Domain, scopes: &[Vec<usize>], opts: &NapsuOptions) -> Result<MaxEnt, NapsuError> {
    let me = max_ent(domain, scopes, opts.max_features)?;
    if opts.inference.is_nuts() {
        opts.nuts.check(me.features.len, me.width)?;
    }
    Ok(me)
}

/// m models p(x | θ_i), each from its own posterior draw, scaled to n̂ rows.
pub fn posterior_models(
    stats: &NoisyStatistics,
    opts: &NapsuOptions,
    m: usize,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
) -> Result<(Vec<GraphicalModel>, InferenceReport), NapsuError> {
    let start = Instant::now();
    let scopes = stats.scopes()?;
    // Checked again here for `--from-record`, which charges nothing but
    // should fail before sampling rather than after.
    let me = checked_model(&stats.domain, &scopes, opts)?;
    let parameters = me.features.len;
    let post = Posterior::new(me.clone(), stats.statistics.clone(), stats.rows, stats.sigma)?;
    progress(&format!("napsu-mq: posterior mode over {parameters} parameters"));
    let fit = laplace(&post, &opts.laplace)?;
    let mut report = InferenceReport {
        method: opts.inference,
        parameters,
        mode_iterations: fit.iterations,
        draws: m,
        max_rhat: None,
        max_rhat_mean: None,
        min_ess: None,
        min_ess_mean: None,
        ranked_cells: None,
        cells: None,
        draws_per_chain: None,
        divergences: None,
        gradients: None,
        mean_steps: None,
        accepted_unconverged: false,
        importance: None,
        seconds: 0.0,
    };
    let thetas: Vec<Vec<f64>> = match opts.inference {
        Inference::Laplace => (0..m).map(|_| fit.draw(rng)).collect(),
        Inference::Nuts | Inference::NutsExact => {
            let exact = opts.inference == Inference::NutsExact;
            progress(&format!(
                "napsu-mq: NUTS, {} chains, {}",
                opts.nuts.chains,
                if exact { "exact gradients" } else { "covariance frozen at the mode, then importance weights" }
            ));
            // R̂ of what is released: μ(θ), which fixes p(x | θ) (nuts.rs's
            // module doc says why not θ's), by ranks for cells with at least
            // one expected row of n̂ (the floor; `convergence_of` says why).
            // The chains go on while it is over the limit (`sample`).
            let template = me.model(&vec![0.0; parameters]);
            let floor = 1.0 / stats.rows.max(1.0);
            let mut judged = None;
            let mut judge = |d: &NutsDraws| {
                let c = d.convergence_of(|t| me.mean_parameters_in(&template, t).iter().copied().collect(), floor);
                judged = Some(c);
                c.rhat
            };
            // The draws, and the importance correction when the chains ran on the surrogate.
            let (exact_run, corrected_run);
            let (draws, corrected) = if exact {
                exact_run = sample(&post, &fit, &opts.nuts, rng, progress, &mut judge)?;
                (&exact_run, None)
            } else {
                corrected_run = sample_corrected(&post, &fit, &opts.nuts, rng, progress, &mut judge)?;
                (&corrected_run.nuts, Some(&corrected_run))
            };
            let mu = judged.ok_or_else(|| NapsuError::Numerical("NUTS returned draws it had not judged".into()))?;
            let rhat_mean = mu.rhat;
            check_converged(rhat_mean, opts.nuts.max_rhat, opts.allow_unconverged)?;
            if let Some(c) = corrected {
                check_reliable(&c.correction, opts.allow_unconverged)?;
            }
            report.max_rhat = Some(draws.max_rhat());
            report.max_rhat_mean = Some(rhat_mean);
            report.min_ess = Some(draws.min_ess());
            report.min_ess_mean = Some(mu.bulk_ess);
            report.ranked_cells = Some(mu.ranked);
            report.cells = Some(mu.components);
            report.draws_per_chain = Some(draws.draws.len() / draws.chains.max(1));
            report.divergences = Some(draws.divergences);
            report.gradients = Some(draws.gradients);
            report.mean_steps = Some(draws.mean_steps);
            // A NaN R̂ is not convergence either.
            report.accepted_unconverged =
                rhat_mean.partial_cmp(&opts.nuts.max_rhat).is_none_or(|o| o == std::cmp::Ordering::Greater)
                    || corrected.is_some_and(|c| check_reliable(&c.correction, false).is_err());
            report.importance = corrected.map(|c| c.correction.clone());
            report.draws = draws.draws.len();
            if m > draws.draws.len() {
                return Err(NapsuError::Numerical(format!(
                    "{m} synthetic sets need {m} posterior draws but NUTS kept {}; ask for more draws",
                    draws.draws.len()
                )));
            }
            match corrected {
                // m draws with probabilities ∝ π/π_s (sampling–importance resampling).
                Some(c) => {
                    check_enough(&c.correction, m)?;
                    c.resample(m, rng)?
                }
                // m distinct draws at random from the pooled chains (003 Alg. 1 line 5).
                None => rand::seq::index::sample(rng, draws.draws.len(), m)
                    .into_iter()
                    .map(|i| draws.draws[i].clone())
                    .collect(),
            }
        }
    };
    let models = thetas
        .iter()
        .map(|t| {
            let mut model = me.model(t);
            model.total = stats.rows;
            model
        })
        .collect();
    report.seconds = start.elapsed().as_secs_f64();
    Ok((models, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DomainSpec;

    fn domain() -> Domain {
        DomainSpec::parse(r#"{"a": 2, "b": 3, "c": 2}"#, "t.json").unwrap().domain
    }

    #[test]
    fn rows_are_the_inverse_variance_weighted_mean_of_the_marginal_sums() {
        // Sums 100 (2 cells) and 130 (6 cells): weights 1/2 and 1/6.
        let stats = NoisyStatistics::new(
            &domain(),
            &[vec![0], vec![1, 2]],
            2.0,
            vec![40.0, 60.0, 20.0, 20.0, 20.0, 20.0, 25.0, 25.0],
        );
        let expect = (100.0 / 2.0 + 130.0 / 6.0) / (1.0 / 2.0 + 1.0 / 6.0);
        assert!((stats.rows - expect).abs() < 1e-9);
        assert_eq!(stats.queries, vec![vec!["a".to_string()], vec!["b".into(), "c".into()]]);
        // Two marginals, σ = 2: Δ₂ = √2, ρ = 2/(2·4).
        assert!((stats.l2_sensitivity - 2f64.sqrt()).abs() < 1e-12);
        assert!((stats.rho - 0.25).abs() < 1e-12);
        assert_eq!(stats.scopes().unwrap(), vec![vec![0], vec![1, 2]]);
    }

    #[test]
    fn edited_statistics_are_refused_with_what_is_wrong() {
        let good = NoisyStatistics::new(&domain(), &[vec![0, 1]], 1.0, vec![10.0; 6]);
        let mut short = good.clone();
        short.statistics.pop();
        assert!(short.scopes().unwrap_err().to_string().contains("5 statistics for queries with 6 cells"));
        let mut unknown = good.clone();
        unknown.queries[0][1] = "zz".into();
        assert!(unknown.scopes().unwrap_err().to_string().contains("\"zz\""));
        let mut order = good.clone();
        order.queries[0].reverse();
        assert!(order.scopes().unwrap_err().to_string().contains("domain order"));
        let mut format = good;
        format.format = "other".into();
        assert!(format.scopes().unwrap_err().to_string().contains("this dpflow reads"));
    }

    /// Statistics of a product distribution measured with little noise: the
    /// m models' 1-way marginals sit near the truth, and differ from each
    /// other (each is its own draw).
    #[test]
    fn laplace_draws_give_distinct_models_near_the_noisy_marginals() {
        let d = domain();
        // a: 30/70, b: 20/30/50 independent, n = 1000, tiny noise.
        let pa = [0.3, 0.7];
        let pb = [0.2, 0.3, 0.5];
        let stats: Vec<f64> = pa.iter().flat_map(|x| pb.iter().map(move |y| 1000.0 * x * y)).collect();
        let s = NoisyStatistics::new(&d, &[vec![0, 1]], 0.5, stats);
        let mut rng = DpRng::unsafe_seeded(3);
        let (models, report) = posterior_models(&s, &NapsuOptions::default(), 3, &mut rng, &|_| {}).unwrap();
        assert_eq!(models.len(), 3);
        assert_eq!(report.parameters, 1 + 2 + 2);
        for m in &models {
            assert!((m.total - 1000.0).abs() < 1e-6);
            let b = m.beliefs().marginal_any(&[0], &d.cardinalities());
            let p0 = b.values[0] / b.values.iter().sum::<f64>();
            // Posterior sd of p(a=0) is about √(0.21/1000) ≈ 0.015.
            assert!((p0 - 0.3).abs() < 0.06, "{p0}");
        }
        assert_ne!(models[0].potentials, models[1].potentials);
    }
}
