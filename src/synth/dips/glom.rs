//! MODIPS with the general location model (002 §3.2.2, §4.3.1): K cells of
//! categorical attributes w and, within cell k, a bivariate normal z with a
//! cell mean μ_k and one covariance Σ shared by all cells.
//!
//! **Model** (002 §4.3.1). π ~ Dirichlet(α), and with the prior
//! f(μ₁…μ_K, Σ) ∝ |Σ|^{-(p+1)/2} (p = 2; 002 writes |Σ⁻¹|, we use the
//! Jeffreys-type prior whose posterior 002's formulas are),
//! π | w ~ Dirichlet(α + n), Σ | z, w ~ Inv-Wishart(n − K, W) with W the
//! pooled within-cell scatter matrix, μ_k | Σ ~ N(z̄_k, Σ/n_k). The Bayesian
//! sufficient statistics are the counts n_k, the cell means z̄_k and W.
//!
//! **Sanitization under add/remove-one neighbours.** Each cell k has public
//! bounds [c₀_kj, c₁_kj] per coordinate j (002 uses μ_kj ± 4σ_j); values are
//! clamped to them (a row-wise map; NaN rows and rows whose cell is out of
//! range are dropped: both 1-stable). With c_k the box's centre and h_kj its
//! half-widths, a row lies in one cell, so per coordinate the vectors over
//! cells of
//! - counts n_k have L1 sensitivity 1,
//! - centred sums Σ(z_j − c_kj) have h_j = max_k h_kj,
//! - centred cross-products Σ(z_i − c_ki)(z_j − c_kj) have max_k h_ki·h_kj.
//!
//! 002 sanitizes its six components (n, z̄₁, z̄₂ and the three entries of S)
//! with ε/(6m) each; we do the same with these six sums, each value rounded
//! to a public grid before exact integer sums (docs/PRIVACY.md §6), discrete
//! Laplace noise in grid units.
//!
//! **Post-processing.** n_k* ≥ 0; z̄_k* = c_k + s_k*/max(n_k*, 1) cut into
//! the box; W* = Σ_k (Q_k* − n_k*(z̄_k* − c_k)(z̄_k* − c_k)ᵀ), then made a
//! proper covariance (variances at least 10⁻⁶ of the squared half-width,
//! correlation within ±0.999). Each set draws π, Σ ~ Inv-Wishart(ν, W*)
//! with ν = max(n* − K, 3), μ_k, then r rows: cells from π, z ~ N(μ_k, Σ)
//! cut into the cell's box.

use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::cauchy::{sample_gamma, standard_normal_sample};

use super::DipsError;
use super::cells::{dirichlet_draw, multinomial, per_set_epsilon};
use super::grid::{GridSum, check_bounds};
use crate::measure::Accountant;
use crate::privacy::MechanismRecord;

type Result<T, E = DipsError> = std::result::Result<T, E>;

/// Public inputs of a GLOM MODIPS release.
#[derive(Debug, Clone, PartialEq)]
pub struct GlomSpec {
    /// Per cell, the bounds (lo, hi) of z₁ and z₂.
    pub bounds: Vec<[(f64, f64); 2]>,
    /// m.
    pub sets: usize,
    /// r, rows per set.
    pub rows: u64,
    /// The Dirichlet prior per cell (002 §4.3.1: 1/2).
    pub prior: f64,
}

/// One set's sanitized statistics (DP output, after post-processing).
#[derive(Debug, Clone, PartialEq)]
pub struct GlomStatistics {
    /// n_k* ≥ 0.
    pub counts: Vec<f64>,
    /// z̄_k*, inside each cell's box.
    pub means: Vec<[f64; 2]>,
    /// W* as (W₁₁, W₂₂, W₁₂), a proper scatter matrix.
    pub scatter: [f64; 3],
}

/// One synthetic set: a cell and a z per row.
#[derive(Debug, Clone, PartialEq)]
pub struct GlomSet {
    /// Cell of each row.
    pub cells: Vec<u32>,
    /// z of each row.
    pub z: Vec<[f64; 2]>,
}

/// What a release produced.
#[derive(Debug, Clone, PartialEq)]
pub struct GlomRelease {
    /// The m sets.
    pub sets: Vec<GlomSet>,
    /// Their statistics.
    pub statistics: Vec<GlomStatistics>,
}

