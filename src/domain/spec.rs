//! The public domain *spec*: the YAML (or JSON) file a data owner writes to
//! declare, for every column, its kind and public domain, whether it may be
//! null, and how text inputs spell null. dpflow never derives a released domain
//! from private data: this file is a public input.
//!
//! Two formats are accepted:
//! * the dpflow spec (a mapping with `columns:`), see `docs/DOMAIN.md`;
//! * private-pgm's domain JSON, `{"col": size, ...}`, for integer-coded data
//!   (each column is the integers `0..size`).
//!
//! Errors name the file, the line and the key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use dpflow_udfs::domain::{Column, ColumnError, ColumnKind, Domain, OutOfDomain};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_saphyr::Spanned;

/// A domain-file error: where it is and what is wrong.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("{file}{}: {key}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct SpecError {
    /// The file (or `"<inline>"`).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<u32>,
    /// The offending key path, e.g. `columns[3] (age).bounds`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// How text (CSV) inputs of this dataset are laid out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextFormat {
    /// Whether the first line holds column names (else names come from the domain, in order).
    #[serde(default = "default_true")]
    pub header: bool,
    /// Field delimiter (one character).
    #[serde(default = "default_delimiter")]
    pub delimiter: char,
    /// Lines starting with this character are skipped.
    #[serde(default)]
    pub comment: Option<char>,
    /// Quote character.
    #[serde(default = "default_quote")]
    pub quote: char,
    /// Trim spaces around fields (e.g. UCI Adult's `, ` separators).
    #[serde(default = "default_true")]
    pub trim: bool,
}

fn default_true() -> bool {
    true
}
fn default_delimiter() -> char {
    ','
}
fn default_quote() -> char {
    '"'
}

impl Default for TextFormat {
    fn default() -> Self {
        Self { header: true, delimiter: ',', comment: None, quote: '"', trim: true }
    }
}

/// A loaded domain: the compiled columns plus text-input settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainSpec {
    /// Dataset name, if given.
    pub name: Option<String>,
    /// The compiled public domain.
    pub domain: Domain,
    /// How to read text inputs.
    pub text: TextFormat,
    /// Where it was loaded from.
    pub source: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    text: Option<TextFormat>,
    /// Null tokens for every column of text inputs.
    #[serde(default)]
    null_tokens: Vec<String>,
    /// Default out-of-domain policy.
    #[serde(default)]
    out_of_domain: Option<OutOfDomain>,
    columns: Vec<Spanned<RawColumn>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    name: String,
    kind: RawKind,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    values: Option<Vec<ScalarText>>,
    #[serde(default)]
    aliases: BTreeMap<String, ScalarText>,
    #[serde(default)]
    bounds: Option<(f64, f64)>,
    #[serde(default)]
    bins: Option<RawBins>,
    #[serde(default)]
    nullable: bool,
    #[serde(default)]
    null_tokens: Option<Vec<String>>,
    #[serde(default)]
    out_of_domain: Option<OutOfDomain>,
    /// Public rule under which a null means "not applicable" (docs/domain.md).
    #[serde(default)]
    not_applicable_when: Option<RawRule>,
}

/// `not_applicable_when:` an SQL boolean expression, or `true` (every null of
/// the column is not applicable).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRule {
    Always(bool),
    Sql(String),
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum RawKind {
    Categorical,
    Integer,
    Float,
    Boolean,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBins {
    #[serde(default)]
    width: Option<f64>,
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    edges: Option<Vec<f64>>,
}

/// A YAML scalar read as text (so `values: [1, 2, 3]` and `["1", "2"]` agree).
#[derive(Debug, Clone)]
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ScalarText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or number")
            }
            fn visit_str<E>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// private-pgm style `{"col": size}`, order preserved.
struct PgmDomain(Vec<(String, u64)>);

