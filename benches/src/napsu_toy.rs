//! 003 §5.1's toy experiment for NA+MI (NAPSU-MQ + Rubin's rules).
//!
//! Data: n records of 3 binary variables; x₁, x₂ independent fair coins and
//! x₃ ~ Bernoulli(σ(1·x₁ + 0·x₂)), so the downstream logistic regression
//! x₃ ~ x₁ + x₂ has true coefficients (0, 1, 0). Queries: all 2-way
//! marginals (as issue 16 asks; 003 §5.1 used the full 3-way marginal),
//! released with the Gaussian mechanism: Δ₂ = √(2k) for substitute
//! neighbours (NOTES §6), σ from the analytic Gaussian at (ε, δ = n⁻²),
//! integer (discrete Gaussian) noise. Inference: the Laplace approximation
//! (as 003 §5.1). Then m synthetic sets of n rows, each from its own
//! posterior draw, a logistic regression on each, and the fully-synthetic
//! combining rule. Reported: the coverage of the true coefficients by the
//! 95% intervals, and their mean width, per ε; and the same for a baseline
//! without noise-awareness or multiple imputation (one set from the
//! posterior mode, ordinary standard errors). With `m = 0` only the
//! baseline runs (its generator is separate, so NA+MI results do not change).
//!
//! Simulation only: the data are generated and the noise is seeded.

use dpflow::analyze::design::Block;
use dpflow::analyze::{EstimatorKind, Rule, combine::combine, estimate::estimate};
use dpflow::synth::napsu::laplace::{LaplaceOptions, laplace};
use dpflow::synth::napsu::likelihood::Posterior;
use dpflow::synth::napsu::{CanonicalFeatures, MaxEnt};
use dpflow_udfs::calibrate::analytic_gaussian_sigma;
use dpflow_udfs::noise::DiscreteGaussian;
use ndarray::{Array1, Array2};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

/// One ε's result.
#[derive(Debug, Clone, Serialize)]
pub struct ToyResult {
    /// ε.
    pub epsilon: f64,
    /// Repeats that produced intervals.
    pub repeats: usize,
    /// Repeats whose inference failed.
    pub failures: usize,
    /// Coverage of each true coefficient (Intercept, x1, x2); `None` with m = 0.
    pub coverage: Option<[f64; 3]>,
    /// Mean interval width of each coefficient; `None` with m = 0.
    pub mean_width: Option<[f64; 3]>,
    /// The baseline without noise-awareness or multiple imputation: one
    /// synthetic set from the posterior mode, ordinary standard errors
    /// (003 §5.1's "−NA −MI" ablation); its coverage per coefficient.
    pub baseline_coverage: [f64; 3],
    /// The baseline's mean interval width.
    pub baseline_mean_width: [f64; 3],
    /// Wall time of all repeats, seconds.
    pub seconds: f64,
}

/// The 8 cell probabilities of p(x | θ).
fn cell_probabilities(me: &MaxEnt, theta: &[f64]) -> Vec<f64> {
    let cells: Vec<[usize; 3]> = (0..8).map(|c| [c >> 2 & 1, c >> 1 & 1, c & 1]).collect();
    let logits: Vec<f64> = cells.iter().map(|x| me.features.active(x).iter().map(|&j| theta[j]).sum::<f64>()).collect();
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|v| v / z).collect()
}

/// The logistic-regression block of rows drawn from cell probabilities.
fn synthetic_block(p: &[f64], n: usize, rng: &mut SmallRng) -> Block {
    let mut x = Array2::<f64>::zeros((n, 3));
    let mut y = Array1::<f64>::zeros(n);
    let cdf: Vec<f64> = p
        .iter()
        .scan(0.0, |s, v| {
            *s += v;
            Some(*s)
        })
        .collect();
    for r in 0..n {
        let u: f64 = rng.random_range(0.0..1.0);
        let c = cdf.iter().position(|&v| u < v).unwrap_or(7);
        x[[r, 0]] = 1.0;
        x[[r, 1]] = (c >> 2 & 1) as f64;
        x[[r, 2]] = (c >> 1 & 1) as f64;
        y[r] = (c & 1) as f64;
    }
    Block { x, y, dropped: 0 }
}

