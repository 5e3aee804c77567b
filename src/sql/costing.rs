//! Costing and sensitivity of DP SQL, from the plan, the catalog and the
//! budget only (no data is read here): what each DP call computes ([`Kind`]),
//! the contribution bounds of a privacy unit (l0 groups, l∞ rows), each
//! call's budget share and the noise calibrated to it ([`plan_one`]), the
//! privacy-unit column, and the GROUP BY's public keys or the DP partition
//! selection that replaces them (docs/PRIVACY.md §3).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan};
use dpflow_udfs::domain::ColumnKind;
use dpflow_udfs::noise::NoiseDistribution;

use super::args::parse_f64;
use super::catalog::{Catalog, PrivacyUnit, TableEntry};
use super::error::{Result, SqlError};
use super::refusal::{Refusal, RefusalKind as K};
use super::sites::{CallSite, site_of};
use crate::privacy::convert::cdp_rho;
use crate::privacy::{Budget, MechanismRecord, PrivacyLoss, Share};

/// Largest number of public-domain keys a GROUP BY may enumerate.
const MAX_DOMAIN_KEYS: usize = 1_000_000;

/// The statistic a DP call computes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    Count { arg: Option<Expr> },
    Sum { arg: Expr, lo: f64, hi: f64 },
    Avg { arg: Expr, lo: f64, hi: f64 },
    Var { arg: Expr, lo: f64, hi: f64 },
    Quantile { arg: Expr, q: f64, lo: f64, hi: f64 },
}

/// A planned DP aggregate.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    /// Output field name in the aggregate's schema.
    pub(super) field: String,
    pub(super) kind: Kind,
    /// Noise per sub-statistic (in the statistic's own units).
    pub(super) noise: Vec<NoiseDistribution>,
    /// Grid exponent for real-valued sums (values are summed as integers of 2^k).
    pub(super) grid: i32,
    /// Records charged.
    pub(super) records: Vec<MechanismRecord>,
    /// Helper aggregate column names.
    pub(super) helpers: Vec<String>,
    /// Quantile: the exponential mechanism's ε per group, bin count, and score
    /// sensitivity (one unit moves each score by up to `max_rows_per_unit`).
    pub(super) quantile: Option<(f64, usize, f64)>,
}

/// One noised sub-statistic of a DP call. Its noise is drawn in the
/// statistic's integer units; [`SubStat::unit`] converts them back to the
/// answer's scale for the release record (never a label's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SubStat {
    /// The number of rows (or of non-null values): unit 1.
    Count,
    /// A sum of clamped values, in grid units g.
    Sum,
    /// A sum of clamped values minus the bounds' midpoint, in grid units g.
    CenteredSum,
    /// A sum of squares of (clamped − midpoint), in units g².
    Squares,
}

impl SubStat {
    /// What the release record says is noised.
    fn label(self) -> &'static str {
        match self {
            SubStat::Count => "count of non-null values",
            SubStat::Sum => "sum of clamped values",
            SubStat::CenteredSum => "sum of clamped values − midpoint",
            SubStat::Squares => "sum of squares of (clamped − midpoint)",
        }
    }

    /// The size of one integer unit of this statistic on the answer's scale.
    fn unit(self, g: f64) -> f64 {
        match self {
            SubStat::Count => 1.0,
            SubStat::Sum | SubStat::CenteredSum => g,
            SubStat::Squares => g * g,
        }
    }
}

/// DP partition selection: its release record, the discrete Laplace scale b
/// on unit counts, and the integer threshold τ.
pub(super) type Selection = (MechanismRecord, f64, i128);

/// The privacy-unit column as it reaches the aggregation (None for row
/// units). It must be the protected scan's own unit column, proven by
/// provenance: a query could otherwise rename another column (or NULL,
/// or random()) to the unit's name and make every row its own unit.
pub(super) fn unit_column(agg: &Aggregate, entry: &TableEntry) -> Result<Option<Column>> {
    let PrivacyUnit::Column(unit) = &entry.unit else { return Ok(None) };
    let named: Vec<Column> = agg.input.schema().columns().into_iter().filter(|c| &c.name == unit).collect();
    if let [c] = named.as_slice()
        && agg.input.schema().qualified_field_from_column(c).is_ok_and(|(_, f)| f.data_type().is_floating())
    {
        return Err(Refusal::new(
            K::PrivacyUnit,
            format!(
                "the privacy unit column {unit:?} of table {} is floating-point: −0.0 and +0.0, or two NaNs, would \
                 be two units. Store unit ids as integers or text",
                entry.name
            ),
        )
        .into());
    }
    match named.as_slice() {
        [c] if super::check::from_scan(&agg.input, c, &entry.name, unit) => Ok(Some(c.clone())),
        [] => Err(Refusal::new(
            K::PrivacyUnit,
            format!(
                "the privacy unit column {unit:?} of table {} must reach the aggregation: keep it in every \
                 subquery's SELECT list",
                entry.name
            ),
        )
        .into()),
        _ => Err(Refusal::new(
            K::PrivacyUnit,
            format!(
                "the column {unit:?} reaching the aggregation must be table {}'s own privacy unit column, \
                 unchanged (not renamed from another column or computed, and not ambiguous with a joined column)",
                entry.name
            ),
        )
        .into()),
    }
}

