//! Where a statement sent to `dpflow serve` goes, decided from its text
//! alone (before anything is planned, read or charged):
//!
//! - a query that names a catalog table goes to the DP SQL engine (the same
//!   checks, costing, ledger reservation and noise as `dpflow sql`); a
//!   catalog table outside the analyst's role is refused here;
//! - a query that names none (`SELECT version()`, `pg_catalog.*`,
//!   `information_schema.*`, `dp_budget()`) goes to the metadata session,
//!   which holds the role tables' *schemas* as empty tables and nothing else;
//! - `BEGIN`/`COMMIT`/`ROLLBACK`, `SET` and `SHOW` are answered by the
//!   server (they change nothing: every query is charged on its own);
//! - everything else (`COPY`, `CREATE`, `INSERT`, several statements in one
//!   message, ...) is refused.

use std::collections::BTreeSet;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use super::sqlstate;

/// The name of the table function (and `SHOW` parameter) that tells an
/// analyst what they have left.
pub const DP_BUDGET: &str = "dp_budget";

/// Whether `name` is a DP SQL table function an analyst may call
/// (`synthetic()` rows of a catalog model, the charged
/// [`crate::sql::sites::DP_TABLE_FUNCTIONS`]); they run in the analyst's DP
/// session.
fn is_dp_table_function(name: &str) -> bool {
    name == "synthetic" || crate::sql::sites::DP_TABLE_FUNCTIONS.contains(&name)
}

