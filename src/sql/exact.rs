//! Exact helper aggregation: the per-unit contribution bounding of the
//! protected rows, and the integer helper aggregates (counts, sums in grid
//! units, split squares) that the release noises. Every sum is exact, so no
//! refusal and no rounding depends on the data (docs/PRIVACY.md §3).

use std::sync::Arc;

use super::error::{Result, SqlError};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, ScalarValue};
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Aggregate, Expr, ExprFunctionExt, LogicalPlan, LogicalPlanBuilder, cast, col, lit, try_cast, when,
};
use dpflow_udfs::noise::DpRng;

use super::catalog::TableEntry;
use super::costing::{Kind, Planned};

pub(super) fn clamp_expr(e: Expr, lo: f64, hi: f64) -> Expr {
    // Numeric arguments only (checked at plan time); TRY_CAST so even so nothing can fail on a row.
    let x = try_cast(e, DataType::Float64);
    when(x.clone().lt(lit(lo)), lit(lo)).when(x.clone().gt(lit(hi)), lit(hi)).otherwise(x).expect("valid CASE")
}

/// round(v / 2^k) as Int64, or null where that cannot be converted (NaN):
/// a helper expression must not fail on a row (docs/PRIVACY.md §1).
pub(super) fn to_units(v: Expr, k: i32) -> Expr {
    try_cast(datafusion::functions::math::expr_fn::round(vec![v / lit(2f64.powi(k))]), DataType::Int64)
}

/// Exact 128-bit accumulation: Int64 values summed as Decimal128(38, 0)
/// (i128). With |row| < 2⁶³ and fewer than 2⁶³ rows a sum of values below
/// 2⁴³ (grid units) or 2⁶² (squares of exact integers) stays below 2¹²⁶, so
/// no sum wraps and no refusal ever depends on the data.
pub(super) fn sum_i128(v: Expr) -> Expr {
    sum(cast(v, DataType::Decimal128(38, 0)))
}

/// Per-unit contribution bounding: at most L∞ rows per (unit, group) and L0
/// groups per unit, chosen at random (row units need none).
pub(super) fn bound_contributions(agg: &Aggregate, entry: &TableEntry, unit: Option<&Column>) -> Result<LogicalPlan> {
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
        // The keys break hash ties: two groups of one unit whose 64-bit hashes
        // collide must still take two of its l0 slots.
        let mut order = vec![hash.sort(true, false)];
        order.extend(agg.group_expr.iter().cloned().map(|e| e.unalias().sort(true, true)));
        let rank = datafusion::functions_window::expr_fn::dense_rank()
            .partition_by(unit_keys)
            .order_by(order)
            .build()?
            .alias("__dp_gr");
        plan = plan.window(vec![rank])?;
        keep = keep.and(col("__dp_gr").lt_eq(lit(entry.max_groups_per_unit as i64)));
    }
    Ok(plan.filter(keep)?.project(fields)?.build()?)
}

/// An exact helper value (count or 128-bit sum) as an integer; null → 0.
pub(super) fn scalar_i128(v: &ScalarValue) -> Result<i128> {
    Ok(match v {
        v if v.is_null() => 0,
        ScalarValue::Decimal128(Some(x), _, 0) => *x,
        ScalarValue::Int64(Some(x)) => *x as i128,
        other => {
            return Err(SqlError::Internal(format!(
                "helper aggregate of type {} is not an exact integer",
                other.data_type()
            )));
        }
    })
}

pub(super) fn scalar_f64(v: &ScalarValue) -> Result<f64> {
    if v.is_null() {
        return Ok(0.0);
    }
    match v.cast_to(&DataType::Float64)? {
        ScalarValue::Float64(Some(f)) => Ok(f),
        _ => Ok(0.0),
    }
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
pub(super) struct Fixup {
    pub(super) col: usize,
    /// Helper column with the count n of summed values (None: a plain sum around 0).
    pub(super) count: Option<usize>,
    /// lo + hi.
    pub(super) m2: i128,
    /// The grid exponent k (≤ −1).
    pub(super) k: i32,
    /// For a sum of squares: the helper column with the plain sum S₁.
    pub(super) square_of: Option<usize>,
}

impl Fixup {
    /// The value in grid units, from the raw helper values.
    pub(super) fn apply(&self, raw: &[i128]) -> i128 {
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
pub(super) type IntArg<'a> = &'a dyn Fn(&Expr) -> Option<Option<(f64, f64)>>;

/// The exact helper aggregates of one DP call.
pub(super) struct Helpers {
    /// One expression per helper column, aliased.
    pub(super) exprs: Vec<Expr>,
    /// Fix-ups that turn integer sums into grid units.
    pub(super) fixups: Vec<Fixup>,
    /// Sums split in two halves: (helper column of the high half, the low
    /// half's sum, shift): the value is (high << shift) + low.
    pub(super) splits: Vec<(usize, Expr, u32)>,
    /// Helper columns counting the summed values.
    pub(super) counts: Vec<usize>,
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
pub(super) fn helper_exprs(p: &Planned, int_arg: IntArg<'_>, wide: bool) -> Helpers {
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, RecordBatch};
    use datafusion::execution::context::SessionContext;

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
