//! Where the plans that read protected data run: in this process, or on an
//! Apache Ballista cluster (feature `cluster`).
//!
//! dpflow plans every read of protected data as a DataFusion *physical* plan
//! in the client (file listing, `EncodeExec`, `MarginalExec`, the SQL helper
//! aggregates, `SyntheticExec`), and charges for it before it runs. Running it
//! is the one step that changes in cluster mode: [`collect`] and
//! [`execute_stream`] hand the plan to DataFusion in this process, or, when the
//! session carries a [`ClusterTarget`], serialize it (with [`codec`]'s
//! extension codec) and submit it to a Ballista scheduler, which cuts it into
//! stages at its exchanges (`CoalescePartitionsExec`, hash repartitions) and
//! runs them on the executors. Only exact aggregates and synthetic rows come
//! back; noise is drawn here, in the client, once, after the results arrived.
//!
//! **Exactly once.** A task retry, a lost executor or speculative execution
//! can re-run a stage on the cluster. What a stage computes is a pure function
//! of its input files and plan (exact counts and sums; synthetic chunks whose
//! random stream is seeded by their global row position, see
//! [`crate::synth::SyntheticExec`]), so a re-run returns the same values, and
//! the client charges before submitting and draws noise after collecting,
//! never on the cluster.
//!
//! **Resubmission.** Ballista recovers a lost executor's *tasks*, but not the
//! job's *results*: the final task's output stays on the executor that ran it,
//! and the client fetches it from there after the job succeeded, so an
//! executor lost in that window fails the fetch. The client therefore submits a
//! job again, at most [`SUBMISSIONS`] jobs in all, when the job **finished**
//! but its results could not be fetched before any of its batches reached the
//! caller ([`collect`]: before the whole result was gathered). A new job
//! computes the same exact values (the plan is a pure function of the files, up
//! to per-attempt random choices such as contribution bounding's row order,
//! which are read from one job only), and no noise has been drawn yet, so a
//! resubmission cannot change what is released or charge again. A job that
//! *failed* is not resubmitted: its failure can depend on the data (a bad
//! value, memory), and sampling it again would multiply what the failure
//! tells. Nor is a stream that fails after delivering batches. Both fail the
//! release, charged. What a failed fetch said is not logged (it can quote
//! data).

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;

#[cfg(feature = "cluster")]
mod client;
#[cfg(feature = "cluster")]
pub mod codec;
#[cfg(feature = "cluster")]
pub mod process;
pub mod shape;
#[cfg(feature = "cluster")]
pub mod state;
pub mod stores;

/// Where a session's protected reads run, as a user writes it: `df://HOST:PORT`
/// (a running Ballista scheduler, e.g. `dpflow cluster scheduler`) or
/// `standalone` (a scheduler and one executor started inside this process:
/// for tests and for trying cluster mode on one machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cluster {
    /// A scheduler at `host:port`.
    Remote {
        /// Host name or address.
        host: String,
        /// gRPC port (Ballista's default is 50050).
        port: u16,
    },
    /// An in-process scheduler and executor.
    Standalone,
}

/// Why a cluster address cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Not `df://HOST:PORT` or `standalone`.
    #[error(
        "{given:?} is not a cluster address: write df://HOST:PORT (a dpflow cluster scheduler, port 50050 by default) or standalone"
    )]
    Address {
        /// What was given.
        given: String,
    },
    /// This build has no cluster mode.
    #[error(
        "this dpflow was built without cluster mode: rebuild it with `cargo build --release --features cluster`, or drop the cluster setting to run in this process"
    )]
    NotBuilt,
    /// The scheduler does not answer.
    #[error(
        "no dpflow cluster scheduler answers at {url}: start one with `dpflow cluster scheduler --port PORT` (and executors with `dpflow cluster executor --scheduler {url}`), or check the address"
    )]
    Unreachable {
        /// The scheduler's URL.
        url: String,
    },
    /// A job timeout that is not a positive duration.
    #[error("job_timeout {given:?} is not a positive duration: write e.g. 90s, 30m or 2h")]
    JobTimeout {
        /// What was given.
        given: String,
    },
    /// The in-process cluster could not start.
    #[error("the standalone cluster could not start: {0}")]
    Standalone(String),
}

