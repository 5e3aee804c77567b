//! Releasing the DP table calls of a query (`dp_marginals`, `synthesize`;
//! [`super::table_calls`]): every call is charged at plan time, before any
//! protected data is read, then run once in our own code; its rows replace
//! its placeholder in the plan, and DataFusion runs the rest of the query
//! over them as post-processing. However often DataFusion evaluates a
//! reference to a call (a CTE used twice, a plan executed again), it reads
//! the one released table: noise is drawn once per call.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::options::ParquetReadOptions;
use datafusion::logical_expr::LogicalPlan;

use super::catalog::Catalog;
use super::engine::{QueryResult, SqlEngine};
use super::error::{Result, SqlError};
use super::refusal::{Refusal, RefusalKind as K};
use super::table_calls::{CallKind, DpTableCall};
use crate::measure::{NoisyMarginal, ReleaseAccountant};
use crate::privacy::accuracy::{integer_abs_quantile, integer_noise_rmse};
use crate::privacy::{Budget, MechanismRecord, Prediction, PrivacyFilter};

/// Runs a synthesis on a thread and runtime of its own: the synthesizers'
/// futures are not `Send`, and a served session's query future must be.
async fn synthesize_apart(
    ctx: datafusion::prelude::SessionContext,
    req: crate::synth::run::SynthRequest,
) -> Result<()> {
    let (tx, rx) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name("dpflow-synthesize".into())
        .spawn(move || {
            let done = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt
                    .block_on(crate::synth::run::run_synth(&ctx, &req, &|_| {}))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(done);
        })
        .map_err(|e| SqlError::Internal(format!("starting a synthesis thread: {e}")))?;
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SqlError::Internal(e)),
        Err(_) => Err(SqlError::Internal("the synthesis thread stopped".into())),
    }
}

fn blocking_unit(ledger: &crate::privacy::Ledger, dataset: &str) -> Result<String> {
    Ok(super::engine::blocking(|| ledger.dataset(dataset))?.privacy_unit)
}

fn call_of(provider: &Arc<dyn TableProvider>) -> Option<&DpTableCall> {
    provider.downcast_ref::<DpTableCall>()
}

