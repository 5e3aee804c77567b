//! `dpflow run`: one release, crash-safe and idempotent.
//!
//! 1. plan every step and its cost (nothing read); `--dry-run` stops here;
//! 2. if the release's `manifest.json` exists, the release is complete: stop;
//! 3. reserve the whole cost in the ledger under the release id (a committed
//!    charge is never spent again; an open one is resumed);
//! 4. run the steps, writing outputs under a private staging prefix;
//! 5. commit the ledger charge (outputs are durable);
//! 6. publish: copy outputs to their final places, then write `manifest.json`
//!    last (its presence means the release is complete); drop the staging copy.
//!
//! After a crash: before 5 → rerun discards the stale staging copy and runs the
//! steps again under the same (still counted) reservation — the staged outputs
//! were never published; after 5 → rerun only publishes the staged outputs.
//! The staging prefix must be as private as the input data.

use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use serde::Serialize;
use sha2::Digest;

use super::error::{BoxError, PipelineError};
use super::paths::{check_output_name, prepare_private_output, prepare_staging, refuse_links_below, template_root};
use super::spec::{Pipeline, Step};
use crate::dataset::Dataset;
use crate::io::{
    IoError, read_bytes, register_stores_for, resolve_url, session_context, store_for, write_bytes, write_private_bytes,
};
use crate::privacy::{Budget, ChargeStatus, Ledger, LedgerError, MechanismRecord, PrivacyFilter, PrivacyLoss};
use crate::sql::{Catalog, PrivacyUnit, SqlEngine, TableEntry};

/// What a step's ground-truth ε̄ covers (000 §5.2): the steps of a release
/// read the same missingness pattern, so their subsamples are shared and
/// their ε̄ must not be added up.
const AMPLIFICATION_SCOPE: &str =
    "this step alone: every step reads the same missingness pattern, so the steps' ε̄ do not add up";

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Release id (default `<name>-<date>`).
    pub release_id: Option<String>,
    /// Plan only.
    pub dry_run: bool,
    /// UNSAFE: seeded noise (tests only).
    pub unsafe_seed: Option<u64>,
    /// The release's date (default: today in the pipeline's time zone).
    pub date: Option<DateTime<Utc>>,
}

/// One step's planned cost.
#[derive(Debug, Clone, Serialize)]
pub struct StepPlan {
    /// Step name.
    pub step: String,
    /// Kind.
    pub kind: &'static str,
    /// Mechanisms it will charge.
    pub mechanisms: Vec<MechanismRecord>,
    /// Predicted error of what it releases (public inputs only; see
    /// [`crate::privacy::accuracy`]).
    pub predictions: Vec<crate::privacy::Prediction>,
}

/// An output in the manifest.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct OutputRecord {
    /// Step.
    pub step: String,
    /// Final URL.
    pub url: String,
    /// Bytes.
    pub bytes: u64,
    /// SHA-256.
    pub sha256: String,
}

/// The release record (`manifest.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    /// Format tag.
    pub format: &'static str,
    /// Pipeline name.
    pub pipeline: String,
    /// SHA-256 of the pipeline file.
    pub pipeline_sha256: String,
    /// dpflow version.
    pub dpflow_version: String,
    /// Release id.
    pub release_id: String,
    /// Dataset (ledger name) and privacy unit.
    pub dataset: String,
    /// Privacy unit.
    pub privacy_unit: String,
    /// Budget of this release.
    pub budget: Budget,
    /// Spent by this release, in the ledger's unit.
    pub spent: f64,
    /// Composition parts of this release's charge.
    pub spent_parts: crate::privacy::Normalized,
    /// Remaining in the ledger after this release.
    pub remaining: f64,
    /// Ledger charge id.
    pub ledger_charge: i64,
    /// Per step: mechanisms with parameters and noise scales, and step records.
    pub steps: Vec<serde_json::Value>,
    /// Published outputs.
    pub outputs: Vec<OutputRecord>,
    /// When the run started and finished.
    pub started_at: String,
    /// Finished.
    pub finished_at: String,
    /// The seed when one was used (the release is then NOT private).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsafe_seed: Option<u64>,
    /// The release report beside the manifest (`report.html`), if it was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
    /// Why the report could not be written (the release itself is complete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_problem: Option<String>,
}

/// The outcome of `run`.
#[derive(Debug, Clone, Serialize)]
pub enum RunOutcome {
    /// Planned only.
    DryRun {
        /// Steps and costs.
        plan: Vec<StepPlan>,
        /// Total in the budget's unit.
        total: f64,
    },
    /// The release already existed.
    AlreadyComplete {
        /// Its manifest URL.
        manifest: String,
    },
    /// Completed now.
    Completed {
        /// Manifest URL.
        manifest: String,
        /// Spent.
        spent: f64,
        /// Remaining.
        remaining: f64,
    },
}

/// Where an evaluate step's curator report goes: beside its private output,
/// with `.html` for the output's extension.
fn curator_report_path(private_output: &str) -> String {
    let (dir, file) = private_output.rsplit_once('/').map_or(("", private_output), |(d, f)| (d, f));
    let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
    let name = if file.ends_with(".html") { format!("{file}.report.html") } else { format!("{stem}.html") };
    if dir.is_empty() { name } else { format!("{dir}/{name}") }
}

