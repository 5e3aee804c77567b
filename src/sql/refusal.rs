//! The one refusal type of DP SQL: every query dpflow will not run is refused
//! with a [`RefusalKind`] (stable: callers and tests match on it, never on the
//! text) and a message that says what to change. Refusals depend only on the
//! query, the catalog and the budget, never on protected data, and are raised
//! before anything is charged.

use serde::Serialize;

/// Why a query was refused: a stable name (`snake_case` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// Protected rows or values would reach the output (or be ordered,
    /// limited or deduplicated) other than through one DP aggregate.
    ExposesRows,
    /// The aggregation of protected rows is not made only of DP aggregates
    /// used as plain aggregates (a non-DP aggregate, DISTINCT inside, a GROUP
    /// BY without one, a DP aggregate over public data or as a window).
    NotDpAggregate,
    /// More than one DP aggregation, or one evaluated twice (a CTE or view
    /// referenced twice).
    RepeatedAggregation,
    /// A row expression over protected rows could fail on some row (or the
    /// query does not type-check): the failure would reveal the row.
    MayFail,
    /// A join or UNNEST could multiply or add protected rows (joins of two
    /// protected tables, outer joins, no equality key, keys that are not
    /// unique or not of one type on the public side).
    MultipliesRows,
    /// The privacy-unit column does not reach the aggregation unchanged.
    PrivacyUnit,
    /// A DP aggregate's arguments: the value is not numeric, a bound or level
    /// is not a number literal, or the bounds are out of order.
    Arguments,
    /// The budget cannot pay for the query's mechanisms (partition selection
    /// needs (ε, δ); smooth-sensitivity noise needs ε, and ε > ln 2).
    Budget,
    /// The table cannot be read under DP as configured (its domain's
    /// out-of-domain policy, or it is public).
    TablePolicy,
    /// The GROUP BY enumerates more public keys than the limit.
    TooManyKeys,
    /// A SQL feature that DP queries do not support (GROUPING SETS, recursive
    /// queries, subquery expressions on protected tables, mixing
    /// `dp_imputed_*` with other DP aggregates, ...).
    Unsupported,
    /// The query reads no protected table.
    NoProtectedTable,
}

/// A refused query: its kind and what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("refused: {message}")]
pub struct Refusal {
    /// Why (stable).
    pub kind: RefusalKind,
    /// What is refused and what to do instead.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind`.
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

/// `Err(Refusal)` of `kind`.
pub fn refuse<T>(kind: RefusalKind, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::new(kind, message))
}
