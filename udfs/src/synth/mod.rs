//! Synthetic data sampling inside the engine: sampling plans (conditional
//! tables in generation order, randomized rounding; NOTES §3) and the
//! streaming `SyntheticExec` operator.

mod exec;
mod plan;

pub use exec::SyntheticExec;
pub use plan::{SamplingPlan, SamplingStep, randomized_round};
