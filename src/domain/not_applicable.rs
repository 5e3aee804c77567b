//! Two kinds of null (issue 24): a column's null means *not applicable*
//! (structural, e.g. the income of a child in the ACS, code "N" below age 15)
//! where the column's public rule `not_applicable_when` holds on the row, and
//! *unknown* (missing) everywhere else.
//!
//! A not-applicable null is never imputed, never a donor or donee, never
//! counted missing, and never enters a statistic of the column (a mean of
//! income is over the people it applies to). Synthetic output of the default
//! `reproduce` strategy enforces the rule (`crate::synth::structure`).
//!
//! The rule is public input (like bounds): an SQL boolean expression over
//! the row's *other* columns, typed as the domain types them (e.g.
//! `AGEP < 15`), or `TRUE` (every null is not applicable). Identifiers keep
//! their case. A rule that is null on a row (one of its inputs is null) does
//! not hold there. Because it reads only the row itself, whether a null is
//! not applicable depends on that row alone, never on other rows.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::{Domain, decoded_schema};

/// A compiled `not_applicable_when` rule of one column.
#[derive(Debug, Clone)]
pub struct NotApplicable {
    /// Position of the column in the domain (and in typed batches).
    position: usize,
    /// The rule, over the domain's typed schema.
    rule: Arc<dyn PhysicalExpr>,
    /// That schema (the domain's decoded schema).
    schema: datafusion::arrow::datatypes::SchemaRef,
}

/// Why a rule cannot be used; the message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column:?}: not_applicable_when {rule:?}: {problem}")]
pub struct RuleError {
    /// The column whose rule it is.
    pub column: String,
    /// The rule as written.
    pub rule: String,
    /// What is wrong.
    pub problem: String,
}