/// Runs the experiment at each ε.
pub fn run(epsilons: &[f64], repeats: usize, n: usize, m: usize, seed: u64) -> anyhow::Result<Vec<ToyResult>> {
    let scopes = vec![vec![0, 1], vec![0, 2], vec![1, 2]];
    let truth = [0.0, 1.0, 0.0];
    let delta = 1.0 / (n as f64 * n as f64);
    let sensitivity = (2.0 * scopes.len() as f64).sqrt();
    let mut out = Vec::new();
    for &epsilon in epsilons {
        let start = std::time::Instant::now();
        let mut rng = SmallRng::seed_from_u64(seed ^ epsilon.to_bits());
        let sigma = analytic_gaussian_sigma(sensitivity, epsilon, delta);
        let noise = DiscreteGaussian::from_sigma(sigma).ok_or_else(|| anyhow::anyhow!("bad σ {sigma}"))?;
        let (mut covered, mut width, mut done, mut failures) = ([0usize; 3], [0.0f64; 3], 0usize, 0usize);
        let (mut b_covered, mut b_width) = ([0usize; 3], [0.0f64; 3]);
        for repeat in 0..repeats {
            let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &[2, 2, 2], 100)?);
            // The original data and its exact query answers.
            let mut stats = vec![0.0; me.width];
            for _ in 0..n {
                let x1 = usize::from(rng.random_range(0.0..1.0) < 0.5);
                let x2 = usize::from(rng.random_range(0.0..1.0) < 0.5);
                let p3 = 1.0 / (1.0 + (-(x1 as f64)).exp());
                let x3 = usize::from(rng.random_range(0.0..1.0) < p3);
                for i in me.queries(&[x1, x2, x3]) {
                    stats[i] += 1.0;
                }
            }
            for s in &mut stats {
                *s += noise.sample(&mut rng) as f64;
            }
            let post = Posterior::new(me.clone(), stats, n as f64, sigma)?;
            let Ok(l) = laplace(&post, &LaplaceOptions::default()) else {
                failures += 1;
                continue;
            };
            // Baseline (its own generator, so the NA+MI draws are unchanged).
            let mut brng =
                SmallRng::seed_from_u64(seed ^ epsilon.to_bits() ^ (repeat as u64).wrapping_mul(0x9E37_79B9));
            let block = synthetic_block(&cell_probabilities(&me, &l.mean), n, &mut brng);
            if let Ok(e) = estimate(EstimatorKind::Logistic, &[block], "synthetic") {
                for k in 0..3 {
                    let c = combine("coef", &[e.estimates[k]], &[e.variances[k]], Rule::Single, 0.05, None)?;
                    b_covered[k] += usize::from(c.ci_low <= truth[k] && truth[k] <= c.ci_high);
                    b_width[k] += c.ci_high - c.ci_low;
                }
            }
            if m == 0 {
                done += 1;
                continue;
            }
            let mut q: Vec<Vec<f64>> = (0..3).map(|_| Vec::with_capacity(m)).collect();
            let mut u: Vec<Vec<f64>> = (0..3).map(|_| Vec::with_capacity(m)).collect();
            let mut ok = true;
            for _ in 0..m {
                let theta = l.draw(&mut rng);
                let block = synthetic_block(&cell_probabilities(&me, &theta), n, &mut rng);
                match estimate(EstimatorKind::Logistic, &[block], "synthetic") {
                    Ok(e) => {
                        for k in 0..3 {
                            q[k].push(e.estimates[k]);
                            u[k].push(e.variances[k]);
                        }
                    }
                    Err(_) => ok = false,
                }
            }
            if !ok {
                failures += 1;
                continue;
            }
            for k in 0..3 {
                let c = combine("coef", &q[k], &u[k], Rule::FullySynthetic { syn_over_original: 1.0 }, 0.05, None)?;
                covered[k] += usize::from(c.ci_low <= truth[k] && truth[k] <= c.ci_high);
                width[k] += c.ci_high - c.ci_low;
            }
            done += 1;
        }
        let d = done.max(1) as f64;
        out.push(ToyResult {
            epsilon,
            repeats: done,
            failures,
            coverage: (m > 0).then(|| covered.map(|c| c as f64 / d)),
            mean_width: (m > 0).then(|| width.map(|w| w / d)),
            baseline_coverage: b_covered.map(|c| c as f64 / d),
            baseline_mean_width: b_width.map(|w| w / d),
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    Ok(out)
}

/// One synthesizer's coverage with one set and ordinary standard errors.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineResult {
    /// `aim` or `mst`.
    pub mechanism: String,
    /// ε.
    pub epsilon: f64,
    /// Repeats that produced intervals.
    pub repeats: usize,
    /// Coverage of (Intercept, x1, x2).
    pub coverage: [f64; 3],
    /// Mean interval width.
    pub mean_width: [f64; 3],
    /// Seconds for this ε.
    pub seconds: f64,
}

