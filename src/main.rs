use clap::Parser;

mod cli;

fn main() {
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
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Off)
        .filter_module("dpflow", level)
        .filter_module("dpflow_udfs", level)
        .format_timestamp_millis()
        .init();
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
                eprintln!("error: {e:#}");
                1
            }
        }
    });
    std::process::exit(code);
}
