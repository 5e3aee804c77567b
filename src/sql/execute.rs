//! Execution of a DP SQL query, once: the exact helper aggregates over the
//! contribution-bounded rows (64-bit, again in 128 bits for groups of 2³²+
//! values), the released keys (public domain or DP partition selection),
//! quantile histograms, the noise of [`super::release`], and the user's
//! post-processing over the released table.

use dpflow_udfs::unwind::catch_unwind_future;
use std::collections::HashMap;
use std::sync::Arc;

use super::error::{Result, SqlError};
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::functions_aggregate::expr_fn::{count, count_distinct, sum};
use datafusion::logical_expr::ExprSchemable;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, LogicalPlanBuilder, cast, col, lit, try_cast, when};
use dpflow_udfs::domain::ColumnKind;
use dpflow_udfs::noise::NoiseDistribution;

use super::catalog::TableEntry;
use super::costing::{Kind, Planned, Selection};
use super::engine::SqlEngine;
use super::exact::{Fixup, bound_contributions, clamp_expr, helper_exprs, scalar_f64, scalar_i128};
use super::release::{CiRequest, ci_requests, release_one};
use super::sites::clean_dp_name;

impl SqlEngine {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn execute(
        &mut self,
        plan: &LogicalPlan,
        agg: &Aggregate,
        entry: &TableEntry,
        unit: Option<&Column>,
        planned: &[Planned],
        domain_keys: Option<Vec<Vec<ScalarValue>>>,
        selection: Option<&Selection>,
        releases: usize,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let g = agg.group_expr.len();
        // Float keys canonical (one zero, one NaN) for grouping, bounding and ranking alike.
        let keyed = &canonical_keys(agg)?;
        let bounded = bound_contributions(keyed, entry, unit)?;
        let n_helpers: usize = planned.iter().map(|p| p.helpers.len()).sum();
        let n_logical = n_helpers + usize::from(selection.is_some());
        let (exact, order) =
            self.exact_helpers(keyed, entry, &bounded, planned, unit, selection.is_some(), n_logical).await?;
        let hist = self.quantile_histograms(keyed, &bounded, planned).await?;
        let ci_requests = ci_requests(plan, planned, self.catalog.confidence);
        // Noise, once per release: one release, except for
        // `SqlEngine::audit_releases`, which releases the same exact aggregates
        // again with independent noise (seeded sessions without a ledger only).
        let mut first = None;
        for _ in 0..releases.max(1) {
            let keys = self.released_keys(agg, domain_keys.as_deref(), selection, &exact, &order, n_helpers)?;
            let (columns, ci_cols) = self.noise(g, planned, &keys, &exact, &hist, &ci_requests, n_logical)?;
            let final_plan = post_process(plan, agg, columns, ci_cols, &ci_requests)?;
            let schema = super::engine::output_schema(&final_plan);
            let out =
                catch_unwind_future(async { self.ctx.execute_logical_plan(final_plan).await?.collect().await }).await?;
            let batches: Vec<RecordBatch> = out.into_iter().map(rename_dp_columns).collect();
            match first {
                None => first = Some((schema, batches)),
                Some(_) => self.audit_out.push(batches),
            }
        }
        Ok(first.expect("at least one release"))
    }

    /// The exact helper aggregates of every DP call per group key, as exact
    /// integers (64-bit sums, again in 128 bits when a group sums 2³² values or
    /// more), and the keys in the order the engine produced them.
    #[allow(clippy::too_many_arguments)]
    async fn exact_helpers(
        &self,
        agg: &Aggregate,
        entry: &TableEntry,
        bounded: &LogicalPlan,
        planned: &[Planned],
        unit: Option<&Column>,
        count_units: bool,
        n_logical: usize,
    ) -> Result<(Exact, Vec<Vec<ScalarValue>>)> {
        let g = agg.group_expr.len();
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
            if count_units {
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
            if helpers.is_empty() && agg.group_expr.is_empty() {
                // Only quantiles, without GROUP BY: there is nothing to aggregate here
                // (their histograms are a pass of their own), and DataFusion refuses an
                // aggregate of nothing, which used to fail such a query after its charge.
                return Ok((exact, order));
            }
            let helper_plan =
                LogicalPlanBuilder::from(bounded.clone()).aggregate(agg.group_expr.clone(), helpers)?.build()?;
            // Protected rows: where the session says (this process or its cluster).
            let batches = catch_unwind_future(dpflow_udfs::cluster::collect_logical(&self.ctx, helper_plan)).await?;
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
        Ok((exact, order))
    }

    /// The keys released: the public domain's keys, or those kept by DP
    /// partition selection (noisy unit counts above the threshold τ).
    fn released_keys(
        &mut self,
        agg: &Aggregate,
        domain_keys: Option<&[Vec<ScalarValue>]>,
        selection: Option<&Selection>,
        exact: &Exact,
        order: &[Vec<ScalarValue>],
        n_helpers: usize,
    ) -> Result<Vec<Vec<ScalarValue>>> {
        Ok(match (domain_keys, selection) {
            (Some(k), _) => k
                .iter()
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
                let mut order: Vec<&Vec<ScalarValue>> = order.iter().collect();
                order.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
                for key in order {
                    let units = exact.get(key).map_or(0, |v| v[n_helpers]);
                    // Unit counts are integers: discrete Laplace noise of scale b (exact, no floats),
                    // kept when above the integer threshold τ of the discrete tail.
                    let noisy = units.saturating_add(sampler.sample(&mut self.rng));
                    if noisy > *tau {
                        kept.push(key.clone());
                    }
                }
                kept
            }
            (None, None) => return Err(SqlError::Internal("no key policy".into())),
        })
    }

