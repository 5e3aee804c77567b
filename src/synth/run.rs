//! Running a synthesizer end to end: budget and ledger, exact answers in one
//! scan, fit, streaming generation to Parquet, model and release record.

use std::sync::Arc;
use std::time::Instant;

use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::ExecutionPlan;
use dpflow_udfs::domain::{DecodeMode, Domain};
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::{DpRng, NoiseDistribution};
use dpflow_udfs::synth::{ColumnFill, FillPlan, Sampler, SamplingPlan, SyntheticExec};
use serde::{Deserialize, Serialize};

use super::compress::Compression;
use super::{
    Answers, FitContext, FitMetadata, Fitted, Observed, Result, SynthError, SynthOptions, Synthesizer, Workload,
};
use crate::dataset::{CodeSource, Dataset};
use crate::io::write_stream;
use crate::measure::{Accountant, ReleaseAccountant};
use crate::missing::{Amplification, AmplificationRequest, ImputeMethod, Strategy, StrategyOptions};
use crate::pgm::{GraphicalModel, ModelFile, sampling_plan};
use crate::privacy::{Budget, Ledger, MechanismRecord, PrivacyFilter, PrivacyLoss, Share};

/// Available synthesizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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
    /// PrivBayes (NOTES §5; pure ε-DP); PrivBayesE with `--missing adaptive`.
    Privbayes,
    /// PrivBayes's noisy marginals estimated with Private-PGM.
    PrivbayesPgm,
    /// NAPSU-MQ (003 Alg. 1): the workload's marginals measured once, a
    /// posterior over the max-entropy model, each synthetic set from its
    /// own posterior draw (noise-aware multiple synthesis).
    #[serde(rename = "napsu-mq")]
    NapsuMq,
    /// 002 §3.1.1: discrete Laplace on the full cross-tabulation.
    #[serde(rename = "laplace-sanitizer")]
    LaplaceSanitizer,
    /// 002 §3.1.2 eq. (5): the same on the domain's numeric bins.
    #[serde(rename = "perturbed-histogram")]
    PerturbedHistogram,
    /// 002 §3.1.2 eqs. (6)–(7): the histogram mixed with the uniform (needs --rows).
    #[serde(rename = "smoothed-histogram")]
    SmoothedHistogram,
    /// 002 §3.2.1: Dirichlet–multinomial posterior predictive (needs --rows).
    #[serde(rename = "multinomial-dirichlet")]
    MultinomialDirichlet,
    /// 002 §3.2.1: Binomial–Beta McClure–Reiter, pseudo-counts (needs --rows).
    #[serde(rename = "binomial-beta")]
    BinomialBeta,
    /// 002 §3.2.2: sanitized counts, a Dirichlet posterior draw per set.
    Modips,
    /// 002 §3.2.3: one DP multinomial logistic regression per column on the
    /// columns before it (needs --rows).
    #[serde(rename = "sequential-regression")]
    SequentialRegression,
    /// 002 §4.2: MODIPS for one bounded numeric column, normal with unknown
    /// mean and variance (needs --rows).
    #[serde(rename = "modips-normal")]
    ModipsNormal,
    /// 002 §4.3.1: MODIPS with the general location model, two numeric
    /// columns bivariate normal within the cells of the others (needs --rows).
    #[serde(rename = "modips-glom")]
    ModipsGlom,
    /// Kamino (Ge et al. 2021) on complete rows: one DP-SGD classifier per
    /// column on the columns before it (000's complete-row baseline).
    Kamino,
    /// KaminoI (000 Alg 3): Kamino that imputes each column's nulls with its
    /// own classifier before the next one learns.
    Kaminoi,
    /// DP-MisGAN (000 Alg 1, MisGAN): data and mask GANs that learn from
    /// incomplete rows, critics trained with DP-SGD.
    #[serde(rename = "dp-misgan")]
    DpMisgan,
    /// DP-GAN: the data GAN on complete rows (000's complete-row baseline).
    #[serde(rename = "dp-gan")]
    DpGan,
}

impl Mechanism {
    /// The implementation.
    pub fn synthesizer(&self, options: &SynthOptions) -> Box<dyn Synthesizer + Send + Sync> {
        let pb = |pgm| super::privbayes::PrivBayes { degree: options.degree, pgm, ..Default::default() };
        match self {
            Mechanism::Aim => Box::new(super::aim::Aim::default()),
            Mechanism::Mwem => Box::new(super::mwem::MwemPgm),
            Mechanism::Mst => Box::new(super::mst::Mst),
            Mechanism::Independent => Box::new(super::independent::Independent),
            Mechanism::Privbayes => Box::new(pb(false)),
            Mechanism::PrivbayesPgm => Box::new(pb(true)),
            Mechanism::NapsuMq => Box::new(super::napsu::synthesize::NapsuMq),
            Mechanism::LaplaceSanitizer
            | Mechanism::PerturbedHistogram
            | Mechanism::SmoothedHistogram
            | Mechanism::MultinomialDirichlet
            | Mechanism::BinomialBeta
            | Mechanism::Modips => Box::new(super::dips::release::CellSynth(self.cells().expect("a cell mechanism"))),
            Mechanism::SequentialRegression => {
                Box::new(super::dips::release::SequentialSynth { ridge: options.dips.ridge })
            }
            Mechanism::ModipsNormal | Mechanism::ModipsGlom => {
                Box::new(super::dips::release::RawSynth(self.raw().expect("a raw mechanism")))
            }
            Mechanism::Kamino | Mechanism::Kaminoi => {
                Box::new(super::kamino::release::RowsOnly(super::kamino::release::name(*self == Mechanism::Kaminoi)))
            }
            Mechanism::DpMisgan | Mechanism::DpGan => {
                Box::new(super::kamino::release::RowsOnly(super::gan::release::name(*self == Mechanism::DpMisgan)))
            }
        }
    }