impl<'de> Deserialize<'de> for PgmDomain {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PgmDomain;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of column name to domain size")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<PgmDomain, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, u64>()? {
                    out.push((k, v));
                }
                Ok(PgmDomain(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl DomainSpec {
    /// Loads a domain file (YAML, JSON or private-pgm JSON).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, SpecError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| SpecError {
            file: file.clone(),
            line: None,
            key: "(file)".into(),
            message: format!("cannot read the domain file: {e}"),
        })?;
        Self::parse(&text, &file)
    }

    /// Parses domain text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, SpecError> {
        let looks_like_spec = text.lines().any(|l| {
            let t = l.trim_start().trim_start_matches(['{', '"', '\'']);
            t.starts_with("columns")
        });
        if !looks_like_spec && let Ok(PgmDomain(cols)) = serde_saphyr::from_str::<PgmDomain>(text) {
            return Self::from_pgm(cols, file);
        }
        let raw: RawSpec = from_yaml_with_path(text).map_err(|(e, path)| SpecError {
            file: file.to_string(),
            line: e.location().map(|l| l.line() as u32),
            key: path.unwrap_or_else(|| "(syntax)".into()),
            message: first_line(&e.to_string()),
        })?;
        compile(raw, file)
    }

    fn from_pgm(cols: Vec<(String, u64)>, file: &str) -> Result<Self, SpecError> {
        if cols.is_empty() {
            return Err(SpecError {
                file: file.into(),
                line: None,
                key: "(root)".into(),
                message: "the domain has no columns".into(),
            });
        }
        let mut columns = Vec::new();
        for (name, size) in cols {
            if size == 0 || size > u32::MAX as u64 / 2 {
                return Err(SpecError {
                    file: file.into(),
                    line: None,
                    key: name,
                    message: format!("domain size must be between 1 and 2^31, got {size}"),
                });
            }
            columns.push(Column {
                name,
                kind: ColumnKind::Integer { edges: (0..=size as i64).collect() },
                nullable: false,
                null_tokens: vec![],
                out_of_domain: OutOfDomain::DropRowIfRead,
                not_applicable_when: None,
            });
        }
        let domain = Domain::new(columns).map_err(|m| SpecError {
            file: file.into(),
            line: None,
            key: "(root)".into(),
            message: m.to_string(),
        })?;
        Ok(Self { name: None, domain, text: TextFormat::default(), source: file.into() })
    }

    /// The file this domain came from.
    pub fn source_path(&self) -> PathBuf {
        PathBuf::from(&self.source)
    }
}

/// Deserializes YAML (or JSON) text, and on failure also returns the key
/// path serde was at (`columns[3].bins`, `steps[1].sql.budget`), exact where
/// indentation-based guesses are not; `None` at the root.
#[allow(clippy::result_large_err)] // serde-saphyr's own error; mapped at once by the caller.
pub(crate) fn from_yaml_with_path<T: serde::de::DeserializeOwned>(
    text: &str,
) -> Result<T, (serde_saphyr::Error, Option<String>)> {
    let mut path = None;
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(key_path(e.path())).filter(|p| !p.is_empty());
            e.into_inner()
        })
    })
    .map_err(|e| (e, path))
}

/// `columns[3].bounds`: a serde path without the `value` field through which
/// serde-saphyr's [`Spanned`] wrappers are read (no spec key is named `value`).
fn key_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        let key = match segment {
            Segment::Seq { index } => {
                out += &format!("[{index}]");
                continue;
            }
            Segment::Map { key } if key == "value" => continue,
            Segment::Map { key } | Segment::Enum { variant: key } => key.as_str(),
            Segment::Unknown => "?",
        };
        if !out.is_empty() {
            out.push('.');
        }
        out += key;
    }
    out
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).to_string()
}

