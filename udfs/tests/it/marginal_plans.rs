//! MarginalExec in plans: the SQL table function, the logical node through the
//! extension planner, agreement with DataFusion GROUP BY and brute force, and
//! a datafusion-proto round trip of the physical plan.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::*;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use dpflow_udfs::codec::DpflowCodec;
use dpflow_udfs::domain::{Column, ColumnKind, Domain, EncodedTable, OutOfDomain};
use dpflow_udfs::marginal::{MarginalNode, MarginalsFunction, NullMode, batch_to_counts, config_for, parse_sets};
use dpflow_udfs::session::dpflow_context;

fn raw_data() -> RecordBatch {
    // 600 rows; x has nulls, y never null, z is entirely null.
    let n = 600;
    let x: Vec<Option<&str>> = (0..n)
        .map(|i| match i % 7 {
            0 => None,
            1 | 2 => Some("b"),
            3 => Some("c"),
            _ => Some("a"),
        })
        .collect();
    let y: Vec<i64> = (0..n).map(|i| (i * 31 % 5) as i64).collect();
    let z: Vec<Option<&str>> = vec![None; n];
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("x", DataType::Utf8, true),
            Field::new("y", DataType::Int64, false),
            Field::new("z", DataType::Utf8, true),
        ])),
        vec![Arc::new(StringArray::from(x)), Arc::new(Int64Array::from(y)), Arc::new(StringArray::from(z))],
    )
    .unwrap()
}

fn domain() -> Arc<Domain> {
    let cat = |name: &str, vals: &[&str], nullable: bool| Column {
        name: name.into(),
        kind: ColumnKind::Categorical {
            values: vals.iter().map(|s| s.to_string()).collect(),
            aliases: Default::default(),
        },
        nullable,
        null_tokens: vec![],
        out_of_domain: OutOfDomain::Error,
        not_applicable_when: None,
    };
    Arc::new(
        Domain::new(vec![
            cat("x", &["a", "b", "c"], true),
            Column {
                name: "y".into(),
                kind: ColumnKind::Integer { edges: vec![0, 1, 2, 3, 4, 5] },
                nullable: false,
                null_tokens: vec![],
                out_of_domain: OutOfDomain::Error,
                not_applicable_when: None,
            },
            cat("z", &["p", "q"], true),
        ])
        .unwrap(),
    )
}

fn setup() -> (SessionContext, Arc<EncodedTable>, Arc<MarginalsFunction>) {
    let ctx = dpflow_context(SessionConfig::new().with_target_partitions(3));
    let batch = raw_data();
    // Three partitions of uneven size.
    let parts = vec![vec![batch.slice(0, 100)], vec![batch.slice(100, 350)], vec![batch.slice(450, 150)]];
    let raw = Arc::new(MemTable::try_new(batch.schema(), parts).unwrap());
    ctx.register_table("raw", raw.clone()).unwrap();
    let enc = Arc::new(EncodedTable::try_new(raw, domain()).unwrap());
    ctx.register_table("raw_encoded", enc.clone()).unwrap();
    let f = Arc::new(MarginalsFunction::new());
    f.register("raw", enc.clone());
    ctx.register_udtf("marginals", f.clone());
    (ctx, enc, f)
}

/// Brute-force marginal over codes, from the raw rows.
fn brute(attrs: &[&str], mode: NullMode) -> (Vec<u64>, u64) {
    let b = raw_data();
    let d = domain();
    let code = |col: &str, row: usize| -> u32 {
        let c = d.column(col).unwrap();
        let a = b.column(b.schema().index_of(col).unwrap());
        if a.is_null(row) {
            return c.null_code().unwrap();
        }
        match &c.kind {
            ColumnKind::Categorical { values, .. } => {
                let v = a.as_string::<i32>().value(row);
                values.iter().position(|x| x == v).unwrap() as u32
            }
            _ => a.as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(row) as u32,
        }
    };
    let sizes: Vec<u32> = attrs
        .iter()
        .map(|a| {
            let c = d.column(a).unwrap();
            if mode == NullMode::Observed && c.nullable { c.size() as u32 } else { c.cardinality() as u32 }
        })
        .collect();
    let mut counts = vec![0u64; sizes.iter().product::<u32>() as usize];
    let mut observed = 0;
    'r: for row in 0..b.num_rows() {
        let mut idx = 0u32;
        for (k, a) in attrs.iter().enumerate() {
            let c = code(a, row);
            if mode == NullMode::Observed && Some(c) == d.column(a).unwrap().null_code() {
                continue 'r;
            }
            idx = idx * sizes[k] + c;
        }
        counts[idx as usize] += 1;
        observed += 1;
    }
    (counts, observed)
}

