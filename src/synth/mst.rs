//! MST (NOTES §4; McKenna, Miklau & Sheldon 2021, the 2018 NIST competition
//! winner, generalised): ρ split in thirds — (1) all 1-way marginals with
//! Gaussian noise, then domain compression (noisy counts below 3σ merged);
//! (2) d−1 edges of a spanning tree, each chosen by the exponential mechanism
//! among pairs joining two components, scored by the L1 error of the 1-way
//! model on the 2-way marginal (sensitivity 1); (3) the chosen 2-way
//! marginals with Gaussian noise. Private-PGM estimation, generation, and the
//! compression is undone at sampling time.

use petgraph::unionfind::UnionFind;

use super::compress::Compression;
use super::{FitContext, FitMetadata, Fitted, MeasurementLog, Result, Synthesizer, gauss, l1, one_way, two_way};
use crate::domain::Domain;
use crate::pgm::{Measurement, estimate};
use crate::synth::workload::Workload;

/// The MST synthesizer.
#[derive(Debug, Clone, Default)]
pub struct Mst;

impl Synthesizer for Mst {
    fn name(&self) -> &'static str {
        "mst"
    }

    fn required_marginals(&self, domain: &Domain, _workload: &Workload) -> Vec<Vec<usize>> {
        let d = domain.len();
        let mut r = one_way(d);
        r.extend(two_way(d));
        r
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted> {
        let d = ctx.sizes.len();
        let rho = ctx.rho;
        // Each third of ρ is spread evenly: k marginals with σ√k each cost 1/(2σ²) in total.
        let sigma = (3.0 / (2.0 * rho)).sqrt();
        let sigma1 = sigma * (d as f64).sqrt();
        let mut log = Vec::new();
        let mut ones = Vec::with_capacity(d);
        for a in 0..d {
            let m = ctx.measure(&[a], sigma1)?;
            log.push(
                MeasurementLog::new(ctx.names(&[a]), gauss(sigma1), 1, ctx.options.confidence).with_values(&m.values),
            );
            ones.push(m);
        }
        // Compression (post-processing of the noisy 1-way counts).
        let compression = Compression::from_one_way(&ones);
        let csizes = compression.sizes();
        let mut notes = Vec::new();
        for (a, g) in compression.members.iter().enumerate() {
            let merged = g.iter().filter(|m| m.len() > 1).map(|m| m.len()).sum::<usize>();
            if merged > 0 {
                notes.push(format!("{}: {merged} rare values merged into one code", ctx.names(&[a])[0]));
            }
        }
        let c_ones: Vec<Measurement> = ones.iter().map(|m| compression.compress_one_way(m)).collect();
        // (2) Selection on the compressed domain.
        let opts = ctx.estimate_options(ctx.options.iters.min(2500));
        let indep = estimate(&csizes, &c_ones, &opts, None).model;
        let beliefs = indep.beliefs();
        let pairs = two_way(d);
        let mut weights = Vec::with_capacity(pairs.len());
        for p in &pairs {
            let exact = compression.compress_table(p, &ctx.sizes, ctx.answers.get(p)?);
            let c = ctx.scale_for(p);
            let est: Vec<f64> = beliefs.marginal_any(p, &csizes).values.iter().map(|v| v * c).collect();
            weights.push(l1(&exact, &est));
        }
        let mut components = UnionFind::<usize>::new(d);
        let edges_needed = d.saturating_sub(1);
        let eps_select = if edges_needed > 0 { (8.0 * (rho / 3.0) / edges_needed as f64).sqrt() } else { 0.0 };
        let mut tree = Vec::with_capacity(edges_needed);
        for k in 0..edges_needed {
            let open: Vec<usize> = (0..pairs.len()).filter(|&i| !components.equiv(pairs[i][0], pairs[i][1])).collect();
            let scores: Vec<f64> = open.iter().map(|&i| weights[i]).collect();
            let pick = ctx.select(&format!("mst edge {}", k + 1), &scores, eps_select, 1.0)?;
            let e = &pairs[open[pick]];
            components.union(e[0], e[1]);
            tree.push(e.clone());
        }
        // (3) Measure the tree's 2-way marginals.
        let sigma3 = sigma * (edges_needed.max(1) as f64).sqrt();
        let mut measurements = c_ones;
        for e in &tree {
            // Measure on the domain, then compress (post-processing): the
            // compressed table sums cells, so its per-cell noise grows; keep
            // exactness by measuring the compressed table directly instead.
            let exact = compression.compress_table(e, &ctx.sizes, ctx.answers.get(e)?);
            let m = ctx.measure_values(e, &exact, sigma3)?;
            log.push(MeasurementLog::new(ctx.names(e), gauss(sigma3), 3, ctx.options.confidence));
            measurements.push(m);
        }
        (ctx.progress)(&format!("mst: selected {} edges; estimating", tree.len()));
        let opts = ctx.estimate_options(ctx.options.iters);
        let model = estimate(&csizes, &measurements, &opts, None).model;
        Ok(Fitted {
            model,
            compression: (!compression.is_trivial()).then_some(compression),
            metadata: FitMetadata { measurements: log, rounds: tree.len(), error_bounds: vec![], notes },
        })
    }
}
