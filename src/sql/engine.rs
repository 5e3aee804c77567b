//! The DP SQL engine: plan-time costing and charging, contribution bounding,
//! exact helper aggregation executed once, noise drawn once in our own code,
//! public-domain keys or DP partition selection, and post-processing over
//! the released values.

use std::sync::Arc;

use super::error::{Result, SqlError};
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::context::SessionContext;
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, col, lit};
use dpflow_udfs::noise::{DpRng, NoiseDistribution};
use serde::Serialize;

use super::args::check_dp_arguments;
use super::catalog::{Catalog, PrivacyUnit, TableEntry};
use super::check::{analyze, no_duplicate_sites};
use super::costing::{domain_keys, plan_costs, unit_column};
use super::refusal::{Refusal, RefusalKind as K};
use super::sites::prepare;
use crate::privacy::ledger::Reservation;
use crate::privacy::{Budget, Ledger, MechanismRecord, PrivacyLoss, charge_failure};

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
    /// The result's columns (also when there are no batches).
    pub schema: SchemaRef,
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
    pub(super) ctx: SessionContext,
    pub(super) catalog: Catalog,
    /// Behind a mutex only so that a session is `Sync` (a server holds
    /// `&SqlEngine` across awaits on other threads); one session uses it at a time.
    pub(super) ledger: Option<parking_lot::Mutex<Ledger>>,
    pub(super) rng: DpRng,
    pub(super) unsafe_seed: Option<u64>,
    /// The caller (a release pipeline) has reserved the budget already.
    pub(super) precharged: bool,
    /// Groups summing at least this many values are re-aggregated with 128-bit sums.
    pub(super) wide_from: i128,
    /// The analyst queries are charged for (`dpflow serve`): each charge must
    /// also fit their grant in the ledger.
    pub(super) analyst: Option<String>,
    /// The releases after the first of [`SqlEngine::audit_releases`] (only
    /// ever filled by it: the repeat count is an argument, never session state).
    pub(super) audit_out: Vec<Vec<RecordBatch>>,
}

/// What an analyst has left on one ledger dataset (`SHOW dp_budget`).
#[derive(Debug, Clone, Serialize)]
pub struct AnalystBudget {
    /// The ledger dataset.
    pub dataset: String,
    /// The analyst's grant (`None`: no grant, every query on it is refused).
    pub grant: Option<Budget>,
    /// Spent by the analyst (grant's unit).
    pub spent: f64,
    /// Left of the grant.
    pub remaining: f64,
    /// Left of the dataset's total (shared by every analyst).
    pub dataset_remaining: f64,
}

