//! DP SQL acceptance tests (issue #7).

use std::path::Path;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use dpflow::sql::{Catalog, SqlEngine};
use dpflow::udfs::noise::testing::chi_square_test_integer;

/// Writes a small world: a keyed table, a table with a person column, a public table.
fn world(dir: &Path, ledger_budget: Option<&str>) -> std::path::PathBuf {
    // keyed: k in 0..2000 with count (k % 7) + 1 rows each, x in [0, 100].
    let mut s = String::from("k,x\n");
    for k in 0..2000 {
        for j in 0..(k % 7) + 1 {
            s += &format!("{k},{}\n", (k * 13 + j * 7) % 101);
        }
    }
    std::fs::write(dir.join("keyed.csv"), s).unwrap();
    std::fs::write(
        dir.join("keyed.yaml"),
        "columns:\n  - {name: k, kind: integer, bounds: [0, 1999]}\n  - {name: x, kind: float, bounds: [0, 100], bins: {count: 10}, out_of_domain: clip}\n",
    )
    .unwrap();
    // people: unit 'heavy' has 1000 rows with value 1e6; 50 light units with 1 row of value 1.
    let mut s = String::from("pid,g,v\n");
    for _ in 0..1000 {
        s += "heavy,a,1000000\n";
    }
    for i in 0..50 {
        s += &format!("u{i},{},1\n", if i % 2 == 0 { "a" } else { "b" });
    }
    // 'lonely' is the only contributor of group c (not in a public domain for tag).
    s += "lonely,c,1\n";
    std::fs::write(dir.join("people.csv"), s).unwrap();
    std::fs::write(
        dir.join("people.yaml"),
        "columns:\n  - {name: g, kind: categorical, values: [a, b, c, d], nullable: true}\n  - {name: v, kind: float, bounds: [0, 10000000], bins: {count: 4}}\n",
    )
    .unwrap();
    std::fs::write(dir.join("regions.csv"), "g,region\na,north\nb,south\nc,east\nd,west\n").unwrap();
    std::fs::write(
        dir.join("regions.yaml"),
        "columns:\n  - {name: g, kind: categorical, values: [a, b, c, d]}\n  - {name: region, kind: categorical, values: [north, south, east, west]}\n",
    )
    .unwrap();
    let ledger = match ledger_budget {
        Some(b) => format!("ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  keyed: {b}\n  people: {b}\n"),
        None => String::new(),
    };
    let cat = format!(
        "{ledger}query_budget: {{epsilon: 1.0}}\ntables:\n  keyed: {{location: keyed.csv, domain: keyed.yaml}}\n  people:\n    location: people.csv\n    domain: people.yaml\n    privacy_unit: {{column: pid}}\n    max_rows_per_unit: 1\n    max_groups_per_unit: 1\n  regions: {{location: regions.csv, domain: regions.yaml, public: true}}\n"
    );
    let p = dir.join("catalog.yaml");
    std::fs::write(&p, cat).unwrap();
    p
}

async fn engine(dir: &Path, seed: u64) -> SqlEngine {
    let cat = Catalog::load(world(dir, None)).unwrap();
    SqlEngine::open(cat, Some(seed)).await.unwrap()
}

fn column_f64(b: &[RecordBatch], name: &str) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for batch in b {
        let i = batch.schema().index_of(name).unwrap();
        let a = cast(batch.column(i), &DataType::Float64).unwrap();
        let a = a.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        out.extend((0..a.len()).map(|r| a.is_valid(r).then(|| a.value(r))));
    }
    out
}

fn column_str(b: &[RecordBatch], name: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for batch in b {
        let i = batch.schema().index_of(name).unwrap();
        let a = cast(batch.column(i), &DataType::Utf8).unwrap();
        let a = a.as_string::<i32>();
        out.extend((0..a.len()).map(|r| a.is_valid(r).then(|| a.value(r).to_string())));
    }
    out
}