    /// Whether it accounts in pure ε-DP (PrivBayes and the 002 synthesizers)
    /// rather than zCDP: its ledger charge is then ε (a ρ budget runs it at
    /// ε = √(2ρ), which is ρ-zCDP).
    pub fn pure_dp(&self) -> bool {
        self.synthesizer(&SynthOptions::default()).pure_dp()
    }

    /// The synthesizer over the full cross-tabulation behind a variant, if
    /// it is one (`dpflow synth` runs these in [`super::dips::release`]).
    pub fn table(&self) -> Option<super::dips::release::TableMechanism> {
        use super::dips::release::TableMechanism as T;
        match self {
            Mechanism::SequentialRegression => Some(T::SequentialRegression),
            other => other.cells().map(T::Cells),
        }
    }

    /// The MODIPS model over raw numeric values behind a variant, if it is
    /// one (`dpflow synth` runs these in [`super::dips::raw`]).
    pub fn raw(&self) -> Option<super::dips::raw::RawMechanism> {
        use super::dips::raw::RawMechanism as R;
        match self {
            Mechanism::ModipsNormal => Some(R::Normal),
            Mechanism::ModipsGlom => Some(R::Glom),
            _ => None,
        }
    }

    /// The 002 cell synthesizer behind a variant, if it is one.
    pub fn cells(&self) -> Option<super::dips::CellMechanism> {
        use super::dips::CellMechanism as C;
        Some(match self {
            Mechanism::LaplaceSanitizer => C::LaplaceSanitizer,
            Mechanism::PerturbedHistogram => C::PerturbedHistogram,
            Mechanism::SmoothedHistogram => C::SmoothedHistogram,
            Mechanism::MultinomialDirichlet => C::MultinomialDirichlet,
            Mechanism::BinomialBeta => C::BinomialBeta,
            Mechanism::Modips => C::Modips,
            _ => return None,
        })
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
        let bytes = std::fs::read(path).map_err(|source| SynthError::ReadModel { path: path.to_string(), source })?;
        let mut m: SavedModel = serde_json::from_slice(&bytes)
            .map_err(|source| SynthError::NotAModel { path: path.to_string(), source })?;
        if m.format != "dpflow-model-v1" {
            return Err(SynthError::ModelFormat { path: path.to_string(), format: m.format });
        }
        m.domain = m.domain.reindex().map_err(|source| SynthError::ModelDomain { path: path.to_string(), source })?;
        Ok(m)
    }

    /// The sampling plan over the domain's codes.
    pub fn sampling_plan(&self, decode: DecodeMode) -> Result<SamplingPlan> {
        let model: GraphicalModel = self.model.clone().into_model()?;
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
        None => Ok(sampling_plan(model, domain, decode)?),
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
                        not_applicable_when: None,
                    })
                    .collect(),
            )?;
            let plan = sampling_plan(model, &stand_in, decode)?;
            Ok(c.expand_plan(plan, &domain.cardinalities(), domain.clone()))
        }
    }
}

/// A streaming synthetic-data plan for `rows` rows in `partitions` streams
/// ([`dpflow_udfs::cluster::partitions_for`] the session that runs it). The
/// rows depend on the seed, not on the partitions.
pub fn synthetic_exec(
    plan: impl Into<Sampler>,
    rows: u64,
    seed: u64,
    partitions: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let exec = SyntheticExec::try_new(Arc::new(plan.into()), rows, partitions.max(1), 1 << 16, seed)
        .map_err(|source| SynthError::Generate { source })?;
    Ok(Arc::new(exec))
}

/// The column that numbers the sets (1..=m) when a run writes several.
pub const SET_COLUMN: &str = "_set";

/// Streams synthetic sets of `rows` rows each, one per plan, to `out`. One
/// plan writes the domain's columns only; several write one file whose
/// last column, [`SET_COLUMN`] (Int32, 1..=m), says which set a row
/// belongs to (`dpflow analyze --set-column _set` reads it). One file
/// rather than m: one location to publish, stage and check in a pipeline,
/// and the sets still stream one after the other.
pub async fn write_sets(
    ctx: &SessionContext,
    plans: Vec<impl Into<Sampler>>,
    rows: u64,
    out: &str,
    seed: u64,
    na_rules: Vec<crate::domain::NotApplicable>,
) -> Result<u64> {
    let mut streams = Vec::with_capacity(plans.len());
    for (i, plan) in plans.into_iter().enumerate() {
        // Distinct, reproducible per-set seeds from the one seed.
        let set_seed = seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let exec = synthetic_exec(plan, rows, set_seed, dpflow_udfs::cluster::partitions_for(ctx))?;
        let stream =
            dpflow_udfs::cluster::execute_stream(exec, ctx).await.map_err(|source| SynthError::Generate { source })?;
        streams.push(super::structure::enforce_stream(na_rules.clone(), stream));
    }
    write_streams(ctx, streams, out).await
}