impl SqlEngine {
    /// Opens a session: registers the catalog's tables (protected ones typed
    /// through their domain, with the privacy-unit column passed through), the
    /// DP functions, and the ledger.
    pub async fn open(catalog: Catalog, unsafe_seed: Option<u64>) -> Result<Self> {
        if unsafe_seed.is_some() && catalog.ledger.is_some() {
            return Err(SqlError::SeededLedger);
        }
        // Protected reads run where the catalog says: a cluster (connected, and
        // checked to answer, before anything is charged) or this process.
        let ctx = match &catalog.cluster {
            Some(c) => crate::io::session_context_on(Some(&c.connect().await?)),
            None => crate::io::session_context(),
        };
        for f in dpflow_udfs::dp::dp_aggregates() {
            ctx.register_udaf(f);
        }
        for f in dpflow_udfs::dp::ci_markers() {
            ctx.register_udf(f);
        }
        ctx.register_udf(datafusion::logical_expr::ScalarUDF::from(dpflow_udfs::dp::KeyedHash::default()));
        ctx.register_udtf(
            "synthetic",
            Arc::new(super::synthetic::SyntheticFunction {
                models: catalog.models.clone(),
                allow_paths: true,
                seed: unsafe_seed,
            }),
        );
        for function in
            [super::table_calls::DpTableFunctionKind::Marginals, super::table_calls::DpTableFunctionKind::Synthesize]
        {
            ctx.register_udtf(
                function.name(),
                Arc::new(super::table_calls::DpTableFunction {
                    function,
                    tables: catalog.tables.clone(),
                    confidence: catalog.confidence,
                }),
            );
        }
        for t in catalog.tables.values() {
            let raw = t.dataset.raw(&ctx).await?.into_view();
            let passthrough = match &t.unit {
                PrivacyUnit::Column(c) => vec![c.clone()],
                PrivacyUnit::Row => vec![],
            };
            let typed =
                dpflow_udfs::domain::EncodedTable::typed_with(raw, Arc::new(t.dataset.domain().clone()), passthrough)
                    .map_err(|e| SqlError::Catalog {
                    path: catalog.path.display().to_string(),
                    problem: format!("tables.{}: {e}", t.name),
                })?;
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
                Some(parking_lot::Mutex::new(l))
            }
            Some(p) => Some(parking_lot::Mutex::new(Ledger::open(p)?)),
        };
        Ok(Self {
            ctx,
            catalog,
            ledger,
            rng: DpRng::new(unsafe_seed)?,
            unsafe_seed,
            precharged: false,
            wide_from: 1 << 32,
            analyst: None,
            audit_out: Vec::new(),
        })
    }

    /// A session of one analyst (`dpflow serve`): only the catalog tables in
    /// `tables` (their role) are registered, so no query can name another,
    /// and every charge is made for `analyst` ([`crate::privacy::Ledger::reserve_for`]).
    pub async fn open_for_analyst(
        mut catalog: Catalog,
        analyst: &str,
        tables: &std::collections::BTreeSet<String>,
    ) -> Result<Self> {
        catalog.tables.retain(|name, _| tables.contains(name));
        catalog.create_ledger = None;
        if catalog.ledger.is_none() {
            return Err(SqlError::NoLedger);
        }
        let mut e = Self::open(catalog, None).await?;
        e.analyst = Some(analyst.to_string());
        // A served analyst names catalog models only, never files on the server.
        e.ctx.register_udtf(
            "synthetic",
            Arc::new(super::synthetic::SyntheticFunction {
                models: e.catalog.models.clone(),
                allow_paths: false,
                seed: None,
            }),
        );
        Ok(e)
    }

    /// The catalog this session serves (for an analyst: only their tables).
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The result schema `sql` would have, from its plan alone: checks and
    /// refusals run, nothing is charged and no protected data is read (what
    /// a client's Describe gets before it executes).
    pub async fn describe(&mut self, sql: &str) -> Result<SchemaRef> {
        let (prepared, checked) = self.plan_checked(sql).await?;
        if prepared.explain {
            return Ok(explain_schema());
        }
        Ok(match checked {
            Checked::Imputed(plan) => imputed_schema(&super::imputed::plan_imputed(
                &plan,
                &self.catalog,
                &prepared.sites,
                self.catalog.query_budget,
            )?),
            Checked::Dp(plan, _) | Checked::Synthetic(plan) | Checked::DpTables(plan) => output_schema(&plan),
        })
    }

    /// Parses, plans and checks `sql` (reads no data, charges nothing): the
    /// plan of a `dp_imputed_*` query, or the coerced plan of a DP query and
    /// its analysis.
    async fn plan_checked(&self, sql: &str) -> Result<(super::sites::Prepared, Checked)> {
        let prepared = prepare(sql)?;
        let plan = self.ctx.state().create_logical_plan(&prepared.sql).await?;
        refuse_statements(&plan)?;
        refuse_placeholders(&plan)?;
        no_duplicate_sites(&plan)?;
        if super::imputed::uses_imputed(&prepared.sites) {
            return Ok((prepared, Checked::Imputed(plan)));
        }
        if !super::table_plan::calls_in(&plan).is_empty() {
            super::table_plan::check_reads(&plan, &self.catalog, !prepared.sites.is_empty())?;
            return Ok((prepared, Checked::DpTables(plan)));
        }
        if prepared.sites.is_empty() && super::synthetic::synthetic_only(&plan, &self.catalog) {
            return Ok((prepared, Checked::Synthetic(plan)));
        }
        analyze(&plan, &self.catalog)?;
        // Again after type coercion: implicit casts must not be able to fail either.
        // From here on the coerced plan is the plan (its types are the rows' types).
        let (plan, analysis) = super::check::analyze_coerced(&plan, &self.catalog, self.ctx.state().config_options())?;
        Ok((prepared, Checked::Dp(plan, Box::new(analysis))))
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
        Ok(self.query_inner(sql, budget, true, 1).await?.mechanisms)
    }

    /// **Privacy audits only** (tests/it/dp_audit_sql.rs): reads the data of a DP
    /// query once and releases it `k` times with independent noise, through
    /// the same release code as [`SqlEngine::query`] (partition selection,
    /// noise, post-processing), so an audit can estimate the mechanism's
    /// privacy loss from many draws on neighbouring datasets. `k` releases of
    /// one read cost `k` times the query's budget, so this is refused unless
    /// the session is seeded (`--unsafe-seed`, output marked unsafe) and has
    /// no ledger: it can never run on a ledger-backed dataset.
    #[doc(hidden)]
    pub async fn audit_releases(
        &mut self,
        sql: &str,
        budget: Option<Budget>,
        k: usize,
    ) -> Result<Vec<Vec<RecordBatch>>> {
        if self.unsafe_seed.is_none() || self.ledger.is_some() || self.precharged || k == 0 {
            return Err(SqlError::Internal(
                "audit releases need a seeded session without a ledger (privacy audits only)".into(),
            ));
        }
        self.audit_out.clear();
        let first = self.query_inner(sql, budget, false, k).await;
        let mut all = vec![first?.batches];
        all.append(&mut self.audit_out);
        if all.len() != k {
            return Err(SqlError::Internal("this query kind has no audit releases (only dp_* aggregates)".into()));
        }
        Ok(all)
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
        self.catalog.tables.get(name).ok_or_else(|| SqlError::UnknownTable(name.to_string()))
    }

    /// Runs (or explains) one query with `budget` (default: the catalog's query budget).
    pub async fn query(&mut self, sql: &str, budget: Option<Budget>) -> Result<QueryResult> {
        self.query_inner(sql, budget, false, 1).await
    }

    /// Plans, charges and runs `sql`; `releases` is 1 except in
    /// [`SqlEngine::audit_releases`].
    async fn query_inner(
        &mut self,
        sql: &str,
        budget: Option<Budget>,
        force_explain: bool,
        releases: usize,
    ) -> Result<QueryResult> {
        let (prepared, checked) = self.plan_checked(sql).await?;
        let (plan, analysis) = match checked {
            Checked::Imputed(plan) => return self.imputed_query(&plan, &prepared, budget, force_explain).await,
            Checked::Synthetic(plan) => {
                if prepared.explain || force_explain {
                    return Ok(explained(vec![]));
                }
                return self.synthetic_query(plan).await;
            }
            Checked::DpTables(plan) => {
                return self.dp_table_query(plan, budget, prepared.explain || force_explain).await;
            }
            Checked::Dp(plan, analysis) => (plan, *analysis),
        };
        let DpPlan { entry, agg, unit, domain_keys, planned, selection, records } =
            self.plan_dp(&plan, &analysis, &prepared, budget).await?;
        if prepared.explain || force_explain {
            return Ok(explained(records));
        }
        // Reserve before touching data; refuse if it does not fit.
        let reservation = self.reserve(&entry.ledger_dataset, &records)?;
        // A panic after the read is caught and charged like any failure.
        let outcome = guarded(self.execute(
            &plan,
            &agg,
            &entry,
            unit.as_ref(),
            &planned,
            domain_keys,
            selection.as_ref(),
            releases,
        ))
        .await;
        self.settle(outcome, reservation, records)
    }

    /// Runs a query over synthetic rows (and public tables) as ordinary SQL:
    /// post-processing of a DP model, nothing charged.
    async fn synthetic_query(&self, plan: LogicalPlan) -> Result<QueryResult> {
        let (schema, batches) = self.run_released(plan).await?;
        Ok(QueryResult { schema, batches, mechanisms: vec![], explain: None, charge_id: None, remaining: None })
    }

    /// Runs a plan that reads only released (or public) rows, as ordinary
    /// SQL, with the output columns named as planned.
    pub(super) async fn run_released(&self, plan: LogicalPlan) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let schema = output_schema(&plan);
        let batches = self.ctx.execute_logical_plan(plan).await?.collect().await?;
        let batches = batches
            .into_iter()
            .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok((schema, batches))
    }

    /// Everything about a checked DP query that is decided before any
    /// protected data is read: its table, contribution bounds, GROUP BY keys
    /// or partition selection, and each aggregate's noise and cost.
    async fn plan_dp(
        &self,
        plan: &LogicalPlan,
        analysis: &super::check::Analysis,
        prepared: &super::sites::Prepared,
        budget: Option<Budget>,
    ) -> Result<DpPlan> {
        let entry = self.table(&analysis.table)?.clone();
        if let Some(why) = entry.dataset.domain().dp_read_refusal() {
            return Err(Refusal::new(K::TablePolicy, format!("table {}: {why}", entry.name)).into());
        }
        for j in &analysis.public_joins {
            self.check_unique_keys(j).await?;
        }
        let agg = analysis.aggregate.clone();
        let unit = unit_column(&agg, &entry)?;
        check_dp_arguments(&agg)?;
        // Plan errors that do not depend on the data (a literal that does not convert)
        // surface here, before anything is charged.
        self.ctx.state().optimize(plan)?;
        let budget = budget.or(self.catalog.query_budget);
        // Domain-enumerable GROUP BY keys, else partition selection.
        let domain_keys = domain_keys(&self.catalog, &agg, &entry)?;
        let needs_selection = !agg.group_expr.is_empty() && domain_keys.is_none();
        let (mut planned, selection) = plan_costs(&agg, &entry, &prepared.sites, budget, needs_selection)?;
        let cis = super::release::ci_requests(plan, &planned, self.catalog.confidence);
        super::release::check_markers(plan, &cis)?;
        let ends: Vec<(usize, bool, f64)> = cis.iter().map(|r| (r.agg, r.side_high, r.level)).collect();
        super::costing::split_quantile_for_intervals(&mut planned, &ends)?;
        let mut records: Vec<MechanismRecord> = planned.iter().flat_map(|p| p.records.clone()).collect();
        if let Some((rec, _, _)) = &selection {
            records.push(rec.clone());
        }
        Ok(DpPlan { entry, agg, unit, domain_keys, planned, selection, records })
    }

    /// The mechanisms a query would charge and the predicted error of each
    /// number it would release ([`super::predict`]): plans it, reads no
    /// protected data, charges nothing.
    pub async fn predict(
        &mut self,
        sql: &str,
        budget: Option<Budget>,
        assumptions: &super::predict::Assumptions,
    ) -> Result<(Vec<MechanismRecord>, Vec<crate::privacy::Prediction>)> {
        let (prepared, checked) = self.plan_checked(sql).await?;
        match checked {
            Checked::Imputed(plan) => {
                let r = self.imputed_query(&plan, &prepared, budget, true).await?;
                let why = "a query over DP-imputed values is calibrated to the smooth sensitivity of the imputation, \
                           which depends on the data: no error can be predicted before reading it";
                Ok((
                    r.mechanisms,
                    vec![crate::privacy::Prediction::new("dp_imputed_*", "imputed", assumptions.level, why)],
                ))
            }
            Checked::Synthetic(_) => Ok((
                vec![],
                vec![crate::privacy::Prediction::new(
                    "synthetic rows",
                    "synthetic",
                    assumptions.level,
                    "sampled from a saved DP model: post-processing, no budget and no noise of its own (the \
                     model's release carries its error)",
                )],
            )),
            Checked::DpTables(plan) => {
                use super::table_plan as t;
                let calls = t::calls_in(&plan);
                let budgets = t::budgets(&calls, budget.or(self.catalog.query_budget))?;
                Ok((t::records(&calls, &budgets)?, t::predictions(&calls, &budgets, assumptions)))
            }
            Checked::Dp(plan, analysis) => {
                let d = self.plan_dp(&plan, &analysis, &prepared, budget).await?;
                let keys = d.domain_keys.as_ref().map(|k| k.len());
                let mut preds = super::predict::predict(&d.planned, d.selection.as_ref(), keys, assumptions);
                // Name each prediction after the output column that shows the aggregate.
                let names = output_names(&plan);
                for p in &mut preds {
                    if let Some((_, alias)) = names.iter().find(|(field, _)| *field == p.target) {
                        p.target = alias.clone();
                    }
                }
                Ok((d.records, preds))
            }
        }
    }

    /// Reserves `records` in the ledger before any data is read (refusing a
    /// query that does not fit), or checks that running unrecorded is allowed.
    pub(super) fn reserve(&mut self, dataset: &str, records: &[MechanismRecord]) -> Result<Option<Reservation>> {
        let release_id = release_id();
        match self.ledger.as_mut() {
            Some(l) => {
                let analyst = self.analyst.as_deref();
                let r = blocking(|| l.get_mut().reserve_for(dataset, &release_id, records, None, analyst))?;
                // A query's id is new: finding a reservation under it would mean two
                // queries share one charge.
                if r.resumed {
                    return Err(SqlError::Internal(format!("release id {release_id} was already reserved")));
                }
                Ok(Some(r))
            }
            None => {
                if self.unsafe_seed.is_none() && !self.precharged {
                    return Err(SqlError::NoLedger);
                }
                Ok(None)
            }
        }
    }

    /// Commits the reservation when the query succeeded. A failure happens
    /// after protected data was read, so it is charged too (status `failed`)
    /// and its message is replaced by one that depends on public inputs only
    /// ([`crate::privacy::failure`]).
    pub(super) fn settle(
        &self,
        outcome: Result<(SchemaRef, Vec<RecordBatch>)>,
        reservation: Option<Reservation>,
        records: Vec<MechanismRecord>,
    ) -> Result<QueryResult> {
        match (outcome, reservation) {
            (Ok((schema, batches)), Some(r)) => {
                let l = self.ledger.as_ref().expect("reserved").lock();
                blocking(|| l.commit(r.charge_id))?;
                Ok(QueryResult {
                    schema,
                    batches,
                    mechanisms: records,
                    explain: None,
                    charge_id: Some(r.charge_id),
                    remaining: Some(r.remaining),
                })
            }
            (Ok((schema, batches)), None) => Ok(QueryResult {
                schema,
                batches,
                mechanisms: records,
                explain: None,
                charge_id: None,
                remaining: None,
            }),
            (Err(e), Some(r)) => {
                let l = self.ledger.as_ref().expect("reserved").lock();
                Err(blocking(|| charge_failure("query", Some((&l, r.charge_id)), e)))
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
            return Err(Refusal::new(K::TablePolicy, format!("table {}: {why}", ip.table.name)).into());
        }
        let imputed = &ip.table.impute.as_ref().expect("checked by plan_imputed").columns;
        let records: Vec<MechanismRecord> = ip
            .calls
            .iter()
            .flat_map(|(q, eps)| query_records(q, imputed, Estimator::Smooth, &PrivacyLoss::Pure { epsilon: *eps }))
            .collect();
        if prepared.explain || force_explain {
            // The smooth bound (hence the noise scale) is data-dependent: not shown.
            return Ok(explained(records));
        }
        let reservation = self.reserve(&ip.table.ledger_dataset, &records)?;
        let outcome = guarded(self.run_imputed(&ip)).await;
        self.settle(outcome, reservation, records)
    }

    async fn run_imputed(&mut self, ip: &super::imputed::ImputedPlan) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let imp = ip.table.impute.as_ref().expect("checked by plan_imputed");
        let queries: Vec<_> = ip.calls.iter().map(|(q, _)| q.clone()).collect();
        let data = crate::impute::summarize_on(&self.ctx, &ip.table.dataset, imp, &queries).await?;
        let mut values = Vec::new();
        for (i, (q, eps)) in ip.calls.iter().enumerate() {
            let r = crate::impute::answer(
                &data.one(i),
                std::slice::from_ref(q),
                crate::impute::Estimator::Smooth,
                *eps,
                None,
                &mut self.rng,
            )?;
            values.push(r[0].value);
        }
        let schema = imputed_schema(ip);
        let columns: Vec<ArrayRef> = ip
            .outputs
            .iter()
            .map(|(_, i)| Arc::new(datafusion::arrow::array::Float64Array::from(vec![values[*i]])) as ArrayRef)
            .collect();
        Ok((schema.clone(), vec![RecordBatch::try_new(schema, columns)?]))
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
        let b = dpflow_udfs::unwind::catch_unwind_future(async {
            self.ctx.execute_logical_plan(dup).await?.collect().await
        })
        .await?;
        if b.iter().any(|b| b.num_rows() > 0) {
            let list = join.keys.iter().map(|k| format!("{k}")).collect::<Vec<_>>().join(", ");
            return Err(Refusal::new(
                K::MultipliesRows,
                format!(
                    "the join keys ({list}) are not unique on the public side of the join: a protected row \
                 could match several public rows and be counted more than once. Join on a key that is unique in the \
                 public relation (deduplicate it first)"
                ),
            )
            .into());
        }
        Ok(())
    }
}

