//! DP-SGD (Abadi et al. 2016, Alg 1; 000 §4.2 Lemma 4.6): Poisson
//! subsampling, per-example clipping, discrete Gaussian noise, and the
//! privacy charge as an RDP curve.
//!
//! **One step.** Every row enters the batch independently with probability
//! q (exact Bernoulli draws, [`poisson_sample`]). Each example's gradient is
//! clipped to L2 norm C, **rounded to the grid γ = 2^k** (k = ⌊log₂ C⌋ − 20)
//! and summed **exactly in integers**; discrete Gaussian noise
//! N_ℤ(0, (σ·Δ)²) is added to every coordinate of the integer sum, where
//! Δ = ⌈C/γ + √d/2⌉ bounds the L2 norm of one rounded example
//! (‖round(x)‖ ≤ ‖x‖ + √d/2). The bound is enforced, not assumed: the exact
//! integer norm of every rounded example is checked against Δ and the
//! example shrunk until it holds, so floating-point error in the clipping
//! cannot raise the sensitivity. The noisy sum times γ, divided by the
//! expected batch size, is the gradient estimate; the optimiser's update is
//! post-processing of it.
//!
//! **Privacy.** Adding or removing one row changes the integer sum by one
//! rounded example, an integer vector of norm ≤ Δ, only when that row is
//! sampled. One step is therefore the Poisson-subsampled discrete Gaussian
//! mechanism with noise multiplier σ, and T steps cost T times its RDP curve
//! ([`crate::privacy::rdp::sampled_discrete_gaussian_curve`]: Zhu & Wang 2019
//! Thm 6 with the discrete Gaussian's RDP, integer orders), composed
//! adaptively. The sum is exact, so no floating-point attack on the noise
//! applies (NOTES §2): outputs are integers times γ. The initial weights and
//! the sampling draw no data.
//!
//! **Cost.** A step costs one forward and one backward pass over the batch,
//! B·d multiplications for the per-example gradients (each example written
//! into one reused buffer, rounded and added, so memory is a few d-vectors
//! per core, not B·d) and d discrete Gaussian draws.

use ndarray::{Array1, Array2, ArrayView2, Axis};
use num_bigint::BigUint;
use rand::Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::mlp::{Mlp, softmax_cross_entropy};
use crate::privacy::rdp::{self, RdpError};
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::discrete::DiscreteGaussian;
use dpflow_udfs::noise::exact::{URational, bernoulli_ratio};

/// Rows per block of a batch's forward and backward passes (one task on a core).
pub const CHUNK: usize = 64;

/// DP-SGD settings, all public.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DpSgdConfig {
    /// Clipping norm C of one example's gradient.
    pub clip: f64,
    /// Noise multiplier σ: noise standard deviation over sensitivity.
    pub noise_multiplier: f64,
    /// Poisson sampling rate q.
    pub sampling_rate: f64,
    /// The batch size the noisy sum is divided by (q times a public or
    /// noisy row count).
    pub expected_batch: f64,
    /// Steps T.
    pub steps: u64,
    /// Adam's learning rate.
    pub learning_rate: f64,
}

/// DP-SGD settings that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DpSgdError {
    /// A setting out of range.
    #[error("DP-SGD setting {name} = {value} is out of range: {hint}")]
    Setting {
        /// Which setting.
        name: &'static str,
        /// Its value.
        value: f64,
        /// What to give instead.
        hint: &'static str,
    },
    /// The accountant refused the settings.
    #[error(transparent)]
    Accounting(#[from] RdpError),
}

