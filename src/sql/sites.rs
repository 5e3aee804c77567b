//! SQL preprocessing: every `dp_*` call site gets an id and its budget share.
//!
//! `dp_count(*, epsilon => 0.1)` becomes `dp_count(1, '__dp_site_0')` and the
//! share (ε = 0.1) is kept on the side. The id lets the engine (a) charge
//! each call site once at plan time and (b) refuse plans in which one call
//! site appears twice (a CTE or view referenced twice would otherwise be
//! evaluated — and noised — twice).

use std::ops::ControlFlow;

use super::error::{Result, SqlError};
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Statement, TableFactor, Value, VisitMut, VisitorMut,
    visit_expressions_mut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use dpflow_udfs::dp::{DP_AGGREGATES, DP_IMPUTED_AGGREGATES};

use super::refusal::{Refusal, RefusalKind as K};
use crate::privacy::Share;

/// One DP aggregate call in the query text.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSite {
    /// Id (order of appearance).
    pub id: usize,
    /// Function name.
    pub function: String,
    /// Explicit share, if any.
    pub budget: Option<Share>,
}

/// A query ready for planning.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Rewritten SQL.
    pub sql: String,
    /// Call sites.
    pub sites: Vec<CallSite>,
    /// The query was `EXPLAIN ...`.
    pub explain: bool,
}

/// The literal that tags call site `id`.
pub fn site_tag(id: usize) -> String {
    format!("__dp_site_{id}")
}

/// Parses one statement and tags its DP calls.
pub fn prepare(sql: &str) -> Result<Prepared> {
    let mut stmts = Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| SqlError::Syntax(e.to_string()))?;
    if stmts.len() != 1 {
        return Err(
            Refusal::new(K::Unsupported, format!("give exactly one SQL statement (got {})", stmts.len())).into()
        );
    }
    let mut stmt = stmts.remove(0);
    let mut explain = false;
    if let Statement::Explain { statement, .. } = stmt {
        explain = true;
        stmt = *statement;
    }
    if let Statement::Query(q) = &stmt
        && let datafusion::sql::sqlparser::ast::SetExpr::Select(s) = q.body.as_ref()
        && s.into.is_some()
    {
        return Err(Refusal::new(
            K::Unsupported,
            "SELECT ... INTO creates a table: only SELECT queries are allowed (no DDL, DML or configuration statements)",
        )
        .into());
    }
    if !matches!(stmt, Statement::Query(_)) {
        return Err(Refusal::new(
            K::Unsupported,
            "only SELECT queries are allowed (no DDL, DML or configuration statements)",
        )
        .into());
    }
    let mut sites: Vec<CallSite> = Vec::new();
    // Identical call text shares one site (e.g. `dp_count(*)` and
    // `dp_ci_low(dp_count(*))`): DataFusion computes it once.
    let mut by_text: std::collections::HashMap<String, usize> = Default::default();
    let mut error: Option<Refusal> = None;
    let _ = visit_expressions_mut(&mut stmt, |e: &mut Expr| {
        if let Expr::Function(f) = e {
            let name = f.name.to_string().to_ascii_lowercase();
            if !DP_AGGREGATES.contains(&name.as_str()) && !DP_IMPUTED_AGGREGATES.contains(&name.as_str()) {
                return ControlFlow::<()>::Continue(());
            }
            let FunctionArguments::List(list) = &mut f.args else {
                error = Some(Refusal::new(K::Arguments, format!("{name} needs an argument list")));
                return ControlFlow::Break(());
            };
            let mut positional = Vec::new();
            let mut budget = None;
            for a in std::mem::take(&mut list.args) {
                match a {
                    FunctionArg::Named { name: n, arg, .. } => {
                        let key = n.value.to_ascii_lowercase();
                        let value = match &arg {
                            FunctionArgExpr::Expr(Expr::Value(v)) => match &v.value {
                                Value::Number(s, _) => s.parse::<f64>().ok(),
                                _ => None,
                            },
                            _ => None,
                        };
                        let Some(value) = value.filter(|v| *v > 0.0 && v.is_finite()) else {
                            error = Some(Refusal::new(
                                K::Arguments,
                                format!("{name}: {key} => must be a positive number literal"),
                            ));
                            return ControlFlow::Break(());
                        };
                        if budget.is_some() {
                            error = Some(Refusal::new(
                                K::Arguments,
                                format!("{name}: give one budget share (epsilon => or rho =>)"),
                            ));
                            return ControlFlow::Break(());
                        }
                        budget = Some(match key.as_str() {
                            "epsilon" | "eps" => Share::Epsilon(value),
                            "rho" => Share::Rho(value),
                            other => {
                                error = Some(Refusal::new(
                                    K::Arguments,
                                    format!("{name}: unknown named argument {other:?} (use epsilon => or rho =>)"),
                                ));
                                return ControlFlow::Break(());
                            }
                        });
                    }
                    FunctionArg::Unnamed(FunctionArgExpr::Wildcard)
                        if name == "dp_count" || name == "dp_imputed_count" =>
                    {
                        positional.push(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::value(Value::Number(
                            "1".into(),
                            false,
                        )))));
                    }
                    FunctionArg::Unnamed(arg @ FunctionArgExpr::Expr(_)) => positional.push(FunctionArg::Unnamed(arg)),
                    other => {
                        error = Some(Refusal::new(K::Arguments, format!("{name}: unsupported argument {other}")));
                        return ControlFlow::Break(());
                    }
                }
            }
            let key = format!(
                "{name}({})|{budget:?}",
                positional.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
            );
            let id = match by_text.get(&key) {
                Some(&id) => id,
                None => {
                    let id = sites.len();
                    by_text.insert(key, id);
                    sites.push(CallSite { id, function: name, budget });
                    id
                }
            };
            positional.push(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::value(Value::SingleQuotedString(
                site_tag(id),
            )))));
            list.args = positional;
        }
        ControlFlow::Continue(())
    });
    if let Some(e) = error {
        return Err(e.into());
    }
    let mut named = NamedTableArgs { error: None };
    let _ = stmt.visit(&mut named);
    if let Some(e) = named.error {
        return Err(e.into());
    }
    Ok(Prepared { sql: stmt.to_string(), sites, explain })
}

