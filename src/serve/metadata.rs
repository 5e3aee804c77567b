//! The metadata session of one analyst: what SQL clients ask on connect and
//! when browsing (`pg_catalog`, `information_schema`, `version()`, psql's
//! `\d`), answered without touching protected data. It holds the analyst's
//! role tables as **empty** tables with their public schemas (the domain
//! types), the `pg_catalog` tables of `datafusion-pg-catalog` built from
//! them, and the `dp_budget()` table function. DDL, DML and statements that
//! change the session are refused, and nothing in it can read a file.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use crate::privacy::Ledger;
use crate::sql::{AnalystBudget, Catalog, analyst_budgets};

/// The database name clients see.
pub const DATABASE: &str = "dpflow";

/// The columns of `dp_budget()`.
pub fn budget_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("dataset", DataType::Utf8, false),
        Field::new("grant", DataType::Utf8, false),
        Field::new("spent", DataType::Float64, false),
        Field::new("remaining", DataType::Float64, false),
        Field::new("dataset_remaining", DataType::Float64, false),
    ]))
}

/// `rows` as one batch of [`budget_schema`].
pub fn budget_batch(rows: &[AnalystBudget]) -> DfResult<RecordBatch> {
    let f = |g: fn(&AnalystBudget) -> f64| Arc::new(rows.iter().map(g).collect::<Float64Array>()) as ArrayRef;
    Ok(RecordBatch::try_new(
        budget_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.dataset.as_str()))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.grant.as_ref().map_or("none".to_string(), |b| b.describe())),
            )),
            f(|r| r.spent),
            f(|r| r.remaining),
            f(|r| r.dataset_remaining),
        ],
    )?)
}

/// `dp_budget()`: the analyst's grant, spending and what is left per ledger
/// dataset, read from the ledger when the query is planned (the session's
/// own connection to it, opened on first use).
#[derive(Debug)]
struct DpBudget {
    catalog: Catalog,
    analyst: String,
    ledger: parking_lot::Mutex<Option<Ledger>>,
}

impl TableFunctionImpl for DpBudget {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return Err(DataFusionError::Plan("dp_budget() takes no arguments".into()));
        }
        let mut ledger = self.ledger.lock();
        if ledger.is_none() {
            let path = self
                .catalog
                .ledger
                .as_ref()
                .ok_or_else(|| DataFusionError::Plan("the catalog has no ledger".into()))?;
            *ledger = Some(Ledger::open(path).map_err(|e| DataFusionError::External(Box::new(e)))?);
        }
        let rows = analyst_budgets(ledger.as_ref().expect("opened"), &self.catalog, &self.analyst)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(Arc::new(MemTable::try_new(budget_schema(), vec![vec![budget_batch(&rows)?]])?))
    }
}

/// What `version()` answers: a PostgreSQL version string, as clients parse
/// it (SQLAlchemy reads the number after "PostgreSQL").
pub const VERSION: &str = concat!("PostgreSQL 16.0 (dpflow ", env!("CARGO_PKG_VERSION"), ": DP SQL server)");

fn version_udf() -> datafusion::logical_expr::ScalarUDF {
    use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
    use datafusion::scalar::ScalarValue;
    create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(|_| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(VERSION.to_string()))))),
    )
}

/// `to_regtype(name)`: NULL, "no such type" (clients ask it for extension
/// types such as hstore, which dpflow has none of; SQLAlchemy asks on connect).
fn to_regtype_udf() -> datafusion::logical_expr::ScalarUDF {
    use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
    use datafusion::scalar::ScalarValue;
    create_udf(
        "to_regtype",
        vec![DataType::Utf8],
        DataType::Int32,
        Volatility::Immutable,
        Arc::new(|_| Ok(ColumnarValue::Scalar(ScalarValue::Int32(None)))),
    )
}

/// One analyst's metadata session.
pub struct Metadata {
    ctx: SessionContext,
    parser: PostgresCompatibilityParser,
}

impl Metadata {
    /// A session with `tables` (name, public schema) as empty tables, the
    /// pg_catalog over them, and `dp_budget()` for `analyst` on `catalog`.
    pub fn new(tables: &[(String, SchemaRef)], catalog: Catalog, analyst: &str) -> DfResult<Self> {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(DATABASE, "public")
            .with_information_schema(true)
            .with_create_default_catalog_and_schema(true);
        let ctx = SessionContext::new_with_config(config);
        for (name, schema) in tables {
            ctx.register_table(name.as_str(), Arc::new(MemTable::try_new(schema.clone(), vec![vec![]])?))?;
        }
        datafusion_pg_catalog::setup_pg_catalog(&ctx, DATABASE, EmptyContextProvider).map_err(|e| *e)?;
        ctx.register_udf(version_udf());
        ctx.register_udf(to_regtype_udf());
        ctx.register_udtf(
            super::route::DP_BUDGET,
            Arc::new(DpBudget { catalog, analyst: analyst.to_string(), ledger: Default::default() }),
        );
        Ok(Self { ctx, parser: PostgresCompatibilityParser::new() })
    }

    /// Plans `sql` (PostgreSQL client dialect, rewritten for DataFusion) as a
    /// read-only query.
    pub async fn plan(&self, sql: &str) -> DfResult<LogicalPlan> {
        let mut stmts = self.parser.parse(sql).map_err(|e| DataFusionError::SQL(Box::new(e), None))?;
        if stmts.len() != 1 {
            return Err(DataFusionError::Plan("send one statement per query".into()));
        }
        let stmt = DfStatement::Statement(Box::new(stmts.remove(0)));
        let plan = self.ctx.state().statement_to_plan(stmt).await?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)?;
        Ok(plan)
    }

    /// Runs `sql` with the values of its placeholders (`$1`, ...): its schema and batches.
    pub async fn query(
        &self,
        sql: &str,
        params: Vec<datafusion::scalar::ScalarValue>,
    ) -> DfResult<(SchemaRef, Vec<RecordBatch>)> {
        let mut plan = self.plan(sql).await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params)?;
        }
        let df = self.ctx.execute_logical_plan(plan).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        Ok((schema, df.collect().await?))
    }

    /// The schema `sql` would return.
    pub async fn describe(&self, sql: &str) -> DfResult<SchemaRef> {
        Ok(Arc::new(self.plan(sql).await?.schema().as_arrow().clone()))
    }
}
