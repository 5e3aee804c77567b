//! Parquet (zstd) writes to any registered object store, streaming.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::context::SessionContext;
use datafusion::parquet::arrow::AsyncArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::IoError;
use super::store::{register_stores_for, resolve_url, store_for};

/// The store and path of an output, local directories created.
fn output(ctx: &SessionContext, location: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath), IoError> {
    let url = resolve_url(location)?;
    register_stores_for(ctx, &url)?;
    if url.scheme() == "file"
        && let Ok(p) = url.to_file_path()
        && let Some(dir) = p.parent()
    {
        std::fs::create_dir_all(dir).map_err(|source| IoError::CreateDir { dir: dir.display().to_string(), source })?;
    }
    let store = store_for(ctx, &url)?;
    let path = ObjectPath::from_url_path(url.path())
        .map_err(|source| IoError::BadPath { location: location.to_string(), source })?;
    Ok((store, path))
}

/// An open Parquet output; write batches, then [`ParquetSink::finish`].
pub struct ParquetSink {
    writer: AsyncArrowWriter<BufWriter>,
    rows: u64,
    location: String,
}

impl ParquetSink {
    /// Creates (or replaces) the Parquet object at `location`.
    pub async fn create(ctx: &SessionContext, location: &str, schema: SchemaRef) -> Result<Self, IoError> {
        let (store, path) = output(ctx, location)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).expect("valid level")))
            .set_max_row_group_row_count(Some(1 << 20))
            .build();
        let object_writer = BufWriter::new(store, path);
        let writer = AsyncArrowWriter::try_new(object_writer, schema, Some(props))
            .map_err(|source| IoError::Parquet { action: "creating", location: location.to_string(), source })?;
        Ok(Self { writer, rows: 0, location: location.to_string() })
    }

    /// Appends a batch.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<(), IoError> {
        self.rows += batch.num_rows() as u64;
        self.writer.write(batch).await.map_err(|source| IoError::Parquet {
            action: "writing",
            location: self.location.clone(),
            source,
        })
    }

    /// Flushes and closes the file; returns the number of rows written.
    pub async fn finish(self) -> Result<u64, IoError> {
        let location = self.location;
        self.writer.close().await.map_err(|source| IoError::Parquet { action: "closing", location, source })?;
        Ok(self.rows)
    }
}

/// Writes a whole stream as CSV (with a header; nulls as empty fields).
pub async fn write_csv_stream(
    ctx: &SessionContext,
    location: &str,
    mut stream: SendableRecordBatchStream,
) -> Result<u64, IoError> {
    use tokio::io::AsyncWriteExt;
    let (store, path) = output(ctx, location)?;
    let output_err = |action| move |source| IoError::Output { action, location: location.to_string(), source };
    let mut out = BufWriter::new(store, path);
    let mut rows = 0u64;
    let mut header = true;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|source| IoError::Stream { location: location.to_string(), source })?;
        rows += batch.num_rows() as u64;
        let mut buf = Vec::new();
        {
            let mut w = datafusion::arrow::csv::WriterBuilder::new().with_header(header).build(&mut buf);
            w.write(&batch).map_err(|source| IoError::Csv { location: location.to_string(), source })?;
        }
        header = false;
        out.write_all(&buf).await.map_err(output_err("writing"))?;
    }
    out.shutdown().await.map_err(output_err("closing"))?;
    Ok(rows)
}

/// Writes bytes to a file or object (creating local directories).
pub async fn write_bytes(ctx: &SessionContext, location: &str, bytes: Vec<u8>) -> Result<(), IoError> {
    let (store, path) = output(ctx, location)?;
    store.put(&path, bytes.into()).await.map_err(|source| IoError::Store {
        action: "writing",
        location: location.to_string(),
        source,
    })?;
    Ok(())
}

/// Reads a whole (small) file or object.
pub async fn read_bytes(ctx: &SessionContext, location: &str) -> Result<Vec<u8>, IoError> {
    let url = resolve_url(location)?;
    register_stores_for(ctx, &url)?;
    let store = store_for(ctx, &url)?;
    let path = ObjectPath::from_url_path(url.path())
        .map_err(|source| IoError::BadPath { location: location.to_string(), source })?;
    let reading = |source| IoError::Store { action: "reading", location: location.to_string(), source };
    let r = store.get(&path).await.map_err(reading)?;
    Ok(r.bytes().await.map_err(reading)?.to_vec())
}

/// Writes a stream as Parquet, or as CSV when the location ends in `.csv`.
pub async fn write_stream(
    ctx: &SessionContext,
    location: &str,
    stream: SendableRecordBatchStream,
) -> Result<u64, IoError> {
    if location.to_ascii_lowercase().ends_with(".csv") {
        write_csv_stream(ctx, location, stream).await
    } else {
        write_parquet_stream(ctx, location, stream).await
    }
}

/// Writes a whole stream to a Parquet object; returns the row count.
pub async fn write_parquet_stream(
    ctx: &SessionContext,
    location: &str,
    mut stream: SendableRecordBatchStream,
) -> Result<u64, IoError> {
    let mut sink = ParquetSink::create(ctx, location, stream.schema()).await?;
    while let Some(batch) = stream.next().await {
        sink.write(&batch.map_err(|source| IoError::Stream { location: location.to_string(), source })?).await?;
    }
    sink.finish().await
}
