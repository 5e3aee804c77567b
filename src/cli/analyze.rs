//! `dpflow analyze`: the same analysis on each released synthetic set,
//! combined into one inference per coefficient (no budget is spent).

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

use dpflow::analyze::{Analysis, AnalysisSpec, EstimatorKind, Options, Rule, Sets, SpecFile, analyze};
use dpflow::io::InputFormat;

/// Arguments of `dpflow analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// The synthetic sets: one location (file, prefix, glob or URL) per set,
    /// or one table with `--set-column`.
    #[arg(required = true)]
    pub sets: Vec<String>,
    /// The sets are the distinct values of this column of one table.
    #[arg(long)]
    pub set_column: Option<String>,
    /// A linear model, e.g. `income ~ age + race + sex`.
    #[arg(long, conflicts_with_all = ["logistic", "mean", "proportion", "spec"])]
    pub ols: Option<String>,
    /// A logistic regression, e.g. `income == '>50K' ~ age + race + sex`.
    #[arg(long, conflicts_with_all = ["mean", "proportion", "spec"])]
    pub logistic: Option<String>,
    /// The mean of a numeric column.
    #[arg(long, conflicts_with_all = ["proportion", "spec"])]
    pub mean: Option<String>,
    /// The share of rows where a column equals a value: `COLUMN=VALUE`.
    #[arg(long, conflicts_with = "spec")]
    pub proportion: Option<String>,
    /// A YAML file of analyses: `analyses: [{estimator: ols, formula: "y ~ x"}, …]`.
    #[arg(long)]
    pub spec: Option<String>,
    /// Combining rule (default: fully-synthetic for two or more sets, single for one).
    #[arg(long, value_enum)]
    pub rule: Option<RuleArg>,
    /// Rows of the original data (n), for the fully-synthetic rule's fallback
    /// when T ≤ 0 (T* = (n_syn/n)·ū); default: the sets' own size.
    #[arg(long)]
    pub original_rows: Option<u64>,
    /// Interval coverage.
    #[arg(long, default_value_t = 0.95)]
    pub level: f64,
    /// Leave out a set's estimate of a coefficient whose standard error
    /// exceeds this (003 §5 does so for coefficients of near-empty levels).
    #[arg(long)]
    pub max_std_error: Option<f64>,
    /// Input format (default: from the extension).
    #[arg(long, value_enum)]
    pub input_format: Option<InputFormat>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: AnalyzeFormat,
}

/// The combining rules.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RuleArg {
    /// Fully synthetic data (NA+MI; Raghunathan, Reiter & Rubin 2003).
    FullySynthetic,
    /// 002 eqs. (9)–(11) (MODIPS and the DIPS synthesizers).
    Dips,
    /// One set, ordinary inference.
    Single,
}

/// Output formats of `dpflow analyze`.
#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum AnalyzeFormat {
    /// Human-readable table.
    #[default]
    Table,
    /// JSON (every set's estimate too).
    Json,
    /// CSV, one row per coefficient.
    Csv,
}

fn specs(a: &AnalyzeArgs) -> Result<Vec<AnalysisSpec>> {
    let one = |estimator, formula: Option<&String>, column: Option<String>, value: Option<String>| AnalysisSpec {
        estimator,
        formula: formula.cloned(),
        column,
        value,
    };
    Ok(if let Some(path) = &a.spec {
        SpecFile::load(path)?.analyses
    } else if let Some(f) = &a.ols {
        vec![one(EstimatorKind::Ols, Some(f), None, None)]
    } else if let Some(f) = &a.logistic {
        vec![one(EstimatorKind::Logistic, Some(f), None, None)]
    } else if let Some(c) = &a.mean {
        vec![one(EstimatorKind::Mean, None, Some(c.clone()), None)]
    } else if let Some(p) = &a.proportion {
        let Some((c, v)) = p.split_once('=') else { bail!("--proportion takes COLUMN=VALUE (got {p:?})") };
        vec![one(EstimatorKind::Proportion, None, Some(c.trim().into()), Some(v.trim().into()))]
    } else {
        bail!(
            "say what to estimate: --ols FORMULA, --logistic FORMULA, --mean COLUMN, --proportion COLUMN=VALUE or --spec FILE"
        )
    })
}

pub(super) async fn run(a: AnalyzeArgs) -> Result<i32> {
    let analyses = specs(&a)?;
    let sets = match &a.set_column {
        Some(column) => {
            let [location] = a.sets.as_slice() else { bail!("--set-column takes one table, not {}", a.sets.len()) };
            Sets::Column { location: location.clone(), column: column.clone() }
        }
        None => Sets::Locations(a.sets.clone()),
    };
    let rule = a.rule.map(|r| match r {
        RuleArg::FullySynthetic => Rule::FullySynthetic { syn_over_original: 1.0 },
        RuleArg::Dips => Rule::Dips,
        RuleArg::Single => Rule::Single,
    });
    let opts = Options {
        rule,
        alpha: 1.0 - a.level,
        max_std_error: a.max_std_error,
        format: a.input_format,
        original_rows: a.original_rows,
    };
    let pb = super::progress::spinner("analysing each synthetic set");
    let results = analyze(&sets, &analyses, &opts).await;
    pb.finish_and_clear();
    let results = results?;
    match a.format {
        AnalyzeFormat::Json => println!("{}", serde_json::to_string_pretty(&results)?),
        AnalyzeFormat::Csv => print!("{}", dpflow::analyze::to_csv(&results)),
        AnalyzeFormat::Table => print!("{}", table(&results)),
    }
    Ok(0)
}

fn df_text(df: Option<f64>) -> String {
    df.map_or("inf".into(), |d| format!("{d:.1}"))
}

fn table(results: &[Analysis]) -> String {
    let mut out = String::new();
    for r in results {
        let rows: usize = r.sets.iter().map(|s| s.rows).sum();
        let dropped: usize = r.sets.iter().map(|s| s.dropped).sum();
        out += &format!(
            "{}   ({} set(s), {} rows used, {} left out for nulls; rule: {}; {:.0}% intervals)\n",
            r.analysis.describe(),
            r.sets.len(),
            rows,
            dropped,
            r.rule.name(),
            r.level * 100.0
        );
        let width = r.terms.iter().map(|t| t.term.chars().count()).max().unwrap_or(4).max(4);
        out += &format!(
            "  {:<width$} {:>12} {:>12} {:>12} {:>12} {:>8}\n",
            "term", "estimate", "std_error", "ci_low", "ci_high", "df"
        );
        for t in &r.terms {
            let c = &t.combined;
            out += &format!(
                "  {:<width$} {:>12.6} {:>12.6} {:>12.6} {:>12.6} {:>8}{}\n",
                t.term,
                c.estimate,
                c.std_error,
                c.ci_low,
                c.ci_high,
                df_text(c.df),
                if c.fallback { "  (T ≤ 0: T* used)" } else { "" }
            );
        }
        out += "\n";
    }
    out
}
