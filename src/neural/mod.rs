//! Small neural networks trained with DP-SGD (issue 18; 000 §4.2): dense
//! layers on `ndarray` with explicit per-example gradients ([`mlp`]), and the
//! DP-SGD step — Poisson sampling, per-example clipping, exact integer sums
//! and discrete Gaussian noise — whose cost is an RDP curve ([`dpsgd`],
//! accounted by [`crate::privacy::rdp`]).
//!
//! Why `ndarray` and hand-written backward passes rather than `candle` or
//! `burn`: DP-SGD needs per-example gradients, which for dense layers are
//! outer products of quantities a batched backward pass already has
//! (Goodfellow 2015); neither framework exposes them without a per-example
//! loop or vmap-style machinery, and both would add minutes to a clean build
//! for networks of a few thousand weights. `ndarray` is already a dependency
//! (`dpflow analyze`), so this adds no build time.

pub mod dpsgd;
pub mod mlp;
