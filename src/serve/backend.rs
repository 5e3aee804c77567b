//! One client connection: SCRAM-SHA-256 login against the users file, then
//! the simple and extended query protocols over the analyst's DP SQL
//! session and metadata session ([`super::route`] decides which).
//!
//! A DP query is described from its plan (no data read, nothing charged)
//! and executed once per `Execute`: the engine reserves its cost in the
//! ledger under the analyst's name before reading anything, draws the noise
//! once, and commits. Query parameters (`$1`) are refused in DP queries (a
//! DP query's literals are part of what is checked and costed, so they must
//! be in its text) and bound in metadata queries.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::scalar::ScalarValue;
use futures::{Sink, stream};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::{ScramAuth, ScramSecret};
use pgwire::api::auth::{AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{NoopQueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, METADATA_USER, PgWireServerHandlers, Type};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::sync::Mutex;

use super::audit::{AuditEntry, AuditLog, query_hash};
use super::metadata::Metadata;
use super::route::{DP_BUDGET, Route, route};
use super::users::Users;
use super::{encode, sqlstate};
use crate::sql::{Catalog, SqlEngine, explain_batch};

/// What every connection of one server shares.
pub struct Shared {
    /// The catalog (every table; each analyst sees their role's).
    pub catalog: Catalog,
    /// Its table names.
    pub catalog_tables: BTreeSet<String>,
    /// The analysts.
    pub users: Users,
    /// The audit log.
    pub audit: AuditLog,
    /// TLS is configured: connections without it get no session.
    pub require_tls: bool,
    /// Held (shared) by every statement while it runs; shutdown takes it
    /// exclusively to wait for statements in flight.
    pub inflight: tokio::sync::RwLock<()>,
    /// Shutdown has begun: new statements are refused.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Salt material for the verifiers of unknown users (so a login fails
    /// the same way whether or not the user exists).
    pub decoy_key: [u8; 32],
}

/// SCRAM secrets from the users file.
#[derive(Debug)]
struct Logins(Arc<Shared>);

impl Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared({} users)", self.users.users.len())
    }
}

#[async_trait]
impl AuthSource for Logins {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        // Only SCRAM is offered; a password is never compared in clear.
        Err(PgWireError::InvalidPassword(login.user().unwrap_or_default().to_owned()))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let name = login.user().unwrap_or_default();
        match self.0.users.users.get(name) {
            Some(u) => Ok((u.verifier.secret(), None)),
            None => {
                // An unknown user gets a decoy verifier with a stable salt, so the
                // exchange runs to the end and fails like a wrong password.
                use sha2::{Digest, Sha256};
                let d = Sha256::new().chain_update(self.0.decoy_key).chain_update(name.as_bytes()).finalize();
                let keys: [u8; 32] = rand::random();
                Ok((
                    ScramSecret::Verifier {
                        salt: d[..16].to_vec(),
                        iterations: self.0.users.typical_iterations,
                        stored_key: keys.to_vec(),
                        server_key: keys.to_vec(),
                    },
                    None,
                ))
            }
        }
    }
}

/// The analyst's sessions, opened after login.
struct Conn {
    analyst: String,
    allowed: BTreeSet<String>,
    engine: SqlEngine,
    meta: Metadata,
}

/// One connection's handlers.
pub struct Session {
    shared: Arc<Shared>,
    conn: Mutex<Option<Conn>>,
    parser: Arc<NoopQueryParser>,
}

/// What a statement produced.
enum Outcome {
    Rows(SchemaRef, Vec<RecordBatch>),
    Tag(Response),
}

/// Accounting of one executed statement, for the audit log.
#[derive(Default)]
struct Accounting {
    route: &'static str,
    charge_id: Option<i64>,
    loss: Option<String>,
}

fn no_such_user() -> PgWireError {
    sqlstate::error(sqlstate::AUTHORIZATION, "the connection has no authenticated user")
}

fn system(e: impl std::fmt::Display) -> PgWireError {
    sqlstate::error(sqlstate::SYSTEM, e.to_string())
}

/// Server settings `SHOW` answers (the values the startup message announced).
fn setting(name: &str) -> Option<&'static str> {
    Some(match name {
        "server_version" => "16.0",
        "server_encoding" | "client_encoding" => "UTF8",
        "standard_conforming_strings" => "on",
        "integer_datetimes" => "on",
        "datestyle" => "ISO, MDY",
        "timezone" => "UTC",
        "search_path" => "public",
        "transaction_isolation" | "default_transaction_isolation" | "transaction isolation level" => "read committed",
        "transaction_read_only" | "default_transaction_read_only" => "on",
        "max_identifier_length" => "63",
        "intervalstyle" => "postgres",
        _ => return None,
    })
}

