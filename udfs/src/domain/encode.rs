//! Streaming encoding of Arrow record batches into dense integer codes.
//!
//! Each domain column becomes a non-null `UInt32` column of codes in
//! `0..cardinality`; a null becomes the column's null code (nullable columns
//! only). Values outside the public domain follow the column's
//! [`OutOfDomain`] policy and are counted apart from nulls. A null never
//! becomes a value and a value never becomes null, except by the explicit
//! `null` policy.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use super::column::{Column, ColumnKind, Domain, OutOfDomain};

/// Per-column counts gathered while encoding (curator-only: exact, not DP).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Nulls in the input (Arrow nulls and null tokens).
    pub nulls: u64,
    /// Values outside the public domain (including unparseable text).
    pub out_of_domain: u64,
    /// Of those, clamped to a bound.
    pub clipped: u64,
    /// Of those, replaced by null.
    pub nulled: u64,
    /// Rows dropped because of this column.
    pub dropped: u64,
}

/// Counts for a whole stream.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodeStats {
    /// Rows read.
    pub rows_in: u64,
    /// Rows written (after drop-row).
    pub rows_out: u64,
    /// Per column, in domain order.
    pub columns: Vec<ColumnStats>,
}

// Counts of nulls and out-of-domain values are exact statistics.
crate::protected_debug!(ColumnStats, EncodeStats);

/// An encoding failure; names the column, the row and the offending value.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum EncodeError {
    /// A domain column is missing from the input.
    // The input's column names are not printed: in a headerless file they are the first data row.
    #[error(
        "column {column:?} of the domain is not in the input; check the file's header (and `text: header`) against \
         the domain with `dpflow inspect` (curator-only)"
    )]
    MissingColumn {
        /// Domain column.
        column: String,
    },
    /// A value outside the domain under the `error` policy (or not fixable by the policy).
    #[error("column {column:?}, row {row}: {value} {reason}")]
    OutOfDomain {
        /// Column name.
        column: String,
        /// 0-based row number in the stream (data rows, header excluded).
        row: u64,
        /// The value as text.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A text value that is not valid UTF-8 (a CSV reader can split a
    /// multi-byte character between two fields and still build the column).
    #[error(
        "column {column:?} holds text that is not valid UTF-8; check the file's encoding (convert it to UTF-8) with \
         `dpflow inspect` (curator-only)"
    )]
    InvalidUtf8 {
        /// Column name.
        column: String,
    },
    /// The input column's type cannot be read as this column's kind.
    #[error("column {column:?}: input type {data_type} cannot be read as {kind}")]
    BadType {
        /// Column name.
        column: String,
        /// Input Arrow type.
        data_type: String,
        /// Domain kind.
        kind: String,
    },
}

/// Outcome of classifying one value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Code(u32),
    Null,
    /// Out of domain; `Some(code)` is the clipped code for numeric values.
    Oob(Option<u32>),
}

/// Prepared per-column lookup state.
struct ColumnEncoder<'a> {
    col: &'a Column,
    labels: HashMap<&'a str, u32>,
    uniform_width: Option<f64>,
}

impl<'a> ColumnEncoder<'a> {
    fn new(col: &'a Column) -> Self {
        let mut labels = HashMap::new();
        let mut uniform_width = None;
        match &col.kind {
            ColumnKind::Categorical { values, aliases } => {
                for (i, v) in values.iter().enumerate() {
                    labels.insert(v.as_str(), i as u32);
                }
                for (from, to) in aliases {
                    let code = labels[to.as_str()];
                    labels.insert(from.as_str(), code);
                }
            }
            ColumnKind::Integer { edges } => {
                let w = edges[1] - edges[0];
                if edges.windows(2).all(|p| p[1] - p[0] == w) {
                    uniform_width = Some(w as f64);
                }
            }
            ColumnKind::Float { edges } => {
                let w = edges[1] - edges[0];
                let n = edges.len() - 1;
                // Uniform when every edge equals lo + i·w exactly.
                if edges.iter().enumerate().all(|(i, e)| *e == edges[0] + i as f64 * w) && n > 0 {
                    uniform_width = Some(w);
                }
            }
            ColumnKind::Boolean => {}
        }
        Self { col, labels, uniform_width }
    }

