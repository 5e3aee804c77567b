use clap::Parser;

fn main() {
    let cli = dpflow::cli::Cli::parse();
    let env = env_logger::Env::default().default_filter_or(cli.log.clone());
    env_logger::Builder::from_env(env).format_timestamp_millis().init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async {
        match dpflow::cli::run(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        }
    });
    std::process::exit(code);
}
