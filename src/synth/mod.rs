//! Select-measure-generate synthesizers (001 §3) on the PGM engine:
//! AIM (with its error bounds), MWEM+PGM, MST and Independent, behind one
//! [`Synthesizer`] abstraction (fit with a budget → model + release metadata;
//! sample N rows).
//!
//! Every synthesizer reads the private data only through exact marginal
//! answers computed once by `MarginalExec` and held in crate-private
//! `Answers`; every noisy measurement and selection is charged to the
//! release's accountant *before* its result is used.

pub mod aim;
pub mod bounds;
pub mod compress;
pub mod dips;
mod error;
pub mod gan;
pub mod independent;
pub mod kamino;
pub mod mst;
pub mod mwem;
pub mod napsu;
pub mod predict;
pub mod privbayes;
pub mod run;
pub mod structure;
#[cfg(test)]
mod tests;
pub mod workload;

use std::collections::HashMap;

use dpflow_udfs::noise::{DpRng, ExponentialMechanism, NoiseDistribution};
use itertools::Itertools;
use serde::{Deserialize, Serialize};

use crate::domain::Domain;
use crate::measure::{Accountant, ReleaseAccountant};
use crate::pgm::{EstimateOptions, GraphicalModel, Measurement, estimate};
use crate::privacy::MechanismRecord;

pub use error::SynthError;
pub use workload::{Workload, WorkloadQuery};

type Result<T, E = SynthError> = std::result::Result<T, E>;

/// Exact marginal answers (crate-private: never released without noise).
/// Keys are sorted attribute ids; values in the sorted-attribute layout.
#[derive(Clone, Default)]
pub(crate) struct Answers {
    pub(crate) sizes: Vec<usize>,
    pub(crate) map: HashMap<Vec<usize>, Vec<f64>>,
}

dpflow_udfs::protected_debug!(Answers);

impl Answers {
    pub(crate) fn get(&self, attrs: &[usize]) -> Result<&[f64]> {
        match self.map.get(attrs) {
            Some(v) => Ok(v),
            None => Err(SynthError::NotPrecomputed(attrs.to_vec())),
        }
    }

    /// Cells of a marginal.
    pub(crate) fn cells(&self, attrs: &[usize]) -> usize {
        attrs.iter().map(|&a| self.sizes[a]).product()
    }
}

/// Options shared by synthesizers.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Mirror-descent iterations per estimation.
    pub iters: usize,
    /// AIM's stopping rule inside the rounds: each estimation stops once its
    /// loss falls by less than this share over 50 iterations (0 runs all
    /// `iters`); `None` takes [`aim::AIM_TOLERANCE`]. The final fit stops at
    /// [`aim::AIM_FINAL_TOLERANCE`] or this, whichever is tighter.
    /// Post-processing: no effect on privacy.
    pub tolerance: Option<f64>,
    /// AIM/MWEM model capacity (JT-SIZE, MB).
    pub max_model_mb: f64,
    /// Confidence of AIM's error bounds (e.g. 0.95).
    pub confidence: f64,
    /// MWEM+PGM rounds (default: number of attributes).
    pub rounds: Option<usize>,
    /// PrivBayes degree k.
    pub degree: usize,
    /// Synthetic sets to write (m ≥ 1). NAPSU-MQ draws each from its own
    /// posterior sample (noise-aware); the other synthesizers draw all m
    /// from their one model (not noise-aware).
    pub multiple: usize,
    /// NAPSU-MQ's inference settings.
    pub napsu: napsu::release::NapsuOptions,
    /// The 002 cell synthesizers' settings.
    pub dips: DipsOptions,
    /// Kamino/KaminoI's settings (`impute` is set by the mechanism).
    pub kamino: kamino::KaminoOptions,
    /// DP-MisGAN/DP-GAN's settings (`missing_aware` is set by the mechanism).
    pub gan: gan::GanOptions,
}

/// Settings of the 002 cell synthesizers (`dips::cells`) that are not
/// budget, sets or rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DipsOptions {
    /// MODIPS's Dirichlet prior per cell (002 §4.1: 1/3, Kerman 2011;
    /// [`DipsOptions::given`] gives modips-glom 002 §4.3.1's 1/2, `default`
    /// gives every mechanism 1/3).
    pub prior: f64,
    /// How the Laplace sanitizer and perturbed histogram turn their table into rows.
    pub generate: dips::Generate,
    /// sequential-regression's ridge Λ (`dips::regression`: noise ∝ 1/Λ).
    pub ridge: f64,
    /// sequential-regression's model of numeric columns.
    pub numeric: dips::sequential::NumericModel,
}

