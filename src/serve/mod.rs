//! `dpflow serve`: DP SQL for ordinary SQL clients (psql, psycopg, JDBC,
//! BI tools) over the PostgreSQL wire protocol.
//!
//! - **Who**: analysts log in with SCRAM-SHA-256 against the users file
//!   ([`users`]); their roles say which catalog tables they may query. Only
//!   those tables are registered in their session ([`crate::sql::SqlEngine::open_for_analyst`]).
//! - **What**: every query goes through the same DP SQL engine as `dpflow
//!   sql` (checks, costing, ledger reservation before any read, noise drawn
//!   once); catalog browsing goes to a metadata session that holds schemas
//!   only ([`metadata`]); [`route`] decides which, from the text.
//! - **How much**: each charge is made for the analyst and must fit their
//!   grant in the ledger as well as the dataset's total, checked in one
//!   SQLite transaction, so any number of sessions and server processes on
//!   one ledger overspend neither ([`crate::privacy::Ledger::reserve_for`]).
//! - **Record**: one audit line per statement, never a value ([`audit`]).
//!
//! Errors carry the CLI's message and a SQLSTATE ([`sqlstate`]).

pub mod audit;
mod backend;
pub mod encode;
pub mod metadata;
pub mod route;
pub mod sqlstate;
pub mod users;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use pgwire::tokio::TlsAcceptor;
use pgwire::tokio::tokio_rustls::rustls;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::sql::{Catalog, SqlError};
pub use audit::AuditLog;
pub use users::{Users, UsersError};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The catalog.
    #[error(transparent)]
    Catalog(#[from] SqlError),
    /// The users file.
    #[error(transparent)]
    Users(#[from] UsersError),
    /// A catalog without a ledger cannot charge anyone.
    #[error("catalog {0}: dpflow serve needs a ledger to charge analysts; add `ledger: FILE` to the catalog")]
    NoLedger(String),
    /// Plain TCP on an address other than loopback.
    #[error(
        "refusing to listen on {0} without TLS: passwords and answers would cross the network in clear; \
         give --tls-cert and --tls-key, or --allow-insecure-remote if the network is trusted"
    )]
    InsecureRemote(SocketAddr),
    /// TLS files.
    #[error("TLS: {0}; give a PEM certificate chain (--tls-cert) and its PEM private key (--tls-key)")]
    Tls(String),
    /// The socket or the audit file.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The DP SQL catalog.
    pub catalog: PathBuf,
    /// The users file.
    pub users: PathBuf,
    /// Where to listen (default `127.0.0.1:5433`; port 0 picks a free one).
    pub listen: SocketAddr,
    /// TLS certificate chain and key (PEM).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Listen on a non-loopback address without TLS.
    pub allow_insecure_remote: bool,
    /// Audit log file (default: standard error).
    pub audit: Option<PathBuf>,
}

/// A server bound to its address, ready to accept.
pub struct Server {
    listener: TcpListener,
    shared: Arc<backend::Shared>,
    tls: Option<(TlsAcceptor, Arc<Vec<u8>>)>,
}

fn tls_acceptor(cert: &PathBuf, key: &PathBuf) -> Result<(TlsAcceptor, Arc<Vec<u8>>), ServeError> {
    let pem = std::fs::read(cert).map_err(|e| ServeError::Tls(format!("{}: {e}", cert.display())))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| ServeError::Tls(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!("{}: no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| ServeError::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), Arc::new(pem)))
}

/// How long shutdown waits for statements in flight.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

impl Server {
    async fn drain(&self) {
        self.shared.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        if tokio::time::timeout(SHUTDOWN_GRACE, self.shared.inflight.write()).await.is_err() {
            log::warn!(
                "shutdown: statements still running after {}s were cut off; their charges stay reserved (counted as \
                 spent): resolve them with `dpflow budget resolve --charge ID --as failed`, never as released",
                SHUTDOWN_GRACE.as_secs()
            );
        }
    }

    /// Loads the catalog and users, checks the TLS policy, and binds.
    pub async fn bind(config: &ServeConfig) -> Result<Self, ServeError> {
        let catalog = Catalog::load(&config.catalog)?;
        if catalog.ledger.is_none() {
            return Err(ServeError::NoLedger(config.catalog.display().to_string()));
        }
        let catalog_tables = catalog.tables.keys().cloned().collect();
        let users = Users::load(&config.users, Some(&catalog_tables))?;
        let tls = match &config.tls {
            Some((cert, key)) => Some(tls_acceptor(cert, key)?),
            None => None,
        };
        if tls.is_none() && !config.listen.ip().is_loopback() && !config.allow_insecure_remote {
            return Err(ServeError::InsecureRemote(config.listen));
        }
        let audit = match &config.audit {
            Some(p) => AuditLog::open(p)
                .map_err(|source| ServeError::Io { what: format!("audit log {}", p.display()), source })?,
            None => AuditLog::stderr(),
        };
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Io { what: format!("listening on {}", config.listen), source })?;
        let require_tls = tls.is_some();
        let shared = Arc::new(backend::Shared {
            catalog,
            catalog_tables,
            users,
            audit,
            require_tls,
            inflight: Default::default(),
            stopping: Default::default(),
            decoy_key: rand::random(),
        });
        Ok(Self { listener, shared, tls })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until `shutdown` completes (each runs on its own
    /// task), then refuses new statements and waits up to [`SHUTDOWN_GRACE`]
    /// for those in flight, so their charges are settled rather than left
    /// reserved.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ServeError> {
        tokio::pin!(shutdown);
        loop {
            let (socket, _) = tokio::select! {
                _ = &mut shutdown => {
                    self.drain().await;
                    return Ok(());
                }
                accepted = self.listener.accept() => match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        log::warn!("accept: {e}");
                        continue;
                    }
                },
            };
            let handlers = Arc::new(backend::Handlers {
                session: Arc::new(backend::Session::new(self.shared.clone())),
                cert_pem: self.tls.as_ref().map(|t| t.1.clone()),
            });
            let tls = self.tls.as_ref().map(|t| t.0.clone());
            tokio::spawn(async move {
                if let Err(e) = pgwire::tokio::process_socket(socket, tls, handlers).await {
                    log::debug!("connection: {e}");
                }
            });
        }
    }
}
