//! What [`crate::synth::SyntheticExec`] samples from: a marginal model's
//! sampling plan (AIM, MST, MWEM, PrivBayes, NAPSU-MQ, …) or a released
//! generator network (DP-MisGAN, DP-GAN).

use datafusion::arrow::array::RecordBatch;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::generator::GeneratorPlan;
use super::plan::{PlanError, SamplingPlan};
use crate::domain::{DecodeError, Domain, DomainError, decode_columns};

/// A sampler over a public domain; every variant draws rows from DP outputs
/// only (post-processing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampler {
    /// Conditional tables in generation order (randomized rounding).
    Marginal(SamplingPlan),
    /// A generator network.
    Generator(GeneratorPlan),
}

impl From<SamplingPlan> for Sampler {
    fn from(plan: SamplingPlan) -> Self {
        Sampler::Marginal(plan)
    }
}

impl From<GeneratorPlan> for Sampler {
    fn from(plan: GeneratorPlan) -> Self {
        Sampler::Generator(plan)
    }
}

impl Sampler {
    /// The domain the rows are decoded into.
    pub fn domain(&self) -> &Domain {
        match self {
            Sampler::Marginal(p) => &p.domain,
            Sampler::Generator(p) => &p.domain,
        }
    }

    /// The same sampler with its domain's indexes rebuilt (after decoding).
    pub fn reindex(self) -> Result<Self, DomainError> {
        Ok(match self {
            Sampler::Marginal(mut p) => {
                p.domain = p.domain.reindex()?;
                Sampler::Marginal(p)
            }
            Sampler::Generator(mut p) => {
                p.domain = p.domain.reindex()?;
                Sampler::Generator(p)
            }
        })
    }

    /// Checks the plan against its domain.
    pub fn validate(&self) -> Result<(), PlanError> {
        match self {
            Sampler::Marginal(p) => p.validate(),
            Sampler::Generator(p) => p.validate(),
        }
    }

    /// `rows` decoded rows.
    pub fn sample_batch<R: Rng + ?Sized>(&self, rows: usize, rng: &mut R) -> Result<RecordBatch, DecodeError> {
        match self {
            Sampler::Marginal(p) => p.sample_batch(rows, rng),
            Sampler::Generator(p) => {
                let codes = p.sample_codes(rows, rng);
                let refs: Vec<&[u32]> = codes.iter().map(|c| c.as_slice()).collect();
                decode_columns(&p.domain, &refs, p.decode, rng)
            }
        }
    }
}