/// What to do with one message's SQL.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Nothing but whitespace, comments or semicolons.
    Empty,
    /// `BEGIN` / `START TRANSACTION`.
    Begin,
    /// `COMMIT` / `END`.
    Commit,
    /// `ROLLBACK` / `ABORT`.
    Rollback,
    /// `SET ...`, `RESET ...`, `DISCARD ...`, `DEALLOCATE ...`, `SAVEPOINT`,
    /// `RELEASE`: accepted, no effect.
    Set(&'static str),
    /// `SHOW name` (lower case).
    Show(String),
    /// A DP query (or its EXPLAIN) over catalog tables.
    Dp,
    /// A query over the metadata session.
    Metadata,
    /// Refused: SQLSTATE and message.
    Refuse(&'static str, String),
}

/// Routes `sql` for an analyst whose role allows `allowed` out of the
/// catalog's `catalog` tables.
pub fn route(sql: &str, catalog: &BTreeSet<String>, allowed: &BTreeSet<String>) -> Route {
    let stmts = match Parser::parse_sql(&PostgreSqlDialect {}, sql) {
        Ok(s) => s,
        Err(e) => return Route::Refuse(sqlstate::SYNTAX, format!("SQL syntax error: {e}")),
    };
    let stmt = match stmts.len() {
        0 => return Route::Empty,
        1 => stmts.into_iter().next().expect("one"),
        n => {
            return Route::Refuse(
                sqlstate::UNSUPPORTED,
                format!("send one statement per query (got {n}): each DP query is planned and charged on its own"),
            );
        }
    };
    match &stmt {
        Statement::StartTransaction { .. } => return Route::Begin,
        Statement::Commit { .. } => return Route::Commit,
        // Rolling back to a savepoint keeps the transaction open.
        Statement::Rollback { savepoint: Some(_), .. } => return Route::Set("ROLLBACK"),
        Statement::Rollback { .. } => return Route::Rollback,
        Statement::Set(_) => return Route::Set("SET"),
        Statement::Reset(_) => return Route::Set("RESET"),
        Statement::Discard { .. } => return Route::Set("DISCARD ALL"),
        Statement::Deallocate { .. } => return Route::Set("DEALLOCATE"),
        Statement::Savepoint { .. } => return Route::Set("SAVEPOINT"),
        Statement::ReleaseSavepoint { .. } => return Route::Set("RELEASE"),
        Statement::ShowVariable { variable } => {
            let name = variable.iter().map(|i| i.value.to_lowercase()).collect::<Vec<_>>().join(" ");
            return Route::Show(name);
        }
        Statement::Query(_) | Statement::Explain { .. } => {}
        other => {
            let what = other.to_string();
            let verb = what.split_whitespace().next().unwrap_or("this statement").to_uppercase();
            return Route::Refuse(
                sqlstate::PERMISSION,
                format!(
                    "{verb} is not allowed: dpflow serve answers DP queries (SELECT with dp_* aggregates), \
                     EXPLAIN and catalog queries only"
                ),
            );
        }
    }
    let (tables, _ctes) =
        match datafusion::sql::resolve::resolve_table_references(&DfStatement::Statement(Box::new(stmt)), true) {
            Ok(t) => t,
            Err(e) => return Route::Refuse(sqlstate::SYNTAX, format!("SQL: {e}")),
        };
    let mut dp = false;
    let mut meta = false;
    for t in &tables {
        let name = t.table();
        let schema = t.schema().map(str::to_lowercase);
        let system = matches!(schema.as_deref(), Some("pg_catalog" | "information_schema"));
        if system || (schema.is_none() && (name == DP_BUDGET || name.starts_with("pg_"))) {
            meta = true;
        } else if schema.is_some() {
            // `x.adult` (DataFusion would read `x` as a table function's name).
            return Route::Refuse(sqlstate::UNDEFINED_TABLE, format!("relation {:?} does not exist", t.to_string()));
        } else if is_dp_table_function(name) {
            // Their tables are the analyst's own: the DP session registers nothing else.
            dp = true;
        } else if catalog.contains(name) {
            if !allowed.contains(name) {
                return Route::Refuse(
                    sqlstate::PERMISSION,
                    format!("permission denied for table {name}: it is not in any of your roles"),
                );
            }
            dp = true;
        } else {
            return Route::Refuse(sqlstate::UNDEFINED_TABLE, format!("relation {name:?} does not exist"));
        }
    }
    match (dp, meta) {
        (true, true) => Route::Refuse(
            sqlstate::UNSUPPORTED,
            "a query cannot mix catalog tables with pg_catalog, information_schema or dp_budget".into(),
        ),
        (true, false) => Route::Dp,
        _ => Route::Metadata,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(sql: &str) -> Route {
        let catalog: BTreeSet<String> = ["adult".into(), "secret".into()].into();
        let allowed: BTreeSet<String> = ["adult".into()].into();
        route(sql, &catalog, &allowed)
    }

    fn code(x: Route) -> &'static str {
        match x {
            Route::Refuse(c, _) => c,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn statements_are_routed_by_kind_and_tables() {
        assert_eq!(r("SELECT dp_count(*) FROM adult"), Route::Dp);
        assert_eq!(r("EXPLAIN SELECT dp_count(*) FROM adult"), Route::Dp);
        assert_eq!(r("WITH a AS (SELECT * FROM adult) SELECT dp_count(*) FROM a"), Route::Dp);
        assert_eq!(r("SELECT version()"), Route::Metadata);
        assert_eq!(r("SELECT * FROM dp_budget()"), Route::Metadata);
        assert_eq!(r("SELECT relname FROM pg_catalog.pg_class"), Route::Metadata);
        assert_eq!(r("select * from information_schema.tables"), Route::Metadata);
        assert_eq!(r(" ;  "), Route::Empty);
        assert_eq!(r("BEGIN"), Route::Begin);
        assert_eq!(r("COMMIT"), Route::Commit);
        assert_eq!(r("ROLLBACK"), Route::Rollback);
        assert_eq!(r("SET extra_float_digits = 3"), Route::Set("SET"));
        assert_eq!(r("SAVEPOINT sa_1"), Route::Set("SAVEPOINT"));
        assert_eq!(r("ROLLBACK TO SAVEPOINT sa_1"), Route::Set("ROLLBACK"));
        assert_eq!(r("SHOW dp_budget"), Route::Show("dp_budget".into()));
        assert_eq!(r("SELECT * FROM dp_marginals('adult', 'sex', rho => 0.1)"), Route::Dp);
        assert_eq!(r("SELECT count(*) FROM synthesize('adult', mechanism => 'mst', rho => 0.1)"), Route::Dp);
        assert_eq!(r("SELECT count(*) FROM synthetic('m', 10)"), Route::Dp);
        // A qualified name is never a table function's alias for a catalog table.
        assert_eq!(code(r("SELECT * FROM dp_marginals.adult('adult', 'sex')")), sqlstate::UNDEFINED_TABLE);
    }

    #[test]
    fn other_tables_files_writes_and_batches_are_refused() {
        assert_eq!(code(r("SELECT dp_count(*) FROM secret")), sqlstate::PERMISSION);
        assert_eq!(code(r("SELECT dp_count(*) FROM adult JOIN secret ON true")), sqlstate::PERMISSION);
        assert_eq!(code(r("SELECT dp_count(*) FROM (SELECT * FROM secret) s")), sqlstate::PERMISSION);
        assert_eq!(code(r("SELECT * FROM read_parquet('/etc/passwd')")), sqlstate::UNDEFINED_TABLE);
        assert_eq!(code(r("SELECT * FROM '/data/adult.parquet'")), sqlstate::UNDEFINED_TABLE);
        assert_eq!(code(r("COPY adult TO '/tmp/x.csv'")), sqlstate::PERMISSION);
        assert_eq!(code(r("CREATE TABLE x AS SELECT 1")), sqlstate::PERMISSION);
        assert_eq!(code(r("CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'")), sqlstate::SYNTAX);
        assert_eq!(code(r("INSERT INTO adult VALUES (1)")), sqlstate::PERMISSION);
        assert_eq!(code(r("DROP TABLE adult")), sqlstate::PERMISSION);
        assert_eq!(code(r("SELECT 1; SELECT dp_count(*) FROM adult")), sqlstate::UNSUPPORTED);
        assert_eq!(code(r("SELECT dp_count(*) FROM adult, pg_catalog.pg_class")), sqlstate::UNSUPPORTED);
        assert_eq!(code(r("SELEC 1")), sqlstate::SYNTAX);
    }
}