const TLS_REQUIRED: &str = "this server requires TLS: connect with sslmode=require (or verify-full)";

/// The one column `SHOW name` answers.
fn setting_schema(name: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, false)]))
}

fn one_text_row(name: &str, value: &str) -> PgWireResult<Outcome> {
    let schema = setting_schema(name);
    let b =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(datafusion::arrow::array::StringArray::from(vec![value]))])
            .map_err(system)?;
    Ok(Outcome::Rows(schema, vec![b]))
}

impl Session {
    /// A connection of the server sharing `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared, conn: Mutex::new(None), parser: Arc::new(NoopQueryParser::new()) }
    }

    /// The analyst's sessions, opened on first use.
    async fn conn<C: ClientInfo>(&self, client: &C) -> PgWireResult<tokio::sync::MutexGuard<'_, Option<Conn>>> {
        let mut guard = self.conn.lock().await;
        if guard.is_none() {
            if self.shared.require_tls && !client.is_secure() {
                return Err(sqlstate::error(sqlstate::AUTHORIZATION, TLS_REQUIRED));
            }
            let analyst = client.metadata().get(METADATA_USER).cloned().ok_or_else(no_such_user)?;
            let user = self.shared.users.users.get(&analyst).ok_or_else(no_such_user)?;
            // Opening lists the tables' files (and checks their footers): an error
            // can name files the catalog does not (Hive partition values, per-person
            // file names), so the analyst gets a generic message and the operator's
            // log gets the details.
            let engine = SqlEngine::open_for_analyst(self.shared.catalog.clone(), &analyst, &user.tables)
                .await
                .map_err(|e| {
                    log::error!("opening the tables of analyst {analyst}: {e}");
                    sqlstate::error(
                        sqlstate::SYSTEM,
                        "the server cannot open your tables; the operator can find why in the server's log",
                    )
                })?;
            let mut tables = Vec::new();
            for name in &user.tables {
                let provider = engine.context().table_provider(name.as_str()).await.map_err(system)?;
                tables.push((name.clone(), provider.schema()));
            }
            let meta = Metadata::new(&tables, engine.catalog().clone(), &analyst).map_err(system)?;
            *guard = Some(Conn { analyst, allowed: user.tables.clone(), engine, meta });
        }
        Ok(guard)
    }

    /// The columns `sql` returns (empty: a statement without rows).
    async fn describe(&self, conn: &mut Conn, sql: &str, has_params: bool) -> PgWireResult<Option<SchemaRef>> {
        Ok(match route(sql, &self.shared.catalog_tables, &conn.allowed) {
            Route::Dp if has_params => return Err(parameters_refused()),
            Route::Dp => Some(conn.engine.describe(sql).await.map_err(|e| sqlstate::from_sql(&e))?),
            Route::Metadata => Some(conn.meta.describe(sql).await.map_err(|e| metadata_error(&e))?),
            Route::Show(name) if name == DP_BUDGET => Some(super::metadata::budget_schema()),
            Route::Show(name) => {
                setting(&name).ok_or_else(|| unknown_setting(&name))?;
                Some(setting_schema(&name))
            }
            Route::Refuse(code, msg) => return Err(sqlstate::error(code, msg)),
            _ => None,
        })
    }

    /// Runs `sql` once.
    async fn run(
        &self,
        conn: &mut Conn,
        sql: &str,
        params: Vec<ScalarValue>,
        acct: &mut Accounting,
    ) -> PgWireResult<Outcome> {
        match route(sql, &self.shared.catalog_tables, &conn.allowed) {
            Route::Empty => {
                acct.route = "session";
                Ok(Outcome::Tag(Response::EmptyQuery))
            }
            Route::Begin => {
                acct.route = "session";
                Ok(Outcome::Tag(Response::TransactionStart(Tag::new("BEGIN"))))
            }
            Route::Commit => {
                acct.route = "session";
                Ok(Outcome::Tag(Response::TransactionEnd(Tag::new("COMMIT"))))
            }
            Route::Rollback => {
                acct.route = "session";
                Ok(Outcome::Tag(Response::TransactionEnd(Tag::new("ROLLBACK"))))
            }
            Route::Set(tag) => {
                acct.route = "session";
                Ok(Outcome::Tag(Response::Execution(Tag::new(tag))))
            }
            Route::Show(name) => {
                acct.route = "metadata";
                if name == DP_BUDGET {
                    let (schema, batches) =
                        conn.meta.query("SELECT * FROM dp_budget()", vec![]).await.map_err(|e| metadata_error(&e))?;
                    return Ok(Outcome::Rows(schema, batches));
                }
                one_text_row(&name, setting(&name).ok_or_else(|| unknown_setting(&name))?)
            }
            Route::Metadata => {
                acct.route = "metadata";
                let (schema, batches) = conn.meta.query(sql, params).await.map_err(|e| metadata_error(&e))?;
                Ok(Outcome::Rows(schema, batches))
            }
            Route::Dp => {
                acct.route = "dp";
                if !params.is_empty() {
                    return Err(parameters_refused());
                }
                let r = match conn.engine.query(sql, None).await {
                    Ok(r) => r,
                    Err(e) => {
                        // A failure after the read is charged: the audit line names its charge.
                        if let crate::sql::SqlError::Failed(f) = &e {
                            acct.charge_id = f.charge_id();
                        }
                        return Err(sqlstate::from_sql(&e));
                    }
                };
                acct.charge_id = r.charge_id;
                if r.charge_id.is_some() {
                    acct.loss = Some(r.mechanisms.iter().map(|m| m.loss.describe()).collect::<Vec<_>>().join(" + "));
                }
                match &r.explain {
                    Some(rows) => {
                        acct.route = "explain";
                        Ok(Outcome::Rows(r.schema, vec![explain_batch(rows).map_err(|e| sqlstate::from_sql(&e))?]))
                    }
                    None => Ok(Outcome::Rows(r.schema, r.batches)),
                }
            }
            Route::Refuse(code, msg) => {
                acct.route = "refused";
                Err(sqlstate::error(code, msg))
            }
        }
    }

    /// Runs `sql`, writes its audit line, and shapes the answer.
    async fn execute<C: ClientInfo>(
        &self,
        client: &C,
        sql: &str,
        format: &Format,
        params: Vec<ScalarValue>,
    ) -> PgWireResult<Response> {
        let _inflight = self.shared.inflight.read().await;
        // Checked once the statement holds its place: shutdown sets the flag before it waits.
        if self.shared.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(sqlstate::error(
                sqlstate::SHUTTING_DOWN,
                "the server is shutting down; reconnect to another server",
            ));
        }
        let mut guard = self.conn(client).await?;
        let conn = guard.as_mut().expect("opened");
        let mut acct = Accounting::default();
        // Encoded before the audit line is written, so the line says what the client got.
        let result = match self.run(conn, sql, params, &mut acct).await {
            Ok(Outcome::Tag(r)) => Ok(r),
            Ok(Outcome::Rows(schema, batches)) => {
                let fields = Arc::new(encode::fields(&schema, format));
                encode::rows(fields.clone(), &schema, &batches)
                    .map(|rows| Response::Query(QueryResponse::new(fields, stream::iter(rows.into_iter().map(Ok)))))
            }
            Err(e) => Err(e),
        };
        let sqlstate = match &result {
            Err(PgWireError::UserError(info)) => Some(info.code.clone()),
            Err(_) => Some(sqlstate::SYSTEM.to_string()),
            Ok(_) => None,
        };
        self.shared.audit.record(&AuditEntry {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            analyst: &conn.analyst,
            peer: client.socket_addr().to_string(),
            query_sha256: query_hash(sql),
            route: if acct.route.is_empty() { "refused" } else { acct.route },
            charge_id: acct.charge_id,
            loss: acct.loss.clone(),
            outcome: if result.is_ok() { "ok" } else { "error" },
            sqlstate,
        });
        result
    }

    async fn fields<C: ClientInfo>(
        &self,
        client: &C,
        sql: &str,
        format: &Format,
        has_params: bool,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let mut guard = self.conn(client).await?;
        let conn = guard.as_mut().expect("opened");
        Ok(self.describe(conn, sql, has_params).await?.map(|s| encode::fields(&s, format)).unwrap_or_default())
    }
}

