//! Generalized Cauchy noise for smooth-sensitivity mechanisms
//! (004 Def 3.7, Thm 3.8, Cor 3.9; NOTES §2).
//!
//! Density h(x) ∝ 1/(1 + |x|^γ), γ > 1. |X|^γ has the Beta-prime(1/γ, 1 − 1/γ)
//! law, so X = S·(G₁/G₂)^{1/γ} with G₁ ~ Gamma(1/γ), G₂ ~ Gamma(1 − 1/γ), S a
//! fair sign.
//!
//! Calibration facts (proofs next to the functions): sliding the argument by
//! μ changes ln h by at most |μ|·[`log_density_lipschitz`]`(γ)`, and dilating
//! it by e^λ (with the Jacobian) changes the log density by at most
//! [`dilation_cost`]`(γ)`·|λ|. `dpflow::impute::smooth_calibration` turns them
//! into (α, γ) for a ln 2-smooth bound.
//!
//! No exact (integer-arithmetic) sampler is known for this law. We sample it in
//! `f64` and never release `x + noise` raw: [`snap`] rounds the noisy value to a
//! power-of-two grid far coarser than the floating-point spacing of the inputs,
//! so the set of possible outputs no longer depends on the low-order bits of the
//! private value (the attack of Mironov 2012). **The grid must be a public
//! quantity** (a function of the statistic's public range, never of the data or
//! of a data-dependent noise scale such as a smooth bound S(D)): otherwise the
//! lattice of possible outputs itself reveals S(D) (issue 14 §2). Residual
//! caveat: the draw and the sum `q + scale·x` are computed in floating point, so
//! the released law differs from the ideal continuous mechanism by rounding
//! errors of relative size ~2⁻⁵² before snapping; with a grid ≥ 2²⁰ times the
//! floating-point spacing this only matters when `q + scale·x` falls within
//! that error of a rounding boundary.

use rand::Rng;

use super::exact::fair_bit;

/// Generalized Cauchy distribution with shape γ > 1 and unit scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeneralizedCauchy {
    gamma: f64,
}

impl GeneralizedCauchy {
    /// Shape γ must be finite and > 1.
    pub fn new(gamma: f64) -> Option<Self> {
        (gamma.is_finite() && gamma > 1.0).then_some(Self { gamma })
    }

    /// The shape parameter γ.
    pub fn gamma(&self) -> f64 {
        self.gamma
    }

    /// One unit-scale draw (floating point; see module docs before releasing).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        let a = 1.0 / self.gamma;
        let g1 = sample_gamma(rng, a);
        let g2 = sample_gamma(rng, 1.0 - a);
        let mag = (g1 / g2).powf(a);
        if fair_bit(rng) { -mag } else { mag }
    }

    /// Density at x.
    pub fn pdf(&self, x: f64) -> f64 {
        let g = self.gamma;
        let c = g * (std::f64::consts::PI / g).sin() / (2.0 * std::f64::consts::PI);
        c / (1.0 + x.abs().powf(g))
    }

    /// Variance (finite only for γ > 3; 004 Remark 3.10).
    pub fn variance(&self) -> f64 {
        let g = self.gamma;
        if g <= 3.0 {
            return f64::INFINITY;
        }
        let pi = std::f64::consts::PI;
        (pi / g).sin() / (3.0 * pi / g).sin()
    }
}

