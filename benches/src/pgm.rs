//! Benchmark helpers for the estimation engine (peer comparison with
//! private-pgm): a portable measurements file and a timed estimation.

use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use dpflow::dataset::Dataset;
use dpflow::io::session_context;
use dpflow::pgm::estimate::{
    EstimateOptions, Measurement, Norm, Weighting, estimate, estimate_total, objective_weighted,
};
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::{DpRng, NoiseDistribution};

/// A measurements file: a domain, a total, and noisy marginals (values
/// row-major over `clique`, which is listed in domain order).
#[derive(Debug, Serialize, Deserialize)]
pub struct MeasurementsFile {
    /// Attribute names and sizes, in order.
    pub domain: Vec<(String, usize)>,
    /// The total both estimators use.
    pub total: f64,
    /// Measurements.
    pub measurements: Vec<MeasurementEntry>,
}

/// One measurement.
#[derive(Debug, Serialize, Deserialize)]
pub struct MeasurementEntry {
    /// Attribute names (domain order).
    pub clique: Vec<String>,
    /// Noise σ.
    pub sigma: f64,
    /// Noisy counts.
    pub values: Vec<f64>,
}

fn mutual_information(joint: &[u64], na: usize, nb: usize) -> f64 {
    let n: f64 = joint.iter().sum::<u64>() as f64;
    if n == 0.0 {
        return 0.0;
    }
    let mut pa = vec![0.0; na];
    let mut pb = vec![0.0; nb];
    for a in 0..na {
        for b in 0..nb {
            let p = joint[a * nb + b] as f64 / n;
            pa[a] += p;
            pb[b] += p;
        }
    }
    let mut mi = 0.0;
    for a in 0..na {
        for b in 0..nb {
            let p = joint[a * nb + b] as f64 / n;
            if p > 0.0 {
                mi += p * (p / (pa[a] * pb[b])).ln();
            }
        }
    }
    mi
}

/// Writes all 1-way marginals and the maximum-MI spanning tree's 2-way
/// marginals with discrete Gaussian noise σ.
pub async fn write_measurements(input: &str, domain: &str, out: &str, sigma: f64, seed: u64) -> Result<()> {
    let ds = Dataset::open("bench", input, None, domain)?;
    let ctx = session_context();
    let names: Vec<String> = ds.domain().names().iter().map(|s| s.to_string()).collect();
    let sizes = ds.domain().cardinalities();
    let d = names.len();
    let mut pairs = Vec::new();
    for i in 0..d {
        for j in i + 1..d {
            pairs.push((i, j));
        }
    }
    let sets: Vec<(Vec<String>, NullMode)> =
        pairs.iter().map(|&(i, j)| (vec![names[i].clone(), names[j].clone()], NullMode::Cells)).collect();
    let exact = dpflow::eval::inspect::exact_marginal_counts(&ds, &ctx, &sets).await?;
    let mut weighted: Vec<(f64, usize, usize)> =
        pairs.iter().zip(&exact).map(|(&(i, j), m)| (mutual_information(m, sizes[i], sizes[j]), i, j)).collect();
    weighted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut comp: Vec<usize> = (0..d).collect();
    fn root(c: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while c[r] != r {
            r = c[r];
        }
        c[x] = r;
        r
    }
    let mut tree = Vec::new();
    for (_, i, j) in weighted {
        let (ri, rj) = (root(&mut comp, i), root(&mut comp, j));
        if ri != rj {
            comp[ri] = rj;
            tree.push((i, j));
        }
    }
    let mut queries: Vec<(Vec<String>, NullMode)> = names.iter().map(|n| (vec![n.clone()], NullMode::Cells)).collect();
    queries.extend(tree.iter().map(|&(i, j)| (vec![names[i].clone(), names[j].clone()], NullMode::Cells)));
    let exact = dpflow::eval::inspect::exact_marginal_counts(&ds, &ctx, &queries).await?;
    let mut rng = DpRng::unsafe_seeded(seed);
    let sampler = NoiseDistribution::Gaussian { sigma }.integer_sampler();
    let measurements: Vec<MeasurementEntry> = queries
        .iter()
        .zip(exact)
        .map(|((clique, _), m)| MeasurementEntry {
            clique: clique.clone(),
            sigma,
            values: m.iter().map(|&c| (c as i128 + sampler.sample(&mut rng)) as f64).collect(),
        })
        .collect();
    let mut file = MeasurementsFile { domain: names.into_iter().zip(sizes).collect(), total: 0.0, measurements };
    file.total = estimate_total(&to_measurements(&file)?);
    std::fs::write(out, serde_json::to_vec_pretty(&file)?).with_context(|| format!("writing {out}"))?;
    Ok(())
}

fn to_measurements(f: &MeasurementsFile) -> Result<Vec<Measurement>> {
    let sizes: Vec<usize> = f.domain.iter().map(|(_, s)| *s).collect();
    f.measurements
        .iter()
        .map(|m| {
            let idx: Vec<usize> = m
                .clique
                .iter()
                .map(|n| f.domain.iter().position(|(d, _)| d == n).with_context(|| format!("unknown attribute {n}")))
                .collect::<Result<_>>()?;
            Ok(Measurement::new(&idx, &sizes, &m.values, m.sigma))
        })
        .collect()
}

/// Estimation report.
#[derive(Debug, Serialize)]
pub struct EstimationReport {
    /// Engine name.
    pub engine: &'static str,
    /// Iterations.
    pub iterations: usize,
    /// Objective Σ‖M(μ) − y‖²/(2σ) (001 §2.3 weights).
    pub objective_inverse_sigma: f64,
    /// Objective Σ‖M(μ) − y‖²/(2σ²) (mbi 2.0.0's weights).
    pub objective_inverse_variance: f64,
    /// The weighting that was optimised.
    pub weighting: Weighting,
    /// Estimation wall time.
    pub seconds: f64,
    /// JT-SIZE in MB.
    pub jt_size_mb: f64,
}

/// Estimates with dpflow and reports.
pub fn run_estimation(path: &str, iters: usize, weighting: Weighting) -> Result<EstimationReport> {
    let f: MeasurementsFile = serde_json::from_slice(&std::fs::read(path).with_context(|| format!("reading {path}"))?)?;
    let ms = to_measurements(&f)?;
    let sizes: Vec<usize> = f.domain.iter().map(|(_, s)| *s).collect();
    let t = Instant::now();
    let opts = EstimateOptions { iters, total: Some(f.total), weighting, ..Default::default() };
    let est = estimate(&sizes, &ms, &opts, None);
    let seconds = t.elapsed().as_secs_f64();
    let b = est.model.beliefs();
    let marg = |a: &[usize]| b.marginal(a).expect("measured cliques are in the tree");
    let inv_sigma = objective_weighted(&ms, Norm::L2, Weighting::InverseSigma, marg);
    let inv_var = objective_weighted(&ms, Norm::L2, Weighting::InverseVariance, marg);
    Ok(EstimationReport {
        engine: "dpflow",
        iterations: est.iterations,
        objective_inverse_sigma: inv_sigma,
        objective_inverse_variance: inv_var,
        weighting,
        seconds,
        jt_size_mb: est.model.jtree.size_mb(&sizes),
    })
}
