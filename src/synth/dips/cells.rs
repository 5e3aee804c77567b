//! The DIPS synthesizers of 002 over a table of K cells (the full
//! cross-tabulation of categorical attributes, numeric attributes binned
//! by public edges): Laplace sanitizer and perturbed histogram (§3.1.1,
//! §3.1.2 eq. (5)), smoothed histogram (§3.1.2 eqs. (6)–(7)),
//! Multinomial–Dirichlet and Binomial–Beta McClure–Reiter (§3.2.1), and
//! MODIPS with the Dirichlet–multinomial model (§3.2.2, §4.1).
//!
//! **Neighbours.** dpflow's are add/remove one row (docs/PRIVACY.md §0);
//! 002 keeps n public. Adding a row moves one cell count by one, so the K
//! counts have L1 sensitivity 1 (002's Δ = 1). The synthesizers whose
//! privacy comes from sampling (MD, BB-MR, smoothed) state their ε in
//! terms of n, the number of *synthetic* rows drawn in 002; here that
//! number, r, is a public input (or a charged noisy count), and the
//! proofs below hold for every n. With r = n they are 002's formulas.
//!
//! **McClure–Reiter and the smoothed histogram are one mechanism.** Both
//! draw r rows independently from p_k = (n_k + α)/(n + Kα):
//! - Adding a row in cell k multiplies p_k by
//!   (n_k + 1 + α)/(n_k + α) · (n + Kα)/(n + 1 + Kα) ∈ [(1 + 1/α)⁻¹, 1 + 1/α]
//!   and every other p_j by (n + Kα)/(n + 1 + Kα) ∈ [(1 + 1/(Kα))⁻¹, 1].
//!   So each draw is ln(1 + 1/α)-DP, and r draws are ε-DP when
//!   α = 1/(e^{ε/r} − 1): 002's α₁ = α₂ = (e^{ε/n} − 1)⁻¹ with r = n.
//! - Eq. (6) mixes the empirical histogram with the uniform one,
//!   (1 − λ)·n_k/n + λ/K. It equals p_k exactly when λ = Kα/(n + Kα), and
//!   with α = 1/(e^{ε/n} − 1) this is eq. (7)'s bound λ = K/(K + n(e^{ε/n} − 1))
//!   (test `eq_7_lambda_is_the_pseudo_count_mixture`). The pseudo-count
//!   form needs no n, which add/remove neighbours make private.
//!
//! **Multinomial–Dirichlet** draws r rows from the Dirichlet–multinomial
//! with parameters a_k = n_k + α. Adding a row in cell k multiplies the
//! probability of synthetic counts m by (A/(A + r))·((a_k + m_k)/a_k)
//! (A = Σ a), which lies in [(1 + r/α)⁻¹, 1 + r/α]. So α = r/(e^ε − 1)
//! gives ε-DP: 002's α* = n/(e^ε − 1) with r = n.
//!
//! **Laplace sanitizer / perturbed histogram / MODIPS** add discrete
//! Laplace noise of scale 1/ε to every cell (L1 sensitivity 1). Every step
//! after the noise is post-processing. Negative counts become 0 (002's
//! boundary-inflated truncation at the lower bound; the upper bound n is
//! not public here). The sanitizer then either normalises and samples r
//! rows (the default, 002's perturbed histogram) or rounds the
//! table to r rows (002's Laplace sanitizer in §4.1 releases the sanitized
//! counts themselves). MODIPS draws π ~ Dirichlet(α₀ + n*) from the
//! posterior given the sanitized counts, then r rows from π.
//!
//! **Multiple sets.** m sets each get ε/m (002 §4: sequential composition
//! across sets), and each is drawn from its own sanitization.

use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::NoiseDistribution;
use dpflow_udfs::noise::cauchy::sample_gamma;
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use super::DipsError;
use super::exact::{alpha_units, categorical_counts, polya_urn_counts};
use crate::measure::Accountant;
use crate::privacy::{MechanismRecord, PrivacyLoss};

type Result<T, E = DipsError> = std::result::Result<T, E>;

