//! Compiled public domains: one [`Column`] per attribute, with its kind, its
//! bins, its null code and its out-of-domain policy.

use std::collections::{BTreeMap, HashMap};

use datafusion::arrow::datatypes::DataType;
use serde::{Deserialize, Serialize};

/// Why a compiled column is inconsistent (each names the domain-file key to fix).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ColumnError {
    /// A categorical column without values.
    #[error("a categorical column needs at least one value; list them under `values:`")]
    NoValues,
    /// A categorical value listed twice.
    #[error(
        "value {value:?} appears twice (positions {first} and {second}); list it once (other spellings go under `aliases:`)"
    )]
    DuplicateValue {
        /// The value.
        value: String,
        /// Its first position.
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// An alias whose target is not a value.
    #[error("alias {alias:?} maps to {target:?}, which is not a value; add {target:?} to `values:` or fix the alias")]
    UnknownAliasTarget {
        /// The alias.
        alias: String,
        /// What it maps to.
        target: String,
    },
    /// `clip` on a column that is not numeric.
    #[error("out_of_domain: clip needs a numeric column; use drop-row, drop-row-if-read, null or error here")]
    ClipNeedsNumeric,
    /// A numeric column without bins.
    #[error("{article} {kind} column needs at least one bin", article = if kind.starts_with('i') { "an" } else { "a" })]
    NoBins {
        /// "integer" or "float".
        kind: &'static str,
    },
    /// Bin edges that are not finite numbers.
    #[error("bin edges must be finite")]
    NonFiniteEdges,
    /// Bin edges out of order.
    #[error("bin edges must be strictly increasing")]
    EdgesNotIncreasing,
    /// `null` on a column that cannot hold one.
    #[error("out_of_domain: null needs nullable: true")]
    NullNeedsNullable,
    /// More codes than a `u32` holds.
    #[error("domain too large ({size} values; at most 4294967294): use coarser bins")]
    TooLarge {
        /// Values of the column.
        size: usize,
    },
}

/// Why a set of columns is not a domain.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DomainError {
    /// One column is inconsistent.
    #[error("column {column:?}: {reason}")]
    Column {
        /// Column name.
        column: String,
        /// What is wrong with it.
        reason: ColumnError,
    },
    /// Two columns with one name.
    #[error("column {0:?} is declared twice; column names must be unique")]
    DuplicateColumn(String),
    /// A column name that is not in the domain.
    #[error("unknown column {0:?}: it is not in the domain")]
    UnknownColumn(String),
}

/// What to do with a value outside the public domain (counted apart from nulls).
///
/// DP reads accept only the data-independent policies (`clip`, `null`,
/// `drop-row`, `drop-row-if-read`): under them encoding cannot fail, and a
/// value a policy cannot fix (text that is not a number under `clip`, a null
/// in a non-nullable column) drops its row. `error` fails on the first bad
/// row with its value and row number, so it is for curator checks only and
/// refused for DP reads ([`Domain::dp_read_refusal`], docs/PRIVACY.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OutOfDomain {
    /// Fail with an error naming the column, the row and the value (curator
    /// checks only; refused for DP reads).
    Error,
    /// Clamp numeric values to the nearest bound (numeric kinds only).
    Clip,
    /// Replace by null (the column must be nullable).
    Null,
    /// Drop the whole row from every query (the column is read by every
    /// query on the table, so all of them see the same rows).
    DropRow,
    /// Drop the row from the queries that read this column (default): as
    /// cheap as `error` was (a column is only decoded when used), and like
    /// every policy here a row-wise, data-independent transformation.
    #[default]
    DropRowIfRead,
}

impl OutOfDomain {
    /// The spelling used in domain files.
    pub fn as_str(&self) -> &'static str {
        match self {
            OutOfDomain::Error => "error",
            OutOfDomain::Clip => "clip",
            OutOfDomain::Null => "null",
            OutOfDomain::DropRow => "drop-row",
            OutOfDomain::DropRowIfRead => "drop-row-if-read",
        }
    }
}

/// The public domain of one attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ColumnKind {
    /// An ordered list of labels; code i is `values[i]`. `aliases` maps other
    /// spellings in the input to a label (e.g. `"<=50K." → "<=50K"`).
    Categorical {
        /// The labels, in code order.
        values: Vec<String>,
        /// Input spelling → label.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        aliases: BTreeMap<String, String>,
    },
    /// Integers binned by `edges`: bin i is `[edges[i], edges[i+1] − 1]`; the
    /// public bounds are `[edges[0], edges[last] − 1]`.
    Integer {
        /// Strictly increasing bin edges (k + 1 of them for k bins).
        edges: Vec<i64>,
    },
    /// Reals binned by `edges`: bin i is `[edges[i], edges[i+1])`, the last bin
    /// is closed; the public bounds are `[edges[0], edges[last]]`.
    Float {
        /// Strictly increasing bin edges.
        edges: Vec<f64>,
    },
    /// false = code 0, true = code 1.
    Boolean,
}

