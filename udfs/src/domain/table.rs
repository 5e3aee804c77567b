//! `EncodedTable`: a table provider presenting another table through its
//! public domain, as dense UInt32 codes (scan = `EncodeExec` over the inner
//! scan of the needed columns).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::TableType;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;

use super::{Domain, DomainOutput, EncodeExec, encoded_schema};

/// A table of codes (or typed values) over a raw table and its domain.
#[derive(Debug)]
pub struct EncodedTable {
    inner: Arc<dyn TableProvider>,
    domain: Arc<Domain>,
    schema: SchemaRef,
    output: DomainOutput,
    passthrough: Vec<String>,
}

impl EncodedTable {
    /// Wraps `inner`; every domain column must exist in it.
    pub fn try_new(inner: Arc<dyn TableProvider>, domain: Arc<Domain>) -> Result<Self> {
        let raw = inner.schema();
        for c in domain.columns() {
            raw.index_of(&c.name)
                .map_err(|_| DataFusionError::Plan(format!("domain column {:?} is not in the table", c.name)))?;
        }
        Ok(Self { schema: encoded_schema(&domain), inner, domain, output: DomainOutput::Codes, passthrough: vec![] })
    }

    /// Like [`EncodedTable::try_new`] but presenting typed, normalised values
    /// (labels, Int64, Float64, Boolean; null tokens and policies applied).
    pub fn typed(inner: Arc<dyn TableProvider>, domain: Arc<Domain>) -> Result<Self> {
        Self::typed_with(inner, domain, vec![])
    }

    /// Typed values plus raw `passthrough` columns (e.g. the privacy unit).
    pub fn typed_with(inner: Arc<dyn TableProvider>, domain: Arc<Domain>, passthrough: Vec<String>) -> Result<Self> {
        let mut t = Self::try_new(inner, domain)?;
        let enc = super::BatchEncoder::new(t.domain.clone(), &t.inner.schema())
            .and_then(|e| e.with_passthrough(&t.inner.schema(), &passthrough))
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        t.schema = enc.typed_schema(&t.inner.schema());
        t.output = DomainOutput::Typed;
        t.passthrough = passthrough;
        Ok(t)
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }
}

#[async_trait]
impl TableProvider for EncodedTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Read the projected domain columns plus every `drop-row` column, so that the row set
        // is the same whatever is projected (a dropped row is dropped for every query); no
        // filter or limit pushdown (both would change which rows are counted). Columns with
        // the other policies are read only when used: `clip`/`null` never change the row set,
        // and an `error` column is validated by the queries that read it.
        let n = self.domain.len();
        let keep: Vec<bool> = match projection {
            None => vec![true; n],
            Some(p) => {
                let mut k: Vec<bool> =
                    self.domain.columns().iter().map(|c| c.out_of_domain == super::OutOfDomain::DropRow).collect();
                for &i in p.iter().filter(|&&i| i < n) {
                    k[i] = true;
                }
                if !k.iter().any(|&x| x) && n > 0 {
                    k[0] = true; // something to count rows with
                }
                k
            }
        };
        let names: Vec<&str> =
            self.domain.names().into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c).collect();
        let sub = Arc::new(self.domain.project(&names).map_err(|e| DataFusionError::Plan(e.to_string()))?);
        let raw = self.inner.schema();
        let mut raw_cols: Vec<usize> = names.iter().map(|n| raw.index_of(n)).collect::<std::result::Result<_, _>>()?;
        for p in &self.passthrough {
            raw_cols.push(raw.index_of(p)?);
        }
        let scan = self.inner.scan(state, Some(&raw_cols), &[], None).await?;
        let encoded: Arc<dyn ExecutionPlan> =
            Arc::new(EncodeExec::with_passthrough(scan, sub, self.output, self.passthrough.clone())?);
        let Some(projection) = projection else { return Ok(encoded) };
        // Map the caller's projection (over the full domain + passthrough) onto the sub-layout.
        let mut position = vec![usize::MAX; n];
        for (j, i) in (0..n).filter(|&i| keep[i]).enumerate() {
            position[i] = j;
        }
        let mapped: Vec<usize> =
            projection.iter().map(|&i| if i < n { position[i] } else { names.len() + (i - n) }).collect();
        project(encoded, Some(&mapped))
    }

    fn statistics(&self) -> Option<datafusion::common::Statistics> {
        // Never expose statistics of private data (no answers from file metadata).
        None
    }
}

/// Applies a scan projection to a plan.
pub fn project(plan: Arc<dyn ExecutionPlan>, projection: Option<&Vec<usize>>) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(p) = projection else { return Ok(plan) };
    let schema = plan.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = p
        .iter()
        .map(|&i| {
            let name = schema.field(i).name().clone();
            (Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>, name)
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
}
