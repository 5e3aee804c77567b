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
use datafusion::physical_plan::ExecutionPlan;

use super::{Domain, DomainOutput, EncodeExec, encoded_schema};

/// A table of codes (or typed values) over a raw table and its domain.
#[derive(Debug)]
pub struct EncodedTable {
    inner: Arc<dyn TableProvider>,
    domain: Arc<Domain>,
    schema: SchemaRef,
    output: DomainOutput,
}

impl EncodedTable {
    /// Wraps `inner`; every domain column must exist in it.
    pub fn try_new(inner: Arc<dyn TableProvider>, domain: Arc<Domain>) -> Result<Self> {
        let raw = inner.schema();
        for c in domain.columns() {
            raw.index_of(&c.name)
                .map_err(|_| DataFusionError::Plan(format!("domain column {:?} is not in the table", c.name)))?;
        }
        Ok(Self { schema: encoded_schema(&domain), inner, domain, output: DomainOutput::Codes })
    }

    /// Like [`EncodedTable::try_new`] but presenting typed, normalised values
    /// (labels, Int64, Float64, Boolean; null tokens and policies applied).
    pub fn typed(inner: Arc<dyn TableProvider>, domain: Arc<Domain>) -> Result<Self> {
        let mut t = Self::try_new(inner, domain)?;
        t.schema = super::decoded_schema(&t.domain);
        t.output = DomainOutput::Typed;
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
        // Encode only the projected domain columns; no filter or limit pushdown
        // (both would change which rows are counted).
        let wanted: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.domain.len()).collect(),
        };
        let names: Vec<&str> = wanted.iter().map(|&i| self.domain.columns()[i].name.as_str()).collect();
        let sub = Arc::new(self.domain.project(&names).map_err(DataFusionError::Plan)?);
        let raw = self.inner.schema();
        let raw_proj: Vec<usize> = names.iter().map(|n| raw.index_of(n)).collect::<std::result::Result<_, _>>()?;
        let scan = self.inner.scan(state, Some(&raw_proj), &[], None).await?;
        let encoded: Arc<dyn ExecutionPlan> = Arc::new(EncodeExec::with_output(scan, sub, self.output)?);
        // EncodeExec emits the sub-domain's columns in projection order already.
        Ok(encoded)
    }
}
