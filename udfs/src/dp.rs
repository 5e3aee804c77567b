//! DP SQL functions as DataFusion UDAF/UDF *markers*.
//!
//! `dp_count`, `dp_sum`, `dp_avg`, `dp_var`, `dp_quantile`, the `dp_imputed_*`
//! statistics and the CI markers
//! `dp_ci_low` / `dp_ci_high` only carry signatures and return types. They can
//! never produce a value inside DataFusion (their accumulators refuse to run):
//! dpflow's DP SQL engine rewrites them into exact, contribution-bounded helper
//! aggregates, charges the budget at plan time, and adds the noise itself,
//! once per query. A session that registers these markers without the engine
//! therefore cannot leak exact answers through them.
//!
//! `dpflow_hash64(salt, ...)` is a deterministic keyed hash used to choose a
//! random subset of groups per privacy unit (contribution bounding).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, UInt64Builder};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};

/// The DP aggregate kinds.
pub const DP_AGGREGATES: [&str; 5] = ["dp_count", "dp_sum", "dp_avg", "dp_var", "dp_quantile"];

/// DP statistics on kNN-imputed data (smooth sensitivity; dpflow's engine
/// runs the imputation and the noise, the markers only plan).
pub const DP_IMPUTED_AGGREGATES: [&str; 4] =
    ["dp_imputed_count", "dp_imputed_mean", "dp_imputed_var", "dp_imputed_proportion"];

/// A DP aggregate marker.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DpAggregateMarker {
    name: &'static str,
    signature: Signature,
}

impl DpAggregateMarker {
    /// The marker for one of [`DP_AGGREGATES`].
    pub fn new(name: &'static str) -> Self {
        Self { name, signature: Signature::variadic_any(Volatility::Volatile) }
    }
}

impl AggregateUDFImpl for DpAggregateMarker {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(if self.name == "dp_count" { DataType::Int64 } else { DataType::Float64 })
    }

    fn accumulator(&self, _acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Err(DataFusionError::Plan(format!(
            "{} can only be evaluated by dpflow's DP SQL engine (it adds the noise and charges the budget)",
            self.name
        )))
    }
}

/// All DP aggregate markers (including the imputed-statistics ones).
pub fn dp_aggregates() -> Vec<AggregateUDF> {
    DP_AGGREGATES.iter().chain(&DP_IMPUTED_AGGREGATES).map(|n| AggregateUDF::from(DpAggregateMarker::new(n))).collect()
}

/// `dp_ci_low(dp_agg, level)` / `dp_ci_high(dp_agg, level)` markers.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CiMarker {
    name: &'static str,
    signature: Signature,
}

impl CiMarker {
    /// `dp_ci_low` or `dp_ci_high`.
    pub fn new(name: &'static str) -> Self {
        Self { name, signature: Signature::variadic_any(Volatility::Volatile) }
    }
}

impl ScalarUDFImpl for CiMarker {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Err(DataFusionError::Plan(format!(
            "{} must wrap a DP aggregate and is computed by dpflow's DP SQL engine",
            self.name
        )))
    }
}

/// The CI markers.
pub fn ci_markers() -> Vec<ScalarUDF> {
    vec![ScalarUDF::from(CiMarker::new("dp_ci_low")), ScalarUDF::from(CiMarker::new("dp_ci_high"))]
}

/// `dpflow_hash64(salt, a, b, ...)`: a 64-bit hash of the values, keyed by the salt.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct KeyedHash {
    signature: Signature,
}

impl Default for KeyedHash {
    fn default() -> Self {
        Self { signature: Signature::variadic_any(Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for KeyedHash {
    fn name(&self) -> &str {
        "dpflow_hash64"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays: Vec<ArrayRef> = args.args.iter().map(|a| a.to_array(n)).collect::<Result<_>>()?;
        let mut b = UInt64Builder::with_capacity(n);
        for i in 0..n {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for a in &arrays {
                if a.is_null(i) {
                    0xFFu8.hash(&mut h);
                } else {
                    ScalarValue::try_from_array(a, i)?.hash(&mut h);
                }
            }
            b.append_value(h.finish());
        }
        Ok(ColumnarValue::Array(Arc::new(b.finish())))
    }
}
