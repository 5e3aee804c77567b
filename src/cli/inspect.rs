//! `dpflow inspect`: the curator's view of an input against its domain.

use anyhow::Result;
use clap::Args;

use super::OutputFormat;
use dpflow::eval::inspect::inspect;
use dpflow::io::InputFormat;

/// Arguments of `dpflow inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Input file, prefix or URL (file://, s3://, memory://).
    pub input: String,
    /// Public domain file (YAML/JSON, or private-pgm `{"col": size}` JSON).
    #[arg(long)]
    pub domain: String,
    /// Input format (default: from the extension).
    #[arg(long, value_enum)]
    pub input_format: Option<InputFormat>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
}

pub(super) async fn run(a: InspectArgs) -> Result<i32> {
    let report = inspect(&a.input, &a.domain, a.input_format).await?;
    match a.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => {
            println!("{}", report.notice);
            println!("input: {}   rows: {}", report.input, report.rows);
            println!(
                "{:<24} {:<12} {:>8} {:>11} {:>10} {:>14}",
                "column", "kind", "nullable", "domain_size", "nulls", "out_of_domain"
            );
            for c in &report.columns {
                println!(
                    "{:<24} {:<12} {:>8} {:>11} {:>10} {:>14}",
                    c.name, c.kind, c.nullable, c.domain_size, c.nulls, c.out_of_domain
                );
            }
        }
    }
    Ok(0)
}
