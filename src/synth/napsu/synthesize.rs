//! NAPSU-MQ end to end (003 Alg. 1): measure the workload's marginals once
//! (charged), save the noisy statistics in the release record, commit the
//! charge, then post-process: posterior, m draws, m synthetic sets.
//!
//! The order is the point. Once the statistics are saved the release has
//! happened, so the ledger charge is committed *before* inference; if
//! inference then fails (a mode search that does not converge, a Hessian
//! that is not positive definite, NUTS chains with R̂ > 1.05), the error
//! is post-processing of DP output and may say what went wrong, nothing
//! else is published, and `--from-record` re-runs inference on the saved
//! statistics for free. A failure *before* the statistics are saved is an
//! ordinary charged failure with its cause withheld (docs/PRIVACY.md §1).

use std::time::Instant;

use datafusion::execution::context::SessionContext;
use dpflow_udfs::domain::DecodeMode;
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::DpRng;
use serde::{Deserialize, Serialize};

use super::laplace::laplace;
use super::likelihood::Posterior;
use super::release::{InferenceReport, NapsuOptions, NoisyStatistics, checked_model, max_ent, posterior_models};
use crate::dataset::CodeSource;
use crate::measure::ReleaseAccountant;
use crate::missing::Strategy;
use crate::privacy::{PrivacyFilter, Share};
use crate::synth::run::{
    SET_COLUMN, SynthRecord, SynthRequest, TimingRecord, budget_check, exact_answers_from, plan_for, reserve, rho_of,
    write_sets,
};
use crate::synth::{FitContext, FitMetadata, Fitted, MeasurementLog, Result, SynthError, Synthesizer, Workload};

/// NAPSU-MQ's part of a release record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NapsuRecord {
    /// The released noisy statistics (what inference reads).
    pub statistics: NoisyStatistics,
    /// What inference did; absent while only the statistics are saved
    /// (or when inference failed: re-run it with `--from-record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<InferenceReport>,
    /// The record whose statistics this run post-processed (spending nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_record: Option<String>,
}

/// NAPSU-MQ behind the [`Synthesizer`] interface: one model, at the
/// posterior mode (no multiple synthesis; the crate-private `run` does that).
#[derive(Debug, Clone, Copy, Default)]
pub struct NapsuMq;

fn scopes_of(workload: &Workload) -> Vec<Vec<usize>> {
    workload.queries.iter().map(|q| q.attrs.clone()).collect()
}

/// Measures every query marginal once with discrete Gaussian noise σ =
/// √(k/(2ρ)): L2 sensitivity 1 each under add/remove-one, √k together, so
/// the k charges add up to ρ (see [`super::release`]).
fn measure(ctx: &mut FitContext<'_>) -> Result<(NoisyStatistics, Vec<MeasurementLog>)> {
    let scopes = scopes_of(ctx.workload);
    let sigma = (scopes.len() as f64 / (2.0 * ctx.rho)).sqrt();
    let mut stats = Vec::new();
    let mut logs = Vec::with_capacity(scopes.len());
    for s in &scopes {
        stats.extend(ctx.measure(s, sigma)?.values);
        logs.push(MeasurementLog::new(ctx.names(s), crate::synth::gauss(sigma), 0, ctx.options.confidence));
    }
    Ok((NoisyStatistics::new(ctx.domain, &scopes, sigma, stats), logs))
}

impl Synthesizer for NapsuMq {
    fn name(&self) -> &'static str {
        "napsu-mq"
    }

    fn required_marginals(&self, _domain: &crate::domain::Domain, workload: &Workload) -> Vec<Vec<usize>> {
        scopes_of(workload)
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted> {
        let (stats, measurements) = measure(ctx)?;
        let scopes = stats.scopes()?;
        let me = max_ent(ctx.domain, &scopes, ctx.options.napsu.max_features)?;
        let post = Posterior::new(me.clone(), stats.statistics.clone(), stats.rows, stats.sigma)?;
        let fit = laplace(&post, &ctx.options.napsu.laplace)?;
        let mut model = me.model(&fit.mean);
        model.total = stats.rows;
        let notes = vec!["napsu-mq: one model at the posterior mode (not noise-aware)".to_string()];
        Ok(Fitted { model, compression: None, metadata: FitMetadata { measurements, notes, ..Default::default() } })
    }
}

/// NUTS settings that cannot run, refused before anything is charged.
fn check_nuts(opts: &NapsuOptions) -> Result<()> {
    if opts.inference.is_nuts() && (opts.nuts.chains == 0 || opts.nuts.draws < 4) {
        return Err(super::NapsuError::Query("NUTS needs at least one chain and four draws per chain".into()).into());
    }
    Ok(())
}

/// The model domain and how its answers are read under `missing`.
fn model_view(req: &SynthRequest) -> Result<(crate::domain::Domain, NullMode, CodeSource)> {
    let domain = req.dataset.domain();
    match req.missing {
        Strategy::Reproduce => Ok((domain.clone(), NullMode::Cells, CodeSource::Plain)),
        Strategy::CompleteRow => Ok((domain.without_nulls(), NullMode::Observed, CodeSource::CompleteRows)),
        other => Err(SynthError::NapsuMissing(other.to_string())),
    }
}