    fn is_null_token(&self, s: &str) -> bool {
        self.col.null_tokens.iter().any(|t| t == s)
    }

    fn classify_str(&self, raw: &str) -> Class {
        let s = raw.trim();
        if self.is_null_token(s) {
            return Class::Null;
        }
        match &self.col.kind {
            ColumnKind::Categorical { .. } => match self.labels.get(s) {
                Some(&c) => Class::Code(c),
                None => Class::Oob(None),
            },
            ColumnKind::Integer { .. } => match s.parse::<i64>() {
                Ok(v) => self.classify_i64(v),
                Err(_) => match s.parse::<f64>() {
                    Ok(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 => self.classify_i64(f as i64),
                    _ => Class::Oob(None),
                },
            },
            ColumnKind::Float { .. } => match s.parse::<f64>() {
                Ok(v) => self.classify_f64(v),
                Err(_) => Class::Oob(None),
            },
            ColumnKind::Boolean => match s.to_ascii_lowercase().as_str() {
                "true" | "t" | "yes" | "y" | "1" => Class::Code(1),
                "false" | "f" | "no" | "n" | "0" => Class::Code(0),
                _ => Class::Oob(None),
            },
        }
    }

    #[inline]
    fn classify_i64(&self, v: i64) -> Class {
        match &self.col.kind {
            ColumnKind::Integer { edges } => {
                let lo = edges[0];
                let hi = edges[edges.len() - 1] - 1;
                let k = (edges.len() - 2) as u32;
                if v < lo {
                    return Class::Oob(Some(0));
                }
                if v > hi {
                    return Class::Oob(Some(k));
                }
                Class::Code(match self.uniform_width {
                    Some(w) => (((v - lo) as f64 / w) as u32).min(k),
                    None => (edges.partition_point(|&e| e <= v) - 1) as u32,
                })
            }
            ColumnKind::Float { .. } => self.classify_f64(v as f64),
            ColumnKind::Boolean => match v {
                0 => Class::Code(0),
                1 => Class::Code(1),
                _ => Class::Oob(None),
            },
            ColumnKind::Categorical { .. } => match self.labels.get(v.to_string().as_str()) {
                Some(&c) => Class::Code(c),
                None => Class::Oob(None),
            },
        }
    }

    #[inline]
    fn classify_f64(&self, v: f64) -> Class {
        match &self.col.kind {
            ColumnKind::Float { edges } => {
                if v.is_nan() {
                    return Class::Oob(None);
                }
                let lo = edges[0];
                let hi = edges[edges.len() - 1];
                let k = (edges.len() - 2) as u32;
                if v < lo {
                    return Class::Oob(Some(0));
                }
                if v > hi {
                    return Class::Oob(Some(k));
                }
                Class::Code(match self.uniform_width {
                    Some(w) => (((v - lo) / w).floor() as u32).min(k),
                    None => ((edges.partition_point(|&e| e <= v) - 1) as u32).min(k),
                })
            }
            ColumnKind::Integer { .. } => {
                if v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15 {
                    self.classify_i64(v as i64)
                } else if v.is_finite() {
                    // A non-integral value: out of an integer domain; clip rounds to the nearest bin.
                    match self.classify_i64(v.round() as i64) {
                        Class::Code(c) | Class::Oob(Some(c)) => Class::Oob(Some(c)),
                        other => other,
                    }
                } else {
                    Class::Oob(None)
                }
            }
            ColumnKind::Boolean => {
                if v == 0.0 {
                    Class::Code(0)
                } else if v == 1.0 {
                    Class::Code(1)
                } else {
                    Class::Oob(None)
                }
            }
            ColumnKind::Categorical { .. } => match self.labels.get(format_f64(v).as_str()) {
                Some(&c) => Class::Code(c),
                None => Class::Oob(None),
            },
        }
    }
}

fn format_f64(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v}") }
}

