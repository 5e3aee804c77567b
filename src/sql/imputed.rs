//! `dp_imputed_count(*)`, `dp_imputed_mean(col, lo, hi)`,
//! `dp_imputed_var(col, lo, hi)` and `dp_imputed_proportion(condition)`:
//! DP statistics on the kNN-imputed version of a protected table, from SQL
//! (issue 8; 004 §5 Thm 5.1–5.7 with the smooth bound of 004 §6.2).
//!
//! A query has the shape
//! `SELECT dp_imputed_mean(PINCP, 0, 300000) AS m FROM ma2019 WHERE AGEP BETWEEN 20 AND 59`:
//! the table's catalog entry says what is imputed and how donors are matched
//! (`impute:`), the WHERE clause is the subpopulation, evaluated on the
//! *imputed* data (as in 004 §5, where predicates may read imputed
//! attributes), and every call releases the subpopulation's noisy count first
//! (004 Cor 5.2/5.5/5.7 divide by it). The imputation runs inside the engine
//! and is never returned; only the noisy statistics leave it.
//!
//! Privacy: each released number is charged at plan time (before reading
//! data) with the ε the call was given, split evenly over the numbers the
//! call releases; the smooth bound is ln 2-smooth, so the generalized Cauchy
//! noise of `crate::impute::smooth_calibration` makes each number ε-DP, and a
//! call whose ε per number is ≤ ln 2 is refused here (issue 14 §2).
//!
//! Refused (each with its reason): GROUP BY (one tuple may change imputations
//! in every group, so disjoint groups do not compose in parallel), mixing
//! with other `dp_*` aggregates, `dp_ci_*` (the noise scale is data-dependent
//! and may not be released), DISTINCT/FILTER/ORDER BY inside a call, joins,
//! subqueries, ORDER BY/LIMIT, expressions over the released values, ρ shares,
//! and WHERE conditions other than conjunctions of comparisons, BETWEEN and
//! IN lists on domain columns.

use super::error::{Result, SqlError};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};

use super::catalog::{Catalog, TableEntry};
use super::refusal::{Refusal, RefusalKind as K};
use super::sites::CallSite;
use crate::domain::{ColumnKind, Domain};
use crate::impute::{Predicate, QueryKind, QuerySpec};
use crate::privacy::{Budget, Share};
use dpflow_udfs::dp::DP_IMPUTED_AGGREGATES as IMPUTED_AGGREGATES;

/// A planned `dp_imputed_*` query.
#[derive(Debug, Clone)]
pub(super) struct ImputedPlan {
    /// The protected table.
    pub table: TableEntry,
    /// One query per call, with the pure ε of each number it releases.
    pub calls: Vec<(QuerySpec, f64)>,
    /// Output columns: (name, index into `calls`).
    pub outputs: Vec<(String, usize)>,
}

fn refuse<T>(kind: K, msg: impl Into<String>) -> Result<T> {
    Err(Refusal::new(kind, msg).into())
}

/// A WHERE condition the imputed subpopulation cannot express.
fn unsupported(msg: String) -> SqlError {
    Refusal::new(K::Unsupported, msg).into()
}

/// A refusal's message prefixed with where it arose (`WHERE …`).
fn prefixed(e: SqlError, prefix: &str) -> SqlError {
    match e {
        SqlError::Refused(r) => Refusal::new(r.kind, format!("{prefix}: {}", r.message)).into(),
        other => other,
    }
}

/// Whether the prepared query calls a `dp_imputed_*` function.
pub(super) fn uses_imputed(sites: &[CallSite]) -> bool {
    sites.iter().any(|s| IMPUTED_AGGREGATES.contains(&s.function.as_str()))
}

