//! The DP SQL engine: plan-time costing and charging, contribution bounding,
//! exact helper aggregation executed once, noise drawn once in our own code,
//! public-domain keys or DP partition selection, and post-processing over
//! the released values.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::execution::context::SessionContext;
use datafusion::functions_aggregate::expr_fn::{count, count_distinct, sum};
use datafusion::logical_expr::ExprSchemable;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Aggregate, Expr, ExprFunctionExt, LogicalPlan, LogicalPlanBuilder, cast, col, lit, try_cast, when,
};
use dpflow_udfs::domain::ColumnKind;
use dpflow_udfs::noise::{DpRng, ExponentialMechanism, NoiseDistribution};
use serde::Serialize;

use super::catalog::{Catalog, PrivacyUnit, TableEntry};
use super::check::{analyze, no_duplicate_sites};
use super::sites::{CallSite, SiteBudget, prepare};
use crate::privacy::convert::cdp_rho;
use crate::privacy::ledger::Reservation;
use crate::privacy::{Budget, Ledger, MechanismRecord, PrivacyLoss, charge_failure};

/// Largest number of public-domain keys a GROUP BY may enumerate.
const MAX_DOMAIN_KEYS: usize = 1_000_000;

/// The statistic a DP call computes.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Count { arg: Option<Expr> },
    Sum { arg: Expr, lo: f64, hi: f64 },
    Avg { arg: Expr, lo: f64, hi: f64 },
    Var { arg: Expr, lo: f64, hi: f64 },
    Quantile { arg: Expr, q: f64, lo: f64, hi: f64 },
}

/// How a call site is noised.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Share {
    Eps(f64),
    Rho(f64),
}

/// A planned DP aggregate.
#[derive(Debug, Clone)]
struct Planned {
    /// Output field name in the aggregate's schema.
    field: String,
    kind: Kind,
    /// Noise per sub-statistic (in the statistic's own units).
    noise: Vec<NoiseDistribution>,
    /// Grid exponent for real-valued sums (values are summed as integers of 2^k).
    grid: i32,
    /// Records charged.
    records: Vec<MechanismRecord>,
    /// Helper aggregate column names.
    helpers: Vec<String>,
    /// Quantile: the exponential mechanism's ε per group, bin count, and score
    /// sensitivity (one unit moves each score by up to `max_rows_per_unit`).
    quantile: Option<(f64, usize, f64)>,
}

/// One row of EXPLAIN output.
#[derive(Debug, Clone, Serialize)]
pub struct ExplainRow {
    /// What is computed.
    pub aggregate: String,
    /// Mechanism.
    pub mechanism: String,
    /// Sensitivity (L1 for Laplace, L2 for Gaussian, score sensitivity for EM).
    pub sensitivity: Option<f64>,
    /// Noise scale (Laplace b or Gaussian σ) on the answer's scale.
    pub noise_scale: Option<f64>,
    /// Privacy loss.
    pub loss: String,
}

/// What a query returns.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// Result batches (noisy values and post-processing).
    pub batches: Vec<RecordBatch>,
    /// Mechanisms charged (or that would be, for EXPLAIN).
    pub mechanisms: Vec<MechanismRecord>,
    /// EXPLAIN rows (only for EXPLAIN).
    pub explain: Option<Vec<ExplainRow>>,
    /// Ledger charge id, if charged.
    pub charge_id: Option<i64>,
    /// Remaining budget after the query (ledger unit), if charged.
    pub remaining: Option<f64>,
}

/// A DP SQL session over a catalog.
pub struct SqlEngine {
    ctx: SessionContext,
    catalog: Catalog,
    ledger: Option<Ledger>,
    rng: DpRng,
    unsafe_seed: Option<u64>,
    counter: u64,
    /// The caller (a release pipeline) has reserved the budget already.
    precharged: bool,
    /// Groups summing at least this many values are re-aggregated with 128-bit sums.
    wide_from: i128,
}

/// A number literal argument (a public constant), or an error naming `what` and `func`.
pub(super) fn parse_f64(e: &Expr, what: &str, func: &str) -> Result<f64> {
    let v = match e.clone().unalias() {
        Expr::Literal(v, _) => v,
        Expr::Negative(inner) => match *inner {
            Expr::Literal(v, _) => {
                ScalarValue::Float64(Some(-ScalarValue::cast_to(&v, &DataType::Float64)?.to_string().parse::<f64>()?))
            }
            _ => bail!("{func}: {what} must be a number literal, got `{e}`"),
        },
        _ => bail!("{func}: {what} must be a number literal (a public constant), got `{e}`"),
    };
    let f = v.cast_to(&DataType::Float64).ok().and_then(|v| match v {
        ScalarValue::Float64(Some(f)) => Some(f),
        _ => None,
    });
    match f {
        Some(f) if f.is_finite() => Ok(f),
        _ => bail!("{func}: {what} must be a finite number, got `{e}`"),
    }
}

/// The call-site id of a tagged DP call (its last argument).
pub(super) fn site_of(args: &[Expr]) -> Result<usize> {
    match args.last() {
        Some(Expr::Literal(ScalarValue::Utf8(Some(s)), _)) => {
            s.strip_prefix("__dp_site_").and_then(|x| x.parse().ok()).context("internal: malformed DP call-site tag")
        }
        _ => bail!("internal: DP call without a site tag"),
    }
}

/// Refuses DP aggregate arguments that are not numbers (their helper
/// expressions cast to numbers, which could fail on a row).
fn check_dp_arguments(agg: &Aggregate) -> Result<()> {
    for e in &agg.aggr_expr {
        let Expr::AggregateFunction(f) = e.clone().unalias() else { continue };
        let name = f.func.name();
        if name == "dp_count" {
            continue;
        }
        if let Some(arg) = f.params.args.first() {
            let t = arg.get_type(agg.input.schema())?;
            if !super::rowsafe::is_number(&t) {
                bail!("refused: {name} needs a numeric argument, got `{arg}` of type {t}");
            }
        }
    }
    Ok(())
}

fn clamp_expr(e: Expr, lo: f64, hi: f64) -> Expr {
    // Numeric arguments only (checked at plan time); TRY_CAST so even so nothing can fail on a row.
    let x = try_cast(e, DataType::Float64);
    when(x.clone().lt(lit(lo)), lit(lo)).when(x.clone().gt(lit(hi)), lit(hi)).otherwise(x).expect("valid CASE")
}

/// round(v / 2^k) as Int64, or null where that cannot be converted (NaN):
/// a helper expression must not fail on a row (docs/PRIVACY.md §1).
fn to_units(v: Expr, k: i32) -> Expr {
    try_cast(datafusion::functions::math::expr_fn::round(vec![v / lit(2f64.powi(k))]), DataType::Int64)
}

/// Exact 128-bit accumulation: Int64 values summed as Decimal128(38, 0)
/// (i128). With |row| < 2⁶³ and fewer than 2⁶³ rows a sum of values below
/// 2⁴³ (grid units) or 2⁶² (squares of exact integers) stays below 2¹²⁶, so
/// no sum wraps and no refusal ever depends on the data.
fn sum_i128(v: Expr) -> Expr {
    sum(cast(v, DataType::Decimal128(38, 0)))
}