impl GlomSpec {
    /// The public checks, before anything is charged.
    pub fn check(&self, epsilon: f64) -> Result<()> {
        per_set_epsilon(epsilon, self.sets, true)?;
        if self.bounds.is_empty() {
            return Err(DipsError::NoCells);
        }
        for (k, b) in self.bounds.iter().enumerate() {
            for (j, &(lo, hi)) in b.iter().enumerate() {
                check_bounds(|| format!("z{} in cell {k}", j + 1), lo, hi)?;
            }
        }
        if self.rows == 0 {
            return Err(DipsError::NoRows);
        }
        if !(self.prior.is_finite() && self.prior > 0.0) {
            return Err(DipsError::Prior(self.prior));
        }
        Ok(())
    }

    fn centre(&self, k: usize) -> [f64; 2] {
        let b = &self.bounds[k];
        let h = self.half(k);
        [b[0].0 + h[0], b[1].0 + h[1]]
    }

    fn half(&self, k: usize) -> [f64; 2] {
        let b = &self.bounds[k];
        [0.5 * (b[0].1 - b[0].0), 0.5 * (b[1].1 - b[1].0)]
    }
}

/// Sanitizes the GLOM statistics of (`cells`, `z`) (protected) m times and
/// draws r rows per set from the posterior given each set's statistics.
pub fn modips_glom(
    cells: &[u32],
    z: &[[f64; 2]],
    spec: &GlomSpec,
    epsilon: f64,
    accountant: &mut dyn Accountant,
    rng: &mut DpRng,
) -> Result<GlomRelease> {
    let mut sums = GlomSums::new(spec, epsilon)?;
    for (&k, &v) in cells.iter().zip(z) {
        sums.add(spec, k, v);
    }
    let statistics = sums.release(spec, accountant, rng)?;
    // Post-processing from here on.
    let sets = statistics.iter().map(|s| draw_set(rng, spec, s)).collect();
    Ok(GlomRelease { sets, statistics })
}

/// The six exact per-cell sums of a GLOM release, added row by row so that
/// a caller can stream the data (protected: released only by
/// [`GlomSums::release`]).
pub struct GlomSums {
    eps: f64,
    stats: [GridSum; 6],
}

// The exact sums are protected: Debug never shows them.
dpflow_udfs::protected_debug!(GlomSums);

impl GlomSums {
    /// Empty sums for `spec` at a total ε (checked: the public checks run here).
    pub fn new(spec: &GlomSpec, epsilon: f64) -> Result<Self> {
        spec.check(epsilon)?;
        let kc = spec.bounds.len();
        let eps = epsilon / spec.sets as f64 / 6.0;
        let hmax = |j: usize| (0..kc).map(|k| spec.half(k)[j]).fold(0.0, f64::max);
        let cross = (0..kc).map(|k| spec.half(k)[0] * spec.half(k)[1]).fold(0.0, f64::max);
        let stat = |name: &str, bound: f64| GridSum::new(format!("modips-glom {name} per cell"), bound, eps, kc);
        let stats = [
            GridSum::count("modips-glom count per cell".into(), kc),
            stat("sum(z1 − c1)", hmax(0)),
            stat("sum(z2 − c2)", hmax(1)),
            stat("sum((z1 − c1)²)", hmax(0).powi(2)),
            stat("sum((z2 − c2)²)", hmax(1).powi(2)),
            stat("sum((z1 − c1)(z2 − c2))", cross),
        ];
        Ok(Self { eps, stats })
    }

    /// Adds one row: its cell and z. A row whose cell is out of range or
    /// whose z has a NaN is dropped (a row-wise, 1-stable map); z is
    /// clamped into its cell's box.
    pub fn add(&mut self, spec: &GlomSpec, cell: u32, v: [f64; 2]) {
        let k = cell as usize;
        if k >= spec.bounds.len() || v[0].is_nan() || v[1].is_nan() {
            return;
        }
        let (c, b) = (spec.centre(k), &spec.bounds[k]);
        let d = [v[0].clamp(b[0].0, b[0].1) - c[0], v[1].clamp(b[1].0, b[1].1) - c[1]];
        let s = &mut self.stats;
        s[0].add(k, 1.0);
        s[1].add(k, d[0]);
        s[2].add(k, d[1]);
        s[3].add(k, d[0] * d[0]);
        s[4].add(k, d[1] * d[1]);
        s[5].add(k, d[0] * d[1]);
    }