/// A DIPS synthesizer over a table of cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CellMechanism {
    /// Discrete Laplace on every cell, negatives to 0, then rows (002 §3.1.1).
    LaplaceSanitizer,
    /// The same mechanism on binned numeric attributes (002 §3.1.2 eq. (5)).
    PerturbedHistogram,
    /// r rows from (n_k + α)/(n + Kα), α = 1/(e^{ε/r} − 1) (002 eqs. (6)–(7)).
    SmoothedHistogram,
    /// Dirichlet–multinomial with α = r/(e^ε − 1) (002 §3.2.1).
    MultinomialDirichlet,
    /// Binomial–Beta McClure–Reiter: the smoothed histogram's mechanism,
    /// 002's name for it on categorical data (§3.2.1).
    BinomialBeta,
    /// Sanitized counts, π ~ Dirichlet(α₀ + n*), r rows from π (002 §3.2.2, §4.1).
    Modips,
}

impl CellMechanism {
    /// The name in commands and records.
    pub fn name(&self) -> &'static str {
        match self {
            CellMechanism::LaplaceSanitizer => "laplace-sanitizer",
            CellMechanism::PerturbedHistogram => "perturbed-histogram",
            CellMechanism::SmoothedHistogram => "smoothed-histogram",
            CellMechanism::MultinomialDirichlet => "multinomial-dirichlet",
            CellMechanism::BinomialBeta => "binomial-beta",
            CellMechanism::Modips => "modips",
        }
    }

    /// Whether each set reflects the uncertainty of the DP noise (so the
    /// 002 eqs. (9)–(11) rule applies across sets).
    pub fn noise_aware(&self) -> bool {
        !matches!(self, CellMechanism::SmoothedHistogram | CellMechanism::BinomialBeta)
    }
}

/// How a sanitized table becomes r rows (post-processing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Generate {
    /// r independent draws from the normalised table.
    #[default]
    Sample,
    /// The table scaled to r rows by randomized rounding (each cell
    /// ⌊r·p_k⌋ or ⌈r·p_k⌉, total exactly r): the sanitized counts themselves.
    Round,
}

/// Settings of a cell synthesizer (all public).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellOptions {
    /// m, the number of synthetic sets (each gets ε/m).
    pub sets: usize,
    /// r, rows per set. The sampling mechanisms' ε depends on it, so it is
    /// fixed before the data is read. 0 (noise-based mechanisms only): each
    /// set has as many rows as its noisy counts add up to (before negatives
    /// are cut: an unbiased estimate of n).
    pub rows: u64,
    /// MODIPS's Dirichlet prior α₀ per cell (002 §4.1: 1/3, Kerman 2011).
    pub prior: f64,
    /// Row generation for the noise-based mechanisms.
    pub generate: Generate,
}

impl Default for CellOptions {
    fn default() -> Self {
        Self { sets: 1, rows: 0, prior: 1.0 / 3.0, generate: Generate::Sample }
    }
}

/// α = 1/(e^{ε/r} − 1): McClure–Reiter's pseudo-count for r draws (module docs).
pub fn pseudo_count(epsilon: f64, rows: u64) -> f64 {
    1.0 / (epsilon / rows as f64).exp_m1()
}

/// α = r/(e^ε − 1): the Multinomial–Dirichlet prior for r rows (module docs).
pub fn dirichlet_prior(epsilon: f64, rows: u64) -> f64 {
    rows as f64 / epsilon.exp_m1()
}

/// 002 eq. (7): λ = K/(K + n(e^{ε/n} − 1)).
pub fn smoothing_lambda(epsilon: f64, n: u64, cells: usize) -> f64 {
    let k = cells as f64;
    k / (k + n as f64 * (epsilon / n as f64).exp_m1())
}

/// What a cell synthesizer released.
#[derive(Debug, Clone, PartialEq)]
pub struct CellRelease {
    /// Synthetic counts per set (each sums to r).
    pub sets: Vec<Vec<u64>>,
    /// The sanitized counts of each set, for the noise-based mechanisms
    /// (after negatives → 0; DP outputs, e.g. for a release record).
    pub sanitized: Vec<Vec<f64>>,
}

/// The smallest ε per set a DIPS mechanism accepts: below it the noise
/// scale (1/ε) or the pseudo-count leaves the range its samplers represent
/// exactly, and no release would be useful anyway.
pub const MIN_EPSILON_PER_SET: f64 = 1e-9;

