//! PrivBayes (Zhang et al. 2017; NOTES §5) and PrivBayes+PGM, and, run on
//! observed-only answers, PrivBayesE (000 Alg 2).
//!
//! Structure: the first attribute is drawn uniformly (data-independent); each
//! next (attribute X, parents Π ⊆ chosen, |Π| = min(k, #chosen)) is selected
//! by the exponential mechanism on the mutual information, ε₁/(d−1) each.
//! Conditionals: for every attribute the (|Π|+1)-way marginal of X ∪ Π gets
//! discrete Laplace noise with scale d/ε₂ (ε₂/d each), negatives are set to 0
//! and each parent configuration normalised (plain PrivBayes), or the noisy
//! marginals are given to Private-PGM (PrivBayes+PGM). Pure ε-DP: ε₁ + ε₂ = ε.
//!
//! Deviation from the papers, and why: the score is n·I(X; Π) in nats rather
//! than I(X; Π). Under add/remove-one neighbours (dpflow's unit) n is private,
//! so the bounded-DP sensitivity of I used by PrivBayes (which needs n) does
//! not apply; for n·I = Σ f(c_xπ) − Σ f(c_x) − Σ f(c_π) + f(n), f(c) = c ln c,
//! adding one row changes it by [g(n) − g(c_π)] − [g(c_x) − g(c_xπ)] with
//! g(c) = f(c+1) − f(c) increasing, so |Δ| ≤ g(N) − g(0) ≤ ln(N+1) + 1 for a
//! public bound N on the rows. On observed-only answers (PrivBayesE) n is the
//! number of rows observed on X ∪ Π and the same bound holds.

use itertools::Itertools;

use super::{FitContext, FitMetadata, Fitted, MeasurementLog, Result, SynthError, Synthesizer};
use crate::domain::Domain;
use crate::pgm::{EstimateOptions, Factor, GraphicalModel, JunctionTree, Measurement, estimate};
use crate::synth::workload::Workload;

/// PrivBayes hyper-parameters.
#[derive(Debug, Clone)]
pub struct PrivBayes {
    /// Degree k (parents per attribute).
    pub degree: usize,
    /// Share of ε spent on the structure (ε₁ = β·ε; 000 Alg 2 uses ε/2).
    pub structure_share: f64,
    /// Estimate a graphical model from the noisy marginals (PrivBayes+PGM).
    pub pgm: bool,
    /// Public upper bound on the number of rows (score sensitivity ln(N+1)+1).
    pub max_rows: f64,
    /// Candidate (X ∪ Π) marginals with more cells than this are skipped.
    pub max_cells: usize,
    /// θ-usefulness (Zhang et al. 2017 §4.3): a conditional is only learned on
    /// X ∪ Π with n̂·ε₂/(d·cells) ≥ θ, so noise does not swamp the counts.
    pub theta: f64,
}

impl Default for PrivBayes {
    fn default() -> Self {
        Self { degree: 2, structure_share: 0.5, pgm: false, max_rows: 1e9, max_cells: 1_000_000, theta: 4.0 }
    }
}

fn xlogx(c: f64) -> f64 {
    if c > 0.0 { c * c.ln() } else { 0.0 }
}

/// n·I(X; Π) in nats from the joint counts over sorted `set` ∋ x.
pub(crate) fn n_mutual_information(set: &[usize], x: usize, shape: &[usize], counts: &[f64]) -> f64 {
    let f = Factor { attrs: set.to_vec(), shape: shape.to_vec(), values: counts.to_vec() };
    let parents: Vec<usize> = set.iter().copied().filter(|&a| a != x).collect();
    let n: f64 = counts.iter().sum();
    let cx = f.sum_to(&[x]);
    let cp = f.sum_to(&parents);
    counts.iter().map(|&c| xlogx(c)).sum::<f64>()
        - cx.values.iter().map(|&c| xlogx(c)).sum::<f64>()
        - cp.values.iter().map(|&c| xlogx(c)).sum::<f64>()
        + xlogx(n)
}

impl PrivBayes {
    /// Sensitivity of the n·I score.
    pub fn score_sensitivity(&self) -> f64 {
        (self.max_rows + 1.0).ln() + 1.0
    }
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

impl Synthesizer for PrivBayes {
    fn name(&self) -> &'static str {
        if self.pgm { "privbayes-pgm" } else { "privbayes" }
    }

    fn pure_dp(&self) -> bool {
        true
    }

