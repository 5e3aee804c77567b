//! What a release of imputed statistics needs from the data, and nothing
//! more: per query, the exact aggregates of its population (a count, a
//! numerator count, sums of clamped values) for the imputed data and for the
//! ignore-missing baseline, and per released number L1_R(D) (issue 24) and
//! the number of donees that can enter it. [`super::answer`] adds the noise.
//!
//! A summary is built in two streaming passes (`stream.rs`), so memory
//! holds classes and donees, never the table; the in-memory imputation
//! ([`super::Imputed::summarize`]) builds the same summary and is the
//! reference the streaming pass is tested against.
//!
//! The rows of each number are those of docs/PRIVACY.md §2.6: a query's
//! subpopulation and, for a mean or a variance, the rows whose value is
//! observed or unknown in an imputed column *with or without a donor*.

use dpflow_udfs::knn::L1Report;

pub(crate) use dpflow_udfs::knn::query::Columns;
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use dpflow_udfs::knn::query::{Aggregates, ValueGrid};
#[cfg(any(test, feature = "bench-internals"))]
pub(crate) use dpflow_udfs::knn::query::{CompiledQuery, RowView};

/// One query's summary.
#[derive(Clone, PartialEq)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct QuerySummary {
    /// On the imputed data (the smooth and global-sensitivity estimators).
    pub imputed: Aggregates,
    /// On complete rows' observed values (the ignore-missing baseline).
    pub ignore: Aggregates,
    /// Per released number: L1_R(D), None when it reads no imputed column.
    pub l1: Vec<Option<L1Report>>,
    /// Per released number: the donees that can enter it (|R|; 0 when it reads no imputed column).
    pub donees_inside: Vec<u64>,
}

/// Everything [`super::answer`] and the curator diagnostics read.
#[derive(Clone, PartialEq)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Summary {
    /// One per query, in the order given.
    pub queries: Vec<QuerySummary>,
    /// Donees (rows with an unknown cell in an imputed column).
    pub donees: u64,
}

dpflow_udfs::protected_debug!(QuerySummary, Summary);

impl Summary {
    /// The summary of query `i` alone (to answer it with its own ε).
    pub fn one(&self, i: usize) -> Summary {
        Summary { queries: vec![self.queries[i].clone()], donees: self.donees }
    }
}
