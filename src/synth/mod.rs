//! Select-measure-generate synthesizers (001 §3) on the PGM engine:
//! AIM (with its error bounds), MWEM+PGM, MST and Independent, behind one
//! [`Synthesizer`] abstraction (fit with a budget → model + release metadata;
//! sample N rows).
//!
//! Every synthesizer reads the private data only through exact marginal
//! answers computed once by `MarginalExec` and held in crate-private
//! [`Answers`]; every noisy measurement and selection is charged to the
//! release's accountant *before* its result is used.

pub mod aim;
pub mod bounds;
pub mod compress;
pub mod independent;
pub mod mst;
pub mod mwem;
pub mod run;
#[cfg(test)]
mod tests;
pub mod workload;

use std::collections::HashMap;

use anyhow::{Result, bail};
use dpflow_udfs::noise::{DpRng, ExponentialMechanism, NoiseDistribution};
use serde::{Deserialize, Serialize};

use crate::domain::Domain;
use crate::measure::{Accountant, ReleaseAccountant};
use crate::pgm::{EstimateOptions, GraphicalModel, Measurement, estimate};
use crate::privacy::MechanismRecord;
pub use workload::{Workload, WorkloadQuery};

/// Exact marginal answers (crate-private: never released without noise).
/// Keys are sorted attribute ids; values in the sorted-attribute layout.
#[derive(Debug, Clone, Default)]
pub(crate) struct Answers {
    pub(crate) sizes: Vec<usize>,
    pub(crate) map: HashMap<Vec<usize>, Vec<f64>>,
}

impl Answers {
    pub(crate) fn get(&self, attrs: &[usize]) -> Result<&[f64]> {
        match self.map.get(attrs) {
            Some(v) => Ok(v),
            None => bail!("internal: marginal {attrs:?} was not precomputed"),
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
    /// AIM/MWEM model capacity (JT-SIZE, MB).
    pub max_model_mb: f64,
    /// Confidence of AIM's error bounds (e.g. 0.95).
    pub confidence: f64,
    /// MWEM+PGM rounds (default: number of attributes).
    pub rounds: Option<usize>,
}

impl Default for SynthOptions {
    fn default() -> Self {
        Self { iters: 1000, max_model_mb: 80.0, confidence: 0.95, rounds: None }
    }
}

/// One noisy measurement in the release record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementLog {
    /// Attribute names.
    pub attributes: Vec<String>,
    /// Noise σ.
    pub sigma: f64,
    /// Round (0 = initialisation).
    pub round: usize,
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
pub(crate) struct FitContext<'a> {
    pub domain: &'a Domain,
    pub sizes: Vec<usize>,
    pub answers: &'a Answers,
    pub accountant: &'a mut ReleaseAccountant,
    pub rng: &'a mut DpRng,
    pub workload: &'a Workload,
    /// The zCDP budget of this fit.
    pub rho: f64,
    pub options: &'a SynthOptions,
    pub progress: &'a dyn Fn(&str),
}

impl FitContext<'_> {
    pub(crate) fn names(&self, attrs: &[usize]) -> Vec<String> {
        attrs.iter().map(|&a| self.domain.columns()[a].name.clone()).collect()
    }

    /// Charges, then measures marginal `attrs` with discrete Gaussian noise σ
    /// (L2 sensitivity 1 under add/remove-one).
    pub(crate) fn measure(&mut self, attrs: &[usize], sigma: f64) -> Result<Measurement> {
        let record = MechanismRecord::gaussian(format!("marginal({})", self.names(attrs).join(",")), 1.0, sigma);
        self.accountant.charge(&[record])?;
        let exact = self.answers.get(attrs)?.to_vec();
        let sampler = NoiseDistribution::Gaussian { sigma }.integer_sampler();
        let values: Vec<f64> = exact.iter().map(|&c| (c as i128 + sampler.sample(self.rng)) as f64).collect();
        Ok(Measurement { attrs: attrs.to_vec(), values, sigma, query: crate::pgm::Query::Identity })
    }

    /// Charges, then adds discrete Gaussian noise σ to exact counts `exact` of a
    /// sensitivity-1 table over `attrs` (e.g. a compressed marginal).
    pub(crate) fn measure_values(&mut self, attrs: &[usize], exact: &[f64], sigma: f64) -> Result<Measurement> {
        let record = MechanismRecord::gaussian(format!("marginal({})", self.names(attrs).join(",")), 1.0, sigma);
        self.accountant.charge(&[record])?;
        let sampler = NoiseDistribution::Gaussian { sigma }.integer_sampler();
        let values: Vec<f64> = exact.iter().map(|&c| (c as i128 + sampler.sample(self.rng)) as f64).collect();
        Ok(Measurement { attrs: attrs.to_vec(), values, sigma, query: crate::pgm::Query::Identity })
    }

    /// Charges, then selects with the exponential mechanism (ε²/8-zCDP).
    pub(crate) fn select(&mut self, what: &str, scores: &[f64], epsilon: f64, sensitivity: f64) -> Result<usize> {
        let record = MechanismRecord::exponential(what, sensitivity, epsilon, true)
            .with_params(serde_json::json!({ "epsilon": epsilon, "candidates": scores.len() }));
        self.accountant.charge(&[record])?;
        let mech = ExponentialMechanism::new(epsilon, sensitivity)?;
        Ok(mech.select(self.rng, scores)?)
    }

    /// Private-PGM estimation with the fit's options.
    pub(crate) fn estimate(
        &self,
        measurements: &[Measurement],
        warm: Option<&GraphicalModel>,
        iters: usize,
    ) -> GraphicalModel {
        let opts = EstimateOptions { iters, ..Default::default() };
        estimate(&self.sizes, measurements, &opts, warm).model
    }
}

/// A select-measure-generate synthesizer.
pub trait Synthesizer {
    /// Name used in release records (`aim`, `mst`, ...).
    fn name(&self) -> &'static str;

    /// The exact marginals (sorted attribute ids) the fit will read.
    fn required_marginals(&self, domain: &Domain, workload: &Workload) -> Vec<Vec<usize>>;

    /// Fits within `ctx.rho`.
    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted>;
}

/// All 1-way attribute sets.
pub(crate) fn one_way(d: usize) -> Vec<Vec<usize>> {
    (0..d).map(|a| vec![a]).collect()
}

/// All 2-way attribute sets.
pub(crate) fn two_way(d: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for i in 0..d {
        for j in i + 1..d {
            out.push(vec![i, j]);
        }
    }
    out
}

/// ‖a − b‖₁.
pub(crate) fn l1(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum()
}
