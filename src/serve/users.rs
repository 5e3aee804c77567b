//! The users file of `dpflow serve`: analysts, their SCRAM-SHA-256
//! verifiers and their roles (which catalog tables each may query).
//!
//! ```yaml
//! roles:
//!   census_analysts: {tables: [adult, ma2019]}
//! users:
//!   alice:
//!     password: "SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>"
//!     roles: [census_analysts]
//! ```
//!
//! Passwords are kept only as PostgreSQL's verifier format (RFC 5802/7677:
//! `StoredKey = H(HMAC(SaltedPassword, "Client Key"))`, `ServerKey =
//! HMAC(SaltedPassword, "Server Key")`): the file lets the server check a
//! login but not log in as anyone, and a plaintext password is refused.
//! `dpflow serve add-user` writes an entry. Budgets are not here: each
//! analyst's budget per dataset is a grant in the ledger (`dpflow budget
//! grant`), so the ledger stays the one place that says what may be spent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use pgwire::api::auth::sasl::scram::{ScramSecret, gen_salted_password};
use serde::{Deserialize, Serialize};

/// SCRAM iterations written by [`verifier`] (PostgreSQL's default).
pub const ITERATIONS: usize = 4096;

/// A users-file problem; the message names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// The file cannot be read or written.
    #[error("users file {path}: {source}")]
    Io {
        /// File.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML does not parse or a key is wrong.
    #[error("users file {path}: {problem}")]
    Invalid {
        /// File.
        path: String,
        /// Where and what.
        problem: String,
    },
}

/// A user's stored SCRAM verifier.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    /// Salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: usize,
    /// `H(ClientKey)`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verifier(<redacted>)")
    }
}

impl Verifier {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64 parts).
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{why}; passwords are stored as SCRAM-SHA-256 verifiers (\"SCRAM-SHA-256$4096:salt$StoredKey:ServerKey\"), \
                 never in plaintext: write the entry with `dpflow serve add-user`"
            )
        };
        let rest = s.strip_prefix("SCRAM-SHA-256$").ok_or_else(|| bad("not a SCRAM-SHA-256 verifier"))?;
        let (params, keys) = rest.split_once('$').ok_or_else(|| bad("no '$' before the keys"))?;
        let (iter, salt) = params.split_once(':').ok_or_else(|| bad("no ':' between iterations and salt"))?;
        let (stored, server) = keys.split_once(':').ok_or_else(|| bad("no ':' between StoredKey and ServerKey"))?;
        let iterations: usize = iter.parse().map_err(|_| bad("the iteration count is not a number"))?;
        if iterations < 4096 {
            return Err(bad("fewer than 4096 iterations (RFC 7677's minimum)"));
        }
        let dec = |x: &str, what: &str| B64.decode(x).map_err(|_| bad(&format!("the {what} is not base64")));
        let v = Self {
            salt: dec(salt, "salt")?,
            iterations,
            stored_key: dec(stored, "StoredKey")?,
            server_key: dec(server, "ServerKey")?,
        };
        if v.stored_key.len() != 32 || v.server_key.len() != 32 || v.salt.is_empty() {
            return Err(bad("a key is not 32 bytes or the salt is empty"));
        }
        Ok(v)
    }

    /// The verifier in PostgreSQL's text form.
    pub fn encode(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(&self.stored_key),
            B64.encode(&self.server_key)
        )
    }

    /// As pgwire's SCRAM secret.
    pub fn secret(&self) -> ScramSecret {
        ScramSecret::Verifier {
            salt: self.salt.clone(),
            iterations: self.iterations,
            stored_key: self.stored_key.clone(),
            server_key: self.server_key.clone(),
        }
    }
}

/// The verifier of `password` with a fresh random salt.
pub fn verifier(password: &str) -> Verifier {
    let salt: [u8; 16] = rand::random();
    verifier_with_salt(password, &salt, ITERATIONS)
}