#[tokio::test]
async fn count_noise_matches_its_stated_scale_and_every_domain_key_is_returned() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(dir.path(), 7).await;
    let r = e.query("SELECT k, dp_count(*, epsilon => 0.5) AS n FROM keyed GROUP BY k ORDER BY k", None).await.unwrap();
    let ks = column_f64(&r.batches, "k");
    assert_eq!(ks.len(), 2000, "every key of the public domain gets a row");
    let ns = column_f64(&r.batches, "n");
    let resid: Vec<i64> = ks.iter().zip(&ns).map(|(k, n)| n.unwrap() as i64 - ((k.unwrap() as i64) % 7 + 1)).collect();
    // Discrete Laplace with scale 1/ε = 2.
    let r_ = (-0.5f64).exp();
    chi_square_test_integer(&resid, |y| (1.0 - r_) / (1.0 + r_) * r_.powi(y.unsigned_abs() as i32), 1e-4);
    assert_eq!(r.mechanisms.len(), 1);
    assert_eq!(
        r.mechanisms[0].noise,
        Some(dpflow::udfs::noise::NoiseDistribution::Laplace { scale: 2.0f64.next_up() })
    );
}

#[tokio::test]
async fn gaussian_sum_noise_has_the_stated_spread() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(dir.path(), 8).await;
    let r =
        e.query("SELECT k, dp_sum(x, 0, 100, rho => 0.5) AS s FROM keyed GROUP BY k ORDER BY k", None).await.unwrap();
    let sigma = match r.mechanisms[0].noise.unwrap() {
        dpflow::udfs::noise::NoiseDistribution::Gaussian { sigma } => sigma,
        other => panic!("{other:?}"),
    };
    // Exact sums from the file.
    let text = std::fs::read_to_string(dir.path().join("keyed.csv")).unwrap();
    let mut exact = vec![0.0; 2000];
    for l in text.lines().skip(1) {
        let (k, x) = l.split_once(',').unwrap();
        exact[k.parse::<usize>().unwrap()] += x.parse::<f64>().unwrap();
    }
    let s = column_f64(&r.batches, "s");
    let var: f64 = s.iter().zip(&exact).map(|(a, b)| (a.unwrap() - b).powi(2)).sum::<f64>() / 2000.0;
    // σ = 100/√(2·0.5) (+ grid rounding): the sample variance is within 10% (2000 draws: sd ≈ 3%).
    assert!((var / (sigma * sigma) - 1.0).abs() < 0.1, "variance {var} vs σ² {}", sigma * sigma);
    assert!((sigma / 100.0 - 1.0).abs() < 1e-3, "σ {sigma}");
}

#[tokio::test]
async fn clamping_and_per_unit_bounds_are_applied() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(dir.path(), 9).await;
    // Huge ε: the noise is negligible, so the answer shows the bounded statistic.
    let r = e
        .query("SELECT dp_count(*, epsilon => 1000) AS n, dp_sum(v, 0, 10, epsilon => 1000) AS s FROM people", None)
        .await
        .unwrap();
    let n = column_f64(&r.batches, "n")[0].unwrap();
    let s = column_f64(&r.batches, "s")[0].unwrap();
    // 52 units, one row each (the heavy unit's 1000 rows count once), values clamped to 10.
    assert!((n - 52.0).abs() <= 2.0, "count {n}");
    assert!((s - (10.0 + 51.0)).abs() <= 2.0, "sum {s}");
}

#[tokio::test]
async fn partition_selection_never_releases_a_single_contributor_key() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 0..30 {
        let mut e = engine(dir.path(), seed).await;
        let r = e
            .query(
                "SELECT upper(g) AS gg, dp_count(*) AS n FROM people GROUP BY upper(g)",
                Some(dpflow::privacy::Budget::Approx { epsilon: 4.0, delta: 1e-9 }),
            )
            .await
            .unwrap();
        // Selection gets ε = 2, δ = 5e-10: scale b = 0.5, threshold τ = 1 + b·ln(1/(2δ)) ≈ 11.4. Key C (1 unit)
        // passes with probability ≈ ½e^{-20.7}, key A (26 units) fails with ≈ ½e^{-29}: over 30 seeds
        // neither happens (with ε = 2 the A-failure chance was ≈ 19% per 30 seeds, and CI hit it).
        let keys = column_str(&r.batches, "gg");
        assert!(!keys.contains(&Some("C".to_string())), "seed {seed}: a key with one contributor was released");
        assert!(keys.contains(&Some("A".to_string())), "seed {seed}: a key with 26 contributors should be released");
        assert!(r.mechanisms.iter().any(|m| m.mechanism == "laplace_partition_selection"));
    }
}