/// Writes one stream per synthetic set to `out`: the stream itself for one
/// set; for several, one file with a [`SET_COLUMN`] numbering them (see
/// [`write_sets`]).
pub(crate) async fn write_streams(
    ctx: &SessionContext,
    mut streams: Vec<datafusion::execution::SendableRecordBatchStream>,
    out: &str,
) -> Result<u64> {
    use datafusion::arrow::array::{ArrayRef, Int32Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;

    let m = streams.len();
    let Some(first) = streams.first() else {
        return Err(SynthError::NoSets);
    };
    if m == 1 {
        return Ok(write_stream(ctx, out, streams.remove(0)).await?);
    }
    let inner = first.schema();
    if inner.field_with_name(SET_COLUMN).is_ok() {
        return Err(SynthError::SetColumnTaken);
    }
    let mut fields: Vec<Field> = inner.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(SET_COLUMN, DataType::Int32, false));
    let schema = Arc::new(Schema::new(fields));
    let out_schema = schema.clone();
    let tagged = futures::stream::iter(streams.into_iter().enumerate()).flat_map(move |(i, s)| {
        let schema = out_schema.clone();
        s.map(move |batch| {
            let batch = batch?;
            let set: ArrayRef = Arc::new(Int32Array::from_value(i as i32 + 1, batch.num_rows()));
            let mut columns = batch.columns().to_vec();
            columns.push(set);
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
    });
    let stream = Box::pin(RecordBatchStreamAdapter::new(schema, tagged));
    Ok(write_stream(ctx, out, stream).await?)
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
    /// Missing-data strategy (000 §4).
    pub missing: Strategy,
    /// Its options.
    pub missing_options: StrategyOptions,
    /// Report the ground-truth ε̄ under this declared missingness (000 §5.2).
    pub amplification: Option<AmplificationRequest>,
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
    /// zCDP ρ the mechanism ran with (none for a mechanism that is not
    /// zCDP, such as Kamino's DP-SGD: see `epsilon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rho: Option<f64>,
    /// ρ actually charged (sum of every mechanism; ≤ ρ). For a pure-ε
    /// synthesizer, the ρ = ε²/2 its ε-DP implies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rho_spent: Option<f64>,
    /// Pure ε of a pure-DP synthesizer (PrivBayes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// ε actually charged by a pure-DP synthesizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon_spent: Option<f64>,
    /// Missing-data strategy.
    #[serde(default)]
    pub missing: String,
    /// Ground-truth ε̄ under declared MCAR missingness (000 §5.2), when it applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amplification: Option<Amplification>,
    /// Why no amplification is reported, when one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amplification_note: Option<String>,
    /// Workload spec.
    pub workload: String,
    /// Rows written (per set, when there are several).
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
    /// Synthetic sets written (absent: one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiple: Option<usize>,
    /// With several sets: whether each set reflects the uncertainty of the
    /// DP noise (NAPSU-MQ: each set from its own posterior draw), so
    /// Rubin's rules give valid intervals; `false` for m sets from one model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_aware: Option<bool>,
    /// The column numbering the sets, when there are several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_column: Option<String>,
    /// NAPSU-MQ: the noisy statistics (saved before inference) and what
    /// inference did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub napsu: Option<super::napsu::synthesize::NapsuRecord>,
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

/// A fit's budget as a share in the synthesizer's own unit: pure ε for
/// PrivBayes, ρ-zCDP for AIM, MST, MWEM and Independent. An ε-DP fit in a ρ
/// budget takes ε = √(2ρ) (ε-DP implies ε²/2-zCDP).
fn fit_share(budget: &Budget, pure: bool) -> Result<Share> {
    if pure {
        return Ok(Share::Epsilon(pure_epsilon(budget)));
    }
    Ok(Share::Rho(rho_of(budget)?))
}

/// The ε a pure-DP mechanism runs with under `budget`: its ε, or √(2ρ) for
/// a ρ budget (ε-DP implies ε²/2-zCDP).
pub(crate) fn pure_epsilon(budget: &Budget) -> f64 {
    match *budget {
        Budget::Pure { epsilon } | Budget::Approx { epsilon, .. } => epsilon,
        Budget::Zcdp { rho } => (2.0 * rho).sqrt(),
    }
}

/// Runs the synthesizer on exact answers already computed (crate-private data).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
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
    let budget = if synth.pure_dp() { Share::Epsilon(rho) } else { Share::Rho(rho) };
    let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(budget.as_budget()));
    let fitted = fit_in(synth, domain, answers, workload, budget, options, rng, progress, &mut accountant, None)?;
    Ok((fitted, accountant))
}

/// Fits `synth` charging `accountant`, within `budget`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fit_in(
    synth: &dyn Synthesizer,
    domain: &Domain,
    answers: &Answers,
    workload: &Workload,
    budget: Share,
    options: &SynthOptions,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
    accountant: &mut ReleaseAccountant,
    observed: Option<Observed>,
) -> Result<Fitted> {
    let (rho, epsilon) = match budget {
        Share::Rho(r) => (r, 0.0),
        Share::Epsilon(e) => (0.0, e),
    };
    let mut ctx = FitContext {
        domain,
        sizes: domain.cardinalities(),
        answers,
        accountant,
        rng,
        workload,
        rho,
        epsilon,
        options,
        progress,
        observed,
        step: Default::default(),
    };
    synth.fit(&mut ctx)
}

/// Computes exact answers for `sets` in one scan.
pub(crate) async fn exact_answers(ctx: &SessionContext, dataset: &Dataset, sets: &[Vec<usize>]) -> Result<Answers> {
    Ok(exact_answers_from(ctx, dataset, sets, NullMode::Cells, &CodeSource::Plain).await?.0)
}