impl std::str::FromStr for Cluster {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<Self, ClusterError> {
        let bad = || ClusterError::Address { given: s.to_string() };
        let t = s.trim();
        if t.eq_ignore_ascii_case("standalone") {
            return Ok(Cluster::Standalone);
        }
        let rest = t.strip_prefix("df://").ok_or_else(bad)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        if host.is_empty() || port == 0 || host.contains(['/', '?', '#', '@', ' ']) {
            return Err(bad());
        }
        Ok(Cluster::Remote { host: host.to_string(), port })
    }
}

impl std::fmt::Display for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cluster::Remote { host, port } => write!(f, "df://{host}:{port}"),
            Cluster::Standalone => f.write_str("standalone"),
        }
    }
}

/// A connected cluster, carried by a session's config
/// ([`SessionContext::copied_config`]'s extensions): plans run through
/// [`collect`] and [`execute_stream`] go to its scheduler.
#[derive(Debug, Clone)]
pub struct ClusterTarget {
    /// The scheduler, `http://host:port`.
    pub scheduler_url: String,
    /// How the user named it (for messages and records).
    pub cluster: Cluster,
    /// Partitions of the plans planned for it (file scan groups, synthetic
    /// streams): the tasks one stage can spread over the executors.
    pub partitions: usize,
    /// How long one plan may take on the cluster, from its first submission
    /// until its job finished and its first results arrived (resubmissions
    /// included); `None` waits as long as the job runs. See
    /// [`Self::with_job_timeout`].
    pub job_timeout: Option<std::time::Duration>,
    /// Jobs submitted through this connection (shared by its clones).
    submitted: Arc<std::sync::atomic::AtomicU64>,
}

impl PartialEq for ClusterTarget {
    fn eq(&self, other: &Self) -> bool {
        (&self.scheduler_url, &self.cluster, self.partitions, self.job_timeout)
            == (&other.scheduler_url, &other.cluster, other.partitions, other.job_timeout)
    }
}

impl Eq for ClusterTarget {}

impl ClusterTarget {
    /// A target for the scheduler at `scheduler_url`, connected as `cluster`.
    pub fn new(scheduler_url: String, cluster: Cluster, partitions: usize) -> Self {
        Self { scheduler_url, cluster, partitions: partitions.max(1), job_timeout: None, submitted: Default::default() }
    }

    /// This target with a job timeout: a plan whose job has not finished (and
    /// delivered its first results) `timeout` after its submission fails the
    /// release, which is charged like any failure after a protected read. It
    /// bounds a job Ballista never finishes (docs/cluster.md, Limits). The
    /// client stops waiting; the scheduler keeps the abandoned job until it
    /// ends or the scheduler restarts.
    pub fn with_job_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.job_timeout = timeout;
        self
    }

    /// Jobs submitted to this cluster through this connection so far
    /// (diagnostics and tests: they show that a plan left the process).
    pub fn jobs_submitted(&self) -> u64 {
        self.submitted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Default partitions of plans planned for a cluster: enough tasks per stage
/// for a few executors' cores, few enough that per-task overhead stays small.
pub const DEFAULT_CLUSTER_PARTITIONS: usize = 16;

/// Connects to `cluster` (for `standalone`, starts it in this process, once)
/// and checks that its scheduler answers, so that a wrong address fails
/// before anything is charged.
pub async fn connect(cluster: &Cluster, partitions: Option<usize>) -> Result<ClusterTarget, ClusterError> {
    #[cfg(feature = "cluster")]
    {
        client::connect(cluster, partitions).await
    }
    #[cfg(not(feature = "cluster"))]
    {
        let _ = (cluster, partitions);
        Err(ClusterError::NotBuilt)
    }
}

/// `ctx` with its protected reads sent to `target`: the same catalog, object
/// stores and planner, plans partitioned for the cluster, and planned in
/// [`shape`]'s one-exchange form (scans and partial aggregates on the
/// executors, one final task; no hash exchanges between stages).
pub fn on_cluster(ctx: &SessionContext, target: &ClusterTarget) -> SessionContext {
    let config = ctx
        .copied_config()
        .with_target_partitions(target.partitions.max(1))
        .with_repartition_file_scans(true)
        // Files split into byte ranges from 1 MiB (DataFusion: 10 MiB), so a
        // stage spreads over executors on mid-sized inputs too.
        .with_repartition_file_min_size(1 << 20)
        .with_repartition_aggregations(false)
        .with_repartition_windows(false)
        .with_repartition_joins(false)
        .with_repartition_sorts(false)
        .with_round_robin_repartition(false)
        .with_extension(Arc::new(target.clone()));
    let state = datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state()).with_config(config).build();
    SessionContext::new_with_state(state)
}

