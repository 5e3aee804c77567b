//! MWEM+PGM (001 Alg 1): T rounds; each selects the workload marginal worst
//! approximated by the current model (exponential mechanism, score
//! ‖M_r(D) − M_r(p̂)‖₁ − n_r, sensitivity 1, ε = 2√(ρ/T)), measures it with
//! Gaussian noise σ = √(T/ρ), and re-estimates with Private-PGM. Per round
//! ε²/8 + 1/(2σ²) = ρ/T. Like private-pgm's implementation, candidates that
//! would push JT-SIZE past the model capacity are skipped.

use super::{FitContext, FitMetadata, Fitted, MeasurementLog, Result, SynthError, Synthesizer, gauss, l1};
use crate::domain::Domain;
use crate::pgm::{GraphicalModel, JunctionTree, Measurement};
use crate::synth::workload::Workload;

/// MWEM+PGM.
#[derive(Debug, Clone, Default)]
pub struct MwemPgm;

impl Synthesizer for MwemPgm {
    fn name(&self) -> &'static str {
        "mwem"
    }

    fn required_marginals(&self, _domain: &Domain, workload: &Workload) -> Vec<Vec<usize>> {
        workload.queries.iter().map(|q| q.attrs.clone()).collect()
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted> {
        let d = ctx.sizes.len();
        let t_rounds = ctx.options.rounds.unwrap_or(d).max(1);
        let epsilon = 2.0 * (ctx.rho / t_rounds as f64).sqrt();
        let sigma = (t_rounds as f64 / ctx.rho).sqrt();
        let all: Vec<Vec<usize>> = (0..d).map(|a| vec![a]).collect();
        let mut model = GraphicalModel::uniform(&ctx.sizes, &all, 1.0);
        let mut measurements: Vec<Measurement> = Vec::new();
        let mut log = Vec::new();
        let queries: Vec<Vec<usize>> = ctx.workload.queries.iter().map(|q| q.attrs.clone()).collect();
        for t in 1..=t_rounds {
            let beliefs = model.beliefs();
            let cliques: Vec<Vec<usize>> = model.potentials.iter().map(|p| p.attrs.clone()).collect();
            let mut cand = Vec::new();
            let mut scores = Vec::new();
            for r in &queries {
                let mut cl = cliques.clone();
                cl.push(r.clone());
                if JunctionTree::build(&ctx.sizes, &cl).size_mb(&ctx.sizes) > ctx.options.max_model_mb {
                    continue;
                }
                let est = beliefs.marginal_any(r, &ctx.sizes).values;
                // Before any measurement the model's total is 1: scale to the noisy total.
                let scale = if measurements.is_empty() { 0.0 } else { ctx.scale_for(r) };
                let est: Vec<f64> = est.iter().map(|v| v * scale).collect();
                let n_r = ctx.answers.cells(r) as f64;
                scores.push(l1(ctx.answers.get(r)?, &est) - n_r);
                cand.push(r.clone());
            }
            if cand.is_empty() {
                return Err(SynthError::NothingFits);
            }
            let pick = ctx.select(&format!("mwem round {t} selection"), &scores, epsilon, 1.0)?;
            let r = cand[pick].clone();
            measurements.push(ctx.measure(&r, sigma)?);
            log.push(MeasurementLog::new(ctx.names(&r), gauss(sigma), t, ctx.options.confidence));
            model = ctx.estimate(&measurements, Some(&model).filter(|_| t > 1), ctx.options.iters);
            (ctx.progress)(&format!("mwem: round {t}/{t_rounds}: measured ({})", ctx.names(&r).join(",")));
        }
        Ok(Fitted {
            model,
            compression: None,
            metadata: FitMetadata { measurements: log, rounds: t_rounds, ..Default::default() },
        })
    }
}
