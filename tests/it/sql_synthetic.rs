//! `synthetic(model, rows)` in DP SQL (issue 20, item 5): rows stream from a
//! saved model, the query costs nothing (no ledger charge, EXPLAIN lists no
//! mechanism), every reference to one call sees the same rows (CTE reuse,
//! re-execution of the plan), and bad calls are refused before anything runs
//! with messages that say what to write.

use std::path::{Path, PathBuf};
use std::process::Command;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use dpflow::sql::{Catalog, SqlEngine};

/// A small table, a saved MST model of it, and a catalog with a ledger and
/// the model under the name `m`.
fn world(dir: &Path) -> (PathBuf, PathBuf) {
    let mut csv = String::from("sex,age\n");
    for i in 0..600 {
        csv += &format!("{},{}\n", if i % 3 == 0 { "F" } else { "M" }, 20 + i % 40);
    }
    std::fs::write(dir.join("t.csv"), csv).unwrap();
    std::fs::write(
        dir.join("t.yaml"),
        "columns:\n  - {name: sex, kind: categorical, values: [F, M]}\n  - {name: age, kind: integer, bounds: [20, 60], \
         bins: {count: 4}}\n",
    )
    .unwrap();
    let model = dir.join("model.json");
    let out = Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .args([
            "synth",
            "--input",
            "t.csv",
            "--domain",
            "t.yaml",
            "--mechanism",
            "mst",
            "--epsilon",
            "2",
            "--workload",
            "all-2way",
        ])
        .args(["--delta", "1e-6", "--out", "syn.parquet", "--model-out", "model.json", "--unsafe-seed", "3"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let catalog = dir.join("catalog.yaml");
    std::fs::write(
        &catalog,
        "ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  t: {epsilon: 5.0}\nquery_budget: {epsilon: 0.5}\n\
         models:\n  m: model.json\ntables:\n  t: {location: t.csv, domain: t.yaml}\n",
    )
    .unwrap();
    (catalog, model)
}

fn unledgered(catalog: &Path) -> Catalog {
    let mut c = Catalog::load(catalog).unwrap();
    (c.ledger, c.create_ledger) = (None, None);
    c
}

fn ints(r: &dpflow::sql::QueryResult) -> Vec<i64> {
    r.batches.iter().flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec()).collect()
}

#[tokio::test]
async fn synthetic_rows_cost_nothing_and_every_reference_sees_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, model) = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    // By catalog name and (locally) by path: exactly the rows asked for.
    let r = e.query("SELECT count(*) FROM synthetic('m', 12345)", None).await.unwrap();
    assert_eq!(ints(&r), vec![12345]);
    assert!(r.mechanisms.is_empty() && r.charge_id.is_none());
    let q = format!("SELECT count(*) FROM synthetic('{}', 7)", model.display());
    assert_eq!(ints(&e.query(&q, None).await.unwrap()), vec![7]);
    // Nothing was charged.
    let ledger = dpflow::privacy::Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    assert!(ledger.history(Some("t")).unwrap().is_empty());
    // EXPLAIN lists no mechanism; the forecast says why there is no error of its own.
    let r = e.query("EXPLAIN SELECT * FROM synthetic('m', 10)", None).await.unwrap();
    assert!(r.explain.unwrap().is_empty());
    let (recs, preds) = e.predict("SELECT * FROM synthetic('m', 10)", None, &Default::default()).await.unwrap();
    assert!(recs.is_empty() && preds[0].basis.contains("no budget"));
    // One call, referenced twice through a CTE: the two halves partition the same rows.
    let q = "WITH s AS (SELECT sex FROM synthetic('m', 5000)) \
             SELECT (SELECT count(*) FROM s WHERE sex = 'F') + (SELECT count(*) FROM s WHERE sex <> 'F') AS n";
    assert_eq!(ints(&e.query(q, None).await.unwrap()), vec![5000]);
    // Two sessions with the same seed sample the same rows (a plan re-executed samples again from its seed).
    let q = "SELECT sum(CASE WHEN sex = 'F' THEN 1 ELSE 0 END) FROM synthetic('m', 3000)";
    let mut s1 = SqlEngine::open(unledgered(&catalog), Some(9)).await.unwrap();
    let mut s2 = SqlEngine::open(unledgered(&catalog), Some(9)).await.unwrap();
    let (a, b) = (ints(&s1.query(q, None).await.unwrap()), ints(&s2.query(q, None).await.unwrap()));
    assert_eq!(a, b);
    // The model's shares survive sampling (a third of the rows are F; MST at ε = 2 on 600 rows:
    // within 0.08 of the share).
    let share = a[0] as f64 / 3000.0;
    assert!((share - 1.0 / 3.0).abs() < 0.08, "F share {share}");
}

#[tokio::test]
async fn bad_synthetic_calls_are_refused_with_what_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, model) = world(dir.path());
    let mut e = SqlEngine::open(Catalog::load(&catalog).unwrap(), None).await.unwrap();
    for (q, want) in [
        ("SELECT * FROM synthetic('m')", "takes (model, rows)"),
        ("SELECT * FROM synthetic('m', 0)", "rows must be a whole number from 1"),
        ("SELECT * FROM synthetic('m', 2.5)", "rows must be a whole number"),
        ("SELECT * FROM synthetic(1, 10)", "the model must be a string literal"),
        ("SELECT * FROM synthetic('no-such-model.json', 10)", "no-such-model.json"),
        // Protected rows next to synthetic ones are still protected rows.
        ("SELECT t.sex FROM t JOIN synthetic('m', 10) s ON t.age = s.age", "protected table t"),
    ] {
        let err = e.query(q, None).await.unwrap_err().to_string();
        assert!(err.contains(want), "{q}: {err}");
    }
    // A served analyst names catalog models only, never files on the server.
    let mut tables = std::collections::BTreeSet::new();
    tables.insert("t".to_string());
    let mut a = SqlEngine::open_for_analyst(Catalog::load(&catalog).unwrap(), "alice", &tables).await.unwrap();
    let q = format!("SELECT count(*) FROM synthetic('{}', 5)", model.display());
    let err = a.query(&q, None).await.unwrap_err().to_string();
    assert!(err.contains("no model") && err.contains("models: m"), "{err}");
    assert_eq!(ints(&a.query("SELECT count(*) FROM synthetic('m', 5)", None).await.unwrap()), vec![5]);
    // Nothing was charged by any of it.
    let ledger = dpflow::privacy::Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    assert!(ledger.history(Some("t")).unwrap().is_empty());
}
