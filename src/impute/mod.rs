//! DP statistics on kNN-imputed data with smooth sensitivity (004 §3–6;
//! NOTES §9): counts and proportions (Thm 5.1, Cor 5.2), means over a
//! subpopulation (Thm 5.4, Cor 5.5, count released first), variances
//! (Thm 5.6, Cor 5.7), with generalized Cauchy noise (γ = 1 + ε/(2 ln 2)) or
//! the Gaussian variant for (ε, δ); plus the two baselines of 004 §6.3.
//!
//! The imputed microdata never leaves this module: only noisy statistics do.
//! The smooth bound S(D) = f(L1(D)) is data-dependent and is *not* reported.

pub mod experiment;
pub mod spec;

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, UInt32Type};
use datafusion::execution::context::SessionContext;
use dpflow_udfs::domain::{ColumnKind, EncodeExec};
use dpflow_udfs::knn::{Assignment, KnnConfig, KnnRecords, L1Report};
use dpflow_udfs::noise::cauchy::{grid_exponent, snap};
use dpflow_udfs::noise::{DpRng, GeneralizedCauchy, NoiseDistribution};
use futures::StreamExt;
use serde::Serialize;

use crate::dataset::Dataset;
use crate::privacy::{MechanismRecord, PrivacyLoss};
pub use spec::{Predicate, QueryKind, QuerySpec, SmoothNoise};

/// The imputed data held in memory (crate-private: never released).
#[derive(Debug, Clone)]
pub(crate) struct Imputed {
    /// Column name → values (numbers, or category codes) after imputation.
    pub columns: HashMap<String, Vec<Option<f64>>>,
    /// Column name → values before imputation (for the ignore-missing baseline).
    pub observed: HashMap<String, Vec<Option<f64>>>,
    /// Which rows were imputed.
    pub imputed: Vec<bool>,
    /// L1(D).
    pub l1: L1Report,
    /// Rows.
    pub n: usize,
    /// Imputed attributes A.
    pub a: Vec<String>,
}

/// Reads the columns `needed` of a dataset as numbers (categorical → code).
pub(crate) async fn load_columns(
    ctx: &SessionContext,
    ds: &Dataset,
    needed: &[String],
    as_codes: &[String],
) -> Result<HashMap<String, Vec<Option<f64>>>> {
    let domain = std::sync::Arc::new(ds.domain().clone());
    let df = ds.raw(ctx).await?;
    let plan = df.create_physical_plan().await?;
    let typed = std::sync::Arc::new(EncodeExec::typed(plan, domain.clone())?);
    let codes_plan =
        std::sync::Arc::new(EncodeExec::try_new(ds.raw(ctx).await?.create_physical_plan().await?, domain.clone())?);
    let mut out: HashMap<String, Vec<Option<f64>>> = needed.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut s_typed = datafusion::physical_plan::execute_stream(typed, ctx.task_ctx())?;
    let mut s_codes = datafusion::physical_plan::execute_stream(codes_plan, ctx.task_ctx())?;
    while let (Some(t), Some(c)) = (s_typed.next().await, s_codes.next().await) {
        let (t, c) = (t?, c?);
        for name in needed {
            let col = domain.column(name).with_context(|| format!("unknown column {name}"))?;
            let i = domain.position(name).expect("known");
            let v = out.get_mut(name).expect("inserted");
            match col.kind {
                _ if as_codes.contains(name) => {
                    let codes = c.column(i).as_primitive::<UInt32Type>();
                    v.extend(codes.values().iter().map(|&x| Some(x as f64)));
                }
                ColumnKind::Categorical { .. } | ColumnKind::Boolean => {
                    let codes = c.column(i).as_primitive::<UInt32Type>();
                    let null = col.null_code();
                    v.extend(codes.values().iter().map(|&x| (Some(x) != null).then_some(x as f64)));
                }
                _ => {
                    let f = datafusion::arrow::compute::cast(
                        t.column(i),
                        &datafusion::arrow::datatypes::DataType::Float64,
                    )?;
                    let f = f.as_primitive::<Float64Type>();
                    v.extend((0..f.len()).map(|r| f.is_valid(r).then(|| f.value(r))));
                }
            }
        }
    }
    Ok(out)
}

