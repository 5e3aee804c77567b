//! What each fuzz target does with its input, shared by the `cargo fuzz`
//! targets (`fuzz/fuzz_targets/*.rs`) and by `tests/it/fuzz_corpus.rs`, which
//! replays the committed corpora in every `cargo test` run.
//!
//! The contract every function checks: dpflow answers any input with a
//! value or a typed error. A panic, an abort or an out-of-memory is a bug.
//! Errors are not failures here; they are formatted (so `Display` code runs).

#![allow(dead_code)]

use std::cell::RefCell;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use dpflow::domain::{BatchEncoder, DomainSpec};
use dpflow::io::InputFormat;

/// The directory of fixed inputs (domain, catalog) next to this file.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(if Path::new(env!("CARGO_MANIFEST_DIR")).ends_with("fuzz") {
        "fixtures"
    } else {
        "fuzz/fixtures"
    })
}

/// With `DPFLOW_FUZZ_SHOW=1`, prints each outcome (to see what a corpus
/// reaches); silent otherwise (the fuzzer runs millions of inputs).
fn show(what: &str, outcome: &str) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("DPFLOW_FUZZ_SHOW").is_some()) {
        eprintln!("  {what}: {}", outcome.lines().next().unwrap_or(""));
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"))
}

fn penguins() -> &'static DomainSpec {
    static SPEC: OnceLock<DomainSpec> = OnceLock::new();
    SPEC.get_or_init(|| DomainSpec::load(fixtures().join("penguins.domain.yaml")).expect("fixture domain"))
}

/// A domain file (YAML or JSON, the same parser): parse it, and when it
/// parses, derive what every consumer derives from it (the encoded schema).
pub fn domain(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match DomainSpec::parse(text, "fuzz.domain.yaml") {
        Ok(spec) => {
            let _ = dpflow_udfs::domain::encoded_schema(&spec.domain);
            show("domain", &format!("{} columns", spec.domain.names().len()));
        }
        Err(e) => show("error", &e.to_string()),
    }
}

/// A pipeline file, validated as if it sat in the fixtures directory (its
/// relative domain paths resolve there).
pub fn pipeline(data: &[u8]) {
    match dpflow::pipeline::Pipeline::parse(data, &fixtures().join("fuzz.pipeline.yaml")) {
        Ok(p) => show("pipeline", &p.name),
        Err(e) => show("error", &e.to_string()),
    }
}

/// A DP SQL catalog, loaded as if it sat in the fixtures directory.
pub fn catalog(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match dpflow::sql::Catalog::parse(text, &fixtures().join("fuzz.catalog.yaml")) {
        Ok(c) => show("catalog", &format!("{} tables", c.tables.len())),
        Err(e) => show("error", &e.to_string()),
    }
}

thread_local! {
    static ENGINE: RefCell<Option<dpflow::sql::SqlEngine>> = const { RefCell::new(None) };
}

/// SQL text through the parser, the planner, the DP plan checker and the
/// costing, against the fixed catalog (`fixtures/catalog.yaml`). Nothing is
/// executed: `cost` stops before any charge or read.
pub fn sql(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let engine = slot.get_or_insert_with(|| {
            let catalog = dpflow::sql::Catalog::load(fixtures().join("catalog.yaml")).expect("fixture catalog");
            runtime().block_on(dpflow::sql::SqlEngine::open(catalog, Some(0))).expect("engine")
        });
        match runtime().block_on(engine.cost(text, None)) {
            Ok(records) => show("sql", &format!("{} mechanisms", records.len())),
            Err(e) => show("error", &e.to_string()),
        }
    });
}

/// CSV bytes as the penguins table: parsed by Arrow's CSV reader with the
/// domain's text settings and every column as text (what `dpflow` reads),
/// then through the domain encoder, both to codes and to typed values.
pub fn csv(data: &[u8]) {
    use datafusion::arrow::csv::ReaderBuilder;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let spec = penguins();
    let schema = Arc::new(Schema::new(
        spec.domain.names().iter().map(|n| Field::new(*n, DataType::Utf8, true)).collect::<Vec<_>>(),
    ));
    let t = &spec.text;
    let mut builder = ReaderBuilder::new(schema.clone())
        .with_header(t.header)
        .with_delimiter(t.delimiter as u8)
        .with_quote(t.quote as u8)
        .with_batch_size(16);
    if let Some(c) = t.comment {
        builder = builder.with_comment(c as u8);
    }
    let Ok(reader) = builder.build(Cursor::new(data)) else { return };
    let domain = Arc::new(spec.domain.clone());
    let (Ok(mut codes), Ok(mut typed)) =
        (BatchEncoder::new(domain.clone(), &schema), BatchEncoder::new(domain, &schema))
    else {
        return;
    };
    for batch in reader {
        let Ok(batch) = batch else { return };
        if let Err(e) = codes.encode(&batch) {
            show("error", &e.to_string());
        }
        if let Err(e) = typed.typed(&batch) {
            show("error", &e.to_string());
        }
    }
}

/// Parquet bytes as an input: stored in the process's `memory://` store and
/// read by `dpflow inspect`'s code (DataFusion's Parquet scan and the domain
/// encoder), against the penguins domain.
pub fn parquet(data: &[u8]) {
    use object_store::{ObjectStoreExt, PutPayload};
    let store = dpflow::io::memory_store();
    let path = object_store::path::Path::from("fuzz/input.parquet");
    // A decoder's panic inside the guarded scan is an error, as in the binary
    // (the hook in front of libFuzzer's aborting one lets it unwind).
    dpflow_udfs::unwind::install_hook();
    runtime().block_on(async {
        store.put(&path, PutPayload::from(data.to_vec())).await.expect("memory store");
        let domain = fixtures().join("penguins.domain.yaml");
        match dpflow::eval::inspect::inspect(
            "memory:///fuzz/input.parquet",
            domain.to_str().expect("utf-8 path"),
            Some(InputFormat::Parquet),
        )
        .await
        {
            Ok(r) => show("parquet", &format!("{} rows", r.rows)),
            Err(e) => {
                let text = e.to_string();
                keep_caught_panic(&text, data);
                show("error", &text)
            }
        }
    });
}

/// With `DPFLOW_FUZZ_CAUGHT=DIR`, keeps one input per distinct location of a
/// caught decoder panic (`dpflow_udfs::unwind`) in DIR, named after the
/// location: the panics dpflow survives, to report upstream.
fn keep_caught_panic(error: &str, data: &[u8]) {
    let Some(dir) = std::env::var_os("DPFLOW_FUZZ_CAUGHT") else { return };
    let Some(at) = error.split("panicked at ").nth(1).and_then(|r| r.split_whitespace().next()) else { return };
    let name: String = at.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
    let path = Path::new(&dir).join(name);
    if !path.exists() {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(path, data);
    }
}
