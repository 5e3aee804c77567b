//! Floating-point-safe noise for integer- and real-valued answers (NOTES §2).
//!
//! Integers get exact discrete Laplace / discrete Gaussian noise directly.
//! A real value x is first rounded to the grid g·ℤ with g = 2^k, the noise is an
//! exact integer multiple of g, and the result is (round(x/g) + Z)·g: the set
//! of possible outputs is the grid, whatever the low-order bits of x, so the
//! floating-point attack on `x + float_noise` (Mironov 2012) does not apply.
//! Rounding can move a neighbour's answer by up to g more, so the integer noise
//! is calibrated to the inflated sensitivity ⌈Δ/g⌉ + 1 (in grid units): the
//! privacy loss is exactly the one requested, the noise at most (1 + 2⁻¹⁹)×.

use num_bigint::BigInt;
use num_rational::Ratio;
use num_traits::{One, ToPrimitive};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::discrete::{DiscreteGaussian, DiscreteLaplace};
use super::exact::{bigint_to_i128_saturating, f64_to_rational};

/// A noise distribution on the answer scale.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "distribution", rename_all = "snake_case")]
pub enum NoiseDistribution {
    /// (Discrete) Laplace with scale b.
    Laplace {
        /// Scale b (the standard deviation is b·√2).
        scale: f64,
    },
    /// (Discrete) Gaussian with standard deviation parameter σ.
    Gaussian {
        /// σ.
        sigma: f64,
    },
}

/// The largest noise scale (Laplace b or Gaussian σ, in integer units) a
/// release may use: 2⁹⁶. A draw from a larger scale can pass 2¹²⁷, where the
/// exact samplers clamp it to i128's range, and a clamped draw plus the
/// exact answer depends on the answer without noise (a review found
/// `rho => 1e-200` telling an empty cell from a full one). Planners refuse
/// such a scale before any charge ([`NoiseDistribution::scale_refusal`]);
/// below the cap a draw reaches 2¹²⁷ with probability below e^(−2³⁰), and
/// answer plus noise stays far inside i128. (Grid units are small: a sum of
/// squares uses up to 2⁴³ units per row, so real scales reach 2⁶⁰.)
pub const MAX_NOISE_SCALE: f64 = 79_228_162_514_264_337_593_543_950_336.0; // 2^96

impl NoiseDistribution {
    /// Why this noise may not be used for a release (a scale that is not
    /// positive and finite, or above [`MAX_NOISE_SCALE`]): a public check,
    /// made when a release is planned.
    pub fn scale_refusal(&self) -> Option<String> {
        let (name, s) = match *self {
            NoiseDistribution::Laplace { scale } => ("Laplace scale", scale),
            NoiseDistribution::Gaussian { sigma } => ("Gaussian σ", sigma),
        };
        if !(s > 0.0 && s.is_finite()) {
            return Some(format!("the {name} {s} is not a positive finite number"));
        }
        (s > MAX_NOISE_SCALE).then(|| {
            format!(
                "the budget is too small: it needs a {name} of {s:e} (integer units), above the largest the exact \
                 samplers take (2^96 ≈ 7.9e28), which would release noise and nothing else; give a larger budget"
            )
        })
    }

    /// Standard deviation of the noise (continuous approximation).
    pub fn std_dev(&self) -> f64 {
        match *self {
            NoiseDistribution::Laplace { scale } => scale * std::f64::consts::SQRT_2,
            NoiseDistribution::Gaussian { sigma } => sigma,
        }
    }

    /// Half-width of a two-sided confidence interval at `level` (e.g. 0.95)
    /// for one noisy answer.
    pub fn ci_half_width(&self, level: f64) -> f64 {
        let alpha = 1.0 - level;
        match *self {
            // P(|L| > t) = exp(−t/b).
            NoiseDistribution::Laplace { scale } => -scale * alpha.ln(),
            NoiseDistribution::Gaussian { sigma } => sigma * crate::calibrate::normal_quantile(1.0 - alpha / 2.0),
        }
    }

