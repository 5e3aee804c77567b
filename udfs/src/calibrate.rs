//! Noise calibration: the scale a mechanism needs for a privacy target.
//!
//! Every function rounds its answer *up* (`next_up`) so that float rounding can
//! only add noise, never remove it.

use statrs::function::erf::{erfc, erfc_inv};

/// Laplace / discrete Laplace scale for ε-DP with L1 sensitivity Δ: b = Δ/ε.
pub fn laplace_scale(sensitivity: f64, epsilon: f64) -> f64 {
    (sensitivity / epsilon).next_up()
}

/// Gaussian σ for ρ-zCDP with L2 sensitivity Δ: ρ = Δ²/(2σ²) (NOTES §1).
pub fn gaussian_sigma_for_rho(sensitivity: f64, rho: f64) -> f64 {
    (sensitivity / (2.0 * rho).sqrt()).next_up()
}

/// The zCDP cost ρ = Δ²/(2σ²) of Gaussian noise σ on sensitivity Δ.
pub fn gaussian_rho(sensitivity: f64, sigma: f64) -> f64 {
    sensitivity * sensitivity / (2.0 * sigma * sigma)
}

/// Standard normal cdf Φ(x), accurate in the tails (via erfc).
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// Standard normal quantile Φ⁻¹(p).
pub fn normal_quantile(p: f64) -> f64 {
    -std::f64::consts::SQRT_2 * erfc_inv(2.0 * p)
}

/// δ of the Gaussian mechanism with noise σ and L2 sensitivity Δ at ε
/// (Balle & Wang 2018, Thm 8; NOTES §1):
/// δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε·Φ(−Δ/(2σ) − εσ/Δ).
pub fn analytic_gaussian_delta(sigma: f64, sensitivity: f64, epsilon: f64) -> f64 {
    let a = sensitivity / (2.0 * sigma);
    let b = epsilon * sigma / sensitivity;
    let d = normal_cdf(a - b) - epsilon.exp() * normal_cdf(-a - b);
    d.max(0.0)
}

/// The smallest σ for which the Gaussian mechanism with L2 sensitivity Δ is
/// (ε, δ)-DP (analytic Gaussian mechanism, Balle & Wang 2018), by bisection on
/// the exact δ(σ) (monotone decreasing in σ). Rounded up.
pub fn analytic_gaussian_sigma(sensitivity: f64, epsilon: f64, delta: f64) -> f64 {
    assert!(sensitivity > 0.0 && epsilon > 0.0 && delta > 0.0 && delta < 1.0);
    let f = |s: f64| analytic_gaussian_delta(s, sensitivity, epsilon);
    let mut lo = 1e-12 * sensitivity;
    let mut hi = sensitivity;
    while f(hi) > delta {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if f(mid) > delta {
            lo = mid;
        } else {
            hi = mid;
        }
        if (hi - lo) <= hi * 1e-15 {
            break;
        }
    }
    hi.next_up()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        ((a - b) / b).abs()
    }

    #[test]
    fn analytic_gaussian_reference_values() {
        // Reference values from issue #3 (analytic Gaussian, Δ = 1).
        assert!(rel(analytic_gaussian_sigma(1.0, 1.0, 1e-5), 3.7306316) < 1e-6);
        assert!(rel(analytic_gaussian_sigma(1.0, 0.5, 1e-6), 8.0576185) < 1e-6);
        assert!(rel(analytic_gaussian_sigma(1.0, 1.0, 4.7e-10), 5.6197108) < 1e-6);
    }

    #[test]
    fn simple_calibrations() {
        assert!(laplace_scale(1.0, 0.5) >= 2.0);
        let s = gaussian_sigma_for_rho(1.0, 0.5);
        assert!(s >= 1.0 && rel(s, 1.0) < 1e-15);
        assert!(gaussian_rho(1.0, s) <= 0.5);
        assert!((normal_quantile(0.975) - 1.959963985).abs() < 1e-8);
    }
}
