//! `dp_marginals(table, 'a,b; c')` and
//! `synthesize(table, mechanism => 'aim', epsilon => 1, rows => 10000)`: DP
//! table functions (issue 20, item 5).
//!
//! Planning a call reads nothing: it checks the call's public arguments (the
//! table is protected and counts one row per person, the columns are in its
//! domain, the cells fit, the mechanism and workload exist), fixes the output
//! schema, and returns a placeholder table, [`DpTableCall`]. The engine
//! (`sql::table_plan`, `sql::table_release`) then finds every call in the plan, charges
//! them all at plan time, runs each one once in our own code, and swaps each
//! placeholder for its released rows before DataFusion executes the rest of
//! the query, which is post-processing. A call referenced twice (a CTE) is
//! one placeholder, so it is charged and noised once; a placeholder that
//! reached execution would fail without reading anything.
//!
//! * `dp_marginals` releases noisy contingency tables: one row per cell, with
//!   the marginal's label, the cell's values (SQL NULL is the null category of
//!   an attribute in the marginal, and fills the attributes not in it), the
//!   noisy `count` (a marginal written `a,b[observed]` counts only the rows
//!   with neither a nor b null, and has no null cells), the noise's standard deviation `sigma`, and the interval
//!   `ci_low`..`ci_high` at the catalog's confidence (or `confidence =>`).
//!   Privacy (NOTES §1, add/remove-one neighbours): one person changes one
//!   cell of each marginal by 1, so each marginal has L1 and L2 sensitivity
//!   1; k marginals under ρ-zCDP get discrete Gaussian noise with
//!   ρ/k each (σ² = k/2ρ), under pure ε discrete Laplace with ε/k each
//!   (scale k/ε), under (ε, δ) the zCDP ρ(ε, δ) (Canonne et al. 2020,
//!   Cor. 13). Null is a cell of its own: a null is never dropped or recoded.
//! * `synthesize` fits a synthesizer (AIM, MST, MWEM, independent, PrivBayes,
//!   PrivBayes-PGM) with the call's budget exactly as `dpflow synth` does and
//!   returns `rows` synthetic rows (default: the model's noisy total).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use datafusion::arrow::array::Array;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::NoiseDistribution;

use super::catalog::{PrivacyUnit, TableEntry};
use crate::measure::MarginalQuery;
use crate::missing::{Strategy, StrategyOptions};
use crate::privacy::{Budget, MechanismRecord};
use crate::synth::SynthOptions;
use crate::synth::run::Mechanism;

/// Most cells (output rows) one `dp_marginals` call may release.
pub const MAX_CELLS: u64 = 10_000_000;

/// The columns `dp_marginals` adds to the attributes.
pub const MARGINAL_COLUMNS: [&str; 5] = ["marginal", "count", "sigma", "ci_low", "ci_high"];

/// Which DP table function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpTableFunctionKind {
    /// `dp_marginals(table, 'a,b; c', ...)`.
    Marginals,
    /// `synthesize(table, mechanism => ..., ...)`.
    Synthesize,
}

impl DpTableFunctionKind {
    /// The SQL name.
    pub fn name(self) -> &'static str {
        match self {
            DpTableFunctionKind::Marginals => "dp_marginals",
            DpTableFunctionKind::Synthesize => "synthesize",
        }
    }
}

/// What one call releases.
#[derive(Debug, Clone)]
pub enum CallKind {
    /// Noisy marginals.
    Marginals {
        /// The marginals, in the order given.
        queries: Vec<MarginalQuery>,
        /// Every attribute of any marginal, in order of first appearance.
        columns: Vec<String>,
        /// Confidence level of the intervals.
        level: f64,
    },
    /// Synthetic rows.
    Synthesize {
        /// The synthesizer.
        mechanism: Mechanism,
        /// Rows (default: the model's noisy total).
        rows: Option<u64>,
        /// Workload spec (as `dpflow synth --workload`).
        workload: String,
        /// Missing-data strategy.
        missing: Strategy,
    },
}

