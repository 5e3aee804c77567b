//! Small neural networks trained with DP-SGD (issue 18; 000 §4.2): dense
//! layers on `ndarray` with explicit per-example gradients ([`mlp`]), and the
//! DP-SGD step — Poisson sampling, per-example clipping, exact integer sums
//! and discrete Gaussian noise — whose cost is an RDP curve ([`dpsgd`],
//! accounted by [`crate::privacy::rdp`]).
//!
//! Why `ndarray` and hand-written backward passes rather than `candle` or
//! `burn`: DP-SGD needs per-example gradients, which for dense layers are
//! outer products of quantities a batched backward pass already has
//! (Goodfellow 2015). candle 0.11 has no per-example gradients (no vmap, no
//! hooks): measured on the GAN critic, its best route is 5–11× slower than
//! this module, and it adds about 6 minutes and 136 crates to a clean build
//! (`benches/results/neural/README.md`). `ndarray` is already a dependency
//! (`dpflow analyze`), so this adds no build time.

pub mod dpsgd;
pub mod mlp;
