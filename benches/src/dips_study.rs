//! 002 §4.1 and §4.2: simulation studies 1 (Bernoulli) and 2 (bounded
//! normal) for the DIPS synthesizers, through the library's mechanisms
//! (`dpflow::synth::dips`), with the 002 eqs. (9)–(11) combining rule
//! (`dpflow::analyze::combine`).
//!
//! Settings as 002 states them: study 1 has n ∈ {40, 100, 1000},
//! π ∈ {0.1, 0.25, 0.5}; study 2 has n ∈ {20, 100, 1000}, σ² ∈ {1, 4, 9},
//! μ = 0 and the asymmetric bounds [μ − 3σ, μ + 4σ]; ε from e⁻⁴ to e⁴; m = 5
//! sets of n rows with ε/5 each, except BB-MR and SMOOTH (one set, ε).
//! Where dpflow differs from 002 (add/remove neighbours; see
//! `dpflow::synth::dips`), the mechanisms here are dpflow's:
//! - LAP and MODIPS sanitize both cells (n₀, n₁) of the Bernoulli table;
//!   002 sanitizes n₁ only and keeps n public.
//! - MD and BB-MR use r = n synthetic rows (002's formulas exactly).
//! - MODIPS-normal takes the simulation's n as a declared public n, as 002
//!   does, and sanitizes the centred sum and sum of squares.
//! - PERT and SMOOTH use K = ⌈(c₁ − c₀)/(3.5σn^{−1/3})⌉ = ⌈2n^{1/3}⌉ bins:
//!   Scott's rule with the simulation's *true* σ, a public design constant.
//!   002 applied Scott's rule to the private sample (free of charge, which
//!   DP does not allow); its median bin counts were 7, 10 and 21 for n = 20,
//!   100, 1000; ours are 6, 10 and 20.
//!
//! Simulation only: the data are generated and the noise is seeded.

use std::time::Instant;

use dpflow::analyze::Rule;
use dpflow::analyze::combine::combine;
use dpflow::measure::ReleaseAccountant;
use dpflow::privacy::{Budget, PrivacyFilter};
use dpflow::synth::dips::cells::{self, CellMechanism, CellOptions, Generate};
use dpflow::synth::dips::normal::{NormalSpec, NormalStatistics, draw_set, modips_normal};
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::cauchy::standard_normal_sample;
use rand::RngExt;
use serde::Serialize;

/// One row of the results table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// 1 or 2.
    pub study: u8,
    /// Sample size.
    pub n: u64,
    /// π (study 1) or σ² (study 2).
    pub param: f64,
    /// ln ε.
    pub log_epsilon: f64,
    /// Method (LAP, MD, BB-MR, MODIPS, PERT, SMOOTH, MS, ORI).
    pub method: String,
    /// Estimand (pi, mu, sigma2).
    pub estimand: String,
    /// Mean of the estimate minus the truth (study 2's σ²: divided by σ²).
    pub bias: f64,
    /// Root mean squared error (σ²: divided by σ²).
    pub rmse: f64,
    /// Coverage of the truth by the 95% interval.
    pub coverage: f64,
    /// Mean interval width (σ²: divided by σ²).
    pub width: f64,
    /// Repeats.
    pub repeats: usize,
}

/// Where a row of results belongs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    pub(crate) study: u8,
    pub(crate) n: u64,
    pub(crate) param: f64,
    pub(crate) log_epsilon: f64,
}

/// Results of one scenario, tagged with its index.
type Tagged = anyhow::Result<Vec<(usize, Vec<Row>)>>;

#[derive(Default, Clone)]
pub(crate) struct Acc {
    err: f64,
    sq: f64,
    cover: usize,
    width: f64,
    k: usize,
}

impl Acc {
    pub(crate) fn add(&mut self, truth: f64, c: &dpflow::analyze::Combined) {
        let e = c.estimate - truth;
        self.err += e;
        self.sq += e * e;
        self.cover += usize::from(c.ci_low <= truth && truth <= c.ci_high);
        self.width += c.ci_high - c.ci_low;
        self.k += 1;
    }