/// Checks the plan's shape and turns it into imputed-statistics queries.
pub(super) fn plan_imputed(
    plan: &LogicalPlan,
    catalog: &Catalog,
    sites: &[CallSite],
    budget: Option<Budget>,
) -> Result<ImputedPlan> {
    if sites.iter().any(|s| !IMPUTED_AGGREGATES.contains(&s.function.as_str())) {
        return refuse(
            K::Unsupported,
            "dp_imputed_* aggregates cannot be mixed with other dp_* aggregates in one query",
        );
    }
    let (projection, agg) = match plan {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Aggregate(a) => (Some(p), a),
            other => {
                return refuse(
                    K::Unsupported,
                    format!(
                        "dp_imputed_* queries are `SELECT dp_imputed_…(…) FROM table [WHERE …]`; found {} above the aggregate",
                        other.display()
                    ),
                );
            }
        },
        LogicalPlan::Aggregate(a) => (None, a),
        other => {
            return refuse(
                K::Unsupported,
                format!(
                    "dp_imputed_* queries are `SELECT dp_imputed_…(…) FROM table [WHERE …]` (no ORDER BY, LIMIT or outer query); found {}",
                    other.display()
                ),
            );
        }
    };
    if !agg.group_expr.is_empty() {
        return refuse(
            K::Unsupported,
            "GROUP BY with dp_imputed_*: one person can change the imputed values in every group, so groups do not compose in parallel; run one query per subpopulation (WHERE)",
        );
    }
    // Below the aggregate: WHERE filters and aliases over one table scan.
    let mut conditions: Vec<Expr> = Vec::new();
    let mut node = agg.input.as_ref();
    let scan = loop {
        match node {
            LogicalPlan::Filter(f) => {
                conditions.push(f.predicate.clone());
                node = f.input.as_ref();
            }
            LogicalPlan::SubqueryAlias(a) => node = a.input.as_ref(),
            LogicalPlan::TableScan(s) => break s,
            other => {
                return refuse(
                    K::Unsupported,
                    format!("dp_imputed_* reads one protected table with an optional WHERE; found {}", other.display()),
                );
            }
        }
    };
    let name = scan.table_name.table().to_string();
    let Some(table) = catalog.tables.get(&name) else { return Err(SqlError::UnknownTable(name)) };
    if table.public {
        return refuse(K::TablePolicy, format!("{name} is public: use ordinary SQL aggregates on it"));
    }
    let Some(imputation) = table.impute.as_ref() else {
        return refuse(
            K::TablePolicy,
            format!("table {name} has no `impute:` block in the catalog (what to impute and how to match donors)"),
        );
    };
    let domain = table.dataset.domain();
    let mut subpopulation = Vec::new();
    for c in &conditions {
        subpopulation.extend(predicates(c, domain).map_err(|e| prefixed(e, &format!("WHERE {c}")))?);
    }
    // Calls and their shares.
    let mut parsed: Vec<(QueryKind, usize, String)> = Vec::new();
    for (i, e) in agg.aggr_expr.iter().enumerate() {
        let Expr::AggregateFunction(f) = e.clone().unalias() else {
            return Err(SqlError::Internal("not an aggregate".into()));
        };
        let func = f.func.name().to_string();
        if f.params.distinct || f.params.filter.is_some() || !f.params.order_by.is_empty() {
            return refuse(
                K::Unsupported,
                format!("{func}: DISTINCT, FILTER and ORDER BY are not supported inside dp_imputed_*"),
            );
        }
        let args = &f.params.args;
        let site = super::sites::site_of(args)?;
        let a = &args[..args.len() - 1];
        let value_column = |e: &Expr| -> Result<String> {
            let Expr::Column(c) = e.clone().unalias() else {
                return refuse(K::Arguments, format!("{func}: the value must be a column of {name}, got `{e}`"));
            };
            match domain.column(&c.name).map(|x| &x.kind) {
                Some(ColumnKind::Integer { .. } | ColumnKind::Float { .. }) => Ok(c.name),
                Some(_) => refuse(K::Arguments, format!("{func}: {} is not numeric", c.name)),
                None => refuse(K::Arguments, format!("{func}: {} is not a domain column of {name}", c.name)),
            }
        };
        let kind = match (func.as_str(), a) {
            ("dp_imputed_count", [Expr::Literal(ScalarValue::Int64(Some(1)), _)]) => QueryKind::Count,
            ("dp_imputed_count", _) => {
                return refuse(K::Arguments, "use dp_imputed_count(*) (rows of the imputed subpopulation)");
            }
            ("dp_imputed_mean" | "dp_imputed_var", [v, lo, hi]) => {
                let value = value_column(v)?;
                let lo = super::args::parse_f64(lo, "the lower bound", &func)?;
                let hi = super::args::parse_f64(hi, "the upper bound", &func)?;
                if lo >= hi {
                    return refuse(
                        K::Arguments,
                        format!("{func}: the lower bound {lo} must be below the upper bound {hi}"),
                    );
                }
                if func == "dp_imputed_mean" {
                    QueryKind::Mean { value, lo, hi }
                } else {
                    QueryKind::Variance { value, lo, hi }
                }
            }
            ("dp_imputed_proportion", [cond]) => QueryKind::Proportion {
                numerator: predicates(cond, domain).map_err(|e| prefixed(e, &format!("{func}({cond})")))?,
            },
            _ => {
                let sig = match func.as_str() {
                    "dp_imputed_proportion" => "condition",
                    _ => "column, lo, hi",
                };
                return refuse(K::Arguments, format!("{func} takes ({sig}), got {} arguments", a.len()));
            }
        };
        let field = agg.schema.field(i).name().clone();
        parsed.push((kind, site, field));
    }
    let explicit: Vec<Option<Share>> =
        parsed.iter().map(|(_, site, _)| sites.iter().find(|s| s.id == *site).and_then(|s| s.budget)).collect();
    let n_explicit = explicit.iter().filter(|e| e.is_some()).count();
    if n_explicit != 0 && n_explicit != parsed.len() {
        return refuse(
            K::Budget,
            "give a budget share (epsilon =>) to every dp_imputed_* call of the query, or to none",
        );
    }
    let shares: Vec<f64> = if n_explicit == parsed.len() {
        explicit
            .iter()
            .map(|e| match e.expect("all explicit") {
                Share::Epsilon(x) => Ok(x),
                Share::Rho(_) => refuse(
                    K::Budget,
                    "dp_imputed_* takes epsilon => (smooth-sensitivity noise is calibrated to pure ε), not rho =>",
                ),
            })
            .collect::<Result<_>>()?
    } else {
        let k = parsed.len() as f64;
        match budget {
            // Pure ε; an (ε, δ) budget is spent as pure ε (δ unused).
            Some(Budget::Pure { epsilon } | Budget::Approx { epsilon, .. }) => vec![epsilon / k; parsed.len()],
            Some(Budget::Zcdp { .. }) => {
                return refuse(K::Budget, "dp_imputed_* needs an ε budget (smooth-sensitivity noise), not ρ");
            }
            None => {
                return refuse(
                    K::Budget,
                    "no budget: give --epsilon, epsilon => per call, or a query_budget in the catalog",
                );
            }
        }
    };
    let mut calls = Vec::new();
    let mut fields = Vec::new();
    for ((kind, _, field), eps) in parsed.into_iter().zip(shares) {
        let per_number = eps / kind.released_numbers() as f64;
        let name = super::sites::clean_dp_name(&field);
        let q = QuerySpec { name, kind, predicate: subpopulation.clone() };
        // ε ≤ ln 2 per number cannot be calibrated (issue 14 §2): refused before any charge,
        // when a number reads an imputed column (the others take discrete Laplace noise).
        if crate::impute::part_noises(&q, &imputation.columns).contains(&crate::impute::PartNoise::Smooth) {
            crate::impute::smooth_calibration(per_number, None)
                .map_err(|e| Refusal::new(K::Budget, format!("{}: {e}", q.name)))?;
        }
        // Discrete Laplace at ~2²¹ grid units / ε: ε ≥ 1e-15 keeps it far below the
        // samplers' range (noise::MAX_NOISE_SCALE); smaller budgets release only noise.
        if per_number < 1e-15 {
            return refuse(
                K::Budget,
                format!("{}: the budget is too small (ε {per_number:e} per number); give a larger one", q.name),
            );
        }
        calls.push((q, per_number));
        fields.push(field);
    }
    // The SELECT list: the released values themselves, renamed at most.
    let outputs = match projection {
        None => calls.iter().enumerate().map(|(i, (q, _))| (q.name.clone(), i)).collect(),
        Some(p) => {
            let mut out = Vec::new();
            for e in &p.expr {
                let (alias, inner) = match e {
                    Expr::Alias(a) => (Some(a.name.clone()), a.expr.as_ref()),
                    other => (None, other),
                };
                let Expr::Column(c) = inner else {
                    return refuse(
                        K::Unsupported,
                        format!(
                            "`{e}`: select the dp_imputed_* values themselves (post-process them outside the query)"
                        ),
                    );
                };
                let Some(i) = fields.iter().position(|f| *f == c.name) else {
                    return refuse(K::Unsupported, format!("`{e}` is not a dp_imputed_* value"));
                };
                out.push((alias.unwrap_or_else(|| calls[i].0.name.clone()), i));
            }
            out
        }
    };
    Ok(ImputedPlan { table: table.clone(), calls, outputs })
}

