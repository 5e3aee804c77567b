//! `MarginalNode`: the logical extension node for marginal counting, and the
//! extension planner that turns it into `Partial → Coalesce → Final`.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};

use super::exec::{MarginalExec, MarginalMode, marginal_output_schema};
use super::kernel::MarginalConfig;

/// Logical node: the marginals of `config` over the encoded `input`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MarginalNode {
    /// Encoded input (UInt32 code columns).
    pub input: LogicalPlan,
    /// The marginals.
    pub config: MarginalConfig,
    schema: DFSchemaRef,
}

impl PartialOrd for MarginalNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        // Plans have no natural order; only equality matters to the optimizer.
        (self == other).then_some(Ordering::Equal)
    }
}

impl MarginalNode {
    /// Creates the node.
    pub fn try_new(input: LogicalPlan, config: MarginalConfig) -> Result<Self> {
        config.validate()?;
        for c in &config.columns {
            input
                .schema()
                .field_with_unqualified_name(&c.name)
                .map_err(|_| DataFusionError::Plan(format!("marginal input has no encoded column {:?}", c.name)))?;
        }
        let schema = Arc::new(DFSchema::try_from(marginal_output_schema().as_ref().clone())?);
        Ok(Self { input, config, schema })
    }

    /// Wraps into a logical plan.
    pub fn into_plan(self) -> LogicalPlan {
        LogicalPlan::Extension(Extension { node: Arc::new(self) })
    }
}

impl UserDefinedLogicalNodeCore for MarginalNode {
    fn name(&self) -> &str {
        "Marginal"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let sets: Vec<String> =
            (0..self.config.sets.len()).map(|i| format!("({})", self.config.set_label(i))).collect();
        write!(f, "Marginal: [{}]", sets.join(", "))
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        if inputs.len() != 1 {
            return Err(DataFusionError::Internal("Marginal has one input".into()));
        }
        Self::try_new(inputs.swap_remove(0), self.config.clone())
    }

    fn necessary_children_exprs(&self, _output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        // Only the encoded columns the marginals use are needed from the input.
        let schema = self.input.schema();
        let mut cols: Vec<usize> =
            self.config.columns.iter().filter_map(|c| schema.index_of_column_by_name(None, &c.name)).collect();
        cols.sort_unstable();
        cols.dedup();
        Some(vec![cols])
    }
}

/// Plans [`MarginalNode`] as `MarginalExec(Final) ← Coalesce ← MarginalExec(Partial)`.
#[derive(Debug, Default)]
pub struct MarginalPlanner;

/// Builds the two-phase physical plan for a marginal config over `input`.
pub fn plan_marginals(input: Arc<dyn ExecutionPlan>, config: MarginalConfig) -> Result<Arc<dyn ExecutionPlan>> {
    let partial = Arc::new(MarginalExec::try_new(input, config.clone(), MarginalMode::Partial)?);
    let coalesced = Arc::new(CoalescePartitionsExec::new(partial));
    Ok(Arc::new(MarginalExec::try_new(coalesced, config, MarginalMode::Final)?))
}

#[async_trait]
impl ExtensionPlanner for MarginalPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(m) = node.as_any().downcast_ref::<MarginalNode>() else {
            return Ok(None);
        };
        Ok(Some(plan_marginals(physical_inputs[0].clone(), m.config.clone())?))
    }
}
