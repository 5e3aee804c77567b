//! `dpflow-bench`: dpflow's benchmark and experiment drivers.
//!
//! Not part of the product: it writes benchmark data from a known network,
//! times dpflow against plain DataFusion and private-pgm, and reruns the
//! paper experiments. Nothing it prints is a private release (benchmark data
//! is public by construction; experiments run on public excerpts with seeds).
//! The scripts in `benches/` call it; their results are in `benches/results/`.

use std::time::Instant;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use itertools::Itertools;
use serde_json::json;

use dpflow::dataset::Dataset;
use dpflow::io::session_context;
use dpflow_bench::{bench_data, dips_case, dips_study, knn_experiment, napsu_adult, napsu_toy, peak_rss_mb, pgm};

/// mimalloc, as datafusion-cli uses: many small allocations on several
/// threads (NUTS chains, DataFusion partitions) spent half their time in
/// glibc's malloc and free (`benches/results/napsu/twinify.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// dpflow-bench: benchmark data and measurements for dpflow (not a release tool).
#[derive(Debug, Parser)]
#[command(name = "dpflow-bench", version, about, long_about = None)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: BenchCommand,
}

/// How to compute the marginals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MarginalEngine {
    /// dpflow's MarginalExec (all marginals in one scan).
    Exec,
    /// One DataFusion `GROUP BY a, b` query per marginal.
    GroupBy,
    /// One DataFusion `GROUP BY GROUPING SETS (...)` query.
    GroupingSets,
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Write census-like benchmark data (Parquet) from a known Bayesian network, with its domain file.
    BenchData {
        /// Number of rows.
        #[arg(long)]
        rows: u64,
        /// Output Parquet file or URL.
        #[arg(long)]
        out: String,
        /// Seed of the generating model and the sample (benchmark data is not private).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also write the matching public domain file here.
        #[arg(long)]
        domain_out: Option<String>,
        /// Rows per generated batch.
        #[arg(long, default_value_t = 1 << 16, hide = true)]
        batch_rows: usize,
        /// Number of columns: the first W of the person's 16, or, from 17 to 32, a spouse's
        /// columns as well (for the width curves of issue 19).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=bench_data::MAX_COLUMNS as i64))]
        columns: u16,
    },
    /// Write noisy measurements for a PGM estimation benchmark: all 1-way
    /// marginals plus the 2-way marginals of the maximum spanning tree on
    /// mutual information (benchmark input, not a private release).
    PgmMeasurements {
        /// Input data.
        #[arg(long)]
        input: String,
        /// Domain file.
        #[arg(long)]
        domain: String,
        /// Output JSON.
        #[arg(long)]
        out: String,
        /// Noise σ for every marginal.
        #[arg(long, default_value_t = 10.0)]
        sigma: f64,
        /// Seed of the noise (benchmark only).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// The 004 §6 experiment on the NIST ACS excerpt (ignore-missing vs global vs smooth sensitivity).
    KnnExperiment {
        /// Data (default: the bundled ma2019).
        #[arg(long, default_value = "sample_data/nist-acs/ma2019.csv")]
        data: String,
        /// Domain file.
        #[arg(long, default_value = "sample_data/nist-acs/ma2019.domain.yaml")]
        domain: String,
        /// Runs.
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// ε per released number (default 6·ln 2, as in 004 §6).
        #[arg(long, default_value_t = 6.0 * std::f64::consts::LN_2)]
        epsilon: f64,
        /// Income threshold of the proportion queries (2019 poverty line for a family of four).
        #[arg(long, default_value_t = 25750.0)]
        threshold: f64,
        /// Seed (evaluation only).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write every estimate as CSV here (for plots).
        #[arg(long)]
        csv: Option<String>,
    },
    /// 002 §4.1–§4.3.1: DIPS simulation studies 1 (Bernoulli), 2 (normal), 3 (GLOM); a CSV table.
    DipsStudy {
        /// Study number (1 to 4).
        #[arg(long)]
        study: u8,
        /// Repeats per scenario (002 ran 5000; the issue asks for at least 1000).
        #[arg(long, default_value_t = 1000)]
        repeats: usize,
        /// Step of ln ε between −4 and 4.
        #[arg(long, default_value_t = 0.5)]
        step: f64,
        /// Seed (simulation only).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// CSV output.
        #[arg(long)]
        out: String,
    },
    /// 002 §5's case study shape on the penguins: SVM accuracy after LAP and MODIPS at ε = e.
    DipsCase {
        /// The penguins CSV.
        #[arg(long, default_value = "sample_data/penguins/penguins.csv")]
        input: String,
        /// Repetitions.
        #[arg(long, default_value_t = 100)]
        repeats: usize,
        /// ε (002 §5: e).
        #[arg(long, default_value_t = std::f64::consts::E)]
        epsilon: f64,
        /// Seed (simulation only).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// 003 §5.1's toy experiment: coverage of NA+MI (NAPSU-MQ, Laplace, Rubin's rules) intervals.
    NapsuToy {
        /// ε values (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,1")]
        epsilon: Vec<f64>,
        /// Repeats per ε.
        #[arg(long, default_value_t = 200)]
        repeats: usize,
        /// Records.
        #[arg(long, default_value_t = 2000)]
        n: usize,
        /// Synthetic sets per repeat.
        #[arg(long, default_value_t = 100)]
        m: usize,
        /// Seed (simulation only).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also run these synthesizers with m = 1 and ordinary standard errors (aim, mst).
        #[arg(long, value_delimiter = ',')]
        baselines: Vec<String>,
    },
    /// 003 §5.2 / App. E: NAPSU-MQ on Adult-reduced, coverage of the real-data logistic coefficients.
    NapsuAdult {
        /// The UCI Adult file.
        #[arg(long, default_value = "sample_data/adult/adult.data")]
        input: String,
        /// ε values (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,1")]
        epsilon: Vec<f64>,
        /// Repeats per ε.
        #[arg(long, default_value_t = 20)]
        repeats: usize,
        /// Synthetic sets per repeat (003 App. E: 100).
        #[arg(long, default_value_t = 100)]
        m: usize,
        /// Use NUTS (4 chains, 800 warm-up, 2000 draws, depth 12) instead of Laplace.
        #[arg(long)]
        nuts: bool,
        /// With --nuts: sample the exact posterior (hours) instead of the importance-corrected
        /// fixed-covariance surrogate that `--inference nuts` uses.
        #[arg(long)]
        nuts_exact: bool,
        /// Queries in place of 003's twelve, e.g. 'age,income;race,income;sex,income' (smaller models).
        #[arg(long)]
        queries: Option<String>,
        /// Print log p along the normalised directions against the Laplace
        /// approximation (first repeat of each ε): the geometry NUTS sees.
        #[arg(long)]
        probe: bool,
        /// NUTS warm-up per chain.
        #[arg(long, default_value_t = 800)]
        warmup: u64,
        /// NUTS draws per chain.
        #[arg(long, default_value_t = 2000)]
        draws: u64,
        /// Most NUTS draws per chain when R̂ of μ is over 1.05 (the chains go on until their
        /// draws double, up to this; default 4 × --draws, as `dpflow synth`).
        #[arg(long)]
        max_draws: Option<u64>,
        /// NUTS mass matrix from the warm-up draws only (Stan's, NumPyro's) instead of nuts-rs's
        /// draws-and-gradients estimate.
        #[arg(long)]
        mass_from_draws: bool,
        /// Mode-search iterations (Fisher scoring; L-BFGS per start when it falls back; 003 App. D: 6000).
        #[arg(long, default_value_t = 6000)]
        max_iters: u64,
        /// Seed (simulation only).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Leave out a set's coefficient whose standard error exceeds this (003 §5.2; 0 keeps all).
        #[arg(long, default_value_t = 10.0)]
        max_std_error: f64,
        /// Queries added to the twelve, e.g. 'sex,income;race,income'.
        #[arg(long, default_value = "")]
        add_queries: String,
    },
    /// Donor search + L1(D) timing on a bench-data file (imputes `income`).
    KnnSpeed {
        /// bench-data Parquet.
        #[arg(long)]
        input: String,
        /// Its domain file.
        #[arg(long)]
        domain: String,
    },
    /// Estimate a model from a measurements JSON and report objective and time.
    Pgm {
        /// Measurements JSON (from `bench pgm-measurements`).
        #[arg(long)]
        measurements: String,
        /// Mirror-descent iterations.
        #[arg(long, default_value_t = 1000)]
        iters: usize,
        /// Optimise with 1/σ² weights (mbi 2.0.0's loss) instead of 1/σ.
        #[arg(long)]
        inverse_variance: bool,
    },
    /// A plain (non-DP) SQL query in DataFusion over one Parquet file registered as table `t`:
    /// the baseline of the DP SQL overhead benchmark (`benches/sql_overhead.sh`). Prints timing only.
    PlainSql {
        /// Parquet file (local path).
        #[arg(long)]
        input: String,
        /// The query.
        #[arg(long)]
        query: String,
    },
    /// All k-way marginals of a dataset (exact counts; the result is discarded).
    Marginals {
        /// Input (Parquet or CSV).
        #[arg(long)]
        input: String,
        /// Domain file.
        #[arg(long)]
        domain: String,
        /// Marginal order k.
        #[arg(long, default_value_t = 2)]
        k: usize,
        /// Engine.
        #[arg(long, value_enum, default_value = "exec")]
        engine: MarginalEngine,
        /// Count on a cluster (`df://HOST:PORT` or `standalone`; needs `--features dpflow/cluster`).
        #[arg(long)]
        cluster: Option<String>,
        /// Partitions of the plan sent to the cluster.
        #[arg(long, requires = "cluster")]
        cluster_partitions: Option<usize>,
    },
}

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = runtime.block_on(run(cli.command)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::BenchData { rows, out, seed, domain_out, batch_rows, columns } => {
            let t = Instant::now();
            let model = bench_data::BenchModel::with_columns(seed, columns.into());
            let n = bench_data::write_model_data(model, rows, &out, domain_out.as_deref(), batch_rows).await?;
            eprintln!("wrote {n} rows to {out} in {:.1}s", t.elapsed().as_secs_f64());
        }
        BenchCommand::PgmMeasurements { input, domain, out, sigma, seed } => {
            pgm::write_measurements(&input, &domain, &out, sigma, seed).await?;
        }
        BenchCommand::KnnExperiment { data, domain, runs, epsilon, threshold, seed, csv } => {
            let r = knn_experiment::run(&data, &domain, runs, epsilon, seed, threshold).await?;
            if let Some(path) = csv {
                let mut s = String::from("run,query,estimator,estimate,truth\n");
                for (run, q, e, v, t) in &r.estimates {
                    s += &format!("{run},{q},{},{v},{t}\n", serde_json::to_value(e)?.as_str().unwrap_or_default());
                }
                std::fs::write(&path, s)?;
            }
            let mut summary = serde_json::to_value(&r)?;
            summary.as_object_mut().expect("object").remove("estimates");
            println!("{}", serde_json::to_string_pretty(&summary)?);
        }
        BenchCommand::DipsCase { input, repeats, epsilon, seed } => {
            println!("{}", serde_json::to_string_pretty(&dips_case::run(&input, repeats, epsilon, seed)?)?);
        }
        BenchCommand::DipsStudy { study, repeats, step, seed, out } => {
            let (rows, seconds) = dips_study::run(study, repeats, step, seed)?;
            let mut csv = String::from("study,n,param,log_epsilon,method,estimand,bias,rmse,coverage,width,repeats\n");
            for r in &rows {
                csv.push_str(&format!(
                    "{},{},{},{},{},{},{:.6},{:.6},{:.4},{:.6},{}\n",
                    r.study,
                    r.n,
                    r.param,
                    r.log_epsilon,
                    r.method,
                    r.estimand,
                    r.bias,
                    r.rmse,
                    r.coverage,
                    r.width,
                    r.repeats
                ));
            }
            std::fs::write(&out, csv)?;
            println!(
                "{}",
                json!({ "study": study, "repeats": repeats, "rows": rows.len(), "seconds": seconds, "out": out })
            );
        }
        BenchCommand::NapsuToy { epsilon, repeats, n, m, seed, baselines } => {
            let mechanisms = baselines
                .iter()
                .map(|b| match b.as_str() {
                    "aim" => Ok(dpflow::synth::run::Mechanism::Aim),
                    "mst" => Ok(dpflow::synth::run::Mechanism::Mst),
                    other => Err(anyhow::anyhow!("--baselines: {other:?} is not aim or mst")),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let r =
                if m > 0 || mechanisms.is_empty() { napsu_toy::run(&epsilon, repeats, n, m, seed)? } else { vec![] };
            let b = napsu_toy::synth_baselines(&mechanisms, &epsilon, repeats, n, seed).await?;
            println!("{}", serde_json::to_string_pretty(&json!({ "n": n, "m": m, "results": r, "baselines": b }))?);
        }
        BenchCommand::NapsuAdult {
            input,
            epsilon,
            repeats,
            m,
            nuts,
            nuts_exact,
            warmup,
            draws,
            max_draws,
            mass_from_draws,
            max_iters,
            seed,
            max_std_error,
            add_queries,
            queries,
            probe,
        } => {
            let mass = if mass_from_draws {
                dpflow::synth::napsu::nuts::MassAdaptation::Draws
            } else {
                dpflow::synth::napsu::nuts::MassAdaptation::DrawsAndGradients
            };
            let nuts = nuts.then_some(dpflow::synth::napsu::nuts::NutsOptions {
                warmup,
                draws,
                max_draws,
                mass,
                ..Default::default()
            });
            // 'a,b;c,d' → [[a, b], [c, d]].
            let parse = |qs: &str| -> Vec<Vec<String>> {
                qs.split(';')
                    .filter(|q| !q.trim().is_empty())
                    .map(|q| q.split(',').map(|c| c.trim().to_string()).collect())
                    .collect()
            };
            let extra_queries = parse(&add_queries);
            let queries = queries.as_deref().map(parse);
            let settings = napsu_adult::Settings {
                repeats,
                m,
                nuts,
                exact: nuts_exact,
                max_iters,
                seed,
                max_std_error: (max_std_error > 0.0).then_some(max_std_error),
                extra_queries,
                queries,
                probe,
            };
            let r = napsu_adult::run(&input, &epsilon, &settings, &|m| eprintln!("{m}"))?;
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
        BenchCommand::PlainSql { input, query } => {
            let ctx = session_context();
            let start = Instant::now();
            ctx.register_parquet("t", &input, datafusion::prelude::ParquetReadOptions::default()).await?;
            let batches = ctx.sql(&query).await?.collect().await?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let report = json!({ "seconds": start.elapsed().as_secs_f64(), "result_rows": rows });
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        BenchCommand::KnnSpeed { input, domain } => {
            let report = knn_experiment::speed(&input, &domain).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        BenchCommand::Pgm { measurements, iters, inverse_variance } => {
            let w = if inverse_variance {
                dpflow::pgm::Weighting::InverseVariance
            } else {
                dpflow::pgm::Weighting::InverseSigma
            };
            let report = pgm::run_estimation(&measurements, iters, w)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        BenchCommand::Marginals { input, domain, k, engine, cluster, cluster_partitions } => {
            let ds = Dataset::open("bench", &input, None, &domain)?;
            let names: Vec<String> = ds.domain().names().iter().map(|s| s.to_string()).collect();
            let sets: Vec<Vec<usize>> = (0..names.len()).combinations(k).collect();
            let ctx = match &cluster {
                Some(c) => {
                    let target = dpflow::io::ClusterSpec::parse(c, cluster_partitions)?.connect().await?;
                    dpflow::io::session_context_on(Some(&target))
                }
                None => session_context(),
            };
            let start = Instant::now();
            let (mut fingerprint, mut cells) = (None::<String>, 0usize);
            let rows: u64 = match engine {
                MarginalEngine::Exec => {
                    let q: Vec<(Vec<String>, _)> = sets
                        .iter()
                        .map(|s| {
                            (s.iter().map(|&i| names[i].clone()).collect(), dpflow_udfs::marginal::NullMode::Cells)
                        })
                        .collect();
                    let m = dpflow::eval::inspect::exact_marginal_counts(&ds, &ctx, &q).await?;
                    // A fingerprint of every count (FNV-1a over the cells in order), to
                    // compare runs (in-process, on a cluster) without printing counts; and
                    // the cells, which each scan task sends to the merge as u64 counts.
                    let mut fnv = 0xcbf2_9ce4_8422_2325u64;
                    for c in m.iter().flatten() {
                        for b in c.to_le_bytes() {
                            fnv = (fnv ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                        }
                    }
                    fingerprint = Some(format!("{fnv:016x}"));
                    cells = m.iter().map(Vec::len).sum();
                    m[0].iter().sum()
                }
                MarginalEngine::GroupBy | MarginalEngine::GroupingSets => {
                    ctx.register_table("t", ds.raw(&ctx).await?.into_view())?;
                    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
                    let queries: Vec<String> = if engine == MarginalEngine::GroupBy {
                        sets.iter()
                            .map(|s| {
                                let cols: Vec<&str> = s.iter().map(|&i| quoted[i].as_str()).collect();
                                format!("SELECT {c}, count(*) AS n FROM t GROUP BY {c}", c = cols.join(", "))
                            })
                            .collect()
                    } else {
                        let used: Vec<usize> = (0..names.len()).collect();
                        let gs: Vec<String> = sets
                            .iter()
                            .map(|s| {
                                format!("({})", s.iter().map(|&i| quoted[i].as_str()).collect::<Vec<_>>().join(", "))
                            })
                            .collect();
                        vec![format!(
                            "SELECT {}, count(*) AS n FROM t GROUP BY GROUPING SETS ({})",
                            used.iter().map(|&i| quoted[i].as_str()).collect::<Vec<_>>().join(", "),
                            gs.join(", ")
                        )]
                    };
                    let mut first_total = 0u64;
                    for (qi, q) in queries.iter().enumerate() {
                        let mut s = ctx.sql(q).await?.execute_stream().await?;
                        let mut total = 0u64;
                        while let Some(b) = s.next().await {
                            let b = b?;
                            let n = b.column(b.num_columns() - 1);
                            let n =
                                datafusion::arrow::compute::cast(n, &datafusion::arrow::datatypes::DataType::Int64)?;
                            let n = n.as_any().downcast_ref::<datafusion::arrow::array::Int64Array>().expect("int64");
                            total += n.values().iter().map(|&v| v as u64).sum::<u64>();
                        }
                        if qi == 0 {
                            first_total = total;
                        }
                    }
                    if engine == MarginalEngine::GroupingSets { first_total / sets.len() as u64 } else { first_total }
                }
            };
            let secs = start.elapsed().as_secs_f64();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "engine": format!("{engine:?}"),
                    "cluster": cluster,
                    "counts_fingerprint": fingerprint,
                    "cells": cells,
                    "input": input,
                    "rows": rows,
                    "marginals": sets.len(),
                    "k": k,
                    "seconds": secs,
                    "rows_per_second": rows as f64 / secs,
                    "rows_per_second_per_core": rows as f64 / secs / cores as f64,
                    "cores": cores,
                    "peak_rss_mb": peak_rss_mb(),
                }))?
            );
        }
    }
    Ok(())
}
