//! Replays every committed fuzz input (`fuzz/corpus/<target>/`) through its
//! target on stable, in every `cargo test`: each input found by `cargo fuzz`
//! that once crashed dpflow, and the inputs that reach the most code, stay
//! regression tests. A panic here is a crash the fuzzer found (see
//! fuzz/README.md to reproduce it with `cargo fuzz run`).

#[path = "../fuzz/harness.rs"]
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
