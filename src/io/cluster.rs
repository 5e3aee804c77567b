//! The cluster setting of catalogs, pipelines and the command line
//! (`--cluster`, `cluster:`): where the plans that read protected data run
//! (docs/cluster.md). Absent, everything runs in this process.
//!
//! In YAML, either the address alone or the address and the partitions:
//!
//! ```yaml
//! cluster: df://scheduler.internal:50050
//! # or
//! cluster: {scheduler: df://scheduler.internal:50050, partitions: 64, job_timeout: 2h}
//! ```
//!
//! `job_timeout` (a duration such as `90s`, `30m` or `2h`; none by default)
//! fails a release whose cluster job has not finished in that time
//! ([`ClusterTarget::with_job_timeout`]); it is charged, as every failure
//! after a protected read.

use std::sync::Arc;
use std::time::Duration;

use dpflow_udfs::cluster::{Cluster, ClusterError, ClusterTarget};
use serde::Deserialize;
use tokio::sync::OnceCell;

/// Where protected reads run, as configured. Clones share one connection:
/// the first [`ClusterSpec::connect`] of any of them is the one they all use
/// (a pipeline's SQL steps and synthesizers run on the cluster its run
/// connected to, one standalone cluster per run).
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// `df://HOST:PORT` or `standalone`.
    pub address: Cluster,
    /// Partitions of the plans sent to it (default
    /// [`dpflow_udfs::cluster::DEFAULT_CLUSTER_PARTITIONS`]).
    pub partitions: Option<usize>,
    /// How long one plan's cluster job may take (none: as long as it runs).
    pub job_timeout: Option<Duration>,
    connected: Arc<OnceCell<ClusterTarget>>,
}

impl PartialEq for ClusterSpec {
    fn eq(&self, other: &Self) -> bool {
        (&self.address, self.partitions, self.job_timeout) == (&other.address, other.partitions, other.job_timeout)
    }
}

impl Eq for ClusterSpec {}

impl ClusterSpec {
    /// From an address and optional partitions (e.g. `--cluster`,
    /// `--cluster-partitions`).
    pub fn parse(address: &str, partitions: Option<usize>) -> Result<Self, ClusterError> {
        if partitions == Some(0) {
            return Err(ClusterError::Address { given: format!("{address} with 0 partitions") });
        }
        Ok(Self { address: address.parse()?, partitions, job_timeout: None, connected: Default::default() })
    }

    /// This setting with a job timeout written as a duration (`90s`, `30m`,
    /// `2h`; see [`ClusterTarget::with_job_timeout`]).
    pub fn with_job_timeout(mut self, timeout: Option<&str>) -> Result<Self, ClusterError> {
        self.job_timeout = match timeout {
            None => None,
            Some(t) => {
                let bad = || ClusterError::JobTimeout { given: t.to_string() };
                let d = humantime::parse_duration(t.trim()).map_err(|_| bad())?;
                if d.is_zero() {
                    return Err(bad());
                }
                Some(d)
            }
        };
        Ok(self)
    }

    /// Connects (for `standalone`, starts the in-process cluster) and checks
    /// that the scheduler answers: call it before any charge.
    pub async fn connect(&self) -> Result<ClusterTarget, ClusterError> {
        self.connected
            .get_or_try_init(|| async {
                Ok(dpflow_udfs::cluster::connect(&self.address, self.partitions)
                    .await?
                    .with_job_timeout(self.job_timeout))
            })
            .await
            .cloned()
    }
}

/// The `cluster:` key as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawCluster {
    /// `cluster: df://host:port`.
    Address(String),
    /// `cluster: {scheduler: df://host:port, partitions: N, job_timeout: 2h}`.
    Full {
        /// The scheduler's address.
        scheduler: String,
        /// Partitions of the plans sent to it.
        #[serde(default)]
        partitions: Option<usize>,
        /// How long one plan's cluster job may take, e.g. `30m`.
        #[serde(default)]
        job_timeout: Option<String>,
    },
}

impl RawCluster {
    /// The setting, or a message saying what is wrong with it.
    pub fn spec(&self) -> Result<ClusterSpec, String> {
        let (address, partitions, timeout) = match self {
            RawCluster::Address(a) => (a.as_str(), None, None),
            RawCluster::Full { scheduler, partitions, job_timeout } => {
                (scheduler.as_str(), *partitions, job_timeout.as_deref())
            }
        };
        if partitions == Some(0) {
            return Err("partitions must be at least 1".into());
        }
        ClusterSpec::parse(address, partitions).and_then(|s| s.with_job_timeout(timeout)).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_yaml_forms_parse_and_bad_ones_say_why() {
        let a: RawCluster = serde_saphyr::from_str("df://h:50050").unwrap();
        assert_eq!(a.spec().unwrap(), ClusterSpec::parse("df://h:50050", None).unwrap());
        let b: RawCluster = serde_saphyr::from_str("{scheduler: standalone, partitions: 4}").unwrap();
        let b = b.spec().unwrap();
        assert_eq!((b.address, b.partitions), (Cluster::Standalone, Some(4)));
        let c: RawCluster = serde_saphyr::from_str("{scheduler: df://h:1, partitions: 0}").unwrap();
        assert!(c.spec().unwrap_err().contains("at least 1"));
        let d: RawCluster = serde_saphyr::from_str("h:50050").unwrap();
        assert!(d.spec().unwrap_err().contains("df://HOST:PORT"));
        let e: RawCluster = serde_saphyr::from_str("{scheduler: df://h:1, job_timeout: 1h 30m}").unwrap();
        assert_eq!(e.spec().unwrap().job_timeout, Some(Duration::from_secs(5400)));
        for bad in ["0s", "soon", "-5m"] {
            let f: RawCluster =
                serde_saphyr::from_str(&format!("{{scheduler: df://h:1, job_timeout: {bad}}}")).unwrap();
            assert!(f.spec().unwrap_err().contains("job_timeout"), "{bad}");
        }
    }

    #[tokio::test]
    async fn an_address_nobody_answers_fails_before_anything_runs() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let spec = ClusterSpec::parse(&format!("df://127.0.0.1:{port}"), None).unwrap();
        let e = spec.connect().await.unwrap_err();
        #[cfg(feature = "cluster")]
        assert!(matches!(e, ClusterError::Unreachable { .. }), "{e}");
        #[cfg(not(feature = "cluster"))]
        assert!(matches!(e, ClusterError::NotBuilt), "{e}");
    }
}
