//! dpflow's scheduler and executor processes (`dpflow cluster scheduler`,
//! `dpflow cluster executor`), and the standalone cluster (both inside the
//! calling process). They are Ballista's own, with dpflow's codecs, planner,
//! functions and object stores registered ([`super::state`]); an executor
//! links this crate only.

use std::sync::Arc;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::serde::BallistaCodec;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;

use super::codec::{ClusterLogicalCodec, ClusterPhysicalCodec};
use super::state::{cluster_config, cluster_functions, cluster_runtime_in, cluster_state};

/// Why a cluster process stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProcessError(String);

impl From<ballista_core::error::BallistaError> for ProcessError {
    fn from(e: ballista_core::error::BallistaError) -> Self {
        ProcessError(e.to_string())
    }
}

/// Settings of a scheduler process.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Address to bind (default `127.0.0.1`; `0.0.0.0` for every interface).
    pub bind_host: String,
    /// gRPC port clients and executors connect to (Ballista's default 50050).
    pub port: u16,
    /// Host name executors and clients reach this scheduler by.
    pub external_host: String,
    /// Seconds without a heartbeat after which an executor is declared lost
    /// and its tasks run elsewhere.
    pub executor_timeout_seconds: u64,
    /// Attempts of one task before its job fails.
    pub task_max_failures: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            bind_host: "127.0.0.1".into(),
            port: 50050,
            external_host: "localhost".into(),
            executor_timeout_seconds: 60,
            task_max_failures: 4,
        }
    }
}

/// Runs a scheduler until the process is stopped.
pub async fn run_scheduler(opts: &SchedulerOptions) -> Result<(), ProcessError> {
    let addr = format!("{}:{}", opts.bind_host, opts.port)
        .parse()
        .map_err(|e| ProcessError(format!("{}:{}: not an address to bind: {e}", opts.bind_host, opts.port)))?;
    let config = SchedulerConfig {
        bind_host: opts.bind_host.clone(),
        bind_port: opts.port,
        external_host: opts.external_host.clone(),
        scheduling_policy: TaskSchedulingPolicy::PushStaged,
        // One task per executor in turn: a stage spreads over every executor
        // (Ballista's default fills the first executor's slots first).
        task_distribution: ballista_scheduler::config::TaskDistributionPolicy::RoundRobin,
        executor_timeout_seconds: opts.executor_timeout_seconds,
        no_executors_grace_period_seconds: opts.executor_timeout_seconds,
        expire_dead_executor_interval_seconds: (opts.executor_timeout_seconds / 4).clamp(1, 15),
        task_max_failures: opts.task_max_failures,
        override_config_producer: Some(Arc::new(cluster_config)),
        override_session_builder: Some(Arc::new(cluster_state)),
        override_logical_codec: Some(Arc::new(ClusterLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(ClusterPhysicalCodec::default())),
        ..SchedulerConfig::default()
    };
    let cluster = BallistaCluster::new_from_config(&config).await?;
    start_server(cluster, addr, Arc::new(config)).await?;
    Ok(())
}

/// Settings of an executor process.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's host.
    pub scheduler_host: String,
    /// The scheduler's port.
    pub scheduler_port: u16,
    /// Address to bind.
    pub bind_host: String,
    /// Host name the scheduler, other executors and clients reach this one by.
    pub external_host: String,
    /// Arrow Flight port (shuffle partitions and results are fetched here).
    pub flight_port: u16,
    /// gRPC port (the scheduler pushes tasks here).
    pub grpc_port: u16,
    /// Tasks run at once.
    pub cores: usize,
    /// Directory for shuffle and spill files; it must exist and be owner-only.
    /// `None`: a new owner-only temporary directory, removed when the
    /// executor stops.
    pub work_dir: Option<String>,
    /// Seconds between heartbeats to the scheduler.
    pub heartbeat_seconds: u64,
}

/// How often an executor removes the shuffle files of jobs older than
/// [`JOB_DATA_TTL_SECONDS`] (they hold exact partial aggregates).
const JOB_DATA_CLEANUP_SECONDS: u64 = 300;
/// Age past which an executor removes a job's shuffle files.
const JOB_DATA_TTL_SECONDS: u64 = 3600;

