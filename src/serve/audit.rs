//! The audit log of `dpflow serve`: one JSON line per statement (analyst,
//! time, client address, SHA-256 of the SQL text, route, ledger charge and
//! its loss, outcome and SQLSTATE). Never a result value, never the SQL text
//! and never an error message: an auditor matches a line to a query by its
//! hash and to the ledger by the charge id.

use std::io::Write;
use std::path::Path;

use parking_lot::Mutex;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// One statement's line.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEntry<'a> {
    /// When it finished (RFC 3339, UTC).
    pub time: String,
    /// The authenticated analyst.
    pub analyst: &'a str,
    /// The client's address.
    pub peer: String,
    /// SHA-256 of the SQL text (hex).
    pub query_sha256: String,
    /// `dp`, `explain`, `metadata`, `session` or `refused`.
    pub route: &'a str,
    /// The ledger charge, if one was made.
    pub charge_id: Option<i64>,
    /// The charged loss, described (`ε=0.5`, ...).
    pub loss: Option<String>,
    /// `ok` or `error`.
    pub outcome: &'a str,
    /// The SQLSTATE of an error.
    pub sqlstate: Option<String>,
}

/// SHA-256 of `sql`, hex.
pub fn query_hash(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// Where audit lines go.
pub struct AuditLog {
    out: Mutex<Box<dyn Write + Send>>,
}

impl AuditLog {
    /// Appends to `path` (created owner-only if missing).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut opts = std::fs::OpenOptions::new();
        opts.append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        Ok(Self { out: Mutex::new(Box::new(opts.open(path)?)) })
    }

    /// Writes lines to standard error.
    pub fn stderr() -> Self {
        Self { out: Mutex::new(Box::new(std::io::stderr())) }
    }

    /// Writes one line (a failure to write is logged, never fatal to the query).
    pub fn record(&self, e: &AuditEntry<'_>) {
        let mut line = serde_json::to_string(e).expect("audit entries serialise");
        line.push('\n');
        let mut out = self.out.lock();
        if let Err(err) = out.write_all(line.as_bytes()).and_then(|_| out.flush()) {
            log::error!("audit log: {err}");
        }
    }
}