/// The cluster `ctx`'s protected reads go to, if any.
pub fn target_of(ctx: &SessionContext) -> Option<Arc<ClusterTarget>> {
    ctx.state().config().get_extension::<ClusterTarget>()
}

/// Jobs submitted for one plan at most (the first and two resubmissions), when
/// a finished job's results could not be fetched (see the module doc).
pub const SUBMISSIONS: usize = 3;

/// Runs `plan` where `ctx` says (this process, or its cluster) and collects
/// its batches. On a cluster, a finished job whose results could not all be
/// fetched is submitted again (at most [`SUBMISSIONS`] jobs in all).
pub async fn collect(plan: Arc<dyn ExecutionPlan>, ctx: &SessionContext) -> Result<Vec<RecordBatch>> {
    match target_of(ctx) {
        None => datafusion::physical_plan::collect(plan, ctx.task_ctx()).await,
        #[cfg(feature = "cluster")]
        Some(target) => {
            let Some(shaped) = shape::one_exchange(plan.clone()) else {
                log::info!("a plan with more than one exchange runs in this process, not on the cluster");
                return datafusion::physical_plan::collect(plan, ctx.task_ctx()).await;
            };
            use futures::TryStreamExt;
            submit_fetching(&shaped, ctx, &target, |stream| Box::pin(stream.try_collect())).await
        }
        #[cfg(not(feature = "cluster"))]
        Some(_) => Err(DataFusionError::Configuration(ClusterError::NotBuilt.to_string())),
    }
}

/// Submits `plan` to `target` and hands the finished job's result stream to
/// `fetch`. A job that failed fails (its failure can depend on the data); a
/// finished job whose results `fetch` could not take is submitted again, at
/// most [`SUBMISSIONS`] jobs in all. A resubmission is logged without the
/// fetch's error (it can quote data), after a pause that lets the scheduler
/// notice a lost executor.
#[cfg(feature = "cluster")]
async fn submit_fetching<T>(
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &SessionContext,
    target: &ClusterTarget,
    fetch: impl Fn(SendableRecordBatchStream) -> futures::future::BoxFuture<'static, Result<T>>,
) -> Result<T> {
    let attempts = submit_attempts(plan, ctx, target, fetch);
    match target.job_timeout {
        None => attempts.await,
        // Dropping the attempts stops the client's polling. The message names
        // the setting only; release paths withhold it anyway, as the cause of
        // every failure after a protected read (a job's duration can depend
        // on the data).
        Some(t) => tokio::time::timeout(t, attempts).await.unwrap_or_else(|_| {
            Err(DataFusionError::Execution(format!(
                "the cluster job did not finish within its job timeout ({t:?}): check the scheduler and executors \
                 (`dpflow cluster` logs), then rerun, or raise the cluster's job_timeout (`--cluster-job-timeout`)"
            )))
        }),
    }
}

/// [`submit_fetching`]'s submissions, without the timeout.
#[cfg(feature = "cluster")]
async fn submit_attempts<T>(
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &SessionContext,
    target: &ClusterTarget,
    fetch: impl Fn(SendableRecordBatchStream) -> futures::future::BoxFuture<'static, Result<T>>,
) -> Result<T> {
    let mut attempt = 1;
    loop {
        target.submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stream = client::submit(plan.clone(), ctx, target).await?;
        match fetch(stream).await {
            Ok(v) => return Ok(v),
            Err(e) if attempt >= SUBMISSIONS => return Err(e),
            Err(_) => {
                attempt += 1;
                log::warn!(
                    "the results of a finished cluster job could not be fetched; submitting it again (job {attempt} of {SUBMISSIONS})"
                );
                tokio::time::sleep(std::time::Duration::from_millis(500 * attempt as u64)).await;
            }
        }
    }
}

/// Plans `plan` in this process and runs it where `ctx` says; the batches of
/// [`DataFrame::collect`](datafusion::dataframe::DataFrame::collect).
pub async fn collect_logical(ctx: &SessionContext, plan: LogicalPlan) -> Result<Vec<RecordBatch>> {
    let physical = ctx.state().create_physical_plan(&plan).await?;
    collect(physical, ctx).await
}

