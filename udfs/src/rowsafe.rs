//! Row expressions over protected data must not be able to fail
//! (docs/PRIVACY.md §1).
//!
//! A failure is an outcome: `WHERE CASE WHEN <predicate on one person> THEN
//! 1/(age-37) ELSE 1 END = 1` fails with a division by zero exactly when that
//! person is in the data, a free and repeatable membership oracle, and a
//! failing `CAST` prints the value it could not convert. The engine charges
//! such failures and withholds their text, but a query whose success depends
//! on one row still leaks through *whether* it failed, without noise. So every
//! expression evaluated on protected rows (WHERE, SELECT below the
//! aggregation, join conditions, GROUP BY keys, DP aggregate arguments) is
//! checked at plan time against a whitelist of expressions that cannot raise
//! an error on any input:
//!
//! - columns, literals, comparisons, AND/OR/NOT, IS \[NOT\] NULL/TRUE/…,
//!   BETWEEN, IN lists, LIKE without ESCAPE, string concatenation, CASE;
//! - `+`, `-`, `*` and unary minus on integers and floats (DataFusion
//!   evaluates them wrapping, without overflow errors);
//! - `/` and `%` only when the result is a float (a float division by zero
//!   gives ±inf or NaN, never an error); integer division can fail (by zero,
//!   or `MIN / -1`), so it is refused with the fix: `CAST(a AS DOUBLE) / b`;
//! - `TRY_CAST` (null on failure) and the casts that cannot fail (integer
//!   widening, integer → float, float → double, number/boolean/decimal/text → text, boolean →
//!   number); every other `CAST` is refused with the fix: `TRY_CAST`;
//! - the scalar functions in [`SAFE_FUNCTIONS`], and the one-argument math
//!   functions in [`FLOAT_FUNCTIONS`] when the argument is a float (on
//!   integers some raise on overflow, e.g. `abs(i64::MIN)`; `sqrt` and
//!   `power` raise on negative input and are not listed);
//! - `LIKE` with a literal pattern of at most [`MAX_LIKE_PATTERN`] characters
//!   (a pattern is compiled to a regular expression, which can exceed the
//!   regex engine's size limit).
//!
//! No exemption for literals: DataFusion evaluates a constant that failed to
//! fold at run time, on the rows that reach it, so `CASE WHEN <one person>
//! THEN abs(-9223372036854775808) ...` would fail only when that person is
//! present. Volatile functions (`random()`) are not listed: the engine
//! evaluates GROUP BY keys more than once (contribution bounding, then the
//! aggregation), and a key that changes between evaluations escapes the
//! bounds.
//!
//! DataFusion's type coercion inserts casts after planning (a text column
//! compared with a number is cast to the number), so the engine runs the
//! check twice: on the planned query, for messages in the user's terms, and
//! on the type-coerced plan, where every implicit cast is explicit
//! (dpflow's `sql::check::analyze_coerced`). Everything else is refused with a
//! message naming the expression. The check needs types, so it runs with the
//! schema of the node's input.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::logical_expr::{Expr, ExprSchemable, Operator};

/// Scalar functions that return a value (maybe null) for every input.
pub const SAFE_FUNCTIONS: &[&str] = &[
    "coalesce",
    "nullif",
    "lower",
    "upper",
    "btrim",
    "ltrim",
    "rtrim",
    "trim",
    "character_length",
    "char_length",
    "length",
    "octet_length",
    "concat",
    "concat_ws",
    "starts_with",
    "ends_with",
    "strpos",
    "greatest",
    "least",
    "isnan",
    "iszero",
];

/// One-argument math functions that cannot fail on a float (NaN/inf instead).
pub const FLOAT_FUNCTIONS: &[&str] =
    &["abs", "round", "floor", "ceil", "trunc", "cbrt", "ln", "log10", "log2", "exp", "signum"];

/// Longest LIKE pattern accepted on protected rows.
pub const MAX_LIKE_PATTERN: usize = 256;

