//! `dpflow synth`, `dpflow sample` and `dpflow eval`.

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::InputArgs;
use super::OutputFormat;
use super::budget::BudgetSpec;
use dpflow::dataset::Dataset;
use dpflow::io::{session_context, write_stream};
use dpflow::synth::SynthOptions;
use dpflow::synth::napsu::release::NapsuOptions;
use dpflow::synth::napsu::synthesize::Post;
use dpflow::synth::run::{Mechanism, SavedModel, SynthRequest, run_synth, synthetic_exec};
use dpflow_udfs::domain::DecodeMode;

/// Arguments of `dpflow synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Input data (file, prefix, glob or URL; not with --from-record).
    #[arg(long, required_unless_present = "from_record", conflicts_with = "from_record")]
    pub input: Option<String>,
    /// Input format (default: from the extension).
    #[arg(long, value_enum)]
    pub input_format: Option<dpflow::io::InputFormat>,
    /// Public domain file (not with --from-record).
    #[arg(long, required_unless_present = "from_record", conflicts_with = "from_record")]
    pub domain: Option<String>,
    /// Synthesizer.
    #[arg(long, value_enum, required_unless_present = "from_record")]
    pub mechanism: Option<Mechanism>,
    /// Budget of this release.
    #[command(flatten)]
    pub budget: BudgetSpec,
    /// Workload: all-Kway[:max-cells=N], target:COL, skewed[:seed=S], file:PATH, marginals:a,b;b,c.
    #[arg(long, default_value = "all-3way")]
    pub workload: String,
    /// The marginals NAPSU-MQ measures, e.g. 'age,income; race,income' (same as --workload marginals:...).
    #[arg(long, conflicts_with = "from_record")]
    pub queries: Option<String>,
    /// Synthetic sets to write, in one file with a `_set` column (1..m) when m > 1. napsu-mq draws
    /// each from its own posterior sample, and the 002 synthesizers (laplace-sanitizer, modips, ...)
    /// each from its own sanitization with ε/m (noise-aware: analyse with `dpflow analyze`); the
    /// other mechanisms draw all m from one model, and the record says they are not noise-aware.
    #[arg(long, default_value_t = 1)]
    pub multiple: usize,
    /// napsu-mq: posterior inference (laplace: seconds; nuts: minutes, NUTS on the posterior with the
    /// likelihood's covariance frozen at the mode, importance-weighted to the exact one and checked by
    /// Pareto k̂; nuts-exact: NUTS on the exact posterior, hours on wide models).
    #[arg(long, value_enum, default_value_t)]
    pub inference: dpflow::synth::napsu::release::Inference,
    /// napsu-mq: most canonical features (parameters) allowed.
    #[arg(long, default_value_t = 1000)]
    pub max_features: usize,
    /// napsu-mq: NUTS chains (each on its own thread).
    #[arg(long, default_value_t = 4)]
    pub nuts_chains: usize,
    /// napsu-mq: NUTS warm-up draws per chain.
    #[arg(long, default_value_t = 800)]
    pub nuts_warmup: u64,
    /// napsu-mq: NUTS kept draws per chain.
    #[arg(long, default_value_t = 2000)]
    pub nuts_draws: u64,
    /// napsu-mq: most NUTS draws per chain: while R̂ of the mean parameters is over 1.05 the chains
    /// go on until their draws double, up to this (default 4 × --nuts-draws; equal to
    /// --nuts-draws for no longer chains).
    #[arg(long)]
    pub nuts_max_draws: Option<u64>,
    /// napsu-mq: publish NUTS draws even when R̂ of the mean parameters (by ranks above one expected row) > 1.05 or the importance k̂ is over its threshold
    /// (post-processing, so it is safe, but the intervals may be wrong).
    #[arg(long)]
    pub allow_unconverged: bool,
    /// napsu-mq: re-run inference and generation on the noisy statistics saved in this release
    /// record, with the settings given here. Reads no data and spends nothing.
    #[arg(long, conflicts_with_all = ["ledger", "dataset", "epsilon", "delta", "rho", "mechanism"])]
    pub from_record: Option<String>,
    /// Rows to generate (default: the model's noisy estimate of the row count). Per set. The 002
    /// sampling synthesizers (smoothed-histogram, binomial-beta, multinomial-dirichlet) need it:
    /// their ε depends on it, so it must be a public number.
    #[arg(long)]
    pub rows: Option<u64>,
    /// Synthetic Parquet output (file or URL).
    #[arg(long)]
    pub out: String,
    /// Also save the fitted model (DP post-processing; safe to publish).
    #[arg(long)]
    pub model_out: Option<String>,
    /// Release record (JSON; default `<out>.record.json`; empty to skip).
    #[arg(long)]
    pub record_out: Option<String>,
    /// Ledger to charge (with --dataset).
    #[arg(long, requires = "dataset")]
    pub ledger: Option<String>,
    /// Dataset name in the ledger.
    #[arg(long, requires = "ledger")]
    pub dataset: Option<String>,
    /// Release id (idempotency in the ledger).
    #[arg(long)]
    pub release_id: Option<String>,
    /// Mirror-descent iterations per estimation.
    #[arg(long, default_value_t = 1000)]
    pub iters: usize,
    /// AIM: stop each estimation inside the rounds once its loss falls by
    /// less than this share over 50 iterations (0 runs all --iters; default
    /// 0.01); the released model's final fit stops at 0.001, or at this if
    /// tighter. See benches/results/aim/tolerance.md.
    #[arg(long)]
    pub tolerance: Option<f64>,
    /// AIM/MWEM model capacity (JT-SIZE in MB).
    #[arg(long, default_value_t = 80.0)]
    pub max_model_size: f64,
    /// Confidence of AIM's error bounds.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// MWEM rounds (default: number of columns).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Decode numeric bins to their midpoints (default: uniform inside the bin).
    #[arg(long)]
    pub midpoints: bool,
    /// Missing data (000 §4): reproduce (null is a value; realistic nulls), complete-row,
    /// adaptive (observed-only marginals: AIME, PrivBayesE),
    /// impute-first:random|mode|model|mode-stability.
    #[arg(long, default_value = "reproduce")]
    pub missing: dpflow::missing::Strategy,
    /// Budget share of DP imputation statistics (impute-first:mode|model).
    #[arg(long, default_value_t = 0.2)]
    pub impute_share: f64,
    /// Public bound on the number of missing cells (impute-first:mode-stability, 000 Thm 4.3).
    #[arg(long)]
    pub max_missing_cells: Option<u64>,
    /// PrivBayes degree k.
    #[arg(long, default_value_t = 2)]
    pub degree: usize,
    /// MODIPS's Dirichlet prior per cell, modips and modips-glom [default: 1/3 for modips (002
    /// §4.1), 1/2 for modips-glom (§4.3.1)].
    #[arg(long, conflicts_with = "from_record")]
    pub dips_prior: Option<f64>,
    /// How laplace-sanitizer and perturbed-histogram turn their sanitized table into rows:
    /// `sample` draws them from the normalised table, `round` writes the table itself, scaled to
    /// the rows by randomized rounding (002 §4.1's Laplace sanitizer) [default: sample].
    #[arg(long, value_enum, conflicts_with = "from_record")]
    pub dips_generate: Option<dpflow::synth::dips::Generate>,
    /// sequential-regression's ridge Λ, each logistic regression's prior precision on the scaled
    /// design: the noise scale is ∝ 1/Λ and the shrinkage toward independence grows with Λ
    /// [default: 1].
    #[arg(long, conflicts_with = "from_record")]
    pub dips_ridge: Option<f64>,
    /// sequential-regression's numeric columns: `bins` models them as categorical over the
    /// domain's bins (over the table: memory ∝ cells); `linear` as linear regressions on the raw
    /// values (over rows: memory ∝ rows; needs --missing complete-row for a nullable one)
    /// [default: bins].
    #[arg(long, value_enum, conflicts_with = "from_record")]
    pub dips_numeric: Option<dpflow::synth::dips::sequential::NumericModel>,
    /// kamino/kaminoi: the attribute order, by the noisy missing share (most complete first,
    /// or most missing first as 000 §4.2 words it) or the domain's order [default: complete-first].
    #[arg(long, value_enum, conflicts_with = "from_record")]
    pub kamino_order: Option<dpflow::synth::kamino::KaminoOrder>,
    /// kamino/kaminoi: hidden units of each column's classifier [default: 64].
    #[arg(long, conflicts_with = "from_record")]
    pub kamino_hidden: Option<usize>,
    /// kamino/kaminoi: DP-SGD passes over each column's (noisy) training rows [default: 2].
    #[arg(long, conflicts_with = "from_record")]
    pub kamino_epochs: Option<f64>,
    /// kamino/kaminoi: DP-SGD's expected batch size [default: 512].
    #[arg(long, conflicts_with = "from_record")]
    pub kamino_batch: Option<f64>,
    /// kamino/kaminoi: DP-SGD's per-example clipping norm [default: 1].
    #[arg(long, conflicts_with = "from_record")]
    pub kamino_clip: Option<f64>,
    /// kamino/kaminoi: Adam's learning rate [default: 0.01].
    #[arg(long, conflicts_with = "from_record")]
    pub kamino_lr: Option<f64>,
    /// dp-misgan/dp-gan: the critics' DP-SGD passes over the (noisy) training rows [default: 5].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_epochs: Option<f64>,
    /// dp-misgan/dp-gan: the critics' expected batch size [default: 256].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_batch: Option<f64>,
    /// dp-misgan/dp-gan: hidden units per layer (two hidden layers; the mask networks use half) [default: 128].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_hidden: Option<usize>,
    /// dp-misgan/dp-gan: the generators' latent dimension [default: 32].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_latent: Option<usize>,
    /// dp-misgan/dp-gan: critic steps per generator step [default: 2].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_critic_steps: Option<usize>,
    /// dp-misgan/dp-gan: clipping norm of one row's critic gradient [default: 1].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_clip: Option<f64>,
    /// dp-misgan/dp-gan: Adam's learning rate [default: 0.001].
    #[arg(long, conflicts_with = "from_record")]
    pub gan_lr: Option<f64>,
    /// Declared missingness mechanism of the input; with --missing-rates, the release
    /// record reports the ground-truth ε̄ under MCAR (000 §5.2); refused for mar/mnar.
    /// Declare mcar only if every cell is missing independently (columns not missing together).
    #[arg(long, value_enum)]
    pub missingness: Option<dpflow::missing::Missingness>,
    /// Public missing probabilities: one rate for every column, or COL=RATE,... (000 §5.2).
    #[arg(long, requires = "missingness")]
    pub missing_rates: Option<String>,
    /// UNSAFE: seed all randomness (tests and reproducible benchmarks only; the output is not private).
    #[arg(long)]
    pub unsafe_seed: Option<u64>,
    /// Where the data is read and the synthetic rows generated.
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

