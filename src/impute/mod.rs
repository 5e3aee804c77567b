//! DP statistics on kNN-imputed data with smooth sensitivity (004 §3–6;
//! NOTES §9): counts and proportions (Thm 5.1, Cor 5.2), means over a
//! subpopulation (Thm 5.4, Cor 5.5, count released first), variances
//! (Thm 5.6, Cor 5.7), with generalized Cauchy noise calibrated by
//! [`smooth_calibration`]; plus the two baselines of 004 §6.3 (Laplace).
//!
//! Calibration (issue 14 §2; proof in [`smooth_calibration`]): the 004 bounds
//! are ln 2-smooth (β = ln 2, fixed by Thm 5.1–5.6), so each released number
//! needs ε > ln 2; for ε ≥ 2 ln 2 the paper's γ = 1 + ε/(2 ln 2), α = ln 2
//! holds, for ln 2 < ε < 2 ln 2 we use γ = 2, α = ε − ln 2, and ε ≤ ln 2 is
//! refused at plan time ([`planned_records`], the SQL planner). The (ε, δ)
//! Gaussian variant is refused (NRS07 Lemma 2.10 cannot give β ≥ ln 2).
//!
//! Every released number is snapped to (smooth) or drawn on (baselines) a
//! grid 2^k fixed by public quantities only ([`OutputGrid`]): counts on the
//! integers, means and variances at 2⁻³² of their public range; never from
//! S(D) or L1(D), whose value would otherwise show in the lattice of outputs.
//!
//! The imputed microdata never leaves this module: only noisy statistics do.
//! The smooth bound S(D) = f(L1(D)) is data-dependent and is *not* reported.

#[cfg(test)]
mod acs_tests;
mod error;
#[cfg(any(test, feature = "bench-internals"))]
mod ordered;
#[cfg(any(test, feature = "bench-internals"))]
pub(crate) use ordered::{batch_values, read_in_order};
#[cfg(any(test, feature = "bench-internals"))]
mod reference;
mod relevance;
pub mod spec;
mod stream;
#[cfg(feature = "bench-internals")]
pub mod summary;
#[cfg(not(feature = "bench-internals"))]
mod summary;

use std::collections::HashMap;

use datafusion::execution::context::SessionContext;
use dpflow_udfs::noise::cauchy::{dilation_cost, log_density_lipschitz, public_grid_exponent, snap};
use dpflow_udfs::noise::real::{from_grid_units, to_grid_units};
use dpflow_udfs::noise::{DpRng, GeneralizedCauchy, NoiseDistribution};
pub use error::{ImputeError, Result};
use relevance::parts;
use serde::Serialize;
use summary::Summary;

use crate::dataset::Dataset;
use crate::privacy::{MechanismRecord, PrivacyLoss};
#[cfg(any(test, feature = "bench-internals"))]
#[allow(unused_imports)] // the tests use some, dpflow-bench others
pub use reference::*;
pub use relevance::{PartNoise, part_noises};
pub use spec::{Predicate, QueryKind, QuerySpec, SmoothNoise};

/// `ctx` with one partition per input and no repartitioning of file scans, so
/// a read returns the rows in file order, the same way every time.
fn ordered_context(ctx: &SessionContext) -> SessionContext {
    let config = ctx.copied_config().with_target_partitions(1).with_repartition_file_scans(false);
    let state = datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state()).with_config(config).build();
    SessionContext::new_with_state(state)
}

/// One released statistic.
#[derive(Debug, Clone, Serialize)]
pub struct Released {
    /// Query name.
    pub name: String,
    /// The noisy value (None when undefined, e.g. an empty subpopulation).
    pub value: Option<f64>,
    /// The noisy count of the subpopulation (released first for means, variances, proportions).
    pub count: Option<f64>,
    /// Mechanisms charged.
    pub mechanisms: Vec<MechanismRecord>,
}

/// The estimators compared in 004 §6.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Estimator {
    /// Impute, then smooth sensitivity (Cor 5.2/5.5/5.7).
    Smooth,
    /// Ignore incomplete rows, Laplace with global sensitivity.
    IgnoreMissing,
    /// Impute, Laplace with the optimistic global bound L1 = number of donees
    /// (004 §6.3; an evaluation baseline — that count is itself private).
    GlobalSensitivity,
}

fn rows_where(d: &HashMap<String, Vec<Option<f64>>>, p: &[Predicate], n: usize) -> Vec<bool> {
    (0..n).map(|r| p.iter().all(|q| q.matches(d[&q.column][r]))).collect()
}

