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
use datafusion::common::tree_node::Transformed;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::options::ParquetReadOptions;
use datafusion::logical_expr::LogicalPlan;

use super::engine::{QueryResult, SqlEngine};
use super::error::{Result, SqlError};
use super::refusal::{Refusal, RefusalKind as K};
use super::table_calls::{CallKind, DpTableCall};
use super::table_plan::{budgets, call_of, calls_in, ledger_dataset, records};
use crate::measure::{NoisyMarginal, ReleaseAccountant};
use crate::privacy::accuracy::{integer_abs_quantile, integer_noise_rmse};
use crate::privacy::{Budget, PrivacyFilter};

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
        let outcome = super::engine::guarded(self.run_dp_tables(plan, &calls, &budgets)).await;
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
        // The synthetic rows' files are read until the results are collected.
        let out = self.run_released(plan).await;
        drop(tmp);
        out
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
        if cols.iter().map(|c| super::table_calls::cells_of(c, m.query.mode)).ne(m.shape.iter().copied()) {
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
        let name = m.query.label();
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
