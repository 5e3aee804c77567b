//! `dp_marginals(table, 'a,b; c')` and `synthesize(table, mechanism => ...)`
//! in DP SQL (issue 20, item 5): charged at plan time (EXPLAIN shows the
//! mechanisms, the ledger holds one charge per query), noise drawn once per
//! call however often the plan reads it (CTE reuse, UNION of one call), the
//! intervals cover at their stated rate, a failure after the read is charged,
//! and bad calls are refused before anything is charged, saying what to write.

use std::path::{Path, PathBuf};

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use dpflow::privacy::accuracy::integer_abs_quantile;
use dpflow::privacy::ledger::ChargeRow;
use dpflow::privacy::{ChargeStatus, Ledger, PrivacyLoss};
use dpflow::sql::{Assumptions, Catalog, SqlEngine, SqlError};
use dpflow_udfs::noise::NoiseDistribution;

/// 600 rows: sex is F for i % 3 == 0, null for i % 10 == 1, M otherwise;
/// age 20 + i % 40 in four bins of ten years. A second protected table `u`
/// charges another ledger dataset; `p` is public.
fn world(dir: &Path) -> PathBuf {
    let mut csv = String::from("sex,age\n");
    for i in 0..600 {
        let sex = if i % 3 == 0 {
            "F"
        } else if i % 10 == 1 {
            ""
        } else {
            "M"
        };
        csv += &format!("{sex},{}\n", 20 + i % 40);
    }
    std::fs::write(dir.join("t.csv"), &csv).unwrap();
    std::fs::write(dir.join("u.csv"), &csv).unwrap();
    std::fs::write(
        dir.join("t.yaml"),
        "columns:\n  - {name: sex, kind: categorical, values: [F, M], nullable: true}\n  - {name: age, kind: integer, \
         bounds: [20, 59], bins: {count: 4}}\n",
    )
    .unwrap();
    let catalog = dir.join("catalog.yaml");
    std::fs::write(
        &catalog,
        "ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  t: {epsilon: 20.0, delta: 1e-6}\n  u: {epsilon: 20.0, \
         delta: 1e-6}\nquery_budget: {rho: 0.2}\ntables:\n  t: {location: t.csv, domain: t.yaml}\n  u: {location: \
         u.csv, domain: t.yaml}\n  p: {location: t.csv, domain: t.yaml, public: true}\n",
    )
    .unwrap();
    catalog
}

/// The exact counts of the world, by (marginal, value) — by hand from its rule.
fn exact(marginal: &str, value: Option<&str>) -> i64 {
    let rows = 0..600i64;
    match marginal {
        "sex" => rows
            .filter(|i| {
                let s = if i % 3 == 0 {
                    Some("F")
                } else if i % 10 == 1 {
                    None
                } else {
                    Some("M")
                };
                s == value
            })
            .count() as i64,
        "age" => {
            let lo: i64 = value.unwrap().trim_start_matches('[').split(',').next().unwrap().parse().unwrap();
            rows.filter(|i| (20 + i % 40) / 10 * 10 == lo).count() as i64
        }
        _ => unreachable!(),
    }
}

fn unledgered(catalog: &Path) -> Catalog {
    let mut c = Catalog::load(catalog).unwrap();
    (c.ledger, c.create_ledger) = (None, None);
    c
}

/// (marginal, sex, age, count, sigma, ci_low, ci_high) of each row.
type Cell = (String, Option<String>, Option<String>, i64, f64, f64, f64);

fn cells(batches: &[RecordBatch]) -> Vec<Cell> {
    let mut out = Vec::new();
    for b in batches {
        let s = |i: usize| {
            datafusion::arrow::compute::cast(b.column(i), &datafusion::arrow::datatypes::DataType::Utf8)
                .unwrap()
                .as_string::<i32>()
                .clone()
        };
        let f = |i: usize| b.column(i).as_primitive::<Float64Type>().clone();
        let (m, sex, age) = (s(0), s(1), s(2));
        let n = b.column(3).as_primitive::<Int64Type>().clone();
        let (sd, lo, hi) = (f(4), f(5), f(6));
        for r in 0..b.num_rows() {
            let opt = |a: &datafusion::arrow::array::StringArray| a.is_valid(r).then(|| a.value(r).to_string());
            out.push((m.value(r).to_string(), opt(&sex), opt(&age), n.value(r), sd.value(r), lo.value(r), hi.value(r)));
        }
    }
    out
}

