//! Object-store registry.

use std::sync::{Arc, OnceLock};

use super::IoError;
use datafusion::execution::context::SessionContext;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::prelude::SessionConfig;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use url::Url;

/// The process-wide in-memory store behind `memory://` URLs (tests, staging).
pub fn memory_store() -> Arc<InMemory> {
    static STORE: OnceLock<Arc<InMemory>> = OnceLock::new();
    STORE.get_or_init(|| Arc::new(InMemory::new())).clone()
}

/// Turns a path or URL into a URL: bare paths become absolute `file://` URLs.
pub fn resolve_url(location: &str) -> Result<Url, IoError> {
    if let Some((scheme, _)) = location.split_once("://") {
        if !matches!(scheme, "file" | "s3" | "memory") {
            return Err(IoError::UnsupportedScheme { scheme: scheme.to_string(), location: location.to_string() });
        }
        return Url::parse(location).map_err(|source| IoError::InvalidUrl { location: location.to_string(), source });
    }
    let path = std::path::Path::new(location);
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| IoError::CurrentDir { location: location.to_string(), source })?
            .join(path)
    };
    // Lexical normalisation: object-store paths may not contain `.` or `..`.
    let mut abs = std::path::PathBuf::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                abs.pop();
            }
            std::path::Component::CurDir => {}
            other => abs.push(other.as_os_str()),
        }
    }
    // Keep a trailing slash (a prefix) and glob characters as written.
    let mut s = abs.to_string_lossy().to_string();
    if location.ends_with('/') && !s.ends_with('/') {
        s.push('/');
    }
    // `from_file_path` drops a trailing slash (it joins path components):
    // a prefix is a directory URL.
    let url = if s.ends_with('/') { Url::from_directory_path(&s) } else { Url::from_file_path(&s) };
    url.or_else(|_| Url::parse(&format!("file://{s}")))
        .map_err(|_| IoError::NotAFileUrl { location: location.to_string() })
}

/// The object store serving `url` (registered with [`register_stores_for`] first).
pub fn store_for(ctx: &SessionContext, url: &Url) -> Result<Arc<dyn ObjectStore>, IoError> {
    let no_store = |source| IoError::NoStore { url: url.to_string(), source };
    let base = ObjectStoreUrl::parse(&url[..url::Position::BeforePath]).map_err(no_store)?;
    ctx.runtime_env().object_store(&base).map_err(no_store)
}

/// A DataFusion session with dpflow's defaults: its protected reads run in
/// this process ([`session_context_on`] sends them to a cluster).
pub fn session_context() -> SessionContext {
    let config = SessionConfig::new()
        .with_information_schema(false)
        .with_target_partitions(std::thread::available_parallelism().map_or(2, |n| n.get()));
    dpflow_udfs::session::dpflow_context(config)
}

/// A DataFusion session whose protected reads run on `cluster` when one is
/// given (connected first with [`dpflow_udfs::cluster::connect`]), or in this
/// process.
pub fn session_context_on(cluster: Option<&dpflow_udfs::cluster::ClusterTarget>) -> SessionContext {
    let ctx = session_context();
    match cluster {
        Some(target) => dpflow_udfs::cluster::on_cluster(&ctx, target),
        None => ctx,
    }
}

/// Registers the object store a URL needs (S3 credentials and endpoint come
/// from the standard AWS environment variables: `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`).
pub fn register_stores_for(ctx: &SessionContext, url: &Url) -> Result<(), IoError> {
    dpflow_udfs::cluster::check_location(ctx, url).map_err(|_| IoError::NotOnCluster { location: url.to_string() })?;
    match url.scheme() {
        "file" => Ok(()),
        "memory" => {
            // One process-wide store, served under every memory:// host.
            let base = Url::parse(&format!("memory://{}", url.host_str().unwrap_or(""))).expect("memory url");
            ctx.register_object_store(&base, memory_store() as Arc<dyn ObjectStore>);
            Ok(())
        }
        "s3" => {
            let bucket = url.host_str().ok_or_else(|| IoError::NoBucket { url: url.to_string() })?;
            let store = dpflow_udfs::cluster::stores::s3_store_from_env(bucket)
                .map_err(|source| IoError::S3Config { bucket: bucket.to_string(), source })?;
            let base = Url::parse(&format!("s3://{bucket}")).expect("bucket url");
            ctx.register_object_store(&base, store);
            Ok(())
        }
        other => Err(IoError::UnsupportedScheme { scheme: other.to_string(), location: url.to_string() }),
    }
}
