//! `dpflow validate`, `dpflow run`, `dpflow schedule`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use dpflow::pipeline::run::RunOutcome;
use dpflow::pipeline::schedule::{ScheduleOptions, load_state, schedule};
use dpflow::pipeline::{Pipeline, RunOptions};

/// Arguments of `dpflow validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Pipeline files.
    #[arg(required = true)]
    pub files: Vec<String>,
}

/// Prints what validation found questionable (public inputs only).
pub(super) fn warn(p: &Pipeline) {
    for w in &p.warnings {
        eprintln!("WARNING: {}: {w}", p.path.display());
    }
}

pub(super) async fn validate(a: ValidateArgs) -> Result<i32> {
    let mut code = 0;
    for f in &a.files {
        match Pipeline::load(f) {
            Ok(p) => match p.plan().await {
                Ok((_, total)) => {
                    println!("{f}: ok ({} steps; cost {total:.6} of {})", p.steps.len(), p.budget.describe());
                    warn(&p);
                }
                Err(e) => {
                    eprintln!("{f}: {e:#}");
                    code = 1;
                }
            },
            Err(e) => {
                eprintln!("{e}");
                code = 1;
            }
        }
    }
    Ok(code)
}

/// Arguments of `dpflow run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline file.
    pub file: String,
    /// Release id (default `<name>-<date>`): the same id never spends twice.
    #[arg(long)]
    pub release_id: Option<String>,
    /// Print the plan and its cost; spend nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// UNSAFE: seeded noise (tests only; the release is NOT private).
    #[arg(long)]
    pub unsafe_seed: Option<u64>,
    /// Where the steps read the protected data (overrides the pipeline's `cluster:`).
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

pub(super) async fn run(a: RunArgs) -> Result<i32> {
    let mut p = Pipeline::load(&a.file)?;
    warn(&p);
    if let Some(spec) = a.cluster.spec()? {
        p.cluster = Some(spec);
    }
    if a.unsafe_seed.is_some() {
        eprintln!("WARNING: --unsafe-seed makes the noise reproducible: this release is NOT differentially private.");
    }
    let pb = super::progress::spinner("");
    let progress = |m: &str| pb.set_message(m.to_string());
    let opts = RunOptions { release_id: a.release_id, dry_run: a.dry_run, unsafe_seed: a.unsafe_seed, date: None };
    let outcome = p.run(&opts, &progress).await;
    pb.finish_and_clear();
    match outcome? {
        RunOutcome::DryRun { plan, total } => {
            println!("pipeline {} (release budget {}): planned cost {total:.6}", p.name, p.budget.describe());
            super::plan::print_plan(&plan);
            println!(
                "(dry run: nothing was read or spent; `dpflow plan {} --rows N` forecasts means and workload floors, \
                 --target-ci the budget for a target error)",
                a.file
            );
        }
        RunOutcome::AlreadyComplete { manifest } => println!("release already complete: {manifest}"),
        RunOutcome::Completed { manifest, spent, remaining } => {
            println!("release complete: {manifest} (spent {spent:.6}; {remaining:.6} left)")
        }
    }
    Ok(0)
}

/// Arguments of `dpflow schedule`.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// Pipeline files (each with a `schedule:` cron).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// State and lock directory.
    #[arg(long, default_value = ".dpflow-schedule")]
    pub state_dir: PathBuf,
    /// Print each pipeline's state and exit (non-zero if any stopped).
    #[arg(long)]
    pub status: bool,
    /// UNSAFE: seeded noise (tests only).
    #[arg(long)]
    pub unsafe_seed: Option<u64>,
}

pub(super) async fn schedule_cmd(a: ScheduleArgs) -> Result<i32> {
    let pipelines = a.files.iter().map(Pipeline::load).collect::<Result<Vec<_>, _>>()?;
    if a.status {
        let mut code = 0;
        let states: Vec<_> = pipelines.iter().map(|p| load_state(&a.state_dir, &p.name)).collect();
        println!("{}", serde_json::to_string_pretty(&states)?);
        if states.iter().any(|s| s.stopped.is_some()) {
            code = 3;
        }
        return Ok(code);
    }
    for p in &pipelines {
        warn(p);
        if p.schedule.is_none() {
            anyhow::bail!("{}: no `schedule:` cron expression", p.path.display());
        }
    }
    Ok(schedule(pipelines, ScheduleOptions { state_dir: a.state_dir, unsafe_seed: a.unsafe_seed }).await?)
}