    /// Charges all m sets' releases at once (6m records of ε/(6m)), then
    /// draws each set's noisy sums and turns them into its statistics.
    pub fn release(
        self,
        spec: &GlomSpec,
        accountant: &mut dyn Accountant,
        rng: &mut DpRng,
    ) -> Result<Vec<GlomStatistics>> {
        let eps = self.eps;
        let records: Vec<MechanismRecord> = (1..=spec.sets)
            .flat_map(|set| self.stats.iter().map(move |s| (set, s)))
            .map(|(set, s)| s.record(set, eps))
            .collect();
        accountant.charge(&records)?;
        Ok((0..spec.sets)
            .map(|_| {
                let noisy: Vec<Vec<f64>> = self.stats.iter().map(|s| s.noisy(rng, eps)).collect();
                statistics(spec, &noisy)
            })
            .collect())
    }
}

/// The statistics from the six noisy per-cell sums (module docs).
pub fn statistics(spec: &GlomSpec, noisy: &[Vec<f64>]) -> GlomStatistics {
    let kc = spec.bounds.len();
    let counts: Vec<f64> = noisy[0].iter().map(|&c| c.round().max(0.0)).collect();
    let mut means = Vec::with_capacity(kc);
    let mut w = [0.0f64; 3];
    for k in 0..kc {
        let (c, b) = (spec.centre(k), &spec.bounds[k]);
        let n = counts[k].max(1.0);
        let m = [(c[0] + noisy[1][k] / n).clamp(b[0].0, b[0].1), (c[1] + noisy[2][k] / n).clamp(b[1].0, b[1].1)];
        let d = [m[0] - c[0], m[1] - c[1]];
        w[0] += noisy[3][k] - counts[k] * d[0] * d[0];
        w[1] += noisy[4][k] - counts[k] * d[1] * d[1];
        w[2] += noisy[5][k] - counts[k] * d[0] * d[1];
        means.push(m);
    }
    // A proper scatter matrix: variances positive, |correlation| < 1.
    let floor = |j: usize| 1e-6 * (0..kc).map(|k| spec.half(k)[j].powi(2)).fold(f64::INFINITY, f64::min);
    w[0] = w[0].max(floor(0));
    w[1] = w[1].max(floor(1));
    let lim = 0.999 * (w[0] * w[1]).sqrt();
    w[2] = w[2].clamp(-lim, lim);
    GlomStatistics { counts, means, scatter: w }
}

/// One draw of (π, μ₁…μ_K, Σ) from the posterior given a set's
/// statistics (DP output: post-processing).
#[derive(Debug, Clone, PartialEq)]
pub struct GlomPosterior {
    /// Cell probabilities π.
    pub pi: Vec<f64>,
    /// Cell means μ_k.
    pub mu: Vec<[f64; 2]>,
    /// The lower Cholesky factor (l₁₁, l₂₁, l₂₂) of Σ.
    chol: [f64; 3],
}

impl GlomPosterior {
    /// (Σ, μ₁…μ_K, π) drawn from the posterior given `s`.
    pub fn draw(rng: &mut DpRng, spec: &GlomSpec, s: &GlomStatistics) -> Self {
        let kc = spec.bounds.len();
        let n: f64 = s.counts.iter().sum();
        let nu = (n - kc as f64).max(3.0);
        let sigma = inverse_wishart_2(rng, nu, s.scatter);
        let chol = cholesky_2(sigma);
        let pi = dirichlet_draw(rng, &s.counts, spec.prior);
        let mu = (0..kc)
            .map(|k| {
                let nk = s.counts[k].max(1.0);
                let e = gaussian_2(rng, chol);
                [s.means[k][0] + e[0] / nk.sqrt(), s.means[k][1] + e[1] / nk.sqrt()]
            })
            .collect();
        Self { pi, mu, chol }
    }

    /// One z ~ N(μ_k, Σ) in cell k, cut into the cell's box.
    pub fn z(&self, rng: &mut DpRng, spec: &GlomSpec, k: usize) -> [f64; 2] {
        let b = &spec.bounds[k];
        let e = gaussian_2(rng, self.chol);
        [(self.mu[k][0] + e[0]).clamp(b[0].0, b[0].1), (self.mu[k][1] + e[1]).clamp(b[1].0, b[1].1)]
    }
}

/// (Σ, μ₁…μ_K, π) from the posterior given the statistics, then r rows
/// (cells from a multinomial draw, in cell order).
pub fn draw_set(rng: &mut DpRng, spec: &GlomSpec, s: &GlomStatistics) -> GlomSet {
    let post = GlomPosterior::draw(rng, spec, s);
    let counts = multinomial(rng, &post.pi, spec.rows);
    let mut set = GlomSet { cells: Vec::with_capacity(spec.rows as usize), z: Vec::with_capacity(spec.rows as usize) };
    for (k, &c) in counts.iter().enumerate() {
        for _ in 0..c {
            set.cells.push(k as u32);
            set.z.push(post.z(rng, spec, k));
        }
    }
    set
}

