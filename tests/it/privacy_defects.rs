//! Issue 14: each test pins one way a release could break its guarantee
//! (docs/PRIVACY.md). Every test here failed on the code before the fix.

use std::path::{Path, PathBuf};
use std::process::Command;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use dpflow::privacy::{Budget, ChargeStatus, Ledger};
use dpflow::sql::{Catalog, SqlEngine};

fn column_f64(b: &[RecordBatch], name: &str) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for batch in b {
        let i = batch.schema().index_of(name).unwrap();
        let a = cast(batch.column(i), &DataType::Float64).unwrap();
        let a = a.as_primitive::<Float64Type>();
        out.extend((0..a.len()).map(|r| a.is_valid(r).then(|| a.value(r))));
    }
    out
}

/// A catalog with one protected table `t` (CSV `csv`, domain `domain`) and
/// extra YAML for its entry, plus an optional ledger with budget ε = 100.
fn catalog(dir: &Path, csv: &str, domain: &str, entry_extra: &str, ledger: bool, public: &str) -> PathBuf {
    std::fs::write(dir.join("t.csv"), csv).unwrap();
    std::fs::write(dir.join("t.yaml"), domain).unwrap();
    let l = if ledger { "ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  t: {epsilon: 100.0}\n" } else { "" };
    let cat = format!(
        "{l}query_budget: {{epsilon: 1.0}}\ntables:\n  t:\n    location: t.csv\n    domain: t.yaml\n{entry_extra}{public}"
    );
    let p = dir.join("catalog.yaml");
    std::fs::write(&p, cat).unwrap();
    p
}

fn dpflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dpflow"))
}

// ---------------------------------------------------------------- §1

#[tokio::test]
async fn the_division_by_zero_membership_oracle_is_refused_before_anything_is_charged() {
    let d = tempfile::tempdir().unwrap();
    let csv = "id,age\np1,30\np2,37\np3,50\n";
    let dom = "columns:\n  - {name: id, kind: categorical, values: [p1, p2, p3, p4]}\n  - {name: age, kind: integer, bounds: [0, 120], bins: {width: 10}}\n";
    let p = catalog(d.path(), csv, dom, "", true, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), None).await.unwrap();
    let oracle = "SELECT dp_count(*) FROM t WHERE CASE WHEN id = 'p2' THEN 1/(age-37) ELSE 1 END = 1";
    let err = e.query(oracle, None).await.unwrap_err();
    assert_eq!(err.refusal_kind(), Some(dpflow::sql::RefusalKind::MayFail), "{err:#}");
    let err = format!("{err:#}");
    assert!(err.contains("integer division") && err.contains("DOUBLE"), "{err}");
    let cast = "SELECT dp_count(*) FROM t WHERE CAST(id AS INT) = 3";
    let err = format!("{:#}", e.query(cast, None).await.unwrap_err());
    assert!(err.contains("TRY_CAST"), "{err}");
    // Refused at plan time: nothing reserved, nothing spent.
    let l = Ledger::open(d.path().join("ledger.sqlite")).unwrap();
    assert!(l.history(Some("t")).unwrap().is_empty());
    // The safe spelling runs.
    let ok = "SELECT dp_count(*) FROM t WHERE CASE WHEN id = 'p2' THEN 1.0/CAST(age-37 AS DOUBLE) ELSE 1.0 END = 1.0";
    e.query(ok, None).await.unwrap();
}