/// The calibration of a smooth-sensitivity release of one number at ε
/// (pure DP; `delta` must be `None`): the generalized Cauchy shape γ and the
/// divisor α of the release y = q(D) + (S(D)/α)·Z, Z with density
/// h(z) ∝ 1/(1 + |z|^γ), S a β-smooth upper bound on the local sensitivity
/// with β = ln 2 (the 004 bounds, Thm 5.1–5.6: S(D) ≤ 2·S(D′)).
///
/// Proof (sliding + dilation, NRS07 Lemma 2.5–2.7 / Bun–Steinke 2019, with
/// the constants of `dpflow_udfs::noise::cauchy`). Let D, D′ be neighbours,
/// s = S(D)/α, s′ = S(D′)/α, r = S(D)/S(D′) ∈ [e^−β, e^β] and
/// |q − q′| ≤ LS(D) or LS(D′), hence ≤ min(S, S′) when both bounds dominate
/// the local sensitivities. With f_D(y) = h((y − q)/s)/s, for every y:
/// ln f_D(y) − ln f_D′(y) = [ln h(z) − ln h(z″)] + [ln h(z″) − ln h(r·z″) − ln r]
/// with z = (y − q)/s, z″ = (y − q′)/s (so (y − q′)/s′ = r·z″). The slide
/// |z − z″| = |q − q′|/s ≤ α costs at most α·L_γ, L_γ = (γ − 1)^{(γ−1)/γ};
/// the dilation costs at most max(1, γ − 1)·|ln r| ≤ max(1, γ − 1)·β. So the
/// mechanism is ε-DP whenever α·L_γ + max(1, γ − 1)·β ≤ ε.
/// - ε ≥ 2 ln 2: γ = 1 + ε/(2 ln 2) ≥ 2, α = ln 2 (004 Cor 3.9; the 004 §6
///   experiment's setting, ε = 6 ln 2 → γ = 4): L_γ ≤ γ − 1, so the total is
///   ≤ 2 ln 2·(γ − 1) = ε.
/// - ln 2 < ε < 2 ln 2: γ = 2, α = ε − ln 2: total = (ε − ln 2)·1 + ln 2 = ε.
/// - ε ≤ ln 2: refused. No noise shape can do better here: at y = q = q′ and
///   S′ = 2S the density ratio is exactly 2 (f_D(q) = h(0)/s), a loss of ln 2
///   whatever h is, and the slide needs α > 0 on top.
///
/// (004 Cor 3.9 as stated — γ = 1 + ε/(2β), α = β = ln 2 for every ε — fails
/// for small ε: its dilation term alone is ln 2 when γ ≤ 2; a direct search
/// gives a log density ratio ≈ 0.91 at ε = 0.5 and ≈ 0.89 at ε = 0.7.)
///
/// The Gaussian (ε, δ) variant (004 Remark 5.3(b), NRS07 Lemma 2.10:
/// α = ε/(5√(2 ln(2/δ))), β = ε/(4(1 + ln(2/δ)))) is refused: the lemma
/// holds for ε < 1, where β < 1/4 < ln 2, so it never covers our ln 2-smooth
/// bounds.
pub fn smooth_calibration(epsilon: f64, delta: Option<f64>) -> Result<SmoothCalibration> {
    let ln2 = std::f64::consts::LN_2;
    if let Some(d) = delta {
        return Err(ImputeError::Calibration(format!(
            "smooth-sensitivity releases with an (ε, δ) budget (δ = {d:e}) are refused: the Gaussian variant \
             (Nissim–Raskhodnikova–Smith 2007, Lemma 2.10) needs β = ε/(4(1 + ln(2/δ))) ≥ ln 2 with ε < 1, \
             which never holds for the ln 2-smooth bounds of 004; give a pure ε budget (generalized Cauchy noise)"
        )));
    }
    if !(epsilon.is_finite() && epsilon > ln2) {
        return Err(ImputeError::Calibration(format!(
            "smooth-sensitivity releases need ε > ln 2 ≈ 0.693 per released number (got ε = {epsilon}): the 004 \
             smooth bounds may double between neighbouring datasets, which alone costs ln 2; give each released \
             number more ε (a mean releases 2 numbers — count and mean —, a variance 3, a proportion 2), \
             e.g. ε = 6·ln 2 ≈ 4.16 per number as in 004 §6, or use the ignore-missing estimator"
        )));
    }
    Ok(if epsilon >= 2.0 * ln2 {
        SmoothCalibration { gamma: 1.0 + epsilon / (2.0 * ln2), alpha: ln2 }
    } else {
        SmoothCalibration { gamma: 2.0, alpha: epsilon - ln2 }
    })
}

/// The generalized Cauchy shape γ and divisor α of a smooth release (the
/// release is q(D) + (S(D)/α)·X, X with density ∝ 1/(1 + |x|^γ)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmoothCalibration {
    /// γ > 1.
    pub gamma: f64,
    /// α > 0.
    pub alpha: f64,
}

impl SmoothCalibration {
    /// The proven bound α·L_γ + max(1, γ − 1)·ln 2 on the log density ratio
    /// of neighbours (see [`smooth_calibration`]); at most the charged ε.
    pub fn loss_bound(&self) -> f64 {
        self.alpha * log_density_lipschitz(self.gamma) + dilation_cost(self.gamma) * std::f64::consts::LN_2
    }

    /// The noise of the release.
    pub fn noise(&self) -> SmoothNoise {
        SmoothNoise::Cauchy { gamma: self.gamma, alpha: self.alpha }
    }
}

/// The public output grid 2^k of one released number: a function of the
/// statistic's kind and its public range only, never of the data, of L1(D)
/// or of a smooth bound S(D) (issue 14 §2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OutputGrid {
    /// Counts: the integers (k = 0); an exact count is on the grid.
    Count,
    /// A mean clamped to the public [a, b]: 2^k ≤ max(|a|, |b|)·2⁻³².
    Mean {
        /// Public lower bound a.
        lo: f64,
        /// Public upper bound b.
        hi: f64,
    },
    /// A variance of values in the public [a, b] (at most (b − a)²/2 once
    /// clamped): 2^k ≤ (b − a)²·2⁻³².
    Variance {
        /// Public lower bound a.
        lo: f64,
        /// Public upper bound b.
        hi: f64,
    },
}

impl OutputGrid {
    /// The grid exponent k (public).
    pub fn exponent(&self) -> i32 {
        match *self {
            OutputGrid::Count => 0,
            OutputGrid::Mean { lo, hi } => public_grid_exponent(lo.abs().max(hi.abs()).max(hi - lo)),
            OutputGrid::Variance { lo, hi } => public_grid_exponent((hi - lo).powi(2)),
        }
    }

    /// Whether every exact value of the statistic is already on the grid
    /// (then rounding it adds nothing to its sensitivity).
    fn exact_on_grid(&self) -> bool {
        matches!(self, OutputGrid::Count)
    }
}

/// Releases `q` with the noise of one estimator on the public grid `grid`;
/// `bound` is the smooth bound S(D) (smooth) or the global sensitivity Δ
/// (baselines).
///
/// - Smooth (generalized Cauchy): y = q + (S/α)·X drawn in floating point,
///   then snapped to the public grid (module docs of
///   `dpflow_udfs::noise::cauchy` for the residual floating-point caveat).
/// - Laplace baselines (`sensitivity` global, ε per number): exact discrete
///   Laplace noise drawn directly in grid units g = 2^k and added to
///   round(q/g): y = g·(round(q/g) + Z), P(Z = z) ∝ exp(−|z|/t),
///   t = Δ_g/ε. Rounding moves a neighbour's round(q/g) by at most
///   ⌊Δ/g⌋ + 1, so Δ_g = ⌈Δ/g⌉ + 1 (or ⌈Δ/g⌉ when exact values are on the
///   grid, as counts are: then t = Δ/ε, the classic scale). Every output is
///   on the public grid and no float noise is involved.
fn release(q: f64, bound: f64, noise: &SmoothNoise, grid: OutputGrid, rng: &mut DpRng) -> f64 {
    let k = grid.exponent();
    match *noise {
        SmoothNoise::Cauchy { gamma, alpha } => {
            let x = GeneralizedCauchy::new(gamma).expect("γ > 1").sample(rng);
            snap(q + bound / alpha * x, k)
        }
        SmoothNoise::Laplace { epsilon } => {
            let g = 2f64.powi(k);
            let units = (bound / g).ceil() + if grid.exact_on_grid() { 0.0 } else { 1.0 };
            let z = NoiseDistribution::Laplace { scale: units / epsilon }.sample_integer(rng);
            from_grid_units(to_grid_units(q, k).saturating_add(z), k)
        }
    }
}

