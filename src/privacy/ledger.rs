//! The persistent privacy-budget ledger: a SQLite database in WAL mode.
//!
//! One row per protected dataset (privacy unit, total budget and its unit) and
//! one per charge (release id, mechanisms, loss in native units and in the
//! budget's unit, times, status). Charges are two-phase:
//!
//! `reserved` (before any data is touched) → `committed` (after the outputs are
//! durably written), `failed` (the run failed *after* protected data was read:
//! the failure itself is an outcome that depends on the data, so it stays
//! spent, docs/PRIVACY.md §1) or `released` (a failure before any protected
//! data was read: nothing depending on the data left the process).
//!
//! An analyst (a user of `dpflow serve`) can hold a **grant**: their own
//! budget on a dataset, in the dataset's unit. A charge made for an analyst
//! must fit both the analyst's grant (counting only their charges) and the
//! dataset's total (counting everyone's), checked in the same transaction.
//!
//! A reservation counts as spent until an operator resolves it
//! (`dpflow budget resolve`), so a crash can make the ledger over-count but
//! never under-count. Reservations run in `BEGIN IMMEDIATE` transactions, so
//! concurrent processes serialise on the check-and-insert and cannot overspend.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use super::budget::{Budget, BudgetError, Normalized, PrivacyFilter, normalize, spent_in_unit};
use dpflow_udfs::cost::MechanismRecord;

const APPLICATION: &str = "dpflow-ledger";
const SCHEMA_VERSION: &str = "3";

/// Appended (with the charge id) to the release id of a failed charge.
const FAILED_SUFFIX: &str = "#failed-";

/// The `charges` table (schema 2: adds the `failed` status).
const CHARGES_TABLE: &str = "CREATE TABLE charges (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 dataset TEXT NOT NULL REFERENCES datasets(name),
                 release_id TEXT NOT NULL,
                 status TEXT NOT NULL CHECK (status IN ('reserved', 'committed', 'failed', 'released')),
                 mechanisms_json TEXT NOT NULL,
                 rho REAL NOT NULL,
                 eps REAL NOT NULL,
                 delta REAL NOT NULL,
                 cost REAL NOT NULL,
                 reserved_at TEXT NOT NULL,
                 resolved_at TEXT,
                 note TEXT,
                 pid INTEGER,
                 UNIQUE (dataset, release_id)
             );";

/// Schema 3: per-analyst grants and the analyst of each charge.
const ANALYSTS_V3: &str = "CREATE TABLE analysts (
                 dataset TEXT NOT NULL REFERENCES datasets(name),
                 analyst TEXT NOT NULL,
                 budget_json TEXT NOT NULL,
                 granted_at TEXT NOT NULL,
                 PRIMARY KEY (dataset, analyst)
             );
             ALTER TABLE charges ADD COLUMN analyst TEXT;
             CREATE INDEX charges_by_analyst ON charges (dataset, analyst);";

