//! The `dpflow impute` spec: what to impute, how to match donors, and which
//! statistics to release.

use serde::Deserialize;

use super::error::{ImputeError, Result};
use crate::domain::{ColumnKind, Domain};
use dpflow_udfs::knn::{AttrKind, KnnConfig, MatchAttr, Metric};

pub use dpflow_udfs::knn::query::{Predicate, QueryKind, QuerySpec};

/// The noise of one released number (see `crate::impute::smooth_calibration`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SmoothNoise {
    /// Generalized Cauchy with shape γ: the release is q + (S(D)/α)·X for a
    /// ln 2-smooth upper bound S (the smooth estimator).
    Cauchy {
        /// γ > 1.
        gamma: f64,
        /// α > 0.
        alpha: f64,
    },
    /// Exact discrete Laplace at ε with a global sensitivity, on the public
    /// output grid (the baselines of 004 §6.3).
    Laplace {
        /// ε of the released number.
        epsilon: f64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    input: String,
    domain: String,
    impute: Vec<String>,
    #[serde(rename = "match")]
    matching: Vec<RawMatch>,
    #[serde(default)]
    metric: Metric,
    budget: crate::privacy::RawBudget,
    queries: Vec<RawQuery>,
}

/// One `match:` entry (a donor-matching attribute).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    column: String,
    #[serde(default)]
    kind: Option<AttrKind>,
    #[serde(default = "one_f")]
    weight: f64,
    /// Integer grouping of the column's codes (e.g. 10 = ages by decade).
    #[serde(default = "one_u")]
    group: u32,
}