fn ints(batches: &[RecordBatch]) -> Vec<i64> {
    batches.iter().flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec()).collect()
}

fn rho_of(l: &PrivacyLoss) -> f64 {
    match l {
        PrivacyLoss::Zcdp { rho } => *rho,
        other => panic!("not zCDP: {other:?}"),
    }
}

fn history(dir: &Path, ds: &str) -> Vec<ChargeRow> {
    Ledger::open(dir.join("ledger.sqlite")).unwrap().history(Some(ds)).unwrap()
}

#[tokio::test]
async fn dp_marginals_are_charged_at_plan_time_and_release_every_cell_with_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    let q = "SELECT * FROM dp_marginals('t', 'sex; age', rho => 0.5)";
    // EXPLAIN: one Gaussian per marginal, ρ/2 each; nothing charged.
    let r = e.query(&format!("EXPLAIN {q}"), None).await.unwrap();
    let ex = r.explain.unwrap();
    assert_eq!(ex.len(), 2, "{ex:?}");
    assert!(ex.iter().all(|x| x.mechanism == "gaussian" && x.sensitivity == Some(1.0)), "{ex:?}");
    assert!(history(dir.path(), "t").is_empty());
    // The release: 3 sex cells (F, M, null) and 4 age bins, one committed charge of ρ = 0.5.
    let r = e.query(q, None).await.unwrap();
    let names: Vec<&str> = r.schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["marginal", "sex", "age", "count", "sigma", "ci_low", "ci_high"]);
    let got = cells(&r.batches);
    assert_eq!(got.len(), 7);
    let sexes: Vec<_> = got.iter().filter(|c| c.0 == "sex").map(|c| (c.1.clone(), c.2.clone())).collect();
    assert_eq!(sexes, [(Some("F".into()), None), (Some("M".into()), None), (None, None)]);
    let ages: Vec<_> = got.iter().filter(|c| c.0 == "age").map(|c| c.2.clone().unwrap()).collect();
    assert_eq!(ages, ["[20, 29]", "[30, 39]", "[40, 49]", "[50, 59]"]);
    // σ² = k/2ρ = 2; the interval is the discrete Gaussian's exact 95% half-width around the count.
    let sigma = (2.0f64).sqrt() * (1.0 + 1e-9);
    let half = integer_abs_quantile(&NoiseDistribution::Gaussian { sigma }, 0.95);
    for c in &got {
        assert!((c.5 - (c.3 as f64 - half)).abs() < 1e-9 && (c.6 - (c.3 as f64 + half)).abs() < 1e-9, "{c:?}");
        assert!(c.4 > 1.3 && c.4 < 1.42, "{c:?}");
    }
    let h = history(dir.path(), "t");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, ChargeStatus::Committed);
    assert_eq!(h[0].mechanisms.len(), 2);
    let rho: f64 = h[0].mechanisms.iter().map(|m| rho_of(&m.loss)).sum();
    assert!((rho - 0.5).abs() < 1e-6 && rho <= 0.5, "{rho}");
    // The planner's forecast is the released interval.
    let (recs, preds) = e.predict(q, None, &Assumptions::default()).await.unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(preds.len(), 2);
    assert!(preds.iter().all(|p| p.half_width == Some(half)), "{preds:?}");
}

#[tokio::test]
async fn an_observed_only_marginal_leaves_out_the_rows_with_a_null() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    let mut e = SqlEngine::open(unledgered(&catalog), Some(4)).await.unwrap();
    // Both modes of one column are two marginals: ρ/2 each, 2 + 3 cells.
    let q = "SELECT marginal, sex, CAST(NULL AS VARCHAR) AS age, count, sigma, ci_low, ci_high \
             FROM dp_marginals('t', 'sex[observed]; sex', rho => 50)";
    let r = e.query(q, None).await.unwrap();
    let got = cells(&r.batches);
    let observed: Vec<_> = got.iter().filter(|c| c.0 == "sex[observed]").collect();
    assert_eq!(observed.iter().map(|c| c.1.as_deref()).collect::<Vec<_>>(), [Some("F"), Some("M")]);
    assert_eq!(got.iter().filter(|c| c.0 == "sex").count(), 3);
    // σ = 0.1: the counts are the exact ones (F 200, M 360; the 40 nulls left out).
    for c in &observed {
        assert!((c.3 - exact("sex", c.1.as_deref())).abs() <= 1, "{c:?}");
    }
    let nulls = exact("sex", None);
    assert_eq!(nulls, 40);
    assert!(got.iter().any(|c| c.0 == "sex" && c.1.is_none() && (c.3 - nulls).abs() <= 1), "{got:?}");
}