async fn write_record(ctx: &SessionContext, path: &str, record: &SynthRecord) -> Result<()> {
    let json =
        serde_json::to_vec_pretty(record).map_err(|source| SynthError::Json { what: "the release record", source })?;
    Ok(crate::io::write_bytes(ctx, path, json).await?)
}

/// `dpflow synth --mechanism napsu-mq`: measure, save, commit, then
/// [`post_process`].
pub(crate) async fn run(ctx: &SessionContext, req: &SynthRequest, progress: &dyn Fn(&str)) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    let rho = rho_of(&req.budget)?;
    // Every public input is checked before anything is charged or read.
    let (model_domain, mode, source) = model_view(req)?;
    crate::synth::structure::rules(&model_domain)?;
    let workload = Workload::parse(&req.workload, &model_domain)?;
    let scopes = scopes_of(&workload);
    checked_model(&model_domain, &scopes, &req.options.napsu)?;
    if req.unsafe_seed.is_some() && req.ledger.is_some() {
        return Err(SynthError::UnsafeSeed);
    }
    if let Some(why) = req.dataset.domain().dp_read_refusal() {
        return Err(SynthError::DpReadRefused { dataset: req.dataset.name.clone(), why });
    }
    let record_path = req.record_out.clone().unwrap_or_else(|| format!("{}.record.json", req.out));
    if record_path.is_empty() {
        return Err(SynthError::NapsuNeedsRecord);
    }
    if req.model_out.is_some() {
        return Err(SynthError::NapsuModelOut);
    }
    check_nuts(&req.options.napsu)?;
    let mut rng = DpRng::new(req.unsafe_seed)?;
    let ledger_state = reserve(req, "napsu-mq", Share::Rho(rho), progress)?;
    let ledger_charge = ledger_state.as_ref().map(|(_, id)| *id);

    // Protected data is read from here until the statistics are saved: a
    // failure in between is charged and reported without its cause.
    let measured = async {
        let t0 = Instant::now();
        let (answers, _) = exact_answers_from(ctx, &req.dataset, &scopes, mode, &source).await?;
        let t_answers = t0.elapsed().as_secs_f64();
        let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(Share::Rho(rho).as_budget()));
        let (statistics, measurements) = measure(&mut FitContext {
            domain: &model_domain,
            sizes: model_domain.cardinalities(),
            answers: &answers,
            accountant: &mut accountant,
            rng: &mut rng,
            workload: &workload,
            rho,
            epsilon: 0.0,
            options: &req.options,
            progress,
            observed: None,
            step: Default::default(),
        })?;
        drop(answers);
        let m = req.options.multiple;
        let record = SynthRecord {
            dpflow_version: env!("CARGO_PKG_VERSION").into(),
            mechanism: "napsu-mq".into(),
            dataset: req.dataset.name.clone(),
            budget: req.budget,
            rho: Some(rho),
            rho_spent: Some(accountant.filter().spent_amount()),
            epsilon: None,
            epsilon_spent: None,
            missing: req.missing.to_string(),
            amplification: None,
            amplification_note: req
                .amplification
                .as_ref()
                .map(|_| "napsu-mq: MCAR amplification is not computed for this mechanism".to_string()),
            workload: req.workload.clone(),
            rows: 0,
            mechanisms: accountant.into_records(),
            fit: FitMetadata {
                measurements,
                notes: vec![format!(
                    "napsu-mq: {} marginals measured once, σ = {sigma:.4} per cell, L2 sensitivity √k under \
                     add/remove-one neighbours; n̂ = {rows:.1} from the noisy marginals",
                    scopes.len(),
                    sigma = statistics.sigma,
                    rows = statistics.rows
                )],
                ..Default::default()
            },
            outputs: vec![],
            seconds: TimingRecord { answers: t_answers, ..Default::default() },
            unsafe_seed: req.unsafe_seed,
            ledger_charge,
            multiple: (m > 1).then_some(m),
            noise_aware: (m > 1).then_some(true),
            set_column: (m > 1).then(|| SET_COLUMN.to_string()),
            napsu: Some(NapsuRecord { statistics, inference: None, from_record: None }),
        };
        write_record(ctx, &record_path, &record).await?;
        Ok::<_, SynthError>(record)
    }
    .await;
    let mut record = match measured {
        Ok(r) => r,
        Err(e) => {
            let ledger = ledger_state.as_ref().map(|(l, id)| (l, *id));
            return Err(crate::privacy::charge_failure("napsu-mq measurement", ledger, e));
        }
    };
    // The statistics are durable: they are the release.
    crate::synth::run::commit_release(ledger_state)?;
    progress(&format!("napsu-mq: noisy statistics saved in {record_path}; the rest is post-processing"));
    let post = Post {
        out: &req.out,
        rows: req.rows,
        multiple: req.options.multiple,
        options: &req.options.napsu,
        decode: req.decode,
        unsafe_seed: req.unsafe_seed,
    };
    post_process(ctx, &mut record, &record_path, &record_path, &post, progress).await?;
    Ok(record)
}

