//! `dpflow plan`: a release's predicted errors before anything is read, and
//! the inverse — the budget a step needs to meet a target error
//! (`--target-ci step.column=half-width`). Public inputs only: the pipeline,
//! its domain and bounds, and the row count the user supplies.
//!
//! The inverse scales the step's budget by a factor t (ε or ρ; δ is kept)
//! and finds the smallest t whose predicted half-width meets the target by
//! bisection on log t: every forecast is monotone in the budget (a larger
//! budget means smaller noise, and the simulated forecasts reuse their seed,
//! so they shrink with it too).

use std::str::FromStr;

use serde::Serialize;

use super::error::PipelineError;
use super::run::StepPlan;
use super::spec::{Pipeline, Step};
use crate::privacy::Budget;
use crate::sql::Assumptions;

/// A target error: `step` or `step.column`, `=`, the half-width.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    /// Step name.
    pub step: String,
    /// The released column (a SQL output column, or a prediction's target
    /// prefix); every prediction of the step when absent.
    pub column: Option<String>,
    /// The largest acceptable half-width at the forecast's level.
    pub half_width: f64,
}

impl FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--target-ci {s:?}: write STEP=HALF_WIDTH or STEP.COLUMN=HALF_WIDTH, e.g. counts.n=25");
        let (lhs, rhs) = s.rsplit_once('=').ok_or_else(bad)?;
        let half_width: f64 = rhs.trim().parse().map_err(|_| bad())?;
        if !(half_width > 0.0 && half_width.is_finite()) {
            return Err(format!("--target-ci {s:?}: the half-width must be a positive number"));
        }
        let (step, column) = match lhs.split_once('.') {
            Some((a, b)) => (a.trim().to_string(), Some(b.trim().to_string())),
            None => (lhs.trim().to_string(), None),
        };
        if step.is_empty() || column.as_deref() == Some("") {
            return Err(bad());
        }
        Ok(Self { step, column, half_width })
    }
}

/// The budget a target needs.
#[derive(Debug, Clone, Serialize)]
pub struct TargetBudget {
    /// The target.
    pub target: Target,
    /// The step's budget now.
    pub current: Budget,
    /// The predicted half-width now.
    pub current_half_width: f64,
    /// The smallest budget (this budget's kind, δ kept) that meets the target.
    pub needed: Budget,
    /// The predicted half-width at `needed`.
    pub half_width: f64,
    /// The release's planned cost with the step at `needed` (the release
    /// budget's unit), or why it does not fit.
    pub release_cost: Result<f64, String>,
}

/// Budget factors searched (a target that needs more than 10⁶× the step's
/// budget, or less than 10⁻⁶×, is reported as out of range).
const FACTORS: (f64, f64) = (1e-6, 1e6);

fn scaled(b: Budget, t: f64) -> Budget {
    match b {
        Budget::Pure { epsilon } => Budget::Pure { epsilon: epsilon * t },
        Budget::Approx { epsilon, delta } => Budget::Approx { epsilon: epsilon * t, delta },
        Budget::Zcdp { rho } => Budget::Zcdp { rho: rho * t },
    }
}

/// `b` with its ε or ρ rounded up to three significant digits.
fn rounded_up(b: Budget) -> Budget {
    match b {
        Budget::Pure { epsilon } => Budget::Pure { epsilon: round_up_3(epsilon) },
        Budget::Approx { epsilon, delta } => Budget::Approx { epsilon: round_up_3(epsilon), delta },
        Budget::Zcdp { rho } => Budget::Zcdp { rho: round_up_3(rho) },
    }
}

impl Pipeline {
    fn step_budget(&self, step: &str) -> Option<Budget> {
        self.steps.iter().find_map(|s| match s {
            Step::Sql { name, budget, .. } | Step::Synthesize { name, budget, .. } if name == step => Some(*budget),
            _ => None,
        })
    }

    fn with_step_budget(&self, step: &str, b: Budget) -> Pipeline {
        let mut p = self.clone();
        for s in &mut p.steps {
            match s {
                Step::Sql { name, budget, .. } | Step::Synthesize { name, budget, .. } if name == step => *budget = b,
                _ => {}
            }
        }
        p
    }

    /// The predicted half-width `target` refers to under this pipeline (the
    /// largest over the predictions it names); `worst`: the worst-case one.
    async fn targeted(&self, target: &Target, a: &Assumptions, worst: bool) -> Result<f64, PipelineError> {
        let plans = self.plan_steps(a, Some(&target.step)).await?;
        targeted_in(&plans, target, worst).map_err(|why| PipelineError::Target { target: target_text(target), why })
    }

