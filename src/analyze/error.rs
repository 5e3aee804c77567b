//! Errors of `dpflow analyze`. The inputs are released (public) synthetic
//! sets, so messages may name sets, columns, levels and counts; each says
//! what to change.

use datafusion::error::DataFusionError;

use crate::io::IoError;

/// Why an analysis failed.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The formula does not parse.
    #[error("formula `{formula}`: {problem}")]
    Formula {
        /// The formula as given.
        formula: String,
        /// What is wrong.
        problem: String,
    },
    /// The analysis spec (YAML or command line) is inconsistent.
    #[error("analysis spec: {0}")]
    Spec(String),
    /// The analysis spec file cannot be read or parsed.
    #[error("analysis spec {path}: {problem}")]
    SpecFile {
        /// The file.
        path: String,
        /// What is wrong (with line and column where the parser gives them).
        problem: String,
    },
    /// Opening a synthetic set.
    #[error(transparent)]
    Io(#[from] IoError),
    /// Reading a synthetic set.
    #[error("reading {set}: {source}")]
    Read {
        /// The set.
        set: String,
        /// DataFusion's error.
        source: DataFusionError,
    },
    /// A column the analysis needs is missing or has a type it cannot use.
    #[error("{set}: column `{column}` {problem}")]
    Column {
        /// The set.
        set: String,
        /// The column.
        column: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// An estimator cannot be computed on one set.
    #[error("{set}: {estimator}: {problem}")]
    Estimate {
        /// The set.
        set: String,
        /// The estimator (`ols`, `logistic`, …).
        estimator: String,
        /// What went wrong and what to change.
        problem: String,
    },
    /// The combining rule cannot be applied.
    #[error("combining {term}: {problem}")]
    Combine {
        /// The term (coefficient) being combined.
        term: String,
        /// What is wrong and what to change.
        problem: String,
    },
}
