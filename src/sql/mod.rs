//! DP SQL: users write SQL against registered DP aggregate functions over
//! protected tables; every answer is noised once and charged to the ledger
//! before it is returned.

pub mod args;
pub mod catalog;
pub mod check;
mod costing;
pub mod engine;
pub mod error;
mod exact;
mod execute;
pub mod imputed;
pub mod predict;
pub mod quantile_interval;
pub mod refusal;
mod release;
pub use dpflow_udfs::rowsafe;
pub mod sites;
pub mod synthetic;
pub mod table_calls;
mod table_plan;
mod table_release;

pub use catalog::{Catalog, PrivacyUnit, TableEntry};
pub use costing::selection_threshold;
pub use engine::{AnalystBudget, ExplainRow, QueryResult, SqlEngine, analyst_budgets, explain_batch, explain_schema};
pub use error::SqlError;
pub use predict::Assumptions;
pub use refusal::{Refusal, RefusalKind};
