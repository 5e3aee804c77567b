//! MODIPS for one bounded numeric attribute under the normal model
//! (002 §3.2.2, §4.2).
//!
//! **Model.** x ~ N(μ, σ²) with the prior f(μ, σ²) ∝ σ⁻²; the posterior is
//! σ² | x ~ Inv-Gamma((n − 1)/2, (n − 1)S²/2), μ | σ², x ~ N(x̄, σ²/n). Its
//! Bayesian sufficient statistics are (n, x̄, S²).
//!
//! **Sanitization under add/remove-one neighbours.** The bounds [c₀, c₁]
//! are public; values outside are clamped to them first (a row-wise map,
//! 1-stable). With the centre c = (c₀ + c₁)/2 and half-width h = (c₁ − c₀)/2,
//! one row changes
//! - the count n by 1,
//! - the centred sum Σ(x − c) by at most h,
//! - the centred sum of squares Σ(x − c)² by at most h².
//!
//! Each set's ε/m is split equally between them (002 splits its ε/m between
//! x̄ and S²), each released with discrete Laplace noise on a public grid
//! (docs/PRIVACY.md §0): each value is rounded to the grid before the
//! exact integer sums, so the sensitivities hold in grid units. 002 sanitizes x̄ and S² directly
//! with the sensitivities (c₁ − c₀)/n and (c₁ − c₀)²/n, which need a public
//! n. When n *is* public (declared, e.g. a published census total) it is
//! used instead of a noisy count, the budget is split between the two sums
//! only, and the statistics are the sums divided by the declared n: still
//! DP for every dataset, since the declared n is a constant.
//!
//! **Post-processing.** x̄* = c + Σ(x − c)*/n*, and
//! S²* = (Σ(x − c)²* − n*(x̄* − c)²)/(n* − 1), each cut back into its range
//! (002's boundary-inflated truncation: x̄* into [c₀, c₁], S²* into
//! [0, (c₁ − c₀)²/4 · n*/(n* − 1)], n* to at least 2). Then
//! σ²* ~ Inv-Gamma((n* − 1)/2, (n* − 1)S²*/2), μ* ~ N(x̄*, σ²*/n*) and r
//! values x̃ ~ N(μ*, σ²*), each cut to [c₀, c₁] (002 §4.2 does the same).

use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::cauchy::{sample_gamma, standard_normal_sample};
use serde::{Deserialize, Serialize};

use super::DipsError;
use super::cells::per_set_epsilon;
use super::grid::{GridSum, check_bounds};
use crate::measure::Accountant;
use crate::privacy::MechanismRecord;

type Result<T, E = DipsError> = std::result::Result<T, E>;

/// Public inputs of a normal MODIPS release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NormalSpec {
    /// The attribute's name (for records and errors).
    pub column: String,
    /// Lower public bound c₀.
    pub lo: f64,
    /// Upper public bound c₁.
    pub hi: f64,
    /// m, synthetic sets (each gets ε/m).
    pub sets: usize,
    /// r, values per set.
    pub rows: u64,
    /// A declared public n (then n is not sanitized).
    pub public_n: Option<u64>,
}

/// One set's sanitized sufficient statistics (DP output).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NormalStatistics {
    /// n* (≥ 2).
    pub n: f64,
    /// x̄* in [c₀, c₁].
    pub mean: f64,
    /// S²* in its range.
    pub variance: f64,
}

/// What a release produced.
#[derive(Debug, Clone, PartialEq)]
pub struct NormalRelease {
    /// The synthetic values of each set.
    pub sets: Vec<Vec<f64>>,
    /// The sanitized statistics of each set.
    pub statistics: Vec<NormalStatistics>,
}

impl NormalSpec {
    /// The public checks, before anything is charged.
    pub fn check(&self, epsilon: f64) -> Result<()> {
        per_set_epsilon(epsilon, self.sets, true)?;
        check_bounds(|| self.column.clone(), self.lo, self.hi)?;
        if self.rows == 0 {
            return Err(DipsError::NoRows);
        }
        match self.public_n {
            Some(n) if n < 2 => Err(DipsError::PublicRows(n)),
            _ => Ok(()),
        }
    }
}