/// A literal as a label (categorical) or number.
fn literal(e: &Expr) -> Option<ScalarValue> {
    match e {
        Expr::Literal(v, _) if !v.is_null() => Some(v.clone()),
        Expr::Negative(inner) => literal(inner)?.arithmetic_negate().ok(),
        Expr::Cast(c) => literal(&c.expr),
        Expr::TryCast(c) => literal(&c.expr),
        _ => None,
    }
}

fn column_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Column(c) => Some(c.name.clone()),
        Expr::Cast(c) => column_name(&c.expr),
        Expr::TryCast(c) => column_name(&c.expr),
        _ => None,
    }
}

fn number(v: &ScalarValue) -> Result<f64> {
    match v.cast_to(&datafusion::arrow::datatypes::DataType::Float64)? {
        ScalarValue::Float64(Some(f)) if f.is_finite() => Ok(f),
        _ => Err(unsupported(format!("`{v}` is not a finite number"))),
    }
}

/// The code of a label of a categorical or boolean column.
fn code_of(domain: &Domain, column: &str, v: &ScalarValue) -> Result<f64> {
    let col = domain.column(column).expect("checked");
    let label = match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s.clone(),
        other => other.to_string(),
    };
    match &col.kind {
        ColumnKind::Categorical { values, .. } => values
            .iter()
            .position(|x| *x == label)
            .map(|p| p as f64)
            .ok_or_else(|| unsupported(format!("{label:?} is not a value of {column}"))),
        ColumnKind::Boolean => match label.as_str() {
            "false" => Ok(0.0),
            "true" => Ok(1.0),
            _ => Err(unsupported(format!("{label:?} is not a boolean"))),
        },
        _ => unreachable!("numeric columns take ranges"),
    }
}

