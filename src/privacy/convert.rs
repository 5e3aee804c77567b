//! Conversions between privacy definitions (NOTES §1).
//!
//! zCDP → (ε, δ) follows Canonne, Kamath & Steinke (2020) exactly as
//! private-pgm's `cdp2adp` computes it; ε(ρ, δ) and ρ(ε, δ) invert it by
//! bisection. Any α > 1 gives a valid δ, so an imperfect search only makes δ
//! larger (still valid).

/// δ(ρ, ε) = min_{α>1} exp((α−1)(αρ−ε) + α·ln(1−1/α)) / (α−1), capped at 1.
pub fn cdp_delta(rho: f64, eps: f64) -> f64 {
    assert!(rho >= 0.0 && eps >= 0.0, "cdp_delta needs rho, eps >= 0");
    if rho == 0.0 {
        return 0.0;
    }
    // The minimiser solves (2α−1)ρ − ε + ln(1−1/α) = 0; bisect the derivative.
    let mut amin: f64 = 1.01;
    let mut amax: f64 = (eps + 1.0) / (2.0 * rho) + 2.0;
    let mut alpha = 0.5 * (amin + amax);
    for _ in 0..1000 {
        alpha = 0.5 * (amin + amax);
        let derivative = (2.0 * alpha - 1.0) * rho - eps + (-1.0 / alpha).ln_1p();
        if derivative < 0.0 {
            amin = alpha;
        } else {
            amax = alpha;
        }
        if amax - amin <= f64::EPSILON * amax {
            break;
        }
    }
    let delta = ((alpha - 1.0) * (alpha * rho - eps) + alpha * (-1.0 / alpha).ln_1p()).exp() / (alpha - 1.0);
    delta.min(1.0)
}

/// The smallest ε (to bisection precision, rounded up) with δ(ρ, ε) ≤ δ.
pub fn cdp_eps(rho: f64, delta: f64) -> f64 {
    assert!(rho >= 0.0 && delta > 0.0);
    if delta >= 1.0 || rho == 0.0 {
        return 0.0;
    }
    let mut lo = 0.0;
    let mut hi = rho + 2.0 * (rho * (1.0 / delta).ln()).sqrt();
    for _ in 0..1000 {
        let mid = 0.5 * (lo + hi);
        if cdp_delta(rho, mid) <= delta {
            hi = mid;
        } else {
            lo = mid;
        }
        if hi - lo <= f64::EPSILON * hi {
            break;
        }
    }
    hi
}

/// The largest ρ (to bisection precision, rounded down) with δ(ρ, ε) ≤ δ.
pub fn cdp_rho(eps: f64, delta: f64) -> f64 {
    assert!(eps >= 0.0 && delta > 0.0);
    if delta >= 1.0 {
        return f64::INFINITY;
    }
    let mut lo = 0.0;
    let mut hi = eps + 1.0;
    for _ in 0..1000 {
        let mid = 0.5 * (lo + hi);
        if cdp_delta(mid, eps) <= delta {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= f64::EPSILON * hi {
            break;
        }
    }
    lo
}

/// RDP curve → (ε, δ): the smallest ε over the orders by the conversion of
/// Canonne, Kamath & Steinke 2020 Prop 12 ([`super::rdp::epsilon`]), which is
/// never above Mironov 2017 Prop 3's ε(α) + ln(1/δ)/(α−1) (000 Lemma 4.6).
/// Returns (ε, the minimising α).
pub fn rdp_to_approx(curve: &[(f64, f64)], delta: f64) -> (f64, f64) {
    super::rdp::epsilon(curve, delta)
}

/// RDP of the sampled Gaussian mechanism at integer order α ≥ 2 (NOTES §1;
/// [`super::rdp::sampled_gaussian`]).
pub fn sampled_gaussian_rdp(q: f64, noise_multiplier: f64, alpha: u32) -> f64 {
    assert!(alpha >= 2);
    super::rdp::sampled_gaussian(q, noise_multiplier, alpha as f64).expect("q in [0, 1] and σ > 0")
}

/// The largest order [`public_order`] considers.
pub const MAX_PUBLIC_ORDER: u32 = 1 << 20;

/// An order fixed from public inputs alone: the integer order (2 to
/// [`MAX_PUBLIC_ORDER`]) at which a ρ(ε, δ)-zCDP curve converts best.
/// Mechanisms whose noise is chosen after some DP output (adaptively) are
/// charged at this one order. (Any integer order, not only the default
/// grid: at small ε·δ the best one is in the thousands.)
pub fn public_order(epsilon_target: f64, delta: f64) -> f64 {
    let rho = cdp_rho(epsilon_target, delta);
    let eps_at = |a: f64| rho * a + (-1.0 / a).ln_1p() - (delta * a).ln() / (a - 1.0);
    // The conversion of ρα is convex in α past its minimum's neighbourhood:
    // scan integers near the continuous optimum 1 + √(ln(1/δ)/ρ), and 2.
    let centre = (1.0 + ((1.0 / delta).ln() / rho).sqrt()).clamp(2.0, MAX_PUBLIC_ORDER as f64);
    let (lo, hi) = ((centre / 4.0).floor().max(2.0), (centre * 4.0).ceil().min(MAX_PUBLIC_ORDER as f64));
    let mut best = (eps_at(2.0), 2.0);
    let mut a = lo;
    while a <= hi {
        let e = eps_at(a);
        if e < best.0 {
            best = (e, a);
        }
        a += 1.0;
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        ((a - b) / b).abs()
    }

    #[test]
    fn reference_values_from_private_pgm() {
        assert!(rel(cdp_rho(1.0, 1e-9), 0.0149730577) < 1e-6, "{}", cdp_rho(1.0, 1e-9));
        assert!(rel(cdp_rho(0.1, 1e-9), 1.77138447e-4) < 1e-6, "{}", cdp_rho(0.1, 1e-9));
        assert!(rel(cdp_rho(10.0, 1e-9), 1.0907857044) < 1e-6, "{}", cdp_rho(10.0, 1e-9));
        assert!(rel(cdp_rho(1.0, 1e-5), 0.0305565952) < 1e-6, "{}", cdp_rho(1.0, 1e-5));
        assert!(rel(cdp_delta(0.5, 3.0), 0.0051431841) < 1e-6, "{}", cdp_delta(0.5, 3.0));
    }

    #[test]
    fn inverses_round_trip() {
        for &(eps, delta) in &[(0.5, 1e-6), (2.0, 1e-9), (8.0, 1e-5)] {
            let rho = cdp_rho(eps, delta);
            assert!(cdp_delta(rho, eps) <= delta);
            let e = cdp_eps(rho, delta);
            assert!(rel(e, eps) < 1e-9, "{e} vs {eps}");
        }
    }

    #[test]
    fn sampled_gaussian_without_sampling_is_gaussian_rdp() {
        // q = 1: ε(α) = α/(2σ²).
        for a in [2u32, 5, 32] {
            let e = sampled_gaussian_rdp(1.0 - 1e-15, 2.0, a);
            assert!(rel(e, a as f64 / 8.0) < 1e-6, "{a}: {e}");
        }
        let (eps, _) = rdp_to_approx(&[(2.0, 0.25), (10.0, 1.25)], 1e-5);
        let improved = 1.25 + (-0.1f64).ln_1p() - (1e-5f64 * 10.0).ln() / 9.0;
        assert!(rel(eps, improved) < 1e-12);
        assert!(eps < 1.25 + (1e5f64).ln() / 9.0);
    }
}