#[tokio::test]
async fn dp_marginal_intervals_cover_the_exact_counts_at_their_stated_rate() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    // 300 seeded releases × 7 cells at σ = 10 (ρ = 0.01 over two marginals).
    let (mut covered, mut total, mut sum_err, mut sum_sq) = (0usize, 0usize, 0.0, 0.0);
    for seed in 0..300u64 {
        let mut e = SqlEngine::open(unledgered(&catalog), Some(seed)).await.unwrap();
        let r = e.query("SELECT * FROM dp_marginals('t', 'sex; age', rho => 0.01)", None).await.unwrap();
        for c in cells(&r.batches) {
            let value = if c.0 == "sex" { c.1.as_deref() } else { c.2.as_deref() };
            let truth = exact(&c.0, value) as f64;
            covered += (c.5 <= truth && truth <= c.6) as usize;
            total += 1;
            let err = c.3 as f64 - truth;
            sum_err += err;
            sum_sq += err * err;
        }
    }
    let coverage = covered as f64 / total as f64;
    // 2100 independent cells: the standard error of the coverage is 0.005; the discrete
    // interval is conservative (≥ 95%), so 0.935..0.975 is ±3 standard errors around ~0.955.
    assert!((0.935..=0.975).contains(&coverage), "coverage {coverage}");
    let (mean, sd) = (sum_err / total as f64, (sum_sq / total as f64).sqrt());
    assert!(mean.abs() < 0.7, "mean error {mean}");
    assert!((sd - 10.0).abs() < 0.5, "error sd {sd}");
}

#[tokio::test]
async fn one_call_is_noised_and_charged_once_however_often_the_plan_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    // σ ≈ 3.2: two draws of the four age cells would differ with near certainty.
    let cte = "WITH m AS (SELECT * FROM dp_marginals('t', 'age', rho => 0.05))";
    let r = e
        .query(&format!("{cte} SELECT a.count - b.count AS d FROM m a JOIN m b ON a.age = b.age"), None)
        .await
        .unwrap();
    assert_eq!(ints(&r.batches), [0, 0, 0, 0]);
    let r = e.query(&format!("{cte} SELECT count FROM m UNION ALL SELECT count FROM m"), None).await.unwrap();
    let v = ints(&r.batches);
    assert_eq!(v.len(), 8);
    let mut halves = (v[..4].to_vec(), v[4..].to_vec());
    halves.0.sort();
    halves.1.sort();
    assert_eq!(halves.0, halves.1);
    // Two queries, two charges of ρ = 0.05 each (one per query, not per reference).
    let h = history(dir.path(), "t");
    assert_eq!(h.len(), 2);
    assert!(h.iter().all(|c| c.mechanisms.len() == 1 && (rho_of(&c.mechanisms[0].loss) - 0.05).abs() < 1e-9));
    // DataFusion alone cannot run a call: the placeholder refuses and reads nothing.
    let err = e
        .context()
        .sql("SELECT * FROM dp_marginals('t', 'sex', named_struct('rho', 1))")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("runs only through dpflow's DP SQL engine"), "{err}");
    assert_eq!(history(dir.path(), "t").len(), 2);
}

