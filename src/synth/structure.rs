//! Not-applicable structure in synthetic output (issue 24): wherever a
//! column's public `not_applicable_when` rule holds on a synthetic row, the
//! column is null (e.g. no income below age 15), exactly as in real data.
//! The model already learns the null code jointly with the other columns
//! (null-as-cell); this makes the structure exact rather than approximate.
//! It reads only synthetic rows and the public domain: post-processing.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::nullif;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::domain::{Domain, NotApplicable, RuleError};

/// The compiled rules of the output domain's nullable columns; compile them
/// before anything is charged (a rule that does not compile is an error,
/// never silently dropped). A column the missing-data strategy made
/// non-nullable (`complete-row`, `impute-first:*`, `adaptive` model no nulls)
/// has no null to set: its rule is not enforced there.
pub fn rules(domain: &Domain) -> Result<Vec<NotApplicable>, RuleError> {
    let mut out = Vec::new();
    for c in domain.columns().iter().filter(|c| c.nullable) {
        out.extend(NotApplicable::compile(domain, &c.name)?);
    }
    Ok(out)
}

/// Sets each ruled column to null where its rule holds.
pub fn enforce(rules: &[NotApplicable], batch: RecordBatch) -> datafusion::common::Result<RecordBatch> {
    if rules.is_empty() {
        return Ok(batch);
    }
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for rule in rules {
        // Rules read the row as generated (never a column another rule has just nulled).
        let holds = BooleanArray::from(rule.holds(&batch)?);
        columns[rule.position()] = nullif(&columns[rule.position()], &holds)?;
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// [`enforce`] on every batch of a synthetic stream (`rules` from [`rules`]).
pub fn enforce_stream(rules: Vec<NotApplicable>, stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let rules = Arc::new(rules);
    if rules.is_empty() {
        return stream;
    }
    let schema = stream.schema();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream.map(move |b| b.and_then(|b| enforce(&rules, b)))))
}
