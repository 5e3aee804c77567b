//! The DP SQL catalog: protected and public tables, privacy units,
//! contribution bounds, the ledger, and the default per-query budget.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{Result, SqlError};
use serde::Deserialize;

use crate::dataset::Dataset;
use crate::domain::DomainSpec;
use crate::io::InputFormat;
use crate::privacy::{Budget, RawBudget};

/// The privacy unit of a protected table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrivacyUnit {
    /// One row is one person.
    Row,
    /// The named column identifies the person.
    Column(String),
}

/// A registered table.
#[derive(Debug, Clone)]
pub struct TableEntry {
    /// SQL name.
    pub name: String,
    /// Data and domain.
    pub dataset: Dataset,
    /// Public tables can be read and joined freely.
    pub public: bool,
    /// Privacy unit (protected tables).
    pub unit: PrivacyUnit,
    /// Max rows per unit per group (L∞).
    pub max_rows_per_unit: u64,
    /// Max groups a unit may contribute to (L0).
    pub max_groups_per_unit: u64,
    /// Ledger dataset charged.
    pub ledger_dataset: String,
    /// kNN imputation behind the `dp_imputed_*` functions (protected tables;
    /// the imputed rows stay inside the engine, only smooth-sensitivity
    /// statistics leave it).
    pub impute: Option<crate::impute::spec::Imputation>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImpute {
    columns: Vec<String>,
    #[serde(rename = "match")]
    matching: Vec<crate::impute::spec::RawMatch>,
    #[serde(default)]
    metric: dpflow_udfs::knn::Metric,
}

/// The catalog.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// The file it came from.
    pub path: PathBuf,
    /// Tables by name.
    pub tables: BTreeMap<String, TableEntry>,
    /// Ledger file.
    pub ledger: Option<PathBuf>,
    /// Create the ledger with these budgets if it is missing (demo catalogs only).
    pub create_ledger: Option<BTreeMap<String, Budget>>,
    /// Default budget of one query.
    pub query_budget: Option<Budget>,
    /// Default confidence level of intervals.
    pub confidence: f64,
    /// Saved models `synthetic(name, rows)` may sample (name → model file).
    pub models: BTreeMap<String, String>,
    /// Where queries read the protected tables (`cluster:`; docs/cluster.md):
    /// a Ballista cluster, or this process when absent.
    pub cluster: Option<crate::io::ClusterSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    #[serde(default)]
    ledger: Option<String>,
    #[serde(default)]
    create_ledger_if_missing: Option<BTreeMap<String, RawBudget>>,
    #[serde(default)]
    query_budget: Option<RawBudget>,
    #[serde(default = "default_confidence")]
    confidence: f64,
    tables: BTreeMap<String, RawTable>,
    #[serde(default)]
    models: BTreeMap<String, String>,
    #[serde(default)]
    cluster: Option<crate::io::RawCluster>,
}

fn default_confidence() -> f64 {
    0.95
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    location: String,
    domain: String,
    #[serde(default)]
    format: Option<InputFormat>,
    #[serde(default)]
    public: bool,
    #[serde(default)]
    privacy_unit: Option<RawUnit>,
    #[serde(default = "one")]
    max_rows_per_unit: u64,
    #[serde(default = "one")]
    max_groups_per_unit: u64,
    #[serde(default)]
    ledger_dataset: Option<String>,
    #[serde(default)]
    impute: Option<RawImpute>,
}