#[tokio::test]
async fn synthesize_is_charged_once_and_every_reference_reads_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    let q = "SELECT count(*) FROM synthesize('t', mechanism => 'mst', epsilon => 2, delta => 1e-6, rows => 500)";
    let ex = e.query(&format!("EXPLAIN {q}"), None).await.unwrap().explain.unwrap();
    assert_eq!(ex.len(), 1);
    assert!(history(dir.path(), "t").is_empty());
    assert_eq!(ints(&e.query(q, None).await.unwrap().batches), [500]);
    let h = history(dir.path(), "t");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].mechanisms[0].mechanism, "mst");
    // A CTE read twice: the same synthetic rows (a second draw would move the counts).
    let q = "WITH s AS (SELECT * FROM synthesize('t', mechanism => 'independent', rho => 0.1, rows => 2000)) \
             SELECT (SELECT count(*) FROM s WHERE sex = 'F') - (SELECT count(*) FROM s WHERE sex = 'F') AS d, \
                    (SELECT count(*) FROM s WHERE sex IS NULL) AS nulls, (SELECT count(*) FROM s) AS n";
    let r = e.query(q, None).await.unwrap();
    let b = &r.batches[0];
    let col = |i: usize| b.column(i).as_primitive::<Int64Type>().value(0);
    assert_eq!((col(0), col(2)), (0, 2000));
    // Nulls are modelled as a category: about a fifteenth of the rows (40 of 600 are null).
    assert!((100..=320).contains(&col(1)), "null rows {}", col(1));
    let h = history(dir.path(), "t");
    assert_eq!(h.len(), 2);
    assert!((rho_of(&h[1].mechanisms[0].loss) - 0.1).abs() < 1e-12);
    // The query budget (ρ = 0.2 in the catalog) is split evenly over calls without their own.
    let q = "SELECT (SELECT count(*) FROM synthesize('t', mechanism => 'independent', rows => 10)) + \
             (SELECT sum(count) FROM dp_marginals('t', 'sex')) AS x";
    let ex = e.query(&format!("EXPLAIN {q}"), None).await.unwrap().explain.unwrap();
    assert_eq!(ex.len(), 2);
    let recs = e.cost(q, None).await.unwrap();
    let rhos: Vec<f64> = recs.iter().map(|r| rho_of(&r.loss)).collect();
    assert!(rhos.iter().all(|r| (r - 0.1).abs() < 1e-9), "{rhos:?}");
}

#[tokio::test]
async fn a_failure_after_the_read_is_charged_and_says_nothing_of_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    // The data disappears between planning and reading.
    std::fs::remove_file(dir.path().join("t.csv")).unwrap();
    let err = e.query("SELECT * FROM dp_marginals('t', 'sex', rho => 0.1)", None).await.unwrap_err();
    assert!(matches!(err, SqlError::Failed(_)), "{err}");
    let h = history(dir.path(), "t");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, ChargeStatus::Failed);
}

#[tokio::test]
async fn a_ledger_that_counts_people_by_a_column_is_refused_before_the_charge() {
    let dir = tempfile::tempdir().unwrap();
    world(dir.path());
    // The table reads one row per person, but its ledger dataset counts people by `pid`.
    let l = Ledger::create(dir.path().join("people.sqlite")).unwrap();
    l.add_dataset("clinic", "pid", dpflow::privacy::Budget::Zcdp { rho: 5.0 }).unwrap();
    let catalog = dir.path().join("people.yaml");
    std::fs::write(
        &catalog,
        "ledger: people.sqlite\ntables:\n  visits: {location: t.csv, domain: t.yaml, ledger_dataset: clinic}\n",
    )
    .unwrap();
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    for q in [
        "SELECT * FROM dp_marginals('visits', 'sex', rho => 0.1)",
        "SELECT count(*) FROM synthesize('visits', mechanism => 'independent', rho => 0.1, rows => 5)",
    ] {
        let err = e.query(q, None).await.unwrap_err().to_string();
        assert!(err.contains("counts people by \"pid\""), "{q}: {err}");
    }
    let l = Ledger::open(dir.path().join("people.sqlite")).unwrap();
    assert!(l.history(Some("clinic")).unwrap().is_empty());
}

