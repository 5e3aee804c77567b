//! Confidence intervals for `dp_quantile` (issue 20, item 2):
//! `dp_ci_low(dp_quantile(x, q, lo, hi))` and `dp_ci_high(...)`, each a
//! further exponential-mechanism selection over the quantile's public bins,
//! charged with its own share of the call's budget.
//!
//! **What is covered.** Let x₍₁₎ ≤ … ≤ x₍ₙ₎ be a group's non-null values,
//! clamped to [lo, hi], and k = max(1, ⌈q·n⌉): the interval [L, U] holds
//! x₍ₖ₎, the exact sample quantile, with probability at least `level` over
//! the noise — on every dataset, like the intervals of counts and sums.
//!
//! **The mechanism.** Bins b = 0..B−1 of width w over [lo, hi]; c⁻_b is the
//! number of values in bins before b and c_b the number in bins up to b, so
//! bin b spans the ranks [c⁻_b, c_b]. For a shift r, the low end selects a
//! bin with the exponential mechanism (McSherry–Talwar 2007) on the score
//!
//! s_L(b) = −dist(q·n − r, [c⁻_b, c_b]),  with c⁻_0 := −∞,
//!
//! and releases L = lo + b·w (the bin's lower edge); the high end uses
//! s_U(b) = −dist(q·n + r, [c⁻_b, c_b]) with c_{B−1} := +∞ and releases
//! U = lo + (b + 1)·w. The point estimate (`release::release_one`) is
//! unchanged.
//!
//! **Sensitivity.** dist(p, [a, c]) = max(a − p, 0, p − c). Adding one row
//! raises c⁻_b and c_b by 0 or 1 and q·n by q, so a − p and p − c each move
//! by at most max(q, 1 − q) ≤ 1, and so does their maximum with 0: score
//! sensitivity 1 per row, l∞ per unit (the point estimate's, §3 of
//! docs/PRIVACY.md). Each selection is ε-DP at ε per group (ε²/8-zCDP).
//!
//! **Coverage (the theorem).** With r = (2Δ/ε)·ln(2B/(1 − level)) each end
//! is wrong with probability at most β = (1 − level)/2, so both together hold
//! x₍ₖ₎ with probability ≥ level (union bound). Proof for the low end: the
//! rank ranges [c⁻_b, c_b] tile (−∞, n], and q·n − r ≤ n, so some bin scores
//! 0. L is wrong iff L > x₍ₖ₎ iff the chosen bin has c⁻_b ≥ k ≥ q·n; such a
//! bin (b ≥ 1) scores at most −(c⁻_b − (q·n − r)) ≤ −r. The mechanism picks
//! any one bin of score ≤ −r with probability at most exp(−ε·r/2Δ) relative
//! to the best (score 0), so all of them together with probability at most
//! B·exp(−ε·r/2Δ) = β. The high end is the mirror image: U is wrong only if
//! the bin has c_b < k, so c_b ≤ q·n, and it scores ≤ −r. Bin 0 (for L) and
//! bin B−1 (for U) are never wrong, which is why their open ends are ±∞: a
//! plain two-sided distance would make a heavy bin out-score them (test
//! `a_heavy_bin_breaks_the_plain_distance_but_not_the_open_ends`).
//!
//! The exponential mechanism's output distribution given the data is
//! known exactly, so the tests check the bound by brute force: the exact
//! probability of a wrong end, summed over the bins, on every histogram of a
//! small grid.

/// The shift r = (2Δ/ε)·ln(2B/(1 − level)) of the interval ends' targets
/// (ranks), for a selection at `epsilon` per group with score sensitivity
/// `sensitivity` over `bins` bins.
pub fn endpoint_shift(epsilon: f64, sensitivity: f64, bins: usize, level: f64) -> f64 {
    2.0 * sensitivity / epsilon * (2.0 * bins as f64 / (1.0 - level)).ln()
}

