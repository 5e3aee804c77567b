//! Decoding integer codes back to values through the public domain.
//!
//! Categorical codes become their labels; a numeric bin becomes a value drawn
//! uniformly inside the bin (default) or the bin's midpoint; the null code
//! becomes null. Decoding is post-processing of already-private codes.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::column::{Column, ColumnKind, Domain};
use crate::noise::exact::uniform_below_u64;

/// How numeric bins become values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeMode {
    /// A value drawn uniformly inside the bin.
    #[default]
    Uniform,
    /// The bin midpoint (integers: rounded down).
    Midpoint,
}

/// A code that is not part of the column's domain.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("column {column:?}: code {code} is outside its domain (cardinality {cardinality})")]
pub struct DecodeError {
    /// Column name.
    pub column: String,
    /// The bad code.
    pub code: u32,
    /// Codes allowed.
    pub cardinality: usize,
}

impl Column {
    /// Decodes codes into an Arrow array of [`Column::arrow_type`].
    pub fn decode<R: Rng + ?Sized>(
        &self,
        codes: &[u32],
        mode: DecodeMode,
        rng: &mut R,
    ) -> Result<ArrayRef, DecodeError> {
        let null = self.null_code();
        let check = |c: u32| -> Result<Option<usize>, DecodeError> {
            if Some(c) == null {
                Ok(None)
            } else if (c as usize) < self.size() {
                Ok(Some(c as usize))
            } else {
                Err(DecodeError { column: self.name.clone(), code: c, cardinality: self.cardinality() })
            }
        };
        Ok(match &self.kind {
            ColumnKind::Categorical { values, .. } => {
                let mut b = StringBuilder::with_capacity(codes.len(), codes.len() * 8);
                for &c in codes {
                    match check(c)? {
                        Some(i) => b.append_value(&values[i]),
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
            ColumnKind::Integer { edges } => {
                let mut b = Int64Builder::with_capacity(codes.len());
                for &c in codes {
                    match check(c)? {
                        Some(i) => {
                            let (lo, hi) = (edges[i], edges[i + 1] - 1);
                            let v = if lo == hi {
                                lo
                            } else {
                                match mode {
                                    DecodeMode::Uniform => lo + uniform_below_u64(rng, (hi - lo) as u64 + 1) as i64,
                                    DecodeMode::Midpoint => lo + (hi - lo) / 2,
                                }
                            };
                            b.append_value(v);
                        }
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
            ColumnKind::Float { edges } => {
                let mut b = Float64Builder::with_capacity(codes.len());
                for &c in codes {
                    match check(c)? {
                        Some(i) => {
                            let (lo, hi) = (edges[i], edges[i + 1]);
                            let v = match mode {
                                DecodeMode::Uniform => {
                                    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                                    (lo + u * (hi - lo)).min(hi)
                                }
                                DecodeMode::Midpoint => lo + (hi - lo) / 2.0,
                            };
                            b.append_value(v);
                        }
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
            ColumnKind::Boolean => {
                let mut b = BooleanBuilder::with_capacity(codes.len());
                for &c in codes {
                    match check(c)? {
                        Some(i) => b.append_value(i == 1),
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
        })
    }
}

/// `typed` with the exact types of `schema` (the domain's decoded schema):
/// typed reads of Parquet hold text as `Utf8View`, the decoded schema as
/// `Utf8` (a cast between the two cannot fail). Expressions compiled over the
/// decoded schema (e.g. `not_applicable_when` rules) evaluate on the result.
pub fn conform_to_decoded(typed: &RecordBatch, schema: &SchemaRef) -> datafusion::common::Result<RecordBatch> {
    if typed.schema().fields() == schema.fields() {
        return Ok(typed.clone());
    }
    let columns = typed
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                datafusion::arrow::compute::cast(c, f.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The schema of decoded batches (nullable exactly where the domain is).
pub fn decoded_schema(domain: &Domain) -> SchemaRef {
    Arc::new(Schema::new(
        domain.columns().iter().map(|c| Field::new(&c.name, c.arrow_type(), c.nullable)).collect::<Vec<_>>(),
    ))
}

/// Decodes a batch of codes (one `&[u32]` per domain column) into values.
pub fn decode_columns<R: Rng + ?Sized>(
    domain: &Domain,
    codes: &[&[u32]],
    mode: DecodeMode,
    rng: &mut R,
) -> Result<RecordBatch, DecodeError> {
    let arrays =
        domain.columns().iter().zip(codes).map(|(c, k)| c.decode(k, mode, rng)).collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(decoded_schema(domain), arrays).expect("decoded schema matches"))
}