/// The donor search and L1(D) of one imputation, each phase timed (for benchmarks).
pub(crate) struct DonorSearch {
    /// Records (rows complete on `a` are donors).
    pub rec: KnnRecords,
    /// Donors of every donee.
    pub asg: Assignment,
    /// L1(D).
    pub l1: L1Report,
    /// Seconds spent in the donor search.
    pub seconds_search: f64,
    /// Seconds spent computing L1(D).
    pub seconds_l1: f64,
}

/// Donor search over the rows of `columns` (donors: complete on `a`) and L1(D).
pub(crate) fn donor_search(
    columns: &HashMap<String, Vec<Option<f64>>>,
    a: &[String],
    match_codes: Vec<Vec<u32>>,
    cfg: &KnnConfig,
    enumerate_limit: u64,
) -> Result<DonorSearch> {
    let n = match_codes.len();
    let complete: Vec<bool> = (0..n).map(|r| a.iter().all(|x| columns[x][r].is_some())).collect();
    let rec = KnnRecords { keys: match_codes, rid: (0..n).map(|i| i as f64).collect(), complete };
    let t = std::time::Instant::now();
    let asg = Assignment::build(cfg, &rec);
    let seconds_search = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let l1 = asg.l1(cfg, &rec, enumerate_limit).map_err(anyhow::Error::msg)?;
    Ok(DonorSearch { rec, asg, l1, seconds_search, seconds_l1: t.elapsed().as_secs_f64() })
}

/// Imputes `a` in `columns` with kNN on the matching attributes (class codes
/// from `match_codes`), k = 1 copy by default; returns the imputed data and L1(D).
pub(crate) fn impute_columns(
    columns: HashMap<String, Vec<Option<f64>>>,
    a: &[String],
    match_codes: Vec<Vec<u32>>,
    cfg: &KnnConfig,
    enumerate_limit: u64,
) -> Result<Imputed> {
    let n = match_codes.len();
    let DonorSearch { rec, asg, l1, .. } = donor_search(&columns, a, match_codes, cfg, enumerate_limit)?;
    let observed = columns.clone();
    let mut cols = columns;
    let imputed: Vec<bool> = (0..n).map(|r| !rec.complete[r]).collect();
    for x in a {
        let src = &observed[x];
        let dst = cols.get_mut(x).expect("present");
        for r in 0..n {
            if imputed[r] {
                // Mean of the donors' values (the value itself for k = 1); no donor stays null.
                let (sum, k) =
                    asg.donors[r].iter().filter_map(|&d| src[d]).fold((0.0, 0usize), |(s, k), v| (s + v, k + 1));
                dst[r] = (k > 0).then(|| sum / k as f64);
            }
        }
    }
    Ok(Imputed { columns: cols, observed, imputed, l1, n, a: a.to_vec() })
}

/// One released statistic.
#[derive(Debug, Clone, Serialize)]
pub struct Released {
    /// Query name.
    pub name: String,
    /// The noisy value (None when undefined, e.g. an empty subpopulation).
    pub value: Option<f64>,
    /// The noisy count of the subpopulation (released first for means, variances, proportions).
    pub count: Option<f64>,
    /// Mechanisms charged.
    pub mechanisms: Vec<MechanismRecord>,
}

/// The estimators compared in 004 §6.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Estimator {
    /// Impute, then smooth sensitivity (Cor 5.2/5.5/5.7).
    Smooth,
    /// Ignore incomplete rows, Laplace with global sensitivity.
    IgnoreMissing,
    /// Impute, Laplace with the optimistic global bound L1 = number of donees
    /// (004 §6.3; an evaluation baseline — that count is itself private).
    GlobalSensitivity,
}

fn rows_where(d: &HashMap<String, Vec<Option<f64>>>, p: &[Predicate], n: usize) -> Vec<bool> {
    (0..n).map(|r| p.iter().all(|q| q.matches(d[&q.column][r]))).collect()
}

/// Draws noise and releases `q + scale·X` safely (snapped to a grid).
fn release(q: f64, scale: f64, noise: &SmoothNoise, rng: &mut DpRng) -> f64 {
    let x = match *noise {
        SmoothNoise::Cauchy { gamma } => GeneralizedCauchy::new(gamma).expect("γ > 1").sample(rng),
        SmoothNoise::Gaussian => dpflow_udfs::noise::cauchy::standard_normal_sample(rng),
        SmoothNoise::Laplace => {
            // Unit Laplace from the exact discrete sampler at a fine grid.
            let g = 2f64.powi(-20);
            NoiseDistribution::Laplace { scale: 1.0 / g }.sample_integer(rng) as f64 * g
        }
    };
    snap(q + scale * x, grid_exponent(scale.max(f64::MIN_POSITIVE)))
}