/// The DP table functions, whose named arguments (`epsilon => 1`) `prepare`
/// rewrites: DataFusion plans only positional table-function arguments, so
/// `name => value` becomes `named_struct('name', value)`, which
/// [`super::table_calls`] reads back.
pub const DP_TABLE_FUNCTIONS: &[&str] = &["dp_marginals", "synthesize"];

struct NamedTableArgs {
    error: Option<Refusal>,
}

impl VisitorMut for NamedTableArgs {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, args: Some(args), .. } = factor else {
            return ControlFlow::Continue(());
        };
        let function = name.to_string().to_ascii_lowercase();
        if !DP_TABLE_FUNCTIONS.contains(&function.as_str()) {
            return ControlFlow::Continue(());
        }
        for a in &mut args.args {
            let FunctionArg::Named { name: n, arg, .. } = a else { continue };
            let FunctionArgExpr::Expr(value) = arg else {
                self.error = Some(Refusal::new(K::Arguments, format!("{function}: {} => needs a value", n.value)));
                return ControlFlow::Break(());
            };
            let key = n.value.to_ascii_lowercase().replace('\'', "''");
            let text = format!("named_struct('{key}', {value})");
            match Parser::new(&GenericDialect {}).try_with_sql(&text).and_then(|mut p| p.parse_expr()) {
                Ok(e) => *a = FunctionArg::Unnamed(FunctionArgExpr::Expr(e)),
                Err(e) => {
                    self.error = Some(Refusal::new(K::Arguments, format!("{function}: {key} => {value}: {e}")));
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// The call-site id of a tagged DP call (its last argument).
pub fn site_of(args: &[datafusion::logical_expr::Expr]) -> Result<usize> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Expr;
    match args.last() {
        Some(Expr::Literal(ScalarValue::Utf8(Some(s)), _)) => s
            .strip_prefix("__dp_site_")
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| SqlError::Internal("malformed DP call-site tag".into())),
        _ => Err(SqlError::Internal("DP call without a site tag".into())),
    }
}

/// `dp_count(Int64(1),Utf8("__dp_site_0"))` → `dp_count(*)`: a DP call's
/// planned name without its site tag.
pub fn clean_dp_name(name: &str) -> String {
    let mut n = name.to_string();
    while let Some(i) = n.find(",Utf8(\"__dp_site_") {
        match n[i..].find("\")") {
            Some(j) => n.replace_range(i..i + j + 2, ""),
            None => break,
        }
    }
    n.replace("dp_count(Int64(1))", "dp_count(*)").replace("dp_imputed_count(Int64(1))", "dp_imputed_count(*)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_sites_and_extracts_budgets() {
        let p =
            prepare("SELECT sex, dp_count(*, epsilon => 0.5), dp_sum(age, 0, 100) FROM adult GROUP BY sex").unwrap();
        assert_eq!(p.sites.len(), 2);
        assert_eq!(p.sites[0].budget, Some(Share::Epsilon(0.5)));
        assert_eq!(p.sites[1].budget, None);
        assert!(p.sql.contains("dp_count(1, '__dp_site_0')"), "{}", p.sql);
        assert!(p.sql.contains("dp_sum(age, 0, 100, '__dp_site_1')"), "{}", p.sql);
        assert!(prepare("EXPLAIN SELECT dp_count(*) FROM adult").unwrap().explain);
        assert!(prepare("DROP TABLE adult").is_err());
        assert!(prepare("SELECT 1; SELECT 2").is_err());
        assert!(prepare("SELECT * INTO x FROM adult").is_err());
        assert!(prepare("SELECT dp_count(*, delta => 1) FROM adult").is_err());
        assert!(prepare("SELECT dp_count(*, rho => -1) FROM adult").is_err());
    }

    #[test]
    fn dp_table_functions_get_positional_named_arguments() {
        let p = prepare("SELECT * FROM synthesize('adult', mechanism => 'aim', EPSILON => 1, rows => 10)").unwrap();
        assert!(
            p.sql.contains(
                "synthesize('adult', named_struct('mechanism', 'aim'), named_struct('epsilon', 1), named_struct('rows', 10))"
            ),
            "{}",
            p.sql
        );
        assert!(p.sites.is_empty());
        // Other table functions keep their arguments.
        let p = prepare("SELECT * FROM synthetic('m.json', 10)").unwrap();
        assert!(p.sql.contains("synthetic('m.json', 10)"), "{}", p.sql);
    }
}