impl Default for DipsOptions {
    fn default() -> Self {
        Self { prior: 1.0 / 3.0, generate: dips::Generate::Sample, ridge: 1.0, numeric: Default::default() }
    }
}

impl DipsOptions {
    /// The settings given for `mechanism` (`None`: not given), the rest
    /// its defaults (modips-glom's prior is 002 §4.3.1's 1/2, the others'
    /// 1/3). `Err` names the first setting given that the mechanism does
    /// not take (`prior`, `generate`, `ridge` or `numeric`), so that a
    /// setting is never silently ignored.
    pub fn given(
        mechanism: run::Mechanism,
        prior: Option<f64>,
        generate: Option<dips::Generate>,
        ridge: Option<f64>,
        numeric: Option<dips::sequential::NumericModel>,
    ) -> std::result::Result<Self, &'static str> {
        use run::Mechanism as M;
        let takes_prior = matches!(mechanism, M::Modips | M::ModipsGlom);
        let takes_generate = matches!(mechanism, M::LaplaceSanitizer | M::PerturbedHistogram);
        let sequential = mechanism == M::SequentialRegression;
        for (given, takes, name) in [
            (prior.is_some(), takes_prior, "prior"),
            (generate.is_some(), takes_generate, "generate"),
            (ridge.is_some(), sequential, "ridge"),
            (numeric.is_some(), sequential, "numeric"),
        ] {
            if given && !takes {
                return Err(name);
            }
        }
        let d = Self::default();
        let default_prior = if mechanism == M::ModipsGlom { 0.5 } else { d.prior };
        Ok(Self {
            prior: prior.unwrap_or(default_prior),
            generate: generate.unwrap_or(d.generate),
            ridge: ridge.unwrap_or(d.ridge),
            numeric: numeric.unwrap_or(d.numeric),
        })
    }
}

impl Default for SynthOptions {
    fn default() -> Self {
        Self {
            iters: 1000,
            tolerance: None,
            max_model_mb: 80.0,
            confidence: 0.95,
            rounds: None,
            degree: 2,
            multiple: 1,
            napsu: Default::default(),
            dips: Default::default(),
            kamino: Default::default(),
            gan: Default::default(),
        }
    }
}

/// One noisy measurement in the release record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementLog {
    /// Attribute names.
    pub attributes: Vec<String>,
    /// Noise σ (the standard deviation; for Laplace noise of scale b, b√2).
    pub sigma: f64,
    /// Round (0 = initialisation).
    pub round: usize,
    /// The noise: `gaussian` (discrete Gaussian, zCDP) or `laplace`
    /// (discrete Laplace, pure ε).
    #[serde(default)]
    pub noise: String,
    /// Half-width of the `level` confidence interval of every noisy cell of
    /// this marginal: the noise scale is public, so each measured count c̃
    /// has c̃ ± this as its interval (Gaussian: z·σ; Laplace: b·ln(1/α)).
    #[serde(default)]
    pub ci_half_width: f64,
    /// The interval's coverage (the run's `--confidence`).
    #[serde(default)]
    pub level: f64,
    /// The noisy counts themselves, for one-way marginals (DP outputs: the
    /// model is post-processing of them; the release report plots them
    /// against the synthetic data's marginals). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<f64>,
}

/// Discrete Gaussian noise of σ (the synthesizers' zCDP measurements).
pub(crate) fn gauss(sigma: f64) -> NoiseDistribution {
    NoiseDistribution::Gaussian { sigma }
}

impl MeasurementLog {
    /// The record of a marginal over `attributes` measured in `round` with
    /// `noise`, with its cells' interval at `level`.
    pub fn new(attributes: Vec<String>, noise: NoiseDistribution, round: usize, level: f64) -> Self {
        let kind = match noise {
            NoiseDistribution::Gaussian { .. } => "gaussian",
            NoiseDistribution::Laplace { .. } => "laplace",
        };
        Self {
            attributes,
            sigma: noise.std_dev(),
            round,
            noise: kind.into(),
            ci_half_width: noise.integer_ci_half_width(level),
            level,
            values: Vec::new(),
        }
    }

    /// The record with the measurement's noisy counts (one-way marginals).
    pub fn with_values(mut self, values: &[f64]) -> Self {
        self.values = values.to_vec();
        self
    }
}