/// One planned call: a placeholder table until the engine releases it.
#[derive(Debug, Clone)]
pub struct DpTableCall {
    /// Unique in the process: one id per call in the query text (a CTE
    /// referenced twice is one call).
    pub id: u64,
    /// The function.
    pub function: DpTableFunctionKind,
    /// The protected table.
    pub table: TableEntry,
    /// The call's own budget (`epsilon =>`, `rho =>`, `delta =>`), if given.
    pub budget: Option<Budget>,
    /// What it releases.
    pub kind: CallKind,
    schema: SchemaRef,
}

impl DpTableCall {
    /// `dp_marginals(adult)` — for messages and EXPLAIN.
    pub fn describe(&self) -> String {
        match &self.kind {
            CallKind::Marginals { queries, .. } => format!(
                "dp_marginals({}, '{}')",
                self.table.name,
                queries.iter().map(|q| q.label()).collect::<Vec<_>>().join("; ")
            ),
            CallKind::Synthesize { mechanism, .. } => {
                format!("synthesize({}, mechanism => '{}')", self.table.name, mechanism_name(*mechanism))
            }
        }
    }

    /// The noise of each marginal under `budget` (its share ρ/k, ε/k, or
    /// ρ(ε, δ)/k), nudged up by one part in 10⁹ so that the k charges never
    /// round above the budget.
    pub fn marginal_noise(k: usize, budget: &Budget) -> NoiseDistribution {
        let k = k as f64;
        let up = 1.0 + 1e-9;
        match *budget {
            Budget::Pure { epsilon } => {
                NoiseDistribution::Laplace { scale: dpflow_udfs::calibrate::laplace_scale(1.0, epsilon / k) * up }
            }
            _ => {
                let rho = budget.as_rho().expect("not pure");
                NoiseDistribution::Gaussian { sigma: dpflow_udfs::calibrate::gaussian_sigma_for_rho(1.0, rho / k) * up }
            }
        }
    }

    /// The mechanisms the call charges under `budget` (decided before any
    /// data is read): one per marginal, or the synthesis's whole budget in
    /// the synthesizer's unit (as `dpflow synth` charges it).
    pub fn records(&self, budget: &Budget) -> std::result::Result<Vec<MechanismRecord>, String> {
        match &self.kind {
            CallKind::Marginals { queries, .. } => {
                let noise = Self::marginal_noise(queries.len(), budget);
                if let Some(why) = noise.scale_refusal() {
                    return Err(why);
                }
                Ok(queries.iter().map(|q| crate::measure::marginal_record(q, noise)).collect())
            }
            CallKind::Synthesize { mechanism, workload, missing, .. } => {
                crate::synth::run::release_record(&self.table.dataset.name, *mechanism, budget, workload, *missing)
                    .map(|r| vec![r])
                    .map_err(|e| e.to_string())
            }
        }
    }
}

fn mechanism_name(m: Mechanism) -> String {
    serde_json::to_value(m).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The mechanisms `synthesize()` runs: those `run_synth` fits itself (the
/// others need options or a record file SQL has no place for: `dpflow
/// synth` or a pipeline step runs them).
pub const SQL_SYNTHESIZERS: [Mechanism; 6] = crate::synth::run::FITTED_SYNTHESIZERS;

#[async_trait]
impl TableProvider for DpTableCall {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Only dpflow's engine releases a call (charged, noised once); a plan
        // that reaches here was not run by it, and reads nothing.
        Err(DataFusionError::Plan(format!(
            "{}() runs only through dpflow's DP SQL engine, which charges it before releasing its rows",
            self.function.name()
        )))
    }
}

/// The `dp_marginals` or `synthesize` table function of one session.
#[derive(Debug)]
pub struct DpTableFunction {
    /// Which one.
    pub function: DpTableFunctionKind,
    /// The session's catalog tables.
    pub tables: BTreeMap<String, TableEntry>,
    /// Default confidence of intervals.
    pub confidence: f64,
}

static NEXT_CALL: AtomicU64 = AtomicU64::new(1);

fn string_value(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => {
            Some(s.clone())
        }
        _ => None,
    }
}

fn string(e: &Expr) -> Option<String> {
    match e {
        Expr::Literal(v, _) => string_value(v),
        _ => None,
    }
}