#[tokio::test]
async fn bad_calls_are_refused_before_anything_is_charged() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    for (q, want) in [
        ("SELECT * FROM dp_marginals('nope', 'sex')", "no table \"nope\""),
        ("SELECT * FROM dp_marginals('p', 'sex')", "p is public"),
        ("SELECT * FROM dp_marginals('t', 'sex, height')", "unknown column \"height\""),
        ("SELECT * FROM dp_marginals('t', 'sex,sex')", "names sex twice"),
        ("SELECT * FROM dp_marginals('t', 'sex; sex')", "given twice"),
        ("SELECT * FROM dp_marginals('t', 'sex;')", "separated by commas"),
        ("SELECT * FROM dp_marginals('t')", "takes 2 positional"),
        ("SELECT * FROM dp_marginals('t', 'sex', rho => 1, epsilon => 1)", "not both rho and epsilon"),
        ("SELECT * FROM dp_marginals('t', 'sex', delta => 1e-6)", "delta only with epsilon"),
        ("SELECT * FROM dp_marginals('t', 'sex', rho => -1)", "rho"),
        ("SELECT * FROM dp_marginals('t', 'sex', confidence => 2)", "confidence"),
        ("SELECT * FROM dp_marginals('t', 'sex', sigma => 2)", "unknown argument \"sigma\""),
        // A vanishing budget would need noise beyond the samplers' range (a review found
        // `rho => 1e-200` telling an empty cell from a full one): refused before the charge.
        ("SELECT * FROM dp_marginals('t', 'sex', rho => 1e-200)", "budget is too small"),
        ("SELECT * FROM dp_marginals('t', 'sex', epsilon => 1e-40)", "budget is too small"),
        ("SELECT dp_count(*, epsilon => 1e-300) AS n FROM t", "budget is too small"),
        ("SELECT dp_count(*, rho => 1e-200) AS n FROM t", "budget is too small"),
        ("SELECT sex, dp_sum(age, 0, 100, epsilon => 1e-30) AS s FROM t GROUP BY sex", "budget is too small"),
        // Found by the review of quantile intervals: each would fail only after the charge.
        (
            "SELECT dp_ci_low(dp_quantile(age, 0.5, 0, 100, epsilon => 2e-307)) AS l FROM t",
            "too small for a quantile interval",
        ),
        ("SELECT dp_quantile(age, 0.5, -1e308, 1e308) AS m FROM t", "too far apart"),
        ("SELECT dp_ci_low(dp_count(*), 1.5) AS l FROM t", "level must be a number between 0 and 1"),
        ("SELECT dp_ci_low(n) AS l FROM (SELECT dp_count(*) AS n FROM t) s", "takes a DP aggregate of the same SELECT"),
        ("(SELECT * INTO x FROM dp_marginals('t', 'sex', rho => 1))", "SELECT ... INTO"),
        ("SELECT * FROM synthesize('t', rho => 1)", "mechanism => is required"),
        ("SELECT * FROM synthesize('t', mechanism => 'aim', rho => 1e-200)", "too small to synthesize"),
        (
            "SELECT * FROM synthesize('t', mechanism => 'aim', rho => 1, missing => 'impute-first:mode-stability')",
            "needs a public bound on the missing cells",
        ),
        ("SELECT * FROM synthesize('t', mechanism => 'gan', rho => 1)", "unknown mechanism"),
        ("SELECT * FROM synthesize('t', mechanism => 'napsu-mq', rho => 1)", "not available from SQL"),
        ("SELECT * FROM synthesize('t', mechanism => 'aim', rho => 1, rows => 0)", "rows => must be a whole number"),
        ("SELECT * FROM synthesize('t', mechanism => 'aim', rho => 1, workload => 'all-9way')", "workload"),
        (
            "SELECT * FROM synthesize('t', mechanism => 'aim', rho => 1) s, dp_marginals('t', 'sex')",
            "every dp_marginals()/synthesize() call",
        ),
        ("SELECT m.count FROM dp_marginals('t', 'sex', rho => 1) m JOIN t ON t.sex = m.sex", "protected table t"),
        ("SELECT dp_count(*) AS n FROM t, dp_marginals('t', 'sex', rho => 1)", "cannot share a query"),
        (
            "SELECT * FROM dp_marginals('t', 'sex', rho => 1) a, dp_marginals('u', 'sex', rho => 1) b",
            "different ledger datasets",
        ),
    ] {
        let err = e.query(q, None).await.unwrap_err().to_string();
        assert!(err.contains(want), "{q}: {err}");
    }
    // A public table next to a call is fine (post-processing).
    let r = e
        .query(
            "SELECT count(*) FROM dp_marginals('t', 'sex', rho => 1) m JOIN (SELECT DISTINCT sex FROM p) q ON m.sex = q.sex",
            None,
        )
        .await
        .unwrap();
    assert_eq!(ints(&r.batches), [2]);
    // Only that last query was charged.
    assert_eq!(history(dir.path(), "t").len(), 1);
    assert!(history(dir.path(), "u").is_empty());
}
