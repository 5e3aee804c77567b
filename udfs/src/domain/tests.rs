use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, AsArray, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};

use super::*;
use crate::noise::DpRng;

fn cat_col(nullable: bool, policy: OutOfDomain) -> Column {
    Column {
        name: "c".into(),
        kind: ColumnKind::Categorical {
            values: vec!["a".into(), "b".into(), "c".into()],
            aliases: BTreeMap::from([("b.".to_string(), "b".to_string())]),
        },
        nullable,
        null_tokens: vec!["?".into(), "".into()],
        out_of_domain: policy,
        not_applicable_when: None,
    }
}

fn int_col(edges: Vec<i64>, nullable: bool, policy: OutOfDomain) -> Column {
    Column {
        name: "i".into(),
        kind: ColumnKind::Integer { edges },
        nullable,
        null_tokens: vec!["NA".into()],
        out_of_domain: policy,
        not_applicable_when: None,
    }
}

fn float_col(edges: Vec<f64>, nullable: bool, policy: OutOfDomain) -> Column {
    Column {
        name: "f".into(),
        kind: ColumnKind::Float { edges },
        nullable,
        null_tokens: vec![],
        out_of_domain: policy,
        not_applicable_when: None,
    }
}

fn bool_col(nullable: bool) -> Column {
    Column {
        name: "b".into(),
        kind: ColumnKind::Boolean,
        nullable,
        null_tokens: vec![],
        out_of_domain: OutOfDomain::Error,
        not_applicable_when: None,
    }
}

fn batch(cols: Vec<(&str, Arc<dyn Array>)>) -> RecordBatch {
    let fields: Vec<Field> = cols.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols.into_iter().map(|(_, a)| a).collect()).unwrap()
}

fn codes(b: &RecordBatch, i: usize) -> Vec<u32> {
    b.column(i).as_primitive::<datafusion::arrow::datatypes::UInt32Type>().values().to_vec()
}

#[test]
fn round_trip_with_nulls_for_every_kind() {
    let domain = Arc::new(
        Domain::new(vec![
            cat_col(true, OutOfDomain::Error),
            int_col(vec![0, 1, 2, 3, 4, 5], true, OutOfDomain::Error),
            float_col(vec![0.0, 0.5, 1.0], true, OutOfDomain::Error),
            bool_col(true),
        ])
        .unwrap(),
    );
    let input = batch(vec![
        ("c", Arc::new(StringArray::from(vec![Some("a"), None, Some("c"), Some(" b. ")]))),
        ("i", Arc::new(Int64Array::from(vec![Some(0), Some(4), None, Some(2)]))),
        ("f", Arc::new(Float64Array::from(vec![Some(0.25), None, Some(1.0), Some(0.5)]))),
        ("b", Arc::new(BooleanArray::from(vec![Some(true), Some(false), None, Some(true)]))),
    ]);
    let mut enc = BatchEncoder::new(domain.clone(), &input.schema()).unwrap();
    let out = enc.encode(&input).unwrap();
    assert_eq!(codes(&out, 0), vec![0, 3, 2, 1]);
    assert_eq!(codes(&out, 1), vec![0, 4, 5, 2]);
    assert_eq!(codes(&out, 2), vec![0, 2, 1, 1]);
    assert_eq!(codes(&out, 3), vec![1, 0, 2, 1]);
    assert_eq!(enc.stats().columns.iter().map(|c| c.nulls).collect::<Vec<_>>(), vec![1, 1, 1, 1]);

    let mut rng = DpRng::unsafe_seeded(1);
    let cols: Vec<Vec<u32>> = (0..4).map(|i| codes(&out, i)).collect();
    let refs: Vec<&[u32]> = cols.iter().map(|c| c.as_slice()).collect();
    let dec = decode_columns(&domain, &refs, DecodeMode::Midpoint, &mut rng).unwrap();
    let c = dec.column(0).as_string::<i32>();
    assert_eq!(
        (0..4).map(|i| c.is_valid(i).then(|| c.value(i))).collect::<Vec<_>>(),
        vec![Some("a"), None, Some("c"), Some("b")]
    );
    let i = dec.column(1).as_primitive::<Int64Type>();
    assert_eq!(i.iter().collect::<Vec<_>>(), vec![Some(0), Some(4), None, Some(2)]);
    let f = dec.column(2).as_primitive::<Float64Type>();
    assert_eq!(f.iter().collect::<Vec<_>>(), vec![Some(0.25), None, Some(0.75), Some(0.75)]);
    let b = dec.column(3).as_boolean();
    assert_eq!(b.iter().collect::<Vec<_>>(), vec![Some(true), Some(false), None, Some(true)]);
    // Nulls stay nulls, values stay values: re-encoding gives the same codes.
    let mut enc2 = BatchEncoder::new(domain.clone(), &dec.schema()).unwrap();
    let again = enc2.encode(&dec).unwrap();
    for (k, col) in cols.iter().enumerate().take(4) {
        assert_eq!(&codes(&again, k), col);
    }
}

