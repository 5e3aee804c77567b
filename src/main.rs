use clap::Parser;

mod cli;

/// mimalloc, as datafusion-cli uses: many small allocations on several
/// threads (NUTS chains, DataFusion partitions) spent half their time in
/// glibc's malloc and free (`benches/results/napsu/twinify.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A panic is a bug, and its message can quote the data it failed on (an
/// index, a value, a length), so only where it happened is printed
/// (docs/RELIABILITY.md). A release already charged stays charged.
fn withhold_panic_messages() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", dpflow_udfs::unwind::short_path(l.file()), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error in dpflow{at} (a bug; please report it with this location). Its message is \
             withheld because it may quote protected data. A reservation this run made stays counted as spent \
             (`dpflow budget history`); data may have been read, so settle it with `dpflow budget resolve --charge ID \
             --as failed`, never `released`."
        );
    }));
}

fn main() {
    withhold_panic_messages();
    // A panic inside a guarded stream (a decoder meeting a corrupt file)
    // becomes an error of that run, reported through the usual path.
    dpflow_udfs::unwind::install_hook();
    let cli = cli::Cli::parse();
    // Only dpflow's own log lines are ever printed, at any level: third-party
    // crates log plans with exact statistics (row counts from Parquet footers),
    // request traces and similar, which can carry protected values
    // (docs/PRIVACY.md §1). RUST_LOG or --log sets the level (a plain level;
    // module directives are ignored).
    let wanted = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty()).unwrap_or(cli.log.clone());
    let level = wanted
        .split(',')
        .filter_map(|d| d.rsplit('=').next()?.trim().parse::<log::LevelFilter>().ok())
        .max()
        .unwrap_or(log::LevelFilter::Warn);
    let mut logger = env_logger::Builder::new();
    logger.filter_level(log::LevelFilter::Off).filter_module("dpflow", level).filter_module("dpflow_udfs", level);
    // A cluster process's operator may ask for Ballista's own lines (scheduling,
    // executor registration, task failures). They can quote values from a
    // failing task, so they are opt-in and for the curator's eyes only
    // (docs/cluster.md).
    if matches!(cli.command, cli::Command::Cluster(_)) && std::env::var("DPFLOW_LOG_BALLISTA").is_ok_and(|v| v == "1") {
        for m in ["ballista_scheduler", "ballista_executor", "ballista_core"] {
            logger.filter_module(m, level);
        }
    }
    logger.format_timestamp_millis().init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async {
        match cli::run(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {}", cli::error_text(&e));
                1
            }
        }
    });
    std::process::exit(code);
}
