//! Privacy accounting: losses and their conversions, budgets and the privacy
//! filter, and the persistent SQLite budget ledger.
//!
//! Samplers and noise calibration run inside the engine and live in
//! `dpflow_udfs::{noise, calibrate}`; the cost types are in
//! `dpflow_udfs::cost` and re-exported here.

pub mod accuracy;
pub mod budget;
pub mod convert;
pub mod failure;
pub mod ledger;
pub mod rdp;
pub mod share;
pub mod yaml;

pub use accuracy::Prediction;
pub use budget::{Budget, BudgetError, Normalized, PrivacyFilter};
pub use dpflow_udfs::cost::{MechanismRecord, PrivacyLoss};
/// Why seeded noise may not be charged to a ledger: a seed makes the noise
/// reproducible, so a charged release could be re-run and differenced away.
pub const SEEDED_LEDGER_REFUSAL: &str = "refused: --unsafe-seed with a ledger: seeded noise is reproducible, so a \
     charged release could be repeated and its noise differenced away; drop --unsafe-seed for a real release, or run \
     without a ledger for tests and benchmarks";

pub use failure::{FailureError, ProtectedFailure, charge_failure};
pub use ledger::{
    AnalystStatus, BudgetStatus, ChargeRow, ChargeStatus, DatasetEntry, Ledger, LedgerError, Reservation,
};
pub use share::Share;
pub use yaml::{RawBudget, RawBudgetError};