#[test]
fn uniform_decode_stays_in_bin() {
    let col = int_col(vec![10, 20, 30], false, OutOfDomain::Error);
    let mut rng = DpRng::unsafe_seeded(2);
    let a = col.decode(&vec![1u32; 1000], DecodeMode::Uniform, &mut rng).unwrap();
    let a = a.as_primitive::<Int64Type>();
    let vals: Vec<i64> = a.values().to_vec();
    assert!(vals.iter().all(|v| (20..=29).contains(v)));
    assert!(vals.contains(&20) && vals.contains(&29));
    let f = float_col(vec![0.0, 1.0, 3.0], false, OutOfDomain::Error);
    let a = f.decode(&vec![1u32; 1000], DecodeMode::Uniform, &mut rng).unwrap();
    assert!(a.as_primitive::<Float64Type>().values().iter().all(|v| (1.0..=3.0).contains(v)));
    // A code outside the domain is an error, not a value.
    assert!(col.decode(&[2], DecodeMode::Uniform, &mut rng).is_err());
}

#[test]
fn null_tokens_in_text_input() {
    let domain = Arc::new(
        Domain::new(vec![cat_col(true, OutOfDomain::Error), int_col(vec![0, 1, 2, 3], true, OutOfDomain::Error)])
            .unwrap(),
    );
    let input = batch(vec![
        ("c", Arc::new(StringArray::from(vec![" ?", "a", "", " c"]))),
        ("i", Arc::new(StringArray::from(vec!["1", " NA ", "2", "0"]))),
    ]);
    let mut enc = BatchEncoder::new(domain, &input.schema()).unwrap();
    let out = enc.encode(&input).unwrap();
    assert_eq!(codes(&out, 0), vec![3, 0, 3, 2]);
    assert_eq!(codes(&out, 1), vec![1, 3, 2, 0]);
    assert_eq!(enc.stats().columns[0].nulls, 2);
    assert_eq!(enc.stats().columns[1].nulls, 1);
    assert_eq!(enc.stats().columns[0].out_of_domain, 0);
}

#[test]
fn out_of_domain_policies() {
    let input = |vals: Vec<Option<i64>>| batch(vec![("i", Arc::new(Int64Array::from(vals)))]);
    let data = input(vec![Some(-5), Some(1), Some(99), None]);

    // error (default): names the column, row and value.
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2, 3], true, OutOfDomain::Error)]).unwrap());
    let err = BatchEncoder::new(d, &data.schema()).unwrap().encode(&data).unwrap_err();
    assert_eq!(err.to_string(), "column \"i\", row 0: \"-5\" is outside the public domain");

    // clip: clamps to the bounds, counted as out-of-domain and clipped, not null.
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2, 3], true, OutOfDomain::Clip)]).unwrap());
    let mut e = BatchEncoder::new(d, &data.schema()).unwrap();
    let out = e.encode(&data).unwrap();
    assert_eq!(codes(&out, 0), vec![0, 1, 2, 3]);
    let s = &e.stats().columns[0];
    assert_eq!((s.nulls, s.out_of_domain, s.clipped), (1, 2, 2));

    // null: replaced by the null code, counted apart from true nulls.
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2, 3], true, OutOfDomain::Null)]).unwrap());
    let mut e = BatchEncoder::new(d, &data.schema()).unwrap();
    let out = e.encode(&data).unwrap();
    assert_eq!(codes(&out, 0), vec![3, 1, 3, 3]);
    let s = &e.stats().columns[0];
    assert_eq!((s.nulls, s.out_of_domain, s.nulled), (1, 2, 2));

    // drop-row: removes the rows; other columns are filtered alike.
    let d = Arc::new(
        Domain::new(vec![
            int_col(vec![0, 1, 2, 3], true, OutOfDomain::DropRow),
            Column { name: "j".into(), ..int_col(vec![0, 10, 20, 100], false, OutOfDomain::Error) },
        ])
        .unwrap(),
    );
    let data2 = batch(vec![
        ("i", Arc::new(Int64Array::from(vec![Some(-5), Some(1), Some(99), None]))),
        ("j", Arc::new(Int64Array::from(vec![1, 15, 25, 99]))),
    ]);
    let mut e = BatchEncoder::new(d, &data2.schema()).unwrap();
    let out = e.encode(&data2).unwrap();
    assert_eq!(codes(&out, 0), vec![1, 3]);
    assert_eq!(codes(&out, 1), vec![1, 2]);
    assert_eq!((e.stats().rows_in, e.stats().rows_out), (4, 2));
    assert_eq!(e.stats().columns[0].dropped, 2);

    // A null in a non-nullable column is never turned into a value: under `error` it
    // fails (curator checks), under every DP policy its row is dropped (never a failure).
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2, 3], false, OutOfDomain::Error)]).unwrap());
    let err = BatchEncoder::new(d, &data.schema()).unwrap().encode(&input(vec![Some(1), None])).unwrap_err();
    assert!(err.to_string().contains("row 1: NULL is null but the column is not nullable"), "{err}");
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2, 3], false, OutOfDomain::Clip)]).unwrap());
    let mut e = BatchEncoder::new(d, &data.schema()).unwrap();
    let out = e.encode(&input(vec![Some(1), None])).unwrap();
    assert_eq!((codes(&out, 0), e.stats().columns[0].dropped), (vec![1], 1));

    // Text that is not a number cannot be clipped: its row is dropped.
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2, 3], false, OutOfDomain::Clip)]).unwrap());
    let t = batch(vec![("i", Arc::new(StringArray::from(vec!["1", "x"])))]);
    let mut e = BatchEncoder::new(d, &t.schema()).unwrap();
    let out = e.encode(&t).unwrap();
    assert_eq!((codes(&out, 0), e.stats().columns[0].dropped), (vec![1], 1));
}

