//! `inspect`: the curator's view of an input against its domain: rows, nulls
//! and out-of-domain values per column. Exact statistics of the private input,
//! NOT differentially private: for the data curator only.

use std::sync::Arc;

use super::error::{EvalError, Result};
use futures::StreamExt;
use serde::Serialize;

use crate::domain::{BatchEncoder, ColumnKind, DomainSpec};
use crate::io::{InputFormat, open_input, session_context};

/// The report (exact counts of private data: for the data curator only).
#[derive(Debug, Serialize)]
pub struct InspectReport {
    /// Always present: this report is not differentially private.
    pub notice: &'static str,
    /// What was read.
    pub input: String,
    /// The domain file.
    pub domain: String,
    /// Rows read.
    pub rows: u64,
    /// Per column.
    pub columns: Vec<ColumnReport>,
    /// Product of all column cardinalities (cells of the full joint table).
    pub joint_domain_cells: f64,
}

/// One column of the report.
#[derive(Debug, Serialize)]
pub struct ColumnReport {
    /// Column name.
    pub name: String,
    /// Domain kind.
    pub kind: &'static str,
    /// Whether null is in the domain.
    pub nullable: bool,
    /// Number of public values (bins), null excluded.
    pub domain_size: usize,
    /// Nulls seen.
    pub nulls: u64,
    /// Values outside the public domain.
    pub out_of_domain: u64,
}

/// Curator-only label used in every exact report.
pub const CURATOR_NOTICE: &str =
    "CURATOR-ONLY: exact statistics of the private input, NOT differentially private. Do not publish.";

/// Computes the report, streaming the input once.
pub async fn inspect(input: &str, domain_path: &str, format: Option<InputFormat>) -> Result<InspectReport> {
    let spec = DomainSpec::load(domain_path)?;
    let ctx = session_context();
    let df = open_input(&ctx, input, format, &spec).await?;
    let domain = Arc::new(spec.domain.clone());
    let schema = df.schema().as_arrow().clone();
    let mut encoder = BatchEncoder::new(domain.clone(), &schema)
        .map_err(|source| EvalError::Encode { input: input.to_string(), source })?
        .count_only();
    let read = |source| EvalError::Read { input: input.to_string(), source };
    let planned = dpflow_udfs::unwind::catch_unwind_future(df.execute_stream()).await.map_err(read)?;
    let mut stream = dpflow_udfs::unwind::catch_unwind(planned);
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(read)?;
        encoder.encode(&batch).map_err(|source| EvalError::Encode { input: input.to_string(), source })?;
    }
    let stats = encoder.into_stats();
    let columns = domain
        .columns()
        .iter()
        .zip(&stats.columns)
        .map(|(c, s)| ColumnReport {
            name: c.name.clone(),
            kind: match c.kind {
                ColumnKind::Categorical { .. } => "categorical",
                ColumnKind::Integer { .. } => "integer",
                ColumnKind::Float { .. } => "float",
                ColumnKind::Boolean => "boolean",
            },
            nullable: c.nullable,
            domain_size: c.size(),
            nulls: s.nulls,
            out_of_domain: s.out_of_domain,
        })
        .collect();
    Ok(InspectReport {
        notice: CURATOR_NOTICE,
        input: input.to_string(),
        domain: domain_path.to_string(),
        rows: stats.rows_in,
        columns,
        joint_domain_cells: domain.cardinalities().iter().map(|&c| c as f64).product(),
    })
}

/// Exact marginal counts of `ds` over each attribute set, in one scan (cells
/// in row-major order of the sets' domain codes). Exact statistics of the
/// private input, NOT differentially private: for the curator and for
/// benchmarks only, like [`inspect`]; DP code inside the crate uses the
/// dataset's crate-private marginals, which only ever feed a mechanism.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))] // used by dpflow-bench only
pub(crate) async fn exact_marginal_counts(
    ds: &crate::dataset::Dataset,
    ctx: &datafusion::execution::context::SessionContext,
    sets: &[(Vec<String>, dpflow_udfs::marginal::NullMode)],
) -> Result<Vec<Vec<u64>>> {
    Ok(ds.exact_marginals(ctx, sets).await?.into_iter().map(|m| m.counts).collect())
}