    pub(crate) fn row(&self, at: Scenario, method: &str, estimand: &str, scale: f64) -> Row {
        let k = self.k.max(1) as f64;
        Row {
            study: at.study,
            n: at.n,
            param: at.param,
            log_epsilon: at.log_epsilon,
            method: method.into(),
            estimand: estimand.into(),
            bias: self.err / k / scale,
            rmse: (self.sq / k).sqrt() / scale,
            coverage: self.cover as f64 / k,
            width: self.width / k / scale,
            repeats: self.k,
        }
    }
}

pub(crate) fn accountant(epsilon: f64) -> ReleaseAccountant {
    ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon }))
}

/// Combines per-set (q, u) with the 002 rule (m ≥ 2) or the single-set rule.
fn combined(q: &[f64], u: &[f64]) -> anyhow::Result<dpflow::analyze::Combined> {
    let rule = if q.len() > 1 { Rule::Dips } else { Rule::Single };
    Ok(combine("x", q, u, rule, 0.05, None)?)
}

/// Proportion estimates and binomial variances of Bernoulli sets given as
/// (n₀, n₁) counts.
fn proportions(sets: &[Vec<u64>]) -> (Vec<f64>, Vec<f64>) {
    sets.iter()
        .map(|s| {
            let n = (s[0] + s[1]) as f64;
            let p = s[1] as f64 / n;
            (p, p * (1.0 - p) / n)
        })
        .unzip()
}

pub(crate) const M: usize = 5;

/// ln ε from −4 to 4 in steps of `step`.
pub fn log_epsilons(step: f64) -> Vec<f64> {
    let k = (8.0 / step).round() as usize;
    (0..=k).map(|i| -4.0 + i as f64 * step).collect()
}

/// Study 1 for one (n, π): every method at every ε.
fn study1_scenario(n: u64, pi: f64, log_eps: &[f64], repeats: usize, seed: u64) -> anyhow::Result<Vec<Row>> {
    let mut rng = DpRng::unsafe_seeded(seed);
    let methods = ["LAP", "MD", "BB-MR", "MODIPS", "MS", "ORI"];
    let mut acc = vec![vec![Acc::default(); methods.len()]; log_eps.len()];
    for _ in 0..repeats {
        let n1 = (0..n).filter(|_| rng.random::<f64>() < pi).count() as u64;
        let exact = [n - n1, n1];
        // Original data (Wald interval) and non-DP multiple synthesis
        // (π ~ Beta(1/3 + n₁, 1/3 + n − n₁), then n rows), both ε-free.
        let p = n1 as f64 / n as f64;
        let ori = combined(&[p], &[p * (1.0 - p) / n as f64])?;
        let ms_sets: Vec<Vec<u64>> = (0..M)
            .map(|_| {
                let pi_draw = cells::dirichlet_draw(&mut rng, &[exact[0] as f64, exact[1] as f64], 1.0 / 3.0);
                cells::multinomial(&mut rng, &pi_draw, n)
            })
            .collect();
        let (q, u) = proportions(&ms_sets);
        let ms = combined(&q, &u)?;
        for (ei, &le) in log_eps.iter().enumerate() {
            let eps = le.exp();
            for (mi, method) in methods.iter().enumerate() {
                let c = match *method {
                    "ORI" => ori.clone(),
                    "MS" => ms.clone(),
                    _ => {
                        let (mech, sets, generate) = match *method {
                            "LAP" => (CellMechanism::LaplaceSanitizer, M, Generate::Round),
                            "MD" => (CellMechanism::MultinomialDirichlet, M, Generate::Sample),
                            "BB-MR" => (CellMechanism::BinomialBeta, 1, Generate::Sample),
                            _ => (CellMechanism::Modips, M, Generate::Sample),
                        };
                        let opts = CellOptions { sets, rows: n, prior: 1.0 / 3.0, generate };
                        let mut a = accountant(eps);
                        let rel = cells::synthesize(mech, &exact, "x", eps, &opts, &mut a, &mut rng)?;
                        let (q, u) = proportions(&rel.sets);
                        combined(&q, &u)?
                    }
                };
                acc[ei][mi].add(pi, &c);
            }
        }
    }
    let mut rows = Vec::new();
    for (ei, &le) in log_eps.iter().enumerate() {
        for (mi, method) in methods.iter().enumerate() {
            rows.push(acc[ei][mi].row(Scenario { study: 1, n, param: pi, log_epsilon: le }, method, "pi", 1.0));
        }
    }
    Ok(rows)
}