#[tokio::test]
async fn refusals_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(dir.path(), 1).await;
    use dpflow::sql::RefusalKind as K;
    // Each refusal has a stable kind (matched here) and a message naming the problem.
    let cases: Vec<(&str, K, &str)> = vec![
        ("SELECT * FROM keyed", K::ExposesRows, "returns rows of protected table keyed"),
        ("SELECT count(*) FROM keyed", K::NotDpAggregate, "non-DP aggregate"),
        ("SELECT dp_count(*) FROM (SELECT * FROM keyed ORDER BY x LIMIT 10) t", K::ExposesRows, "ORDER BY"),
        ("SELECT dp_count(*) FROM (SELECT * FROM keyed LIMIT 10) t", K::ExposesRows, "LIMIT"),
        ("SELECT dp_count(*) OVER () FROM keyed", K::NotDpAggregate, "window"),
        (
            "SELECT dp_count(*) FROM keyed a JOIN people b ON a.k = b.v",
            K::MultipliesRows,
            "join between protected tables",
        ),
        (
            "WITH c AS (SELECT dp_count(*) AS n FROM keyed) SELECT a.n + b.n FROM c a, c b",
            K::RepeatedAggregation,
            "evaluated twice",
        ),
        ("SELECT DISTINCT g FROM people", K::ExposesRows, "DISTINCT"),
        ("SELECT k FROM keyed UNION SELECT 1", K::ExposesRows, "UNION"),
        ("SELECT region FROM regions WHERE g IN (SELECT g FROM people)", K::Unsupported, "subquery"),
        ("SELECT dp_sum(x, 10, 0) FROM keyed", K::Arguments, "lower bound"),
        ("SELECT dp_sum(x, 0, k) FROM keyed", K::Arguments, "number literal"),
        (
            "SELECT dp_count(*) FROM (SELECT row_number() OVER () AS r FROM keyed) t",
            K::ExposesRows,
            "window function over protected rows",
        ),
        ("SELECT region, dp_count(*) FROM regions GROUP BY region", K::NotDpAggregate, "not a protected table"),
        ("DELETE FROM keyed", K::Unsupported, "only SELECT"),
        ("SELECT x, dp_count(*) FROM keyed GROUP BY x", K::Budget, "partition selection"),
        ("SELECT dp_count(*, epsilon => 0.1), dp_count(x) FROM keyed", K::Budget, "every DP aggregate"),
        ("SELECT region FROM regions", K::NoProtectedTable, "no protected table"),
    ];
    assert!(cases.len() >= 10);
    for (q, kind, want) in cases {
        let err = e.query(q, None).await.err().unwrap_or_else(|| panic!("accepted: {q}"));
        assert_eq!(err.refusal_kind(), Some(kind), "{q}: {err:#}");
        let err = format!("{err:#}");
        assert!(err.contains(want), "{q}\n  error: {err}\n  expected to mention: {want}");
    }
}

#[tokio::test]
async fn public_join_on_unique_keys_is_allowed_and_duplicates_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(dir.path(), 3).await;
    let r = e
        .query(
            "SELECT r.region, dp_count(*) AS n FROM people p JOIN regions r ON p.g = r.g GROUP BY r.region",
            Some(dpflow::privacy::Budget::Pure { epsilon: 4.0 }),
        )
        .await
        .unwrap();
    // The public table's column has a public domain: every region gets a row
    // (west has no people), no partition selection and no δ needed.
    let mut regions: Vec<String> = column_str(&r.batches, "region").into_iter().map(|v| v.unwrap()).collect();
    regions.sort();
    assert_eq!(regions, ["east", "north", "south", "west"]);
    assert!(r.mechanisms.iter().all(|m| m.mechanism != "laplace_partition_selection"));
    // A public table whose key is not unique would duplicate protected rows.
    std::fs::write(dir.path().join("regions.csv"), "g,region\na,north\na,south\nb,east\n").unwrap();
    let mut e = engine_no_rewrite(dir.path(), 3).await;
    let err = e
        .query(
            "SELECT r.region, dp_count(*) AS n FROM people p JOIN regions r ON p.g = r.g GROUP BY r.region",
            Some(dpflow::privacy::Budget::Approx { epsilon: 4.0, delta: 1e-6 }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.refusal_kind(), Some(dpflow::sql::RefusalKind::MultipliesRows), "{err:#}");
    assert!(format!("{err:#}").contains("not unique"), "{err:#}");
}

