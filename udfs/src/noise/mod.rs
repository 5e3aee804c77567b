//! Noise samplers for DP mechanisms: exact discrete Laplace and Gaussian
//! (CKS20), exact Bernoulli(exp(−γ)), an exact exponential mechanism, a
//! generalized Cauchy sampler with output snapping, and floating-point-safe
//! releases of real values. All randomness comes from [`DpRng`].

pub mod cauchy;
pub mod discrete;
pub mod exact;
pub mod exponential;
pub mod real;
pub mod rng;
pub mod testing;

pub use cauchy::GeneralizedCauchy;
pub use discrete::{DiscreteGaussian, DiscreteLaplace};
pub use exponential::{ExpMechError, ExponentialMechanism};
pub use real::{IntegerSampler, NoiseDistribution, noisy_integer, noisy_real};
pub use rng::DpRng;