/// One attribute of a public domain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Column {
    /// Column name, as in the data.
    pub name: String,
    /// Kind and public values/bins.
    #[serde(flatten)]
    pub kind: ColumnKind,
    /// Whether null is part of the domain (then it has its own code).
    #[serde(default)]
    pub nullable: bool,
    /// Text tokens read as null in text inputs (compared after trimming).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub null_tokens: Vec<String>,
    /// Out-of-domain policy.
    #[serde(default)]
    pub out_of_domain: OutOfDomain,
    /// A public rule (an SQL boolean expression over the row's other columns)
    /// under which this column's null means *not applicable* (structural:
    /// never imputed, never counted missing) rather than *unknown*; a null
    /// where the rule is false or null is unknown. `None`: every null is
    /// unknown (docs/domain.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_applicable_when: Option<String>,
}

impl Column {
    /// A non-nullable categorical column with these values (codes in this
    /// order), no aliases, and out-of-domain values refused.
    pub fn categorical(name: &str, values: &[&str]) -> Self {
        Column {
            name: name.into(),
            kind: ColumnKind::Categorical {
                values: values.iter().map(|s| s.to_string()).collect(),
                aliases: Default::default(),
            },
            nullable: false,
            null_tokens: vec![],
            out_of_domain: OutOfDomain::Error,
            not_applicable_when: None,
        }
    }

    /// Number of value codes (excluding the null code).
    pub fn size(&self) -> usize {
        match &self.kind {
            ColumnKind::Categorical { values, .. } => values.len(),
            ColumnKind::Integer { edges } => edges.len() - 1,
            ColumnKind::Float { edges } => edges.len() - 1,
            ColumnKind::Boolean => 2,
        }
    }

    /// Number of codes including the null code of a nullable column.
    pub fn cardinality(&self) -> usize {
        self.size() + usize::from(self.nullable)
    }

    /// The code that stands for null, if the column is nullable.
    pub fn null_code(&self) -> Option<u32> {
        self.nullable.then_some(self.size() as u32)
    }

    /// The Arrow type of decoded values.
    pub fn arrow_type(&self) -> DataType {
        match &self.kind {
            ColumnKind::Categorical { .. } => DataType::Utf8,
            ColumnKind::Integer { .. } => DataType::Int64,
            ColumnKind::Float { .. } => DataType::Float64,
            ColumnKind::Boolean => DataType::Boolean,
        }
    }

    /// Human-readable label of a code (for reports).
    pub fn label(&self, code: u32) -> String {
        if Some(code) == self.null_code() {
            return "NULL".to_string();
        }
        let i = code as usize;
        match &self.kind {
            ColumnKind::Categorical { values, .. } => values.get(i).cloned().unwrap_or_default(),
            ColumnKind::Integer { edges } => {
                let (lo, hi) = (edges[i], edges[i + 1] - 1);
                if lo == hi { lo.to_string() } else { format!("[{lo}, {hi}]") }
            }
            ColumnKind::Float { edges } => {
                let close = if i + 2 == edges.len() { "]" } else { ")" };
                format!("[{}, {}{close}", edges[i], edges[i + 1])
            }
            ColumnKind::Boolean => (i == 1).to_string(),
        }
    }