    /// The smallest budget for `target`'s step that meets it (module docs).
    pub async fn budget_for_target(
        &self,
        target: &Target,
        a: &Assumptions,
        worst: bool,
    ) -> Result<TargetBudget, PipelineError> {
        let current = self.step_budget(&target.step).ok_or_else(|| PipelineError::Target {
            target: target_text(target),
            why: format!(
                "no sql or synthesize step named {:?} (steps: {})",
                target.step,
                self.steps.iter().map(|s| s.name().to_string()).collect::<Vec<_>>().join(", ")
            ),
        })?;
        let current_half_width = self.targeted(target, a, worst).await?;
        let at = |t: f64| self.with_step_budget(&target.step, scaled(current, t));
        let ok = |hw: f64| hw <= target.half_width;
        let (mut lo, mut hi) = (FACTORS.0.ln(), FACTORS.1.ln());
        if !ok(at(hi.exp()).targeted(target, a, worst).await?) {
            return Err(PipelineError::Target {
                target: target_text(target),
                why: format!("not reachable with up to {}× the step's budget {}", FACTORS.1, current.describe()),
            });
        }
        if ok(at(lo.exp()).targeted(target, a, worst).await?) {
            hi = lo;
        }
        while hi - lo > 1e-3 {
            let mid = (lo + hi) / 2.0;
            if ok(at(mid.exp()).targeted(target, a, worst).await?) { hi = mid } else { lo = mid }
        }
        // Rounded up to three significant digits: the budget printed is the one forecast.
        let needed = rounded_up(scaled(current, hi.exp()));
        let p = self.with_step_budget(&target.step, needed);
        let half_width = p.targeted(target, a, worst).await?;
        let release_cost = match p.plan_forecast(a).await {
            Ok((_, total)) => Ok(total),
            Err(PipelineError::OverBudget { budget, .. }) => {
                Err(format!("the release budget {budget} would not cover it: raise `budget:` or lower other steps"))
            }
            Err(e) => return Err(e),
        };
        Ok(TargetBudget { target: target.clone(), current, current_half_width, needed, half_width, release_cost })
    }
}

/// `x` (> 0) rounded up to three significant digits.
fn round_up_3(x: f64) -> f64 {
    let e = 10f64.powi(x.log10().floor() as i32 - 2);
    let up = (x / e).ceil() * e;
    // Through three significant digits of text: 0.285, not 0.28500000000000003.
    format!("{up:.2e}").parse::<f64>().map_or(up, |r| if r >= x { r } else { up })
}

fn target_text(t: &Target) -> String {
    match &t.column {
        Some(c) => format!("{}.{c}={}", t.step, t.half_width),
        None => format!("{}={}", t.step, t.half_width),
    }
}

/// The largest predicted half-width among the predictions `target` names.
fn targeted_in(plans: &[StepPlan], target: &Target, worst: bool) -> Result<f64, String> {
    let step = plans.iter().find(|p| p.step == target.step).ok_or_else(|| format!("no step {:?}", target.step))?;
    // A column's exact name first, else the predictions whose target starts with it.
    let exact: Vec<_> =
        step.predictions.iter().filter(|p| target.column.as_ref().is_none_or(|c| p.target == *c)).collect();
    let named = if exact.is_empty() {
        step.predictions
            .iter()
            .filter(|p| target.column.as_ref().is_some_and(|c| p.target.starts_with(c.as_str())))
            .collect()
    } else {
        exact
    };
    if named.is_empty() {
        return Err(format!(
            "step {:?} releases no {}; its predictions: {}",
            target.step,
            target.column.as_deref().unwrap_or("numbers"),
            step.predictions.iter().map(|p| p.target.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let widths: Vec<f64> = named.iter().filter_map(|p| p.error(worst)).collect();
    if widths.is_empty() {
        return Err(format!(
            "no interval is predicted for it: {}",
            named.iter().map(|p| p.basis.as_str()).collect::<Vec<_>>().join("; ")
        ));
    }
    Ok(widths.into_iter().fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_say_how_to_write_them() {
        assert_eq!(
            "counts.n=25".parse::<Target>().unwrap(),
            Target { step: "counts".into(), column: Some("n".into()), half_width: 25.0 }
        );
        assert_eq!("synthetic=40".parse::<Target>().unwrap().column, None);
        assert!("counts.n".parse::<Target>().unwrap_err().contains("STEP.COLUMN=HALF_WIDTH"));
        assert!("counts.n=-1".parse::<Target>().unwrap_err().contains("positive"));
        assert!(".n=3".parse::<Target>().is_err());
    }

    #[test]
    fn budgets_round_up_to_three_digits() {
        assert_eq!(round_up_3(0.28447883), 0.285);
        assert_eq!(round_up_3(0.2845), 0.285);
        assert_eq!(round_up_3(1.0), 1.0);
        assert_eq!(round_up_3(3.140134), 3.15);
        assert!(round_up_3(0.0486288) >= 0.0486288 && round_up_3(0.0486288) <= 0.0487 + 1e-15);
    }
}