fn number(v: &ScalarValue) -> Option<f64> {
    if !v.data_type().is_numeric() {
        return None;
    }
    match v.cast_to(&DataType::Float64).ok()? {
        ScalarValue::Float64(Some(x)) => Some(x),
        _ => None,
    }
}

/// A literal, or a negated one.
fn value(e: &Expr) -> Option<ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Negative(x) => value(x)?.arithmetic_negate().ok(),
        _ => None,
    }
}

/// A rewritten named argument `named_struct('key', value)` (see
/// [`super::sites::DP_TABLE_FUNCTIONS`]), as planned (a call) or as
/// simplified (a one-field struct literal); `Some((key, None))` when the
/// value is not a literal.
fn named(e: &Expr) -> Option<(String, Option<ScalarValue>)> {
    match e {
        Expr::ScalarFunction(f) if f.name() == "named_struct" && f.args.len() == 2 => {
            Some((string(&f.args[0])?, value(&f.args[1])))
        }
        Expr::Literal(ScalarValue::Struct(a), _) if a.num_columns() == 1 && a.len() == 1 => {
            let key = a.fields()[0].name().clone();
            Some((key, ScalarValue::try_from_array(a.column(0), 0).ok()))
        }
        _ => None,
    }
}

impl DpTableFunction {
    fn err(&self, msg: impl std::fmt::Display) -> DataFusionError {
        DataFusionError::Plan(format!("{}(): {msg}", self.function.name()))
    }