fn kind_name(kind: &ColumnKind) -> &'static str {
    match kind {
        ColumnKind::Categorical { .. } => "categorical",
        ColumnKind::Integer { .. } => "integer",
        ColumnKind::Float { .. } => "float",
        ColumnKind::Boolean => "boolean",
    }
}

/// Value of row `i` of `array` as text, for error messages.
fn value_text(array: &dyn Array, i: usize) -> String {
    if array.is_null(i) {
        return "NULL".into();
    }
    datafusion::arrow::util::display::array_value_to_string(array, i)
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|_| "?".into())
}

/// Encodes a stream of batches against a domain. Create one per stream: it
/// counts rows so errors can name the absolute row.
pub struct BatchEncoder {
    domain: Arc<Domain>,
    /// Input column index for each domain column.
    input_index: Vec<usize>,
    output_schema: SchemaRef,
    stats: EncodeStats,
    /// Whether out-of-domain values abort (false = count only, for `inspect`).
    enforce: bool,
    /// Input columns copied unchanged after the domain columns in typed output.
    passthrough: Vec<usize>,
    /// Canonical labels of categorical columns (for the vectorised typed path).
    label_sets: Vec<Option<super::fast::LabelSet>>,
    /// Typed string type per column: categorical columns read as string views
    /// stay views (no copy); others are `Utf8`.
    text_types: Vec<DataType>,
}

impl BatchEncoder {
    /// Prepares an encoder for inputs with `input_schema`.
    pub fn new(domain: Arc<Domain>, input_schema: &Schema) -> Result<Self, EncodeError> {
        let mut input_index = Vec::with_capacity(domain.len());
        for c in domain.columns() {
            let idx =
                input_schema.index_of(&c.name).map_err(|_| EncodeError::MissingColumn { column: c.name.clone() })?;
            // Decided by the schema alone, before any row: a type the kind cannot read
            // fails here for every input, never on the first non-null value.
            let dt = input_schema.field(idx).data_type();
            if !reads(&c.kind, dt) {
                return Err(bad_type(c, dt));
            }
            input_index.push(idx);
        }
        let output_schema = encoded_schema(&domain);
        let stats = EncodeStats { columns: vec![ColumnStats::default(); domain.len()], ..Default::default() };
        let label_sets = domain
            .columns()
            .iter()
            .map(|c| match &c.kind {
                ColumnKind::Categorical { values, .. } => {
                    Some(super::fast::LabelSet::new(values.iter().map(|v| v.as_str())))
                }
                _ => None,
            })
            .collect();
        let text_types = input_index
            .iter()
            .map(|&i| match input_schema.field(i).data_type() {
                DataType::Utf8View => DataType::Utf8View,
                _ => DataType::Utf8,
            })
            .collect();
        Ok(Self {
            domain,
            input_index,
            output_schema,
            stats,
            enforce: true,
            passthrough: vec![],
            label_sets,
            text_types,
        })
    }