impl DpSgdConfig {
    /// Checks every setting (public inputs, before anything is read).
    pub fn validate(&self) -> Result<(), DpSgdError> {
        let bad = |name, value, hint| Err(DpSgdError::Setting { name, value, hint });
        if !(1e-6..=1e6).contains(&self.clip) {
            return bad("clip", self.clip, "give a clipping norm between 1e-6 and 1e6 (1 is usual)");
        }
        if !(self.noise_multiplier > 0.0 && self.noise_multiplier.is_finite()) {
            return bad("noise_multiplier", self.noise_multiplier, "give σ > 0 or let the budget calibrate it");
        }
        if !(self.sampling_rate > 0.0 && self.sampling_rate <= 1.0) {
            return bad("sampling_rate", self.sampling_rate, "give q in (0, 1]: batch size over rows");
        }
        if !(self.expected_batch > 0.0 && self.expected_batch.is_finite()) {
            return bad("expected_batch", self.expected_batch, "give a positive batch size");
        }
        if self.steps == 0 {
            return bad("steps", 0.0, "train for at least one step");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad("learning_rate", self.learning_rate, "give a positive learning rate (1e-3 is usual for Adam)");
        }
        Ok(())
    }

    /// The RDP curve of the whole training run at `orders` (integer, ≥ 2).
    pub fn curve(&self, orders: &[f64]) -> Result<Vec<(f64, f64)>, DpSgdError> {
        self.validate()?;
        Ok(rdp::sampled_discrete_gaussian_curve(self.sampling_rate, self.noise_multiplier, self.steps, orders)?)
    }
}

/// Exact Bernoulli(q) for an f64 q in [0, 1]: q = m/2^e exactly, and a
/// uniform e-bit integer below m has probability exactly q.
pub fn bernoulli<R: Rng + ?Sized>(rng: &mut R, q: f64) -> bool {
    if q <= 0.0 {
        return false;
    }
    if q >= 1.0 {
        return true;
    }
    let bits = q.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    let (mant, e) =
        if exp == 0 { (bits & ((1 << 52) - 1), 1074) } else { ((bits & ((1 << 52) - 1)) | (1 << 52), 1075 - exp) };
    // q = mant · 2^−e with e ≥ 53 for q < 1.
    if e <= 128 {
        let u: u128 = ((rng.next_u64() as u128) << 64) | rng.next_u64() as u128;
        let u = if e == 128 { u } else { u & ((1u128 << e) - 1) };
        u < mant as u128
    } else {
        bernoulli_ratio(rng, &BigUint::from(mant), &(BigUint::from(1u8) << e as usize))
    }
}

/// The rows of a Poisson sample: each of `n` rows independently with
/// probability `q`, in increasing order.
pub fn poisson_sample<R: Rng + ?Sized>(rng: &mut R, n: usize, q: f64) -> Vec<usize> {
    (0..n).filter(|_| bernoulli(rng, q)).collect()
}

/// Clips, rounds and sums per-example gradients and adds the noise (module
/// docs). `grads` is examples × d; the result is the noisy sum on the
/// gradient scale (multiply by 1/expected batch for the estimate).
pub struct NoisySum {
    k: i32,
    delta_units: f64,
    sum: Vec<i64>,
    noise: DiscreteGaussian,
    clip: f64,
    /// One rounded example (reused, so adding allocates nothing).
    scratch: Vec<i64>,
}

impl NoisySum {
    /// An empty sum over `d` coordinates with clipping norm `clip` and noise
    /// multiplier `sigma`.
    pub fn new(d: usize, clip: f64, sigma: f64) -> Self {
        let k = clip.log2().floor() as i32 - 20;
        let delta_units = (clip / 2f64.powi(k) + (d as f64).sqrt() / 2.0).ceil();
        // σ² in grid units rounded *up* to an integer: never less noise, and
        // the exact sampler's arithmetic stays on small integers.
        let s2 = (sigma * delta_units).powi(2).next_up().ceil().max(1.0);
        let noise = DiscreteGaussian::new(URational::from_integer(BigUint::from(s2 as u128))).expect("σ² ≥ 1");
        Self { k, delta_units, sum: vec![0; d], noise, clip, scratch: Vec::new() }
    }

    /// Δ in grid units: the L2 bound of one rounded example.
    pub fn sensitivity_units(&self) -> f64 {
        self.delta_units
    }

