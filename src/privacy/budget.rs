//! Budgets and the privacy filter (odometer) that refuses to overspend.
//!
//! A budget is held in one unit: pure ε-DP, (ε, δ)-DP or ρ-zCDP. Charges in
//! other units are mapped into it:
//!
//! | charge \ budget | ε-DP | ρ-zCDP | (ε, δ)-DP |
//! |---|---|---|---|
//! | pure ε | ε adds | ρ += ε²/2 (ε-DP ⇒ ε²/2-zCDP) | ε adds linearly |
//! | ρ-zCDP | refused | ρ adds | ρ adds; converted once with the δ left |
//! | (ε, δ) | refused | refused | (ε, δ) add linearly |
//! | RDP curve | refused | refused | converted to (ε, δ) with a stated δ, then linear |
//!
//! For an (ε, δ) budget the spent amount is
//! ε_lin + ε_CKS(ρ_total, δ_B − δ_lin): the zCDP part composes by adding ρ
//! (Bun & Steinke 2016; adaptive, and valid as a filter), the rest by basic
//! composition, and the two by basic composition. Sums are compared with a
//! relative slack of 1e-12 so that floating-point rounding in a mechanism that
//! spends "exactly the rest" (AIM's last round) is not refused.

use serde::{Deserialize, Serialize};

use super::convert::{cdp_eps, cdp_rho, rdp_to_approx};
use dpflow_udfs::cost::PrivacyLoss;

/// Relative slack for floating-point rounding of sums.
pub const BUDGET_SLACK: f64 = 1e-12;

/// A total budget in one unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "unit", rename_all = "snake_case")]
pub enum Budget {
    /// Pure ε-DP.
    Pure {
        /// ε.
        epsilon: f64,
    },
    /// (ε, δ)-DP.
    Approx {
        /// ε.
        epsilon: f64,
        /// δ.
        delta: f64,
    },
    /// ρ-zCDP.
    Zcdp {
        /// ρ.
        rho: f64,
    },
}

impl Budget {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), BudgetError> {
        let ok = match *self {
            Budget::Pure { epsilon } => epsilon > 0.0 && epsilon.is_finite(),
            Budget::Approx { epsilon, delta } => epsilon > 0.0 && epsilon.is_finite() && delta > 0.0 && delta < 1.0,
            Budget::Zcdp { rho } => rho > 0.0 && rho.is_finite(),
        };
        if ok { Ok(()) } else { Err(BudgetError::Invalid(format!("{self:?}"))) }
    }

    /// The budget's size in its own unit (ε or ρ).
    pub fn amount(&self) -> f64 {
        match *self {
            Budget::Pure { epsilon } | Budget::Approx { epsilon, .. } => epsilon,
            Budget::Zcdp { rho } => rho,
        }
    }

    /// Name of the unit ("epsilon" or "rho").
    pub fn unit_name(&self) -> &'static str {
        match self {
            Budget::Zcdp { .. } => "rho",
            _ => "epsilon",
        }
    }

    /// The zCDP budget equivalent to this one, for mechanisms that account in
    /// ρ internally (AIM, MST): ρ(ε, δ) for (ε, δ), ε²/2 for pure ε (whose
    /// mechanisms must then be pure, see [`Budget::Pure`]).
    pub fn as_rho(&self) -> Option<f64> {
        match *self {
            Budget::Zcdp { rho } => Some(rho),
            Budget::Approx { epsilon, delta } => Some(cdp_rho(epsilon, delta)),
            Budget::Pure { .. } => None,
        }
    }

    /// One line, e.g. `ε=1, δ=1e-9`.
    pub fn describe(&self) -> String {
        match *self {
            Budget::Pure { epsilon } => format!("ε={epsilon}"),
            Budget::Approx { epsilon, delta } => format!("ε={epsilon}, δ={delta:e}"),
            Budget::Zcdp { rho } => format!("ρ={rho}"),
        }
    }
}

/// A charge normalised for composition: a zCDP part and a linear (ε, δ) part.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Normalized {
    /// ρ (zCDP part).
    pub rho: f64,
    /// ε composed linearly (pure and approximate charges).
    pub eps: f64,
    /// δ composed linearly.
    pub delta: f64,
}

impl std::ops::Add for Normalized {
    type Output = Normalized;
    fn add(self, o: Normalized) -> Normalized {
        Normalized { rho: self.rho + o.rho, eps: self.eps + o.eps, delta: self.delta + o.delta }
    }
}