/// Lower Cholesky factor (l₁₁, l₂₁, l₂₂) of a 2×2 SPD matrix (a₁₁, a₂₂, a₁₂).
fn cholesky_2(a: [f64; 3]) -> [f64; 3] {
    let l11 = a[0].sqrt();
    let l21 = a[2] / l11;
    [l11, l21, (a[1] - l21 * l21).max(0.0).sqrt()]
}

fn gaussian_2(rng: &mut DpRng, l: [f64; 3]) -> [f64; 2] {
    let (a, b) = (standard_normal_sample(rng), standard_normal_sample(rng));
    [l[0] * a, l[1] * a + l[2] * b]
}

/// A draw from Inv-Wishart(ν, Ψ) in two dimensions (Ψ = (ψ₁₁, ψ₂₂, ψ₁₂)),
/// as the inverse of a Wishart(ν, Ψ⁻¹) draw by Bartlett's decomposition:
/// W = L A Aᵀ Lᵀ with L = chol(Ψ⁻¹), A lower triangular, A₁₁² ~ χ²_ν,
/// A₂₂² ~ χ²_{ν−1}, A₂₁ ~ N(0, 1).
pub fn inverse_wishart_2(rng: &mut DpRng, nu: f64, psi: [f64; 3]) -> [f64; 3] {
    let det = psi[0] * psi[1] - psi[2] * psi[2];
    let inv = [psi[1] / det, psi[0] / det, -psi[2] / det];
    let l = cholesky_2(inv);
    let a11 = (2.0 * sample_gamma(rng, nu / 2.0)).sqrt();
    let a22 = (2.0 * sample_gamma(rng, (nu - 1.0) / 2.0)).sqrt();
    let a21 = standard_normal_sample(rng);
    // B = L·A (lower triangular), W = B Bᵀ.
    let b11 = l[0] * a11;
    let b21 = l[1] * a11 + l[2] * a21;
    let b22 = l[2] * a22;
    let w = [b11 * b11, b21 * b21 + b22 * b22, b11 * b21];
    let wdet = w[0] * w[1] - w[2] * w[2];
    [w[1] / wdet, w[0] / wdet, -w[2] / wdet]
}

#[cfg(test)]
mod tests {
    use dpflow_udfs::noise::NoiseDistribution;
    use dpflow_udfs::noise::real::grid_exponent;

    use super::*;
    use crate::measure::ReleaseAccountant;
    use crate::privacy::{Budget, PrivacyFilter, PrivacyLoss};

    fn spec(k: usize) -> GlomSpec {
        GlomSpec { bounds: vec![[(-4.0, 4.0), (-3.0, 5.0)]; k], sets: 5, rows: 200, prior: 0.5 }
    }

    /// E[Σ] = Ψ/(ν − p − 1) for Inv-Wishart(ν, Ψ), p = 2: with ν = 13 and
    /// Ψ = (20, 10, 5), E[Σ] = (2, 1, 0.5), checked on 40 000 draws.
    #[test]
    fn inverse_wishart_draws_have_the_conjugate_mean() {
        let mut rng = DpRng::unsafe_seeded(5);
        let k = 40_000;
        let mut s = [0.0; 3];
        for _ in 0..k {
            let d = inverse_wishart_2(&mut rng, 13.0, [20.0, 10.0, 5.0]);
            (0..3).for_each(|i| s[i] += d[i]);
        }
        let mean: Vec<f64> = s.iter().map(|x| x / k as f64).collect();
        // Var(Σ₁₁) = 2ψ₁₁²/((ν−3)²(ν−5)) = 1: sd of the mean 0.005; Σ₂₂: 0.0025.
        assert!(
            (mean[0] - 2.0).abs() < 0.03 && (mean[1] - 1.0).abs() < 0.015 && (mean[2] - 0.5).abs() < 0.015,
            "{mean:?}"
        );
    }

