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
        if let ColumnKind::Categorical { values, aliases } = &col.kind {
            for (i, v) in values.iter().enumerate() {
                labels.insert(v.as_str(), i as u32);
            }
            for (from, to) in aliases {
                let code = labels[to.as_str()];
                labels.insert(from.as_str(), code);
            }
        }
        Self { col, labels, uniform_width: uniform_width(&col.kind) }
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
                Class::Code(int_code(v, edges, self.uniform_width))
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
                Class::Code(float_code(v, edges, self.uniform_width))
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

/// The common width of a numeric column's bins, when they are uniform.
fn uniform_width(kind: &ColumnKind) -> Option<f64> {
    match kind {
        ColumnKind::Integer { edges } => {
            let w = edges[1] - edges[0];
            edges.windows(2).all(|p| p[1] - p[0] == w).then_some(w as f64)
        }
        ColumnKind::Float { edges } => {
            let w = edges[1] - edges[0];
            // Uniform when every edge equals lo + i·w exactly.
            (edges.len() > 1 && edges.iter().enumerate().all(|(i, e)| *e == edges[0] + i as f64 * w)).then_some(w)
        }
        _ => None,
    }
}

/// The bin of an integer `v` inside `[edges[0], edges[last] - 1]` (`w`: the
/// width when the bins are uniform). Any `v` gives some code without
/// panicking, so the vectorised path may compute it under a null slot.
#[inline]
fn int_code(v: i64, edges: &[i64], w: Option<f64>) -> u32 {
    let k = (edges.len() - 2) as u32;
    match w {
        Some(w) => ((v.wrapping_sub(edges[0]) as f64 / w) as u32).min(k),
        None => (edges.partition_point(|&e| e <= v).max(1) - 1) as u32,
    }
}

/// The bin of a real `v` inside `[edges[0], edges[last]]` (as [`int_code`]).
#[inline]
fn float_code(v: f64, edges: &[f64], w: Option<f64>) -> u32 {
    let k = (edges.len() - 2) as u32;
    match w {
        Some(w) => (((v - edges[0]) / w).floor() as u32).min(k),
        None => ((edges.partition_point(|&e| e <= v).max(1) - 1) as u32).min(k),
    }
}

/// The codes of `array` when every value is one the row path codes without
/// a policy — a label or alias of a categorical column, an integer or real
/// inside the bounds, a boolean — and nulls appear only where the column has
/// a null code. Whole-array passes without a class per row; `None` sends the
/// column to the row path, which gives the same codes (the label table holds
/// only strings `classify_str` codes, and the numeric bins share
/// [`int_code`]/[`float_code`]). Never reads a value as `&str`, so it may run
/// before the UTF-8 check: a string equal to a label is valid text.
fn fast_codes(col: &Column, table: Option<&super::fast::LabelSet>, array: &ArrayRef) -> Option<Vec<u32>> {
    let dt = array.data_type();
    let nc = match (array.null_count(), col.null_code()) {
        (0, c) => c.unwrap_or(0),
        (_, Some(c)) => c,
        (_, None) => return None,
    };
    let valid = array.logical_nulls();
    let valid = valid.as_ref().map(|n| n.inner());
    // A null row's slot holds anything: its code becomes the null code.
    let nulls_to = |mut codes: Vec<u32>| {
        if let Some(v) = valid {
            codes.iter_mut().zip(v.iter()).for_each(|(c, ok)| *c = if ok { *c } else { nc });
        }
        codes
    };
    match (&col.kind, dt) {
        (ColumnKind::Integer { edges }, dt) if dt.is_integer() => {
            let a = cast(array, &DataType::Int64).ok()?;
            // A lossy cast (u64 above i64::MAX) shows up as a new null.
            if a.null_count() != array.null_count() {
                return None;
            }
            let a = a.as_primitive::<Int64Type>();
            if !super::fast::within(a, edges[0], edges[edges.len() - 1] - 1) {
                return None;
            }
            let w = uniform_width(&col.kind);
            Some(nulls_to(a.values().iter().map(|&v| int_code(v, edges, w)).collect()))
        }
        (ColumnKind::Float { edges }, dt) if dt.is_floating() => {
            let a = cast(array, &DataType::Float64).ok()?;
            let a = a.as_primitive::<Float64Type>();
            // NaN fails both comparisons, so it goes to the row path.
            if !super::fast::within(a, edges[0], edges[edges.len() - 1]) {
                return None;
            }
            let w = uniform_width(&col.kind);
            Some(nulls_to(a.values().iter().map(|&v| float_code(v, edges, w)).collect()))
        }
        (ColumnKind::Boolean, DataType::Boolean) => {
            Some(nulls_to(array.as_boolean().values().iter().map(u32::from).collect()))
        }
        (ColumnKind::Categorical { .. }, DataType::Utf8View) => {
            let table = table?;
            let a = array.as_string_view();
            let Some(p) = table.perfect() else {
                // A label longer than a view holds inline: look each row up by its bytes.
                let buffers = a.data_buffers();
                let mut last: Option<(u128, u32)> = None;
                let mut codes = Vec::with_capacity(a.len());
                for (i, &v) in a.views().iter().enumerate() {
                    if valid.is_some_and(|b| !b.value(i)) {
                        codes.push(nc);
                        continue;
                    }
                    let c = match last {
                        Some((p, c)) if p == v => c,
                        _ => {
                            let c = table.view_code(v, buffers)?;
                            last = Some((v, c));
                            c
                        }
                    };
                    codes.push(c);
                }
                return Some(codes);
            };
            let views = a.views();
            let mut ok = true;
            let codes: Vec<u32> = match valid {
                None => views
                    .iter()
                    .map(|&v| {
                        let c = p.code(v);
                        ok &= c.is_some();
                        c.unwrap_or(0)
                    })
                    .collect(),
                Some(valid) => views
                    .iter()
                    .zip(valid.iter())
                    .map(|(&v, is)| {
                        let c = p.code(v);
                        ok &= c.is_some() | !is;
                        if is { c.unwrap_or(0) } else { nc }
                    })
                    .collect(),
            };
            ok.then_some(codes)
        }
        (ColumnKind::Categorical { .. }, DataType::Utf8) => label_codes(array.as_string::<i32>(), table?, valid, nc),
        (ColumnKind::Categorical { .. }, DataType::LargeUtf8) => {
            label_codes(array.as_string::<i64>(), table?, valid, nc)
        }
        _ => None,
    }
}