    /// [`NoiseDistribution::ci_half_width`] rounded up to a whole number of
    /// units: the interval for one answer with *integer* noise of this
    /// scale (the exact samplers' noise), which covers at least `level`.
    /// The continuous half-width h undercovers integer noise when the
    /// fraction of h is lost (|X| ≤ h means |X| ≤ ⌊h⌋; e.g. σ = 1 covers
    /// 0.88, not 0.95). With m = ⌈h⌉: discrete Laplace (q = e^{−1/b}) has
    /// P(|X| > m) = 2q^{m+1}/(1 + q) ≤ q^m ≤ α since m ≥ b·ln(1/α); the
    /// discrete Gaussian's tail is at most the normal one shifted by one
    /// unit (CKS20), P(|X| > m) ≤ P(|N| ≥ m) ≤ α since m ≥ z·σ. Test
    /// `integer_half_widths_cover_their_level`.
    pub fn integer_ci_half_width(&self, level: f64) -> f64 {
        self.ci_half_width(level).ceil()
    }

    fn scaled(&self, factor: f64) -> Self {
        match *self {
            NoiseDistribution::Laplace { scale } => NoiseDistribution::Laplace { scale: scale * factor },
            NoiseDistribution::Gaussian { sigma } => NoiseDistribution::Gaussian { sigma: sigma * factor },
        }
    }

    /// One exact integer draw with this scale (in integer units).
    pub fn sample_integer<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        self.integer_sampler().sample(rng)
    }

    /// A reusable exact integer sampler (avoids re-deriving rationals per draw).
    pub fn integer_sampler(&self) -> IntegerSampler {
        match *self {
            NoiseDistribution::Laplace { scale } => {
                IntegerSampler::Laplace(DiscreteLaplace::from_f64(scale).expect("positive finite Laplace scale"))
            }
            NoiseDistribution::Gaussian { sigma } => {
                IntegerSampler::Gaussian(DiscreteGaussian::from_sigma(sigma).expect("positive finite sigma"))
            }
        }
    }
}

/// A prepared exact integer noise sampler.
#[derive(Debug, Clone)]
pub enum IntegerSampler {
    /// Discrete Laplace.
    Laplace(DiscreteLaplace),
    /// Discrete Gaussian.
    Gaussian(DiscreteGaussian),
}

impl IntegerSampler {
    /// One exact draw.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        match self {
            IntegerSampler::Laplace(d) => d.sample(rng),
            IntegerSampler::Gaussian(d) => d.sample(rng),
        }
    }
}

/// Adds exact integer noise to an integer answer (sensitivity is already in
/// the noise scale; counts have integer sensitivity).
pub fn noisy_integer<R: Rng + ?Sized>(rng: &mut R, value: i128, noise: &NoiseDistribution) -> i128 {
    value.saturating_add(noise.sample_integer(rng))
}

/// The grid exponent k (g = 2^k) used for a real-valued release: 2^k ≤
/// min(scale, Δ)·2⁻²⁰.
pub fn grid_exponent(noise: &NoiseDistribution, sensitivity: f64) -> i32 {
    let s = match *noise {
        NoiseDistribution::Laplace { scale } => scale,
        NoiseDistribution::Gaussian { sigma } => sigma,
    };
    (s.min(sensitivity).log2().floor() as i32) - 20
}

/// Releases a real-valued answer `value` with L1 (Laplace) or L2 (Gaussian)
/// sensitivity `sensitivity` and noise `noise`, floating-point safely (module
/// docs). Returns the released value, an exact multiple of 2^k.
pub fn noisy_real<R: Rng + ?Sized>(rng: &mut R, value: f64, sensitivity: f64, noise: &NoiseDistribution) -> f64 {
    assert!(sensitivity > 0.0 && sensitivity.is_finite(), "sensitivity must be positive");
    let k = grid_exponent(noise, sensitivity);
    let g = Ratio::from_integer(BigInt::one()) * pow2(k);
    let x = match f64_to_rational(value) {
        Some(x) => x,
        // ±inf/NaN answers cannot occur for clamped queries; clamp defensively.
        None => return f64::NAN,
    };
    let xi = (x / &g).round().to_integer();
    // Noise in grid units with inflated sensitivity ⌈Δ/g⌉ + 1.
    let delta_units = (sensitivity / 2f64.powi(k)).ceil() + 1.0;
    let unit_noise = noise.scaled(delta_units / sensitivity);
    let z = BigInt::from(unit_noise.sample_integer(rng));
    let y = xi + z;
    let yi = bigint_to_i128_saturating(&y);
    (yi as f64) * 2f64.powi(k)
}