#[tokio::test]
async fn out_of_domain_error_policy_is_refused_for_dp_reads_and_drop_row_is_data_independent() {
    let d = tempfile::tempdir().unwrap();
    // 987654 is out of the domain [0, 120].
    let csv = "age\n30\n987654\n50\n";
    let strict =
        "out_of_domain: error\ncolumns:\n  - {name: age, kind: integer, bounds: [0, 120], bins: {width: 10}}\n";
    let p = catalog(d.path(), csv, strict, "", true, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), None).await.unwrap();
    let err = e.query("SELECT dp_count(*) FROM t", None).await.unwrap_err();
    assert_eq!(err.refusal_kind(), Some(dpflow::sql::RefusalKind::TablePolicy), "{err:#}");
    let err = format!("{err:#}");
    assert!(err.contains("out_of_domain: error") && err.contains("drop-row"), "{err}");
    assert!(!err.contains("987654"), "{err}");
    let l = Ledger::open(d.path().join("ledger.sqlite")).unwrap();
    assert!(l.history(Some("t")).unwrap().is_empty(), "refused before any charge");
    // The default (drop-row) runs and drops the bad row, whatever it holds.
    let lenient = "columns:\n  - {name: age, kind: integer, bounds: [0, 120], bins: {width: 10}}\n";
    std::fs::write(d.path().join("t.yaml"), lenient).unwrap();
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), None).await.unwrap();
    // ε = 50: the discrete Laplace noise is 0 with probability 1 − 2e^{-50}/(1 + e^{-50}).
    let r = e.query("SELECT dp_count(*, epsilon => 50) AS n FROM t", None).await.unwrap();
    assert_eq!(column_f64(&r.batches, "n"), vec![Some(2.0)]);
}

/// A CSV whose line 3 has one field too many, holding a planted value: the
/// reader fails there, after the query was charged.
fn broken_world(dir: &Path) -> PathBuf {
    let mut csv = String::from("age\n30\n");
    csv += "40,31337\n";
    for i in 0..50 {
        csv += &format!("{}\n", 20 + i);
    }
    let dom = "columns:\n  - {name: age, kind: integer, bounds: [0, 120], bins: {width: 10}}\n";
    catalog(dir, &csv, dom, "", true, "")
}

#[tokio::test]
async fn a_failure_after_reading_is_charged_and_says_nothing_about_the_data() {
    let d = tempfile::tempdir().unwrap();
    let p = broken_world(d.path());
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), None).await.unwrap();
    let err = format!("{:#}", e.query("SELECT dp_count(*) FROM t", None).await.unwrap_err());
    assert!(err.contains("failed after reading protected data"), "{err}");
    assert!(!err.contains("31337") && !err.contains("line"), "{err}");
    let l = Ledger::open(d.path().join("ledger.sqlite")).unwrap();
    let h = l.history(Some("t")).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, ChargeStatus::Failed, "charged, never refunded");
    let s = l.status("t").unwrap();
    assert!((s.spent - 1.0).abs() < 1e-9 && s.open_reservations == 0, "{s:?}");
    // The same query again is a new charge (the failed one stays spent).
    assert!(e.query("SELECT dp_count(*) FROM t", None).await.is_err());
    assert!((l.status("t").unwrap().spent - 2.0).abs() < 1e-9);
}

#[test]
fn no_output_or_trace_log_holds_the_planted_value() {
    let d = tempfile::tempdir().unwrap();
    let p = broken_world(d.path());
    let out = dpflow()
        .args(["sql", "--catalog", p.to_str().unwrap(), "-e", "SELECT dp_count(*) FROM t"])
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(all.contains("failed after reading protected data"), "{all}");
    assert!(!all.contains("31337") && !all.contains("line 3"), "the bad line leaked: {all}");
    assert!(!all.contains("Exact("), "exact statistics leaked into the logs: {all}");

    // An out-of-domain value, under `error` (refused before reading) and under the
    // default drop-row (read and dropped): neither run prints it, at any log level.
    let d = tempfile::tempdir().unwrap();
    let csv = "age\n30\n987654\n50\n";
    for (policy, ok) in [("out_of_domain: error\n", false), ("", true)] {
        let dom =
            format!("{policy}columns:\n  - {{name: age, kind: integer, bounds: [0, 120], bins: {{width: 10}}}}\n");
        let p = catalog(d.path(), csv, &dom, "", true, "");
        let out = dpflow()
            .args(["sql", "--catalog", p.to_str().unwrap(), "-e", "SELECT dp_count(*) AS n FROM t"])
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        assert_eq!(out.status.success(), ok);
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!all.contains("987654"), "the out-of-domain value leaked: {all}");
        assert!(!all.contains("Exact("), "{all}");
    }
}