/// Exact answers for `sets` over `source` in `mode`, and the number of rows
/// the source has (all crate-private), in one scan.
pub(crate) async fn exact_answers_from(
    ctx: &SessionContext,
    dataset: &Dataset,
    sets: &[Vec<usize>],
    mode: NullMode,
    source: &CodeSource,
) -> Result<(Answers, u64)> {
    let domain = dataset.domain();
    let names = domain.names();
    let mut queries: Vec<(Vec<String>, NullMode)> =
        sets.iter().map(|s| (s.iter().map(|&a| names[a].to_string()).collect(), mode)).collect();
    // One more 1-way in null-as-cell mode counts the source's rows.
    queries.push((vec![names[0].to_string()], NullMode::Cells));
    let mut exact = dataset.exact_marginals_from(ctx, &queries, source).await?;
    let rows = exact.pop().map_or(0, |m| m.observed);
    let sizes = match mode {
        NullMode::Cells => domain.cardinalities(),
        NullMode::Observed => domain.columns().iter().map(|c| c.size()).collect(),
    };
    let mut answers = Answers { sizes, map: Default::default() };
    for (s, m) in sets.iter().zip(exact) {
        answers.map.insert(s.clone(), m.counts.iter().map(|&c| c as f64).collect());
    }
    Ok((answers, rows))
}

pub(crate) fn rho_of(budget: &Budget) -> Result<f64> {
    budget.as_rho().ok_or(SynthError::NotZcdp)
}

/// Charges `budget` for a sensitivity-1 count and returns it noisy.
fn noisy_count(
    accountant: &mut ReleaseAccountant,
    rng: &mut DpRng,
    budget: Share,
    target: &str,
    exact: u64,
) -> Result<f64> {
    let noise = budget.count_noise();
    let record = match noise {
        NoiseDistribution::Gaussian { sigma } => MechanismRecord::gaussian(target, 1.0, sigma),
        NoiseDistribution::Laplace { scale } => MechanismRecord::laplace(target, 1.0, scale),
    };
    accountant.charge(&[record])?;
    Ok((exact as i128).saturating_add(noise.integer_sampler().sample(rng)) as f64)
}

/// What the missing-data strategy produced before the main fit.
struct Prepared {
    answers: Answers,
    observed: Option<Observed>,
    fit_budget: Share,
    stability: Option<f64>,
    notes: Vec<String>,
}

