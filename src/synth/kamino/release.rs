//! `dpflow synth --mechanism kamino|kaminoi`: the public checks, the ledger
//! reservation, the read of the coded columns, the fit ([`super::fit`]) and
//! the synthetic sets, streamed to the output.
//!
//! The charge is (ε, δ): the whole run's RDP curve converts to at most the
//! budget (docs/PRIVACY.md §8), so a (ε, δ) budget is required. Everything
//! after the fit is post-processing of the released classifiers. The input
//! is held as one u32 code per cell (4·rows·columns bytes); the synthetic
//! sets are generated and written in batches.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt32Type;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use dpflow_udfs::domain::{BatchEncoder, DecodeMode, EncodeExec, decoded_schema};
use dpflow_udfs::noise::DpRng;
use futures::StreamExt;

use super::{CodedTable, KaminoError, KaminoFit, KaminoModel, KaminoOptions, fit};
use crate::domain::Domain;
use crate::missing::Strategy;
use crate::privacy::{Budget, MechanismRecord, PrivacyLoss};
use crate::synth::run::{
    SET_COLUMN, SynthRecord, SynthRequest, TimingRecord, begin_release_loss, budget_check, save_record, write_streams,
};
use crate::synth::{FitMetadata, Result, SynthError};

/// Rows per generated batch.
const BATCH: usize = 1 << 16;

/// The mechanism's name in records.
pub fn name(impute: bool) -> &'static str {
    if impute { "kaminoi" } else { "kamino" }
}

/// The checks every mechanism that trains on rows makes first: an (ε, δ)
/// budget, and the missing-data strategy it implies (`adaptive` when it uses
/// incomplete rows, `complete-row` otherwise; `reproduce` means the same).
pub(crate) fn rows_budget_and_strategy(
    mechanism: &'static str,
    budget: &Budget,
    uses_incomplete_rows: bool,
    missing: Strategy,
) -> Result<(f64, f64)> {
    let Budget::Approx { epsilon, delta } = *budget else {
        return Err(SynthError::KaminoBudget(mechanism, budget.describe()));
    };
    let implied = if uses_incomplete_rows { Strategy::Adaptive } else { Strategy::CompleteRow };
    if missing != implied && missing != Strategy::Reproduce {
        return Err(SynthError::KaminoMissing { mechanism, implied: implied.to_string(), given: missing.to_string() });
    }
    Ok((epsilon, delta))
}

/// The public checks of a run (also made by the pipeline spec check):
/// an (ε, δ) budget, no `--model-out`, the missing-data strategy the
/// mechanism implies, and the settings and classifier sizes.
pub fn check_public(
    domain: &Domain,
    budget: &Budget,
    options: &KaminoOptions,
    missing: Strategy,
    model_out: bool,
) -> Result<(f64, f64)> {
    let (epsilon, delta) = rows_budget_and_strategy(name(options.impute), budget, options.impute, missing)?;
    if model_out {
        return Err(SynthError::KaminoModelOut(name(options.impute)));
    }
    let names: Vec<String> = domain.names().iter().map(|n| n.to_string()).collect();
    let sizes: Vec<usize> = domain.columns().iter().map(|c| c.size()).collect();
    options.check(&names, &sizes)?;
    super::check_budget(epsilon, delta, sizes.len())?;
    Ok((epsilon, delta))
}

/// Runs Kamino (complete rows) or KaminoI for `req` (the caller has checked
/// the budget and `--multiple`).
pub(crate) async fn run(
    ctx: &SessionContext,
    req: &SynthRequest,
    impute: bool,
    progress: &dyn Fn(&str),
) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    let options = KaminoOptions { impute, ..req.options.kamino };
    let domain = req.dataset.domain().clone();
    let (epsilon, delta) = check_public(&domain, &req.budget, &options, req.missing, req.model_out.is_some())?;
    let name = name(impute);
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
        let fitted = fit(table, &options, epsilon, delta, &mut rng, progress)
            .map_err(|_: KaminoError| SynthError::KaminoFailed)?;
        let t_fit = t1.elapsed().as_secs_f64();
        // Post-processing from here on.
        let t2 = Instant::now();
        let rows = req.rows.unwrap_or(fitted.model.rows.round().max(0.0) as u64);
        let model: KaminoModel = fitted.model.clone();
        let written = write_sets(ctx, req, &domain, rows, move |n, r| model.sample(n, r), &mut rng).await?;
        let seconds = TimingRecord { answers: t_read, fit: t_fit, generate: t2.elapsed().as_secs_f64() };
        Ok::<_, SynthError>((fitted, written, seconds))
    }
    .await;
    let (fitted, written, seconds) = crate::synth::dips::release::settle(ledger_state.as_ref(), released)?;
    let ledger_charge = crate::synth::run::commit_release(ledger_state)?;
    let record = record(req, &options, epsilon, delta, &domain, &fitted, written, seconds, ledger_charge);
    save_record(ctx, req, &record).await?;
    Ok(record)
}