    fn required_marginals(&self, domain: &Domain, _workload: &Workload) -> Vec<Vec<usize>> {
        // Every (X ∪ Π) the structure search may score or the conditionals measure.
        let d = domain.len();
        let all: Vec<usize> = (0..d).collect();
        let sizes = domain.cardinalities();
        let mut out = Vec::new();
        for size in 1..=(self.degree + 1).min(d) {
            for s in all.iter().copied().combinations(size) {
                let cells: usize = s.iter().map(|&a| sizes[a]).product();
                if cells <= self.max_cells || size == 1 {
                    out.push(s);
                }
            }
        }
        out
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted> {
        let d = ctx.sizes.len();
        let eps = ctx.epsilon;
        if eps.is_nan() || eps <= 0.0 {
            return Err(SynthError::NeedsPureEpsilon);
        }
        let sizes = ctx.sizes.clone();
        let cells = |s: &[usize]| -> usize { s.iter().map(|&a| sizes[a]).product() };
        // n̂ for θ-usefulness: the fit's N̂, or a noisy count with 1% of ε.
        let mut count_log = None;
        let (n_hat, eps) = match &ctx.observed {
            Some(o) => (o.total, eps),
            None => {
                let e = 0.01 * eps;
                let first_attr = [0usize];
                let m = ctx.measure_laplace(&first_attr, 1.0 / e)?;
                let noise = dpflow_udfs::noise::NoiseDistribution::Laplace { scale: 1.0 / e };
                count_log = Some(MeasurementLog::new(ctx.names(&first_attr), noise, 0, ctx.options.confidence));
                (m.values.iter().sum::<f64>().max(1.0), eps - e)
            }
        };
        let eps1 = if d > 1 { self.structure_share * eps } else { 0.0 };
        let eps2 = eps - eps1;
        let delta = self.score_sensitivity();
        let useful_cells = (n_hat * eps2 / (d as f64 * self.theta)).max(1.0) as usize;
        let limit = useful_cells.min(self.max_cells);

        // Structure (NOTES §5; 000 Alg 2 lines 1–8).
        let first = dpflow_udfs::noise::exact::uniform_below_u64(ctx.rng, d as u64) as usize;
        let mut chosen = vec![first];
        let mut network: Vec<(usize, Vec<usize>)> = vec![(first, vec![])];
        let mut notes: Vec<String> = Vec::new();
        for step in 1..d {
            let k = self.degree.min(chosen.len());
            let mut cand: Vec<(usize, Vec<usize>)> = Vec::new();
            let mut scores = Vec::new();
            for x in (0..d).filter(|a| !chosen.contains(a)) {
                // θ-useful parent sets of size ≤ k, keeping only maximal ones (Zhang et al. 2017 §4.3).
                let mut valid: Vec<Vec<usize>> = Vec::new();
                for size in (0..=k).rev() {
                    // Lexicographic in the positions of `chosen` (seeded runs depend on the order).
                    for parents in chosen.iter().copied().combinations(size) {
                        let set = sorted(parents.iter().copied().chain([x]).collect());
                        let fits = cells(&set) <= limit || parents.is_empty();
                        if fits && !valid.iter().any(|v| parents.iter().all(|p| v.contains(p))) {
                            valid.push(parents);
                        }
                    }
                }
                for parents in valid {
                    let set = sorted(parents.iter().copied().chain([x]).collect());
                    let counts = ctx.answers.get(&set)?;
                    let shape: Vec<usize> = set.iter().map(|&a| sizes[a]).collect();
                    scores.push(n_mutual_information(&set, x, &shape, counts));
                    cand.push((x, parents));
                }
            }
            let pick =
                ctx.select(&format!("privbayes structure step {step}"), &scores, eps1 / (d - 1) as f64, delta)?;
            let (x, parents) = cand[pick].clone();
            chosen.push(x);
            network.push((x, parents));
        }
        (ctx.progress)(&format!("{}: network chosen; measuring {d} conditionals", self.name()));

        // Conditionals: d marginals with discrete Laplace b = d/ε₂ (000 Alg 2 lines 10–14).
        let b = d as f64 / eps2;
        let mut measurements: Vec<Measurement> = Vec::with_capacity(d);
        let mut log: Vec<MeasurementLog> = count_log.into_iter().collect();
        for (x, parents) in &network {
            let set = sorted(parents.iter().copied().chain([*x]).collect());
            measurements.push(ctx.measure_laplace(&set, b)?);
            let noise = dpflow_udfs::noise::NoiseDistribution::Laplace { scale: b };
            log.push(MeasurementLog::new(ctx.names(&set), noise, 1, ctx.options.confidence));
        }
        // Total: the fit's N̂ (observed-only fits) or the mean noisy total.
        let total = match &ctx.observed {
            Some(o) => o.total,
            None => (measurements.iter().map(|m| m.values.iter().sum::<f64>()).sum::<f64>() / d as f64).max(1.0),
        };
        let model = if self.pgm {
            let opts = EstimateOptions { iters: ctx.options.iters, total: Some(total), ..Default::default() };
            estimate(&ctx.sizes, &measurements, &opts, None).model
        } else {
            bayes_net_model(&ctx.sizes, &network, &measurements, total)
        };
        notes.push(format!("θ-usefulness: conditionals limited to {limit} cells (n̂ = {n_hat:.0}, θ = {})", self.theta));
        notes.push(format!(
            "network: {}",
            network
                .iter()
                .map(|(x, p)| format!("{} <- [{}]", ctx.names(&[*x])[0], ctx.names(p).join(",")))
                .collect::<Vec<_>>()
                .join("; ")
        ));
        Ok(Fitted {
            model,
            compression: None,
            metadata: FitMetadata { measurements: log, rounds: d, error_bounds: vec![], notes },
        })
    }
}

/// The Bayesian network Π_i p̂(x_i | Π_i) as a graphical model: each noisy
/// marginal is clipped at 0 and normalised per parent configuration (a
/// configuration with no mass becomes uniform); log-conditionals are the
/// potentials of the cliques X_i ∪ Π_i.
fn bayes_net_model(
    sizes: &[usize],
    network: &[(usize, Vec<usize>)],
    measurements: &[Measurement],
    total: f64,
) -> GraphicalModel {
    let mut potentials = Vec::with_capacity(network.len());
    for ((x, parents), m) in network.iter().zip(measurements) {
        let shape: Vec<usize> = m.attrs.iter().map(|&a| sizes[a]).collect();
        let mut f = Factor { attrs: m.attrs.clone(), shape, values: m.values.iter().map(|v| v.max(0.0)).collect() };
        let mut p = parents.clone();
        p.sort_unstable();
        let mut z = f.sum_to(&p);
        // Empty parent configurations: uniform over x.
        let size_x = sizes[*x] as f64;
        let empty = Factor {
            attrs: z.attrs.clone(),
            shape: z.shape.clone(),
            values: z.values.iter().map(|&v| if v > 0.0 { 0.0 } else { 1.0 / size_x }).collect(),
        };
        f.add_assign_sub(&empty);
        z = f.sum_to(&p);
        f.div_assign_sub(&z);
        for v in &mut f.values {
            *v = v.max(1e-300).ln();
        }
        potentials.push(f);
    }
    let cliques: Vec<Vec<usize>> = potentials.iter().map(|f| f.attrs.clone()).collect();
    let jtree = JunctionTree::build(sizes, &cliques);
    GraphicalModel { sizes: sizes.to_vec(), potentials, total, jtree }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutual_information_by_hand() {
        // X = Π exactly on 2 values, 50/50: n·I = n ln 2.
        let counts = vec![50.0, 0.0, 0.0, 50.0];
        let v = n_mutual_information(&[0, 1], 1, &[2, 2], &counts);
        assert!((v - 100.0 * 2f64.ln()).abs() < 1e-9);
        // Independent: 0.
        let v = n_mutual_information(&[0, 1], 0, &[2, 2], &[25.0, 25.0, 25.0, 25.0]);
        assert!(v.abs() < 1e-9);
    }

    #[test]
    fn score_sensitivity_bound_holds_by_brute_force() {
        // Adding any one row to random tables changes n·I by at most ln(n+1)+1.
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
        for _ in 0..300 {
            let shape = [rng.random_range(2..4usize), rng.random_range(2..4usize), rng.random_range(2..3usize)];
            let cells: usize = shape.iter().product();
            let counts: Vec<f64> = (0..cells).map(|_| rng.random_range(0..6u32) as f64).collect();
            let n: f64 = counts.iter().sum();
            let base = n_mutual_information(&[0, 1, 2], 1, &shape, &counts);
            for c in 0..cells {
                let mut more = counts.clone();
                more[c] += 1.0;
                let diff = (n_mutual_information(&[0, 1, 2], 1, &shape, &more) - base).abs();
                assert!(diff <= (n + 2.0).ln() + 1.0 + 1e-9, "diff {diff} n {n}");
            }
        }
    }

    #[test]
    fn bayes_net_model_reproduces_its_conditionals() {
        // x0 ~ (0.3, 0.7); x1 | x0 given by the counts below (no noise).
        let sizes = [2, 3];
        let m0 =
            Measurement { attrs: vec![0], values: vec![30.0, 70.0], sigma: 1.0, query: crate::pgm::Query::Identity };
        let m1 = Measurement {
            attrs: vec![0, 1],
            values: vec![10.0, 10.0, 10.0, 7.0, 0.0, 63.0],
            sigma: 1.0,
            query: crate::pgm::Query::Identity,
        };
        let model = bayes_net_model(&sizes, &[(0, vec![]), (1, vec![0])], &[m0, m1.clone()], 100.0);
        let joint = model.marginal(&[0, 1]);
        for (a, b) in joint.values.iter().zip(&m1.values) {
            assert!((a - b).abs() < 1e-6, "{:?}", joint.values);
        }
    }
}