/// An invalid budget, or a charge that does not fit the budget or cannot be
/// expressed in its unit.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum BudgetError {
    /// The charge would exceed what is left.
    #[error(
        "privacy budget exceeded: this charge costs {} {unit} but only {} {unit} of {} remain",
        amount(*.cost), amount(*.remaining), amount(*.total)
    )]
    Exceeded {
        /// Cost of the charge in the budget's unit (marginal, given what is spent).
        cost: f64,
        /// Remaining before the charge.
        remaining: f64,
        /// Total budget.
        total: f64,
        /// "epsilon" or "rho".
        unit: &'static str,
    },
    /// A budget that is not positive and finite.
    #[error("invalid budget {0}: ε and ρ must be positive and finite, 0 < δ < 1")]
    Invalid(String),
    /// The loss's unit cannot be charged to this budget.
    #[error("a {loss} charge cannot be made against a {budget} budget")]
    Incompatible {
        /// The loss.
        loss: String,
        /// The budget.
        budget: String,
    },
}

/// A budget amount for people: ten decimals at most, so floating-point
/// residue reads as what it is (`0.5`, not `0.4999999999999998`; `0`, not
/// `4.44e-16`). Amounts below 1e-10 that are not residue keep their exponent.
fn amount(x: f64) -> String {
    if x != 0.0 && x.abs() < 1e-10 && x.abs() > 1e-14 {
        return format!("{x:e}");
    }
    let s = format!("{x:.10}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

/// Maps a loss into the budget's composition parts.
pub fn normalize(budget: &Budget, loss: &PrivacyLoss, rdp_delta: Option<f64>) -> Result<Normalized, BudgetError> {
    let incompatible = || BudgetError::Incompatible { loss: loss.describe(), budget: budget.describe() };
    Ok(match (budget, loss) {
        (Budget::Pure { .. }, PrivacyLoss::Pure { epsilon }) => Normalized { eps: *epsilon, ..Default::default() },
        (Budget::Pure { .. }, _) => return Err(incompatible()),
        (Budget::Zcdp { .. }, PrivacyLoss::Pure { epsilon }) => {
            Normalized { rho: epsilon * epsilon / 2.0, ..Default::default() }
        }
        (Budget::Zcdp { .. }, PrivacyLoss::Zcdp { rho }) => Normalized { rho: *rho, ..Default::default() },
        (Budget::Zcdp { .. }, _) => return Err(incompatible()),
        (Budget::Approx { .. }, PrivacyLoss::Pure { epsilon }) => Normalized { eps: *epsilon, ..Default::default() },
        (Budget::Approx { .. }, PrivacyLoss::Zcdp { rho }) => Normalized { rho: *rho, ..Default::default() },
        (Budget::Approx { .. }, PrivacyLoss::Approx { epsilon, delta }) => {
            Normalized { rho: 0.0, eps: *epsilon, delta: *delta }
        }
        (Budget::Approx { .. }, PrivacyLoss::Rdp { curve }) => {
            let d = rdp_delta.ok_or_else(incompatible)?;
            let (eps, _) = rdp_to_approx(curve, d);
            Normalized { rho: 0.0, eps, delta: d }
        }
    })
}

/// How much of the budget (in its unit) a normalised total uses; infinite if
/// it cannot fit at all (e.g. δ spent beyond the budget's δ).
pub fn spent_in_unit(budget: &Budget, total: &Normalized) -> f64 {
    match *budget {
        Budget::Pure { .. } => total.eps,
        Budget::Zcdp { .. } => total.rho,
        Budget::Approx { delta, .. } => {
            if total.delta > delta * (1.0 + BUDGET_SLACK) {
                return f64::INFINITY;
            }
            if total.rho == 0.0 {
                return total.eps;
            }
            let left = delta - total.delta;
            if left <= 0.0 {
                return f64::INFINITY;
            }
            total.eps + cdp_eps(total.rho, left)
        }
    }
}

/// A privacy filter: a budget, what has been spent, and a refusal to spend more.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivacyFilter {
    budget: Budget,
    spent: Normalized,
}

impl PrivacyFilter {
    /// A fresh filter.
    pub fn new(budget: Budget) -> Self {
        Self { budget, spent: Normalized::default() }
    }

    /// A filter with some spending already recorded (e.g. from the ledger).
    pub fn with_spent(budget: Budget, spent: Normalized) -> Self {
        Self { budget, spent }
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Spent so far (normalised parts).
    pub fn spent(&self) -> Normalized {
        self.spent
    }

    /// Spent so far in the budget's unit.
    pub fn spent_amount(&self) -> f64 {
        spent_in_unit(&self.budget, &self.spent)
    }

    /// What is left in the budget's unit.
    pub fn remaining(&self) -> f64 {
        (self.budget.amount() - self.spent_amount()).max(0.0)
    }

    /// Checks whether `loss` fits, without spending.
    pub fn check(&self, loss: &PrivacyLoss) -> Result<Normalized, BudgetError> {
        self.check_normalized(normalize(&self.budget, loss, None)?)
    }

    /// Checks a normalised charge.
    pub fn check_normalized(&self, n: Normalized) -> Result<Normalized, BudgetError> {
        let after = spent_in_unit(&self.budget, &(self.spent + n));
        let total = self.budget.amount();
        // A NaN loss compares false with everything: refuse it as over budget.
        if !after.is_finite() || after > total * (1.0 + BUDGET_SLACK) {
            let before = self.spent_amount();
            return Err(BudgetError::Exceeded {
                cost: after - before,
                remaining: (total - before).max(0.0),
                total,
                unit: self.budget.unit_name(),
            });
        }
        Ok(n)
    }

    /// Spends `loss` if it fits; otherwise refuses and spends nothing.
    pub fn charge(&mut self, loss: &PrivacyLoss) -> Result<Normalized, BudgetError> {
        let n = self.check(loss)?;
        self.spent = self.spent + n;
        Ok(n)
    }

    /// Spends a normalised charge if it fits.
    pub fn charge_normalized(&mut self, n: Normalized) -> Result<(), BudgetError> {
        self.check_normalized(n)?;
        self.spent = self.spent + n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn amounts_in_messages_drop_floating_point_residue() {
        let e = BudgetError::Exceeded {
            cost: 0.4999999999999998,
            remaining: 4.440892098500626e-16,
            total: 3.0,
            unit: "epsilon",
        };
        assert_eq!(
            e.to_string(),
            "privacy budget exceeded: this charge costs 0.5 epsilon but only 0 epsilon of 3 remain"
        );
        assert_eq!(amount(1e-12), "1e-12");
        assert_eq!(amount(0.125), "0.125");
    }

    use super::*;

    /// A NaN loss (e.g. from a mechanism calibrated with an overflowing
    /// sensitivity) is refused and leaves the filter usable.
    #[test]
    fn a_nan_loss_is_refused() {
        let mut f = PrivacyFilter::new(Budget::Pure { epsilon: 1.0 });
        assert!(f.charge(&PrivacyLoss::Pure { epsilon: f64::NAN }).is_err());
        assert!(f.charge(&PrivacyLoss::Pure { epsilon: f64::INFINITY }).is_err());
        f.charge(&PrivacyLoss::Pure { epsilon: 0.5 }).unwrap();
        assert!((f.spent_amount() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn pure_budget_composes_linearly_and_refuses() {
        let mut f = PrivacyFilter::new(Budget::Pure { epsilon: 1.0 });
        for _ in 0..3 {
            f.charge(&PrivacyLoss::Pure { epsilon: 1.0 / 3.0 }).unwrap();
        }
        let err = f.charge(&PrivacyLoss::Pure { epsilon: 0.01 }).unwrap_err();
        assert!(matches!(err, BudgetError::Exceeded { .. }), "{err}");
        assert!(f.charge(&PrivacyLoss::Zcdp { rho: 0.001 }).is_err());
    }

    #[test]
    fn zcdp_budget_takes_pure_as_half_eps_squared() {
        let mut f = PrivacyFilter::new(Budget::Zcdp { rho: 0.5 });
        f.charge(&PrivacyLoss::Pure { epsilon: 0.5 }).unwrap();
        assert!((f.spent_amount() - 0.125).abs() < 1e-15);
        f.charge(&PrivacyLoss::Zcdp { rho: 0.375 }).unwrap();
        assert!(f.charge(&PrivacyLoss::Zcdp { rho: 1e-9 }).is_err());
        assert!(f.charge(&PrivacyLoss::Approx { epsilon: 0.1, delta: 1e-9 }).is_err());
    }

    #[test]
    fn approx_budget_mixes_parts() {
        let b = Budget::Approx { epsilon: 1.0, delta: 1e-6 };
        let mut f = PrivacyFilter::new(b);
        let rho = cdp_rho(0.5, 1e-6);
        f.charge(&PrivacyLoss::Zcdp { rho }).unwrap();
        assert!((f.spent_amount() - 0.5).abs() < 1e-9);
        f.charge(&PrivacyLoss::Pure { epsilon: 0.3 }).unwrap();
        // 0.2 left in ε, but an extra δ shrinks what the zCDP part may use.
        assert!(f.charge(&PrivacyLoss::Approx { epsilon: 0.19, delta: 5e-7 }).is_err());
        f.charge(&PrivacyLoss::Approx { epsilon: 0.1, delta: 1e-12 }).unwrap();
        assert!(f.remaining() < 0.1);
    }

    #[test]
    fn exact_spend_of_the_rest_is_accepted() {
        let mut f = PrivacyFilter::new(Budget::Zcdp { rho: 0.3 });
        let mut used = 0.0;
        for _ in 0..9 {
            f.charge(&PrivacyLoss::Zcdp { rho: 0.01 }).unwrap();
            used += 0.01;
        }
        f.charge(&PrivacyLoss::Zcdp { rho: 0.3 - used }).unwrap();
        assert!(f.charge(&PrivacyLoss::Zcdp { rho: 1e-6 }).is_err());
    }
}