fn one() -> u64 {
    1
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawUnit {
    Row(String),
    Column { column: String },
}

fn resolve(base: &Path, p: &str) -> String {
    if p.contains("://") || Path::new(p).is_absolute() { p.to_string() } else { base.join(p).display().to_string() }
}

impl Catalog {
    /// Loads a catalog; relative paths are relative to the catalog file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|source| SqlError::ReadCatalog { path: path.display().to_string(), source })?;
        Self::parse(&text, path)
    }

    /// A catalog from its text, as if read from `path` (relative locations
    /// and domain files are resolved against `path`'s directory).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let file = path.display().to_string();
        let bad = |problem: String| SqlError::Catalog { path: file.clone(), problem };
        let raw: RawCatalog = serde_saphyr::from_str(text).map_err(|e| bad(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut tables = BTreeMap::new();
        for (name, t) in raw.tables {
            let what = format!("tables.{name}");
            let domain_path = resolve(base, &t.domain);
            let spec = DomainSpec::load(&domain_path).map_err(crate::dataset::DatasetError::from)?;
            let unit = match t.privacy_unit {
                None => PrivacyUnit::Row,
                Some(RawUnit::Row(s)) if s == "row" => PrivacyUnit::Row,
                Some(RawUnit::Row(s)) => {
                    return Err(bad(format!("{what}.privacy_unit: {s:?} is not `row` or {{column: NAME}}")));
                }
                Some(RawUnit::Column { column }) => {
                    if spec.domain.column(&column).is_some() {
                        return Err(bad(format!(
                            "{what}.privacy_unit: the unit column {column:?} must not be a domain attribute (it identifies people)"
                        )));
                    }
                    PrivacyUnit::Column(column)
                }
            };
            if t.max_rows_per_unit == 0 || t.max_groups_per_unit == 0 {
                return Err(bad(format!("{what}: contribution bounds must be at least 1")));
            }
            let impute = match &t.impute {
                None => None,
                Some(i) => {
                    if t.public {
                        return Err(bad(format!("{what}.impute: public tables need no private imputation")));
                    }
                    if unit != PrivacyUnit::Row || t.max_rows_per_unit != 1 {
                        return Err(bad(format!(
                            "{what}.impute: kNN imputation's smooth sensitivity (004) assumes one row per person: use privacy_unit: row"
                        )));
                    }
                    Some(crate::impute::spec::matching(
                        &spec.domain,
                        &i.columns,
                        &i.matching,
                        i.metric,
                        &format!("{file}: {what}.impute"),
                    )?)
                }
            };
            let dataset = Dataset {
                name: name.clone(),
                location: resolve(base, &t.location),
                extra_locations: vec![],
                format: t.format,
                spec: Arc::new(spec),
            };
            tables.insert(
                name.clone(),
                TableEntry {
                    ledger_dataset: t.ledger_dataset.unwrap_or_else(|| name.clone()),
                    name,
                    dataset,
                    public: t.public,
                    unit,
                    max_rows_per_unit: t.max_rows_per_unit,
                    max_groups_per_unit: t.max_groups_per_unit,
                    impute,
                },
            );
        }
        let create_ledger = match raw.create_ledger_if_missing {
            None => None,
            Some(m) => Some(
                m.into_iter()
                    .map(|(k, v)| {
                        let b = v
                            .budget(&format!("create_ledger_if_missing.{k}"))
                            .map_err(|source| SqlError::CatalogBudget { path: file.clone(), source })?;
                        Ok((k.clone(), b))
                    })
                    .collect::<Result<BTreeMap<_, _>>>()?,
            ),
        };
        if !(raw.confidence > 0.0 && raw.confidence < 1.0) {
            return Err(bad("confidence must be in (0, 1)".to_string()));
        }
        let cluster = raw.cluster.as_ref().map(|c| c.spec().map_err(|e| bad(format!("cluster: {e}")))).transpose()?;
        Ok(Self {
            path: path.to_path_buf(),
            tables,
            ledger: raw.ledger.map(|l| PathBuf::from(resolve(base, &l))),
            create_ledger,
            query_budget: raw
                .query_budget
                .map(|b| b.budget("query_budget"))
                .transpose()
                .map_err(|source| SqlError::CatalogBudget { path: file.clone(), source })?,
            confidence: raw.confidence,
            models: raw.models.iter().map(|(k, v)| (k.clone(), resolve(base, v))).collect(),
            cluster,
        })
    }
}
