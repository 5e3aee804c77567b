//! Multi-marginal counting: dense count vectors for many attribute sets from
//! one streaming scan of encoded data (the currency of AIM, MST, PrivBayes,
//! NAPSU-MQ and DP histograms).
//!
//! * [`MarginalAccumulator`]: the vectorised counting kernel;
//! * [`MarginalExec`]: the physical operator (Partial per input partition,
//!   Final merge), [`MarginalNode`]/[`MarginalPlanner`] for logical plans;
//! * two null modes per set ([`NullMode`]): null as its own cell, or
//!   observed-only counts (000 §4.2) with the number of observed rows.
//!
//! These are **exact** counts of private data: they must only ever be consumed
//! by a DP mechanism (see the `dpflow` crate's `measure`).

mod exec;
mod kernel;
mod logical;
mod table_fn;
#[cfg(test)]
mod tests;

/// Moved to [`crate::domain::project`]; kept here for callers of the old path.
pub use crate::domain::project;
pub use exec::{MarginalExec, MarginalMode, batch_to_counts, counts_to_batch, for_each_counts, marginal_output_schema};
pub use kernel::{
    EncodedColumn, FinishedCounts, MAX_CELLS, MarginalAccumulator, MarginalConfig, MarginalSet, NullMode,
};
pub use logical::{MarginalNode, MarginalPlanner, plan_marginals};
pub use table_fn::{MarginalsFunction, MarginalsTable, config_for, parse_sets};
