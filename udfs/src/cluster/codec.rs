//! The extension codecs a dpflow cluster speaks: dpflow's own nodes and
//! operators ([`DpflowCodec`]) beside Ballista's (shuffle writers and readers,
//! its cache node). Ballista's codecs do not delegate nodes they do not know,
//! so one codec serves both, each payload behind a one-byte tag saying whose
//! it is. The client, the scheduler and every executor use these two.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use crate::codec::DpflowCodec;

const DPFLOW: u8 = b'D';
const BALLISTA: u8 = b'B';

fn split(buf: &[u8]) -> Result<(u8, &[u8])> {
    match buf.split_first() {
        Some((&tag, rest)) if tag == DPFLOW || tag == BALLISTA => Ok((tag, rest)),
        _ => Err(DataFusionError::Internal("dpflow cluster codec: a payload without its tag".into())),
    }
}

fn tagged(tag: u8, buf: &mut Vec<u8>, encode: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Result<()> {
    let start = buf.len();
    buf.push(tag);
    encode(buf).inspect_err(|_| buf.truncate(start))
}

/// Physical codec: dpflow's operators, then Ballista's.
#[derive(Debug, Default)]
pub struct ClusterPhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for ClusterPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match split(buf)? {
            (DPFLOW, rest) => PhysicalExtensionCodec::try_decode(&DpflowCodec, rest, inputs, ctx, converter),
            (_, rest) => self.ballista.try_decode(rest, inputs, ctx, converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let ours =
            tagged(DPFLOW, buf, |b| PhysicalExtensionCodec::try_encode(&DpflowCodec, node.clone(), b, converter));
        match ours {
            Ok(()) => Ok(()),
            Err(DataFusionError::NotImplemented(_)) => {
                tagged(BALLISTA, buf, |b| self.ballista.try_encode(node, b, converter))
            }
            Err(e) => Err(e),
        }
    }
}

/// Logical codec: dpflow's nodes, then Ballista's (whose default delegates to
/// DataFusion's own).
#[derive(Debug, Default)]
pub struct ClusterLogicalCodec {
    ballista: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for ClusterLogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        match split(buf)? {
            (DPFLOW, rest) => LogicalExtensionCodec::try_decode(&DpflowCodec, rest, inputs, ctx),
            (_, rest) => self.ballista.try_decode(rest, inputs, ctx),
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        match tagged(DPFLOW, buf, |b| LogicalExtensionCodec::try_encode(&DpflowCodec, node, b)) {
            Ok(()) => Ok(()),
            Err(DataFusionError::NotImplemented(_)) => tagged(BALLISTA, buf, |b| self.ballista.try_encode(node, b)),
            Err(e) => Err(e),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        self.ballista.try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.ballista.try_encode_table_provider(table_ref, node, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marginal::{config_for, plan_marginals};
    use datafusion::physical_plan::displayable;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion_proto::physical_plan::AsExecutionPlan;
    use datafusion_proto::protobuf::PhysicalPlanNode;

    fn round_trip(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let codec = ClusterPhysicalCodec::default();
        let node = PhysicalPlanNode::try_from_physical_plan(plan, &codec).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        node.try_into_physical_plan(&ctx.task_ctx(), &codec).unwrap()
    }

    #[test]
    fn dpflow_and_ballista_operators_share_one_plan() {
        use crate::domain::{Column, ColumnKind, Domain, EncodeExec, OutOfDomain};
        use crate::marginal::NullMode;
        use ballista_core::execution_plans::ShuffleWriterExec;
        let domain = Domain::new(vec![Column {
            name: "a".into(),
            kind: ColumnKind::Categorical { values: vec!["x".into(), "y".into()], aliases: Default::default() },
            nullable: true,
            null_tokens: vec![],
            out_of_domain: OutOfDomain::Error,
            not_applicable_when: None,
        }])
        .unwrap();
        let raw = Arc::new(EmptyExec::new(Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("a", datafusion::arrow::datatypes::DataType::Utf8, true),
        ]))));
        let encoded = Arc::new(EncodeExec::try_new(raw, Arc::new(domain.clone())).unwrap());
        let config = config_for(&domain, &[(vec!["a".to_string()], NullMode::Cells)]).unwrap();
        let plan = plan_marginals(encoded, config).unwrap();
        // A stage as the scheduler ships it: Ballista's writer over dpflow's operators.
        let writer = Arc::new(ShuffleWriterExec::try_new("job".into(), 1, plan, "/tmp".into()).unwrap());
        let back = round_trip(writer.clone());
        let show = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
        assert_eq!(show(&back), show(&(writer as Arc<dyn ExecutionPlan>)));
        assert!(show(&back).contains("MarginalExec") && show(&back).contains("ShuffleWriterExec"));
    }

    #[test]
    fn an_untagged_payload_is_an_error_not_a_guess() {
        let codec = ClusterPhysicalCodec::default();
        let ctx = datafusion::prelude::SessionContext::new();
        let conv = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        for buf in [&b""[..], b"{\"node\":\"marginal\"}", b"X123"] {
            let e = codec.try_decode(buf, &[], &ctx.task_ctx(), &conv).unwrap_err();
            assert!(e.to_string().contains("tag"), "{e}");
        }
    }
}