/// Answers the queries with one estimator; every query spends `epsilon` per
/// released number (counts first, then means/variances).
///
/// The smooth estimator noises each number by what it reads
/// ([`part_noises`], issue 24): a number that reads an imputed column gets a
/// smooth bound from L1_R(D), the donees that can enter it, and generalized
/// Cauchy noise calibrated by [`smooth_calibration`] (refuses ε ≤ ln 2 and
/// any δ); a number that reads none gets its global sensitivity and exact
/// discrete Laplace noise. The baselines use discrete Laplace throughout.
/// Means and variances are over the rows whose value is observed, or
/// unknown in an imputed column *with or without a donor* (never "has a
/// value after imputation": whether a donee finds a donor depends on other
/// rows); a not-applicable null, or an unknown value that is not imputed, is
/// outside the population, its count included. It charges nothing: a caller reserves
/// the budget first (as `dpflow impute` and DP SQL do), and only
/// [`Estimator::Smooth`] is a release path.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) fn answer(
    data: &Summary,
    queries: &[QuerySpec],
    estimator: Estimator,
    epsilon: f64,
    delta: Option<f64>,
    rng: &mut DpRng,
) -> Result<Vec<Released>> {
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(ImputeError::Epsilon(epsilon));
    }
    if data.queries.len() != queries.len() {
        return Err(ImputeError::Internal("a summary answers the queries it was built for"));
    }
    let laplace = SmoothNoise::Laplace { epsilon };
    let any_smooth = estimator == Estimator::Smooth && data.queries.iter().any(|q| q.l1.iter().any(Option::is_some));
    // Calibrated (or refused) before anything is computed.
    let cauchy = if any_smooth { Some(smooth_calibration(epsilon, delta)?.noise()) } else { None };
    let donees = data.donees as f64;
    let mut out = Vec::new();
    for (q, summary) in queries.iter().zip(&data.queries) {
        let ignore = estimator == Estimator::IgnoreMissing;
        let agg = if ignore { &summary.ignore } else { &summary.imputed };
        let mut noises = Vec::new();
        let mut l1s = Vec::new();
        for l1 in &summary.l1 {
            let smooth = estimator == Estimator::Smooth && l1.is_some();
            noises.push(if smooth { cauchy.expect("calibrated above") } else { laplace });
            l1s.push(if smooth { l1.map_or(0.0, |l| l.value as f64) } else { 0.0 });
        }
        let mut mechs = Vec::new();
        // Every released number is pure ε-DP (the smooth estimator refuses any δ above).
        let loss = PrivacyLoss::Pure { epsilon };
        let mut record = |what: &str, noise: SmoothNoise, sens: Option<f64>, grid: OutputGrid| {
            let mut params = serde_json::json!({
                "estimator": estimator,
                "grid": 2f64.powi(grid.exponent()),
            });
            if let SmoothNoise::Cauchy { gamma, alpha } = noise {
                params["smooth_bound"] = "data-dependent, not released".into();
                params["gamma"] = gamma.into();
                params["alpha"] = alpha.into();
            }
            mechs.push(MechanismRecord {
                mechanism: mechanism_name(noise).into(),
                target: format!("{} ({what})", q.name),
                // A smooth bound is data-dependent: never shown.
                sensitivity: matches!(noise, SmoothNoise::Laplace { .. }).then_some(sens).flatten(),
                noise: None,
                loss: loss.clone(),
                params,
            });
        };
        // The bound of a count: 1 (global), 1 + L1_R (smooth), 1 + donees (the optimistic baseline).
        let count_bound = |i: usize| match (estimator, noises[i]) {
            (Estimator::GlobalSensitivity, _) => 1.0 + donees,
            (_, SmoothNoise::Cauchy { .. }) => 1.0 + l1s[i],
            _ => 1.0,
        };
        // Count of the population (the denominator).
        let count = agg.count as f64;
        let noisy_count = release(count, count_bound(0), &noises[0], OutputGrid::Count, rng);
        record("count", noises[0], Some(count_bound(0)), OutputGrid::Count);
        let value = match &q.kind {
            QueryKind::Count => Some(noisy_count),
            QueryKind::Proportion { .. } => {
                let num = agg.numerator as f64;
                let noisy_num = release(num, count_bound(1), &noises[1], OutputGrid::Count, rng);
                record("numerator count", noises[1], Some(count_bound(1)), OutputGrid::Count);
                (noisy_count >= 1.0).then(|| (noisy_num / noisy_count).clamp(0.0, 1.0))
            }
            QueryKind::Mean { lo, hi, .. } | QueryKind::Variance { lo, hi, .. } => {
                let (a, b) = (*lo, *hi);
                let grid = summary::ValueGrid::new(a, b);
                let s = noisy_count;
                if s <= 1.0 {
                    None
                } else {
                    let mean = agg.sum(&grid) / s;
                    let mean_sens = match (estimator, noises[1]) {
                        (Estimator::GlobalSensitivity, _) => (b.abs().max(a.abs()) + donees * (b - a)) / s,
                        // Smooth: L1_R; reads no imputed value (or ignores them): global, L = 0.
                        _ => mean_bound(a, b, l1s[1], s),
                    };
                    let mgrid = OutputGrid::Mean { lo: a, hi: b };
                    // q clamped to its public range first (1-Lipschitz, so S still bounds it): keeps
                    // q + scale·x within the float range the public grid was chosen for.
                    let noisy_mean = release(mean.clamp(a, b), mean_sens, &noises[1], mgrid, rng).clamp(a, b);
                    record("mean", noises[1], Some(mean_sens), mgrid);
                    if let QueryKind::Variance { .. } = q.kind {
                        let m = (a - noisy_mean).powi(2).max((b - noisy_mean).powi(2));
                        let var = agg.sum_sq_about(noisy_mean, &grid) / (s - 1.0);
                        let l = match (estimator, noises[2]) {
                            (Estimator::GlobalSensitivity, _) => donees,
                            (Estimator::Smooth, SmoothNoise::Cauchy { .. }) => l1s[2],
                            _ => 0.0,
                        };
                        let vsens = variance_bound(m, l, s);
                        let vgrid = OutputGrid::Variance { lo: a, hi: b };
                        record("variance", noises[2], Some(vsens), vgrid);
                        let cap = (b - a).powi(2) / 4.0 * s / (s - 1.0);
                        Some(release(var.clamp(0.0, cap), vsens, &noises[2], vgrid, rng).clamp(0.0, cap))
                    } else {
                        Some(noisy_mean)
                    }
                }
            }
        };
        out.push(Released { name: q.name.clone(), value, count: Some(noisy_count), mechanisms: mechs });
    }
    Ok(out)
}