const SETS: &str = "x; y; z; x,y; y,x; x,z; x,y,z";

#[tokio::test]
async fn table_function_matches_brute_force_in_both_modes() {
    let (ctx, _, _) = setup();
    for mode in ["cells", "observed"] {
        let batches = ctx
            .sql(&format!("SELECT * FROM marginals('raw', '{SETS}', '{mode}') ORDER BY set_index"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let m = if mode == "cells" { NullMode::Cells } else { NullMode::Observed };
        let got: Vec<_> = batches.iter().flat_map(|b| batch_to_counts(b).unwrap()).collect();
        let sets = parse_sets(SETS, m).unwrap();
        assert_eq!(got.len(), sets.len());
        for ((_, counts, obs), (attrs, _)) in got.iter().zip(&sets) {
            let names: Vec<&str> = attrs.iter().map(|s| s.as_str()).collect();
            assert_eq!((counts.clone(), *obs), brute(&names, m), "{names:?} {mode}");
        }
    }
}

#[tokio::test]
async fn agrees_with_group_by() {
    let (ctx, _, _) = setup();
    let b = ctx.sql("SELECT * FROM marginals('raw', 'x,y')").await.unwrap().collect().await.unwrap();
    let (_, counts, _) = batch_to_counts(&b[0]).unwrap().remove(0);
    let g = ctx.sql("SELECT x, y, count(*) AS n FROM raw GROUP BY x, y").await.unwrap().collect().await.unwrap();
    let mut by_key: HashMap<(Option<String>, i64), u64> = HashMap::new();
    for batch in &g {
        let x = datafusion::arrow::compute::cast(batch.column(0), &DataType::Utf8).unwrap();
        let x = x.as_string::<i32>();
        let y = batch.column(1).as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let n = batch.column(2).as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        for i in 0..batch.num_rows() {
            by_key.insert((x.is_valid(i).then(|| x.value(i).to_string()), y.value(i)), n.value(i) as u64);
        }
    }
    let labels = [Some("a"), Some("b"), Some("c"), None];
    for (xi, xl) in labels.iter().enumerate() {
        for y in 0..5 {
            let want = by_key.get(&(xl.map(|s| s.to_string()), y)).copied().unwrap_or(0);
            assert_eq!(counts[xi * 5 + y as usize], want, "cell x={xl:?} y={y}");
        }
    }
}

#[tokio::test]
async fn logical_node_plans_through_extension_planner() {
    let (ctx, enc, _) = setup();
    let scan = ctx.table("raw_encoded").await.unwrap().into_unoptimized_plan();
    let config = config_for(enc.domain(), &parse_sets("x,y; observed:x,z", NullMode::Cells).unwrap()).unwrap();
    let plan = MarginalNode::try_new(scan, config).unwrap().into_plan();
    let plan = LogicalPlanBuilder::from(plan).build().unwrap();
    let df = ctx.execute_logical_plan(plan).await.unwrap();
    let batches = df.collect().await.unwrap();
    let got: Vec<_> = batches.iter().flat_map(|b| batch_to_counts(b).unwrap()).collect();
    assert_eq!((got[0].1.clone(), got[0].2), brute(&["x", "y"], NullMode::Cells));
    assert_eq!((got[1].1.clone(), got[1].2), brute(&["x", "z"], NullMode::Observed));
    assert_eq!(got[1].2, 0, "z is all null: no row observed on (x, z)");
}

#[tokio::test]
async fn empty_input_gives_zero_vectors() {
    let ctx = dpflow_context(SessionConfig::new());
    let b = raw_data().slice(0, 0);
    let raw = Arc::new(MemTable::try_new(b.schema(), vec![vec![b]]).unwrap());
    let enc = Arc::new(EncodedTable::try_new(raw, domain()).unwrap());
    let f = Arc::new(MarginalsFunction::new());
    f.register("e", enc);
    ctx.register_udtf("marginals", f);
    let out = ctx.sql("SELECT * FROM marginals('e', 'x,y')").await.unwrap().collect().await.unwrap();
    let got = batch_to_counts(&out[0]).unwrap();
    assert_eq!(got[0].1, vec![0; 20]);
    assert_eq!(got[0].2, 0);
    // Unknown tables and columns are plan errors.
    assert!(ctx.sql("SELECT * FROM marginals('nope', 'x')").await.is_err());
    assert!(ctx.sql("SELECT * FROM marginals('e', 'w')").await.is_err());
}

#[tokio::test]
async fn physical_plan_round_trips_through_proto() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.parquet");
    let batch = raw_data();
    {
        let file = std::fs::File::create(&path).unwrap();
        let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    let ctx = dpflow_context(SessionConfig::new().with_target_partitions(2));
    ctx.register_parquet("raw", path.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    let raw = ctx.table_provider("raw").await.unwrap();
    let enc = Arc::new(EncodedTable::try_new(raw, domain()).unwrap());
    let f = Arc::new(MarginalsFunction::new());
    f.register("raw", enc);
    ctx.register_udtf("marginals", f);
    let df = ctx.sql("SELECT * FROM marginals('raw', 'x,y; observed:x')").await.unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let before = datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx()).await.unwrap();
    let bytes = physical_plan_to_bytes_with_extension_codec(plan, &DpflowCodec).unwrap();
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &DpflowCodec).unwrap();
    let after = datafusion::physical_plan::collect(decoded, ctx.task_ctx()).await.unwrap();
    let a: Vec<_> = before.iter().flat_map(|b| batch_to_counts(b).unwrap()).collect();
    let b: Vec<_> = after.iter().flat_map(|b| batch_to_counts(b).unwrap()).collect();
    assert_eq!(a, b);
    assert_eq!(a[0].1.iter().sum::<u64>(), 600);
}

#[tokio::test]
async fn typed_table_projection() {
    let ctx = dpflow_context(SessionConfig::new().with_target_partitions(2));
    let batch = raw_data();
    let raw = Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap());
    let t = Arc::new(EncodedTable::typed(raw, domain()).unwrap());
    ctx.register_table("t", t).unwrap();
    let b = ctx.sql("SELECT x, count(*) FROM t GROUP BY x").await.unwrap().collect().await.unwrap();
    assert!(!b.is_empty());
    let b = ctx.sql("SELECT y FROM t").await.unwrap().collect().await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 600);
}

