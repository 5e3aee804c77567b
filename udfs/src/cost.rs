//! Privacy costs as data: what a mechanism spent and how, so that a release
//! can list every mechanism with its parameters (OpenDP-style: the cost sits
//! next to the mechanism that incurs it).

use serde::{Deserialize, Serialize};

use crate::noise::NoiseDistribution;

/// A privacy loss in its native unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "unit", rename_all = "snake_case")]
pub enum PrivacyLoss {
    /// Pure ε-DP.
    Pure {
        /// ε.
        epsilon: f64,
    },
    /// Approximate (ε, δ)-DP.
    Approx {
        /// ε.
        epsilon: f64,
        /// δ.
        delta: f64,
    },
    /// ρ-zero-concentrated DP.
    Zcdp {
        /// ρ.
        rho: f64,
    },
    /// A Rényi-DP curve: (α, ε(α)) pairs.
    Rdp {
        /// (order α, ε at α).
        curve: Vec<(f64, f64)>,
    },
}

impl PrivacyLoss {
    /// A one-line description, e.g. `ρ=0.0125` or `ε=1, δ=1e-6`.
    pub fn describe(&self) -> String {
        match self {
            PrivacyLoss::Pure { epsilon } => format!("ε={epsilon}"),
            PrivacyLoss::Approx { epsilon, delta } => format!("ε={epsilon}, δ={delta:e}"),
            PrivacyLoss::Zcdp { rho } => format!("ρ={rho}"),
            PrivacyLoss::Rdp { curve } => format!("RDP curve with {} orders", curve.len()),
        }
    }

    /// Whether the loss is zero (nothing spent).
    pub fn is_zero(&self) -> bool {
        match self {
            PrivacyLoss::Pure { epsilon } => *epsilon == 0.0,
            PrivacyLoss::Approx { epsilon, delta } => *epsilon == 0.0 && *delta == 0.0,
            PrivacyLoss::Zcdp { rho } => *rho == 0.0,
            PrivacyLoss::Rdp { curve } => curve.iter().all(|(_, e)| *e == 0.0),
        }
    }
}

/// One mechanism invocation, as it appears in a release record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MechanismRecord {
    /// Mechanism name, e.g. `gaussian`, `laplace`, `exponential`, `generalized_cauchy`.
    pub mechanism: String,
    /// What it measured, e.g. `marginal(age,income)` or `dp_sum(capital-gain)`.
    pub target: String,
    /// Sensitivity of the measured query (L1 for Laplace, L2 for Gaussian, score
    /// sensitivity for the exponential mechanism); `None` when not
    /// applicable (e.g. an out-of-band charge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<f64>,
    /// The noise distribution, when the mechanism adds noise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<NoiseDistribution>,
    /// Its privacy loss.
    pub loss: PrivacyLoss,
    /// Mechanism-specific parameters (candidates, clamping bounds, ...).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub params: serde_json::Value,
}

impl MechanismRecord {
    /// A record for Gaussian noise σ on an L2-sensitivity-Δ query (ρ = Δ²/2σ²).
    pub fn gaussian(target: impl Into<String>, sensitivity: f64, sigma: f64) -> Self {
        Self {
            mechanism: "gaussian".into(),
            target: target.into(),
            sensitivity: Some(sensitivity),
            noise: Some(NoiseDistribution::Gaussian { sigma }),
            loss: PrivacyLoss::Zcdp { rho: crate::calibrate::gaussian_rho(sensitivity, sigma) },
            params: serde_json::Value::Null,
        }
    }

    /// A record for Laplace noise b on an L1-sensitivity-Δ query (ε = Δ/b).
    pub fn laplace(target: impl Into<String>, sensitivity: f64, scale: f64) -> Self {
        Self {
            mechanism: "laplace".into(),
            target: target.into(),
            sensitivity: Some(sensitivity),
            noise: Some(NoiseDistribution::Laplace { scale }),
            loss: PrivacyLoss::Pure { epsilon: sensitivity / scale },
            params: serde_json::Value::Null,
        }
    }

    /// A record for an exponential-mechanism selection (ε-DP, ε²/8-zCDP).
    pub fn exponential(target: impl Into<String>, sensitivity: f64, epsilon: f64, zcdp: bool) -> Self {
        Self {
            mechanism: "exponential".into(),
            target: target.into(),
            sensitivity: Some(sensitivity),
            noise: None,
            loss: if zcdp { PrivacyLoss::Zcdp { rho: epsilon * epsilon / 8.0 } } else { PrivacyLoss::Pure { epsilon } },
            params: serde_json::json!({ "epsilon": epsilon }),
        }
    }

    /// Attaches parameters.
    pub fn with_params(mut self, params: serde_json::Value) -> Self {
        self.params = params;
        self
    }
}
