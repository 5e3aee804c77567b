//! A dataset: where the data is, how to read it, and its public domain.
//! Exact statistics computed here are `pub(crate)`: they only ever feed DP
//! mechanisms inside this crate.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column as PhysColumn, Literal};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use dpflow_udfs::domain::EncodeExec;
use dpflow_udfs::marginal::{NullMode, batch_to_counts, config_for, plan_marginals};
use dpflow_udfs::synth::{FillNullsExec, FillPlan};

use crate::domain::{Domain, DomainSpec, SpecError};
use crate::io::{InputFormat, IoError, open_inputs};

/// Why a dataset cannot be opened, read or counted.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The domain file (it names the file, line and key).
    #[error(transparent)]
    Domain(#[from] SpecError),
    /// The input cannot be opened (it names the location).
    #[error(transparent)]
    Io(#[from] IoError),
    /// The input lacks some domain column.
    #[error(
        "{location}: the data does not have the domain's columns {columns:?}; check the header against the domain with `dpflow inspect`"
    )]
    MissingColumns {
        /// The input.
        location: String,
        /// The domain's columns.
        columns: Vec<String>,
        // DataFusion's error is not kept: it lists the input's column names,
        // which in a headerless file are its first data row.
    },
    /// A column name that is not in the domain.
    #[error("unknown column {0:?}: it is not in the domain")]
    UnknownColumn(String),
    /// DataFusion cannot plan the encoded read.
    #[error("planning the encoded read of {location}")]
    Plan {
        /// The input.
        location: String,
        /// DataFusion's error.
        source: DataFusionError,
    },
    /// Counting failed.
    #[error("counting marginals of {location}")]
    Count {
        /// The input.
        location: String,
        /// DataFusion's error.
        source: DataFusionError,
    },
    /// The marginal operator answered fewer sets than asked (a bug).
    #[error("marginal operator returned too few marginals")]
    TooFewMarginals,
}

type Result<T, E = DatasetError> = std::result::Result<T, E>;

/// A protected (or public) dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Name (the ledger's dataset name for protected data).
    pub name: String,
    /// File, prefix, glob or URL.
    pub location: String,
    /// Further inputs of the same format (e.g. partitions listed one by one).
    pub extra_locations: Vec<String>,
    /// Format (default: from the extension).
    pub format: Option<InputFormat>,
    /// Public domain.
    pub spec: Arc<DomainSpec>,
}

/// Which rows and codes marginals are counted over.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) enum CodeSource {
    /// The data as encoded.
    Plain,
    /// Only rows observed on every domain column (complete-row, 000 §4.1).
    CompleteRows,
    /// Nulls filled first (imputation-first, 000 §4.1).
    Filled(Arc<FillPlan>),
}

/// Exact marginal counts (crate-private: never released without noise;
/// public under `bench-internals`, for benchmarks and tests only).
#[derive(Clone, PartialEq)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct ExactMarginal {
    /// The attributes, in order.
    pub attrs: Vec<String>,
    /// Whether nulls are cells or rows are observed-only.
    pub mode: NullMode,
    /// Cells per attribute (null cell included in `Cells` mode).
    pub shape: Vec<usize>,
    /// Counts, cells in row-major order over `shape`.
    pub counts: Vec<u64>,
    /// Rows observed on every attribute (all rows in `Cells` mode).
    pub observed: u64,
}

