//! 003 §5.2 / App. E: NAPSU-MQ on Adult-reduced, logistic regression of
//! income on age, race and sex, coverage of the real-data coefficients.
//!
//! The reduced table is built here from `sample_data/adult/adult.data`
//! (App. E): the ten columns age, workclass, education, marital status,
//! race, sex, capital gain, capital loss, hours per week and income; rows
//! with a missing value (`?`) dropped; age and hours per week cut into 5
//! equal-width buckets (pandas' `cut(x, 5)`), capital gain and loss to
//! "positive or not". Age goes back to a number, its bucket's midpoint,
//! for the regression.
//!
//! Queries: App. E's fixed five (hours per week with age, race, sex and
//! income; race with sex) plus seven that App. E's MST selected (Fig. S1,
//! whose edges the text lost): income with age, marital status, education,
//! capital gain and capital loss; marital status with age; education with
//! workclass — a tree over the other columns through income, chosen before
//! looking at any result and fixed for every run.
//!
//! Per repeat: the exact marginals (computed once) plus fresh discrete
//! Gaussian noise, σ from the analytic Gaussian for Δ₂ = √(2k) (003's
//! substitute-one calibration, so the ε are comparable with 003 and
//! twinify), δ = n⁻²; the posterior (Laplace or NUTS); m draws; for each,
//! n synthetic rows of (age, race, sex, income) — sampling those four
//! columns of the model's joint is the same in distribution as sampling
//! whole rows and keeping them — and a logistic regression; Rubin's rules
//! for fully synthetic data. A simulation: the seed is fine here.

use std::time::Instant;

use dpflow::analyze::design::Block;
use dpflow::analyze::{EstimatorKind, Rule, combine::combine, estimate::estimate};
use dpflow::synth::napsu::importance::{check_enough, check_reliable, sample_corrected};
use dpflow::synth::napsu::laplace::LogDensity;
use dpflow::synth::napsu::laplace::{LaplaceOptions, laplace};
use dpflow::synth::napsu::likelihood::Posterior;
use dpflow::synth::napsu::nuts::{Convergence, NutsDraws, NutsOptions, sample};
use dpflow::synth::napsu::surrogate::FixedCovariance;
use dpflow::synth::napsu::{CanonicalFeatures, MaxEnt};
use dpflow_udfs::calibrate::analytic_gaussian_sigma;
use dpflow_udfs::noise::{DiscreteGaussian, DpRng};
use ndarray::{Array1, Array2};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

/// Column order of the reduced table.
const COLUMNS: [&str; 10] =
    ["age", "workclass", "education", "marital", "race", "sex", "gain", "loss", "hours", "income"];
const AGE: usize = 0;
const RACE: usize = 4;
const SEX: usize = 5;
const HOURS: usize = 8;
const INCOME: usize = 9;

/// The reduced table: codes per row, sizes, level names and age midpoints.
#[derive(Debug, Clone)]
pub struct Reduced {
    /// Rows as codes.
    pub rows: Vec<[usize; 10]>,
    /// Column sizes.
    pub sizes: Vec<usize>,
    /// Level names per column (sorted, as `dpflow analyze` orders them).
    pub levels: Vec<Vec<String>>,
    /// Midpoint of each age bucket.
    pub age_mid: Vec<f64>,
}

fn buckets(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    // pandas cut(x, 5): equal width over [min, max].
    let w = (hi - lo) / 5.0;
    let edges: Vec<f64> = (0..=5).map(|i| lo + w * i as f64).collect();
    let mids = (0..5).map(|i| lo + w * (i as f64 + 0.5)).collect();
    (edges, mids)
}

fn bucket(edges: &[f64], x: f64) -> usize {
    (0..5).find(|&i| x <= edges[i + 1]).unwrap_or(4)
}