    /// Per group, the histogram of each quantile call's values over its public
    /// bins (a second exact pass, only when a query has a quantile).
    async fn quantile_histograms(
        &self,
        agg: &Aggregate,
        bounded: &LogicalPlan,
        planned: &[Planned],
    ) -> Result<Histograms> {
        let g = agg.group_expr.len();
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
                let hb = catch_unwind_future(dpflow_udfs::cluster::collect_logical(&self.ctx, hp)).await?;
                let mut m: HashMap<Vec<ScalarValue>, Vec<f64>> = HashMap::new();
                for b in &hb {
                    for r in 0..b.num_rows() {
                        let key: Vec<ScalarValue> =
                            (0..g).map(|c| ScalarValue::try_from_array(b.column(c), r)).collect::<Result<_, _>>()?;
                        let bin = ScalarValue::try_from_array(b.column(g), r)?;
                        if bin.is_null() {
                            // Only where the bin width is not finite (refused at plan time). A NaN
                            // value compares above hi (IEEE total order), so it is clamped to hi and
                            // counted in the last bin: the interval covers the data with NaN read as hi.
                            continue;
                        }
                        let bi = scalar_f64(&bin)?.max(0.0) as usize;
                        let n = scalar_f64(&ScalarValue::try_from_array(b.column(g + 1), r)?)?;
                        m.entry(key).or_insert_with(|| vec![0.0; bins])[bi.min(bins - 1)] += n;
                    }
                }
                hist.insert(pi, m);
            }
        }
        Ok(hist)
    }

    /// Noises every DP call for every released key, once: the released
    /// columns (keys, then one per call) and the requested confidence bounds.
    #[allow(clippy::too_many_arguments)]
    fn noise(
        &mut self,
        g: usize,
        planned: &[Planned],
        keys: &[Vec<ScalarValue>],
        exact: &Exact,
        hist: &Histograms,
        ci_requests: &[CiRequest],
        n_logical: usize,
    ) -> Result<(Columns, Columns)> {
        let zeros = vec![0i128; n_logical];
        let mut columns: Vec<Vec<ScalarValue>> = vec![Vec::new(); g + planned.len()];
        let mut ci_cols: Vec<Vec<ScalarValue>> = vec![Vec::new(); ci_requests.len()];
        for key in keys {
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
                let (value, cis) = release_one(p, h, histo, ci_requests, pi, &mut self.rng)?;
                columns[g + pi].push(value);
                for (k, v) in cis {
                    ci_cols[k].push(v);
                }
            }
        }
        Ok((columns, ci_cols))
    }
}

/// `agg` with each floating-point GROUP BY key made canonical: −0.0 becomes
/// +0.0 and every NaN one NaN. GROUP BY treats ±0 as one group, but the
/// `row_number` partition that caps a unit's rows per group compares bit
/// patterns, and the keyed hash that ranks a unit's groups (DataFusion's
/// `create_hashes`) treats ±0 as one value: without one canonical value the
/// three disagree and a unit could put 2·l∞ rows into one released group, or
/// two groups into one of its l0 slots (privacy review of issue 15). Only the
/// keys change (the output schema and post-processing use the original
/// aggregate); a canonical key cannot fail on a row.
fn canonical_keys(agg: &Aggregate) -> Result<Aggregate> {
    let schema = agg.input.schema();
    let mut out = agg.clone();
    out.group_expr = agg
        .group_expr
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let t = e.get_type(schema)?;
            if !t.is_floating() {
                return Ok(e.clone());
            }
            let x = e.clone().unalias();
            let typed = |v: f64| cast(lit(v), t.clone());
            Ok(when(datafusion::functions::math::expr_fn::isnan(x.clone()), typed(f64::NAN))
                .when(x.clone().eq(typed(0.0)), typed(0.0))
                .otherwise(x)?
                .alias(format!("__dp_key{i}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(out)
}

/// Released columns, one vector of values per column.
type Columns = Vec<Vec<ScalarValue>>;

/// Exact helper values per group key.
type Exact = HashMap<Vec<ScalarValue>, Vec<i128>>;

/// Per quantile call (by index), per group key, the counts of its bins.
type Histograms = HashMap<usize, HashMap<Vec<ScalarValue>, Vec<f64>>>;

/// The user's query with its DP aggregation replaced by the released table
/// (noisy values and confidence bounds): everything above it is
/// post-processing of released values.
fn post_process(
    plan: &LogicalPlan,
    agg: &Aggregate,
    columns: Columns,
    ci_cols: Columns,
    ci_requests: &[CiRequest],
) -> Result<LogicalPlan> {
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
    for r in ci_requests {
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
    Ok(final_plan)
}

/// Output column names without site tags.
fn rename_dp_columns(b: RecordBatch) -> RecordBatch {
    let fields: Vec<Field> =
        b.schema().fields().iter().map(|f| f.as_ref().clone().with_name(clean_dp_name(f.name()))).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), b.columns().to_vec()).unwrap_or(b)
}
