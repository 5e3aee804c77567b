//! Errors of [`crate::missing`]: strategies, missing rates, amplification and
//! the missingness simulator.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use dpflow_udfs::domain::EncodeError;

use crate::dataset::DatasetError;
use crate::io::IoError;

/// A missing-data failure.
#[derive(Debug, thiserror::Error)]
pub enum MissingError {
    /// An unknown `--missing` strategy.
    #[error(
        "unknown missing-data strategy {0:?}: use reproduce, complete-row, adaptive, or \
         impute-first:random|mode|model|mode-stability"
    )]
    UnknownStrategy(String),
    /// MAR or MNAR data: MCAR amplification does not hold.
    #[error(
        "no amplified ground-truth ε̄ is reported for {0} data: under MAR/MNAR whether a row is missing depends on \
         the data, so the MCAR amplification of 000 §5.2 does not hold (the release is still DP for the ground truth \
         at its nominal ε by 000 Thm 5.2)"
    )]
    NotMcar(&'static str),
    /// The missingness mechanism was not declared.
    #[error("no amplified ground-truth ε̄: declare the missingness mechanism (mcar) and public missing rates")]
    UndeclaredMissingness,
    /// A strategy that reads every row, so nothing is subsampled.
    #[error("no MCAR amplification: {0}, so missingness subsamples nothing")]
    NoSubsampling(&'static str),
    /// Column names that a measurement's label cannot be read back from.
    #[error(
        "column {0:?} has a comma or a parenthesis in its name, so the measurements' attributes cannot be told apart \
         for the amplification: rename it to report ε̄"
    )]
    AmbiguousName(String),
    /// A rate for a column that is not in the domain.
    #[error("missing rate given for unknown column {0:?}")]
    RateColumn(String),
    /// A rate outside [0, 1).
    #[error("missing rate of {column:?} must be in [0, 1), got {rate}")]
    RateRange {
        /// The column.
        column: String,
        /// The rate given.
        rate: f64,
    },
    /// A rates list entry that is not `COLUMN=RATE`.
    #[error("missing rates: expected COLUMN=RATE, got {0:?}")]
    RateSyntax(String),
    /// A rate that is not a number.
    #[error("missing rates: {0:?} is not a number")]
    RateNumber(String),
    /// Overlapping marginals where 000 Thm 5.6 needs disjoint ones.
    #[error("000 Thm 5.6 needs disjoint marginals, but {0} and {1} overlap")]
    Overlap(String, String),
    /// A column-wise learner with costs that do not pair with its order.
    #[error("column_wise: {attributes} attributes but {costs} costs")]
    CostCount {
        /// Attributes.
        attributes: usize,
        /// Costs.
        costs: usize,
    },
    /// `--rate` outside [0, 1).
    #[error("--rate must be in [0, 1), got {0}")]
    InjectRate(f64),
    /// `--columns` names a column that is not in the domain.
    #[error("--columns: unknown column {0:?}")]
    InjectColumn(String),
    /// MAR/MNAR on one column.
    #[error("MAR/MNAR need at least two columns (inputs and masked)")]
    TooFewColumns,
    /// MAR/MNAR with every column masked.
    #[error("MAR/MNAR need at least one input column that is not masked")]
    NoInputColumn,
    /// Opening the dataset.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// Reading the dataset.
    #[error("reading {location}")]
    Read {
        /// The input.
        location: String,
        /// Why.
        source: DataFusionError,
    },
    /// Encoding the data through its domain.
    #[error("encoding {location} through its domain")]
    Encode {
        /// The input.
        location: String,
        /// Why.
        source: EncodeError,
    },
    /// Building the output batch.
    #[error("building the output with injected nulls")]
    Output(#[from] ArrowError),
    /// Writing the output.
    #[error(transparent)]
    Io(#[from] IoError),
}