/// Answers the queries with one estimator; every query spends `epsilon` per
/// released number (counts first, then means/variances).
pub(crate) fn answer(
    data: &Imputed,
    queries: &[QuerySpec],
    estimator: Estimator,
    epsilon: f64,
    delta: Option<f64>,
    rng: &mut DpRng,
) -> Result<Vec<Released>> {
    let ln2 = std::f64::consts::LN_2;
    let smooth_noise = match delta {
        None => SmoothNoise::Cauchy { gamma: 1.0 + epsilon / (2.0 * ln2) },
        Some(d) => {
            // Gaussian is (α, β)-admissible with α = ε/(5√(2 ln(2/δ))), β = ε/(4(1 + ln(2/δ)))
            // (Nissim, Raskhodnikova, Smith 2007, Lemma 2.10); our bound is ln 2-smooth.
            let beta = epsilon / (4.0 * (1.0 + (2.0 / d).ln()));
            if beta < ln2 {
                bail!(
                    "the Gaussian smooth-sensitivity variant needs ε ≥ 4·ln2·(1 + ln(2/δ)) = {:.2} at δ = {d:e} (the bound is only ln 2-smooth); use the generalized Cauchy (no δ)",
                    4.0 * ln2 * (1.0 + (2.0 / d).ln())
                );
            }
            SmoothNoise::Gaussian
        }
    };
    let alpha = match (smooth_noise, delta) {
        (SmoothNoise::Gaussian, Some(d)) => epsilon / (5.0 * (2.0 * (2.0 / d).ln()).sqrt()),
        _ => ln2,
    };
    let l1 = data.l1.value as f64;
    let donees = data.imputed.iter().filter(|x| **x).count() as f64;
    let mut out = Vec::new();
    for q in queries {
        let ignore = estimator == Estimator::IgnoreMissing;
        let cols = if ignore { &data.observed } else { &data.columns };
        // Ignoring missing data keeps only complete rows.
        let mut sel = rows_where(cols, &q.predicate, data.n);
        if ignore {
            for (r, s) in sel.iter_mut().enumerate() {
                if data.imputed[r] {
                    *s = false;
                }
            }
        }
        let depends = q.predicate.iter().any(|p| data.a.contains(&p.column));
        let mut mechs = Vec::new();
        let loss = match delta {
            Some(d) if estimator == Estimator::Smooth => PrivacyLoss::Approx { epsilon, delta: d },
            _ => PrivacyLoss::Pure { epsilon },
        };
        let mut record = |what: &str, sens: Option<f64>| {
            mechs.push(MechanismRecord {
                mechanism: match estimator {
                    Estimator::Smooth => format!(
                        "smooth_sensitivity_{}",
                        if delta.is_some() { "gaussian" } else { "generalized_cauchy" }
                    ),
                    _ => "laplace".into(),
                },
                target: format!("{} ({what})", q.name),
                sensitivity: sens,
                noise: None,
                loss: loss.clone(),
                params: serde_json::json!({ "estimator": estimator, "smooth_bound": "data-dependent, not released" }),
            });
        };
        // Count of the subpopulation (the denominator).
        let count = sel.iter().filter(|x| **x).count() as f64;
        let (count_scale, count_noise) = match estimator {
            Estimator::Smooth => ((1.0 + l1) / alpha, smooth_noise),
            Estimator::IgnoreMissing => (1.0 / epsilon, SmoothNoise::Laplace),
            Estimator::GlobalSensitivity => ((1.0 + donees) / epsilon, SmoothNoise::Laplace),
        };
        let noisy_count = release(count, count_scale, &count_noise, rng);
        record("count", (estimator != Estimator::Smooth).then_some(count_scale * epsilon));
        let value = match &q.kind {
            QueryKind::Count => Some(noisy_count),
            QueryKind::Proportion { numerator } => {
                let num_sel: Vec<bool> =
                    rows_where(cols, numerator, data.n).iter().zip(&sel).map(|(a, b)| *a && *b).collect();
                let num = num_sel.iter().filter(|x| **x).count() as f64;
                let noisy_num = release(num, count_scale, &count_noise, rng);
                record("numerator count", (estimator != Estimator::Smooth).then_some(count_scale * epsilon));
                (noisy_count >= 1.0).then(|| (noisy_num / noisy_count).clamp(0.0, 1.0))
            }
            QueryKind::Mean { value, lo, hi } | QueryKind::Variance { value, lo, hi } => {
                let (a, b) = (*lo, *hi);
                let vals: Vec<f64> =
                    (0..data.n).filter(|&r| sel[r]).filter_map(|r| cols[value][r]).map(|v| v.clamp(a, b)).collect();
                let s = noisy_count;
                if s <= 1.0 {
                    None
                } else {
                    let mean = vals.iter().sum::<f64>() / s;
                    let mean_sens = match estimator {
                        Estimator::Smooth => {
                            if depends {
                                b.abs().max(a.abs()) * (1.0 + l1) / s
                            } else {
                                (b.abs().max(a.abs()) + l1 * (b - a)) / s
                            }
                        }
                        Estimator::IgnoreMissing => b.abs().max(a.abs()) / s,
                        Estimator::GlobalSensitivity => (b.abs().max(a.abs()) + donees * (b - a)) / s,
                    };
                    let (mscale, mnoise) = match estimator {
                        Estimator::Smooth => (mean_sens / alpha, smooth_noise),
                        _ => (mean_sens / epsilon, SmoothNoise::Laplace),
                    };
                    let noisy_mean = release(mean, mscale, &mnoise, rng).clamp(a, b);
                    record("mean", (estimator != Estimator::Smooth).then_some(mean_sens));
                    if let QueryKind::Variance { .. } = q.kind {
                        let m = (a - noisy_mean).powi(2).max((b - noisy_mean).powi(2));
                        let var = vals.iter().map(|v| (v - noisy_mean).powi(2)).sum::<f64>() / (s - 1.0);
                        let l = match estimator {
                            Estimator::Smooth => l1,
                            Estimator::IgnoreMissing => 0.0,
                            Estimator::GlobalSensitivity => donees,
                        };
                        let vsens = m * (1.0 + l) / (s - 1.0);
                        let (vscale, vnoise) = match estimator {
                            Estimator::Smooth => (vsens / alpha, smooth_noise),
                            _ => (vsens / epsilon, SmoothNoise::Laplace),
                        };
                        record("variance", (estimator != Estimator::Smooth).then_some(vsens));
                        Some(release(var, vscale, &vnoise, rng).clamp(0.0, (b - a).powi(2) / 4.0 * s / (s - 1.0)))
                    } else {
                        Some(noisy_mean)
                    }
                }
            }
        };
        out.push(Released { name: q.name.clone(), value, count: Some(noisy_count), mechanisms: mechs });
    }
    Ok(out)
}