/// The largest ε per set the grid-based statistics (MODIPS-normal, GLOM)
/// accept: their per-row bound is about 2²⁰·max(1, ε) grid units, which
/// stays far below i128's range for any number of rows.
pub const MAX_EPSILON_PER_SET: f64 = 1e9;

/// ε/m after the checks every DIPS mechanism shares: ε positive and finite,
/// m ≥ 1, ε/m at least [`MIN_EPSILON_PER_SET`] and, for the grid-based
/// statistics (`grid`), at most [`MAX_EPSILON_PER_SET`].
pub(crate) fn per_set_epsilon(epsilon: f64, sets: usize, grid: bool) -> Result<f64> {
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(DipsError::Epsilon(epsilon));
    }
    if sets == 0 {
        return Err(DipsError::NoSets);
    }
    let eps = epsilon / sets as f64;
    if eps < MIN_EPSILON_PER_SET {
        return Err(DipsError::EpsilonPerSet { epsilon: eps, sets, min: MIN_EPSILON_PER_SET });
    }
    if grid && eps > MAX_EPSILON_PER_SET {
        return Err(DipsError::EpsilonTooLarge { epsilon: eps, max: MAX_EPSILON_PER_SET });
    }
    Ok(eps)
}

/// The pseudo-count of a sampling mechanism (`None`: a noise-based one).
fn calibration(mechanism: CellMechanism, eps: f64, rows: u64) -> Option<f64> {
    match mechanism {
        CellMechanism::SmoothedHistogram | CellMechanism::BinomialBeta => Some(pseudo_count(eps, rows)),
        CellMechanism::MultinomialDirichlet => Some(dirichlet_prior(eps, rows)),
        _ => None,
    }
}

/// The public checks of a run, before anything is charged. They also keep
/// the exact samplers' integer weights below 2¹²⁷: K cells of weight
/// n_k·D + ⌈α·D⌉ plus r·D, where n·D and r·D are each below 2⁹⁶.
pub fn check(mechanism: CellMechanism, cells: usize, epsilon: f64, options: &CellOptions) -> Result<()> {
    units(mechanism, cells, epsilon, options).map(|_| ())
}

/// [`check`], returning ε/m and the sampling mechanisms' pseudo-count α
/// with its integer weight ⌈α·D⌉.
fn units(
    mechanism: CellMechanism,
    cells: usize,
    epsilon: f64,
    options: &CellOptions,
) -> Result<(f64, Option<(f64, u128)>)> {
    let eps = per_set_epsilon(epsilon, options.sets, false)?;
    if cells == 0 {
        return Err(DipsError::NoCells);
    }
    if !(options.prior.is_finite() && options.prior > 0.0) {
        return Err(DipsError::Prior(options.prior));
    }
    let Some(alpha) = calibration(mechanism, eps, options.rows) else {
        return Ok((eps, None));
    };
    if options.rows == 0 {
        return Err(DipsError::NoRows);
    }
    let fits = alpha_units(alpha)
        .filter(|u| u.checked_mul(cells as u128).is_some_and(|w| w < 1u128 << 126) && options.rows < 1u64 << 63);
    match fits {
        Some(u) => Ok((eps, Some((alpha, u)))),
        None => Err(DipsError::PseudoCount { alpha, epsilon: eps, rows: options.rows, cells }),
    }
}