/// What post-processing writes, and how.
#[derive(Debug, Clone)]
pub struct Post<'a> {
    /// Synthetic output (one file; a `_set` column when m > 1).
    pub out: &'a str,
    /// Rows per set (default: n̂).
    pub rows: Option<u64>,
    /// m.
    pub multiple: usize,
    /// Inference settings.
    pub options: &'a NapsuOptions,
    /// How numeric bins are decoded.
    pub decode: DecodeMode,
    /// Seed for the draws and the rows (reproducibility only: this is
    /// post-processing, so it does not weaken the guarantee).
    pub unsafe_seed: Option<u64>,
}

/// Inference and generation from `record`'s saved statistics (kept at
/// `saved_at`, which errors point to); writes the completed record to
/// `record_path` unless it is empty. Spends nothing.
pub async fn post_process(
    ctx: &SessionContext,
    record: &mut SynthRecord,
    saved_at: &str,
    record_path: &str,
    post: &Post<'_>,
    progress: &dyn Fn(&str),
) -> Result<()> {
    if post.multiple == 0 {
        return Err(SynthError::NoSets);
    }
    let napsu = record.napsu.as_mut().ok_or_else(|| SynthError::NotNapsuRecord { path: saved_at.into() })?;
    let mut rng = DpRng::new(post.unsafe_seed)?;
    let (models, report) = posterior_models(&napsu.statistics, post.options, post.multiple, &mut rng, progress)
        .map_err(|source| SynthError::NapsuInference { record: saved_at.into(), source })?;
    let domain = napsu.statistics.domain.clone();
    let rules = crate::synth::structure::rules(&domain)?;
    let plans = models.iter().map(|m| plan_for(m, None, &domain, post.decode)).collect::<Result<Vec<_>>>()?;
    let rows = post.rows.unwrap_or(napsu.statistics.rows.round().max(1.0) as u64);
    let seed = rand::Rng::next_u64(&mut rng);
    record.seconds.fit = report.seconds;
    napsu.inference = Some(report);
    progress(&format!("napsu-mq: writing {} set(s) of {rows} rows", post.multiple));
    let t = Instant::now();
    let written = write_sets(ctx, plans, rows, post.out, seed, rules).await?;
    record.seconds.generate = t.elapsed().as_secs_f64();
    record.rows = written / post.multiple as u64;
    record.outputs = vec![post.out.to_string()];
    let m = post.multiple;
    record.multiple = (m > 1).then_some(m);
    record.noise_aware = (m > 1).then_some(true);
    record.set_column = (m > 1).then(|| SET_COLUMN.to_string());
    if record_path.is_empty() {
        return Ok(());
    }
    write_record(ctx, record_path, record).await
}

/// `dpflow synth --from-record FILE`: post-processes the noisy statistics
/// saved by an earlier NAPSU-MQ release with new settings, spending
/// nothing. Writes its own record (`record_out`, default `<out>.record.json`)
/// naming the record it read.
pub async fn from_record(
    ctx: &SessionContext,
    path: &str,
    record_out: Option<&str>,
    post: &Post<'_>,
    progress: &dyn Fn(&str),
) -> Result<SynthRecord> {
    let bytes = crate::io::read_bytes(ctx, path)
        .await
        .map_err(|e| SynthError::ReadRecord { path: path.into(), source: Box::new(e) })?;
    let mut record: SynthRecord =
        serde_json::from_slice(&bytes).map_err(|source| SynthError::NotARecord { path: path.into(), source })?;
    check_nuts(post.options)?;
    let napsu = record.napsu.as_mut().ok_or_else(|| SynthError::NotNapsuRecord { path: path.into() })?;
    // The domain's lookup index is not serialised: rebuild it (which also
    // checks a hand-edited domain), then refuse bad statistics before
    // anything is written.
    napsu.statistics.domain = napsu.statistics.domain.clone().reindex()?;
    napsu.statistics.scopes()?;
    napsu.inference = None;
    napsu.from_record = Some(path.to_string());
    // This run charged nothing: the accounting fields would double-count if
    // records were summed. What the statistics cost stays in `statistics.rho`.
    record.mechanisms.clear();
    record.rho_spent = Some(0.0);
    record.ledger_charge = None;
    record.fit.notes.push(format!(
        "post-processing of the noisy statistics in {path} (ρ = {:.6} charged there): this run spends nothing{}",
        napsu.statistics.rho,
        post.unsafe_seed.map_or(String::new(), |s| format!("; post-processing seed {s}"))
    ));
    let out_record = record_out.map_or_else(|| format!("{}.record.json", post.out), str::to_string);
    post_process(ctx, &mut record, path, &out_record, post, progress).await?;
    Ok(record)
}
