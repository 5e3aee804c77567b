//! datafusion-proto extension codecs for dpflow's logical nodes and physical
//! operators, so that plans containing them can be shipped to a distributed
//! executor (e.g. Ballista). Node payloads are JSON.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};

use crate::domain::{Domain, DomainOutput, EncodeExec};
use crate::knn::pass::KnnRead;
use crate::knn::{KnnDonorExec, KnnPassExec, KnnSpec, KnnStage};
use crate::marginal::{MarginalConfig, MarginalExec, MarginalMode, MarginalNode};
use crate::synth::{FillNullsExec, FillPlan, Sampler, SyntheticExec};

#[derive(Serialize, Deserialize)]
#[serde(tag = "node", rename_all = "snake_case")]
enum LogicalPayload {
    Marginal { config: MarginalConfig },
}

fn codes() -> DomainOutput {
    DomainOutput::Codes
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "node", rename_all = "snake_case")]
enum PhysicalPayload {
    Marginal {
        config: MarginalConfig,
        mode: MarginalMode,
    },
    Encode {
        domain: Domain,
        #[serde(default = "codes")]
        output: DomainOutput,
        #[serde(default)]
        passthrough: Vec<String>,
    },
    Synthetic {
        plan: Sampler,
        rows: u64,
        partitions: usize,
        chunk_rows: usize,
        seed: u64,
    },
    Fill {
        plan: FillPlan,
    },
    Knn {
        spec: KnnSpec,
    },
    KnnPass {
        read: KnnRead,
        /// Per imputed column with a rule: (column, the rule as a protobuf `PhysicalExprNode`).
        rules: Vec<(String, Vec<u8>)>,
        stage: KnnStage,
    },
}

fn enc_err(e: serde_json::Error) -> DataFusionError {
    DataFusionError::Internal(format!("dpflow codec: {e}"))
}

/// Codec for every dpflow extension node and operator.
#[derive(Debug, Default, Clone)]
pub struct DpflowCodec;

impl LogicalExtensionCodec for DpflowCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], _ctx: &TaskContext) -> Result<Extension> {
        let payload: LogicalPayload = serde_json::from_slice(buf).map_err(enc_err)?;
        match payload {
            LogicalPayload::Marginal { config } => {
                let input = inputs
                    .first()
                    .cloned()
                    .ok_or_else(|| DataFusionError::Internal("Marginal needs an input".into()))?;
                Ok(Extension { node: Arc::new(MarginalNode::try_new(input, config)?) })
            }
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(m) = node.node.as_any().downcast_ref::<MarginalNode>() {
            let p = LogicalPayload::Marginal { config: m.config.clone() };
            buf.extend(serde_json::to_vec(&p).map_err(enc_err)?);
            return Ok(());
        }
        Err(DataFusionError::NotImplemented(format!("dpflow codec cannot encode logical node {}", node.node.name())))
    }

    fn try_decode_table_provider(
        &self,
        _buf: &[u8],
        table_ref: &TableReference,
        _schema: SchemaRef,
        _ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        Err(DataFusionError::NotImplemented(format!("dpflow codec: table provider {table_ref}")))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        _node: Arc<dyn TableProvider>,
        _buf: &mut Vec<u8>,
    ) -> Result<()> {
        Err(DataFusionError::NotImplemented(format!("dpflow codec: table provider {table_ref}")))
    }
}

