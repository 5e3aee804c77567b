//! A floating-point-safe exponential mechanism (McSherry & Talwar 2007).
//!
//! Selects candidate r with probability ∝ w_r·exp(ε·q_r / (2Δ)) *exactly*:
//! every score is converted to its exact rational value (an `f64` is a dyadic
//! rational), γ_r = ε(q* − q_r)/(2Δ) ≥ 0 is computed in big-rational arithmetic
//! and candidate r is accepted with an exact Bernoulli(exp(−γ_r)) after being
//! proposed with probability ∝ w_r. The accepted draw has exactly the target law
//! (rejection sampling), and no float rounding can bias the choice.
//!
//! Privacy: ε-DP and ε²/8-zCDP (Cesar & Rogers 2021; NOTES §1) for a score
//! with sensitivity Δ. The expected number of proposals is Σw / Σ w·e^{−γ},
//! at most the number of candidates when all weights are 1.

use num_bigint::{BigInt, BigUint};
use num_rational::Ratio;
use num_traits::{Signed, Zero};
use rand::Rng;

use super::exact::{URational, bernoulli_exp_neg_ratio, f64_to_rational, uniform_below_u64};

/// Errors of the exponential mechanism's inputs.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExpMechError {
    /// No candidate (or all weights zero).
    #[error("exponential mechanism: no candidates to select from")]
    Empty,
    /// A score was NaN or infinite.
    #[error("exponential mechanism: score {index} is not finite ({value})")]
    NonFiniteScore {
        /// Candidate index.
        index: usize,
        /// The offending score.
        value: f64,
    },
    /// ε or Δ not positive and finite.
    #[error("exponential mechanism: epsilon and sensitivity must be positive and finite")]
    BadParameters,
}

/// Exponential mechanism with privacy parameter ε and score sensitivity Δ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialMechanism {
    /// ε of the selection.
    pub epsilon: f64,
    /// Sensitivity Δ of the quality score.
    pub sensitivity: f64,
}

impl ExponentialMechanism {
    /// A mechanism selecting with ∝ exp(ε·q/(2Δ)).
    pub fn new(epsilon: f64, sensitivity: f64) -> Result<Self, ExpMechError> {
        if !(epsilon > 0.0 && epsilon.is_finite() && sensitivity > 0.0 && sensitivity.is_finite()) {
            return Err(ExpMechError::BadParameters);
        }
        Ok(Self { epsilon, sensitivity })
    }

    /// zCDP cost ε²/8 (Cesar & Rogers 2021).
    pub fn rho(&self) -> f64 {
        self.epsilon * self.epsilon / 8.0
    }

    /// Selects an index with probability ∝ exp(ε·q_r/(2Δ)).
    pub fn select<R: Rng + ?Sized>(&self, rng: &mut R, scores: &[f64]) -> Result<usize, ExpMechError> {
        self.select_weighted(rng, scores, None)
    }