#[tokio::test]
async fn neighbours_around_the_old_overflow_threshold_behave_identically() {
    // dp_var(age, 2121320343, 2121320344) used to fail iff ≥ 2 rows matched.
    for rows in [1, 2] {
        let d = tempfile::tempdir().unwrap();
        let mut csv = String::from("age\n");
        for _ in 0..rows {
            csv += "2121320343\n";
        }
        let dom = "columns:\n  - {name: age, kind: integer, bounds: [0, 2147483000], bins: {count: 4}}\n";
        let p = catalog(d.path(), &csv, dom, "", false, "");
        let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(5)).await.unwrap();
        for q in [
            "SELECT dp_var(age, 2121320343, 2121320344) AS v FROM t",
            "SELECT dp_sum(age, 2121320343, 2121320344) AS v FROM t",
        ] {
            let r = e.query(q, None).await;
            assert!(r.is_ok(), "{rows} row(s): {q}: {:#}", r.err().unwrap());
        }
    }
}

#[tokio::test]
async fn variance_sums_are_exact_beyond_2_pow_53() {
    // var(C + y) with bounds [C, C + 1] must release exactly what var(y) with
    // bounds [0, 1] releases (same seed): the grid units are the same
    // integers. With C = 2^25 and 4000 rows, Σx² ≈ 2^62: below the old 64-bit
    // refusal, but far above 2^53, where f64 cancellation (ulp 2^10, i.e.
    // 2^52 grid units of g² = 2^-42) exceeded the sensitivity (2^40 units).
    let c: i64 = 1 << 25;
    let d = tempfile::tempdir().unwrap();
    let mut csv = String::from("y,x\n");
    for i in 0..4000i64 {
        let y = (i * 7919) % 3 % 2;
        csv += &format!("{y},{}\n", c + y);
    }
    let dom = format!(
        "columns:\n  - {{name: y, kind: integer, bounds: [0, 1]}}\n  - {{name: x, kind: integer, bounds: [{c}, {}]}}\n",
        c + 1
    );
    let p = catalog(d.path(), &csv, &dom, "", false, "");
    let run = |q: String| {
        let p = p.clone();
        async move {
            let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(17)).await.unwrap();
            column_f64(&e.query(&q, None).await.unwrap().batches, "v")[0].unwrap()
        }
    };
    let small = run("SELECT dp_var(y, 0, 1) AS v FROM t".into()).await;
    let large = run(format!("SELECT dp_var(x, {c}, {}) AS v FROM t", c + 1)).await;
    assert_eq!(small, large, "exact sums: identical releases");
}

#[tokio::test]
async fn narrow_and_wide_exact_sums_release_the_same_values() {
    // 64-bit sums (split squares) and the 128-bit fallback are the same exact integers:
    // forced to the fallback, every release is identical under the same seed.
    let d = tempfile::tempdir().unwrap();
    let mut csv = String::from("k,x,f\n");
    for i in 0..3000i64 {
        csv += &format!("{},{},{}\n", i % 3, 1_000_000 + (i * 7919) % 100_000, (i as f64) * 0.37);
    }
    let dom = "columns:\n  - {name: k, kind: integer, bounds: [0, 2]}\n  - {name: x, kind: integer, bounds: [0, 2000000], bins: {count: 4}}\n  - {name: f, kind: float, bounds: [0, 2000], bins: {count: 4}}\n";
    let p = catalog(d.path(), &csv, dom, "", false, "");
    let q = "SELECT k, dp_sum(x, 0, 2000000) AS s, dp_avg(x, 900000, 1200000) AS a, dp_var(x, 900000, 1200000) AS v, \
             dp_var(f, 0, 2000) AS vf, dp_avg(f, 0, 2000) AS af FROM t GROUP BY k";
    let mut out = Vec::new();
    for wide_from in [1i128 << 32, 0] {
        let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(41)).await.unwrap();
        e.set_wide_sums_from(wide_from);
        let r = e.query(q, None).await.unwrap();
        out.push(["s", "a", "v", "vf", "af"].map(|c| column_f64(&r.batches, c)));
    }
    assert_eq!(out[0], out[1]);
}

// ---------------------------------------------------------------- §3