fn unknown_setting(name: &str) -> PgWireError {
    sqlstate::error(sqlstate::UNDEFINED_OBJECT, format!("unrecognized configuration parameter \"{name}\""))
}

/// Errors of the metadata session (it holds no protected data, so its
/// messages are shown as they are).
fn metadata_error(e: &datafusion::error::DataFusionError) -> PgWireError {
    let msg = e.to_string();
    let code = if msg.contains("not found") || msg.contains("does not exist") {
        sqlstate::UNDEFINED_TABLE
    } else if msg.contains("not supported") || msg.contains("DDL") || msg.contains("DML") {
        sqlstate::PERMISSION
    } else {
        sqlstate::ACCESS_RULE
    };
    sqlstate::error(code, msg)
}

fn parameters_refused() -> PgWireError {
    sqlstate::error(
        sqlstate::UNSUPPORTED,
        "query parameters ($1, ...) are not supported in DP queries: a DP query is checked and costed from its \
         text, so write the values into the SQL (psycopg: use a ClientCursor)",
    )
}

/// The values bound to a portal's placeholders (used by metadata queries only;
/// DP queries with parameters are refused).
fn parameters(portal: &Portal<String>) -> PgWireResult<Vec<ScalarValue>> {
    (0..portal.parameter_len())
        .map(|i| {
            let ty = portal.statement.parameter_types.get(i).cloned().flatten().unwrap_or(Type::UNKNOWN);
            Ok(match ty {
                Type::BOOL => ScalarValue::Boolean(portal.parameter::<bool>(i, &ty)?),
                Type::INT2 => ScalarValue::Int16(portal.parameter::<i16>(i, &ty)?),
                Type::INT4 => ScalarValue::Int32(portal.parameter::<i32>(i, &ty)?),
                Type::INT8 => ScalarValue::Int64(portal.parameter::<i64>(i, &ty)?),
                Type::FLOAT4 => ScalarValue::Float32(portal.parameter::<f32>(i, &ty)?),
                Type::FLOAT8 => ScalarValue::Float64(portal.parameter::<f64>(i, &ty)?),
                _ => ScalarValue::Utf8(portal.parameter::<String>(i, &Type::TEXT)?),
            })
        })
        .collect()
}