    /// Copies the named input columns unchanged after the domain columns in
    /// [`BatchEncoder::typed`] output (e.g. a privacy-unit identifier).
    pub fn with_passthrough(mut self, input_schema: &Schema, names: &[String]) -> Result<Self, EncodeError> {
        self.passthrough = names
            .iter()
            .map(|n| input_schema.index_of(n).map_err(|_| EncodeError::MissingColumn { column: n.clone() }))
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Schema of [`BatchEncoder::typed`] output for inputs with `input_schema`.
    pub fn typed_schema(&self, input_schema: &Schema) -> SchemaRef {
        let mut fields: Vec<Field> = super::decode::decoded_schema(&self.domain)
            .fields()
            .iter()
            .zip(self.domain.columns())
            .zip(&self.text_types)
            .map(|((f, c), t)| match c.kind {
                ColumnKind::Categorical { .. } => f.as_ref().clone().with_data_type(t.clone()),
                _ => f.as_ref().clone(),
            })
            .collect();
        for &p in &self.passthrough {
            fields.push(input_schema.field(p).clone());
        }
        Arc::new(Schema::new(fields))
    }

    /// Count out-of-domain values without applying the policy (for the
    /// curator's `inspect` report): nothing fails, values keep their clipped or
    /// null code.
    pub fn count_only(mut self) -> Self {
        self.enforce = false;
        self
    }

    /// The schema of encoded batches.
    pub fn output_schema(&self) -> SchemaRef {
        self.output_schema.clone()
    }

    /// Counts so far.
    pub fn stats(&self) -> &EncodeStats {
        &self.stats
    }

    /// Consumes the encoder, returning its counts.
    pub fn into_stats(self) -> EncodeStats {
        self.stats
    }

    /// Encodes one batch.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<RecordBatch, EncodeError> {
        self.check_utf8(batch)?;
        let (codes, _, keep) = self.classify_batch(batch, &[])?;
        let outputs: Vec<ArrayRef> = codes.into_iter().map(|c| Arc::new(UInt32Array::from(c)) as ArrayRef).collect();
        let encoded = RecordBatch::try_new(self.output_schema.clone(), outputs).expect("encoded schema matches");
        let out = match keep {
            Some(mask) => {
                filter_record_batch(&encoded, &BooleanArray::from(mask)).expect("filter of equal-length mask")
            }
            None => encoded,
        };
        self.stats.rows_out += out.num_rows() as u64;
        Ok(out)
    }

    /// Normalises one batch to typed values through the domain: categorical
    /// labels (aliases resolved, text trimmed), integers as Int64, reals as
    /// Float64, booleans; null tokens become nulls and out-of-domain values
    /// follow the column's policy (clip clamps the raw value to the bounds).
    ///
    /// Columns whose values are all canonical and in the domain are checked
    /// with whole-array kernels and passed through without per-row work
    /// (`fast_typed`); the others are classified row by row.
    pub fn typed(&mut self, batch: &RecordBatch) -> Result<RecordBatch, EncodeError> {
        self.check_utf8(batch)?;
        let domain = self.domain.clone();
        // The count-only mode (`inspect`) needs every value classified.
        let mut fast: Vec<Option<ArrayRef>> = domain
            .columns()
            .iter()
            .enumerate()
            .map(|(ci, col)| {
                let array = batch.column(self.input_index[ci]);
                let labels = self.label_sets[ci].as_ref();
                self.enforce.then(|| super::fast::fast_typed(col, labels, &self.text_types[ci], array)).flatten()
            })
            .collect();
        let skip: Vec<bool> = fast.iter().map(|f| f.is_some()).collect();
        let (codes, clipped, keep) = self.classify_batch(batch, &skip)?;
        let mut outputs: Vec<ArrayRef> = Vec::with_capacity(domain.len());
        for (ci, col) in domain.columns().iter().enumerate() {
            if let Some(a) = fast[ci].take() {
                outputs.push(a);
                continue;
            }
            let null = col.null_code();
            let array = batch.column(self.input_index[ci]);
            let is_null = |i: usize| Some(codes[ci][i]) == null;
            let out: ArrayRef = match &col.kind {
                ColumnKind::Categorical { values, .. } => {
                    let labels: ArrayRef = Arc::new(
                        (0..codes[ci].len())
                            .map(|i| (!is_null(i)).then(|| values[codes[ci][i] as usize].as_str()))
                            .collect::<datafusion::arrow::array::StringArray>(),
                    );
                    if self.text_types[ci] == DataType::Utf8 {
                        labels
                    } else {
                        cast(&labels, &self.text_types[ci]).map_err(|_| bad_type(col, &self.text_types[ci]))?
                    }
                }
                ColumnKind::Boolean => Arc::new(
                    (0..codes[ci].len()).map(|i| (!is_null(i)).then(|| codes[ci][i] == 1)).collect::<BooleanArray>(),
                ),
                ColumnKind::Integer { edges } => {
                    let (lo, hi) = (edges[0], edges[edges.len() - 1] - 1);
                    let raw = raw_numbers(array.as_ref(), col)?;
                    Arc::new(
                        (0..codes[ci].len())
                            .map(|i| {
                                if is_null(i) {
                                    return None;
                                }
                                let v = raw[i].unwrap_or(f64::NAN);
                                let v = if clipped[ci][i] { v.clamp(lo as f64, hi as f64) } else { v };
                                Some(v.round() as i64)
                            })
                            .collect::<datafusion::arrow::array::Int64Array>(),
                    )
                }
                ColumnKind::Float { edges } => {
                    let (lo, hi) = (edges[0], edges[edges.len() - 1]);
                    let raw = raw_numbers(array.as_ref(), col)?;
                    Arc::new(
                        (0..codes[ci].len())
                            .map(|i| {
                                if is_null(i) {
                                    return None;
                                }
                                let v = raw[i].unwrap_or(f64::NAN);
                                Some(if clipped[ci][i] { v.clamp(lo, hi) } else { v })
                            })
                            .collect::<datafusion::arrow::array::Float64Array>(),
                    )
                }
            };
            outputs.push(out);
        }
        for &p in &self.passthrough {
            outputs.push(batch.column(p).clone());
        }
        let typed =
            RecordBatch::try_new(self.typed_schema(batch.schema().as_ref()), outputs).expect("typed schema matches");
        let out = match keep {
            Some(mask) => filter_record_batch(&typed, &BooleanArray::from(mask)).expect("filter of equal-length mask"),
            None => typed,
        };
        self.stats.rows_out += out.num_rows() as u64;
        Ok(out)
    }

