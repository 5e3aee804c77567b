//! Synthetic data sampling inside the engine: sampling plans (conditional
//! tables in generation order, randomized rounding; NOTES §3) and the
//! streaming `SyntheticExec` operator; `FillNullsExec` for imputation-first.

mod exec;
mod fill;
mod plan;

pub use exec::SyntheticExec;
pub use fill::{ColumnFill, FillNullsExec, FillPlan};
pub use plan::{PlanError, SamplingPlan, SamplingStep, randomized_round};
