//! The arguments of DP aggregate calls: bounds and levels are public
//! constants (number literals), and the aggregated value must be a number.

use super::error::Result;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable};

use super::refusal::{Refusal, RefusalKind as K};

/// A number literal argument (a public constant), or an error naming `what` and `func`.
pub fn parse_f64(e: &Expr, what: &str, func: &str) -> Result<f64> {
    let refused = |problem: &str| Refusal::new(K::Arguments, format!("{func}: {what} must be {problem}, got `{e}`"));
    let (v, sign) = match e.clone().unalias() {
        Expr::Literal(v, _) => (v, 1.0),
        Expr::Negative(inner) => match *inner {
            Expr::Literal(v, _) => (v, -1.0),
            _ => return Err(refused("a number literal (a public constant)").into()),
        },
        _ => return Err(refused("a number literal (a public constant)").into()),
    };
    match v.cast_to(&DataType::Float64) {
        Ok(ScalarValue::Float64(Some(f))) if f.is_finite() => Ok(sign * f),
        _ => Err(refused("a finite number").into()),
    }
}

/// Refuses DP aggregate arguments that are not numbers (their helper
/// expressions cast to numbers, which could fail on a row).
pub fn check_dp_arguments(agg: &Aggregate) -> Result<()> {
    for e in &agg.aggr_expr {
        let Expr::AggregateFunction(f) = e.clone().unalias() else { continue };
        let name = f.func.name();
        if name == "dp_count" {
            continue;
        }
        if let Some(arg) = f.params.args.first() {
            let t = arg.get_type(agg.input.schema())?;
            if !super::rowsafe::is_number(&t) {
                return Err(Refusal::new(
                    K::Arguments,
                    format!("{name} needs a numeric argument, got `{arg}` of type {t}"),
                )
                .into());
            }
        }
    }
    Ok(())
}
