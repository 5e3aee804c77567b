//! Replays every committed fuzz input (`fuzz/corpus/<target>/`) through its
//! target on stable, in every `cargo test`: each input found by `cargo fuzz`
//! that once crashed dpflow, and the inputs that reach the most code, stay
//! regression tests. A panic here is a crash the fuzzer found (see
//! fuzz/README.md to reproduce it with `cargo fuzz run`).

#[path = "../../fuzz/harness.rs"]
mod harness;

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{}: the corpus is empty", dir.display());
    for input in &inputs {
        let data = std::fs::read(input).unwrap();
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "fuzz target {target} panicked on {}", input.display());
    }
    eprintln!("{target}: {} inputs replayed", inputs.len());
}

#[test]
fn domain_corpus() {
    replay("domain", harness::domain);
}

#[test]
fn pipeline_corpus() {
    replay("pipeline", harness::pipeline);
}

#[test]
fn catalog_corpus() {
    replay("catalog", harness::catalog);
}

#[test]
fn sql_corpus() {
    replay("sql", harness::sql);
}

#[test]
fn csv_corpus() {
    replay("csv", harness::csv);
}

#[test]
fn parquet_corpus() {
    replay("parquet", harness::parquet);
}

/// The Parquet file whose data page makes the reader panic (arrow-buffer
/// 59.3.2, `bit_chunk_iterator.rs:224`), queried through the binary with a
/// ledger: the query touching the broken column fails the ordinary way after
/// its charge (exit 1, charge `failed`, nothing left reserved, no panic
/// report), where it used to crash with exit 101 and an open reservation.
#[test]
fn a_decoder_panic_in_a_dp_query_is_a_charged_failure_not_a_crash() {
    use dpflow::privacy::{ChargeStatus, Ledger};
    let d = tempfile::tempdir().unwrap();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parquet");
    std::fs::copy(corpus.join("parquet-data-page-bit-chunk-out-of-bounds.parquet"), d.path().join("t.parquet"))
        .unwrap();
    std::fs::copy(harness::fixtures().join("penguins.domain.yaml"), d.path().join("t.yaml")).unwrap();
    let catalog = d.path().join("catalog.yaml");
    std::fs::write(
        &catalog,
        "ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  t: {epsilon: 10.0}\nquery_budget: {epsilon: 1.0}\n\
         tables:\n  t:\n    location: t.parquet\n    domain: t.yaml\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .args(["sql", "--catalog", catalog.to_str().unwrap(), "-e", "SELECT dp_count(bill_length_mm) FROM t"])
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed after reading protected data"), "{stderr}");
    assert!(!stderr.contains("internal error") && !stderr.contains("out of bounds"), "{stderr}");
    let ledger = Ledger::open(d.path().join("ledger.sqlite")).unwrap();
    let h = ledger.history(Some("t")).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, ChargeStatus::Failed, "charged, never refunded");
    assert_eq!(ledger.status("t").unwrap().open_reservations, 0);
}