/// A uniform f64 in (0, 1), never exactly 0.
fn open_unit<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    ((rng.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal draw (Box–Muller, floating point; release only after snapping).
pub fn standard_normal_sample<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    standard_normal(rng)
}

fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // Box–Muller.
    let u1 = open_unit(rng);
    let u2 = open_unit(rng);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Gamma(shape, 1) by Marsaglia & Tsang (2000), with the U^{1/a} boost for a < 1.
pub fn sample_gamma<R: Rng + ?Sized>(rng: &mut R, shape: f64) -> f64 {
    if shape < 1.0 {
        let u = open_unit(rng);
        return sample_gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = standard_normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = open_unit(rng);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// Rounds `x` to the nearest multiple of 2^`exp` (ties to even).
pub fn snap(x: f64, exp: i32) -> f64 {
    let g = 2f64.powi(exp);
    (x / g).round_ties_even() * g
}

/// The exponent k of the public output grid 2^k for a statistic whose values
/// have public magnitude `magnitude` (> 0): 2^k ≤ magnitude·2⁻³² < 2^{k+1}.
///
/// `magnitude` must be public (e.g. max(|a|, |b|) for a mean clamped to the
/// public [a, b]); the grid is then the same for every dataset. It sits 2²⁰
/// above the floating-point spacing of numbers of that magnitude (2⁻⁵²).
/// Never panics: the exponent is kept in [−900, 900], so 2^k and its
/// reciprocal are finite and nonzero even for extreme public bounds (0, ∞ or
/// NaN magnitudes).
pub fn public_grid_exponent(magnitude: f64) -> i32 {
    let m = if magnitude.is_nan() { f64::MAX } else { magnitude.clamp(f64::MIN_POSITIVE, f64::MAX) };
    ((m.log2().floor() as i32) - 32).clamp(-900, 900)
}

/// L_γ = sup_x |d/dx ln h(x)| = (γ − 1)^{(γ−1)/γ} for h(x) ∝ 1/(1 + |x|^γ), γ > 1.
///
/// Proof: for x > 0, |(ln h)'(x)| = γx^{γ−1}/(1 + x^γ) =: φ(x); φ'(x) = 0 iff
/// (γ − 1)(1 + x^γ) = γx^γ, i.e. x^γ = γ − 1, where φ = (γ − 1)^{(γ−1)/γ}; φ → 0
/// at 0⁺ (γ > 1) and at ∞, so this is the maximum; h is even. By the mean value
/// theorem |ln h(x) − ln h(x + μ)| ≤ L_γ·|μ| (cf. 004 Thm 3.8, whose bound
/// γ − 1 ≥ L_γ holds only for γ ≥ 2).
pub fn log_density_lipschitz(gamma: f64) -> f64 {
    (gamma - 1.0).powf((gamma - 1.0) / gamma)
}

/// max(1, γ − 1): the cost per unit |λ| of dilating the generalized Cauchy
/// density: for all x and λ, |ln h(x) − ln h(e^λ·x) − λ| ≤ max(1, γ − 1)·|λ|
/// (the −λ is the Jacobian of the change of scale).
///
/// Proof: with t = |x|^γ ≥ 0, ln h(x) − ln h(e^λ x) = ln((1 + e^{γλ} t)/(1 + t)),
/// monotone in t from 0 (t = 0) to γλ (t → ∞); so the difference minus λ lies
/// between −λ and (γ − 1)λ, and both ends are attained in the limit.
pub fn dilation_cost(gamma: f64) -> f64 {
    (gamma - 1.0).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::DpRng;
    use crate::noise::testing::ks_test;

    fn numeric_cdf(d: GeneralizedCauchy) -> impl Fn(f64) -> f64 {
        // Integrate the pdf on a fine grid once; interpolate.
        let lo: f64 = -200.0;
        let step = 1e-3;
        let n = (400.0 / step) as usize;
        let mut cdf = Vec::with_capacity(n + 1);
        let mut acc = 0.0;
        // Mass below lo (tail integral approximated by ∫ c |x|^-γ).
        let g = d.gamma();
        let c = d.pdf(0.0);
        let tail = c * lo.abs().powf(1.0 - g) / (g - 1.0);
        acc += tail;
        cdf.push(acc);
        for i in 0..n {
            let x0 = lo + i as f64 * step;
            acc += step * (d.pdf(x0) + 4.0 * d.pdf(x0 + step / 2.0) + d.pdf(x0 + step)) / 6.0;
            cdf.push(acc);
        }
        move |x: f64| {
            if x <= lo {
                return 0.0;
            }
            let pos = (x - lo) / step;
            let i = pos.floor() as usize;
            if i >= n {
                return 1.0;
            }
            let f = pos - i as f64;
            cdf[i] * (1.0 - f) + cdf[i + 1] * f
        }
    }

    #[test]
    fn generalized_cauchy_ks() {
        for (i, gamma) in [2.0, 4.0].into_iter().enumerate() {
            let d = GeneralizedCauchy::new(gamma).unwrap();
            let mut rng = DpRng::unsafe_seeded(300 + i as u64);
            let mut draws: Vec<f64> = (0..50_000).map(|_| d.sample(&mut rng)).collect();
            ks_test(&mut draws, numeric_cdf(d), 1e-4);
        }
        // γ = 2 is the standard Cauchy: check the closed form too.
        let d = GeneralizedCauchy::new(2.0).unwrap();
        let mut rng = DpRng::unsafe_seeded(302);
        let mut draws: Vec<f64> = (0..50_000).map(|_| d.sample(&mut rng)).collect();
        ks_test(&mut draws, |x| 0.5 + x.atan() / std::f64::consts::PI, 1e-4);
    }

    #[test]
    fn gamma_sampler_mean() {
        let mut rng = DpRng::unsafe_seeded(9);
        for shape in [0.25, 0.75, 3.0] {
            let n = 50_000;
            let m: f64 = (0..n).map(|_| sample_gamma(&mut rng, shape)).sum::<f64>() / n as f64;
            assert!((m - shape).abs() < 5.0 * (shape / n as f64).sqrt(), "{shape}: {m}");
        }
    }

    #[test]
    fn snapping_rounds_to_grid() {
        assert_eq!(snap(1.3, -1), 1.5);
        assert_eq!(snap(-0.2, 0), 0.0);
        assert_eq!(public_grid_exponent(1.0), -32);
        assert_eq!(public_grid_exponent(300_000.0), 18 - 32);
        // Extreme public bounds (e.g. (b − a)² overflowing) still give a usable grid.
        let top = public_grid_exponent(f64::INFINITY);
        assert_eq!(top, public_grid_exponent(f64::MAX));
        assert!(2f64.powi(top).is_finite());
        assert_eq!(public_grid_exponent(0.0), -900);
        assert!(2f64.powi(public_grid_exponent(0.0)) > 0.0);
    }

    #[test]
    fn slide_and_dilation_constants_match_a_brute_force_search() {
        let lnh = |x: f64, g: f64| -(x.abs().powf(g)).ln_1p();
        for g in [1.2, 1.5, 2.0, 3.0, 4.0, 8.0] {
            // Largest |d/dx ln h| by finite differences over a wide grid.
            let h = 1e-6;
            let slope = (1..200_000)
                .map(|i| i as f64 * 1e-4)
                .map(|x| ((lnh(x + h, g) - lnh(x - h, g)) / (2.0 * h)).abs())
                .fold(0.0, f64::max);
            let l = log_density_lipschitz(g);
            assert!(slope <= l * (1.0 + 1e-6) && slope >= l * (1.0 - 1e-4), "γ = {g}: {slope} vs {l}");
            if g >= 2.0 {
                assert!(l <= g - 1.0 + 1e-12, "004 Thm 3.8's bound γ − 1 holds for γ ≥ 2");
            }
            // Dilation by e^λ, Jacobian included.
            for lambda in [-0.7, -0.1, 0.3, 0.7] {
                let worst = (-200..=200)
                    .map(|k| 10f64.powf(k as f64 / 20.0))
                    .map(|x| (lnh(x, g) - lnh(f64::exp(lambda) * x, g) - lambda).abs())
                    .fold(0.0, f64::max);
                let bound = dilation_cost(g) * lambda.abs();
                assert!(worst <= bound + 1e-9 && worst >= 0.99 * bound, "γ = {g}, λ = {lambda}: {worst} vs {bound}");
            }
        }
    }
}

#[cfg(test)]
mod large_tests {
    use super::*;
    use crate::noise::DpRng;
    use crate::noise::testing::ks_test;

    #[test]
    #[ignore]
    fn million_draw_ks() {
        let d = GeneralizedCauchy::new(2.0).unwrap();
        let mut rng = DpRng::unsafe_seeded(3002);
        let mut draws: Vec<f64> = (0..1_000_000).map(|_| d.sample(&mut rng)).collect();
        let stat = ks_test(&mut draws, |x| 0.5 + x.atan() / std::f64::consts::PI, 1e-4);
        println!(
            "generalized Cauchy γ=2: KS D = {stat:.5} (critical at 1e-4: {:.5})",
            (-(0.5e-4f64).ln() / 2.0).sqrt() / 1000.0
        );
    }
}