/// The scores s_L (or s_U when `high`) of every bin, from a group's bin
/// counts (`histogram`, `bins` long; missing trailing bins count 0).
pub fn endpoint_scores(histogram: &[f64], bins: usize, q: f64, shift: f64, high: bool) -> Vec<f64> {
    let n: f64 = histogram.iter().sum();
    let target = if high { q * n + shift } else { q * n - shift };
    let mut before = 0.0;
    (0..bins)
        .map(|b| {
            let upto = before + histogram.get(b).copied().unwrap_or(0.0);
            let a = if !high && b == 0 { f64::NEG_INFINITY } else { before };
            let c = if high && b + 1 == bins { f64::INFINITY } else { upto };
            before = upto;
            -(a - target).max(0.0).max(target - c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exponential mechanism's exact probabilities ∝ exp(ε·s/2Δ).
    fn em_probabilities(scores: &[f64], epsilon: f64, sensitivity: f64) -> Vec<f64> {
        let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (epsilon * (s - top) / (2.0 * sensitivity)).exp()).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|x| x / z).collect()
    }

    /// k = max(1, ⌈q·n⌉) and the exact probability that each end misses x₍ₖ₎.
    fn miss_probabilities(histogram: &[f64], q: f64, epsilon: f64, shift: f64) -> (f64, f64) {
        let bins = histogram.len();
        let n: f64 = histogram.iter().sum();
        let k = (q * n).ceil().max(1.0);
        let (mut before, mut low_miss, mut high_miss) = (0.0, 0.0, 0.0);
        let pl = em_probabilities(&endpoint_scores(histogram, bins, q, shift, false), epsilon, 1.0);
        let pu = em_probabilities(&endpoint_scores(histogram, bins, q, shift, true), epsilon, 1.0);
        for b in 0..bins {
            let upto = before + histogram[b];
            // L = lower edge of b misses iff every one of the k smallest lies before b.
            if before >= k {
                low_miss += pl[b];
            }
            // U = upper edge of b misses iff fewer than k values lie up to b (and b is not the last).
            if b + 1 < bins && upto < k {
                high_miss += pu[b];
            }
            before = upto;
        }
        (low_miss, high_miss)
    }

    /// Every histogram of `total` rows over `bins` bins.
    fn histograms(bins: usize, total: usize) -> Vec<Vec<f64>> {
        if bins == 1 {
            return vec![vec![total as f64]];
        }
        (0..=total)
            .flat_map(|first| {
                histograms(bins - 1, total - first).into_iter().map(move |mut rest| {
                    rest.insert(0, first as f64);
                    rest
                })
            })
            .collect()
    }

    #[test]
    fn each_end_misses_with_probability_at_most_beta_on_every_small_histogram() {
        // Brute force: every histogram of 1..=12 rows over 5 bins, several q, ε and levels.
        for total in 1..=12 {
            for h in histograms(5, total) {
                for q in [0.0, 0.1, 0.25, 0.5, 0.9, 1.0] {
                    for (epsilon, level) in [(0.5, 0.9), (1.0, 0.95), (4.0, 0.95), (0.2, 0.5)] {
                        let r = endpoint_shift(epsilon, 1.0, 5, level);
                        let (low, high) = miss_probabilities(&h, q, epsilon, r);
                        let beta = (1.0 - level) / 2.0;
                        assert!(low <= beta + 1e-12 && high <= beta + 1e-12, "{h:?} q {q} ε {epsilon}: {low} {high}");
                    }
                }
            }
        }
    }

    #[test]
    fn without_the_shift_the_ends_miss_far_more_often() {
        // The same ends aimed at q·n itself: q·n = 40 is the edge between bins 3 and 4, which
        // both score 0 for the low end, and bin 4 starts above x₍₄₀₎ — a miss about half the
        // time; the shift is what covers.
        let h = vec![10.0; 8];
        let (low, _) = miss_probabilities(&h, 0.5, 1.0, 0.0);
        assert!(low > 0.4, "{low}");
        let (low, high) = miss_probabilities(&h, 0.5, 1.0, endpoint_shift(1.0, 1.0, 8, 0.95));
        assert!(low <= 0.025 && high <= 0.025, "{low} {high}");
    }

    #[test]
    fn a_heavy_bin_breaks_the_plain_distance_but_not_the_open_ends() {
        // 40 rows in bin 2, 1 in bin 5, q = 0.9: x₍ₖ₎ is in bin 2. With a plain distance (c⁻_0 = 0),
        // the low end's target q·n − r ≈ 28.6 sits inside bin 2's ranks, so it is chosen and right;
        // but at q·n − r < 0 (a small ε) a plain distance would score bin 0 at −(0 − target) < 0
        // and a wrong bin only r lower: the open end keeps bin 0 at 0.
        let h = vec![0.0, 0.0, 40.0, 0.0, 0.0, 1.0];
        for epsilon in [0.05, 0.1, 0.5, 2.0] {
            let r = endpoint_shift(epsilon, 1.0, h.len(), 0.95);
            let (low, high) = miss_probabilities(&h, 0.9, epsilon, r);
            assert!(low <= 0.025 + 1e-12 && high <= 0.025 + 1e-12, "ε {epsilon}: {low} {high}");
        }
        // The plain distance at a small ε: bin 0 no longer dominates the wrong bins.
        let epsilon = 0.05;
        let r = endpoint_shift(epsilon, 1.0, h.len(), 0.95);
        let mut plain = endpoint_scores(&h, h.len(), 0.9, r, false);
        let target = 0.9 * 41.0 - r;
        plain[0] = -(0.0 - target).max(0.0);
        let p = em_probabilities(&plain, epsilon, 1.0);
        // Bins 3..5 start after all 40 + ... rows ≥ k = 37: wrong.
        let wrong: f64 = p[3..].iter().sum();
        assert!(wrong > 0.025, "plain distance miss {wrong}");
    }

    #[test]
    fn the_scores_are_minus_the_distance_to_each_bins_rank_range() {
        // Ranks: bin 0 [−∞, 2], bin 1 [2, 2], bin 2 [2, 7], bin 3 [7, 10].
        let h = [2.0, 0.0, 5.0, 3.0];
        // Low end at q·n − r = 5 − 4 = 1: bin 0 holds it; bins 1, 2 are 1 away, bin 3 is 6 away.
        assert_eq!(endpoint_scores(&h, 4, 0.5, 4.0, false), vec![0.0, -1.0, -1.0, -6.0]);
        // High end at 5 + 4 = 9: bin 3 (open above) holds it; bin 2 is 2 away, bins 0, 1 are 7 away.
        assert_eq!(endpoint_scores(&h, 4, 0.5, 4.0, true), vec![-7.0, -7.0, -2.0, 0.0]);
    }

    #[test]
    fn one_row_moves_every_score_by_at_most_one() {
        // Add-one neighbours of every histogram of 6 rows over 4 bins.
        for h in histograms(4, 6) {
            for b in 0..4 {
                let mut g = h.clone();
                g[b] += 1.0;
                for q in [0.0, 0.3, 0.5, 0.99] {
                    for high in [false, true] {
                        let s = endpoint_scores(&h, 4, q, 2.5, high);
                        let t = endpoint_scores(&g, 4, q, 2.5, high);
                        for (x, y) in s.iter().zip(&t) {
                            assert!((x - y).abs() <= 1.0 + 1e-12, "{h:?} +{b} q {q}: {x} {y}");
                        }
                    }
                }
            }
        }
    }
}