    /// The grid exponent k (γ = 2^k).
    pub fn grid_exponent(&self) -> i32 {
        self.k
    }

    /// Adds each row of `grads`, clipped and rounded.
    pub fn add(&mut self, grads: ArrayView2<f64>) {
        assert_eq!(grads.ncols(), self.sum.len(), "gradient width");
        let mut row = vec![0.0; self.sum.len()];
        for g in grads.axis_iter(Axis(0)) {
            for (r, &v) in row.iter_mut().zip(g.iter()) {
                *r = v;
            }
            self.add_row(&row);
        }
    }

    /// Adds one example's gradient `g`, clipped to norm C, rounded to the
    /// grid, its exact integer norm checked against Δ (shrunk until it
    /// holds), and summed. A non-finite gradient contributes nothing (a
    /// data-independent rule).
    pub fn add_row(&mut self, g: &[f64]) {
        assert_eq!(g.len(), self.sum.len(), "gradient width");
        let norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
        if !norm.is_finite() {
            return;
        }
        let inv_g = 2f64.powi(-self.k);
        // Δ² in grid units; Δ ≤ C/γ + √d/2 with γ = 2^(⌊log₂ C⌋ − 20), so Δ²
        // fits a u64 for any d below 2^40.
        let bound2 = (self.delta_units as u64).saturating_mul(self.delta_units as u64);
        let mut scale = if norm > self.clip { self.clip / norm } else { 1.0 };
        let v = &mut self.scratch;
        v.resize(g.len(), 0);
        loop {
            let mult = scale * inv_g;
            let mut n2 = 0u64;
            for (vi, &gi) in v.iter_mut().zip(g) {
                *vi = round_small(gi * mult);
                n2 = n2.saturating_add(vi.unsigned_abs().saturating_mul(vi.unsigned_abs()));
            }
            if n2 <= bound2 {
                break;
            }
            scale *= 1.0 - 1e-6;
        }
        for (s, x) in self.sum.iter_mut().zip(v.iter()) {
            *s += x;
        }
    }

    /// The exact integer sum so far (tests).
    pub fn exact_units(&self) -> &[i64] {
        &self.sum
    }

    /// Adds another partial sum of the same shape (exact: integers).
    pub fn absorb(&mut self, other: &NoisySum) {
        for (s, o) in self.sum.iter_mut().zip(&other.sum) {
            *s += o;
        }
    }

    /// Adds the noise and returns the noisy sum on the gradient scale. The
    /// coordinates are drawn in blocks on all cores, each block from its own
    /// child of `rng` forked in block order (so a seeded run repeats).
    pub fn release(self, rng: &mut DpRng) -> Array1<f64> {
        let g = 2f64.powi(self.k);
        const BLOCK: usize = 2048;
        let mut children: Vec<DpRng> = (0..self.sum.len().div_ceil(BLOCK)).map(|_| rng.fork()).collect();
        let noise = &self.noise;
        let mut out = vec![0.0; self.sum.len()];
        out.par_chunks_mut(BLOCK).zip(self.sum.par_chunks(BLOCK)).zip(children.par_iter_mut()).for_each(
            |((o, s), r)| {
                for (oi, &si) in o.iter_mut().zip(s) {
                    *oi = (si as i128 + noise.sample(r)) as f64 * g;
                }
            },
        );
        Array1::from(out)
    }
}

/// Rounds to the nearest integer (ties to even). A clipped example's
/// coordinates are at most C/γ = 2^21 in grid units, far below 2^51, where
/// adding and removing 1.5·2^52 rounds exactly in the default rounding mode
/// and compiles to two additions (`f64::round` is a library call on baseline
/// x86-64). Larger magnitudes, which a clipped gradient never has, take
/// `round`. What matters for privacy is only that the rounded integers are
/// the ones whose norm is checked and summed.
#[inline]
fn round_small(x: f64) -> i64 {
    const MAGIC: f64 = 6_755_399_441_055_744.0; // 1.5 · 2^52
    if x.abs() < 2f64.powi(51) { ((x + MAGIC) - MAGIC) as i64 } else { x.round() as i64 }
}

