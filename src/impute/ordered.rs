//! Reads in file order for the in-memory imputation (`reference.rs`, the
//! tests' oracle and the 004 experiments' engine): values and codes from two
//! reads paired row by row, one partition at a time.

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float64Type, UInt32Type};
use datafusion::execution::context::SessionContext;
use dpflow_udfs::domain::{ColumnKind, EncodeExec};
use futures::StreamExt;

use super::{ImputeError, Result, ordered_context};
use crate::dataset::Dataset;

/// Reads a dataset in file order and calls `f` with each batch twice over:
/// typed by its domain, and as domain codes (row-aligned).
pub(crate) async fn read_in_order(
    ctx: &SessionContext,
    ds: &Dataset,
    mut f: impl FnMut(&RecordBatch, &RecordBatch) -> Result<()>,
) -> Result<()> {
    use datafusion::physical_plan::ExecutionPlan;
    // Rows are paired across reads (typed values with codes, and across calls), so
    // every read must see them in the same order: one partition per input in file
    // order, partitions read one after the other (never merged as they finish).
    let ctx = &ordered_context(ctx);
    let domain = std::sync::Arc::new(ds.domain().clone());
    let plan = ds.raw(ctx).await?.create_physical_plan().await?;
    let typed = std::sync::Arc::new(EncodeExec::typed(plan, domain.clone())?);
    let codes_plan =
        std::sync::Arc::new(EncodeExec::try_new(ds.raw(ctx).await?.create_physical_plan().await?, domain.clone())?);
    let parts = typed.properties().partitioning.partition_count();
    if codes_plan.properties().partitioning.partition_count() != parts {
        return Err(ImputeError::Internal("the two reads of an imputation input are partitioned differently"));
    }
    let on_cluster = dpflow_udfs::cluster::target_of(ctx).is_some();
    if on_cluster && parts != 1 {
        // A cluster returns a job's partitions in the order they finish.
        return Err(ImputeError::Internal("an ordered read on a cluster must be one partition"));
    }
    for p in 0..parts {
        // On a cluster each read is one job of one task (its executor decodes
        // and types the input in file order); the donor search stays here.
        let (mut s_typed, mut s_codes) = if on_cluster {
            (
                dpflow_udfs::cluster::execute_stream(typed.clone(), ctx).await?,
                dpflow_udfs::cluster::execute_stream(codes_plan.clone(), ctx).await?,
            )
        } else {
            (typed.execute(p, ctx.task_ctx())?, codes_plan.execute(p, ctx.task_ctx())?)
        };
        loop {
            match (s_typed.next().await, s_codes.next().await) {
                (Some(t), Some(c)) => {
                    let (t, c) = (t?, c?);
                    if t.num_rows() != c.num_rows() {
                        return Err(ImputeError::Internal("the two reads of an imputation input are not aligned"));
                    }
                    f(&t, &c)?;
                }
                (None, None) => break,
                _ => return Err(ImputeError::Internal("the two reads of an imputation input are not aligned")),
            }
        }
    }
    Ok(())
}

/// One column of a batch pair as numbers: categorical and boolean columns as
/// their codes (their null code a null), or every column as its raw code
/// (`as_code`, null code included), other columns cast to `f64`.
pub(crate) fn batch_values(
    domain: &dpflow_udfs::domain::Domain,
    name: &str,
    typed: &RecordBatch,
    codes: &RecordBatch,
    as_code: bool,
) -> Result<Vec<Option<f64>>> {
    let col = domain.column(name).ok_or_else(|| crate::dataset::DatasetError::UnknownColumn(name.to_string()))?;
    let i = domain.position(name).expect("known");
    Ok(match col.kind {
        _ if as_code => codes.column(i).as_primitive::<UInt32Type>().values().iter().map(|&x| Some(x as f64)).collect(),
        ColumnKind::Categorical { .. } | ColumnKind::Boolean => {
            let null = col.null_code();
            let codes = codes.column(i).as_primitive::<UInt32Type>();
            codes.values().iter().map(|&x| (Some(x) != null).then_some(x as f64)).collect()
        }
        _ => {
            let f =
                datafusion::arrow::compute::cast(typed.column(i), &datafusion::arrow::datatypes::DataType::Float64)?;
            let f = f.as_primitive::<Float64Type>();
            (0..f.len()).map(|r| f.is_valid(r).then(|| f.value(r))).collect()
        }
    })
}