/// The bound on a mean's change over a released count s, with L changed
/// donees (L = L1_R(D) smooth, 0 when it reads no imputed value).
///
/// 004 Thm 5.4 with L1_R: the added/removed row moves the sum by ≤ max(|a|, |b|),
/// each of the L changed donees by ≤ w. The paper's w is b − a (the
/// subpopulation reads no imputed attribute) or b (it does, a ≥ 0).
/// Here w = max(b − a, |a|, |b|) for every case: a donee with no donor
/// stays NULL and is left out of the sum, so gaining a donor moves the
/// sum by up to max(|a|, |b|) (which exceeds b − a when 0 ∉ [a, b]),
/// and a donee entering or leaving a predicate on imputed data moves
/// it by up to max(|a|, |b|) too, for any sign of a (a privacy review
/// found both). For the paper's [0, b] this is its bound.
fn mean_bound(a: f64, b: f64, l: f64, s: f64) -> f64 {
    let w = (b - a).max(a.abs()).max(b.abs());
    (b.abs().max(a.abs()) + l * w) / s
}

/// The bound on a variance's change (004 Thm 5.6 with L changed donees),
/// m = max((a − Ȳ)², (b − Ȳ)²) for the released mean Ȳ and count s.
fn variance_bound(m: f64, l: f64, s: f64) -> f64 {
    m * (1.0 + l) / (s - 1.0)
}

/// The ledger name of a noise.
fn mechanism_name(noise: SmoothNoise) -> &'static str {
    match noise {
        SmoothNoise::Cauchy { .. } => SMOOTH_MECHANISM,
        SmoothNoise::Laplace { .. } => LAPLACE_MECHANISM,
    }
}

/// The ledger name of a smooth-sensitivity release.
const SMOOTH_MECHANISM: &str = "smooth_sensitivity_generalized_cauchy";
/// The ledger name of a discrete Laplace release.
const LAPLACE_MECHANISM: &str = "discrete_laplace";

/// The exact (non-private) value of each query on the given columns (for evaluation).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))] // evaluation only (dpflow-bench)
pub(crate) fn exact(cols: &HashMap<String, Vec<Option<f64>>>, n: usize, queries: &[QuerySpec]) -> Vec<Option<f64>> {
    queries
        .iter()
        .map(|q| {
            let sel = rows_where(cols, &q.predicate, n);
            let count = sel.iter().filter(|x| **x).count() as f64;
            match &q.kind {
                QueryKind::Count => Some(count),
                QueryKind::Proportion { numerator } => {
                    let num =
                        rows_where(cols, numerator, n).iter().zip(&sel).filter(|(a, b)| **a && **b).count() as f64;
                    (count > 0.0).then(|| num / count)
                }
                QueryKind::Mean { value, lo, hi } => {
                    let v: Vec<f64> =
                        (0..n).filter(|&r| sel[r]).filter_map(|r| cols[value][r]).map(|x| x.clamp(*lo, *hi)).collect();
                    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
                }
                QueryKind::Variance { value, lo, hi } => {
                    let v: Vec<f64> =
                        (0..n).filter(|&r| sel[r]).filter_map(|r| cols[value][r]).map(|x| x.clamp(*lo, *hi)).collect();
                    let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
                    (v.len() > 1).then(|| v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64)
                }
            }
        })
        .collect()
}

/// What `dpflow impute` releases.
#[derive(Clone, Serialize)]
pub struct ImputeReport {
    /// Estimator used.
    pub estimator: Estimator,
    /// Released statistics.
    pub results: Vec<Released>,
    /// Rows whose attributes were imputed (not released: reported as a note only in tests/benchmarks).
    #[serde(skip)]
    pub donees: usize,
}

// Debug shows only what is released (donees and L1(D) are exact, data-dependent).
impl std::fmt::Debug for ImputeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImputeReport").field("estimator", &self.estimator).field("results", &self.results).finish()
    }
}

/// The summary of a spec's queries, imputed in a streaming pass ([`stream`]).
pub(crate) async fn summarize(ctx: &SessionContext, spec: &spec::ImputeSpec) -> Result<summary::Summary> {
    let ds = Dataset::open("impute", &spec.input, None, &spec.domain)?;
    summarize_on(ctx, &ds, &spec.imputation, &spec.queries).await
}

/// The summary of `queries` on an opened dataset, imputed in a streaming
/// pass: what every release path (`dpflow impute`, DP SQL, pipelines) reads.
pub(crate) async fn summarize_on(
    ctx: &SessionContext,
    ds: &Dataset,
    imp: &spec::Imputation,
    queries: &[QuerySpec],
) -> Result<summary::Summary> {
    stream::summarize(ctx, ds, imp, queries, ENUMERATE_LIMIT).await
}

/// Case (d) of L1(D) is enumerated exactly up to this many class keys (a
/// public switch: the size of the public class space, never the data).
const ENUMERATE_LIMIT: u64 = 2_000_000;

