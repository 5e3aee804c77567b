//! Errors of [`crate::io`]: each names the location and what was being done
//! with it; the storage or format error underneath is the source.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::parquet::errors::ParquetError;

/// A data-access failure.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A URL whose scheme dpflow cannot serve.
    #[error("unsupported URL scheme {scheme:?} in {location:?} (use file://, s3:// or memory://, or a local path)")]
    UnsupportedScheme {
        /// The scheme.
        scheme: String,
        /// The location as given.
        location: String,
    },
    /// A location that does not parse as a URL.
    #[error("invalid URL {location:?}; check its spelling (scheme://bucket/path, or a local path)")]
    InvalidUrl {
        /// The location as given.
        location: String,
        /// Why.
        source: url::ParseError,
    },
    /// A relative path, and no current directory to resolve it against.
    #[error(
        "cannot resolve the relative path {location:?}: the current directory is unreadable; give an absolute path"
    )]
    CurrentDir {
        /// The location as given.
        location: String,
        /// Why.
        source: std::io::Error,
    },
    /// A local path that has no `file://` form.
    #[error("cannot turn {location:?} into a file URL; give an absolute local path or a file:// URL")]
    NotAFileUrl {
        /// The location as given.
        location: String,
    },
    /// No store is registered for the URL (or its base does not parse).
    #[error("no object store registered for {url}")]
    NoStore {
        /// The URL.
        url: String,
        /// Why.
        source: DataFusionError,
    },
    /// `s3://` without a bucket.
    #[error("{url}: an s3:// URL needs a bucket (s3://BUCKET/path)")]
    NoBucket {
        /// The URL.
        url: String,
    },
    /// The S3 client cannot be built from the environment.
    #[error(
        "configuring S3 for bucket {bucket:?}; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and \
         AWS_ENDPOINT_URL"
    )]
    S3Config {
        /// The bucket.
        bucket: String,
        /// Why.
        source: object_store::Error,
    },
    /// A `memory://` input with a cluster: executors cannot read this process's memory.
    #[error(
        "{location}: memory:// data lives in this process and cluster executors cannot read it; use s3:// or file:// on a file system every executor shares, or run without a cluster"
    )]
    NotOnCluster {
        /// The input.
        location: String,
    },
    /// A URL path that is not a valid object path.
    #[error("bad path in {location}")]
    BadPath {
        /// The location.
        location: String,
        /// Why.
        source: object_store::path::Error,
    },
    /// No location at all.
    #[error("no input given")]
    NoInput,
    /// Nothing at the location (DataFusion would read an empty table).
    #[error("input {location} does not exist (no file or object at {url})")]
    MissingInput {
        /// The location as given.
        location: String,
        /// Its URL.
        url: String,
    },
    /// A prefix without files.
    #[error("{url}: no files under this prefix")]
    EmptyPrefix {
        /// The URL.
        url: String,
    },
    /// A file that cannot be Parquet: its footer is missing or inconsistent
    /// (checked before the Parquet reader sees it: the reader panics on some
    /// such files).
    #[error("{file} is not a valid Parquet file: {problem}; check that it was written completely, as Parquet")]
    NotParquet {
        /// The file (URL).
        file: String,
        /// What is wrong, in words (no byte counts from the file).
        problem: &'static str,
    },
    /// Listing or reading a file's footer failed.
    #[error("cannot read the Parquet footer of {file}")]
    ReadFooter {
        /// The file (URL).
        file: String,
        /// Why.
        source: object_store::Error,
    },
    /// A text file without a header line.
    #[error(
        "{url}: empty file (a header line was expected; set `text: {{header: false}}` in the domain if there is none)"
    )]
    EmptyFile {
        /// The URL.
        url: String,
    },
    /// A text format that DataFusion's CSV reader cannot take.
    #[error("{domain}: text delimiter, quote and comment must be ASCII characters")]
    NonAsciiText {
        /// The domain file.
        domain: String,
    },
    /// DataFusion cannot set up the read.
    #[error("cannot read {format} input {location}")]
    OpenInput {
        /// "CSV" or "Parquet".
        format: &'static str,
        /// The location.
        location: String,
        /// Why.
        source: DataFusionError,
    },
    /// A local directory for an output cannot be created.
    #[error("cannot create {dir}")]
    CreateDir {
        /// The directory.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// An owner-only local file cannot be written.
    #[error("writing {path} (owner-only, mode 0600); check that its directory exists and is writable")]
    WritePrivate {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The object store failed on an object.
    #[error("{action} {location}")]
    Store {
        /// "cannot open", "reading", "writing".
        action: &'static str,
        /// The location.
        location: String,
        /// Why.
        source: object_store::Error,
    },
    /// Writing or closing a text output failed.
    #[error("{action} {location}")]
    Output {
        /// "writing", "closing".
        action: &'static str,
        /// The location.
        location: String,
        /// Why.
        source: std::io::Error,
    },
    /// The Parquet writer failed.
    #[error("{action} {location}")]
    Parquet {
        /// "creating", "writing", "closing".
        action: &'static str,
        /// The location.
        location: String,
        /// Why.
        source: ParquetError,
    },
    /// A batch cannot be encoded as CSV.
    #[error("encoding CSV for {location}")]
    Csv {
        /// The location.
        location: String,
        /// Why.
        source: ArrowError,
    },
    /// The stream being written failed.
    #[error("computing the rows written to {location}")]
    Stream {
        /// The location.
        location: String,
        /// Why.
        source: DataFusionError,
    },
}