#[async_trait]
impl SimpleQueryHandler for Session {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        Ok(vec![self.execute(client, query, &Format::UnifiedText, vec![]).await?])
    }
}

#[async_trait]
impl ExtendedQueryHandler for Session {
    type Statement = String;
    type QueryParser = NoopQueryParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    async fn do_describe_statement<C>(
        &self,
        client: &mut C,
        target: &StoredStatement<Self::Statement>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let params = target.parameter_types.iter().map(|t| t.clone().unwrap_or(Type::UNKNOWN)).collect();
        let has_params = !target.parameter_types.is_empty();
        let fields = self.fields(client, &target.statement, &Format::UnifiedBinary, has_params).await?;
        Ok(DescribeStatementResponse::new(params, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        client: &mut C,
        target: &Portal<Self::Statement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let has_params = !target.parameters.is_empty();
        let fields = self.fields(client, &target.statement.statement, &target.result_column_format, has_params).await?;
        Ok(DescribePortalResponse::new(fields))
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let params = parameters(portal)?;
        self.execute(client, &portal.statement.statement, &portal.result_column_format, params).await
    }
}

/// Login: refuses a connection without TLS when TLS is configured (before
/// any password exchange, so no channel-bound mechanism is offered on a
/// plain socket), then SCRAM-SHA-256.
struct Startup {
    require_tls: bool,
    inner: SASLAuthStartupHandler<DefaultServerParameterProvider>,
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.require_tls && !client.is_secure() {
            return Err(PgWireError::UserError(Box::new(pgwire::error::ErrorInfo::new(
                "FATAL".to_owned(),
                sqlstate::AUTHORIZATION.to_owned(),
                TLS_REQUIRED.to_owned(),
            ))));
        }
        self.inner.on_startup(client, message).await
    }
}

/// The handlers of one connection.
pub struct Handlers {
    /// The connection's session.
    pub session: Arc<Session>,
    /// TLS certificate (PEM) for SCRAM channel binding, when TLS is on.
    pub cert_pem: Option<Arc<Vec<u8>>>,
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.session.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.session.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        let mut scram = ScramAuth::new(Arc::new(Logins(self.session.shared.clone())));
        scram.set_iterations(self.session.shared.users.typical_iterations);
        if let Some(pem) = &self.cert_pem
            && let Err(e) = scram.configure_certificate(pem)
        {
            log::warn!("SCRAM channel binding is off: {e}");
        }
        let mut params = DefaultServerParameterProvider::default();
        params.server_version = "16.0".into();
        params.default_transaction_read_only = true;
        params.is_superuser = false;
        Arc::new(Startup {
            require_tls: self.session.shared.require_tls,
            inner: SASLAuthStartupHandler::new(Arc::new(params)).with_scram(scram),
        })
    }
}
