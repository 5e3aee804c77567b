//! Running a synthesizer end to end: budget and ledger, exact answers in one
//! scan, fit, streaming generation to Parquet, model and release record.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::ExecutionPlan;
use dpflow_udfs::domain::{DecodeMode, Domain};
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::synth::{SamplingPlan, SyntheticExec};
use serde::{Deserialize, Serialize};

use super::compress::Compression;
use super::{Answers, FitContext, FitMetadata, Fitted, SynthOptions, Synthesizer, Workload};
use crate::dataset::Dataset;
use crate::io::write_stream;
use crate::measure::ReleaseAccountant;
use crate::pgm::{GraphicalModel, ModelFile, sampling_plan};
use crate::privacy::{Budget, Ledger, MechanismRecord, PrivacyFilter, PrivacyLoss};

/// Available synthesizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// AIM (001 Alg 4) with error bounds.
    Aim,
    /// MWEM+PGM (001 Alg 1).
    Mwem,
    /// MST (NOTES §4).
    Mst,
    /// Independent 1-way marginals.
    Independent,
}

impl Mechanism {
    /// The implementation.
    pub fn synthesizer(&self) -> Box<dyn Synthesizer + Send + Sync> {
        match self {
            Mechanism::Aim => Box::new(super::aim::Aim::default()),
            Mechanism::Mwem => Box::new(super::mwem::MwemPgm),
            Mechanism::Mst => Box::new(super::mst::Mst),
            Mechanism::Independent => Box::new(super::independent::Independent),
        }
    }
}

/// A saved model: DP post-processing, safe to publish; sampling needs no data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedModel {
    /// Format tag.
    pub format: String,
    /// The public domain.
    pub domain: Domain,
    /// Model over (possibly compressed) codes.
    pub model: ModelFile,
    /// Compression of codes (MST).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Mechanism that produced it.
    pub mechanism: String,
}

impl SavedModel {
    /// Loads and validates a saved model.
    pub fn load(path: &str) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading model {path}"))?;
        let mut m: SavedModel =
            serde_json::from_slice(&bytes).with_context(|| format!("{path}: not a dpflow model"))?;
        if m.format != "dpflow-model-v1" {
            bail!("{path}: unsupported model format {:?}", m.format);
        }
        m.domain = m.domain.reindex().map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
        Ok(m)
    }

    /// The sampling plan over the domain's codes.
    pub fn sampling_plan(&self, decode: DecodeMode) -> Result<SamplingPlan> {
        let model: GraphicalModel = self.model.clone().into_model().map_err(anyhow::Error::msg)?;
        plan_for(&model, self.compression.as_ref(), &self.domain, decode)
    }

    /// The model's (noisy, DP) estimate of the number of rows.
    pub fn total(&self) -> f64 {
        self.model.total
    }
}

/// Sampling plan for a fitted model, undoing any compression.
pub fn plan_for(
    model: &GraphicalModel,
    compression: Option<&Compression>,
    domain: &Domain,
    decode: DecodeMode,
) -> Result<SamplingPlan> {
    match compression {
        None => sampling_plan(model, domain, decode).map_err(anyhow::Error::msg),
        Some(c) => {
            // Build over a stand-in domain of compressed sizes, then expand.
            let stand_in = Domain::new(
                c.sizes()
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| dpflow_udfs::domain::Column {
                        name: format!("c{i}"),
                        kind: dpflow_udfs::domain::ColumnKind::Integer { edges: (0..=s as i64).collect() },
                        nullable: false,
                        null_tokens: vec![],
                        out_of_domain: dpflow_udfs::domain::OutOfDomain::Error,
                    })
                    .collect(),
            )
            .map_err(anyhow::Error::msg)?;
            let plan = sampling_plan(model, &stand_in, decode).map_err(anyhow::Error::msg)?;
            Ok(c.expand_plan(plan, &domain.cardinalities(), domain.clone()))
        }
    }
}

/// A streaming synthetic-data plan for `rows` rows.
pub fn synthetic_exec(plan: SamplingPlan, rows: u64, seed: u64) -> Result<Arc<dyn ExecutionPlan>> {
    let parts = std::thread::available_parallelism().map_or(2, |n| n.get());
    Ok(Arc::new(SyntheticExec::try_new(Arc::new(plan), rows, parts, 1 << 16, seed)?))
}