/// Runs `plan` where `ctx` says, as one stream: in this process, its
/// partitions merged as they come (DataFusion's `execute_stream`); on a
/// cluster, the final stage's partitions one after the other, in the order
/// their tasks finished (a plan of one partition keeps its row order). A
/// finished job whose first batch could not be fetched is submitted again (at
/// most [`SUBMISSIONS`] jobs in all).
pub async fn execute_stream(plan: Arc<dyn ExecutionPlan>, ctx: &SessionContext) -> Result<SendableRecordBatchStream> {
    #[cfg(feature = "cluster")]
    use {datafusion::physical_plan::stream::RecordBatchStreamAdapter, futures::StreamExt};
    match target_of(ctx) {
        None => datafusion::physical_plan::execute_stream(plan, ctx.task_ctx()),
        #[cfg(feature = "cluster")]
        Some(target) => {
            // One exchange at most, into one final task (see `shape`); a plan
            // that needs more runs here, where it is exact as it stands.
            let Some(shaped) = shape::one_exchange(plan.clone()) else {
                log::info!("a plan with more than one exchange runs in this process, not on the cluster");
                return datafusion::physical_plan::execute_stream(plan, ctx.task_ctx());
            };
            // Only the first batch decides a resubmission: once a batch has
            // reached the caller, a failure fails the stream.
            submit_fetching(&shaped, ctx, &target, |mut stream| {
                Box::pin(async move {
                    let first = match stream.next().await {
                        Some(Err(e)) => return Err(e),
                        first => first,
                    };
                    let schema = stream.schema();
                    let whole = futures::stream::iter(first).chain(stream);
                    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, whole)) as SendableRecordBatchStream)
                })
            })
            .await
        }
        #[cfg(not(feature = "cluster"))]
        Some(_) => Err(DataFusionError::Configuration(ClusterError::NotBuilt.to_string())),
    }
}

/// Partitions for a plan built for `ctx` whose natural width is this
/// machine's cores (e.g. synthetic sampling): the cluster's when it has one.
pub fn partitions_for(ctx: &SessionContext) -> usize {
    match target_of(ctx) {
        Some(t) => t.partitions.max(1),
        None => std::thread::available_parallelism().map_or(2, |n| n.get()),
    }
}

/// Refuses plans that cannot leave this process (a `memory://` input lives
/// in this process only).
pub fn check_location(ctx: &SessionContext, url: &url::Url) -> Result<()> {
    if target_of(ctx).is_some() && url.scheme() == "memory" {
        return Err(DataFusionError::Configuration(format!(
            "{url}: memory:// inputs live in this process and cannot be read by cluster executors; use file:// on a shared file system or s3://"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_back() {
        let c: Cluster = "df://127.0.0.1:50050".parse().unwrap();
        assert_eq!(c, Cluster::Remote { host: "127.0.0.1".into(), port: 50050 });
        assert_eq!(c.to_string(), "df://127.0.0.1:50050");
        assert_eq!("df://sched.internal:7000/".parse::<Cluster>().unwrap().to_string(), "df://sched.internal:7000");
        assert_eq!(" Standalone ".parse::<Cluster>().unwrap(), Cluster::Standalone);
        for bad in
            ["", "127.0.0.1:50050", "http://h:1", "df://h", "df://h:0", "df://:50050", "df://h:99999", "df://a/b:1"]
        {
            let e = bad.parse::<Cluster>().unwrap_err();
            assert!(e.to_string().contains("df://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_session_without_a_target_runs_here() {
        let ctx = SessionContext::new();
        assert!(target_of(&ctx).is_none());
        let target =
            ClusterTarget::new("http://127.0.0.1:1".into(), Cluster::Remote { host: "127.0.0.1".into(), port: 1 }, 5);
        let on = on_cluster(&ctx, &target);
        assert_eq!(target_of(&on).as_deref(), Some(&target));
        assert_eq!(partitions_for(&on), 5);
        assert_eq!(on.copied_config().target_partitions(), 5);
        let mem = url::Url::parse("memory://x/t.csv").unwrap();
        assert!(check_location(&ctx, &mem).is_ok());
        assert!(check_location(&on, &mem).unwrap_err().to_string().contains("memory://"));
    }
}
