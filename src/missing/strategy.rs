//! How a marginal-based synthesizer treats nulls (000 §4):
//!
//! - `reproduce` (default): null is its own code in the model, so synthetic
//!   data has nulls where the model puts them (realistic missingness; the
//!   released nulls are synthetic, drawn from the DP model, never copied).
//! - `complete-row` (000 §4.1): only rows observed on every column are read.
//! - `impute-first:<method>` (000 §4.1): nulls are filled first, then the
//!   synthesizer reads the filled table. `random` (uniform, data-independent,
//!   free), `mode` (DP mode of each column: noisy 1-way observed marginals,
//!   a share of the budget), `model` (a DP MST model fitted on observed-only
//!   marginals with a share of the budget; each null drawn from its
//!   conditional given the row's parents), and `mode-stability` (the exact,
//!   non-private mode — the imputation is then a transformation whose
//!   stability 1 + M, for a public bound M on the missing cells, multiplies
//!   the synthesizer's cost (000 Lemma 4.2 / Thm 4.3), so the synthesizer
//!   gets only ρ/(1+M)² or ε/(1+M): this is why it is expensive).
//! - `adaptive` (000 §4.2, partial marginal observation): each marginal is
//!   counted on the rows observed on its own attributes — AIME for AIM,
//!   PrivBayesE for PrivBayes. The model is over observed values; a measured
//!   marginal estimates c_r·M_r(p) with c_r its noisy observed fraction
//!   relative to a noisy row count N̂ (1% of the budget).

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::amplify::{self, Amplification, Missingness, Rates, SubCost, SubMechanism};
use crate::privacy::{MechanismRecord, PrivacyLoss};

/// An imputation method for imputation-first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImputeMethod {
    /// Uniform over the column's values (data-independent).
    Random,
    /// DP mode per column (budget split).
    Mode,
    /// Draws from a DP model's conditionals (budget split).
    Model,
    /// Exact mode, paid for by stability (000 Thm 4.3).
    ModeStability,
}

/// The missing-data strategy of a synthesis run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case", tag = "strategy", content = "method")]
pub enum Strategy {
    /// Null is a code of the model; synthetic data has realistic nulls.
    #[default]
    Reproduce,
    /// Only complete rows.
    CompleteRow,
    /// Fill nulls, then synthesize.
    ImputeFirst(ImputeMethod),
    /// Observed-only marginals (AIME, PrivBayesE).
    Adaptive,
}

impl FromStr for Strategy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "reproduce" | "as-value" => Strategy::Reproduce,
            "complete-row" => Strategy::CompleteRow,
            "adaptive" => Strategy::Adaptive,
            "impute-first" | "impute-first:model" => Strategy::ImputeFirst(ImputeMethod::Model),
            "impute-first:random" => Strategy::ImputeFirst(ImputeMethod::Random),
            "impute-first:mode" => Strategy::ImputeFirst(ImputeMethod::Mode),
            "impute-first:mode-stability" => Strategy::ImputeFirst(ImputeMethod::ModeStability),
            other => bail!(
                "unknown missing-data strategy {other:?}: use reproduce, complete-row, adaptive, or \
                 impute-first:random|mode|model|mode-stability"
            ),
        })
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Reproduce => write!(f, "reproduce"),
            Strategy::CompleteRow => write!(f, "complete-row"),
            Strategy::Adaptive => write!(f, "adaptive"),
            Strategy::ImputeFirst(m) => write!(
                f,
                "impute-first:{}",
                match m {
                    ImputeMethod::Random => "random",
                    ImputeMethod::Mode => "mode",
                    ImputeMethod::Model => "model",
                    ImputeMethod::ModeStability => "mode-stability",
                }
            ),
        }
    }
}

impl Strategy {
    /// Whether the model has null codes (only `reproduce`).
    pub fn models_nulls(&self) -> bool {
        *self == Strategy::Reproduce
    }
}

/// Options of the strategies.
#[derive(Debug, Clone, PartialEq)]
pub struct StrategyOptions {
    /// Budget share of DP imputation statistics (`mode`, `model`).
    pub impute_share: f64,
    /// Budget share of the noisy row count N̂ (`adaptive`).
    pub total_share: f64,
    /// Public bound on the number of missing cells (`mode-stability`).
    pub max_missing_cells: Option<u64>,
}

impl Default for StrategyOptions {
    fn default() -> Self {
        Self { impute_share: 0.2, total_share: 0.01, max_missing_cells: None }
    }
}

