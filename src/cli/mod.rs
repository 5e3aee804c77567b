//! The `dpflow` command line.

mod analyze;
mod budget;
mod cluster;
mod impute;
mod inspect;
mod missing;
mod pipeline;
mod plan;
mod progress;
mod report;
mod serve;
mod sql;
mod synth;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// dpflow: differentially private releases of census-scale data.
#[derive(Debug, Parser)]
#[command(name = "dpflow", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Log level (error, warn, info, debug, trace); also RUST_LOG.
    #[arg(long, global = true, default_value = "warn")]
    pub log: String,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// dpflow's commands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
pub enum Command {
    /// Curator-only report on an input: rows, nulls and out-of-domain values per column (NOT private).
    Inspect(inspect::InspectArgs),
    /// Create and inspect the privacy-budget ledger.
    Budget(budget::BudgetArgs),
    /// Fit a DP synthesizer (AIM, MWEM+PGM, MST, Independent) and write synthetic Parquet.
    Synth(synth::SynthArgs),
    /// Sample synthetic rows from a saved model (no data needed).
    Sample(synth::SampleArgs),
    /// Compare synthetic with real data: workload error and 1/2/3-way TVD (curator-only).
    Eval(synth::EvalArgs),
    /// DP SQL over a catalog of protected tables (one query, or an interactive session).
    Sql(sql::SqlArgs),
    /// Serve DP SQL to PostgreSQL clients (psql, psycopg, JDBC) with analysts, roles and per-analyst budgets.
    Serve(serve::ServeArgs),
    /// Check release pipeline files (errors name the file, line and key).
    Validate(pipeline::ValidateArgs),
    /// Predict a pipeline's errors before anything is read, and the budget a target error needs.
    Plan(plan::PlanArgs),
    /// Write the HTML report of a published release (budget timeline, every released number and its interval).
    Report(report::ReportArgs),
    /// Run one release of a pipeline (plan, reserve, execute, commit, publish).
    Run(pipeline::RunArgs),
    /// Run pipelines on their cron schedules.
    Schedule(pipeline::ScheduleArgs),
    /// DP statistics on kNN-imputed data with smooth sensitivity (imputed rows are never released).
    Impute(impute::ImputeArgs),
    /// Missing-data tools: inject MCAR/MAR/MNAR missingness (evaluation only).
    Missing(missing::MissingArgs),
    /// Run a cluster's scheduler or executor processes (Apache Ballista; docs/cluster.md).
    Cluster(cluster::ClusterCommand),
    /// Run an analysis (mean, proportion, OLS, logistic) on each synthetic set and combine the results (Rubin's rules).
    Analyze(analyze::AnalyzeArgs),
}

/// An error and its causes on one line, as `{:#}` prints them, except that a
/// cause already quoted by the message before it is not printed again (most
/// library errors quote their source, and DataFusion's `External` does too).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Inspect(a) => inspect::run(a).await,
        Command::Analyze(a) => analyze::run(a).await,
        Command::Budget(a) => budget::run(a).await,
        Command::Synth(a) => synth::run(a).await,
        Command::Sample(a) => synth::sample(a).await,
        Command::Eval(a) => synth::eval(a).await,
        Command::Sql(a) => sql::run(a).await,
        Command::Serve(a) => serve::run(a).await,
        Command::Validate(a) => pipeline::validate(a).await,
        Command::Run(a) => pipeline::run(a).await,
        Command::Plan(a) => plan::run(a).await,
        Command::Report(a) => report::run(a).await,
        Command::Schedule(a) => pipeline::schedule_cmd(a).await,
        Command::Impute(a) => impute::run(a).await,
        Command::Missing(a) => missing::run(a).await,
        Command::Cluster(a) => cluster::run(a).await,
    }
}

/// Output format shared by reporting commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum OutputFormat {
    /// Human-readable table.
    #[default]
    Table,
    /// JSON.
    Json,
}

/// The private input of a command: data location, its format and the public domain.
#[derive(Debug, clap::Args)]
pub struct InputArgs {
    /// Input data (file, prefix, glob or URL).
    #[arg(long)]
    pub input: String,
    /// Input format (default: from the extension).
    #[arg(long, value_enum)]
    pub input_format: Option<dpflow::io::InputFormat>,
    /// Public domain file.
    #[arg(long)]
    pub domain: String,
}

impl InputArgs {
    /// Opens the input as a dataset named `name`.
    pub fn open(&self, name: &str) -> Result<dpflow::dataset::Dataset> {
        Ok(dpflow::dataset::Dataset::open(name, &self.input, self.input_format, &self.domain)?)
    }
}

/// Where the reads of protected data run (`--cluster`), for the commands
/// that read them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// Run the reads of protected data on a cluster: df://HOST:PORT (a `dpflow cluster scheduler`)
    /// or standalone (a scheduler and an executor inside this process). Overrides a catalog's or
    /// pipeline's `cluster:`; without either, everything runs in this process. Needs a build with
    /// `--features cluster`.
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
    /// Partitions of the plans sent to the cluster (tasks per stage; default 16).
    #[arg(long, requires = "cluster")]
    pub cluster_partitions: Option<usize>,
    /// Fail the release (charged, as any failure after reading protected data) when one cluster job
    /// has not finished in this time, e.g. 30m or 2h. Default: no limit (with `--cluster`, a
    /// catalog's or pipeline's `cluster: {job_timeout: ...}` is overridden too).
    #[arg(long, requires = "cluster", value_name = "DURATION")]
    pub cluster_job_timeout: Option<String>,
}

impl ClusterArgs {
    /// The setting given, if any.
    pub fn spec(&self) -> Result<Option<dpflow::io::ClusterSpec>> {
        Ok(match &self.cluster {
            Some(c) => Some(
                dpflow::io::ClusterSpec::parse(c, self.cluster_partitions)?
                    .with_job_timeout(self.cluster_job_timeout.as_deref())?,
            ),
            None => None,
        })
    }

    /// A session whose protected reads run where these arguments say: the
    /// cluster is connected (and must answer) now, before anything is charged.
    pub async fn context(&self) -> Result<datafusion::execution::context::SessionContext> {
        Ok(match self.spec()? {
            Some(spec) => dpflow::io::session_context_on(Some(&spec.connect().await?)),
            None => dpflow::io::session_context(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug, thiserror::Error)]
    #[error("reading x.parquet: {source}")]
    struct Quoting {
        source: std::io::Error,
    }

    #[test]
    fn error_text_prints_a_quoted_cause_once_and_keeps_context() {
        let inner = std::io::Error::other("bad page");
        let e = anyhow::Error::new(Quoting { source: inner }).context("step counts");
        assert_eq!(error_text(&e), "step counts: reading x.parquet: bad page");
        let plain = anyhow::anyhow!("a").context("b");
        assert_eq!(error_text(&plain), "b: a");
    }
}