/// Computes the synthesizer's answers under the missing-data strategy,
/// spending any imputation or row-count budget through `accountant`.
#[allow(clippy::too_many_arguments)]
async fn prepare(
    ctx: &SessionContext,
    req: &SynthRequest,
    synth: &dyn Synthesizer,
    model_domain: &Domain,
    workload: &Workload,
    budget: Share,
    accountant: &mut ReleaseAccountant,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
) -> Result<Prepared> {
    let required = synth.required_marginals(model_domain, workload);
    let dataset = &req.dataset;
    let domain = dataset.domain();
    let mopts = &req.missing_options;
    let nullable: Vec<usize> = (0..domain.len()).filter(|&i| domain.columns()[i].nullable).collect();
    let plain = |answers| Prepared { answers, observed: None, fit_budget: budget, stability: None, notes: vec![] };
    match req.missing {
        Strategy::Reproduce => {
            Ok(plain(exact_answers_from(ctx, dataset, &required, NullMode::Cells, &CodeSource::Plain).await?.0))
        }
        Strategy::CompleteRow => {
            let (answers, _) =
                exact_answers_from(ctx, dataset, &required, NullMode::Observed, &CodeSource::CompleteRows).await?;
            Ok(plain(answers))
        }
        Strategy::Adaptive => {
            let (answers, rows) =
                exact_answers_from(ctx, dataset, &required, NullMode::Observed, &CodeSource::Plain).await?;
            let share = mopts.total_share;
            let total = noisy_count(accountant, rng, budget.scaled(share), "row count (adaptive N̂)", rows)?.max(1.0);
            progress(&format!("adaptive: {} observed-only marginals; noisy row count {total:.0}", required.len()));
            Ok(Prepared {
                answers,
                observed: Some(Observed { total, fraction: vec![None; domain.len()] }),
                fit_budget: budget.scaled(1.0 - share),
                stability: None,
                notes: vec![format!("adaptive: N̂ measured with {:.1}% of the budget", share * 100.0)],
            })
        }
        Strategy::ImputeFirst(method) => {
            let mut notes = Vec::new();
            let mut fit_budget = budget;
            let mut stability = None;
            let fills: Vec<ColumnFill>;
            let mut model_plan = None;
            match method {
                ImputeMethod::Random => {
                    fills = (0..domain.len())
                        .map(|i| if nullable.contains(&i) { ColumnFill::Uniform } else { ColumnFill::Keep })
                        .collect();
                    notes.push("impute-first:random: nulls drawn uniformly from each column's values (free)".into());
                }
                ImputeMethod::Mode | ImputeMethod::ModeStability => {
                    let sets: Vec<Vec<usize>> = nullable.iter().map(|&i| vec![i]).collect();
                    let (ones, rows) =
                        exact_answers_from(ctx, dataset, &sets, NullMode::Observed, &CodeSource::Plain).await?;
                    let mut modes = vec![0u32; domain.len()];
                    if method == ImputeMethod::Mode {
                        let share = mopts.impute_share;
                        let k = nullable.len().max(1) as f64;
                        let each = budget.scaled(share / k);
                        for &i in &nullable {
                            let exact = ones.get(&[i])?;
                            let noise = each.count_noise();
                            let target = format!("observed-only marginal({}) for its DP mode", domain.names()[i]);
                            let record = match noise {
                                NoiseDistribution::Gaussian { sigma } => MechanismRecord::gaussian(target, 1.0, sigma),
                                NoiseDistribution::Laplace { scale } => MechanismRecord::laplace(target, 1.0, scale),
                            };
                            accountant.charge(&[record])?;
                            let sampler = noise.integer_sampler();
                            let noisy: Vec<f64> =
                                exact.iter().map(|&c| (c as i128).saturating_add(sampler.sample(rng)) as f64).collect();
                            modes[i] = argmax(&noisy);
                        }
                        fit_budget = budget.scaled(1.0 - share);
                        notes.push(format!("impute-first:mode: DP modes with {:.0}% of the budget", share * 100.0));
                    } else {
                        let m = mopts.max_missing_cells.ok_or(SynthError::MissingCellBound)?;
                        // Over the public bound M the nulls get a public constant instead of the
                        // exact modes, which keeps the fill (1 + 2M)-stable for every pair of
                        // neighbours, with no failure whose outcome would reveal the count
                        // (docs/PRIVACY.md §4.1).
                        let mut missing = 0u64;
                        for &i in &nullable {
                            let observed: f64 = ones.get(&[i])?.iter().sum();
                            missing = missing.saturating_add(rows.saturating_sub(observed as u64));
                        }
                        let within = crate::missing::strategy::within_missing_cell_bound(missing, m);
                        for &i in &nullable {
                            modes[i] = if within { argmax(ones.get(&[i])?) } else { 0 };
                        }
                        // c = 1 + 2M under add/remove neighbours; a c-stable transformation multiplies
                        // ε by c and ρ by c² (group privacy).
                        let c = crate::missing::strategy::mode_stability(m);
                        fit_budget = budget
                            .scaled(crate::missing::strategy::stability_share(c, matches!(budget, Share::Rho(_))));
                        stability = Some(c);
                        notes.push(format!(
                            "impute-first:mode-stability: exact modes (a public constant over the bound M) make the input {c}-stable (000 Lemma 4.2 / Thm 4.3); the synthesizer runs with {:.3e} instead of {:.3e}",
                            fit_budget.amount(),
                            budget.amount()
                        ));
                    }
                    fills = (0..domain.len())
                        .map(|i| if nullable.contains(&i) { ColumnFill::Constant(modes[i]) } else { ColumnFill::Keep })
                        .collect();
                }
                ImputeMethod::Model => {
                    let share = mopts.impute_share;
                    let imp_budget = budget.scaled(share);
                    // A DP tree model of the observed values (MST under zCDP, PrivBayes k=1 under pure ε),
                    // fitted adaptively on observed-only marginals.
                    let imputer: Box<dyn Synthesizer + Send + Sync> = match budget {
                        Share::Rho(_) => Box::new(super::mst::Mst),
                        Share::Epsilon(_) => Box::new(super::privbayes::PrivBayes { degree: 1, ..Default::default() }),
                    };
                    let imp_workload = Workload::parse("all-2way", model_domain)?;
                    let req_sets = imputer.required_marginals(model_domain, &imp_workload);
                    let (answers, rows) =
                        exact_answers_from(ctx, dataset, &req_sets, NullMode::Observed, &CodeSource::Plain).await?;
                    let total =
                        noisy_count(accountant, rng, imp_budget.scaled(0.05), "row count (imputation model N̂)", rows)?
                            .max(1.0);
                    let imp_opts = SynthOptions { iters: req.options.iters.min(1000), ..req.options.clone() };
                    let fitted = fit_in(
                        imputer.as_ref(),
                        model_domain,
                        &answers,
                        &imp_workload,
                        imp_budget.scaled(0.95),
                        &imp_opts,
                        rng,
                        progress,
                        accountant,
                        Some(Observed { total, fraction: vec![None; domain.len()] }),
                    )?;
                    model_plan =
                        Some(plan_for(&fitted.model, fitted.compression.as_ref(), model_domain, DecodeMode::Midpoint)?);
                    fills = (0..domain.len())
                        .map(|i| if nullable.contains(&i) { ColumnFill::Model } else { ColumnFill::Keep })
                        .collect();
                    fit_budget = budget.scaled(1.0 - share);
                    notes.push(format!(
                        "impute-first:model: nulls drawn from a DP {} model of the observed values ({:.0}% of the budget)",
                        imputer.name(),
                        share * 100.0
                    ));
                }
            }
            let seed = match req.unsafe_seed {
                Some(s) => s ^ 0x5EED_F111,
                None => rand::Rng::next_u64(&mut DpRng::from_os()?),
            };
            let plan = Arc::new(FillPlan { domain: domain.clone(), fills, model: model_plan, seed });
            let (answers, _) =
                exact_answers_from(ctx, dataset, &required, NullMode::Observed, &CodeSource::Filled(plan)).await?;
            Ok(Prepared { answers, observed: None, fit_budget, stability, notes })
        }
    }
}

fn argmax(v: &[f64]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32)
}