/// Runs `mechanism` on the exact cell counts `exact` (protected) with total
/// budget ε, charging `accountant` before each set is drawn.
pub fn synthesize(
    mechanism: CellMechanism,
    exact: &[u64],
    target: &str,
    epsilon: f64,
    options: &CellOptions,
    accountant: &mut dyn Accountant,
    rng: &mut DpRng,
) -> Result<CellRelease> {
    let (eps, alpha) = units(mechanism, exact.len(), epsilon, options)?;
    let (m, r) = (options.sets, options.rows);
    // Every set's charge at once, before any draw: all or nothing.
    let records: Vec<MechanismRecord> = (1..=m)
        .map(|set| {
            let target = format!("{}({target}) set {set}", mechanism.name());
            match alpha {
                Some((a, _)) => sampling_record(mechanism, target, eps, a, r),
                None => MechanismRecord::laplace(target, 1.0, 1.0 / eps),
            }
        })
        .collect();
    accountant.charge(&records)?;
    let mut release = CellRelease { sets: Vec::with_capacity(m), sanitized: Vec::new() };
    for _ in 0..m {
        let counts = match alpha {
            Some((_, units)) if mechanism == CellMechanism::MultinomialDirichlet => {
                polya_urn_counts(rng, exact, units, r)
            }
            Some((_, units)) => categorical_counts(rng, exact, units, r),
            None => {
                let (noisy, total) = sanitize(exact, eps, rng);
                let r = if r == 0 { total.max(0) as u64 } else { r };
                let counts = match (mechanism, options.generate) {
                    (CellMechanism::Modips, _) => {
                        let pi = dirichlet_draw(rng, &noisy, options.prior);
                        multinomial(rng, &pi, r)
                    }
                    (_, Generate::Sample) => multinomial(rng, &noisy, r),
                    (_, Generate::Round) => randomized_round(rng, &noisy, r),
                };
                release.sanitized.push(noisy);
                counts
            }
        };
        release.sets.push(counts);
    }
    Ok(release)
}

fn sampling_record(mechanism: CellMechanism, target: String, epsilon: f64, alpha: f64, rows: u64) -> MechanismRecord {
    MechanismRecord {
        mechanism: mechanism.name().into(),
        target,
        sensitivity: None,
        noise: None,
        loss: PrivacyLoss::Pure { epsilon },
        params: serde_json::json!({ "alpha": alpha, "rows": rows }),
    }
}

/// Adds discrete Laplace noise of scale 1/ε to every cell (L1 sensitivity
/// 1 under add/remove-one; the caller has charged ε) and sets negatives to
/// 0. The addition saturates, so no count can wrap around.
///
/// Also returns the sum of the noisy counts *before* the negatives are cut,
/// an unbiased estimate of n (the cut sum is biased upwards by about
/// K·b/2 on a sparse table of K cells with noise scale b).
fn sanitize(exact: &[u64], epsilon: f64, rng: &mut DpRng) -> (Vec<f64>, i128) {
    let sampler = NoiseDistribution::Laplace { scale: 1.0 / epsilon }.integer_sampler();
    let mut total = 0i128;
    let noisy = exact
        .iter()
        .map(|&c| {
            let v = (c as i128).saturating_add(sampler.sample(rng));
            total = total.saturating_add(v);
            v.max(0) as f64
        })
        .collect();
    (noisy, total)
}

/// A Dirichlet(prior + counts) draw (post-processing: float Gamma variates).
pub fn dirichlet_draw<R: Rng + ?Sized>(rng: &mut R, counts: &[f64], prior: f64) -> Vec<f64> {
    let g: Vec<f64> = counts.iter().map(|&c| sample_gamma(rng, c.max(0.0) + prior)).collect();
    let s: f64 = g.iter().sum();
    if s > 0.0 && s.is_finite() {
        g.iter().map(|x| x / s).collect()
    } else {
        vec![1.0 / counts.len() as f64; counts.len()]
    }
}

/// r independent draws from weights `w` (normalised; uniform when they are
/// all 0), as counts. Post-processing only: float inverse CDF.
pub fn multinomial<R: Rng + ?Sized>(rng: &mut R, w: &[f64], r: u64) -> Vec<u64> {
    let total: f64 = w.iter().sum();
    let k = w.len();
    let mut out = vec![0u64; k];
    if !(total > 0.0 && total.is_finite()) {
        for _ in 0..r {
            out[rng.random_range(0..k)] += 1;
        }
        return out;
    }
    let mut cdf = Vec::with_capacity(k);
    let mut acc = 0.0;
    for &x in w {
        acc += x / total;
        cdf.push(acc);
    }
    for _ in 0..r {
        let u: f64 = rng.random::<f64>();
        let i = cdf.partition_point(|&c| c <= u).min(k - 1);
        out[i] += 1;
    }
    out
}