/// Ledger failures.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The file does not exist (never silently create a fresh budget).
    #[error("ledger {0} does not exist; create it with `dpflow budget init --ledger {0} ...`")]
    Missing(String),
    /// The file exists but is not a dpflow ledger, or is damaged.
    #[error(
        "ledger {path} is not a usable dpflow ledger ({reason}); refusing to continue. Restore it from backup; do not delete it (that would reset the budget)"
    )]
    Corrupt {
        /// File.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// `init` on an existing file.
    #[error("ledger {0} already exists")]
    Exists(String),
    /// The ledger file cannot be created.
    #[error("cannot create ledger {path}; check that its directory exists and is writable")]
    Create {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Unknown dataset.
    #[error("dataset {dataset:?} is not in ledger {path} (known: {known})")]
    UnknownDataset {
        /// Dataset.
        dataset: String,
        /// File.
        path: String,
        /// Known datasets.
        known: String,
    },
    /// Dataset already registered.
    #[error("dataset {0:?} is already in the ledger")]
    DatasetExists(String),
    /// The charge would overspend (nothing was recorded).
    #[error("dataset {dataset:?}: {source}")]
    Budget {
        /// Dataset.
        dataset: String,
        /// Why.
        source: BudgetError,
    },
    /// This release id is already committed: it must not be spent again.
    #[error(
        "release {release_id:?} of dataset {dataset:?} is already committed (charge #{charge_id}); it will not be spent again"
    )]
    AlreadyCommitted {
        /// Dataset.
        dataset: String,
        /// Release id.
        release_id: String,
        /// Charge id.
        charge_id: i64,
    },
    /// The same release id was reserved with a different cost.
    #[error(
        "release {release_id:?} of dataset {dataset:?} is already reserved (charge #{charge_id}) with a different cost; resolve it first"
    )]
    ConflictingReservation {
        /// Dataset.
        dataset: String,
        /// Release id.
        release_id: String,
        /// Charge id.
        charge_id: i64,
    },
    /// This release id belongs to a charge that failed after reading data.
    #[error(
        "release id {release_id:?} of dataset {dataset:?} names a failed charge (#{charge_id}), which stays spent; \
         run the release under a new release id"
    )]
    FailedRelease {
        /// Dataset.
        dataset: String,
        /// Release id.
        release_id: String,
        /// Charge id.
        charge_id: i64,
    },
    /// A release id that uses the suffix reserved for failed charges.
    #[error("release id {0:?} contains {FAILED_SUFFIX:?}, which is reserved for failed charges; choose another id")]
    BadReleaseId(String),
    /// No such charge, or not in the expected state.
    #[error("charge #{0} {1}")]
    BadCharge(i64, String),
    /// The analyst holds no grant on the dataset.
    #[error(
        "analyst {analyst:?} has no budget on dataset {dataset:?}; an administrator grants one with \
         `dpflow budget grant --ledger LEDGER --dataset {dataset} --analyst {analyst} --epsilon E`"
    )]
    NoGrant {
        /// Dataset.
        dataset: String,
        /// Analyst.
        analyst: String,
    },
    /// The charge would overspend the analyst's own grant (nothing was recorded).
    #[error("analyst {analyst:?} on dataset {dataset:?}: {source}; ask an administrator for a larger grant")]
    AnalystBudget {
        /// Dataset.
        dataset: String,
        /// Analyst.
        analyst: String,
        /// Why.
        source: BudgetError,
    },
    /// A grant whose kind differs from the dataset's budget.
    #[error(
        "a grant on dataset {dataset:?} must be in the dataset's unit ({expected}), not {given}; \
         give it with the same flags as the dataset's budget"
    )]
    GrantUnit {
        /// Dataset.
        dataset: String,
        /// The dataset's budget.
        expected: String,
        /// The grant given.
        given: String,
    },
    /// SQLite error.
    #[error("ledger {path}: {source}")]
    Sql {
        /// File.
        path: String,
        /// The error.
        source: rusqlite::Error,
    },
    /// Stored JSON that cannot be read back.
    #[error("ledger {path}: stored record cannot be read: {reason}")]
    Decode {
        /// File.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Status of a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ChargeStatus {
    /// Counted as spent; outputs not yet confirmed.
    Reserved,
    /// Spent; the release is complete.
    Committed,
    /// Spent; the run failed after reading protected data (never refunded).
    Failed,
    /// Returned to the budget after a clean failure.
    Released,
}

impl ChargeStatus {
    fn as_str(&self) -> &'static str {
        match self {
            ChargeStatus::Reserved => "reserved",
            ChargeStatus::Committed => "committed",
            ChargeStatus::Failed => "failed",
            ChargeStatus::Released => "released",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        match s {
            "reserved" => Some(ChargeStatus::Reserved),
            "committed" => Some(ChargeStatus::Committed),
            "failed" => Some(ChargeStatus::Failed),
            "released" => Some(ChargeStatus::Released),
            _ => None,
        }
    }
}

/// A protected dataset's entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetEntry {
    /// Name.
    pub name: String,
    /// The privacy unit: `row` (one row = one person) or the column naming the person.
    pub privacy_unit: String,
    /// Total budget.
    pub budget: Budget,
    /// Creation time (RFC 3339).
    pub created_at: String,
}

/// One charge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeRow {
    /// Charge id.
    pub id: i64,
    /// Dataset.
    pub dataset: String,
    /// Release id.
    pub release_id: String,
    /// Status.
    pub status: ChargeStatus,
    /// Mechanisms with their native losses.
    pub mechanisms: Vec<MechanismRecord>,
    /// The charge's composition parts.
    pub normalized: Normalized,
    /// Marginal cost in the budget's unit when it was reserved.
    pub cost: f64,
    /// When reserved.
    pub reserved_at: String,
    /// When committed or released.
    pub resolved_at: Option<String>,
    /// Free-text note (e.g. who resolved it).
    pub note: Option<String>,
    /// The analyst the charge was made for (`dpflow serve`), if any.
    pub analyst: Option<String>,
}