/// The inputs of one synthesis run.
#[derive(Debug, Clone)]
pub struct SynthRequest {
    /// The data.
    pub dataset: Dataset,
    /// Synthesizer.
    pub mechanism: Mechanism,
    /// Budget of this release.
    pub budget: Budget,
    /// Workload spec.
    pub workload: String,
    /// Rows to generate (default: the model's noisy total).
    pub rows: Option<u64>,
    /// Synthetic Parquet output.
    pub out: String,
    /// Model output.
    pub model_out: Option<String>,
    /// Release record output (default: `<out>.record.json` next to a local output).
    pub record_out: Option<String>,
    /// Ledger file and dataset name.
    pub ledger: Option<(String, String)>,
    /// Release id (ledger idempotency).
    pub release_id: Option<String>,
    /// Test/benchmark seed (never for real releases).
    pub unsafe_seed: Option<u64>,
    /// Options.
    pub options: SynthOptions,
    /// Decode numeric bins as midpoints instead of uniform draws.
    pub decode: DecodeMode,
}

/// The release record of a synthesis run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SynthRecord {
    /// dpflow version.
    pub dpflow_version: String,
    /// Mechanism.
    pub mechanism: String,
    /// Dataset name.
    pub dataset: String,
    /// Budget given.
    pub budget: Budget,
    /// zCDP ρ the mechanism ran with.
    pub rho: f64,
    /// ρ actually charged (sum of every mechanism; ≤ ρ).
    pub rho_spent: f64,
    /// Workload spec.
    pub workload: String,
    /// Rows written.
    pub rows: u64,
    /// Every mechanism invocation with its noise scale and loss.
    pub mechanisms: Vec<MechanismRecord>,
    /// Fit metadata (measurements, rounds, error bounds, notes).
    pub fit: FitMetadata,
    /// Output locations.
    pub outputs: Vec<String>,
    /// Seconds: exact answers, fit, generation.
    pub seconds: TimingRecord,
    /// The unsafe seed, when one was used (the release is then NOT private).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsafe_seed: Option<u64>,
    /// Ledger charge, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_charge: Option<i64>,
}

/// Timing of the phases.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimingRecord {
    /// Computing exact answers (one scan).
    pub answers: f64,
    /// Fitting.
    pub fit: f64,
    /// Generating and writing.
    pub generate: f64,
}

/// Runs the synthesizer on exact answers already computed (crate-private data).
pub(crate) fn fit_with_answers(
    synth: &dyn Synthesizer,
    domain: &Domain,
    answers: &Answers,
    workload: &Workload,
    rho: f64,
    options: &SynthOptions,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
) -> Result<(Fitted, ReleaseAccountant)> {
    let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(Budget::Zcdp { rho }));
    let fitted = {
        let mut ctx = FitContext {
            domain,
            sizes: domain.cardinalities(),
            answers,
            accountant: &mut accountant,
            rng,
            workload,
            rho,
            options,
            progress,
        };
        synth.fit(&mut ctx)?
    };
    Ok((fitted, accountant))
}

/// Computes exact answers for `sets` in one scan.
pub(crate) async fn exact_answers(ctx: &SessionContext, dataset: &Dataset, sets: &[Vec<usize>]) -> Result<Answers> {
    let names = dataset.domain().names();
    let queries: Vec<(Vec<String>, NullMode)> =
        sets.iter().map(|s| (s.iter().map(|&a| names[a].to_string()).collect(), NullMode::Cells)).collect();
    let exact = dataset.exact_marginals(ctx, &queries).await?;
    let mut answers = Answers { sizes: dataset.domain().cardinalities(), map: Default::default() };
    for (s, m) in sets.iter().zip(exact) {
        answers.map.insert(s.clone(), m.counts.iter().map(|&c| c as f64).collect());
    }
    Ok(answers)
}

fn rho_of(budget: &Budget) -> Result<f64> {
    budget
        .as_rho()
        .context("synthesizers account in zCDP: give --epsilon with --delta, or --rho (a pure-ε budget cannot pay for Gaussian noise)")
}

