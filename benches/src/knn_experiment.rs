//! The 004 §6 experiment on the NIST ACS excerpt: make income missing at
//! random (logistic model on other attributes), impute with 1-NN, and compare
//! ignore-missing vs. global sensitivity vs. smooth sensitivity over many runs.
//! An evaluation tool: it reads the ground truth, so its output is not private.

use std::collections::HashMap;

use anyhow::Result;
use datafusion::execution::context::SessionContext;
use dpflow_udfs::knn::{AttrKind, KnnConfig, MatchAttr, Metric};
use dpflow_udfs::noise::DpRng;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use dpflow::dataset::Dataset;
use dpflow::impute::spec::{Predicate, QueryKind, QuerySpec};
use dpflow::impute::{Estimator, answer, donor_search, exact, impute_columns, load_columns};

/// Summary of one (query, estimator) pair.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Query.
    pub query: String,
    /// Estimator.
    pub estimator: Estimator,
    /// Mean squared error against the ground truth.
    pub mse: f64,
    /// Mean of the estimates.
    pub mean_estimate: f64,
    /// Mean of the true values.
    pub mean_truth: f64,
    /// Runs with a defined estimate.
    pub runs: usize,
}

/// Experiment output.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentReport {
    /// Table.
    pub cells: Vec<Cell>,
    /// Every estimate: (run, query, estimator, estimate, truth).
    pub estimates: Vec<(usize, String, Estimator, f64, f64)>,
    /// Average missing rate.
    pub missing_rate: f64,
    /// Average L1(D).
    pub mean_l1: f64,
    /// Average number of donees.
    pub mean_donees: f64,
    /// ε per released number.
    pub epsilon: f64,
    /// Seconds per run (imputation + L1).
    pub seconds_per_run: f64,
}

fn range(col: &str, lo: f64, hi: f64) -> Predicate {
    Predicate { column: col.into(), lo: Some(lo), hi: Some(hi), codes: None }
}

/// Runs the experiment on `ma2019` (paths of data and domain).
pub async fn run(
    data: &str,
    domain: &str,
    runs: usize,
    epsilon: f64,
    seed: u64,
    threshold: f64,
) -> Result<ExperimentReport> {
    let ctx = SessionContext::new();
    let ds = Dataset::open("ma2019", data, None, domain)?;
    let match_cols: Vec<String> =
        ["AGEP", "SEX", "RAC1P", "EDU", "MSP", "HISP"].iter().map(|s| s.to_string()).collect();
    let value_cols: Vec<String> = vec!["PINCP".into(), "AGEP".into()];
    let vals = load_columns(&ctx, &ds, &value_cols, &[]).await?;
    let codes = load_columns(&ctx, &ds, &match_cols, &match_cols).await?;
    // Ground truth: people with an observed income.
    let truth_rows: Vec<usize> = (0..vals["PINCP"].len()).filter(|&r| vals["PINCP"][r].is_some()).collect();
    let dom = ds.domain();
    let groups: Vec<u32> = match_cols.iter().map(|c| if c == "AGEP" { 10 } else { 1 }).collect();
    let cfg = KnnConfig {
        attrs: match_cols
            .iter()
            .zip(&groups)
            .map(|(c, g)| MatchAttr {
                name: c.clone(),
                kind: if c == "AGEP" || c == "EDU" { AttrKind::Ordinal } else { AttrKind::Categorical },
                weight: 1.0,
                size: (dom.column(c).expect("column").cardinality() as u32).div_ceil(*g),
            })
            .collect(),
        metric: Metric::Euclidean,
        k: 1,
    };
    let (lo, hi) = (0.0, 300_000.0);
    let mean = |name: &str, a: f64, b: f64| QuerySpec {
        name: name.into(),
        kind: QueryKind::Mean { value: "PINCP".into(), lo, hi },
        predicate: vec![range("AGEP", a, b)],
    };
    let prop = |name: &str, a: f64, b: f64| QuerySpec {
        name: name.into(),
        kind: QueryKind::Proportion {
            numerator: vec![Predicate { column: "PINCP".into(), lo: Some(threshold), hi: None, codes: None }],
        },
        predicate: vec![range("AGEP", a, b)],
    };
    let queries = vec![
        // The overall mean (every sampled person is 15 or over: all have an applicable income).
        QuerySpec {
            name: "mean_income_all".into(),
            kind: QueryKind::Mean { value: "PINCP".into(), lo, hi },
            predicate: vec![],
        },
        mean("mean_income_20_59", 20.0, 59.0),
        mean("mean_income_20_29", 20.0, 29.0),
        mean("mean_income_40_49", 40.0, 49.0),
        prop("share_above_threshold_20_29", 20.0, 29.0),
        prop("share_above_threshold_40_49", 40.0, 49.0),
    ];
    let estimators = [Estimator::IgnoreMissing, Estimator::GlobalSensitivity, Estimator::Smooth];
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut noise_rng = DpRng::unsafe_seeded(seed ^ 0xA5A5);
    let mut estimates = Vec::new();
    let (mut miss_total, mut l1_total, mut donee_total) = (0.0, 0.0, 0.0);
    let t0 = std::time::Instant::now();
    let mut impute_secs = 0.0;
    for run in 0..runs {
        // A survey sample of the ground truth (with replacement; rows stay distinct by identifier).
        let n = truth_rows.len();
        let sample: Vec<usize> = (0..n).map(|_| truth_rows[rng.random_range(0..n)]).collect();
        let mut cols: HashMap<String, Vec<Option<f64>>> = HashMap::new();
        for c in &value_cols {
            cols.insert(c.clone(), sample.iter().map(|&r| vals[c][r]).collect());
        }
        let truth = exact(&cols, n, &queries);
        // MAR: income missing with probability sigmoid(w·x + b) on observed attributes.
        let feats: Vec<Vec<f64>> = sample
            .iter()
            .map(|&r| {
                let age = vals["AGEP"][r].unwrap_or(0.0);
                let edu = codes["EDU"][r].unwrap_or(0.0);
                let sex = codes["SEX"][r].unwrap_or(0.0);
                let race = codes["RAC1P"][r].unwrap_or(0.0);
                vec![(age - 45.0) / 18.0, (edu - 6.0) / 3.0, sex, f64::from(u8::from(race > 0.0))]
            })
            .collect();
        let w = [-0.6, -0.5, 0.4, 0.5];
        let score: Vec<f64> = feats.iter().map(|f| f.iter().zip(&w).map(|(a, b)| a * b).sum()).collect();
        let b = dpflow::missing::inject::fit_bias(&score, 0.15);
        let mut masked = cols.clone();
        let mut missing = 0usize;
        for (r, s) in score.iter().enumerate() {
            if rng.random::<f64>() < dpflow::missing::inject::sigmoid(s + b) {
                masked.get_mut("PINCP").expect("present")[r] = None;
                missing += 1;
            }
        }
        miss_total += missing as f64 / n as f64;
        let match_codes: Vec<Vec<u32>> = sample
            .iter()
            .map(|&r| match_cols.iter().zip(&groups).map(|(c, g)| codes[c][r].unwrap_or(0.0) as u32 / g).collect())
            .collect();
        let ti = std::time::Instant::now();
        let data = impute_columns(masked, &["PINCP".to_string()], match_codes, &cfg, 2_000_000)?;
        impute_secs += ti.elapsed().as_secs_f64();
        l1_total += data.l1.value as f64;
        donee_total += data.imputed.iter().filter(|x| **x).count() as f64;
        let summary = data.summarize(&queries)?;
        for est in estimators {
            let rel = answer(&summary, &queries, est, epsilon, None, &mut noise_rng)?;
            for ((q, r), t) in queries.iter().zip(rel).zip(&truth) {
                if let (Some(v), Some(t)) = (r.value, t) {
                    estimates.push((run, q.name.clone(), est, v, *t));
                }
            }
        }
    }
    let _ = t0;
    let mut cells = Vec::new();
    for q in &queries {
        for est in estimators {
            let e: Vec<&(usize, String, Estimator, f64, f64)> =
                estimates.iter().filter(|x| x.1 == q.name && x.2 == est).collect();
            let k = e.len().max(1) as f64;
            cells.push(Cell {
                query: q.name.clone(),
                estimator: est,
                mse: e.iter().map(|x| (x.3 - x.4).powi(2)).sum::<f64>() / k,
                mean_estimate: e.iter().map(|x| x.3).sum::<f64>() / k,
                mean_truth: e.iter().map(|x| x.4).sum::<f64>() / k,
                runs: e.len(),
            });
        }
    }
    Ok(ExperimentReport {
        cells,
        estimates,
        missing_rate: miss_total / runs as f64,
        mean_l1: l1_total / runs as f64,
        mean_donees: donee_total / runs as f64,
        epsilon,
        seconds_per_run: impute_secs / runs as f64,
    })
}

