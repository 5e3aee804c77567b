//! Exact discrete Laplace and discrete Gaussian samplers
//! (Canonne, Kamath, Steinke, *The Discrete Gaussian for Differential Privacy*,
//! NeurIPS 2020, Algorithms 2 and 3; NOTES §2).

use num_bigint::{BigInt, BigUint};
use num_traits::{One, Signed, Zero};
use rand::Rng;

use super::exact::{
    URational, bernoulli_exp_neg, bigint_to_i128_saturating, f64_to_urational, fair_bit, uniform_below,
};

/// Discrete Laplace with scale `b = t/s`: P(Y = y) ∝ exp(−|y|/b) on ℤ.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscreteLaplace {
    scale: URational,
}

impl DiscreteLaplace {
    /// A discrete Laplace with an exact rational scale (must be positive).
    pub fn new(scale: URational) -> Option<Self> {
        (!scale.is_zero()).then_some(Self { scale })
    }

    /// A discrete Laplace whose scale is the exact value of `scale` (> 0, finite).
    pub fn from_f64(scale: f64) -> Option<Self> {
        if scale <= 0.0 {
            return None;
        }
        Self::new(f64_to_urational(scale)?)
    }

    /// The scale b.
    pub fn scale(&self) -> &URational {
        &self.scale
    }

    /// One exact draw (CKS20 Algorithm 2).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        bigint_to_i128_saturating(&self.sample_big(rng))
    }

    /// One exact draw as a big integer.
    pub fn sample_big<R: Rng + ?Sized>(&self, rng: &mut R) -> BigInt {
        // scale = t/s
        sample_dlap(rng, self.scale.denom(), self.scale.numer())
    }
}

/// CKS20 Algorithm 2 with s, t positive integers: P(y) ∝ exp(−|y|·s/t).
fn sample_dlap<R: Rng + ?Sized>(rng: &mut R, s: &BigUint, t: &BigUint) -> BigInt {
    let one = BigUint::one();
    loop {
        let u = uniform_below(rng, t);
        if !bernoulli_exp_neg(rng, &u, t) {
            continue;
        }
        let mut v = BigUint::zero();
        while bernoulli_exp_neg(rng, &one, &one) {
            v += 1u32;
        }
        let x = u + t * v;
        let y = x / s;
        let negative = fair_bit(rng);
        if negative && y.is_zero() {
            continue;
        }
        let y = BigInt::from(y);
        return if negative { -y } else { y };
    }
}

/// Discrete Gaussian with variance parameter σ² (exact rational):
/// P(Y = y) ∝ exp(−y²/(2σ²)) on ℤ.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscreteGaussian {
    sigma2: URational,
    /// t = ⌊σ⌋ + 1, the discrete Laplace scale of the proposal.
    t: BigUint,
}

impl DiscreteGaussian {
    /// A discrete Gaussian with exact rational σ² > 0.
    pub fn new(sigma2: URational) -> Option<Self> {
        if sigma2.is_zero() {
            return None;
        }
        // ⌊√(p/q)⌋ = ⌊√⌊p/q⌋⌋.
        let t = sigma2.to_integer().sqrt() + 1u32;
        Some(Self { sigma2, t })
    }

    /// A discrete Gaussian with σ given as f64; σ² is rounded *up* to the next
    /// representable value so the noise is never smaller than requested.
    pub fn from_sigma(sigma: f64) -> Option<Self> {
        if !(sigma > 0.0 && sigma.is_finite()) {
            return None;
        }
        Self::new(f64_to_urational((sigma * sigma).next_up())?)
    }

    /// σ² as an exact rational.
    pub fn sigma2(&self) -> &URational {
        &self.sigma2
    }