fn verifier_with_salt(password: &str, salt: &[u8], iterations: usize) -> Verifier {
    let salted = gen_salted_password(password, salt, iterations);
    match ScramSecret::verifier_from_salted_password(salt.to_vec(), salted, iterations) {
        ScramSecret::Verifier { salt, iterations, stored_key, server_key } => {
            Verifier { salt, iterations, stored_key, server_key }
        }
        ScramSecret::SaltedPassword { .. } => unreachable!("verifier_from_salted_password returns a verifier"),
    }
}

#[derive(Debug, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawUsers {
    #[serde(default)]
    roles: BTreeMap<String, RawRole>,
    #[serde(default)]
    users: BTreeMap<String, RawUser>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    tables: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    password: String,
    #[serde(default)]
    roles: Vec<String>,
}

/// One analyst.
#[derive(Debug, Clone)]
pub struct User {
    /// Their verifier.
    pub verifier: Verifier,
    /// Their roles.
    pub roles: Vec<String>,
    /// The catalog tables their roles allow.
    pub tables: BTreeSet<String>,
}

/// The users file, loaded and checked.
#[derive(Debug, Clone)]
pub struct Users {
    /// The file.
    pub path: PathBuf,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// The iteration count most users' verifiers have (what an unknown
    /// user's decoy exchange announces, so it looks like a real user's).
    pub typical_iterations: usize,
}

impl Users {
    /// Loads and checks the file: every password a verifier, every role
    /// defined, and (when `catalog_tables` is given) every role table in the catalog.
    pub fn load(path: impl AsRef<Path>, catalog_tables: Option<&BTreeSet<String>>) -> Result<Self, UsersError> {
        let path = path.as_ref();
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| UsersError::Io { path: p.clone(), source })?;
        let invalid = |problem: String| UsersError::Invalid { path: p.clone(), problem };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(|source| UsersError::Io { path: p.clone(), source })?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(invalid(format!(
                    "other users can read it (mode {:o}); its verifiers would let them guess passwords offline: \
                     `chmod 600 {p}`",
                    mode & 0o777
                )));
            }
        }
        let raw = parse(&text, &p)?;
        for (name, role) in &raw.roles {
            for t in &role.tables {
                if let Some(known) = catalog_tables
                    && !known.contains(t)
                {
                    let list = known.iter().cloned().collect::<Vec<_>>().join(", ");
                    return Err(invalid(format!(
                        "roles.{name}.tables: {t:?} is not a table of the catalog (its tables: {list})"
                    )));
                }
            }
        }
        let mut users = BTreeMap::new();
        for (name, u) in raw.users {
            let verifier = Verifier::parse(&u.password).map_err(|e| invalid(format!("users.{name}.password: {e}")))?;
            let mut tables = BTreeSet::new();
            for r in &u.roles {
                let role = raw
                    .roles
                    .get(r)
                    .ok_or_else(|| invalid(format!("users.{name}.roles: role {r:?} is not defined under roles:")))?;
                tables.extend(role.tables.iter().cloned());
            }
            users.insert(name, User { verifier, roles: u.roles, tables });
        }
        let mut counts = BTreeMap::new();
        for u in users.values() {
            *counts.entry(u.verifier.iterations).or_insert(0usize) += 1;
        }
        let typical_iterations =
            counts.into_iter().max_by_key(|(i, n)| (*n, std::cmp::Reverse(*i))).map_or(ITERATIONS, |(i, _)| i);
        Ok(Self { path: path.to_path_buf(), users, typical_iterations })
    }
}

fn parse(text: &str, path: &str) -> Result<RawUsers, UsersError> {
    if text.trim().is_empty() {
        return Ok(RawUsers::default());
    }
    let de = serde_saphyr::from_str::<serde_json::Value>(text)
        .map_err(|e| UsersError::Invalid { path: path.to_string(), problem: e.to_string() })?;
    serde_path_to_error::deserialize(de)
        .map_err(|e| UsersError::Invalid { path: path.to_string(), problem: format!("{}: {}", e.path(), e.inner()) })
}