    fn usage(&self) -> &'static str {
        match self.function {
            DpTableFunctionKind::Marginals => {
                "dp_marginals('table', 'a,b; c[observed]' [, rho => R | epsilon => E [, delta => D]] [, confidence => 0.95])"
            }
            DpTableFunctionKind::Synthesize => {
                "synthesize('table', mechanism => 'aim' [, rho => R | epsilon => E [, delta => D]] [, rows => N] \
                 [, workload => 'all-3way' (default)] [, missing => 'cells'])"
            }
        }
    }

    fn table(&self, name: &str) -> Result<TableEntry> {
        let Some(t) = self.tables.get(name) else {
            return Err(self.err(format!(
                "no table {name:?} in the catalog (tables: {})",
                self.tables.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        };
        if t.public {
            return Err(self.err(format!("{name} is public: count or sample it with ordinary SQL, no budget needed")));
        }
        if t.unit != PrivacyUnit::Row || t.max_rows_per_unit != 1 {
            return Err(self.err(format!(
                "{name}: marginals and synthesizers bound one row's influence, so they need privacy_unit: row with \
                 max_rows_per_unit: 1 (a person with k rows would move a count by k)"
            )));
        }
        if let Some(why) = t.dataset.domain().dp_read_refusal() {
            return Err(self.err(format!("table {name}: {why}")));
        }
        Ok(t.clone())
    }

    fn budget(&self, named: &BTreeMap<String, f64>) -> Result<Option<Budget>> {
        let (e, r, d) = (named.get("epsilon"), named.get("rho"), named.get("delta"));
        let b = match (e, r, d) {
            (None, None, None) => return Ok(None),
            (Some(&epsilon), None, None) => Budget::Pure { epsilon },
            (Some(&epsilon), None, Some(&delta)) => Budget::Approx { epsilon, delta },
            (None, Some(&rho), None) => Budget::Zcdp { rho },
            _ => {
                return Err(self.err(
                    "give rho =>, or epsilon => with an optional delta => (not both rho and epsilon, \
                     and delta only with epsilon)",
                ));
            }
        };
        b.validate().map_err(|e| self.err(e))?;
        Ok(Some(b))
    }
}

impl TableFunctionImpl for DpTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let mut positional = Vec::new();
        let mut numbers: BTreeMap<String, f64> = BTreeMap::new();
        let mut strings: BTreeMap<String, String> = BTreeMap::new();
        for e in args.exprs() {
            match named(e) {
                None => {
                    if !numbers.is_empty() || !strings.is_empty() {
                        return Err(self.err(format!("positional arguments come first: {}", self.usage())));
                    }
                    positional.push(
                        string(e)
                            .ok_or_else(|| self.err(format!("arguments are literals: {e} is not a string literal")))?,
                    );
                }
                Some((key, v)) => {
                    let known: &[&str] = match self.function {
                        DpTableFunctionKind::Marginals => &["epsilon", "rho", "delta", "confidence"],
                        DpTableFunctionKind::Synthesize => {
                            &["epsilon", "rho", "delta", "rows", "mechanism", "workload", "missing"]
                        }
                    };
                    let key = if key == "eps" { "epsilon".to_string() } else { key };
                    if !known.contains(&key.as_str()) {
                        return Err(self.err(format!("unknown argument {key:?}: {}", self.usage())));
                    }
                    if numbers.contains_key(&key) || strings.contains_key(&key) {
                        return Err(self.err(format!("{key} => is given twice")));
                    }
                    if ["mechanism", "workload", "missing"].contains(&key.as_str()) {
                        let s = v
                            .as_ref()
                            .and_then(string_value)
                            .ok_or_else(|| self.err(format!("{key} => takes a string literal")))?;
                        strings.insert(key, s);
                    } else {
                        let x = v
                            .as_ref()
                            .and_then(number)
                            .filter(|x| x.is_finite())
                            .ok_or_else(|| self.err(format!("{key} => takes a number literal")))?;
                        numbers.insert(key, x);
                    }
                }
            }
        }
        let want = match self.function {
            DpTableFunctionKind::Marginals => 2,
            DpTableFunctionKind::Synthesize => 1,
        };
        if positional.len() != want {
            return Err(self.err(format!("takes {want} positional argument(s): {}", self.usage())));
        }
        let table = self.table(&positional[0])?;
        let budget = self.budget(&numbers)?;
        let domain = table.dataset.domain().clone();
        let (kind, schema) = match self.function {
            DpTableFunctionKind::Marginals => {
                let level = numbers.get("confidence").copied().unwrap_or(self.confidence);
                if !(level > 0.0 && level < 1.0) {
                    return Err(self.err(format!("confidence => must be between 0 and 1, got {level}")));
                }
                let (queries, columns) = self.marginals(&positional[1], &table)?;
                let mut fields = vec![Field::new("marginal", DataType::Utf8, false)];
                fields.extend(columns.iter().map(|c| Field::new(c, DataType::Utf8, true)));
                fields.push(Field::new("count", DataType::Int64, false));
                for c in ["sigma", "ci_low", "ci_high"] {
                    fields.push(Field::new(c, DataType::Float64, false));
                }
                (CallKind::Marginals { queries, columns, level }, Arc::new(Schema::new(fields)))
            }
            DpTableFunctionKind::Synthesize => {
                let Some(m) = strings.get("mechanism") else {
                    return Err(self.err(format!("mechanism => is required: {}", self.usage())));
                };
                let mechanism: Mechanism = serde_json::from_value(serde_json::Value::String(m.to_ascii_lowercase()))
                    .map_err(|_| self.err(format!("unknown mechanism {m:?}")))?;
                if !SQL_SYNTHESIZERS.contains(&mechanism) {
                    return Err(self.err(format!(
                        "{m} is not available from SQL (it needs options SQL has no place for): use `dpflow synth` or \
                         a pipeline step; SQL runs {}",
                        SQL_SYNTHESIZERS.iter().map(|m| mechanism_name(*m)).collect::<Vec<_>>().join(", ")
                    )));
                }
                let rows = match numbers.get("rows") {
                    None => None,
                    Some(&r) if r.fract() == 0.0 && r >= 1.0 && r <= super::synthetic::MAX_ROWS as f64 => {
                        Some(r as u64)
                    }
                    Some(r) => {
                        return Err(self.err(format!(
                            "rows => must be a whole number from 1 to {}, got {r}",
                            super::synthetic::MAX_ROWS
                        )));
                    }
                };
                let missing = match strings.get("missing") {
                    None => Strategy::default(),
                    Some(s) => s.parse::<Strategy>().map_err(|e| self.err(format!("missing => {s:?}: {e}")))?,
                };
                if missing == Strategy::ImputeFirst(crate::missing::ImputeMethod::ModeStability) {
                    return Err(self.err(
                        "missing => 'impute-first:mode-stability' needs a public bound on the missing cells, which \
                         SQL has no place for: use `dpflow synth --max-missing-cells` or a pipeline step",
                    ));
                }
                crate::synth::run::check_settings(&SynthOptions::default(), &StrategyOptions::default())
                    .map_err(|e| self.err(e))?;
                let model_domain = if missing.models_nulls() { domain.clone() } else { domain.without_nulls() };
                // Default: every 3-way marginal (as `dpflow synth`), or all columns on a narrower table.
                let workload = strings
                    .get("workload")
                    .cloned()
                    .unwrap_or_else(|| format!("all-{}way", model_domain.names().len().clamp(1, 3)));
                crate::synth::workload::Workload::parse(&workload, &model_domain)
                    .map_err(|e| self.err(format!("workload => {workload:?}: {e}")))?;
                // The output's not-applicable rules compile from the public domain alone.
                crate::synth::structure::rules(&model_domain).map_err(|e| self.err(format!("{}: {e}", table.name)))?;
                let schema = dpflow_udfs::domain::decoded_schema(&model_domain);
                (CallKind::Synthesize { mechanism, rows, workload, missing }, schema)
            }
        };
        Ok(Arc::new(DpTableCall {
            id: NEXT_CALL.fetch_add(1, Ordering::Relaxed),
            function: self.function,
            table,
            budget,
            kind,
            schema,
        }))
    }
}