impl NotApplicable {
    /// Compiles the rule of `column` (None when it has no rule or is unknown).
    pub fn compile(domain: &Domain, column: &str) -> Result<Option<Self>, RuleError> {
        let Some(position) = domain.position(column) else { return Ok(None) };
        let Some(sql) = domain.columns()[position].not_applicable_when.as_deref() else { return Ok(None) };
        let err = |problem: String| RuleError { column: column.to_string(), rule: sql.to_string(), problem };
        let schema = decoded_schema(domain);
        let df_schema = DFSchema::try_from(schema.as_ref().clone()).map_err(|e| err(e.to_string()))?;
        // Identifiers keep their case (`AGEP`, not `agep`).
        let mut config = SessionConfig::new();
        config.options_mut().sql_parser.enable_ident_normalization = false;
        let ctx = SessionContext::new_with_config(config);
        let expr = ctx.parse_sql_expr(sql, &df_schema).map_err(|e| {
            err(format!("not an SQL expression over this domain's columns ({e}); write e.g. `AGEP < 15`"))
        })?;
        if expr.column_refs().iter().any(|c| c.name == column) {
            return Err(err("a rule reads the row's other columns, not the column it classifies".into()));
        }
        // It runs on every protected row: whether it fails must not depend on a row
        // (docs/PRIVACY.md §1.3). The same whitelist as DP SQL, before and after the
        // implicit casts of type coercion.
        let simplifier =
            ExprSimplifier::new(SimplifyContext::builder().with_schema(Arc::new(df_schema.clone())).build());
        let coerced = simplifier.coerce(expr.clone(), &df_schema).map_err(|e| err(e.to_string()))?;
        for e in [&expr, &coerced] {
            if let Some(why) = dpflow_udfs::rowsafe::may_fail(e, &df_schema) {
                return Err(err(format!("could fail on some row, which would reveal that row: {why}")));
            }
        }
        if coerced.is_volatile() {
            return Err(err("a rule must be a fixed function of the row (no random() or now())".into()));
        }
        let expr = coerced;
        let physical = ctx
            .create_physical_expr(expr, &df_schema)
            .map_err(|e| err(format!("cannot be evaluated ({e}); name columns of this domain")))?;
        match physical.data_type(&schema) {
            Ok(DataType::Boolean) => Ok(Some(NotApplicable { position, rule: physical, schema })),
            Ok(t) => Err(err(format!("is of type {t}, not boolean; write a condition such as `AGEP < 15`"))),
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// Checks every rule of a domain (at load time, before any data is read).
    pub fn check_all(domain: &Domain) -> Result<(), RuleError> {
        for c in domain.columns() {
            Self::compile(domain, &c.name)?;
        }
        Ok(())
    }

    /// Per row of a typed batch (the domain's decoded schema): whether the
    /// column is null *and* the rule holds (a not-applicable null).
    pub fn mask(&self, typed: &RecordBatch) -> datafusion::common::Result<Vec<bool>> {
        let holds = self.holds(typed)?;
        let col = typed.column(self.position);
        Ok((0..typed.num_rows()).map(|r| col.is_null(r) && holds[r]).collect())
    }

    /// Per row of a typed batch: whether the rule holds (a rule that is null does not).
    pub fn holds(&self, typed: &RecordBatch) -> datafusion::common::Result<Vec<bool>> {
        let typed = super::conform_to_decoded(typed, &self.schema)?;
        let holds = self.rule.evaluate(&typed)?.into_array(typed.num_rows())?;
        let holds = holds.as_boolean();
        Ok((0..typed.num_rows()).map(|r| holds.is_valid(r) && holds.value(r)).collect())
    }

    /// The rule, over the domain's decoded schema (`decoded_schema`); a
    /// null on a row where it holds is not applicable (see [`Self::mask`]).
    pub fn rule(&self) -> Arc<dyn PhysicalExpr> {
        self.rule.clone()
    }

    /// The column's position in the domain.
    pub fn position(&self) -> usize {
        self.position
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DomainSpec;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray, StringViewArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    fn domain(rule: &str) -> Result<Domain, String> {
        let y = format!(
            "columns:\n  - {{name: AGEP, kind: integer, bounds: [0, 99], nullable: true}}\n  - {{name: SEX, kind: categorical, values: [m, f]}}\n  - {{name: PINCP, kind: float, bins: {{edges: [0, 10, 100]}}, nullable: true, not_applicable_when: {rule}}}\n"
        );
        DomainSpec::parse(&y, "d.yaml").map(|s| s.domain).map_err(|e| e.to_string())
    }

    #[test]
    fn a_null_is_not_applicable_only_where_the_rule_holds() {
        let d = domain("'AGEP < 15'").unwrap();
        let na = NotApplicable::compile(&d, "PINCP").unwrap().unwrap();
        let batch = RecordBatch::try_new(
            decoded_schema(&d),
            vec![
                Arc::new(Int64Array::from(vec![Some(3), Some(40), Some(10), None, Some(70)])),
                Arc::new(StringArray::from(vec!["m", "f", "m", "f", "f"])),
                Arc::new(Float64Array::from(vec![None, None, Some(5.0), None, Some(50.0)])),
            ],
        )
        .unwrap();
        // Child with null: not applicable; adult with null: unknown; a value is a value;
        // a null age makes the rule null: unknown.
        assert_eq!(na.mask(&batch).unwrap(), vec![true, false, false, false, false]);
        assert_eq!(na.holds(&batch).unwrap(), vec![true, false, true, false, false]);
        assert!(NotApplicable::compile(&d, "AGEP").unwrap().is_none());
        let always = domain("true").unwrap();
        let na = NotApplicable::compile(&always, "PINCP").unwrap().unwrap();
        assert_eq!(na.mask(&batch).unwrap(), vec![true, true, false, true, false]);
        // A rule on a categorical column, on a Parquet read whose text is Utf8View.
        let d = domain("\"SEX = 'f' AND AGEP > 5\"").unwrap();
        let na = NotApplicable::compile(&d, "PINCP").unwrap().unwrap();
        let view = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("AGEP", DataType::Int64, true),
                Field::new("SEX", DataType::Utf8View, false),
                Field::new("PINCP", DataType::Float64, true),
            ])),
            vec![
                batch.column(0).clone(),
                Arc::new(StringViewArray::from(vec!["m", "f", "m", "f", "f"])),
                batch.column(2).clone(),
            ],
        )
        .unwrap();
        assert_eq!(na.holds(&view).unwrap(), vec![false, true, false, false, true]);
        assert_eq!(na.mask(&view).unwrap(), vec![false, true, false, false, false]);
    }

    #[test]
    fn bad_rules_are_refused_when_the_domain_loads() {
        for (rule, says) in [
            ("'NOPE < 15'", "NOPE"),
            ("'AGEP +'", "SQL"),
            ("'AGEP + 1'", "boolean"),
            ("'PINCP IS NULL'", "other columns"),
            // Could fail on one row (division by zero, a failing cast): a membership oracle.
            ("'100 / (AGEP - 37) < 0'", "could fail"),
            ("'CAST(SEX AS INT) = 1'", "could fail"),
            // A date out of chrono's range fails to format as text on exactly one row.
            (
                "\"CAST(TRY_CAST(CASE WHEN SEX = 'f' AND AGEP = 37 THEN 200000000 ELSE 0 END AS DATE) AS VARCHAR) <> ''\"",
                "could fail",
            ),
            ("'random() < 0.5'", "random"),
        ] {
            let e = domain(rule).unwrap_err();
            assert!(e.contains(says) && e.contains("not_applicable_when"), "{rule}: {e}");
        }
        let y = "columns:\n  - {name: a, kind: integer, bounds: [0, 9], not_applicable_when: 'TRUE'}\n";
        let e = DomainSpec::parse(y, "d.yaml").unwrap_err().to_string();
        assert!(e.contains("nullable: true"), "{e}");
    }
}
