//! `dpflow impute`: DP statistics on kNN-imputed data (the imputed rows are never released).

use anyhow::Result;
use clap::Args;

use super::OutputFormat;
use dpflow::impute::{Estimator, planned_records, spec::ImputeSpec};
use dpflow::privacy::Ledger;

/// Arguments of `dpflow impute`.
#[derive(Debug, Args)]
pub struct ImputeArgs {
    /// Spec file (input, domain, attributes to impute, matching attributes, queries, budget).
    #[arg(long)]
    pub spec: String,
    /// Read this input instead of the spec's `input:` (same domain), e.g. a copy with injected
    /// missingness. Not with --ledger: a charged release reads what its spec names.
    #[arg(long, conflicts_with = "ledger")]
    pub input: Option<String>,
    /// Estimator.
    #[arg(long, value_enum, default_value = "smooth")]
    pub estimator: Estimator,
    /// Ledger to charge (with --dataset).
    #[arg(long, requires = "dataset")]
    pub ledger: Option<String>,
    /// Dataset in the ledger.
    #[arg(long, requires = "ledger")]
    pub dataset: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
    /// UNSAFE: seeded noise (tests only).
    #[arg(long)]
    pub unsafe_seed: Option<u64>,
    /// Curator diagnostics, NOT private (never publish them): per released number, the donees
    /// whose imputed values can enter it, L1_R(D), the bound and the noise scale. Releases and
    /// charges nothing.
    #[arg(long, conflicts_with_all = ["ledger", "dataset", "unsafe_seed"])]
    pub diagnose: bool,
    /// Where the data is read (the donor search runs in this process).
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

pub(super) async fn run(a: ImputeArgs) -> Result<i32> {
    let mut spec = ImputeSpec::load(&a.spec)?;
    if let Some(i) = &a.input {
        spec.input = i.clone();
    }
    if a.estimator == Estimator::GlobalSensitivity {
        anyhow::bail!(
            "the global-sensitivity estimator is an evaluation baseline (its bound uses the private number of donees); use it through `dpflow bench knn-experiment`"
        );
    }
    if a.unsafe_seed.is_some() && a.ledger.is_some() {
        anyhow::bail!(dpflow::privacy::SEEDED_LEDGER_REFUSAL);
    }
    if a.diagnose {
        return diagnose(&spec, a.format).await;
    }
    let records = planned_records(&spec, a.estimator)?;
    let mut ledger_charge = None;
    // The cluster (if any) must answer before the reservation.
    let ctx = a.cluster.context().await?;
    if let (Some(l), Some(d)) = (&a.ledger, &a.dataset) {
        let mut ledger = Ledger::open(l)?;
        let id = format!("impute-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"));
        let r = ledger.reserve(d, &id, &records, None)?;
        ledger_charge = Some((ledger, r.charge_id));
    } else if a.unsafe_seed.is_none() {
        eprintln!("note: no --ledger given: this release's privacy cost is not recorded in a budget ledger.");
    }
    let mut rng = dpflow_udfs::noise::DpRng::new(a.unsafe_seed)?;
    let pb = super::progress::spinner("imputation: reading the data, searching donors, releasing the statistics");
    let outcome = dpflow::impute::run(&ctx, &spec, a.estimator, &mut rng).await;
    pb.finish_and_clear();
    let report = match outcome {
        Ok(r) => r,
        // After a protected read every outcome is a release: charged, cause withheld (docs/PRIVACY.md §1).
        Err(e) => {
            return Err(dpflow::privacy::charge_failure(
                "imputation",
                ledger_charge.as_ref().map(|(l, id)| (l, *id)),
                e,
            ));
        }
    };
    if let Some((l, id)) = ledger_charge {
        l.commit(id)?;
    }
    match a.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => {
            println!("{:<36} {:>16} {:>14}", "query", "value", "noisy count");
            for r in &report.results {
                println!(
                    "{:<36} {:>16} {:>14}",
                    r.name,
                    r.value.map_or("NULL".into(), |v| format!("{v:.4}")),
                    r.count.map_or("-".into(), |v| format!("{v:.1}"))
                );
            }
        }
    }
    Ok(0)
}

/// `--diagnose`: curator-only numbers (exact, data-dependent), labelled as such.
async fn diagnose(spec: &ImputeSpec, format: OutputFormat) -> Result<i32> {
    let ctx = dpflow::io::session_context();
    let pb = super::progress::spinner("imputation diagnostics: reading the data");
    let rows = dpflow::impute::diagnose(&ctx, spec).await;
    pb.finish_and_clear();
    let rows = rows?;
    eprintln!("NOT PRIVATE: curator diagnostics of exact data; never publish them. Nothing was charged.");
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        OutputFormat::Table => {
            println!(
                "{:<44} {:>7} {:>8} {:>8} {:>14} {:>14} {:>16}",
                "number", "noise", "donees", "L1_R", "bound", "noise scale", "exact value"
            );
            let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.4}"));
            for r in &rows {
                println!(
                    "{:<44} {:>7} {:>8} {:>8} {:>14} {:>14} {:>16}",
                    r.target,
                    r.noise,
                    r.donees_inside,
                    r.l1.map_or("-".to_string(), |l| l.to_string()),
                    f(r.bound),
                    f(r.scale),
                    f(r.exact)
                );
            }
        }
    }
    Ok(0)
}
