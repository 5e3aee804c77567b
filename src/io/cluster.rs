//! The cluster setting of catalogs, pipelines and the command line
//! (`--cluster`, `cluster:`): where the plans that read protected data run
//! (docs/cluster.md). Absent, everything runs in this process.
//!
//! In YAML, either the address alone or the address and the partitions:
//!
//! ```yaml
//! cluster: df://scheduler.internal:50050
//! # or
//! cluster: {scheduler: df://scheduler.internal:50050, partitions: 64}
//! ```

use std::sync::Arc;

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
    connected: Arc<OnceCell<ClusterTarget>>,
}

impl PartialEq for ClusterSpec {
    fn eq(&self, other: &Self) -> bool {
        self.address == other.address && self.partitions == other.partitions
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
        Ok(Self { address: address.parse()?, partitions, connected: Default::default() })
    }

    /// Connects (for `standalone`, starts the in-process cluster) and checks
    /// that the scheduler answers: call it before any charge.
    pub async fn connect(&self) -> Result<ClusterTarget, ClusterError> {
        self.connected.get_or_try_init(|| dpflow_udfs::cluster::connect(&self.address, self.partitions)).await.cloned()
    }
}

/// The `cluster:` key as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawCluster {
    /// `cluster: df://host:port`.
    Address(String),
    /// `cluster: {scheduler: df://host:port, partitions: N}`.
    Full {
        /// The scheduler's address.
        scheduler: String,
        /// Partitions of the plans sent to it.
        #[serde(default)]
        partitions: Option<usize>,
    },
}

impl RawCluster {
    /// The setting, or a message saying what is wrong with it.
    pub fn spec(&self) -> Result<ClusterSpec, String> {
        let (address, partitions) = match self {
            RawCluster::Address(a) => (a.as_str(), None),
            RawCluster::Full { scheduler, partitions } => (scheduler.as_str(), *partitions),
        };
        if partitions == Some(0) {
            return Err("partitions must be at least 1".into());
        }
        ClusterSpec::parse(address, partitions).map_err(|e| e.to_string())
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