fn pow2(k: i32) -> Ratio<BigInt> {
    if k >= 0 {
        Ratio::from_integer(BigInt::one() << (k as usize))
    } else {
        Ratio::new(BigInt::one(), BigInt::one() << ((-k) as usize))
    }
}

/// The integer grid value round(x / 2^k) (exact, half away from zero,
/// saturating; 0 for a non-finite x), for pre-rounding summands.
///
/// For |k| ≤ 1000 it is computed in floats, with the same result as the
/// exact rational computation (`to_grid_units_exact`; test
/// `float_grid_units_equal_the_exact_ones`): multiplying by 2^−k only moves
/// the exponent, so x·2^−k is exact whenever it is a normal number; when it
/// is subnormal or underflows, |x/2^k| < 2^−1022 and both round to 0; on
/// overflow both saturate; `f64::round` and `Ratio::round` both round half
/// away from zero. This is the per-row cost of every grid sum (it was
/// ~100× slower with big rationals).
pub fn to_grid_units(x: f64, k: i32) -> i128 {
    if !x.is_finite() {
        return 0;
    }
    if (-1000..=1000).contains(&k) {
        // 2^−k, built from its exponent bits (a normal number for |k| ≤ 1000).
        let scale = f64::from_bits(((1023 - k) as u64) << 52);
        return (x * scale).round() as i128;
    }
    to_grid_units_exact(x, k)
}

/// [`to_grid_units`] in exact rational arithmetic.
fn to_grid_units_exact(x: f64, k: i32) -> i128 {
    match f64_to_rational(x) {
        Some(x) => bigint_to_i128_saturating(&(x / pow2(k)).round().to_integer()),
        None => 0,
    }
}