fn spinner() -> ProgressBar {
    super::progress::spinner("")
}

/// The GANs' settings from the flags (`missing_aware` is set by the
/// mechanism); refused for other mechanisms.
fn gan_options(a: &SynthArgs, mechanism: Mechanism) -> Result<dpflow::synth::gan::GanOptions> {
    let d = dpflow::synth::gan::GanOptions::default();
    let given = a.gan_epochs.is_some()
        || a.gan_batch.is_some()
        || a.gan_hidden.is_some()
        || a.gan_latent.is_some()
        || a.gan_critic_steps.is_some()
        || a.gan_clip.is_some()
        || a.gan_lr.is_some();
    if given && !matches!(mechanism, Mechanism::DpMisgan | Mechanism::DpGan) {
        anyhow::bail!("--gan-* settings are for --mechanism dp-misgan or dp-gan: drop them");
    }
    Ok(dpflow::synth::gan::GanOptions {
        missing_aware: mechanism == Mechanism::DpMisgan,
        epochs: a.gan_epochs.unwrap_or(d.epochs),
        batch: a.gan_batch.unwrap_or(d.batch),
        hidden: a.gan_hidden.unwrap_or(d.hidden),
        latent: a.gan_latent.unwrap_or(d.latent),
        critic_steps: a.gan_critic_steps.unwrap_or(d.critic_steps),
        clip: a.gan_clip.unwrap_or(d.clip),
        learning_rate: a.gan_lr.unwrap_or(d.learning_rate),
        ..d
    })
}

