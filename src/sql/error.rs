//! Errors of DP SQL. A refused query is [`SqlError::Refused`] with a stable
//! [`super::RefusalKind`]; everything else says what failed and what to do.
//! Once a query has read protected data, any failure is charged and comes
//! back as [`SqlError::Failed`], whose message carries nothing of the cause
//! (docs/PRIVACY.md §1).

use datafusion::error::DataFusionError;

use super::refusal::Refusal;
use crate::dataset::DatasetError;
use crate::impute::ImputeError;
use crate::privacy::{FailureError, LedgerError, RawBudgetError};

/// Why a catalog could not be loaded or a query could not run.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// The query is refused (its kind is stable; nothing was charged).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The cluster the catalog names cannot be used (nothing was charged).
    #[error(transparent)]
    Cluster(#[from] dpflow_udfs::cluster::ClusterError),
    /// The SQL does not parse.
    #[error("SQL syntax error: {0}")]
    Syntax(String),
    /// The catalog file cannot be read.
    #[error("reading catalog {path}: {source}; check the path")]
    ReadCatalog {
        /// The catalog file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A key of the catalog is invalid (the message names the key).
    #[error("{path}: {problem}")]
    Catalog {
        /// The catalog file.
        path: String,
        /// The key and what is wrong with it.
        problem: String,
    },
    /// A budget in the catalog.
    #[error("{path}: {source}")]
    CatalogBudget {
        /// The catalog file.
        path: String,
        /// What is wrong with it.
        source: RawBudgetError,
    },
    /// A table's data or domain.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A table's `impute:` block, or smooth-sensitivity calibration.
    #[error(transparent)]
    Impute(#[from] ImputeError),
    /// The query names a table that is not in the catalog.
    #[error("unknown table {0}: it is not in the catalog")]
    UnknownTable(String),
    /// `--unsafe-seed` together with a ledger.
    #[error("{}", crate::privacy::SEEDED_LEDGER_REFUSAL)]
    SeededLedger,
    /// A DP query without a ledger to charge.
    #[error(
        "the catalog has no ledger: DP queries must be charged to a ledger; add `ledger: FILE` to the catalog \
         (or run with --unsafe-seed for a non-private test)"
    )]
    NoLedger,
    /// The ledger refused or failed (over budget, busy, ...).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The query failed after reading protected data: charged, cause withheld.
    #[error(transparent)]
    Failed(#[from] FailureError),
    /// DataFusion could not plan the query (before any data is read).
    #[error("planning the query: {0}")]
    Plan(#[from] DataFusionError),
    /// The exponential mechanism's parameters (a bug: they are checked when planned).
    #[error("the exponential mechanism: {0}")]
    Mechanism(#[from] dpflow_udfs::noise::ExpMechError),
    /// The operating system's entropy source.
    #[error(transparent)]
    Entropy(#[from] dpflow_udfs::noise::rng::getrandom_error::Error),
    /// A bug in dpflow.
    #[error("internal: {0}; please report it")]
    Internal(String),
}

impl From<datafusion::arrow::error::ArrowError> for SqlError {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        SqlError::Plan(e.into())
    }
}

/// The result type of DP SQL.
pub type Result<T, E = SqlError> = std::result::Result<T, E>;

impl SqlError {
    /// The refusal kind, if the query was refused.
    pub fn refusal_kind(&self) -> Option<super::RefusalKind> {
        match self {
            SqlError::Refused(r) => Some(r.kind),
            _ => None,
        }
    }
}