/// Runs a spec: imputes, then releases every query with `estimator`.
pub async fn run(
    ctx: &SessionContext,
    spec: &spec::ImputeSpec,
    estimator: Estimator,
    rng: &mut DpRng,
) -> Result<ImputeReport> {
    let (eps, delta) = match spec.budget {
        crate::privacy::Budget::Pure { epsilon } => (epsilon, None),
        crate::privacy::Budget::Approx { epsilon, delta } => (epsilon, Some(delta)),
        crate::privacy::Budget::Zcdp { .. } => {
            return Err(ImputeError::Calibration(
                "smooth-sensitivity releases need an ε (or ε, δ) budget per released number".into(),
            ));
        }
    };
    let data = summarize(ctx, spec).await?;
    let results = answer(&data, &spec.queries, estimator, eps, delta, rng)?;
    Ok(ImputeReport { estimator, results, donees: data.donees as usize })
}

/// The mechanisms a spec will charge (known before reading data): one per
/// released number, each with the noise [`part_noises`] decides from the
/// spec alone.
pub fn planned_records(spec: &spec::ImputeSpec, estimator: Estimator) -> Result<Vec<MechanismRecord>> {
    if let Some(why) = crate::domain::DomainSpec::load(&spec.domain)?.domain.dp_read_refusal() {
        return Err(ImputeError::TablePolicy { domain: spec.domain.clone(), why: why.to_string() });
    }
    let (loss, epsilon, delta) = match spec.budget {
        crate::privacy::Budget::Pure { epsilon } => (PrivacyLoss::Pure { epsilon }, epsilon, None),
        crate::privacy::Budget::Approx { epsilon, delta } => {
            (PrivacyLoss::Approx { epsilon, delta }, epsilon, Some(delta))
        }
        crate::privacy::Budget::Zcdp { .. } => {
            return Err(ImputeError::Calibration("smooth-sensitivity releases need an ε (or ε, δ) budget".into()));
        }
    };
    let imputed = &spec.imputation.columns;
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(ImputeError::Epsilon(epsilon));
    }
    let smooth = spec.queries.iter().any(|q| part_noises(q, imputed).contains(&PartNoise::Smooth));
    if estimator == Estimator::Smooth && smooth {
        // Refused here, before any ledger charge or data read (issue 14 §2).
        smooth_calibration(epsilon, delta)?;
    }
    Ok(spec.queries.iter().flat_map(|q| query_records(q, imputed, estimator, &loss)).collect())
}

/// The mechanisms one query charges, each released number at `loss`
/// (`imputed`: the imputed columns, which decide each number's noise).
pub fn query_records(
    q: &QuerySpec,
    imputed: &[String],
    estimator: Estimator,
    loss: &PrivacyLoss,
) -> Vec<MechanismRecord> {
    part_noises(q, imputed)
        .into_iter()
        .enumerate()
        .map(|(i, noise)| MechanismRecord {
            mechanism: match (estimator, noise) {
                (Estimator::Smooth, PartNoise::Smooth) => SMOOTH_MECHANISM.into(),
                _ => LAPLACE_MECHANISM.into(),
            },
            target: format!("{} ({})", q.name, q.kind.part_names()[i]),
            sensitivity: None,
            noise: None,
            loss: loss.clone(),
            params: serde_json::json!({ "estimator": estimator }),
        })
        .collect()
}

/// What the curator sees of one released number before spending anything
/// (`dpflow impute --diagnose`): **not private**, never published.
#[derive(Debug, Clone, Serialize)]
pub struct PartDiagnosis {
    /// Query and part, e.g. `mean_income (mean)`.
    pub target: String,
    /// `smooth` (reads an imputed column) or `global` (discrete Laplace).
    pub noise: &'static str,
    /// Donees whose imputed value can enter this number (|R|).
    pub donees_inside: usize,
    /// L1_R(D) (smooth numbers only).
    pub l1: Option<u64>,
    /// The smooth bound S(D) or global sensitivity, on the exact counts.
    pub bound: Option<f64>,
    /// The noise scale: S(D)/α (smooth) or Δ/ε (Laplace).
    pub scale: Option<f64>,
    /// The exact value (curator only).
    pub exact: Option<f64>,
}

/// Curator diagnostics of a spec (reads the data, charges and releases
/// nothing): per released number, the donees inside it, L1_R(D), the bound
/// and the noise scale at the spec's ε. Its output is NOT differentially
/// private: never publish it.
pub async fn diagnose(ctx: &SessionContext, spec: &spec::ImputeSpec) -> Result<Vec<PartDiagnosis>> {
    let data = summarize(ctx, spec).await?;
    let epsilon = match spec.budget {
        crate::privacy::Budget::Pure { epsilon } | crate::privacy::Budget::Approx { epsilon, .. } => epsilon,
        crate::privacy::Budget::Zcdp { .. } => {
            return Err(ImputeError::Calibration("smooth-sensitivity releases need an ε (or ε, δ) budget".into()));
        }
    };
    let alpha = smooth_calibration(epsilon, None).map(|c| c.alpha).ok();
    let mut out = Vec::new();
    for (q, summary) in spec.queries.iter().zip(&data.queries) {
        let ex = exact_parts(q, summary);
        for (i, p) in parts(q).iter().enumerate() {
            let noise = p.noise(&spec.imputation.columns);
            let l1 = summary.l1[i].map(|l| l.value);
            let s = ex[0].unwrap_or(0.0);
            let (lo, hi) = match &q.kind {
                QueryKind::Mean { lo, hi, .. } | QueryKind::Variance { lo, hi, .. } => (*lo, *hi),
                _ => (0.0, 0.0),
            };
            let l = l1.unwrap_or(0) as f64;
            let bound = match (i, &q.kind) {
                (0, _) | (1, QueryKind::Proportion { .. }) => Some(1.0 + l),
                (1, _) if s > 0.0 => Some(mean_bound(lo, hi, l, s)),
                (2, _) if s > 1.0 => {
                    let m = ex[1].map_or((hi - lo).powi(2), |y| (lo - y).powi(2).max((hi - y).powi(2)));
                    Some(variance_bound(m, l, s))
                }
                _ => None,
            };
            let scale = match noise {
                PartNoise::Smooth => bound.zip(alpha).map(|(b, a)| b / a),
                PartNoise::Global => bound.map(|b| b / epsilon),
            };
            out.push(PartDiagnosis {
                target: format!("{} ({})", q.name, q.kind.part_names()[i]),
                noise: match noise {
                    PartNoise::Smooth => "smooth",
                    PartNoise::Global => "global",
                },
                donees_inside: summary.donees_inside[i] as usize,
                l1,
                bound,
                scale,
                exact: ex[i],
            });
        }
    }
    Ok(out)
}