    /// Every text value of the domain's input columns is valid UTF-8. Arrow's
    /// CSV reader (59.x) checks a record's bytes as a whole, after removing the
    /// delimiters, so a multi-byte character split by a delimiter passes its
    /// check while neither field is valid text; reading such a value as `&str`
    /// is undefined behaviour (found by the `csv` fuzz target). One pass over
    /// the bytes and the offsets of each text column.
    fn check_utf8(&self, batch: &RecordBatch) -> Result<(), EncodeError> {
        fn generic<O: datafusion::arrow::array::OffsetSizeTrait>(
            a: &datafusion::arrow::array::GenericStringArray<O>,
        ) -> bool {
            let Ok(text) = std::str::from_utf8(a.value_data()) else { return false };
            a.value_offsets().iter().all(|o| o.to_usize().is_some_and(|o| text.is_char_boundary(o)))
        }
        for (ci, col) in self.domain.columns().iter().enumerate() {
            let array = batch.column(self.input_index[ci]);
            let ok = match array.data_type() {
                DataType::Utf8 => generic(array.as_string::<i32>()),
                DataType::LargeUtf8 => generic(array.as_string::<i64>()),
                DataType::Utf8View => array.to_data().validate_full().is_ok(),
                _ => true,
            };
            if !ok {
                return Err(EncodeError::InvalidUtf8 { column: col.name.clone() });
            }
        }
        Ok(())
    }

