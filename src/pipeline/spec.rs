//! The release pipeline spec (YAML; schema in `docs/pipeline.md`) and its
//! validation. Every error names the file, the line and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::io::InputFormat;
use crate::privacy::Budget;
use crate::privacy::RawBudget;

pub use super::error::PipelineError;
use super::error::chain;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    name: Spanned<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    schedule: Option<Spanned<String>>,
    #[serde(default)]
    timezone: Option<Spanned<String>>,
    ledger: Spanned<String>,
    #[serde(default)]
    create_ledger_if_missing: Option<BTreeMap<String, RawBudget>>,
    dataset: RawDataset,
    budget: Spanned<RawBudget>,
    output: Spanned<String>,
    #[serde(default)]
    staging: Option<Spanned<String>>,
    #[serde(default)]
    public_tables: BTreeMap<String, RawPublic>,
    #[serde(default)]
    cluster: Option<Spanned<crate::io::RawCluster>>,
    steps: Vec<Spanned<RawStep>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataset {
    name: Spanned<String>,
    sources: Vec<Spanned<String>>,
    #[serde(default)]
    format: Option<InputFormat>,
    domain: Spanned<String>,
    #[serde(default)]
    privacy_unit: Option<Spanned<String>>,
    #[serde(default = "one")]
    max_rows_per_unit: u64,
    #[serde(default = "one")]
    max_groups_per_unit: u64,
    /// The declared missingness of the data (000 §5.2): synthesize steps
    /// report the ground-truth ε̄ under MCAR.
    #[serde(default)]
    missingness: Option<Spanned<RawMissingness>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMissingness {
    /// mcar, mar or mnar.
    mechanism: crate::missing::Missingness,
    /// Public missing probabilities: one for every column, or per column.
    #[serde(default)]
    rates: Option<RawRates>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRates {
    One(f64),
    Each(BTreeMap<String, f64>),
}

fn one() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPublic {
    location: String,
    domain: String,
    #[serde(default)]
    format: Option<InputFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[allow(clippy::large_enum_variant)] // a handful per pipeline, parsed once
enum RawStep {
    Sql(RawSql),
    Synthesize(RawSynth),
    Impute(RawImpute),
    Evaluate(RawEval),
    Analyze(RawAnalyze),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnalyze {
    name: String,
    /// The synthesize step whose output is analysed.
    synthetic: String,
    analyses: Vec<crate::analyze::AnalysisSpec>,
    /// Interval coverage (default 0.95).
    #[serde(default)]
    level: Option<f64>,
    /// Combining rule: `fully-synthetic` (default for two or more sets),
    /// `dips` or `single`.
    #[serde(default)]
    rule: Option<String>,
    /// 003 §5: leave a set's coefficient out when its standard error exceeds this.
    #[serde(default)]
    max_std_error: Option<f64>,
    /// Output CSV (relative; published with the release).
    output: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImpute {
    name: String,
    /// A `dpflow impute` spec file (its input must be one of the dataset's sources).
    spec: String,
    #[serde(default)]
    estimator: Option<crate::impute::Estimator>,
    /// Budget of every released number (overrides the spec's).
    #[serde(default)]
    budget: Option<RawBudget>,
    output: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSql {
    name: String,
    query: String,
    budget: RawBudget,
    output: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSynth {
    name: String,
    mechanism: crate::synth::run::Mechanism,
    #[serde(default = "default_workload")]
    workload: String,
    #[serde(default)]
    rows: Option<u64>,
    budget: RawBudget,
    output: String,
    #[serde(default)]
    model_output: Option<String>,
    #[serde(default = "default_iters")]
    iters: usize,
    #[serde(default = "default_mb")]
    max_model_size: f64,
    /// Missing-data strategy (reproduce, complete-row, adaptive, impute-first:METHOD).
    #[serde(default)]
    missing: Option<String>,
    /// The marginals NAPSU-MQ measures (`a,b; b,c`): the workload `marginals:a,b; b,c`.
    #[serde(default)]
    queries: Option<String>,
    /// Synthetic sets in the output (a `_set` column when more than one).
    #[serde(default = "one_set")]
    multiple: usize,
    /// NAPSU-MQ inference: laplace (default) or nuts.
    #[serde(default)]
    inference: Option<crate::synth::napsu::release::Inference>,
    /// NAPSU-MQ's cap on canonical features.
    #[serde(default)]
    max_features: Option<usize>,
    /// NAPSU-MQ: publish NUTS draws with R̂ of the mean parameters over 1.05
    /// (rank-normalised for cells of at least one expected row).
    #[serde(default)]
    allow_unconverged: bool,
    /// NAPSU-MQ NUTS chains (default 4).
    #[serde(default)]
    nuts_chains: Option<usize>,
    /// NAPSU-MQ NUTS warm-up draws per chain (default 800).
    #[serde(default)]
    nuts_warmup: Option<u64>,
    /// NAPSU-MQ NUTS kept draws per chain (default 2000).
    #[serde(default)]
    nuts_draws: Option<u64>,
    /// NAPSU-MQ most NUTS draws per chain when R̂ asks for longer chains
    /// (default 4 × nuts_draws).
    #[serde(default)]
    nuts_max_draws: Option<u64>,
    /// MODIPS's Dirichlet prior per cell (modips, modips-glom; default 1/3).
    #[serde(default)]
    dips_prior: Option<f64>,
    /// laplace-sanitizer and perturbed-histogram: `sample` (default) or `round`.
    #[serde(default)]
    dips_generate: Option<crate::synth::dips::Generate>,
    /// sequential-regression's ridge Λ (default 1).
    #[serde(default)]
    dips_ridge: Option<f64>,
    /// sequential-regression's numeric columns: `bins` (default) or `linear`.
    #[serde(default)]
    dips_numeric: Option<crate::synth::dips::sequential::NumericModel>,
    /// PrivBayes's degree k (privbayes, privbayes-pgm; default 2).
    #[serde(default)]
    degree: Option<usize>,
    /// MWEM's rounds (default: the number of columns).
    #[serde(default)]
    rounds: Option<usize>,
    /// AIM's error-bound coverage (default 0.95).
    #[serde(default)]
    confidence: Option<f64>,
    /// impute-first:mode|model's budget share for imputation statistics (default 0.2).
    #[serde(default)]
    impute_share: Option<f64>,
    /// Decode numeric bins to their midpoints (default: uniform inside the bin).
    #[serde(default)]
    midpoints: bool,
}

fn one_set() -> usize {
    1
}

/// Where a napsu-mq step's release record (its noisy statistics) goes,
/// next to its output.
pub fn napsu_record_name(output: &str) -> String {
    format!("{output}.napsu.json")
}

fn default_workload() -> String {
    "all-2way".into()
}
fn default_iters() -> usize {
    1000
}
fn default_mb() -> f64 {
    80.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEval {
    name: String,
    synthetic: String,
    #[serde(default = "default_workload")]
    workload: String,
    /// Curator-only output (never published in the release).
    private_output: String,
}

/// A validated step.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a handful per pipeline, built once at load
pub enum Step {
    /// A DP SQL query written as CSV.
    Sql {
        /// Step name.
        name: String,
        /// The query.
        query: String,
        /// Its budget.
        budget: Budget,
        /// Output (relative to the release output).
        output: String,
    },
    /// A synthetic dataset.
    Synthesize {
        /// Step name.
        name: String,
        /// Synthesizer.
        mechanism: crate::synth::run::Mechanism,
        /// Workload spec.
        workload: String,
        /// Rows (default: noisy n).
        rows: Option<u64>,
        /// Budget (zCDP inside).
        budget: Budget,
        /// Output (relative).
        output: String,
        /// Model output (relative).
        model_output: Option<String>,
        /// Estimation iterations.
        iters: usize,
        /// Model capacity (MB).
        max_model_size: f64,
        /// Missing-data strategy.
        missing: crate::missing::Strategy,
        /// Synthetic sets (m).
        multiple: usize,
        /// NAPSU-MQ's inference settings.
        napsu: crate::synth::napsu::release::NapsuOptions,
        /// The 002 synthesizers' settings.
        dips: crate::synth::DipsOptions,
        /// PrivBayes degree, MWEM rounds, AIM confidence (the rest of
        /// [`crate::synth::SynthOptions`] comes from the keys above).
        options: crate::synth::SynthOptions,
        /// The missing-data strategy's options.
        missing_options: crate::missing::StrategyOptions,
        /// Numeric bins decoded to midpoints.
        midpoints: bool,
    },
    /// Estimates combined across a synthesize step's sets (post-processing:
    /// no budget of its own).
    Analyze {
        /// Step name.
        name: String,
        /// Name of the synthesize step analysed.
        synthetic: String,
        /// The analyses.
        analyses: Vec<crate::analyze::AnalysisSpec>,
        /// Interval coverage.
        level: f64,
        /// The combining rule (`None`: fully synthetic for m ≥ 2, single for m = 1).
        rule: Option<crate::analyze::Rule>,
        /// Leave out a set's coefficient whose standard error exceeds this.
        max_std_error: Option<f64>,
        /// Output CSV (relative).
        output: String,
    },
    /// DP statistics on kNN-imputed data (004): the imputed rows are never published.
    Impute {
        /// Step name.
        name: String,
        /// The impute spec, with the step's budget override applied.
        spec: Box<crate::impute::spec::ImputeSpec>,
        /// Estimator (smooth or ignore-missing).
        estimator: crate::impute::Estimator,
        /// Output CSV (relative).
        output: String,
    },
    /// Curator-only evaluation of a synthesize step's output (not published).
    Evaluate {
        /// Step name.
        name: String,
        /// Name of the synthesize step to evaluate.
        synthetic: String,
        /// Workload.
        workload: String,
        /// Private output location (absolute URL or path).
        private_output: String,
    },
}

impl Step {
    /// The step's name.
    pub fn name(&self) -> &str {
        match self {
            Step::Sql { name, .. }
            | Step::Synthesize { name, .. }
            | Step::Impute { name, .. }
            | Step::Evaluate { name, .. }
            | Step::Analyze { name, .. } => name,
        }
    }
}

/// A validated pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// Name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// SHA-256 of the file's bytes.
    pub sha256: String,
    /// Cron expression.
    pub schedule: Option<String>,
    /// Time zone of the schedule.
    pub timezone: chrono_tz::Tz,
    /// Ledger file.
    pub ledger: PathBuf,
    /// Demo ledger creation.
    pub create_ledger: Option<BTreeMap<String, Budget>>,
    /// Ledger dataset name (also the SQL table name).
    pub dataset: String,
    /// Sources.
    pub sources: Vec<String>,
    /// Format.
    pub format: Option<InputFormat>,
    /// Domain file.
    pub domain: String,
    /// Privacy unit column (None = one row per person).
    pub privacy_unit: Option<String>,
    /// Contribution bounds.
    pub max_rows_per_unit: u64,
    /// Contribution bounds.
    pub max_groups_per_unit: u64,
    /// Declared missingness and its public rates spec (`R` or `COL=R,...`).
    pub missingness: Option<(crate::missing::Missingness, String)>,
    /// Release budget.
    pub budget: Budget,
    /// Output base URL template (`{date}`, `{release_id}`, `{name}`).
    pub output: String,
    /// Staging base (default `<output>/_staging`).
    pub staging: Option<String>,
    /// Public tables (name → (location, domain, format)).
    pub public_tables: BTreeMap<String, (String, String, Option<InputFormat>)>,
    /// Steps.
    pub steps: Vec<Step>,
    /// Where the steps read the protected data (`cluster:`; docs/cluster.md):
    /// a Ballista cluster, or this process when absent.
    pub cluster: Option<crate::io::ClusterSpec>,
    /// What validation found questionable but not wrong (public inputs
    /// only: printed before anything is read), e.g. an analysis whose
    /// relation the synthesizer's queries cannot carry.
    pub warnings: Vec<String>,
}

/// The dotted key path of the YAML line `line` (1-based), from indentation:
/// the fallback for errors outside any key (YAML syntax errors), where serde
/// has no path.
pub fn key_at(text: &str, line: u32) -> String {
    let mut stack: Vec<(usize, String)> = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let trimmed = l.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut indent = l.len() - trimmed.len();
        let body = match trimmed.strip_prefix("- ") {
            Some(b) => {
                indent += 2;
                b
            }
            None => trimmed,
        };
        let key = body
            .split_once(':')
            .map(|(k, _)| k.trim())
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-'));
        if let Some(k) = key {
            while stack.last().is_some_and(|(d, _)| *d >= indent) {
                stack.pop();
            }
            stack.push((indent, k.to_string()));
        }
        if i + 1 == line as usize {
            break;
        }
    }
    stack.into_iter().map(|(_, k)| k).collect::<Vec<_>>().join(".")
}

/// Why `id` cannot be a release id (one path segment of staging and output
/// locations), if it cannot.
pub fn release_id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() || id.len() > 128 {
        return Some("it must have 1 to 128 characters");
    }
    if id == "." || id == ".." {
        return Some("it would name a directory above or at the root");
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')) {
        return Some("it has a character that could leave its directory or that storage may reinterpret");
    }
    if id.contains(".failed-") {
        return Some("it contains \".failed-\", which names where failed napsu-mq runs keep their statistics");
    }
    None
}

/// Why a step's output name (a path relative to the release root) is unsafe,
/// if it is: outputs stay below the root whatever the name.
pub(crate) fn output_name_problem(name: &str) -> Option<&'static str> {
    if name == "manifest.json" || name == "report.html" || name.starts_with('_') {
        return Some(
            "`manifest.json`, `report.html` and names starting with `_` are dpflow's own (the manifest, the \
             release report, staging, step records)",
        );
    }
    crate::io::names::relative_name_problem(name)
}

/// The spec key a row-trained mechanism's public check (Kamino, KaminoI,
/// DP-MisGAN, DP-GAN) points at when it refuses.
fn rows_check_field(e: &crate::synth::SynthError) -> &'static str {
    use crate::synth::SynthError as E;
    match e {
        E::KaminoBudget(..)
        | E::Kamino(crate::synth::kamino::KaminoError::BudgetTooSmall { .. })
        | E::Gan(crate::synth::gan::GanError::BudgetTooSmall { .. }) => "synthesize.budget",
        E::KaminoModelOut(_) => "synthesize.model_output",
        E::KaminoMissing { .. } => "synthesize.missing",
        _ => "dataset.domain",
    }
}

fn resolve(base: &Path, p: &str) -> String {
    if p.contains("://") || Path::new(p).is_absolute() { p.to_string() } else { base.join(p).display().to_string() }
}

impl Pipeline {
    /// Loads and validates a pipeline file (reads no data).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PipelineError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| PipelineError::Spec {
            file: path.display().to_string(),
            line: None,
            key: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&bytes, path)
    }

    /// Validates a pipeline's text as if it were read from `path` (relative
    /// locations are resolved against `path`'s directory; reads no data).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self, PipelineError> {
        let file = path.display().to_string();
        let err = |line: Option<u32>, key: &str, message: String| PipelineError::Spec {
            file: file.clone(),
            line,
            key: key.into(),
            message,
        };
        let text = String::from_utf8(bytes.to_vec()).map_err(|_| err(None, "(file)", "not UTF-8".into()))?;
        let raw: RawPipeline = crate::domain::from_yaml_with_path(&text).map_err(|(e, path)| {
            let msg = e.to_string();
            let line = e.location().map(|l| l.line() as u32);
            // The key path serde was at; the line's keys when it was at the root (an unknown top-level key).
            let key = path
                .or_else(|| line.map(|l| key_at(&text, l)))
                .filter(|k| !k.is_empty())
                .unwrap_or_else(|| "(syntax)".into());
            err(line, &key, msg.lines().next().unwrap_or(&msg).to_string())
        })?;
        let line = |l: &serde_saphyr::Location| Some(l.line() as u32).filter(|x| *x > 0);
        let base = path.parent().unwrap_or(Path::new("."));
        use sha2::Digest;
        let sha256 = hex::encode(sha2::Sha256::digest(bytes));

        let name = raw.name.value.clone();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(err(line(&raw.name.referenced), "name", "use letters, digits, '-' and '_' only".into()));
        }
        let timezone: chrono_tz::Tz = match &raw.timezone {
            Some(tz) => tz
                .value
                .parse()
                .map_err(|_| err(line(&tz.referenced), "timezone", format!("unknown time zone {:?}", tz.value)))?,
            None => chrono_tz::UTC,
        };
        let cluster = match &raw.cluster {
            Some(c) => Some(c.value.spec().map_err(|e| err(line(&c.referenced), "cluster", e))?),
            None => None,
        };
        if let Some(s) = &raw.schedule {
            <croner::Cron as std::str::FromStr>::from_str(&s.value)
                .map_err(|e| err(line(&s.referenced), "schedule", format!("bad cron expression {:?}: {e}", s.value)))?;
        }
        let budget = raw
            .budget
            .value
            .budget("budget")
            .map_err(|e| err(line(&raw.budget.referenced), "budget", e.to_string()))?;
        // Data sources and domain.
        let d = &raw.dataset;
        if d.sources.is_empty() {
            return Err(err(line(&d.name.referenced), "dataset.sources", "give at least one source".into()));
        }
        let mut sources = Vec::new();
        for (i, s) in d.sources.iter().enumerate() {
            let v = resolve(base, &s.value);
            if let Some((scheme, _)) = v.split_once("://") {
                if !matches!(scheme, "file" | "s3" | "memory") {
                    return Err(err(
                        line(&s.referenced),
                        &format!("dataset.sources[{i}]"),
                        format!("unsupported URL scheme {scheme:?} (use file://, s3:// or memory://)"),
                    ));
                }
                if url::Url::parse(&v).is_err() {
                    return Err(err(
                        line(&s.referenced),
                        &format!("dataset.sources[{i}]"),
                        format!("invalid URL {v:?}"),
                    ));
                }
            }
            sources.push(v);
        }
        let domain = resolve(base, &d.domain.value);
        let spec = crate::domain::DomainSpec::load(&domain)
            .map_err(|e| err(line(&d.domain.referenced), "dataset.domain", chain(&e)))?;
        if let Some(u) = &d.privacy_unit
            && u.value != "row"
            && spec.domain.column(&u.value).is_some()
        {
            return Err(err(
                line(&u.referenced),
                "dataset.privacy_unit",
                "the unit column must not be a domain attribute".into(),
            ));
        }
        let missingness = match &d.missingness {
            None => None,
            Some(m) => {
                use crate::missing::Missingness as Mi;
                let at = line(&m.referenced);
                let rates = match &m.value.rates {
                    None => String::new(),
                    Some(RawRates::One(r)) => r.to_string(),
                    Some(RawRates::Each(each)) => {
                        each.iter().map(|(c, r)| format!("{c}={r}")).collect::<Vec<_>>().join(",")
                    }
                };
                if m.value.mechanism == Mi::Mcar {
                    // The rates are public inputs of the amplification: checked here, before any run.
                    let names = spec.domain.names();
                    let parsed = match &m.value.rates {
                        None => Err("give the public missing rates: one for every column, or one per column".into()),
                        Some(RawRates::One(r)) => {
                            crate::missing::amplify::Rates::uniform(&names, *r).map_err(|e| e.to_string())
                        }
                        Some(RawRates::Each(_)) => {
                            crate::missing::amplify::Rates::parse(&names, &rates).map_err(|e| e.to_string())
                        }
                    };
                    parsed.map_err(|why| err(at, "dataset.missingness.rates", why))?;
                }
                Some((m.value.mechanism, rates))
            }
        };
        let output = raw.output.value.clone();
        if let Some((scheme, _)) = output.split_once("://")
            && !matches!(scheme, "file" | "s3" | "memory")
        {
            return Err(err(line(&raw.output.referenced), "output", format!("unsupported URL scheme {scheme:?}")));
        }
        let mut steps = Vec::new();
        let mut warnings = Vec::new();
        let mut names = std::collections::HashSet::new();
        let mut all_outputs: Vec<String> = Vec::new();
        for (i, s) in raw.steps.iter().enumerate() {
            let l = line(&s.referenced);
            let key = |k: &str| format!("steps[{i}].{k}");
            let step = match &s.value {
                RawStep::Sql(q) => {
                    crate::sql::sites::prepare(&q.query).map_err(|e| err(l, &key("sql.query"), e.to_string()))?;
                    Step::Sql {
                        name: q.name.clone(),
                        query: q.query.clone(),
                        budget: q.budget.budget("budget").map_err(|e| err(l, &key("sql.budget"), e.to_string()))?,
                        output: q.output.clone(),
                    }
                }
                RawStep::Synthesize(x) => {
                    // Synthesizers bound one row's influence, not a person's.
                    if let Some(u) = d.privacy_unit.as_ref().filter(|u| u.value != "row") {
                        return Err(err(
                            l,
                            &key("synthesize"),
                            format!(
                                "the dataset's privacy unit is the column {:?}, but synthesizers bound one row's \
                                 influence: synthesize from a dataset with one row per person (privacy_unit: row)",
                                u.value
                            ),
                        ));
                    }
                    let b = x.budget.budget("budget").map_err(|e| err(l, &key("synthesize.budget"), e.to_string()))?;
                    let pure = x.mechanism.pure_dp();
                    if b.as_rho().is_none() && !pure {
                        return Err(err(
                            l,
                            &key("synthesize.budget"),
                            "synthesizers need {epsilon, delta} or {rho}".into(),
                        ));
                    }
                    let missing = match &x.missing {
                        None => crate::missing::Strategy::default(),
                        Some(m) => m
                            .parse::<crate::missing::Strategy>()
                            .map_err(|e| err(l, &key("synthesize.missing"), e.to_string()))?,
                    };
                    let workload = match &x.queries {
                        Some(q) => format!("marginals:{q}"),
                        None => x.workload.clone(),
                    };
                    let field = if x.queries.is_some() { "synthesize.queries" } else { "synthesize.workload" };
                    let parsed = crate::synth::Workload::parse(&workload, &spec.domain)
                        .map_err(|e| err(l, &key(field), chain(&e)))?;
                    if x.multiple == 0 || x.multiple > crate::synth::run::MAX_SETS {
                        return Err(err(
                            l,
                            &key("synthesize.multiple"),
                            format!("must be between 1 and {}", crate::synth::run::MAX_SETS),
                        ));
                    }
                    if x.multiple > 1 && spec.domain.position(crate::synth::run::SET_COLUMN).is_some() {
                        return Err(err(
                            l,
                            &key("synthesize.multiple"),
                            "the domain has a column named _set, which numbers the sets; rename it".into(),
                        ));
                    }
                    let mut napsu = crate::synth::napsu::release::NapsuOptions {
                        inference: x.inference.unwrap_or_default(),
                        allow_unconverged: x.allow_unconverged,
                        ..Default::default()
                    };
                    if let Some(cap) = x.max_features {
                        napsu.max_features = cap;
                    }
                    if let Some(c) = x.nuts_chains {
                        napsu.nuts.chains = c;
                    }
                    if let Some(w) = x.nuts_warmup {
                        napsu.nuts.warmup = w;
                    }
                    if let Some(d) = x.nuts_draws {
                        napsu.nuts.draws = d;
                    }
                    napsu.nuts.max_draws = x.nuts_max_draws;
                    let nuts_keys = x.nuts_chains.is_some()
                        || x.nuts_warmup.is_some()
                        || x.nuts_draws.is_some()
                        || x.nuts_max_draws.is_some();
                    if nuts_keys && !napsu.inference.is_nuts() {
                        return Err(err(
                            l,
                            &key("synthesize.nuts_draws"),
                            "nuts_chains, nuts_warmup, nuts_draws and nuts_max_draws need inference: nuts".into(),
                        ));
                    }
                    if x.mechanism == crate::synth::run::Mechanism::NapsuMq {
                        // NAPSU-MQ's public inputs are checked here, before the release is charged.
                        if x.model_output.is_some() {
                            return Err(err(
                                l,
                                &key("synthesize.model_output"),
                                "napsu-mq has no single model: its noisy statistics are published beside the output"
                                    .into(),
                            ));
                        }
                        if !matches!(
                            missing,
                            crate::missing::Strategy::Reproduce | crate::missing::Strategy::CompleteRow
                        ) {
                            return Err(err(
                                l,
                                &key("synthesize.missing"),
                                "napsu-mq supports reproduce and complete-row".into(),
                            ));
                        }
                        let model_domain =
                            if missing.models_nulls() { spec.domain.clone() } else { spec.domain.without_nulls() };
                        let scopes: Vec<Vec<usize>> = parsed.queries.iter().map(|q| q.attrs.clone()).collect();
                        let me = crate::synth::napsu::release::max_ent(&model_domain, &scopes, napsu.max_features)
                            .map_err(|e| err(l, &key(field), e.to_string()))?;
                        if napsu.inference.is_nuts() {
                            napsu
                                .nuts
                                .check(me.features.len, me.width)
                                .map_err(|e| err(l, &key("synthesize.nuts_draws"), e.to_string()))?;
                        }
                    } else if x.queries.is_some() || x.inference.is_some() || x.max_features.is_some() {
                        return Err(err(
                            l,
                            &key("synthesize.queries"),
                            "queries, inference and max_features are napsu-mq settings".into(),
                        ));
                    }
                    let dips = crate::synth::DipsOptions::given(
                        x.mechanism,
                        x.dips_prior,
                        x.dips_generate,
                        x.dips_ridge,
                        x.dips_numeric,
                    )
                    .map_err(|setting| {
                        let name = x.mechanism.synthesizer(&Default::default()).name();
                        err(
                            l,
                            &key(&format!("synthesize.dips_{setting}")),
                            format!("{name} does not take dips_{setting}: drop it"),
                        )
                    })?;
                    let (options, missing_options) = {
                        use crate::missing::{ImputeMethod as I, Strategy as S};
                        use crate::synth::run::Mechanism as M;
                        let imputes = matches!(missing, S::ImputeFirst(I::Mode | I::Model));
                        for (given, takes, field) in [
                            (x.degree.is_some(), matches!(x.mechanism, M::Privbayes | M::PrivbayesPgm), "degree"),
                            (x.rounds.is_some(), x.mechanism == M::Mwem, "rounds"),
                            (x.confidence.is_some(), x.mechanism == M::Aim, "confidence"),
                            (x.impute_share.is_some(), imputes, "impute_share"),
                        ] {
                            if given && !takes {
                                let name = x.mechanism.synthesizer(&Default::default()).name();
                                let what = if field == "impute_share" {
                                    "only impute-first:mode and impute-first:model take impute_share: drop it"
                                        .to_string()
                                } else {
                                    format!("{name} does not take {field}: drop it")
                                };
                                return Err(err(l, &key(&format!("synthesize.{field}")), what));
                            }
                        }
                        let d = crate::synth::SynthOptions::default();
                        let options = crate::synth::SynthOptions {
                            degree: x.degree.unwrap_or(d.degree),
                            rounds: x.rounds,
                            confidence: x.confidence.unwrap_or(d.confidence),
                            ..d
                        };
                        let missing_options = crate::missing::StrategyOptions {
                            impute_share: x
                                .impute_share
                                .unwrap_or(crate::missing::StrategyOptions::default().impute_share),
                            ..Default::default()
                        };
                        crate::synth::run::check_settings(&options, &missing_options)
                            .map_err(|e| err(l, &key("synthesize"), e.to_string()))?;
                        (options, missing_options)
                    };
                    if x.midpoints && crate::synth::dips::raw::raw_mechanism(x.mechanism, &dips).is_some() {
                        return Err(err(
                            l,
                            &key("synthesize.midpoints"),
                            "this mechanism writes raw numeric values, not bins: drop midpoints".into(),
                        ));
                    }
                    if let Some(raw) = crate::synth::dips::raw::raw_mechanism(x.mechanism, &dips) {
                        // MODIPS over raw values: its public inputs, checked before the release is charged.
                        use crate::synth::dips::DipsError as E;
                        let epsilon = crate::synth::run::pure_epsilon(&b);
                        crate::synth::dips::raw::check_public_raw(
                            raw,
                            &spec.domain,
                            missing,
                            epsilon,
                            x.multiple,
                            x.rows.unwrap_or(0),
                            &dips,
                            x.model_output.is_some(),
                        )
                        .map_err(|e| {
                            let field = match e {
                                E::ModelOut(_) => "synthesize.model_output",
                                E::NoRows => "synthesize.rows",
                                E::Missing(_) | E::NullableNumeric(_) => "synthesize.missing",
                                E::Prior(_) => "synthesize.dips_prior",
                                E::Ridge(_) => "synthesize.dips_ridge",
                                E::NoSets | E::EpsilonPerSet { .. } | E::TooManyCellSets { .. } => {
                                    "synthesize.multiple"
                                }
                                E::TooManyCells { .. }
                                | E::NormalColumns(_)
                                | E::GlomColumns(_)
                                | E::Bounds { .. }
                                | E::TooManyParameters { .. }
                                | E::Levels { .. } => "dataset.domain",
                                _ => "synthesize.budget",
                            };
                            err(l, &key(field), e.to_string())
                        })?;
                    }
                    if matches!(
                        x.mechanism,
                        crate::synth::run::Mechanism::Kamino | crate::synth::run::Mechanism::Kaminoi
                    ) {
                        // Kamino's public inputs (default settings), checked before the release is charged.
                        let options = crate::synth::kamino::KaminoOptions {
                            impute: x.mechanism == crate::synth::run::Mechanism::Kaminoi,
                            ..Default::default()
                        };
                        crate::synth::kamino::release::check_public(
                            &spec.domain,
                            &b,
                            &options,
                            missing,
                            x.model_output.is_some(),
                        )
                        .map_err(|e| err(l, &key(rows_check_field(&e)), e.to_string()))?;
                    }
                    if matches!(
                        x.mechanism,
                        crate::synth::run::Mechanism::DpMisgan | crate::synth::run::Mechanism::DpGan
                    ) {
                        // The GANs' public inputs (default settings), checked before the release is charged.
                        let options = crate::synth::gan::GanOptions {
                            missing_aware: x.mechanism == crate::synth::run::Mechanism::DpMisgan,
                            ..Default::default()
                        };
                        crate::synth::gan::release::check_public(&spec.domain, &b, &options, missing)
                            .map_err(|e| err(l, &key(rows_check_field(&e)), e.to_string()))?;
                    }
                    if let Some(cells) = x.mechanism.cells() {
                        // The 002 synthesizers' public inputs, checked before the release is charged.
                        use crate::synth::dips::DipsError as E;
                        let table = crate::synth::dips::release::table_domain(&spec.domain, missing)
                            .map_err(|e| err(l, &key("synthesize.missing"), e.to_string()))?;
                        let options = crate::synth::dips::CellOptions {
                            sets: x.multiple,
                            rows: x.rows.unwrap_or(0),
                            prior: dips.prior,
                            generate: dips.generate,
                        };
                        let epsilon = crate::synth::run::pure_epsilon(&b);
                        let model_output = x.model_output.is_some();
                        crate::synth::dips::release::check_public(cells, &table, epsilon, &options, model_output)
                            .map_err(|e| {
                                let field = match e {
                                    E::ModelOut(_) => "synthesize.model_output",
                                    E::NoRows | E::PseudoCount { .. } => "synthesize.rows",
                                    E::Prior(_) => "synthesize.dips_prior",
                                    E::NoSets | E::EpsilonPerSet { .. } | E::TooManyCellSets { .. } => {
                                        "synthesize.multiple"
                                    }
                                    E::TooManyCells { .. } => "dataset.domain",
                                    _ => "synthesize.budget",
                                };
                                err(l, &key(field), e.to_string())
                            })?;
                    } else if x.mechanism == crate::synth::run::Mechanism::SequentialRegression
                        && dips.numeric == crate::synth::dips::sequential::NumericModel::Bins
                    {
                        // Its public inputs, checked before the release is charged (default ridge).
                        use crate::synth::dips::DipsError as E;
                        let table = crate::synth::dips::release::table_domain(&spec.domain, missing)
                            .map_err(|e| err(l, &key("synthesize.missing"), e.to_string()))?;
                        let epsilon = crate::synth::run::pure_epsilon(&b);
                        let ridge = dips.ridge;
                        crate::synth::dips::release::check_public_sequential(
                            &table,
                            epsilon,
                            x.multiple,
                            x.rows.unwrap_or(0),
                            ridge,
                            x.model_output.is_some(),
                        )
                        .map_err(|e| {
                            let field = match e {
                                E::ModelOut(_) => "synthesize.model_output",
                                E::NoRows => "synthesize.rows",
                                E::Ridge(_) => "synthesize.dips_ridge",
                                E::NoSets | E::EpsilonPerSet { .. } | E::TooManyCellSets { .. } => {
                                    "synthesize.multiple"
                                }
                                E::TooManyCells { .. } | E::TooManyParameters { .. } | E::Levels { .. } => {
                                    "dataset.domain"
                                }
                                _ => "synthesize.budget",
                            };
                            err(l, &key(field), e.to_string())
                        })?;
                    }
                    Step::Synthesize {
                        name: x.name.clone(),
                        mechanism: x.mechanism,
                        workload,
                        rows: x.rows,
                        budget: b,
                        output: x.output.clone(),
                        model_output: x.model_output.clone(),
                        iters: x.iters,
                        max_model_size: x.max_model_size,
                        missing,
                        multiple: x.multiple,
                        napsu,
                        dips,
                        options,
                        missing_options,
                        midpoints: x.midpoints,
                    }
                }
                RawStep::Analyze(x) => {
                    let level = x.level.unwrap_or(0.95);
                    if !(level > 0.0 && level < 1.0) {
                        return Err(err(l, &key("analyze.level"), format!("{level} must be between 0 and 1")));
                    }
                    if x.analyses.is_empty() {
                        return Err(err(l, &key("analyze.analyses"), "give at least one analysis".into()));
                    }
                    let rule = match x.rule.as_deref() {
                        None => None,
                        Some("fully-synthetic") => {
                            Some(crate::analyze::Rule::FullySynthetic { syn_over_original: 1.0 })
                        }
                        Some("dips") => Some(crate::analyze::Rule::Dips),
                        Some("single") => Some(crate::analyze::Rule::Single),
                        Some(other) => {
                            return Err(err(
                                l,
                                &key("analyze.rule"),
                                format!("{other:?} is not a rule: use fully-synthetic, dips or single"),
                            ));
                        }
                    };
                    if let Some(cap) = x.max_std_error
                        && !(cap > 0.0 && cap.is_finite())
                    {
                        return Err(err(
                            l,
                            &key("analyze.max_std_error"),
                            format!("{cap} must be a positive number (a standard error above it is left out)"),
                        ));
                    }
                    let Some((sets, mechanism, workload)) = steps.iter().find_map(|st: &Step| match st {
                        Step::Synthesize { name, multiple, mechanism, workload, .. } if *name == x.synthetic => {
                            Some((*multiple, *mechanism, workload.clone()))
                        }
                        _ => None,
                    }) else {
                        return Err(err(
                            l,
                            &key("analyze.synthetic"),
                            format!("{:?} is not the name of an earlier synthesize step", x.synthetic),
                        ));
                    };
                    // The rule against the number of sets: public, so checked
                    // here rather than after the charge.
                    match rule {
                        Some(crate::analyze::Rule::Single) if sets != 1 => {
                            return Err(err(
                                l,
                                &key("analyze.rule"),
                                format!(
                                    "the single-set rule takes one set but step {:?} writes {sets}: use \
                                     fully-synthetic or dips, or drop the rule",
                                    x.synthetic
                                ),
                            ));
                        }
                        Some(crate::analyze::Rule::FullySynthetic { .. } | crate::analyze::Rule::Dips) if sets < 2 => {
                            return Err(err(
                                l,
                                &key("analyze.rule"),
                                format!(
                                    "this rule combines at least 2 sets but step {:?} writes one: set its `multiple` \
                                     to 2 or more, or use the single rule",
                                    x.synthetic
                                ),
                            ));
                        }
                        _ => {}
                    }
                    // Formulas and columns are public: a typo is refused
                    // here, not after the synthesis it analyses is charged.
                    let mut formulas = Vec::with_capacity(x.analyses.len());
                    for (i, a) in x.analyses.iter().enumerate() {
                        let f = a
                            .check(|c| spec.domain.position(c).is_some())
                            .map_err(|e| err(l, &key(&format!("analyze.analyses[{i}]")), e.to_string()))?;
                        formulas.push((a.describe(), f));
                    }
                    // NAPSU-MQ's model holds exactly its queries: say which
                    // analysed relations it cannot carry (a warning: the
                    // analyst may mean it).
                    if mechanism == crate::synth::run::Mechanism::NapsuMq
                        && let Ok(w) = crate::synth::Workload::parse(&workload, &spec.domain)
                    {
                        let names = spec.domain.names();
                        let scopes: Vec<Vec<String>> =
                            w.queries.iter().map(|q| q.attrs.iter().map(|&a| names[a].to_string()).collect()).collect();
                        for (what, f) in &formulas {
                            let missing = f.unmodelled(&scopes);
                            if missing.is_empty() {
                                continue;
                            }
                            let y = &f.response.column;
                            let why = if f.terms.is_empty() {
                                format!(
                                    "holds `{y}`, so the model knows nothing of it and every synthetic set draws it \
                                     alike: the interval may miss the real value however many sets are drawn. Add a \
                                     query holding `{y}`"
                                )
                            } else {
                                format!(
                                    "holds {} with `{y}`, so the model cannot carry that relation and every synthetic \
                                     set shares the bias: the intervals may miss the real values however many sets \
                                     are drawn. Add `{}` to its queries",
                                    missing.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
                                    missing.iter().map(|t| format!("{t},{y}")).collect::<Vec<_>>().join("; ")
                                )
                            };
                            warnings.push(format!(
                                "step {:?} ({what}): no query of napsu-mq step {:?} {why}",
                                x.name, x.synthetic
                            ));
                        }
                    }
                    Step::Analyze {
                        name: x.name.clone(),
                        synthetic: x.synthetic.clone(),
                        analyses: x.analyses.clone(),
                        level,
                        rule,
                        max_std_error: x.max_std_error,
                        output: x.output.clone(),
                    }
                }
                RawStep::Impute(x) => {
                    let file = resolve(base, &x.spec);
                    let mut spec = crate::impute::spec::ImputeSpec::load(&file)
                        .map_err(|e| err(l, &key("impute.spec"), e.to_string()))?;
                    if let Some(b) = &x.budget {
                        spec.budget = b.budget("budget").map_err(|e| err(l, &key("impute.budget"), e.to_string()))?;
                    }
                    let same = |a: &str, b: &str| {
                        a == b
                            || matches!(
                                (std::fs::canonicalize(a), std::fs::canonicalize(b)),
                                (Ok(x), Ok(y)) if x == y
                            )
                    };
                    // The spec must read this pipeline's dataset, so that the charge lands on it.
                    if !sources.iter().any(|s| same(s, &spec.input)) {
                        return Err(err(
                            l,
                            &key("impute.spec"),
                            format!(
                                "{file}: input {:?} is not one of this pipeline's dataset sources (the charge would land on the wrong dataset)",
                                spec.input
                            ),
                        ));
                    }
                    if !same(&domain, &spec.domain) {
                        return Err(err(
                            l,
                            &key("impute.spec"),
                            format!("{file}: domain {:?} is not the dataset's domain file", spec.domain),
                        ));
                    }
                    let estimator = x.estimator.unwrap_or(crate::impute::Estimator::Smooth);
                    if estimator == crate::impute::Estimator::GlobalSensitivity {
                        return Err(err(
                            l,
                            &key("impute.estimator"),
                            "global-sensitivity is an evaluation baseline (its bound uses a private count); use smooth or ignore-missing".into(),
                        ));
                    }
                    crate::impute::planned_records(&spec, estimator)
                        .map_err(|e| err(l, &key("impute.spec"), e.to_string()))?;
                    Step::Impute { name: x.name.clone(), spec: Box::new(spec), estimator, output: x.output.clone() }
                }
                RawStep::Evaluate(x) => {
                    if !names.contains(&x.synthetic) {
                        return Err(err(
                            l,
                            &key("evaluate.synthetic"),
                            format!("no earlier synthesize step named {:?}", x.synthetic),
                        ));
                    }
                    Step::Evaluate {
                        name: x.name.clone(),
                        synthetic: x.synthetic.clone(),
                        workload: x.workload.clone(),
                        private_output: resolve(base, &x.private_output),
                    }
                }
            };
            let outputs: Vec<(&str, String)> = match &step {
                Step::Sql { output, .. } | Step::Impute { output, .. } | Step::Analyze { output, .. } => {
                    vec![("output", output.clone())]
                }
                Step::Synthesize { output, model_output, mechanism, .. } => {
                    let mut v = vec![("output", output.clone())];
                    v.extend(model_output.iter().map(|m| ("model_output", m.clone())));
                    if *mechanism == crate::synth::run::Mechanism::NapsuMq {
                        // Its noisy statistics are published beside the sets.
                        v.push(("output", napsu_record_name(output)));
                    }
                    v
                }
                Step::Evaluate { .. } => vec![],
            };
            for (k, o) in &outputs {
                // Two outputs must not be one file, or a file and a directory above another.
                let clash = all_outputs.iter().find(|other: &&String| {
                    *other == o || o.starts_with(&format!("{other}/")) || other.starts_with(&format!("{o}/"))
                });
                let problem = output_name_problem(o).map(str::to_string).or_else(|| {
                    clash.map(|other| format!("it clashes with the output {other:?} of an earlier step or field"))
                });
                if let Some(why) = problem {
                    let kind = match &s.value {
                        RawStep::Sql(_) => "sql",
                        RawStep::Synthesize(_) => "synthesize",
                        RawStep::Impute(_) => "impute",
                        RawStep::Evaluate(_) => "evaluate",
                        RawStep::Analyze(_) => "analyze",
                    };
                    return Err(err(l, &key(&format!("{kind}.{k}")), format!("{o:?}: {why}")));
                }
                all_outputs.push(o.clone());
            }
            if !names.insert(step.name().to_string()) {
                return Err(err(l, &key("name"), format!("duplicate step name {:?}", step.name())));
            }
            steps.push(step);
        }
        if steps.is_empty() {
            return Err(err(None, "steps", "a pipeline needs at least one step".into()));
        }
        let create_ledger = match &raw.create_ledger_if_missing {
            None => None,
            Some(m) => Some(
                m.iter()
                    .map(|(k, v)| {
                        Ok((
                            k.clone(),
                            v.budget("create_ledger_if_missing")
                                .map_err(|e| err(None, &format!("create_ledger_if_missing.{k}"), e.to_string()))?,
                        ))
                    })
                    .collect::<Result<BTreeMap<_, _>, PipelineError>>()?,
            ),
        };
        let public_tables = raw
            .public_tables
            .iter()
            .map(|(k, v)| (k.clone(), (resolve(base, &v.location), resolve(base, &v.domain), v.format)))
            .collect();
        let _ = raw.description;
        Ok(Pipeline {
            name,
            path: path.to_path_buf(),
            sha256,
            schedule: raw.schedule.map(|s| s.value),
            timezone,
            ledger: PathBuf::from(resolve(base, &raw.ledger.value)),
            create_ledger,
            dataset: d.name.value.clone(),
            sources,
            format: d.format,
            domain,
            privacy_unit: d.privacy_unit.as_ref().map(|u| u.value.clone()).filter(|u| u != "row"),
            max_rows_per_unit: d.max_rows_per_unit,
            max_groups_per_unit: d.max_groups_per_unit,
            missingness,
            budget,
            output: if output.contains("://") { output } else { resolve(base, &output) },
            staging: raw.staging.map(|s| resolve(base, &s.value)),
            public_tables,
            steps,
            cluster,
            warnings,
        })
    }
}