#[tokio::test]
async fn quantile_audit_with_several_rows_per_unit() {
    // 4000 groups; group g holds one unit with 5 rows at 99 (l∞ = 5). For
    // q = 1 the 11 bins from 99 up score 0 and every other bin −5. The
    // neighbour without the unit has an empty group: a uniform choice, so
    // P'(top 11 bins) = 11/1024 exactly. ε-DP needs P(top) ≤ e^ε·11/1024.
    // With sensitivity 1 instead of l∞ = 5, P(top) ≈ 0.117 (ε̂ ≈ 2.4 at ε = 1).
    let d = tempfile::tempdir().unwrap();
    let mut csv = String::from("pid,g,v\n");
    for g in 0..4000 {
        for _ in 0..5 {
            csv += &format!("u{g},{g},99\n");
        }
    }
    let dom = "columns:\n  - {name: g, kind: integer, bounds: [0, 3999]}\n  - {name: v, kind: float, bounds: [0, 100], bins: {count: 4}}\n";
    let unit = "    privacy_unit: {column: pid}\n    max_rows_per_unit: 5\n    max_groups_per_unit: 1\n";
    let p = catalog(d.path(), &csv, dom, unit, false, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(23)).await.unwrap();
    let r =
        e.query("SELECT g, dp_quantile(v, 1.0, 0, 100, epsilon => 1.0) AS m FROM t GROUP BY g", None).await.unwrap();
    let m = column_f64(&r.batches, "m");
    assert_eq!(m.len(), 4000);
    let edge = 1013.0 * 100.0 / 1024.0;
    let top = m.iter().filter(|x| x.unwrap() >= edge).count();
    let bound = 1f64.exp() * 11.0 / 1024.0 * 4000.0; // 116.8
    // Correct sensitivity: P(top) = 11/(11 + 1013·e^{−1/2}) ≈ 0.0176, i.e. 70 ± 8 of 4000.
    assert!((top as f64) < bound, "ε̂ = ln({top}/4000 / (11/1024)) exceeds ε = 1");
    let eps_hat = ((top as f64 / 4000.0) / (11.0 / 1024.0)).ln();
    assert!(eps_hat < 1.0, "{eps_hat}");
}

#[tokio::test]
async fn partition_selection_keeps_a_one_unit_key_with_probability_at_most_delta() {
    // At ε = 1, l0 = 1, δ = 0.0711 the continuous threshold 1 + ln(1/2δ) = 2.95
    // keeps a one-unit key when Z ≥ 2: probability e^{-2}/(1 + e^{-1}) = 0.099 > δ.
    // The discrete threshold τ = 3 keeps it with probability 0.036 ≤ δ.
    let d = tempfile::tempdir().unwrap();
    let mut csv = String::from("k\n");
    for k in 0..20000 {
        csv += &format!("{k}\n");
    }
    // Bins of width 10: the key has no enumerable public domain, so keys are selected.
    let dom = "columns:\n  - {name: k, kind: integer, bounds: [0, 19999], bins: {width: 10}}\n";
    let p = catalog(d.path(), &csv, dom, "", false, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(31)).await.unwrap();
    let budget = Budget::Approx { epsilon: 1.0, delta: 0.0711 };
    let r = e.query("SELECT k, dp_count(*, epsilon => 1.0) AS n FROM t GROUP BY k", Some(budget)).await.unwrap();
    let kept = r.batches.iter().map(|b| b.num_rows()).sum::<usize>() as f64;
    // Expected 0.0364 · 20000 = 728 ± 27; δ · 20000 = 1422; the old rule kept ≈ 1978.
    assert!(kept <= 0.0711 * 20000.0, "kept {kept} one-unit keys of 20000: more than δ");
    assert!(kept > 600.0, "sanity: the keep probability should be ≈ 0.036, kept {kept}");
    let sel = r.mechanisms.iter().find(|m| m.mechanism == "laplace_partition_selection").unwrap();
    assert_eq!(sel.params["threshold"], 3);
}