/// Adam (Kingma & Ba 2015) on noisy gradients: post-processing.
#[derive(Debug, Clone)]
pub struct Adam {
    m: Array1<f64>,
    v: Array1<f64>,
    t: i32,
    lr: f64,
    betas: (f64, f64),
}

impl Adam {
    /// Adam state for `d` parameters, β = (0.9, 0.999).
    pub fn new(d: usize, lr: f64) -> Self {
        Self::with_betas(d, lr, (0.9, 0.999))
    }

    /// Adam with moment decays `betas` (WGAN-GP uses (0.5, 0.9)).
    pub fn with_betas(d: usize, lr: f64, betas: (f64, f64)) -> Self {
        Self { m: Array1::zeros(d), v: Array1::zeros(d), t: 0, lr, betas }
    }

    /// The update direction for gradient `g` (to be added to the parameters).
    pub fn step(&mut self, g: &Array1<f64>) -> Array1<f64> {
        let ((b1, b2), eps) = (self.betas, 1e-8);
        self.t += 1;
        self.m = &self.m * b1 + g * (1.0 - b1);
        self.v = &self.v * b2 + &(g * g) * (1.0 - b2);
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        let lr = self.lr;
        ndarray::Zip::from(&self.m).and(&self.v).map_collect(|&m, &v| -lr * (m / c1) / ((v / c2).sqrt() + eps))
    }
}

/// The exact clipped sum of a step's examples, built on all cores: `add`
/// adds one chunk's examples to a partial sum through [`NoisySum::add_row`],
/// writing each into `row`, a reused buffer of `d` coordinates. One partial
/// sum per worker, not per chunk (memory stays a few d-vectors whatever the
/// batch); integer sums add exactly, in any order. The noise is drawn by
/// [`NoisySum::release`].
pub fn par_noisy_sum<T: Sync>(
    chunks: &[T],
    d: usize,
    clip: f64,
    sigma: f64,
    add: impl Fn(&T, &mut NoisySum, &mut [f64]) + Sync,
) -> NoisySum {
    let empty = || NoisySum::new(d, clip, sigma);
    chunks
        .par_iter()
        .fold(
            || (empty(), vec![0.0; d]),
            |(mut part, mut row), chunk| {
                add(chunk, &mut part, &mut row);
                (part, row)
            },
        )
        .map(|(part, _)| part)
        .reduce(empty, |mut a, b| {
            a.absorb(&b);
            a
        })
}

/// One DP-SGD step's noisy gradient estimate for softmax cross-entropy on
/// the sampled rows `batch`, whose features and labels `batch_of` builds
/// (module docs).
pub fn noisy_classifier_gradient(
    model: &Mlp,
    batch: &[usize],
    batch_of: &(impl Fn(&[usize]) -> (Array2<f64>, Vec<usize>) + Sync),
    cfg: &DpSgdConfig,
    rng: &mut DpRng,
) -> Array1<f64> {
    let chunks: Vec<&[usize]> = batch.chunks(CHUNK).collect();
    let sum = par_noisy_sum(&chunks, model.n_params(), cfg.clip, cfg.noise_multiplier, |rows, part, row| {
        let (xb, yb) = batch_of(rows);
        let trace = model.forward(xb.view());
        let (_, dl) = softmax_cross_entropy(trace.output().view(), &yb);
        let back = model.backward(&trace, dl.view());
        for i in 0..rows.len() {
            model.example_gradient_into(&trace, &back, i, row);
            part.add_row(row);
        }
    });
    sum.release(rng) / cfg.expected_batch
}

