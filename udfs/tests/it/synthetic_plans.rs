//! SyntheticExec over a released generator network (the GANs' sampler):
//! the rows do not depend on the partitioning, and the plan round-trips
//! through the datafusion-proto codec unchanged (what a cluster executor
//! receives).

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use dpflow_udfs::codec::DpflowCodec;
use dpflow_udfs::domain::{Column, DecodeMode, Domain};
use dpflow_udfs::neural::{Activation, Dense};
use dpflow_udfs::synth::{GeneratorPlan, Sampler, SyntheticExec};
use ndarray::{Array1, Array2};

fn generator() -> Sampler {
    let col = Column::categorical;
    let domain = Domain::new(vec![col("a", &["x", "y", "z"]), col("b", &["u", "v"])]).unwrap();
    // Fixed, arbitrary weights: latent 3 → 6 hidden → 5 logits.
    let dense = |i: usize, o: usize, k: f64| Dense {
        w: Array2::from_shape_fn((i, o), |(r, c)| ((r * 7 + c) as f64 * k).sin()),
        b: Array1::from_shape_fn(o, |c| (c as f64 * k).cos() * 0.1),
    };
    Sampler::from(GeneratorPlan {
        domain,
        layers: vec![dense(3, 6, 0.7), dense(6, 5, 1.3)],
        hidden: Activation::Relu,
        sizes: vec![3, 2],
        decode: DecodeMode::Uniform,
    })
}

/// Every row of every partition, as text, sorted: the multiset of rows.
async fn rows(plan: Arc<dyn ExecutionPlan>, ctx: &SessionContext) -> Vec<String> {
    let mut all = Vec::new();
    for p in 0..plan.properties().partitioning.partition_count() {
        let batches: Vec<_> =
            futures::TryStreamExt::try_collect(plan.execute(p, ctx.task_ctx()).unwrap()).await.unwrap();
        let text = pretty_format_batches(&batches).unwrap().to_string();
        all.extend(text.lines().filter(|l| l.starts_with("| ") && !l.contains(" a ")).map(String::from));
    }
    all.sort();
    all
}

#[tokio::test]
async fn a_generator_streams_the_same_rows_in_any_partitioning_and_after_a_codec_round_trip() {
    let ctx = SessionContext::new();
    let sampler = Arc::new(generator());
    let one: Arc<dyn ExecutionPlan> = Arc::new(SyntheticExec::try_new(sampler.clone(), 1000, 1, 64, 11).unwrap());
    let reference = rows(one, &ctx).await;
    assert_eq!(reference.len(), 1000);
    let four: Arc<dyn ExecutionPlan> = Arc::new(SyntheticExec::try_new(sampler.clone(), 1000, 4, 64, 11).unwrap());
    assert_eq!(rows(four.clone(), &ctx).await, reference);
    let bytes = physical_plan_to_bytes_with_extension_codec(four, &DpflowCodec).unwrap();
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &DpflowCodec).unwrap();
    assert_eq!(rows(decoded, &ctx).await, reference);
    // Another seed, other rows.
    let other: Arc<dyn ExecutionPlan> = Arc::new(SyntheticExec::try_new(sampler, 1000, 4, 64, 12).unwrap());
    assert_ne!(rows(other, &ctx).await, reference);
}