fn template(s: &str, p: &Pipeline, release_id: &str, date: &str) -> String {
    s.replace("{date}", date).replace("{release_id}", release_id).replace("{name}", &p.name)
}

fn join(base: &str, rel: &str) -> String {
    format!("{}/{}", base.trim_end_matches('/'), rel.trim_start_matches('/'))
}

type Result<T, E = PipelineError> = std::result::Result<T, E>;

/// A step's error (from a layer without a typed error of its own yet).
fn step_error(step: &str, source: BoxError) -> PipelineError {
    PipelineError::Step { step: step.to_string(), source }
}

struct Locations {
    output: String,
    staging: String,
    /// The output template's root: nothing is published through a link below it.
    output_root: String,
    /// The staging template's root (the same rule).
    staging_root: String,
}

impl Pipeline {
    fn dataset(&self) -> Result<Dataset> {
        let spec = crate::domain::DomainSpec::load(&self.domain)?;
        Ok(Dataset {
            name: self.dataset.clone(),
            location: self.sources[0].clone(),
            extra_locations: self.sources[1..].to_vec(),
            format: self.format,
            spec: std::sync::Arc::new(spec),
        })
    }

    fn catalog(&self) -> Result<Catalog> {
        let mut tables = std::collections::BTreeMap::new();
        tables.insert(
            self.dataset.clone(),
            TableEntry {
                name: self.dataset.clone(),
                dataset: self.dataset()?,
                public: false,
                unit: match &self.privacy_unit {
                    Some(c) => PrivacyUnit::Column(c.clone()),
                    None => PrivacyUnit::Row,
                },
                max_rows_per_unit: self.max_rows_per_unit,
                max_groups_per_unit: self.max_groups_per_unit,
                ledger_dataset: self.dataset.clone(),
                impute: None,
            },
        );
        for (name, (loc, dom, fmt)) in &self.public_tables {
            tables.insert(
                name.clone(),
                TableEntry {
                    name: name.clone(),
                    dataset: Dataset::open(name, loc, *fmt, dom)?,
                    public: true,
                    unit: PrivacyUnit::Row,
                    max_rows_per_unit: 1,
                    max_groups_per_unit: 1,
                    ledger_dataset: name.clone(),
                    impute: None,
                },
            );
        }
        Ok(Catalog {
            path: self.path.clone(),
            tables,
            ledger: None,
            create_ledger: None,
            query_budget: None,
            confidence: 0.95,
            models: Default::default(),
            cluster: self.cluster.clone(),
        })
    }

    /// Plans every step's cost (reads no data) and checks it fits the release budget.
    pub async fn plan(&self) -> Result<(Vec<StepPlan>, f64)> {
        self.plan_forecast(&crate::sql::Assumptions::default()).await
    }

    /// [`Pipeline::plan`] with each step's predicted error under `assumptions`.
    pub async fn plan_forecast(&self, assumptions: &crate::sql::Assumptions) -> Result<(Vec<StepPlan>, f64)> {
        let plans = self.plan_steps(assumptions, None).await?;
        let mut filter = PrivacyFilter::new(self.budget);
        for p in &plans {
            for m in &p.mechanisms {
                filter.charge(&m.loss).map_err(|source| PipelineError::OverBudget {
                    file: self.path.display().to_string(),
                    budget: self.budget.describe(),
                    step: p.step.clone(),
                    source,
                })?;
            }
        }
        Ok((plans, filter.spent_amount()))
    }