#[test]
fn invalid_columns_are_rejected() {
    assert!(Domain::new(vec![cat_col(false, OutOfDomain::Clip)]).is_err());
    assert!(Domain::new(vec![int_col(vec![0, 1, 2], false, OutOfDomain::Null)]).is_err());
    assert!(Domain::new(vec![int_col(vec![3, 2], false, OutOfDomain::Error)]).is_err());
    assert!(Domain::new(vec![cat_col(false, OutOfDomain::Error), cat_col(true, OutOfDomain::Error)]).is_err());
}

#[test]
fn missing_input_column_is_named() {
    let d = Arc::new(Domain::new(vec![bool_col(false)]).unwrap());
    let s = Schema::new(vec![Field::new("zq17", DataType::Boolean, true)]);
    let err = BatchEncoder::new(d, &s).err().unwrap();
    // Named, without the input's column names (in a headerless file they are a data row).
    assert!(err.to_string().starts_with("column \"b\" of the domain is not in the input;"), "{err}");
    assert!(!err.to_string().contains("zq17"), "{err}");
}

#[test]
fn binned_float_edges_and_uniform_width() {
    let d = Arc::new(
        Domain::new(vec![float_col(vec![0.0, 0.1, 0.2, 0.30000000000000004], false, OutOfDomain::Error)]).unwrap(),
    );
    let b = batch(vec![("f", Arc::new(Float64Array::from(vec![0.0, 0.1, 0.15, 0.30000000000000004])))]);
    let out = BatchEncoder::new(d, &b.schema()).unwrap().encode(&b).unwrap();
    assert_eq!(codes(&out, 0), vec![0, 1, 1, 2]);
    let _ = UInt32Array::from(vec![0u32]);
}