/// The amplification request of a release: declared mechanism and public rates.
#[derive(Debug, Clone)]
pub struct AmplificationRequest {
    /// Declared missingness.
    pub missingness: Missingness,
    /// Public missing probabilities (rates spec `COL=R,...`, or one rate for all).
    pub rates: String,
    /// δ at which zCDP parts are converted.
    pub delta: f64,
}

/// Attribute names of a marginal record's target, e.g. `observed-only marginal(a,b)`.
fn record_attrs(r: &MechanismRecord, names: &[&str]) -> Vec<usize> {
    let t = r.target.as_str();
    let Some(inner) = t.find("marginal(").map(|i| &t[i + "marginal(".len()..]).and_then(|s| s.strip_suffix(')')) else {
        return vec![];
    };
    let mut out: Vec<usize> = inner.split(',').filter_map(|n| names.iter().position(|x| *x == n)).collect();
    out.sort_unstable();
    out
}

/// The sub-mechanisms of a release for amplification: marginal measurements
/// read the rows observed on their attributes; anything else (selections,
/// counts) is treated as reading every row (no amplification).
pub fn sub_mechanisms(records: &[MechanismRecord], names: &[&str]) -> Vec<SubMechanism> {
    records
        .iter()
        .map(|r| SubMechanism {
            name: r.target.clone(),
            attrs: record_attrs(r, names),
            cost: match r.loss {
                PrivacyLoss::Pure { epsilon } => SubCost::Approx { epsilon, delta: 0.0 },
                PrivacyLoss::Approx { epsilon, delta } => SubCost::Approx { epsilon, delta },
                PrivacyLoss::Zcdp { rho } => SubCost::Zcdp { rho },
                // Converted at a small fixed δ (no synthesizer produces RDP charges today).
                PrivacyLoss::Rdp { ref curve } => {
                    let (epsilon, delta) = crate::privacy::convert::rdp_to_approx(curve, 1e-10);
                    SubCost::Approx { epsilon, delta }
                }
            },
        })
        .collect()
}

/// The ground-truth ε̄ of a synthesis run's records under `request`, or why none is reported.
pub fn amplification_for(
    strategy: Strategy,
    records: &[MechanismRecord],
    names: &[&str],
    request: &AmplificationRequest,
) -> Result<Amplification> {
    request.missingness.require_mcar()?;
    let rates = match request.rates.trim().parse::<f64>() {
        Ok(r) => Rates::uniform(names, r)?,
        Err(_) => Rates::parse(names, &request.rates)?,
    };
    let mechs = sub_mechanisms(records, names);
    match strategy {
        Strategy::CompleteRow => Ok(amplify::complete_row(&mechs, &rates, request.delta)),
        Strategy::Adaptive => Ok(amplify::optimal(&mechs, &rates, request.delta)),
        Strategy::Reproduce => {
            bail!("no MCAR amplification: with null as a value every row is read, so missingness subsamples nothing")
        }
        Strategy::ImputeFirst(_) => {
            bail!("no MCAR amplification: imputation-first reads every row (filled), so missingness subsamples nothing")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for s in [
            "reproduce",
            "complete-row",
            "adaptive",
            "impute-first:random",
            "impute-first:mode",
            "impute-first:model",
            "impute-first:mode-stability",
        ] {
            assert_eq!(s.parse::<Strategy>().unwrap().to_string(), s);
        }
        assert!("impute-first:median".parse::<Strategy>().is_err());
    }

    #[test]
    fn records_map_to_marginal_attributes() {
        let names = ["a", "b", "c"];
        let recs = vec![
            MechanismRecord::laplace("observed-only marginal(c,a)", 1.0, 2.0),
            MechanismRecord::exponential("privbayes structure step 1", 3.0, 0.1, false),
        ];
        let m = sub_mechanisms(&recs, &names);
        assert_eq!(m[0].attrs, vec![0, 2]);
        assert!(m[1].attrs.is_empty());
        let req = AmplificationRequest { missingness: Missingness::Mcar, rates: "0.2".into(), delta: 0.0 };
        let a = amplification_for(Strategy::Adaptive, &recs, &names, &req).unwrap();
        // Marginal (ε = 0.5) amplified by the block {a, c} (0.8² = 0.64); the selection (0.1) not.
        assert!((a.linear_factor - (0.5 * 0.64 + 0.1) / 0.6).abs() < 1e-12, "{}", a.linear_factor);
        let mar = AmplificationRequest { missingness: Missingness::Mar, ..req.clone() };
        assert!(amplification_for(Strategy::Adaptive, &recs, &names, &mar).is_err());
        assert!(amplification_for(Strategy::Reproduce, &recs, &names, &req).is_err());
    }
}