#[allow(clippy::too_many_arguments)]
fn record(
    req: &SynthRequest,
    o: &KaminoOptions,
    epsilon: f64,
    delta: f64,
    domain: &Domain,
    fitted: &KaminoFit,
    written: u64,
    seconds: TimingRecord,
    ledger_charge: Option<i64>,
) -> SynthRecord {
    let name = name(o.impute);
    let names = domain.names();
    let order: Vec<&str> = fitted.model.order.iter().map(|&c| names[c]).collect();
    // Every component at the one order α* the run is charged at (Rényi filter, docs/PRIVACY.md §8).
    let orders = [fitted.curve[0].0];
    let curve = |c: Vec<(f64, f64)>| PrivacyLoss::Rdp { curve: c };
    let p = names.len();
    let mut mechanisms = vec![
        MechanismRecord {
            mechanism: "discrete-gaussian".into(),
            target: "rows, complete rows and nulls per column".into(),
            sensitivity: Some(((p + 1) as f64).sqrt()),
            noise: None,
            loss: curve(crate::privacy::rdp::gaussian_curve(fitted.counts_sigma, &orders).unwrap_or_default()),
            params: serde_json::json!({ "noise_multiplier": fitted.counts_sigma }),
        },
        MechanismRecord {
            mechanism: "discrete-gaussian".into(),
            target: format!("histogram of {}", order[0]),
            sensitivity: Some(1.0),
            noise: None,
            loss: curve(crate::privacy::rdp::gaussian_curve(fitted.first_sigma, &orders).unwrap_or_default()),
            params: serde_json::json!({ "noise_multiplier": fitted.first_sigma }),
        },
    ];
    for (j, s) in fitted.schedule.iter().enumerate() {
        // One rounded example's L2 bound on the gradient scale: C + √d·γ/2.
        let sum = crate::neural::dpsgd::NoisySum::new(fitted.model.models[j].n_params(), o.clip, 1.0);
        let sensitivity = sum.sensitivity_units() * 2f64.powi(sum.grid_exponent());
        mechanisms.push(MechanismRecord {
            mechanism: "dp-sgd".into(),
            target: format!("classifier of {} given {}", order[j + 1], order[..=j].join(", ")),
            sensitivity: Some(sensitivity),
            noise: None,
            loss: curve(
                crate::privacy::rdp::sampled_discrete_gaussian_curve(s.rate, fitted.sgd_sigma, s.steps, &orders)
                    .unwrap_or_default(),
            ),
            params: serde_json::json!({
                "noise_multiplier": fitted.sgd_sigma, "sampling_rate": s.rate, "steps": s.steps,
                "expected_batch": s.batch, "clip": o.clip,
            }),
        });
    }
    let mut notes = vec![
        format!(
            "{name} (000 Alg 3): order {}; one MLP per column after the first (one-hot inputs, {} ReLU units), \
             trained with DP-SGD ({:.2} epochs, expected batch {}, clip {}, Adam lr {}), noise multiplier {:.4}",
            order.join(", "),
            o.hidden,
            o.epochs,
            o.batch,
            o.clip,
            o.learning_rate,
            fitted.sgd_sigma
        ),
        format!(
            "privacy: the RDP of the counts, the first histogram and every DP-SGD run (discrete Gaussian noise; \
             Poisson subsampling, Zhu & Wang 2019 Thm 6) add at the order α = {} fixed from (ε, δ) before the read \
             (a Rényi filter: the DP-SGD schedules follow the noisy counts); converted once at δ = {delta:e}: \
             ε = {:.6} of {epsilon}; add/remove-one neighbours",
            fitted.curve[0].0, fitted.epsilon
        ),
    ];
    notes.push(if o.impute {
        format!("{name}: each column's nulls filled by draws from its own classifier before the next one learns; the synthetic data has no nulls")
    } else {
        format!("{name}: rows with a null in any column were left out (the complete-row baseline)")
    });
    let amplification_note = if o.impute {
        format!(
            "{name}: no MCAR amplification is reported. 000 §5.2 use case 3 (Thm 5.12) gives p·ε for one \
             classifier, which is not a bound (ln(1 − p + p·e^ε) ≥ p·ε), and this run is charged as one RDP \
             filter at one order, with no per-component (ε, δ) to amplify; no RDP-filter amplification proof is \
             implemented (docs/PRIVACY.md §8). The guarantee for the ground truth is the nominal one (000 Thm 5.2)"
        )
    } else {
        format!("{name}: {}", COMPLETE_ROW_NOTE)
    };
    let spent = Spent { epsilon, epsilon_spent: fitted.epsilon, written, seconds, ledger_charge };
    row_record(req, name, o.impute, spent, mechanisms, notes, vec![req.out.clone()], amplification_note)
}