/// An integer or floating-point type (the numbers row arithmetic and DP
/// arguments accept; decimals are not, their arithmetic can overflow).
pub fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Whether casting `from` to `to` can never fail (DataFusion casts with
/// `safe = false`, so an unconvertible value is an error).
pub fn infallible_cast(from: &DataType, to: &DataType) -> bool {
    use DataType as D;
    if from == to || matches!(from, D::Null) {
        return true;
    }
    // Numbers, booleans, decimals and text always have a text form. Temporal values do not:
    // arrow formats a date or time outside chrono's range with an error whatever the cast
    // options say (a privacy review: `CAST(TRY_CAST(<huge int> AS DATE) AS VARCHAR)` failed on
    // exactly one row); bytes may not be valid UTF-8.
    if is_text(to) {
        return is_number(from)
            || is_text(from)
            || matches!(
                from,
                D::Boolean | D::Decimal32(..) | D::Decimal64(..) | D::Decimal128(..) | D::Decimal256(..)
            );
    }
    match (from, to) {
        (D::Boolean, t) if is_number(t) => true,
        (f, D::Float64) if is_number(f) => true,
        (f, D::Float32) if f.is_integer() || matches!(f, D::Float16) => true,
        (f, t) if f.is_integer() && t.is_integer() => {
            let (fs, fb) = (f.is_signed_integer(), f.primitive_width());
            let (ts, tb) = (t.is_signed_integer(), t.primitive_width());
            // Widening that keeps the sign: signed → wider signed, unsigned → wider (or signed wider).
            (fs == ts && tb >= fb) || (!fs && ts && tb > fb)
        }
        _ => false,
    }
}

/// The first sub-expression of `e` that could raise an error on some row,
/// with the reason and the fix; `None` when `e` cannot fail.
pub fn may_fail(e: &Expr, schema: &DFSchema) -> Option<String> {
    let ty = |x: &Expr| x.get_type(schema).ok();
    let sub = |xs: &[&Expr]| xs.iter().find_map(|x| may_fail(x, schema));
    match e {
        Expr::Column(_) | Expr::Literal(..) => None,
        Expr::Alias(a) => may_fail(&a.expr, schema),
        Expr::Not(x)
        | Expr::IsNull(x)
        | Expr::IsNotNull(x)
        | Expr::IsTrue(x)
        | Expr::IsFalse(x)
        | Expr::IsUnknown(x)
        | Expr::IsNotTrue(x)
        | Expr::IsNotFalse(x)
        | Expr::IsNotUnknown(x) => may_fail(x, schema),
        // On a scalar (a constant) integer negation is checked and raises on
        // MIN; on floats it cannot fail.
        Expr::Negative(x) => match ty(x) {
            Some(t) if t.is_floating() => may_fail(x, schema),
            _ => Some(format!("`{e}`: unary minus is allowed on floats only; write 0 - <x> for integers")),
        },
        Expr::BinaryExpr(b) => {
            use Operator as O;
            let (lt, rt) = (ty(&b.left), ty(&b.right));
            let ok = match b.op {
                O::Eq | O::NotEq | O::Lt | O::LtEq | O::Gt | O::GtEq | O::IsDistinctFrom | O::IsNotDistinctFrom => {
                    // A comparison of text with a number casts the text, which can fail.
                    let mixed = |a: &Option<DataType>, b: &Option<DataType>| matches!((a, b), (Some(x), Some(y)) if is_text(x) && is_number(y));
                    if mixed(&lt, &rt) || mixed(&rt, &lt) {
                        return Some(format!(
                            "`{e}` compares text with a number, which casts the text and fails on a non-number; \
                             compare TRY_CAST(<text> AS <type>) instead"
                        ));
                    }
                    true
                }
                O::And | O::Or | O::StringConcat => true,
                O::Plus | O::Minus | O::Multiply => {
                    matches!((&lt, &rt), (Some(a), Some(b)) if is_number(a) && is_number(b))
                }
                O::Divide | O::Modulo => {
                    if !matches!(ty(e), Some(t) if t.is_floating()) {
                        return Some(format!(
                            "`{e}` is an integer division, which fails on a row where the divisor is 0 (or on \
                             MIN / -1); divide as floats instead: CAST(<a> AS DOUBLE) {} <b>",
                            b.op
                        ));
                    }
                    true
                }
                _ => false,
            };
            if !ok {
                return Some(format!(
                    "`{e}`: the operator {} is not on the list of row operations that cannot fail \
                     (comparisons, AND/OR, ||, and + - * / on numbers)",
                    b.op
                ));
            }
            sub(&[&b.left, &b.right])
        }
        Expr::Like(l) => {
            if l.escape_char.is_some() {
                return Some(format!("`{e}`: LIKE with ESCAPE can fail on a pattern; drop the ESCAPE clause"));
            }
            match &*l.pattern {
                Expr::Literal(v, _) if v.to_string().chars().count() <= MAX_LIKE_PATTERN => may_fail(&l.expr, schema),
                _ => Some(format!(
                    "`{e}`: LIKE needs a literal pattern of at most {MAX_LIKE_PATTERN} characters on protected rows"
                )),
            }
        }
        Expr::Between(b) => sub(&[&b.expr, &b.low, &b.high]),
        Expr::InList(l) => may_fail(&l.expr, schema).or_else(|| l.list.iter().find_map(|x| may_fail(x, schema))),
        Expr::Case(c) => c
            .expr
            .as_deref()
            .and_then(|x| may_fail(x, schema))
            .or_else(|| c.when_then_expr.iter().find_map(|(w, t)| sub(&[w, t])))
            .or_else(|| c.else_expr.as_deref().and_then(|x| may_fail(x, schema))),
        Expr::TryCast(c) => may_fail(&c.expr, schema),
        Expr::Cast(c) => match ty(&c.expr) {
            Some(from) if infallible_cast(&from, c.field.data_type()) => may_fail(&c.expr, schema),
            _ => Some(format!(
                "`{e}` can fail on a value that does not convert; use TRY_CAST({} AS {}), which gives NULL instead",
                c.expr,
                c.field.data_type()
            )),
        },
        Expr::ScalarFunction(f) => {
            let name = f.func.name();
            let args: Vec<&Expr> = f.args.iter().collect();
            if SAFE_FUNCTIONS.contains(&name) {
                return sub(&args);
            }
            if FLOAT_FUNCTIONS.contains(&name) {
                if args.len() == 1 && matches!(ty(args[0]), Some(t) if t.is_floating()) {
                    return sub(&args);
                }
                return Some(format!(
                    "`{e}`: on protected rows {name} takes one DOUBLE argument (on integers it can fail by \
                     overflow): cast it to DOUBLE first"
                ));
            }
            Some(format!(
                "`{e}`: the function {name} is not on the list of functions that cannot fail on a row \
                 (see docs/PRIVACY.md §1)"
            ))
        }
        Expr::AggregateFunction(f) => {
            if f.params.filter.is_some() || !f.params.order_by.is_empty() {
                return Some(format!("`{e}`: FILTER and ORDER BY inside a DP aggregate are not supported"));
            }
            sub(&f.params.args.iter().collect::<Vec<_>>())
        }
        other => Some(format!("`{other}` is not on the list of row expressions that cannot fail")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::logical_expr::{cast, col, lit, try_cast, when};

    fn schema() -> DFSchema {
        DFSchema::try_from(Schema::new(vec![
            Field::new("age", DataType::Int64, true),
            Field::new("income", DataType::Float64, true),
            Field::new("id", DataType::Utf8, true),
        ]))
        .unwrap()
    }

    #[test]
    fn the_division_by_zero_oracle_is_refused() {
        // WHERE CASE WHEN id = 'p42' THEN 1/(age-37) ELSE 1 END = 1
        let oracle = when(col("id").eq(lit("p42")), lit(1i64) / (col("age") - lit(37i64)))
            .otherwise(lit(1i64))
            .unwrap()
            .eq(lit(1i64));
        let why = may_fail(&oracle, &schema()).expect("refused");
        assert!(why.contains("integer division"), "{why}");
        // As floats the same expression cannot fail.
        let float = when(col("id").eq(lit("p42")), lit(1.0) / cast(col("age") - lit(37i64), DataType::Float64))
            .otherwise(lit(1.0))
            .unwrap()
            .eq(lit(1.0));
        assert_eq!(may_fail(&float, &schema()), None);
    }

    #[test]
    fn casts_that_can_fail_are_refused_and_try_cast_is_not() {
        let s = schema();
        assert!(may_fail(&cast(col("id"), DataType::Int64).eq(lit(3i64)), &s).unwrap().contains("TRY_CAST"));
        assert!(may_fail(&cast(col("income"), DataType::Int64), &s).is_some());
        assert!(may_fail(&cast(col("age"), DataType::Int32), &s).is_some());
        assert_eq!(may_fail(&try_cast(col("id"), DataType::Int64).eq(lit(3i64)), &s), None);
        assert_eq!(may_fail(&cast(col("age"), DataType::Float64), &s), None);
        assert_eq!(may_fail(&cast(col("age"), DataType::Utf8), &s), None);
    }

    #[test]
    fn arithmetic_comparisons_and_safe_functions_pass() {
        let s = schema();
        let e = (col("age") * lit(2i64) + lit(1i64)).gt(lit(40i64)).and(col("income").between(lit(0.0), lit(1e5)));
        assert_eq!(may_fail(&e, &s), None);
        assert_eq!(may_fail(&(col("income") % lit(7.0)), &s), None);
        assert_eq!(may_fail(&datafusion::functions::math::expr_fn::floor(col("income")), &s), None);
        assert!(may_fail(&(col("age") % lit(7i64)), &s).is_some());
        assert!(may_fail(&col("id").eq(col("age")), &s).is_some(), "text = number casts the text");
    }

    #[test]
    fn failures_the_review_found_are_refused() {
        let s = schema();
        let big = lit(i64::MIN);
        // abs on an integer constant raises on MIN, even as a literal.
        assert!(may_fail(&datafusion::functions::math::expr_fn::abs(big.clone()), &s).is_some());
        assert!(may_fail(&datafusion::functions::math::expr_fn::sqrt(col("income")), &s).is_some());
        assert!(may_fail(&Expr::Negative(Box::new(col("age"))), &s).is_some());
        assert_eq!(may_fail(&Expr::Negative(Box::new(col("income"))), &s), None);
        assert!(may_fail(&datafusion::functions::math::expr_fn::random().gt(lit(0.5)), &s).is_some());
        assert!(may_fail(&col("id").like(col("id")), &s).is_some(), "non-literal pattern");
        assert!(may_fail(&col("id").like(lit("_".repeat(MAX_LIKE_PATTERN + 1))), &s).is_some());
        assert_eq!(may_fail(&col("id").like(lit("p%")), &s), None);
        // A literal text compared with a number is cast at run time too.
        assert!(may_fail(&col("age").eq(lit("37")), &s).is_some());
        assert!(!infallible_cast(&DataType::Binary, &DataType::Utf8));
        // A date out of chrono's range fails to format: TRY_CAST to DATE, then to text.
        let date = Expr::TryCast(datafusion::logical_expr::TryCast::new(Box::new(col("age")), DataType::Date32));
        let text = Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(date), DataType::Utf8));
        assert!(may_fail(&text.not_eq(lit("")), &s).is_some());
    }

    #[test]
    fn cast_table_is_conservative() {
        use DataType as D;
        assert!(infallible_cast(&D::Int32, &D::Int64));
        assert!(infallible_cast(&D::UInt32, &D::Int64));
        assert!(!infallible_cast(&D::Int64, &D::UInt64));
        assert!(!infallible_cast(&D::UInt64, &D::Int64));
        assert!(!infallible_cast(&D::Float64, &D::Int64));
        assert!(!infallible_cast(&D::Utf8, &D::Date32));
        // A date or time outside chrono's range fails to format (review finding).
        assert!(!infallible_cast(&D::Date32, &D::Utf8));
        assert!(!infallible_cast(&D::Time64(datafusion::arrow::datatypes::TimeUnit::Nanosecond), &D::Utf8View));
        assert!(infallible_cast(&D::Int64, &D::Utf8) && infallible_cast(&D::Boolean, &D::Utf8));
    }
}