/// The exact value of each released number of `q` on the imputed data,
/// with the populations of [`answer`] (curator diagnostics only).
fn exact_parts(q: &QuerySpec, s: &summary::QuerySummary) -> Vec<Option<f64>> {
    let a = &s.imputed;
    let count = a.count as f64;
    match &q.kind {
        QueryKind::Count => vec![Some(count)],
        QueryKind::Proportion { .. } => vec![Some(count), Some(a.numerator as f64)],
        QueryKind::Mean { lo, hi, .. } | QueryKind::Variance { lo, hi, .. } => {
            let grid = summary::ValueGrid::new(*lo, *hi);
            let mean = (count > 0.0).then(|| a.sum(&grid) / count);
            let var = mean.filter(|_| count > 1.0).map(|m| a.sum_sq_about(m, &grid) / (count - 1.0));
            vec![Some(count), mean, var]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_of_a_multi_partition_input_stay_in_file_order_and_aligned() {
        // Values and match codes come from two reads and are paired by row: merged
        // partitions (as they finish) could pair one person's values with another's codes.
        let d = tempfile::tempdir().unwrap();
        let mut s = String::from("id,g\n");
        for id in 0..3000 {
            s += &format!("{id},{}\n", id % 7);
        }
        std::fs::write(d.path().join("t.csv"), s).unwrap();
        let dom = d.path().join("d.yaml");
        std::fs::write(
            &dom,
            "columns:\n  - {name: id, kind: integer, bounds: [0, 2999]}\n  - {name: g, kind: integer, bounds: [0, 6]}\n",
        )
        .unwrap();
        let loc = d.path().join("t.csv");
        let ds = Dataset::open("t", loc.to_str().unwrap(), None, dom.to_str().unwrap()).unwrap();
        // The file is split into byte ranges read as 4 partitions by the caller's context.
        let ctx = SessionContext::new_with_config(
            datafusion::prelude::SessionConfig::new()
                .with_target_partitions(4)
                .with_repartition_file_min_size(1024)
                .with_batch_size(128),
        );
        let raw = ds.raw(&ctx).await.unwrap().create_physical_plan().await.unwrap();
        assert!(raw.properties().partitioning.partition_count() > 1, "the test needs a multi-partition read");
        let names = vec!["id".to_string(), "g".to_string()];
        let values = load_columns(&ctx, &ds, &names, &[]).await.unwrap();
        let codes = load_columns(&ctx, &ds, &names, &names).await.unwrap();
        let want: Vec<Option<f64>> = (0..3000).map(|i| Some(i as f64)).collect();
        assert_eq!(values["id"], want, "file order");
        assert_eq!(codes["id"], want, "codes of id in the same order");
        let g: Vec<Option<f64>> = (0..3000).map(|i| Some((i % 7) as f64)).collect();
        assert_eq!(values["g"], g);
        assert_eq!(codes["g"], g);
    }

    #[test]
    fn the_mean_bound_covers_every_change_of_one_donee() {
        // Brute force over what one changed donee can do to the sum of clamped values:
        // gain a value (it had no donor), lose it, change it, or enter/leave the
        // subpopulation. Each moves the sum by at most w = max(b − a, |a|, |b|).
        for (a, b) in [(0.0f64, 300000.0f64), (190.0, 200.0), (-100.0, 100.0), (-50.0, -10.0), (5.0, 6.0)] {
            let w = (b - a).max(f64::abs(a)).max(f64::abs(b));
            let states = [None, Some(a), Some(b), Some((a + b) / 2.0)];
            for x in states {
                for y in states {
                    let change = (x.unwrap_or(0.0) - y.unwrap_or(0.0)).abs();
                    assert!(change <= w + 1e-9, "[{a}, {b}]: {x:?} → {y:?} moves the sum by {change} > {w}");
                }
            }
            // The paper's b − a is too small when 0 ∉ [a, b] (a donee gaining a value).
            if a > 0.0 || b < 0.0 {
                assert!(f64::abs(b) > b - a || f64::abs(a) > b - a);
            }
        }
    }
    use dpflow_udfs::knn::{AttrKind, KnnConfig, MatchAttr, Metric};
    use dpflow_udfs::noise::testing::ks_test;

    fn tiny() -> Imputed {
        tiny_with(|i| i % 5 == 0)
    }

    fn tiny_with(missing: impl Fn(usize) -> bool) -> Imputed {
        // 40 rows, class by x in 0..4; y missing for some rows.
        let n = 40;
        let x: Vec<Option<f64>> = (0..n).map(|i| Some((i % 4) as f64)).collect();
        let y: Vec<Option<f64>> = (0..n).map(|i| if missing(i) { None } else { Some((i * 37 % 100) as f64) }).collect();
        let mut cols = HashMap::new();
        cols.insert("x".to_string(), x.clone());
        cols.insert("y".to_string(), y);
        let cfg = KnnConfig {
            attrs: vec![MatchAttr { name: "x".into(), kind: AttrKind::Ordinal, weight: 1.0, size: 4 }],
            metric: Metric::Euclidean,
            k: 1,
        };
        let codes = x.iter().map(|v| vec![v.unwrap() as u32]).collect();
        impute_columns(cols, &["y".to_string()], codes, &cfg, 1000).unwrap()
    }

    #[test]
    fn smooth_count_noise_is_generalized_cauchy_with_the_bound_scale() {
        let data = tiny();
        assert!(data.imputed.iter().filter(|x| **x).count() == 8);
        assert!(
            data.imputed.iter().zip(&data.columns["y"]).all(|(i, v)| !*i || v.is_some()),
            "every donee got a value"
        );
        // A count that reads the imputed y (every value passes): every donee is in R, L1_R = L1.
        let all_y = Predicate { column: "y".into(), lo: Some(0.0), hi: Some(100.0), codes: None };
        let q = vec![QuerySpec { name: "n".into(), kind: QueryKind::Count, predicate: vec![all_y] }];
        let sq = data.summarize(&q).unwrap();
        let l1 = data.l1_of(&parts(&q[0])[0]).unwrap().unwrap().value;
        assert_eq!(l1, data.l1.value);
        let eps = 6.0 * std::f64::consts::LN_2; // γ = 4
        let scale = (1.0 + l1 as f64) / std::f64::consts::LN_2;
        let mut rng = DpRng::unsafe_seeded(3);
        let mut z: Vec<f64> = (0..4000)
            .map(|_| {
                let v = answer(&sq, &q, Estimator::Smooth, eps, None, &mut rng).unwrap()[0].value.unwrap();
                assert_eq!(v, v.round(), "counts are released on the integers");
                // Undo the integer grid with a uniform jitter (changes the cdf by < 10⁻³ here).
                let u = (rand::Rng::next_u64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                (v + u - 40.0) / scale
            })
            .collect();
        let d = dpflow_udfs::noise::GeneralizedCauchy::new(4.0).unwrap();
        // Numerical cdf of the generalized Cauchy(4).
        let (lo, h) = (-60.0f64, 1e-3);
        let mut table = vec![0.0];
        let mut acc = 0.0;
        for i in 0..120_000 {
            acc += d.pdf(lo + (i as f64 + 0.5) * h) * h;
            table.push(acc);
        }
        let cdf = |t: f64| table[(((t.clamp(lo, 60.0) - lo) / h) as usize).min(table.len() - 1)];
        ks_test(&mut z, cdf, 1e-4);
    }

    #[test]
    fn estimators_agree_with_exact_values_at_huge_epsilon() {
        let data = tiny();
        let q = vec![
            QuerySpec {
                name: "m".into(),
                kind: QueryKind::Mean { value: "y".into(), lo: 0.0, hi: 100.0 },
                predicate: vec![],
            },
            QuerySpec {
                name: "p".into(),
                kind: QueryKind::Proportion {
                    numerator: vec![Predicate { column: "y".into(), lo: Some(50.0), hi: None, codes: None }],
                },
                predicate: vec![],
            },
        ];
        let sq = data.summarize(&q).unwrap();
        let ex = exact(&data.columns, data.n, &q);
        let mut rng = DpRng::unsafe_seeded(4);
        let r = answer(&sq, &q, Estimator::Smooth, 1e7, None, &mut rng).unwrap();
        assert!((r[0].value.unwrap() - ex[0].unwrap()).abs() < 0.1);
        assert!((r[1].value.unwrap() - ex[1].unwrap()).abs() < 0.01);
        // The Gaussian (ε, δ) variant is refused at every ε (NRS07 Lemma 2.10 needs β < ln 2).
        for eps in [1.0, 60.0] {
            let e = answer(&sq, &q, Estimator::Smooth, eps, Some(1e-6), &mut rng).unwrap_err();
            assert!(e.to_string().contains("pure ε"), "{e}");
        }
    }

    /// ln f(y) for the release y = q + (S/α)·X, X generalized Cauchy(γ) (normalised pdf).
    fn ln_density(y: f64, q: f64, s: f64, cal: SmoothCalibration) -> f64 {
        let d = GeneralizedCauchy::new(cal.gamma).unwrap();
        let scale = s / cal.alpha;
        (d.pdf((y - q) / scale) / scale).ln()
    }

    /// The largest |ln f_D(y) − ln f_D′(y)| over a grid of y, S′/S ∈ [1/2, 2] and
    /// |q − q′| ≤ min(S, S′) (S = 1, q = 0).
    fn worst_log_ratio(cal: SmoothCalibration) -> f64 {
        let ln2 = std::f64::consts::LN_2;
        let mut zs: Vec<f64> = (-1000..=1000).map(|i| i as f64 / 50.0).collect();
        zs.extend((-80..=140).flat_map(|k| [10f64.powf(k as f64 / 20.0), -(10f64.powf(k as f64 / 20.0))]));
        let mut worst = 0f64;
        for i in 0..=20 {
            let r = (-ln2 + 2.0 * ln2 * i as f64 / 20.0).exp();
            let m = r.min(1.0);
            for j in 0..=10 {
                let dq = -m + 2.0 * m * j as f64 / 10.0;
                for &z in &zs {
                    let y = z / cal.alpha;
                    let v = ln_density(y, 0.0, 1.0, cal) - ln_density(y, dq, r, cal);
                    assert!(v.is_finite());
                    worst = worst.max(v.abs());
                }
            }
        }
        worst
    }

    #[test]
    fn calibration_keeps_the_log_density_ratio_of_neighbours_within_epsilon() {
        let ln2 = std::f64::consts::LN_2;
        for eps in [0.7, 0.75, 0.8, 1.0, 1.2, 2.0 * ln2, 2.0, 3.0, 6.0 * ln2, 10.0] {
            let cal = smooth_calibration(eps, None).unwrap();
            assert!(cal.loss_bound() <= eps * (1.0 + 1e-12), "ε = {eps}: proven bound {}", cal.loss_bound());
            let w = worst_log_ratio(cal);
            assert!(w <= eps * (1.0 + 1e-9), "ε = {eps}: log density ratio {w}");
        }
        // The paper's γ = 4 at ε = 6 ln 2 (004 §6) is kept.
        let cal = smooth_calibration(6.0 * ln2, None).unwrap();
        assert!((cal.gamma - 4.0).abs() < 1e-12 && (cal.alpha - ln2).abs() < 1e-15);
        // The old calibration (γ = 1 + ε/(2 ln 2), α = ln 2 for every ε) breaks below ≈ 0.86.
        for eps in [0.5, 0.7] {
            let old = SmoothCalibration { gamma: 1.0 + eps / (2.0 * ln2), alpha: ln2 };
            let w = worst_log_ratio(old);
            assert!(w > eps + 0.15, "ε = {eps}: the old calibration gives {w}");
        }
        // ε ≤ ln 2 (and nonsense) is refused with a message saying what to do.
        for eps in [0.5, ln2, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = smooth_calibration(eps, None).unwrap_err().to_string();
            assert!(e.contains("ε > ln 2") && e.contains("ignore-missing"), "{e}");
        }
    }

    #[test]
    fn small_epsilon_is_refused_at_plan_time_before_any_read() {
        let dir = tempfile::tempdir().unwrap();
        let domain = dir.path().join("d.yaml");
        std::fs::write(
            &domain,
            "columns:\n  - {name: x, kind: integer, bounds: [0, 3]}\n  - {name: y, kind: integer, bounds: [0, 99], nullable: true}\n",
        )
        .unwrap();
        // The input file does not exist: planning must fail before anything reads it.
        let spec = |budget: &str| {
            let path = dir.path().join("spec.yaml");
            std::fs::write(
                &path,
                format!(
                    "input: missing.csv\ndomain: d.yaml\nimpute: [y]\nmatch: [{{column: x}}]\nbudget: {budget}\nqueries:\n  - {{name: n, count: {{}}, where: {{y: [0, 50]}}}}\n"
                ),
            )
            .unwrap();
            spec::ImputeSpec::load(path.to_str().unwrap()).unwrap()
        };
        let small = spec("{epsilon: 0.6}");
        let e = planned_records(&small, Estimator::Smooth).unwrap_err().to_string();
        assert!(e.contains("ε > ln 2"), "{e}");
        // The Laplace baseline has no such limit; a valid ε plans fine.
        assert!(planned_records(&small, Estimator::IgnoreMissing).is_ok());
        assert_eq!(planned_records(&spec("{epsilon: 1.0}"), Estimator::Smooth).unwrap().len(), 1);
        let approx = spec("{epsilon: 60.0, delta: 1.0e-6}");
        assert!(planned_records(&approx, Estimator::Smooth).is_err());
        // A count that reads no imputed column is plain discrete Laplace: no ln 2 limit.
        let path = dir.path().join("spec2.yaml");
        std::fs::write(
            &path,
            "input: missing.csv\ndomain: d.yaml\nimpute: [y]\nmatch: [{column: x}]\nbudget: {epsilon: 0.6}\nqueries:\n  - {name: n, count: {}, where: {x: [0, 1]}}\n",
        )
        .unwrap();
        let r = planned_records(&spec::ImputeSpec::load(path.to_str().unwrap()).unwrap(), Estimator::Smooth).unwrap();
        assert_eq!(r[0].mechanism, "discrete_laplace");
    }

    #[test]
    fn smooth_outputs_lie_on_a_grid_fixed_by_public_ranges_only() {
        // Two datasets with different L1(D) (hence different smooth bounds).
        let a = tiny();
        let b = tiny_with(|i| i % 3 == 0 || i % 7 == 1);
        let all_y = Predicate { column: "y".into(), lo: None, hi: None, codes: None };
        let q = vec![
            QuerySpec { name: "n".into(), kind: QueryKind::Count, predicate: vec![all_y] },
            QuerySpec {
                name: "v".into(),
                kind: QueryKind::Variance { value: "y".into(), lo: 0.0, hi: 100.0 },
                predicate: vec![],
            },
        ];
        let mut rng = DpRng::unsafe_seeded(12);
        let on = |v: f64, k: i32| (v / 2f64.powi(k)).fract() == 0.0;
        let l1 = |d: &Imputed| d.l1_of(&parts(&q[0])[0]).unwrap().unwrap().value;
        assert_ne!(l1(&a), l1(&b), "the two datasets must have different smooth bounds");
        let (km, kv) = (
            OutputGrid::Mean { lo: 0.0, hi: 100.0 }.exponent(),
            OutputGrid::Variance { lo: 0.0, hi: 100.0 }.exponent(),
        );
        assert_eq!((km, kv), (6 - 32, 13 - 32));
        for data in [&a, &b] {
            for _ in 0..300 {
                let r = answer(&data.summarize(&q).unwrap(), &q, Estimator::Smooth, 3.0, None, &mut rng).unwrap();
                assert!(on(r[0].value.unwrap(), 0), "count {:?}", r[0].value);
                assert!(on(r[1].count.unwrap(), 0));
                if let Some(v) = r[1].value {
                    // Or clamped to the public bound (b − a)²/4·s/(s − 1) (post-processing).
                    let s = r[1].count.unwrap();
                    assert!(on(v, kv) || v == 2500.0 * s / (s - 1.0), "variance {v}");
                }
            }
        }
    }

    #[test]
    fn laplace_baseline_draws_discrete_noise_on_the_public_grid() {
        let data = tiny();
        let q = vec![QuerySpec { name: "n".into(), kind: QueryKind::Count, predicate: vec![] }];
        let sq = data.summarize(&q).unwrap();
        let mut rng = DpRng::unsafe_seeded(21);
        // Ignore-missing count: 32 complete rows, sensitivity 1, ε = 1: integer noise with
        // P(z) ∝ e^{−|z|}: P(0) = (1 − p)/(1 + p), Var = 2p/(1 − p)², p = e^{−1}.
        let n = 20_000;
        let (mut zeros, mut sum2) = (0usize, 0.0);
        for _ in 0..n {
            let v = answer(&sq, &q, Estimator::IgnoreMissing, 1.0, None, &mut rng).unwrap()[0].value.unwrap();
            assert_eq!(v, v.round(), "on the integer grid: {v}");
            zeros += usize::from(v == 32.0);
            sum2 += (v - 32.0).powi(2);
        }
        let p = (-1f64).exp();
        let (p0, var) = ((1.0 - p) / (1.0 + p), 2.0 * p / (1.0 - p).powi(2));
        assert!((zeros as f64 / n as f64 - p0).abs() < 0.015, "P(0) = {}", zeros as f64 / n as f64);
        assert!((sum2 / n as f64 - var).abs() < 0.1, "variance {}", sum2 / n as f64);
        // A mean's release: on the public grid of [0, 100] whatever q, Laplace spread Δ/ε.
        let grid = OutputGrid::Mean { lo: 0.0, hi: 100.0 };
        let k = grid.exponent();
        let (mut abs, m) = (0.0, 20_000);
        for i in 0..m {
            let q = 10.123456789 + i as f64 * 1e-7;
            let y = release(q, 1.0, &SmoothNoise::Laplace { epsilon: 0.5 }, grid, &mut rng);
            assert_eq!((y / 2f64.powi(k)).fract(), 0.0, "{y}");
            abs += (y - q).abs();
        }
        // E|Laplace(b = 2)| = 2 (grid rounding adds 2⁻²⁶-sized terms).
        assert!((abs / m as f64 - 2.0).abs() < 0.06, "{}", abs / m as f64);
    }
}