    /// Selects an index with probability ∝ w_r·exp(ε·q_r/(2Δ)); `weights` are
    /// public (e.g. interval lengths of a quantile mechanism).
    pub fn select_weighted<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        scores: &[f64],
        weights: Option<&[u64]>,
    ) -> Result<usize, ExpMechError> {
        if let Some(w) = weights {
            assert_eq!(w.len(), scores.len(), "one weight per score");
        }
        let weight = |i: usize| weights.map_or(1, |w| w[i]);
        let mut best: Option<f64> = None;
        for (i, &s) in scores.iter().enumerate() {
            if !s.is_finite() {
                return Err(ExpMechError::NonFiniteScore { index: i, value: s });
            }
            if weight(i) > 0 {
                best = Some(best.map_or(s, |b: f64| b.max(s)));
            }
        }
        let best = best.ok_or(ExpMechError::Empty)?;
        let best_q = f64_to_rational(best).expect("finite");
        let eps = f64_to_rational(self.epsilon).expect("finite");
        let two_delta = f64_to_rational(self.sensitivity).expect("finite") * BigInt::from(2);
        let c = eps / two_delta;
        // Exact γ_r = c·(q* − q_r) ≥ 0.
        let gammas: Vec<URational> = scores
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                if weight(i) == 0 {
                    // Never proposed.
                    return URational::zero();
                }
                let g: Ratio<BigInt> = &c * (&best_q - f64_to_rational(s).expect("finite"));
                debug_assert!(!g.is_negative());
                let (n, d) = g.into_raw();
                URational::new(n.magnitude().clone(), d.magnitude().clone())
            })
            .collect();
        // Proposal ∝ weights via prefix sums.
        let mut prefix = Vec::with_capacity(scores.len());
        let mut total: u128 = 0;
        for i in 0..scores.len() {
            total += weight(i) as u128;
            prefix.push(total);
        }
        loop {
            let u = if total <= u64::MAX as u128 {
                uniform_below_u64(rng, total as u64) as u128
            } else {
                let t = BigUint::from(total);
                let v = super::exact::uniform_below(rng, &t);
                u128::try_from(v).expect("below total")
            };
            let r = prefix.partition_point(|&p| p <= u);
            if gammas[r].is_zero() || bernoulli_exp_neg_ratio(rng, &gammas[r]) {
                return Ok(r);
            }
        }
    }

    /// The exact selection probabilities (computed in floating point, for
    /// tests and for reporting only: never used to sample).
    pub fn probabilities(&self, scores: &[f64], weights: Option<&[u64]>) -> Vec<f64> {
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let raw: Vec<f64> = scores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let w = weights.map_or(1.0, |w| w[i] as f64);
                w * (self.epsilon * (s - m) / (2.0 * self.sensitivity)).exp()
            })
            .collect();
        let z: f64 = raw.iter().sum();
        raw.into_iter().map(|x| x / z).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::DpRng;
    use crate::noise::testing::chi_square_test_counts;

    #[test]
    fn selection_frequencies_match_softmax() {
        let scores = [0.0, 1.0, 2.5, -3.0, 2.4, 0.1];
        let mech = ExponentialMechanism::new(1.3, 0.7).unwrap();
        let probs = mech.probabilities(&scores, None);
        let mut rng = DpRng::unsafe_seeded(42);
        let mut counts = vec![0.0; scores.len()];
        for _ in 0..60_000 {
            counts[mech.select(&mut rng, &scores).unwrap()] += 1.0;
        }
        chi_square_test_counts(&counts, &probs, 1e-4);
    }

    #[test]
    fn weighted_selection_matches() {
        let scores = [5.0, 4.0, 0.0];
        let weights = [1u64, 10, 100];
        let mech = ExponentialMechanism::new(2.0, 1.0).unwrap();
        let probs = mech.probabilities(&scores, Some(&weights));
        let mut rng = DpRng::unsafe_seeded(43);
        let mut counts = vec![0.0; 3];
        for _ in 0..60_000 {
            counts[mech.select_weighted(&mut rng, &scores, Some(&weights)).unwrap()] += 1.0;
        }
        chi_square_test_counts(&counts, &probs, 1e-4);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let mut rng = DpRng::unsafe_seeded(1);
        let m = ExponentialMechanism::new(1.0, 1.0).unwrap();
        assert_eq!(m.select(&mut rng, &[]), Err(ExpMechError::Empty));
        assert!(matches!(m.select(&mut rng, &[1.0, f64::NAN]), Err(ExpMechError::NonFiniteScore { index: 1, .. })));
        assert!(ExponentialMechanism::new(0.0, 1.0).is_err());
        // Zero-weight candidates are never chosen.
        for _ in 0..100 {
            assert_eq!(m.select_weighted(&mut rng, &[100.0, 0.0], Some(&[0, 1])).unwrap(), 1);
        }
    }
}

#[cfg(test)]
mod large_tests {
    use super::*;
    use crate::noise::DpRng;
    use crate::noise::testing::chi_square_test_counts;

    #[test]
    #[ignore]
    fn million_draw_selection() {
        let scores = [0.0, 1.0, 2.5, -3.0, 2.4, 0.1];
        let mech = ExponentialMechanism::new(1.3, 0.7).unwrap();
        let probs = mech.probabilities(&scores, None);
        let mut rng = DpRng::unsafe_seeded(4242);
        let mut counts = vec![0.0; scores.len()];
        for _ in 0..1_000_000 {
            counts[mech.select(&mut rng, &scores).unwrap()] += 1.0;
        }
        let (stat, dof, p) = chi_square_test_counts(&counts, &probs, 1e-4);
        println!("exponential mechanism: chi2 {stat:.2} on {dof} dof, p = {p:.3}");
    }
}
