//! Synthetic data sampling inside the engine: sampling plans (conditional
//! tables in generation order, randomized rounding; NOTES §3), released
//! generator networks, and the streaming `SyntheticExec` operator over
//! either; `FillNullsExec` for imputation-first.

mod exec;
mod fill;
pub mod generator;
mod plan;
mod sampler;

pub use exec::SyntheticExec;
pub use fill::{ColumnFill, FillNullsExec, FillPlan};
pub use generator::GeneratorPlan;
pub use plan::{PlanError, SamplingPlan, SamplingStep, randomized_round};
pub use sampler::Sampler;
