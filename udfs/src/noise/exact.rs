//! Exact integer/rational primitives the samplers are built from.
//!
//! Everything here uses only uniform random bits and big-integer arithmetic,
//! so no floating-point rounding ever reaches a released value
//! (Canonne, Kamath, Steinke 2020, §5; NOTES §2).

use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_rational::Ratio;
use num_traits::{One, ToPrimitive, Zero};
use rand::Rng;

/// A non-negative exact rational number.
pub type URational = Ratio<BigUint>;

/// Uniform integer in `[0, n)`; `n` must be positive.
pub fn uniform_below<R: Rng + ?Sized>(rng: &mut R, n: &BigUint) -> BigUint {
    assert!(!n.is_zero(), "uniform_below(0)");
    if let Some(small) = n.to_u64() {
        return BigUint::from(uniform_below_u64(rng, small));
    }
    // Rejection sampling on exactly bits(n) random bits: accepts with probability > 1/2.
    let bits = n.bits();
    let bytes = bits.div_ceil(8) as usize;
    let excess = (bytes as u64) * 8 - bits;
    let mut buf = vec![0u8; bytes];
    loop {
        rng.fill_bytes(&mut buf);
        // Big-endian: clear the excess high bits of the first byte.
        buf[0] &= 0xffu8 >> excess;
        let candidate = BigUint::from_bytes_be(&buf);
        if &candidate < n {
            return candidate;
        }
    }
}

/// Uniform integer in `[0, n)` for `n > 0`, by rejection (no modulo bias).
#[inline]
pub fn uniform_below_u64<R: Rng + ?Sized>(rng: &mut R, n: u64) -> u64 {
    debug_assert!(n > 0);
    if n.is_power_of_two() {
        return rng.next_u64() & (n - 1);
    }
    // Largest multiple of n that fits: reject draws above it.
    let zone = u64::MAX - (u64::MAX % n) - 1;
    loop {
        let v = rng.next_u64();
        if v <= zone {
            return v % n;
        }
    }
}

/// Bernoulli(num/den) exactly; requires `num <= den`, `den > 0`.
pub fn bernoulli_ratio<R: Rng + ?Sized>(rng: &mut R, num: &BigUint, den: &BigUint) -> bool {
    debug_assert!(num <= den);
    if num.is_zero() {
        return false;
    }
    if num == den {
        return true;
    }
    &uniform_below(rng, den) < num
}

/// A fair coin.
#[inline]
pub fn fair_bit<R: Rng + ?Sized>(rng: &mut R) -> bool {
    rng.next_u32() & 1 == 1
}

/// Bernoulli(exp(−γ)) for an exact rational γ = num/den ≥ 0.
///
/// CKS20 Algorithm 1: for γ ∈ [0, 1] draw A_k ~ Bernoulli(γ/k) for k = 1, 2, …
/// until the first failure at K; return 1 iff K is odd. For γ > 1 use
/// exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)).
pub fn bernoulli_exp_neg<R: Rng + ?Sized>(rng: &mut R, num: &BigUint, den: &BigUint) -> bool {
    assert!(!den.is_zero(), "zero denominator");
    if num <= den {
        return bernoulli_exp_neg_unit(rng, num, den);
    }
    let (whole, rest) = num.div_rem(den);
    let one = BigUint::one();
    let mut i = BigUint::zero();
    while i < whole {
        if !bernoulli_exp_neg_unit(rng, &one, &one) {
            return false;
        }
        i += 1u32;
    }
    bernoulli_exp_neg_unit(rng, &rest, den)
}

fn bernoulli_exp_neg_unit<R: Rng + ?Sized>(rng: &mut R, num: &BigUint, den: &BigUint) -> bool {
    let mut k: u64 = 1;
    loop {
        let d = den * k;
        if !bernoulli_ratio(rng, num, &d) {
            break;
        }
        k += 1;
    }
    k % 2 == 1
}

/// Bernoulli(exp(−γ)) for a rational γ ≥ 0.
pub fn bernoulli_exp_neg_ratio<R: Rng + ?Sized>(rng: &mut R, gamma: &URational) -> bool {
    bernoulli_exp_neg(rng, gamma.numer(), gamma.denom())
}

/// The exact rational value of a finite, non-negative `f64`.
pub fn f64_to_urational(x: f64) -> Option<URational> {
    if !x.is_finite() || x < 0.0 {
        return None;
    }
    let r = Ratio::<BigInt>::from_float(x)?;
    let (n, d) = r.into_raw();
    Some(URational::new(n.to_biguint()?, d.to_biguint()?))
}

/// The exact rational value of a finite `f64` (signed).
pub fn f64_to_rational(x: f64) -> Option<Ratio<BigInt>> {
    if !x.is_finite() {
        return None;
    }
    Ratio::<BigInt>::from_float(x)
}

/// Converts a signed big integer to `i128`, saturating (values that large have
/// probability below 2^-100 for any realistic noise scale).
pub fn bigint_to_i128_saturating(v: &BigInt) -> i128 {
    v.to_i128().unwrap_or(if v.sign() == Sign::Minus { i128::MIN } else { i128::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::DpRng;

    #[test]
    fn uniform_below_covers_range_evenly() {
        let mut rng = DpRng::unsafe_seeded(3);
        let n = BigUint::from(7u32);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[uniform_below(&mut rng, &n).to_usize().unwrap()] += 1;
        }
        for c in counts {
            assert!((9_400..10_600).contains(&c), "{counts:?}");
        }
        // A big modulus (> u64) still stays below n.
        let big = BigUint::from(3u32) << 100usize;
        for _ in 0..100 {
            assert!(uniform_below(&mut rng, &big) < big);
        }
    }

    #[test]
    fn bernoulli_exp_matches_probability() {
        let mut rng = DpRng::unsafe_seeded(11);
        for (num, den) in [(0u32, 1u32), (1, 2), (1, 1), (3, 2), (7, 3)] {
            let p = (-(num as f64) / den as f64).exp();
            let n = 100_000;
            let hits =
                (0..n).filter(|_| bernoulli_exp_neg(&mut rng, &BigUint::from(num), &BigUint::from(den))).count() as f64;
            let se = (p * (1.0 - p) / n as f64).sqrt().max(1e-9);
            assert!((hits / n as f64 - p).abs() < 5.0 * se + 1e-12, "γ={num}/{den}: {} vs {p}", hits / n as f64);
        }
    }

    #[test]
    fn f64_rationals_are_exact() {
        let r = f64_to_urational(0.1).unwrap();
        assert_eq!(r.denom(), &(BigUint::one() << 55usize));
        assert!(f64_to_urational(-1.0).is_none());
        assert!(f64_to_urational(f64::NAN).is_none());
    }
}