#[tokio::test]
async fn null_unit_ids_are_each_their_own_unit() {
    let d = tempfile::tempdir().unwrap();
    let mut csv = String::from("pid,v\n");
    for _ in 0..10 {
        csv += ",1\n"; // null ids
    }
    csv += "a,1\na,1\nb,1\n";
    let dom = "columns:\n  - {name: v, kind: integer, bounds: [0, 9]}\n";
    let unit = "    privacy_unit: {column: pid}\n    max_rows_per_unit: 1\n    max_groups_per_unit: 1\n";
    let p = catalog(d.path(), &csv, dom, unit, false, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
    let r = e.query("SELECT dp_count(*, epsilon => 1000000) AS n FROM t", None).await.unwrap();
    // Ten null-id rows (ten units) + one row of a + one row of b.
    assert_eq!(column_f64(&r.batches, "n"), vec![Some(12.0)]);
}

#[tokio::test]
async fn an_unsafe_seed_with_a_ledger_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dom = "columns:\n  - {name: v, kind: integer, bounds: [0, 9]}\n";
    let p = catalog(d.path(), "v\n1\n", dom, "", true, "");
    let err = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.err().expect("refused");
    assert!(format!("{err:#}").contains("--unsafe-seed with a ledger"), "{err:#}");
}

fn join_world(dir: &Path) -> PathBuf {
    let dom = "columns:\n  - {name: x, kind: integer, bounds: [0, 9]}\n";
    std::fs::write(dir.join("p.csv"), "y,w,v\n1,1,1\n2,1,1\n3,2,2\n").unwrap();
    std::fs::write(
        dir.join("p.yaml"),
        "columns:\n  - {name: y, kind: integer, bounds: [0, 9]}\n  - {name: w, kind: integer, bounds: [0, 9]}\n  - {name: v, kind: integer, bounds: [0, 9]}\n",
    )
    .unwrap();
    let public = "  p: {location: p.csv, domain: p.yaml, public: true}\n";
    catalog(dir, "x\n1\n1\n2\n", dom, "", false, public)
}

#[tokio::test]
async fn join_uniqueness_is_checked_on_the_actual_keys_of_the_public_side() {
    let d = tempfile::tempdir().unwrap();
    let p = join_world(d.path());
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
    // y is unique in p, but the joined key is w renamed to y, which is not.
    let renamed = "SELECT dp_count(*) FROM t JOIN (SELECT w AS y FROM p) q ON t.x = q.y";
    let err = format!("{:#}", e.query(renamed, None).await.unwrap_err());
    assert!(err.contains("not unique"), "{err}");
    // (y, w, v) is unique, but the key is y alone... which is unique: accepted; w alone is not.
    e.query("SELECT dp_count(*) FROM t JOIN p ON t.x = p.y AND p.w = p.v", None).await.unwrap();
    let err = format!(
        "{:#}",
        e.query("SELECT dp_count(*) FROM t JOIN p ON t.x = p.w AND p.y = p.v", None).await.unwrap_err()
    );
    assert!(err.contains("not unique"), "{err}");
}

// ---------------------------------------------------------------- ledger

/// A mechanism record costing pure ε.
fn pure(epsilon: f64) -> dpflow::privacy::MechanismRecord {
    dpflow::privacy::MechanismRecord {
        mechanism: "m".into(),
        target: "x".into(),
        sensitivity: None,
        noise: None,
        loss: dpflow::privacy::PrivacyLoss::Pure { epsilon },
        params: serde_json::Value::Null,
    }
}

#[test]
fn a_failed_charge_stays_spent_and_frees_its_release_id() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l.sqlite");
    let mut l = Ledger::create(&path).unwrap();
    l.add_dataset("t", "row", Budget::Pure { epsilon: 2.0 }).unwrap();
    let rec = pure(1.0);
    let r = l.reserve("t", "r1", std::slice::from_ref(&rec), None).unwrap();
    l.fail(r.charge_id, "test").unwrap();
    assert!(l.release(r.charge_id, "refund?").is_err(), "a failed charge cannot be refunded");
    assert!(l.resolve(r.charge_id, ChargeStatus::Released, "refund?").is_err());
    let s = l.status("t").unwrap();
    assert_eq!((s.spent, s.committed, s.open_reservations), (1.0, 1.0, 0));
    // The same release id can run again, as a new charge; the budget then holds no third.
    let r2 = l.reserve("t", "r1", std::slice::from_ref(&rec), None).unwrap();
    assert_ne!(r2.charge_id, r.charge_id);
    assert!(l.reserve("t", "r2", std::slice::from_ref(&rec), None).is_err(), "over budget");
    // Reopening keeps it (schema 2).
    drop(l);
    assert_eq!(Ledger::open(&path).unwrap().status("t").unwrap().spent, 2.0);
}

