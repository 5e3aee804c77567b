//! Data access: object stores (`file://`, `s3://`, `memory://`), streaming
//! reads of CSV and Parquet through DataFusion, and Parquet (zstd) writes.
//!
//! Reads always stream record batches: nothing here loads a whole file.

mod read;
mod store;
mod write;

pub use read::{InputFormat, open_input, read_header_names};
pub use store::{memory_store, register_stores_for, resolve_url, session_context, store_for};
pub use write::{ParquetSink, write_csv_stream, write_parquet_stream, write_stream};
