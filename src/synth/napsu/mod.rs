//! NAPSU-MQ: noise-aware synthetic data from marginal queries (003 §4,
//! Alg. 1, App. C–E; `../shared/papers/NOTES.md` §6).
//!
//! The mechanism releases the chosen full marginals once with the Gaussian
//! mechanism; everything after is post-processing of those noisy
//! statistics: a maximum-entropy model in canonical parameters
//! ([`canonical`]), whose likelihood under the central limit theorem needs
//! the model's query mean and covariance ([`moments`]), a posterior over
//! its parameters, and m synthetic sets, each from its own posterior draw.
//!
//! The parts: the canonical parametrisation ([`canonical`]), the moments
//! μ(θ), Σ(θ) ([`moments`]; both checked against enumeration of the joint
//! distribution), the log-posterior with its exact gradient
//! ([`likelihood`], checked against finite differences), the Laplace
//! approximation ([`laplace`]: mode by Fisher scoring, L-BFGS with restarts as
//! the fallback, Hessian from the gradient), NUTS ([`nuts`]: `nuts-rs` chains on threads, rank-normalised
//! split-R̂ and ESS) on the exact posterior or on a fixed-covariance surrogate with a
//! cheap exact gradient ([`surrogate`]) whose draws importance weights
//! correct to the exact posterior ([`importance`]: Pareto k̂), the saved noisy statistics and the m posterior models
//! ([`release`]), and the run from data or from a saved record
//! ([`synthesize`]).

pub mod canonical;
pub mod importance;
pub mod laplace;
pub mod likelihood;
pub mod moments;
pub mod nuts;
pub mod packed;
pub mod record_float;
pub mod release;
pub mod surrogate;
pub mod synthesize;

pub use canonical::CanonicalFeatures;
pub use moments::MaxEnt;

/// Why NAPSU-MQ cannot run.
#[derive(Debug, thiserror::Error)]
pub enum NapsuError {
    /// The queries are malformed or too large.
    #[error("NAPSU-MQ queries: {0}")]
    Query(String),
    /// Inference met a numerical failure.
    #[error("NAPSU-MQ inference: {0}")]
    Numerical(String),
}
