//! `dpflow sql`: DP SQL over a catalog (one query with -e/-f, or a REPL).

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use datafusion::arrow::array::RecordBatch;

use super::budget::BudgetSpec;
use dpflow::sql::{Catalog, QueryResult, SqlEngine};

/// Result formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum SqlFormat {
    /// Pretty table.
    #[default]
    Table,
    /// JSON (rows plus the mechanisms charged).
    Json,
    /// CSV.
    Csv,
}

/// Arguments of `dpflow sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// Catalog file (tables, privacy units, bounds, ledger).
    #[arg(long)]
    pub catalog: String,
    /// Run this query.
    #[arg(short = 'e', long = "execute", conflicts_with = "file")]
    pub execute: Option<String>,
    /// Run the query in this file.
    #[arg(short = 'f', long)]
    pub file: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: SqlFormat,
    /// Budget of the query (default: the catalog's query_budget).
    #[command(flatten)]
    pub budget: BudgetSpec,
    /// UNSAFE: seed the noise (tests only; answers are NOT private).
    #[arg(long)]
    pub unsafe_seed: Option<u64>,
    /// Print the query's mechanisms and the predicted error of every number
    /// it would release; read and spend nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Forecast inputs (with --dry-run).
    #[command(flatten)]
    pub forecast: super::plan::ForecastArgs,
    /// Where the protected tables are read.
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

fn render(r: &QueryResult, format: SqlFormat) -> Result<String> {
    if let Some(rows) = &r.explain {
        return Ok(match format {
            SqlFormat::Json => serde_json::to_string_pretty(rows)?,
            _ => {
                let mut s = format!(
                    "{:<48} {:<28} {:>12} {:>14} {}\n",
                    "aggregate", "mechanism", "sensitivity", "noise scale", "loss"
                );
                for x in rows {
                    s += &format!(
                        "{:<48} {:<28} {:>12} {:>14} {}\n",
                        x.aggregate,
                        x.mechanism,
                        x.sensitivity.map_or("-".into(), |v| format!("{v:.4}")),
                        x.noise_scale.map_or("-".into(), |v| format!("{v:.4}")),
                        x.loss
                    );
                }
                s
            }
        });
    }
    Ok(match format {
        SqlFormat::Table => {
            let opts = datafusion::arrow::util::display::FormatOptions::default().with_null("NULL");
            let mut s =
                datafusion::arrow::util::pretty::pretty_format_batches_with_options(&r.batches, &opts)?.to_string();
            if let (Some(id), Some(rem)) = (r.charge_id, r.remaining) {
                s += &format!("\n(charged as ledger charge #{id}; remaining budget {rem:.6})");
            }
            s
        }
        SqlFormat::Csv => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new().with_header(true).build(&mut buf);
                for b in &r.batches {
                    w.write(b)?;
                }
            }
            String::from_utf8(buf)?
        }
        SqlFormat::Json => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::json::ArrayWriter::new(&mut buf);
                let refs: Vec<&RecordBatch> = r.batches.iter().collect();
                w.write_batches(&refs)?;
                w.finish()?;
            }
            let rows: serde_json::Value =
                if buf.is_empty() { serde_json::json!([]) } else { serde_json::from_slice(&buf)? };
            serde_json::to_string_pretty(&serde_json::json!({
                "rows": rows,
                "mechanisms": r.mechanisms,
                "ledger_charge": r.charge_id,
                "remaining_budget": r.remaining,
            }))?
        }
    })
}

pub(super) async fn run(a: SqlArgs) -> Result<i32> {
    let mut catalog = Catalog::load(&a.catalog)?;
    if let Some(spec) = a.cluster.spec()? {
        catalog.cluster = Some(spec);
    }
    if a.dry_run {
        // A dry run reads nothing: it needs no cluster.
        catalog.cluster = None;
    }
    let budget = if a.budget.epsilon.is_some() || a.budget.rho.is_some() { Some(a.budget.budget()?) } else { None };
    if a.unsafe_seed.is_some() {
        eprintln!("WARNING: --unsafe-seed makes the noise reproducible: answers are NOT differentially private.");
    }
    let mut engine = SqlEngine::open(catalog, a.unsafe_seed).await?;
    let query = match (&a.execute, &a.file) {
        (Some(q), _) => Some(q.clone()),
        (None, Some(f)) => Some(std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?),
        (None, None) => None,
    };
    if a.dry_run {
        let Some(q) = query else { bail!("--dry-run needs a query (-e or -f)") };
        let (records, preds) = engine.predict(&q, budget, &a.forecast.assumptions()?).await?;
        if a.format == SqlFormat::Json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"mechanisms": records, "predictions": preds}))?
            );
        } else {
            for m in &records {
                println!("{} [{}] {}", m.mechanism, m.target, m.loss.describe());
            }
            println!("predicted error:");
            super::plan::print_predictions(&preds, "  ");
            println!("(dry run: nothing was read or spent)");
        }
        return Ok(0);
    }
    if let Some(q) = query {
        let pb = super::progress::spinner("running the query");
        let r = engine.query(&q, budget).await;
        pb.finish_and_clear();
        let r = r?;
        println!("{}", render(&r, a.format)?);
        return Ok(0);
    }
    repl(&mut engine, budget, a.format).await
}

async fn repl(engine: &mut SqlEngine, budget: Option<dpflow::privacy::Budget>, format: SqlFormat) -> Result<i32> {
    use rustyline::error::ReadlineError;
    let mut rl = rustyline::DefaultEditor::new()?;
    let history = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".dpflow_sql_history"));
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    eprintln!(
        "dpflow DP SQL — every answer is noised and charged to the ledger. End a query with ';'. Ctrl-D to quit."
    );
    let mut buf = String::new();
    loop {
        let prompt = if buf.is_empty() { "dp> " } else { "..> " };
        match rl.readline(prompt) {
            Ok(line) => {
                buf.push_str(&line);
                buf.push('\n');
                if !line.trim_end().ends_with(';') {
                    continue;
                }
                let q = buf.trim().trim_end_matches(';').to_string();
                buf.clear();
                let _ = rl.add_history_entry(q.as_str());
                match engine.query(&q, budget).await {
                    Ok(r) => println!("{}", render(&r, format)?),
                    Err(e) => eprintln!("error: {e:#}"),
                }
            }
            Err(ReadlineError::Interrupted) => {
                buf.clear();
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => bail!("terminal: {e}"),
        }
    }
    if let Some(h) = &history {
        let _ = rl.save_history(h);
    }
    Ok(0)
}