/// An owner-only temporary work directory (mode 0700), removed on drop.
fn private_work_dir() -> Result<tempfile::TempDir, ProcessError> {
    // tempfile creates directories with mode 0700 on Unix.
    tempfile::Builder::new()
        .prefix("dpflow-executor-")
        .tempdir()
        .map_err(|e| ProcessError(format!("cannot create the executor's work directory: {e}")))
}

fn executor_config(
    opts: &ExecutorOptions,
    work_dir: &str,
    policy: TaskSchedulingPolicy,
) -> Result<ExecutorProcessConfig, ProcessError> {
    let spill_dir = work_dir.to_string();
    Ok(ExecutorProcessConfig {
        bind_host: opts.bind_host.clone(),
        external_host: Some(opts.external_host.clone()),
        port: opts.flight_port,
        grpc_port: opts.grpc_port,
        scheduler_host: opts.scheduler_host.clone(),
        scheduler_port: opts.scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        vcores: opts.cores.max(1),
        task_scheduling_policy: policy,
        work_dir: Some(work_dir.to_string()),
        job_data_ttl_seconds: JOB_DATA_TTL_SECONDS,
        job_data_clean_up_interval_seconds: JOB_DATA_CLEANUP_SECONDS,
        executor_heartbeat_interval_seconds: opts.heartbeat_seconds.max(1),
        override_config_producer: Some(Arc::new(cluster_config)),
        override_runtime_producer: Some(Arc::new(move |_: &datafusion::prelude::SessionConfig| {
            cluster_runtime_in(&spill_dir)
        })),
        override_logical_codec: Some(Arc::new(ClusterLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(ClusterPhysicalCodec::default())),
        override_function_registry: Some(Arc::new(cluster_functions().map_err(|e| ProcessError(e.to_string()))?)),
        ..ExecutorProcessConfig::default()
    })
}

/// Runs an executor until the process is stopped.
pub async fn run_executor(opts: &ExecutorOptions) -> Result<(), ProcessError> {
    let temporary = match &opts.work_dir {
        Some(_) => None,
        None => Some(private_work_dir()?),
    };
    let work_dir = match (&opts.work_dir, &temporary) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().display().to_string(),
        (None, None) => unreachable!("a work directory is given or made"),
    };
    let config = executor_config(opts, &work_dir, TaskSchedulingPolicy::PushStaged)?;
    start_executor_process(Arc::new(config)).await?;
    drop(temporary);
    Ok(())
}

/// A port nobody listens on now (for the standalone executor's services).
fn free_port() -> Result<u16, ProcessError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ProcessError(format!("no free port for the standalone executor: {e}")))
}

/// Starts a scheduler and one executor of `cores` task slots inside this
/// process (on the current tokio runtime; they stop with it) and returns the
/// scheduler's URL. Both listen on 127.0.0.1 only; the executor's work
/// directory is owner-only and removed when it stops.
pub async fn start_standalone(cores: usize) -> Result<String, ProcessError> {
    let codec = BallistaCodec::new(Arc::new(ClusterLogicalCodec::default()), Arc::new(ClusterPhysicalCodec::default()));
    let addr = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::new(cluster_state),
        Arc::new(cluster_config),
        codec,
    )
    .await?;
    let url = format!("http://{addr}");
    let work = private_work_dir()?;
    let opts = ExecutorOptions {
        scheduler_host: addr.ip().to_string(),
        scheduler_port: addr.port(),
        bind_host: "127.0.0.1".into(),
        external_host: "127.0.0.1".into(),
        flight_port: free_port()?,
        grpc_port: free_port()?,
        cores,
        work_dir: Some(work.path().display().to_string()),
        heartbeat_seconds: 5,
    };
    // The standalone scheduler hands out tasks when executors ask (pull).
    let config =
        Arc::new(executor_config(&opts, &work.path().display().to_string(), TaskSchedulingPolicy::PullStaged)?);
    tokio::spawn(async move {
        let _keep = work;
        if let Err(e) = start_executor_process(config).await {
            log::warn!("the standalone executor stopped: {e}");
        }
    });
    // Wait until it has registered (its first poll), at most ten seconds.
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(10) {
        if tokio::net::TcpStream::connect(("127.0.0.1", opts.flight_port)).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(url)
}
