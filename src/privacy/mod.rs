//! Privacy accounting: losses and their conversions, budgets and the privacy
//! filter, and the persistent SQLite budget ledger.
//!
//! Samplers and noise calibration run inside the engine and live in
//! `dpflow_udfs::{noise, calibrate}`; the cost types are in
//! `dpflow_udfs::cost` and re-exported here.

pub mod budget;
pub mod convert;
pub mod ledger;

pub use budget::{Budget, BudgetError, Normalized, PrivacyFilter};
pub use dpflow_udfs::cost::{MechanismRecord, PrivacyLoss};
pub use ledger::{BudgetStatus, ChargeRow, ChargeStatus, DatasetEntry, Ledger, LedgerError, Reservation};
