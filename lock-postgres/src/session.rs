//! Server sessions: one dedicated connection per held lease, idle ones kept for reuse, and
//! the guard that ends a cancelled waiter's backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fencelock_core::raw::cleanup::CleanupSchedule;
use fencelock_core::raw::session_pool::{open_within, OpenCount, SessionPool};
use fencelock_core::Error;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Row};
use tokio::sync::OnceCell;

use crate::config::PostgresConfig;
use crate::error::{
    bounded, connect_error, is_duplicate_object, sql_error, CREATING_THE_FENCE_TABLE,
};
use crate::keys::{check_recorded_fence_scheme, check_recorded_scheme};
use crate::sql::{Statements, FENCE_TABLE_STATE, SESSION_INFO, TERMINATE_WAITER};

/// How often a backend that runs a statement (a lock wait) polls its socket to notice a client
/// that went away (`client_connection_check_interval`, PostgreSQL 14+), so a dropped waiter's
/// backend stops waiting instead of taking the lock later.
pub(crate) const DISCONNECT_CHECK_MS: u32 = 500;

/// Session settings sent in the startup packet (no extra round trip). They come after any
/// `options` from the URL, so they win.
fn session_settings() -> [(&'static str, String); 7] {
    [
        // A fence bump is durable before its token is handed out, unless its own statement
        // says otherwise for its transaction (a token at the clock: see `sql::grant_commit`).
        ("synchronous_commit", "on".into()),
        // ON CONFLICT DO UPDATE must read the latest token, whatever the server default is.
        ("default_transaction_isolation", "read\\ committed".into()),
        // Armed per lease by the acquire statement; off while a session is idle in the pool.
        ("idle_session_timeout", "0".into()),
        ("lock_timeout", "0".into()),
        ("statement_timeout", "0".into()),
        ("idle_in_transaction_session_timeout", "0".into()),
        (
            "client_connection_check_interval",
            DISCONNECT_CHECK_MS.to_string(),
        ),
    ]
}

/// One server session: a connection and the identity of its backend.
pub(crate) struct Session {
    pub(crate) conn: PgConnection,
    /// `pg_backend_pid()` when the session was opened.
    pub(crate) pid: i32,
    /// The backend's start time (µs since the epoch), to tell it from a later one with its pid.
    pub(crate) started_us: Option<i64>,
    _open: OpenCount,
}

/// A session taken for one operation, and whether it came from the idle list.
pub(crate) type Checkout = fencelock_core::raw::session_pool::Checkout<Session>;

/// The connections of one store handle and everything needed to open more.
pub(crate) struct Sessions {
    pub(crate) config: PostgresConfig,
    options: PgConnectOptions,
    pool: SessionPool<Session>,
    fence_table_ready: OnceCell<()>,
    /// Whether the fence table has the `permit_limit` column (known once it was checked).
    permit_limit_column: AtomicBool,
    /// Whether the fence table has the `label` column (known once it was checked).
    label_column: AtomicBool,
    pub(crate) sql: Statements,
    /// When idle fence rows were last removed (see `cleanup.rs`).
    pub(crate) cleanup: CleanupSchedule,
}

impl Sessions {
    pub(crate) fn new(config: PostgresConfig) -> Self {
        let options = config.connect.clone().options(session_settings());
        let sql = Statements::new(&config.fence_table(), &config.schema, config.durable_grants);
        Sessions {
            config,
            options,
            pool: SessionPool::default(),
            fence_table_ready: OnceCell::new(),
            permit_limit_column: AtomicBool::new(false),
            label_column: AtomicBool::new(false),
            sql,
            cleanup: CleanupSchedule::default(),
        }
    }

    /// Whether the fence table can record a semaphore's limit (it has the `permit_limit`
    /// column). Meaningful once a session was opened.
    pub(crate) fn has_label_column(&self) -> bool {
        self.label_column.load(Ordering::Relaxed)
    }

    /// Whether the fence table can record a semaphore's limit (it has the `permit_limit`
    /// column, known once it was checked).
    pub(crate) fn has_permit_limit_column(&self) -> bool {
        self.permit_limit_column.load(Ordering::Relaxed)
    }

    /// Sessions open right now: held by leases, waiting, running a statement, or idle.
    pub(crate) fn open_count(&self) -> usize {
        self.pool.open_count()
    }

    /// Idle sessions kept for reuse.
    pub(crate) fn idle_count(&self) -> usize {
        self.pool.idle_count()
    }

    /// An idle session, or a new one.
    ///
    /// # Cancel safety
    /// Dropping the future drops a half-opened connection; nothing is held.
    pub(crate) async fn checkout(&self) -> fencelock_core::Result<Checkout> {
        if let Some(session) = self.pool.take_idle(|_| true) {
            return Ok(Checkout {
                session,
                reused: true,
            });
        }
        Ok(Checkout {
            session: self.open().await?,
            reused: false,
        })
    }

    /// A session for background work: a spare idle one ([`SessionPool::take_spare`]), or a
    /// new one.
    ///
    /// # Cancel safety
    /// As [`open`](Self::open).
    pub(crate) async fn checkout_spare(&self) -> fencelock_core::Result<Session> {
        match self.pool.take_spare(|_| true) {
            Some(session) => Ok(session),
            None => self.open().await,
        }
    }

    /// Gives back a session that holds no lock and has its idle timeout off.
    pub(crate) fn checkin(&self, session: Session) {
        self.pool.keep_idle(session, self.config.max_idle());
    }

    /// Closes every idle session: after one of them turned out dead, the rest likely are too.
    pub(crate) fn discard_idle(&self) {
        self.pool.discard_idle();
    }

    /// Opens a session within the connect timeout and makes sure the fence table exists.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-opened connection; nothing is held.
    pub(crate) async fn open(&self) -> fencelock_core::Result<Session> {
        let limit = self.config.connect_timeout();
        let opening = async {
            let mut conn = PgConnection::connect_with(&self.options)
                .await
                .map_err(|e| connect_error(self.config.redacted(), e))?;
            if conn.server_version_num().is_some_and(|v| v < 140_000) {
                return Err(Error::Store {
                    message: format!(
                        "{} runs PostgreSQL {}; this store needs 14 or newer (idle_session_timeout, client_connection_check_interval)",
                        self.config.redacted(),
                        conn.server_version_num().unwrap_or_default()
                    ),
                    source: None,
                });
            }
            let row = sqlx::query(SESSION_INFO)
                .fetch_one(&mut conn)
                .await
                .map_err(|e| sql_error("reading the session's backend", e))?;
            let pid: i32 = row
                .try_get("pid")
                .map_err(|e| sql_error("reading the session's backend", e))?;
            let started_us: Option<i64> = row
                .try_get("started_us")
                .map_err(|e| sql_error("reading the session's backend", e))?;
            self.fence_table_ready
                .get_or_try_init(|| self.ensure_fence_table(&mut conn))
                .await?;
            Ok(Session {
                conn,
                pid,
                started_us,
                _open: self.pool.count_open(),
            })
        };
        open_within(limit, self.config.redacted(), opening).await
    }

    /// Creates the schema and the fence table if they are missing (only then: `CREATE SCHEMA`
    /// checks its privilege even when the schema exists; never with `create_table=false`), then
    /// refuses a table that records a lock-id scheme other than this build's. Concurrent
    /// creators race harmlessly: a duplicate error means another one won.
    async fn ensure_fence_table(&self, conn: &mut PgConnection) -> fencelock_core::Result<()> {
        let fence_table = self.config.fence_table();
        let mut state = self.fence_table_state(conn).await?;
        if !state.table_exists && !self.config.create_table() {
            let schema = if state.schema_exists {
                String::new()
            } else {
                format!(" (nor its schema \"{}\")", self.config.schema)
            };
            return Err(Error::Store {
                message: format!(
                    "the fence table {fence_table} does not exist{schema}, and create_table=false \
                     forbids creating it: have an administrator run the statement of \
                     PostgresConfig::fence_table_ddl() once (docs/security.md, \"Minimal rights\" \
                     shows it with its grants)"
                ),
                source: None,
            });
        }
        if !state.table_exists {
            let statements = if state.schema_exists {
                vec![&self.sql.create_fence_table]
            } else {
                vec![&self.sql.create_schema, &self.sql.create_fence_table]
            };
            for statement in statements {
                match sqlx::query(statement).execute(&mut *conn).await {
                    Ok(_) => {}
                    Err(e) if is_duplicate_object(&e) => {}
                    Err(e) => return Err(sql_error(CREATING_THE_FENCE_TABLE, e)),
                }
            }
            state = self.fence_table_state(conn).await?;
            if !state.table_exists {
                return Err(Error::Store {
                    message: format!(
                        "the fence table {fence_table} is still missing after creating it"
                    ),
                    source: None,
                });
            }
            tracing::info!(table = %fence_table, "created the fence table");
        }
        check_recorded_scheme(&fence_table, &state.schemes)?;
        check_recorded_fence_scheme(&fence_table, &state.fence_schemes)?;
        check_privileges(&fence_table, &state)?;
        self.permit_limit_column
            .store(state.permit_limit_column, Ordering::Relaxed);
        if !state.permit_limit_column {
            tracing::info!(table = %fence_table, "the fence table has no permit_limit column: semaphore permits are refused until PostgresConfig::permits_upgrade_sql() ran");
        }
        let mut labels = state.label_column;
        if !labels && self.config.create_table() {
            // A table made before labels: the column is nullable, so adding it rewrites nothing.
            match sqlx::query(&self.sql.add_label).execute(&mut *conn).await {
                Ok(_) => {
                    labels = true;
                    tracing::info!(table = %fence_table, "added the label column to the fence table");
                }
                Err(error) => {
                    tracing::info!(table = %fence_table, %error, "cannot add the label column to the fence table: labels stay on the lease until PostgresConfig::label_column_ddl() ran")
                }
            }
        }
        self.label_column.store(labels, Ordering::Relaxed);
        Ok(())
    }

    async fn fence_table_state(
        &self,
        conn: &mut PgConnection,
    ) -> fencelock_core::Result<FenceTableState> {
        let failed = |e| sql_error("looking for the fence table", e);
        let row = sqlx::query(FENCE_TABLE_STATE)
            .bind(format!("\"{}\"", self.config.schema))
            .bind(self.config.fence_table())
            .fetch_one(conn)
            .await
            .map_err(failed)?;
        Ok(FenceTableState {
            schema_exists: row.try_get(0).map_err(failed)?,
            table_exists: row.try_get(1).map_err(failed)?,
            schemes: row.try_get(2).map_err(failed)?,
            fence_schemes: row.try_get(3).map_err(failed)?,
            role: row.try_get(4).map_err(failed)?,
            privileges: [
                ("SELECT", row.try_get(5).map_err(failed)?),
                ("INSERT", row.try_get(6).map_err(failed)?),
                ("UPDATE", row.try_get(7).map_err(failed)?),
                ("DELETE", row.try_get(8).map_err(failed)?),
            ],
            permit_limit_column: row.try_get(9).map_err(failed)?,
            label_column: row.try_get(10).map_err(failed)?,
        })
    }

    /// Terminates the backend `pid` if it is still waiting for advisory lock `lock_id`: the
    /// condition names the cancelled waiter, never a later backend that reused the pid for
    /// something else (at worst another waiter for the same key, which then fails retryably).
    pub(crate) async fn terminate_waiter(
        &self,
        pid: i32,
        lock_id: i64,
    ) -> fencelock_core::Result<()> {
        let Checkout { mut session, .. } = self.checkout().await?;
        let result = bounded(
            self.config.command_timeout(),
            sqlx::query(TERMINATE_WAITER)
                .bind(pid)
                .bind(lock_id)
                .execute(&mut session.conn),
        )
        .await;
        match result {
            Ok(_) => {
                self.checkin(session);
                Ok(())
            }
            Err(fault) => Err(fault.into_error("terminating a cancelled waiter's backend")),
        }
    }
}

/// What [`FENCE_TABLE_STATE`] found.
struct FenceTableState {
    schema_exists: bool,
    table_exists: bool,
    /// The lock-id schemes the table records (none for a table made by a scheme-1 store).
    schemes: Vec<String>,
    /// The token schemes it records (none for a table made before fence scheme 2).
    fence_schemes: Vec<String>,
    /// The session's role (`current_user`).
    role: String,
    /// Whether the role holds each privilege the store uses on the table (`None` without it).
    privileges: [(&'static str, Option<bool>); 4],
    /// Whether the table has the `permit_limit` column (tables made before permits have not).
    permit_limit_column: bool,
    label_column: bool,
}

/// Refuses a role that lacks a privilege the store uses on the fence table, naming it and the
/// `GRANT` that fixes it, rather than failing later in an acquire (`UPDATE`), a status
/// (`SELECT`) or the background removal of idle rows (`DELETE`). For SELECT, INSERT and
/// UPDATE a grant on any column counts, so column-level grants are never refused here (a
/// partial one fails later, with the server's text).
fn check_privileges(fence_table: &str, state: &FenceTableState) -> fencelock_core::Result<()> {
    let missing: Vec<&str> = state
        .privileges
        .iter()
        .filter(|(_, held)| *held == Some(false))
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let role = format!("\"{}\"", state.role.replace('"', "\"\""));
    let missing = missing.join(", ");
    Err(Error::Store {
        message: format!(
            "the role {role} lacks {missing} on the fence table {fence_table}; the store needs \
             SELECT, INSERT, UPDATE and DELETE on it (and USAGE on its schema): GRANT {missing} \
             ON {fence_table} TO {role}"
        ),
        source: None,
    })
}

/// Cancels a lock wait whose future was dropped: the dropped connection alone does not stop a
/// backend blocked in `pg_advisory_lock` until it next polls its socket, so a task terminates
/// the backend from another session at once.
pub(crate) struct WaitGuard {
    target: Option<(Arc<Sessions>, i32, i64)>,
}

impl WaitGuard {
    pub(crate) fn arm(sessions: &Arc<Sessions>, session: &Session, lock_id: i64) -> Self {
        WaitGuard {
            target: Some((sessions.clone(), session.pid, lock_id)),
        }
    }

    pub(crate) fn disarm(mut self) {
        self.target = None;
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let Some((sessions, pid, lock_id)) = self.target.take() else {
            return;
        };
        // Without a runtime the backend still notices within DISCONNECT_CHECK_MS.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                match sessions.terminate_waiter(pid, lock_id).await {
                    Ok(()) => tracing::debug!(pid, "terminated a cancelled waiter's backend"),
                    Err(error) => tracing::debug!(pid, %error, "could not terminate a cancelled waiter's backend; it stops within its disconnect check"),
                }
            });
        }
    }
}