/// Mean, variance, and the 002 §4.2 within-set variances of x̄ and s².
fn normal_estimates(x: &[f64]) -> [(f64, f64); 2] {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let m2 = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let m4 = x.iter().map(|v| (v - mean).powi(4)).sum::<f64>() / n;
    let s2 = m2 * n / (n - 1.0);
    let kurt = if m2 > 0.0 { m4 / (m2 * m2) - 3.0 } else { 0.0 };
    // 002: (s²)²(2/(n − 1) + κ/n); never negative.
    let u_s2 = (s2 * s2 * (2.0 / (n - 1.0) + kurt / n)).max(0.0);
    [(mean, s2 / n), (s2, u_s2)]
}

/// Values from bin counts over equal bins of [lo, hi], uniform within bins
/// (002 §3.1.2).
fn from_bins(rng: &mut DpRng, counts: &[u64], lo: f64, hi: f64) -> Vec<f64> {
    let w = (hi - lo) / counts.len() as f64;
    let mut out = Vec::new();
    for (k, &c) in counts.iter().enumerate() {
        for _ in 0..c {
            out.push(lo + w * (k as f64 + rng.random::<f64>()));
        }
    }
    out
}

/// Study 2 for one (n, σ²).
fn study2_scenario(n: u64, sigma2: f64, log_eps: &[f64], repeats: usize, seed: u64) -> anyhow::Result<Vec<Row>> {
    let mut rng = DpRng::unsafe_seeded(seed);
    let sigma = sigma2.sqrt();
    let (lo, hi) = (-3.0 * sigma, 4.0 * sigma);
    let bins = (2.0 * (n as f64).cbrt()).ceil() as usize;
    let methods = ["MODIPS", "PERT", "SMOOTH", "MS", "ORI"];
    let mut acc = vec![vec![[Acc::default(), Acc::default()]; methods.len()]; log_eps.len()];
    let truth = [0.0, sigma2];
    for _ in 0..repeats {
        // N(0, σ²) truncated to [lo, hi] by rejection.
        let data: Vec<f64> = (0..n)
            .map(|_| {
                loop {
                    let x = sigma * standard_normal_sample(&mut rng);
                    if (lo..=hi).contains(&x) {
                        break x;
                    }
                }
            })
            .collect();
        let mut exact_bins = vec![0u64; bins];
        for &x in &data {
            let k = (((x - lo) / (hi - lo)) * bins as f64).floor() as usize;
            exact_bins[k.min(bins - 1)] += 1;
        }
        let ori: Vec<_> =
            normal_estimates(&data).iter().map(|&(q, u)| combined(&[q], &[u])).collect::<anyhow::Result<_>>()?;
        // Non-DP MS: the posterior given the exact statistics, 5 sets.
        let ori_stats = {
            let [(mean, _), (s2, _)] = normal_estimates(&data);
            NormalStatistics { n: n as f64, mean, variance: s2 }
        };
        let ms_sets: Vec<Vec<f64>> = (0..M).map(|_| draw_set(&mut rng, &ori_stats, lo, hi, n)).collect();
        let ms = combine_sets(&ms_sets)?;
        for (ei, &le) in log_eps.iter().enumerate() {
            let eps = le.exp();
            for (mi, method) in methods.iter().enumerate() {
                let c: Vec<dpflow::analyze::Combined> = match *method {
                    "ORI" => ori.clone(),
                    "MS" => ms.clone(),
                    "MODIPS" => {
                        let spec = NormalSpec { column: "x".into(), lo, hi, sets: M, rows: n, public_n: Some(n) };
                        let mut a = accountant(eps);
                        combine_sets(&modips_normal(&data, &spec, eps, &mut a, &mut rng)?.sets)?
                    }
                    _ => {
                        let (mech, sets) = if *method == "PERT" {
                            (CellMechanism::PerturbedHistogram, M)
                        } else {
                            (CellMechanism::SmoothedHistogram, 1)
                        };
                        let opts = CellOptions { sets, rows: n, ..Default::default() };
                        let mut a = accountant(eps);
                        let rel = cells::synthesize(mech, &exact_bins, "x", eps, &opts, &mut a, &mut rng)?;
                        let sets: Vec<Vec<f64>> = rel.sets.iter().map(|s| from_bins(&mut rng, s, lo, hi)).collect();
                        combine_sets(&sets)?
                    }
                };
                for j in 0..2 {
                    acc[ei][mi][j].add(truth[j], &c[j]);
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (ei, &le) in log_eps.iter().enumerate() {
        for (mi, method) in methods.iter().enumerate() {
            let at = Scenario { study: 2, n, param: sigma2, log_epsilon: le };
            rows.push(acc[ei][mi][0].row(at, method, "mu", 1.0));
            rows.push(acc[ei][mi][1].row(at, method, "sigma2", sigma2));
        }
    }
    Ok(rows)
}

/// Combined inferences for μ and σ² from synthetic sets.
fn combine_sets(sets: &[Vec<f64>]) -> anyhow::Result<Vec<dpflow::analyze::Combined>> {
    let est: Vec<[(f64, f64); 2]> = sets.iter().map(|s| normal_estimates(s)).collect();
    (0..2)
        .map(|j| {
            let (q, u): (Vec<f64>, Vec<f64>) = est.iter().map(|e| e[j]).unzip();
            combined(&q, &u)
        })
        .collect()
}

/// Runs study `study` (1 to 4) on all cores; returns the table and seconds.
pub fn run(study: u8, repeats: usize, step: f64, seed: u64) -> anyhow::Result<(Vec<Row>, f64)> {
    let t = Instant::now();
    let log_eps = log_epsilons(step);
    let scenarios: Vec<(u64, f64)> = match study {
        1 => [40u64, 100, 1000].iter().flat_map(|&n| [0.1, 0.25, 0.5].map(|p| (n, p))).collect(),
        2 => [20u64, 100, 1000].iter().flat_map(|&n| [1.0, 4.0, 9.0].map(|s| (n, s))).collect(),
        3 => return run_study3(repeats, step, seed),
        4 => return crate::dips_study4::run_study4(repeats, step, seed),
        other => anyhow::bail!("--study {other}: the studies are 1, 2, 3 and 4"),
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunks: Vec<Vec<(usize, (u64, f64))>> = {
        let mut c = vec![Vec::new(); threads];
        // Largest n first, round-robin, to balance the threads.
        let mut order: Vec<_> = scenarios.iter().copied().enumerate().collect();
        order.sort_by_key(|s| std::cmp::Reverse(s.1.0));
        for (i, s) in order.into_iter().enumerate() {
            c[i % threads].push(s);
        }
        c
    };
    let results: Vec<Tagged> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let log_eps = &log_eps;
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|&(i, (n, p))| {
                            let s = seed.wrapping_add(1000 * i as u64 + study as u64);
                            let rows = if study == 1 {
                                study1_scenario(n, p, log_eps, repeats, s)?
                            } else {
                                study2_scenario(n, p, log_eps, repeats, s)?
                            };
                            Ok((i, rows))
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a study thread panicked")).collect()
    });
    let mut all: Vec<(usize, Vec<Row>)> = Vec::new();
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok((all.into_iter().flat_map(|(_, r)| r).collect(), t.elapsed().as_secs_f64()))
}

/// Study 3's design (002 §4.3.1): w = (w₁, w₂, w₃) with 2, 3 and 4 levels
/// (K = 24 cells, k = 12·w₁ + 4·w₂ + w₃), z | w ~ N₂(μ_k, Σ) with σ₁² = σ₂² = 1,
/// ρ = 0.5, truncated to μ_kj ± 4. 002's cell probabilities and means are
/// in its supplement, which we do not have; ours are the product margins
/// (0.4, 0.6) × (0.5, 0.3, 0.2) × (0.1, 0.2, 0.3, 0.4) (cells of 0.8% to
/// 12%, so 8 to 120 rows of 1000) and μ_k = (w₁ − 0.5w₂ + 0.3w₃,
/// −w₁ + 0.4w₂ − 0.2w₃).
pub struct Glom3 {
    /// π_k.
    pub pi: Vec<f64>,
    /// μ_k.
    pub mu: Vec<[f64; 2]>,
    /// The public boxes μ_kj ± 4.
    pub bounds: Vec<[(f64, f64); 2]>,
}

impl Default for Glom3 {
    fn default() -> Self {
        let (a, b, c) = ([0.4, 0.6], [0.5, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4]);
        let mut pi = Vec::new();
        let mut mu = Vec::new();
        for (w1, pa) in a.iter().enumerate() {
            for (w2, pb) in b.iter().enumerate() {
                for (w3, pc) in c.iter().enumerate() {
                    pi.push(pa * pb * pc);
                    let (x1, x2, x3) = (w1 as f64, w2 as f64, w3 as f64);
                    mu.push([x1 - 0.5 * x2 + 0.3 * x3, -x1 + 0.4 * x2 - 0.2 * x3]);
                }
            }
        }
        let bounds = mu.iter().map(|m| [(m[0] - 4.0, m[0] + 4.0), (m[1] - 4.0, m[1] + 4.0)]).collect();
        Self { pi, mu, bounds }
    }
}

/// The six marginal probabilities Π of 002 §4.3.1 (first levels), as cell
/// predicates on k = 12·w₁ + 4·w₂ + w₃.
/// A marginal's name and its cell predicate.
type Term = (&'static str, fn(usize) -> bool);

const PI_TERMS: [Term; 6] = [
    ("P(w1=1)", |k| k / 12 == 0),
    ("P(w2=1)", |k| (k / 4) % 3 == 0),
    ("P(w2=2)", |k| (k / 4) % 3 == 1),
    ("P(w3=1)", |k| k % 4 == 0),
    ("P(w3=2)", |k| k % 4 == 1),
    ("P(w3=3)", |k| k % 4 == 2),
];

/// Per-set estimates (q, u) of Π and of the 24 cell means of z₁; `None`
/// for a cell mean when the set has fewer than 2 rows in the cell.
fn glom_estimates(cells: &[u32], z: &[[f64; 2]]) -> Vec<Option<(f64, f64)>> {
    let n = cells.len() as f64;
    let mut out = Vec::new();
    for (_, pred) in PI_TERMS {
        let p = cells.iter().filter(|&&k| pred(k as usize)).count() as f64 / n;
        out.push(Some((p, p * (1.0 - p) / n)));
    }
    let mut sum = [0.0f64; 24];
    let mut cnt = [0usize; 24];
    for (&k, v) in cells.iter().zip(z) {
        sum[k as usize] += v[0];
        cnt[k as usize] += 1;
    }
    let mean: Vec<f64> = (0..24).map(|k| sum[k] / cnt[k].max(1) as f64).collect();
    let within = cells.iter().zip(z).map(|(&k, v)| (v[0] - mean[k as usize]).powi(2)).sum::<f64>();
    let pooled = within / (n - 24.0).max(1.0);
    for k in 0..24 {
        out.push((cnt[k] >= 2).then(|| (mean[k], pooled / cnt[k] as f64)));
    }
    out
}

/// Combines per-set estimates term by term (a term with a missing set is `None`).
pub(crate) fn combine_terms(per_set: &[Vec<Option<(f64, f64)>>]) -> Vec<Option<dpflow::analyze::Combined>> {
    (0..per_set[0].len())
        .map(|t| {
            let pairs: Option<Vec<(f64, f64)>> = per_set.iter().map(|s| s[t]).collect();
            let (q, u): (Vec<f64>, Vec<f64>) = pairs?.into_iter().unzip();
            combined(&q, &u).ok()
        })
        .collect()
}

/// Runs `work(thread)` on `threads` threads and adds up their accumulators
/// (shape ε × method × term).
pub(crate) fn on_threads<F>(threads: usize, work: F, shape: [usize; 3]) -> anyhow::Result<Vec<Vec<Vec<Acc>>>>
where
    F: Fn(usize) -> anyhow::Result<Vec<Vec<Vec<Acc>>>> + Sync,
{
    let work = &work;
    let parts: Vec<anyhow::Result<Vec<Vec<Vec<Acc>>>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|i| scope.spawn(move || work(i))).collect();
        handles.into_iter().map(|h| h.join().expect("a study thread panicked")).collect()
    });
    let mut total = vec![vec![vec![Acc::default(); shape[2]]; shape[1]]; shape[0]];
    for p in parts {
        merge(&mut total, &p?);
    }
    Ok(total)
}

/// Adds one thread's accumulators (ε × method × term) to the total.
fn merge(total: &mut [Vec<Vec<Acc>>], part: &[Vec<Vec<Acc>>]) {
    for (te, pe) in total.iter_mut().zip(part) {
        for (tm, pm) in te.iter_mut().zip(pe) {
            for (t, a) in tm.iter_mut().zip(pm) {
                t.err += a.err;
                t.sq += a.sq;
                t.cover += a.cover;
                t.width += a.width;
                t.k += a.k;
            }
        }
    }
}

/// Study 3: MODIPS (GLOM) against NP-DIPS (the Laplace sanitizer on the 24
/// cells and a perturbed 2-D histogram of z per cell, ε/2 each, 002 §4.3.1),
/// with non-DP MS and the original data. Repeats are split over the threads.
pub fn run_study3(repeats: usize, step: f64, seed: u64) -> anyhow::Result<(Vec<Row>, f64)> {
    use dpflow::synth::dips::glom::{GlomSpec, GlomStatistics, draw_set as glom_draw, modips_glom};
    let t = Instant::now();
    let log_eps = log_epsilons(step);
    let design = Glom3::default();
    let n = 1000u64;
    let methods = ["MODIPS", "NP-DIPS", "MS", "ORI"];
    let terms = PI_TERMS.len() + 24;
    let truth: Vec<f64> = PI_TERMS
        .iter()
        .map(|(_, pred)| (0..24).filter(|&k| pred(k)).map(|k| design.pi[k]).sum())
        .chain(design.mu.iter().map(|m| m[0]))
        .collect();
    // Scott's rule in 2-D (h = 3.5σ·m^{−1/4}) with the expected cell size nπ_k.
    let bins: Vec<usize> =
        design.pi.iter().map(|p| ((8.0 / 3.5) * (n as f64 * p).powf(0.25)).ceil() as usize).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spec = GlomSpec { bounds: design.bounds.clone(), sets: M, rows: n, prior: 0.5 };
    let chol = [1.0, 0.5, 0.75f64.sqrt()];
    type Accs = Vec<Vec<Vec<Acc>>>;
    let work = |thread: usize| -> anyhow::Result<Accs> {
        let mut rng = DpRng::unsafe_seeded(seed.wrapping_add(3000 + thread as u64));
        let mut acc: Accs = vec![vec![vec![Acc::default(); terms]; methods.len()]; log_eps.len()];
        let mine = repeats / threads + usize::from(thread < repeats % threads);
        for _ in 0..mine {
            // Data: cells from π, z from the truncated normal of its cell.
            let counts = cells::multinomial(&mut rng, &design.pi, n);
            let (mut wc, mut z) = (Vec::new(), Vec::new());
            for (k, &c) in counts.iter().enumerate() {
                for _ in 0..c {
                    let b = design.bounds[k];
                    let v = loop {
                        let (a, e) = (standard_normal_sample(&mut rng), standard_normal_sample(&mut rng));
                        let v = [design.mu[k][0] + chol[0] * a, design.mu[k][1] + chol[1] * a + chol[2] * e];
                        if (b[0].0..=b[0].1).contains(&v[0]) && (b[1].0..=b[1].1).contains(&v[1]) {
                            break v;
                        }
                    };
                    wc.push(k as u32);
                    z.push(v);
                }
            }
            let ori = combine_terms(&[glom_estimates(&wc, &z)]);
            // Non-DP MS: the posterior given the exact statistics.
            let exact = {
                let mut means = vec![[0.0f64; 2]; 24];
                for (&k, v) in wc.iter().zip(&z) {
                    means[k as usize][0] += v[0];
                    means[k as usize][1] += v[1];
                }
                for (k, m) in means.iter_mut().enumerate() {
                    let c = counts[k].max(1) as f64;
                    *m = [m[0] / c, m[1] / c];
                }
                let mut w = [0.0; 3];
                for (&k, v) in wc.iter().zip(&z) {
                    let d = [v[0] - means[k as usize][0], v[1] - means[k as usize][1]];
                    w[0] += d[0] * d[0];
                    w[1] += d[1] * d[1];
                    w[2] += d[0] * d[1];
                }
                GlomStatistics { counts: counts.iter().map(|&c| c as f64).collect(), means, scatter: w }
            };
            let ms_sets: Vec<_> = (0..M)
                .map(|_| {
                    let s = glom_draw(&mut rng, &spec, &exact);
                    glom_estimates(&s.cells, &s.z)
                })
                .collect();
            let ms = combine_terms(&ms_sets);
            // Exact 2-D histograms per cell (bins over the cell's box).
            let hist: Vec<Vec<u64>> = (0..24)
                .map(|k| {
                    let b = bins[k];
                    let mut h = vec![0u64; b * b];
                    for (&c, v) in wc.iter().zip(&z) {
                        if c as usize == k {
                            let bx = design.bounds[k];
                            let i = (((v[0] - bx[0].0) / 8.0 * b as f64) as usize).min(b - 1);
                            let j = (((v[1] - bx[1].0) / 8.0 * b as f64) as usize).min(b - 1);
                            h[i * b + j] += 1;
                        }
                    }
                    h
                })
                .collect();
            for (ei, &le) in log_eps.iter().enumerate() {
                let eps = le.exp();
                for (mi, method) in methods.iter().enumerate() {
                    let c = match *method {
                        "ORI" => ori.clone(),
                        "MS" => ms.clone(),
                        "MODIPS" => {
                            let mut a = accountant(eps);
                            let rel = modips_glom(&wc, &z, &spec, eps, &mut a, &mut rng)?;
                            combine_terms(&rel.sets.iter().map(|s| glom_estimates(&s.cells, &s.z)).collect::<Vec<_>>())
                        }
                        _ => {
                            // Cells: ε/2 over the 5 sets; each cell's histogram: ε/2 over
                            // the 5 sets (parallel composition across cells).
                            let opts = CellOptions { sets: M, rows: n, ..Default::default() };
                            let mut a = accountant(eps / 2.0);
                            let cell_sets = cells::synthesize(
                                CellMechanism::LaplaceSanitizer,
                                &counts,
                                "w",
                                eps / 2.0,
                                &opts,
                                &mut a,
                                &mut rng,
                            )?;
                            let per_set: Vec<_> = cell_sets
                                .sets
                                .iter()
                                .map(|sc| -> anyhow::Result<_> {
                                    let (mut sc_cells, mut sz) = (Vec::new(), Vec::new());
                                    for (k, &rows) in sc.iter().enumerate() {
                                        if rows == 0 {
                                            continue;
                                        }
                                        let o = CellOptions { sets: 1, rows, ..Default::default() };
                                        let mut a = accountant(eps / 2.0 / M as f64);
                                        let e = eps / 2.0 / M as f64;
                                        let h = cells::synthesize(
                                            CellMechanism::PerturbedHistogram,
                                            &hist[k],
                                            "z",
                                            e,
                                            &o,
                                            &mut a,
                                            &mut rng,
                                        )?;
                                        let b = bins[k];
                                        let bx = design.bounds[k];
                                        for (sq, &c) in h.sets[0].iter().enumerate() {
                                            for _ in 0..c {
                                                let (i, j) = ((sq / b) as f64, (sq % b) as f64);
                                                let w = 8.0 / b as f64;
                                                sc_cells.push(k as u32);
                                                sz.push([
                                                    bx[0].0 + w * (i + rng.random::<f64>()),
                                                    bx[1].0 + w * (j + rng.random::<f64>()),
                                                ]);
                                            }
                                        }
                                    }
                                    Ok(glom_estimates(&sc_cells, &sz))
                                })
                                .collect::<anyhow::Result<_>>()?;
                            combine_terms(&per_set)
                        }
                    };
                    for (ti, ct) in c.iter().enumerate() {
                        if let Some(ct) = ct {
                            acc[ei][mi][ti].add(truth[ti], ct);
                        }
                    }
                }
            }
        }
        Ok(acc)
    };
    let total = on_threads(threads, work, [log_eps.len(), methods.len(), terms])?;
    let names: Vec<String> =
        PI_TERMS.iter().map(|(n, _)| n.to_string()).chain((0..24).map(|k| format!("mu1[{k}]"))).collect();
    let mut rows = Vec::new();
    for (ei, &le) in log_eps.iter().enumerate() {
        for (mi, method) in methods.iter().enumerate() {
            for (ti, name) in names.iter().enumerate() {
                let at = Scenario { study: 3, n, param: truth[ti], log_epsilon: le };
                rows.push(total[ei][mi][ti].row(at, method, name, 1.0));
            }
        }
    }
    Ok((rows, t.elapsed().as_secs_f64()))
}