/// Runs a synthesis request end to end.
pub async fn run_synth(ctx: &SessionContext, req: &SynthRequest, progress: &dyn Fn(&str)) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    check_sets(req)?;
    check_settings(&req.options, &req.missing_options)?;
    if req.mechanism == Mechanism::NapsuMq {
        return super::napsu::synthesize::run(ctx, req, progress).await;
    }
    if matches!(req.mechanism, Mechanism::Kamino | Mechanism::Kaminoi) {
        return super::kamino::release::run(ctx, req, req.mechanism == Mechanism::Kaminoi, progress).await;
    }
    if matches!(req.mechanism, Mechanism::DpMisgan | Mechanism::DpGan) {
        return super::gan::release::run(ctx, req, req.mechanism == Mechanism::DpMisgan, progress).await;
    }
    if let Some(raw) = super::dips::raw::raw_mechanism(req.mechanism, &req.options.dips) {
        return super::dips::raw::run(ctx, req, raw, progress).await;
    }
    if let Some(table) = req.mechanism.table() {
        return super::dips::release::run(ctx, req, table, progress).await;
    }
    let synth = req.mechanism.synthesizer(&req.options);
    let budget = fit_share(&req.budget, synth.pure_dp())?;
    let mut rng = DpRng::new(req.unsafe_seed)?;
    let domain = req.dataset.domain().clone();
    let model_domain = if req.missing.models_nulls() { domain.clone() } else { domain.without_nulls() };
    // Not-applicable rules enforced on the output: compiled before anything is charged.
    let na_rules = super::structure::rules(&model_domain)?;
    let workload = Workload::parse(&req.workload, &model_domain)?;

    if req.unsafe_seed.is_some() && req.ledger.is_some() {
        return Err(SynthError::UnsafeSeed);
    }
    // A public input: checked before anything is charged or read.
    if req.missing == Strategy::ImputeFirst(ImputeMethod::ModeStability)
        && req.missing_options.max_missing_cells.is_none()
    {
        return Err(SynthError::MissingCellBound);
    }
    if let Some(why) = req.dataset.domain().dp_read_refusal() {
        return Err(SynthError::DpReadRefused { dataset: req.dataset.name.clone(), why });
    }
    // Reserve the whole release budget in the ledger before touching data.
    let mut ledger_state = reserve(req, synth.name(), budget, progress)?;

    // From here on protected data is read: every outcome is a release, so a
    // failure is charged (status `failed`) and reported without its cause
    // (docs/PRIVACY.md §1).
    let released = async {
        let t0 = Instant::now();
        let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(budget.as_budget()));
        let prepared =
            prepare(ctx, req, synth.as_ref(), &model_domain, &workload, budget, &mut accountant, &mut rng, progress)
                .await?;
        let t_answers = t0.elapsed().as_secs_f64();
        progress(&format!("computed exact marginals ({}) in {t_answers:.1}s", req.missing));

        let t1 = Instant::now();
        let Prepared { answers, observed, fit_budget, stability, notes } = prepared;
        let spent_before = accountant.filter().spent_amount();
        let mut fitted = fit_in(
            synth.as_ref(),
            &model_domain,
            &answers,
            &workload,
            fit_budget,
            &req.options,
            &mut rng,
            progress,
            &mut accountant,
            observed,
        )?;
        drop(answers);
        if let Some(c) = stability {
            // The synthesizer's charges hold for the imputed data; for the input they cost c× (ε) or c²× (ρ).
            let spent = accountant.filter().spent_amount() - spent_before;
            // Exact c² or c (not 1/stability_share: a reciprocal may round above it).
            let factor = match budget {
                Share::Rho(_) => c * c,
                Share::Epsilon(_) => c,
            };
            let surcharge = match budget {
                Share::Rho(_) => PrivacyLoss::Zcdp { rho: spent * (factor - 1.0) },
                Share::Epsilon(_) => PrivacyLoss::Pure { epsilon: spent * (factor - 1.0) },
            };
            accountant.charge(&[MechanismRecord {
                mechanism: "stability".into(),
                target: format!("imputation-first with exact statistics: stability {c} (000 Lemma 4.2 / Thm 4.3)"),
                sensitivity: None,
                noise: None,
                loss: surcharge,
                params: serde_json::json!({ "stability": c }),
            }])?;
        }
        fitted.metadata.notes.extend(notes);
        let t_fit = t1.elapsed().as_secs_f64();
        let spent = accountant.filter().spent_amount();

        let names = domain.names();
        let (amplification, amplification_note) = match &req.amplification {
            None => (None, None),
            Some(a) => {
                match crate::missing::strategy::amplification_for(req.missing, accountant.records(), &names, a) {
                    Ok(x) => (Some(x), None),
                    Err(e) => (None, Some(e.to_string())),
                }
            }
        };

        let t2 = Instant::now();
        let total = fitted.model.total;
        let rows = req.rows.unwrap_or(total.round().max(1.0) as u64);
        let plan = plan_for(&fitted.model, fitted.compression.as_ref(), &model_domain, req.decode)?;
        let seed = match req.unsafe_seed {
            Some(s) => s,
            None => {
                let mut r = DpRng::from_os()?;
                rand::Rng::next_u64(&mut r)
            }
        };
        // m sets from the one model: not noise-aware (the record says so).
        let written = write_sets(ctx, vec![plan; req.options.multiple], rows, &req.out, seed, na_rules).await?;
        let written = written / req.options.multiple as u64;
        let mut outputs = vec![req.out.clone()];
        if let Some(mo) = &req.model_out {
            let saved = SavedModel {
                format: "dpflow-model-v1".into(),
                domain: model_domain.clone(),
                model: ModelFile::from(&fitted.model),
                compression: fitted.compression.clone(),
                mechanism: synth.name().into(),
            };
            let json = serde_json::to_vec(&saved).map_err(|source| SynthError::Json { what: "the model", source })?;
            crate::io::write_bytes(ctx, mo, json)
                .await
                .map_err(|e| SynthError::WriteModel { path: mo.clone(), source: Box::new(e) })?;
            outputs.push(mo.clone());
        }
        let t_gen = t2.elapsed().as_secs_f64();
        Ok::<_, SynthError>((
            accountant,
            fitted.metadata,
            spent,
            amplification,
            amplification_note,
            written,
            outputs,
            TimingRecord { answers: t_answers, fit: t_fit, generate: t_gen },
        ))
    }
    .await;
    let (accountant, fit_metadata, spent, amplification, amplification_note, written, outputs, seconds) = match released
    {
        Ok(x) => x,
        Err(e) => {
            let ledger = ledger_state.as_ref().map(|(l, id)| (l, *id));
            return Err(crate::privacy::charge_failure("synthesis run", ledger, e));
        }
    };
    // Outputs are durable: commit the charge.
    let ledger_charge = commit_release(ledger_state.take())?;
    let (rho, rho_spent, epsilon, epsilon_spent) = match budget {
        Share::Rho(r) => (r, spent, None, None),
        Share::Epsilon(e) => (e * e / 2.0, e * e / 2.0 * (spent / e).min(1.0), Some(e), Some(spent)),
    };
    let record = SynthRecord {
        dpflow_version: env!("CARGO_PKG_VERSION").into(),
        mechanism: synth.name().into(),
        dataset: req.dataset.name.clone(),
        budget: req.budget,
        rho: Some(rho),
        rho_spent: Some(rho_spent),
        epsilon,
        epsilon_spent,
        missing: req.missing.to_string(),
        amplification,
        amplification_note,
        workload: req.workload.clone(),
        rows: written,
        mechanisms: accountant.into_records(),
        fit: fit_metadata,
        outputs,
        seconds,
        unsafe_seed: req.unsafe_seed,
        ledger_charge,
        multiple: (req.options.multiple > 1).then_some(req.options.multiple),
        noise_aware: (req.options.multiple > 1).then_some(false),
        set_column: (req.options.multiple > 1).then(|| SET_COLUMN.to_string()),
        napsu: None,
    };
    save_record(ctx, req, &record).await?;
    Ok(record)
}

