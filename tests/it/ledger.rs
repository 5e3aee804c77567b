//! Ledger acceptance tests (issue #3): concurrent processes never overspend,
//! a SIGKILL between reserve and commit leaves the reservation counted,
//! history lists every charge, and a corrupt or missing ledger is an error.

use std::process::{Command, Stdio};
use std::time::Duration;

use dpflow::privacy::{Budget, ChargeStatus, Ledger, LedgerError, MechanismRecord, PrivacyLoss};

fn dpflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dpflow"))
}

fn init(path: &std::path::Path, budget: &[&str]) {
    let out = dpflow()
        .args(["budget", "init", "--ledger", path.to_str().unwrap(), "--dataset", "adult"])
        .args(budget)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn pure(eps: f64) -> MechanismRecord {
    MechanismRecord {
        mechanism: "test".into(),
        target: "count".into(),
        sensitivity: Some(1.0),
        noise: None,
        loss: PrivacyLoss::Pure { epsilon: eps },
        params: serde_json::Value::Null,
    }
}

#[test]
fn eight_processes_never_overspend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    init(&path, &["--epsilon", "1.0"]);
    // 8 processes × 3 charges of ε = 0.1 = 2.4 requested against a budget of 1.0.
    let children: Vec<_> = (0..8)
        .map(|p| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut ok = 0;
                for k in 0..3 {
                    let out = dpflow()
                        .args(["budget", "charge", "--ledger", path.to_str().unwrap(), "--dataset", "adult"])
                        .args(["--release-id", &format!("p{p}-{k}"), "--epsilon", "0.1"])
                        .output()
                        .unwrap();
                    if out.status.success() {
                        ok += 1;
                    } else {
                        let err = String::from_utf8_lossy(&out.stderr);
                        assert!(err.contains("budget exceeded"), "unexpected failure: {err}");
                    }
                }
                ok
            })
        })
        .collect();
    let ok: i32 = children.into_iter().map(|c| c.join().unwrap()).sum();
    let ledger = Ledger::open(&path).unwrap();
    let status = ledger.status("adult").unwrap();
    assert_eq!(ok, 10, "exactly 10 charges of 0.1 fit in 1.0");
    assert!(status.spent <= 1.0 + 1e-9, "overspent: {}", status.spent);
    assert_eq!(ledger.history(Some("adult")).unwrap().len(), 10);
}

#[test]
fn sigkill_between_reserve_and_commit_leaves_reservation_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    init(&path, &["--epsilon", "1.0", "--delta", "1e-6"]);
    let mut child = dpflow()
        .args(["budget", "charge", "--ledger", path.to_str().unwrap(), "--dataset", "adult"])
        .args(["--release-id", "r1", "--epsilon", "0.4", "--hold-ms", "60000"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the reservation is visible, then kill -9.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let l = Ledger::open(&path).unwrap();
        if !l.history(None).unwrap().is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "reservation never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let ledger = Ledger::open(&path).unwrap();
    let h = ledger.history(None).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, ChargeStatus::Reserved);
    let s = ledger.status("adult").unwrap();
    assert!((s.spent - 0.4).abs() < 1e-12, "reservation must count as spent: {}", s.spent);
    assert_eq!(s.committed, 0.0);
    assert_eq!(s.open_reservations, 1);
    // The operator resolves it (outputs were never published): released.
    let out = dpflow()
        .args([
            "budget",
            "resolve",
            "--ledger",
            path.to_str().unwrap(),
            "--charge",
            &h[0].id.to_string(),
            "--as",
            "released",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ledger.status("adult").unwrap().spent, 0.0);
}

#[test]
fn history_lists_every_charge_and_release_ids_never_double_spend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.sqlite");
    let mut ledger = Ledger::create(&path).unwrap();
    ledger.add_dataset("d", "row", Budget::Pure { epsilon: 1.0 }).unwrap();
    let a = ledger.reserve("d", "a", &[pure(0.2)], None).unwrap();
    ledger.commit(a.charge_id).unwrap();
    let b = ledger.reserve("d", "b", &[pure(0.3)], None).unwrap();
    ledger.release(b.charge_id, "failed cleanly").unwrap();
    let c = ledger.reserve("d", "c", &[pure(0.1), pure(0.1)], None).unwrap();
    // Resuming an open reservation with the same cost does not spend twice.
    let c2 = ledger.reserve("d", "c", &[pure(0.1), pure(0.1)], None).unwrap();
    assert!(c2.resumed && c2.charge_id == c.charge_id);
    // A committed release id is refused.
    assert!(matches!(ledger.reserve("d", "a", &[pure(0.2)], None), Err(LedgerError::AlreadyCommitted { .. })));
    // A different cost under the same open id is refused.
    assert!(matches!(ledger.reserve("d", "c", &[pure(0.3)], None), Err(LedgerError::ConflictingReservation { .. })));
    let s = ledger.status("d").unwrap();
    assert!((s.spent - 0.4).abs() < 1e-12);
    let out =
        dpflow().args(["budget", "history", "--ledger", path.to_str().unwrap(), "--format", "json"]).output().unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let statuses: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, vec!["committed", "released", "reserved"]);
    assert_eq!(rows[2]["mechanisms"].as_array().unwrap().len(), 2);
}