/// Kamino's settings from the flags (`impute` is set by the mechanism);
/// refused for other mechanisms, so a flag is never silently ignored.
fn kamino_options(a: &SynthArgs, mechanism: Mechanism) -> Result<dpflow::synth::kamino::KaminoOptions> {
    let d = dpflow::synth::kamino::KaminoOptions::default();
    let given = a.kamino_order.is_some()
        || a.kamino_hidden.is_some()
        || a.kamino_epochs.is_some()
        || a.kamino_batch.is_some()
        || a.kamino_clip.is_some()
        || a.kamino_lr.is_some();
    if given && !matches!(mechanism, Mechanism::Kamino | Mechanism::Kaminoi) {
        anyhow::bail!("--kamino-* settings are for --mechanism kamino or kaminoi: drop them");
    }
    Ok(dpflow::synth::kamino::KaminoOptions {
        impute: mechanism == Mechanism::Kaminoi,
        order: a.kamino_order.unwrap_or(d.order),
        hidden: a.kamino_hidden.unwrap_or(d.hidden),
        epochs: a.kamino_epochs.unwrap_or(d.epochs),
        batch: a.kamino_batch.unwrap_or(d.batch),
        clip: a.kamino_clip.unwrap_or(d.clip),
        learning_rate: a.kamino_lr.unwrap_or(d.learning_rate),
    })
}