/// A dataset's budget position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetStatus {
    /// The dataset.
    pub dataset: DatasetEntry,
    /// Spent by committed charges (budget unit).
    pub committed: f64,
    /// Spent including open reservations (budget unit).
    pub spent: f64,
    /// Remaining (budget unit).
    pub remaining: f64,
    /// Open reservations.
    pub open_reservations: usize,
    /// Composition parts of committed + reserved charges.
    pub normalized: Normalized,
}

/// An analyst's position on a dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnalystStatus {
    /// Dataset.
    pub dataset: String,
    /// Analyst.
    pub analyst: String,
    /// The analyst's grant.
    pub budget: Budget,
    /// Spent by the analyst's committed, failed and reserved charges (budget unit).
    pub spent: f64,
    /// Left of the grant (budget unit).
    pub remaining: f64,
    /// Left of the dataset's total (budget unit): the analyst can spend at most
    /// the smaller of the two.
    pub dataset_remaining: f64,
}

/// A reservation handle.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    /// The charge id.
    pub charge_id: i64,
    /// True if an existing reservation of the same release was resumed.
    pub resumed: bool,
    /// Remaining budget after this reservation.
    pub remaining: f64,
}

/// An open ledger.
pub struct Ledger {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ledger({})", self.path.display())
    }
}

/// How long a writer waits for another process's lock before giving up.
const BUSY_LIMIT: Duration = Duration::from_secs(120);

/// SQLite's busy handler: retries every 1–4 ms (with jitter) for up to
/// [`BUSY_LIMIT`]. SQLite's own `busy_timeout` backs off to 100 ms sleeps,
/// so under a steady stream of charges from another process a waiter could
/// lose the race for seconds (benches/serve: p99 2.8 s with two servers).
fn busy_wait(attempt: i32) -> bool {
    let pause = Duration::from_micros(1000 + rand::random::<u64>() % 3000);
    if pause * (attempt.max(0) as u32) > BUSY_LIMIT {
        return false;
    }
    std::thread::sleep(pause);
    true
}