impl SqlEngine {
    /// Opens a session: registers the catalog's tables (protected ones typed
    /// through their domain, with the privacy-unit column passed through), the
    /// DP functions, and the ledger.
    pub async fn open(catalog: Catalog, unsafe_seed: Option<u64>) -> Result<Self> {
        if unsafe_seed.is_some() && catalog.ledger.is_some() {
            bail!(crate::privacy::SEEDED_LEDGER_REFUSAL);
        }
        let ctx = crate::io::session_context();
        for f in dpflow_udfs::dp::dp_aggregates() {
            ctx.register_udaf(f);
        }
        for f in dpflow_udfs::dp::ci_markers() {
            ctx.register_udf(f);
        }
        ctx.register_udf(datafusion::logical_expr::ScalarUDF::from(dpflow_udfs::dp::KeyedHash::default()));
        for t in catalog.tables.values() {
            let raw = t.dataset.raw(&ctx).await?.into_view();
            let passthrough = match &t.unit {
                PrivacyUnit::Column(c) => vec![c.clone()],
                PrivacyUnit::Row => vec![],
            };
            let typed =
                dpflow_udfs::domain::EncodedTable::typed_with(raw, Arc::new(t.dataset.domain().clone()), passthrough)
                    .with_context(|| format!("table {}", t.name))?;
            ctx.register_table(t.name.as_str(), Arc::new(typed))?;
        }
        let ledger = match &catalog.ledger {
            None => None,
            Some(p) if !p.exists() && catalog.create_ledger.is_some() => {
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).ok();
                }
                let l = Ledger::create(p)?;
                for (ds, b) in catalog.create_ledger.as_ref().expect("checked") {
                    l.add_dataset(ds, "row", *b)?;
                }
                eprintln!(
                    "note: created ledger {} with the catalog's demo budgets (create_ledger_if_missing)",
                    p.display()
                );
                Some(l)
            }
            Some(p) => Some(Ledger::open(p)?),
        };
        Ok(Self {
            ctx,
            catalog,
            ledger,
            rng: DpRng::new(unsafe_seed)?,
            unsafe_seed,
            counter: 0,
            precharged: false,
            wide_from: 1 << 32,
        })
    }

    /// A session whose caller accounts for every query itself (a release
    /// pipeline reserves its whole budget before running any step): queries
    /// are not charged to a ledger here.
    pub async fn open_precharged(mut catalog: Catalog, unsafe_seed: Option<u64>) -> Result<Self> {
        catalog.ledger = None;
        catalog.create_ledger = None;
        let mut e = Self::open(catalog, unsafe_seed).await?;
        e.precharged = true;
        Ok(e)
    }

    /// The mechanisms a query would charge (plans it; reads no data).
    pub async fn cost(&mut self, sql: &str, budget: Option<Budget>) -> Result<Vec<MechanismRecord>> {
        Ok(self.query_inner(sql, budget, true).await?.mechanisms)
    }

    /// Tests only: re-aggregate with 128-bit sums from `n` summed values per
    /// group (default 2³², below which 64-bit sums are exact).
    #[doc(hidden)]
    pub fn set_wide_sums_from(&mut self, n: i128) {
        self.wide_from = n;
    }

    /// The DataFusion session (tables and functions registered).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    fn table(&self, name: &str) -> Result<&TableEntry> {
        self.catalog.tables.get(name).with_context(|| format!("unknown table {name}"))
    }

    /// Runs (or explains) one query with `budget` (default: the catalog's query budget).
    pub async fn query(&mut self, sql: &str, budget: Option<Budget>) -> Result<QueryResult> {
        self.query_inner(sql, budget, false).await
    }

    async fn query_inner(&mut self, sql: &str, budget: Option<Budget>, force_explain: bool) -> Result<QueryResult> {
        let prepared = prepare(sql)?;
        let plan = self.ctx.state().create_logical_plan(&prepared.sql).await?;
        no_duplicate_sites(&plan)?;
        if super::imputed::uses_imputed(&prepared.sites) {
            return self.imputed_query(&plan, &prepared, budget, force_explain).await;
        }
        let analysis = analyze(&plan, &self.catalog)?;
        // Again after type coercion: implicit casts must not be able to fail either.
        super::check::analyze_coerced(&plan, &self.catalog, self.ctx.state().config_options())?;
        let entry = self.table(&analysis.table)?.clone();
        if let Some(why) = entry.dataset.domain().dp_read_refusal() {
            bail!("refused: table {}: {why}", entry.name);
        }
        for j in &analysis.public_joins {
            self.check_unique_keys(j).await?;
        }
        let agg = analysis.aggregate.clone();
        let unit = self.unit_column(&agg, &entry)?;
        check_dp_arguments(&agg)?;
        // Plan errors that do not depend on the data (a literal that does not convert)
        // surface here, before anything is charged.
        self.ctx.state().optimize(&plan)?;
        let budget = budget.or(self.catalog.query_budget);
        // Domain-enumerable GROUP BY keys, else partition selection.
        let domain_keys = self.domain_keys(&agg, &entry)?;
        let needs_selection = !agg.group_expr.is_empty() && domain_keys.is_none();
        let (planned, selection) = self.plan_costs(&agg, &entry, &prepared.sites, budget, needs_selection)?;
        let mut records: Vec<MechanismRecord> = planned.iter().flat_map(|p| p.records.clone()).collect();
        if let Some((rec, _, _)) = &selection {
            records.push(rec.clone());
        }
        if prepared.explain || force_explain {
            return Ok(explained(records));
        }
        // Reserve before touching data; refuse if it does not fit.
        let reservation = self.reserve(&entry.ledger_dataset, &records)?;
        let outcome = self.execute(&plan, &agg, &entry, unit.as_ref(), &planned, domain_keys, selection.as_ref()).await;
        self.settle(outcome, reservation, records)
    }

    /// Reserves `records` in the ledger before any data is read (refusing a
    /// query that does not fit), or checks that running unrecorded is allowed.
    fn reserve(&mut self, dataset: &str, records: &[MechanismRecord]) -> Result<Option<Reservation>> {
        self.counter += 1;
        let release_id =
            format!("sql-{}-{}-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"), std::process::id(), self.counter);
        match self.ledger.as_mut() {
            Some(l) => Ok(Some(l.reserve(dataset, &release_id, records, None)?)),
            None => {
                if self.unsafe_seed.is_none() && !self.precharged {
                    bail!("the catalog has no ledger: DP queries must be charged to a ledger");
                }
                Ok(None)
            }
        }
    }

    /// Commits the reservation when the query succeeded. A failure happens
    /// after protected data was read, so it is charged too (status `failed`)
    /// and its message is replaced by one that depends on public inputs only
    /// ([`crate::privacy::failure`]).
    fn settle(
        &self,
        outcome: Result<Vec<RecordBatch>>,
        reservation: Option<Reservation>,
        records: Vec<MechanismRecord>,
    ) -> Result<QueryResult> {
        match (outcome, reservation) {
            (Ok(batches), Some(r)) => {
                let l = self.ledger.as_ref().expect("reserved");
                l.commit(r.charge_id)?;
                Ok(QueryResult {
                    batches,
                    mechanisms: records,
                    explain: None,
                    charge_id: Some(r.charge_id),
                    remaining: Some(r.remaining),
                })
            }
            (Ok(batches), None) => {
                Ok(QueryResult { batches, mechanisms: records, explain: None, charge_id: None, remaining: None })
            }
            (Err(e), Some(r)) => {
                let l = self.ledger.as_ref().expect("reserved");
                Err(charge_failure("query", Some((l, r.charge_id)), e))
            }
            (Err(e), None) => Err(charge_failure("query", None, e)),
        }
    }

    /// A `dp_imputed_*` query (see [`super::imputed`]): plan and charge, impute
    /// inside the engine, release each statistic with smooth-sensitivity noise.
    async fn imputed_query(
        &mut self,
        plan: &LogicalPlan,
        prepared: &super::sites::Prepared,
        budget: Option<Budget>,
        force_explain: bool,
    ) -> Result<QueryResult> {
        use crate::impute::{Estimator, query_records};
        let ip =
            super::imputed::plan_imputed(plan, &self.catalog, &prepared.sites, budget.or(self.catalog.query_budget))?;
        if let Some(why) = ip.table.dataset.domain().dp_read_refusal() {
            bail!("refused: table {}: {why}", ip.table.name);
        }
        let records: Vec<MechanismRecord> = ip
            .calls
            .iter()
            .flat_map(|(q, eps)| query_records(q, Estimator::Smooth, &PrivacyLoss::Pure { epsilon: *eps }))
            .collect();
        if prepared.explain || force_explain {
            // The smooth bound (hence the noise scale) is data-dependent: not shown.
            return Ok(explained(records));
        }
        let reservation = self.reserve(&ip.table.ledger_dataset, &records)?;
        let outcome = self.run_imputed(&ip).await;
        self.settle(outcome, reservation, records)
    }

    async fn run_imputed(&mut self, ip: &super::imputed::ImputedPlan) -> Result<Vec<RecordBatch>> {
        let imp = ip.table.impute.as_ref().expect("checked by plan_imputed");
        let queries: Vec<_> = ip.calls.iter().map(|(q, _)| q.clone()).collect();
        let data = crate::impute::prepare_on(&self.ctx, &ip.table.dataset, imp, &queries).await?;
        let mut values = Vec::new();
        for (q, eps) in &ip.calls {
            let r = crate::impute::answer(
                &data,
                std::slice::from_ref(q),
                crate::impute::Estimator::Smooth,
                *eps,
                None,
                &mut self.rng,
            )?;
            values.push(r[0].value);
        }
        let fields: Vec<Field> = ip.outputs.iter().map(|(n, _)| Field::new(n, DataType::Float64, true)).collect();
        let columns: Vec<ArrayRef> = ip
            .outputs
            .iter()
            .map(|(_, i)| Arc::new(datafusion::arrow::array::Float64Array::from(vec![values[*i]])) as ArrayRef)
            .collect();
        Ok(vec![RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?])
    }

    /// A join with a public relation must not multiply protected rows: its ON
    /// keys must be unique on the public side *as planned* (reads public data
    /// only; runs before anything is charged).
    async fn check_unique_keys(&self, join: &super::check::PublicJoin) -> Result<()> {
        let keys: Vec<Expr> = join.keys.iter().enumerate().map(|(i, k)| k.clone().alias(format!("__k{i}"))).collect();
        let dup = LogicalPlanBuilder::from(join.plan.clone())
            .aggregate(keys, vec![count(lit(1)).alias("__n")])?
            .filter(col("__n").gt(lit(1i64)))?
            .limit(0, Some(1))?
            .build()?;
        let b = self.ctx.execute_logical_plan(dup).await?.collect().await?;
        if b.iter().any(|b| b.num_rows() > 0) {
            let list = join.keys.iter().map(|k| format!("{k}")).collect::<Vec<_>>().join(", ");
            bail!(
                "refused: the join keys ({list}) are not unique on the public side of the join: a protected row \
                 could match several public rows and be counted more than once. Join on a key that is unique in the \
                 public relation (deduplicate it first)"
            );
        }
        Ok(())
    }

    /// The privacy-unit column as it reaches the aggregation (None for row
    /// units). It must be the protected scan's own unit column, proven by
    /// provenance: a query could otherwise rename another column (or NULL,
    /// or random()) to the unit's name and make every row its own unit.
    fn unit_column(&self, agg: &Aggregate, entry: &TableEntry) -> Result<Option<Column>> {
        let PrivacyUnit::Column(unit) = &entry.unit else { return Ok(None) };
        let named: Vec<Column> = agg.input.schema().columns().into_iter().filter(|c| &c.name == unit).collect();
        match named.as_slice() {
            [c] if super::check::from_scan(&agg.input, c, &entry.name, unit) => Ok(Some(c.clone())),
            [] => bail!(
                "refused: the privacy unit column {unit:?} of table {} must reach the aggregation: keep it in \
                 every subquery's SELECT list",
                entry.name
            ),
            _ => bail!(
                "refused: the column {unit:?} reaching the aggregation must be table {}'s own privacy unit column, \
                 unchanged (not renamed from another column or computed, and not ambiguous with a joined column)",
                entry.name
            ),
        }
    }

    /// Public-domain keys for the GROUP BY, when every key column is a raw
    /// protected column with an enumerable domain.
    fn domain_keys(&self, agg: &Aggregate, entry: &TableEntry) -> Result<Option<Vec<Vec<ScalarValue>>>> {
        if agg.group_expr.is_empty() {
            return Ok(Some(vec![vec![]]));
        }
        let mut per_col: Vec<Vec<ScalarValue>> = Vec::new();
        for g in &agg.group_expr {
            let Expr::Column(c) = g.clone().unalias() else { return Ok(None) };
            // A column of a joined public table has that table's public domain.
            let source = match source_table(&agg.input, &c).and_then(|t| self.catalog.tables.get(&t)) {
                Some(t) if t.public => t,
                _ => entry,
            };
            let Some(column) = source.dataset.domain().column(&c.name) else { return Ok(None) };
            // Only if the column is that table's own column, unchanged (by provenance, not name).
            if !super::check::from_scan(&agg.input, &c, &source.name, &c.name) {
                return Ok(None);
            }
            let mut vals: Vec<ScalarValue> = match &column.kind {
                ColumnKind::Categorical { values, .. } => {
                    values.iter().map(|v| ScalarValue::Utf8(Some(v.clone()))).collect()
                }
                ColumnKind::Boolean => vec![ScalarValue::Boolean(Some(false)), ScalarValue::Boolean(Some(true))],
                ColumnKind::Integer { edges } if edges.windows(2).all(|w| w[1] - w[0] == 1) => {
                    (edges[0]..edges[edges.len() - 1]).map(|v| ScalarValue::Int64(Some(v))).collect()
                }
                _ => return Ok(None),
            };
            if column.nullable {
                vals.push(ScalarValue::try_from(match column.kind {
                    ColumnKind::Categorical { .. } => DataType::Utf8,
                    ColumnKind::Boolean => DataType::Boolean,
                    _ => DataType::Int64,
                })?);
            }
            per_col.push(vals);
        }
        let total: f64 = per_col.iter().map(|v| v.len() as f64).product();
        if total > MAX_DOMAIN_KEYS as f64 {
            bail!("refused: the GROUP BY enumerates {total} public keys (limit {MAX_DOMAIN_KEYS})");
        }
        let mut keys: Vec<Vec<ScalarValue>> = vec![vec![]];
        for vals in per_col {
            keys = keys
                .into_iter()
                .flat_map(|k| {
                    vals.iter().map(move |v| {
                        let mut k2 = k.clone();
                        k2.push(v.clone());
                        k2
                    })
                })
                .collect();
        }
        Ok(Some(keys))
    }

    #[allow(clippy::type_complexity)]
    fn plan_costs(
        &self,
        agg: &Aggregate,
        entry: &TableEntry,
        sites: &[CallSite],
        budget: Option<Budget>,
        needs_selection: bool,
    ) -> Result<(Vec<Planned>, Option<(MechanismRecord, f64, i128)>)> {
        let grouped = !agg.group_expr.is_empty();
        let l0 = if grouped { entry.max_groups_per_unit as f64 } else { 1.0 };
        let linf = match entry.unit {
            PrivacyUnit::Row => 1.0,
            PrivacyUnit::Column(_) => entry.max_rows_per_unit as f64,
        };
        let l0 = if entry.unit == PrivacyUnit::Row { 1.0 } else { l0 };
        // Parse calls in aggregate order.
        let mut calls = Vec::new();
        for (i, e) in agg.aggr_expr.iter().enumerate() {
            let Expr::AggregateFunction(f) = e.clone().unalias() else { bail!("internal: not an aggregate") };
            let name = f.func.name().to_string();
            let args = &f.params.args;
            let site = site_of(args)?;
            let a = &args[..args.len() - 1];
            let nargs = |n: usize, sig: &str| -> Result<()> {
                if a.len() != n {
                    bail!("{name} takes ({sig}), got {} arguments", a.len());
                }
                Ok(())
            };
            let bounds = |lo_e: &Expr, hi_e: &Expr| -> Result<(f64, f64)> {
                let lo = parse_f64(lo_e, "the lower bound", &name)?;
                let hi = parse_f64(hi_e, "the upper bound", &name)?;
                if lo >= hi {
                    bail!("{name}: the lower bound {lo} must be below the upper bound {hi}");
                }
                Ok((lo, hi))
            };
            let kind = match name.as_str() {
                "dp_count" => {
                    nargs(1, "* | column")?;
                    let is_star = matches!(&a[0], Expr::Literal(v, _) if v.to_string() == "1");
                    Kind::Count { arg: (!is_star).then(|| a[0].clone()) }
                }
                "dp_sum" | "dp_avg" | "dp_var" => {
                    nargs(3, "column, lo, hi")?;
                    let (lo, hi) = bounds(&a[1], &a[2])?;
                    match name.as_str() {
                        "dp_sum" => Kind::Sum { arg: a[0].clone(), lo, hi },
                        "dp_avg" => Kind::Avg { arg: a[0].clone(), lo, hi },
                        _ => Kind::Var { arg: a[0].clone(), lo, hi },
                    }
                }
                "dp_quantile" => {
                    nargs(4, "column, q, lo, hi")?;
                    let q = parse_f64(&a[1], "q", &name)?;
                    if !(0.0..=1.0).contains(&q) {
                        bail!("dp_quantile: q must be in [0, 1], got {q}");
                    }
                    let (lo, hi) = bounds(&a[2], &a[3])?;
                    Kind::Quantile { arg: a[0].clone(), q, lo, hi }
                }
                other => bail!("internal: unknown DP function {other}"),
            };
            let field = agg.schema.field(agg.group_expr.len() + i).name().clone();
            calls.push((i, site, name, kind, field));
        }
        // Shares.
        let explicit: Vec<Option<SiteBudget>> =
            calls.iter().map(|c| sites.iter().find(|s| s.id == c.1).and_then(|s| s.budget)).collect();
        let n_explicit = explicit.iter().filter(|e| e.is_some()).count();
        if n_explicit != 0 && n_explicit != calls.len() {
            bail!("give a budget share (epsilon => or rho =>) to every DP aggregate of the query, or to none");
        }
        let mut selection = None;
        let shares: Vec<Share> = if n_explicit == calls.len() {
            if needs_selection {
                let Some(Budget::Approx { epsilon, delta }) = budget else {
                    bail!(
                        "refused: GROUP BY keys without a public domain need DP partition selection, which needs an (ε, δ) query budget (--epsilon with --delta)"
                    );
                };
                selection = Some((epsilon, delta));
            }
            explicit
                .iter()
                .map(|e| match e.expect("all explicit") {
                    SiteBudget::Epsilon(x) => Share::Eps(x),
                    SiteBudget::Rho(x) => Share::Rho(x),
                })
                .collect()
        } else {
            let b = budget.context(
                "no budget: give --epsilon [--delta] or --rho, per-aggregate shares, or a query_budget in the catalog",
            )?;
            let k = calls.len() as f64;
            match b {
                Budget::Pure { epsilon } => {
                    if needs_selection {
                        bail!(
                            "refused: GROUP BY keys without a public domain need DP partition selection, which needs δ > 0 (give --delta)"
                        );
                    }
                    vec![Share::Eps(epsilon / k); calls.len()]
                }
                Budget::Zcdp { rho } => {
                    if needs_selection {
                        bail!(
                            "refused: GROUP BY keys without a public domain need DP partition selection, which needs an (ε, δ) budget"
                        );
                    }
                    vec![Share::Rho(rho / k); calls.len()]
                }
                Budget::Approx { epsilon, delta } => {
                    let (eps_rest, delta_rest) = if needs_selection {
                        selection = Some((epsilon / 2.0, delta / 2.0));
                        (epsilon / 2.0, delta / 2.0)
                    } else {
                        (epsilon, delta)
                    };
                    vec![Share::Rho(cdp_rho(eps_rest, delta_rest) / k); calls.len()]
                }
            }
        };
        let mut planned = Vec::new();
        for ((i, site, name, kind, field), share) in calls.into_iter().zip(shares) {
            planned.push(plan_one(i, site, &name, kind, field, share, l0, linf, &agg.group_expr)?);
        }
        let selection = selection.map(|(eps, delta)| {
            let b = l0 / eps;
            let tau = selection_threshold(eps, delta, l0);
            let rec = MechanismRecord {
                mechanism: "laplace_partition_selection".into(),
                target: "GROUP BY keys (units per key)".into(),
                sensitivity: Some(l0),
                noise: Some(NoiseDistribution::Laplace { scale: b }),
                loss: PrivacyLoss::Approx { epsilon: eps, delta },
                params: serde_json::json!({ "threshold": tau as i64, "max_groups_per_unit": l0 }),
            };
            (rec, b, tau)
        });
        Ok((planned, selection))
    }

    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &mut self,
        plan: &LogicalPlan,
        agg: &Aggregate,
        entry: &TableEntry,
        unit: Option<&Column>,
        planned: &[Planned],
        domain_keys: Option<Vec<Vec<ScalarValue>>>,
        selection: Option<&(MechanismRecord, f64, i128)>,
    ) -> Result<Vec<RecordBatch>> {
        let g = agg.group_expr.len();
        let bounded = self.bound_contributions(agg, entry, unit)?;
        // Exact helper aggregates (once, or twice when a group is too large for 64-bit sums).
        let schema = bounded.schema().clone();
        let domain = entry.dataset.domain();
        let int_arg = |e: &Expr| -> Option<Option<(f64, f64)>> {
            // Integer types that convert to Int64 without failing (UInt64 takes the float path).
            let t = e.get_type(&schema).ok()?;
            if !(t.is_integer() && super::rowsafe::infallible_cast(&t, &DataType::Int64)) {
                return None;
            }
            // A column proven to be the protected scan's own column keeps its domain's
            // bounds (by provenance through the plan, never by name).
            let bounds = match e {
                Expr::Column(c) if super::check::from_scan(&agg.input, c, &entry.name, &c.name) => {
                    match domain.column(&c.name).map(|x| &x.kind) {
                        Some(ColumnKind::Integer { edges }) => {
                            Some((edges[0] as f64, (edges[edges.len() - 1] - 1) as f64))
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            Some(bounds)
        };
        let n_helpers: usize = planned.iter().map(|p| p.helpers.len()).sum();
        let n_logical = n_helpers + usize::from(selection.is_some());
        let mut exact: HashMap<Vec<ScalarValue>, Vec<i128>> = HashMap::new();
        let mut order: Vec<Vec<ScalarValue>> = Vec::new();
        // Narrow 64-bit sums first; if any group sums 2³² values or more, again with
        // 128-bit sums. Both give the same exact integers (only the time differs).
        for wide in [false, true] {
            let mut helpers: Vec<Expr> = Vec::new();
            let mut fixups: Vec<Fixup> = Vec::new();
            let mut splits: Vec<(usize, Expr, u32)> = Vec::new();
            let mut counts: Vec<usize> = Vec::new();
            for p in planned {
                let offset = helpers.len();
                let h = helper_exprs(p, &int_arg, wide);
                fixups.extend(h.fixups.into_iter().map(|f| Fixup {
                    col: f.col + offset,
                    count: f.count.map(|c| c + offset),
                    square_of: f.square_of.map(|c| c + offset),
                    ..f
                }));
                splits.extend(h.splits.into_iter().map(|(j, e, s)| (j + offset, e, s)));
                counts.extend(h.counts.into_iter().map(|c| c + offset));
                helpers.extend(h.exprs);
            }
            if selection.is_some() {
                helpers.push(match unit {
                    None => count(lit(1)).alias("__units"),
                    // A null id is its own unit (never pooled): distinct ids plus null-id rows.
                    Some(c) => (count_distinct(col(c.clone()))
                        + sum(when(col(c.clone()).is_null(), lit(1i64)).otherwise(lit(0i64))?))
                    .alias("__units"),
                });
            }
            // The low halves of split sums go last.
            let split_cols: Vec<(usize, usize, u32)> = splits
                .into_iter()
                .enumerate()
                .map(|(i, (j, e, s))| {
                    helpers.push(e.alias(format!("__lo{i}")));
                    (j, n_logical + i, s)
                })
                .collect();
            let helper_plan =
                LogicalPlanBuilder::from(bounded.clone()).aggregate(agg.group_expr.clone(), helpers)?.build()?;
            let batches = self.ctx.execute_logical_plan(helper_plan).await?.collect().await?;
            // Exact integers per key (counts, and sums): never rounded through f64.
            exact.clear();
            order.clear();
            let mut too_many = false;
            for b in &batches {
                for r in 0..b.num_rows() {
                    let key: Vec<ScalarValue> =
                        (0..g).map(|c| ScalarValue::try_from_array(b.column(c), r)).collect::<Result<_, _>>()?;
                    let mut vals: Vec<i128> = (g..b.num_columns())
                        .map(|c| scalar_i128(&ScalarValue::try_from_array(b.column(c), r)?))
                        .collect::<Result<_>>()?;
                    too_many |= counts.iter().any(|&c| vals[c] >= self.wide_from);
                    for &(j, lo, shift) in &split_cols {
                        vals[j] = (vals[j] << shift) + vals[lo];
                    }
                    vals.truncate(n_logical);
                    if !fixups.is_empty() {
                        let raw = vals.clone();
                        for f in &fixups {
                            vals[f.col] = f.apply(&raw);
                        }
                    }
                    order.push(key.clone());
                    exact.insert(key, vals);
                }
            }
            if wide || !too_many {
                break;
            }
        }
        let zeros = vec![0i128; n_logical];
        // Which keys are released.
        let keys: Vec<Vec<ScalarValue>> = match (domain_keys, selection) {
            (Some(k), _) => k
                .into_iter()
                .map(|key| {
                    key.iter()
                        .zip(agg.schema.fields().iter())
                        .map(
                            |(v, f)| {
                                if v.data_type() == *f.data_type() { Ok(v.clone()) } else { v.cast_to(f.data_type()) }
                            },
                        )
                        .collect::<Result<Vec<_>, _>>()
                })
                .collect::<Result<_, _>>()?,
            (None, Some((_, b, tau))) => {
                let sampler = NoiseDistribution::Laplace { scale: *b }.integer_sampler();
                let mut kept = Vec::new();
                // Draw in key order, not in the engine's (partition-dependent) row order, so seeded runs
                // reproduce on any machine and the released order says nothing about the data layout.
                let mut order = order;
                order.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
                for key in order {
                    let units = exact.get(&key).map_or(0, |v| v[n_helpers]);
                    // Unit counts are integers: discrete Laplace noise of scale b (exact, no floats),
                    // kept when above the integer threshold τ of the discrete tail.
                    let noisy = units + sampler.sample(&mut self.rng);
                    if noisy > *tau {
                        kept.push(key);
                    }
                }
                kept
            }
            (None, None) => bail!("internal: no key policy"),
        };
        // Quantile histograms (a second exact pass) when needed.
        let mut hist: HashMap<usize, HashMap<Vec<ScalarValue>, Vec<f64>>> = HashMap::new();
        for (pi, p) in planned.iter().enumerate() {
            if let Kind::Quantile { arg, lo, hi, .. } = &p.kind {
                let bins = p.quantile.expect("quantile plan").1;
                let width = (hi - lo) / bins as f64;
                let bin = try_cast(
                    datafusion::functions::math::expr_fn::floor(
                        (clamp_expr(arg.clone(), *lo, *hi) - lit(*lo)) / lit(width),
                    ),
                    DataType::Int64,
                );
                let mut groups = agg.group_expr.clone();
                groups.push(bin.alias("__bin"));
                let hp = LogicalPlanBuilder::from(bounded.clone())
                    .filter(arg.clone().is_not_null())?
                    .aggregate(groups, vec![count(lit(1)).alias("__n")])?
                    .build()?;
                let hb = self.ctx.execute_logical_plan(hp).await?.collect().await?;
                let mut m: HashMap<Vec<ScalarValue>, Vec<f64>> = HashMap::new();
                for b in &hb {
                    for r in 0..b.num_rows() {
                        let key: Vec<ScalarValue> =
                            (0..g).map(|c| ScalarValue::try_from_array(b.column(c), r)).collect::<Result<_, _>>()?;
                        let bin = ScalarValue::try_from_array(b.column(g), r)?;
                        if bin.is_null() {
                            continue; // NaN: no bin (TRY_CAST gave null)
                        }
                        let bi = scalar_f64(&bin)?.max(0.0) as usize;
                        let n = scalar_f64(&ScalarValue::try_from_array(b.column(g + 1), r)?)?;
                        m.entry(key).or_insert_with(|| vec![0.0; bins])[bi.min(bins - 1)] += n;
                    }
                }
                hist.insert(pi, m);
            }
        }
        // Noise, once.
        let ci_requests = ci_requests(plan, planned, self.catalog.confidence);
        let mut columns: Vec<Vec<ScalarValue>> = vec![Vec::new(); g + planned.len()];
        let mut ci_cols: Vec<Vec<ScalarValue>> = vec![Vec::new(); ci_requests.len()];
        for key in &keys {
            let stats = exact.get(key).unwrap_or(&zeros);
            for (c, v) in key.iter().enumerate() {
                columns[c].push(v.clone());
            }
            let mut off = 0;
            for (pi, p) in planned.iter().enumerate() {
                let h = &stats[off..off + p.helpers.len()];
                off += p.helpers.len();
                let empty = Vec::new();
                let histo = hist.get(&pi).and_then(|m| m.get(key)).unwrap_or(&empty);
                let (value, cis) = release_one(p, h, histo, &ci_requests, pi, &mut self.rng)?;
                columns[g + pi].push(value);
                for (k, v) in cis {
                    ci_cols[k].push(v);
                }
            }
        }
        // The released table, shaped like the aggregate's output (+ CI columns).
        let mut fields = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for (c, f) in agg.schema.fields().iter().enumerate() {
            fields.push(Field::new(format!("__c{c}"), f.data_type().clone(), true));
            arrays.push(if columns[c].is_empty() {
                datafusion::arrow::array::new_empty_array(f.data_type())
            } else {
                ScalarValue::iter_to_array(columns[c].clone())?
            });
        }
        for (k, r) in ci_requests.iter().enumerate() {
            fields.push(Field::new(r.hidden.clone(), DataType::Float64, true));
            arrays.push(if ci_cols[k].is_empty() {
                datafusion::arrow::array::new_empty_array(&DataType::Float64)
            } else {
                ScalarValue::iter_to_array(ci_cols[k].clone())?
            });
        }
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(schema.clone(), arrays)?;
        let mem = MemTable::try_new(schema, vec![vec![batch]])?;
        let scan = LogicalPlanBuilder::scan("__dp_released", provider_as_source(Arc::new(mem)), None)?.build()?;
        let mut proj: Vec<Expr> = agg
            .schema
            .iter()
            .enumerate()
            .map(|(c, (q, f))| col(Column::new_unqualified(format!("__c{c}"))).alias_qualified(q.cloned(), f.name()))
            .collect();
        for r in &ci_requests {
            proj.push(col(Column::new_unqualified(r.hidden.clone())));
        }
        let replacement = LogicalPlanBuilder::from(scan).project(proj)?.build()?;
        let target = LogicalPlan::Aggregate(agg.clone());
        let final_plan = plan
            .clone()
            .transform_up(|node| {
                if node == target {
                    return Ok(Transformed::yes(replacement.clone()));
                }
                let node = node.map_expressions(|e| {
                    e.transform_up(|x| {
                        if let Expr::ScalarFunction(ScalarFunction { func, args }) = &x
                            && (func.name() == "dp_ci_low" || func.name() == "dp_ci_high")
                            && let Some(r) = ci_requests.iter().find(|r| r.matches(func.name(), args))
                        {
                            return Ok(Transformed::yes(col(Column::new_unqualified(r.hidden.clone()))));
                        }
                        Ok(Transformed::no(x))
                    })
                })?;
                // Always recompute: rewritten expressions below may change the schema.
                Ok(Transformed::yes(node.data.recompute_schema()?))
            })?
            .data;
        let out = self.ctx.execute_logical_plan(final_plan).await?.collect().await?;
        Ok(out.into_iter().map(rename_dp_columns).collect())
    }

    /// Per-unit contribution bounding: at most L∞ rows per (unit, group) and L0
    /// groups per unit, chosen at random (row units need none).
    fn bound_contributions(&self, agg: &Aggregate, entry: &TableEntry, unit: Option<&Column>) -> Result<LogicalPlan> {
        let input = agg.input.as_ref().clone();
        let Some(unit) = unit else { return Ok(input) };
        let unit_col = col(unit.clone());
        let fields: Vec<Expr> = input.schema().columns().into_iter().map(col).collect();
        // A row with a null unit id is its own unit: it gets a fresh random id
        // (uuid, 122 random bits) in a second partition key, so null ids are
        // never pooled into one unit whose rows would be bounded together
        // (not needed when the column cannot hold a null).
        let nullable = input.schema().qualified_field_from_column(unit)?.1.is_nullable();
        let mut plan = LogicalPlanBuilder::from(input);
        let mut unit_keys = vec![unit_col.clone()];
        if nullable {
            let null_unit = when(unit_col.clone().is_null(), datafusion::functions::string::expr_fn::uuid())
                .otherwise(lit(ScalarValue::Utf8(None)))?;
            plan = plan.project(
                fields.iter().cloned().chain(std::iter::once(null_unit.alias("__dp_null_unit"))).collect::<Vec<_>>(),
            )?;
            unit_keys.push(col("__dp_null_unit"));
        }
        let mut partition = unit_keys.clone();
        partition.extend(agg.group_expr.iter().cloned().map(|e| e.unalias()));
        let rn = datafusion::functions_window::expr_fn::row_number()
            .partition_by(partition)
            .order_by(vec![datafusion::functions::math::expr_fn::random().sort(true, false)])
            .build()?
            .alias("__dp_rn");
        plan = plan.window(vec![rn])?;
        let mut keep = col("__dp_rn").lt_eq(lit(entry.max_rows_per_unit as i64));
        if !agg.group_expr.is_empty() {
            let salt = rand::Rng::next_u64(&mut DpRng::from_os()?) as i64;
            let mut hash_args = vec![lit(salt)];
            hash_args.extend(agg.group_expr.iter().cloned().map(|e| e.unalias()));
            let hash = Expr::ScalarFunction(ScalarFunction::new_udf(
                Arc::new(datafusion::logical_expr::ScalarUDF::from(dpflow_udfs::dp::KeyedHash::default())),
                hash_args,
            ));
            let rank = datafusion::functions_window::expr_fn::dense_rank()
                .partition_by(unit_keys)
                .order_by(vec![hash.sort(true, false)])
                .build()?
                .alias("__dp_gr");
            plan = plan.window(vec![rank])?;
            keep = keep.and(col("__dp_gr").lt_eq(lit(entry.max_groups_per_unit as i64)));
        }
        Ok(plan.filter(keep)?.project(fields)?.build()?)
    }
}

/// The integer threshold τ of DP partition selection with discrete Laplace
/// noise of scale b = l0/ε on unit counts: a key is kept when count + Z > τ.
///
/// Proof sketch (docs/PRIVACY.md §3): a unit touches at most l0 keys, each
/// count by 1, so the noisy counts of keys present in both neighbours are
/// ε-DP (L1 sensitivity l0). A key present in only one neighbour has count 1
/// there and is kept with probability P(Z ≥ τ) = p^τ/(1 + p), p = e^(−1/b),
/// for the discrete Laplace P(Z = z) = (1 − p)/(1 + p)·p^|z|; over at most l0
/// such keys this is ≤ δ when p^τ/(1 + p) ≤ δ/l0. τ is the smallest such
/// integer (the continuous-Laplace threshold 1 + b·ln(l0/2δ) is too low for
/// the discrete tail: at (1, 1e-5), l0 = 1 it keeps a one-unit key with
/// probability 1.22e-5 > δ).
pub(crate) fn selection_threshold(epsilon: f64, delta: f64, l0: f64) -> i128 {
    let b = l0 / epsilon;
    let ln_p = -1.0 / b;
    let ln_tail = |k: i128| k as f64 * ln_p - ln_p.exp().ln_1p();
    let target = (delta / l0).ln();
    // First guess from the closed form, then step to the exact smallest k.
    let mut k = (((target + ln_p.exp().ln_1p()) / ln_p).ceil().max(0.0)) as i128;
    // A relative slack of 1e-12 keeps τ conservative where the tail is within
    // rounding of δ/l0.
    let slack = 1e-12 * target.abs().max(1.0);
    while ln_tail(k) > target - slack {
        k += 1;
    }
    while k > 0 && ln_tail(k - 1) <= target - slack {
        k -= 1;
    }
    k
}

/// `dp_count(Int64(1),Utf8("__dp_site_0"))` → `dp_count(*)`: a DP call's
/// planned name without its site tag.
pub(super) fn clean_dp_name(name: &str) -> String {
    let mut n = name.to_string();
    while let Some(i) = n.find(",Utf8(\"__dp_site_") {
        match n[i..].find("\")") {
            Some(j) => n.replace_range(i..i + j + 2, ""),
            None => break,
        }
    }
    n.replace("dp_count(Int64(1))", "dp_count(*)").replace("dp_imputed_count(Int64(1))", "dp_imputed_count(*)")
}

/// Output column names without site tags.
fn rename_dp_columns(b: RecordBatch) -> RecordBatch {
    let fields: Vec<Field> =
        b.schema().fields().iter().map(|f| f.as_ref().clone().with_name(clean_dp_name(f.name()))).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), b.columns().to_vec()).unwrap_or(b)
}

/// The EXPLAIN answer for `records` (nothing charged, no data read).
fn explained(records: Vec<MechanismRecord>) -> QueryResult {
    let rows = records
        .iter()
        .map(|r| ExplainRow {
            aggregate: r.target.clone(),
            mechanism: r.mechanism.clone(),
            sensitivity: r.sensitivity,
            noise_scale: r.noise.map(|n| match n {
                NoiseDistribution::Laplace { scale } => scale,
                NoiseDistribution::Gaussian { sigma } => sigma,
            }),
            loss: r.loss.describe(),
        })
        .collect();
    QueryResult { batches: vec![], mechanisms: records, explain: Some(rows), charge_id: None, remaining: None }
}

/// The catalog table a qualified column is read from (through its alias).
fn source_table(plan: &LogicalPlan, c: &Column) -> Option<String> {
    let rel = c.relation.as_ref()?.table().to_string();
    let mut found = None;
    let _ = plan.apply(|node| {
        Ok(match node {
            LogicalPlan::SubqueryAlias(a) if a.alias.table() == rel => {
                found = super::check::base_table(&a.input);
                datafusion::common::tree_node::TreeNodeRecursion::Stop
            }
            LogicalPlan::TableScan(t) if t.table_name.table() == rel => {
                found = Some(rel.clone());
                datafusion::common::tree_node::TreeNodeRecursion::Stop
            }
            _ => datafusion::common::tree_node::TreeNodeRecursion::Continue,
        })
    });
    found
}

/// An exact helper value (count or 128-bit sum) as an integer; null → 0.
fn scalar_i128(v: &ScalarValue) -> Result<i128> {
    Ok(match v {
        v if v.is_null() => 0,
        ScalarValue::Decimal128(Some(x), _, 0) => *x,
        ScalarValue::Int64(Some(x)) => *x as i128,
        other => bail!("internal: helper aggregate of type {} is not an exact integer", other.data_type()),
    })
}

fn scalar_f64(v: &ScalarValue) -> Result<f64> {
    if v.is_null() {
        return Ok(0.0);
    }
    match v.cast_to(&DataType::Float64)? {
        ScalarValue::Float64(Some(f)) => Ok(f),
        _ => Ok(0.0),
    }
}

#[allow(clippy::too_many_arguments)]
fn plan_one(
    index: usize,
    site: usize,
    name: &str,
    kind: Kind,
    field: String,
    share: Share,
    l0: f64,
    linf: f64,
    _groups: &[Expr],
) -> Result<Planned> {
    let target = |what: &str| format!("{name}#{site} {what}");
    // Sensitivities of one sub-statistic with per-row bound c.
    let l1 = |c: f64| l0 * linf * c;
    let l2 = |c: f64| l0.sqrt() * linf * c;
    let parts = match &kind {
        Kind::Count { .. } | Kind::Sum { .. } => 1.0,
        Kind::Avg { .. } => 2.0,
        Kind::Var { .. } => 3.0,
        Kind::Quantile { .. } => 1.0,
    };
    let noise_for = |c: f64| -> (NoiseDistribution, f64, PrivacyLoss) {
        match share {
            Share::Eps(e) => {
                let eps = e / parts;
                let b = dpflow_udfs::calibrate::laplace_scale(l1(c), eps);
                (NoiseDistribution::Laplace { scale: b }, l1(c), PrivacyLoss::Pure { epsilon: l1(c) / b })
            }
            Share::Rho(r) => {
                let rho = r / parts;
                let s = dpflow_udfs::calibrate::gaussian_sigma_for_rho(l2(c), rho);
                (
                    NoiseDistribution::Gaussian { sigma: s },
                    l2(c),
                    PrivacyLoss::Zcdp { rho: dpflow_udfs::calibrate::gaussian_rho(l2(c), s) },
                )
            }
        }
    };
    let record = |what: &str, noise: NoiseDistribution, sens: f64, loss: PrivacyLoss| MechanismRecord {
        mechanism: match noise {
            NoiseDistribution::Laplace { .. } => "discrete_laplace".into(),
            NoiseDistribution::Gaussian { .. } => "discrete_gaussian".into(),
        },
        target: target(what),
        sensitivity: Some(sens),
        noise: Some(noise),
        loss,
        params: serde_json::json!({ "max_groups_per_unit": l0, "max_rows_per_unit": linf }),
    };
    let h = |j: usize| format!("__h{index}_{j}");
    let mut noise = Vec::new();
    let mut records = Vec::new();
    let mut grid = 0;
    let mut quantile = None;
    let helpers: Vec<String> = match &kind {
        Kind::Count { .. } => {
            let (n, s, l) = noise_for(1.0);
            records.push(record("count", n, s, l));
            noise.push(n);
            vec![h(0)]
        }
        Kind::Sum { lo, hi, .. } | Kind::Avg { lo, hi, .. } | Kind::Var { lo, hi, .. } => {
            let c = match &kind {
                Kind::Sum { .. } => lo.abs().max(hi.abs()),
                _ => (hi - lo) / 2.0,
            };
            grid = (c.log2().floor() as i32) - 20;
            let g = 2f64.powi(grid);
            let c_units = (c / g).ceil() + 1.0;
            let mut subs: Vec<(&str, f64)> = Vec::new();
            match &kind {
                Kind::Sum { .. } => subs.push(("sum of clamped values", c_units)),
                Kind::Avg { .. } => {
                    subs.push(("count of non-null values", 1.0));
                    subs.push(("sum of clamped values − midpoint", c_units));
                }
                _ => {
                    subs.push(("count of non-null values", 1.0));
                    subs.push(("sum of clamped values − midpoint", c_units));
                    let c2 = (c * c / (g * g)).ceil() + 1.0;
                    subs.push(("sum of squares of (clamped − midpoint)", c2));
                }
            }
            for (what, units) in subs {
                let (n, s, l) = noise_for(units);
                // Record in real units (grid units × g, or g² for squares).
                let scale = if what.starts_with("count") {
                    1.0
                } else if what.contains("squares") {
                    g * g
                } else {
                    g
                };
                let shown = match n {
                    NoiseDistribution::Laplace { scale: b } => NoiseDistribution::Laplace { scale: b * scale },
                    NoiseDistribution::Gaussian { sigma } => NoiseDistribution::Gaussian { sigma: sigma * scale },
                };
                records.push(record(what, shown, s * scale, l));
                noise.push(n);
            }
            // A plain sum also counts its values (not released: it picks the exact
            // accumulation width, see `helper_exprs`).
            if matches!(kind, Kind::Sum { .. }) { vec![h(0), h(1)] } else { (0..noise.len()).map(h).collect() }
        }
        Kind::Quantile { lo, hi, .. } => {
            let bins = 1024usize;
            let (eps_em, loss) = match share {
                Share::Eps(e) => (e / l0, PrivacyLoss::Pure { epsilon: e }),
                // ε²/8 per group, L0 groups: ρ = L0·ε²/8.
                Share::Rho(r) => ((8.0 * r / l0).sqrt(), PrivacyLoss::Zcdp { rho: r }),
            };
            // One unit adds up to l∞ rows to a group, each moving every score
            // −|#{x ≤ edge} − q·n| by at most max(q, 1 − q) ≤ 1: sensitivity l∞.
            quantile = Some((eps_em, bins, linf));
            records.push(MechanismRecord {
                mechanism: "exponential".into(),
                target: target("quantile bin"),
                sensitivity: Some(linf),
                noise: None,
                loss,
                params: serde_json::json!({ "epsilon_per_group": eps_em, "bins": bins, "lo": lo, "hi": hi }),
            });
            vec![]
        }
    };
    Ok(Planned { field, kind, noise, grid, records, helpers, quantile })
}

/// Turns exact integer helper sums into grid units, exactly (big-integer
/// arithmetic, so no refusal and no rounding depends on the data). With the
/// grid g = 2^k (k ≤ −1 on this path) and m₂ = lo + hi (an integer, so the
/// midpoint is m₂/2):
///
/// - a plain sum S of values in [lo, hi] around 0: S/g = S·2^(−k);
/// - a sum S₁ around the midpoint: (S₁ − n·m₂/2)/g = (2S₁ − n·m₂)·2^(−k−1);
/// - a sum of squares S₂ around the midpoint: Σ(x − m₂/2)²/g² =
///   (4S₂ − 4m₂S₁ + n·m₂²)·2^(−2k−2).
///
/// Each is an integer because (x − mid)/g is an integer for integer x.
#[derive(Debug, Clone, Copy)]
struct Fixup {
    col: usize,
    /// Helper column with the count n of summed values (None: a plain sum around 0).
    count: Option<usize>,
    /// lo + hi.
    m2: i128,
    /// The grid exponent k (≤ −1).
    k: i32,
    /// For a sum of squares: the helper column with the plain sum S₁.
    square_of: Option<usize>,
}

impl Fixup {
    /// The value in grid units, from the raw helper values.
    fn apply(&self, raw: &[i128]) -> i128 {
        use num_bigint::BigInt;
        let big = |x: i128| BigInt::from(x);
        let shifted = |v: BigInt, by: i32| -> i128 {
            let v = v << (by.max(0) as usize);
            // |units| ≤ n·(c/g + 1)² < 2¹²⁶ for n < 2⁶³ rows: always fits.
            i128::try_from(v).expect("grid units fit 128 bits")
        };
        match (self.count, self.square_of) {
            (None, _) => shifted(big(raw[self.col]), -self.k),
            (Some(n), None) => shifted(big(2) * big(raw[self.col]) - big(raw[n]) * big(self.m2), -self.k - 1),
            (Some(n), Some(s1)) => shifted(
                big(4) * big(raw[self.col]) - big(4) * big(self.m2) * big(raw[s1]) + big(raw[n]) * big(self.m2).pow(2),
                -2 * self.k - 2,
            ),
        }
    }
}

/// For an aggregate argument: `None` if it is not integer-typed, else the
/// public bounds of its domain column when it is a bare column.
type IntArg<'a> = &'a dyn Fn(&Expr) -> Option<Option<(f64, f64)>>;

/// The exact helper aggregates of one DP call.
struct Helpers {
    /// One expression per helper column, aliased.
    exprs: Vec<Expr>,
    /// Fix-ups that turn integer sums into grid units.
    fixups: Vec<Fixup>,
    /// Sums split in two halves: (helper column of the high half, the low
    /// half's sum, shift): the value is (high << shift) + low.
    splits: Vec<(usize, Expr, u32)>,
    /// Helper columns counting the summed values.
    counts: Vec<usize>,
}

/// The exact helper aggregates of one DP call, and the fix-ups that turn
/// integer sums into grid units.
///
/// Integer arguments with integer bounds (and a grid g ≤ ½, so the bounds
/// and their midpoint are multiples of g) are summed as integers, clamped
/// with a CASE only when the public domain is not already inside [lo, hi],
/// and converted exactly afterwards ([`Fixup`]). Other arguments are clamped,
/// centred and rounded to the grid row by row.
///
/// Every summed row value is below 2³¹ in magnitude (exact values |x| < 2³¹,
/// grid units ≤ 2²¹ + 1), so a 64-bit sum of fewer than 2³² values is exact;
/// squares (below 2⁶², or 2⁴³ in grid units) are split into a high and a low
/// half below 2³¹ each, summed apart and recombined in 128 bits. The caller
/// checks the counts and, if a group sums 2³² values or more, runs again
/// with `wide` 128-bit sums ([`sum_i128`], slower). Either way the sums are
/// exact, so no refusal and no rounding depends on the data.
fn helper_exprs(p: &Planned, int_arg: IntArg<'_>, wide: bool) -> Helpers {
    use datafusion::logical_expr::{bitwise_and, bitwise_shift_right};
    let mut out = Vec::new();
    let mut fixups = Vec::new();
    let mut splits = Vec::new();
    let mut counts = Vec::new();
    let g = 2f64.powi(p.grid);
    let plain = |v: Expr| if wide { sum_i128(v) } else { sum(v) };
    // A non-negative square below 2^(2·half): its two halves below 2^half, or whole when wide.
    let mut square = |out: &mut Vec<Expr>, v: Expr, half: u32| {
        if wide {
            out.push(sum_i128(v));
        } else {
            out.push(sum(bitwise_shift_right(v.clone(), lit(half as i64))));
            splits.push((out.len() - 1, sum(bitwise_and(v, lit((1i64 << half) - 1))), half));
        }
    };
    let exact = |arg: &Expr, lo: f64, hi: f64| -> Option<Expr> {
        let bounds = int_arg(arg)?;
        if lo.fract() != 0.0 || hi.fract() != 0.0 || g > 0.5 || lo.abs().max(hi.abs()) >= 2f64.powi(31) {
            return None;
        }
        let x = cast(arg.clone(), DataType::Int64);
        Some(match bounds {
            Some((dlo, dhi)) if dlo >= lo && dhi <= hi => x,
            _ => when(x.clone().lt(lit(lo as i64)), lit(lo as i64))
                .when(x.clone().gt(lit(hi as i64)), lit(hi as i64))
                .otherwise(x)
                .expect("valid CASE"),
        })
    };
    let m2 = |lo: f64, hi: f64| (lo as i128) + (hi as i128);
    match &p.kind {
        Kind::Count { arg } => out.push(count(arg.clone().unwrap_or(lit(1)))),
        Kind::Sum { arg, lo, hi } => {
            match exact(arg, *lo, *hi) {
                Some(x) => {
                    out.push(plain(x));
                    fixups.push(Fixup { col: 0, count: None, m2: 0, k: p.grid, square_of: None });
                }
                None => out.push(plain(to_units(clamp_expr(arg.clone(), *lo, *hi), p.grid))),
            }
            out.push(count(arg.clone()));
            counts.push(1);
        }
        Kind::Avg { arg, lo, hi } | Kind::Var { arg, lo, hi } => {
            let mid = (lo + hi) / 2.0;
            let var = matches!(p.kind, Kind::Var { .. });
            out.push(count(arg.clone()));
            counts.push(0);
            match exact(arg, *lo, *hi) {
                Some(x) => {
                    let m2 = m2(*lo, *hi);
                    out.push(plain(x.clone()));
                    fixups.push(Fixup { col: 1, count: Some(0), m2, k: p.grid, square_of: None });
                    if var {
                        square(&mut out, x.clone() * x, 31);
                        fixups.push(Fixup { col: 2, count: Some(0), m2, k: p.grid, square_of: Some(1) });
                    }
                }
                None => {
                    let centered = clamp_expr(arg.clone(), *lo, *hi) - lit(mid);
                    out.push(plain(to_units(centered.clone(), p.grid)));
                    if var {
                        square(&mut out, to_units(centered.clone() * centered, 2 * p.grid), 22);
                    }
                }
            }
        }
        Kind::Quantile { .. } => {}
    }
    Helpers { exprs: out.into_iter().zip(&p.helpers).map(|(e, n)| e.alias(n)).collect(), fixups, splits, counts }
}

/// A requested confidence bound.
#[derive(Debug, Clone)]
struct CiRequest {
    side_high: bool,
    agg: usize,
    level: f64,
    field: String,
    level_arg: Option<Expr>,
    hidden: String,
}

impl CiRequest {
    fn matches(&self, func: &str, args: &[Expr]) -> bool {
        (func == "dp_ci_high") == self.side_high
            && matches!(args.first(), Some(Expr::Column(c)) if c.name == self.field)
            && args.get(1) == self.level_arg.as_ref()
    }
}

fn ci_requests(plan: &LogicalPlan, planned: &[Planned], default_level: f64) -> Vec<CiRequest> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut out: Vec<CiRequest> = Vec::new();
    let _ = plan.apply(|node| {
        for e in node.expressions() {
            let _ = e.apply(|x| {
                if let Expr::ScalarFunction(ScalarFunction { func, args }) = x
                    && (func.name() == "dp_ci_low" || func.name() == "dp_ci_high")
                    && let Some(Expr::Column(c)) = args.first()
                    && let Some(agg) = planned.iter().position(|p| p.field == c.name)
                {
                    let level = args
                        .get(1)
                        .and_then(|l| parse_f64(l, "level", func.name()).ok())
                        .filter(|l| *l > 0.0 && *l < 1.0)
                        .unwrap_or(default_level);
                    let side_high = func.name() == "dp_ci_high";
                    if !out
                        .iter()
                        .any(|r| r.side_high == side_high && r.agg == agg && r.level_arg.as_ref() == args.get(1))
                    {
                        let hidden = format!("__ci_{}_{agg}_{}", if side_high { "hi" } else { "lo" }, out.len());
                        out.push(CiRequest {
                            side_high,
                            agg,
                            level,
                            field: c.name.clone(),
                            level_arg: args.get(1).cloned(),
                            hidden,
                        });
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// Noises one aggregate for one group; returns the value and requested CI bounds.
fn release_one(
    p: &Planned,
    h: &[i128],
    histogram: &[f64],
    cis: &[CiRequest],
    pi: usize,
    rng: &mut DpRng,
) -> Result<(ScalarValue, Vec<(usize, ScalarValue)>)> {
    // Exact integer + exact integer noise; only the noisy value becomes a float.
    let noisy_int = |x: i128, n: &NoiseDistribution, rng: &mut DpRng| -> f64 { (x + n.sample_integer(rng)) as f64 };
    let g = 2f64.powi(p.grid);
    let mine: Vec<(usize, &CiRequest)> = cis.iter().enumerate().filter(|(_, r)| r.agg == pi).collect();
    let mut out_cis = Vec::new();
    let value = match &p.kind {
        Kind::Count { .. } => {
            let v = noisy_int(h[0], &p.noise[0], rng);
            for (k, r) in &mine {
                let hw = p.noise[0].ci_half_width(r.level);
                out_cis.push((*k, ScalarValue::Float64(Some(if r.side_high { v + hw } else { v - hw }))));
            }
            ScalarValue::Int64(Some(v as i64))
        }
        Kind::Sum { .. } => {
            let v = noisy_int(h[0], &p.noise[0], rng) * g;
            for (k, r) in &mine {
                let hw = p.noise[0].ci_half_width(r.level) * g;
                out_cis.push((*k, ScalarValue::Float64(Some(if r.side_high { v + hw } else { v - hw }))));
            }
            ScalarValue::Float64(Some(v))
        }
        Kind::Avg { lo, hi, .. } => {
            let mid = (lo + hi) / 2.0;
            let c = noisy_int(h[0], &p.noise[0], rng);
            let s = noisy_int(h[1], &p.noise[1], rng) * g;
            for (k, r) in &mine {
                // Conservative: each part at level 1 − (1 − level)/2, interval arithmetic.
                let lvl = 1.0 - (1.0 - r.level) / 2.0;
                let hc = p.noise[0].ci_half_width(lvl);
                let hs = p.noise[1].ci_half_width(lvl) * g;
                let bound = if c - hc > 0.0 {
                    let cands = [(s - hs) / (c - hc), (s - hs) / (c + hc), (s + hs) / (c - hc), (s + hs) / (c + hc)];
                    let b = if r.side_high {
                        cands.iter().copied().fold(f64::MIN, f64::max)
                    } else {
                        cands.iter().copied().fold(f64::MAX, f64::min)
                    };
                    (b + mid).clamp(*lo, *hi)
                } else if r.side_high {
                    *hi
                } else {
                    *lo
                };
                out_cis.push((*k, ScalarValue::Float64(Some(bound))));
            }
            if c >= 1.0 {
                ScalarValue::Float64(Some((s / c + mid).clamp(*lo, *hi)))
            } else {
                ScalarValue::Float64(None)
            }
        }
        Kind::Var { lo, hi, .. } => {
            let c = noisy_int(h[0], &p.noise[0], rng);
            let s1 = noisy_int(h[1], &p.noise[1], rng) * g;
            let s2 = noisy_int(h[2], &p.noise[2], rng) * g * g;
            let max_var = ((hi - lo) / 2.0).powi(2);
            let var = |c: f64, s1: f64, s2: f64| (s2 / c - (s1 / c).powi(2)).clamp(0.0, max_var);
            for (k, r) in &mine {
                let lvl = 1.0 - (1.0 - r.level) / 3.0;
                let (hc, h1, h2) = (
                    p.noise[0].ci_half_width(lvl),
                    p.noise[1].ci_half_width(lvl) * g,
                    p.noise[2].ci_half_width(lvl) * g * g,
                );
                let bound = if c - hc > 1.0 {
                    let mut vals = Vec::new();
                    for cc in [c - hc, c + hc] {
                        for a in [s1 - h1, s1 + h1, 0.0f64.clamp(s1 - h1, s1 + h1)] {
                            for b in [s2 - h2, s2 + h2] {
                                vals.push(var(cc, a, b));
                            }
                        }
                    }
                    if r.side_high {
                        vals.iter().copied().fold(0.0, f64::max)
                    } else {
                        vals.iter().copied().fold(max_var, f64::min)
                    }
                } else if r.side_high {
                    max_var
                } else {
                    0.0
                };
                out_cis.push((*k, ScalarValue::Float64(Some(bound))));
            }
            if c > 1.0 { ScalarValue::Float64(Some(var(c, s1, s2))) } else { ScalarValue::Float64(None) }
        }
        Kind::Quantile { q, lo, hi, .. } => {
            let (eps, bins, sensitivity) = p.quantile.expect("quantile");
            let n: f64 = histogram.iter().sum();
            // Score of bin b: −|#{x below b's upper edge} − q·n| (sensitivity 1 per row, l∞ per unit).
            let mut cum = 0.0;
            let scores: Vec<f64> = (0..bins)
                .map(|b| {
                    cum += histogram.get(b).copied().unwrap_or(0.0);
                    -(cum - q * n).abs()
                })
                .collect();
            let mech = ExponentialMechanism::new(eps, sensitivity)?;
            let b = mech.select(rng, &scores)?;
            let width = (hi - lo) / bins as f64;
            for (k, _) in &mine {
                out_cis.push((*k, ScalarValue::Float64(None)));
            }
            ScalarValue::Float64(Some(lo + (b as f64 + 0.5) * width))
        }
    };
    Ok((value, out_cis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_threshold_is_the_smallest_integer_with_a_discrete_tail_below_delta() {
        // Issue 14's example: (ε, δ) = (1, 1e-5), l0 = 1. The continuous rule kept a
        // one-unit key when Z ≥ 11: p^11/(1 + p) = 1.22e-5 > δ.
        let p = (-1.0f64).exp();
        let tail = |k: i128| p.powi(k as i32) / (1.0 + p);
        assert!(tail(11) > 1e-5);
        let tau = selection_threshold(1.0, 1e-5, 1.0);
        assert_eq!(tau, 12);
        assert!(tail(tau) <= 1e-5 && tail(tau - 1) > 1e-5);
        // Brute force over a grid of (ε, δ, l0).
        for eps in [0.1f64, 0.5, 1.0, 2.0, 8.0] {
            for delta in [1e-9, 1e-6, 1e-3, 0.05, 0.3] {
                for l0 in [1.0, 3.0, 10.0] {
                    let p = (-eps / l0).exp();
                    let tail = |k: i128| p.powf(k as f64) / (1.0 + p);
                    let tau = selection_threshold(eps, delta, l0);
                    assert!(tail(tau) <= delta / l0 * (1.0 + 1e-12), "{eps} {delta} {l0}");
                    assert!(tau == 0 || tail(tau - 1) > delta / l0, "{eps} {delta} {l0}: τ not minimal");
                }
            }
        }
    }

    #[test]
    fn fixups_match_grid_units_computed_row_by_row() {
        // Brute force: Σ (x − mid)/g and Σ ((x − mid)/g)² over exact integers, for bounds
        // whose midpoint is a half-integer and values far from 0 (sums beyond 2^64).
        let (lo, hi) = (2_000_000_001i64, 2_000_000_004i64);
        let k = ((((hi - lo) as f64) / 2.0).log2().floor() as i32) - 20;
        let xs: Vec<i64> = (0..2000).map(|i| lo + (i * 7) % 4).collect();
        let n = xs.len() as i128;
        let s1: i128 = xs.iter().map(|&x| x as i128).sum();
        let s2: i128 = xs.iter().map(|&x| (x as i128) * (x as i128)).sum();
        assert!(s2 > i64::MAX as i128, "the test must exceed 64 bits");
        let m2 = (lo + hi) as i128;
        // (x − mid)/g = (2x − m2)·2^(−k−1), an integer.
        let unit = |x: i64| (2 * x as i128 - m2) << (-k - 1);
        let want1: i128 = xs.iter().map(|&x| unit(x)).sum();
        let want2: i128 = xs.iter().map(|&x| unit(x) * unit(x)).sum();
        let raw = [n, s1, s2];
        let f1 = Fixup { col: 1, count: Some(0), m2, k, square_of: None };
        let f2 = Fixup { col: 2, count: Some(0), m2, k, square_of: Some(1) };
        assert_eq!(f1.apply(&raw), want1);
        assert_eq!(f2.apply(&raw), want2);
        let plain = Fixup { col: 1, count: None, m2: 0, k, square_of: None };
        assert_eq!(plain.apply(&raw), s1 << -k);
    }

    #[tokio::test]
    async fn helper_sums_do_not_wrap_past_64_bits() {
        use datafusion::arrow::array::Int64Array;
        let ctx = SessionContext::new();
        let batch = RecordBatch::try_from_iter(vec![(
            "x",
            Arc::new(Int64Array::from(vec![i64::MAX, i64::MAX, i64::MAX])) as ArrayRef,
        )])
        .unwrap();
        let df = ctx.read_batch(batch).unwrap().aggregate(vec![], vec![sum_i128(col("x")).alias("s")]).unwrap();
        let out = df.collect().await.unwrap();
        let v = ScalarValue::try_from_array(out[0].column(0), 0).unwrap();
        assert_eq!(scalar_i128(&v).unwrap(), 3 * i64::MAX as i128);
    }
}
