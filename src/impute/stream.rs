//! kNN imputation streamed over record batches (issue 19 item 3), in
//! partitions of the input (issue 21): two passes, with memory bounded by the
//! donor classes and the donees, never by the rows.
//!
//! The donor search, the aggregation and the merge are
//! [`dpflow_udfs::knn::pass`] (its module doc states the rule and why the
//! partitioned passes choose exactly the donors of one pass in file order);
//! each pass is one [`KnnPassExec`] over the raw scan, run where the session
//! says: on this machine's cores, or one task per partition on a cluster's
//! executors, which return classes, partial aggregates and donee intervals,
//! never rows. Here: the levels of the donee classes between the passes, the
//! merge, and L1_R(D) of every released number.
//!
//! The partitions must be contiguous stretches of the input in file order,
//! since identifiers are row numbers: a scan DataFusion splits any other way
//! is read as one partition instead ([`in_file_order`]).
//!
//! The result is the same [`Summary`] as the in-memory imputation's
//! (`Imputed::summarize` in `reference.rs`), exactly: sums are exact
//! integers on a public grid, so the order in which donees are added does
//! not matter (tested, with the input split into partitions and batches).

use std::sync::Arc;

use dpflow_udfs::knn::pass::{
    ClassCount, Compiled, KnnIndex, KnnRead, NONE, interval_table, merge_classes, merge_partials, push_interval,
};
use dpflow_udfs::knn::{ClassView, KnnConfig, KnnError, KnnPassExec, KnnPassOutput, KnnStage, PartDonees};
use futures::StreamExt;
use rayon::prelude::*;

use super::spec::{Imputation, QuerySpec};
use super::summary::{Columns, QuerySummary, Summary};
use super::{ImputeError, Result};
use crate::dataset::Dataset;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// The streamed imputation's summary of `queries` (the release paths' entry).
pub(crate) async fn summarize(
    ctx: &SessionContext,
    ds: &Dataset,
    imp: &Imputation,
    queries: &[QuerySpec],
    enumerate_limit: u64,
) -> Result<Summary> {
    if imp.knn.k != 1 {
        return Err(KnnError::UnsupportedK(imp.knn.k).into());
    }
    let domain = ds.domain();
    let cols = Columns::of(&imp.columns, queries);
    let mut rules = Vec::new();
    for name in &imp.columns {
        if let Some(rule) = crate::domain::NotApplicable::compile(domain, name)? {
            rules.push((name.clone(), rule.rule()));
        }
    }
    for (c, _) in &imp.grouping {
        if domain.position(c).is_none() {
            return Err(crate::dataset::DatasetError::UnknownColumn(c.clone()).into());
        }
    }
    // Each pass plans its own scan (a plan's scan keeps state from its run),
    // with the session the split in file order was found for.
    let (pctx, scan) = scan_in_file_order(ctx, ds).await?;
    let partitions = scan.output_partitioning().partition_count();
    let read = KnnRead {
        domain: domain.clone(),
        columns: cols.names.clone(),
        imputed: imp.columns.clone(),
        grouping: imp.grouping.clone(),
        groups: dpflow_udfs::knn::file_groups(&scan),
    };

    // Pass 1: the class index.
    let pass = Arc::new(KnnPassExec::try_new(scan, read.clone(), rules.clone(), KnnStage::Classes)?);
    let mut out = KnnPassOutput::default();
    let mut stream = dpflow_udfs::cluster::execute_stream(pass, &pctx).await?;
    while let Some(batch) = stream.next().await {
        KnnPassExec::decode(&batch?, &mut out, &mut |_| {
            Err(datafusion::common::DataFusionError::Internal("the first pass returned an interval".into()))
        })?;
    }
    let counts = out.classes(partitions)?;
    let rows: Vec<u64> = counts.iter().map(|c| c.rows).collect();
    let (classes, offsets) = merge_classes(&counts);
    drop(counts);
    if rows.iter().sum::<u64>() >= 1 << 53 {
        // Identifiers are f64 row numbers, exact below 2^53.
        return Err(ImputeError::Internal(
            "an imputation input of 2^53 rows or more is beyond kNN imputation's identifiers",
        ));
    }
    let levels = levels(&imp.knn, &classes);
    let index = Arc::new(KnnIndex {
        queries: queries.to_vec(),
        keys: classes.iter().map(|c| c.key.clone()).collect(),
        watchers: levels.watchers,
        has_level: levels.wrap.iter().map(Option::is_some).collect(),
        offsets,
        rows,
    });

    // Pass 2: impute and aggregate per partition; the intervals are filed as
    // they arrive, then the partials are merged in file order.
    let scan = ds.raw(&pctx).await?.create_physical_plan().await?;
    if scan.output_partitioning().partition_count() != partitions || dpflow_udfs::knn::file_groups(&scan) != read.groups
    {
        return Err(ImputeError::Internal("the imputation input is partitioned differently in its two passes"));
    }
    let pass = Arc::new(KnnPassExec::try_new(scan, read.clone(), rules, KnnStage::Impute(index.clone()))?);
    let compiled = Compiled::new(queries, &read);
    let mut per_part = interval_table(&compiled, &index);
    let mut out = KnnPassOutput::default();
    let mut stream = dpflow_udfs::cluster::execute_stream(pass, &pctx).await?;
    while let Some(batch) = stream.next().await {
        KnnPassExec::decode(&batch?, &mut out, &mut |iv| push_interval(&mut per_part, iv))?;
    }
    let first_donor: Vec<u64> = classes.iter().map(|c| c.first_donor).collect();
    let merged = merge_partials(&compiled, &index, &first_donor, &levels.wrap, out.partials()?, per_part)?;
    let total: u64 = classes.iter().map(|c| c.donees).sum();
    if total != merged.seen {
        return Err(ImputeError::Internal("the imputation input changed between its two reads"));
    }

    // L1_R(D) of every smooth number.
    let has_donor: Vec<bool> = classes.iter().map(|c| c.donors > 0).collect();
    let view = ClassView { classes: &index.keys, has_donor: &has_donor, dmin: &levels.dmin };
    let asked: Vec<PartDonees<'_>> = merged
        .per_part
        .iter()
        .zip(&merged.remove_donor)
        .map(|(d, &remove_donor)| PartDonees { donees: d, remove_donor })
        .collect();
    let l1s = view.l1_many(&imp.knn, &asked, enumerate_limit, true);
    let mut out = Vec::with_capacity(queries.len());
    let mut f = 0;
    for (q, (imputed, ignore)) in compiled.queries().iter().zip(merged.aggs) {
        let mut l1 = vec![None; q.parts()];
        let mut donees_inside = vec![0u64; q.parts()];
        for i in q.smooth_parts() {
            l1[i] = Some(l1s[f]);
            donees_inside[i] = merged.inside[f];
            f += 1;
        }
        out.push(QuerySummary { imputed, ignore, l1, donees_inside });
    }
    Ok(Summary { queries: out, donees: total })
}

