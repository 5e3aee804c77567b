//! The differentially private data synthesizers of Bowen & Liu (002): the
//! non-parametric ones (§3.1: Laplace sanitizer, perturbed and smoothed
//! histograms) and the parametric ones (§3.2: Multinomial–Dirichlet,
//! Binomial–Beta McClure–Reiter, MODIPS), each releasing m synthetic sets
//! that an analyst combines with 002 eqs. (9)–(11) (`dpflow analyze
//! --rule dips`, [`crate::analyze`]).
//!
//! - [`cells`]: the synthesizers over a table of K cells (categorical
//!   attributes, numeric ones binned by public edges), with their privacy
//!   proofs under dpflow's add/remove-one neighbours.
//! - [`normal`]: MODIPS for a bounded normal attribute (002 §4.2).
//! - [`glom`]: MODIPS with the general location model (002 §4.3.1).
//! - [`raw`]: `dpflow synth` for the normal and general location models
//!   (one streaming read of the raw numeric values).
//! - [`sequential`]: the sequential regression synthesizer (002 §3.2.3,
//!   §4.3.2) on the DP regressions of [`regression`].
//! - [`exact`]: the exact integer samplers the sampling-based mechanisms
//!   need.
//!
//! 002 keeps n public and states ε in terms of it; dpflow's neighbours
//! make n private. Where 002's n is the size of the synthetic set, the
//! mechanisms here take that size r as a public input; where it scales a
//! statistic, they either sanitize n or take a declared public n. Each
//! module says which, and why the guarantee holds for every n.

pub mod cells;
pub mod exact;
pub mod glom;
mod grid;
pub mod normal;
pub mod raw;
pub mod regression;
pub mod release;
pub mod sequential;

pub use cells::{CellMechanism, CellOptions, CellRelease, Generate};