/// An engine over the world already written in `dir` (files as they are now).
async fn engine_no_rewrite(dir: &Path, seed: u64) -> SqlEngine {
    let cat = Catalog::load(dir.join("catalog.yaml")).unwrap();
    SqlEngine::open(cat, Some(seed)).await.unwrap()
}

#[tokio::test]
async fn budget_exhaustion_refuses_before_touching_data_and_explain_shows_costs() {
    let dir = tempfile::tempdir().unwrap();
    let cat = Catalog::load(world(dir.path(), Some("{epsilon: 1.0}"))).unwrap();
    let mut e = SqlEngine::open(cat, None).await.unwrap();
    let ex = e.query("EXPLAIN SELECT k, dp_count(*), dp_avg(x, 0, 100) FROM keyed GROUP BY k", None).await.unwrap();
    let rows = ex.explain.unwrap();
    assert_eq!(rows.len(), 3, "count + the avg's count and sum");
    assert!(rows.iter().all(|r| r.noise_scale.is_some() && r.sensitivity.is_some()));
    assert!(ex.charge_id.is_none(), "EXPLAIN spends nothing");
    e.query("SELECT dp_count(*, epsilon => 0.6) FROM keyed", None).await.unwrap();
    let err = format!("{:#}", e.query("SELECT dp_count(*, epsilon => 0.6) FROM keyed", None).await.unwrap_err());
    assert!(err.contains("budget exceeded"), "{err}");
    // A query that fits still runs; each query is charged once.
    let r = e.query("SELECT dp_count(*, epsilon => 0.3) FROM keyed", None).await.unwrap();
    assert!(r.charge_id.is_some());
    let ledger = dpflow::privacy::Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    let s = ledger.status("keyed").unwrap();
    assert!((s.spent - 0.9).abs() < 1e-9, "spent {}", s.spent);
    assert_eq!(s.open_reservations, 0);
}

#[tokio::test]
async fn results_are_noisy_each_time_and_never_exact_from_statistics() {
    // Same query twice: two charges, two independent noise draws.
    let dir = tempfile::tempdir().unwrap();
    let cat = Catalog::load(world(dir.path(), Some("{epsilon: 10.0}"))).unwrap();
    let mut e = SqlEngine::open(cat, None).await.unwrap();
    let mut values = Vec::new();
    for _ in 0..6 {
        let r = e.query("SELECT dp_count(*, epsilon => 0.1) AS n FROM keyed", None).await.unwrap();
        values.push(column_f64(&r.batches, "n")[0].unwrap());
    }
    let exact = (0..2000).map(|k| (k % 7) + 1).sum::<i64>() as f64;
    assert!(values.iter().any(|v| *v != exact), "answers must carry noise: {values:?}");
    values.dedup();
    assert!(values.len() > 1, "independent draws per query");
    let ledger = dpflow::privacy::Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    assert_eq!(ledger.history(Some("keyed")).unwrap().len(), 6);
}

#[tokio::test]
async fn nulls_are_their_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(dir.path(), 4).await;
    let r = e.query("SELECT g, dp_count(*) AS n FROM people GROUP BY g", None).await.unwrap();
    let keys = column_str(&r.batches, "g");
    assert_eq!(keys.len(), 5, "a, b, c, d and NULL: {keys:?}");
    assert!(keys.contains(&None));
}

