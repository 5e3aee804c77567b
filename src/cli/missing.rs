//! `dpflow missing`: missingness simulators (evaluation tools, 000 §6.1).

use anyhow::Result;
use clap::{Args, Subcommand};

use super::InputArgs;
use super::OutputFormat;
use dpflow::missing::inject::{InjectMechanism, InjectSpec, inject};

/// Arguments of `dpflow missing`.
#[derive(Debug, Args)]
pub struct MissingArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: MissingCommand,
}

/// `dpflow missing` subcommands.
#[derive(Debug, Subcommand)]
pub enum MissingCommand {
    /// Inject MCAR/MAR/MNAR missingness into a complete dataset (seeded; NOT a private release).
    Inject(InjectArgs),
}

/// Arguments of `dpflow missing inject`.
#[derive(Debug, Args)]
pub struct InjectArgs {
    /// Input data and its public domain.
    #[command(flatten)]
    pub data: InputArgs,
    /// Mechanism.
    #[arg(long, value_enum)]
    pub mechanism: InjectMechanism,
    /// Fraction of masked cells among the masked columns.
    #[arg(long)]
    pub rate: f64,
    /// Columns to mask (comma-separated; MCAR default all, MAR/MNAR default a random half).
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Seed (required: this is a seeded evaluation tool).
    #[arg(long)]
    pub unsafe_seed: u64,
    /// Output (Parquet or CSV by extension).
    #[arg(long)]
    pub out: String,
    /// Also write the domain with every column nullable (YAML).
    #[arg(long)]
    pub domain_out: Option<String>,
    /// Report format.
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
}

pub(super) async fn run(a: MissingArgs) -> Result<i32> {
    match a.command {
        MissingCommand::Inject(a) => {
            let dataset = a.data.open("data")?;
            let spec =
                InjectSpec { mechanism: a.mechanism, rate: a.rate, columns: a.columns.clone(), seed: a.unsafe_seed };
            let ctx = dpflow::io::session_context();
            let pb = super::progress::spinner("injecting missing values");
            let report = inject(&ctx, &dataset, &spec, &a.out).await;
            pb.finish_and_clear();
            let report = report?;
            if let Some(d) = &a.domain_out {
                let mut nullable = dataset.domain().clone();
                nullable = dpflow::domain::with_all_nullable(&nullable);
                let text =
                    dpflow::domain::to_yaml(&nullable, dataset.spec.name.as_deref()).map_err(anyhow::Error::msg)?;
                std::fs::write(d, text).map_err(|e| anyhow::anyhow!("writing {d}: {e}"))?;
            }
            match a.format {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                OutputFormat::Table => {
                    println!(
                        "{:?} at {:.3}: {} rows, masked {:.4} of the cells of [{}]; {:.1}% complete rows",
                        report.mechanism,
                        report.rate,
                        report.rows,
                        report.achieved_rate,
                        report.masked_columns.join(", "),
                        report.complete_rows * 100.0
                    );
                    if !report.inputs.is_empty() {
                        println!("inputs: [{}]", report.inputs.join(", "));
                    }
                    for (c, n, f) in &report.per_column {
                        println!("  {c:<24} {n:>10} new nulls ({:.2}%)", f * 100.0);
                    }
                }
            }
            Ok(0)
        }
    }
}
