//! Release pipelines: the YAML spec and its validation, `dpflow run` (one
//! crash-safe, idempotent release with its `manifest.json`), and the
//! `dpflow schedule` cron scheduler.

mod error;
pub mod forecast;
pub mod paths;
pub mod run;
pub mod schedule;
pub mod spec;

pub use error::{BoxError, PipelineError};
pub use forecast::{Target, TargetBudget};
pub use run::{Manifest, RunOptions, RunOutcome};
pub use spec::{Pipeline, Step};