#[tokio::test]
async fn integer_sums_are_exact_and_match_the_row_by_row_path() {
    // Integer arguments are summed as integers and converted to grid units
    // afterwards; the same statistics over a float cast take the clamp/round
    // path. Same seed, same noise: the releases must be identical.
    let dir = tempfile::tempdir().unwrap();
    let q = |arg: &str| {
        format!(
            "SELECT dp_sum({arg}, 0, 1000, epsilon => 1) AS s, dp_avg({arg}, 0, 1999, epsilon => 1) AS a, \
             dp_avg({arg}, -7, 500, epsilon => 1) AS b, dp_var({arg}, 0, 1999, epsilon => 1) AS v, \
             dp_var({arg}, 3, 1000, epsilon => 1) AS w FROM keyed"
        )
    };
    let mut e = engine(dir.path(), 21).await;
    let int = e.query(&q("k"), None).await.unwrap();
    let mut e = engine(dir.path(), 21).await;
    let float = e.query(&q("CAST(k AS DOUBLE)"), None).await.unwrap();
    for c in ["s", "a", "b", "v", "w"] {
        assert_eq!(column_f64(&int.batches, c), column_f64(&float.batches, c), "{c}");
    }
    // And the released sum is near the exact clamped sum (Laplace scale 1000/ε).
    let exact: f64 = (0..2000).map(|k: i64| (k.min(1000) * ((k % 7) + 1)) as f64).sum();
    let s = column_f64(&int.batches, "s")[0].unwrap();
    assert!((s - exact).abs() < 20_000.0, "{s} vs {exact}");
}

/// Continuous-enough Laplace draws at scale `b` from the exact sampler (grid b·2⁻²⁰).
fn laplace(b: f64, rng: &mut dpflow::udfs::noise::DpRng) -> f64 {
    let g = b * 2f64.powi(-20);
    dpflow::udfs::noise::NoiseDistribution::Laplace { scale: b / g }.sample_integer(rng) as f64 * g
}

