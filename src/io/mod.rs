//! Data access: object stores (`file://`, `s3://`, `memory://`), streaming
//! reads of CSV and Parquet through DataFusion, and Parquet (zstd) writes.
//!
//! Reads always stream record batches: nothing here loads a whole file.

pub mod cluster;
mod error;
pub mod names;
pub mod private;
mod read;
mod store;
mod write;

pub use cluster::{ClusterSpec, RawCluster};
pub use error::IoError;
pub use private::{write_private_bytes, write_private_file};
pub use read::{InputFormat, ensure_exists, open_input, open_inputs, open_released, read_header_names};
pub use store::{memory_store, register_stores_for, resolve_url, session_context, session_context_on, store_for};
pub use write::{ParquetSink, read_bytes, write_bytes, write_csv_stream, write_parquet_stream, write_stream};