    /// Checks the internal consistency of a compiled column.
    pub fn validate(&self) -> Result<(), ColumnError> {
        match &self.kind {
            ColumnKind::Categorical { values, aliases } => {
                if values.is_empty() {
                    return Err(ColumnError::NoValues);
                }
                let mut seen = HashMap::new();
                for (i, v) in values.iter().enumerate() {
                    if let Some(j) = seen.insert(v.as_str(), i) {
                        return Err(ColumnError::DuplicateValue { value: v.clone(), first: j, second: i });
                    }
                }
                for (from, to) in aliases {
                    if !seen.contains_key(to.as_str()) {
                        return Err(ColumnError::UnknownAliasTarget { alias: from.clone(), target: to.clone() });
                    }
                }
                if self.out_of_domain == OutOfDomain::Clip {
                    return Err(ColumnError::ClipNeedsNumeric);
                }
            }
            ColumnKind::Integer { edges } => {
                if edges.len() < 2 {
                    return Err(ColumnError::NoBins { kind: "integer" });
                }
                if edges.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(ColumnError::EdgesNotIncreasing);
                }
            }
            ColumnKind::Float { edges } => {
                if edges.len() < 2 {
                    return Err(ColumnError::NoBins { kind: "float" });
                }
                if edges.iter().any(|e| !e.is_finite()) {
                    return Err(ColumnError::NonFiniteEdges);
                }
                if edges.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(ColumnError::EdgesNotIncreasing);
                }
            }
            ColumnKind::Boolean => {
                if self.out_of_domain == OutOfDomain::Clip {
                    return Err(ColumnError::ClipNeedsNumeric);
                }
            }
        }
        if self.out_of_domain == OutOfDomain::Null && !self.nullable {
            return Err(ColumnError::NullNeedsNullable);
        }
        if self.size() > u32::MAX as usize - 1 {
            return Err(ColumnError::TooLarge { size: self.size() });
        }
        Ok(())
    }

    /// Inclusive integer bounds of bin `code` (integer columns).
    pub fn int_bin(&self, code: u32) -> Option<(i64, i64)> {
        match &self.kind {
            ColumnKind::Integer { edges } => {
                let i = code as usize;
                (i + 1 < edges.len()).then(|| (edges[i], edges[i + 1] - 1))
            }
            _ => None,
        }
    }

    /// Bounds [lo, hi) of bin `code` (float columns; the last bin is closed).
    pub fn float_bin(&self, code: u32) -> Option<(f64, f64)> {
        match &self.kind {
            ColumnKind::Float { edges } => {
                let i = code as usize;
                (i + 1 < edges.len()).then(|| (edges[i], edges[i + 1]))
            }
            _ => None,
        }
    }

    /// The public numeric bounds (lo, hi) of a numeric column.
    pub fn numeric_bounds(&self) -> Option<(f64, f64)> {
        match &self.kind {
            ColumnKind::Integer { edges } => Some((edges[0] as f64, (edges[edges.len() - 1] - 1) as f64)),
            ColumnKind::Float { edges } => Some((edges[0], edges[edges.len() - 1])),
            _ => None,
        }
    }
}

/// A public domain: an ordered list of columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Domain {
    columns: Vec<Column>,
    #[serde(skip)]
    index: HashMap<String, usize>,
}

impl Domain {
    /// Why this domain cannot be read for a DP release, if it cannot: a
    /// column whose out-of-domain policy is `error` would fail on one bad
    /// row, with its value and row number (docs/PRIVACY.md §1).
    pub fn dp_read_refusal(&self) -> Option<String> {
        let bad: Vec<&str> =
            self.columns.iter().filter(|c| c.out_of_domain == OutOfDomain::Error).map(|c| c.name.as_str()).collect();
        (!bad.is_empty()).then(|| {
            format!(
                "column(s) {} have out_of_domain: error, which fails on one bad row and would reveal it; DP reads \
                 need a data-independent policy: set out_of_domain: drop-row (any column), clip (numeric) or null \
                 (nullable) in the domain file, and check the data with `dpflow inspect` (curator-only)",
                bad.join(", ")
            )
        })
    }

    /// Builds a domain, checking every column and that names are unique.
    pub fn new(columns: Vec<Column>) -> Result<Self, DomainError> {
        let mut index = HashMap::new();
        for (i, c) in columns.iter().enumerate() {
            c.validate().map_err(|reason| DomainError::Column { column: c.name.clone(), reason })?;
            if index.insert(c.name.clone(), i).is_some() {
                return Err(DomainError::DuplicateColumn(c.name.clone()));
            }
        }
        Ok(Self { columns, index })
    }

    /// Restores the name index after deserialisation.
    pub fn reindex(mut self) -> Result<Self, DomainError> {
        let cols = std::mem::take(&mut self.columns);
        Self::new(cols)
    }

    /// The columns in order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// Whether the domain has no columns.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// Position of a column by name.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// A column by name.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.position(name).map(|i| &self.columns[i])
    }

    /// Cardinalities (codes incl. null) of all columns, in order.
    pub fn cardinalities(&self) -> Vec<usize> {
        self.columns.iter().map(Column::cardinality).collect()
    }

    /// Column names in order.
    pub fn names(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }

    /// The same columns without null codes: the domain of a model of the
    /// observed values (complete-row, imputation-first and adaptive synthesis),
    /// whose codes equal the value codes of this domain.
    pub fn without_nulls(&self) -> Domain {
        let mut d = self.clone();
        for c in &mut d.columns {
            c.nullable = false;
        }
        d
    }

    /// The sub-domain of the named columns (in the given order).
    pub fn project(&self, names: &[&str]) -> Result<Domain, DomainError> {
        let cols = names
            .iter()
            .map(|n| self.column(n).cloned().ok_or_else(|| DomainError::UnknownColumn(n.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        Domain::new(cols)
    }
}