/// What a fit produces besides the model.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FitMetadata {
    /// Every measurement.
    pub measurements: Vec<MeasurementLog>,
    /// Rounds run (AIM, MWEM).
    pub rounds: usize,
    /// Per-workload-marginal error bounds (AIM).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_bounds: Vec<bounds::ErrorBound>,
    /// Free-form notes (e.g. compression, annealing events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A fitted synthesizer.
#[derive(Debug, Clone)]
pub struct Fitted {
    /// The model over (possibly compressed) codes.
    pub model: GraphicalModel,
    /// Domain compression (MST), mapping model codes to domain codes.
    pub compression: Option<compress::Compression>,
    /// Release metadata.
    pub metadata: FitMetadata,
}

/// Everything a synthesizer may use while fitting.
///
/// What it allows, precisely: `answers` holds the exact marginals of the
/// private data and is readable by the synthesizers, because selection needs
/// them: AIM's quality scores (001 Alg. 2), MWEM's L1 errors, PrivBayes's
/// mutual information (the exponential mechanism's scores) and MST's domain
/// compression (its compressed tables are then measured). Every such read
/// must end in a charged mechanism: [`FitContext::measure`] and its siblings
/// (charge through `accountant`, then add noise) or an exponential mechanism
/// whose loss is charged before it draws. No exact value may be stored in the
/// model or the metadata; the reviews of each synthesizer check this.
pub(crate) struct FitContext<'a> {
    pub domain: &'a Domain,
    pub sizes: Vec<usize>,
    pub answers: &'a Answers,
    pub accountant: &'a mut ReleaseAccountant,
    pub rng: &'a mut DpRng,
    pub workload: &'a Workload,
    /// The zCDP budget of this fit (zCDP synthesizers).
    pub rho: f64,
    /// The pure-ε budget of this fit (pure-DP synthesizers such as PrivBayes).
    pub epsilon: f64,
    pub options: &'a SynthOptions,
    pub progress: &'a dyn Fn(&str),
    /// Set when answers are observed-only marginals (adaptive recourse, 000
    /// §4.2) of a model over observed values: each measurement then estimates
    /// c_r·M_r(p) with c_r the fraction of rows observed on r.
    pub observed: Option<Observed>,
    /// The step size the last warm-startable estimate ended with.
    pub step: std::cell::Cell<Option<f64>>,
}

/// State of an observed-only (adaptive) fit.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// Noisy number of rows N̂ (measured before the fit, charged).
    pub total: f64,
    /// Observed fraction of each attribute, once its 1-way marginal is measured.
    pub fraction: Vec<Option<f64>>,
}