/// [`fast_codes`] for offset strings: each row's bytes looked up, the last
/// lookup reused (sorted or low-cardinality inputs repeat values).
fn label_codes<O: datafusion::arrow::array::OffsetSizeTrait>(
    a: &datafusion::arrow::array::GenericStringArray<O>,
    table: &super::fast::LabelSet,
    valid: Option<&datafusion::arrow::buffer::BooleanBuffer>,
    nc: u32,
) -> Option<Vec<u32>> {
    let offsets = a.value_offsets();
    let bytes = a.value_data();
    let mut codes = Vec::with_capacity(a.len());
    let mut last: Option<(&[u8], u32)> = None;
    for i in 0..a.len() {
        if valid.is_some_and(|v| !v.value(i)) {
            codes.push(nc);
            continue;
        }
        let b = bytes.get(offsets[i].as_usize()..offsets[i + 1].as_usize())?;
        let c = match last {
            Some((p, c)) if p == b => c,
            _ => {
                let c = table.code(b)?;
                last = Some((b, c));
                c
            }
        };
        codes.push(c);
    }
    Some(codes)
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
    /// Labels and aliases of categorical columns with their codes (for the
    /// vectorised encode path, [`fast_codes`]).
    code_tables: Vec<Option<super::fast::LabelSet>>,
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
        // Only strings the row path codes as they are (a label or alias that is
        // not a null token and needs no trimming) enter the table.
        let code_tables = domain
            .columns()
            .iter()
            .map(|c| match &c.kind {
                ColumnKind::Categorical { values, aliases } => {
                    let enc = ColumnEncoder::new(c);
                    let keys = values.iter().chain(aliases.keys()).filter_map(|l| match enc.classify_str(l) {
                        Class::Code(code) => Some((l.as_str(), code)),
                        _ => None,
                    });
                    Some(super::fast::LabelSet::with_codes(keys))
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
            code_tables,
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
    ///
    /// Columns whose values all code as they are take whole-array passes
    /// (`fast_codes`); the others are checked for UTF-8 and classified row
    /// by row.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<RecordBatch, EncodeError> {
        let mut fast: Vec<Option<Vec<u32>>> = self
            .domain
            .columns()
            .iter()
            .enumerate()
            .map(|(ci, col)| fast_codes(col, self.code_tables[ci].as_ref(), batch.column(self.input_index[ci])))
            .collect();
        let skip: Vec<bool> = fast.iter().map(Option::is_some).collect();
        self.check_utf8(batch, &skip)?;
        let (mut codes, _, keep) = self.classify_batch(batch, &skip)?;
        for (ci, f) in fast.iter_mut().enumerate() {
            if let Some(f) = f.take() {
                codes[ci] = f;
            }
        }
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
        self.check_utf8(batch, &[])?;
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
    /// Columns flagged in `skip` are not checked (their values were never read as text).
    fn check_utf8(&self, batch: &RecordBatch, skip: &[bool]) -> Result<(), EncodeError> {
        fn generic<O: datafusion::arrow::array::OffsetSizeTrait>(
            a: &datafusion::arrow::array::GenericStringArray<O>,
        ) -> bool {
            let Ok(text) = std::str::from_utf8(a.value_data()) else { return false };
            a.value_offsets().iter().all(|o| o.to_usize().is_some_and(|o| text.is_char_boundary(o)))
        }
        for (ci, col) in self.domain.columns().iter().enumerate() {
            if skip.get(ci).copied().unwrap_or(false) {
                continue;
            }
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

#[cfg(test)]
mod fast_tests {
    use std::collections::BTreeMap;

    use datafusion::arrow::array::{
        Float32Array, Float64Array, Int32Array, Int64Array, LargeStringArray, StringArray, StringViewArray, UInt64Array,
    };

    use super::*;

    fn column(kind: ColumnKind, nullable: bool, null_tokens: &[&str]) -> Column {
        Column {
            name: "x".into(),
            kind,
            nullable,
            null_tokens: null_tokens.iter().map(|t| t.to_string()).collect(),
            out_of_domain: OutOfDomain::Clip,
            not_applicable_when: None,
        }
    }

    /// A small deterministic generator (xorshift), so the cases are fixed.
    struct Gen(u64);
    impl Gen {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Whenever the whole-array path answers, each code is the row path's:
    /// its `Code`, or the null code for a `Null`. Checked on random arrays
    /// of every readable type with nulls, null tokens, aliases, padded text
    /// and out-of-domain values mixed in, and the whole-array path must
    /// answer on the clean ones (so the check is never vacuous).
    #[test]
    fn whole_array_codes_equal_the_row_path() {
        // Without the 13-byte label every label is inline in a string view.
        let cat = |nullable, long: bool| {
            let labels = ["a", "b", "twelve bytes", "NA", "thirteen byte", "a label beyond sixteen bytes"];
            let labels = if long { &labels[..] } else { &labels[..4] };
            column(
                ColumnKind::Categorical {
                    values: labels.iter().map(|l| l.to_string()).collect(),
                    aliases: BTreeMap::from([("B".to_string(), "b".to_string())]),
                },
                nullable,
                &["NA", "?"],
            )
        };
        let columns = [
            cat(true, false),
            cat(false, true),
            cat(true, true),
            column(ColumnKind::Integer { edges: vec![-5, 0, 5, 10, 15] }, true, &[]),
            column(ColumnKind::Integer { edges: vec![0, 1, 18, 65, 100] }, true, &[]),
            column(ColumnKind::Float { edges: vec![0.0, 0.25, 0.5, 0.75, 1.0] }, true, &[]),
            column(ColumnKind::Float { edges: vec![0.0, 0.1, 0.9, 1.0] }, false, &[]),
            column(ColumnKind::Boolean, true, &[]),
        ];
        let texts = [
            "a",
            "b",
            "B",
            "twelve bytes",
            "thirteen byte",
            "NA",
            "?",
            " a",
            "c",
            "",
            "a label beyond sixteen bytes",
            "a label beyond sixteen bytez",
        ];
        let mut g = Gen(0x2545_F491_4F6C_DD1D);
        let mut answered = vec![0usize; columns.len()];
        for round in 0..400 {
            // Every fourth round is clean: in-domain values (and nulls where allowed) only.
            let clean = round % 4 == 0;
            for (ci, col) in columns.iter().enumerate() {
                let n = 1 + g.below(40) as usize;
                let null = |g: &mut Gen| (col.nullable || !clean) && g.below(6) == 0;
                let long_labels = matches!(&col.kind, ColumnKind::Categorical { values, .. } if values.len() > 4);
                let array: ArrayRef = match &col.kind {
                    ColumnKind::Categorical { .. } => {
                        let vals: Vec<Option<&str>> = (0..n)
                            .map(|_| {
                                if null(&mut g) {
                                    None
                                } else if clean {
                                    let k = if long_labels { 6 } else { 4 };
                                    let pick = [
                                        "a",
                                        "b",
                                        "B",
                                        "twelve bytes",
                                        "thirteen byte",
                                        "a label beyond sixteen bytes",
                                    ];
                                    Some(pick[g.below(k) as usize])
                                } else {
                                    Some(texts[g.below(texts.len() as u64) as usize])
                                }
                            })
                            .collect();
                        match round % 3 {
                            0 => Arc::new(StringViewArray::from(vals)),
                            1 => Arc::new(StringArray::from(vals)),
                            _ => Arc::new(LargeStringArray::from(vals)),
                        }
                    }
                    ColumnKind::Integer { edges } => {
                        let (lo, hi) = (edges[0], edges[edges.len() - 1] - 1);
                        let vals: Vec<Option<i64>> = (0..n)
                            .map(|_| {
                                let span = (hi - lo + 1) as u64 + if clean { 0 } else { 6 };
                                (!null(&mut g)).then(|| lo - if clean { 0 } else { 3 } + g.below(span) as i64)
                            })
                            .collect();
                        match round % 3 {
                            0 => Arc::new(Int64Array::from(vals)),
                            1 => {
                                Arc::new(Int32Array::from(vals.iter().map(|v| v.map(|v| v as i32)).collect::<Vec<_>>()))
                            }
                            // Unsigned: a negative becomes a value above i64::MAX (lossy cast).
                            _ => Arc::new(UInt64Array::from(
                                vals.iter().map(|v| v.map(|v| v as u64)).collect::<Vec<_>>(),
                            )),
                        }
                    }
                    ColumnKind::Float { edges } => {
                        let (lo, hi) = (edges[0], edges[edges.len() - 1]);
                        let vals: Vec<Option<f64>> = (0..n)
                            .map(|_| {
                                (!null(&mut g)).then(|| match (clean, g.below(10)) {
                                    (false, 0) => f64::NAN,
                                    (false, 1) => hi + 0.5,
                                    // Often exactly on an edge.
                                    (_, 2) => edges[g.below(edges.len() as u64) as usize],
                                    _ => lo + (hi - lo) * g.below(1001) as f64 / 1000.0,
                                })
                            })
                            .collect();
                        if round % 2 == 0 {
                            Arc::new(Float64Array::from(vals))
                        } else {
                            Arc::new(Float32Array::from(vals.iter().map(|v| v.map(|v| v as f32)).collect::<Vec<_>>()))
                        }
                    }
                    ColumnKind::Boolean => Arc::new(BooleanArray::from(
                        (0..n).map(|_| (!null(&mut g)).then(|| g.below(2) == 1)).collect::<Vec<_>>(),
                    )),
                };
                let enc = ColumnEncoder::new(col);
                let table = match &col.kind {
                    ColumnKind::Categorical { values, aliases } => Some(super::super::fast::LabelSet::with_codes(
                        values.iter().chain(aliases.keys()).filter_map(|l| match enc.classify_str(l) {
                            Class::Code(c) => Some((l.as_str(), c)),
                            _ => None,
                        }),
                    )),
                    _ => None,
                };
                let fast = fast_codes(col, table.as_ref(), &array);
                let rows = classify_array(&enc, array.as_ref()).unwrap();
                let row_codes: Option<Vec<u32>> = rows
                    .iter()
                    .map(|c| match c {
                        Class::Code(c) => Some(*c),
                        Class::Null => col.null_code(),
                        Class::Oob(_) => None,
                    })
                    .collect();
                if let Some(f) = &fast {
                    answered[ci] += 1;
                    assert_eq!(Some(f), row_codes.as_ref(), "column {ci}, round {round}: {array:?}");
                }
                // A clean array answers, except negative numbers read as unsigned (out of the
                // domain on both paths).
                let negative_unsigned =
                    matches!(&col.kind, ColumnKind::Integer { edges } if edges[0] < 0) && round % 3 == 2;
                if clean && !negative_unsigned {
                    assert!(fast.is_some(), "column {ci}, round {round}: a clean array took the row path");
                }
            }
        }
        assert!(answered.iter().all(|&a| a >= 60), "{answered:?}");
    }
}