    /// Every step's mechanisms and predictions (only step `only`'s, when
    /// given), not yet checked against the release budget.
    pub(super) async fn plan_steps(
        &self,
        assumptions: &crate::sql::Assumptions,
        only: Option<&str>,
    ) -> Result<Vec<StepPlan>> {
        // Planning reads no data: it needs no cluster.
        let mut catalog = self.catalog()?;
        catalog.cluster = None;
        for t in catalog.tables.values().filter(|t| !t.public) {
            if let Some(why) = t.dataset.domain().dp_read_refusal() {
                return Err(PipelineError::DpReadRefused {
                    file: self.path.display().to_string(),
                    dataset: t.name.clone(),
                    why,
                });
            }
        }
        let mut engine = SqlEngine::open_precharged(catalog, Some(0))
            .await
            .map_err(|e| PipelineError::Tables { file: self.path.display().to_string(), source: e.into() })?;
        let mut plans = Vec::new();
        for step in self.steps.iter().filter(|s| only.is_none_or(|o| o == s.name())) {
            let mut predictions = Vec::new();
            let (kind, mechanisms) = match step {
                Step::Sql { query, budget, name, .. } => {
                    let (records, preds) = engine
                        .predict(query, Some(*budget), assumptions)
                        .await
                        .map_err(|e| step_error(name, e.into()))?;
                    predictions = preds;
                    ("sql", records)
                }
                Step::Synthesize { name, mechanism, budget, missing, workload, options, missing_options, .. } => {
                    // Pipelines have no public bound M: refuse before the run reserves and reads.
                    if *missing == crate::missing::Strategy::ImputeFirst(crate::missing::ImputeMethod::ModeStability) {
                        return Err(PipelineError::ModeStabilityUnsupported {
                            file: self.path.display().to_string(),
                            step: name.clone(),
                        });
                    }
                    let pure = mechanism.pure_dp();
                    // PrivBayes and the 002 synthesizers are pure ε-DP (the ε of their budget); the
                    // others account in zCDP.
                    let kamino = matches!(
                        mechanism,
                        crate::synth::run::Mechanism::Kamino
                            | crate::synth::run::Mechanism::Kaminoi
                            | crate::synth::run::Mechanism::DpMisgan
                            | crate::synth::run::Mechanism::DpGan
                    );
                    let loss = match (pure, *budget) {
                        // Kamino's and the GANs' RDP curves convert to at most the budget's (ε, δ)
                        // (docs/PRIVACY.md §8, §9).
                        (_, Budget::Approx { epsilon, delta }) if kamino => PrivacyLoss::Approx { epsilon, delta },
                        (true, Budget::Pure { epsilon } | Budget::Approx { epsilon, .. }) => {
                            PrivacyLoss::Pure { epsilon }
                        }
                        _ => PrivacyLoss::Zcdp {
                            rho: budget.as_rho().ok_or_else(|| PipelineError::NotZcdp { step: name.clone() })?,
                        },
                    };
                    predictions = self.synth_forecast(
                        name,
                        *mechanism,
                        workload,
                        *budget,
                        options,
                        *missing,
                        missing_options,
                        assumptions,
                    )?;
                    (
                        "synthesize",
                        vec![MechanismRecord {
                            mechanism: mechanism.synthesizer(&Default::default()).name().to_string(),
                            target: format!("synthetic data ({name})"),
                            sensitivity: None,
                            noise: None,
                            loss,
                            params: serde_json::Value::Null,
                        }],
                    )
                }
                Step::Impute { name, spec, estimator, .. } => {
                    predictions.push(crate::privacy::Prediction::new(
                        "imputed values",
                        "imputation",
                        assumptions.level,
                        "DP kNN imputation is calibrated to its smooth sensitivity, which depends on the data: no \
                         error can be predicted before reading it",
                    ));
                    (
                        "impute",
                        crate::impute::planned_records(spec, *estimator).map_err(|e| step_error(name, e.into()))?,
                    )
                }
                Step::Evaluate { .. } => ("evaluate", vec![]),
                // Post-processing of a synthesize step's output.
                Step::Analyze { .. } => ("analyze", vec![]),
            };
            plans.push(StepPlan { step: step.name().to_string(), kind, mechanisms, predictions });
        }
        Ok(plans)
    }

    /// A synthesize step's forecast (`synth::predict`); a workload that
    /// does not parse is the step's error.
    #[allow(clippy::too_many_arguments)]
    fn synth_forecast(
        &self,
        name: &str,
        mechanism: crate::synth::run::Mechanism,
        workload: &str,
        budget: Budget,
        options: &crate::synth::SynthOptions,
        missing: crate::missing::Strategy,
        missing_options: &crate::missing::StrategyOptions,
        a: &crate::sql::Assumptions,
    ) -> Result<Vec<crate::privacy::Prediction>> {
        let dataset = self.dataset()?;
        let domain = dataset.domain();
        let workload =
            crate::synth::workload::Workload::parse(workload, domain).map_err(|e| step_error(name, e.into()))?;
        Ok(crate::synth::predict::predict(&crate::synth::predict::SynthForecastInput {
            mechanism,
            domain,
            workload: &workload,
            budget,
            options,
            missing,
            missing_options,
            rows: a.rows,
            level: a.level,
        }))
    }

    fn open_ledger(&self) -> Result<Ledger> {
        if !self.ledger.exists()
            && let Some(m) = &self.create_ledger
        {
            if let Some(dir) = self.ledger.parent() {
                std::fs::create_dir_all(dir).ok();
            }
            let l = Ledger::create(&self.ledger)?;
            for (ds, b) in m {
                l.add_dataset(ds, "row", *b)?;
            }
            eprintln!("note: created ledger {} with the pipeline's demo budgets", self.ledger.display());
            return Ok(l);
        }
        Ok(Ledger::open(&self.ledger)?)
    }

