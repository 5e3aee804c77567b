//! Errors of curator-side evaluation (`inspect`, `eval`, the ML score).
//! These tools read the private data and print exact statistics for the
//! curator only; their errors name the input and what to fix.

use datafusion::error::DataFusionError;

use crate::dataset::DatasetError;
use crate::domain::{EncodeError, SpecError};
use crate::io::IoError;

/// Why an evaluation or inspection failed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The domain file.
    #[error(transparent)]
    Domain(#[from] SpecError),
    /// Opening the input.
    #[error(transparent)]
    Io(#[from] IoError),
    /// Opening or counting a dataset.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// Reading the input.
    #[error("reading {input}: {source}")]
    Read {
        /// The input.
        input: String,
        /// DataFusion's error.
        source: DataFusionError,
    },
    /// The input does not fit its domain (a type or column mismatch).
    #[error("{input}: {source}")]
    Encode {
        /// The input.
        input: String,
        /// What does not fit.
        source: EncodeError,
    },
    /// `--ml-target` is not usable.
    #[error("--ml-target {target:?}: {problem}")]
    MlTarget {
        /// The column given.
        target: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The ML models (smartcore) failed.
    #[error("the {model} model: {message}")]
    Model {
        /// Which model.
        model: &'static str,
        /// smartcore's message.
        message: String,
    },
    /// The workload or the exact answers (synth's error).
    #[error(transparent)]
    Synth(#[from] crate::synth::SynthError),
}

/// The result type of evaluation.
pub type Result<T, E = EvalError> = std::result::Result<T, E>;
