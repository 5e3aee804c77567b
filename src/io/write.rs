//! Parquet (zstd) writes to any registered object store, streaming.

use anyhow::{Context, Result};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::context::SessionContext;
use datafusion::parquet::arrow::AsyncArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;

use super::store::{register_stores_for, resolve_url, store_for};

/// An open Parquet output; write batches, then [`ParquetSink::finish`].
pub struct ParquetSink {
    writer: AsyncArrowWriter<BufWriter>,
    rows: u64,
    location: String,
}

impl ParquetSink {
    /// Creates (or replaces) the Parquet object at `location`.
    pub async fn create(ctx: &SessionContext, location: &str, schema: SchemaRef) -> Result<Self> {
        let url = resolve_url(location)?;
        register_stores_for(ctx, &url)?;
        if url.scheme() == "file"
            && let Ok(p) = url.to_file_path()
            && let Some(dir) = p.parent()
        {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let store = store_for(ctx, &url)?;
        let path = ObjectPath::from_url_path(url.path()).with_context(|| format!("bad output path {location}"))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).expect("valid level")))
            .set_max_row_group_row_count(Some(1 << 20))
            .build();
        let object_writer = BufWriter::new(store, path);
        let writer = AsyncArrowWriter::try_new(object_writer, schema, Some(props))?;
        Ok(Self { writer, rows: 0, location: location.to_string() })
    }

    /// Appends a batch.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.writer.write(batch).await.with_context(|| format!("writing {}", self.location))
    }

    /// Flushes and closes the file; returns the number of rows written.
    pub async fn finish(self) -> Result<u64> {
        self.writer.close().await.with_context(|| format!("closing {}", self.location))?;
        Ok(self.rows)
    }
}

/// Writes a whole stream as CSV (with a header; nulls as empty fields).
pub async fn write_csv_stream(
    ctx: &SessionContext,
    location: &str,
    mut stream: SendableRecordBatchStream,
) -> Result<u64> {
    use tokio::io::AsyncWriteExt;
    let url = resolve_url(location)?;
    register_stores_for(ctx, &url)?;
    if url.scheme() == "file"
        && let Ok(p) = url.to_file_path()
        && let Some(dir) = p.parent()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let store = store_for(ctx, &url)?;
    let path = ObjectPath::from_url_path(url.path()).with_context(|| format!("bad output path {location}"))?;
    let mut out = BufWriter::new(store, path);
    let mut rows = 0u64;
    let mut header = true;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        let mut buf = Vec::new();
        {
            let mut w = datafusion::arrow::csv::WriterBuilder::new().with_header(header).build(&mut buf);
            w.write(&batch)?;
        }
        header = false;
        out.write_all(&buf).await.with_context(|| format!("writing {location}"))?;
    }
    out.shutdown().await.with_context(|| format!("closing {location}"))?;
    Ok(rows)
}

/// Writes bytes to a file or object (creating local directories).
pub async fn write_bytes(ctx: &SessionContext, location: &str, bytes: Vec<u8>) -> Result<()> {
    let url = resolve_url(location)?;
    register_stores_for(ctx, &url)?;
    if url.scheme() == "file"
        && let Ok(p) = url.to_file_path()
        && let Some(dir) = p.parent()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let store = store_for(ctx, &url)?;
    let path = ObjectPath::from_url_path(url.path()).with_context(|| format!("bad output path {location}"))?;
    store.put(&path, bytes.into()).await.with_context(|| format!("writing {location}"))?;
    Ok(())
}

/// Reads a whole (small) file or object.
pub async fn read_bytes(ctx: &SessionContext, location: &str) -> Result<Vec<u8>> {
    let url = resolve_url(location)?;
    register_stores_for(ctx, &url)?;
    let store = store_for(ctx, &url)?;
    let path = ObjectPath::from_url_path(url.path()).with_context(|| format!("bad path {location}"))?;
    let r = store.get(&path).await.with_context(|| format!("reading {location}"))?;
    Ok(r.bytes().await.with_context(|| format!("reading {location}"))?.to_vec())
}

/// Writes a stream as Parquet, or as CSV when the location ends in `.csv`.
pub async fn write_stream(ctx: &SessionContext, location: &str, stream: SendableRecordBatchStream) -> Result<u64> {
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
) -> Result<u64> {
    let mut sink = ParquetSink::create(ctx, location, stream.schema()).await?;
    while let Some(batch) = stream.next().await {
        sink.write(&batch?).await?;
    }
    sink.finish().await
}
