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
//! random subset of groups per privacy unit (contribution bounding). It is
//! DataFusion's vectorised `create_hashes` with a hash state seeded from the
//! salt: the same keys and salt give the same hash in every batch, partition
//! and process.

use std::hash::BuildHasher;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, UInt64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::hash_utils::{QualityRandomState, create_hashes};
use datafusion::common::{DataFusionError, Result};
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
        let mut values = args.args.as_slice();
        // The hash must depend on the salt and the key values only (not on
        // the batch, the partition or the process), so the hash state is
        // fixed: seeded from the salt when it is a constant (the engine's
        // case), otherwise a fixed seed with the salt hashed as a column.
        let state = match values.first() {
            Some(ColumnarValue::Scalar(salt)) if values.len() > 1 => {
                values = &values[1..];
                let mut seed = [0u64];
                create_hashes([salt.to_array_of_size(1)?], &SALT_STATE, &mut seed)?;
                QualityRandomState::with_seed(seed[0])
            }
            _ => SALT_STATE,
        };
        let arrays: Vec<ArrayRef> = values.iter().map(|a| a.to_array(n)).collect::<Result<_>>()?;
        let mut hashes = vec![0u64; n];
        create_hashes(&arrays, &state, &mut hashes)?;
        // A null leaves the running hash unchanged in `create_hashes`; mark it
        // so that a null key never shares a hash with a value by construction.
        for (k, a) in arrays.iter().enumerate() {
            if let Some(nulls) = a.logical_nulls() {
                for i in (0..n).filter(|&i| nulls.is_null(i)) {
                    hashes[i] = state.hash_one((NULL_MARK, k, hashes[i]));
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(UInt64Array::from(hashes))))
    }
}

/// The fixed hash state that turns a salt into a seed.
const SALT_STATE: QualityRandomState = QualityRandomState::with_seed(0x6470_666c_6f77_5f68);

/// Hashed in place of a null key.
const NULL_MARK: u8 = 0xFF;

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::common::ScalarValue;
    use datafusion::config::ConfigOptions;

    fn hash(args: Vec<ColumnarValue>, n: usize) -> Vec<Option<u64>> {
        let arg_fields = args.iter().map(|a| Arc::new(Field::new("a", a.data_type(), true))).collect();
        let out = KeyedHash::default()
            .invoke_with_args(ScalarFunctionArgs {
                args,
                arg_fields,
                number_rows: n,
                return_field: Arc::new(Field::new("h", DataType::UInt64, false)),
                config_options: Arc::new(ConfigOptions::default()),
            })
            .unwrap()
            .to_array(n)
            .unwrap();
        out.as_any().downcast_ref::<UInt64Array>().unwrap().iter().collect()
    }

    fn salt(s: i64) -> ColumnarValue {
        ColumnarValue::Scalar(ScalarValue::Int64(Some(s)))
    }

    #[test]
    fn the_hash_depends_on_the_salt_and_the_key_values_only() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(0), Some(1)]));
        let b: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), Some("x"), None, Some("x")]));
        let h = hash(vec![salt(7), ColumnarValue::Array(a.clone()), ColumnarValue::Array(b.clone())], 4);
        // Same key, same hash, wherever the row sits (batch, position).
        assert_eq!(h[0], h[3]);
        let alone = hash(vec![salt(7), ColumnarValue::Array(a.slice(3, 1)), ColumnarValue::Array(b.slice(3, 1))], 1);
        assert_eq!(alone[0], h[0]);
        // Nulls are values of their own.
        assert_ne!(h[0], h[1]);
        assert_ne!(h[1], h[2]);
        let nulls: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>]));
        let zero: ArrayRef = Arc::new(Int64Array::from(vec![Some(0)]));
        assert_ne!(
            hash(vec![salt(7), ColumnarValue::Array(nulls)], 1),
            hash(vec![salt(7), ColumnarValue::Array(zero)], 1)
        );
        // Another salt, another order.
        let other = hash(vec![salt(8), ColumnarValue::Array(a), ColumnarValue::Array(b)], 4);
        assert_ne!(h, other);
        assert!(h.iter().all(Option::is_some));
    }
}