/// Builds Adult-reduced from the UCI file.
pub fn reduce(path: &str) -> anyhow::Result<Reduced> {
    let text = std::fs::read_to_string(path)?;
    let mut raw: Vec<Vec<String>> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        anyhow::ensure!(f.len() == 15, "{path}: a line with {} fields", f.len());
        if f.contains(&"?") {
            continue;
        }
        raw.push(vec![
            f[0].into(),
            f[1].into(),
            f[3].into(),
            f[5].into(),
            f[8].into(),
            f[9].into(),
            f[10].into(),
            f[11].into(),
            f[12].into(),
            f[14].trim_end_matches('.').into(),
        ]);
    }
    let num = |r: &Vec<String>, i: usize| r[i].parse::<f64>().unwrap_or(0.0);
    let range = |i: usize| {
        raw.iter().map(|r| num(r, i)).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)))
    };
    let (age_edges, age_mid) = {
        let (lo, hi) = range(0);
        buckets(lo, hi)
    };
    let (hours_edges, _) = {
        let (lo, hi) = range(8);
        buckets(lo, hi)
    };
    let mut levels: Vec<Vec<String>> = vec![Vec::new(); 10];
    for c in [1, 2, 3, 4, 5, 9] {
        let mut v: Vec<String> = raw.iter().map(|r| r[c].clone()).collect();
        v.sort();
        v.dedup();
        levels[c] = v;
    }
    levels[AGE] = (0..5).map(|i| format!("{:.2}", age_mid[i])).collect();
    levels[HOURS] = (0..5).map(|i| i.to_string()).collect();
    levels[6] = vec!["0".into(), "1".into()];
    levels[7] = vec!["0".into(), "1".into()];
    let rows = raw
        .iter()
        .map(|r| {
            let mut x = [0usize; 10];
            for c in [1, 2, 3, 4, 5, 9] {
                x[c] = levels[c].binary_search(&r[c]).unwrap_or(0);
            }
            x[AGE] = bucket(&age_edges, num(r, 0));
            x[HOURS] = bucket(&hours_edges, num(r, 8));
            x[6] = usize::from(num(r, 6) > 0.0);
            x[7] = usize::from(num(r, 7) > 0.0);
            x
        })
        .collect();
    let sizes = levels.iter().map(Vec::len).collect();
    Ok(Reduced { rows, sizes, levels, age_mid })
}

/// The twelve queries (see the module doc).
pub fn queries() -> Vec<Vec<usize>> {
    let mut q = vec![
        vec![AGE, HOURS],
        vec![RACE, HOURS],
        vec![SEX, HOURS],
        vec![HOURS, INCOME],
        vec![RACE, SEX],
        vec![AGE, INCOME],
        vec![3, INCOME],
        vec![2, INCOME],
        vec![6, INCOME],
        vec![7, INCOME],
        vec![AGE, 3],
        vec![1, 2],
    ];
    for s in &mut q {
        s.sort_unstable();
    }
    q
}

/// Design of income ~ age + race + sex over the 4-column cells, with
/// treatment coding (reference = first sorted level, as `dpflow analyze`).
/// Columns: Intercept, race[T.*] (4), sex[T.Male], age.
fn design_row(red: &Reduced, age: usize, race: usize, sex: usize) -> Vec<f64> {
    let mut x = vec![1.0];
    for r in 1..red.sizes[RACE] {
        x.push(f64::from(u8::from(race == r)));
    }
    x.push(f64::from(u8::from(sex == 1)));
    x.push(red.age_mid[age]);
    x
}

/// The coefficient names, in design order.
pub fn terms(red: &Reduced) -> Vec<String> {
    let mut t = vec!["Intercept".to_string()];
    for r in 1..red.sizes[RACE] {
        t.push(format!("race[T.{}]", red.levels[RACE][r]));
    }
    t.push(format!("sex[T.{}]", red.levels[SEX][1]));
    t.push("age".into());
    t
}

