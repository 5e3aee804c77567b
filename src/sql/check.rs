//! Plan checking: every value derived from a protected table must reach the
//! output only through DP aggregates, and nothing before the aggregation may
//! break contribution bounds. Refusals say which expression and why.
//!
//! Accepted shape: `[post-processing] → Aggregate(dp_* only) → [Filter |
//! Projection | SubqueryAlias | Join with a public table] → protected scan`.
//! Post-processing (projection, HAVING, ORDER BY, LIMIT, joins with public
//! tables, windows over released values) may be anything that does not scan a
//! protected table again.

use std::collections::{BTreeMap, HashSet};

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, JoinType, LogicalPlan};
use dpflow_udfs::dp::DP_AGGREGATES;

use super::catalog::Catalog;
use super::refusal::{Refusal, RefusalKind as K, refuse};

/// What flows out of a plan node.
#[derive(Debug, Clone, PartialEq)]
enum Flow {
    /// Only public data.
    Public,
    /// Rows of a protected table, not yet aggregated.
    Protected(String),
    /// Released (noisy) results of the DP aggregation, maybe combined with public data.
    Released,
}

/// The outcome of a successful check.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// The one DP aggregation.
    pub aggregate: Aggregate,
    /// The protected table it aggregates.
    pub table: String,
    /// Public relations joined before aggregation: the public side's plan and
    /// its equality keys (expressions over that plan's output).
    pub public_joins: Vec<PublicJoin>,
}

/// A join of protected rows with a public relation. Each protected row may
/// match at most one public row, so the keys must be unique on the public
/// side as planned (after its own filters, projections and aliases).
#[derive(Debug, Clone)]
pub struct PublicJoin {
    /// The public side's plan.
    pub plan: LogicalPlan,
    /// Its ON equality keys, as expressions over `plan`'s output.
    pub keys: Vec<Expr>,
}

struct Checker<'a> {
    catalog: &'a Catalog,
    aggregate: Option<(Aggregate, String)>,
    public_joins: Vec<PublicJoin>,
}

fn table_name(scan: &datafusion::logical_expr::TableScan) -> String {
    scan.table_name.table().to_string()
}

fn is_dp_aggregate(e: &Expr) -> Option<String> {
    match e {
        Expr::AggregateFunction(f) if DP_AGGREGATES.contains(&f.func.name()) => Some(f.func.name().to_string()),
        Expr::Alias(a) => is_dp_aggregate(&a.expr),
        _ => None,
    }
}