fn scale_of(r: &dpflow::sql::QueryResult, what: &str) -> f64 {
    let m = r.mechanisms.iter().find(|m| m.target.contains(what)).unwrap_or_else(|| panic!("no {what}"));
    match m.noise.unwrap() {
        dpflow::udfs::noise::NoiseDistribution::Laplace { scale } => scale,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn avg_var_and_quantile_noise_match_their_stated_scales() {
    // 2000 keys × 100 rows, x alternating 25 and 75: mean 50 (the midpoint of
    // [0, 100]), population variance 625, median between 25 and 75.
    let dir = tempfile::tempdir().unwrap();
    let mut s = String::from("k,x\n");
    for k in 0..2000 {
        for j in 0..100 {
            s += &format!("{k},{}\n", if j % 2 == 0 { 25 } else { 75 });
        }
    }
    std::fs::write(dir.path().join("flat.csv"), s).unwrap();
    std::fs::write(
        dir.path().join("flat.yaml"),
        "columns:\n  - {name: k, kind: integer, bounds: [0, 1999]}\n  - {name: x, kind: float, bounds: [0, 100], bins: {count: 10}}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("catalog.yaml"), "tables:\n  flat: {location: flat.csv, domain: flat.yaml}\n")
        .unwrap();
    let mut e = SqlEngine::open(Catalog::load(dir.path().join("catalog.yaml")).unwrap(), Some(17)).await.unwrap();
    let mut sim = dpflow::udfs::noise::DpRng::unsafe_seeded(99);
    let c = 100.0;
    // The released value's distribution, simulated from the stated scales,
    // against the engine's 2000 releases: KS for the shape, and the mean
    // absolute deviation from the truth within 10% for the scale (its
    // relative standard error is ≈ 1/√2000 = 2.2% for Laplace-like noise).
    let check = |mut got: Vec<f64>, truth: f64, simulate: &mut dyn FnMut() -> f64| {
        let mut reference: Vec<f64> = (0..40_000).map(|_| simulate()).collect();
        let mad = |v: &[f64]| v.iter().map(|x| (x - truth).abs()).sum::<f64>() / v.len() as f64;
        let ratio = mad(&got) / mad(&reference);
        assert!((ratio - 1.0).abs() < 0.1, "spread {ratio} of the stated one");
        reference.sort_by(f64::total_cmp);
        let cdf = |x: f64| reference.partition_point(|&r| r <= x) as f64 / reference.len() as f64;
        dpflow::udfs::noise::testing::ks_test(&mut got, cdf, 1e-4);
    };

    let r = e.query("SELECT k, dp_avg(x, 0, 100, epsilon => 1) AS a FROM flat GROUP BY k", None).await.unwrap();
    let (bc, bs) = (scale_of(&r, "count of non-null"), scale_of(&r, "sum of clamped values"));
    let got: Vec<f64> = column_f64(&r.batches, "a").into_iter().map(|v| v.unwrap()).collect();
    check(got, 50.0, &mut || (laplace(bs, &mut sim) / (c + laplace(bc, &mut sim)) + 50.0).clamp(0.0, 100.0));

    let r = e.query("SELECT k, dp_var(x, 0, 100, epsilon => 1) AS v FROM flat GROUP BY k", None).await.unwrap();
    let (bc, b1, b2) =
        (scale_of(&r, "count of non-null"), scale_of(&r, "sum of clamped values"), scale_of(&r, "sum of squares"));
    let got: Vec<f64> = column_f64(&r.batches, "v").into_iter().map(|v| v.unwrap()).collect();
    check(got, 625.0, &mut || {
        let n = c + laplace(bc, &mut sim);
        let (s1, s2) = (laplace(b1, &mut sim), 625.0 * c + laplace(b2, &mut sim));
        (s2 / n - (s1 / n).powi(2)).clamp(0.0, 2500.0)
    });

    // Exponential mechanism over 1024 bins of [0, 100]: scores −|cum − 50| are
    // −50 below 25, 0 on [25, 75), −50 from 75; P ∝ exp(ε·score/2).
    let r = e
        .query("SELECT k, dp_quantile(x, 0.5, 0, 100, epsilon => 0.05) AS q FROM flat GROUP BY k", None)
        .await
        .unwrap();
    let q = column_f64(&r.batches, "q");
    let mut observed = [0.0; 3];
    for v in q {
        let v = v.unwrap();
        observed[if v < 25.0 {
            0
        } else if v < 75.0 {
            1
        } else {
            2
        }] += 1.0;
    }
    let w = 256.0 * (-0.05 * 50.0 / 2.0f64).exp();
    let z = 2.0 * w + 512.0;
    dpflow::udfs::noise::testing::chi_square_test_counts(&observed, &[w / z, 512.0 / z, w / z], 1e-4);
}

/// Issue 20, item 2: `dp_ci_low`/`dp_ci_high` of a quantile are selections
/// of their own (`sql::quantile_interval`), each charged a third of the
/// call's ε; the interval holds the exact sample quantile x₍⌈qn⌉₎ of every
/// group (the bound is proved and brute-forced there; here: on real plans)
/// and is informative (a few values wide on 2000 rows, not [lo, hi]).
#[tokio::test]
async fn quantile_intervals_are_charged_and_cover_the_exact_quantile() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = String::from("k,x\n");
    let mut truth = Vec::new();
    for k in 0..40u64 {
        let mut xs: Vec<f64> = (0..2000u64).map(|j| ((k * 7 + j * 37) % 101) as f64).collect();
        for x in &xs {
            s += &format!("{k},{x}\n");
        }
        xs.sort_by(f64::total_cmp);
        for q in [0.5, 0.9] {
            let rank = (q * 2000.0f64).ceil().max(1.0) as usize;
            truth.push((k, q, xs[rank - 1]));
        }
    }
    std::fs::write(dir.path().join("u.csv"), s).unwrap();
    std::fs::write(
        dir.path().join("u.yaml"),
        "columns:\n  - {name: k, kind: integer, bounds: [0, 39]}\n  - {name: x, kind: float, bounds: [0, 100], bins: {count: 10}}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("catalog.yaml"), "tables:\n  u: {location: u.csv, domain: u.yaml}\n").unwrap();
    let cat = || Catalog::load(dir.path().join("catalog.yaml")).unwrap();
    let (mut covered, mut total, mut widest) = (0, 0, 0.0f64);
    for q in [0.5, 0.9] {
        let call = format!("dp_quantile(x, {q}, 0, 100, epsilon => 1.5)");
        let sql = format!(
            "SELECT k, {call} AS m, dp_ci_low({call}) AS lo, dp_ci_high({call}) AS hi FROM u GROUP BY k ORDER BY k"
        );
        let mut e = SqlEngine::open(cat(), Some(5)).await.unwrap();
        // Three selections (point, low end, high end), ε = 0.5 each.
        let recs = e.cost(&sql, None).await.unwrap();
        assert_eq!(recs.len(), 3, "{recs:?}");
        for r in &recs {
            assert_eq!(r.loss, dpflow::privacy::PrivacyLoss::Pure { epsilon: 0.5 });
        }
        assert!(recs[1].target.contains("interval low end (0.95)") && recs[2].target.contains("interval high end"));
        let r = e.query(&sql, None).await.unwrap();
        let (m, lo, hi) = (column_f64(&r.batches, "m"), column_f64(&r.batches, "lo"), column_f64(&r.batches, "hi"));
        for (k, ((m, lo), hi)) in m.iter().zip(&lo).zip(&hi).enumerate() {
            let (m, lo, hi) = (m.unwrap(), lo.unwrap(), hi.unwrap());
            let t = truth.iter().find(|x| x.0 == k as u64 && x.1 == q).unwrap().2;
            covered += (lo <= t && t <= hi) as usize;
            total += 1;
            assert!(lo <= m + 0.1 && m <= hi + 0.1, "group {k}: {lo} {m} {hi}");
            widest = widest.max(hi - lo);
        }
    }
    // Each end misses with probability ≤ 2.5%, so ≥ 95% of 80 intervals cover in expectation;
    // the union bound is loose, and all 80 cover at this seed.
    assert_eq!(covered, total, "{covered}/{total}");
    // Ranks qn ± r with r = (2/0.5)·ln(2·1024/0.05) ≈ 42 of 2000 rows: a few values of [0, 100].
    assert!(widest < 8.0, "widest interval {widest}");
    // Bounds that are not dyadic: (hi − lo)/1024 rounds, and the top bin's computed upper edge,
    // lo + 1024·w, fell one ulp below hi = 1 while every value (1.0) sat in it (found in review):
    // the ends are the bounds themselves at the first and last bins, and rounded outward inside.
    let call = "dp_quantile(x, 0.5, -1.0000000000000002, 1, epsilon => 3)";
    let sql = format!("SELECT dp_ci_low({call}) AS lo, dp_ci_high({call}) AS hi FROM u WHERE k = 0 AND x >= 1");
    let mut e = SqlEngine::open(cat(), Some(6)).await.unwrap();
    let r = e.query(&sql, None).await.unwrap();
    let (lo, hi) = (column_f64(&r.batches, "lo")[0].unwrap(), column_f64(&r.batches, "hi")[0].unwrap());
    assert!(lo <= 1.0 && hi >= 1.0, "[{lo}, {hi}] misses 1.0");
}

/// Found by the SQL privacy audit (tests/it/dp_audit_sql.rs): a query whose only
/// DP call is a quantile, without GROUP BY, built an aggregate of nothing,
/// which DataFusion refuses, after the charge: every such query failed (and
/// was charged). It now answers, with exactly one committed charge.
#[tokio::test]
async fn a_lone_quantile_without_group_by_answers_and_is_charged_once() {
    let dir = tempfile::tempdir().unwrap();
    let cat = Catalog::load(world(dir.path(), Some("{epsilon: 10.0}"))).unwrap();
    let mut e = SqlEngine::open(cat, None).await.unwrap();
    let r = e.query("SELECT dp_quantile(x, 0.5, 0, 100, epsilon => 1.0) AS q FROM keyed", None).await.unwrap();
    let q = column_f64(&r.batches, "q");
    assert_eq!(q.len(), 1);
    assert!(q[0].is_some_and(|v| (0.0..=100.0).contains(&v)), "{q:?}");
    let l = dpflow::privacy::Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    let h = l.history(Some("keyed")).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, dpflow::privacy::ChargeStatus::Committed);
}