impl Dataset {
    /// A dataset from a location and a domain file.
    pub fn open(name: &str, location: &str, format: Option<InputFormat>, domain_file: &str) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            location: location.to_string(),
            extra_locations: vec![],
            format,
            spec: Arc::new(DomainSpec::load(domain_file)?),
        })
    }

    fn plan_err(&self) -> impl Fn(DataFusionError) -> DatasetError + '_ {
        |source| DatasetError::Plan { location: self.location.clone(), source }
    }

    /// Positions of domain columns.
    fn positions(&self, columns: &[&str]) -> Result<Vec<usize>> {
        columns
            .iter()
            .map(|c| self.domain().position(c).ok_or_else(|| DatasetError::UnknownColumn(c.to_string())))
            .collect()
    }

    /// The public domain.
    pub fn domain(&self) -> &Domain {
        &self.spec.domain
    }

    /// The raw data as a lazy DataFrame.
    pub async fn raw(&self, ctx: &SessionContext) -> Result<DataFrame> {
        let mut all = vec![self.location.clone()];
        all.extend(self.extra_locations.iter().cloned());
        Ok(open_inputs(ctx, &all, self.format, &self.spec).await?)
    }

    /// Physical plan producing encoded codes for `columns` (all domain columns if empty).
    pub(crate) async fn encoded_plan(&self, ctx: &SessionContext, columns: &[&str]) -> Result<Arc<dyn ExecutionPlan>> {
        // Encode every domain column (so drop-row/error policies select the same
        // rows whatever is counted), then keep the requested ones.
        let all = self.domain().names();
        let df = self.raw(ctx).await?.select_columns(&all).map_err(|_| DatasetError::MissingColumns {
            location: self.location.clone(),
            columns: all.iter().map(|c| c.to_string()).collect(),
        })?;
        let plan =
            dpflow_udfs::unwind::catch_unwind_future(df.create_physical_plan()).await.map_err(self.plan_err())?;
        let encoded: Arc<dyn ExecutionPlan> =
            Arc::new(EncodeExec::try_new(plan, Arc::new(self.domain().clone())).map_err(self.plan_err())?);
        if columns.is_empty() {
            return Ok(encoded);
        }
        let idx = self.positions(columns)?;
        dpflow_udfs::marginal::project(encoded, Some(&idx)).map_err(self.plan_err())
    }

    /// Exact marginals of attribute sets, in one scan.
    pub(crate) async fn exact_marginals(
        &self,
        ctx: &SessionContext,
        sets: &[(Vec<String>, NullMode)],
    ) -> Result<Vec<ExactMarginal>> {
        self.exact_marginals_from(ctx, sets, &CodeSource::Plain).await
    }

    /// Encoded codes of every domain column, transformed by `source`.
    pub(crate) async fn codes_plan(&self, ctx: &SessionContext, source: &CodeSource) -> Result<Arc<dyn ExecutionPlan>> {
        let all = self.encoded_plan(ctx, &[]).await?;
        Ok(match source {
            CodeSource::Plain => all,
            CodeSource::CompleteRows => {
                let schema = all.schema();
                let mut predicate: Option<Arc<dyn PhysicalExpr>> = None;
                for (i, c) in self.domain().columns().iter().enumerate() {
                    let Some(null) = c.null_code() else { continue };
                    let e: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
                        Arc::new(PhysColumn::new(schema.field(i).name(), i)),
                        Operator::NotEq,
                        Arc::new(Literal::new(ScalarValue::UInt32(Some(null)))),
                    ));
                    predicate = Some(match predicate {
                        None => e,
                        Some(p) => Arc::new(BinaryExpr::new(p, Operator::And, e)),
                    });
                }
                match predicate {
                    None => all,
                    Some(p) => Arc::new(FilterExec::try_new(p, all).map_err(self.plan_err())?),
                }
            }
            CodeSource::Filled(plan) => Arc::new(FillNullsExec::try_new(all, plan.clone()).map_err(self.plan_err())?),
        })
    }

    /// Exact marginals of attribute sets over the codes of `source`, in one scan.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn exact_marginals_from(
        &self,
        ctx: &SessionContext,
        sets: &[(Vec<String>, NullMode)],
        source: &CodeSource,
    ) -> Result<Vec<ExactMarginal>> {
        let config = config_for(self.domain(), sets).map_err(self.plan_err())?;
        let used: Vec<&str> = config.columns.iter().map(|c| c.name.as_str()).collect();
        let input = match source {
            CodeSource::Plain => self.encoded_plan(ctx, &used).await?,
            _ => {
                let idx = self.positions(&used)?;
                dpflow_udfs::marginal::project(self.codes_plan(ctx, source).await?, Some(&idx))
                    .map_err(self.plan_err())?
            }
        };
        let plan = plan_marginals(input, config.clone()).map_err(self.plan_err())?;
        let count_err = |source| DatasetError::Count { location: self.location.clone(), source };
        let batches = dpflow_udfs::cluster::collect(plan, ctx).await.map_err(count_err)?;
        let mut out: Vec<Option<ExactMarginal>> = vec![None; sets.len()];
        for b in &batches {
            for (i, counts, observed) in batch_to_counts(b).map_err(count_err)? {
                let i = i as usize;
                let (attrs, mode) = &sets[i];
                let shape = config.sets[i]
                    .attrs
                    .iter()
                    .map(|&a| {
                        let c = &config.columns[a];
                        match (mode, c.null_code) {
                            (NullMode::Observed, Some(_)) => c.cardinality as usize - 1,
                            _ => c.cardinality as usize,
                        }
                    })
                    .collect();
                out[i] = Some(ExactMarginal { attrs: attrs.clone(), mode: *mode, shape, counts, observed });
            }
        }
        out.into_iter().map(|m| m.ok_or(DatasetError::TooFewMarginals)).collect()
    }
}

dpflow_udfs::protected_debug!(ExactMarginal);