#[test]
fn a_schema_1_ledger_is_migrated_in_place() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("l.sqlite");
    {
        let mut l = Ledger::create(&path).unwrap();
        l.add_dataset("t", "row", Budget::Pure { epsilon: 2.0 }).unwrap();
        let rec = pure(0.5);
        let r = l.reserve("t", "r1", &[rec], None).unwrap();
        l.commit(r.charge_id).unwrap();
    }
    // Rewrite it as schema 1 (the old CHECK constraint without 'failed').
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "BEGIN; DROP INDEX charges_by_analyst; DROP TABLE analysts; ALTER TABLE charges RENAME TO c2;
         CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL REFERENCES datasets(name),
           release_id TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('reserved', 'committed', 'released')),
           mechanisms_json TEXT NOT NULL, rho REAL NOT NULL, eps REAL NOT NULL, delta REAL NOT NULL, cost REAL NOT NULL,
           reserved_at TEXT NOT NULL, resolved_at TEXT, note TEXT, pid INTEGER, UNIQUE (dataset, release_id));
         INSERT INTO charges SELECT id, dataset, release_id, status, mechanisms_json, rho, eps, delta, cost,
           reserved_at, resolved_at, note, pid FROM c2; DROP TABLE c2;
         UPDATE meta SET value = '1' WHERE key = 'schema_version'; COMMIT;",
    )
    .unwrap();
    drop(c);
    let l = Ledger::open(&path).unwrap();
    assert_eq!(l.status("t").unwrap().spent, 0.5, "history kept");
    let rec = l.history(Some("t")).unwrap()[0].mechanisms[0].clone();
    let mut l = l;
    let r = l.reserve("t", "r2", &[rec], None).unwrap();
    l.fail(r.charge_id, "after migration the failed status is accepted").unwrap();
    assert_eq!(l.status("t").unwrap().spent, 1.0);
    // ... and so are analysts' grants (schema 3).
    l.grant("t", "alice", Budget::Pure { epsilon: 0.1 }).unwrap();
    assert_eq!(l.analyst_status("t", "alice").unwrap().spent, 0.0);
}

// ---------------------------------------------------------------- review findings

/// t(pid, age, id) with a unit column, and a public table p(k, w).
fn review_world(dir: &Path, unit: bool) -> PathBuf {
    let mut csv = String::from("pid,age,id\n");
    for i in 0..40 {
        csv += &format!("u{},{},{}\n", i % 20, 20 + i % 50, if i == 7 { "p2" } else { "p1" });
    }
    let dom = "columns:\n  - {name: age, kind: integer, bounds: [0, 120], bins: {width: 10}}\n  - {name: id, kind: categorical, values: [p1, p2]}\n";
    std::fs::write(dir.join("p.csv"), "k,w\n20,1\n21,2\n22,3\n").unwrap();
    std::fs::write(
        dir.join("p.yaml"),
        "columns:\n  - {name: k, kind: integer, bounds: [0, 120]}\n  - {name: w, kind: integer, bounds: [0, 9]}\n",
    )
    .unwrap();
    let entry = if unit {
        "    privacy_unit: {column: pid}\n    max_rows_per_unit: 1\n    max_groups_per_unit: 1\n"
    } else {
        ""
    };
    catalog(dir, &csv, dom, entry, false, "  p: {location: p.csv, domain: p.yaml, public: true}\n")
}

#[tokio::test]
async fn the_unit_column_cannot_be_redefined_by_the_query() {
    let d = tempfile::tempdir().unwrap();
    let p = review_world(d.path(), true);
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
    for q in [
        "SELECT dp_count(*) FROM (SELECT CAST(NULL AS VARCHAR) AS pid, age FROM t) s",
        "SELECT dp_count(*) FROM (SELECT id AS pid, age FROM t) s",
        "SELECT dp_count(*) FROM (SELECT age FROM t) s",
    ] {
        let err = format!("{:#}", e.query(q, None).await.unwrap_err());
        assert!(err.contains("privacy unit column"), "{q}: {err}");
    }
    e.query("SELECT dp_count(*) FROM (SELECT pid, age FROM t WHERE age > 30) s", None).await.unwrap();
}

