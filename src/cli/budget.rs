//! `dpflow budget`: create and inspect the privacy-budget ledger.

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

use super::OutputFormat;
use dpflow::privacy::{Budget, ChargeStatus, Ledger, MechanismRecord, PrivacyLoss};

/// Arguments of `dpflow budget`.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// The ledger file (SQLite).
    #[arg(long, global = true)]
    pub ledger: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t, global = true)]
    pub format: OutputFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: BudgetCommand,
}

/// A total budget given on the command line.
#[derive(Debug, Args, Clone)]
pub struct BudgetSpec {
    /// ε (pure ε-DP, or (ε, δ)-DP with --delta).
    #[arg(long)]
    pub epsilon: Option<f64>,
    /// δ for (ε, δ)-DP.
    #[arg(long)]
    pub delta: Option<f64>,
    /// ρ for ρ-zCDP.
    #[arg(long, conflicts_with_all = ["epsilon", "delta"])]
    pub rho: Option<f64>,
}

impl BudgetSpec {
    /// The budget these flags describe.
    pub fn budget(&self) -> Result<Budget> {
        let b = match (self.epsilon, self.delta, self.rho) {
            (_, _, Some(rho)) => Budget::Zcdp { rho },
            (Some(epsilon), Some(delta), None) => Budget::Approx { epsilon, delta },
            (Some(epsilon), None, None) => Budget::Pure { epsilon },
            (None, Some(_), None) => bail!("--delta needs --epsilon"),
            (None, None, None) => bail!("give a budget: --epsilon E [--delta D] or --rho R"),
        };
        b.validate().map_err(anyhow::Error::msg)?;
        Ok(b)
    }
}

/// `dpflow budget` subcommands.
#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Create a ledger (if missing) and register a protected dataset with its total budget.
    Init {
        /// Dataset name.
        #[arg(long)]
        dataset: String,
        /// Privacy unit: `row` (one row = one person) or the column naming the person.
        #[arg(long, default_value = "row")]
        privacy_unit: String,
        /// The total budget.
        #[command(flatten)]
        budget: BudgetSpec,
    },
    /// Budget, spent, reserved and remaining per dataset.
    Show {
        /// Only this dataset.
        #[arg(long)]
        dataset: Option<String>,
    },
    /// Every charge with its mechanisms and status.
    History {
        /// Only this dataset.
        #[arg(long)]
        dataset: Option<String>,
    },
    /// Resolve a reservation left open by a crash: `committed` if its outputs were published, else `released`.
    Resolve {
        /// The charge id (see `budget history`).
        #[arg(long)]
        charge: i64,
        /// New status.
        #[arg(long = "as", value_enum)]
        to: ChargeStatus,
        /// Why (kept in the ledger).
        #[arg(long, default_value = "resolved by operator")]
        note: String,
    },
    /// Give an analyst (a `dpflow serve` user) their own budget on a dataset, or change it.
    /// Their queries must fit it and the dataset's total.
    Grant {
        /// Dataset name.
        #[arg(long)]
        dataset: String,
        /// The analyst's user name (as in the users file).
        #[arg(long)]
        analyst: String,
        /// The analyst's budget, in the dataset's unit.
        #[command(flatten)]
        budget: BudgetSpec,
    },
    /// Analysts' grants, spending and what is left.
    Analysts {
        /// Only this dataset.
        #[arg(long)]
        dataset: Option<String>,
    },
    /// Record an out-of-band release (its cost is reserved and committed).
    Charge {
        /// Dataset name.
        #[arg(long)]
        dataset: String,
        /// Release id (unique per dataset).
        #[arg(long)]
        release_id: String,
        /// What was released.
        #[arg(long, default_value = "out-of-band release")]
        what: String,
        /// The loss.
        #[command(flatten)]
        loss: BudgetSpec,
        /// Test hook: sleep this long between reserve and commit.
        #[arg(long, hide = true)]
        hold_ms: Option<u64>,
    },
}

fn ledger_path(a: &BudgetArgs) -> Result<&str> {
    a.ledger.as_deref().ok_or_else(|| anyhow::anyhow!("--ledger FILE is required"))
}