#[tokio::test]
async fn fill_operator_round_trips_through_proto() {
    use dpflow_udfs::domain::EncodeExec;
    use dpflow_udfs::marginal::plan_marginals;
    use dpflow_udfs::synth::{ColumnFill, FillNullsExec, FillPlan};
    let ctx = dpflow_context(SessionConfig::new().with_target_partitions(2));
    let batch = raw_data();
    let raw = Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap());
    ctx.register_table("raw", raw).unwrap();
    let scan = ctx.table("raw").await.unwrap().create_physical_plan().await.unwrap();
    let d = domain();
    let enc = Arc::new(EncodeExec::try_new(scan, d.clone()).unwrap());
    // x's nulls become "c" (code 2); z's nulls uniform over its values.
    let fills = vec![ColumnFill::Constant(2), ColumnFill::Keep, ColumnFill::Uniform];
    let plan = Arc::new(FillPlan { domain: d.as_ref().clone(), fills, model: None, seed: 9 });
    let fill: Arc<dyn datafusion::physical_plan::ExecutionPlan> = Arc::new(FillNullsExec::try_new(enc, plan).unwrap());
    let config = config_for(&d, &parse_sets("x; z", NullMode::Observed).unwrap()).unwrap();
    let m = plan_marginals(fill, config).unwrap();
    let before = datafusion::physical_plan::collect(m.clone(), ctx.task_ctx()).await.unwrap();
    let bytes = physical_plan_to_bytes_with_extension_codec(m, &DpflowCodec).unwrap();
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &DpflowCodec).unwrap();
    let after = datafusion::physical_plan::collect(decoded, ctx.task_ctx()).await.unwrap();
    let a: Vec<_> = before.iter().flat_map(|b| batch_to_counts(b).unwrap()).collect();
    let b: Vec<_> = after.iter().flat_map(|b| batch_to_counts(b).unwrap()).collect();
    assert_eq!(a, b, "same seed, same fills after the round trip");
    // Every row is observed after filling; x's 86 nulls (i % 7 == 0) all went to "c".
    assert_eq!(a[0].2, 600);
    let nulls = (0..600).filter(|i| i % 7 == 0).count() as u64;
    let c_rows = (0..600).filter(|i| i % 7 == 3).count() as u64;
    assert_eq!(a[0].1[2], c_rows + nulls);
    assert_eq!(a[1].2, 600);
}