    /// One exact draw (CKS20 Algorithm 3).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        bigint_to_i128_saturating(&self.sample_big(rng))
    }

    /// One exact draw as a big integer.
    pub fn sample_big<R: Rng + ?Sized>(&self, rng: &mut R) -> BigInt {
        let p = self.sigma2.numer();
        let q = self.sigma2.denom();
        let one = BigUint::one();
        let p_int = BigInt::from(p.clone());
        let qt = BigInt::from(q * &self.t);
        // Accept Y with probability exp(−(|Y| − σ²/t)² / (2σ²)); with σ² = p/q this
        // exponent is (|Y|·q·t − p)² / (2·p·q·t²).
        let den = (p * q * &self.t * &self.t) << 1usize;
        loop {
            let y = sample_dlap(rng, &one, &self.t);
            let diff = y.abs() * &qt - &p_int;
            let num = (&diff * &diff).magnitude().clone();
            if bernoulli_exp_neg(rng, &num, &den) {
                return y;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::DpRng;
    use crate::noise::testing::chi_square_test_integer;

    fn dlap_pmf(scale: f64) -> impl Fn(i64) -> f64 {
        let r = (-1.0 / scale).exp();
        move |y: i64| (1.0 - r) / (1.0 + r) * r.powi(y.unsigned_abs() as i32)
    }

    fn dgauss_pmf(sigma2: f64) -> impl Fn(i64) -> f64 {
        let norm: f64 = (-2000..=2000).map(|y: i64| (-(y * y) as f64 / (2.0 * sigma2)).exp()).sum();
        move |y: i64| (-(y * y) as f64 / (2.0 * sigma2)).exp() / norm
    }

    #[test]
    fn discrete_laplace_goodness_of_fit() {
        // Several scales, including a non-integer and a very small one.
        for (i, scale) in [0.3, 1.0, 2.5, 10.0].into_iter().enumerate() {
            let d = DiscreteLaplace::from_f64(scale).unwrap();
            let mut rng = DpRng::unsafe_seeded(100 + i as u64);
            let draws: Vec<i64> = (0..50_000).map(|_| d.sample(&mut rng) as i64).collect();
            chi_square_test_integer(&draws, dlap_pmf(scale), 1e-4);
        }
    }

    #[test]
    fn discrete_gaussian_goodness_of_fit() {
        // σ² non-integer, very small, and large.
        for (i, sigma2) in [0.05, 0.7, 2.0, 12.345, 400.0].into_iter().enumerate() {
            let d = DiscreteGaussian::new(f64_to_urational(sigma2).unwrap()).unwrap();
            let mut rng = DpRng::unsafe_seeded(200 + i as u64);
            let draws: Vec<i64> = (0..50_000).map(|_| d.sample(&mut rng) as i64).collect();
            chi_square_test_integer(&draws, dgauss_pmf(sigma2), 1e-4);
        }
    }

    #[test]
    fn huge_scale_does_not_overflow() {
        let d = DiscreteGaussian::from_sigma(1e15).unwrap();
        let mut rng = DpRng::unsafe_seeded(5);
        let v: Vec<i128> = (0..200).map(|_| d.sample(&mut rng)).collect();
        let sd = (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / 200.0).sqrt();
        assert!(sd > 0.7e15 && sd < 1.3e15, "{sd}");
        let l = DiscreteLaplace::from_f64(1e12).unwrap();
        let _ = l.sample(&mut rng);
    }
}

#[cfg(test)]
mod large_tests {
    //! 10^6-draw versions of the goodness-of-fit tests; run with
    //! `cargo test -p dpflow-udfs --release -- --ignored --nocapture`.
    use super::*;
    use crate::noise::DpRng;
    use crate::noise::testing::chi_square_test_integer;

    #[test]
    #[ignore]
    fn million_draw_goodness_of_fit() {
        for (i, scale) in [0.3, 1.0, 2.5, 10.0].into_iter().enumerate() {
            let d = DiscreteLaplace::from_f64(scale).unwrap();
            let mut rng = DpRng::unsafe_seeded(1000 + i as u64);
            let draws: Vec<i64> = (0..1_000_000).map(|_| d.sample(&mut rng) as i64).collect();
            let r = (-1.0 / scale).exp();
            let (stat, dof, p) =
                chi_square_test_integer(&draws, |y| (1.0 - r) / (1.0 + r) * r.powi(y.unsigned_abs() as i32), 1e-4);
            println!("discrete Laplace scale {scale}: chi2 {stat:.1} on {dof} dof, p = {p:.3}");
        }
        for (i, sigma2) in [0.05, 0.7, 2.0, 12.345, 400.0].into_iter().enumerate() {
            let d = DiscreteGaussian::new(f64_to_urational(sigma2).unwrap()).unwrap();
            let mut rng = DpRng::unsafe_seeded(2000 + i as u64);
            let draws: Vec<i64> = (0..1_000_000).map(|_| d.sample(&mut rng) as i64).collect();
            let norm: f64 = (-4000..=4000).map(|y: i64| (-(y * y) as f64 / (2.0 * sigma2)).exp()).sum();
            let (stat, dof, p) =
                chi_square_test_integer(&draws, |y| (-(y * y) as f64 / (2.0 * sigma2)).exp() / norm, 1e-4);
            println!("discrete Gaussian σ²={sigma2}: chi2 {stat:.1} on {dof} dof, p = {p:.3}");
        }
    }
}