fn napsu_options(a: &SynthArgs) -> NapsuOptions {
    NapsuOptions {
        inference: a.inference,
        max_features: a.max_features,
        allow_unconverged: a.allow_unconverged,
        nuts: dpflow::synth::napsu::nuts::NutsOptions {
            chains: a.nuts_chains,
            warmup: a.nuts_warmup,
            draws: a.nuts_draws,
            max_draws: a.nuts_max_draws,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `--from-record`: post-processing only.
async fn from_record(a: &SynthArgs, path: &str) -> Result<i32> {
    if a.input.is_some() || a.domain.is_some() {
        anyhow::bail!("--from-record reads no data: drop --input and --domain");
    }
    let options = napsu_options(a);
    let post = Post {
        out: &a.out,
        rows: a.rows,
        multiple: a.multiple,
        options: &options,
        decode: if a.midpoints { DecodeMode::Midpoint } else { DecodeMode::Uniform },
        unsafe_seed: a.unsafe_seed,
    };
    let pb = spinner();
    let ctx = session_context();
    let progress = |m: &str| {
        log::info!("{m}");
        pb.set_message(m.to_string());
    };
    let record =
        dpflow::synth::napsu::synthesize::from_record(&ctx, path, a.record_out.as_deref(), &post, &progress).await;
    pb.finish_and_clear();
    let record = record?;
    eprintln!(
        "napsu-mq (from {path}, spent nothing): wrote {} set(s) of {} rows to {} (inference {:.1}s, generation {:.1}s)",
        a.multiple, record.rows, a.out, record.seconds.fit, record.seconds.generate
    );
    Ok(0)
}

pub(super) async fn run(a: SynthArgs) -> Result<i32> {
    if let Some(path) = a.from_record.clone() {
        return from_record(&a, &path).await;
    }
    // (Not a flattened `Option<InputArgs>`: clap then requires its fields
    // even with --from-record, clap-rs/clap#5092.)
    let data = a.input.clone().zip(a.domain.clone()).map(|(input, domain)| InputArgs {
        input,
        input_format: a.input_format,
        domain,
    });
    let (Some(data), Some(mechanism)) = (&data, a.mechanism) else {
        anyhow::bail!("give the data (--input and --domain) and --mechanism, or --from-record FILE");
    };
    if a.unsafe_seed.is_some() {
        eprintln!("WARNING: --unsafe-seed makes the noise reproducible: this output is NOT differentially private.");
    }
    if a.ledger.is_none() {
        eprintln!("note: no --ledger given: this release's privacy cost is not recorded in a budget ledger.");
    }
    let dips =
        dpflow::synth::DipsOptions::given(mechanism, a.dips_prior, a.dips_generate, a.dips_ridge, a.dips_numeric)
            .map_err(|setting| {
                let name = mechanism.synthesizer(&Default::default()).name();
                anyhow::anyhow!("{name} does not take --dips-{setting}: drop it")
            })?;
    if a.midpoints && dpflow::synth::dips::raw::raw_mechanism(mechanism, &dips).is_some() {
        anyhow::bail!("{mechanism:?} writes raw numeric values, not bins: drop --midpoints");
    }
    let dataset = data.open(a.dataset.as_deref().unwrap_or("data"))?;
    let budget = a.budget.budget()?;
    let workload = match &a.queries {
        Some(q) => format!("marginals:{q}"),
        None => a.workload.clone(),
    };
    let req = SynthRequest {
        dataset,
        mechanism,
        budget,
        workload,
        rows: a.rows,
        out: a.out.clone(),
        model_out: a.model_out.clone(),
        record_out: a.record_out.clone(),
        ledger: a.ledger.clone().zip(a.dataset.clone()),
        release_id: a.release_id.clone(),
        unsafe_seed: a.unsafe_seed,
        options: SynthOptions {
            iters: a.iters,
            tolerance: a.tolerance,
            max_model_mb: a.max_model_size,
            confidence: a.confidence,
            rounds: a.rounds,
            degree: a.degree,
            multiple: a.multiple,
            napsu: napsu_options(&a),
            dips,
            kamino: kamino_options(&a, mechanism)?,
            gan: gan_options(&a, mechanism)?,
        },
        decode: if a.midpoints { DecodeMode::Midpoint } else { DecodeMode::Uniform },
        missing: a.missing,
        missing_options: dpflow::missing::StrategyOptions {
            impute_share: a.impute_share,
            max_missing_cells: a.max_missing_cells,
            ..Default::default()
        },
        amplification: a.missingness.map(|m| dpflow::missing::AmplificationRequest {
            missingness: m,
            rates: a.missing_rates.clone().unwrap_or_default(),
            delta: match budget {
                dpflow::privacy::Budget::Approx { delta, .. } => delta,
                _ => 1e-9,
            },
        }),
    };
    // The cluster (if any) must answer before run_synth charges anything.
    let ctx = a.cluster.context().await?;
    let pb = spinner();
    let progress = |m: &str| {
        log::info!("{m}");
        pb.set_message(m.to_string());
    };
    let record = run_synth(&ctx, &req, &progress).await;
    pb.finish_and_clear();
    let record = record?;
    let spent = match (record.epsilon, record.epsilon_spent) {
        (Some(e), Some(s)) => format!("ε spent {s:.6} of {e:.6}"),
        _ => format!("ρ spent {:.6} of {:.6}", record.rho_spent.unwrap_or(f64::NAN), record.rho.unwrap_or(f64::NAN)),
    };
    let sets = match record.multiple {
        Some(m) => format!("{m} sets of {} rows", record.rows),
        None => format!("{} rows", record.rows),
    };
    eprintln!(
        "{}: wrote {sets} to {} ({spent}; missing: {}; fit {:.1}s, generation {:.1}s)",
        record.mechanism, a.out, record.missing, record.seconds.fit, record.seconds.generate
    );
    if record.noise_aware == Some(true) {
        // NAPSU-MQ's sets take the fully-synthetic rule (the default); the
        // 002 synthesizers' take 002 eqs. (9)-(11).
        let rule = if record.napsu.is_some() { "" } else { " --rule dips" };
        eprintln!(
            "the sets are noise-aware: analyse them with `dpflow analyze {} --set-column _set{rule} --logistic FORMULA` \
             (or --ols, --mean, --proportion)",
            a.out
        );
    }
    if record.noise_aware == Some(false) {
        eprintln!(
            "note: the {} sets come from one model: they are not noise-aware, and intervals combined across them \
             ignore the DP noise (napsu-mq's sets are noise-aware)",
            record.multiple.unwrap_or(1)
        );
    }
    if let Some(i) = record.napsu.as_ref().and_then(|n| n.inference.as_ref())
        && let Some(r) = i.max_rhat
    {
        eprintln!(
            "NUTS: largest R̂ {:.3} of the mean parameters (what the sets depend on; checked against \
             the limit; {} of {} cells by ranks) and {r:.3} of θ, smallest bulk ESS {:.0} of the mean parameters \
             and ESS {:.0} of θ over {} kept draws per chain (the chains go on while R̂ is over the limit, up to \
             --nuts-max-draws), {} divergences, {:.1} leapfrog steps per draw, {} gradients in {:.1}s",
            i.max_rhat_mean.unwrap_or(f64::NAN),
            i.ranked_cells.unwrap_or(0),
            i.cells.unwrap_or(0),
            i.min_ess_mean.unwrap_or(f64::NAN),
            i.min_ess.unwrap_or(f64::NAN),
            i.draws_per_chain.unwrap_or(0),
            i.divergences.unwrap_or(0),
            i.mean_steps.unwrap_or(f64::NAN),
            i.gradients.unwrap_or(0),
            i.seconds
        );
        if let Some(c) = &i.importance {
            eprintln!(
                "NUTS ran with the likelihood's covariance frozen at the mode; importance weights to the exact \
                 posterior: Pareto k̂ {} (reliable below {:.2}), effective sample size {:.0}{}",
                c.pareto_k.map_or_else(|| "none (equal weights)".to_string(), |k| format!("{k:.3}")),
                c.k_threshold,
                c.ess,
                if c.failed > 0 { format!(", {} draws of weight 0", c.failed) } else { String::new() }
            );
        }
    }
    if let Some(amp) = &record.amplification {
        eprintln!(
            "ground truth under MCAR: ε̄ = {:.4} (nominal {:.4}, δ = {:.1e}; paper-style factor {:.3})",
            amp.epsilon, amp.nominal_epsilon, amp.delta, amp.linear_factor
        );
        for c in &amp.caveats {
            eprintln!("  ε̄ {c}");
        }
    }
    if let Some(note) = &record.amplification_note {
        eprintln!("no ground-truth amplification: {note}");
    }
    Ok(0)
}

/// Arguments of `dpflow sample`.
#[derive(Debug, Args)]
pub struct SampleArgs {
    /// A model saved by `dpflow synth --model-out`.
    #[arg(long)]
    pub model: String,
    /// Rows to generate (default: the model's noisy row count).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Output Parquet (file or URL).
    #[arg(long)]
    pub out: String,
    /// Decode numeric bins to their midpoints.
    #[arg(long)]
    pub midpoints: bool,
    /// Seed for the sampling (sampling a DP model is post-processing).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the rows are generated.
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

pub(super) async fn sample(a: SampleArgs) -> Result<i32> {
    let m = SavedModel::load(&a.model)?;
    let na_rules = dpflow::synth::structure::rules(&m.domain)?;
    let plan = m.sampling_plan(if a.midpoints { DecodeMode::Midpoint } else { DecodeMode::Uniform })?;
    let rows = a.rows.unwrap_or(m.total().round().max(1.0) as u64);
    let seed = match a.seed {
        Some(s) => s,
        None => rand::Rng::next_u64(&mut dpflow_udfs::noise::DpRng::from_os()?),
    };
    let ctx = a.cluster.context().await?;
    let exec = synthetic_exec(plan, rows, seed, dpflow_udfs::cluster::partitions_for(&ctx))?;
    let pb = ProgressBar::new(rows);
    pb.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} rows [{elapsed}]").expect("template"));
    let stream = dpflow_udfs::cluster::execute_stream(exec, &ctx).await?;
    let stream = dpflow::synth::structure::enforce_stream(na_rules, stream);
    let pb2 = pb.clone();
    let stream = Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        stream.schema(),
        futures::StreamExt::inspect(stream, move |b| {
            if let Ok(b) = b {
                pb2.inc(b.num_rows() as u64)
            }
        }),
    ));
    let n = write_stream(&ctx, &a.out, stream).await.with_context(|| format!("writing {}", a.out))?;
    pb.finish_and_clear();
    eprintln!("wrote {n} rows to {}", a.out);
    Ok(0)
}

/// Arguments of `dpflow eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Real data.
    #[arg(long)]
    pub real: String,
    /// Synthetic data.
    #[arg(long)]
    pub synth: String,
    /// Public domain file (both inputs are read through it).
    #[arg(long)]
    pub domain: String,
    /// Workload spec.
    #[arg(long, default_value = "all-3way")]
    pub workload: String,
    /// Also measure ML efficacy for predicting this column (train on synthetic, test on real; F1).
    #[arg(long)]
    pub ml_target: Option<String>,
    /// Most synthetic rows used to train the ML models.
    #[arg(long, default_value_t = 50_000)]
    pub ml_max_train: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
    /// Also write the curator report (HTML, NOT PRIVATE: heat maps of the
    /// 2/3-way TVDs, k-marginal score, ML efficacy) to this file, owner-only.
    /// Never put it where releases are published.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

pub(super) async fn eval(a: EvalArgs) -> Result<i32> {
    let real = Dataset::open("real", &a.real, None, &a.domain)?;
    let synth = Dataset::open("synthetic", &a.synth, None, &a.domain)?;
    let ctx = session_context();
    let pb = super::progress::spinner("evaluation: counting the marginals of both files");
    let r = dpflow::eval::evaluate(&ctx, &real, &synth, &a.workload).await;
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            pb.finish_and_clear();
            return Err(e.into());
        }
    };
    pb.set_message("evaluation: training the ML efficacy models");
    let ml = match &a.ml_target {
        Some(t) => dpflow::eval::ml::ml_efficacy(&ctx, &real, &synth, t, a.ml_max_train).await.map(Some),
        None => Ok(None),
    };
    pb.finish_and_clear();
    let ml = ml?;
    if let Some(path) = &a.report {
        let html = dpflow::report::curator::render(&r, ml.as_ref(), &a.real, &a.synth)?;
        dpflow::io::write_private_file(path, html.as_bytes())
            .with_context(|| format!("writing the curator report {}", path.display()))?;
        eprintln!("curator report (NOT PRIVATE, owner-only) written: {}", path.display());
    }
    match a.format {
        OutputFormat::Json => {
            let mut v = serde_json::to_value(&r)?;
            if let Some(m) = &ml {
                v["ml"] = serde_json::to_value(m)?;
            }
            println!("{}", serde_json::to_string_pretty(&v)?)
        }
        OutputFormat::Table => {
            println!("{}", r.notice);
            println!("workload {}: error {:.4}", r.workload, r.workload_error);
            println!(
                "TVD 1-way {:.4}  2-way {:.4}  3-way {}",
                r.tvd_1way,
                r.tvd_2way,
                r.tvd_3way.map_or("-".into(), |v| format!("{v:.4}"))
            );
            println!("rows: real {} synthetic {}", r.rows_real, r.rows_synthetic);
            if let Some(k) = &r.kmarginal {
                let groups: Vec<String> = k.groups.iter().map(|g| format!("{} {:.1}", g.group, g.score)).collect();
                let by =
                    k.group_column.as_deref().map_or(String::new(), |c| format!("; by {c}: {}", groups.join(", ")));
                println!("k-marginal score (NIST CRC, 0–1000) {:.1} over {} pairs{by}", k.score, k.pairs);
            }
            if let Some(m) = &ml {
                println!(
                    "ML efficacy ({}, {}): logistic regression {:.4} (real {:.4}), decision tree {:.4} (real {:.4})",
                    m.target,
                    m.metric,
                    m.logistic_regression_f1,
                    m.real_logistic_regression_f1,
                    m.decision_tree_f1,
                    m.real_decision_tree_f1
                );
            }
        }
    }
    Ok(0)
}