/// A query checked by [`SqlEngine::plan_checked`].
/// (aggregate field, output column) for every output column of `plan`'s
/// top projection that shows an aggregate's value unchanged under an alias.
fn output_names(plan: &LogicalPlan) -> Vec<(String, String)> {
    let mut node = plan;
    loop {
        match node {
            LogicalPlan::Projection(p) => {
                return p
                    .expr
                    .iter()
                    .filter_map(|e| match e {
                        Expr::Alias(a) => match a.expr.as_ref() {
                            Expr::Column(c) => Some((c.name.clone(), a.name.clone())),
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect();
            }
            LogicalPlan::Sort(s) => node = &s.input,
            LogicalPlan::Limit(l) => node = &l.input,
            _ => return vec![],
        }
    }
}

/// A DP query's plan-time decisions (see [`SqlEngine::plan_dp`]).
struct DpPlan {
    entry: TableEntry,
    agg: datafusion::logical_expr::Aggregate,
    unit: Option<datafusion::common::Column>,
    domain_keys: Option<Vec<Vec<datafusion::common::ScalarValue>>>,
    planned: Vec<super::costing::Planned>,
    selection: Option<super::costing::Selection>,
    records: Vec<MechanismRecord>,
}

enum Checked {
    /// Synthetic rows (and public tables) only: ordinary SQL, no budget.
    Synthetic(LogicalPlan),
    /// A `dp_imputed_*` query (checked by `imputed::plan_imputed`).
    Imputed(LogicalPlan),
    /// A DP query: its coerced plan and analysis.
    Dp(LogicalPlan, Box<super::check::Analysis>),
    /// A query over `dp_marginals()`/`synthesize()` calls (and public or
    /// synthetic tables): see [`super::table_release`].
    DpTables(LogicalPlan),
}

/// The columns a DP query returns: its plan's, named without call-site tags
/// (the released table has the aggregate's types, so the post-processed
/// plan's schema is this one).
pub(super) fn output_schema(plan: &LogicalPlan) -> SchemaRef {
    let fields: Vec<Field> = plan
        .schema()
        .fields()
        .iter()
        .map(|f| Field::new(super::sites::clean_dp_name(f.name()), f.data_type().clone(), true))
        .collect();
    Arc::new(Schema::new(fields))
}

/// The columns of a `dp_imputed_*` query: one nullable float per output.
fn imputed_schema(ip: &super::imputed::ImputedPlan) -> SchemaRef {
    Arc::new(Schema::new(ip.outputs.iter().map(|(n, _)| Field::new(n, DataType::Float64, true)).collect::<Vec<_>>()))
}

/// Only queries: a plan that would create, change or copy anything (e.g.
/// `(SELECT ... INTO t ...)`, which parses as a query) is refused before
/// anything runs.
fn refuse_statements(plan: &LogicalPlan) -> Result<()> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut found = false;
    plan.apply_with_subqueries(|node| {
        found |= matches!(
            node,
            LogicalPlan::Ddl(_) | LogicalPlan::Dml(_) | LogicalPlan::Copy(_) | LogicalPlan::Statement(_)
        );
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })?;
    if found {
        return Err(Refusal::new(
            K::Unsupported,
            "only SELECT queries are allowed (no DDL, DML or configuration statements, and no SELECT ... INTO)",
        )
        .into());
    }
    Ok(())
}

/// A DP query's values are part of what is checked and costed: a
/// placeholder (`$1`) left in its plan is refused before anything is charged
/// (DataFusion would only fail on it after the data was read).
fn refuse_placeholders(plan: &LogicalPlan) -> Result<()> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut found = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|x| {
                if let Expr::Placeholder(p) = x {
                    found = Some(p.id.clone());
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    match found {
        Some(id) => Err(Refusal::new(
            K::Unsupported,
            format!(
                "the query has a parameter placeholder ({id}): DP queries are checked and costed from their text, \
                 so write the value into the SQL"
            ),
        )
        .into()),
        None => Ok(()),
    }
}

/// A new release id for one query: unique across sessions of a process (a
/// process-wide counter) and across processes and hosts (the pid, the time
/// and 64 random bits), so two queries never share a reservation.
fn release_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    let nonce: u64 = rand::random();
    format!("sql-{}-{}-{n}-{nonce:016x}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"), std::process::id())
}

/// Runs what follows a reservation with panics caught: a panic becomes an
/// error, which `settle` then charges with its text withheld.
pub(super) async fn guarded<T>(run: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match dpflow_udfs::unwind::catch_unwind_future(async { Ok(run.await) }).await {
        Ok(r) => r,
        Err(panic) => Err(panic.into()),
    }
}

/// Runs a ledger call (SQLite, which may wait for another process's lock)
/// without stalling the other tasks of a multi-threaded runtime (a server's
/// other sessions); on any other thread it just runs.
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// What `analyst` has left on each ledger dataset behind the protected
/// tables of `catalog` (a dataset without a grant shows none and 0 left).
pub fn analyst_budgets(ledger: &Ledger, catalog: &Catalog, analyst: &str) -> Result<Vec<AnalystBudget>> {
    let datasets: std::collections::BTreeSet<&str> =
        catalog.tables.values().filter(|t| !t.public).map(|t| t.ledger_dataset.as_str()).collect();
    let mut out = Vec::new();
    for d in datasets {
        out.push(match ledger.analyst_status(d, analyst) {
            Ok(s) => AnalystBudget {
                dataset: s.dataset,
                grant: Some(s.budget),
                spent: s.spent,
                remaining: s.remaining,
                dataset_remaining: s.dataset_remaining,
            },
            Err(crate::privacy::LedgerError::NoGrant { .. }) => AnalystBudget {
                dataset: d.to_string(),
                grant: None,
                spent: 0.0,
                remaining: 0.0,
                dataset_remaining: ledger.status(d)?.remaining,
            },
            Err(e) => return Err(e.into()),
        });
    }
    Ok(out)
}

/// The columns of [`explain_batch`].
pub fn explain_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("aggregate", DataType::Utf8, false),
        Field::new("mechanism", DataType::Utf8, false),
        Field::new("sensitivity", DataType::Float64, true),
        Field::new("noise_scale", DataType::Float64, true),
        Field::new("loss", DataType::Utf8, false),
    ]))
}

/// EXPLAIN rows as one record batch (for clients that take tables).
pub fn explain_batch(rows: &[ExplainRow]) -> Result<RecordBatch> {
    use datafusion::arrow::array::{Float64Array, StringArray};
    let text = |f: fn(&ExplainRow) -> &str| Arc::new(StringArray::from_iter_values(rows.iter().map(f))) as ArrayRef;
    Ok(RecordBatch::try_new(
        explain_schema(),
        vec![
            text(|r| &r.aggregate),
            text(|r| &r.mechanism),
            Arc::new(rows.iter().map(|r| r.sensitivity).collect::<Float64Array>()),
            Arc::new(rows.iter().map(|r| r.noise_scale).collect::<Float64Array>()),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.loss.as_str()))),
        ],
    )?)
}

/// The EXPLAIN answer for `records` (nothing charged, no data read).
pub(super) fn explained(records: Vec<MechanismRecord>) -> QueryResult {
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
    QueryResult {
        schema: explain_schema(),
        batches: vec![],
        mechanisms: records,
        explain: Some(rows),
        charge_id: None,
        remaining: None,
    }
}
