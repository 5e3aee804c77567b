//! A share: the part of a budget one mechanism (or one fit) is given, in the
//! unit its noise is calibrated in: pure ε (Laplace, exponential mechanism)
//! or ρ-zCDP (Gaussian).
//!
//! With [`super::Budget`] (what a dataset or release may spend, including
//! (ε, δ)) and [`super::PrivacyLoss`] (what a mechanism is charged, in any
//! unit the accountant composes), it is the third and last member of the
//! privacy-loss family: a SQL call site's `epsilon =>`/`rho =>`, the per-call
//! split of a query budget and a synthesizer's fit budget are all shares.

use dpflow_udfs::noise::NoiseDistribution;
use serde::Serialize;

use super::{Budget, PrivacyLoss};

/// The part of a budget given to one mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Share {
    /// Pure ε (Laplace noise, exponential mechanism).
    Epsilon(f64),
    /// ρ-zCDP (Gaussian noise).
    Rho(f64),
}

impl Share {
    /// The amount in its own unit (ε or ρ).
    pub fn amount(&self) -> f64 {
        match *self {
            Share::Epsilon(x) | Share::Rho(x) => x,
        }
    }

    /// The same kind of share, `f` times as large.
    pub fn scaled(&self, f: f64) -> Self {
        match *self {
            Share::Epsilon(x) => Share::Epsilon(x * f),
            Share::Rho(x) => Share::Rho(x * f),
        }
    }

    /// The share as a budget of its own (a per-fit filter).
    pub fn as_budget(&self) -> Budget {
        match *self {
            Share::Epsilon(epsilon) => Budget::Pure { epsilon },
            Share::Rho(rho) => Budget::Zcdp { rho },
        }
    }

    /// The loss of a mechanism that spends exactly this share.
    pub fn loss(&self) -> PrivacyLoss {
        match *self {
            Share::Epsilon(epsilon) => PrivacyLoss::Pure { epsilon },
            Share::Rho(rho) => PrivacyLoss::Zcdp { rho },
        }
    }

    /// Noise for a count of sensitivity 1 that spends this share: Laplace
    /// b = 1/ε (ε-DP), or Gaussian σ = √(1/(2ρ)) (ρ-zCDP, 1/(2σ²) = ρ).
    pub fn count_noise(&self) -> NoiseDistribution {
        match *self {
            Share::Epsilon(eps) => NoiseDistribution::Laplace { scale: 1.0 / eps },
            Share::Rho(rho) => NoiseDistribution::Gaussian { sigma: (1.0 / (2.0 * rho)).sqrt() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_noised_for_a_share_costs_exactly_that_share() {
        // Laplace b = 1/ε on sensitivity 1 is ε-DP; Gaussian σ on sensitivity 1 is 1/(2σ²)-zCDP.
        match Share::Epsilon(0.5).count_noise() {
            NoiseDistribution::Laplace { scale } => assert_eq!(scale, 2.0),
            other => panic!("{other:?}"),
        }
        match Share::Rho(0.125).count_noise() {
            NoiseDistribution::Gaussian { sigma } => assert!((1.0 / (2.0 * sigma * sigma) - 0.125).abs() < 1e-12),
            other => panic!("{other:?}"),
        }
        assert_eq!(Share::Rho(0.2).scaled(0.5), Share::Rho(0.1));
        assert_eq!(Share::Epsilon(1.0).as_budget(), Budget::Pure { epsilon: 1.0 });
        assert_eq!(Share::Rho(0.3).loss(), PrivacyLoss::Zcdp { rho: 0.3 });
    }
}
