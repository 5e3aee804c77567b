//! `EncodeExec`: streams record batches through a public domain, producing
//! dense UInt32 codes (see [`BatchEncoder`]). One encoder per partition.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::StreamExt;

use super::{BatchEncoder, Domain, encoded_schema};

/// What [`EncodeExec`] outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DomainOutput {
    /// Dense UInt32 codes.
    Codes,
    /// Typed, normalised values (labels, Int64, Float64, Boolean; nulls and policies applied).
    Typed,
}

/// Physical operator reading its input through a domain.
#[derive(Debug)]
pub struct EncodeExec {
    input: Arc<dyn ExecutionPlan>,
    domain: Arc<Domain>,
    output: DomainOutput,
    passthrough: Vec<String>,
    properties: Arc<PlanProperties>,
}

impl EncodeExec {
    /// Creates the operator; every domain column must be in the input.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, domain: Arc<Domain>) -> Result<Self> {
        Self::with_output(input, domain, DomainOutput::Codes)
    }

    /// An operator producing typed, normalised values instead of codes.
    pub fn typed(input: Arc<dyn ExecutionPlan>, domain: Arc<Domain>) -> Result<Self> {
        Self::with_output(input, domain, DomainOutput::Typed)
    }

    /// An operator with the given output.
    pub fn with_output(input: Arc<dyn ExecutionPlan>, domain: Arc<Domain>, output: DomainOutput) -> Result<Self> {
        Self::with_passthrough(input, domain, output, vec![])
    }

    /// Typed output plus input columns copied unchanged (e.g. a privacy unit).
    pub fn with_passthrough(
        input: Arc<dyn ExecutionPlan>,
        domain: Arc<Domain>,
        output: DomainOutput,
        passthrough: Vec<String>,
    ) -> Result<Self> {
        // Fail at plan time if columns are missing.
        let plan_err = |e: super::EncodeError| DataFusionError::Plan(e.to_string());
        let enc = BatchEncoder::new(domain.clone(), &input.schema())
            .map_err(plan_err)?
            .with_passthrough(&input.schema(), &passthrough)
            .map_err(plan_err)?;
        if output == DomainOutput::Codes && !passthrough.is_empty() {
            return Err(DataFusionError::Plan("passthrough columns need typed output".into()));
        }
        let schema = match output {
            DomainOutput::Codes => encoded_schema(&domain),
            DomainOutput::Typed => enc.typed_schema(&input.schema()),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self { input, domain, output, passthrough, properties })
    }

    /// Columns copied unchanged.
    pub fn passthrough(&self) -> &[String] {
        &self.passthrough
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// What it outputs.
    pub fn output(&self) -> DomainOutput {
        self.output
    }
}

impl DisplayAs for EncodeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "EncodeExec: columns=[{}]", self.domain.names().join(", "))
    }
}

impl ExecutionPlan for EncodeExec {
    fn name(&self) -> &str {
        "EncodeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("EncodeExec has one child".into()));
        }
        Ok(Arc::new(EncodeExec::with_passthrough(
            children.swap_remove(0),
            self.domain.clone(),
            self.output,
            self.passthrough.clone(),
        )?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let mut encoder = BatchEncoder::new(self.domain.clone(), &self.input.schema())
            .and_then(|e| e.with_passthrough(&self.input.schema(), &self.passthrough))
            .map_err(|e| DataFusionError::Execution(e.to_string()))?;
        let schema = self.schema();
        let output = self.output;
        let stream = input.map(move |batch| {
            let batch = batch?;
            match output {
                DomainOutput::Codes => encoder.encode(&batch),
                DomainOutput::Typed => encoder.typed(&batch),
            }
            .map_err(|e| DataFusionError::Execution(e.to_string()))
        });
        // The scan under this operator decodes the input (Parquet, CSV):
        // a decoder's panic on a corrupt file ends the stream with an error.
        Ok(crate::unwind::catch_unwind(Box::pin(RecordBatchStreamAdapter::new(schema, stream))))
    }
}