#[test]
fn missing_or_corrupt_ledger_is_an_error_never_a_fresh_budget() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.sqlite");
    let out = dpflow().args(["budget", "show", "--ledger", missing.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    assert!(!missing.exists(), "a missing ledger must not be created by `show`");

    let corrupt = dir.path().join("corrupt.sqlite");
    std::fs::write(&corrupt, b"this is not a database, just some bytes that look wrong......").unwrap();
    let out = dpflow().args(["budget", "show", "--ledger", corrupt.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a usable dpflow ledger"), "{err}");

    // A valid SQLite file that is not a ledger.
    let other = dir.path().join("other.sqlite");
    rusqlite_free_create(&other);
    let err = Ledger::open(&other).unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");

    // Truncating a real ledger is detected.
    let real = dir.path().join("real.sqlite");
    let l = Ledger::create(&real).unwrap();
    l.add_dataset("d", "row", Budget::Zcdp { rho: 1.0 }).unwrap();
    drop(l);
    let bytes = std::fs::read(&real).unwrap();
    std::fs::write(&real, &bytes[..bytes.len() / 2]).unwrap();
    let _ = std::fs::remove_file(real.with_extension("sqlite-wal"));
    assert!(Ledger::open(&real).and_then(|l| l.status("d")).is_err());
}

/// Creates an unrelated SQLite database through the dpflow ledger's own
/// dependency, by making a ledger and dropping its header.
fn rusqlite_free_create(path: &std::path::Path) {
    let l = Ledger::create(path).unwrap();
    drop(l);
    // Overwrite the header row through a second ledger handle is not possible
    // via the API; use the sqlite3 file format directly instead: a fresh
    // ledger without its `meta` rows is not a dpflow ledger.
    let conn_path = path.to_str().unwrap().to_string();
    let status = Command::new("python3")
        .args([
            "-c",
            &format!("import sqlite3; c=sqlite3.connect({conn_path:?}); c.execute('DELETE FROM meta'); c.commit()"),
        ])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn an_analyst_spends_only_their_grant_and_the_total_caps_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    let mut l = Ledger::create(&path).unwrap();
    l.add_dataset("adult", "row", Budget::Pure { epsilon: 1.0 }).unwrap();
    l.grant("adult", "alice", Budget::Pure { epsilon: 0.5 }).unwrap();
    l.grant("adult", "bob", Budget::Pure { epsilon: 0.8 }).unwrap();
    // No grant: refused, nothing recorded.
    assert!(matches!(
        l.reserve_for("adult", "c0", &[pure(0.1)], None, Some("carol")),
        Err(LedgerError::NoGrant { .. })
    ));
    // A grant must be in the dataset's unit.
    assert!(matches!(l.grant("adult", "carol", Budget::Zcdp { rho: 0.1 }), Err(LedgerError::GrantUnit { .. })));
    // alice: 0.4 fits, another 0.2 does not (her grant), though the dataset has 0.6 left.
    let r = l.reserve_for("adult", "a1", &[pure(0.4)], None, Some("alice")).unwrap();
    assert!((r.remaining - 0.1).abs() < 1e-12, "the smaller of her 0.1 and the dataset's 0.6: {}", r.remaining);
    l.commit(r.charge_id).unwrap();
    let e = l.reserve_for("adult", "a2", &[pure(0.2)], None, Some("alice")).unwrap_err();
    assert!(matches!(e, LedgerError::AnalystBudget { .. }), "{e}");
    assert!(e.to_string().contains("larger grant"), "{e}");
    // bob: his 0.8 grant is capped by the dataset's remaining 0.6.
    let e = l.reserve_for("adult", "b1", &[pure(0.7)], None, Some("bob")).unwrap_err();
    assert!(matches!(e, LedgerError::Budget { .. }), "{e}");
    let r = l.reserve_for("adult", "b2", &[pure(0.6)], None, Some("bob")).unwrap();
    assert!(r.remaining.abs() < 1e-12);
    // A failed charge stays spent against the analyst too; a released one is refunded.
    l.fail(r.charge_id, "test").unwrap();
    let s = l.analyst_status("adult", "bob").unwrap();
    assert!((s.spent - 0.6).abs() < 1e-12 && (s.remaining - 0.2).abs() < 1e-12 && s.dataset_remaining.abs() < 1e-12);
    let a = l.analyst_status("adult", "alice").unwrap();
    assert!((a.spent - 0.4).abs() < 1e-12, "only her own charges count: {}", a.spent);
    let h = l.history(Some("adult")).unwrap();
    assert_eq!(h.iter().map(|c| c.analyst.as_deref()).collect::<Vec<_>>(), vec![Some("alice"), Some("bob")]);
    // A reservation cannot be resumed under another analyst's name.
    let mut l2 = Ledger::open(&path).unwrap();
    l2.grant("adult", "bob", Budget::Pure { epsilon: 2.0 }).unwrap();
    let open = l2.reserve_for("adult", "x", &[pure(0.0)], None, Some("alice")).unwrap();
    assert!(l2.reserve_for("adult", "x", &[pure(0.0)], None, Some("bob")).is_err());
    l2.release(open.charge_id, "test").unwrap();
}

#[test]
fn eight_processes_of_one_analyst_never_overspend_the_grant() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    init(&path, &["--epsilon", "10.0"]);
    let out = dpflow()
        .args(["budget", "grant", "--ledger", path.to_str().unwrap(), "--dataset", "adult", "--analyst", "alice"])
        .args(["--epsilon", "1.0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let children: Vec<_> = (0..8)
        .map(|p| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut ok = 0;
                for k in 0..3 {
                    let mut l = Ledger::open(&path).unwrap();
                    match l.reserve_for("adult", &format!("p{p}-{k}"), &[pure(0.1)], None, Some("alice")) {
                        Ok(r) => {
                            l.commit(r.charge_id).unwrap();
                            ok += 1
                        }
                        Err(LedgerError::AnalystBudget { .. }) => {}
                        Err(e) => panic!("unexpected: {e}"),
                    }
                }
                ok
            })
        })
        .collect();
    let ok: i32 = children.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(ok, 10, "exactly 10 charges of 0.1 fit in alice's 1.0");
    let s = Ledger::open(&path).unwrap().analyst_status("adult", "alice").unwrap();
    assert!(s.spent <= 1.0 + 1e-9, "overspent: {}", s.spent);
}

#[test]
fn two_handles_committing_one_reservation_succeed_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    let mut l = Ledger::create(&path).unwrap();
    l.add_dataset("adult", "row", Budget::Pure { epsilon: 1e6 }).unwrap();
    let ids: Vec<i64> =
        (0..300).map(|k| l.reserve("adult", &format!("r{k}"), &[pure(1.0)], None).unwrap().charge_id).collect();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let oks: Vec<Vec<bool>> = (0..2)
        .map(|_| {
            let (path, ids, barrier) = (path.clone(), ids.clone(), barrier.clone());
            std::thread::spawn(move || {
                let l = Ledger::open(&path).unwrap();
                barrier.wait();
                ids.iter().map(|id| l.commit(*id).is_ok()).collect()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    for (k, id) in ids.iter().enumerate() {
        assert_eq!(oks[0][k] as u8 + oks[1][k] as u8, 1, "charge #{id} committed by both handles or neither");
    }
}

#[test]
fn eight_processes_opening_an_old_ledger_migrate_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    {
        let mut l = Ledger::create(&path).unwrap();
        l.add_dataset("adult", "row", Budget::Pure { epsilon: 1.0 }).unwrap();
        let r = l.reserve("adult", "r1", &[pure(0.25)], None).unwrap();
        l.commit(r.charge_id).unwrap();
    }
    // Back to schema 2 (no analysts).
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "BEGIN; DROP INDEX charges_by_analyst; DROP TABLE analysts; ALTER TABLE charges DROP COLUMN analyst;
         UPDATE meta SET value = '2' WHERE key = 'schema_version'; COMMIT;",
    )
    .unwrap();
    drop(c);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let opened: Vec<_> = (0..8)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                Ledger::open(&path).map(|l| l.status("adult").unwrap().spent)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    for o in opened {
        assert_eq!(o.unwrap(), 0.25, "every process opens it, history kept");
    }
}
