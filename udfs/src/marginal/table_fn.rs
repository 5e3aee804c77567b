//! `marginals(table, sets [, mode])`: a SQL table function returning the exact
//! marginals of an encoded table, e.g.
//! `SELECT * FROM marginals('adult', 'age,income; race,sex')`.
//!
//! These are exact counts: register this function only in curator-side
//! sessions. DP SQL exposes noisy marginals instead.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use parking_lot::RwLock;

use super::{EncodedColumn, MarginalConfig, MarginalSet, NullMode, marginal_output_schema, plan_marginals};
use crate::domain::{Domain, EncodedTable, project};

/// Parses `"a,b; c"` (optionally `"observed:a,b"` per set) into attribute-name sets.
pub fn parse_sets(spec: &str, default_mode: NullMode) -> Result<Vec<(Vec<String>, NullMode)>> {
    let mut out = Vec::new();
    for part in spec.split(';') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (mode, attrs) = match part.split_once(':') {
            Some((m, rest)) => (parse_mode(m.trim())?, rest),
            None => (default_mode, part),
        };
        let attrs: Vec<String> = attrs.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
        if attrs.is_empty() {
            return Err(DataFusionError::Plan(format!("empty attribute set in {spec:?}")));
        }
        out.push((attrs, mode));
    }
    if out.is_empty() {
        return Err(DataFusionError::Plan("no attribute sets given".into()));
    }
    Ok(out)
}

fn parse_mode(m: &str) -> Result<NullMode> {
    match m {
        "cells" | "null_as_cell" => Ok(NullMode::Cells),
        "observed" | "observed_only" => Ok(NullMode::Observed),
        other => Err(DataFusionError::Plan(format!("unknown null mode {other:?} (use cells or observed)"))),
    }
}

/// Builds a marginal config for named attribute sets over a domain.
pub fn config_for(domain: &Domain, sets: &[(Vec<String>, NullMode)]) -> Result<MarginalConfig> {
    let mut used: Vec<String> = Vec::new();
    let mut position = HashMap::new();
    let mut out_sets = Vec::new();
    for (attrs, mode) in sets {
        let mut idx = Vec::new();
        for a in attrs {
            if domain.column(a).is_none() {
                return Err(DataFusionError::Plan(format!(
                    "unknown column {a:?} (columns: {})",
                    domain.names().join(", ")
                )));
            }
            let p = *position.entry(a.clone()).or_insert_with(|| {
                used.push(a.clone());
                used.len() - 1
            });
            idx.push(p);
        }
        out_sets.push(MarginalSet { attrs: idx, mode: *mode });
    }
    let columns = used
        .iter()
        .map(|n| {
            let c = domain.column(n).expect("checked");
            EncodedColumn { name: n.clone(), cardinality: c.cardinality() as u32, null_code: c.null_code() }
        })
        .collect();
    let config = MarginalConfig { columns, sets: out_sets };
    config.validate()?;
    Ok(config)
}

/// The `marginals` table function over a registry of encoded tables.
#[derive(Debug, Default)]
pub struct MarginalsFunction {
    tables: RwLock<HashMap<String, Arc<EncodedTable>>>,
}

impl MarginalsFunction {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `table` available under `name`.
    pub fn register(&self, name: &str, table: Arc<EncodedTable>) {
        self.tables.write().insert(name.to_string(), table);
    }
}

fn literal_string(e: &Expr, what: &str) -> Result<String> {
    match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Ok(s.clone()),
        other => Err(DataFusionError::Plan(format!("marginals(): {what} must be a string literal, got {other}"))),
    }
}

impl TableFunctionImpl for MarginalsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if !(2..=3).contains(&exprs.len()) {
            return Err(DataFusionError::Plan(
                "marginals(table, 'a,b; c' [, 'cells'|'observed']) takes 2 or 3 arguments".into(),
            ));
        }
        let name = literal_string(&exprs[0], "the table name")?;
        let sets = literal_string(&exprs[1], "the attribute sets")?;
        let mode = match exprs.get(2) {
            Some(e) => parse_mode(&literal_string(e, "the null mode")?)?,
            None => NullMode::Cells,
        };
        let table =
            self.tables.read().get(&name).cloned().ok_or_else(|| {
                DataFusionError::Plan(format!("marginals(): no encoded table {name:?} is registered"))
            })?;
        let config = config_for(table.domain(), &parse_sets(&sets, mode)?)?;
        Ok(Arc::new(MarginalsTable { source: table, config }))
    }
}

/// The table a `marginals(...)` call returns.
#[derive(Debug)]
pub struct MarginalsTable {
    source: Arc<EncodedTable>,
    config: MarginalConfig,
}

#[async_trait]
impl TableProvider for MarginalsTable {
    fn schema(&self) -> SchemaRef {
        marginal_output_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = self.source.schema();
        let cols: Vec<usize> =
            self.config.columns.iter().map(|c| schema.index_of(&c.name)).collect::<std::result::Result<_, _>>()?;
        let input = self.source.scan(state, Some(&cols), &[], None).await?;
        let plan = plan_marginals(input, self.config.clone())?;
        project(plan, projection)
    }
}