impl FitContext<'_> {
    pub(crate) fn names(&self, attrs: &[usize]) -> Vec<String> {
        attrs.iter().map(|&a| self.domain.columns()[a].name.clone()).collect()
    }

    /// Charges, then measures marginal `attrs` with discrete Gaussian noise σ
    /// (L2 sensitivity 1 under add/remove-one).
    pub(crate) fn measure(&mut self, attrs: &[usize], sigma: f64) -> Result<Measurement> {
        let exact = self.answers.get(attrs)?.to_vec();
        self.measure_values(attrs, &exact, sigma)
    }

    /// Charges, then adds discrete Gaussian noise σ to exact counts `exact` of a
    /// sensitivity-1 table over `attrs` (e.g. a compressed marginal).
    pub(crate) fn measure_values(&mut self, attrs: &[usize], exact: &[f64], sigma: f64) -> Result<Measurement> {
        self.measure_with(attrs, exact, NoiseDistribution::Gaussian { sigma })
    }

    /// Charges, then adds discrete Laplace noise of scale `b` (ε = 1/b for a
    /// sensitivity-1 count table) to the exact marginal `attrs`.
    pub(crate) fn measure_laplace(&mut self, attrs: &[usize], b: f64) -> Result<Measurement> {
        let exact = self.answers.get(attrs)?.to_vec();
        self.measure_with(attrs, &exact, NoiseDistribution::Laplace { scale: b })
    }

    fn measure_with(&mut self, attrs: &[usize], exact: &[f64], noise: NoiseDistribution) -> Result<Measurement> {
        let mode = if self.observed.is_some() { "observed-only " } else { "" };
        let target = format!("{mode}marginal({})", self.names(attrs).join(","));
        let (record, sigma) = match noise {
            NoiseDistribution::Gaussian { sigma } => (MechanismRecord::gaussian(target, 1.0, sigma), sigma),
            NoiseDistribution::Laplace { scale } => {
                (MechanismRecord::laplace(target, 1.0, scale), scale * std::f64::consts::SQRT_2)
            }
        };
        self.accountant.charge(&[record])?;
        let sampler = noise.integer_sampler();
        let values: Vec<f64> =
            exact.iter().map(|&c| (c as i128).saturating_add(sampler.sample(self.rng)) as f64).collect();
        let query = match &mut self.observed {
            None => crate::pgm::Query::Identity,
            Some(o) => {
                // Post-processing of this measurement: its noisy total over N̂.
                let c = (values.iter().sum::<f64>() / o.total).clamp(1e-3, 1.0);
                if attrs.len() == 1 {
                    o.fraction[attrs[0]] = Some(c);
                }
                crate::pgm::Query::Scaled(c)
            }
        };
        Ok(Measurement { attrs: attrs.to_vec(), values, sigma, query })
    }

    /// The factor relating the model's marginal on `attrs` to its exact answer:
    /// 1 for full answers; for observed-only answers the product of the
    /// attributes' measured observed fractions (exact under MCAR with
    /// independent columns; unmeasured attributes count as fully observed).
    pub(crate) fn scale_for(&self, attrs: &[usize]) -> f64 {
        match &self.observed {
            None => 1.0,
            Some(o) => attrs.iter().map(|&a| o.fraction[a].unwrap_or(1.0)).product(),
        }
    }

    /// Estimation options with the fit's known total (observed-only fits).
    pub(crate) fn estimate_options(&self, iters: usize) -> EstimateOptions {
        EstimateOptions { iters, total: self.observed.as_ref().map(|o| o.total), ..Default::default() }
    }

    /// Charges, then selects with the exponential mechanism (ε-DP, charged
    /// as ε²/8-zCDP to a zCDP budget).
    pub(crate) fn select(&mut self, what: &str, scores: &[f64], epsilon: f64, sensitivity: f64) -> Result<usize> {
        let zcdp = matches!(self.accountant.filter().budget(), crate::privacy::Budget::Zcdp { .. });
        let record = MechanismRecord::exponential(what, sensitivity, epsilon, zcdp)
            .with_params(serde_json::json!({ "epsilon": epsilon, "candidates": scores.len() }));
        self.accountant.charge(&[record])?;
        let mech = ExponentialMechanism::new(epsilon, sensitivity)?;
        Ok(mech.select(self.rng, scores)?)
    }

    /// Private-PGM estimation with the fit's options (all iterations).
    pub(crate) fn estimate(
        &self,
        measurements: &[Measurement],
        warm: Option<&GraphicalModel>,
        iters: usize,
    ) -> GraphicalModel {
        self.estimate_until(measurements, warm, iters, 0.0)
    }

    /// Private-PGM estimation that stops once the loss falls by less than
    /// `tolerance` (relative) over 50 iterations (0: run all `iters`). A
    /// warm-started fit also starts from the step size its predecessor in
    /// this fit ended with, not from the conservative 2/(L·n): the line
    /// search halves a step that is too long, and growing a short one by 1%
    /// per iteration took hundreds of iterations in every AIM round.
    pub(crate) fn estimate_until(
        &self,
        measurements: &[Measurement],
        warm: Option<&GraphicalModel>,
        iters: usize,
        tolerance: f64,
    ) -> GraphicalModel {
        let mut options = self.estimate_options(iters);
        options.tolerance = tolerance;
        if warm.is_some() {
            options.initial_step = self.step.get();
        }
        let e = estimate(&self.sizes, measurements, &options, warm);
        self.step.set(Some(e.step));
        e.model
    }
}

/// A select-measure-generate synthesizer.
pub trait Synthesizer {
    /// Name used in release records (`aim`, `mst`, ...).
    fn name(&self) -> &'static str;

    /// The exact marginals (sorted attribute ids) the fit will read.
    fn required_marginals(&self, domain: &Domain, workload: &Workload) -> Vec<Vec<usize>>;

    /// Fits within `ctx.rho` (or `ctx.epsilon` for pure-DP synthesizers).
    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted>;

    /// Whether it accounts in pure ε-DP (Laplace noise) rather than zCDP.
    fn pure_dp(&self) -> bool {
        false
    }
}

/// All 1-way attribute sets.
pub(crate) fn one_way(d: usize) -> Vec<Vec<usize>> {
    (0..d).map(|a| vec![a]).collect()
}

/// All 2-way attribute sets, in lexicographic order.
pub(crate) fn two_way(d: usize) -> Vec<Vec<usize>> {
    (0..d).array_combinations().map(|[i, j]| vec![i, j]).collect()
}

/// ‖a − b‖₁.
pub(crate) fn l1(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum()
}