/// Sanitizes `values` (protected; non-null) m times and draws r synthetic
/// values per set from the posterior given each set's statistics.
pub fn modips_normal(
    values: &[f64],
    spec: &NormalSpec,
    epsilon: f64,
    accountant: &mut dyn Accountant,
    rng: &mut DpRng,
) -> Result<NormalRelease> {
    let mut sums = NormalSums::new(spec, epsilon)?;
    values.iter().for_each(|&x| sums.add(x));
    let statistics = sums.release(spec, accountant, rng)?;
    // Post-processing from here on.
    let sets = statistics.iter().map(|s| draw_set(rng, s, spec.lo, spec.hi, spec.rows)).collect();
    Ok(NormalRelease { sets, statistics })
}

/// The exact centred sums (and count) of a normal MODIPS release, added
/// value by value so that a caller can stream the data (protected:
/// released only by [`NormalSums::release`]).
pub struct NormalSums {
    eps: f64,
    lo: f64,
    hi: f64,
    centre: f64,
    sum: GridSum,
    squares: GridSum,
    count: Option<GridSum>,
}

// The exact sums are protected: Debug never shows them.
dpflow_udfs::protected_debug!(NormalSums);

impl NormalSums {
    /// Empty sums for `spec` at a total ε (the public checks run here).
    pub fn new(spec: &NormalSpec, epsilon: f64) -> Result<Self> {
        spec.check(epsilon)?;
        let (lo, hi) = (spec.lo, spec.hi);
        let h = 0.5 * (hi - lo);
        let c = lo + h;
        let parts = if spec.public_n.is_some() { 2.0 } else { 3.0 };
        let eps = epsilon / spec.sets as f64 / parts;
        // Exact grid sums ([`super::grid`]).
        let name = &spec.column;
        Ok(Self {
            eps,
            lo,
            hi,
            centre: c,
            sum: GridSum::new(format!("modips sum({name} − {c})"), h, eps, 1),
            squares: GridSum::new(format!("modips sum(({name} − {c})²)"), h * h, eps, 1),
            count: spec.public_n.is_none().then(|| GridSum::count(format!("modips count({name})"), 1)),
        })
    }

    /// Adds one value, clamped to the bounds; a NaN is dropped from every
    /// statistic (a row-wise, 1-stable map).
    pub fn add(&mut self, x: f64) {
        if x.is_nan() {
            return;
        }
        let d = x.clamp(self.lo, self.hi) - self.centre;
        self.sum.add(0, d);
        self.squares.add(0, d * d);
        if let Some(n) = &mut self.count {
            n.add(0, 1.0);
        }
    }

    /// Charges all m sets' releases at once, then draws each set's noisy
    /// sums and turns them into its statistics.
    pub fn release(
        self,
        spec: &NormalSpec,
        accountant: &mut dyn Accountant,
        rng: &mut DpRng,
    ) -> Result<Vec<NormalStatistics>> {
        let eps = self.eps;
        let stats: Vec<&GridSum> =
            [Some(&self.sum), Some(&self.squares), self.count.as_ref()].into_iter().flatten().collect();
        let records: Vec<MechanismRecord> =
            (1..=spec.sets).flat_map(|set| stats.iter().map(move |s| s.record(set, eps))).collect();
        accountant.charge(&records)?;
        Ok((0..spec.sets)
            .map(|_| {
                let s1 = self.sum.noisy(rng, eps)[0];
                let s2 = self.squares.noisy(rng, eps)[0];
                // Without a count the declared public n is used.
                let n = self.count.as_ref().map_or(spec.public_n.unwrap_or(0) as f64, |n| n.noisy(rng, eps)[0]);
                statistics(n, s1, s2, self.lo, self.hi)
            })
            .collect())
    }
}

/// x̄*, S²* and n* from the noisy sums, cut into their ranges (module docs).
pub fn statistics(n: f64, sum: f64, squares: f64, lo: f64, hi: f64) -> NormalStatistics {
    let c = lo + 0.5 * (hi - lo);
    let n = n.round().max(2.0);
    let mean = (c + sum / n).clamp(lo, hi);
    let max_var = (hi - lo).powi(2) / 4.0 * n / (n - 1.0);
    let variance = ((squares - n * (mean - c).powi(2)) / (n - 1.0)).clamp(0.0, max_var);
    NormalStatistics { n, mean, variance }
}

