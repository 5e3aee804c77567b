//! `dpflow serve`: DP SQL over the PostgreSQL wire protocol, and
//! `dpflow serve add-user` to write an analyst into the users file.

use std::io::BufRead;
use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use dpflow::serve::{ServeConfig, Server};

/// Arguments of `dpflow serve`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServeArgs {
    /// Catalog file (tables, privacy units, bounds, ledger).
    #[arg(long, required = true)]
    pub catalog: Option<String>,
    /// Users file (analysts, SCRAM verifiers, roles).
    #[arg(long, required = true)]
    pub users: Option<String>,
    /// Address to listen on (port 0: any free port, printed on start).
    #[arg(long, default_value = "127.0.0.1:5433")]
    pub listen: SocketAddr,
    /// TLS certificate chain (PEM); with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<String>,
    /// TLS private key (PEM); with --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<String>,
    /// Listen on a non-loopback address without TLS (only on a trusted network).
    #[arg(long)]
    pub allow_insecure_remote: bool,
    /// Append the audit log (one JSON line per statement) to this file instead of standard error.
    #[arg(long)]
    pub audit: Option<String>,
    /// Helpers.
    #[command(subcommand)]
    pub command: Option<ServeCommand>,
}

/// `dpflow serve` helpers.
#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Add (or replace) an analyst in the users file. The password is read from the first line of
    /// standard input (never from the command line) and only its SCRAM-SHA-256 verifier is written.
    AddUser {
        /// Users file (created if missing, owner-only).
        #[arg(long)]
        users: String,
        /// The analyst's user name.
        #[arg(long)]
        name: String,
        /// Roles (defined under `roles:` in the file), comma-separated.
        #[arg(long, value_delimiter = ',')]
        roles: Vec<String>,
    },
}

pub(super) async fn run(a: ServeArgs) -> Result<i32> {
    if let Some(ServeCommand::AddUser { users, name, roles }) = &a.command {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).context("reading the password from standard input")?;
        let password = line.trim_end_matches(['\n', '\r']);
        if password.is_empty() {
            bail!(
                "give the password on standard input, e.g. `read -s P; printf '%s\\n' \"$P\" | dpflow serve add-user ...`"
            );
        }
        dpflow::serve::users::add_user(users, name, password, roles)?;
        println!("{users}: analyst {name:?} with roles [{}]", roles.join(", "));
        return Ok(0);
    }
    let config = ServeConfig {
        catalog: a.catalog.expect("required").into(),
        users: a.users.expect("required").into(),
        listen: a.listen,
        tls: a.tls_cert.zip(a.tls_key).map(|(c, k)| (c.into(), k.into())),
        allow_insecure_remote: a.allow_insecure_remote,
        audit: a.audit.map(Into::into),
    };
    let server = Server::bind(&config).await?;
    eprintln!(
        "dpflow serve: listening on {} ({}); every answer is noised and charged to the analyst's grant",
        server.local_addr()?,
        if config.tls.is_some() { "TLS" } else { "no TLS" }
    );
    server.run(shutdown()).await?;
    eprintln!("dpflow serve: stopped");
    Ok(0)
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
