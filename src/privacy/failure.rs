//! The failure rule (docs/PRIVACY.md §1): **once protected data has been
//! read, every outcome is a release.**
//!
//! Whether a run fails, and how, can depend on the data (a division by zero
//! on one person's row, a malformed line, a value outside the domain). So a
//! failure after the first protected read is charged like a success (ledger
//! status `failed`, counted as spent, never refunded) and what it prints
//! depends only on public inputs: the kind of run, the charge id, and what
//! to do next. The underlying error is dropped, not logged: its text may
//! hold a value, a row or line number, a count or an id.
//!
//! Curator-only commands (`inspect`, `eval`, `missing inject`) read data
//! without releasing anything and keep their detailed messages.

use super::ledger::{Ledger, LedgerError};

/// A run that failed after reading protected data. Its message is the same
/// for one bad row or a million, and says nothing about the data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} failed after reading protected data; {charged}. The cause is not shown because it could depend on the data \
     (docs/PRIVACY.md §1). The data curator can check the input against its domain with `dpflow inspect`; \
     queries that cannot fail on any row (TRY_CAST, NULLIF-guarded division, an out_of_domain policy of clip, null \
     or drop-row) avoid this"
)]
pub struct ProtectedFailure {
    /// What failed: "query", "synthesis run", "imputation", "pipeline run".
    pub what: &'static str,
    /// How the charge was settled (public: the charge id, or that none was recorded).
    pub charged: String,
    /// The ledger charge kept as spent, if one was recorded.
    pub charge: Option<i64>,
}

impl ProtectedFailure {
    /// The failure of `what`; `charge` is the ledger charge kept as spent.
    pub fn new(what: &'static str, charge: Option<i64>) -> Self {
        let charged = match charge {
            Some(id) => format!("its budget stays spent (ledger charge #{id}, status failed)"),
            None => "no ledger charge was recorded for it (unsafe seed or precharged run)".to_string(),
        };
        Self { what, charged, charge }
    }
}

impl FailureError {
    /// The ledger charge the failure is recorded under (for audit records).
    pub fn charge_id(&self) -> Option<i64> {
        match self {
            FailureError::Charged(f) => f.charge,
            FailureError::Unsettled { charge, .. } => Some(*charge),
        }
    }
}

/// A failure after a protected read, as settled by [`charge_failure`].
#[derive(Debug, thiserror::Error)]
pub enum FailureError {
    /// The charge is marked failed (or none was recorded).
    #[error(transparent)]
    Charged(#[from] ProtectedFailure),
    /// Marking the charge failed did not succeed: it stays `reserved`, which
    /// also counts as spent. The ledger error holds no data (file, charge id).
    #[error(
        "{failure}; and marking charge #{charge} failed did not succeed ({ledger_error}); it stays reserved, which \
         also counts as spent: resolve it with `dpflow budget resolve` as failed, never as released"
    )]
    Unsettled {
        /// The redacted failure.
        failure: ProtectedFailure,
        /// The charge left reserved.
        charge: i64,
        /// Why it could not be marked failed.
        ledger_error: Box<LedgerError>,
    },
}

/// Settles a failure after a protected read: marks `charge` failed (spent)
/// in `ledger` and returns the redacted error. The original error is
/// dropped here on purpose, unformatted; any error type is accepted so that
/// nothing has to be formatted to get here.
pub fn charge_failure<E: From<FailureError>, C>(what: &'static str, ledger: Option<(&Ledger, i64)>, _cause: C) -> E {
    let failure = match ledger {
        Some((l, id)) => match l.fail(id, "failed after reading protected data (cause withheld)") {
            Ok(()) => ProtectedFailure::new(what, Some(id)).into(),
            // The reservation stays `reserved`, which also counts as spent.
            Err(e) => FailureError::Unsettled {
                failure: ProtectedFailure::new(what, Some(id)),
                charge: id,
                ledger_error: Box::new(e),
            },
        },
        None => ProtectedFailure::new(what, None).into(),
    };
    failure.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_the_same_whatever_the_cause() {
        let a: FailureError = charge_failure("query", None, "row 17: value 4242 is outside the domain");
        let b: FailureError = charge_failure("query", None, std::io::Error::other("Divide by zero error"));
        let (a, b) = (a.to_string(), b.to_string());
        assert_eq!(a, b);
        assert!(!a.contains("4242") && !a.contains("17"));
    }
}