    /// Codes per column, per-row "was clipped" flags, and the rows to keep.
    /// Columns flagged in `skip` are known to be canonical and in the domain
    /// (only their nulls are counted; their codes and flags are left empty).
    #[allow(clippy::type_complexity)]
    fn classify_batch(
        &mut self,
        batch: &RecordBatch,
        skip: &[bool],
    ) -> Result<(Vec<Vec<u32>>, Vec<Vec<bool>>, Option<Vec<bool>>), EncodeError> {
        let n = batch.num_rows();
        let row0 = self.stats.rows_in;
        let mut keep: Option<Vec<bool>> = None;
        let mut all_codes = Vec::with_capacity(self.domain.len());
        let mut all_clipped = Vec::with_capacity(self.domain.len());
        let domain = self.domain.clone();
        for (ci, col) in domain.columns().iter().enumerate() {
            let array = batch.column(self.input_index[ci]);
            if skip.get(ci).copied().unwrap_or(false) {
                self.stats.columns[ci].nulls += array.null_count() as u64;
                all_codes.push(Vec::new());
                all_clipped.push(Vec::new());
                continue;
            }
            let enc = ColumnEncoder::new(col);
            let classes = classify_array(&enc, array.as_ref())?;
            let mut codes = Vec::with_capacity(n);
            let mut clipped_rows = vec![false; n];
            let st = &mut self.stats.columns[ci];
            for (i, class) in classes.into_iter().enumerate() {
                let code = match class {
                    Class::Code(c) => c,
                    Class::Null => {
                        st.nulls += 1;
                        match col.null_code() {
                            Some(nc) => nc,
                            None => {
                                // A null in a non-nullable column: `error` fails; every other
                                // policy drops the row (data-independent, docs/PRIVACY.md §1).
                                if !self.enforce {
                                    0
                                } else if col.out_of_domain != OutOfDomain::Error {
                                    st.dropped += 1;
                                    keep.get_or_insert_with(|| vec![true; n])[i] = false;
                                    0
                                } else {
                                    return Err(EncodeError::OutOfDomain {
                                        column: col.name.clone(),
                                        row: row0 + i as u64,
                                        value: value_text(array.as_ref(), i),
                                        reason: "is null but the column is not nullable".into(),
                                    });
                                }
                            }
                        }
                    }
                    Class::Oob(clipped) => {
                        st.out_of_domain += 1;
                        if !self.enforce {
                            clipped.or(col.null_code()).unwrap_or(0)
                        } else {
                            match col.out_of_domain {
                                OutOfDomain::Error => {
                                    return Err(EncodeError::OutOfDomain {
                                        column: col.name.clone(),
                                        row: row0 + i as u64,
                                        value: value_text(array.as_ref(), i),
                                        reason: "is outside the public domain".into(),
                                    });
                                }
                                OutOfDomain::Clip => match clipped {
                                    Some(c) => {
                                        st.clipped += 1;
                                        clipped_rows[i] = true;
                                        c
                                    }
                                    None => {
                                        // Not a number, so nothing to clip to: drop the row
                                        // (never fail on one row under a DP policy).
                                        st.dropped += 1;
                                        keep.get_or_insert_with(|| vec![true; n])[i] = false;
                                        0
                                    }
                                },
                                OutOfDomain::Null => {
                                    st.nulled += 1;
                                    col.null_code().expect("validated: null policy needs nullable")
                                }
                                OutOfDomain::DropRow | OutOfDomain::DropRowIfRead => {
                                    st.dropped += 1;
                                    keep.get_or_insert_with(|| vec![true; n])[i] = false;
                                    0
                                }
                            }
                        }
                    }
                };
                codes.push(code);
            }
            all_codes.push(codes);
            all_clipped.push(clipped_rows);
        }
        self.stats.rows_in += n as u64;
        Ok((all_codes, all_clipped, keep))
    }
}

/// Raw numeric values of a column (text parsed after trimming; unparseable → None).
fn raw_numbers(array: &dyn Array, col: &Column) -> Result<Vec<Option<f64>>, EncodeError> {
    let n = array.len();
    let dt = array.data_type();
    let parse = |s: &str| s.trim().parse::<f64>().ok();
    Ok(match dt {
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            (0..n).map(|i| if a.is_null(i) { None } else { parse(a.value(i)) }).collect()
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            (0..n).map(|i| if a.is_null(i) { None } else { parse(a.value(i)) }).collect()
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            (0..n).map(|i| if a.is_null(i) { None } else { parse(a.value(i)) }).collect()
        }
        DataType::Dictionary(_, _) => {
            let a = cast(array, &DataType::Utf8).map_err(|_| bad_type(col, dt))?;
            return raw_numbers(a.as_ref(), col);
        }
        _ => {
            let a = cast(array, &DataType::Float64).map_err(|_| bad_type(col, dt))?;
            let a = a.as_primitive::<Float64Type>();
            (0..n).map(|i| (!a.is_null(i)).then(|| a.value(i))).collect()
        }
    })
}

