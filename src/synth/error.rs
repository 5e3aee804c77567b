//! Errors of [`crate::synth`]: workloads, saved models, fits and runs.

use std::num::{ParseFloatError, ParseIntError};

use dpflow_udfs::domain::DomainError;
use dpflow_udfs::noise::ExpMechError;
use dpflow_udfs::noise::rng::getrandom_error;

use crate::dataset::DatasetError;
use crate::io::IoError;
use crate::measure::MeasureError;
use crate::pgm::PgmError;
use crate::privacy::{BudgetError, FailureError, LedgerError};

/// A synthesis failure.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A budget so small that the noise would leave the exact samplers' range.
    #[error(
        "the budget {budget} is too small to synthesize anything (its noise would be pure noise and beyond the \
         exact samplers' range): give ρ ≥ 1e-30 or ε ≥ 1e-15"
    )]
    BudgetTooSmall {
        /// The budget given.
        budget: String,
    },
    /// A domain's `not_applicable_when` rule (checked before anything is charged).
    #[error(transparent)]
    Rule(#[from] crate::domain::RuleError),
    /// `all-Kway` with a K that is not a number.
    #[error("bad workload {spec:?}: K of all-Kway must be a number")]
    WorkloadK {
        /// The workload spec.
        spec: String,
        /// Why.
        source: ParseIntError,
    },
    /// `all-Kway` with K out of range.
    #[error("workload {spec:?}: k must be between 1 and the number of columns ({columns})")]
    WorkloadKRange {
        /// The workload spec.
        spec: String,
        /// Columns of the domain.
        columns: usize,
    },
    /// `max-cells=` that is not a number.
    #[error("bad max-cells in {spec:?}")]
    MaxCells {
        /// The workload spec.
        spec: String,
        /// Why.
        source: ParseFloatError,
    },
    /// `seed=` that is not a number.
    #[error("bad seed in {spec:?}")]
    WorkloadSeed {
        /// The workload spec.
        spec: String,
        /// Why.
        source: ParseIntError,
    },
    /// `target` without a column.
    #[error("target workload needs a column: target:COL")]
    TargetColumnMissing,
    /// `target` on fewer than 3 columns.
    #[error("target workload needs at least 3 columns")]
    TargetTooFewColumns,
    /// A workload column that is not in the domain.
    #[error("workload {spec:?}: unknown column {column:?}")]
    WorkloadColumn {
        /// The workload spec.
        spec: String,
        /// The column.
        column: String,
    },
    /// A `marginals:` workload naming a column twice in one marginal.
    #[error("workload {spec:?}: a marginal names column {column:?} twice")]
    WorkloadRepeat {
        /// The workload spec.
        spec: String,
        /// The column.
        column: String,
    },
    /// A `marginals:` workload giving the same marginal twice.
    #[error("workload {spec:?}: the marginal {marginal:?} is given twice (in some order); list each once")]
    WorkloadDuplicate {
        /// The workload spec.
        spec: String,
        /// The marginal as written.
        marginal: String,
    },
    /// A workload file that cannot be read.
    #[error("reading workload file {path}")]
    ReadWorkload {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A workload file that is not a list of `{attrs, weight}`.
    #[error("{path}: not a workload list ([{{attrs: [..], weight: w}}, ...])")]
    ParseWorkload {
        /// The file.
        path: String,
        /// Why (with line and column).
        source: Box<serde_saphyr::Error>,
    },
    /// A workload file entry over an unknown column.
    #[error("{path}: entry {entry}: unknown column {column:?}")]
    WorkloadEntryColumn {
        /// The file.
        path: String,
        /// 0-based entry.
        entry: usize,
        /// The column.
        column: String,
    },
    /// A workload file entry without attributes or with a bad weight.
    #[error("{path}: entry {entry}: needs attributes and a non-negative weight")]
    WorkloadEntry {
        /// The file.
        path: String,
        /// 0-based entry.
        entry: usize,
    },
    /// An unknown workload spec.
    #[error(
        "unknown workload {0:?} (use all-Kway[:max-cells=N], target:COL, skewed[:seed=S], file:PATH or \
         marginals:a,b;b,c)"
    )]
    UnknownWorkload(String),
    /// A workload without marginals.
    #[error("workload {0:?} has no marginals (is max-cells too small?)")]
    EmptyWorkload(String),
    /// A saved model that cannot be read.
    #[error("reading model {path}")]
    ReadModel {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file that is not a dpflow model.
    #[error("{path}: not a dpflow model")]
    NotAModel {
        /// The file.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A model of another format version.
    #[error("{path}: unsupported model format {format:?} (this dpflow reads dpflow-model-v1)")]
    ModelFormat {
        /// The file.
        path: String,
        /// Its format tag.
        format: String,
    },
    /// A saved model whose domain is invalid.
    #[error("{path}: invalid domain in the model")]
    ModelDomain {
        /// The file.
        path: String,
        /// Why.
        source: DomainError,
    },
    /// A model that does not fit its domain or file.
    #[error(transparent)]
    Model(#[from] PgmError),
    /// An internal domain (compressed codes) that cannot be built.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// The synthetic-data generator cannot be set up.
    #[error("setting up synthetic data generation")]
    Generate {
        /// Why.
        source: datafusion::error::DataFusionError,
    },
    /// A zCDP synthesizer with a pure-ε budget.
    #[error(
        "synthesizers account in zCDP: give --epsilon with --delta, or --rho (a pure-ε budget cannot pay for Gaussian \
         noise)"
    )]
    NotZcdp,
    /// PrivBayes without a pure ε.
    #[error("privbayes needs a pure ε budget")]
    NeedsPureEpsilon,
    /// MWEM with nothing that fits the model capacity.
    #[error(
        "mwem: every workload marginal exceeds the model capacity; raise --max-model-size or use a smaller workload"
    )]
    NothingFits,
    /// A marginal the fit reads that was not computed (a bug).
    #[error("internal: marginal {0:?} was not precomputed")]
    NotPrecomputed(Vec<usize>),
    /// `impute-first:mode-stability` without its public bound.
    #[error(
        "impute-first:mode-stability needs --max-missing-cells M, a public bound on the number of missing cells \
         (000 Thm 4.3)"
    )]
    MissingCellBound,
    /// `--unsafe-seed` with a ledger.
    #[error("{}", crate::privacy::SEEDED_LEDGER_REFUSAL)]
    UnsafeSeed,
    /// A domain that DP reads refuse.
    #[error("refused: dataset {dataset}: {why}")]
    DpReadRefused {
        /// Dataset.
        dataset: String,
        /// Why, and what to set in the domain.
        why: String,
    },
    /// An invalid budget.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// A refused charge.
    #[error(transparent)]
    Charge(#[from] MeasureError),
    /// The exponential mechanism's inputs.
    #[error(transparent)]
    Selection(#[from] ExpMechError),
    /// Reading or counting the data.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The ledger.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Writing outputs.
    #[error(transparent)]
    Io(#[from] IoError),
    /// Writing the model.
    #[error("writing model {path}")]
    WriteModel {
        /// The location.
        path: String,
        /// Why.
        source: Box<IoError>,
    },
    /// Encoding a record.
    #[error("encoding {what}")]
    Json {
        /// The model or the release record.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// The OS random source.
    #[error(transparent)]
    Rng(#[from] getrandom_error::Error),
    /// The raw read of a MODIPS model went wrong after protected data was
    /// read (the cause is not reported: it could depend on the data).
    #[error("reading the numeric columns failed")]
    RawRead,
    /// A setting out of its range (checked before anything is charged).
    #[error("{name} must be {range}, not {value}: {what}")]
    Setting {
        /// The setting (`--impute-share`, `--confidence`, ...).
        name: &'static str,
        /// Its range.
        range: &'static str,
        /// The value given.
        value: f64,
        /// What it is.
        what: &'static str,
    },
    /// `--multiple` out of range.
    #[error("--multiple must be between 1 and 10000 (the number of synthetic sets to write)")]
    NoSets,
    /// A ledger dataset whose privacy unit is not a row.
    #[error(
        "dataset {dataset} counts people by the column {unit:?}, but synthesizers bound one row's influence; \
         synthesize from a table with one row per person, in a ledger dataset whose unit is row"
    )]
    PrivacyUnit {
        /// The ledger dataset.
        dataset: String,
        /// Its unit.
        unit: String,
    },
    /// A release id whose earlier run stopped after reserving.
    #[error(
        "release {release_id} has a reservation (charge #{charge}) left by an earlier run that stopped: that run may \
         have released, so it is not run again under the same charge. Settle it with `dpflow budget resolve` (as \
         failed: it stays spent) and run with a new --release-id"
    )]
    ResumedRelease {
        /// The release id.
        release_id: String,
        /// The charge.
        charge: i64,
    },
    /// napsu-mq with `--model-out`.
    #[error(
        "napsu-mq has no single model to save: its m sets come from m posterior draws, and the release record keeps \
         the noisy statistics they are drawn from (re-use them with --from-record); drop --model-out"
    )]
    NapsuModelOut,
    /// A domain with a column named like the set column.
    #[error("the domain has a column named _set, which numbers the sets of a --multiple run; rename that column")]
    SetColumnTaken,
    /// NAPSU-MQ's model, measurement or post-processing.
    #[error(transparent)]
    Napsu(#[from] super::napsu::NapsuError),
    /// Kamino/KaminoI refused a public input.
    #[error(transparent)]
    Kamino(#[from] super::kamino::KaminoError),
    /// Kamino/KaminoI with a budget that is not (ε, δ).
    #[error(
        "{0} accounts its DP-SGD runs as an RDP curve converted to (ε, δ), so it needs an (ε, δ) budget, not {1}: \
         give --epsilon and --delta"
    )]
    KaminoBudget(&'static str, String),
    /// Kamino/KaminoI with `--model-out`.
    #[error("{0} has no model file format yet (its classifiers are not a graphical model); drop --model-out")]
    KaminoModelOut(&'static str),
    /// A missing-data strategy that contradicts the mechanism.
    #[error(
        "{mechanism} fixes its own missing-data strategy ({implied}: kaminoi and dp-misgan learn from incomplete \
         rows, kamino and dp-gan from complete rows); drop --missing {given} or choose the other mechanism"
    )]
    KaminoMissing {
        /// The mechanism.
        mechanism: &'static str,
        /// The strategy it implies.
        implied: String,
        /// The strategy given.
        given: String,
    },
    /// A mechanism that trains on rows (Kamino, the GANs) through the marginal interface (SQL's `synthesize()`).
    #[error("{0} trains on rows, not marginals: run it with `dpflow synth --mechanism {0}` or a pipeline step")]
    KaminoRows(&'static str),
    /// A Kamino fit that failed after the data was read.
    #[error("the kamino fit failed after the data was read (the cause is not reported: it could depend on the data)")]
    KaminoFailed,
    /// DP-MisGAN/DP-GAN refused a public input.
    #[error(transparent)]
    Gan(#[from] super::gan::GanError),
    /// A GAN fit that failed after the data was read.
    #[error("the {0} fit failed after the data was read (the cause is not reported: it could depend on the data)")]
    GanFailed(&'static str),
    /// A DIPS synthesizer (002) refused its inputs.
    #[error(transparent)]
    Dips(#[from] super::dips::DipsError),
    /// NAPSU-MQ inference that failed after the statistics were released
    /// and saved: post-processing, so its cause is safe to show.
    #[error(
        "{source}\nthe release's noisy statistics are saved in {record}; nothing else was published. Re-run \
         inference with other settings for free: dpflow synth --from-record {record} --out PATH [--inference nuts] \
         [--max-features N]"
    )]
    NapsuInference {
        /// The release record holding the statistics.
        record: String,
        /// What failed.
        source: super::napsu::NapsuError,
    },
    /// A missing-data strategy NAPSU-MQ does not support.
    #[error(
        "napsu-mq models nulls as a value (--missing reproduce) or drops incomplete rows (--missing complete-row); \
         {0} is not supported"
    )]
    NapsuMissing(String),
    /// NAPSU-MQ without a place for its noisy statistics.
    #[error(
        "napsu-mq saves its noisy statistics in the release record before inference; give --record-out PATH (it \
         cannot be empty)"
    )]
    NapsuNeedsRecord,
    /// A record without NAPSU-MQ statistics given to `--from-record`.
    #[error(
        "{path}: not a napsu-mq release record (it has no noisy statistics); --from-record reads the record that dpflow synth --mechanism napsu-mq wrote"
    )]
    NotNapsuRecord {
        /// The file.
        path: String,
    },
    /// A release record that cannot be read.
    #[error("reading release record {path}")]
    ReadRecord {
        /// The location.
        path: String,
        /// Why.
        source: Box<IoError>,
    },
    /// A release record that is not JSON of the expected shape.
    #[error("{path}: not a dpflow synthesis release record")]
    NotARecord {
        /// The location.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A run that failed after reading protected data (charged, cause withheld).
    #[error(transparent)]
    Failed(#[from] FailureError),
}