/// Writes `record` to the request's record location (`--record-out`,
/// default `<out>.record.json`; empty: none).
pub(crate) async fn save_record(ctx: &SessionContext, req: &SynthRequest, record: &SynthRecord) -> Result<()> {
    let record_path = req.record_out.clone().unwrap_or_else(|| format!("{}.record.json", req.out));
    if !record_path.is_empty() {
        let json = serde_json::to_vec_pretty(record)
            .map_err(|source| SynthError::Json { what: "the release record", source })?;
        crate::io::write_bytes(ctx, &record_path, json).await?;
    }
    Ok(())
}

/// Most synthetic sets one run writes.
pub const MAX_SETS: usize = 10_000;

/// `--multiple`'s public checks, before anything is charged.
/// The largest PrivBayes degree a run accepts.
pub const MAX_DEGREE: usize = 64;

/// The ranges of the settings that are not budget, sets or rows (public:
/// checked before anything is charged, also by the pipeline spec check).
pub fn check_settings(options: &SynthOptions, missing: &StrategyOptions) -> Result<()> {
    let open_unit = |v: f64| v.is_finite() && v > 0.0 && v < 1.0;
    let checks = [
        (
            open_unit(missing.impute_share),
            "--impute-share",
            "between 0 and 1",
            missing.impute_share,
            "the share of the budget spent on the imputation statistics of impute-first:mode|model",
        ),
        (
            open_unit(options.confidence),
            "--confidence",
            "between 0 and 1",
            options.confidence,
            "the coverage of AIM's error bounds, e.g. 0.95",
        ),
        // (PrivBayes uses at most the columns there are; the cap keeps k + 1 from overflowing.)
        (
            (1..=MAX_DEGREE).contains(&options.degree),
            "--degree",
            "between 1 and 64",
            options.degree as f64,
            "PrivBayes's parents per attribute",
        ),
        (options.rounds != Some(0), "--rounds", "at least 1", 0.0, "MWEM's rounds"),
    ];
    for (ok, name, range, value, what) in checks {
        if !ok {
            return Err(SynthError::Setting { name, range, value, what });
        }
    }
    Ok(())
}

pub(crate) fn check_sets(req: &SynthRequest) -> Result<()> {
    let m = req.options.multiple;
    if m == 0 || m > MAX_SETS {
        return Err(SynthError::NoSets);
    }
    if m > 1 && req.dataset.domain().position(SET_COLUMN).is_some() {
        return Err(SynthError::SetColumnTaken);
    }
    Ok(())
}

/// The last public checks of a release and its start: a seed never goes
/// with a ledger, the domain must be readable for DP, then the RNG and the
/// ledger reservation of `budget` (before any data is read).
pub(crate) fn begin_release(
    req: &SynthRequest,
    name: &str,
    budget: Share,
    progress: &dyn Fn(&str),
) -> Result<(DpRng, Option<(Ledger, i64)>)> {
    begin_release_loss(req, name, budget.loss(), budget.amount(), progress)
}