#[tokio::test]
async fn encoded_table_projection_keeps_the_drop_row_set() {
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;
    // i: drop-row (two rows out of domain); j: error policy with one bad value; k: clean.
    let data = batch(vec![
        ("i", Arc::new(Int64Array::from(vec![Some(-5), Some(1), Some(99), None, Some(2)]))),
        ("j", Arc::new(Int64Array::from(vec![1, 15, 25, 99, 5000]))),
        ("k", Arc::new(Int64Array::from(vec![0, 1, 2, 3, 0]))),
    ]);
    let domain = Arc::new(
        Domain::new(vec![
            int_col(vec![0, 1, 2, 3], true, OutOfDomain::DropRow),
            Column { name: "j".into(), ..int_col(vec![0, 10, 20, 100], false, OutOfDomain::Error) },
            Column { name: "k".into(), ..int_col(vec![0, 1, 2, 3, 4], false, OutOfDomain::Error) },
        ])
        .unwrap(),
    );
    let mem = Arc::new(MemTable::try_new(data.schema(), vec![vec![data]]).unwrap());
    let ctx = SessionContext::new();
    ctx.register_table("t", Arc::new(EncodedTable::typed(mem, domain).unwrap())).unwrap();
    let rows = |q: &'static str| {
        let ctx = ctx.clone();
        async move {
            let b = ctx.sql(q).await.unwrap().collect().await.unwrap();
            b.iter().map(|b| b.num_rows()).sum::<usize>()
        }
    };
    // Rows 0 and 2 are dropped for every projection, including one that does not read i.
    assert_eq!(rows("SELECT k FROM t").await, 3);
    assert_eq!(rows("SELECT i, k FROM t").await, 3);
    let n = ctx.sql("SELECT count(*) AS n FROM t").await.unwrap().collect().await.unwrap();
    assert_eq!(n[0].column(0).as_primitive::<Int64Type>().value(0), 3);
    // j (error policy) is validated by the queries that read it.
    let err = ctx.sql("SELECT j FROM t").await.unwrap().collect().await.unwrap_err();
    assert!(err.to_string().contains("outside the public domain"), "{err}");
}

/// The vectorised pass-through (all values canonical) and the row-by-row path
/// give the same typed values: the same batch with one alias, null token or
/// clipped value added takes the row path, and the shared rows must agree.
#[test]
fn typed_fast_and_row_paths_agree() {
    use datafusion::arrow::array::{Float32Array, StringViewArray};
    let domain = Arc::new(
        Domain::new(vec![
            cat_col(true, OutOfDomain::Error),
            int_col(vec![0, 10, 20, 100], true, OutOfDomain::Clip),
            float_col(vec![0.0, 0.5, 1.0], false, OutOfDomain::Error),
            bool_col(true),
        ])
        .unwrap(),
    );
    let make = |c: Vec<Option<&str>>, i: Vec<Option<i64>>, f: Vec<f32>, b: Vec<Option<bool>>| {
        batch(vec![
            ("c", Arc::new(StringViewArray::from(c))),
            ("i", Arc::new(Int64Array::from(i))),
            ("f", Arc::new(Float32Array::from(f))),
            ("b", Arc::new(BooleanArray::from(b))),
        ])
    };
    let canonical = make(
        vec![Some("a"), None, Some("c"), Some("b")],
        vec![Some(0), Some(99), None, Some(42)],
        vec![0.0, 0.25, 1.0, 0.75],
        vec![Some(true), None, Some(false), Some(true)],
    );
    // Extra row: alias "b." (categorical), 150 clipped to 99 (integer).
    let messy = make(
        vec![Some("a"), None, Some("c"), Some("b"), Some("b.")],
        vec![Some(0), Some(99), None, Some(42), Some(150)],
        vec![0.0, 0.25, 1.0, 0.75, 0.5],
        vec![Some(true), None, Some(false), Some(true), None],
    );
    let mut e = BatchEncoder::new(domain.clone(), &canonical.schema()).unwrap();
    let fast = e.typed(&canonical).unwrap();
    assert_eq!(e.stats().columns[0].nulls, 1);
    let mut e = BatchEncoder::new(domain, &messy.schema()).unwrap();
    let slow = e.typed(&messy).unwrap();
    assert_eq!(fast.schema(), slow.schema());
    for c in 0..4 {
        assert_eq!(fast.column(c).as_ref(), slow.column(c).slice(0, 4).as_ref(), "column {c}");
    }
    assert_eq!(slow.column(0).as_string_view().value(4), "b");
    assert_eq!(slow.column(1).as_primitive::<Int64Type>().value(4), 99);
    // Out of bounds under `error` is still refused when it is the only problem.
    let bad = make(vec![Some("a")], vec![Some(1)], vec![1.5], vec![None]);
    let d = Arc::new(Domain::new(vec![float_col(vec![0.0, 0.5, 1.0], false, OutOfDomain::Error)]).unwrap());
    assert!(BatchEncoder::new(d, &bad.schema()).unwrap().typed(&bad).is_err());
}

#[test]
fn an_unreadable_input_type_fails_at_construction_not_on_a_row() {
    // Booleans under an integer kind: refused from the schema alone, so a file whose
    // flags are all null fails exactly like one with a true flag.
    let d = Arc::new(Domain::new(vec![int_col(vec![0, 1, 2], true, OutOfDomain::DropRow)]).unwrap());
    let s = Schema::new(vec![Field::new("i", DataType::Boolean, true)]);
    assert!(matches!(BatchEncoder::new(d, &s), Err(EncodeError::BadType { .. })));
}