/// One posterior draw (σ², μ) given sufficient statistics, then r values.
pub fn draw_set(rng: &mut DpRng, s: &NormalStatistics, lo: f64, hi: f64, rows: u64) -> Vec<f64> {
    let (var, mu) = posterior_draw(rng, s);
    let sd = var.sqrt();
    (0..rows).map(|_| (mu + sd * standard_normal_sample(rng)).clamp(lo, hi)).collect()
}

/// (σ², μ) from the posterior under f(μ, σ²) ∝ σ⁻² (002 §4.2).
pub fn posterior_draw(rng: &mut DpRng, s: &NormalStatistics) -> (f64, f64) {
    let shape = (s.n - 1.0) / 2.0;
    let scale = (s.n - 1.0) * s.variance / 2.0;
    let var = scale / sample_gamma(rng, shape);
    let mu = s.mean + (var / s.n).sqrt() * standard_normal_sample(rng);
    (var, mu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::ReleaseAccountant;
    use crate::privacy::{Budget, PrivacyFilter, PrivacyLoss};

    fn spec(public_n: Option<u64>) -> NormalSpec {
        NormalSpec { column: "x".into(), lo: -3.0, hi: 4.0, sets: 5, rows: 50, public_n }
    }

    #[test]
    fn it_spends_exactly_its_budget_split_over_sets_and_statistics() {
        let mut rng = DpRng::unsafe_seeded(1);
        for (public_n, per_set) in [(None, 3), (Some(40), 2)] {
            let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 2.0 }));
            let rel = modips_normal(&[0.5; 40], &spec(public_n), 2.0, &mut acc, &mut rng).unwrap();
            let spent: f64 = acc
                .records()
                .iter()
                .map(|r| if let PrivacyLoss::Pure { epsilon } = r.loss { epsilon } else { 0.0 })
                .sum();
            assert!((spent - 2.0).abs() < 1e-12, "{spent}");
            assert_eq!(acc.records().len(), 5 * per_set);
            assert_eq!(rel.sets.len(), 5);
            // Post-processing never leaves the bounds.
            assert!(rel.sets.iter().flatten().all(|&x| (-3.0..=4.0).contains(&x)));
            assert!(rel.statistics.iter().all(|s| s.n >= 2.0 && (-3.0..=4.0).contains(&s.mean) && s.variance >= 0.0));
        }
    }

    #[test]
    fn bad_public_inputs_are_refused() {
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 2.0 }));
        let mut rng = DpRng::unsafe_seeded(1);
        for s in [
            NormalSpec { lo: 1.0, hi: 1.0, ..spec(None) },
            NormalSpec { hi: f64::INFINITY, ..spec(None) },
            NormalSpec { sets: 0, ..spec(None) },
            NormalSpec { rows: 0, ..spec(None) },
            spec(Some(1)),
            NormalSpec { lo: -1e160, hi: 1e160, ..spec(None) },
        ] {
            assert!(modips_normal(&[0.0], &s, 1.0, &mut acc, &mut rng).is_err());
        }
        assert!(acc.records().is_empty());
    }

    /// Statistics by hand: c = 0.5, n* = 4, Σ(x − c)* = 2, Σ(x − c)²* = 5
    /// → x̄* = 1, S²* = (5 − 4·0.25)/3 = 4/3; out-of-range values are cut.
    #[test]
    fn statistics_match_a_hand_computation_and_stay_in_range() {
        let s = statistics(4.2, 2.0, 5.0, -3.0, 4.0);
        assert_eq!(s.n, 4.0);
        assert!((s.mean - 1.0).abs() < 1e-12);
        assert!((s.variance - 4.0 / 3.0).abs() < 1e-12);
        let s = statistics(-7.0, 1e6, -5.0, -3.0, 4.0);
        assert_eq!((s.n, s.mean, s.variance), (2.0, 4.0, 0.0));
        let s = statistics(3.0, 0.0, 1e9, -3.0, 4.0);
        assert!((s.variance - 49.0 / 4.0 * 1.5).abs() < 1e-12);
    }

    /// The conjugate posterior by hand: E[σ²] = (n − 1)S²/(n − 3) and
    /// E[μ] = x̄; for n = 11, S² = 2: E[σ²] = 20/8 = 2.5. Checked on 20 000
    /// draws within 5 standard errors (sd of σ² is E[σ²]·√(2/(n − 5)) ≈ 1.44).
    #[test]
    fn posterior_draws_match_the_conjugate_moments() {
        let mut rng = DpRng::unsafe_seeded(4);
        let s = NormalStatistics { n: 11.0, mean: 0.7, variance: 2.0 };
        let k = 20_000;
        let (mut sv, mut sm) = (0.0, 0.0);
        for _ in 0..k {
            let (v, m) = posterior_draw(&mut rng, &s);
            sv += v;
            sm += m;
        }
        let se_v = 2.5 * (2.0f64 / 6.0).sqrt() / (k as f64).sqrt();
        assert!((sv / k as f64 - 2.5).abs() < 5.0 * se_v, "{}", sv / k as f64);
        // sd(μ) = √(E[σ²]/n) ≈ 0.48.
        assert!((sm / k as f64 - 0.7).abs() < 5.0 * 0.48 / (k as f64).sqrt());
    }

    /// The review's counterexample to a float running sum: 2²⁰ − 1 ones, a
    /// tiny value and many tinier ones, with or without one more 1 first.
    /// With per-row grid rounding the exact sums differ by exactly one
    /// row's grid value, whatever the order.
    #[test]
    fn one_row_moves_the_sums_by_at_most_its_sensitivity() {
        use dpflow_udfs::noise::NoiseDistribution;
        use dpflow_udfs::noise::real::grid_exponent;
        let (lo, hi, eps) = (-1.0, 1.0, 1.0);
        let k1 = grid_exponent(&NoiseDistribution::Laplace { scale: 1.0 / eps }, 1.0);
        let u = 2f64.powi(-33);
        let mut d: Vec<f64> = vec![1.0; (1 << 20) - 1];
        d.push(2f64.powi(-32));
        d.extend(std::iter::repeat_n(-0.75 * u, 1 << 14));
        let mut d2 = vec![1.0];
        d2.extend(&d);
        // The sums MODIPS-normal releases (`GridSum`, module `grid`).
        let units = |v: &[f64]| {
            let mut s = GridSum::new("x".into(), 1.0, eps, 1);
            v.iter().for_each(|&x| s.add(0, x.clamp(lo, hi)));
            s.sums[0]
        };
        let bound = (1.0 / 2f64.powi(k1)).ceil() as i128;
        assert!((units(&d2) - units(&d)).abs() <= bound);
        // The float running sums differ by more than the sensitivity.
        let float = |v: &[f64]| v.iter().fold(0.0f64, |a, &x| a + x);
        assert!((float(&d2) - float(&d)) > 1.0);
    }

    /// NaN rows are dropped (they used to turn the released sums into NaN
    /// without noise); ±∞ are clamped to the bounds.
    #[test]
    fn nan_rows_are_dropped_and_infinities_clamped() {
        let mut rng = DpRng::unsafe_seeded(2);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1e6 }));
        let data = [0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
        let rel = modips_normal(&data, &NormalSpec { sets: 1, ..spec(None) }, 1e5, &mut acc, &mut rng).unwrap();
        let s = rel.statistics[0];
        assert_eq!(s.n, 3.0);
        assert!((s.mean - 0.5).abs() < 1e-3, "{s:?}");
        assert!(rel.sets[0].iter().all(|x| x.is_finite()));
    }

    /// With a large budget the sets recover the data's mean and variance.
    #[test]
    fn with_little_noise_the_sets_recover_the_data() {
        let mut rng = DpRng::unsafe_seeded(9);
        let data: Vec<f64> = (0..2000).map(|i| ((i % 7) as f64 - 3.0) * 0.5).collect();
        let mean = data.iter().sum::<f64>() / 2000.0;
        let var = data.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 1999.0;
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1e6 }));
        let rel = modips_normal(&data, &NormalSpec { rows: 2000, ..spec(None) }, 1e5, &mut acc, &mut rng).unwrap();
        for st in &rel.statistics {
            assert!((st.mean - mean).abs() < 1e-3 && (st.variance - var).abs() < 1e-3, "{st:?}");
        }
    }
}