    /// Runs one release.
    pub async fn run(&self, opts: &RunOptions, progress: &dyn Fn(&str)) -> Result<RunOutcome> {
        let started = Utc::now();
        let (plans, total) = self.plan().await?;
        if opts.dry_run {
            return Ok(RunOutcome::DryRun { plan: plans, total });
        }
        // A pipeline always charges its ledger.
        if opts.unsafe_seed.is_some() {
            return Err(PipelineError::UnsafeSeed);
        }
        let when = opts.date.unwrap_or(started).with_timezone(&self.timezone);
        let date = when.format("%Y-%m-%d").to_string();
        let release_id = opts.release_id.clone().unwrap_or_else(|| format!("{}-{}", self.name, date));
        if let Some(why) = super::spec::release_id_problem(&release_id) {
            return Err(PipelineError::BadReleaseId { id: release_id, why });
        }
        let output = template(&self.output, self, &release_id, &date);
        let staging = match &self.staging {
            Some(s) => join(&template(s, self, &release_id, &date), &release_id),
            None => join(&join(&output, "_staging"), &release_id),
        };
        let output_root = template_root(&self.output).to_string();
        let staging_root = self.staging.as_deref().map_or(output_root.as_str(), template_root).to_string();
        // Before anything is charged: no link below a root (paths.rs).
        refuse_links_below(&output_root, &output)?;
        refuse_links_below(&staging_root, &staging)?;
        let loc = Locations { output, staging, output_root, staging_root };
        // The steps read protected data where the spec says: a cluster (which
        // must answer now, before the reservation) or this process.
        let ctx = match &self.cluster {
            Some(c) => crate::io::session_context_on(Some(&c.connect().await?)),
            None => session_context(),
        };
        let manifest_url = join(&loc.output, "manifest.json");
        if exists(&ctx, &manifest_url).await? {
            return Ok(RunOutcome::AlreadyComplete { manifest: manifest_url });
        }
        // Ledger: reserve (or find) this release's charge.
        let mut ledger = self.open_ledger()?;
        let records: Vec<MechanismRecord> = plans.iter().flat_map(|p| p.mechanisms.clone()).collect();
        let existing = ledger.charge_for_release(&self.dataset, &release_id)?;
        let (charge_id, fresh) = match existing {
            Some(c) if c.status == ChargeStatus::Committed => {
                progress("release already charged; publishing its staged outputs");
                return self.publish(&ctx, &loc, &release_id, c.id, &mut ledger, started, opts, None).await;
            }
            _ => match ledger.reserve(&self.dataset, &release_id, &records, None) {
                Ok(r) => {
                    if r.resumed {
                        progress("resuming an interrupted release under its existing reservation");
                    }
                    (r.charge_id, !r.resumed)
                }
                Err(LedgerError::AlreadyCommitted { charge_id, .. }) => {
                    return self.publish(&ctx, &loc, &release_id, charge_id, &mut ledger, started, opts, None).await;
                }
                Err(e) => return Err(e.into()),
            },
        };
        // A resumed reservation whose earlier attempt saved napsu-mq statistics
        // (a file usable with `dpflow synth --from-record`, its path shown in
        // the progress output) must not measure again under the same charge:
        // settle it as failed and keep the statistics, as `dpflow synth`
        // refuses to resume (docs/PRIVACY.md §5).
        // The decision comes from the ledger and the spec, not from what staging
        // holds (staging may have moved with the date or an edit, or lost files):
        // an open reservation of a release with a napsu-mq step, now or when it
        // was reserved, is never resumed.
        let napsu_now = self
            .steps
            .iter()
            .any(|s| matches!(s, Step::Synthesize { mechanism: crate::synth::run::Mechanism::NapsuMq, .. }));
        let napsu_then = existing.as_ref().is_some_and(|c| c.mechanisms.iter().any(|m| m.mechanism == "napsu-mq"));
        if !fresh && (napsu_now || napsu_then) {
            ledger.fail(charge_id, "interrupted release with a napsu-mq step: settled, not resumed")?;
            let staged = self.staged_napsu_records(&ctx, &loc).await?;
            let kept = if staged.is_empty() {
                "no napsu-mq statistics were found in this run's staging area (the interruption came before the \
                 measurement, or staging has moved)"
                    .to_string()
            } else {
                let kept = self.keep_napsu_statistics(&ctx, &loc, charge_id, &staged).await?;
                let _ = delete_prefix(&ctx, &loc.staging).await;
                format!(
                    "the statistics are kept beside the staging area (owner-only on local disk) in {}",
                    kept.join(", ")
                )
            };
            return Err(PipelineError::NapsuInterrupted { release: release_id, charge: charge_id, kept });
        }
        // Fresh staging area (a previous crash may have left partial outputs),
        // owner-only, and the curator-only outputs' directories. Nothing has been
        // read yet: if this fails, a reservation made by this run goes back to the
        // budget; a resumed one (an earlier attempt may have read) stays.
        if let Err(e) = delete_prefix(&ctx, &loc.staging).await.and_then(|()| self.prepare_local(&loc)) {
            if fresh {
                ledger.release(charge_id, "the staging area could not be prepared (before any read)")?;
            }
            return Err(e);
        }
        let step_records = match self.run_steps(&ctx, &loc, opts, &plans, progress).await {
            Ok(r) => r,
            Err(PipelineError::NapsuInference { step, record, source }) => {
                // After the statistics were saved: everything since is post-processing
                // of DP output, so the statistics are kept and the cause shown; the
                // charge is still spent (docs/PRIVACY.md §5). The charge is settled
                // first: statistics are kept only under a charge recorded as failed,
                // never under an open reservation that a rerun would resume and
                // measure again.
                if ledger.fail(charge_id, "napsu-mq inference failed after the measurement (statistics kept)").is_err()
                {
                    // Staging is left as it is: the next run finds the open reservation
                    // and settles it (above) instead of measuring again.
                    return Err(crate::privacy::charge_failure("pipeline run", Some((&ledger, charge_id)), source));
                }
                let kept = match self.staged_napsu_records(&ctx, &loc).await {
                    Ok(records) => {
                        self.keep_napsu_statistics(&ctx, &loc, charge_id, &records).await.map(|k| (records, k))
                    }
                    Err(e) => Err(e),
                };
                let _ = delete_prefix(&ctx, &loc.staging).await;
                let Ok((records, kept)) = kept else {
                    // The charge is already failed; the copy's cause is withheld.
                    let failure: crate::privacy::FailureError =
                        crate::privacy::ProtectedFailure::new("pipeline run", Some(charge_id)).into();
                    return Err(failure.into());
                };
                let record = records.iter().position(|r| *r == record).map_or(record, |i| kept[i].clone());
                return Err(PipelineError::NapsuInference { step, record, source });
            }
            Err(e) => {
                // Nothing was published, but the steps read protected data: the
                // failure is charged and its cause withheld (docs/PRIVACY.md §1).
                let _ = delete_prefix(&ctx, &loc.staging).await;
                return Err(crate::privacy::charge_failure("pipeline run", Some((&ledger, charge_id)), e));
            }
        };
        let records_json = serde_json::to_vec(&step_records).map_err(|source| PipelineError::Json {
            action: "encoding",
            what: "the step records".into(),
            source,
        })?;
        if let Err(e) = write_bytes(&ctx, &join(&loc.staging, "_steps.json"), records_json).await {
            let _ = delete_prefix(&ctx, &loc.staging).await;
            return Err(crate::privacy::charge_failure("pipeline run", Some((&ledger, charge_id)), e));
        }
        ledger.commit(charge_id)?;
        progress("ledger charge committed");
        self.publish(&ctx, &loc, &release_id, charge_id, &mut ledger, started, opts, Some(step_records)).await
    }

