//! Budgets as written in YAML files (catalogs, pipelines, imputation specs):
//! `{epsilon}`, `{epsilon, delta}` or `{rho}`.
//!
//! It lives here, below every module that reads one, so that `sql`,
//! `pipeline` and `impute` share it without importing each other.

use serde::Deserialize;

use super::Budget;

/// A budget as written in YAML, not yet checked.
#[derive(Deserialize, Clone, Copy, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    #[serde(default)]
    epsilon: Option<f64>,
    #[serde(default)]
    delta: Option<f64>,
    #[serde(default)]
    rho: Option<f64>,
}

/// A YAML budget that is not a valid budget.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RawBudgetError {
    /// Neither `{epsilon}`, `{epsilon, delta}` nor `{rho}`.
    #[error("{what}: give {{epsilon}}, {{epsilon, delta}} or {{rho}}")]
    Shape {
        /// Where the budget was written (a key).
        what: String,
    },
    /// The right keys, but out of range (ε ≤ 0, δ ∉ (0, 1), …).
    #[error("{what}: {reason}")]
    Invalid {
        /// Where the budget was written (a key).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl RawBudget {
    /// The budget, or an error naming `what` (the key it was written under).
    pub fn budget(&self, what: &str) -> Result<Budget, RawBudgetError> {
        let b = match (self.epsilon, self.delta, self.rho) {
            (None, None, Some(rho)) => Budget::Zcdp { rho },
            (Some(epsilon), Some(delta), None) => Budget::Approx { epsilon, delta },
            (Some(epsilon), None, None) => Budget::Pure { epsilon },
            _ => return Err(RawBudgetError::Shape { what: what.to_string() }),
        };
        b.validate().map_err(|e| RawBudgetError::Invalid { what: what.to_string(), reason: e.to_string() })?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(y: &str) -> RawBudget {
        serde_json::from_str(y).unwrap()
    }

    #[test]
    fn each_shape_maps_to_its_budget() {
        assert_eq!(raw(r#"{"epsilon": 1}"#).budget("b").unwrap(), Budget::Pure { epsilon: 1.0 });
        assert_eq!(
            raw(r#"{"epsilon": 1, "delta": 1e-6}"#).budget("b").unwrap(),
            Budget::Approx { epsilon: 1.0, delta: 1e-6 }
        );
        assert_eq!(raw(r#"{"rho": 0.5}"#).budget("b").unwrap(), Budget::Zcdp { rho: 0.5 });
    }

    #[test]
    fn wrong_shape_and_range_name_the_key() {
        let e = raw(r#"{"delta": 1e-6}"#).budget("query_budget").unwrap_err();
        assert_eq!(e, RawBudgetError::Shape { what: "query_budget".into() });
        let e = raw(r#"{"epsilon": -1}"#).budget("query_budget").unwrap_err();
        assert!(matches!(e, RawBudgetError::Invalid { ref what, .. } if what == "query_budget"), "{e}");
        assert!(serde_json::from_str::<RawBudget>(r#"{"epsilon": 1, "eps": 2}"#).is_err());
    }
}