/// Adds (or replaces) `name` with `password` and `roles` in the users file
/// (created if missing), keeping everything else. Only the verifier is written.
pub fn add_user(path: impl AsRef<Path>, name: &str, password: &str, roles: &[String]) -> Result<(), UsersError> {
    let path = path.as_ref();
    let p = path.display().to_string();
    let invalid = |problem: String| UsersError::Invalid { path: p.clone(), problem };
    if name.is_empty() || name.chars().any(|c| c.is_control() || c == '\0') {
        return Err(invalid(format!("user name {name:?}: give a non-empty name without control characters")));
    }
    if password.len() < 8 {
        return Err(invalid("the password must have at least 8 characters".into()));
    }
    let mut raw = match std::fs::read_to_string(path) {
        Ok(t) => parse(&t, &p)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => RawUsers::default(),
        Err(source) => return Err(UsersError::Io { path: p, source }),
    };
    for r in roles {
        if !raw.roles.contains_key(r) {
            let known = raw.roles.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(invalid(format!(
                "role {r:?} is not defined (defined: {}); add it under roles: first",
                if known.is_empty() { "none".into() } else { known }
            )));
        }
    }
    raw.users.insert(name.to_string(), RawUser { password: verifier(password).encode(), roles: roles.to_vec() });
    let text = serde_saphyr::to_string(&raw).map_err(|e| invalid(e.to_string()))?;
    // Owner-only (the file holds verifiers), through a new temporary file
    // created exclusively beside it, so no existing file's permissions carry over.
    crate::io::write_private_file(path, text.as_bytes()).map_err(|source| UsersError::Io { path: p, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3's exchange (user "user", password "pencil"): a server
    /// holding only our verifier accepts the RFC's client proof and answers
    /// with the RFC's server signature.
    #[test]
    fn the_rfc_7677_exchange_verifies_against_the_stored_keys() {
        use ring::{digest, hmac};
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let v = verifier_with_salt("pencil", &salt, 4096);
        let auth = "n=user,r=rOprNGfwEbeRWgbNEkqO,\
                    r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,\
                    c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let mac = |key: &[u8]| hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), auth.as_bytes()).as_ref().to_vec();
        let proof = B64.decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        let client_key: Vec<u8> = proof.iter().zip(mac(&v.stored_key)).map(|(a, b)| a ^ b).collect();
        assert_eq!(digest::digest(&digest::SHA256, &client_key).as_ref(), v.stored_key.as_slice());
        assert_eq!(B64.encode(mac(&v.server_key)), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        assert_eq!(Verifier::parse(&v.encode()).unwrap(), v);
    }

    #[test]
    fn plaintext_and_malformed_passwords_are_refused() {
        for bad in ["pencil", "SCRAM-SHA-256$4096:abc", "SCRAM-SHA-256$10:c2FsdA==$AAAA:AAAA", "md5abcdef"] {
            let e = Verifier::parse(bad).unwrap_err();
            assert!(e.contains("add-user"), "{e}");
        }
    }

    #[test]
    fn add_user_writes_a_verifier_and_load_resolves_roles() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("users.yaml");
        std::fs::write(&f, "roles:\n  r: {tables: [adult]}\n").unwrap();
        add_user(&f, "alice", "correct horse", &["r".into()]).unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(!text.contains("correct horse") && text.contains("SCRAM-SHA-256$4096:"), "{text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let u = Users::load(&f, Some(&["adult".to_string()].into())).unwrap();
        assert_eq!(u.users["alice"].tables, ["adult".to_string()].into());
        // A role table outside the catalog and an undefined role are errors naming the key.
        let e = Users::load(&f, Some(&["penguins".to_string()].into())).unwrap_err().to_string();
        assert!(e.contains("roles.r.tables") && e.contains("penguins"), "{e}");
        assert!(add_user(&f, "bob", "correct horse", &["nope".into()]).unwrap_err().to_string().contains("nope"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = Users::load(&f, None).unwrap_err().to_string();
            assert!(e.contains("chmod 600"), "{e}");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::write(&f, "users:\n  carol: {password: pencil}\n").unwrap();
        let e = Users::load(&f, None).unwrap_err().to_string();
        assert!(e.contains("users.carol.password") && e.contains("plaintext"), "{e}");
    }
}
