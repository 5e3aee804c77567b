//! `dp_imputed_*` in DP SQL (issue #8): statistics on kNN-imputed protected
//! tables compose with the SQL engine, its budget shares and its ledger.

use std::path::Path;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Float64Type;
use dpflow::impute::Estimator;
use dpflow::impute::spec::ImputeSpec;
use dpflow::sql::{Catalog, SqlEngine};
use dpflow::udfs::noise::DpRng;

const MATCH: &str = "[{column: age, kind: ordinal, group: 10}, {column: sex}]";

/// 4,000 people aged 20–59; income is a function of (decade, sex), so every
/// donor of a class carries the same value and the imputed data equals the
/// complete data. Income is missing for every 3rd person in their fifties and
/// every 20th otherwise (missing not at random in age).
fn world(dir: &Path, ledger: bool) -> std::path::PathBuf {
    let mut s = String::from("age,sex,inc\n");
    for i in 0..4000 {
        let age = 20 + (i * 7) % 40;
        let sex = if i % 2 == 0 { "F" } else { "M" };
        let inc = 100 * ((age - 20) / 10) + if sex == "M" { 50 } else { 0 };
        let missing = if age >= 50 { i % 3 == 0 } else { i % 20 == 0 };
        if missing {
            s += &format!("{age},{sex},\n");
        } else {
            s += &format!("{age},{sex},{inc}\n");
        }
    }
    std::fs::write(dir.join("survey.csv"), s).unwrap();
    std::fs::write(
        dir.join("survey.yaml"),
        "columns:\n  - {name: age, kind: integer, bounds: [0, 99]}\n  - {name: sex, kind: categorical, values: [F, M]}\n  - {name: inc, kind: float, bounds: [0, 1000], bins: {count: 10}, nullable: true}\n",
    )
    .unwrap();
    std::fs::write(dir.join("plain.csv"), "age,sex,inc\n30,F,1\n").unwrap();
    let ledger =
        if ledger { "ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  survey: {epsilon: 30.0}\n" } else { "" };
    let cat = format!(
        "{ledger}query_budget: {{epsilon: 6.0}}\ntables:\n  survey:\n    location: survey.csv\n    domain: survey.yaml\n    impute:\n      columns: [inc]\n      match: {MATCH}\n      metric: euclidean\n  plain: {{location: plain.csv, domain: survey.yaml}}\n"
    );
    let p = dir.join("catalog.yaml");
    std::fs::write(&p, cat).unwrap();
    p
}

fn value(b: &[RecordBatch], name: &str) -> Option<f64> {
    let batch = &b[0];
    let a = batch.column(batch.schema().index_of(name).unwrap()).as_primitive::<Float64Type>();
    a.is_valid(0).then(|| a.value(0))
}

#[tokio::test]
async fn imputed_statistics_from_sql_equal_the_impute_command_and_are_charged() {
    // Charged: a session with a ledger (and OS randomness: a seed may not be charged).
    let charged = tempfile::tempdir().unwrap();
    let mut e = SqlEngine::open(Catalog::load(world(charged.path(), true)).unwrap(), None).await.unwrap();
    // Seeded, to compare with the impute command: a session without a ledger.
    let dir = tempfile::tempdir().unwrap();
    let cat = Catalog::load(world(dir.path(), false)).unwrap();
    let mut seeded = SqlEngine::open(cat, Some(11)).await.unwrap();
    // Mean (count + mean) and proportion (count + numerator): 4 numbers at ε = 1.5 each.
    let sql = "SELECT dp_imputed_mean(inc, 0, 1000, epsilon => 3) AS m, \
               dp_imputed_proportion(inc >= 300, epsilon => 3) AS p \
               FROM survey WHERE age BETWEEN 40 AND 59 AND sex = 'M'";
    let ex = e.query(&format!("EXPLAIN {sql}"), None).await.unwrap();
    let rows = ex.explain.unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.iter().all(|r| r.loss.contains("1.5")), "{rows:?}");
    let r = e.query(sql, None).await.unwrap();
    assert!(r.charge_id.is_some());
    let ledger = dpflow::privacy::Ledger::open(charged.path().join("ledger.sqlite")).unwrap();
    assert!((ledger.status("survey").unwrap().spent - 6.0).abs() < 1e-9);
    let r = seeded.query(sql, None).await.unwrap();
    let (m, p) = (value(&r.batches, "m").unwrap(), value(&r.batches, "p").unwrap());

    // The same statistics through `dpflow impute`'s spec, same seed and ε per number.
    let spec_path = dir.path().join("spec.yaml");
    std::fs::write(
        &spec_path,
        format!(
            "input: survey.csv\ndomain: survey.yaml\nimpute: [inc]\nmatch: {MATCH}\nmetric: euclidean\nbudget: {{epsilon: 1.5}}\nqueries:\n  - {{name: m, mean: {{value: inc, lo: 0, hi: 1000}}, where: {{age: [40, 59], sex: [M]}}}}\n  - {{name: p, proportion: {{numerator: {{inc: [300, null]}}}}, where: {{age: [40, 59], sex: [M]}}}}\n"
        ),
    )
    .unwrap();
    let spec = ImputeSpec::load(spec_path.to_str().unwrap()).unwrap();
    let ctx = dpflow::io::session_context();
    let mut rng = DpRng::unsafe_seeded(11);
    let rep = dpflow::impute::run(&ctx, &spec, Estimator::Smooth, &mut rng).await.unwrap();
    assert_eq!(rep.results[0].value, Some(m));
    assert_eq!(rep.results[1].value, Some(p));
    // Imputation happened: rows with missing income were filled, not dropped.
    assert!(rep.donees > 0);
    assert!((0.0..=1.0).contains(&p));
}