#[tokio::test]
async fn a_column_named_like_a_domain_column_is_still_clamped() {
    // v.age is a VALUES column named like t's domain column age ∈ [0, 120]: its
    // 10^9 must be clamped to the call's bound 200, not trusted as in-domain.
    let d = tempfile::tempdir().unwrap();
    let p = review_world(d.path(), false);
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(2)).await.unwrap();
    let q = "SELECT dp_sum(v.age, 0, 200, epsilon => 50) AS s FROM t JOIN (VALUES (0, 1000000000)) AS v(k, age) ON t.age * 0 = v.k";
    let s = column_f64(&e.query(q, None).await.unwrap().batches, "s")[0].unwrap();
    assert!(s <= 200.0 * 40.0 + 200.0, "not clamped: {s}");
}

#[tokio::test]
async fn join_keys_of_different_types_and_volatile_keys_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = review_world(d.path(), false);
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(3)).await.unwrap();
    let cases = [
        // Int64 keys compared as Float64 could all collapse to one value.
        ("SELECT dp_count(*) FROM t JOIN (VALUES (20.0), (21.0)) AS v(y) ON t.age = v.y", "different types"),
        ("SELECT dp_count(*) FROM t GROUP BY random() < 0.5", "random"),
        // Failure oracles the first whitelist let through.
        ("SELECT dp_count(*) FROM t WHERE sqrt(CASE WHEN id = 'p2' THEN -1.0 ELSE 1.0 END) > 0", "sqrt"),
        ("SELECT dp_count(*) FROM t WHERE CASE WHEN id = 'p2' THEN 'x' ELSE '1' END IN (1)", "fail"),
        ("SELECT dp_count(*) FROM t WHERE CASE WHEN id = 'p2' THEN abs(-9223372036854775808) > 0 ELSE true END", "abs"),
        ("SELECT dp_sum(CASE WHEN id = 'p2' THEN id END, 0, 1) FROM t", "numeric argument"),
        ("SELECT dp_count(*) FILTER (WHERE age > 50) FROM t", "FILTER"),
        // The public side runs or not depending on the protected rows: it must not fail either.
        ("SELECT dp_count(*) FROM t JOIN (SELECT k, 1/(k-k) AS z FROM p) q ON t.age = q.k", "public side"),
    ];
    for (q, want) in cases {
        let err = format!("{:#}", e.query(q, None).await.unwrap_err());
        assert!(err.contains(want), "{q}: {err}");
    }
}

#[test]
fn a_failed_charge_cannot_be_refunded_by_reusing_its_release_id() {
    let d = tempfile::tempdir().unwrap();
    let mut l = Ledger::create(d.path().join("l.sqlite")).unwrap();
    l.add_dataset("t", "row", Budget::Pure { epsilon: 2.0 }).unwrap();
    let rec = pure;
    let r = l.reserve("t", "R", &[rec(1.0)], None).unwrap();
    l.fail(r.charge_id, "test").unwrap();
    let renamed = l.history(Some("t")).unwrap()[0].release_id.clone();
    assert_eq!(renamed, format!("R#failed-{}", r.charge_id));
    // Reserving under the failed charge's id would overwrite (refund) it.
    assert!(l.reserve("t", &renamed, &[rec(0.01)], None).is_err());
    assert!(l.reserve("t", "mine#failed-99", &[rec(0.01)], None).is_err());
    assert!(l.fail(r.charge_id, "twice").is_err());
    assert_eq!(l.status("t").unwrap().spent, 1.0);
}

