//! `KnnDonorExec` in a physical plan: donors are nearest by brute force, and
//! the operator survives a datafusion-proto round trip (so a distributed
//! executor can run it).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Float64Array, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, UInt32Type};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionConfig;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use dpflow_udfs::codec::DpflowCodec;
use dpflow_udfs::knn::{AttrKind, ImputeScheme, KnnConfig, KnnDonorExec, KnnSpec, MatchAttr, Metric};
use dpflow_udfs::session::dpflow_context;

const N: usize = 240;

fn codes(i: usize) -> (u32, u32) {
    // Class (a, b); class (2, 3) has no donors, so its donees look further away.
    ((i % 3) as u32, ((i / 3) % 4) as u32)
}

fn missing(i: usize) -> bool {
    i.is_multiple_of(5) || codes(i) == (2, 3)
}

fn input() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::UInt32, false),
        Field::new("b", DataType::UInt32, false),
        Field::new("y", DataType::Float64, true),
        Field::new("rid", DataType::Float64, false),
    ]));
    let a = UInt32Array::from((0..N).map(|i| codes(i).0).collect::<Vec<_>>());
    let b = UInt32Array::from((0..N).map(|i| codes(i).1).collect::<Vec<_>>());
    let y = Float64Array::from((0..N).map(|i| (!missing(i)).then_some(i as f64 * 1.5)).collect::<Vec<_>>());
    let rid = Float64Array::from((0..N).map(|i| i as f64).collect::<Vec<_>>());
    RecordBatch::try_new(schema, vec![Arc::new(a), Arc::new(b), Arc::new(y), Arc::new(rid)]).unwrap()
}

fn spec() -> KnnSpec {
    KnnSpec {
        config: KnnConfig {
            attrs: vec![
                MatchAttr { name: "a".into(), kind: AttrKind::Categorical, weight: 1.0, size: 3 },
                MatchAttr { name: "b".into(), kind: AttrKind::Ordinal, weight: 1.0, size: 4 },
            ],
            metric: Metric::Euclidean,
            k: 1,
        },
        imputed: vec!["y".into()],
        rid: "rid".into(),
        scheme: ImputeScheme::Copy,
    }
}

/// (rid, y, donor rid) per output row, sorted by rid.
fn rows(batches: &[RecordBatch]) -> Vec<(f64, Option<f64>, Option<f64>)> {
    let mut out = Vec::new();
    for b in batches {
        let s = b.schema();
        let col = |n: &str| b.column(s.index_of(n).unwrap()).as_primitive::<Float64Type>().clone();
        let (rid, y, donor) = (col("rid"), col("y"), col("donor_rid"));
        for r in 0..b.num_rows() {
            out.push((rid.value(r), y.is_valid(r).then(|| y.value(r)), donor.is_valid(r).then(|| donor.value(r))));
        }
        assert_eq!(b.column(s.index_of("donee_count").unwrap()).as_primitive::<UInt32Type>().len(), b.num_rows());
    }
    out.sort_by(|x, y| x.0.total_cmp(&y.0));
    out
}

#[tokio::test]
async fn knn_donor_exec_picks_nearest_donors_and_round_trips_through_proto() {
    let ctx = dpflow_context(SessionConfig::new().with_target_partitions(1));
    let batch = input();
    let table = Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap());
    ctx.register_table("t", table).unwrap();
    let scan = ctx.table("t").await.unwrap().create_physical_plan().await.unwrap();
    let plan: Arc<dyn ExecutionPlan> = Arc::new(KnnDonorExec::try_new(scan, spec()).unwrap());
    let before = rows(&collect(plan.clone(), ctx.task_ctx()).await.unwrap());
    assert_eq!(before.len(), N);

    // Brute force: every donee's donor is a complete row at the minimum distance,
    // and the imputed value is that donor's value (copy scheme).
    let cfg = spec().config;
    let key = |i: usize| [codes(i).0, codes(i).1];
    let donors: Vec<usize> = (0..N).filter(|&i| !missing(i)).collect();
    let mut donees = 0;
    for (rid, y, donor) in &before {
        let i = *rid as usize;
        if !missing(i) {
            assert_eq!(*y, Some(i as f64 * 1.5), "complete rows pass through unchanged");
            continue;
        }
        donees += 1;
        let d = donor.expect("every donee has a donor") as usize;
        assert!(!missing(d), "donor {d} is complete");
        let best = donors.iter().map(|&j| cfg.distance(&key(i), &key(j))).fold(f64::INFINITY, f64::min);
        assert!((cfg.distance(&key(i), &key(d)) - best).abs() < 1e-12, "row {i}: donor {d} is not nearest");
        assert_eq!(*y, Some(d as f64 * 1.5), "row {i} copies its donor's value");
    }
    assert!(donees > 50);

    let bytes = physical_plan_to_bytes_with_extension_codec(plan, &DpflowCodec).unwrap();
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &DpflowCodec).unwrap();
    assert!(
        format!("{}", datafusion::physical_plan::displayable(decoded.as_ref()).indent(true)).contains("KnnDonorExec")
    );
    let after = rows(&collect(decoded, ctx.task_ctx()).await.unwrap());
    assert_eq!(before, after, "same donors and values after the round trip");
}