fn compile(raw: RawSpec, file: &str) -> Result<DomainSpec, SpecError> {
    let _ = raw.description;
    let default_policy = raw.out_of_domain.unwrap_or_default();
    let mut columns = Vec::with_capacity(raw.columns.len());
    let lines: Vec<u32> = raw.columns.iter().map(|c| c.referenced.line() as u32).collect();
    if raw.columns.is_empty() {
        return Err(SpecError {
            file: file.into(),
            line: None,
            key: "columns".into(),
            message: "the domain has no columns".into(),
        });
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, spanned) in raw.columns.into_iter().enumerate() {
        let line = Some(spanned.referenced.line() as u32).filter(|l| *l > 0);
        let rc = spanned.value;
        let err = |key: &str, message: String| SpecError {
            file: file.into(),
            line,
            key: format!("columns[{i}] ({}){}{key}", rc.name, if key.is_empty() { "" } else { "." }),
            message,
        };
        if let Some(j) = seen.insert(rc.name.clone(), i) {
            return Err(err("name", format!("duplicate column name (also columns[{j}])")));
        }
        let kind = match rc.kind {
            RawKind::Categorical => {
                if rc.bounds.is_some() || rc.bins.is_some() {
                    return Err(err("bounds", "a categorical column takes `values`, not bounds or bins".into()));
                }
                let values: Vec<String> = rc
                    .values
                    .clone()
                    .ok_or_else(|| err("values", "a categorical column needs `values`".into()))?
                    .into_iter()
                    .map(|v| v.0)
                    .collect();
                ColumnKind::Categorical {
                    values,
                    aliases: rc.aliases.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect(),
                }
            }
            RawKind::Boolean => {
                if rc.values.is_some() || rc.bounds.is_some() || rc.bins.is_some() {
                    return Err(err("kind", "a boolean column takes no values, bounds or bins".into()));
                }
                ColumnKind::Boolean
            }
            RawKind::Integer => ColumnKind::Integer { edges: integer_edges(&rc).map_err(|(k, m)| err(k, m))? },
            RawKind::Float => ColumnKind::Float { edges: float_edges(&rc).map_err(|(k, m)| err(k, m))? },
        };
        if !rc.aliases.is_empty() && rc.kind != RawKind::Categorical {
            return Err(err("aliases", "aliases apply to categorical columns only".into()));
        }
        let col = Column {
            name: rc.name.clone(),
            kind,
            nullable: rc.nullable,
            null_tokens: rc.null_tokens.clone().unwrap_or_else(|| raw.null_tokens.clone()),
            out_of_domain: rc.out_of_domain.unwrap_or(default_policy),
            not_applicable_when: match &rc.not_applicable_when {
                None | Some(RawRule::Always(false)) => None,
                Some(RawRule::Always(true)) => Some("TRUE".to_string()),
                Some(RawRule::Sql(s)) => Some(s.trim().to_string()),
            },
        };
        if col.not_applicable_when.is_some() && !col.nullable {
            return Err(err(
                "not_applicable_when",
                "only a nullable column has nulls to call not applicable: add `nullable: true`".into(),
            ));
        }
        col.validate().map_err(|m| err(column_key(&m), m.to_string()))?;
        columns.push(col);
    }
    let domain = Domain::new(columns).map_err(|m| SpecError {
        file: file.into(),
        line: None,
        key: "columns".into(),
        message: m.to_string(),
    })?;
    if let Err(e) = super::not_applicable::NotApplicable::check_all(&domain) {
        let i = domain.position(&e.column).unwrap_or(0);
        return Err(SpecError {
            file: file.into(),
            line: lines.get(i).copied().filter(|l| *l > 0),
            key: format!("columns[{i}] ({}).not_applicable_when", e.column),
            message: e.to_string(),
        });
    }
    Ok(DomainSpec { name: raw.name, domain, text: raw.text.unwrap_or_default(), source: file.into() })
}

/// The key of a column spec that a compiled column's error is about.
fn column_key(e: &ColumnError) -> &'static str {
    match e {
        ColumnError::NoValues | ColumnError::DuplicateValue { .. } => "values",
        ColumnError::UnknownAliasTarget { .. } => "aliases",
        ColumnError::ClipNeedsNumeric | ColumnError::NullNeedsNullable => "out_of_domain",
        ColumnError::NoBins { .. }
        | ColumnError::NonFiniteEdges
        | ColumnError::EdgesNotIncreasing
        | ColumnError::TooLarge { .. } => "bins",
    }
}

