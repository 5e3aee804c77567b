//! `dpflow synth --mechanism dp-misgan|dp-gan`: the public checks, the
//! ledger reservation, the read of the coded columns, the fit
//! ([`super::fit`]), the generator file (`--model-out`) and the synthetic
//! sets, streamed to the output.
//!
//! The charge is (ε, δ), as for Kamino (docs/PRIVACY.md §9). Everything
//! after the fit is post-processing of the released generator.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{GanError, GanFit, GanModel, GanOptions, fit};
use crate::domain::Domain;
use crate::missing::Strategy;
use crate::privacy::{Budget, MechanismRecord, PrivacyLoss};
use crate::synth::kamino::release::{COMPLETE_ROW_NOTE, Spent, read_codes, row_record};
use crate::synth::run::{SynthRecord, SynthRequest, TimingRecord, begin_release_loss, budget_check, save_record};
use crate::synth::{Result, SynthError};

/// The mechanism's name in records.
pub fn name(missing_aware: bool) -> &'static str {
    if missing_aware { "dp-misgan" } else { "dp-gan" }
}

/// The generator file `--model-out` writes: the released data generator
/// and the columns it draws (JSON; post-processing of DP output).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GeneratorFile {
    /// `dpflow-gan-generator-v1`.
    pub format: String,
    /// dp-misgan or dp-gan.
    pub mechanism: String,
    /// Column names, in the generator's block order.
    pub columns: Vec<String>,
    /// The model.
    pub model: GanModel,
}

/// The public checks of a run (also made by the pipeline spec check): an
/// (ε, δ) budget, the missing-data strategy the mechanism implies, and the
/// settings and network sizes.
pub fn check_public(domain: &Domain, budget: &Budget, options: &GanOptions, missing: Strategy) -> Result<(f64, f64)> {
    let aware = options.missing_aware;
    let (epsilon, delta) =
        crate::synth::kamino::release::rows_budget_and_strategy(name(aware), budget, aware, missing)?;
    let sizes: Vec<usize> = domain.columns().iter().map(|c| c.size()).collect();
    options.check(&sizes)?;
    super::check_budget(epsilon, delta)?;
    Ok((epsilon, delta))
}

/// Runs DP-MisGAN or DP-GAN for `req` (the caller has checked the budget
/// and `--multiple`).
pub(crate) async fn run(
    ctx: &datafusion::execution::context::SessionContext,
    req: &SynthRequest,
    missing_aware: bool,
    progress: &dyn Fn(&str),
) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    let options = GanOptions { missing_aware, ..req.options.gan };
    let domain = req.dataset.domain().clone();
    let (epsilon, delta) = check_public(&domain, &req.budget, &options, req.missing)?;
    let name = name(missing_aware);
    let loss = PrivacyLoss::Approx { epsilon, delta };
    let (mut rng, ledger_state) = begin_release_loss(req, name, loss, epsilon, progress)?;

    // Protected data is read from here on: a failure is charged and
    // reported without its cause (docs/PRIVACY.md §1).
    let released = async {
        let t0 = Instant::now();
        let table = read_codes(ctx, req, &domain).await?;
        let t_read = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        // The settings were checked before the read, so a failure here may
        // depend on the data: its cause is not reported.
        let fitted = fit(&table, &options, epsilon, delta, &mut rng, progress)
            .map_err(|_: GanError| SynthError::GanFailed(name))?;
        drop(table);
        let t_fit = t1.elapsed().as_secs_f64();
        // Post-processing from here on.
        let t2 = Instant::now();
        if let Some(path) = &req.model_out {
            let file = GeneratorFile {
                format: "dpflow-gan-generator-v1".into(),
                mechanism: name.into(),
                columns: domain.names().iter().map(|n| n.to_string()).collect(),
                model: fitted.model.clone(),
            };
            let json = serde_json::to_vec(&file).map_err(|source| SynthError::Json { what: "the model", source })?;
            crate::io::write_bytes(ctx, path, json)
                .await
                .map_err(|e| SynthError::WriteModel { path: path.clone(), source: Box::new(e) })?;
        }
        let rows = req.rows.unwrap_or(fitted.model.rows.round().max(0.0) as u64);
        // The generator streams through `SyntheticExec` (chunks seeded from
        // one secret, so a retried task on a cluster regenerates its rows);
        // m sets from the one model, not noise-aware (the record says so).
        let m = req.options.multiple;
        // The sampling seed: a fresh OS draw (from the release's stream only
        // under --unsafe-seed, so a seeded run repeats), as for the marginal
        // models in `run.rs`.
        let seed = match req.unsafe_seed {
            Some(_) => rand::Rng::next_u64(&mut rng),
            None => rand::Rng::next_u64(&mut dpflow_udfs::noise::DpRng::from_os()?),
        };
        let plans = vec![fitted.model.plan(domain.clone(), req.decode); m];
        let written = crate::synth::run::write_sets(ctx, plans, rows, &req.out, seed, vec![]).await? / m as u64;
        let seconds = TimingRecord { answers: t_read, fit: t_fit, generate: t2.elapsed().as_secs_f64() };
        Ok::<_, SynthError>((fitted, written, seconds))
    }
    .await;
    let (fitted, written, seconds) = crate::synth::dips::release::settle(ledger_state.as_ref(), released)?;
    let mut outputs = vec![req.out.clone()];
    outputs.extend(req.model_out.clone());
    let ledger_charge = crate::synth::run::commit_release(ledger_state)?;
    let record = record(req, &options, epsilon, delta, &fitted, written, seconds, ledger_charge, outputs);
    save_record(ctx, req, &record).await?;
    Ok(record)
}