fn block_from_counts(red: &Reduced, counts: &[usize]) -> Block {
    // counts over (age, race, sex, income) row-major.
    let n: usize = counts.iter().sum();
    let p = 1 + (red.sizes[RACE] - 1) + 1 + 1;
    let mut x = Array2::<f64>::zeros((n, p));
    let mut y = Array1::<f64>::zeros(n);
    let mut r = 0;
    let (sr, ss, si) = (red.sizes[RACE], red.sizes[SEX], red.sizes[INCOME]);
    for (cell, &c) in counts.iter().enumerate() {
        let inc = cell % si;
        let sex = (cell / si) % ss;
        let race = (cell / (si * ss)) % sr;
        let age = cell / (si * ss * sr);
        let row = design_row(red, age, race, sex);
        for _ in 0..c {
            for (j, v) in row.iter().enumerate() {
                x[[r, j]] = *v;
            }
            y[r] = inc as f64;
            r += 1;
        }
    }
    Block { x, y, dropped: 0 }
}

fn multinomial(p: &[f64], n: usize, rng: &mut SmallRng) -> Vec<usize> {
    let total: f64 = p.iter().sum();
    let cdf: Vec<f64> = p
        .iter()
        .scan(0.0, |s, v| {
            *s += v / total;
            Some(*s)
        })
        .collect();
    let mut counts = vec![0usize; p.len()];
    for _ in 0..n {
        let u: f64 = rng.random_range(0.0..1.0);
        counts[cdf.iter().position(|&c| u < c).unwrap_or(p.len() - 1)] += 1;
    }
    counts
}

/// One ε's results.
#[derive(Debug, Clone, Serialize)]
pub struct AdultResult {
    /// ε.
    pub epsilon: f64,
    /// `laplace` or `nuts`.
    pub inference: String,
    /// Repeats that produced intervals.
    pub repeats: usize,
    /// Repeats whose inference failed.
    pub failures: usize,
    /// Coverage of each real-data coefficient.
    pub coverage: Vec<f64>,
    /// Mean interval width of each (over the repeats that gave one).
    pub mean_width: Vec<f64>,
    /// Mean share of the m estimates of each coefficient kept by the
    /// standard-error filter.
    pub kept: Vec<f64>,
    /// Mean seconds of inference (Laplace, or Laplace + NUTS) per repeat.
    pub inference_seconds: f64,
    /// Largest R̂ of θ seen (NUTS).
    pub max_rhat: Option<f64>,
    /// Largest R̂ of the mean parameters μ(θ) seen (NUTS; by ranks for
    /// cells of at least one expected row, plain below): what `dpflow synth`
    /// compares with 1.05.
    pub max_rhat_mean: Option<f64>,
    /// Smallest bulk ESS of μ(θ)'s components seen (NUTS).
    pub min_ess_mean: Option<f64>,
    /// Repeats whose R̂ of θ was over 1.05 (NUTS).
    pub over_rhat: usize,
    /// Repeats whose R̂ of μ(θ) was over 1.05 (NUTS): `dpflow synth` would
    /// refuse them without `--allow-unconverged`.
    pub over_rhat_mean: usize,
    /// Repeats whose plain split-R̂ of μ(θ) for every cell (BDA3's, the
    /// check before 2026-11-29) was over 1.05, for comparison.
    pub over_split_rhat_mean: usize,
    /// Repeats whose rank-normalised R̂ of μ(θ) for every cell (no floor)
    /// was over 1.05, for comparison.
    pub over_rank_rhat_mean: usize,
    /// Repeats whose chains went on past `--draws` because R̂ of μ(θ) was
    /// over 1.05 (NUTS; up to `--max-draws`). Absent in results from before.
    pub extended: usize,
    /// Mean gradient evaluations per repeat (NUTS, all chains).
    pub gradients: Option<f64>,
    /// Mean leapfrog steps per kept draw (NUTS).
    pub mean_steps: Option<f64>,
    /// Corrected NUTS: the largest Pareto k̂ of the importance weights.
    pub max_pareto_k: Option<f64>,
    /// Corrected NUTS: the smallest effective sample size of the weights.
    pub min_importance_ess: Option<f64>,
    /// Corrected NUTS: repeats whose correction k̂ was over its threshold
    /// (refused, as a release would; counted in `failures`).
    pub refused: usize,
    /// Seconds for the whole ε.
    pub seconds: f64,
}