/// Cells of one attribute in a marginal: its categories, and its null cell
/// unless the marginal is observed-only.
pub(super) fn cells_of(c: &dpflow_udfs::domain::Column, mode: NullMode) -> usize {
    match (mode, c.null_code()) {
        (NullMode::Observed, Some(_)) => c.cardinality() - 1,
        _ => c.cardinality(),
    }
}

impl DpTableFunction {
    /// `'a,b; c[observed]'` → the marginals and the attributes they cover.
    fn marginals(&self, spec: &str, table: &TableEntry) -> Result<(Vec<MarginalQuery>, Vec<String>)> {
        let domain = table.dataset.domain();
        let mut queries: Vec<MarginalQuery> = Vec::new();
        let mut columns: Vec<String> = Vec::new();
        let mut cells: u64 = 0;
        for part in spec.split(';') {
            // `a,b[observed]`: rows with a null in any of a, b are left out (no null cells).
            let (body, mode) = match part.trim().strip_suffix("[observed]") {
                Some(b) => (b, NullMode::Observed),
                None => (part, NullMode::Cells),
            };
            let attrs: Vec<String> = body.split(',').map(|a| a.trim().to_string()).collect();
            if attrs.iter().any(|a| a.is_empty()) {
                return Err(self.err(format!(
                    "marginal {:?}: give column names separated by commas, marginals by semicolons, e.g. 'sex,race; age'",
                    part.trim()
                )));
            }
            let mut size: u64 = 1;
            for (i, a) in attrs.iter().enumerate() {
                let Some(c) = domain.column(a) else {
                    return Err(self.err(format!(
                        "{}: unknown column {a:?} (columns: {})",
                        table.name,
                        domain.names().join(", ")
                    )));
                };
                if attrs[..i].contains(a) {
                    return Err(self.err(format!("marginal {:?} names {a} twice", part.trim())));
                }
                if MARGINAL_COLUMNS.contains(&a.as_str()) {
                    return Err(self.err(format!(
                        "column {a:?} clashes with the output column of that name ({})",
                        MARGINAL_COLUMNS.join(", ")
                    )));
                }
                size = size.saturating_mul(cells_of(c, mode) as u64);
                if !columns.contains(a) {
                    columns.push(a.clone());
                }
            }
            let q = MarginalQuery { attrs, mode };
            if queries.contains(&q) {
                return Err(self.err(format!("marginal {:?} is given twice", part.trim())));
            }
            queries.push(q);
            cells = cells.saturating_add(size);
        }
        if cells > MAX_CELLS {
            return Err(self.err(format!(
                "the marginals have {cells} cells in all; at most {MAX_CELLS} per call (coarsen the domain's bins or \
                 ask for fewer columns)"
            )));
        }
        Ok((queries, columns))
    }
}
