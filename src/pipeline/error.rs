//! Errors of [`crate::pipeline`]: a bad pipeline file (file, line, key), a
//! release that cannot be planned or run, and scheduler failures.

use std::path::PathBuf;

use crate::dataset::DatasetError;
use crate::domain::SpecError;
use crate::io::IoError;
use crate::privacy::{BudgetError, FailureError, LedgerError};

/// An error of a lower layer without a typed error of its own yet (the SQL
/// engine, imputation, evaluation, synthesis).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A pipeline failure.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The pipeline's cluster cannot be used (nothing was charged).
    #[error(transparent)]
    Cluster(#[from] dpflow_udfs::cluster::ClusterError),
    /// The pipeline file is invalid: file, line, key, message.
    #[error("{file}{}: {key}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Spec {
        /// File.
        file: String,
        /// 1-based line.
        line: Option<u32>,
        /// Key path.
        key: String,
        /// Message.
        message: String,
    },
    /// The dataset's domain file (it names the file, line and key).
    #[error(transparent)]
    Domain(#[from] SpecError),
    /// A public table cannot be opened.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The dataset's domain cannot be read for a DP release.
    #[error("{file}: dataset {dataset}: {why}")]
    DpReadRefused {
        /// Pipeline file.
        file: String,
        /// Dataset.
        dataset: String,
        /// Why, and what to set in the domain.
        why: String,
    },
    /// The SQL engine cannot be opened on the pipeline's tables.
    #[error("{file}: cannot open the pipeline's tables for DP SQL")]
    Tables {
        /// Pipeline file.
        file: String,
        /// Why.
        source: BoxError,
    },
    /// A step failed (planning or running).
    #[error("step {step}")]
    Step {
        /// Step name.
        step: String,
        /// Why.
        source: BoxError,
    },
    /// `impute-first:mode-stability` in a pipeline.
    #[error(
        "{file}: step {step}: impute-first:mode-stability needs a public bound on the missing cells, which pipelines \
         do not take yet; use impute-first:mode (DP modes) or adaptive"
    )]
    ModeStabilityUnsupported {
        /// Pipeline file.
        file: String,
        /// Step name.
        step: String,
    },
    /// A synthesizer budget without a zCDP form.
    #[error("step {step}: synthesize needs a zCDP-convertible budget ({{epsilon, delta}} or {{rho}})")]
    NotZcdp {
        /// Step name.
        step: String,
    },
    /// A `--target-ci` that names nothing, or cannot be met.
    #[error("--target-ci {target}: {why}")]
    Target {
        /// The target as given.
        target: String,
        /// Why, and what to name instead.
        why: String,
    },
    /// The steps cost more than the release budget.
    #[error("{file}: the steps cost more than the release budget {budget} (step {step}); lower the steps' budgets")]
    OverBudget {
        /// Pipeline file.
        file: String,
        /// The release budget.
        budget: String,
        /// The step that overflows it.
        step: String,
        /// By how much.
        source: BudgetError,
    },
    /// A release id that is not one safe path segment (it names staging
    /// and output directories, so `../` or `/` could leave their root).
    #[error(
        "release id {id:?} is not allowed: {why}; use letters, digits, '.', '-' and '_' (at most 128, not `.` or `..`)"
    )]
    BadReleaseId {
        /// The id as given.
        id: String,
        /// What is wrong.
        why: &'static str,
    },
    /// An output would be written through a symbolic link below its root
    /// (it could point anywhere), so nothing is written there.
    #[error(
        "{path} is a symbolic link below the release root {root}; outputs and staging are never written through \
         links (they could point outside the root): remove the link or point the pipeline's output at its target"
    )]
    SymlinkInRoot {
        /// The link.
        path: String,
        /// The root it is below.
        root: String,
    },
    /// An output or staging location that is not below its template's root.
    #[error("{path} is not below its root {root}; check the pipeline's output and staging templates")]
    OutsideRoot {
        /// The location.
        path: String,
        /// The root.
        root: String,
    },
    /// `--unsafe-seed` on a pipeline (which always charges its ledger).
    #[error("{}", crate::privacy::SEEDED_LEDGER_REFUSAL)]
    UnsafeSeed,
    /// The ledger.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Reading or writing outputs, staging or the manifest.
    #[error(transparent)]
    Io(#[from] IoError),
    /// Checking whether an object exists.
    #[error("checking whether {location} exists")]
    Exists {
        /// The object.
        location: String,
        /// Why.
        source: object_store::Error,
    },
    /// A napsu-mq step's inference failed after its noisy statistics were
    /// measured: the pipeline's charge is spent, nothing is published, and
    /// the statistics are kept for the curator. Post-processing of DP
    /// output, so the cause is safe to show.
    #[error(
        "step {step}: napsu-mq inference failed: {source}\nThe pipeline's charge is spent (recorded as failed) and \
         nothing was published, but the step's noisy statistics are kept beside the staging area (owner-only on local disk) in {record}. Re-run \
         inference from them for free: dpflow synth --from-record {record} --out PATH [--multiple M] \
         [--inference nuts] [--allow-unconverged] [--max-features N]; or change the step's inference settings and run the pipeline \
         under a new release id (a new charge)"
    )]
    NapsuInference {
        /// Step name.
        step: String,
        /// Where the statistics are (staging while the run is on; then where they were kept).
        record: String,
        /// What failed.
        source: crate::synth::napsu::NapsuError,
    },
    /// A release with a napsu-mq step found its reservation open (an earlier
    /// run was interrupted): resuming could measure again under the same
    /// charge, so it is settled as failed, and any statistics kept.
    #[error(
        "release {release} was interrupted before it finished, and it has a napsu-mq step: an interrupted \
         napsu-mq step may have measured (and saved) its noisy statistics, so resuming could spend ledger charge \
         #{charge} twice. The charge is recorded as failed (spent) and nothing was published; {kept}. Run \
         inference from kept statistics for free with dpflow synth --from-record FILE --out PATH [--multiple M] \
         [--inference nuts], or run the pipeline again (a new charge)"
    )]
    NapsuInterrupted {
        /// The release id.
        release: String,
        /// The charge, now failed.
        charge: i64,
        /// Where the statistics were kept, or that none were found.
        kept: String,
    },
    /// A run that failed after reading protected data (charged, cause withheld).
    #[error(transparent)]
    Failed(#[from] FailureError),
    /// The OS random source.
    #[error(transparent)]
    Rng(#[from] dpflow_udfs::noise::rng::getrandom_error::Error),
    /// A SQL step's answer cannot be written as CSV.
    #[error("step {step}: writing the answer as CSV")]
    Csv {
        /// Step name.
        step: String,
        /// Why.
        source: datafusion::arrow::error::ArrowError,
    },
    /// An evaluate step names no earlier synthesize step.
    #[error("step {step}: evaluate: unknown synthetic step {synthetic:?}")]
    UnknownSynthetic {
        /// Step name.
        step: String,
        /// The name it gives.
        synthetic: String,
    },
    /// A committed release whose staged outputs are gone.
    #[error(
        "release {release_id} is committed in the ledger but its staged outputs are missing; they cannot be \
         recomputed without spending again — investigate {staging}"
    )]
    StagedMissing {
        /// Release id.
        release_id: String,
        /// Staging prefix.
        staging: String,
        /// Why.
        source: Box<IoError>,
    },
    /// JSON records (step records, manifest, scheduler state).
    #[error("{action} {what}")]
    Json {
        /// "encoding", "decoding".
        action: &'static str,
        /// Which record.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The scheduler's state directory or files.
    #[error("{action} {}", path.display())]
    State {
        /// "creating the state directory", "writing", "opening the lock file".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another scheduler runs this pipeline.
    #[error(
        "another scheduler holds the lock {} of pipeline {pipeline} (its pid is in the file); stop it before \
         starting a new scheduler for this pipeline",
        path.display()
    )]
    Locked {
        /// Pipeline name.
        pipeline: String,
        /// The lock file.
        path: PathBuf,
    },
    /// A pipeline without `schedule:` given to the scheduler.
    #[error("pipeline {0} has no schedule; add a `schedule:` cron expression")]
    NoSchedule(String),
    /// A schedule that does not parse, or has no next run.
    #[error("pipeline {pipeline}: {problem} {schedule:?}")]
    Schedule {
        /// Pipeline name.
        pipeline: String,
        /// "bad schedule", "no next run for".
        problem: &'static str,
        /// The cron expression.
        schedule: String,
        /// Why.
        source: croner::errors::CronError,
    },
}

/// An error and its sources, joined by ": " (for logs and the state file).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |e| e.source()).map(|e| e.to_string()).collect::<Vec<_>>().join(": ")
}