/// The experiment's report.
#[derive(Debug, Clone, Serialize)]
pub struct AdultReport {
    /// Rows after dropping missing values.
    pub n: usize,
    /// Canonical features (θ's dimension).
    pub parameters: usize,
    /// The queries by column name.
    pub queries: Vec<Vec<String>>,
    /// Coefficient names.
    pub terms: Vec<String>,
    /// The real-data coefficients (the targets of coverage).
    pub real: Vec<f64>,
    /// Milliseconds per log-density-and-gradient evaluation.
    pub gradient_ms: f64,
    /// The same for the fixed-covariance surrogate NUTS runs on.
    pub surrogate_gradient_ms: f64,
    /// Milliseconds per exact log-density (no gradient): one importance weight.
    pub value_ms: f64,
    /// Per ε.
    pub results: Vec<AdultResult>,
    /// Peak RSS, MB.
    pub peak_rss_mb: f64,
    /// The standard-error filter (003 §5.2), if any.
    pub max_std_error: Option<f64>,
}

/// The experiment's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Repeats per ε.
    pub repeats: usize,
    /// Synthetic sets per repeat.
    pub m: usize,
    /// NUTS (else Laplace).
    pub nuts: Option<NutsOptions>,
    /// NUTS on the exact posterior (else on the fixed-covariance surrogate,
    /// importance-corrected, as `--inference nuts` does).
    pub exact: bool,
    /// Mode-search iterations.
    pub max_iters: u64,
    /// Simulation seed.
    pub seed: u64,
    /// 003 §5.2: a synthetic set's coefficient whose standard error exceeds
    /// this is left out before Rubin's rules (a set with no high earners of
    /// a rare race gives a near-infinite one). The paper's value was lost
    /// in conversion; `None` keeps every estimate.
    pub max_std_error: Option<f64>,
    /// Queries in place of the twelve (smaller models, e.g. to run
    /// twinify's NUTS side by side); `None` keeps the twelve.
    pub queries: Option<Vec<Vec<String>>>,
    /// Queries added to the twelve (column names, e.g. `sex,income`).
    pub extra_queries: Vec<Vec<String>>,
    /// Print, for the first repeat of each ε, how far log p departs from
    /// the Laplace approximation along each normalised direction.
    pub probe: bool,
}