/// The exact (non-private) value of each query on the given columns (for evaluation).
pub(crate) fn exact(cols: &HashMap<String, Vec<Option<f64>>>, n: usize, queries: &[QuerySpec]) -> Vec<Option<f64>> {
    queries
        .iter()
        .map(|q| {
            let sel = rows_where(cols, &q.predicate, n);
            let count = sel.iter().filter(|x| **x).count() as f64;
            match &q.kind {
                QueryKind::Count => Some(count),
                QueryKind::Proportion { numerator } => {
                    let num =
                        rows_where(cols, numerator, n).iter().zip(&sel).filter(|(a, b)| **a && **b).count() as f64;
                    (count > 0.0).then(|| num / count)
                }
                QueryKind::Mean { value, lo, hi } => {
                    let v: Vec<f64> =
                        (0..n).filter(|&r| sel[r]).filter_map(|r| cols[value][r]).map(|x| x.clamp(*lo, *hi)).collect();
                    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
                }
                QueryKind::Variance { value, lo, hi } => {
                    let v: Vec<f64> =
                        (0..n).filter(|&r| sel[r]).filter_map(|r| cols[value][r]).map(|x| x.clamp(*lo, *hi)).collect();
                    let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
                    (v.len() > 1).then(|| v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64)
                }
            }
        })
        .collect()
}

