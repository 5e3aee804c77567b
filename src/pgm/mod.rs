//! The graphical-model engine behind AIM, MST, MWEM+PGM and PrivBayes+PGM
//! (001 §2.3; NOTES §3): factors, junction trees, exact belief propagation,
//! Private-PGM estimation from noisy marginals, and synthetic sampling.

pub mod estimate;
pub mod factor;
pub mod jtree;
pub mod model;
pub mod sample;
#[cfg(test)]
mod tests;

pub use estimate::{
    Estimate, EstimateOptions, Measurement, Norm, Query, Weighting, estimate, estimate_total, objective,
    objective_weighted,
};
pub use factor::Factor;
pub use jtree::{JunctionTree, hypothetical_size_mb};
pub use model::{Beliefs, GraphicalModel, MessageCache, ModelFile, PgmError, belief_propagation};
pub use sample::sampling_plan;
