//! Data-access tests (issue #2): Parquet written then read back identical,
//! object stores `file://` and `memory://`, the Adult/penguins acceptance
//! counts, and domain errors that name the file and the key.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use dpflow::domain::DomainSpec;
use dpflow::eval::inspect::inspect;
use dpflow::io::{open_input, session_context, write_parquet_stream};

fn sample_batch() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8, true),
        Field::new("i", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("b", DataType::Boolean, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![Some("a"), None, Some("ç"), Some("")])),
        Arc::new(Int64Array::from(vec![Some(1), Some(-7), None, Some(i64::MAX)])),
        Arc::new(Float64Array::from(vec![Some(0.1), None, Some(f64::MIN_POSITIVE), Some(-2.5)])),
        Arc::new(BooleanArray::from(vec![Some(true), Some(false), None, Some(true)])),
    ];
    RecordBatch::try_new(schema, cols).unwrap()
}

fn any_domain() -> DomainSpec {
    DomainSpec::parse("columns:\n  - {name: s, kind: categorical, values: [a]}\n", "t.yaml").unwrap()
}

async fn round_trip(location: &str) {
    let ctx = session_context();
    let batch = sample_batch();
    let stream =
        Box::pin(RecordBatchStreamAdapter::new(batch.schema(), futures::stream::iter(vec![Ok(batch.clone())])));
    let rows = write_parquet_stream(&ctx, location, stream).await.unwrap();
    assert_eq!(rows, 4);
    let df = open_input(&ctx, location, None, &any_domain()).await.unwrap();
    let got = df.collect().await.unwrap();
    let got = datafusion::arrow::compute::concat_batches(&got[0].schema(), &got).unwrap();
    // DataFusion may read strings as views; compare values after casting back.
    assert_eq!(got.num_rows(), 4);
    for (i, want) in batch.columns().iter().enumerate() {
        let have = datafusion::arrow::compute::cast(got.column(i), want.data_type()).unwrap();
        assert_eq!(&have, want, "column {i} differs after the round trip through {location}");
    }
}

#[tokio::test]
async fn parquet_round_trip_file_url_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/x.parquet");
    round_trip(path.to_str().unwrap()).await;
    let url = format!("file://{}", dir.path().join("y.parquet").display());
    round_trip(&url).await;
}

#[tokio::test]
async fn parquet_round_trip_memory_store() {
    round_trip("memory://bucket/test/x.parquet").await;
}

#[tokio::test]
async fn adult_acceptance_counts() {
    let d = "sample_data/adult/adult.domain.yaml";
    let r = inspect("sample_data/adult/adult.data", d, None).await.unwrap();
    assert_eq!(r.rows, 32_561);
    let nulls = |name: &str| r.columns.iter().find(|c| c.name == name).unwrap().nulls;
    assert_eq!((nulls("workclass"), nulls("occupation"), nulls("native-country")), (1_836, 1_843, 583));
    assert!(r.columns.iter().all(|c| c.out_of_domain == 0));
    // adult.test: a leading "|1x3 Cross validator" line and labels ending in '.'.
    let t = inspect("sample_data/adult/adult.test", d, None).await.unwrap();
    assert_eq!(t.rows, 16_281);
    let nulls = |name: &str| t.columns.iter().find(|c| c.name == name).unwrap().nulls;
    assert_eq!((nulls("workclass"), nulls("occupation"), nulls("native-country")), (963, 966, 274));
    assert!(t.columns.iter().all(|c| c.out_of_domain == 0), "income labels map to the same values");
    let p =
        inspect("sample_data/penguins/penguins.csv", "sample_data/penguins/penguins.domain.yaml", None).await.unwrap();
    let nulls: Vec<u64> = p.columns.iter().map(|c| c.nulls).collect();
    assert_eq!(nulls, vec![0, 0, 2, 2, 2, 2, 11, 0]);
}

#[tokio::test]
async fn local_prefixes_and_globs_read_every_file_they_name() {
    // Before the fix a local directory (`dir/`, `file://.../dir/`) was taken for
    // a file and refused, and a local glob read no rows at all.
    let dir = tempfile::tempdir().unwrap();
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    std::fs::copy("sample_data/adult/adult.data", parts.join("a.csv")).unwrap();
    std::fs::copy("sample_data/adult/adult.data", parts.join("b.csv")).unwrap();
    let d = "sample_data/adult/adult.domain.yaml";
    let csv = Some(dpflow::io::InputFormat::Csv);
    let p = parts.display().to_string();
    for (location, rows) in [
        (format!("{p}/"), 65_122),
        (format!("file://{p}/"), 65_122),
        (format!("{p}/*.csv"), 65_122),
        (format!("file://{p}/*.csv"), 65_122),
        (format!("{p}/a*"), 32_561),
    ] {
        let r = inspect(&location, d, csv).await.unwrap_or_else(|e| panic!("{location}: {e}"));
        assert_eq!(r.rows, rows, "{location}");
    }
}

