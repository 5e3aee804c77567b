//! AIM: An Adaptive and Iterative Mechanism (001 Alg 2–4, §4), with its error
//! bounds (001 §5).
//!
//! Privacy (001 Thm 1): ρ-zCDP. Initialisation measures the 1-way marginals
//! of W₊ with σ₀ = √(T/(2αρ)); every round spends ε_t²/8 (exponential
//! mechanism, Cesar & Rogers) + 1/(2σ_t²) (Gaussian); when the rest cannot pay
//! for two more rounds, the last round takes exactly the rest. Each charge
//! goes through the release accountant, which refuses anything beyond ρ.
//!
//! Speed (issue 19; none of it touches privacy, since everything below reads
//! only the noisy measurements, except the scores' exact answers, as before):
//! candidates are scored on all cores; each round's estimation starts from the
//! previous model *and* its final step size, and stops once the loss falls by
//! less than [`Aim::tolerance`] over 50 iterations (001 and private-pgm run a
//! fixed 1000). `benches/results/aim/tolerance.md` measures the rule
//! against tighter ones on Adult and on 10⁷ bench rows.

use std::collections::HashMap;

use rayon::prelude::*;

use super::bounds::{MeasuredMarginal, RoundInfo, workload_bounds};
use super::{FitContext, FitMetadata, Fitted, MeasurementLog, Result, Synthesizer, gauss, l1};
use crate::domain::Domain;
use crate::pgm::{GraphicalModel, JunctionTree, Measurement, MessageCache};
use crate::synth::workload::Workload;

/// AIM hyper-parameters (001 Alg 4 line 3).
#[derive(Debug, Clone)]
pub struct Aim {
    /// Budget share of the measure steps (α = 0.9).
    pub alpha: f64,
    /// Upper bound on rounds T as a multiple of d (T = 16d).
    pub rounds_per_attribute: usize,
    /// Stopping rule of the estimations inside the rounds, which only steer
    /// the next selection: stop once the loss falls by less than this share
    /// over 50 iterations (at most `iters` either way; 0 runs them all, as
    /// private-pgm does). Post-processing: no effect on privacy.
    pub tolerance: f64,
    /// Stopping rule of the final estimation, the model that is released
    /// (warm-started from the last round's; never looser than `tolerance`).
    pub final_tolerance: f64,
}

impl Default for Aim {
    fn default() -> Self {
        Self { alpha: 0.9, rounds_per_attribute: 16, tolerance: AIM_TOLERANCE, final_tolerance: AIM_FINAL_TOLERANCE }
    }
}

/// The default stopping rule of the rounds (see [`Aim::tolerance`]);
/// measured in `benches/results/aim/tolerance.md` against tighter ones.
pub const AIM_TOLERANCE: f64 = 1e-2;

/// The default stopping rule of the final fit (see [`Aim::final_tolerance`]).
pub const AIM_FINAL_TOLERANCE: f64 = 1e-3;

/// Is `r` a subset of some clique of the model (free to add)?
fn in_closure(r: &[usize], cliques: &[Vec<usize>]) -> bool {
    cliques.iter().any(|c| r.iter().all(|a| c.contains(a)))
}

