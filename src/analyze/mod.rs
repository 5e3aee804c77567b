//! `dpflow analyze`: an analysis run on each of m released synthetic sets,
//! and the m results combined into one inference per coefficient.
//!
//! This is the MI half of NA+MI (003 §2): a noise-aware synthesizer
//! (NAPSU-MQ) releases m sets, each drawn from its own posterior sample, the
//! analyst runs the same analysis on each, and combining rules
//! ([`combine`]) turn the m estimates and their variances into an interval
//! that accounts for the DP noise and the synthesis. The same machinery
//! serves the DIPS synthesizers of 002 (§3.3, eqs. (9)–(11)), and one set
//! (m = 1) gives the ordinary intervals an analyst would otherwise compute.
//!
//! The inputs are released sets, so everything here is post-processing: no
//! budget is spent and no ledger is opened. Sets are given as one location
//! each (a file, prefix or glob of Parquet or CSV) or as one table with a
//! set column (`--set-column`), whose distinct values name the sets.
//!
//! Estimators ([`estimate`]): mean, proportion, OLS and logistic regression,
//! from a formula ([`formula`]) over a design built from the Arrow batches
//! ([`design`]). A set's columns are read once for every analysis of a run.

pub mod combine;
pub mod design;
mod error;
pub mod estimate;
pub mod formula;

use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::array::{Scalar, StringArray};
use datafusion::arrow::compute::kernels::cmp::eq;
use datafusion::arrow::compute::{cast, filter_record_batch};
use datafusion::arrow::datatypes::DataType;
use datafusion::prelude::{SessionContext, col};

pub use combine::{Combined, Rule};
pub use error::AnalyzeError;
pub use estimate::EstimatorKind;
pub use formula::Formula;

use crate::io::{InputFormat, open_released};
use design::{Design, ResponseKind};

/// One analysis to run on every set.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AnalysisSpec {
    /// The estimator.
    pub estimator: EstimatorKind,
    /// `ols` and `logistic`: the model formula (`y ~ a + b`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formula: Option<String>,
    /// `mean` and `proportion`: the column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// `proportion`: the value counted (compared as text, or as a number
    /// for a numeric column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl<'de> serde::Deserialize<'de> for EstimatorKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "mean" => Ok(EstimatorKind::Mean),
            "proportion" => Ok(EstimatorKind::Proportion),
            "ols" => Ok(EstimatorKind::Ols),
            "logistic" | "logit" => Ok(EstimatorKind::Logistic),
            other => Err(serde::de::Error::custom(format!(
                "unknown estimator `{other}`: use mean, proportion, ols or logistic"
            ))),
        }
    }
}

/// A spec file: `analyses: [{estimator: ols, formula: "y ~ x"}, …]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    /// The analyses.
    pub analyses: Vec<AnalysisSpec>,
}

impl SpecFile {
    /// Reads a YAML spec; errors name the file, line and column.
    pub fn load(path: &str) -> Result<Self, AnalyzeError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AnalyzeError::SpecFile { path: path.to_string(), problem: format!("{e}; check the path") })?;
        serde_saphyr::from_str(&text)
            .map_err(|e| AnalyzeError::SpecFile { path: path.to_string(), problem: e.to_string() })
    }
}

impl AnalysisSpec {
    /// Checks the analysis before anything is read or charged (a pipeline's
    /// validation): the estimator has what it needs, the formula parses, and
    /// every column it reads is one the synthetic sets will have
    /// (`has_column`). Returns the formula it fits (a mean or proportion is
    /// the intercept-only model of its column).
    pub fn check(&self, has_column: impl Fn(&str) -> bool) -> Result<Formula, AnalyzeError> {
        let (f, _, _) = self.model()?;
        if let Some(c) = f.columns().into_iter().find(|c| !has_column(c)) {
            return Err(AnalyzeError::Spec(format!(
                "{}: `{c}` is not a column of the synthetic data (the dataset's domain): check its spelling",
                self.describe()
            )));
        }
        Ok(f)
    }