#[allow(clippy::too_many_arguments)]
fn record(
    req: &SynthRequest,
    o: &GanOptions,
    epsilon: f64,
    delta: f64,
    fitted: &GanFit,
    written: u64,
    seconds: TimingRecord,
    ledger_charge: Option<i64>,
    outputs: Vec<String>,
) -> SynthRecord {
    let name = name(o.missing_aware);
    let orders = [fitted.curve[0].0];
    let curve = |c: Vec<(f64, f64)>| PrivacyLoss::Rdp { curve: c };
    let sum = crate::neural::dpsgd::NoisySum::new(fitted.critic_parameters, o.clip, 1.0);
    let sensitivity = sum.sensitivity_units() * 2f64.powi(sum.grid_exponent());
    let mechanisms = vec![
        MechanismRecord {
            mechanism: "discrete-gaussian".into(),
            target: if o.missing_aware { "rows" } else { "rows and complete rows" }.into(),
            sensitivity: Some(super::counts_sensitivity(o)),
            noise: None,
            loss: curve(crate::privacy::rdp::gaussian_curve(fitted.counts_sigma, &orders).unwrap_or_default()),
            params: serde_json::json!({ "noise_multiplier": fitted.counts_sigma }),
        },
        MechanismRecord {
            mechanism: "dp-sgd".into(),
            target: if o.missing_aware { "data and mask critics" } else { "data critic (complete rows)" }.into(),
            sensitivity: Some(sensitivity),
            noise: None,
            loss: curve(
                crate::privacy::rdp::sampled_discrete_gaussian_curve(fitted.rate, fitted.sigma, fitted.steps, &orders)
                    .unwrap_or_default(),
            ),
            params: serde_json::json!({
                "noise_multiplier": fitted.sigma, "sampling_rate": fitted.rate, "steps": fitted.steps,
                "expected_batch": fitted.batch, "clip": o.clip, "parameters": fitted.critic_parameters,
            }),
        },
    ];
    let mut notes = vec![
        format!(
            "{name} ({}): WGAN with a data-free gradient penalty (λ = {}, at points between generated and random \
             rows), generators and critics of two hidden layers of {} units, latent dimension {}, Gumbel-softmax \
             τ = {}; {} critic steps (expected batch {:.0}, clip {}, Adam lr {}), a generator step every {} critic \
             steps",
            if o.missing_aware { "000 Alg 1, MisGAN" } else { "complete-row baseline" },
            o.penalty,
            o.hidden,
            o.latent,
            o.temperature,
            fitted.steps,
            fitted.batch,
            o.clip,
            o.learning_rate,
            o.critic_steps
        ),
        format!(
            "privacy: the critics are trained with DP-SGD (one row's gradient for {} clipped jointly; discrete \
             Gaussian noise, multiplier {:.4}; Poisson subsampling, Zhu & Wang 2019 Thm 6), the generators only \
             read the critics; not 000 Thm 4.7's generator-gradient accounting, which does not bound the loss \
             (docs/PRIVACY.md §9). The counts and the critics add at the order α = {} fixed from (ε, δ) before \
             the read (a Rényi filter); converted once at δ = {delta:e}: ε = {:.6} of {epsilon}; add/remove-one \
             neighbours",
            if o.missing_aware { "both critics" } else { "the critic" },
            fitted.sigma,
            fitted.curve[0].0,
            fitted.epsilon
        ),
    ];
    notes.push(if o.missing_aware {
        format!(
            "{name}: every row is used, incomplete ones through the mask (the data critic sees only observed \
             cells); the mask generator is not released; the synthetic data has no nulls"
        )
    } else {
        format!("{name}: rows with a null in any column were left out (the complete-row baseline)")
    });
    let amplification_note = if o.missing_aware {
        format!("{name}: no MCAR amplification: every row is read (with its mask), so nothing is subsampled")
    } else {
        format!("{name}: {COMPLETE_ROW_NOTE}")
    };
    let spent = Spent { epsilon, epsilon_spent: fitted.epsilon, written, seconds, ledger_charge };
    row_record(req, name, o.missing_aware, spent, mechanisms, notes, outputs, amplification_note)
}
