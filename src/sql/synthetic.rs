//! `synthetic(model, rows)`: a SQL table function streaming synthetic rows
//! from a saved model (issue 20, item 5), e.g.
//! `SELECT sex, count(*) FROM synthetic('adult-model.json', 1000000) GROUP BY sex`.
//!
//! A saved model is the output of a DP release (`dpflow synth --model-out`,
//! a pipeline's `model_output`); sampling from it is post-processing, so a
//! query that reads only synthetic rows and public tables costs no budget and
//! runs as ordinary SQL (no ledger charge, no noise). The rows stream from
//! `SyntheticExec` in chunks, never materialised by the function.
//!
//! `model` is a model name from the catalog's `models:` section; sessions
//! of the local command line also accept a path (a served analyst cannot name
//! files on the server). Models whose domain has `not_applicable_when` rules
//! are refused: SQL does not enforce them yet (`dpflow sample` does).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use dpflow_udfs::domain::DecodeMode;

/// Largest number of rows one call may ask for.
pub const MAX_ROWS: i64 = 1_000_000_000;

/// The `synthetic` table function of one session.
#[derive(Debug)]
pub struct SyntheticFunction {
    /// Catalog model names → model files.
    pub models: BTreeMap<String, String>,
    /// Whether a path (not only a catalog name) may be given.
    pub allow_paths: bool,
    /// Sampling seed (tests); otherwise fresh from the OS per call. The seed
    /// has no privacy role: sampling is post-processing of a DP model.
    pub seed: Option<u64>,
}

fn plan_err(msg: String) -> DataFusionError {
    DataFusionError::Plan(format!("synthetic(): {msg}"))
}

impl TableFunctionImpl for SyntheticFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if exprs.len() != 2 {
            return Err(plan_err(format!(
                "takes (model, rows), e.g. synthetic('adult-model.json', 10000); got {} arguments",
                exprs.len()
            )));
        }
        let model = match &exprs[0] {
            Expr::Literal(
                ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) | ScalarValue::LargeUtf8(Some(s)),
                _,
            ) => s.clone(),
            other => return Err(plan_err(format!("the model must be a string literal, got {other}"))),
        };
        let rows = match &exprs[1] {
            Expr::Literal(v, _) => match v.cast_to(&datafusion::arrow::datatypes::DataType::Int64) {
                Ok(ScalarValue::Int64(Some(n))) if (1..=MAX_ROWS).contains(&n) && !v.data_type().is_floating() => n,
                _ => {
                    return Err(plan_err(format!("rows must be a whole number from 1 to {MAX_ROWS}, got {v}")));
                }
            },
            other => return Err(plan_err(format!("rows must be a literal number, got {other}"))),
        };
        let path = match self.models.get(&model) {
            Some(p) => p.clone(),
            None if self.allow_paths => model.clone(),
            None => {
                return Err(plan_err(format!(
                    "no model {model:?} in the catalog's models: section (models: {})",
                    if self.models.is_empty() {
                        "none".to_string()
                    } else {
                        self.models.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                )));
            }
        };
        let m = crate::synth::run::SavedModel::load(&path).map_err(|e| {
            let cause = std::error::Error::source(&e).map_or(String::new(), |c| format!(": {c}"));
            plan_err(format!("{e}{cause}"))
        })?;
        let rules = crate::synth::structure::rules(&m.domain).map_err(|e| plan_err(format!("{path}: {e}")))?;
        if !rules.is_empty() {
            return Err(plan_err(format!(
                "{path}: the model's domain has not_applicable_when rules, which SQL does not enforce yet; use \
                 `dpflow sample`"
            )));
        }
        let plan = m.sampling_plan(DecodeMode::Uniform).map_err(|e| plan_err(format!("{path}: {e}")))?;
        let seed = match self.seed {
            Some(s) => s,
            None => rand::random(),
        };
        Ok(Arc::new(SyntheticTable { plan: Arc::new(plan.into()), rows: rows as u64, seed }))
    }
}

/// The rows of one `synthetic(...)` call.
#[derive(Debug)]
pub struct SyntheticTable {
    plan: Arc<dpflow_udfs::synth::Sampler>,
    rows: u64,
    seed: u64,
}

#[async_trait]
impl TableProvider for SyntheticTable {
    fn schema(&self) -> SchemaRef {
        dpflow_udfs::domain::decoded_schema(self.plan.domain())
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let parts = std::thread::available_parallelism().map_or(2, |n| n.get());
        let exec = dpflow_udfs::synth::SyntheticExec::try_new(self.plan.clone(), self.rows, parts, 1 << 16, self.seed)?;
        dpflow_udfs::domain::project(Arc::new(exec), projection)
    }
}

/// Whether `plan` reads synthetic rows and nothing protected: every scan is a
/// `synthetic(...)` call or a public catalog table, and at least one is a call.
pub(super) fn synthetic_only(plan: &LogicalPlan, catalog: &super::Catalog) -> bool {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let (mut synthetic, mut other) = (false, false);
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(s) = node {
            let is_synthetic = datafusion::datasource::source_as_provider(&s.source)
                .is_ok_and(|p| p.downcast_ref::<SyntheticTable>().is_some());
            let public = catalog.tables.get(s.table_name.table()).is_some_and(|t| t.public);
            synthetic |= is_synthetic;
            other |= !is_synthetic && !public;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    synthetic && !other
}