/// Runs the experiment.
pub fn run(path: &str, epsilons: &[f64], s: &Settings, progress: &dyn Fn(&str)) -> anyhow::Result<AdultReport> {
    let Settings { repeats, m, ref nuts, max_iters, seed, max_std_error, .. } = *s;
    let red = reduce(path)?;
    let n = red.rows.len();
    let ids = |q: &Vec<String>| -> anyhow::Result<Vec<usize>> {
        let mut ids = q
            .iter()
            .map(|c| COLUMNS.iter().position(|x| x == c).ok_or_else(|| anyhow::anyhow!("no column {c}")))
            .collect::<anyhow::Result<Vec<usize>>>()?;
        ids.sort_unstable();
        Ok(ids)
    };
    let mut scopes = match &s.queries {
        Some(qs) => qs.iter().map(ids).collect::<anyhow::Result<Vec<_>>>()?,
        None => queries(),
    };
    for q in &s.extra_queries {
        let q = ids(q)?;
        anyhow::ensure!(!scopes.contains(&q), "the query {q:?} is already one of the queries");
        scopes.push(q);
    }
    let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &red.sizes, 5000)?);
    let mut exact = vec![0.0; me.width];
    for x in &red.rows {
        for i in me.queries(x) {
            exact[i] += 1.0;
        }
    }
    // The real data's coefficients.
    let (sa, sr, ss, si) = (red.sizes[AGE], red.sizes[RACE], red.sizes[SEX], red.sizes[INCOME]);
    let mut real_counts = vec![0usize; sa * sr * ss * si];
    for x in &red.rows {
        real_counts[((x[AGE] * sr + x[RACE]) * ss + x[SEX]) * si + x[INCOME]] += 1;
    }
    let real = estimate(EstimatorKind::Logistic, &[block_from_counts(&red, &real_counts)], "real")?.estimates;
    let p = real.len();
    let delta = 1.0 / (n as f64 * n as f64);
    let sensitivity = (2.0 * scopes.len() as f64).sqrt();
    let four = [AGE, RACE, SEX, INCOME];
    // Cost of one log-density-and-gradient evaluation (the unit of every inference step).
    let gradient_ms = {
        let post = Posterior::new(me.clone(), exact.clone(), n as f64, 10.0)?;
        let theta = vec![0.01; me.features.len];
        let t = Instant::now();
        for _ in 0..5 {
            post.log_density_and_gradient(&theta)?;
        }
        t.elapsed().as_secs_f64() * 1000.0 / 5.0
    };
    let (surrogate_gradient_ms, value_ms) = {
        let post = Posterior::new(me.clone(), exact.clone(), n as f64, 10.0)?;
        let theta = vec![0.01; me.features.len];
        let s = FixedCovariance::new(&post, &theta)?;
        let t = Instant::now();
        for _ in 0..50 {
            s.value_and_gradient(&theta)?;
        }
        let g = t.elapsed().as_secs_f64() * 1000.0 / 50.0;
        let t = Instant::now();
        for _ in 0..5 {
            post.log_density(&theta)?;
        }
        (g, t.elapsed().as_secs_f64() * 1000.0 / 5.0)
    };
    progress(&format!(
        "{} parameters; one gradient {gradient_ms:.1} ms (surrogate {surrogate_gradient_ms:.2} ms; exact value \
         {value_ms:.1} ms)",
        me.features.len
    ));
    let mut results = Vec::new();
    for &epsilon in epsilons {
        let start = Instant::now();
        let mut rng = SmallRng::seed_from_u64(seed ^ epsilon.to_bits());
        let mut dprng = DpRng::unsafe_seeded(seed ^ epsilon.to_bits() ^ 0xADu64);
        let sigma = analytic_gaussian_sigma(sensitivity, epsilon, delta);
        let noise = DiscreteGaussian::from_sigma(sigma).ok_or_else(|| anyhow::anyhow!("bad σ {sigma}"))?;
        let (mut covered, mut width) = (vec![0usize; p], vec![0.0f64; p]);
        let (mut kept, mut with_interval) = (vec![0.0f64; p], vec![0usize; p]);
        let (mut done, mut failures, mut inference_seconds, mut max_rhat) = (0usize, 0usize, 0.0f64, None::<f64>);
        let (mut gradients, mut steps) = (0u64, 0.0f64);
        let (mut max_k, mut min_iess, mut refused) = (None::<f64>, None::<f64>, 0usize);
        let (mut max_rhat_mean, mut over_rhat, mut over_rhat_mean) = (None::<f64>, 0usize, 0usize);
        let (mut min_ess_mean, mut over_split_rhat_mean, mut over_rank_rhat_mean) = (None::<f64>, 0usize, 0usize);
        let over = |r: f64| usize::from(r.partial_cmp(&1.05).is_none_or(|o| o.is_gt()));
        let mut extended = 0usize;
        let draws_per_chain = nuts.map_or(0, |o| o.draws as usize);
        let template = me.model(&vec![0.0; me.features.len]);
        let mut tally = |d: &NutsDraws, c: Option<Convergence>| -> String {
            let c = c.unwrap_or(Convergence::NAN);
            extended += usize::from(d.draws.len() / d.chains.max(1) > draws_per_chain);
            max_rhat_mean = Some(max_rhat_mean.map_or(c.rhat, |x: f64| x.max(c.rhat)));
            min_ess_mean = Some(min_ess_mean.map_or(c.bulk_ess, |x: f64| x.min(c.bulk_ess)));
            over_rhat += over(d.max_rhat());
            over_rhat_mean += over(c.rhat);
            over_split_rhat_mean += over(c.split_rhat);
            over_rank_rhat_mean += over(c.rank_rhat);
            format!(
                "R̂ of μ {:.3} (ranks for {} of {} cells; all by ranks {:.3}, all plain {:.3}), bulk ESS of μ {:.0}, \
                 {} draws per chain",
                c.rhat,
                c.ranked,
                c.components,
                c.rank_rhat,
                c.split_rhat,
                c.bulk_ess,
                d.draws.len() / d.chains.max(1)
            )
        };
        let mut fit_errors = std::collections::BTreeMap::<String, usize>::new();
        for repeat in 0..repeats {
            let stats: Vec<f64> = exact.iter().map(|c| c + noise.sample(&mut rng) as f64).collect();
            let t = Instant::now();
            let post = Posterior::new(me.clone(), stats, n as f64, sigma)?;
            let opts = LaplaceOptions { max_iters, ..Default::default() };
            let Ok(l) = laplace(&post, &opts) else {
                failures += 1;
                progress(&format!("ε={epsilon} repeat {repeat}: Laplace failed"));
                continue;
            };
            if s.probe && repeat == 0 {
                probe(&post, &l, progress);
            }
            // What `dpflow synth` decides on (and extends the chains by): R̂ of μ.
            let mut last = None;
            let mut judge = |d: &NutsDraws| {
                let c =
                    d.convergence_of(|t| me.mean_parameters_in(&template, t).iter().copied().collect(), 1.0 / n as f64);
                last = Some(c);
                c.rhat
            };
            let thetas: Vec<Vec<f64>> = match nuts {
                None => (0..m).map(|_| l.draw(&mut rng)).collect(),
                Some(o) if s.exact => match sample(&post, &l, o, &mut dprng, progress, &mut judge) {
                    Ok(d) => {
                        let r = tally(&d, last);
                        progress(&format!(
                            "ε={epsilon} repeat {repeat}: R̂ {:.3} ({}), {r}",
                            d.max_rhat(),
                            worst(&d, &me.features)
                        ));
                        max_rhat = Some(max_rhat.map_or(d.max_rhat(), |r| r.max(d.max_rhat())));
                        gradients += d.gradients;
                        steps += d.mean_steps;
                        rand::seq::index::sample(&mut rng, d.draws.len(), m.min(d.draws.len()))
                            .into_iter()
                            .map(|i| d.draws[i].clone())
                            .collect()
                    }
                    Err(e) => {
                        failures += 1;
                        progress(&format!("ε={epsilon} repeat {repeat}: NUTS failed: {e}"));
                        continue;
                    }
                },
                Some(o) => match sample_corrected(&post, &l, o, &mut dprng, progress, &mut judge) {
                    Ok(c) => {
                        let d = &c.nuts;
                        let r = tally(d, last);
                        max_rhat = Some(max_rhat.map_or(d.max_rhat(), |r| r.max(d.max_rhat())));
                        gradients += d.gradients;
                        steps += d.mean_steps;
                        let k = c.correction.pareto_k.unwrap_or(f64::NEG_INFINITY);
                        max_k = Some(max_k.map_or(k, |x| x.max(k)));
                        min_iess = Some(min_iess.map_or(c.correction.ess, |x| x.min(c.correction.ess)));
                        progress(&format!(
                            "ε={epsilon} repeat {repeat}: R̂ {:.3} ({}), {}, k̂ {k:.3} (threshold {:.2}), importance ESS \
                             {:.0} of {}",
                            d.max_rhat(),
                            worst(d, &me.features),
                            r,
                            c.correction.k_threshold,
                            c.correction.ess,
                            d.draws.len()
                        ));
                        if let Err(e) =
                            check_reliable(&c.correction, false).and_then(|()| check_enough(&c.correction, m))
                        {
                            failures += 1;
                            refused += 1;
                            progress(&format!("ε={epsilon} repeat {repeat}: refused: {e}"));
                            continue;
                        }
                        c.resample(m, &mut dprng)?
                    }
                    Err(e) => {
                        failures += 1;
                        progress(&format!("ε={epsilon} repeat {repeat}: NUTS failed: {e}"));
                        continue;
                    }
                },
            };
            inference_seconds += t.elapsed().as_secs_f64();
            let mut q: Vec<Vec<f64>> = vec![Vec::with_capacity(m); p];
            let mut u: Vec<Vec<f64>> = vec![Vec::with_capacity(m); p];
            for theta in &thetas {
                let model = me.model(theta);
                let joint = model.beliefs().marginal_any(&four, &red.sizes);
                let counts = multinomial(&joint.values, n, &mut rng);
                match estimate(EstimatorKind::Logistic, &[block_from_counts(&red, &counts)], "synthetic") {
                    Ok(e) => {
                        for k in 0..p {
                            if max_std_error.is_none_or(|cap| e.variances[k].sqrt() <= cap) {
                                q[k].push(e.estimates[k]);
                                u[k].push(e.variances[k]);
                            }
                        }
                    }
                    Err(e) => *fit_errors.entry(e.to_string()).or_insert(0usize) += 1,
                }
            }
            // Why synthetic fits failed (a simulation: its data are synthetic).
            for (why, count) in std::mem::take(&mut fit_errors) {
                progress(&format!("ε={epsilon} repeat {repeat}: {count} of {m} synthetic fits failed: {why}"));
            }
            for k in 0..p {
                kept[k] += q[k].len() as f64 / m as f64;
                // Fewer than two estimates left: no interval, counted as not covering.
                if q[k].len() < 2 {
                    continue;
                }
                let c = combine("coef", &q[k], &u[k], Rule::FullySynthetic { syn_over_original: 1.0 }, 0.05, None)?;
                covered[k] += usize::from(c.ci_low <= real[k] && real[k] <= c.ci_high);
                width[k] += c.ci_high - c.ci_low;
                with_interval[k] += 1;
            }
            done += 1;
            progress(&format!("ε={epsilon} repeat {repeat} done ({:.1}s inference)", t.elapsed().as_secs_f64()));
        }
        let d = done.max(1) as f64;
        results.push(AdultResult {
            epsilon,
            inference: if nuts.is_some() { "nuts".into() } else { "laplace".into() },
            repeats: done,
            failures,
            coverage: covered.iter().map(|&c| c as f64 / d).collect(),
            mean_width: width.iter().zip(&with_interval).map(|(w, &k)| w / k.max(1) as f64).collect(),
            kept: kept.iter().map(|k| k / d).collect(),
            inference_seconds: inference_seconds / d,
            max_rhat,
            max_rhat_mean,
            min_ess_mean,
            over_rhat,
            over_rhat_mean,
            over_split_rhat_mean,
            over_rank_rhat_mean,
            extended,
            gradients: nuts.is_some().then(|| gradients as f64 / d),
            mean_steps: nuts.is_some().then(|| steps / d),
            max_pareto_k: max_k,
            min_importance_ess: min_iess,
            refused,
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    Ok(AdultReport {
        n,
        parameters: me.features.len,
        queries: scopes.iter().map(|s| s.iter().map(|&a| COLUMNS[a].to_string()).collect()).collect(),
        max_std_error,
        terms: terms(&red),
        real,
        gradient_ms,
        surrogate_gradient_ms,
        value_ms,
        results,
        peak_rss_mb: crate::peak_rss_mb(),
    })
}

/// A diagnostic of the geometry NUTS sees: in the coordinates z the
/// sampler works in (θ = mode + L z, LLᵀ the Laplace covariance), log p
/// along each axis and along five random unit directions at
/// t ∈ {−4, −2, −1, 1, 2, 4}, relative to the mode. Under a Gaussian
/// posterior every value is −t²/2; a value far below it is a wall that
/// forces a small step size (a rare cell whose count grows like e^θ).
fn probe(post: &Posterior, l: &dpflow::synth::napsu::laplace::Laplace, progress: &dyn Fn(&str)) {
    const TS: [f64; 6] = [-4.0, -2.0, -1.0, 1.0, 2.0, 4.0];
    let d = l.mean.len();
    let at = |z: &[f64]| -> f64 { post.value(&l.at(z)).unwrap_or(f64::NEG_INFINITY) };
    let zero = at(&vec![0.0; d]);
    let mut rows = Vec::new();
    for i in 0..d {
        let mut vals = Vec::new();
        for t in TS {
            let mut z = vec![0.0; d];
            z[i] = t;
            vals.push(at(&z) - zero);
        }
        let dev: f64 = TS.iter().zip(&vals).map(|(t, v)| (v + t * t / 2.0).abs()).fold(0.0, f64::max);
        rows.push((dev, i, vals));
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let big = rows.iter().filter(|r| r.0 > 1.0).count();
    progress(&format!("probe: {big} of {d} directions deviate by > 1 nat within 4 sd"));
    for (dev, i, vals) in rows.iter().take(12) {
        let v: Vec<String> = vals.iter().map(|v| format!("{v:.2}")).collect();
        progress(&format!("probe: z{i} dev {dev:.2}: at -4,-2,-1,1,2,4: {}", v.join(" ")));
    }
    // Random directions too.
    let mut g = rand::rngs::SmallRng::seed_from_u64(3);
    for _ in 0..5 {
        let u: Vec<f64> = (0..d).map(|_| rand::RngExt::random_range(&mut g, -1.0..1.0)).collect();
        let norm = u.iter().map(|x| x * x).sum::<f64>().sqrt();
        let vals: Vec<String> = TS
            .iter()
            .map(|t| {
                let z: Vec<f64> = u.iter().map(|x| x / norm * t).collect();
                format!("{:.2}", at(&z) - zero)
            })
            .collect();
        progress(&format!("probe: random direction: {}", vals.join(" ")));
    }
}

/// The parameter with the largest R̂: which feature (subset and level), its
/// ESS, posterior mean and sd, and how far its draws reach (a diagnostic of
/// why a run did not converge).
fn worst(d: &dpflow::synth::napsu::nuts::NutsDraws, f: &dpflow::synth::napsu::CanonicalFeatures) -> String {
    let Some((j, _)) = d.rhat.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)) else {
        return String::new();
    };
    let subset = f.offsets.iter().rposition(|&o| o <= j).unwrap_or(0);
    let x: Vec<f64> = d.draws.iter().map(|t| t[j]).collect();
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let sd = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let (lo, hi) = x.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let per_chain = x.len() / d.chains.max(1);
    let chain_means: Vec<String> =
        x.chunks(per_chain.max(1)).map(|c| format!("{:.2}", c.iter().sum::<f64>() / c.len() as f64)).collect();
    format!(
        "θ_{j} of subset {:?} level {}, ESS {:.0}, mean {mean:.2} sd {sd:.2}, range [{lo:.2}, {hi:.2}], chain means [{}]",
        f.subsets[subset],
        j - f.offsets[subset],
        d.ess[j],
        chain_means.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduced_table_matches_app_e() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../sample_data/adult/adult.data");
        let red = reduce(path).unwrap();
        // 003 §5.2: 30162 rows after dropping rows with missing values.
        assert_eq!(red.rows.len(), 30162);
        assert_eq!(red.sizes, vec![5, 7, 16, 7, 5, 2, 2, 2, 5, 2]);
        assert_eq!(terms(&red).len(), 1 + 4 + 1 + 1);
        let me = MaxEnt::new(CanonicalFeatures::new(&queries(), &red.sizes, 5000).unwrap());
        assert!(me.features.len > 100 && me.features.len < 400, "{}", me.features.len);
    }
}