/// Runs a synthesis request end to end.
pub async fn run_synth(ctx: &SessionContext, req: &SynthRequest, progress: &dyn Fn(&str)) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    let rho = rho_of(&req.budget)?;
    let mut rng = DpRng::new(req.unsafe_seed)?;
    let domain = req.dataset.domain().clone();
    let workload = Workload::parse(&req.workload, &domain)?;
    let synth = req.mechanism.synthesizer();

    // Reserve the whole release budget in the ledger before touching data.
    let mut ledger_state = None;
    if let Some((file, ds)) = &req.ledger {
        let mut ledger = Ledger::open(file)?;
        let release_id = req
            .release_id
            .clone()
            .unwrap_or_else(|| format!("synth-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")));
        let record = MechanismRecord {
            mechanism: synth.name().to_string(),
            target: format!("synthetic data of {}", req.dataset.name),
            sensitivity: None,
            noise: None,
            loss: PrivacyLoss::Zcdp { rho },
            params: serde_json::json!({ "workload": req.workload }),
        };
        let r = ledger.reserve(ds, &release_id, &[record], None)?;
        progress(&format!("ledger: reserved ρ={rho:.6} as charge #{} ({:.6} left)", r.charge_id, r.remaining));
        ledger_state = Some((ledger, r.charge_id));
    }
    let release = |ledger_state: &mut Option<(Ledger, i64)>, why: &str| {
        if let Some((l, id)) = ledger_state.take() {
            let _ = l.release(id, why);
        }
    };

    let t0 = Instant::now();
    let required = synth.required_marginals(&domain, &workload);
    let answers = match exact_answers(ctx, &req.dataset, &required).await {
        Ok(a) => a,
        Err(e) => {
            // Nothing was computed from the data that could leak: a clean failure.
            release(&mut ledger_state, &format!("failed before fitting: {e:#}"));
            return Err(e);
        }
    };
    let t_answers = t0.elapsed().as_secs_f64();
    progress(&format!("computed {} exact marginals in {t_answers:.1}s", required.len()));

    let t1 = Instant::now();
    let (fitted, accountant) =
        fit_with_answers(synth.as_ref(), &domain, &answers, &workload, rho, &req.options, &mut rng, progress)?;
    drop(answers);
    let t_fit = t1.elapsed().as_secs_f64();
    let rho_spent = accountant.filter().spent_amount();

    let t2 = Instant::now();
    let total = fitted.model.total;
    let rows = req.rows.unwrap_or(total.round().max(1.0) as u64);
    let plan = plan_for(&fitted.model, fitted.compression.as_ref(), &domain, req.decode)?;
    let seed = match req.unsafe_seed {
        Some(s) => s,
        None => {
            let mut r = DpRng::from_os()?;
            rand::Rng::next_u64(&mut r)
        }
    };
    let exec = synthetic_exec(plan, rows, seed)?;
    let stream = datafusion::physical_plan::execute_stream(exec, ctx.task_ctx())?;
    let written = write_stream(ctx, &req.out, stream).await?;
    let mut outputs = vec![req.out.clone()];
    if let Some(mo) = &req.model_out {
        let saved = SavedModel {
            format: "dpflow-model-v1".into(),
            domain: domain.clone(),
            model: ModelFile::from(&fitted.model),
            compression: fitted.compression.clone(),
            mechanism: synth.name().into(),
        };
        crate::io::write_bytes(ctx, mo, serde_json::to_vec(&saved)?)
            .await
            .with_context(|| format!("writing model {mo}"))?;
        outputs.push(mo.clone());
    }
    let t_gen = t2.elapsed().as_secs_f64();

    // Outputs are durable: commit the charge.
    let mut ledger_charge = None;
    if let Some((l, id)) = ledger_state.take() {
        l.commit(id)?;
        ledger_charge = Some(id);
    }
    let record = SynthRecord {
        dpflow_version: env!("CARGO_PKG_VERSION").into(),
        mechanism: synth.name().into(),
        dataset: req.dataset.name.clone(),
        budget: req.budget,
        rho,
        rho_spent,
        workload: req.workload.clone(),
        rows: written,
        mechanisms: accountant.into_records(),
        fit: fitted.metadata,
        outputs,
        seconds: TimingRecord { answers: t_answers, fit: t_fit, generate: t_gen },
        unsafe_seed: req.unsafe_seed,
        ledger_charge,
    };
    let record_path = req.record_out.clone().unwrap_or_else(|| format!("{}.record.json", req.out));
    if !record_path.is_empty() {
        crate::io::write_bytes(ctx, &record_path, serde_json::to_vec_pretty(&record)?).await?;
    }
    Ok(record)
}

fn budget_check(b: &Budget) -> Result<()> {
    b.validate().map_err(anyhow::Error::msg)
}