/// A conjunction of simple conditions on domain columns as predicates on the
/// imputed data (numbers for integer/float columns, codes for categorical and
/// boolean ones). A null never matches, as in SQL.
pub(super) fn predicates(e: &Expr, domain: &Domain) -> Result<Vec<Predicate>> {
    let numeric = |c: &str| -> Result<Option<bool>> {
        match domain.column(c).map(|x| &x.kind) {
            None => Err(unsupported(format!("{c} is not a domain column"))),
            Some(ColumnKind::Integer { .. }) => Ok(Some(true)),
            Some(ColumnKind::Float { .. }) => Ok(Some(false)),
            Some(_) => Ok(None),
        }
    };
    let range = |c: String, lo: Option<f64>, hi: Option<f64>| Predicate { column: c, lo, hi, codes: None };
    match e {
        Expr::Alias(a) => predicates(&a.expr, domain),
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::And, right }) => {
            let mut p = predicates(left, domain)?;
            p.extend(predicates(right, domain)?);
            Ok(p)
        }
        Expr::Between(b) if !b.negated => {
            let Some(c) = column_name(&b.expr) else {
                return Err(unsupported("BETWEEN must test a column".to_string()));
            };
            if numeric(&c)?.is_none() {
                return Err(unsupported(format!("BETWEEN needs a numeric column ({c} is categorical)")));
            }
            let (Some(lo), Some(hi)) = (literal(&b.low), literal(&b.high)) else {
                return Err(unsupported("BETWEEN needs literals".to_string()));
            };
            Ok(vec![range(c, Some(number(&lo)?), Some(number(&hi)?))])
        }
        Expr::InList(l) if !l.negated => {
            let Some(c) = column_name(&l.expr) else { return Err(unsupported("IN must test a column".to_string())) };
            let vals = l
                .list
                .iter()
                .map(literal)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| unsupported("IN needs literals".to_string()))?;
            match numeric(&c)? {
                None => Ok(vec![Predicate {
                    column: c.clone(),
                    lo: None,
                    hi: None,
                    codes: Some(vals.iter().map(|v| code_of(domain, &c, v)).collect::<Result<_>>()?),
                }]),
                Some(_) => {
                    Err(unsupported(format!("IN lists are supported on categorical columns; use BETWEEN on {c}")))
                }
            }
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            if !matches!(op, Operator::Eq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq) {
                return Err(unsupported(format!(
                    "operator {op} is not supported: use AND-ed comparisons (=, <, <=, >, >=), BETWEEN or IN"
                )));
            }
            // column op literal, or literal op column (mirrored).
            let (c, v, op) = match (column_name(left), literal(right), column_name(right), literal(left)) {
                (Some(c), Some(v), _, _) => (c, v, *op),
                (_, _, Some(c), Some(v)) => {
                    (c, v, op.swap().ok_or_else(|| unsupported(format!("unsupported operator {op}")))?)
                }
                _ => return Err(unsupported("conditions must compare a column with a literal".to_string())),
            };
            match (numeric(&c)?, op) {
                (None, Operator::Eq) => {
                    let code = code_of(domain, &c, &v)?;
                    Ok(vec![Predicate { column: c, lo: None, hi: None, codes: Some(vec![code]) }])
                }
                (None, _) => Err(unsupported(format!("only = and IN are supported on categorical column {c}"))),
                (Some(integer), op) => {
                    let x = number(&v)?;
                    let name = c.clone();
                    let step = |strict: bool, up: bool| -> Result<f64> {
                        if !strict {
                            return Ok(x);
                        }
                        if !integer {
                            return Err(unsupported(format!(
                                "strict comparisons on real-valued {name} are not supported: use >= or <="
                            )));
                        }
                        Ok(if up { x.floor() + 1.0 } else { x.ceil() - 1.0 })
                    };
                    Ok(vec![match op {
                        Operator::Eq => range(c, Some(x), Some(x)),
                        Operator::GtEq => range(c, Some(step(false, true)?), None),
                        Operator::Gt => range(c, Some(step(true, true)?), None),
                        Operator::LtEq => range(c, None, Some(step(false, false)?)),
                        Operator::Lt => range(c, None, Some(step(true, false)?)),
                        other => {
                            return Err(unsupported(format!(
                                "operator {other} is not supported (use =, <, <=, >, >=, BETWEEN, IN)"
                            )));
                        }
                    }])
                }
            }
        }
        Expr::Column(c) if matches!(domain.column(&c.name).map(|x| &x.kind), Some(ColumnKind::Boolean)) => {
            Ok(vec![Predicate { column: c.name.clone(), lo: None, hi: None, codes: Some(vec![1.0]) }])
        }
        other => Err(unsupported(format!(
            "`{other}` is not supported: use AND-ed comparisons of a column with a literal, BETWEEN, or IN lists"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    fn domain() -> Domain {
        crate::domain::DomainSpec::parse(
            "name: t\ncolumns:\n  - {name: age, kind: integer, bounds: [0, 99]}\n  - {name: w, kind: float, bounds: [0, 10], bins: {count: 5}}\n  - {name: sex, kind: categorical, values: [F, M]}\n",
            "t.yaml",
        )
        .unwrap()
        .domain
    }

    #[test]
    fn where_clauses_become_predicates() {
        let d = domain();
        let p = predicates(&col("age").between(lit(20i64), lit(59i64)).and(col("sex").eq(lit("M"))), &d).unwrap();
        assert_eq!(p[0], Predicate { column: "age".into(), lo: Some(20.0), hi: Some(59.0), codes: None });
        assert_eq!(p[1], Predicate { column: "sex".into(), lo: None, hi: None, codes: Some(vec![1.0]) });
        // Strict integer comparisons become closed ranges; literal-first is mirrored.
        let p = predicates(&lit(30i64).lt(col("age")), &d).unwrap();
        assert_eq!(p[0], Predicate { column: "age".into(), lo: Some(31.0), hi: None, codes: None });
        let p = predicates(&col("age").lt(lit(30i64)), &d).unwrap();
        assert_eq!(p[0].hi, Some(29.0));
        let p = predicates(&col("sex").in_list(vec![lit("F"), lit("M")], false), &d).unwrap();
        assert_eq!(p[0].codes, Some(vec![0.0, 1.0]));
        // Refused: OR, strict on reals, unknown labels, NOT IN, functions.
        assert!(predicates(&col("age").gt(lit(3i64)).or(col("sex").eq(lit("M"))), &d).is_err());
        assert!(predicates(&col("w").gt(lit(3.0)), &d).is_err());
        assert!(predicates(&col("sex").eq(lit("X")), &d).is_err());
        assert!(predicates(&col("sex").in_list(vec![lit("F")], true), &d).is_err());
        assert!(predicates(&col("nope").eq(lit(1i64)), &d).is_err());
    }
}
