//! Planning the DP table calls of a query (`dp_marginals`, `synthesize`;
//! [`super::table_calls`]): finding every call in a plan, what the query
//! may read besides them, each call's budget, the mechanisms charged before
//! any data is read, and the predicted error of what they release. Reads no
//! data; [`super::table_release`] runs them.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::LogicalPlan;

use super::catalog::Catalog;
use super::error::Result;
use super::refusal::{Refusal, RefusalKind as K};
use super::table_calls::{CallKind, DpTableCall};
use crate::privacy::accuracy::{integer_abs_quantile, integer_noise_rmse};
use crate::privacy::{Budget, MechanismRecord, Prediction};

pub(super) fn call_of(provider: &Arc<dyn TableProvider>) -> Option<&DpTableCall> {
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
                        format!("{}: {}", c.describe(), q.label()),
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