impl Synthesizer for Aim {
    fn name(&self) -> &'static str {
        "aim"
    }

    fn required_marginals(&self, domain: &Domain, workload: &Workload) -> Vec<Vec<usize>> {
        let mut req: Vec<Vec<usize>> = workload.downward_closure().into_iter().map(|(r, _)| r).collect();
        for a in 0..domain.len() {
            if !req.contains(&vec![a]) {
                req.push(vec![a]);
            }
        }
        req
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted> {
        let d = ctx.sizes.len();
        let rho = ctx.rho;
        let alpha = self.alpha;
        let t_max = (self.rounds_per_attribute * d) as f64;
        let candidates: Vec<(Vec<usize>, f64)> = ctx.workload.downward_closure();
        let weight_of: HashMap<Vec<usize>, f64> = candidates.iter().cloned().collect();
        let sizes = ctx.sizes.clone();
        let cells = |r: &[usize]| -> f64 { r.iter().map(|&a| sizes[a] as f64).product() };

        // Alg 2: initialise on the 1-way marginals of W₊ (and of any attribute
        // outside W₊, so every column has a noisy marginal; an extension).
        let sigma0 = (t_max / (2.0 * alpha * rho)).sqrt();
        let mut measurements: Vec<Measurement> = Vec::new();
        let mut log = Vec::new();
        let mut measured_for_bounds = Vec::new();
        let mut rho_used = 0.0;
        for a in 0..d {
            let m = ctx.measure(&[a], sigma0)?;
            rho_used += 1.0 / (2.0 * sigma0 * sigma0);
            log.push(
                MeasurementLog::new(ctx.names(&[a]), gauss(sigma0), 0, ctx.options.confidence).with_values(&m.values),
            );
            measured_for_bounds.push(MeasuredMarginal {
                attrs: m.attrs.clone(),
                values: m.values.clone(),
                sigma: sigma0,
            });
            measurements.push(m);
        }
        let iters = ctx.options.iters;
        let tolerance = ctx.options.tolerance.unwrap_or(self.tolerance);
        let mut model: GraphicalModel = ctx.estimate_until(&measurements, None, iters, tolerance);
        (ctx.progress)(&format!("aim: initialised on {d} one-way marginals (σ₀ = {sigma0:.2})"));

        let mut sigma = sigma0;
        let mut epsilon = (8.0 * (1.0 - alpha) * rho / t_max).sqrt();
        let mut rounds: Vec<RoundInfo> = Vec::new();
        // Per candidate: the last round it was admitted in and its estimate then.
        let mut last_candidate: Vec<Option<(usize, Vec<f64>)>> = vec![None; candidates.len()];
        let scales: Vec<f64> = candidates.iter().map(|(r, _)| ctx.scale_for(r)).collect();
        let mut notes = Vec::new();
        let mut terminate = false;
        let mut t = 0usize;
        while !terminate {
            t += 1;
            // Alg 3 line 8 (checked before spending, as private-pgm does).
            if rho - rho_used <= 2.0 * (1.0 / (2.0 * sigma * sigma) + epsilon * epsilon / 8.0) {
                let remaining = rho - rho_used;
                sigma = (1.0 / (2.0 * alpha * remaining)).sqrt();
                epsilon = (8.0 * (1.0 - alpha) * remaining).sqrt();
                terminate = true;
            }
            rho_used += epsilon * epsilon / 8.0 + 1.0 / (2.0 * sigma * sigma);
            let size_limit = ctx.options.max_model_mb * (rho_used / rho).min(1.0);
            // Candidates: JT-SIZE filter, or already free in the model.
            let model_cliques: Vec<Vec<usize>> = model.potentials.iter().map(|p| p.attrs.clone()).collect();
            let beliefs = model.beliefs();
            // Out-of-clique candidates share their elimination messages.
            let messages = MessageCache::default();
            // The JT-SIZE filter, the model's marginal and the score of each
            // candidate are independent of one another: computed on all
            // cores, kept in order. An admitted candidate's scaled marginal
            // replaces, in its own slot, its estimate from the last round it
            // was admitted in, which 001 §5's bounds need (issue 19, AIM at
            // width: the run holds one copy of the candidates' marginals
            // besides the exact answers, and scoring copies none).
            let round = rounds.len();
            let answers = ctx.answers;
            let scored: Vec<Option<f64>> = candidates
                .par_iter()
                .zip(last_candidate.par_iter_mut())
                .zip(scales.par_iter())
                .map(|(((r, w), slot), &c)| {
                    let ok = in_closure(r, &model_cliques) || {
                        let mut cl = model_cliques.clone();
                        cl.push(r.clone());
                        JunctionTree::build(&sizes, &cl).size_mb(&sizes) <= size_limit
                    };
                    if !ok {
                        return Ok(None);
                    }
                    let mut est = beliefs.marginal_any_cached(r, &sizes, Some(&messages)).values;
                    est.iter_mut().for_each(|v| *v *= c);
                    let score =
                        w * (l1(answers.get(r)?, &est) - (2.0 / std::f64::consts::PI).sqrt() * sigma * cells(r));
                    *slot = Some((round, est));
                    Ok(Some(score))
                })
                .collect::<Result<_>>()?;
            let admitted: Vec<usize> = (0..candidates.len()).filter(|&i| scored[i].is_some()).collect();
            let delta = admitted.iter().map(|&i| candidates[i].1).fold(0.0f64, f64::max).max(f64::MIN_POSITIVE);
            let scores: Vec<f64> = admitted.iter().filter_map(|&i| scored[i]).collect();
            let pick = admitted[ctx.select(&format!("aim round {t} selection"), &scores, epsilon, delta)?];
            let (r_t, w_t) = (candidates[pick].0.clone(), candidates[pick].1);
            let prev_est = last_candidate[pick].as_ref().map(|(_, e)| e.clone()).unwrap_or_default();
            let n_candidates = admitted.len();
            let m = ctx.measure(&r_t, sigma)?;
            let selected_error = l1(&prev_est, &m.values);
            log.push(MeasurementLog::new(ctx.names(&r_t), gauss(sigma), t, ctx.options.confidence));
            measured_for_bounds.push(MeasuredMarginal { attrs: r_t.clone(), values: m.values.clone(), sigma });
            measurements.push(m);
            rounds.push(RoundInfo {
                sigma,
                epsilon,
                selected: r_t.clone(),
                selected_weight: w_t,
                selected_cells: cells(&r_t),
                selected_error,
                delta,
                candidates: n_candidates,
            });
            model = ctx.estimate_until(&measurements, Some(&model), iters, tolerance);
            let c = ctx.scale_for(&r_t);
            let new_est: Vec<f64> = model.marginal(&r_t).values.iter().map(|v| v * c).collect();
            (ctx.progress)(&format!(
                "aim: round {t}: measured ({}) σ={sigma:.2} ε={epsilon:.4}; ρ used {:.4}/{rho:.4}",
                ctx.names(&r_t).join(","),
                rho_used.min(rho)
            ));
            // Alg 3 lines 1–7: anneal when little was learned.
            if !terminate && l1(&new_est, &prev_est) <= (2.0 / std::f64::consts::PI).sqrt() * sigma * cells(&r_t) {
                sigma /= 2.0;
                epsilon *= 2.0;
                notes.push(format!("round {t}: annealed to σ={sigma:.3}, ε={epsilon:.4}"));
            }
        }
        // The released model: the last round's fit, polished to the final
        // tolerance (the rounds' looser fits only had to steer selection).
        let final_tolerance = self.final_tolerance.min(tolerance);
        if final_tolerance < tolerance {
            model = ctx.estimate_until(&measurements, Some(&model), iters, final_tolerance);
        }
        let workload: Vec<(Vec<usize>, f64)> =
            ctx.workload.queries.iter().map(|q| (q.attrs.clone(), *weight_of.get(&q.attrs).unwrap_or(&0.0))).collect();
        let names = |r: &[usize]| r.iter().map(|&a| ctx.domain.columns()[a].name.clone()).collect::<Vec<_>>();
        // The bounds of 001 §5 bound the error against the answers measured; for
        // observed-only answers that is not the complete data, so none are claimed.
        if ctx.observed.is_some() {
            notes.push("observed-only (adaptive) fit: no AIM error bounds are reported (they would bound the error on observed rows only)".into());
        }
        let error_bounds = if ctx.observed.is_some() {
            vec![]
        } else {
            workload_bounds(
                &workload,
                &names,
                &ctx.sizes,
                &measured_for_bounds,
                &rounds,
                &candidates
                    .iter()
                    .map(|(r, _)| r.clone())
                    .zip(last_candidate)
                    .filter_map(|(r, l)| Some((r, l?)))
                    .collect(),
                &model,
                ctx.options.confidence,
            )
        };
        Ok(Fitted {
            model,
            compression: None,
            metadata: FitMetadata { measurements: log, rounds: t, error_bounds, notes },
        })
    }
}