/// What `dpflow impute` releases.
#[derive(Debug, Clone, Serialize)]
pub struct ImputeReport {
    /// Estimator used.
    pub estimator: Estimator,
    /// Released statistics.
    pub results: Vec<Released>,
    /// Rows whose attributes were imputed (not released: reported as a note only in tests/benchmarks).
    #[serde(skip)]
    pub donees: usize,
    /// L1(D) (data-dependent: never released; kept for benchmarks).
    #[serde(skip)]
    pub l1: Option<L1Report>,
}

/// Loads and imputes the data of a spec (crate-private).
pub(crate) async fn prepare(ctx: &SessionContext, spec: &spec::ImputeSpec) -> Result<Imputed> {
    let ds = Dataset::open("impute", &spec.input, None, &spec.domain)?;
    prepare_on(ctx, &ds, &spec.imputation, &spec.queries).await
}

/// Loads the columns `queries` read from an opened dataset and imputes them.
pub(crate) async fn prepare_on(
    ctx: &SessionContext,
    ds: &Dataset,
    imp: &spec::Imputation,
    queries: &[QuerySpec],
) -> Result<Imputed> {
    let mut needed: Vec<String> = imp.columns.clone();
    for q in queries {
        needed.extend(q.predicate.iter().map(|p| p.column.clone()));
        match &q.kind {
            QueryKind::Mean { value, .. } | QueryKind::Variance { value, .. } => needed.push(value.clone()),
            QueryKind::Proportion { numerator } => needed.extend(numerator.iter().map(|p| p.column.clone())),
            QueryKind::Count => {}
        }
    }
    needed.sort();
    needed.dedup();
    let match_cols: Vec<String> = imp.grouping.iter().map(|(c, _)| c.clone()).collect();
    let mut cols = load_columns(ctx, ds, &needed, &[]).await?;
    let codes = load_columns(ctx, ds, &match_cols, &match_cols).await?;
    let n = cols.values().next().map_or(0, |v| v.len());
    let match_codes: Vec<Vec<u32>> =
        (0..n).map(|r| imp.grouping.iter().map(|(c, g)| (codes[c][r].unwrap_or(0.0) as u32) / g).collect()).collect();
    cols.retain(|k, _| needed.contains(k));
    impute_columns(cols, &imp.columns, match_codes, &imp.knn, 2_000_000)
}

/// Runs a spec: imputes, then releases every query with `estimator`.
pub async fn run(
    ctx: &SessionContext,
    spec: &spec::ImputeSpec,
    estimator: Estimator,
    rng: &mut DpRng,
) -> Result<ImputeReport> {
    let data = prepare(ctx, spec).await?;
    let (eps, delta) = match spec.budget {
        crate::privacy::Budget::Pure { epsilon } => (epsilon, None),
        crate::privacy::Budget::Approx { epsilon, delta } => (epsilon, Some(delta)),
        crate::privacy::Budget::Zcdp { .. } => {
            bail!("smooth-sensitivity releases need an ε (or ε, δ) budget per released number")
        }
    };
    let results = answer(&data, &spec.queries, estimator, eps, delta, rng)?;
    Ok(ImputeReport { estimator, results, donees: data.imputed.iter().filter(|x| **x).count(), l1: Some(data.l1) })
}

/// The mechanisms a spec will charge (known before reading data): one per
/// released number.
pub fn planned_records(spec: &spec::ImputeSpec, estimator: Estimator) -> Result<Vec<MechanismRecord>> {
    let loss = match spec.budget {
        crate::privacy::Budget::Pure { epsilon } => PrivacyLoss::Pure { epsilon },
        crate::privacy::Budget::Approx { epsilon, delta } => PrivacyLoss::Approx { epsilon, delta },
        crate::privacy::Budget::Zcdp { .. } => bail!("smooth-sensitivity releases need an ε (or ε, δ) budget"),
    };
    Ok(spec.queries.iter().flat_map(|q| query_records(q, estimator, &loss)).collect())
}

