//! Object stores from the standard environment, for the client and for every
//! executor: `file://` always, `s3://BUCKET` built on first use from the AWS
//! variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`). An executor never
//! sees the client's registrations, so it resolves every bucket a plan names
//! this way.

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use url::Url;

/// An S3 store for `bucket` configured from the environment.
pub fn s3_store_from_env(bucket: &str) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    // AmazonS3Builder::from_env reads AWS_ENDPOINT; accept the newer spelling too.
    if let Ok(ep) = std::env::var("AWS_ENDPOINT_URL") {
        builder = builder.with_endpoint(ep);
    }
    if std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true" || v == "1") {
        builder = builder.with_allow_http(true);
    }
    if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
        builder = builder.with_region("us-east-1");
    }
    Ok(Arc::new(builder.build()?))
}

/// A registry that serves `file://` and builds `s3://BUCKET` stores from the
/// environment the first time a plan names the bucket.
#[derive(Debug, Default)]
pub struct EnvStores {
    inner: DefaultObjectStoreRegistry,
}

impl ObjectStoreRegistry for EnvStores {
    fn register_store(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if let Ok(s) = self.inner.get_store(url) {
            return Ok(s);
        }
        match (url.scheme(), url.host_str()) {
            ("s3", Some(bucket)) => {
                let store = s3_store_from_env(bucket).map_err(|e| {
                    DataFusionError::Configuration(format!("s3://{bucket}: the S3 store cannot be configured: {e}"))
                })?;
                let base = Url::parse(&format!("s3://{bucket}")).map_err(|e| DataFusionError::External(Box::new(e)))?;
                self.inner.register_store(&base, store.clone());
                Ok(store)
            }
            _ => self.inner.get_store(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_resolve_and_s3_buckets_are_built_once() {
        let r = EnvStores::default();
        assert!(r.get_store(&Url::parse("file:///tmp/x.parquet").unwrap()).is_ok());
        let a = r.get_store(&Url::parse("s3://bucket-a/x/y.parquet").unwrap()).unwrap();
        let b = r.get_store(&Url::parse("s3://bucket-a/z.parquet").unwrap()).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one store per bucket");
        let c = r.get_store(&Url::parse("s3://bucket-b/z.parquet").unwrap()).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(r.get_store(&Url::parse("gs://bucket/z").unwrap()).is_err());
    }
}