/// Why a complete-row row synthesizer (Kamino, DP-GAN) reports no MCAR ε̄
/// (000 §5.2 use case 1; docs/PRIVACY.md §8).
pub(crate) const COMPLETE_ROW_NOTE: &str = "no MCAR amplification is reported (000 §5.2 use case 1): the \
    counts read every row, and amplifying the rest of the RDP filter by p = Π(1 − φ_j) after two separate \
    (ε, δ) conversions gains only under heavy missingness (at ε = 3, δ = 1e−9: about 2.9 for p = 0.2, more \
    than the nominal 3 for p ≥ 0.3); no such figure is computed (docs/PRIVACY.md §8)";

/// What a row synthesizer's run spent and wrote (for [`row_record`]).
pub(crate) struct Spent {
    /// The budget's ε.
    pub epsilon: f64,
    /// ε of the charged RDP point at the budget's δ.
    pub epsilon_spent: f64,
    /// Rows per set written.
    pub written: u64,
    /// Timings.
    pub seconds: TimingRecord,
    /// The ledger charge, if any.
    pub ledger_charge: Option<i64>,
}

/// The release record of a row synthesizer charged (ε, δ) through an RDP
/// curve (Kamino/KaminoI here, the GANs in [`crate::synth::gan::release`]):
/// no ρ, the strategy its mechanism implies, and m sets drawn from one
/// model (not noise-aware).
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_record(
    req: &SynthRequest,
    name: &str,
    adaptive: bool,
    spent: Spent,
    mechanisms: Vec<MechanismRecord>,
    mut notes: Vec<String>,
    outputs: Vec<String>,
    amplification_note: String,
) -> SynthRecord {
    let m = req.options.multiple;
    if m > 1 {
        notes.push(format!("{name}: the {m} sets are drawn from one model; they are not noise-aware"));
    }
    SynthRecord {
        dpflow_version: env!("CARGO_PKG_VERSION").into(),
        mechanism: name.into(),
        dataset: req.dataset.name.clone(),
        budget: req.budget,
        // Not a zCDP mechanism: no ρ to report.
        rho: None,
        rho_spent: None,
        epsilon: Some(spent.epsilon),
        epsilon_spent: Some(spent.epsilon_spent),
        missing: if adaptive { Strategy::Adaptive } else { Strategy::CompleteRow }.to_string(),
        amplification: None,
        amplification_note: req.amplification.as_ref().map(|_| amplification_note),
        workload: req.workload.clone(),
        rows: spent.written,
        mechanisms,
        fit: FitMetadata { notes, ..Default::default() },
        outputs,
        seconds: spent.seconds,
        unsafe_seed: req.unsafe_seed,
        ledger_charge: spent.ledger_charge,
        multiple: (m > 1).then_some(m),
        noise_aware: (m > 1).then_some(false),
        set_column: (m > 1).then(|| SET_COLUMN.to_string()),
        napsu: None,
    }
}

