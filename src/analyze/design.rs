//! Design matrices from Arrow batches: a formula's response and terms as
//! f64 columns, the way statsmodels' formula interface builds them.
//!
//! - Numeric columns (integers, floats) and booleans (0/1) enter as they are.
//! - Text and dictionary columns are categorical, in treatment coding: one
//!   0/1 column per level except the reference, which is the first level in
//!   sorted order (patsy's default), named `column[T.level]`. Levels are
//!   collected over *all* sets first, so every set has the same columns.
//! - A row with a null in the response or any term is left out (listwise
//!   deletion, what statsmodels does with `missing='drop'`); the count is
//!   reported. A null never becomes a value.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{and, cast, filter, is_not_null};
use datafusion::arrow::datatypes::{DataType, Float64Type, Schema};
use ndarray::{Array1, Array2};

use super::AnalyzeError;
use super::formula::Formula;

/// How a column enters a design.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Numeric,
    Categorical { levels: Vec<String> },
}

/// Whether an Arrow type is read as numeric (true), categorical (false) or
/// not at all (None).
fn numeric(t: &DataType) -> Option<bool> {
    match t {
        t if t.is_numeric() => Some(true),
        DataType::Boolean => Some(true),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(false),
        DataType::Dictionary(_, v) => numeric(v).filter(|n| !n).or(Some(false)),
        _ => None,
    }
}

