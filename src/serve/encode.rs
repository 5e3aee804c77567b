//! Arrow results as PostgreSQL rows: each Arrow type is sent as the nearest
//! PostgreSQL type (integers widen, unsigned types take the next signed
//! width, dates are `date`), anything else as `text` through Arrow's own
//! formatting. Nulls stay SQL `NULL`. Text or binary per column, as the
//! client asked.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, AsArray, BooleanArray, Date32Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
    RecordBatch, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Schema};
use pgwire::api::Type;
use pgwire::api::portal::Format;
use pgwire::api::results::{DataRowEncoder, FieldInfo};
use pgwire::error::PgWireResult;
use pgwire::messages::data::DataRow;

use super::sqlstate;

/// The PostgreSQL type an Arrow type is sent as, and the Arrow type it is cast to first.
fn target(dt: &DataType) -> (Type, DataType) {
    match dt {
        DataType::Boolean => (Type::BOOL, DataType::Boolean),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => (Type::INT2, DataType::Int16),
        DataType::Int32 | DataType::UInt16 => (Type::INT4, DataType::Int32),
        DataType::Int64 | DataType::UInt32 => (Type::INT8, DataType::Int64),
        DataType::Float16 | DataType::Float32 => (Type::FLOAT4, DataType::Float32),
        DataType::Float64 => (Type::FLOAT8, DataType::Float64),
        DataType::Date32 | DataType::Date64 => (Type::DATE, DataType::Date32),
        _ => (Type::TEXT, DataType::Utf8),
    }
}

/// The row description of `schema` in `format`.
pub fn fields(schema: &Schema, format: &Format) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| FieldInfo::new(f.name().clone(), None, None, target(f.data_type()).0, format.format_for(i)))
        .collect()
}

/// One result column, cast to its sending type and downcast once per batch.
enum Column<'a> {
    Bool(&'a BooleanArray),
    I16(&'a Int16Array),
    I32(&'a Int32Array),
    I64(&'a Int64Array),
    F32(&'a Float32Array),
    F64(&'a Float64Array),
    Date(&'a Date32Array),
    Text(&'a StringArray),
}

impl<'a> Column<'a> {
    fn of(a: &'a dyn Array) -> Self {
        match a.data_type() {
            DataType::Boolean => Column::Bool(a.as_boolean()),
            DataType::Int16 => Column::I16(a.as_primitive()),
            DataType::Int32 => Column::I32(a.as_primitive()),
            DataType::Int64 => Column::I64(a.as_primitive()),
            DataType::Float32 => Column::F32(a.as_primitive()),
            DataType::Float64 => Column::F64(a.as_primitive()),
            DataType::Date32 => Column::Date(a.as_primitive()),
            _ => Column::Text(a.as_string()),
        }
    }

    fn encode(&self, row: usize, enc: &mut DataRowEncoder) -> PgWireResult<()> {
        match self {
            Column::Bool(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
            Column::I16(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
            Column::I32(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
            Column::I64(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
            Column::F32(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
            Column::F64(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
            Column::Date(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value_as_date(row)).flatten()),
            Column::Text(a) => enc.encode_field(&(!a.is_null(row)).then(|| a.value(row))),
        }
    }
}

/// Encodes `batches` (of `schema`) as rows of `fields`.
pub fn rows(fields: Arc<Vec<FieldInfo>>, schema: &Schema, batches: &[RecordBatch]) -> PgWireResult<Vec<DataRow>> {
    let mut out = Vec::new();
    let mut enc = DataRowEncoder::new(fields.clone());
    let fail = |what: String| sqlstate::error(sqlstate::SYSTEM, what);
    for b in batches {
        if b.num_columns() != schema.fields().len() {
            return Err(fail("internal: a result batch does not match its described columns; please report it".into()));
        }
        let cast: Vec<Arc<dyn Array>> = b
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| cast(c, &target(f.data_type()).1))
            .collect::<Result<_, _>>()
            // The cast's own message is not shown: it could quote a value.
            .map_err(|_| fail("a result column could not be encoded for the client; please report it".into()))?;
        let cols: Vec<Column> = cast.iter().map(|c| Column::of(c.as_ref())).collect();
        for row in 0..b.num_rows() {
            for c in &cols {
                c.encode(row, &mut enc)?;
            }
            out.push(enc.take_row());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray, UInt8Array};
    use datafusion::arrow::datatypes::Field;

    #[test]
    fn types_map_to_the_nearest_postgres_type_and_nulls_stay_null() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("x", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("u", DataType::UInt8, true),
        ]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![Some(7), None])),
                Arc::new(Float64Array::from(vec![Some(1.5), Some(-2.0)])),
                Arc::new(StringArray::from(vec![None, Some("a")])),
                Arc::new(UInt8Array::from(vec![Some(255), Some(0)])),
            ],
        )
        .unwrap();
        let f = Arc::new(fields(&schema, &Format::UnifiedText));
        let types: Vec<Type> = f.iter().map(|x| x.datatype().clone()).collect();
        assert_eq!(types, vec![Type::INT8, Type::FLOAT8, Type::TEXT, Type::INT2]);
        let r = rows(f, &schema, &[b]).unwrap();
        assert_eq!(r.len(), 2);
        // Text format: length-prefixed values, -1 for NULL.
        let first = &r[0].data;
        assert_eq!(&first[..5], &[0, 0, 0, 1, b'7']);
        let second = &r[1].data;
        assert_eq!(&second[..4], &(-1i32).to_be_bytes());
    }
}
