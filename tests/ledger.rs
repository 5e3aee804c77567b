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