/// The DP table calls of `plan`, each once (by id), in plan order.
pub(super) fn calls_in(plan: &LogicalPlan) -> Vec<DpTableCall> {
    let mut calls: Vec<DpTableCall> = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(s) = node
            && let Ok(p) = source_as_provider(&s.source)
            && let Some(c) = call_of(&p)
            && !calls.iter().any(|x| x.id == c.id)
        {
            calls.push(c.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    calls
}

/// A query with DP table calls may read only them, `synthetic()` rows and
/// public tables, and calls no `dp_*` aggregate (whose engine path reads
/// one protected table directly).
pub(super) fn check_reads(plan: &LogicalPlan, catalog: &Catalog, has_aggregates: bool) -> Result<()> {
    if has_aggregates {
        return Err(Refusal::new(
            K::Unsupported,
            "dp_marginals()/synthesize() and dp_* aggregates cannot share a query: run the aggregates in a query of \
             their own",
        )
        .into());
    }
    let mut protected: Option<String> = None;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(s) = node {
            let p = source_as_provider(&s.source).ok();
            let released = p.as_ref().is_some_and(|p| {
                call_of(p).is_some() || p.downcast_ref::<super::synthetic::SyntheticTable>().is_some()
            });
            let public = catalog.tables.get(s.table_name.table()).is_some_and(|t| t.public);
            if !released && !public {
                protected = Some(s.table_name.to_string());
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match protected {
        Some(t) => Err(Refusal::new(
            K::TablePolicy,
            format!(
                "a query over dp_marginals()/synthesize() may also read public tables and synthetic() rows, not the \
                 protected table {t}: query it with dp_* aggregates in a query of its own"
            ),
        )
        .into()),
        None => Ok(()),
    }
}

/// Each call's budget: its own (`epsilon =>`, `rho =>`), or the query's
/// budget split evenly over the calls (basic composition). Either every
/// call names its budget or none does, as with `dp_*` aggregates.
pub(super) fn budgets(calls: &[DpTableCall], query: Option<Budget>) -> Result<Vec<Budget>> {
    let explicit = calls.iter().filter(|c| c.budget.is_some()).count();
    if explicit == calls.len() {
        return Ok(calls.iter().map(|c| c.budget.expect("counted")).collect());
    }
    if explicit > 0 {
        return Err(Refusal::new(
            K::Budget,
            "give a budget (epsilon => or rho =>) to every dp_marginals()/synthesize() call of the query, or to none",
        )
        .into());
    }
    let Some(b) = query else {
        return Err(Refusal::new(
            K::Budget,
            "no budget: give the call epsilon => or rho =>, run with --epsilon [--delta] or --rho, or set a \
             query_budget in the catalog",
        )
        .into());
    };
    let k = calls.len() as f64;
    let each = match b {
        Budget::Pure { epsilon } => Budget::Pure { epsilon: epsilon / k },
        Budget::Approx { epsilon, delta } => Budget::Approx { epsilon: epsilon / k, delta: delta / k },
        Budget::Zcdp { rho } => Budget::Zcdp { rho: rho / k },
    };
    Ok(vec![each; calls.len()])
}

/// The mechanisms of every call (what is charged before any data is read).
pub(super) fn records(calls: &[DpTableCall], budgets: &[Budget]) -> Result<Vec<MechanismRecord>> {
    let mut out = Vec::new();
    for (c, b) in calls.iter().zip(budgets) {
        let r = c.records(b).map_err(|e| Refusal::new(K::Budget, format!("{}: {e}", c.describe())))?;
        out.extend(r);
    }
    Ok(out)
}

/// The one ledger dataset the calls charge (calls on tables with different
/// ledger datasets go in separate queries: one query is one charge).
pub(super) fn ledger_dataset(calls: &[DpTableCall]) -> Result<String> {
    let sets: std::collections::BTreeSet<&str> = calls.iter().map(|c| c.table.ledger_dataset.as_str()).collect();
    if sets.len() != 1 {
        return Err(Refusal::new(
            K::Unsupported,
            format!(
                "the calls charge different ledger datasets ({}): one query is one charge, so run one query per \
                 dataset",
                sets.into_iter().collect::<Vec<_>>().join(", ")
            ),
        )
        .into());
    }
    Ok(sets.into_iter().next().expect("one").to_string())
}

/// Predicted error of what the calls release (public inputs only): each
/// marginal's exact noise interval; a synthesizer's per-marginal noise and
/// workload floor ([`crate::synth::predict`]).
pub(super) fn predictions(
    calls: &[DpTableCall],
    budgets: &[Budget],
    assumptions: &super::predict::Assumptions,
) -> Vec<Prediction> {
    let mut out = Vec::new();
    for (c, b) in calls.iter().zip(budgets) {
        match &c.kind {
            CallKind::Marginals { queries, .. } => {
                let noise = DpTableCall::marginal_noise(queries.len(), b);
                for q in queries {
                    let mut p = Prediction::new(
                        format!("{}: {}", c.describe(), q.attrs.join(",")),
                        "count",
                        assumptions.level,
                        "every cell's noise, exactly (integer noise of a known scale)",
                    );
                    p.half_width = Some(integer_abs_quantile(&noise, assumptions.level));
                    p.rmse = Some(integer_noise_rmse(&noise));
                    out.push(p);
                }
            }
            CallKind::Synthesize { mechanism, workload, missing, .. } => {
                let domain = c.table.dataset.domain();
                let model = if missing.models_nulls() { domain.clone() } else { domain.without_nulls() };
                let Ok(w) = crate::synth::workload::Workload::parse(workload, &model) else { continue };
                let options = crate::synth::SynthOptions::default();
                let missing_options = crate::missing::StrategyOptions::default();
                let mut ps = crate::synth::predict::predict(&crate::synth::predict::SynthForecastInput {
                    mechanism: *mechanism,
                    domain: &model,
                    workload: &w,
                    budget: *b,
                    options: &options,
                    missing: *missing,
                    missing_options: &missing_options,
                    rows: assumptions.rows,
                    level: assumptions.level,
                });
                for p in &mut ps {
                    p.target = format!("{}: {}", c.describe(), p.target);
                }
                out.extend(ps);
            }
        }
    }
    out
}

impl SqlEngine {
    /// Plans, charges and runs a query over DP table calls.
    pub(super) async fn dp_table_query(
        &mut self,
        plan: LogicalPlan,
        budget: Option<Budget>,
        explain: bool,
    ) -> Result<QueryResult> {
        let calls = calls_in(&plan);
        let budgets = budgets(&calls, budget.or(self.catalog.query_budget))?;
        let records = records(&calls, &budgets)?;
        let dataset = ledger_dataset(&calls)?;
        // Plan errors that do not depend on the data surface before the charge.
        self.ctx.state().optimize(&plan)?;
        if explain {
            return Ok(super::engine::explained(records));
        }
        // Marginals and synthesizers bound one row's influence: a ledger that
        // counts people by a column would be undercharged (as `dpflow synth` refuses).
        if let Some(l) = self.ledger.as_ref() {
            let unit = blocking_unit(&l.lock(), &dataset)?;
            if unit != "row" {
                return Err(Refusal::new(
                    K::TablePolicy,
                    format!(
                        "ledger dataset {dataset} counts people by {unit:?}; dp_marginals()/synthesize() bound one \
                         row's influence and need a ledger dataset with privacy unit `row`"
                    ),
                )
                .into());
            }
        }
        let reservation = self.reserve(&dataset, &records)?;
        // From here on protected data is read: every outcome is a release (a
        // panic too: caught, and charged like any failure).
        let run = async { Ok(self.run_dp_tables(plan, &calls, &budgets).await) };
        let outcome = match dpflow_udfs::unwind::catch_unwind_future(run).await {
            Ok(r) => r,
            Err(panic) => Err(panic.into()),
        };
        self.settle(outcome, reservation, records)
    }

    async fn run_dp_tables(
        &mut self,
        plan: LogicalPlan,
        calls: &[DpTableCall],
        budgets: &[Budget],
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        // Synthetic rows are written here and read back by the query; the
        // directory lives until the results are collected.
        let tmp = tempfile::tempdir().map_err(|e| SqlError::Internal(format!("a temporary directory: {e}")))?;
        let mut released: BTreeMap<u64, Arc<dyn TableProvider>> = BTreeMap::new();
        for (i, (c, b)) in calls.iter().zip(budgets).enumerate() {
            let provider: Arc<dyn TableProvider> = match &c.kind {
                CallKind::Marginals { queries, columns, level } => {
                    let noise = DpTableCall::marginal_noise(queries.len(), b);
                    let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(*b));
                    let noisy = crate::measure::measure(
                        &self.ctx,
                        &c.table.dataset,
                        queries,
                        &[noise],
                        &mut accountant,
                        &mut self.rng,
                    )
                    .await
                    .map_err(|e| SqlError::Internal(e.to_string()))?;
                    let batch = marginal_rows(c, &noisy, columns, *level)?;
                    Arc::new(datafusion::datasource::MemTable::try_new(batch.schema(), vec![vec![batch]])?)
                }
                CallKind::Synthesize { mechanism, rows, workload, missing } => {
                    let out = tmp.path().join(format!("call-{i}.parquet")).display().to_string();
                    let req = crate::synth::run::SynthRequest {
                        dataset: c.table.dataset.clone(),
                        mechanism: *mechanism,
                        budget: *b,
                        workload: workload.clone(),
                        rows: *rows,
                        out: out.clone(),
                        model_out: None,
                        record_out: Some(String::new()),
                        // Charged by this engine already.
                        ledger: None,
                        release_id: None,
                        unsafe_seed: self.unsafe_seed.map(|s| s.wrapping_add(i as u64)),
                        options: crate::synth::SynthOptions::default(),
                        decode: dpflow_udfs::domain::DecodeMode::Uniform,
                        missing: *missing,
                        missing_options: crate::missing::StrategyOptions::default(),
                        amplification: None,
                    };
                    synthesize_apart(self.ctx.clone(), req).await?;
                    let schema = c.schema();
                    self.ctx.read_parquet(out, ParquetReadOptions::default().schema(&schema)).await?.into_view()
                }
            };
            released.insert(c.id, provider);
        }
        // Swap every placeholder for its released rows.
        let plan = plan
            .transform_up_with_subqueries(|node| {
                if let LogicalPlan::TableScan(mut s) = node {
                    let id = source_as_provider(&s.source).ok().and_then(|p| call_of(&p).map(|c| c.id));
                    if let Some(p) = id.and_then(|id| released.get(&id)) {
                        s.source = provider_as_source(p.clone());
                        return Ok(Transformed::yes(LogicalPlan::TableScan(s)));
                    }
                    return Ok(Transformed::no(LogicalPlan::TableScan(s)));
                }
                Ok(Transformed::no(node))
            })?
            .data;
        let schema = super::engine::output_schema(&plan);
        let batches = self.ctx.execute_logical_plan(plan).await?.collect().await?;
        let batches = batches
            .into_iter()
            .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        drop(tmp);
        Ok((schema, batches))
    }
}

/// One row per cell of each noisy marginal (first attribute slowest).
fn marginal_rows(call: &DpTableCall, noisy: &[NoisyMarginal], columns: &[String], level: f64) -> Result<RecordBatch> {
    let domain = call.table.dataset.domain();
    let total: usize = noisy.iter().map(|m| m.values.len()).sum();
    let mut label = StringBuilder::with_capacity(total, total * 8);
    let mut values: Vec<StringBuilder> =
        columns.iter().map(|_| StringBuilder::with_capacity(total, total * 8)).collect();
    let (mut count, mut sigma, mut lo, mut hi) =
        (Vec::with_capacity(total), Vec::with_capacity(total), Vec::with_capacity(total), Vec::with_capacity(total));
    for m in noisy {
        let cols: Vec<_> = m
            .query
            .attrs
            .iter()
            .map(|a| domain.column(a).ok_or_else(|| SqlError::Internal(format!("column {a} left the domain"))))
            .collect::<Result<_>>()?;
        if cols.iter().map(|c| c.cardinality()).ne(m.shape.iter().copied()) {
            return Err(SqlError::Internal("a marginal's shape differs from its domain".into()));
        }
        let at: Vec<usize> = m
            .query
            .attrs
            .iter()
            .map(|a| columns.iter().position(|c| c == a).expect("every attribute has a column"))
            .collect();
        let sd = integer_noise_rmse(&m.noise);
        let half = integer_abs_quantile(&m.noise, level);
        let name = m.query.attrs.join(",");
        for (cell, v) in m.values.iter().enumerate() {
            let mut codes = vec![0u32; cols.len()];
            let mut rest = cell;
            for k in (0..cols.len()).rev() {
                codes[k] = (rest % m.shape[k]) as u32;
                rest /= m.shape[k];
            }
            label.append_value(&name);
            for (j, b) in values.iter_mut().enumerate() {
                match at.iter().position(|&x| x == j) {
                    Some(k) if Some(codes[k]) != cols[k].null_code() => b.append_value(cols[k].label(codes[k])),
                    _ => b.append_null(),
                }
            }
            count.push(*v as i64);
            sigma.push(sd);
            lo.push(v - half);
            hi.push(v + half);
        }
    }
    let mut arrays: Vec<ArrayRef> = vec![Arc::new(label.finish())];
    arrays.extend(values.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    arrays.push(Arc::new(Int64Array::from(count)));
    for v in [sigma, lo, hi] {
        arrays.push(Arc::new(Float64Array::from(v)));
    }
    Ok(RecordBatch::try_new(call.schema(), arrays)?)
}
