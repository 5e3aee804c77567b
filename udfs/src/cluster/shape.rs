//! The shape of a plan a cluster may run: at most one exchange on any path
//! from the root to a leaf, and one final task.
//!
//! Why. A Ballista scheduler recovers from a lost executor by re-running
//! tasks. Two of its recovery paths hand a stage the outputs of two attempts
//! of the same work (Ballista 55, `execution_graph.rs`): a *middle* stage (one
//! that reads shuffle data and writes shuffle data) that is rolled back after
//! some of its tasks succeeded is re-run in full, while the next stage keeps
//! the first attempt's outputs; and a final stage of several tasks keeps the
//! output location of a task that is then re-run elsewhere. Either way rows or
//! partial aggregates are counted twice and the result no longer has the
//! sensitivity the release was charged for.
//!
//! Neither can happen to a plan of this shape. Its first stages only scan (no
//! shuffle input: a lost executor's tasks are reset and their stale outputs
//! are removed from the final stage's inputs before they run again); its last
//! stage is one task, and the job ends the moment that task succeeds, so
//! there is no later stage to receive a second attempt and no second output
//! location. DataFusion plans dpflow's reads in this form when hash
//! repartitioning is off ([`super::on_cluster`]): marginals (partial counts,
//! then one merge), DP SQL's aggregates (partial, then final in one task; a
//! unit's contribution bounding in that task), synthetic rows and raw reads
//! (their partitions gathered by one task).

use std::sync::Arc;

use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

/// The most exchanges (stage boundaries) on any path from `plan` down to a leaf.
pub fn exchanges(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let children = plan.children();
    let own = usize::from(
        plan.is::<CoalescePartitionsExec>()
            || plan.is::<SortPreservingMergeExec>()
            || plan
                .downcast_ref::<RepartitionExec>()
                .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..))),
    );
    // A collected build side is a broadcast stage of its own.
    let collected_left =
        plan.downcast_ref::<HashJoinExec>().is_some_and(|j| *j.partition_mode() == PartitionMode::CollectLeft)
            || plan.is::<CrossJoinExec>()
            || plan.is::<NestedLoopJoinExec>();
    children.iter().enumerate().map(|(i, c)| exchanges(c) + usize::from(collected_left && i == 0)).max().unwrap_or(0)
        + own
}

/// `plan` with one final task (its partitions gathered when it has several),
/// if it then has at most one exchange; `None` when it needs more (it must run
/// in this process).
pub fn one_exchange(plan: Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let plan: Arc<dyn ExecutionPlan> = if plan.properties().output_partitioning().partition_count() > 1 {
        Arc::new(CoalescePartitionsExec::new(plan))
    } else {
        plan
    };
    (exchanges(&plan) <= 1).then_some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{SessionConfig, SessionContext};

    async fn planned(config: SessionConfig, sql: &str) -> Arc<dyn ExecutionPlan> {
        let ctx = SessionContext::new_with_config(config);
        let dir = tempfile::tempdir().unwrap();
        for (name, rows) in [("t", 50), ("p", 5)] {
            let path = dir.path().join(format!("{name}.csv"));
            let mut text = String::from("k,u,x\n");
            for i in 0..rows {
                text += &format!("{},{},{}\n", i % 5, i % 7, i);
            }
            std::fs::write(&path, text).unwrap();
            ctx.register_csv(name, path.to_str().unwrap(), Default::default()).await.unwrap();
        }
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        drop(dir);
        plan
    }

    fn cluster_config() -> SessionConfig {
        SessionConfig::new()
            .with_target_partitions(4)
            .with_repartition_file_scans(true)
            .with_repartition_file_min_size(1)
            .with_repartition_aggregations(false)
            .with_repartition_windows(false)
            .with_repartition_joins(false)
            .with_repartition_sorts(false)
            .with_round_robin_repartition(false)
    }

    #[tokio::test]
    async fn dpflow_reads_plan_with_one_exchange_and_hash_exchanges_are_refused() {
        // DP SQL's shapes: grouped aggregates, a unit's bounding windows, plain reads.
        for sql in [
            "SELECT k, count(*), sum(x) FROM t GROUP BY k",
            "SELECT count(*) FROM t",
            "SELECT k, count(*) FROM (SELECT *, row_number() OVER (PARTITION BY u, k ORDER BY random()) AS r FROM t) WHERE r <= 2 GROUP BY k",
            "SELECT * FROM t",
        ] {
            let plan = planned(cluster_config(), sql).await;
            assert!(
                plan.properties().output_partitioning().partition_count() > 1
                    || sql.contains("GROUP BY")
                    || sql.contains("count"),
                "{sql}: not split"
            );
            let shaped = one_exchange(plan).unwrap_or_else(|| panic!("{sql}: more than one exchange"));
            assert_eq!(shaped.properties().output_partitioning().partition_count(), 1, "{sql}");
            assert!(exchanges(&shaped) <= 1);
        }
        // With DataFusion's default repartitioning a grouped aggregate has a
        // hash exchange under its final merge: two exchanges, refused.
        let plan =
            planned(SessionConfig::new().with_target_partitions(4), "SELECT k, count(*) FROM t GROUP BY k").await;
        assert!(one_exchange(plan).is_none());
        // A join collects its build side: a broadcast stage under a scan stage
        // that feeds the final task (two exchanges on that path), refused.
        let plan = planned(cluster_config(), "SELECT t.k, count(*) FROM t JOIN p ON t.k = p.k GROUP BY t.k").await;
        let show = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
        assert!(one_exchange(plan).is_none(), "{show}");
    }
}