/// Why a DIPS synthesizer cannot run (all checked before any charge,
/// except a refused charge itself).
#[derive(Debug, thiserror::Error)]
pub enum DipsError {
    /// ε is not a positive number.
    #[error("the privacy budget must be a positive ε, not {0}: give e.g. --epsilon 1")]
    Epsilon(f64),
    /// m = 0.
    #[error("a DIPS release needs at least one synthetic set: give --multiple 1 or more")]
    NoSets,
    /// r = 0.
    #[error(
        "the sampling synthesizers' ε depends on how many rows they draw, so the rows per set are a public input: \
         give --rows N"
    )]
    NoRows,
    /// An empty table.
    #[error("the table has no cells: give at least one attribute")]
    NoCells,
    /// A non-positive Dirichlet prior.
    #[error("the Dirichlet prior must be positive, not {0} (002 §4.1 uses 1/3)")]
    Prior(f64),
    /// ε/m below [`cells::MIN_EPSILON_PER_SET`].
    #[error(
        "ε = {epsilon} per set ({sets} sets) is below the smallest budget a DIPS set can be calibrated for \
         ({min}): spend more or write fewer sets"
    )]
    EpsilonPerSet {
        /// ε per set.
        epsilon: f64,
        /// m.
        sets: usize,
        /// The floor.
        min: f64,
    },
    /// ε/m above [`cells::MAX_EPSILON_PER_SET`] for a grid-based statistic.
    #[error("ε = {epsilon} per set is above the {max} the sanitized sums are calibrated for: spend less per set")]
    EpsilonTooLarge {
        /// ε per set.
        epsilon: f64,
        /// The cap.
        max: f64,
    },
    /// The pseudo-count times the cells is too large for the exact sampler.
    #[error(
        "ε = {epsilon} per set for {rows} rows over {cells} cells gives the pseudo-count α = {alpha}, too large for \
         the exact sampler: spend more per set, draw fewer rows or use fewer cells"
    )]
    PseudoCount {
        /// α.
        alpha: f64,
        /// ε per set.
        epsilon: f64,
        /// r.
        rows: u64,
        /// K.
        cells: usize,
    },
    /// Public bounds that are not an interval.
    #[error(
        "the bounds [{lo}, {hi}] of {column} are not an interval: give finite lo < hi, between 1e-100 and 1e150 apart"
    )]
    Bounds {
        /// The attribute.
        column: String,
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// A declared public n below 2.
    #[error("a declared public row count must be at least 2 (the variance needs n − 1 > 0), not {0}")]
    PublicRows(u64),
    /// A missing-data strategy the cell synthesizers do not take.
    #[error(
        "the 002 synthesizers count the full table with nulls as cells (--missing reproduce) or over complete rows \
         (--missing complete-row), not {0}"
    )]
    Missing(String),
    /// A table over [`release::MAX_CELLS`].
    #[error(
        "the full cross-tabulation has {cells:.0} cells, over the {max} a 002 synthesizer takes: use fewer columns \
         or coarser bins in the domain"
    )]
    TooManyCells {
        /// Cells of the table.
        cells: f64,
        /// The cap.
        max: usize,
    },
    /// Every set's table at once would not fit in memory.
    #[error(
        "{sets} sets of {cells} cells are more than {max} cells in all, which a run holds at once: write fewer \
         sets or use coarser bins"
    )]
    TooManyCellSets {
        /// K.
        cells: usize,
        /// m.
        sets: usize,
        /// The cap.
        max: usize,
    },
    /// `--model-out` with a mechanism that has no model file.
    #[error("{0} releases synthetic counts, not a model: drop --model-out")]
    ModelOut(&'static str),
    /// A non-positive ridge Λ.
    #[error(
        "a regression's ridge (prior precision) must be between 1e-6 and 1e12, not {0}: for the logistic \
         regressions the noise scale is proportional to 1/Λ and the shrinkage grows with Λ (try 1 to 10)"
    )]
    Ridge(f64),
    /// A categorical column with fewer than two levels.
    #[error("{column} has {levels} level(s): a regression target needs at least 2 (drop a constant column)")]
    Levels {
        /// The column.
        column: String,
        /// Its levels.
        levels: u32,
    },
    /// A regression with too many coefficients.
    #[error(
        "the regression of {column} on the columns before it has {parameters} coefficients, over the {max} the \
         solver takes: put {column} earlier in the order, or use fewer or coarser columns before it"
    )]
    TooManyParameters {
        /// The target column.
        column: String,
        /// Its coefficients.
        parameters: usize,
        /// The cap.
        max: usize,
    },
    /// Data with another number of columns than the spec.
    #[error("the data have {given} columns but the sequence names {expected}")]
    Columns {
        /// Columns given.
        given: usize,
        /// Columns in the spec.
        expected: usize,
    },
    /// A numeric column in the table form.
    #[error("sequential-regression over a table takes categorical columns; {0} is numeric: bin it in the domain")]
    NotCategorical(String),
    /// Data columns of different lengths.
    #[error("the data columns have different lengths: give one value per row in every column")]
    RaggedColumns,
    /// modips-normal on a domain that is not one numeric column.
    #[error(
        "modips-normal models one numeric (integer or float) column, but the domain has: {0}. Give a domain file \
         with just that column (for two numeric columns within categorical cells, use modips-glom)"
    )]
    NormalColumns(String),
    /// modips-glom on a domain without exactly two numeric columns.
    #[error(
        "modips-glom models exactly two numeric (integer or float) columns as a bivariate normal within the cells of \
         the categorical and boolean ones, but the domain's numeric columns are: {0}. Give a domain with two \
         (bin any other numeric column as a categorical one)"
    )]
    GlomColumns(String),
    /// A nullable numeric column under `--missing reproduce`.
    #[error(
        "{0} is nullable, but the normal models have no missing values: give --missing complete-row (rows with a \
         null are left out and the record says so), or declare {0} not nullable"
    )]
    NullableNumeric(String),
    /// A MODIPS model that reads raw values behind the model interface.
    #[error("{0} reads raw numeric values: run it with `dpflow synth` or a pipeline synthesize step")]
    RawValues(&'static str),
    /// The accountant refused a charge.
    #[error(transparent)]
    Charge(#[from] crate::measure::MeasureError),
}