/// The schema of encoded batches: one non-null UInt32 per domain column.
pub fn encoded_schema(domain: &Domain) -> SchemaRef {
    Arc::new(Schema::new(
        domain.columns().iter().map(|c| Field::new(&c.name, DataType::UInt32, false)).collect::<Vec<_>>(),
    ))
}

/// Whether an input column of type `dt` can be read as `kind` (the cases of
/// `classify_array`).
fn reads(kind: &ColumnKind, dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => true,
        DataType::Dictionary(_, v) => reads(kind, v),
        DataType::Boolean => matches!(kind, ColumnKind::Boolean),
        dt if dt.is_integer() || dt.is_floating() => true,
        DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => true,
        _ => false,
    }
}

fn bad_type(col: &Column, dt: &DataType) -> EncodeError {
    EncodeError::BadType { column: col.name.clone(), data_type: dt.to_string(), kind: kind_name(&col.kind).into() }
}

fn classify_array(enc: &ColumnEncoder<'_>, array: &dyn Array) -> Result<Vec<Class>, EncodeError> {
    let col = enc.col;
    let dt = array.data_type();
    let n = array.len();
    let mut out = Vec::with_capacity(n);
    macro_rules! strings {
        ($arr:expr) => {{
            let a = $arr;
            // Cache the last lookup: sorted or low-cardinality inputs repeat values.
            let mut last: Option<(&str, Class)> = None;
            for i in 0..n {
                if a.is_null(i) {
                    out.push(Class::Null);
                    continue;
                }
                let s = a.value(i);
                let c = match last {
                    Some((p, c)) if p == s => c,
                    _ => {
                        let c = enc.classify_str(s);
                        last = Some((s, c));
                        c
                    }
                };
                out.push(c);
            }
        }};
    }
    match dt {
        DataType::Utf8 => strings!(array.as_string::<i32>()),
        DataType::LargeUtf8 => strings!(array.as_string::<i64>()),
        DataType::Utf8View => strings!(array.as_string_view()),
        DataType::Dictionary(_, _) => {
            let a = cast(array, &DataType::Utf8).map_err(|_| bad_type(col, dt))?;
            return classify_array(enc, a.as_ref());
        }
        DataType::Boolean => {
            let a = array.as_boolean();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Class::Null
                } else {
                    match &col.kind {
                        ColumnKind::Boolean => Class::Code(a.value(i) as u32),
                        _ => return Err(bad_type(col, dt)),
                    }
                });
            }
        }
        dt if dt.is_integer() => {
            let a = cast(array, &DataType::Int64).map_err(|_| bad_type(col, dt))?;
            // A lossy cast (u64 > i64::MAX) shows up as a new null: out of domain.
            let a = a.as_primitive::<Int64Type>();
            for i in 0..n {
                out.push(if array.is_null(i) {
                    Class::Null
                } else if a.is_null(i) {
                    Class::Oob(None)
                } else {
                    enc.classify_i64(a.value(i))
                });
            }
        }
        dt if dt.is_floating() || matches!(dt, DataType::Decimal128(_, _) | DataType::Decimal256(_, _)) => {
            let a = cast(array, &DataType::Float64).map_err(|_| bad_type(col, dt))?;
            let a = a.as_primitive::<Float64Type>();
            for i in 0..n {
                out.push(if array.is_null(i) { Class::Null } else { enc.classify_f64(a.value(i)) });
            }
        }
        DataType::Null => out.resize(n, Class::Null),
        _ => return Err(bad_type(col, dt)),
    }
    Ok(out)
}