/// Reads every column's codes (nulls as the column's null code). Shared
/// with the GANs ([`crate::synth::gan::release`]).
pub(crate) async fn read_codes(ctx: &SessionContext, req: &SynthRequest, domain: &Domain) -> Result<CodedTable> {
    let ds = &req.dataset;
    let domain = Arc::new(domain.clone());
    let names: Vec<&str> = domain.names();
    let read_err = |source| crate::dataset::DatasetError::Plan { location: ds.location.clone(), source };
    let df = ds.raw(ctx).await?.select_columns(&names).map_err(read_err)?;
    let plan = dpflow_udfs::unwind::catch_unwind_future(df.create_physical_plan()).await.map_err(read_err)?;
    let typed: Arc<dyn ExecutionPlan> = Arc::new(EncodeExec::typed(plan, domain.clone()).map_err(read_err)?);
    let mut encoder = BatchEncoder::new(domain.clone(), &typed.schema()).map_err(|_| SynthError::RawRead)?;
    let mut stream = dpflow_udfs::cluster::execute_stream(typed, ctx).await.map_err(read_err)?;
    let mut columns = vec![Vec::new(); names.len()];
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(read_err)?;
        let codes = encoder.encode(&batch).map_err(|_| SynthError::RawRead)?;
        if codes.num_rows() != batch.num_rows() {
            return Err(SynthError::RawRead);
        }
        for (c, col) in columns.iter_mut().enumerate() {
            col.extend_from_slice(codes.column(c).as_primitive::<UInt32Type>().values());
        }
    }
    Ok(CodedTable {
        names: names.iter().map(|n| n.to_string()).collect(),
        sizes: domain.columns().iter().map(|c| c.size()).collect(),
        columns,
    })
}

/// Writes `--multiple` synthetic sets of `rows` rows each, drawn by `sample`
/// (rows, rng → codes per column) with one generator per set (seeded from
/// `rng` under `--unsafe-seed`); returns the rows per set. (The GANs'
/// generator streams through `SyntheticExec` instead:
/// [`crate::synth::run::write_sets`].)
pub(crate) async fn write_sets(
    ctx: &SessionContext,
    req: &SynthRequest,
    domain: &Domain,
    rows: u64,
    sample: impl Fn(usize, &mut DpRng) -> Vec<Vec<u32>> + Clone + Send + 'static,
    rng: &mut DpRng,
) -> Result<u64> {
    let m = req.options.multiple;
    let mut streams = Vec::with_capacity(m);
    for _ in 0..m {
        let set_rng = DpRng::new(req.unsafe_seed.map(|_| rand::Rng::next_u64(rng)))?;
        streams.push(set_stream(domain.clone(), sample.clone(), rows, req.decode, set_rng));
    }
    Ok(write_streams(ctx, streams, &req.out).await? / m as u64)
}

/// One synthetic set of `rows` rows, generated by `sample` (rows, rng →
/// codes per column) and decoded in batches.
fn set_stream(
    domain: Domain,
    sample: impl Fn(usize, &mut DpRng) -> Vec<Vec<u32>> + Send + 'static,
    rows: u64,
    decode: DecodeMode,
    mut rng: DpRng,
) -> SendableRecordBatchStream {
    let schema = decoded_schema(&domain);
    let out_schema = schema.clone();
    let mut left = rows;
    let batches = std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let n = (left as usize).min(BATCH);
        left -= n as u64;
        let codes = sample(n, &mut rng);
        let mut arrays = Vec::with_capacity(codes.len());
        for (c, col) in domain.columns().iter().zip(&codes) {
            match c.decode(col, decode, &mut rng) {
                Ok(a) => arrays.push(a),
                Err(e) => return Some(Err(datafusion::error::DataFusionError::External(Box::new(e)))),
            }
        }
        Some(
            RecordBatch::try_new(out_schema.clone(), arrays)
                .map_err(|e| datafusion::error::DataFusionError::ArrowError(Box::new(e), None)),
        )
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::iter(batches)))
}

/// A mechanism that trains on rows (Kamino, KaminoI, DP-MisGAN, DP-GAN)
/// behind the [`crate::synth::Synthesizer`] interface, which hands a fit
/// marginals only: the fit refuses, before any charge. `dpflow synth` and
/// pipelines run these through their modules' `run`.
#[derive(Debug, Clone, Copy)]
pub struct RowsOnly(pub &'static str);

impl crate::synth::Synthesizer for RowsOnly {
    fn name(&self) -> &'static str {
        self.0
    }

    fn required_marginals(&self, _domain: &Domain, _workload: &crate::synth::Workload) -> Vec<Vec<usize>> {
        vec![]
    }

    #[allow(private_interfaces)]
    fn fit(&self, _ctx: &mut crate::synth::FitContext<'_>) -> Result<crate::synth::Fitted> {
        Err(SynthError::KaminoRows(self.0))
    }
}