    /// The formula this analysis fits, the kind of response it needs and
    /// the names its coefficients get when they are not the design's.
    fn model(&self) -> Result<(Formula, ResponseKind, Option<String>), AnalyzeError> {
        let need = |what: &str| AnalyzeError::Spec(format!("the {} estimator needs `{what}`", self.estimator.name()));
        let refuse =
            |what: &str| AnalyzeError::Spec(format!("the {} estimator does not take `{what}`", self.estimator.name()));
        match self.estimator {
            EstimatorKind::Ols | EstimatorKind::Logistic => {
                if self.column.is_some() {
                    return Err(refuse("column"));
                }
                if self.value.is_some() {
                    return Err(refuse("value"));
                }
                let f = Formula::parse(self.formula.as_deref().ok_or_else(|| need("formula"))?)?;
                let kind = if self.estimator == EstimatorKind::Ols { ResponseKind::Real } else { ResponseKind::Binary };
                Ok((f, kind, None))
            }
            EstimatorKind::Mean | EstimatorKind::Proportion => {
                if self.formula.is_some() {
                    return Err(refuse("formula"));
                }
                let c = self.column.clone().ok_or_else(|| need("column"))?;
                let (equals, kind, name) = if self.estimator == EstimatorKind::Mean {
                    if self.value.is_some() {
                        return Err(refuse("value"));
                    }
                    (None, ResponseKind::Real, format!("mean({c})"))
                } else {
                    let v = self.value.clone().ok_or_else(|| need("value"))?;
                    let name = format!("P({c} == {v})");
                    (Some(v), ResponseKind::Binary, name)
                };
                let f = Formula { response: formula::Response { column: c, equals }, terms: vec![], intercept: true };
                Ok((f, kind, Some(name)))
            }
        }
    }

    /// How the analysis reads in reports.
    pub fn describe(&self) -> String {
        match (self.estimator, &self.formula, &self.column, &self.value) {
            (_, Some(f), _, _) => format!("{} {f}", self.estimator.name()),
            (EstimatorKind::Proportion, _, Some(c), Some(v)) => format!("proportion {c} == {v}"),
            (_, _, Some(c), _) => format!("{} {c}", self.estimator.name()),
            _ => self.estimator.name().to_string(),
        }
    }
}

/// Where the m sets are.
#[derive(Debug, Clone, PartialEq)]
pub enum Sets {
    /// One location per set.
    Locations(Vec<String>),
    /// One table; each distinct value of `column` is a set.
    Column {
        /// The table.
        location: String,
        /// The set column.
        column: String,
    },
}

/// Options of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The combining rule (`None`: fully synthetic for m ≥ 2, single for m = 1).
    pub rule: Option<Rule>,
    /// 1 − the interval's coverage (0.05 for 95%).
    pub alpha: f64,
    /// 003 §5: a set's estimate of a coefficient whose standard error
    /// exceeds this is left out of that coefficient's combination.
    pub max_std_error: Option<f64>,
    /// Input format (`None`: from the extension).
    pub format: Option<InputFormat>,
    /// Rows of the original data (n), for the fully-synthetic rule's
    /// fallback T* = (n_syn/n)·ū, with n_syn the sets' mean size (`None`:
    /// n_syn/n = 1, the sets have the original data's size).
    pub original_rows: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options { rule: None, alpha: 0.05, max_std_error: None, format: None, original_rows: None }
    }
}

/// One set's part in an analysis.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SetSummary {
    /// The set's name (its location, or `column=value`).
    pub name: String,
    /// Rows used.
    pub rows: usize,
    /// Rows left out for a null.
    pub dropped: usize,
    /// Newton iterations (logistic regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iterations: Option<usize>,
}

/// One coefficient's combined inference.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TermResult {
    /// The coefficient (`Intercept`, `age`, `race[T.White]`, `mean(age)`).
    pub term: String,
    /// The combined inference.
    #[serde(flatten)]
    pub combined: Combined,
    /// Each set's (estimate, variance), in set order.
    pub per_set: Vec<[f64; 2]>,
    /// Sets left out by `max_std_error`.
    pub excluded: usize,
}

/// The result of one analysis.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Analysis {
    /// What was run.
    pub analysis: AnalysisSpec,
    /// The rule used.
    pub rule: Rule,
    /// The interval's coverage (0.95).
    pub level: f64,
    /// The sets.
    pub sets: Vec<SetSummary>,
    /// One row per coefficient.
    pub terms: Vec<TermResult>,
}

/// Reads the sets and runs every analysis on them.
pub async fn analyze(sets: &Sets, analyses: &[AnalysisSpec], opts: &Options) -> Result<Vec<Analysis>, AnalyzeError> {
    let models = models(analyses, opts)?;
    let mut columns: Vec<String> = Vec::new();
    for (f, _, _) in &models {
        for c in f.columns() {
            if !columns.contains(&c) {
                columns.push(c);
            }
        }
    }
    let data = load(sets, &columns, opts.format).await?;
    run(&data, analyses, &models, opts)
}

/// The analyses on sets already in memory (`(name, batches)` per set).
pub fn analyze_batches(
    data: &[(String, Vec<RecordBatch>)],
    analyses: &[AnalysisSpec],
    opts: &Options,
) -> Result<Vec<Analysis>, AnalyzeError> {
    run(data, analyses, &models(analyses, opts)?, opts)
}