fn one_f() -> f64 {
    1.0
}
fn one_u() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuery {
    name: String,
    #[serde(default)]
    count: Option<serde_json::Value>,
    #[serde(default)]
    mean: Option<RawValue>,
    #[serde(default)]
    variance: Option<RawValue>,
    #[serde(default)]
    proportion: Option<RawProportion>,
    #[serde(default, rename = "where")]
    filter: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawValue {
    value: String,
    lo: f64,
    hi: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProportion {
    numerator: std::collections::BTreeMap<String, serde_json::Value>,
}

/// What is imputed and how donors are matched (a spec's `impute:`/`match:`/
/// `metric:`, or a catalog table's `impute:` block).
#[derive(Debug, Clone)]
pub struct Imputation {
    /// Attributes to impute.
    pub columns: Vec<String>,
    /// Donor search.
    pub knn: KnnConfig,
    /// Per matching attribute: (column, code grouping).
    pub grouping: Vec<(String, u32)>,
}

/// A loaded spec.
#[derive(Debug, Clone)]
pub struct ImputeSpec {
    /// Input data.
    pub input: String,
    /// Domain file.
    pub domain: String,
    /// What is imputed and how.
    pub imputation: Imputation,
    /// Budget of every released number.
    pub budget: crate::privacy::Budget,
    /// Queries.
    pub queries: Vec<QuerySpec>,
}

fn spec_error(path: &str, key: &str, problem: impl Into<String>) -> ImputeError {
    ImputeError::Spec { path: path.to_string(), key: key.to_string(), problem: problem.into() }
}

/// Parses a `where:` mapping of spec file `path` into predicates.
pub fn predicates(
    path: &str,
    domain: &Domain,
    m: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<Vec<Predicate>> {
    let mut out = Vec::new();
    for (col, v) in m {
        let c = domain.column(col).ok_or_else(|| spec_error(path, "where", format!("unknown column {col:?}")))?;
        let arr = v
            .as_array()
            .ok_or_else(|| spec_error(path, &format!("where.{col}"), "give [lo, hi] or a list of labels"))?;
        match &c.kind {
            ColumnKind::Categorical { values, .. } => {
                let codes =
                    arr.iter()
                        .map(|x| {
                            let s = match x {
                                serde_json::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            values.iter().position(|v| *v == s).map(|p| p as f64).ok_or_else(|| {
                                spec_error(path, &format!("where.{col}"), format!("unknown label {s:?}"))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                out.push(Predicate { column: col.clone(), lo: None, hi: None, codes: Some(codes) });
            }
            _ => {
                if arr.len() != 2 {
                    return Err(spec_error(path, &format!("where.{col}"), "give [lo, hi] (null for open)"));
                }
                out.push(Predicate { column: col.clone(), lo: arr[0].as_f64(), hi: arr[1].as_f64(), codes: None });
            }
        }
    }
    Ok(out)
}

/// Checks the imputed columns and builds the donor search (1-NN) and the
/// per-attribute code grouping from `match:` entries; errors name `what`.
pub(crate) fn matching(
    domain: &Domain,
    impute: &[String],
    matches: &[RawMatch],
    metric: Metric,
    what: &str,
) -> Result<Imputation> {
    let path = what;
    for a in impute {
        let c = domain.column(a).ok_or_else(|| spec_error(path, "impute", format!("unknown column {a:?}")))?;
        if !c.nullable {
            return Err(spec_error(path, "impute", format!("column {a:?} is not nullable, nothing to impute")));
        }
    }
    let mut attrs = Vec::new();
    let mut grouping = Vec::new();
    for m in matches {
        let c = domain
            .column(&m.column)
            .ok_or_else(|| spec_error(path, "match", format!("unknown column {:?}", m.column)))?;
        if impute.contains(&m.column) {
            return Err(spec_error(path, "match", format!("{:?} is being imputed", m.column)));
        }
        let kind = m.kind.unwrap_or(match c.kind {
            ColumnKind::Categorical { .. } | ColumnKind::Boolean => AttrKind::Categorical,
            _ => AttrKind::Ordinal,
        });
        // A non-finite weight makes distances NaN (∞·0), which the donor search and
        // L1(D) cannot order: L1 would come out far too small.
        if m.group == 0 || !m.weight.is_finite() || m.weight < 0.0 {
            return Err(spec_error(
                path,
                &format!("match.{}", m.column),
                "group must be ≥ 1 and weight a finite number ≥ 0",
            ));
        }
        attrs.push(MatchAttr {
            name: m.column.clone(),
            kind,
            weight: m.weight,
            size: (c.cardinality() as u32).div_ceil(m.group),
        });
        grouping.push((m.column.clone(), m.group));
    }
    Ok(Imputation { columns: impute.to_vec(), knn: KnnConfig { attrs, metric, k: 1 }, grouping })
}

impl ImputeSpec {
    /// Loads a spec (paths relative to the file).
    pub fn load(path: &str) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ImputeError::ReadSpec { path: path.to_string(), source })?;
        let raw: RawSpec = serde_saphyr::from_str(&text)
            .map_err(|e| ImputeError::ParseSpec { path: path.to_string(), message: e.to_string() })?;
        let base = std::path::Path::new(path).parent().unwrap_or(std::path::Path::new("."));
        let rel = |p: &str| {
            if p.contains("://") || std::path::Path::new(p).is_absolute() {
                p.to_string()
            } else {
                base.join(p).display().to_string()
            }
        };
        let domain_file = rel(&raw.domain);
        let domain = crate::domain::DomainSpec::load(&domain_file)?.domain;
        let imputation = matching(&domain, &raw.impute, &raw.matching, raw.metric, path)?;
        let mut queries = Vec::new();
        for q in &raw.queries {
            let kinds = [q.count.is_some(), q.mean.is_some(), q.variance.is_some(), q.proportion.is_some()];
            if kinds.iter().filter(|x| **x).count() != 1 {
                return Err(spec_error(
                    path,
                    &format!("query {}", q.name),
                    "give exactly one of count, mean, variance, proportion",
                ));
            }
            let kind = if let Some(m) = &q.mean {
                QueryKind::Mean { value: m.value.clone(), lo: m.lo, hi: m.hi }
            } else if let Some(m) = &q.variance {
                QueryKind::Variance { value: m.value.clone(), lo: m.lo, hi: m.hi }
            } else if let Some(p) = &q.proportion {
                QueryKind::Proportion { numerator: predicates(path, &domain, &p.numerator)? }
            } else {
                QueryKind::Count
            };
            if let QueryKind::Mean { lo, hi, .. } | QueryKind::Variance { lo, hi, .. } = &kind
                && !(lo.is_finite() && hi.is_finite() && lo < hi)
            {
                return Err(spec_error(path, &format!("query {}", q.name), "lo must be below hi, both finite"));
            }
            queries.push(QuerySpec { name: q.name.clone(), kind, predicate: predicates(path, &domain, &q.filter)? });
        }
        Ok(Self {
            input: rel(&raw.input),
            domain: domain_file,
            imputation,
            budget: raw
                .budget
                .budget("budget")
                .map_err(|source| ImputeError::Budget { path: path.to_string(), source })?,
            queries,
        })
    }
}