#[tokio::test]
async fn domain_column_missing_from_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let dom = dir.path().join("d.yaml");
    std::fs::write(&dom, "columns:\n  - {name: species, kind: categorical, values: [Adelie]}\n  - {name: wingspan, kind: integer, bounds: [0, 9]}\n").unwrap();
    let err = inspect("sample_data/penguins/penguins.csv", dom.to_str().unwrap(), None).await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("penguins.csv") && msg.contains("\"wingspan\""), "{msg}");
}

#[tokio::test]
async fn malformed_domain_file_names_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let dom = dir.path().join("bad.yaml");
    std::fs::write(&dom, "columns:\n  - name: age\n    kind: integer\n    bounds: [10, 5]\n").unwrap();
    let err = inspect("sample_data/penguins/penguins.csv", dom.to_str().unwrap(), None).await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("bad.yaml:2") && msg.contains("columns[0] (age).bounds"), "{msg}");
    std::fs::write(&dom, "columns: [ {name: x, kind: categorical, values: [a] ").unwrap();
    let msg = format!("{:#}", DomainSpec::load(&dom).unwrap_err());
    assert!(msg.starts_with(&format!("{}:", dom.display())), "{msg}");
    let msg = format!("{:#}", DomainSpec::load(dir.path().join("missing.yaml")).unwrap_err());
    assert!(msg.contains("missing.yaml") && msg.contains("cannot read"), "{msg}");
}

#[tokio::test]
async fn missing_inputs_are_errors_not_empty_tables() {
    let dir = tempfile::tempdir().unwrap();
    for loc in [
        dir.path().join("nope.csv").display().to_string(),
        dir.path().join("nope.parquet").display().to_string(),
        format!("{}/", dir.path().join("empty-prefix").display()),
        "memory://bucket/nothing/here.parquet".to_string(),
    ] {
        let err = inspect(&loc, "sample_data/penguins/penguins.domain.yaml", None).await.unwrap_err();
        assert!(format!("{err:#}").contains("does not exist"), "{loc}: {err:#}");
    }
}

/// Found by hand and kept in fuzz/corpus/parquet: the Parquet reader (59.x)
/// panicked on a footer that claims more metadata than the file holds
/// (exit 101). Every malformed footer now gets an error naming the file,
/// from the library and from `dpflow inspect`, and nothing panics.
#[test]
fn files_that_are_not_parquet_get_an_error_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let domain = concat!(env!("CARGO_MANIFEST_DIR"), "/sample_data/adult/adult.domain.yaml");
    let cases: [(&str, &[u8], &str); 6] = [
        ("garbage.parquet", b"PAR1garbagePAR1", "claims more metadata than the file holds"),
        // Found by the `parquet` fuzz target: an embedded Arrow schema with a
        // field of type NONE made arrow-ipc panic while DataFusion inferred it.
        (
            "arrow-schema.parquet",
            include_bytes!("../../fuzz/corpus/parquet/crash-arrow-schema-type-none.parquet"),
            "embedded Arrow schema",
        ),
        // Found by the same target: a negative row-group row count, which
        // DataFusion's statistics sum (a debug build's overflow panic).
        (
            "row-count.parquet",
            include_bytes!("../../fuzz/corpus/parquet/crash-negative-row-count.parquet"),
            "impossible row count",
        ),
        ("short.parquet", b"PAR1", "shorter than a Parquet header and footer"),
        ("csv.parquet", b"a,b\n1,2\n3,4\n5,6\n", "does not end with the Parquet magic"),
        ("empty.parquet", b"", "shorter than a Parquet header and footer"),
    ];
    for (name, bytes, want) in cases {
        let f = dir.path().join(name);
        std::fs::write(&f, bytes).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpflow"))
            .args(["inspect", f.to_str().unwrap(), "--domain", domain])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(name) && err.contains("is not a valid Parquet file") && err.contains(want),
            "{name}: {err}"
        );
        assert!(!err.contains("internal error") && !err.contains("panicked"), "{name}: {err}");
    }
    // A prefix holding one bad part among good ones names the bad part.
    let prefix = dir.path().join("parts");
    std::fs::create_dir(&prefix).unwrap();
    std::fs::write(prefix.join("part-1.parquet"), b"PAR1garbagePAR1").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .args(["inspect", &format!("{}/", prefix.display()), "--domain", domain, "--input-format", "parquet"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("part-1.parquet") && err.contains("not a valid Parquet file"), "{err}");
}

/// The Parquet checks are remembered per file version in a process, not per
/// name: a file that changes after it passed is checked again.
#[tokio::test]
async fn a_parquet_file_that_changes_after_its_check_is_checked_again() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("changes.parquet");
    let domain = concat!(env!("CARGO_MANIFEST_DIR"), "/sample_data/penguins/penguins.domain.yaml");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/parquet/seed-plain.parquet"), &f).unwrap();
    let location = f.to_str().unwrap();
    assert_eq!(inspect(location, domain, None).await.unwrap().rows, 40);
    std::fs::write(&f, b"PAR1garbagePAR1").unwrap();
    let e = inspect(location, domain, None).await.unwrap_err().to_string();
    assert!(e.contains("not a valid Parquet file"), "{e}");
}