/// The categorical columns among `columns` in `schema` (text and dictionary).
pub fn categorical_columns(schema: &Schema, columns: &[String], set: &str) -> Result<Vec<String>, AnalyzeError> {
    let mut out = Vec::new();
    for c in columns {
        let f = schema.field_with_name(c).map_err(|_| AnalyzeError::Column {
            set: set.to_string(),
            column: c.clone(),
            problem: format!(
                "is not in the set (its columns: {})",
                schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
            ),
        })?;
        match numeric(f.data_type()) {
            Some(true) => {}
            Some(false) => out.push(c.clone()),
            None => {
                return Err(AnalyzeError::Column {
                    set: set.to_string(),
                    column: c.clone(),
                    problem: format!(
                        "has type {}, which an analysis cannot use (numbers, booleans or text)",
                        f.data_type()
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// Adds the non-null values of the categorical `columns` of `batch` to `levels`.
pub fn collect_levels(
    batch: &RecordBatch,
    columns: &[String],
    levels: &mut BTreeMap<String, BTreeSet<String>>,
    set: &str,
) -> Result<(), AnalyzeError> {
    for c in columns {
        let text = text_column(batch, c, set)?;
        let entry = levels.entry(c.clone()).or_default();
        for v in text.as_string::<i32>().iter().flatten() {
            if !entry.contains(v) {
                entry.insert(v.to_string());
            }
        }
    }
    Ok(())
}

fn column<'a>(batch: &'a RecordBatch, name: &str, set: &str) -> Result<&'a ArrayRef, AnalyzeError> {
    batch.column_by_name(name).ok_or_else(|| AnalyzeError::Column {
        set: set.to_string(),
        column: name.to_string(),
        problem: "is not in the set".into(),
    })
}

fn cast_err(set: &str, name: &str) -> impl FnOnce(datafusion::arrow::error::ArrowError) -> AnalyzeError {
    let (set, name) = (set.to_string(), name.to_string());
    move |e| AnalyzeError::Column { set, column: name, problem: format!("cannot be converted: {e}") }
}

fn text_column(batch: &RecordBatch, name: &str, set: &str) -> Result<ArrayRef, AnalyzeError> {
    cast(column(batch, name, set)?, &DataType::Utf8).map_err(cast_err(set, name))
}

fn float_column(array: &ArrayRef, name: &str, set: &str) -> Result<ArrayRef, AnalyzeError> {
    cast(array, &DataType::Float64).map_err(cast_err(set, name))
}

/// How the response is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind {
    /// Any number (linear models, means).
    Real,
    /// 0 or 1 (logistic regression, proportions): `column == value`, a
    /// boolean, or a numeric column holding only 0 and 1.
    Binary,
}

/// A formula bound to the columns' kinds and levels: builds the same
/// columns for every set.
#[derive(Debug, Clone)]
pub struct Design {
    formula: Formula,
    kinds: Vec<Kind>,
    response: ResponseKind,
    names: Vec<String>,
}

/// The design of one batch: the rows without nulls.
#[derive(Debug, Clone)]
pub struct Block {
    /// n × p design matrix.
    pub x: Array2<f64>,
    /// The response, length n.
    pub y: Array1<f64>,
    /// Rows left out for a null.
    pub dropped: usize,
}

impl Design {
    /// Binds `formula`; `levels` holds every categorical column's levels
    /// over all sets, `categorical` which term columns are categorical.
    pub fn new(
        formula: &Formula,
        categorical: &[String],
        levels: &BTreeMap<String, BTreeSet<String>>,
        response: ResponseKind,
    ) -> Result<Self, AnalyzeError> {
        let mut names = Vec::new();
        if formula.intercept {
            names.push("Intercept".to_string());
        }
        let mut kinds = Vec::new();
        for t in &formula.terms {
            if categorical.contains(t) {
                let lv: Vec<String> = levels.get(t).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                if lv.len() < 2 {
                    return Err(AnalyzeError::Spec(format!(
                        "the categorical term `{t}` has {} level(s) over all sets; a term needs at least two (leave it out)",
                        lv.len()
                    )));
                }
                names.extend(lv[1..].iter().map(|l| format!("{t}[T.{l}]")));
                kinds.push(Kind::Categorical { levels: lv });
            } else {
                names.push(t.clone());
                kinds.push(Kind::Numeric);
            }
        }
        if response == ResponseKind::Real
            && formula.response.equals.is_none()
            && categorical.contains(&formula.response.column)
        {
            return Err(AnalyzeError::Spec(format!(
                "the response `{}` is text; a linear model or mean needs a number (for a proportion or logistic \
                 regression write `{} == 'value'`)",
                formula.response.column, formula.response.column
            )));
        }
        Ok(Design { formula: formula.clone(), kinds, response, names })
    }

    /// The design's column (coefficient) names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Builds the block of one batch.
    pub fn block(&self, batch: &RecordBatch, set: &str) -> Result<Block, AnalyzeError> {
        let f = &self.formula;
        let mut arrays = vec![column(batch, &f.response.column, set)?.clone()];
        for t in &f.terms {
            arrays.push(column(batch, t, set)?.clone());
        }
        // Rows with no null in any column used.
        let mut keep: BooleanArray = is_not_null(&arrays[0]).map_err(cast_err(set, &f.response.column))?;
        for (a, t) in arrays[1..].iter().zip(&f.terms) {
            keep = and(&keep, &is_not_null(a).map_err(cast_err(set, t))?).map_err(cast_err(set, t))?;
        }
        let n = keep.true_count();
        let dropped = batch.num_rows() - n;
        let arrays: Vec<ArrayRef> = arrays
            .iter()
            .map(|a| if dropped == 0 { Ok(a.clone()) } else { filter(a, &keep) })
            .collect::<Result<_, _>>()
            .map_err(cast_err(set, &f.response.column))?;
        let y = self.response_values(&arrays[0], set)?;
        let mut x = Array2::<f64>::zeros((n, self.names.len()));
        let mut j = 0;
        if f.intercept {
            x.column_mut(0).fill(1.0);
            j = 1;
        }
        for ((a, t), kind) in arrays[1..].iter().zip(&f.terms).zip(&self.kinds) {
            match kind {
                Kind::Numeric => {
                    let v = float_column(a, t, set)?;
                    let v = v.as_primitive::<Float64Type>();
                    if let Some(bad) = v.values().iter().find(|v| !v.is_finite()) {
                        return Err(AnalyzeError::Column {
                            set: set.to_string(),
                            column: t.clone(),
                            problem: format!("holds {bad}; only finite numbers can enter a model"),
                        });
                    }
                    x.column_mut(j).assign(&Array1::from_iter(v.values().iter().copied()));
                    j += 1;
                }
                Kind::Categorical { levels } => {
                    let index: HashMap<&str, usize> = levels.iter().enumerate().map(|(i, l)| (l.as_str(), i)).collect();
                    let text = cast(a, &DataType::Utf8).map_err(cast_err(set, t))?;
                    for (r, v) in text.as_string::<i32>().iter().enumerate() {
                        let v = v.unwrap_or_default();
                        let i = *index.get(v).ok_or_else(|| AnalyzeError::Column {
                            set: set.to_string(),
                            column: t.clone(),
                            problem: format!("has the level {v:?}, which was not seen when the levels were collected"),
                        })?;
                        if i > 0 {
                            x[[r, j + i - 1]] = 1.0;
                        }
                    }
                    j += levels.len() - 1;
                }
            }
        }
        Ok(Block { x, y, dropped })
    }

    fn response_values(&self, a: &ArrayRef, set: &str) -> Result<Array1<f64>, AnalyzeError> {
        let r = &self.formula.response;
        let bad = |problem: String| AnalyzeError::Column { set: set.to_string(), column: r.column.clone(), problem };
        if let Some(value) = &r.equals {
            let is_num = numeric(a.data_type()) == Some(true) && a.data_type() != &DataType::Boolean;
            if is_num && let Ok(target) = value.parse::<f64>() {
                let v = float_column(a, &r.column, set)?;
                return Ok(v.as_primitive::<Float64Type>().values().iter().map(|&x| f64::from(x == target)).collect());
            }
            let text = cast(a, &DataType::Utf8).map_err(cast_err(set, &r.column))?;
            return Ok(text.as_string::<i32>().iter().map(|v| f64::from(v == Some(value.as_str()))).collect());
        }
        if numeric(a.data_type()) != Some(true) {
            return Err(bad(format!(
                "is {}, not a number; write `{} == 'value'` for a 0/1 response",
                a.data_type(),
                r.column
            )));
        }
        let v = float_column(a, &r.column, set)?;
        let y: Array1<f64> = v.as_primitive::<Float64Type>().values().iter().copied().collect();
        if let Some(x) = y.iter().find(|x| !x.is_finite()) {
            return Err(bad(format!("holds {x}; only finite numbers can be a response")));
        }
        if self.response == ResponseKind::Binary
            && let Some(x) = y.iter().find(|&&x| x != 0.0 && x != 1.0)
        {
            return Err(bad(format!(
                "holds {x}; a logistic regression or proportion needs 0/1 (write `{} == value`)",
                r.column
            )));
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use std::sync::Arc;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("y", DataType::Float64, true),
            Field::new("x", DataType::Int64, true),
            Field::new("g", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Float64Array::from(vec![Some(1.0), Some(2.0), None, Some(4.0)])),
                Arc::new(Int64Array::from(vec![Some(10), Some(20), Some(30), Some(40)])),
                Arc::new(StringArray::from(vec![Some("b"), Some("a"), Some("c"), Some("c")])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn treatment_coding_with_the_first_sorted_level_as_reference_and_listwise_deletion() {
        let b = batch();
        let f = Formula::parse("y ~ x + g").unwrap();
        let cat = categorical_columns(&b.schema(), &f.terms, "s").unwrap();
        assert_eq!(cat, vec!["g"]);
        let mut levels = BTreeMap::new();
        collect_levels(&b, &cat, &mut levels, "s").unwrap();
        let d = Design::new(&f, &cat, &levels, ResponseKind::Real).unwrap();
        assert_eq!(d.names(), ["Intercept", "x", "g[T.b]", "g[T.c]"]);
        let blk = d.block(&b, "s").unwrap();
        assert_eq!(blk.dropped, 1, "the row with a null response is left out");
        assert_eq!(blk.y.to_vec(), vec![1.0, 2.0, 4.0]);
        let rows: Vec<Vec<f64>> = blk.x.outer_iter().map(|r| r.to_vec()).collect();
        assert_eq!(rows, vec![vec![1.0, 10.0, 1.0, 0.0], vec![1.0, 20.0, 0.0, 0.0], vec![1.0, 40.0, 0.0, 1.0]]);
    }

    #[test]
    fn binary_responses_from_equality_booleans_or_zero_one_columns() {
        let b = batch();
        let mut levels = BTreeMap::new();
        collect_levels(&b, &["g".to_string()], &mut levels, "s").unwrap();
        let f = Formula::parse("g == 'c' ~ x").unwrap();
        let d = Design::new(&f, &[], &levels, ResponseKind::Binary).unwrap();
        assert_eq!(d.block(&b, "s").unwrap().y.to_vec(), vec![0.0, 0.0, 1.0, 1.0]);
        let f = Formula::parse("x == 20 ~ 1").unwrap();
        let d = Design::new(&f, &[], &levels, ResponseKind::Binary).unwrap();
        assert_eq!(d.block(&b, "s").unwrap().y.to_vec(), vec![0.0, 1.0, 0.0, 0.0]);
        let f = Formula::parse("x ~ 1").unwrap();
        let d = Design::new(&f, &[], &levels, ResponseKind::Binary).unwrap();
        let e = d.block(&b, "s").unwrap_err().to_string();
        assert!(e.contains("needs 0/1"), "{e}");
        let f = Formula::parse("g ~ x").unwrap();
        let e = Design::new(&f, &["g".into()], &levels, ResponseKind::Real).unwrap_err().to_string();
        assert!(e.contains("is text"), "{e}");
        let e = categorical_columns(&b.schema(), &["nope".to_string()], "s").unwrap_err().to_string();
        assert!(e.contains("`nope` is not in the set") && e.contains("y, x, g"), "{e}");
    }
}
