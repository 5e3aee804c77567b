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

use crate::domain::{Domain, NotApplicable};

/// The compiled rules of a domain's columns. A rule that cannot be compiled
/// on this domain (it reads a column the output does not have) is left out.
pub fn rules(domain: &Domain) -> Vec<NotApplicable> {
    domain.columns().iter().filter_map(|c| NotApplicable::compile(domain, &c.name).ok().flatten()).collect()
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

/// [`enforce`] on every batch of a synthetic stream over `domain`.
pub fn enforce_stream(domain: &Domain, stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let rules = Arc::new(rules(domain));
    if rules.is_empty() {
        return stream;
    }
    let schema = stream.schema();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream.map(move |b| b.and_then(|b| enforce(&rules, b)))))
}