#[tokio::test]
async fn imputed_count_defaults_to_the_query_budget() {
    let dir = tempfile::tempdir().unwrap();
    let cat = Catalog::load(world(dir.path(), false)).unwrap();
    let mut e = SqlEngine::open(cat, Some(3)).await.unwrap();
    let r = e.query("SELECT dp_imputed_count(*), dp_imputed_var(inc, 0, 1000) AS v FROM survey", None).await.unwrap();
    // query_budget ε = 6 split over two calls (3 each); the variance releases 3 numbers (ε = 1 each).
    assert_eq!(r.mechanisms.len(), 4);
    assert!((r.mechanisms[0].loss.describe()).contains('3'), "{:?}", r.mechanisms[0].loss);
    assert!((r.mechanisms[3].loss.describe()).contains('1'), "{:?}", r.mechanisms[3].loss);
    let names: Vec<String> = r.batches[0].schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, vec!["dp_imputed_count(*)".to_string(), "v".to_string()]);
    let v = value(&r.batches, "v").unwrap();
    assert!((0.0..=250_000.0 * 4000.0 / 3999.0).contains(&v), "variance is clamped to its range: {v}");
}

#[tokio::test]
async fn imputed_queries_outside_the_supported_shape_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cat = Catalog::load(world(dir.path(), false)).unwrap();
    let mut e = SqlEngine::open(cat, Some(5)).await.unwrap();
    use dpflow::sql::RefusalKind as K;
    let cases = [
        ("SELECT sex, dp_imputed_count(*) FROM survey GROUP BY sex", K::Unsupported, "GROUP BY"),
        ("SELECT dp_imputed_count(*), dp_count(*) FROM survey", K::Unsupported, "mixed"),
        ("SELECT dp_ci_low(dp_imputed_mean(inc, 0, 1000)) FROM survey", K::Unsupported, "values themselves"),
        ("SELECT dp_imputed_mean(inc, 0, 1000) + 1 FROM survey", K::Unsupported, "values themselves"),
        ("SELECT dp_imputed_count(*) FROM survey WHERE age > 30 OR sex = 'M'", K::Unsupported, "not supported"),
        ("SELECT dp_imputed_count(*) FROM survey WHERE sex = 'X'", K::Unsupported, "not a value"),
        ("SELECT dp_imputed_count(*) FROM plain", K::TablePolicy, "no `impute:` block"),
        ("SELECT dp_imputed_count(*, rho => 0.1) FROM survey", K::Budget, "epsilon"),
        ("SELECT dp_imputed_mean(sex, 0, 1) FROM survey", K::Arguments, "not numeric"),
        ("SELECT dp_imputed_count(inc) FROM survey", K::Arguments, "dp_imputed_count(*)"),
        ("SELECT dp_imputed_count(*) AS n FROM survey ORDER BY n LIMIT 1", K::Unsupported, "ORDER BY"),
        // ε ≤ ln 2 per released number cannot be calibrated (issue 14 §2): 2 numbers at ε = 0.6 each.
        ("SELECT dp_imputed_mean(inc, 0, 1000, epsilon => 1.2) FROM survey", K::Budget, "ε > ln 2"),
    ];
    for (sql, kind, want) in cases {
        let err = e.query(sql, None).await.unwrap_err();
        assert_eq!(err.refusal_kind(), Some(kind), "{sql}: {err:#}");
        let err = format!("{err:#}");
        assert!(err.contains(want), "{sql}: {err}");
    }
}

#[test]
fn an_infinite_match_weight_is_refused() {
    // ∞·0 = NaN distances: the donor search and L1(D) cannot order them (L1 came out 1).
    let dir = tempfile::tempdir().unwrap();
    world(dir.path(), false);
    let p = dir.path().join("inf.yaml");
    std::fs::write(
        &p,
        "input: survey.csv\ndomain: survey.yaml\nimpute: [inc]\nmatch: [{column: sex, weight: .inf}]\nmetric: euclidean\nbudget: {epsilon: 2.0}\nqueries:\n  - {name: n, count: {}}\n",
    )
    .unwrap();
    let err = format!("{:#}", ImputeSpec::load(p.to_str().unwrap()).unwrap_err());
    assert!(err.contains("finite"), "{err}");
}