    #[test]
    fn it_spends_exactly_its_budget_and_stays_in_bounds() {
        let mut rng = DpRng::unsafe_seeded(1);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1.0 }));
        let cells: Vec<u32> = (0..300).map(|i| (i % 3) as u32).collect();
        let z: Vec<[f64; 2]> = (0..300).map(|i| [(i % 7) as f64 - 3.0, 1.0]).collect();
        let rel = modips_glom(&cells, &z, &spec(3), 1.0, &mut acc, &mut rng).unwrap();
        let spent: f64 =
            acc.records().iter().map(|r| if let PrivacyLoss::Pure { epsilon } = r.loss { epsilon } else { 0.0 }).sum();
        assert!((spent - 1.0).abs() < 1e-12, "{spent}");
        assert_eq!(acc.records().len(), 30);
        assert_eq!(rel.sets.len(), 5);
        for s in &rel.sets {
            assert_eq!(s.z.len(), 200);
            assert!(s.z.iter().all(|v| (-4.0..=4.0).contains(&v[0]) && (-3.0..=5.0).contains(&v[1])));
            assert!(s.cells.iter().all(|&c| c < 3));
        }
        for st in &rel.statistics {
            let w = st.scatter;
            assert!(w[0] > 0.0 && w[1] > 0.0 && w[2].abs() < (w[0] * w[1]).sqrt());
        }
    }

    /// With little noise the statistics are the data's: counts, cell means
    /// and the pooled within-cell scatter, computed here by hand.
    #[test]
    fn with_little_noise_the_statistics_are_the_datas() {
        let mut rng = DpRng::unsafe_seeded(2);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1e9 }));
        // Cell 0: z = (1, 2), (3, 2), (2, 5); cell 1: (−1, 0), (1, 2).
        let cells = [0u32, 0, 0, 1, 1, 7];
        let z = [[1.0, 2.0], [3.0, 2.0], [2.0, 5.0], [-1.0, 0.0], [1.0, 2.0], [0.0, 0.0]];
        let one = GlomSpec { sets: 1, ..spec(2) };
        let rel = modips_glom(&cells, &z, &one, 1e8, &mut acc, &mut rng).unwrap();
        let st = &rel.statistics[0];
        assert_eq!(st.counts, vec![3.0, 2.0], "the row in cell 7 is dropped");
        assert!((st.means[0][0] - 2.0).abs() < 1e-4 && (st.means[0][1] - 3.0).abs() < 1e-4);
        assert!((st.means[1][0] - 0.0).abs() < 1e-4 && (st.means[1][1] - 1.0).abs() < 1e-4);
        // Scatter: cell 0 (2, 6, 0) + cell 1 (2, 2, 2) = (4, 8, 2).
        let w = st.scatter;
        assert!((w[0] - 4.0).abs() < 1e-3 && (w[1] - 8.0).abs() < 1e-3 && (w[2] - 2.0).abs() < 1e-3, "{w:?}");
    }

    /// Float centring can leave a row more than h from the centre (here
    /// the centre of [1, 1 + 2⁻⁵²] rounds to 1, so the upper bound is 2h
    /// away); the clamp in grid units keeps one row within the charged bound.
    #[test]
    fn one_row_moves_a_sum_by_at_most_its_bound_even_when_centring_rounds() {
        let s = GlomSpec { bounds: vec![[(1.0, 1.0 + 2f64.powi(-52)), (-1.0, 1.0)]], sets: 1, rows: 1, prior: 0.5 };
        let (c, h) = (s.centre(0), s.half(0));
        let d = (1.0 + 2f64.powi(-52)) - c[0];
        assert!(d > h[0], "the float centre did not round");
        for eps in [1e-3, 1.0, 1e3] {
            let mut st = GridSum::new("x".into(), h[0], eps, 1);
            st.add(0, d);
            let units =
                (h[0] / 2f64.powi(grid_exponent(&NoiseDistribution::Laplace { scale: h[0] / eps }, h[0]))).ceil();
            assert!(st.sums[0].abs() as f64 <= units, "ε = {eps}");
        }
    }

    #[test]
    fn bad_public_inputs_are_refused() {
        let mut rng = DpRng::unsafe_seeded(1);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1.0 }));
        for s in [
            GlomSpec { bounds: vec![], ..spec(1) },
            GlomSpec { bounds: vec![[(1.0, 1.0), (0.0, 1.0)]], ..spec(1) },
            GlomSpec { sets: 0, ..spec(1) },
            GlomSpec { rows: 0, ..spec(1) },
            GlomSpec { prior: 0.0, ..spec(1) },
        ] {
            assert!(modips_glom(&[0], &[[0.0, 0.0]], &s, 1.0, &mut acc, &mut rng).is_err());
        }
        assert!(acc.records().is_empty());
    }
}