/// Writers of one process take turns here before asking SQLite for its
/// write lock: many sessions of one server then queue in order instead of
/// polling SQLite's busy handler, whose back-off sleeps made the slowest
/// charges wait seconds under load (benches/serve). Other processes still
/// serialise through SQLite's lock, which alone guarantees correctness.
static WRITE_GATE: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn now() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Ledger {
    fn sql_err(&self, e: rusqlite::Error) -> LedgerError {
        LedgerError::Sql { path: self.path.display().to_string(), source: e }
    }

    fn configure(conn: &mut Connection) -> rusqlite::Result<()> {
        conn.busy_handler(Some(busy_wait))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        Ok(())
    }

    /// Creates a new, empty ledger; fails if the file exists.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let p = path.display().to_string();
        let sql = |e| LedgerError::Sql { path: p.clone(), source: e };
        // Owner-only from the first byte: the file is created 0600 here (SQLite
        // gives its -wal and -shm files the database's mode), and `create_new`
        // also makes two concurrent creates fail cleanly instead of sharing it.
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(crate::io::private::PRIVATE_FILE_MODE)
                .open(&path)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::AlreadyExists => LedgerError::Exists(p.clone()),
                    _ => LedgerError::Create { path: p.clone(), source: e },
                })?;
        }
        let mut conn =
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE)
                .map_err(sql)?;
        Self::configure(&mut conn).map_err(sql)?;
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE datasets (
                 name TEXT PRIMARY KEY,
                 privacy_unit TEXT NOT NULL,
                 budget_json TEXT NOT NULL,
                 created_at TEXT NOT NULL
             );
             COMMIT;",
        )
        .map_err(sql)?;
        conn.execute_batch(CHARGES_TABLE).map_err(sql)?;
        conn.execute_batch(ANALYSTS_V3).map_err(sql)?;
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('application', ?1), ('schema_version', ?2), ('created_at', ?3)",
            params![APPLICATION, SCHEMA_VERSION, now()],
        )
        .map_err(sql)?;
        Ok(Self { conn, path })
    }

    /// Opens an existing ledger; a missing or damaged file is an error, never a fresh budget.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let p = path.display().to_string();
        if !path.exists() {
            return Err(LedgerError::Missing(p));
        }
        let corrupt = |reason: String| LedgerError::Corrupt { path: p.clone(), reason };
        let mut conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_WRITE)
            .map_err(|e| corrupt(e.to_string()))?;
        Self::configure(&mut conn).map_err(|e| corrupt(e.to_string()))?;
        let check: String =
            conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(|e| corrupt(e.to_string()))?;
        if check != "ok" {
            return Err(corrupt(format!("integrity check: {check}")));
        }
        let app: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'application'", [], |r| r.get(0))
            .optional()
            .map_err(|e| corrupt(e.to_string()))?;
        if app.as_deref() != Some(APPLICATION) {
            return Err(corrupt("no dpflow ledger header".into()));
        }
        let version: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
            .optional()
            .map_err(|e| corrupt(e.to_string()))?;
        match version.as_deref() {
            Some(SCHEMA_VERSION) => {}
            Some("1" | "2") => Self::migrate(&conn).map_err(|e| corrupt(format!("migrating to schema 3: {e}")))?,
            _ => return Err(corrupt(format!("unsupported schema version {version:?}"))),
        }
        Ok(Self { conn, path })
    }

    /// Brings a schema 1 or 2 ledger to schema 3 in one `BEGIN IMMEDIATE`
    /// transaction that reads the version again inside it: of several
    /// processes opening an old ledger at once, one migrates and the others
    /// find it done. A crash leaves the old schema intact.
    fn migrate(conn: &Connection) -> rusqlite::Result<()> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let steps = || -> rusqlite::Result<()> {
            let version: String =
                conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))?;
            match version.as_str() {
                // Another process migrated it meanwhile.
                SCHEMA_VERSION => return Ok(()),
                "1" | "2" => {}
                // A newer dpflow upgraded it meanwhile: never relabel a schema we do not know.
                other => {
                    return Err(rusqlite::Error::InvalidParameterName(format!(
                        "schema version {other} is newer than this dpflow understands (3); use a newer dpflow"
                    )));
                }
            }
            if version == "1" {
                // 1 → 2: the `failed` status. SQLite cannot alter a CHECK
                // constraint, so the charges table is copied into a new one.
                conn.execute_batch(&format!(
                    "ALTER TABLE charges RENAME TO charges_v1;
                     {CHARGES_TABLE}
                     INSERT INTO charges SELECT * FROM charges_v1;
                     DROP TABLE charges_v1;"
                ))?;
            }
            if version == "1" || version == "2" {
                // 2 → 3: analysts' grants and the analyst of each charge (none for old ones).
                conn.execute_batch(ANALYSTS_V3)?;
            }
            conn.execute("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", params![SCHEMA_VERSION])?;
            Ok(())
        };
        match steps() {
            Ok(()) => conn.execute_batch("COMMIT"),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Registers a protected dataset with its total budget.
    pub fn add_dataset(&self, name: &str, privacy_unit: &str, budget: Budget) -> Result<(), LedgerError> {
        budget.validate().map_err(|source| LedgerError::Budget { dataset: name.to_string(), source })?;
        let json = serde_json::to_string(&budget).expect("budget serialises");
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO datasets (name, privacy_unit, budget_json, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![name, privacy_unit, json, now()],
            )
            .map_err(|e| self.sql_err(e))?;
        if n == 0 {
            return Err(LedgerError::DatasetExists(name.to_string()));
        }
        Ok(())
    }

    /// All datasets.
    pub fn datasets(&self) -> Result<Vec<DatasetEntry>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, privacy_unit, budget_json, created_at FROM datasets ORDER BY name")
            .map_err(|e| self.sql_err(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
            })
            .map_err(|e| self.sql_err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, unit, bj, created) = row.map_err(|e| self.sql_err(e))?;
            out.push(DatasetEntry { name, privacy_unit: unit, budget: self.decode(&bj)?, created_at: created });
        }
        Ok(out)
    }

    fn decode<T: for<'de> Deserialize<'de>>(&self, s: &str) -> Result<T, LedgerError> {
        serde_json::from_str(s)
            .map_err(|e| LedgerError::Decode { path: self.path.display().to_string(), reason: e.to_string() })
    }

    fn dataset_in(conn: &Connection, path: &Path, name: &str) -> Result<DatasetEntry, LedgerError> {
        let row: Option<(String, String, String)> = conn
            .query_row(
                "SELECT privacy_unit, budget_json, created_at FROM datasets WHERE name = ?1",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(|e| LedgerError::Sql { path: path.display().to_string(), source: e })?;
        match row {
            Some((unit, bj, created)) => Ok(DatasetEntry {
                name: name.to_string(),
                privacy_unit: unit,
                budget: serde_json::from_str(&bj)
                    .map_err(|e| LedgerError::Decode { path: path.display().to_string(), reason: e.to_string() })?,
                created_at: created,
            }),
            None => {
                let known: Vec<String> = conn
                    .prepare("SELECT name FROM datasets ORDER BY name")
                    .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                    .unwrap_or_default();
                Err(LedgerError::UnknownDataset {
                    dataset: name.to_string(),
                    path: path.display().to_string(),
                    known: if known.is_empty() { "none".into() } else { known.join(", ") },
                })
            }
        }
    }

    /// One dataset's entry.
    pub fn dataset(&self, name: &str) -> Result<DatasetEntry, LedgerError> {
        Self::dataset_in(&self.conn, &self.path, name)
    }

    fn totals_in(
        conn: &Connection,
        path: &Path,
        dataset: &str,
        exclude: Option<i64>,
        analyst: Option<&str>,
    ) -> Result<(Normalized, Normalized, usize), LedgerError> {
        let mut stmt = conn
            .prepare(
                "SELECT id, status, rho, eps, delta FROM charges
                 WHERE dataset = ?1 AND status != 'released' AND (?2 IS NULL OR analyst = ?2)",
            )
            .map_err(|e| LedgerError::Sql { path: path.display().to_string(), source: e })?;
        let mut committed = Normalized::default();
        let mut all = Normalized::default();
        let mut open = 0;
        let rows = stmt
            .query_map(params![dataset, analyst], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, f64>(2)?,
                    r.get::<_, f64>(3)?,
                    r.get::<_, f64>(4)?,
                ))
            })
            .map_err(|e| LedgerError::Sql { path: path.display().to_string(), source: e })?;
        for row in rows {
            let (id, status, rho, eps, delta) =
                row.map_err(|e| LedgerError::Sql { path: path.display().to_string(), source: e })?;
            if Some(id) == exclude {
                continue;
            }
            let n = Normalized { rho, eps, delta };
            all = all + n;
            if status == "committed" || status == "failed" {
                committed = committed + n;
            } else {
                open += 1;
            }
        }
        Ok((committed, all, open))
    }

    /// A dataset's budget position.
    pub fn status(&self, dataset: &str) -> Result<BudgetStatus, LedgerError> {
        let entry = self.dataset(dataset)?;
        let (committed, all, open) = Self::totals_in(&self.conn, &self.path, dataset, None, None)?;
        let spent = spent_in_unit(&entry.budget, &all);
        Ok(BudgetStatus {
            committed: spent_in_unit(&entry.budget, &committed),
            spent,
            remaining: (entry.budget.amount() - spent).max(0.0),
            open_reservations: open,
            normalized: all,
            dataset: entry,
        })
    }

    /// A filter holding the dataset's budget and everything reserved or committed.
    pub fn filter(&self, dataset: &str) -> Result<PrivacyFilter, LedgerError> {
        let entry = self.dataset(dataset)?;
        let (_, all, _) = Self::totals_in(&self.conn, &self.path, dataset, None, None)?;
        Ok(PrivacyFilter::with_spent(entry.budget, all))
    }

    /// Gives `analyst` their own budget on `dataset` (or changes it), in the
    /// dataset's unit. Lowering a grant below what the analyst has spent is
    /// allowed: they can spend nothing more.
    pub fn grant(&self, dataset: &str, analyst: &str, budget: Budget) -> Result<(), LedgerError> {
        let entry = self.dataset(dataset)?;
        budget.validate().map_err(|source| LedgerError::Budget { dataset: dataset.to_string(), source })?;
        if std::mem::discriminant(&budget) != std::mem::discriminant(&entry.budget) {
            return Err(LedgerError::GrantUnit {
                dataset: dataset.into(),
                expected: entry.budget.describe(),
                given: budget.describe(),
            });
        }
        let json = serde_json::to_string(&budget).expect("budget serialises");
        self.conn
            .execute(
                "INSERT INTO analysts (dataset, analyst, budget_json, granted_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (dataset, analyst) DO UPDATE SET budget_json = ?3, granted_at = ?4",
                params![dataset, analyst, json, now()],
            )
            .map_err(|e| self.sql_err(e))?;
        Ok(())
    }

    fn grant_in(conn: &Connection, path: &Path, dataset: &str, analyst: &str) -> Result<Budget, LedgerError> {
        let p = || path.display().to_string();
        let json: Option<String> = conn
            .query_row(
                "SELECT budget_json FROM analysts WHERE dataset = ?1 AND analyst = ?2",
                params![dataset, analyst],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| LedgerError::Sql { path: p(), source: e })?;
        let json = json.ok_or_else(|| LedgerError::NoGrant { dataset: dataset.into(), analyst: analyst.into() })?;
        serde_json::from_str(&json).map_err(|e| LedgerError::Decode { path: p(), reason: e.to_string() })
    }

    /// An analyst's grant, spending and what is left on a dataset.
    pub fn analyst_status(&self, dataset: &str, analyst: &str) -> Result<AnalystStatus, LedgerError> {
        let entry = self.dataset(dataset)?;
        let budget = Self::grant_in(&self.conn, &self.path, dataset, analyst)?;
        let (_, mine, _) = Self::totals_in(&self.conn, &self.path, dataset, None, Some(analyst))?;
        let (_, all, _) = Self::totals_in(&self.conn, &self.path, dataset, None, None)?;
        let spent = spent_in_unit(&budget, &mine);
        Ok(AnalystStatus {
            dataset: dataset.into(),
            analyst: analyst.into(),
            remaining: (budget.amount() - spent).max(0.0),
            dataset_remaining: (entry.budget.amount() - spent_in_unit(&entry.budget, &all)).max(0.0),
            spent,
            budget,
        })
    }

    /// Every grant (optionally of one dataset) with its position.
    pub fn analysts(&self, dataset: Option<&str>) -> Result<Vec<AnalystStatus>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT dataset, analyst FROM analysts WHERE (?1 IS NULL OR dataset = ?1) ORDER BY dataset, analyst",
            )
            .map_err(|e| self.sql_err(e))?;
        let pairs: Vec<(String, String)> = stmt
            .query_map(params![dataset], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.sql_err(e))?;
        pairs.iter().map(|(d, a)| self.analyst_status(d, a)).collect()
    }

    /// Reserves the cost of `mechanisms` for `release_id` before any data is
    /// touched. Refuses (recording nothing) if it does not fit. Reserving a
    /// release id again resumes its open reservation if the cost is the same;
    /// a committed release id is refused so it is never spent twice.
    pub fn reserve(
        &mut self,
        dataset: &str,
        release_id: &str,
        mechanisms: &[MechanismRecord],
        rdp_delta: Option<f64>,
    ) -> Result<Reservation, LedgerError> {
        self.reserve_for(dataset, release_id, mechanisms, rdp_delta, None)
    }

    /// [`Ledger::reserve`] on behalf of `analyst`: the charge must also fit the
    /// analyst's grant (only their own charges count against it), checked in
    /// the same transaction as the dataset's total, so concurrent servers on
    /// one ledger overspend neither. `remaining` is the smaller of the two.
    pub fn reserve_for(
        &mut self,
        dataset: &str,
        release_id: &str,
        mechanisms: &[MechanismRecord],
        rdp_delta: Option<f64>,
        analyst: Option<&str>,
    ) -> Result<Reservation, LedgerError> {
        let path = self.path.clone();
        let sql = |e| LedgerError::Sql { path: path.display().to_string(), source: e };
        if release_id.contains(FAILED_SUFFIX) {
            return Err(LedgerError::BadReleaseId(release_id.to_string()));
        }
        let _gate = WRITE_GATE.lock();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql)?;
        let entry = Self::dataset_in(&tx, &path, dataset)?;
        let grant = match analyst {
            Some(a) => Some((a, Self::grant_in(&tx, &path, dataset, a)?)),
            None => None,
        };
        let budget_err = |source| LedgerError::Budget { dataset: dataset.to_string(), source };
        let mut charge = Normalized::default();
        for m in mechanisms {
            charge = charge + normalize(&entry.budget, &m.loss, rdp_delta).map_err(budget_err)?;
        }
        let existing: Option<(i64, String, f64, f64, f64, Option<String>)> = tx
            .query_row(
                "SELECT id, status, rho, eps, delta, analyst FROM charges WHERE dataset = ?1 AND release_id = ?2",
                params![dataset, release_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
            )
            .optional()
            .map_err(sql)?;
        let (_, before, _) = Self::totals_in(&tx, &path, dataset, existing.as_ref().map(|e| e.0), None)?;
        // The analyst's own spending (their charges only) and what their grant leaves.
        let mine = match &grant {
            Some((a, _)) => Some(Self::totals_in(&tx, &path, dataset, existing.as_ref().map(|e| e.0), Some(a))?.1),
            None => None,
        };
        let left = |charge: Normalized| {
            let total = (entry.budget.amount() - spent_in_unit(&entry.budget, &(before + charge))).max(0.0);
            match (&grant, mine) {
                (Some((_, g)), Some(m)) => total.min((g.amount() - spent_in_unit(g, &(m + charge))).max(0.0)),
                _ => total,
            }
        };
        if let Some((id, status, rho, eps, delta, owner)) = &existing {
            match ChargeStatus::parse(status) {
                // Terminal: a failed charge is never overwritten (that would refund it).
                Some(ChargeStatus::Failed) => {
                    return Err(LedgerError::FailedRelease {
                        dataset: dataset.into(),
                        release_id: release_id.into(),
                        charge_id: *id,
                    });
                }
                Some(ChargeStatus::Committed) => {
                    return Err(LedgerError::AlreadyCommitted {
                        dataset: dataset.into(),
                        release_id: release_id.into(),
                        charge_id: *id,
                    });
                }
                Some(ChargeStatus::Reserved) => {
                    let same = Normalized { rho: *rho, eps: *eps, delta: *delta };
                    // Resuming is for the same release by the same analyst only.
                    if !approx_eq(&same, &charge) || owner.as_deref() != analyst {
                        return Err(LedgerError::ConflictingReservation {
                            dataset: dataset.into(),
                            release_id: release_id.into(),
                            charge_id: *id,
                        });
                    }
                    let remaining = left(same);
                    tx.commit().map_err(sql)?;
                    return Ok(Reservation { charge_id: *id, resumed: true, remaining });
                }
                _ => {}
            }
        }
        let filter = PrivacyFilter::with_spent(entry.budget, before);
        filter.check_normalized(charge).map_err(budget_err)?;
        if let (Some((a, g)), Some(m)) = (&grant, mine) {
            PrivacyFilter::with_spent(*g, m).check_normalized(charge).map_err(|source| LedgerError::AnalystBudget {
                dataset: dataset.into(),
                analyst: a.to_string(),
                source,
            })?;
        }
        let cost = spent_in_unit(&entry.budget, &(before + charge)) - spent_in_unit(&entry.budget, &before);
        let mjson = serde_json::to_string(mechanisms).expect("mechanisms serialise");
        let id = match existing {
            Some((id, ..)) => {
                tx.execute(
                    "UPDATE charges SET status = 'reserved', mechanisms_json = ?2, rho = ?3, eps = ?4, delta = ?5, cost = ?6,
                         reserved_at = ?7, resolved_at = NULL, note = NULL, pid = ?8, analyst = ?9 WHERE id = ?1",
                    params![id, mjson, charge.rho, charge.eps, charge.delta, cost, now(), std::process::id(), analyst],
                )
                .map_err(sql)?;
                id
            }
            None => {
                tx.execute(
                    "INSERT INTO charges (dataset, release_id, status, mechanisms_json, rho, eps, delta, cost, reserved_at, pid, analyst)
                     VALUES (?1, ?2, 'reserved', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    params![dataset, release_id, mjson, charge.rho, charge.eps, charge.delta, cost, now(), std::process::id(), analyst],
                )
                .map_err(sql)?;
                tx.last_insert_rowid()
            }
        };
        let remaining = left(charge);
        tx.commit().map_err(sql)?;
        Ok(Reservation { charge_id: id, resumed: false, remaining })
    }

    fn transition(
        &self,
        id: i64,
        from: &[ChargeStatus],
        to: ChargeStatus,
        note: Option<&str>,
    ) -> Result<(), LedgerError> {
        let _gate = WRITE_GATE.lock();
        let status: Option<String> = self
            .conn
            .query_row("SELECT status FROM charges WHERE id = ?1", params![id], |r| r.get(0))
            .optional()
            .map_err(|e| self.sql_err(e))?;
        let status = status.ok_or_else(|| LedgerError::BadCharge(id, "does not exist".into()))?;
        if !from.iter().any(|s| s.as_str() == status) {
            return Err(LedgerError::BadCharge(id, format!("is {status}, cannot become {}", to.as_str())));
        }
        // The status is checked again by the UPDATE itself: two handles that both read
        // `reserved` cannot both move the charge (exactly one row changes, or it is an error).
        let changed = self
            .conn
            .execute(
                "UPDATE charges SET status = ?2, resolved_at = ?3, note = COALESCE(?4, note) WHERE id = ?1 AND status = ?5",
                params![id, to.as_str(), now(), note, status],
            )
            .map_err(|e| self.sql_err(e))?;
        if changed != 1 {
            return Err(LedgerError::BadCharge(id, format!("changed while it was becoming {}", to.as_str())));
        }
        Ok(())
    }

    /// Marks a reservation as spent for good (after outputs are durably written).
    pub fn commit(&self, charge_id: i64) -> Result<(), LedgerError> {
        self.transition(charge_id, &[ChargeStatus::Reserved], ChargeStatus::Committed, None)
    }

    /// Marks a reservation as spent by a run that failed *after* it read
    /// protected data: whether and how a run fails can depend on the data,
    /// so the failure is an outcome and its cost is never refunded
    /// (docs/PRIVACY.md §1). The release id is renamed `<id>#failed-<charge>`
    /// so the same release can be run again under a fresh charge.
    pub fn fail(&self, charge_id: i64, note: &str) -> Result<(), LedgerError> {
        let _gate = WRITE_GATE.lock();
        // One statement: status, rename and note together (user release ids never
        // contain the suffix, so the new id is free).
        let n = self
            .conn
            .execute(
                &format!(
                    "UPDATE charges SET status = 'failed', resolved_at = ?2, note = ?3,
                         release_id = release_id || '{FAILED_SUFFIX}' || id
                     WHERE id = ?1 AND status = 'reserved'"
                ),
                params![charge_id, now(), note],
            )
            .map_err(|e| self.sql_err(e))?;
        if n != 1 {
            return Err(LedgerError::BadCharge(charge_id, "is not reserved, so it cannot be marked failed".into()));
        }
        Ok(())
    }

    /// Returns a reservation to the budget after a clean failure *before* any
    /// protected data was read (nothing that depends on the data left the
    /// process). After a read, use [`Ledger::fail`].
    pub fn release(&self, charge_id: i64, note: &str) -> Result<(), LedgerError> {
        self.transition(charge_id, &[ChargeStatus::Reserved], ChargeStatus::Released, Some(note))
    }

    /// Operator resolution of an open reservation left by a crash.
    pub fn resolve(&self, charge_id: i64, to: ChargeStatus, note: &str) -> Result<(), LedgerError> {
        if to == ChargeStatus::Reserved {
            return Err(LedgerError::BadCharge(charge_id, "can only be resolved to committed or released".into()));
        }
        self.transition(charge_id, &[ChargeStatus::Reserved], to, Some(note))
    }

    /// A charge by id.
    pub fn charge(&self, id: i64) -> Result<ChargeRow, LedgerError> {
        let rows = self.query_charges("WHERE id = ?1", params![id])?;
        rows.into_iter().next().ok_or_else(|| LedgerError::BadCharge(id, "does not exist".into()))
    }

    /// The charge of a release, if any.
    pub fn charge_for_release(&self, dataset: &str, release_id: &str) -> Result<Option<ChargeRow>, LedgerError> {
        Ok(self
            .query_charges("WHERE dataset = ?1 AND release_id = ?2", params![dataset, release_id])?
            .into_iter()
            .next())
    }

    /// Every charge (optionally of one dataset), oldest first.
    pub fn history(&self, dataset: Option<&str>) -> Result<Vec<ChargeRow>, LedgerError> {
        match dataset {
            Some(d) => {
                self.dataset(d)?;
                self.query_charges("WHERE dataset = ?1", params![d])
            }
            None => self.query_charges("", params![]),
        }
    }

    fn query_charges(&self, filter: &str, p: &[&dyn rusqlite::ToSql]) -> Result<Vec<ChargeRow>, LedgerError> {
        let sql = format!(
            "SELECT id, dataset, release_id, status, mechanisms_json, rho, eps, delta, cost, reserved_at, resolved_at, note,
                    analyst
             FROM charges {filter} ORDER BY id"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.sql_err(e))?;
        let raw = stmt
            .query_map(p, |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    Normalized { rho: r.get(5)?, eps: r.get(6)?, delta: r.get(7)? },
                    r.get::<_, f64>(8)?,
                    r.get::<_, String>(9)?,
                    r.get::<_, Option<String>>(10)?,
                    r.get::<_, Option<String>>(11)?,
                    r.get::<_, Option<String>>(12)?,
                ))
            })
            .map_err(|e| self.sql_err(e))?;
        let mut out = Vec::new();
        for row in raw {
            let (id, dataset, release_id, status, mj, normalized, cost, reserved_at, resolved_at, note, analyst) =
                row.map_err(|e| self.sql_err(e))?;
            out.push(ChargeRow {
                id,
                dataset,
                release_id,
                status: ChargeStatus::parse(&status).ok_or_else(|| LedgerError::Decode {
                    path: self.path.display().to_string(),
                    reason: format!("bad status {status:?}"),
                })?,
                mechanisms: self.decode(&mj)?,
                normalized,
                cost,
                reserved_at,
                resolved_at,
                note,
                analyst,
            });
        }
        Ok(out)
    }
}

fn approx_eq(a: &Normalized, b: &Normalized) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1e-300);
    close(a.rho, b.rho) && close(a.eps, b.eps) && close(a.delta, b.delta)
}