/// Checks the request and binds each analysis to its model (before any set is read).
fn models(
    analyses: &[AnalysisSpec],
    opts: &Options,
) -> Result<Vec<(Formula, ResponseKind, Option<String>)>, AnalyzeError> {
    if analyses.is_empty() {
        return Err(AnalyzeError::Spec("no analysis given".into()));
    }
    if !(opts.alpha > 0.0 && opts.alpha < 1.0) {
        return Err(AnalyzeError::Spec(format!(
            "the interval level must be between 0 and 1 (got {})",
            1.0 - opts.alpha
        )));
    }
    analyses.iter().map(|a| a.model()).collect()
}

fn run(
    data: &[(String, Vec<RecordBatch>)],
    analyses: &[AnalysisSpec],
    models: &[(Formula, ResponseKind, Option<String>)],
    opts: &Options,
) -> Result<Vec<Analysis>, AnalyzeError> {
    let m = data.len();
    if m == 0 {
        return Err(AnalyzeError::Spec("no synthetic sets given".into()));
    }
    let rule = opts.rule.unwrap_or(if m >= 2 { Rule::FullySynthetic { syn_over_original: 1.0 } } else { Rule::Single });
    let mut out = Vec::with_capacity(analyses.len());
    for (spec, (formula, response, rename)) in analyses.iter().zip(models) {
        // Categorical columns (from the first set's schema; every set must
        // agree) and their levels over all sets.
        let mut categorical: Option<Vec<String>> = None;
        let mut levels = BTreeMap::<String, BTreeSet<String>>::new();
        for (name, batches) in data {
            let Some(first) = batches.first() else { continue };
            let cat = design::categorical_columns(&first.schema(), &formula.columns(), name)?;
            match &categorical {
                None => categorical = Some(cat.clone()),
                Some(c) if *c != cat => {
                    return Err(AnalyzeError::Spec(format!(
                        "the sets disagree on which columns are text: {name} has {cat:?}, the first set {c:?}"
                    )));
                }
                _ => {}
            }
            let term_cats: Vec<String> = cat.iter().filter(|c| formula.terms.contains(c)).cloned().collect();
            for b in batches {
                design::collect_levels(b, &term_cats, &mut levels, name)?;
            }
        }
        let categorical = categorical.unwrap_or_default();
        let design = Design::new(formula, &categorical, &levels, *response)?;
        let mut summaries = Vec::with_capacity(m);
        let mut per_set = Vec::with_capacity(m);
        for (name, batches) in data {
            let blocks = batches.iter().map(|b| design.block(b, name)).collect::<Result<Vec<_>, _>>()?;
            let est = estimate::estimate(spec.estimator, &blocks, name)?;
            summaries.push(SetSummary {
                name: name.clone(),
                rows: est.rows,
                dropped: est.dropped,
                iterations: (spec.estimator == EstimatorKind::Logistic).then_some(est.iterations),
            });
            per_set.push(est);
        }
        // n_syn/n for the fully-synthetic rule's fallback.
        let rule = match (rule, opts.original_rows) {
            (Rule::FullySynthetic { .. }, Some(n)) => {
                let n_syn = summaries.iter().map(|s| s.rows as f64).sum::<f64>() / m as f64;
                Rule::FullySynthetic { syn_over_original: n_syn / n.max(1) as f64 }
            }
            (r, _) => r,
        };
        let names: Vec<String> = match rename {
            Some(n) => vec![n.clone()],
            None => design.names().to_vec(),
        };
        let mut terms = Vec::with_capacity(names.len());
        for (k, term) in names.iter().enumerate() {
            let pairs: Vec<[f64; 2]> = per_set.iter().map(|e| [e.estimates[k], e.variances[k]]).collect();
            let kept: Vec<[f64; 2]> =
                pairs.iter().copied().filter(|[_, u]| opts.max_std_error.is_none_or(|s| u.sqrt() <= s)).collect();
            if kept.is_empty() {
                return Err(AnalyzeError::Combine {
                    term: term.clone(),
                    problem: "every set's standard error exceeds --max-std-error".into(),
                });
            }
            let q: Vec<f64> = kept.iter().map(|p| p[0]).collect();
            let u: Vec<f64> = kept.iter().map(|p| p[1]).collect();
            let combined = combine::combine(term, &q, &u, rule, opts.alpha, per_set[0].df)?;
            terms.push(TermResult { term: term.clone(), combined, excluded: pairs.len() - kept.len(), per_set: pairs });
        }
        out.push(Analysis { analysis: spec.clone(), rule, level: 1.0 - opts.alpha, sets: summaries, terms });
    }
    Ok(out)
}