/// The raw scan of `ds` in partitions that are contiguous stretches of its
/// files in order, and the session it was planned with: the session's own
/// split when it is one; else whole files (DataFusion splits a CSV file at
/// line ends without reading quotes); else one partition in file order.
async fn scan_in_file_order(ctx: &SessionContext, ds: &Dataset) -> Result<(SessionContext, Arc<dyn ExecutionPlan>)> {
    let whole_files = {
        let config = ctx.copied_config().with_repartition_file_scans(false);
        let state =
            datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state()).with_config(config).build();
        SessionContext::new_with_state(state)
    };
    for c in [ctx.clone(), whole_files] {
        let plan = ds.raw(&c).await?.create_physical_plan().await?;
        if in_file_order(&plan) {
            return Ok((c, plan));
        }
    }
    let ordered = super::ordered_context(ctx);
    let plan = ds.raw(&ordered).await?.create_physical_plan().await?;
    Ok((ordered, plan))
}

/// Whether the partitions of `plan` are contiguous stretches of its files in
/// the files' order: a chain of order-keeping operators over one file scan
/// whose file groups, read one after another, visit each file once, its
/// byte ranges in increasing order (file listings and ranges are public);
/// byte ranges only of Parquet files (row groups: a CSV range starts at the
/// first line end, quoted or not).
pub(crate) fn in_file_order(plan: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::datasource::physical_plan::FileScanConfig;
    use datafusion::datasource::source::DataSourceExec;
    let n = plan.output_partitioning().partition_count();
    let mut node = plan.clone();
    loop {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>() {
            let Some(conf) = scan.data_source().downcast_ref::<FileScanConfig>() else { return false };
            if conf.file_groups.len() != n {
                return false;
            }
            let ranges_ok = conf.file_source().file_type() == "parquet";
            let mut seen = std::collections::HashSet::new();
            let mut last: Option<(&object_store::path::Path, i64)> = None;
            for f in conf.file_groups.iter().flat_map(|g| g.files()) {
                if f.range.is_some() && !ranges_ok {
                    return false;
                }
                let (loc, start) = (&f.object_meta.location, f.range.as_ref().map_or(0, |r| r.start));
                match last {
                    Some((l, s)) if l == loc => {
                        if start <= s {
                            return false;
                        }
                    }
                    _ => {
                        if !seen.insert(loc) {
                            return false;
                        }
                    }
                }
                last = Some((loc, start));
            }
            return true;
        }
        let children = node.children();
        let [child] = children.as_slice() else { return false };
        if child.output_partitioning().partition_count() != n
            || !node.maintains_input_order().first().copied().unwrap_or(false)
        {
            return false;
        }
        let child = (*child).clone();
        node = child;
    }
}