pub(super) async fn run(a: BudgetArgs) -> Result<i32> {
    let path = ledger_path(&a)?.to_string();
    let json = a.format == OutputFormat::Json;
    match &a.command {
        BudgetCommand::Init { dataset, privacy_unit, budget } => {
            let budget = budget.budget()?;
            let ledger =
                if std::path::Path::new(&path).exists() { Ledger::open(&path)? } else { Ledger::create(&path)? };
            ledger.add_dataset(dataset, privacy_unit, budget)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&ledger.status(dataset)?)?);
            } else {
                println!(
                    "ledger {path}: dataset {dataset:?} (privacy unit {privacy_unit}) with budget {}",
                    budget.describe()
                );
            }
        }
        BudgetCommand::Show { dataset } => {
            let ledger = Ledger::open(&path)?;
            let names: Vec<String> = match dataset {
                Some(d) => vec![d.clone()],
                None => ledger.datasets()?.into_iter().map(|d| d.name).collect(),
            };
            let statuses = names.iter().map(|n| ledger.status(n)).collect::<Result<Vec<_>, _>>()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&statuses)?);
            } else {
                println!(
                    "{:<20} {:<12} {:<24} {:>12} {:>12} {:>12} {:>6}",
                    "dataset", "unit", "budget", "committed", "spent", "remaining", "open"
                );
                for s in statuses {
                    println!(
                        "{:<20} {:<12} {:<24} {:>12.6} {:>12.6} {:>12.6} {:>6}",
                        s.dataset.name,
                        s.dataset.privacy_unit,
                        s.dataset.budget.describe(),
                        s.committed,
                        s.spent,
                        s.remaining,
                        s.open_reservations
                    );
                }
            }
        }
        BudgetCommand::History { dataset } => {
            let ledger = Ledger::open(&path)?;
            let rows = ledger.history(dataset.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:>5} {:<16} {:<28} {:<10} {:>12} {:<25} mechanisms",
                    "id", "dataset", "release", "status", "cost", "reserved at"
                );
                for r in rows {
                    let mechs: Vec<String> = r
                        .mechanisms
                        .iter()
                        .map(|m| format!("{}[{}] {}", m.mechanism, m.target, m.loss.describe()))
                        .collect();
                    println!(
                        "{:>5} {:<16} {:<28} {:<10} {:>12.6} {:<25} {}",
                        r.id,
                        r.dataset,
                        r.release_id,
                        format!("{:?}", r.status).to_lowercase(),
                        r.cost,
                        r.reserved_at,
                        mechs.join("; ")
                    );
                }
            }
        }
        BudgetCommand::Grant { dataset, analyst, budget } => {
            let ledger = Ledger::open(&path)?;
            ledger.grant(dataset, analyst, budget.budget()?)?;
            let s = ledger.analyst_status(dataset, analyst)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!(
                    "analyst {analyst:?} on dataset {dataset:?}: grant {}, spent {:.6}, remaining {:.6}",
                    s.budget.describe(),
                    s.spent,
                    s.remaining
                );
            }
        }
        BudgetCommand::Analysts { dataset } => {
            let ledger = Ledger::open(&path)?;
            let rows = ledger.analysts(dataset.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<20} {:<20} {:<24} {:>12} {:>12} {:>18}",
                    "dataset", "analyst", "grant", "spent", "remaining", "dataset remaining"
                );
                for s in rows {
                    println!(
                        "{:<20} {:<20} {:<24} {:>12.6} {:>12.6} {:>18.6}",
                        s.dataset,
                        s.analyst,
                        s.budget.describe(),
                        s.spent,
                        s.remaining,
                        s.dataset_remaining
                    );
                }
            }
        }
        BudgetCommand::Resolve { charge, to, note } => {
            let ledger = Ledger::open(&path)?;
            ledger.resolve(*charge, *to, note)?;
            println!("charge #{charge} resolved as {to:?}");
        }
        BudgetCommand::Charge { dataset, release_id, what, loss, hold_ms } => {
            let mut ledger = Ledger::open(&path)?;
            let loss = match loss.budget()? {
                Budget::Pure { epsilon } => PrivacyLoss::Pure { epsilon },
                Budget::Approx { epsilon, delta } => PrivacyLoss::Approx { epsilon, delta },
                Budget::Zcdp { rho } => PrivacyLoss::Zcdp { rho },
            };
            let record = MechanismRecord {
                mechanism: "external".into(),
                target: what.clone(),
                sensitivity: None,
                noise: None,
                loss,
                params: serde_json::Value::Null,
            };
            let r = ledger.reserve(dataset, release_id, &[record], None)?;
            if let Some(ms) = hold_ms {
                eprintln!("reserved charge #{}", r.charge_id);
                std::thread::sleep(std::time::Duration::from_millis(*ms));
            }
            ledger.commit(r.charge_id)?;
            println!("charge #{} committed; remaining {}", r.charge_id, r.remaining);
        }
    }
    Ok(0)
}