    /// The napsu-mq records (noisy statistics) that steps of this release
    /// have saved in staging.
    async fn staged_napsu_records(
        &self,
        ctx: &datafusion::execution::context::SessionContext,
        loc: &Locations,
    ) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for s in &self.steps {
            if let Step::Synthesize { mechanism: crate::synth::run::Mechanism::NapsuMq, output, .. } = s {
                let record = join(&loc.staging, &super::spec::napsu_record_name(output));
                if exists(ctx, &record).await? {
                    out.push(record);
                }
            }
        }
        Ok(out)
    }

    /// Copies staged napsu-mq records to a new owner-only directory beside
    /// staging, `<staging>.failed-<charge id>[-k]/` (outside staging, which a
    /// rerun clears; never one that already has files), each record marked
    /// with the charge that paid for it. Call only once the charge is
    /// settled as failed. Returns where each record went.
    async fn keep_napsu_statistics(
        &self,
        ctx: &datafusion::execution::context::SessionContext,
        loc: &Locations,
        charge_id: i64,
        records: &[String],
    ) -> Result<Vec<String>> {
        let base = format!("{}.failed-{charge_id}", loc.staging.trim_end_matches('/'));
        let mut dir = base.clone();
        let mut k = 1;
        while !prefix_is_empty(ctx, &dir).await? {
            k += 1;
            dir = format!("{base}-{k}");
        }
        refuse_links_below(&loc.staging_root, &dir)?;
        prepare_staging(&dir)?;
        let staging = format!("{}/", loc.staging.trim_end_matches('/'));
        let mut kept = Vec::with_capacity(records.len());
        for record in records {
            let name = record.strip_prefix(&staging).unwrap_or(record.rsplit('/').next().unwrap_or(record));
            let to = join(&dir, name);
            let bytes = crate::io::read_bytes(ctx, record).await?;
            // The record was written with no ledger (the pipeline holds the charge).
            let bytes = match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(serde_json::Value::Object(mut o)) => {
                    o.insert("ledger_charge".into(), charge_id.into());
                    serde_json::to_vec_pretty(&o).unwrap_or_else(|_| bytes.to_vec())
                }
                _ => bytes,
            };
            write_bytes(ctx, &to, bytes).await?;
            kept.push(to);
        }
        Ok(kept)
    }

    /// Local directories a release needs, made before any data is read: the
    /// owner-only staging area and the curator-only outputs' directories.
    fn prepare_local(&self, loc: &Locations) -> Result<()> {
        if self.staging.is_none() {
            prepare_staging(&join(&loc.output, "_staging"))?;
        }
        prepare_staging(&loc.staging)?;
        for s in &self.steps {
            if let Step::Evaluate { private_output, .. } = s {
                prepare_private_output(private_output)?;
                prepare_private_output(&curator_report_path(private_output))?;
            }
        }
        Ok(())
    }

    async fn run_steps(
        &self,
        ctx: &datafusion::execution::context::SessionContext,
        loc: &Locations,
        opts: &RunOptions,
        plans: &[StepPlan],
        progress: &dyn Fn(&str),
    ) -> Result<Vec<serde_json::Value>> {
        let mut engine = SqlEngine::open_precharged(self.catalog()?, opts.unsafe_seed)
            .await
            .map_err(|e| PipelineError::Tables { file: self.path.display().to_string(), source: e.into() })?;
        let mut records = Vec::new();
        let mut synth_outputs: std::collections::HashMap<String, String> = Default::default();
        let mut synth_sets: std::collections::HashMap<String, (Option<String>, bool)> = Default::default();
        for step in &self.steps {
            let t = Instant::now();
            progress(&format!("step {}", step.name()));
            match step {
                Step::Sql { name, query, budget, output } => {
                    // Each output column's statistic and stated interval (public: from the plan).
                    let columns = plans.iter().find(|p| &p.step == name).map(|p| p.predictions.clone());
                    let r = engine.query(query, Some(*budget)).await.map_err(|e| step_error(name, e.into()))?;
                    let mut buf = Vec::new();
                    {
                        let mut w = datafusion::arrow::csv::WriterBuilder::new().with_header(true).build(&mut buf);
                        for b in &r.batches {
                            w.write(b).map_err(|source| PipelineError::Csv { step: name.clone(), source })?;
                        }
                    }
                    write_bytes(ctx, &join(&loc.staging, output), buf).await?;
                    records.push(serde_json::json!({
                        "step": name, "kind": "sql", "query": query, "mechanisms": r.mechanisms,
                        "columns": columns, "outputs": [output], "seconds": t.elapsed().as_secs_f64(),
                    }));
                }
                Step::Synthesize {
                    name,
                    mechanism,
                    workload,
                    rows,
                    budget,
                    output,
                    model_output,
                    iters,
                    max_model_size,
                    missing,
                    multiple,
                    napsu,
                    dips,
                    options,
                    missing_options,
                    midpoints,
                } => {
                    let is_napsu = *mechanism == crate::synth::run::Mechanism::NapsuMq;
                    // napsu-mq saves its noisy statistics (published with the release); the
                    // others' records live in the pipeline's step record.
                    let record_out = if is_napsu {
                        join(&loc.staging, &super::spec::napsu_record_name(output))
                    } else {
                        String::new()
                    };
                    let req = crate::synth::run::SynthRequest {
                        dataset: self.dataset()?,
                        mechanism: *mechanism,
                        budget: *budget,
                        workload: workload.clone(),
                        rows: *rows,
                        out: join(&loc.staging, output),
                        model_out: model_output.as_ref().map(|m| join(&loc.staging, m)),
                        record_out: Some(record_out),
                        ledger: None,
                        release_id: None,
                        unsafe_seed: opts.unsafe_seed,
                        options: crate::synth::SynthOptions {
                            iters: *iters,
                            max_model_mb: *max_model_size,
                            multiple: *multiple,
                            napsu: napsu.clone(),
                            dips: *dips,
                            ..options.clone()
                        },
                        decode: if *midpoints {
                            dpflow_udfs::domain::DecodeMode::Midpoint
                        } else {
                            dpflow_udfs::domain::DecodeMode::Uniform
                        },
                        missing: *missing,
                        missing_options: missing_options.clone(),
                        // The dataset's declared missingness: the record (and the step's
                        // manifest entry) report the ground-truth ε̄ where it applies.
                        amplification: self.missingness.as_ref().map(|(m, rates)| {
                            crate::missing::AmplificationRequest {
                                missingness: *m,
                                rates: rates.clone(),
                                delta: match budget {
                                    Budget::Approx { delta, .. } => *delta,
                                    _ => 1e-9,
                                },
                            }
                        }),
                    };
                    let rec = match crate::synth::run::run_synth(ctx, &req, progress).await {
                        Ok(rec) => rec,
                        Err(crate::synth::SynthError::NapsuInference { record, source }) => {
                            return Err(PipelineError::NapsuInference { step: name.clone(), record, source });
                        }
                        Err(e) => return Err(step_error(name, e.into())),
                    };
                    let mut outs = vec![output.clone()];
                    outs.extend(model_output.iter().cloned());
                    if is_napsu {
                        outs.push(super::spec::napsu_record_name(output));
                    }
                    synth_outputs.insert(name.clone(), join(&loc.staging, output));
                    synth_sets.insert(name.clone(), (rec.set_column.clone(), rec.noise_aware.unwrap_or(false)));
                    records.push(serde_json::json!({
                        "step": name, "kind": "synthesize", "mechanism": rec.mechanism, "rho": rec.rho,
                        "rho_spent": rec.rho_spent, "rows": rec.rows, "mechanisms": rec.mechanisms,
                        "measurements": rec.fit.measurements, "error_bounds": rec.fit.error_bounds,
                        "multiple": rec.multiple, "noise_aware": rec.noise_aware, "set_column": rec.set_column,
                        "inference": rec.napsu.as_ref().and_then(|n| n.inference.clone()),
                        "amplification": rec.amplification, "amplification_note": rec.amplification_note,
                        "amplification_scope": rec.amplification.as_ref().map(|_| AMPLIFICATION_SCOPE),
                        "outputs": outs, "seconds": t.elapsed().as_secs_f64(),
                    }));
                }
                Step::Impute { name, spec, estimator, output } => {
                    let mechanisms =
                        crate::impute::planned_records(spec, *estimator).map_err(|e| step_error(name, e.into()))?;
                    let mut rng = dpflow_udfs::noise::DpRng::new(opts.unsafe_seed)?;
                    let report = crate::impute::run(ctx, spec, *estimator, &mut rng)
                        .await
                        .map_err(|e| step_error(name, e.into()))?;
                    let mut csv = String::from("query,value,noisy_count\n");
                    for r in &report.results {
                        let v = r.value.map_or(String::new(), |v| v.to_string());
                        let c = r.count.map_or(String::new(), |c| c.to_string());
                        csv += &format!("{},{v},{c}\n", r.name);
                    }
                    write_bytes(ctx, &join(&loc.staging, output), csv.into_bytes()).await?;
                    records.push(serde_json::json!({
                        "step": name, "kind": "impute", "estimator": estimator, "mechanisms": mechanisms,
                        "note": "statistics of kNN-imputed data with smooth-sensitivity noise (004); the imputed rows are not released",
                        "outputs": [output], "seconds": t.elapsed().as_secs_f64(),
                    }));
                }
                Step::Analyze { name, synthetic, analyses, level, rule, max_std_error, output } => {
                    let location = synth_outputs.get(synthetic).ok_or_else(|| PipelineError::UnknownSynthetic {
                        step: name.clone(),
                        synthetic: synthetic.clone(),
                    })?;
                    let (set_column, noise_aware) = synth_sets.get(synthetic).cloned().unwrap_or_default();
                    let sets = match set_column {
                        Some(column) => crate::analyze::Sets::Column { location: location.clone(), column },
                        None => crate::analyze::Sets::Locations(vec![location.clone()]),
                    };
                    let options = crate::analyze::Options {
                        rule: *rule,
                        alpha: 1.0 - level,
                        max_std_error: *max_std_error,
                        ..Default::default()
                    };
                    let results = crate::analyze::analyze(&sets, analyses, &options)
                        .await
                        .map_err(|e| step_error(name, e.into()))?;
                    let csv = crate::analyze::to_csv(&results);
                    write_bytes(ctx, &join(&loc.staging, output), csv.into_bytes()).await?;
                    records.push(serde_json::json!({
                        "step": name, "kind": "analyze", "synthetic": synthetic, "analyses": analyses,
                        "rule": results.first().map(|r| r.rule.name()), "level": level,
                        "max_std_error": max_std_error,
                        "noise_aware": noise_aware,
                        "note": if noise_aware {
                            "estimates combined across noise-aware synthetic sets (post-processing: no budget)"
                        } else {
                            "NOT noise-aware: the sets come from one model, so these intervals ignore the DP noise \
                             (use mechanism napsu-mq with multiple > 1 for valid intervals); post-processing: no budget"
                        },
                        "outputs": [output], "seconds": t.elapsed().as_secs_f64(),
                    }));
                }
                Step::Evaluate { name, synthetic, workload, private_output } => {
                    let synth_loc = synth_outputs.get(synthetic).ok_or_else(|| PipelineError::UnknownSynthetic {
                        step: name.clone(),
                        synthetic: synthetic.clone(),
                    })?;
                    let real = self.dataset()?;
                    let mut syn = self.dataset()?;
                    syn.location = synth_loc.clone();
                    syn.extra_locations = vec![];
                    syn.format = None;
                    let r = crate::eval::evaluate(ctx, &real, &syn, workload)
                        .await
                        .map_err(|e| step_error(name, e.into()))?;
                    let json = serde_json::to_vec_pretty(&r).map_err(|source| PipelineError::Json {
                        action: "encoding",
                        what: format!("the evaluation of step {name}"),
                        source,
                    })?;
                    // Curator-only: written to a private place, never published; the
                    // curator report beside it.
                    write_private_bytes(ctx, private_output, json).await?;
                    let html = crate::report::curator::render(&r, None, &real.location, synth_loc)
                        .map_err(|e| step_error(name, e.into()))?;
                    write_private_bytes(ctx, &curator_report_path(private_output), html.into_bytes()).await?;
                    records.push(serde_json::json!({
                        "step": name, "kind": "evaluate", "note": "curator-only evaluation (JSON, and an HTML report beside it) written to a private location; not part of the release",
                    }));
                }
            }
        }
        Ok(records)
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &self,
        ctx: &datafusion::execution::context::SessionContext,
        loc: &Locations,
        release_id: &str,
        charge_id: i64,
        ledger: &mut Ledger,
        started: DateTime<Utc>,
        opts: &RunOptions,
        step_records: Option<Vec<serde_json::Value>>,
    ) -> Result<RunOutcome> {
        let steps: Vec<serde_json::Value> = match step_records {
            Some(s) => s,
            None => {
                let records = join(&loc.staging, "_steps.json");
                let b = read_bytes(ctx, &records).await.map_err(|source| PipelineError::StagedMissing {
                    release_id: release_id.to_string(),
                    staging: loc.staging.clone(),
                    source: Box::new(source),
                })?;
                serde_json::from_slice(&b).map_err(|source| PipelineError::Json {
                    action: "decoding",
                    what: records,
                    source,
                })?
            }
        };
        let mut outputs = Vec::new();
        for s in &steps {
            let step = s["step"].as_str().unwrap_or_default().to_string();
            for o in s["outputs"].as_array().cloned().unwrap_or_default() {
                let rel = o.as_str().unwrap_or_default();
                check_output_name(rel)?;
                let src = join(&loc.staging, rel);
                let dst = join(&loc.output, rel);
                refuse_links_below(&loc.output_root, &dst)?;
                let bytes = read_bytes(ctx, &src).await?;
                let sha = hex::encode(sha2::Sha256::digest(&bytes));
                let n = bytes.len() as u64;
                write_bytes(ctx, &dst, bytes).await?;
                outputs.push(OutputRecord { step: step.clone(), url: dst, bytes: n, sha256: sha });
            }
        }
        let charge = ledger.charge(charge_id)?;
        let status = ledger.status(&self.dataset)?;
        let mut manifest = Manifest {
            format: "dpflow-release-v1",
            pipeline: self.name.clone(),
            pipeline_sha256: self.sha256.clone(),
            dpflow_version: env!("CARGO_PKG_VERSION").into(),
            release_id: release_id.into(),
            dataset: self.dataset.clone(),
            privacy_unit: self.privacy_unit.clone().unwrap_or_else(|| "row".into()),
            budget: self.budget,
            spent: charge.cost,
            spent_parts: charge.normalized,
            remaining: status.remaining,
            ledger_charge: charge_id,
            steps,
            outputs,
            started_at: started.to_rfc3339(),
            finished_at: Utc::now().to_rfc3339(),
            unsafe_seed: opts.unsafe_seed,
            report: Some("report.html".into()),
            report_problem: None,
        };
        // The report (public outputs and the ledger only), before the manifest: a
        // release whose manifest exists is complete. A report that cannot be made
        // does not hold the release back; the manifest says why.
        let report_url = join(&loc.output, "report.html");
        refuse_links_below(&loc.output_root, &report_url)?;
        let report = async {
            let value = serde_json::to_value(&manifest).map_err(|e| e.to_string())?;
            let history = ledger.history(Some(&self.dataset)).map_err(|e| e.to_string())?;
            let dataset = self.dataset().map_err(|e| e.to_string())?;
            let html = crate::report::gather::build(
                ctx,
                &value,
                &loc.output,
                Some(&dataset),
                Some((&status.dataset.budget, &history)),
            )
            .await
            .map_err(|e| e.to_string())?;
            write_bytes(ctx, &report_url, html.into_bytes()).await.map_err(|e| e.to_string())
        }
        .await;
        if let Err(why) = report {
            manifest.report = None;
            manifest.report_problem = Some(why);
        }
        let manifest_url = join(&loc.output, "manifest.json");
        refuse_links_below(&loc.output_root, &manifest_url)?;
        // Last: its presence means the release is complete.
        let json = serde_json::to_vec_pretty(&manifest).map_err(|source| PipelineError::Json {
            action: "encoding",
            what: "the manifest".into(),
            source,
        })?;
        write_bytes(ctx, &manifest_url, json).await?;
        delete_prefix(ctx, &loc.staging).await.ok();
        if self.staging.is_none()
            && let Ok(url) = resolve_url(&join(&loc.output, "_staging"))
            && url.scheme() == "file"
            && let Ok(p) = url.to_file_path()
        {
            // The default staging parent, if no other release is staging there (remove_dir needs it empty).
            let _ = std::fs::remove_dir(p);
        }
        Ok(RunOutcome::Completed { manifest: manifest_url, spent: charge.cost, remaining: status.remaining })
    }
}