/// Each donee class's level: its nearest donor distance dmin, the donor
/// classes at that distance (as watcher lists), and the class of the level's
/// first donor in the file (k = 1).
struct Levels {
    /// Nearest donor distance per class (∞ without a donor anywhere; set for donee classes).
    dmin: Vec<f64>,
    /// Per donor class: the donee classes whose level holds it.
    watchers: Vec<Vec<u32>>,
    /// Per donee class: the class of its level's first donor (None: no donor anywhere).
    wrap: Vec<Option<u32>>,
}

fn levels(cfg: &KnnConfig, classes: &[ClassCount]) -> Levels {
    let donor_classes: Vec<usize> = (0..classes.len()).filter(|&c| classes[c].donors > 0).collect();
    // With every weight positive, distinct keys are at a positive distance: a
    // class holding donors is its own donees' only nearest donor class (the
    // census-scale case, where a scan of all pairs was most of the work).
    let positive = cfg.distinct_keys_apart();
    // Per class with donees: (dmin, level); the distances of the other pairs, on all cores.
    let found: Vec<(f64, Vec<u32>)> = (0..classes.len())
        .into_par_iter()
        .map(|c| {
            if classes[c].donees == 0 {
                return (f64::INFINITY, Vec::new());
            }
            if positive && classes[c].donors > 0 {
                return (0.0, vec![c as u32]);
            }
            let mut nearest = f64::INFINITY;
            let mut level = Vec::new();
            for &d in &donor_classes {
                let x = cfg.distance(&classes[c].key, &classes[d].key);
                if x < nearest {
                    nearest = x;
                    level.clear();
                }
                if x == nearest {
                    level.push(d as u32);
                }
            }
            (nearest, level)
        })
        .collect();
    let mut watchers = vec![Vec::new(); classes.len()];
    let mut wrap = vec![None; classes.len()];
    let mut dmin = vec![f64::INFINITY; classes.len()];
    for (c, (d, level)) in found.into_iter().enumerate() {
        dmin[c] = d;
        wrap[c] = level
            .iter()
            .copied()
            .filter(|&l| classes[l as usize].first_donor != NONE)
            .min_by_key(|&l| classes[l as usize].first_donor);
        for l in level {
            watchers[l as usize].push(c as u32);
        }
    }
    Levels { dmin, watchers, wrap }
}

#[cfg(test)]
mod tests {
    //! The streamed summary equals the in-memory imputation's on random
    //! tables with both kinds of null, donor-less classes, predicates on
    //! imputed and observed columns, every kind of query, small batches (so
    //! donees wait across batches and wrap around), and both ways of bounding
    //! case (d) of L1(D).
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::impute::spec::ImputeSpec;