/// The mechanisms one query charges, each released number at `loss`.
pub fn query_records(q: &QuerySpec, estimator: Estimator, loss: &PrivacyLoss) -> Vec<MechanismRecord> {
    (0..q.kind.released_numbers())
        .map(|i| MechanismRecord {
            mechanism: match estimator {
                Estimator::Smooth => match loss {
                    PrivacyLoss::Approx { .. } => "smooth_sensitivity_gaussian".into(),
                    _ => "smooth_sensitivity_generalized_cauchy".into(),
                },
                _ => "laplace".into(),
            },
            target: format!("{} ({})", q.name, q.kind.part_names()[i]),
            sensitivity: None,
            noise: None,
            loss: loss.clone(),
            params: serde_json::json!({ "estimator": estimator }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpflow_udfs::knn::{AttrKind, MatchAttr, Metric};
    use dpflow_udfs::noise::testing::ks_test;

    fn tiny() -> Imputed {
        // 40 rows, class by x in 0..4; y missing for some rows.
        let n = 40;
        let x: Vec<Option<f64>> = (0..n).map(|i| Some((i % 4) as f64)).collect();
        let y: Vec<Option<f64>> = (0..n).map(|i| if i % 5 == 0 { None } else { Some((i * 37 % 100) as f64) }).collect();
        let mut cols = HashMap::new();
        cols.insert("x".to_string(), x.clone());
        cols.insert("y".to_string(), y);
        let cfg = KnnConfig {
            attrs: vec![MatchAttr { name: "x".into(), kind: AttrKind::Ordinal, weight: 1.0, size: 4 }],
            metric: Metric::Euclidean,
            k: 1,
        };
        let codes = x.iter().map(|v| vec![v.unwrap() as u32]).collect();
        impute_columns(cols, &["y".to_string()], codes, &cfg, 1000).unwrap()
    }

    #[test]
    fn smooth_count_noise_is_generalized_cauchy_with_the_bound_scale() {
        let data = tiny();
        assert!(data.imputed.iter().filter(|x| **x).count() == 8);
        assert!(
            data.imputed.iter().zip(&data.columns["y"]).all(|(i, v)| !*i || v.is_some()),
            "every donee got a value"
        );
        let q = vec![QuerySpec { name: "n".into(), kind: QueryKind::Count, predicate: vec![] }];
        let eps = 6.0 * std::f64::consts::LN_2; // γ = 4
        let scale = (1.0 + data.l1.value as f64) / std::f64::consts::LN_2;
        let mut rng = DpRng::unsafe_seeded(3);
        let mut z: Vec<f64> = (0..4000)
            .map(|_| {
                (answer(&data, &q, Estimator::Smooth, eps, None, &mut rng).unwrap()[0].value.unwrap() - 40.0) / scale
            })
            .collect();
        let d = dpflow_udfs::noise::GeneralizedCauchy::new(4.0).unwrap();
        // Numerical cdf of the generalized Cauchy(4).
        let (lo, h) = (-60.0f64, 1e-3);
        let mut table = vec![0.0];
        let mut acc = 0.0;
        for i in 0..120_000 {
            acc += d.pdf(lo + (i as f64 + 0.5) * h) * h;
            table.push(acc);
        }
        let cdf = |t: f64| table[(((t.clamp(lo, 60.0) - lo) / h) as usize).min(table.len() - 1)];
        ks_test(&mut z, cdf, 1e-4);
    }

    #[test]
    fn estimators_agree_with_exact_values_at_huge_epsilon() {
        let data = tiny();
        let q = vec![
            QuerySpec {
                name: "m".into(),
                kind: QueryKind::Mean { value: "y".into(), lo: 0.0, hi: 100.0 },
                predicate: vec![],
            },
            QuerySpec {
                name: "p".into(),
                kind: QueryKind::Proportion {
                    numerator: vec![Predicate { column: "y".into(), lo: Some(50.0), hi: None, codes: None }],
                },
                predicate: vec![],
            },
        ];
        let ex = exact(&data.columns, data.n, &q);
        let mut rng = DpRng::unsafe_seeded(4);
        let r = answer(&data, &q, Estimator::Smooth, 1e7, None, &mut rng).unwrap();
        assert!((r[0].value.unwrap() - ex[0].unwrap()).abs() < 0.1);
        assert!((r[1].value.unwrap() - ex[1].unwrap()).abs() < 0.01);
        // Gaussian variant refuses ε below its admissibility condition.
        assert!(answer(&data, &q, Estimator::Smooth, 1.0, Some(1e-6), &mut rng).is_err());
        assert!(answer(&data, &q, Estimator::Smooth, 60.0, Some(1e-6), &mut rng).is_ok());
    }
}