/// Inverse of [`to_grid_units`].
pub fn from_grid_units(v: i128, k: i32) -> f64 {
    v.to_f64().unwrap_or(f64::NAN) * 2f64.powi(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::DpRng;

    /// Exact coverage of the whole-number half-widths, at small scales where
    /// the continuous ones fall short (σ = 1 at 95%: 0.883): discrete
    /// Laplace in closed form, 1 − 2q^{m+1}/(1 + q); the discrete Gaussian
    /// by summing its weights over ±60σ.
    #[test]
    fn integer_half_widths_cover_their_level() {
        let gaussian_coverage = |sigma: f64, m: f64| {
            let w = |x: f64| (-x * x / (2.0 * sigma * sigma)).exp();
            let r = (60.0 * sigma).ceil() as i64 + 2;
            let total: f64 = (-r..=r).map(|x| w(x as f64)).sum();
            (-r..=r).filter(|&x| (x as f64).abs() <= m).map(|x| w(x as f64)).sum::<f64>() / total
        };
        let laplace_coverage = |b: f64, m: f64| {
            let q = (-1.0 / b).exp();
            1.0 - 2.0 * q.powf(m + 1.0) / (1.0 + q)
        };
        for level in [0.8, 0.9, 0.95, 0.99, 0.999] {
            for s in [0.3, 0.5, 1.0, 1.7, 2.0, 3.7, 10.0, 41.3] {
                let g = NoiseDistribution::Gaussian { sigma: s };
                let c = gaussian_coverage(s, g.integer_ci_half_width(level));
                assert!(c >= level, "gaussian σ = {s} at {level}: {c}");
                let l = NoiseDistribution::Laplace { scale: s };
                let c = laplace_coverage(s, l.integer_ci_half_width(level));
                assert!(c >= level, "laplace b = {s} at {level}: {c}");
            }
        }
        // The continuous half-width undercovers integer noise.
        let g = NoiseDistribution::Gaussian { sigma: 1.0 };
        assert!(gaussian_coverage(1.0, g.ci_half_width(0.95).floor()) < 0.89);
    }

    /// The float path of `to_grid_units` equals the exact rational one on
    /// random bit patterns (every exponent, signs, NaN, ∞), on exact
    /// half-way cases (m + ½)·2^k, on values at the i128 boundary, and at
    /// the ends of the float path's k range.
    #[test]
    fn float_grid_units_equal_the_exact_ones() {
        use rand::RngExt;
        let mut rng = DpRng::unsafe_seeded(11);
        let check = |x: f64, k: i32| assert_eq!(to_grid_units(x, k), to_grid_units_exact(x, k), "x = {x:e}, k = {k}");
        for _ in 0..200_000 {
            let x = f64::from_bits(rng.random::<u64>());
            let k = rng.random_range(-1000..=1000);
            check(x, k);
            // Near the grid: x/2^k of moderate size, either sign.
            let (e, k) = (rng.random_range(-60..=130), k.clamp(-900, 900));
            let sign = if rng.random::<bool>() { -1.0 } else { 1.0 };
            check(sign * rng.random::<f64>() * 2f64.powi(e) * 2f64.powi(k), k);
        }
        for _ in 0..50_000 {
            let k = rng.random_range(-900..=900);
            let m = rng.random_range(-(1i64 << 52)..(1i64 << 52)) as f64;
            check((m + 0.5) * 2f64.powi(k), k);
            check((m + 0.5).next_up() * 2f64.powi(k), k);
            check((m + 0.5).next_down() * 2f64.powi(k), k);
        }
        // Beyond ±1000 the exact path runs (2^−k is no longer a normal float
        // near ±1023): covered too, should the fast range ever be widened.
        for k in [-1100, -1074, -1023, -1022, -1001, -1000, -999, -1, 0, 1, 999, 1000, 1001, 1022, 1023, 1074, 1100] {
            for x in [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, f64::MIN_POSITIVE, 5e-324, f64::MAX, f64::MIN] {
                check(x * 2f64.powi(k.clamp(-1000, 1000)), k);
                check(x, k);
            }
            for e in [126, 127, 128] {
                for x in [2f64.powi(e), -2f64.powi(e), 2f64.powi(e).next_down(), -2f64.powi(e).next_up()] {
                    check(x * 2f64.powi(k.clamp(-800, 800)), k.clamp(-800, 800));
                }
            }
            check(f64::NAN, k);
            check(f64::INFINITY, k);
            check(f64::NEG_INFINITY, k);
        }
    }

    #[test]
    fn real_release_lands_on_grid_and_has_right_spread() {
        let noise = NoiseDistribution::Laplace { scale: 2.0 };
        let k = grid_exponent(&noise, 1.0);
        let mut rng = DpRng::unsafe_seeded(8);
        let n = 20_000;
        let mut sum2 = 0.0;
        for _ in 0..n {
            let v = noisy_real(&mut rng, 10.123456789, 1.0, &noise);
            let units = v / 2f64.powi(k);
            assert_eq!(units, units.round());
            sum2 += (v - 10.123456789).powi(2);
        }
        let var = sum2 / n as f64;
        // Laplace(2) has variance 8.
        assert!((var - 8.0).abs() < 0.5, "{var}");
    }

    #[test]
    fn ci_half_width_laplace_and_gauss() {
        let l = NoiseDistribution::Laplace { scale: 1.0 };
        assert!((l.ci_half_width(0.95) - 20f64.ln()).abs() < 1e-12);
        let g = NoiseDistribution::Gaussian { sigma: 1.0 };
        assert!((g.ci_half_width(0.95) - 1.959964).abs() < 1e-5);
    }
}