/// 003's comparison: AIM and MST (through `run_synth`, as a user runs
/// them) at the same (ε, δ = n⁻²) on the same toy data, m = 1, the
/// logistic regression's own standard errors (the single-set rule). Both
/// account in zCDP under add/remove neighbours (ε, δ converted to ρ), so
/// their noise is, if anything, smaller than NAPSU-MQ's substitute-one
/// calibration here: their under-coverage is not for lack of budget.
pub async fn synth_baselines(
    mechanisms: &[dpflow::synth::run::Mechanism],
    epsilons: &[f64],
    repeats: usize,
    n: usize,
    seed: u64,
) -> anyhow::Result<Vec<BaselineResult>> {
    use datafusion::arrow::array::AsArray;
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("toy.yaml"),
        "columns:\n  - {name: x1, kind: categorical, values: ['0', '1']}\n  - {name: x2, kind: categorical, values: ['0', '1']}\n  - {name: y, kind: categorical, values: ['0', '1']}\n",
    )?;
    let truth = [0.0, 1.0, 0.0];
    let mut out = Vec::new();
    for &mechanism in mechanisms {
        for &epsilon in epsilons {
            let start = std::time::Instant::now();
            let mut rng = SmallRng::seed_from_u64(seed ^ epsilon.to_bits() ^ 0xBA5E);
            let (mut covered, mut width, mut done) = ([0usize; 3], [0.0f64; 3], 0usize);
            for repeat in 0..repeats {
                let mut csv = String::from("x1,x2,y\n");
                for _ in 0..n {
                    let x1 = usize::from(rng.random_range(0.0..1.0) < 0.5);
                    let x2 = usize::from(rng.random_range(0.0..1.0) < 0.5);
                    let p3 = 1.0 / (1.0 + (-(x1 as f64)).exp());
                    let y = usize::from(rng.random_range(0.0..1.0) < p3);
                    csv += &format!("{x1},{x2},{y}\n");
                }
                std::fs::write(dir.path().join("toy.csv"), csv)?;
                let path = |f: &str| dir.path().join(f).display().to_string();
                let req = dpflow::synth::run::SynthRequest {
                    dataset: dpflow::dataset::Dataset::open("toy", &path("toy.csv"), None, &path("toy.yaml"))?,
                    mechanism,
                    budget: dpflow::privacy::Budget::Approx { epsilon, delta: 1.0 / (n as f64 * n as f64) },
                    workload: "all-2way".into(),
                    rows: Some(n as u64),
                    out: path("syn.parquet"),
                    model_out: None,
                    record_out: Some(String::new()),
                    ledger: None,
                    release_id: None,
                    unsafe_seed: Some(seed ^ (repeat as u64) ^ epsilon.to_bits()),
                    options: dpflow::synth::SynthOptions { iters: 300, ..Default::default() },
                    decode: dpflow_udfs::domain::DecodeMode::Midpoint,
                    missing: dpflow::missing::Strategy::CompleteRow,
                    missing_options: Default::default(),
                    amplification: None,
                };
                let ctx = dpflow::io::session_context();
                dpflow::synth::run::run_synth(&ctx, &req, &|_| {}).await?;
                let batches = ctx.read_parquet(&path("syn.parquet"), Default::default()).await?.collect().await?;
                let mut x = Array2::<f64>::zeros((n, 3));
                let mut y = Array1::<f64>::zeros(n);
                let mut r = 0;
                for b in &batches {
                    let col = |name: &str| -> anyhow::Result<Vec<f64>> {
                        let c = datafusion::arrow::compute::cast(
                            b.column_by_name(name).ok_or_else(|| anyhow::anyhow!("no {name}"))?,
                            &datafusion::arrow::datatypes::DataType::Utf8,
                        )?;
                        Ok(c.as_string::<i32>().iter().map(|v| if v == Some("1") { 1.0 } else { 0.0 }).collect())
                    };
                    let (c1, c2, cy) = (col("x1")?, col("x2")?, col("y")?);
                    for i in 0..b.num_rows() {
                        x[[r, 0]] = 1.0;
                        x[[r, 1]] = c1[i];
                        x[[r, 2]] = c2[i];
                        y[r] = cy[i];
                        r += 1;
                    }
                }
                if r != n {
                    anyhow::bail!("{mechanism:?} wrote {r} rows, not {n}");
                }
                let block = Block { x, y, dropped: 0 };
                if let Ok(e) = estimate(EstimatorKind::Logistic, &[block], "synthetic") {
                    for k in 0..3 {
                        let c = combine("coef", &[e.estimates[k]], &[e.variances[k]], Rule::Single, 0.05, None)?;
                        covered[k] += usize::from(c.ci_low <= truth[k] && truth[k] <= c.ci_high);
                        width[k] += c.ci_high - c.ci_low;
                    }
                    done += 1;
                }
            }
            let d = done.max(1) as f64;
            out.push(BaselineResult {
                mechanism: format!("{mechanism:?}").to_lowercase(),
                epsilon,
                repeats: done,
                coverage: covered.map(|c| c as f64 / d),
                mean_width: width.map(|w| w / d),
                seconds: start.elapsed().as_secs_f64(),
            });
        }
    }
    Ok(out)
}