type KeyErr = (&'static str, String);

fn integer_edges(rc: &RawColumn) -> Result<Vec<i64>, KeyErr> {
    if rc.values.is_some() {
        return Err(("values", "an integer column takes `bounds` (and optional `bins`), not values".into()));
    }
    let as_int = |x: f64, key: &'static str| -> Result<i64, KeyErr> {
        if x.fract() != 0.0 || !x.is_finite() || x.abs() > 9.0e15 {
            Err((key, format!("{x} is not an integer")))
        } else {
            Ok(x as i64)
        }
    };
    if let Some(RawBins { edges: Some(e), width: None, count: None }) = &rc.bins {
        if e.len() < 2 {
            return Err(("bins.edges", "need at least two edges".into()));
        }
        let mut edges = e.iter().map(|x| as_int(*x, "bins.edges")).collect::<Result<Vec<_>, _>>()?;
        if edges.windows(2).any(|w| w[0] >= w[1]) {
            return Err(("bins.edges", "edges must be strictly increasing".into()));
        }
        if let Some((lo, hi)) = rc.bounds
            && (as_int(lo, "bounds")? != edges[0] || as_int(hi, "bounds")? != *edges.last().unwrap())
        {
            return Err(("bounds", "bounds must equal the first and last edge".into()));
        }
        // The last bin is closed: [e_{k-1}, e_k].
        *edges.last_mut().unwrap() += 1;
        return Ok(edges);
    }
    let (lo, hi) = rc.bounds.ok_or(("bounds", "an integer column needs `bounds: [lo, hi]`".to_string()))?;
    let (lo, hi) = (as_int(lo, "bounds")?, as_int(hi, "bounds")?);
    if lo > hi {
        return Err(("bounds", format!("lower bound {lo} is above upper bound {hi}")));
    }
    let span = hi - lo + 1;
    match &rc.bins {
        None => {
            if span > 10_000_000 {
                return Err(("bins", format!("{span} unit bins is too many; give `bins: {{count: k}}` or `width`")));
            }
            Ok((lo..=hi + 1).collect())
        }
        Some(RawBins { width: Some(w), count: None, edges: None }) => {
            let w = as_int(*w, "bins.width")?;
            if w < 1 {
                return Err(("bins.width", "width must be at least 1".into()));
            }
            let mut edges: Vec<i64> = (0..).map(|i| lo + i * w).take_while(|e| *e <= hi).collect();
            edges.push(hi + 1);
            Ok(edges)
        }
        Some(RawBins { count: Some(k), width: None, edges: None }) => {
            let k = *k as i64;
            if k < 1 || k > span {
                return Err((
                    "bins.count",
                    format!("count must be between 1 and {span} (the number of integers in bounds)"),
                ));
            }
            // Near-equal widths: e_i = lo + ⌊i·span/k⌋.
            Ok((0..=k).map(|i| lo + ((i as i128 * span as i128) / k as i128) as i64).collect())
        }
        Some(_) => Err(("bins", "give exactly one of `width`, `count` or `edges`".into())),
    }
}