    const DOMAIN: &str = "columns:
  - {name: a, kind: integer, bounds: [0, 9]}
  - {name: s, kind: categorical, values: [p, q, r], nullable: true}
  - {name: y, kind: integer, bounds: [0, 100], nullable: true}
  - {name: v, kind: float, bins: {edges: [0, 10, 25, 50]}, nullable: true, not_applicable_when: \"a < 2\"}
  - {name: z, kind: integer, bounds: [0, 9], nullable: true}
";

    const SPEC: &str = "input: t.csv
domain: d.yaml
impute: [y, v]
match:
  - {column: a, kind: ordinal, group: 3}
  - {column: s}
metric: euclidean
budget: {epsilon: 4.2}
queries:
  - {name: all, count: {}}
  - {name: mid_y, count: {}, where: {y: [20, 80]}}
  - {name: v_share, proportion: {numerator: {v: [10, null]}}, where: {z: [0, 5]}}
  - {name: y_mean, mean: {value: y, lo: 0, hi: 100}, where: {a: [3, 9]}}
  - {name: v_var, variance: {value: v, lo: 0, hi: 50}, where: {y: [0, 60]}}
  - {name: z_mean, mean: {value: z, lo: 0, hi: 9}, where: {a: [0, 4]}}
";

    fn table(rng: &mut SmallRng, n: usize) -> String {
        let (py, pv, pz, ps) = (rng.random::<f64>() * 0.9, rng.random::<f64>() * 0.5, 0.2, 0.1);
        let mut s = String::from("a,s,y,v,z\n");
        for _ in 0..n {
            let a = rng.random_range(0..10u32);
            let cell = |rng: &mut SmallRng, p: f64, x: String| if rng.random::<f64>() < p { String::new() } else { x };
            let (sv, y) = (["p", "q", "r"][rng.random_range(0..3usize)].to_string(), rng.random_range(0..=100u32));
            let (v, z) = (rng.random::<f64>() * 50.0, rng.random_range(0..10u32));
            let sv = cell(rng, ps, sv);
            let y = cell(rng, py, y.to_string());
            // Full precision: values cross the partials as JSON and must come back bit for bit.
            let v = cell(rng, pv, format!("{v}"));
            let z = cell(rng, pz, z.to_string());
            s += &format!("{a},{sv},{y},{v},{z}\n");
        }
        s
    }

    /// `t.csv` of `dir` as `t.parquet`, in row groups of `group_rows` (a
    /// Parquet file is split into byte ranges at row groups).
    async fn to_parquet(dir: &std::path::Path, group_rows: usize) {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let ctx = SessionContext::new();
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("y", DataType::Int64, true),
            Field::new("v", DataType::Float64, true),
            Field::new("z", DataType::Int64, true),
        ]);
        let csv = dir.join("t.csv");
        let options = datafusion::prelude::CsvReadOptions::new().schema(&schema);
        ctx.register_csv("t", csv.to_str().unwrap(), options).await.unwrap();
        let out = dir.join("t.parquet");
        let sql = format!(
            "COPY (SELECT a, NULLIF(s, '') AS s, y, v, z FROM t) TO '{}' STORED AS PARQUET \
             OPTIONS ('format.max_row_group_size' '{group_rows}')",
            out.display()
        );
        ctx.sql(&sql).await.unwrap().collect().await.unwrap();
    }

    fn assert_same(trial: usize, got: &Summary, want: &Summary) {
        assert_eq!(got.donees, want.donees, "trial {trial}: donees");
        for (i, (g, w)) in got.queries.iter().zip(&want.queries).enumerate() {
            assert!(g.l1 == w.l1, "trial {trial} query {i}: L1_R");
            assert_eq!(g.donees_inside, w.donees_inside, "trial {trial} query {i}: |R|");
            for (x, y) in [(&g.imputed, &w.imputed), (&g.ignore, &w.ignore)] {
                // Exact: counts, and sums in integer grid units whatever the row order.
                assert!(x == y, "trial {trial} query {i}");
            }
        }
    }

    #[tokio::test]
    async fn the_streamed_summary_equals_the_in_memory_imputation() {
        let mut rng = SmallRng::seed_from_u64(19);
        let mut split = false;
        for trial in 0..60 {
            let dir = tempfile::tempdir().unwrap();
            let n = rng.random_range(1..400);
            std::fs::write(dir.path().join("t.csv"), table(&mut rng, n)).unwrap();
            std::fs::write(dir.path().join("d.yaml"), DOMAIN).unwrap();
            // Odd trials read Parquet in row groups of 1–40 rows, split into up to 5 byte
            // ranges (partitions), so donees wait across partitions and batches, and wrap
            // around; even trials read the CSV file whole (its byte ranges are refused).
            let parquet = trial % 2 == 1;
            let spec_text = if parquet {
                to_parquet(dir.path(), rng.random_range(1..40)).await;
                SPEC.replace("input: t.csv", "input: t.parquet")
            } else {
                SPEC.to_string()
            };
            std::fs::write(dir.path().join("spec.yaml"), spec_text).unwrap();
            let spec = ImputeSpec::load(dir.path().join("spec.yaml").to_str().unwrap()).unwrap();
            let ds = Dataset::open("t", &spec.input, None, &spec.domain).unwrap();
            let batch = [3, 17, 8192][trial % 3];
            let partitions = 1 + trial % 5;
            let config = datafusion::prelude::SessionConfig::new()
                .with_batch_size(batch)
                .with_target_partitions(partitions)
                .with_repartition_file_scans(true)
                .with_repartition_file_min_size(1);
            let ctx = SessionContext::new_with_config(config);
            let plan = Dataset::open("t", &spec.input, None, &spec.domain)
                .unwrap()
                .raw(&ctx)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let parts = plan.output_partitioning().partition_count();
            if parquet {
                assert!(in_file_order(&plan), "trial {trial}: Parquet ranges are in file order");
            } else if parts > 1 {
                assert!(!in_file_order(&plan), "trial {trial}: CSV byte ranges are refused");
            }
            split |= parquet && parts > 1;
            // 4 × 3 keys: enumerated exactly, or bounded by N₀ (a limit below the space size).
            for limit in [u64::MAX, 5] {
                let want = crate::impute::prepare_on(&ctx, &ds, &spec.imputation, &spec.queries).await.unwrap();
                let want = {
                    let mut w = want;
                    if let Some(s) = &mut w.search {
                        s.enumerate_limit = limit;
                    }
                    w.l1 = w.search.as_ref().map_or(w.l1, |s| s.asg.l1(&s.cfg, &s.rec, limit).unwrap());
                    w.summarize(&spec.queries).unwrap()
                };
                let got = summarize(&ctx, &ds, &spec.imputation, &spec.queries, limit).await.unwrap();
                assert_same(trial, &got, &want);
            }
        }
        assert!(split, "no trial split its input into partitions");
    }

    /// Issue 21: on a standalone Ballista cluster each partition's pass runs
    /// as a task (the not-applicable rule travels as a protobuf expression),
    /// and the summary equals this process's, read as one partition and as
    /// many.
    #[cfg(feature = "cluster")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standalone_cluster_imputes_what_this_process_does() {
        use crate::io::{ClusterSpec, session_context, session_context_on};
        let mut rng = SmallRng::seed_from_u64(21);
        let dir = tempfile::tempdir().unwrap();
        // Several MB of Parquet: the cluster's session splits it into byte ranges.
        std::fs::write(dir.path().join("t.csv"), table(&mut rng, 400_000)).unwrap();
        to_parquet(dir.path(), 20_000).await;
        std::fs::write(dir.path().join("d.yaml"), DOMAIN).unwrap();
        std::fs::write(dir.path().join("spec.yaml"), SPEC.replace("input: t.csv", "input: t.parquet")).unwrap();
        let spec = ImputeSpec::load(dir.path().join("spec.yaml").to_str().unwrap()).unwrap();
        let ds = Dataset::open("t", &spec.input, None, &spec.domain).unwrap();
        let target = ClusterSpec::parse("standalone", Some(5)).unwrap().connect().await.unwrap();
        let cluster = session_context_on(Some(&target));
        let plan = ds.raw(&cluster).await.unwrap().create_physical_plan().await.unwrap();
        assert!(plan.output_partitioning().partition_count() > 1, "the cluster reads the input in one task");
        assert!(in_file_order(&plan));

        let local = session_context();
        let ordered = crate::impute::ordered_context(&local);
        let want = summarize(&ordered, &ds, &spec.imputation, &spec.queries, 5).await.unwrap();
        assert!(want.donees > 10_000, "not vacuous: {} donees", want.donees);
        let before = target.jobs_submitted();
        let got = summarize(&cluster, &ds, &spec.imputation, &spec.queries, 5).await.unwrap();
        assert_eq!(target.jobs_submitted(), before + 2, "one job per pass");
        assert_same(0, &got, &want);
        let split = local.state().config().clone().with_target_partitions(7).with_repartition_file_min_size(1);
        let split = SessionContext::new_with_state(
            datafusion::execution::SessionStateBuilder::new_from_existing(local.state()).with_config(split).build(),
        );
        let got = summarize(&split, &ds, &spec.imputation, &spec.queries, 5).await.unwrap();
        assert_same(1, &got, &want);
    }
}