/// [`begin_release`] for a release charged a general loss (e.g. (ε, δ));
/// `amount` is its size in the budget's unit, for the progress line.
pub(crate) fn begin_release_loss(
    req: &SynthRequest,
    name: &str,
    loss: PrivacyLoss,
    amount: f64,
    progress: &dyn Fn(&str),
) -> Result<(DpRng, Option<(Ledger, i64)>)> {
    if req.unsafe_seed.is_some() && req.ledger.is_some() {
        return Err(SynthError::UnsafeSeed);
    }
    if let Some(why) = req.dataset.domain().dp_read_refusal() {
        return Err(SynthError::DpReadRefused { dataset: req.dataset.name.clone(), why });
    }
    let rng = DpRng::new(req.unsafe_seed)?;
    Ok((rng, reserve_loss(req, name, loss, amount, progress)?))
}

/// Commits the ledger charge reserved by [`begin_release`] or [`reserve`],
/// once the outputs are durable; the charge's id, for the release record.
pub(crate) fn commit_release(ledger_state: Option<(Ledger, i64)>) -> Result<Option<i64>> {
    match ledger_state {
        Some((l, id)) => {
            l.commit(id)?;
            Ok(Some(id))
        }
        None => Ok(None),
    }
}

/// Reserves the release's whole budget in the ledger, if there is one,
/// before any data is read.
pub(crate) fn reserve(
    req: &SynthRequest,
    name: &str,
    budget: Share,
    progress: &dyn Fn(&str),
) -> Result<Option<(Ledger, i64)>> {
    reserve_loss(req, name, budget.loss(), budget.amount(), progress)
}

/// [`reserve`] for a general loss of size `amount` in the budget's unit.
fn reserve_loss(
    req: &SynthRequest,
    name: &str,
    loss: PrivacyLoss,
    amount: f64,
    progress: &dyn Fn(&str),
) -> Result<Option<(Ledger, i64)>> {
    let Some((file, ds)) = &req.ledger else {
        return Ok(None);
    };
    let mut ledger = Ledger::open(file)?;
    // Synthesizers bound one row's influence, not a person's: a ledger that
    // counts people by a column would be undercharged (k rows of one person
    // move a marginal by k).
    let unit = ledger.dataset(ds)?.privacy_unit;
    if unit != "row" {
        return Err(SynthError::PrivacyUnit { dataset: ds.clone(), unit });
    }
    let release_id =
        req.release_id.clone().unwrap_or_else(|| format!("synth-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")));
    let record = synthesis_record(name, &req.dataset.name, loss, &req.workload, req.missing);
    let r = ledger.reserve(ds, &release_id, &[record], None)?;
    // A run that reads the data again under an earlier run's reservation
    // would release twice for one charge: the earlier run may have
    // published before it stopped.
    if r.resumed {
        return Err(SynthError::ResumedRelease { release_id, charge: r.charge_id });
    }
    progress(&format!("ledger: reserved {amount:.6} as charge #{} ({:.6} left)", r.charge_id, r.remaining));
    Ok(Some((ledger, r.charge_id)))
}

/// The one ledger record of a synthesis release: its whole budget share,
/// in the synthesizer's unit.
fn synthesis_record(
    name: &str,
    dataset: &str,
    loss: PrivacyLoss,
    workload: &str,
    missing: Strategy,
) -> MechanismRecord {
    MechanismRecord {
        mechanism: name.to_string(),
        target: format!("synthetic data of {dataset}"),
        sensitivity: None,
        noise: None,
        loss,
        params: serde_json::json!({ "workload": workload, "missing": missing.to_string() }),
    }
}

/// The synthesizers [`run_synth`] fits itself from exact marginals (the
/// others — NAPSU-MQ and the 002 family — have runs of their own).
pub const FITTED_SYNTHESIZERS: [Mechanism; 6] = [
    Mechanism::Aim,
    Mechanism::Mst,
    Mechanism::Mwem,
    Mechanism::Independent,
    Mechanism::Privbayes,
    Mechanism::PrivbayesPgm,
];

/// The record [`run_synth`] charges a ledger for a release of `mechanism`
/// (one of the synthesizers [`run_synth`] fits itself: AIM, MST, MWEM,
/// independent, PrivBayes, PrivBayes-PGM) under `budget` — for a caller
/// that charges the ledger itself before running it (SQL's `synthesize()`).
pub fn release_record(
    dataset: &str,
    mechanism: Mechanism,
    budget: &Budget,
    workload: &str,
    missing: Strategy,
) -> Result<MechanismRecord> {
    budget_check(budget)?;
    let synth = mechanism.synthesizer(&SynthOptions::default());
    let share = fit_share(budget, synth.pure_dp())?;
    Ok(synthesis_record(synth.name(), dataset, share.loss(), workload, missing))
}

/// The smallest ρ (and ε) a synthesis runs with: far below any useful
/// budget, and far above where a synthesizer's noise would leave the exact
/// samplers' range (σ ≈ √(T/2ρ) stays below 2⁹⁶ for thousands of
/// measurements; docs/PRIVACY.md §3.2).
pub const MIN_SYNTH_BUDGET: f64 = 1e-30;

pub(crate) fn budget_check(b: &Budget) -> Result<()> {
    b.validate()?;
    let small = match *b {
        Budget::Pure { epsilon } | Budget::Approx { epsilon, .. } => epsilon < MIN_SYNTH_BUDGET.sqrt(),
        Budget::Zcdp { rho } => rho < MIN_SYNTH_BUDGET,
    };
    if small {
        return Err(SynthError::BudgetTooSmall { budget: b.describe() });
    }
    Ok(())
}