/// Donor search + L1(D) timing on a bench-data file: imputes `income` from
/// age (by decade), sex, race, education and state.
pub async fn speed(input: &str, domain: &str) -> Result<serde_json::Value> {
    let ctx = SessionContext::new();
    let ds = Dataset::open("bench", input, None, domain)?;
    let match_cols: Vec<String> =
        ["age", "sex", "race", "education", "marital"].iter().map(|s| s.to_string()).collect();
    let groups = [10u32, 1, 1, 1, 1];
    let t_load = std::time::Instant::now();
    let vals = load_columns(&ctx, &ds, &["income".to_string()], &[]).await?;
    let codes = load_columns(&ctx, &ds, &match_cols, &match_cols).await?;
    let load = t_load.elapsed().as_secs_f64();
    let n = vals["income"].len();
    let dom = ds.domain();
    let cfg = KnnConfig {
        attrs: match_cols
            .iter()
            .zip(groups)
            .map(|(c, g)| MatchAttr {
                name: c.clone(),
                kind: if c == "age" || c == "education" { AttrKind::Ordinal } else { AttrKind::Categorical },
                weight: 1.0,
                size: (dom.column(c).expect("column").cardinality() as u32).div_ceil(g),
            })
            .collect(),
        metric: Metric::Euclidean,
        k: 1,
    };
    let match_codes: Vec<Vec<u32>> = (0..n)
        .map(|r| match_cols.iter().zip(groups).map(|(c, g)| codes[c][r].unwrap_or(0.0) as u32 / g).collect())
        .collect();
    let s = donor_search(&vals, &["income".to_string()], match_codes, &cfg, 2_000_000)?;
    Ok(serde_json::json!({
        "rows": n,
        "donees": s.rec.complete.iter().filter(|c| !**c).count(),
        "classes": s.asg.classes.len(),
        "l1": s.l1,
        "seconds_load": load,
        "seconds_donor_search": s.seconds_search,
        "seconds_l1": s.seconds_l1,
        "seconds_donor_search_and_l1": s.seconds_search + s.seconds_l1,
        "peak_rss_mb": crate::peak_rss_mb(),
    }))
}