/// Every DP marker or window function inside `e` (for refusals).
fn find_forbidden_in_rows(e: &Expr) -> Option<String> {
    let mut found = None;
    let _ = e.apply(|x| {
        match x {
            Expr::WindowFunction(w) => {
                found = Some(format!("window function `{}` over protected rows", w.fun));
                return Ok(TreeNodeRecursion::Stop);
            }
            Expr::AggregateFunction(f) => {
                found = Some(format!("aggregate `{}` inside a row-level expression", f.func.name()));
                return Ok(TreeNodeRecursion::Stop);
            }
            Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_) => {
                found = Some(format!("subquery expression `{x}` over protected rows"));
                return Ok(TreeNodeRecursion::Stop);
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Refuses a public relation joined with protected rows of `t` if any of its
/// expressions could fail on a row, or if it reads a public table whose
/// out-of-domain policy is `error`: whether it is evaluated can depend on
/// the protected rows.
fn public_cannot_fail(plan: &LogicalPlan, catalog: &Catalog, t: &str) -> Result<(), Refusal> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(s) = node
            && let Some(entry) = catalog.tables.get(&table_name(s))
            && let Some(why) = entry.dataset.domain().dp_read_refusal()
        {
            found = Some(Refusal::new(
                K::TablePolicy,
                format!("public table {} joined with protected table {t}: {why}", entry.name),
            ));
            return Ok(TreeNodeRecursion::Stop);
        }
        if let Some(schema) = expression_schema(node) {
            for e in node.expressions() {
                if let Some(why) = super::rowsafe::may_fail(&e, &schema) {
                    found = Some(Refusal::new(
                        K::MayFail,
                        format!(
                            "{why}. The public side of a join with protected table {t} must not be able to fail \
                         either: whether it runs depends on the protected rows (docs/PRIVACY.md §1)"
                        ),
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found.map_or(Ok(()), Err)
}

/// The schema a node's expressions are evaluated against: its input's, or
/// both inputs' for a join (None for a leaf, or inputs that cannot merge).
fn expression_schema(node: &LogicalPlan) -> Option<datafusion::common::DFSchema> {
    match node.inputs().as_slice() {
        [input] => Some(input.schema().as_ref().clone()),
        [left, right] => left.schema().as_ref().clone().join(right.schema()).ok(),
        _ => None,
    }
}

/// Whether output column `c` of `plan` is column `name` of the scan of
/// table `table` (protected or public), unchanged: followed through projections (only a
/// bare column, maybe aliased), filters, aliases, repartitions and joins by
/// position, never by name (a user column named like a domain or unit
/// column proves nothing).
pub fn from_scan(plan: &LogicalPlan, c: &datafusion::common::Column, table: &str, name: &str) -> bool {
    use LogicalPlan as P;
    use datafusion::common::Column;
    let Ok(i) = plan.schema().index_of_column(c) else { return false };
    let field_of = |p: &LogicalPlan, j: usize| {
        let (q, f) = p.schema().qualified_field(j);
        Column::from((q, f))
    };
    match plan {
        P::TableScan(s) => table_name(s) == table && s.projected_schema.field(i).name() == name,
        P::Projection(p) => match p.expr.get(i).map(|e| e.clone().unalias()) {
            Some(Expr::Column(inner)) => from_scan(&p.input, &inner, table, name),
            _ => false,
        },
        P::Filter(f) => from_scan(&f.input, c, table, name),
        P::Repartition(r) => from_scan(&r.input, c, table, name),
        P::SubqueryAlias(a) => from_scan(&a.input, &field_of(&a.input, i), table, name),
        P::Join(j) => {
            let l = j.left.schema().fields().len();
            match j.join_type {
                JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                    if i < l {
                        from_scan(&j.left, &field_of(&j.left, i), table, name)
                    } else {
                        from_scan(&j.right, &field_of(&j.right, i - l), table, name)
                    }
                }
                JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => {
                    i < l && from_scan(&j.left, &field_of(&j.left, i), table, name)
                }
                JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
                    i < j.right.schema().fields().len() && from_scan(&j.right, &field_of(&j.right, i), table, name)
                }
            }
        }
        _ => false,
    }
}

/// Checks the plan again after DataFusion's type coercion, where every
/// implicit cast is explicit (a text column compared with a number, IN and
/// BETWEEN operands, CASE branches): each must be unable to fail too.
/// Returns the coerced plan and its analysis: the engine plans and runs on
/// it, so every type it sees is the type the rows will have (before coercion
/// a CASE reports its first branch's type, e.g. Int64 for `THEN 1 ELSE 1e300`).
pub fn analyze_coerced(
    plan: &LogicalPlan,
    catalog: &Catalog,
    config: &datafusion::common::config::ConfigOptions,
) -> Result<(LogicalPlan, Analysis), Refusal> {
    use datafusion::optimizer::analyzer::AnalyzerRule;
    let coerced = datafusion::optimizer::analyzer::type_coercion::TypeCoercion::new()
        .analyze(plan.clone(), config)
        .map_err(|e| Refusal::new(K::MayFail, format!("the query does not type-check: {e}")))?;
    let analysis = analyze(&coerced, catalog)?;
    Ok((coerced, analysis))
}

/// Refuses a row expression on protected table `t` that could raise an
/// error on some row (see [`super::rowsafe`]).
fn cannot_fail(e: &Expr, schema: &datafusion::common::DFSchema, t: &str) -> Result<(), Refusal> {
    match super::rowsafe::may_fail(e, schema) {
        Some(why) => refuse(
            K::MayFail,
            format!(
                "{why}. On protected table {t} a row expression must not be able to fail: a failure on one row \
             would reveal that row (docs/PRIVACY.md §1)"
            ),
        ),
        None => Ok(()),
    }
}

impl Checker<'_> {
    fn is_protected(&self, name: &str) -> bool {
        self.catalog.tables.get(name).is_some_and(|t| !t.public)
    }

    fn flow(&mut self, plan: &LogicalPlan) -> Result<Flow, Refusal> {
        use LogicalPlan as P;
        match plan {
            P::TableScan(s) => {
                let name = table_name(s);
                if self.is_protected(&name) {
                    if s.fetch.is_some() {
                        return refuse(K::ExposesRows, format!("LIMIT pushed into protected table {name}"));
                    }
                    Ok(Flow::Protected(name))
                } else {
                    Ok(Flow::Public)
                }
            }
            P::EmptyRelation(_) | P::Values(_) => Ok(Flow::Public),
            P::Projection(p) => {
                let f = self.flow(&p.input)?;
                if let Flow::Protected(t) = &f {
                    for e in &p.expr {
                        if let Some(why) = find_forbidden_in_rows(e) {
                            return refuse(K::ExposesRows, format!("{why} (`{e}` on protected table {t})"));
                        }
                        cannot_fail(e, p.input.schema(), t)?;
                    }
                }
                Ok(f)
            }
            P::Filter(x) => {
                let f = self.flow(&x.input)?;
                if let Flow::Protected(t) = &f {
                    if let Some(why) = find_forbidden_in_rows(&x.predicate) {
                        return refuse(
                            K::ExposesRows,
                            format!("{why} (WHERE `{}` on protected table {t})", x.predicate),
                        );
                    }
                    cannot_fail(&x.predicate, x.input.schema(), t)?;
                }
                Ok(f)
            }
            P::SubqueryAlias(a) => self.flow(&a.input),
            P::Subquery(s) => self.flow(&s.subquery),
            P::Aggregate(a) => {
                let f = self.flow(&a.input)?;
                let dp: Vec<Option<String>> = a.aggr_expr.iter().map(is_dp_aggregate).collect();
                match f {
                    Flow::Protected(t) => {
                        for e in a.group_expr.iter().chain(&a.aggr_expr) {
                            cannot_fail(e, a.input.schema(), &t)?;
                        }
                        for (e, d) in a.aggr_expr.iter().zip(&dp) {
                            if d.is_none() {
                                return refuse(
                                    K::NotDpAggregate,
                                    format!(
                                        "non-DP aggregate `{e}` on protected table {t}: use dp_count, dp_sum, dp_avg, dp_var or dp_quantile"
                                    ),
                                );
                            }
                            if let Expr::AggregateFunction(f) = e.clone().unalias()
                                && f.params.distinct
                            {
                                return refuse(
                                    K::NotDpAggregate,
                                    format!("DISTINCT inside `{e}` is not supported (it breaks contribution bounds)"),
                                );
                            }
                        }
                        if a.aggr_expr.is_empty() {
                            return refuse(
                                K::NotDpAggregate,
                                format!(
                                    "GROUP BY/DISTINCT without a DP aggregate on protected table {t} would release the set of keys"
                                ),
                            );
                        }
                        if a.group_expr.iter().any(|g| matches!(g, Expr::GroupingSet(_))) {
                            return refuse(
                                K::Unsupported,
                                "GROUPING SETS / ROLLUP / CUBE over protected data are not supported",
                            );
                        }
                        if let Some((_, other)) = &self.aggregate {
                            return refuse(
                                K::RepeatedAggregation,
                                format!(
                                    "more than one DP aggregation in one query (tables {other} and {t}): run them as separate queries"
                                ),
                            );
                        }
                        self.aggregate = Some((a.clone(), t));
                        Ok(Flow::Released)
                    }
                    other => {
                        if let Some(Some(name)) = dp.iter().find(|d| d.is_some()) {
                            return refuse(
                                K::NotDpAggregate,
                                format!("{name} applied to data that is not a protected table's rows"),
                            );
                        }
                        Ok(other)
                    }
                }
            }
            P::Window(w) => {
                let f = self.flow(&w.input)?;
                for e in &w.window_expr {
                    let mut dp = None;
                    let _ = e.apply(|x| {
                        if let Expr::WindowFunction(wf) = x {
                            let n = wf.fun.to_string();
                            if DP_AGGREGATES.iter().any(|d| n.contains(d)) {
                                dp = Some(n);
                                return Ok(TreeNodeRecursion::Stop);
                            }
                        }
                        Ok(TreeNodeRecursion::Continue)
                    });
                    if let Some(n) = dp {
                        return refuse(
                            K::NotDpAggregate,
                            format!(
                                "DP aggregate {n} used as a window function (`{e}`): it would be evaluated once per row"
                            ),
                        );
                    }
                }
                if let Flow::Protected(t) = &f {
                    return refuse(
                        K::ExposesRows,
                        format!("window function over protected rows of {t} (`{}`)", w.window_expr[0]),
                    );
                }
                Ok(f)
            }
            P::Sort(s) => {
                let f = self.flow(&s.input)?;
                if let Flow::Protected(t) = &f {
                    return refuse(K::ExposesRows, format!("ORDER BY on protected rows of {t} before aggregation"));
                }
                Ok(f)
            }
            P::Limit(l) => {
                let f = self.flow(&l.input)?;
                if let Flow::Protected(t) = &f {
                    return refuse(K::ExposesRows, format!("LIMIT/OFFSET on protected rows of {t} before aggregation"));
                }
                Ok(f)
            }
            P::Distinct(d) => {
                let f = self.flow(d.input())?;
                if let Flow::Protected(t) = &f {
                    return refuse(
                        K::ExposesRows,
                        format!("DISTINCT on protected rows of {t} would release their values"),
                    );
                }
                Ok(f)
            }
            P::Repartition(r) => {
                let f = self.flow(&r.input)?;
                if let Flow::Protected(t) = &f {
                    for e in plan.expressions() {
                        cannot_fail(&e, r.input.schema(), t)?;
                    }
                }
                Ok(f)
            }
            P::Join(j) => {
                let l = self.flow(&j.left)?;
                let r = self.flow(&j.right)?;
                match (&l, &r) {
                    (Flow::Protected(a), Flow::Protected(b)) => refuse(
                        K::MultipliesRows,
                        format!(
                            "join between protected tables {a} and {b}: one person's rows could be multiplied, breaking contribution bounds"
                        ),
                    ),
                    (Flow::Protected(t), Flow::Public) | (Flow::Public, Flow::Protected(t)) => {
                        let protected_left = matches!(l, Flow::Protected(_));
                        let ok_type = match j.join_type {
                            JoinType::Inner => true,
                            JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti => protected_left,
                            JoinType::Right | JoinType::RightSemi | JoinType::RightAnti => !protected_left,
                            _ => false,
                        };
                        if !ok_type {
                            return refuse(
                                K::MultipliesRows,
                                format!(
                                    "{} join of protected table {t} with a public table could add rows not derived from {t}",
                                    j.join_type
                                ),
                            );
                        }
                        let both = expression_schema(plan).ok_or_else(|| {
                            Refusal::new(K::Unsupported, format!("internal: join schema of protected table {t}"))
                        })?;
                        for (a, b) in &j.on {
                            // As a comparison, so a text = number key (which casts the text) is refused.
                            cannot_fail(&a.clone().eq(b.clone()), &both, t)?;
                        }
                        if let Some(f) = &j.filter {
                            cannot_fail(f, &both, t)?;
                        }
                        let (public_side, protected_side) =
                            if protected_left { (&j.right, &j.left) } else { (&j.left, &j.right) };
                        let public_schema = public_side.schema();
                        let protected_schema = protected_side.schema();
                        // Equality keys from ON pairs or from the join filter's conjuncts.
                        let mut pairs: Vec<(Expr, Expr)> = j.on.clone();
                        if let Some(f) = &j.filter {
                            for c in datafusion::logical_expr::utils::split_conjunction(f) {
                                if let Expr::BinaryExpr(b) = c
                                    && b.op == datafusion::logical_expr::Operator::Eq
                                {
                                    pairs.push(((*b.left).clone(), (*b.right).clone()));
                                }
                            }
                        }
                        // A key pair equates an expression over the public side only with
                        // one over the protected side only; conjuncts within one side
                        // (`p.w = p.v`) only filter and are not keys.
                        let only_in = |e: &Expr, schema: &datafusion::common::DFSchema| {
                            let cols = e.column_refs();
                            !cols.is_empty() && cols.iter().all(|c| schema.has_column(c))
                        };
                        let mut keys: Vec<Expr> = Vec::new();
                        for (a, b) in &pairs {
                            let (public_key, protected_key) =
                                if only_in(a, public_schema) && only_in(b, protected_schema) {
                                    (a, b)
                                } else if only_in(b, public_schema) && only_in(a, protected_schema) {
                                    (b, a)
                                } else {
                                    continue;
                                };
                            // Uniqueness is checked on the key's own values; a join that
                            // coerces one side (Int64 → Float64) could make distinct keys equal.
                            let (pt, qt) =
                                (public_key.get_type(public_schema), protected_key.get_type(protected_schema));
                            if !matches!((&pt, &qt), (Ok(x), Ok(y)) if x == y) {
                                return refuse(
                                    K::MultipliesRows,
                                    format!(
                                        "join key `{public_key}` and `{protected_key}` have different types ({} and {}): \
                                     cast the public side's key to the protected side's type",
                                        pt.map_or("?".into(), |t| t.to_string()),
                                        qt.map_or("?".into(), |t| t.to_string())
                                    ),
                                );
                            }
                            keys.push(public_key.clone());
                        }
                        if keys.is_empty() {
                            return refuse(
                                K::MultipliesRows,
                                format!(
                                    "join of protected table {t} with a public relation without an equality key between \
                                 them (a cross join multiplies rows)"
                                ),
                            );
                        }
                        // Whether the public side is evaluated at all can depend on the
                        // protected rows (a hash join skips its probe side when the build
                        // side is empty), so it must not be able to fail either.
                        public_cannot_fail(public_side, self.catalog, t)?;
                        self.public_joins.push(PublicJoin { plan: public_side.as_ref().clone(), keys });
                        Ok(Flow::Protected(t.clone()))
                    }
                    (Flow::Released, Flow::Protected(t)) | (Flow::Protected(t), Flow::Released) => {
                        refuse(K::ExposesRows, format!("join of released results with protected rows of {t}"))
                    }
                    (Flow::Released, _) | (_, Flow::Released) => Ok(Flow::Released),
                    _ => Ok(Flow::Public),
                }
            }
            P::Union(u) => {
                let flows = u.inputs.iter().map(|i| self.flow(i)).collect::<Result<Vec<_>, _>>()?;
                if let Some(Flow::Protected(t)) = flows.iter().find(|f| matches!(f, Flow::Protected(_))) {
                    return refuse(K::ExposesRows, format!("UNION/INTERSECT/EXCEPT with protected rows of {t}"));
                }
                Ok(if flows.contains(&Flow::Released) { Flow::Released } else { Flow::Public })
            }
            P::RecursiveQuery(_) => refuse(K::Unsupported, "recursive queries are not supported"),
            P::Unnest(u) => {
                let f = self.flow(&u.input)?;
                if let Flow::Protected(t) = &f {
                    return refuse(K::MultipliesRows, format!("UNNEST on protected rows of {t} multiplies rows"));
                }
                Ok(f)
            }
            other => refuse(K::Unsupported, format!("{} is not allowed in a DP query", other.display())),
        }
    }
}

/// The base table under a chain of projections/filters/aliases, if any.
/// The table a plan reads, through projections, filters and aliases.
pub(super) fn base_table(plan: &LogicalPlan) -> Option<String> {
    match plan {
        LogicalPlan::TableScan(s) => Some(table_name(s)),
        LogicalPlan::Projection(p) => base_table(&p.input),
        LogicalPlan::Filter(f) => base_table(&f.input),
        LogicalPlan::SubqueryAlias(a) => base_table(&a.input),
        _ => None,
    }
}

/// Checks a (unoptimised) logical plan.
pub fn analyze(plan: &LogicalPlan, catalog: &Catalog) -> Result<Analysis, Refusal> {
    // Protected tables inside subquery expressions are never allowed.
    let mut in_subquery = None;
    let _ = plan.apply(|node| {
        for e in node.expressions() {
            let _ = e.apply(|x| {
                let sub = match x {
                    Expr::ScalarSubquery(s) => Some(&s.subquery),
                    Expr::InSubquery(s) => Some(&s.subquery.subquery),
                    Expr::Exists(s) => Some(&s.subquery.subquery),
                    _ => None,
                };
                if let Some(sub) = sub {
                    let _ = sub.apply(|n| {
                        if let LogicalPlan::TableScan(s) = n {
                            let name = table_name(s);
                            if catalog.tables.get(&name).is_some_and(|t| !t.public) {
                                in_subquery = Some(name);
                            }
                        }
                        Ok(TreeNodeRecursion::Continue)
                    });
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if let Some(t) = in_subquery {
        return refuse(
            K::Unsupported,
            format!("protected table {t} used inside a subquery expression (IN/EXISTS/scalar subquery)"),
        );
    }
    let mut c = Checker { catalog, aggregate: None, public_joins: vec![] };
    match c.flow(plan)? {
        Flow::Protected(t) => refuse(
            K::ExposesRows,
            format!(
                "the query returns rows of protected table {t}: only DP aggregates (dp_count, dp_sum, ...) may read it"
            ),
        ),
        Flow::Public => {
            refuse(K::NoProtectedTable, "the query reads no protected table: run it in an ordinary SQL engine")
        }
        Flow::Released => {
            let (aggregate, table) = c.aggregate.expect("released implies an aggregate");
            Ok(Analysis { aggregate, table, public_joins: c.public_joins })
        }
    }
}

/// Call-site ids of every DP aggregate in the plan (duplicates mean the same
/// call would be evaluated twice).
pub fn site_ids(plan: &LogicalPlan) -> Vec<String> {
    let mut out = Vec::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::Aggregate(a) = node {
            for e in &a.aggr_expr {
                if let Expr::AggregateFunction(f) = e.clone().unalias()
                    && DP_AGGREGATES.contains(&f.func.name())
                    && let Some(Expr::Literal(v, _)) = f.params.args.last()
                {
                    out.push(v.to_string());
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// Refuses plans where a DP call site appears more than once.
pub fn no_duplicate_sites(plan: &LogicalPlan) -> Result<(), Refusal> {
    let mut seen = HashSet::new();
    for s in site_ids(plan) {
        if !seen.insert(s.clone()) {
            return refuse(
                K::RepeatedAggregation,
                "a DP aggregate would be evaluated twice (a CTE or view containing it is referenced more than once): \
                 compute it once and reuse the released value",
            );
        }
    }
    Ok(())
}

/// Counts of tables by role (for messages).
pub fn roles(catalog: &Catalog) -> BTreeMap<String, bool> {
    catalog.tables.iter().map(|(k, v)| (k.clone(), v.public)).collect()
}