/// `w` scaled to r rows by randomized rounding (post-processing).
pub fn randomized_round<R: Rng + ?Sized>(rng: &mut R, w: &[f64], r: u64) -> Vec<u64> {
    let mut out = Vec::new();
    dpflow_udfs::synth::randomized_round(rng, w, r, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::ReleaseAccountant;
    use crate::privacy::{Budget, PrivacyFilter};

    fn accountant(epsilon: f64) -> ReleaseAccountant {
        ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon }))
    }

    fn spent(a: &ReleaseAccountant) -> f64 {
        a.records().iter().map(|r| if let PrivacyLoss::Pure { epsilon } = r.loss { epsilon } else { f64::NAN }).sum()
    }

    const ALL: [CellMechanism; 6] = [
        CellMechanism::LaplaceSanitizer,
        CellMechanism::PerturbedHistogram,
        CellMechanism::SmoothedHistogram,
        CellMechanism::MultinomialDirichlet,
        CellMechanism::BinomialBeta,
        CellMechanism::Modips,
    ];

    #[test]
    fn every_mechanism_spends_exactly_its_budget_and_writes_r_rows_per_set() {
        let mut rng = DpRng::unsafe_seeded(3);
        for mech in ALL {
            for m in [1usize, 5] {
                let mut acc = accountant(1.0);
                let opts = CellOptions { sets: m, rows: 37, ..Default::default() };
                let rel = synthesize(mech, &[10, 0, 25, 3], "x", 1.0, &opts, &mut acc, &mut rng).unwrap();
                assert!((spent(&acc) - 1.0).abs() < 1e-12, "{mech:?} m={m}: {}", spent(&acc));
                assert_eq!(acc.records().len(), m, "{mech:?}: one charge per set");
                assert_eq!(rel.sets.len(), m);
                assert!(rel.sets.iter().all(|s| s.len() == 4 && s.iter().sum::<u64>() == 37));
                // A second run does not fit in the spent budget.
                assert!(synthesize(mech, &[1, 2, 3, 4], "x", 1.0, &opts, &mut acc, &mut rng).is_err());
            }
        }
    }

    #[test]
    fn bad_public_inputs_are_refused_before_any_charge() {
        let mut rng = DpRng::unsafe_seeded(3);
        let mut acc = accountant(1.0);
        let ok = CellOptions { sets: 1, rows: 10, ..Default::default() };
        let cases = [
            (0.0, ok.clone()),
            (f64::NAN, ok.clone()),
            (1.0, CellOptions { sets: 0, ..ok.clone() }),
            (1.0, CellOptions { prior: -1.0, ..ok.clone() }),
        ];
        for (eps, opts) in cases {
            assert!(synthesize(CellMechanism::Modips, &[1, 2], "x", eps, &opts, &mut acc, &mut rng).is_err());
        }
        assert!(synthesize(CellMechanism::Modips, &[], "x", 1.0, &ok, &mut acc, &mut rng).is_err());
        // The sampling mechanisms' ε depends on r: it must be given.
        let no_rows = CellOptions { rows: 0, ..ok.clone() };
        for mech in [CellMechanism::BinomialBeta, CellMechanism::SmoothedHistogram, CellMechanism::MultinomialDirichlet]
        {
            let e = synthesize(mech, &[1, 2], "x", 1.0, &no_rows, &mut acc, &mut rng);
            assert!(matches!(e, Err(DipsError::NoRows)), "{e:?}");
        }
        assert!(acc.records().is_empty());
    }

    /// 002 eq. (7) by hand: K = 10, n = 100, ε = 1:
    /// e^{0.01} − 1 = 0.010050167…, λ = 10/(10 + 1.0050167) = 0.908677…
    #[test]
    fn eq_7_lambda_matches_a_hand_computation() {
        let l = smoothing_lambda(1.0, 100, 10);
        assert!((l - 10.0 / (10.0 + 1.005_016_708_416_795)).abs() < 1e-12, "{l}");
        assert!((l - 0.908_677_2).abs() < 1e-6);
        // ε → ∞: λ → 0; ε → 0: λ → 1.
        assert!(smoothing_lambda(500.0, 10, 4) < 1e-12);
        assert!(smoothing_lambda(1e-9, 10, 4) > 1.0 - 1e-9);
    }

    /// (1 − λ)·n_k/n + λ/K with eq. (7)'s λ equals (n_k + α)/(n + Kα) with
    /// α = 1/(e^{ε/n} − 1): the smoothed histogram is McClure–Reiter.
    #[test]
    fn eq_7_lambda_is_the_pseudo_count_mixture() {
        let counts = [7u64, 0, 2, 31];
        let n: u64 = counts.iter().sum();
        let k = counts.len();
        for eps in [0.05, 1.0, 8.0] {
            let lambda = smoothing_lambda(eps, n, k);
            let alpha = pseudo_count(eps, n);
            for &c in &counts {
                let mix = (1.0 - lambda) * c as f64 / n as f64 + lambda / k as f64;
                let pc = (c as f64 + alpha) / (n as f64 + k as f64 * alpha);
                assert!((mix - pc).abs() < 1e-12, "ε={eps}: {mix} vs {pc}");
            }
        }
    }

    /// The privacy claims of the module docs, checked exactly on small
    /// tables: for every neighbour (one row added to any cell) and every
    /// synthetic output, the log-ratio of output probabilities is ≤ ε.
    #[test]
    fn sampling_mechanisms_are_epsilon_dp_by_enumeration() {
        use statrs::function::gamma::ln_gamma;
        let eps = 0.7;
        let r = 4u64;
        // All outputs of r rows over K = 3 cells.
        let outputs: Vec<[u64; 3]> = (0..=r).flat_map(|a| (0..=r - a).map(move |b| [a, b, r - a - b])).collect();
        let ln_multi =
            |m: &[u64; 3]| ln_gamma(r as f64 + 1.0) - m.iter().map(|&x| ln_gamma(x as f64 + 1.0)).sum::<f64>();
        // McClure–Reiter: multinomial with p_k = (n_k + α)/(n + Kα).
        let mr = |n: &[u64; 3], m: &[u64; 3]| {
            let a = pseudo_count(eps, r);
            let tot: f64 = n.iter().map(|&x| x as f64 + a).sum();
            ln_multi(m) + (0..3).map(|k| m[k] as f64 * ((n[k] as f64 + a) / tot).ln()).sum::<f64>()
        };
        // Multinomial–Dirichlet: Dirichlet–multinomial with a_k = n_k + α.
        let md = |n: &[u64; 3], m: &[u64; 3]| {
            let a = dirichlet_prior(eps, r);
            let ak: Vec<f64> = n.iter().map(|&x| x as f64 + a).collect();
            let at: f64 = ak.iter().sum();
            ln_multi(m) + ln_gamma(at) - ln_gamma(at + r as f64)
                + (0..3).map(|k| ln_gamma(ak[k] + m[k] as f64) - ln_gamma(ak[k])).sum::<f64>()
        };
        let mut worst: [f64; 2] = [0.0, 0.0];
        for base in [[0u64, 0, 0], [5, 0, 1], [40, 3, 0], [1000, 2, 7]] {
            for k in 0..3 {
                let mut nb = base;
                nb[k] += 1;
                for m in &outputs {
                    for (i, f) in [&mr as &dyn Fn(&[u64; 3], &[u64; 3]) -> f64, &md].iter().enumerate() {
                        worst[i] = worst[i].max((f(&base, m) - f(&nb, m)).abs());
                    }
                }
            }
        }
        assert!(worst.iter().all(|&w| w <= eps + 1e-9), "{worst:?}");
        // And the bound is nearly attained (the calibration is not loose).
        assert!(worst.iter().all(|&w| w > 0.5 * eps), "{worst:?}");
    }

    /// MODIPS on a Bernoulli (K = 2) as 002 §4.1 runs it: with noise far
    /// below the counts the sets' mean proportion is the posterior mean
    /// (α₀ + n₁)/(2α₀ + n) within sampling error.
    #[test]
    fn modips_sets_centre_on_the_posterior_mean() {
        let mut rng = DpRng::unsafe_seeded(11);
        let mut acc = accountant(1e6);
        let opts = CellOptions { sets: 200, rows: 1000, ..Default::default() };
        let rel = synthesize(CellMechanism::Modips, &[750, 250], "x", 2e4, &opts, &mut acc, &mut rng).unwrap();
        let p: Vec<f64> = rel.sets.iter().map(|s| s[1] as f64 / 1000.0).collect();
        let mean = p.iter().sum::<f64>() / p.len() as f64;
        let want = (1.0 / 3.0 + 250.0) / (2.0 / 3.0 + 1000.0);
        // Each set: posterior sd ≈ 0.0137 plus binomial sd ≈ 0.0137 → 0.019; mean of 200: 0.0014.
        assert!((mean - want).abs() < 5.0 * 0.0014, "{mean} vs {want}");
        // Noise ε/m = 100 per set: sanitized counts within ±1 almost surely.
        assert!(rel.sanitized.iter().all(|s| (s[1] - 250.0).abs() <= 1.0));
    }

    /// The review's counterexamples to the first draft, now refused before
    /// any charge: ε so small that the noise saturates i128, and a
    /// pseudo-count whose K·⌈α·D⌉ wraps the sampler's u128 weights.
    #[test]
    fn calibrations_the_samplers_cannot_represent_are_refused_before_any_charge() {
        let mut rng = DpRng::unsafe_seeded(3);
        let mut acc = accountant(1.0);
        let opts = CellOptions { sets: 1, rows: 1_000_000, ..Default::default() };
        let tiny = synthesize(CellMechanism::LaplaceSanitizer, &[0], "x", 1e-39, &opts, &mut acc, &mut rng);
        assert!(matches!(tiny, Err(DipsError::EpsilonPerSet { .. })), "{tiny:?}");
        let eps = 3.308_722_453_520_833_3e-18;
        let big = check(CellMechanism::BinomialBeta, 1 << 18, eps, &opts);
        assert!(big.is_err());
        // At MIN_EPSILON_PER_SET the Dirichlet prior for 10⁶ rows still fits 2¹⁸ cells.
        let floor = check(CellMechanism::MultinomialDirichlet, 1 << 18, MIN_EPSILON_PER_SET, &opts);
        assert!(floor.is_ok(), "{floor:?}");
        assert!(check(CellMechanism::MultinomialDirichlet, usize::MAX, MIN_EPSILON_PER_SET, &opts).is_err());
        assert!(acc.records().is_empty());
    }

    /// Without r, a noise-based set has as many rows as its noisy total
    /// before the cut at 0; on a sparse table the cut total would be far
    /// too large (here 1000 empty cells at ε = 0.5 add about 1000 rows).
    #[test]
    fn noise_based_sets_default_to_their_sanitized_total() {
        let mut rng = DpRng::unsafe_seeded(8);
        let mut acc = accountant(1e6);
        let opts = CellOptions { sets: 2, rows: 0, ..Default::default() };
        for mech in [CellMechanism::LaplaceSanitizer, CellMechanism::Modips] {
            let rel = synthesize(mech, &[300, 0, 700], "x", 1e5, &opts, &mut acc, &mut rng).unwrap();
            assert!(rel.sets.iter().all(|s| s.iter().sum::<u64>() == 1000), "{mech:?}");
        }
        let mut sparse = vec![0u64; 1000];
        sparse[0] = 500;
        let mut totals = Vec::new();
        for _ in 0..20 {
            let one = CellOptions { sets: 1, rows: 0, ..Default::default() };
            let rel = synthesize(CellMechanism::LaplaceSanitizer, &sparse, "x", 0.5, &one, &mut acc, &mut rng).unwrap();
            totals.push(rel.sets[0].iter().sum::<u64>() as f64);
        }
        // Noise sd of the total √(1000·2·2²) ≈ 89; the mean of 20 within 5 of its sd/√20 ≈ 20 → 100.
        let mean = totals.iter().sum::<f64>() / 20.0;
        assert!((mean - 500.0).abs() < 100.0, "{mean}");
    }

    #[test]
    fn the_laplace_sanitizer_can_release_its_rounded_counts() {
        let mut rng = DpRng::unsafe_seeded(5);
        let mut acc = accountant(1e6);
        let opts = CellOptions { sets: 1, rows: 100, generate: Generate::Round, ..Default::default() };
        let rel = synthesize(CellMechanism::LaplaceSanitizer, &[30, 70], "x", 1e5, &opts, &mut acc, &mut rng).unwrap();
        assert_eq!(rel.sets[0], vec![30, 70]);
    }
}
