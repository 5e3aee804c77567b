//! Errors of private imputation: the spec file (each names the file and key),
//! the calibration that smooth-sensitivity noise refuses, and reading the
//! input. Reading errors can surface after protected data was read; callers
//! that release charge them as failures and drop their text
//! ([`crate::privacy::failure`]).

use datafusion::error::DataFusionError;

use crate::dataset::DatasetError;
use crate::domain::SpecError;
use crate::privacy::RawBudgetError;

/// Why an imputation spec is invalid, a release is refused, or a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ImputeError {
    /// The spec file cannot be read.
    #[error("reading {path}: {source}; check the path")]
    ReadSpec {
        /// The spec file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The spec file is not valid YAML for a spec (the message has line and column).
    #[error("{path}: {message}")]
    ParseSpec {
        /// The spec file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A key of the spec (or of a catalog's `impute:` block) is invalid.
    #[error("{path}: {key}: {problem}")]
    Spec {
        /// The file (or catalog table) the key is in.
        path: String,
        /// The key, e.g. `match.age` or `query q1`.
        key: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
    /// The spec's budget.
    #[error("{path}: {source}")]
    Budget {
        /// The spec file.
        path: String,
        /// What is wrong with it.
        source: RawBudgetError,
    },
    /// The domain file of the spec.
    #[error(transparent)]
    Domain(#[from] SpecError),
    /// The budget cannot pay for smooth-sensitivity noise (ρ, δ, or ε ≤ ln 2 per number).
    #[error("{0}")]
    Calibration(String),
    /// The domain's out-of-domain policy forbids DP reads.
    #[error("refused: {domain}: {why}")]
    TablePolicy {
        /// The domain file.
        domain: String,
        /// Why, and what to set instead.
        why: String,
    },
    /// A baseline estimator's ε is not a positive finite number.
    #[error("ε must be positive and finite, got {0}")]
    Epsilon(f64),
    /// Opening the input.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// Reading the input.
    #[error("reading the imputation input: {0}")]
    Read(#[from] DataFusionError),
    /// L1(D) over too many donee cells.
    #[error(transparent)]
    Knn(#[from] dpflow_udfs::knn::KnnError),
    /// A domain's `not_applicable_when` rule (checked when the domain loads; kept for domains built in code).
    #[error(transparent)]
    Rule(#[from] crate::domain::RuleError),
    /// A bug: the two aligned reads of the input disagree.
    #[error("internal: {0}; please report it")]
    Internal(&'static str),
}

impl From<datafusion::arrow::error::ArrowError> for ImputeError {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        ImputeError::Read(e.into())
    }
}

/// The result type of imputation.
pub type Result<T, E = ImputeError> = std::result::Result<T, E>;