/// Reads the needed columns of every set into memory.
async fn load(
    sets: &Sets,
    columns: &[String],
    format: Option<InputFormat>,
) -> Result<Vec<(String, Vec<RecordBatch>)>, AnalyzeError> {
    let ctx = crate::io::session_context();
    let read = |set: &str| {
        let set = set.to_string();
        move |source| AnalyzeError::Read { set, source }
    };
    let select = |ctx: &SessionContext, location: &str, extra: Option<&str>| {
        let location = location.to_string();
        let mut cols: Vec<String> = columns.to_vec();
        if let Some(e) = extra {
            cols.push(e.to_string());
        }
        let ctx = ctx.clone();
        async move {
            let df = open_released(&ctx, &location, format).await?;
            let have: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();
            if let Some(c) = cols.iter().find(|c| !have.contains(c)) {
                return Err(AnalyzeError::Column {
                    set: location.clone(),
                    column: c.clone(),
                    problem: format!("is not in the set (its columns: {})", have.join(", ")),
                });
            }
            let df = df
                .select(cols.iter().map(|c| col(datafusion::common::Column::from_name(c))).collect::<Vec<_>>())
                .map_err(read(&location))?;
            df.collect().await.map_err(read(&location))
        }
    };
    match sets {
        Sets::Locations(locations) => {
            let mut out = Vec::with_capacity(locations.len());
            for l in locations {
                out.push((l.clone(), select(&ctx, l, None).await?));
            }
            Ok(out)
        }
        Sets::Column { location, column } => {
            if columns.contains(column) {
                return Err(AnalyzeError::Spec(format!("the set column `{column}` is also used by an analysis")));
            }
            let batches = select(&ctx, location, Some(column)).await?;
            split_by(&batches, column, location)
        }
    }
}

/// Splits batches into sets by the text of `column` (sorted numerically
/// when every value is an integer, else as text).
fn split_by(
    batches: &[RecordBatch],
    column: &str,
    location: &str,
) -> Result<Vec<(String, Vec<RecordBatch>)>, AnalyzeError> {
    let bad = |problem: String| AnalyzeError::Column { set: location.to_string(), column: column.to_string(), problem };
    let mut texts = Vec::with_capacity(batches.len());
    let mut values = BTreeSet::new();
    for b in batches {
        let idx = b.schema().index_of(column).map_err(|_| bad("is not in the table".into()))?;
        let t = cast(b.column(idx), &DataType::Utf8).map_err(|e| bad(format!("cannot be read as text: {e}")))?;
        if t.null_count() > 0 {
            return Err(bad("has nulls; every row must name its set".into()));
        }
        values.extend(t.as_string::<i32>().iter().flatten().map(str::to_string));
        texts.push((idx, t));
    }
    let mut values: Vec<String> = values.into_iter().collect();
    if values.iter().all(|v| v.parse::<i64>().is_ok()) {
        values.sort_by_key(|v| v.parse::<i64>().unwrap_or_default());
    }
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        let key = Scalar::new(StringArray::from(vec![v.as_str()]));
        let mut part = Vec::new();
        for (b, (idx, t)) in batches.iter().zip(&texts) {
            let mask = eq(t, &key).map_err(|e| bad(e.to_string()))?;
            let mut kept = filter_record_batch(b, &mask).map_err(|e| bad(e.to_string()))?;
            kept.remove_column(*idx);
            if kept.num_rows() > 0 {
                part.push(kept);
            }
        }
        out.push((format!("{column}={v}"), part));
    }
    Ok(out)
}

/// The combined estimates as CSV: one row per coefficient of every analysis
/// (`analysis,term,estimate,std_error,ci_low,ci_high,df,m,rule,level`; `df`
/// is `inf` for the normal reference).
pub fn to_csv(results: &[Analysis]) -> String {
    let quote =
        |s: &str| if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.into() };
    let mut out = String::from("analysis,term,estimate,std_error,ci_low,ci_high,df,m,rule,level\n");
    for r in results {
        for t in &r.terms {
            let c = &t.combined;
            out += &format!(
                "{},{},{},{},{},{},{},{},{},{}\n",
                quote(&r.analysis.describe()),
                quote(&t.term),
                c.estimate,
                c.std_error,
                c.ci_low,
                c.ci_high,
                c.df.map_or("inf".into(), |d| format!("{d:.1}")),
                c.m,
                r.rule.name(),
                r.level
            );
        }
    }
    out
}
