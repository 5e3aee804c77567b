//! DP SQL: users write SQL against registered DP aggregate functions over
//! protected tables; every answer is noised once and charged to the ledger
//! before it is returned.

pub mod catalog;
pub mod check;
pub mod engine;
pub mod imputed;
pub mod rowsafe;
pub mod sites;

pub use catalog::{Catalog, PrivacyUnit, TableEntry};
pub use engine::{ExplainRow, QueryResult, SqlEngine};