/// Privacy review of issue 15: GROUP BY merges −0.0 and +0.0, so contribution
/// bounding must too. Unit p has one row in each zero; with one group and one
/// row per unit it may add 1 to the merged group, never 2.
#[tokio::test]
async fn signed_zero_keys_are_one_group_for_contribution_bounds() {
    let d = tempfile::tempdir().unwrap();
    let csv = "pid,age\nq,30\np,30\np,50\n";
    let dom = "columns:\n  - {name: age, kind: integer, bounds: [0, 99]}\n";
    let unit = "    privacy_unit: {column: pid}\n    max_rows_per_unit: 1\n    max_groups_per_unit: 1\n";
    let p = catalog(d.path(), csv, dom, unit, false, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
    let q = "SELECT CASE WHEN age < 40 THEN -0.0 ELSE 0.0 END AS z, dp_count(*) AS n FROM t \
             GROUP BY CASE WHEN age < 40 THEN -0.0 ELSE 0.0 END";
    for _ in 0..5 {
        // Noise ~1e-6 and a threshold of 0 units: the exact bounded count shows through.
        let r = e.query(q, Some(Budget::Approx { epsilon: 1e7, delta: 0.4 })).await.unwrap();
        assert_eq!(column_f64(&r.batches, "n"), vec![Some(2.0)], "q's row and one of p's");
    }
    // With two groups per unit the group ranking no longer hides it: the row cap
    // per (unit, group) itself must see one group. The first branch's type (an
    // integer 0) must not hide that the key is a float either.
    let unit = "    privacy_unit: {column: pid}\n    max_rows_per_unit: 1\n    max_groups_per_unit: 2\n";
    let p = catalog(d.path(), csv, dom, unit, false, "");
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
    for q in [
        q,
        "SELECT CASE WHEN age < 40 THEN 0 ELSE -0.0 END AS z, dp_count(*) AS n FROM t \
         GROUP BY CASE WHEN age < 40 THEN 0 ELSE -0.0 END",
    ] {
        let r = e.query(q, Some(Budget::Approx { epsilon: 1e7, delta: 0.4 })).await.unwrap();
        assert_eq!(column_f64(&r.batches, "n"), vec![Some(2.0)], "{q}");
    }
}

/// Privacy re-review of issue 15: before type coercion a CASE reports its first
/// branch's type, so `THEN 1 ELSE 1e300` looked like an integer and took the
/// exact path's CAST to Int64, which fails on 1e300: whether the query failed
/// told whether the person aged 37 was in the data. The engine now plans on the
/// coerced plan (a float, clamped with TRY_CAST): it succeeds either way.
#[tokio::test]
async fn a_case_whose_first_branch_is_an_integer_is_planned_with_its_coerced_type() {
    let d = tempfile::tempdir().unwrap();
    let dom = "columns:\n  - {name: age, kind: integer, bounds: [0, 99]}\n";
    let q = "SELECT dp_sum(CASE WHEN age <> 37 THEN 1 ELSE 1e300 END, 0, 10, epsilon => 1000000) AS s FROM t";
    for csv in ["age\n30\n50\n", "age\n30\n37\n50\n"] {
        let p = catalog(d.path(), csv, dom, "", false, "");
        let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
        let r = e.query(q, None).await;
        assert!(r.is_ok(), "{csv:?}: {:#}", r.err().unwrap());
    }
}

/// A floating-point unit id is refused: −0.0 and +0.0 (or two NaNs) would be two units.
#[tokio::test]
async fn a_floating_point_unit_column_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dom = "columns:\n  - {name: age, kind: integer, bounds: [0, 99]}\n";
    // CSV columns outside the domain are read as text; Parquet keeps the float type.
    let batch = RecordBatch::try_from_iter(vec![
        ("pid", std::sync::Arc::new(datafusion::arrow::array::Float64Array::from(vec![-0.0, 0.0])) as _),
        ("age", std::sync::Arc::new(datafusion::arrow::array::Int64Array::from(vec![30, 50])) as _),
    ])
    .unwrap();
    let file = std::fs::File::create(d.path().join("t.parquet")).unwrap();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    std::fs::write(d.path().join("t.yaml"), dom).unwrap();
    let p = d.path().join("catalog.yaml");
    std::fs::write(&p, "tables:\n  t:\n    location: t.parquet\n    domain: t.yaml\n    privacy_unit: {column: pid}\n")
        .unwrap();
    let mut e = SqlEngine::open(Catalog::load(&p).unwrap(), Some(1)).await.unwrap();
    let err = e.query("SELECT dp_count(*, epsilon => 1) FROM t", None).await.unwrap_err();
    assert_eq!(err.refusal_kind(), Some(dpflow::sql::RefusalKind::PrivacyUnit), "{err:#}");
}
