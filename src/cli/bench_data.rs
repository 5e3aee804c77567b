//! `dpflow bench-data`: census-like data of any size from a known network.

use anyhow::Result;
use clap::Args;

/// Arguments of `dpflow bench-data`.
#[derive(Debug, Args)]
pub struct BenchDataArgs {
    /// Number of rows.
    #[arg(long)]
    pub rows: u64,
    /// Output Parquet file or URL.
    #[arg(long)]
    pub out: String,
    /// Seed of the generating model and the sample (benchmark data is not private).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the matching public domain file here.
    #[arg(long)]
    pub domain_out: Option<String>,
    /// Rows per generated batch.
    #[arg(long, default_value_t = 1 << 16, hide = true)]
    pub batch_rows: usize,
}

pub(super) async fn run(a: BenchDataArgs) -> Result<i32> {
    let t = std::time::Instant::now();
    let n = crate::bench_data::write_bench_data(a.rows, &a.out, a.seed, a.domain_out.as_deref(), a.batch_rows).await?;
    eprintln!("wrote {n} rows to {} in {:.1}s", a.out, t.elapsed().as_secs_f64());
    Ok(0)
}
