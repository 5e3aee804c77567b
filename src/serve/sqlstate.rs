//! SQLSTATEs of `dpflow serve`'s errors. Standard codes where PostgreSQL has
//! one; DP outcomes in the implementation-defined class `PD` (SQL standard:
//! classes beginning with I–Z are the implementation's), so a client can tell
//! a refusal from an exhausted budget without reading the text. The message
//! is the same one the CLI prints (and, like it, never depends on protected
//! data: a failure after reading is reported without its cause).

use pgwire::error::{ErrorInfo, PgWireError};

use crate::privacy::LedgerError;
use crate::sql::{RefusalKind, SqlError};

/// The dataset's total budget cannot pay for the query.
pub const DATASET_BUDGET: &str = "PD100";
/// The analyst's own grant cannot pay for the query.
pub const ANALYST_BUDGET: &str = "PD101";
/// The analyst holds no grant on the dataset.
pub const NO_GRANT: &str = "PD102";
/// The query failed after reading protected data: charged, cause withheld.
pub const FAILED_CHARGED: &str = "PD200";
/// Permission denied (a table outside the analyst's role, a statement that
/// writes or reaches files).
pub const PERMISSION: &str = "42501";
/// A table that does not exist.
pub const UNDEFINED_TABLE: &str = "42P01";
/// SQL that does not parse.
pub const SYNTAX: &str = "42601";
/// A protocol or SQL feature the server does not offer.
pub const UNSUPPORTED: &str = "0A000";
/// An unknown `SHOW` parameter.
pub const UNDEFINED_OBJECT: &str = "42704";
/// Another syntax or access-rule problem (a catalog query DataFusion cannot plan).
pub const ACCESS_RULE: &str = "42000";
/// No authenticated user, or TLS required and not used.
pub const AUTHORIZATION: &str = "28000";
/// The server is shutting down.
pub const SHUTTING_DOWN: &str = "57P01";
/// A server-side problem (ledger unreadable, data source failing before any read).
pub const SYSTEM: &str = "58000";

/// The code of each refusal kind: `PD001`… in the order of [`RefusalKind`].
pub fn refusal_code(kind: RefusalKind) -> &'static str {
    match kind {
        RefusalKind::ExposesRows => "PD001",
        RefusalKind::NotDpAggregate => "PD002",
        RefusalKind::RepeatedAggregation => "PD003",
        RefusalKind::MayFail => "PD004",
        RefusalKind::MultipliesRows => "PD005",
        RefusalKind::PrivacyUnit => "PD006",
        RefusalKind::Arguments => "PD007",
        RefusalKind::Budget => "PD008",
        RefusalKind::TablePolicy => "PD009",
        RefusalKind::TooManyKeys => "PD010",
        RefusalKind::Unsupported => "PD011",
        RefusalKind::NoProtectedTable => "PD012",
    }
}

/// The SQLSTATE of a DP SQL error.
pub fn code_of(e: &SqlError) -> &'static str {
    match e {
        SqlError::Refused(r) => refusal_code(r.kind),
        SqlError::Syntax(_) => SYNTAX,
        SqlError::UnknownTable(_) => UNDEFINED_TABLE,
        SqlError::Failed(_) => FAILED_CHARGED,
        SqlError::Ledger(LedgerError::Budget { .. }) => DATASET_BUDGET,
        SqlError::Ledger(LedgerError::AnalystBudget { .. }) => ANALYST_BUDGET,
        SqlError::Ledger(LedgerError::NoGrant { .. }) => NO_GRANT,
        SqlError::Plan(d) if d.to_string().contains("not found") => UNDEFINED_TABLE,
        SqlError::Plan(_) => ACCESS_RULE,
        _ => SYSTEM,
    }
}

/// An `ERROR` with `code` and `message`.
pub fn error(code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("ERROR".to_owned(), code.to_owned(), message.into())))
}

/// A DP SQL error as a PostgreSQL error.
pub fn from_sql(e: &SqlError) -> PgWireError {
    error(code_of(e), e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_kind_has_its_own_code_in_class_pd() {
        let kinds = [
            RefusalKind::ExposesRows,
            RefusalKind::NotDpAggregate,
            RefusalKind::RepeatedAggregation,
            RefusalKind::MayFail,
            RefusalKind::MultipliesRows,
            RefusalKind::PrivacyUnit,
            RefusalKind::Arguments,
            RefusalKind::Budget,
            RefusalKind::TablePolicy,
            RefusalKind::TooManyKeys,
            RefusalKind::Unsupported,
            RefusalKind::NoProtectedTable,
        ];
        let codes: std::collections::BTreeSet<_> = kinds.iter().map(|k| refusal_code(*k)).collect();
        assert_eq!(codes.len(), kinds.len());
        assert!(codes.iter().all(|c| c.len() == 5 && c.starts_with("PD0")));
    }
}