/// Trains `model` as a classifier with DP-SGD for `cfg.steps` steps over
/// `rows` rows, of which `batch_of` builds the features and labels of any
/// subset (so no design matrix is held). The caller charges
/// [`DpSgdConfig::curve`] before calling; `progress` hears the step number
/// after each step (public).
pub fn train_classifier(
    model: &mut Mlp,
    rows: usize,
    batch_of: impl Fn(&[usize]) -> (Array2<f64>, Vec<usize>) + Sync,
    cfg: &DpSgdConfig,
    rng: &mut DpRng,
    mut progress: impl FnMut(u64),
) -> Result<(), DpSgdError> {
    cfg.validate()?;
    let mut adam = Adam::new(model.n_params(), cfg.learning_rate);
    for step in 1..=cfg.steps {
        let batch = poisson_sample(rng, rows, cfg.sampling_rate);
        let g = noisy_classifier_gradient(model, &batch, &batch_of, cfg, rng);
        let dir = adam.step(&g);
        model.add_scaled(dir.view(), 1.0);
        progress(step);
    }
    Ok(())
}

/// Rows × classes one-hot encoding helper for tests and callers.
pub fn one_hot(codes: &[usize], classes: usize) -> Array2<f64> {
    let mut m = Array2::zeros((codes.len(), classes));
    for (i, &c) in codes.iter().enumerate() {
        m[[i, c]] = 1.0;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neural::mlp::{Activation, unit};
    use crate::privacy::rdp::{calibrate_sampled_discrete_gaussian, epsilon, integer_orders};
    use dpflow_udfs::noise::DpRng;

    #[test]
    fn poisson_sampling_has_rate_q_and_bernoulli_is_exact_at_dyadic_rates() {
        let mut rng = DpRng::unsafe_seeded(1);
        let n = 200_000;
        for q in [0.01, 0.25, 1e-3] {
            let k = poisson_sample(&mut rng, n, q).len() as f64;
            let sd = (n as f64 * q * (1.0 - q)).sqrt();
            assert!((k - n as f64 * q).abs() < 4.0 * sd, "q={q}: {k}");
        }
        // Tiny rates take the big-integer path and still sample.
        let tiny = 2f64.powi(-100);
        assert!(!(0..1000).any(|_| bernoulli(&mut rng, tiny)));
        assert!(bernoulli(&mut rng, 1.0) && !bernoulli(&mut rng, 0.0));
    }

    #[test]
    fn one_rounded_example_never_exceeds_the_sensitivity() {
        // Neighbours differ by one rounded example: its exact integer norm is
        // at most Δ however large or oddly shaped the raw gradient is.
        let mut rng = DpRng::unsafe_seeded(2);
        for &(d, clip) in &[(7usize, 1.0), (1000, 0.37), (50, 1e-3), (3, 4.0)] {
            for _ in 0..50 {
                let scale = 10f64.powf(6.0 * unit(&mut rng) - 3.0);
                let g = Array2::from_shape_fn((1, d), |_| scale * (2.0 * unit(&mut rng) - 1.0));
                let mut s = NoisySum::new(d, clip, 1.0);
                s.add(g.view());
                let n2: f64 = s.exact_units().iter().map(|&x| (x as f64) * (x as f64)).sum();
                assert!(n2.sqrt() <= s.sensitivity_units(), "d={d} clip={clip}");
                // Small gradients pass unclipped (up to the grid).
                if g.iter().map(|x| x * x).sum::<f64>().sqrt() < clip {
                    let gamma = 2f64.powi(s.grid_exponent());
                    for (x, &u) in g.iter().zip(s.exact_units()) {
                        assert!((x - u as f64 * gamma).abs() <= gamma / 2.0);
                    }
                }
            }
        }
    }

    #[test]
    fn the_noise_has_the_stated_scale() {
        // Zero gradients: the released sum is pure noise with standard
        // deviation σ·Δ·γ per coordinate. 20 000 draws: the sample sd is
        // within 3% (its relative sd is 0.5%), the mean within 4 standard errors.
        let mut rng = DpRng::unsafe_seeded(3);
        let (d, clip, sigma) = (20_000, 1.0, 1.3);
        let s = NoisySum::new(d, clip, sigma);
        let expected = sigma * s.sensitivity_units() * 2f64.powi(s.grid_exponent());
        // Δ·γ is C plus the rounding slack √d·γ/2.
        assert!((s.sensitivity_units() * 2f64.powi(s.grid_exponent()) - clip).abs() < 1e-3);
        let out = s.release(&mut rng);
        let mean = out.mean().unwrap();
        let sd = out.std(0.0);
        assert!((sd / expected - 1.0).abs() < 0.03, "{sd} vs {expected}");
        assert!(mean.abs() < 4.0 * expected / (d as f64).sqrt(), "{mean}");
    }

    #[test]
    fn clipped_sum_equals_the_sum_of_clipped_examples() {
        let mut rng = DpRng::unsafe_seeded(4);
        let g = Array2::from_shape_fn((30, 12), |_| 3.0 * (2.0 * unit(&mut rng) - 1.0));
        let mut s = NoisySum::new(12, 1.0, 1.0);
        s.add(g.view());
        let gamma = 2f64.powi(s.grid_exponent());
        for j in 0..12 {
            let direct: f64 = g.axis_iter(Axis(0)).map(|r| r[j] * (1.0f64).min(1.0 / r.dot(&r).sqrt())).sum();
            assert!((s.exact_units()[j] as f64 * gamma - direct).abs() < 30.0 * gamma);
        }
    }

    #[test]
    fn dp_sgd_learns_a_separable_rule_at_a_generous_budget_and_spends_exactly_it() {
        // y = 1 iff x0 + x1 > 1 on the unit square. ε = 8, δ = 1e-6.
        let mut rng = DpRng::unsafe_seeded(5);
        let n = 4000;
        let x = Array2::from_shape_fn((n, 2), |_| unit(&mut rng));
        let y: Vec<usize> = x.axis_iter(Axis(0)).map(|r| usize::from(r[0] + r[1] > 1.0)).collect();
        let (q, steps) = (0.05, 300);
        let orders = integer_orders();
        let sigma = calibrate_sampled_discrete_gaussian(q, steps, 8.0, 1e-6, &orders).unwrap();
        let cfg = DpSgdConfig {
            clip: 1.0,
            noise_multiplier: sigma,
            sampling_rate: q,
            expected_batch: q * n as f64,
            steps,
            learning_rate: 0.02,
        };
        let spent = epsilon(&cfg.curve(&orders).unwrap(), 1e-6).0;
        assert!(spent <= 8.0 && spent > 8.0 * (1.0 - 1e-4), "{spent}");
        let mut model = Mlp::new(&[2, 16, 2], Activation::Relu, &mut rng);
        let mut seen = 0;
        let batch_of = |rows: &[usize]| (x.select(Axis(0), rows), rows.iter().map(|&r| y[r]).collect());
        train_classifier(&mut model, n, batch_of, &cfg, &mut rng, |s| seen = s).unwrap();
        assert_eq!(seen, steps);
        let p = model.predict(x.view());
        let correct = p.axis_iter(Axis(0)).zip(&y).filter(|(r, t)| usize::from(r[1] > r[0]) == **t).count();
        assert!(correct as f64 / n as f64 > 0.9, "accuracy {}", correct as f64 / n as f64);
    }

    #[test]
    fn settings_are_checked_with_what_to_change() {
        let ok = DpSgdConfig {
            clip: 1.0,
            noise_multiplier: 1.0,
            sampling_rate: 0.01,
            expected_batch: 10.0,
            steps: 10,
            learning_rate: 1e-3,
        };
        assert!(ok.validate().is_ok());
        let e = DpSgdConfig { sampling_rate: 0.0, ..ok }.validate().unwrap_err();
        assert!(e.to_string().contains("batch size over rows"), "{e}");
        assert!(DpSgdConfig { clip: f64::NAN, ..ok }.validate().is_err());
        assert!(DpSgdConfig { steps: 0, ..ok }.validate().is_err());
    }
}