/// Public-domain keys for the GROUP BY, when every key column is a raw
/// protected column with an enumerable domain.
pub(super) fn domain_keys(
    catalog: &Catalog,
    agg: &Aggregate,
    entry: &TableEntry,
) -> Result<Option<Vec<Vec<ScalarValue>>>> {
    if agg.group_expr.is_empty() {
        return Ok(Some(vec![vec![]]));
    }
    let mut per_col: Vec<Vec<ScalarValue>> = Vec::new();
    for g in &agg.group_expr {
        let Expr::Column(c) = g.clone().unalias() else { return Ok(None) };
        // A column of a joined public table has that table's public domain.
        let source = match source_table(&agg.input, &c).and_then(|t| catalog.tables.get(&t)) {
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
        return Err(Refusal::new(
            K::TooManyKeys,
            format!("the GROUP BY enumerates {total} public keys (limit {MAX_DOMAIN_KEYS})"),
        )
        .into());
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

pub(super) fn plan_costs(
    agg: &Aggregate,
    entry: &TableEntry,
    sites: &[CallSite],
    budget: Option<Budget>,
    needs_selection: bool,
) -> Result<(Vec<Planned>, Option<Selection>)> {
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
        let Expr::AggregateFunction(f) = e.clone().unalias() else {
            return Err(SqlError::Internal("not an aggregate".into()));
        };
        let name = f.func.name().to_string();
        let args = &f.params.args;
        let site = site_of(args)?;
        let a = &args[..args.len() - 1];
        let nargs = |n: usize, sig: &str| -> Result<()> {
            if a.len() != n {
                return Err(
                    Refusal::new(K::Arguments, format!("{name} takes ({sig}), got {} arguments", a.len())).into()
                );
            }
            Ok(())
        };
        let bounds = |lo_e: &Expr, hi_e: &Expr| -> Result<(f64, f64)> {
            let lo = parse_f64(lo_e, "the lower bound", &name)?;
            let hi = parse_f64(hi_e, "the upper bound", &name)?;
            if lo >= hi {
                return Err(Refusal::new(
                    K::Arguments,
                    format!("{name}: the lower bound {lo} must be below the upper bound {hi}"),
                )
                .into());
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
                    return Err(Refusal::new(K::Arguments, format!("dp_quantile: q must be in [0, 1], got {q}")).into());
                }
                let (lo, hi) = bounds(&a[2], &a[3])?;
                Kind::Quantile { arg: a[0].clone(), q, lo, hi }
            }
            other => return Err(SqlError::Internal(format!("unknown DP function {other}"))),
        };
        let field = agg.schema.field(agg.group_expr.len() + i).name().clone();
        calls.push((i, site, name, kind, field));
    }
    // Shares.
    let explicit: Vec<Option<Share>> =
        calls.iter().map(|c| sites.iter().find(|s| s.id == c.1).and_then(|s| s.budget)).collect();
    let n_explicit = explicit.iter().filter(|e| e.is_some()).count();
    if n_explicit != 0 && n_explicit != calls.len() {
        return Err(Refusal::new(
            K::Budget,
            "give a budget share (epsilon => or rho =>) to every DP aggregate of the query, or to none",
        )
        .into());
    }
    let mut selection = None;
    let shares: Vec<Share> = if n_explicit == calls.len() {
        if needs_selection {
            let Some(Budget::Approx { epsilon, delta }) = budget else {
                return Err(Refusal::new(K::Budget, "GROUP BY keys without a public domain need DP partition selection, which needs an (ε, δ) query budget (--epsilon with --delta)").into());
            };
            selection = Some((epsilon, delta));
        }
        explicit.iter().map(|e| e.expect("all explicit")).collect()
    } else {
        let Some(b) = budget else {
            return Err(Refusal::new(
                K::Budget,
                "no budget: give --epsilon [--delta] or --rho, per-aggregate shares, or a query_budget in the catalog",
            )
            .into());
        };
        let k = calls.len() as f64;
        match b {
            Budget::Pure { epsilon } => {
                if needs_selection {
                    return Err(Refusal::new(K::Budget, "GROUP BY keys without a public domain need DP partition selection, which needs δ > 0 (give --delta)").into());
                }
                vec![Share::Epsilon(epsilon / k); calls.len()]
            }
            Budget::Zcdp { rho } => {
                if needs_selection {
                    return Err(Refusal::new(K::Budget, "GROUP BY keys without a public domain need DP partition selection, which needs an (ε, δ) budget").into());
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
    if let Some((rec, b, _)) = &selection
        && let Some(why) = (NoiseDistribution::Laplace { scale: *b }).scale_refusal()
    {
        return Err(Refusal::new(K::Budget, format!("{}: {why}", rec.target)).into());
    }
    Ok((planned, selection))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn plan_one(
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
            Share::Epsilon(e) => {
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
            let mut subs: Vec<(SubStat, f64)> = Vec::new();
            match &kind {
                Kind::Sum { .. } => subs.push((SubStat::Sum, c_units)),
                Kind::Avg { .. } => {
                    subs.push((SubStat::Count, 1.0));
                    subs.push((SubStat::CenteredSum, c_units));
                }
                _ => {
                    subs.push((SubStat::Count, 1.0));
                    subs.push((SubStat::CenteredSum, c_units));
                    let c2 = (c * c / (g * g)).ceil() + 1.0;
                    subs.push((SubStat::Squares, c2));
                }
            }
            for (stat, units) in subs {
                let (n, s, l) = noise_for(units);
                // Record in real units (grid units × g, or g² for squares).
                let scale = stat.unit(g);
                let shown = match n {
                    NoiseDistribution::Laplace { scale: b } => NoiseDistribution::Laplace { scale: b * scale },
                    NoiseDistribution::Gaussian { sigma } => NoiseDistribution::Gaussian { sigma: sigma * scale },
                };
                records.push(record(stat.label(), shown, s * scale, l));
                noise.push(n);
            }
            // A plain sum also counts its values (not released: it picks the exact
            // accumulation width, see `helper_exprs`).
            if matches!(kind, Kind::Sum { .. }) { vec![h(0), h(1)] } else { (0..noise.len()).map(h).collect() }
        }
        Kind::Quantile { lo, hi, .. } => {
            let bins = 1024usize;
            if !((hi - lo) / bins as f64).is_finite() {
                return Err(Refusal::new(
                    K::Arguments,
                    format!("{name}: the bounds {lo} and {hi} are too far apart for a finite bin width"),
                )
                .into());
            }
            let (eps_em, loss) = match share {
                Share::Epsilon(e) => (e / l0, PrivacyLoss::Pure { epsilon: e }),
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
    // A public check before anything is charged (MAX_NOISE_SCALE says why).
    if let Some(why) = noise.iter().find_map(|n| n.scale_refusal()) {
        return Err(Refusal::new(K::Budget, format!("{name}: {why}")).into());
    }
    Ok(Planned { field, kind, noise, grid, records, helpers, quantile })
}

/// Gives each `dp_ci_low`/`dp_ci_high` of a `dp_quantile` call its own
/// exponential-mechanism selection ([`super::quantile_interval`]): a call
/// with m − 1 requested ends splits its share into m equal parts (ε/m, or
/// ρ/m), one for the point and one per end, each charged at plan time.
/// `ends` are the requested ends as (aggregate index, high end, level).
pub(super) fn split_quantile_for_intervals(planned: &mut [Planned], ends: &[(usize, bool, f64)]) -> Result<()> {
    for (i, p) in planned.iter_mut().enumerate() {
        let Some((eps, bins, sens)) = p.quantile else { continue };
        let ends: Vec<(bool, f64)> = ends.iter().filter(|r| r.0 == i).map(|r| (r.1, r.2)).collect();
        if ends.is_empty() || p.records.len() != 1 {
            continue;
        }
        let m = (ends.len() + 1) as f64;
        let point = p.records[0].clone();
        let (loss, eps) = match point.loss {
            PrivacyLoss::Pure { epsilon } => (PrivacyLoss::Pure { epsilon: epsilon / m }, eps / m),
            // ε per group from ρ = l0·ε²/8: a share ρ/m gives ε/√m.
            PrivacyLoss::Zcdp { rho } => (PrivacyLoss::Zcdp { rho: rho / m }, eps / m.sqrt()),
            _ => continue,
        };
        p.quantile = Some((eps, bins, sens));
        let record = |target: String| MechanismRecord {
            target,
            loss: loss.clone(),
            params: {
                let mut v = point.params.clone();
                v["epsilon_per_group"] = serde_json::json!(eps);
                v
            },
            ..point.clone()
        };
        let mut records = vec![record(point.target.clone())];
        for (high, level) in ends {
            // A public check before the charge: a vanishing ε would aim the ends at ±∞.
            if !super::quantile_interval::endpoint_shift(eps, sens, bins, level).is_finite() {
                return Err(Refusal::new(
                    K::Budget,
                    format!("{}: the budget is too small for a quantile interval; give a larger one", point.target),
                )
                .into());
            }
            let side = if high { "high" } else { "low" };
            records
                .push(record(point.target.replace("quantile bin", &format!("quantile interval {side} end ({level})"))));
        }
        p.records = records;
    }
    Ok(())
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
pub fn selection_threshold(epsilon: f64, delta: f64, l0: f64) -> i128 {
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
}
