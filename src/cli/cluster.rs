//! `dpflow cluster scheduler` and `dpflow cluster executor`: the processes of
//! a dpflow cluster (Apache Ballista with dpflow's operators; docs/cluster.md).

use anyhow::Result;
use clap::{Args, Subcommand};

/// `dpflow cluster`.
#[derive(Debug, Args)]
pub struct ClusterCommand {
    #[command(subcommand)]
    what: ClusterProcess,
}

#[derive(Debug, Subcommand)]
enum ClusterProcess {
    /// Run a scheduler: clients (`--cluster df://HOST:PORT`) submit plans here, executors register here.
    Scheduler(SchedulerArgs),
    /// Run an executor: it registers with a scheduler and runs the tasks it is given.
    Executor(ExecutorArgs),
}

/// `dpflow cluster scheduler`.
#[derive(Debug, Args)]
struct SchedulerArgs {
    /// Address to bind (0.0.0.0 for every interface; keep the cluster on a private network).
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// gRPC port for clients and executors.
    #[arg(long, default_value_t = 50050)]
    port: u16,
    /// Host name executors and clients reach this scheduler by.
    #[arg(long, default_value = "localhost")]
    external_host: String,
    /// Seconds without a heartbeat after which an executor is lost and its tasks run elsewhere.
    #[arg(long, default_value_t = 60)]
    executor_timeout: u64,
    /// Attempts of one task before its job (and so the release) fails.
    #[arg(long, default_value_t = 4)]
    task_max_failures: usize,
}

/// `dpflow cluster executor`.
#[derive(Debug, Args)]
struct ExecutorArgs {
    /// The scheduler, df://HOST:PORT.
    #[arg(long, default_value = "df://localhost:50050")]
    scheduler: String,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// Host name others reach this executor by.
    #[arg(long, default_value = "localhost")]
    external_host: String,
    /// Arrow Flight port (shuffle data and results are fetched here).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// gRPC port (the scheduler pushes tasks here).
    #[arg(long, default_value_t = 50052)]
    grpc_port: u16,
    /// Task slots (default: this machine's cores).
    #[arg(long)]
    cores: Option<usize>,
    /// Directory for shuffle files (default: a new temporary directory). Shuffle files hold
    /// exact partial results: keep the directory owner-only.
    #[arg(long)]
    work_dir: Option<String>,
    /// Seconds between heartbeats to the scheduler.
    #[arg(long, default_value_t = 5)]
    heartbeat: u64,
}

/// Runs `dpflow cluster ...` until the process is stopped.
pub(super) async fn run(a: ClusterCommand) -> Result<i32> {
    #[cfg(feature = "cluster")]
    {
        use dpflow_udfs::cluster::Cluster;
        use dpflow_udfs::cluster::process::{ExecutorOptions, SchedulerOptions, run_executor, run_scheduler};
        match a.what {
            ClusterProcess::Scheduler(s) => {
                let opts = SchedulerOptions {
                    bind_host: s.bind,
                    port: s.port,
                    external_host: s.external_host,
                    executor_timeout_seconds: s.executor_timeout.max(1),
                    task_max_failures: s.task_max_failures.max(1),
                };
                eprintln!("dpflow cluster scheduler: listening on {}:{}", opts.bind_host, opts.port);
                run_scheduler(&opts).await?;
            }
            ClusterProcess::Executor(e) => {
                let (host, port) = match e.scheduler.parse::<Cluster>()? {
                    Cluster::Remote { host, port } => (host, port),
                    Cluster::Standalone => anyhow::bail!("--scheduler: give the scheduler's df://HOST:PORT"),
                };
                if let Some(dir) = &e.work_dir {
                    dpflow::io::private::create_private_dir(std::path::Path::new(dir))?;
                }
                let opts = ExecutorOptions {
                    scheduler_host: host,
                    scheduler_port: port,
                    bind_host: e.bind,
                    external_host: e.external_host,
                    flight_port: e.port,
                    grpc_port: e.grpc_port,
                    cores: e.cores.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
                    work_dir: e.work_dir,
                    heartbeat_seconds: e.heartbeat.max(1),
                };
                eprintln!(
                    "dpflow cluster executor: {} task slots, flight port {}, registering with {}",
                    opts.cores, opts.flight_port, e.scheduler
                );
                run_executor(&opts).await?;
            }
        }
        Ok(0)
    }
    #[cfg(not(feature = "cluster"))]
    {
        let _ = a;
        Err(dpflow_udfs::cluster::ClusterError::NotBuilt.into())
    }
}
