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

use dpflow_udfs::noise::cauchy::{sample_gamma, standard_normal_sample};
use dpflow_udfs::noise::real::{grid_exponent, to_grid_units};
use dpflow_udfs::noise::{DpRng, NoiseDistribution};
use serde::{Deserialize, Serialize};

use super::DipsError;
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
        if !(epsilon.is_finite() && epsilon > 0.0) {
            return Err(DipsError::Epsilon(epsilon));
        }
        // h² / ε must be a finite scale (bounds up to about ±1e150).
        let h = 0.5 * (self.hi - self.lo);
        if !(self.lo.is_finite()
            && self.hi.is_finite()
            && self.lo < self.hi
            && (h * h * 1e12).is_finite()
            && h >= 1e-100)
        {
            return Err(DipsError::Bounds { column: self.column.clone(), lo: self.lo, hi: self.hi });
        }
        if self.sets == 0 {
            return Err(DipsError::NoSets);
        }
        if self.rows == 0 {
            return Err(DipsError::NoRows);
        }
        let per_set = epsilon / self.sets as f64;
        if per_set > super::cells::MAX_EPSILON_PER_SET {
            return Err(DipsError::EpsilonTooLarge { epsilon: per_set, max: super::cells::MAX_EPSILON_PER_SET });
        }
        if per_set < super::cells::MIN_EPSILON_PER_SET {
            return Err(DipsError::EpsilonPerSet {
                epsilon: per_set,
                sets: self.sets,
                min: super::cells::MIN_EPSILON_PER_SET,
            });
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
    spec.check(epsilon)?;
    let (lo, hi) = (spec.lo, spec.hi);
    let h = 0.5 * (hi - lo);
    let c = lo + h;
    let parts = if spec.public_n.is_some() { 2.0 } else { 3.0 };
    let eps = epsilon / spec.sets as f64 / parts;
    // Public grids (docs/PRIVACY.md §0): each clamped, centred value and its
    // square is rounded to its grid once, and the sums are exact integers,
    // so one row moves them by at most ⌈h/g₁⌉ and ⌈h²/g₂⌉ units whatever
    // the order of the rows (a float running sum would not: its rounding
    // depends on the other rows).
    let k1 = grid_exponent(&NoiseDistribution::Laplace { scale: h / eps }, h);
    let k2 = grid_exponent(&NoiseDistribution::Laplace { scale: h * h / eps }, h * h);
    let d1 = (h / 2f64.powi(k1)).ceil();
    let d2 = (h * h / 2f64.powi(k2)).ceil();
    // A NaN row is dropped from every statistic (a row-wise, 1-stable map).
    let (mut s1, mut s2, mut count) = (0i128, 0i128, 0i128);
    for &x in values.iter().filter(|x| !x.is_nan()) {
        let d = x.clamp(lo, hi) - c;
        s1 += to_grid_units(d, k1).clamp(-(d1 as i128), d1 as i128);
        s2 += to_grid_units(d * d, k2).clamp(0, d2 as i128);
        count += 1;
    }
    // Every set's charge at once, before any draw. The noise is in grid
    // units, so the real-valued scales are the unit sensitivities times g.
    let (g1, g2) = (2f64.powi(k1), 2f64.powi(k2));
    let name = &spec.column;
    let mut records = Vec::new();
    for set in 1..=spec.sets {
        records.push(MechanismRecord::laplace(format!("modips sum({name} − {c}) set {set}"), d1 * g1, d1 * g1 / eps));
        records.push(MechanismRecord::laplace(
            format!("modips sum(({name} − {c})²) set {set}"),
            d2 * g2,
            d2 * g2 / eps,
        ));
        if spec.public_n.is_none() {
            records.push(MechanismRecord::laplace(format!("modips count({name}) set {set}"), 1.0, 1.0 / eps));
        }
    }
    accountant.charge(&records)?;
    let noisy = |rng: &mut DpRng, exact: i128, units: f64, k: i32| {
        let noise = NoiseDistribution::Laplace { scale: units / eps };
        exact.saturating_add(noise.sample_integer(rng)) as f64 * 2f64.powi(k)
    };
    let mut release = NormalRelease { sets: Vec::with_capacity(spec.sets), statistics: Vec::new() };
    for _ in 0..spec.sets {
        let sum = noisy(rng, s1, d1, k1);
        let squares = noisy(rng, s2, d2, k2);
        let n = match spec.public_n {
            Some(n) => n as f64,
            None => noisy(rng, count, 1.0, 0),
        };
        // Post-processing from here on.
        let stats = statistics(n, sum, squares, lo, hi);
        release.sets.push(draw_set(rng, &stats, lo, hi, spec.rows));
        release.statistics.push(stats);
    }
    Ok(release)
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
        let (lo, hi, eps) = (-1.0, 1.0, 1.0);
        let k1 = grid_exponent(&NoiseDistribution::Laplace { scale: 1.0 / eps }, 1.0);
        let u = 2f64.powi(-33);
        let mut d: Vec<f64> = vec![1.0; (1 << 20) - 1];
        d.push(2f64.powi(-32));
        d.extend(std::iter::repeat_n(-0.75 * u, 1 << 14));
        let mut d2 = vec![1.0];
        d2.extend(&d);
        let units = |v: &[f64]| v.iter().map(|&x| to_grid_units(x.clamp(lo, hi), k1)).sum::<i128>();
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