impl PhysicalExtensionCodec for DpflowCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let payload: PhysicalPayload = serde_json::from_slice(buf).map_err(enc_err)?;
        let input = || {
            inputs.first().cloned().ok_or_else(|| DataFusionError::Internal("dpflow operator needs an input".into()))
        };
        Ok(match payload {
            PhysicalPayload::Marginal { config, mode } => Arc::new(MarginalExec::try_new(input()?, config, mode)?),
            PhysicalPayload::Encode { domain, output, passthrough } => {
                let domain = domain.reindex().map_err(|e| DataFusionError::Internal(e.to_string()))?;
                Arc::new(EncodeExec::with_passthrough(input()?, Arc::new(domain), output, passthrough)?)
            }
            PhysicalPayload::Synthetic { plan, rows, partitions, chunk_rows, seed } => {
                let plan = plan.reindex().map_err(|e| DataFusionError::Internal(e.to_string()))?;
                match inputs.first() {
                    // Its chunk-range table (restricted, on a cluster, to a task's partitions).
                    Some(work) => {
                        Arc::new(SyntheticExec::with_work(Arc::new(plan), rows, chunk_rows, seed, work.clone())?)
                    }
                    None => Arc::new(SyntheticExec::try_new(Arc::new(plan), rows, partitions, chunk_rows, seed)?),
                }
            }
            PhysicalPayload::Fill { mut plan } => {
                plan.domain = plan.domain.reindex().map_err(|e| DataFusionError::Internal(e.to_string()))?;
                if let Some(m) = plan.model.as_mut() {
                    m.domain = m.domain.clone().reindex().map_err(|e| DataFusionError::Internal(e.to_string()))?;
                }
                Arc::new(FillNullsExec::try_new(input()?, Arc::new(plan))?)
            }
            PhysicalPayload::Knn { spec } => Arc::new(KnnDonorExec::try_new(input()?, spec)?),
            PhysicalPayload::KnnPass { mut read, rules, stage } => {
                read.domain = read.domain.reindex().map_err(|e| DataFusionError::Internal(e.to_string()))?;
                let schema = crate::domain::decoded_schema(&read.domain);
                let rules = rules
                    .into_iter()
                    .map(|(name, bytes)| {
                        let node =
                            <datafusion_proto::protobuf::PhysicalExprNode as prost::Message>::decode(bytes.as_slice())
                                .map_err(|e| {
                                    DataFusionError::Internal(format!("dpflow codec: a rule of {name:?}: {e}"))
                                })?;
                        let expr = datafusion_proto::physical_plan::from_proto::parse_physical_expr(
                            &node, ctx, &schema, self,
                        )?;
                        Ok((name, expr))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Arc::new(KnnPassExec::try_new(input()?, read, rules, stage)?)
            }
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let payload = if let Some(m) = node.downcast_ref::<MarginalExec>() {
            PhysicalPayload::Marginal { config: m.config().clone(), mode: m.mode() }
        } else if let Some(e) = node.downcast_ref::<EncodeExec>() {
            PhysicalPayload::Encode {
                domain: e.domain().as_ref().clone(),
                output: e.output(),
                passthrough: e.passthrough().to_vec(),
            }
        } else if let Some(s) = node.downcast_ref::<SyntheticExec>() {
            let (rows, partitions, chunk_rows, seed) = s.params();
            PhysicalPayload::Synthetic { plan: s.plan().as_ref().clone(), rows, partitions, chunk_rows, seed }
        } else if let Some(f) = node.downcast_ref::<FillNullsExec>() {
            PhysicalPayload::Fill { plan: f.plan().as_ref().clone() }
        } else if let Some(k) = node.downcast_ref::<KnnDonorExec>() {
            PhysicalPayload::Knn { spec: k.spec().clone() }
        } else if let Some(k) = node.downcast_ref::<KnnPassExec>() {
            let rules = k
                .rules()
                .iter()
                .map(|(name, expr)| {
                    let node = datafusion_proto::physical_plan::to_proto::serialize_physical_expr(expr, self)?;
                    Ok((name.clone(), prost::Message::encode_to_vec(&node)))
                })
                .collect::<Result<Vec<_>>>()?;
            PhysicalPayload::KnnPass { read: k.read().clone(), rules, stage: k.stage().clone() }
        } else {
            return Err(DataFusionError::NotImplemented(format!(
                "dpflow codec cannot encode operator {}",
                node.name()
            )));
        };
        buf.extend(serde_json::to_vec(&payload).map_err(enc_err)?);
        Ok(())
    }
}
