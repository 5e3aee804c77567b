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
//! Built so far: the canonical parametrisation, the moments μ(θ), Σ(θ)
//! (both checked against enumeration of the joint distribution) and the
//! log-posterior with its exact gradient ([`likelihood`], checked against
//! finite differences), the Laplace approximation ([`laplace`]: L-BFGS
//! mode with restarts, Hessian from the gradient) and NUTS ([`nuts`]:
//! `nuts-rs` chains on threads, split-R̂ and ESS). The measurement, the
//! synthesizer with multiple synthesis, its release record and the
//! command-line and pipeline options are the next steps (issue 16).

pub mod canonical;
pub mod laplace;
pub mod likelihood;
pub mod moments;
pub mod nuts;

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
