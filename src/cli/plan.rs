//! `dpflow plan`: a release's predicted errors and the budgets for target
//! errors, before anything is read (`dpflow::pipeline::forecast`).

use anyhow::Result;
use clap::Args;

use dpflow::pipeline::run::StepPlan;
use dpflow::pipeline::{Pipeline, Target};
use dpflow::privacy::Prediction;
use dpflow::sql::Assumptions;

/// The public inputs of a forecast (shared by `plan` and `sql --dry-run`).
#[derive(Debug, Args, Clone)]
pub struct ForecastArgs {
    /// A public estimate of the table's row count (means, variances and the
    /// synthesizers' workload floor need one).
    #[arg(long)]
    pub rows: Option<f64>,
    /// A public estimate of the rows in each released group (default: --rows
    /// split evenly over the GROUP BY's public keys).
    #[arg(long)]
    pub group_rows: Option<f64>,
    /// Confidence level of the predicted intervals.
    #[arg(long, default_value_t = 0.95)]
    pub level: f64,
}

impl ForecastArgs {
    pub(super) fn assumptions(&self) -> Result<Assumptions> {
        if !(self.level > 0.0 && self.level < 1.0) {
            anyhow::bail!("--level {}: give a confidence level strictly between 0 and 1, e.g. 0.95", self.level);
        }
        for (flag, v) in [("--rows", self.rows), ("--group-rows", self.group_rows)] {
            if let Some(v) = v
                && !(v >= 1.0 && v.is_finite())
            {
                anyhow::bail!("{flag} {v}: give a public row-count estimate of at least 1");
            }
        }
        Ok(Assumptions { rows: self.rows, group_rows: self.group_rows, level: self.level })
    }
}

/// Arguments of `dpflow plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Pipeline file.
    pub file: String,
    /// Forecast inputs.
    #[command(flatten)]
    pub forecast: ForecastArgs,
    /// The budget a step needs for a target error: STEP.COLUMN=HALF_WIDTH
    /// (a SQL output column) or STEP=HALF_WIDTH (every number it releases);
    /// repeatable.
    #[arg(long = "target-ci")]
    pub target_ci: Vec<String>,
    /// Meet targets in the worst case over the data's shape (means and
    /// variances), not at the forecast's stated assumption.
    #[arg(long)]
    pub worst: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// One line per prediction, indented.
pub(super) fn print_predictions(preds: &[Prediction], indent: &str) {
    for p in preds {
        println!("{indent}{} [{}]: {}", p.target, p.statistic, p.describe());
        println!("{indent}    {}", p.basis);
    }
}

pub(super) fn print_plan(plans: &[StepPlan]) {
    for s in plans {
        println!("  step {} ({})", s.step, s.kind);
        for m in &s.mechanisms {
            println!("    {} [{}] {}", m.mechanism, m.target, m.loss.describe());
        }
        if !s.predictions.is_empty() {
            println!("    predicted error:");
            print_predictions(&s.predictions, "      ");
        }
    }
}

pub(super) async fn run(a: PlanArgs) -> Result<i32> {
    let p = Pipeline::load(&a.file)?;
    super::pipeline::warn(&p);
    let assumptions = a.forecast.assumptions()?;
    let targets =
        a.target_ci.iter().map(|t| t.parse::<Target>().map_err(anyhow::Error::msg)).collect::<Result<Vec<_>>>()?;
    let (plans, total) = p.plan_forecast(&assumptions).await?;
    let mut solved = Vec::new();
    for t in &targets {
        solved.push(p.budget_for_target(t, &assumptions, a.worst).await?);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "pipeline": p.name,
                "budget": p.budget,
                "planned_cost": total,
                "steps": plans,
                "targets": solved.iter().map(|s| serde_json::json!({
                    "target": s.target,
                    "current": s.current,
                    "current_half_width": s.current_half_width,
                    "needed": s.needed,
                    "half_width": s.half_width,
                    "release_cost": s.release_cost.as_ref().ok(),
                    "release_problem": s.release_cost.as_ref().err(),
                })).collect::<Vec<_>>(),
            }))?
        );
        return Ok(0);
    }
    println!("pipeline {} (release budget {}): planned cost {total:.6}", p.name, p.budget.describe());
    print_plan(&plans);
    for s in &solved {
        let what = match &s.target.column {
            Some(c) => format!("{}.{c}", s.target.step),
            None => s.target.step.clone(),
        };
        println!(
            "target {what} ±{}: needs {} (now {}: ±{}); predicted ±{} at that budget; {}",
            dpflow::privacy::accuracy::fmt_num(s.target.half_width),
            s.needed.describe(),
            s.current.describe(),
            dpflow::privacy::accuracy::fmt_num(s.current_half_width),
            dpflow::privacy::accuracy::fmt_num(s.half_width),
            match &s.release_cost {
                Ok(c) => format!("the release would cost {c:.6} of {}", p.budget.describe()),
                Err(why) => why.clone(),
            }
        );
    }
    println!("(forecast from public inputs only: nothing was read or spent)");
    Ok(0)
}