/// The store behind `location`, with its URL and object path (as a prefix,
/// ending in `/`, when `prefix` is set).
fn object_location(
    ctx: &datafusion::execution::context::SessionContext,
    location: &str,
    prefix: bool,
) -> Result<(url::Url, std::sync::Arc<dyn object_store::ObjectStore>, ObjectPath)> {
    let url =
        if prefix { resolve_url(&format!("{}/", location.trim_end_matches('/')))? } else { resolve_url(location)? };
    register_stores_for(ctx, &url)?;
    let store = store_for(ctx, &url)?;
    let path = ObjectPath::from_url_path(url.path())
        .map_err(|source| IoError::BadPath { location: location.to_string(), source })?;
    Ok((url, store, path))
}

async fn exists(ctx: &datafusion::execution::context::SessionContext, location: &str) -> Result<bool> {
    let (_, store, path) = object_location(ctx, location, false)?;
    match store.head(&path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(source) => Err(PipelineError::Exists { location: location.to_string(), source }),
    }
}

/// Whether nothing is stored under a prefix.
async fn prefix_is_empty(ctx: &datafusion::execution::context::SessionContext, location: &str) -> Result<bool> {
    let (url, store, prefix) = object_location(ctx, location, true)?;
    let local_dir = url.scheme() == "file" && url.to_file_path().is_ok_and(|p| p.exists());
    match store.list(Some(&prefix)).try_next().await {
        Ok(first) => Ok(first.is_none() && !local_dir),
        Err(source) => Err(PipelineError::Exists { location: location.to_string(), source }),
    }
}

/// Deletes every object under a prefix (and the local directory).
pub async fn delete_prefix(ctx: &datafusion::execution::context::SessionContext, location: &str) -> Result<()> {
    let (url, store, prefix) = object_location(ctx, location, true)?;
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap_or_default();
    for o in objects {
        store.delete(&o.location).await.ok();
    }
    if url.scheme() == "file"
        && let Ok(p) = url.to_file_path()
    {
        let _ = std::fs::remove_dir_all(p);
    }
    Ok(())
}
