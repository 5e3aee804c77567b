//! `dpflow report`: the HTML report of a published release (`dpflow::report`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use dpflow::dataset::Dataset;
use dpflow::privacy::Ledger;

/// Arguments of `dpflow report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The release's manifest.json (local path or URL).
    pub manifest: String,
    /// The dataset's domain file: labels the marginal plots and decodes the
    /// synthetic outputs (without it, no one-way marginal plots).
    #[arg(long)]
    pub domain: Option<String>,
    /// The budget ledger: adds the dataset's budget timeline.
    #[arg(long)]
    pub ledger: Option<PathBuf>,
    /// Where to write the report (default: report.html beside the manifest, for a local manifest).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
}

pub(super) async fn run(a: ReportArgs) -> Result<i32> {
    let ctx = dpflow::io::session_context();
    let bytes = dpflow::io::read_bytes(&ctx, &a.manifest).await.with_context(|| format!("reading {}", a.manifest))?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{}: not a JSON manifest", a.manifest))?;
    let dataset_name = manifest.get("dataset").and_then(|d| d.as_str()).unwrap_or_default().to_string();
    let dataset = match &a.domain {
        // The location is never read: only published outputs are (gather replaces it).
        Some(d) => Some(Dataset::open(&dataset_name, &a.manifest, None, d)?),
        None => None,
    };
    let ledger = match &a.ledger {
        Some(p) => {
            let l = Ledger::open(p)?;
            let status = l.status(&dataset_name)?;
            Some((status.dataset.budget, l.history(Some(&dataset_name))?))
        }
        None => None,
    };
    // Outputs are read from the manifest's own directory only (gather checks names and hashes).
    let base = a.manifest.rsplit_once('/').map_or(".", |(dir, _)| dir).to_string();
    let html = dpflow::report::gather::build(
        &ctx,
        &manifest,
        &base,
        dataset.as_ref(),
        ledger.as_ref().map(|(b, h)| (b, h.as_slice())),
    )
    .await?;
    let out = match &a.out {
        Some(o) => o.clone(),
        None => {
            let p = PathBuf::from(a.manifest.trim_start_matches("file://"));
            anyhow::ensure!(p.exists(), "give --out for a manifest that is not a local file");
            p.with_file_name("report.html")
        }
    };
    std::fs::write(&out, html).with_context(|| format!("writing {}", out.display()))?;
    println!("report written: {}", out.display());
    Ok(0)
}