fn float_edges(rc: &RawColumn) -> Result<Vec<f64>, KeyErr> {
    if rc.values.is_some() {
        return Err(("values", "a float column takes `bounds` and `bins`, not values".into()));
    }
    if let Some(RawBins { edges: Some(e), width: None, count: None }) = &rc.bins {
        if e.len() < 2 || e.iter().any(|x| !x.is_finite()) || e.windows(2).any(|w| w[0] >= w[1]) {
            return Err(("bins.edges", "need at least two finite, strictly increasing edges".into()));
        }
        if let Some((lo, hi)) = rc.bounds
            && (lo != e[0] || hi != *e.last().unwrap())
        {
            return Err(("bounds", "bounds must equal the first and last edge".into()));
        }
        return Ok(e.clone());
    }
    let (lo, hi) = rc.bounds.ok_or(("bounds", "a float column needs `bounds: [lo, hi]`".to_string()))?;
    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
        return Err(("bounds", format!("bounds must be finite with lo < hi, got [{lo}, {hi}]")));
    }
    match &rc.bins {
        None => Err(("bins", "a float column needs `bins` (`width`, `count` or `edges`)".into())),
        Some(RawBins { width: Some(w), count: None, edges: None }) => {
            if !(*w > 0.0 && w.is_finite()) {
                return Err(("bins.width", "width must be positive".into()));
            }
            let n = ((hi - lo) / w).ceil() as usize;
            if n > 10_000_000 {
                return Err(("bins.width", "too many bins".into()));
            }
            let mut edges: Vec<f64> = (0..n).map(|i| lo + i as f64 * w).filter(|e| *e < hi).collect();
            edges.push(hi);
            Ok(edges)
        }
        Some(RawBins { count: Some(k), width: None, edges: None }) => {
            let k = *k as usize;
            if !(1..=10_000_000).contains(&k) {
                return Err(("bins.count", "count must be between 1 and 10^7".into()));
            }
            let mut edges: Vec<f64> = (0..k).map(|i| lo + (hi - lo) * i as f64 / k as f64).collect();
            edges.push(hi);
            Ok(edges)
        }
        Some(_) => Err(("bins", "give exactly one of `width`, `count` or `edges`".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind() {
        let y = r#"
name: t
null_tokens: ["?"]
columns:
  - {name: c, kind: categorical, values: [a, b], nullable: true, aliases: {"a.": a}}
  - {name: i, kind: integer, bounds: [0, 9]}
  - {name: w, kind: integer, bounds: [0, 9], bins: {width: 4}}
  - {name: k, kind: integer, bounds: [0, 9], bins: {count: 3}}
  - {name: e, kind: integer, bins: {edges: [0, 5, 10]}}
  - {name: f, kind: float, bounds: [0, 1], bins: {count: 4}}
  - {name: b, kind: boolean, nullable: true, null_tokens: [NA]}
"#;
        let s = DomainSpec::parse(y, "t.yaml").unwrap();
        let d = &s.domain;
        assert_eq!(d.cardinalities(), vec![3, 10, 3, 3, 2, 4, 3]);
        assert_eq!(d.columns()[0].null_tokens, vec!["?"]);
        assert_eq!(d.columns()[6].null_tokens, vec!["NA"]);
        match &d.columns()[2].kind {
            ColumnKind::Integer { edges } => assert_eq!(edges, &vec![0, 4, 8, 10]),
            _ => panic!(),
        }
        match &d.columns()[3].kind {
            ColumnKind::Integer { edges } => assert_eq!(edges, &vec![0, 3, 6, 10]),
            _ => panic!(),
        }
        match &d.columns()[4].kind {
            ColumnKind::Integer { edges } => assert_eq!(edges, &vec![0, 5, 11]),
            _ => panic!(),
        }
    }

    #[test]
    fn json_and_pgm_formats() {
        let j = r#"{"columns": [{"name": "x", "kind": "boolean"}]}"#;
        assert_eq!(DomainSpec::parse(j, "x.json").unwrap().domain.len(), 1);
        let p = r#"{"b": 3, "a": 2}"#;
        let s = DomainSpec::parse(p, "p.json").unwrap();
        assert_eq!(s.domain.names(), vec!["b", "a"]);
        assert_eq!(s.domain.cardinalities(), vec![3, 2]);
    }

    #[test]
    fn deserialization_errors_name_the_key_path() {
        let cases = [
            ("columns:\n  - name: a\n    kind: integer\n    bounds: [0, x]\n", "columns[0].bounds[1]"),
            (
                "columns:\n  - {name: a, kind: boolean}\n  - {name: b, kind: boolean, nulable: true}\n",
                "columns[1].nulable",
            ),
            ("columns:\n  - {name: a, kind: strange}\n", "columns[0].kind"),
            ("columns: []\ntext: {header: maybe}\n", "text.header"),
        ];
        for (y, key) in cases {
            let e = DomainSpec::parse(y, "d.yaml").unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let y = "columns:\n  - name: a\n    kind: integer\n    bounds: [5, 1]\n";
        let e = DomainSpec::parse(y, "d.yaml").unwrap_err();
        assert_eq!(e.file, "d.yaml");
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key, "columns[0] (a).bounds");
        assert!(e.to_string().starts_with("d.yaml:2: columns[0] (a).bounds: lower bound 5"), "{e}");

        let y = "columns:\n  - name: a\n    kind: categorical\n    valeus: [x]\n";
        let e = DomainSpec::parse(y, "d.yaml").unwrap_err();
        assert!(e.to_string().contains("valeus"), "{e}");
        assert_eq!(e.line, Some(4));

        let y = "columns:\n  - name: a\n    kind: categorical\n";
        let e = DomainSpec::parse(y, "d.yaml").unwrap_err();
        assert_eq!(e.key, "columns[0] (a).values");

        let y = "columns:\n  - {name: a, kind: boolean}\n  - {name: a, kind: boolean}\n";
        let e = DomainSpec::parse(y, "d.yaml").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("duplicate"), "{e}");

        let y = "columns:\n  - {name: a, kind: strange}\n";
        assert!(DomainSpec::parse(y, "d.yaml").is_err());
        let y = "columns:\n  - {name: a, kind: categorical, values: [x], out_of_domain: clip}\n";
        let e = DomainSpec::parse(y, "d.yaml").unwrap_err();
        assert!(e.message.contains("clip"), "{e}");
        assert_eq!(e.key, "columns[0] (a).out_of_domain");
    }
}
