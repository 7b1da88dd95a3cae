//! Server sessions: one dedicated connection per held lease, idle ones kept for reuse, and
//! the guard that ends a cancelled waiter's session.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::raw::cleanup::CleanupSchedule;
use fencelock_core::raw::session_pool::{open_within, OpenCount, SessionPool};
use fencelock_core::{Error, Instant};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{Connection, Row};
use tokio::sync::OnceCell;

use crate::config::MysqlConfig;
use crate::error::{bounded, connect_error, number, sql_error};
use crate::keys::check_recorded_scheme;
use crate::sql::{
    Statements, AUTOCOMMIT_ON, FENCE_TABLE_STATE, KILL_SESSION, SESSION_INFO, SESSION_PRESENT,
};

/// One server session: a connection and who it is on the server.
pub(crate) struct Session {
    pub(crate) conn: MySqlConnection,
    /// `CONNECTION_ID()`.
    pub(crate) id: i64,
    /// The client address the server shows for it (`host:port`), which tells it from a later
    /// session that got the same id after a restart.
    pub(crate) host: String,
    /// MariaDB takes fractional `GET_LOCK` timeouts; MySQL counts whole seconds.
    pub(crate) fractional_wait: bool,
    /// The `wait_timeout` this store last set on the session, in seconds (`None`: the server's
    /// default, as opened).
    pub(crate) wait_timeout: Option<u64>,
    /// When the session last finished a statement, for an idle one.
    idle_since: Instant,
    _open: OpenCount,
}

impl Session {
    /// Whether the server may have ended this idle session by its `wait_timeout` (or is about
    /// to): a session is dropped from the idle list after half its timeout, rather than found
    /// dead by the next acquire.
    fn may_have_timed_out(&self) -> bool {
        self.wait_timeout
            .is_some_and(|secs| self.idle_since.elapsed() >= Duration::from_secs(secs) / 2)
    }
}

/// A session taken for one operation, and whether it came from the idle list.
pub(crate) type Checkout = fencelock_core::raw::session_pool::Checkout<Session>;

/// The connections of one store handle and everything needed to open more.
pub(crate) struct Sessions {
    pub(crate) config: MysqlConfig,
    options: MySqlConnectOptions,
    pool: SessionPool<Session>,
    fence_table_ready: OnceCell<()>,
    warned_not_durable: AtomicBool,
    /// Whether the fence table has the `label` column: false only for a table made before
    /// labels that this store may not alter (`create_table=false`).
    pub(crate) labels: AtomicBool,
    pub(crate) sql: Statements,
    /// When idle fence rows were last removed (see `cleanup.rs`).
    pub(crate) cleanup: CleanupSchedule,
}

impl Sessions {
    pub(crate) fn new(config: MysqlConfig) -> Self {
        let options = config.connect.clone();
        let sql = Statements::new(&config.fence_table(), &config.floor_table());
        Sessions {
            config,
            options,
            pool: SessionPool::default(),
            fence_table_ready: OnceCell::new(),
            warned_not_durable: AtomicBool::new(false),
            labels: AtomicBool::new(true),
            sql,
            cleanup: CleanupSchedule::default(),
        }
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
        if let Some(session) = self.pool.take_idle(|session| !session.may_have_timed_out()) {
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
        match self
            .pool
            .take_spare(|session| !session.may_have_timed_out())
        {
            Some(session) => Ok(session),
            None => self.open().await,
        }
    }

    /// Gives back a session that holds no lock.
    pub(crate) fn checkin(&self, mut session: Session) {
        session.idle_since = Instant::now();
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
            let mut conn = MySqlConnection::connect_with(&self.options)
                .await
                .map_err(|e| connect_error(self.config.redacted(), e))?;
            let failed = |e| sql_error("reading the session's identity", e);
            let row = sqlx::query(SESSION_INFO)
                .fetch_one(&mut conn)
                .await
                .map_err(failed)?;
            let id: i64 = row.try_get("id").map_err(failed)?;
            let host: Option<String> = row.try_get("host").map_err(failed)?;
            let version: String = row.try_get("version").map_err(failed)?;
            let autocommit: i64 = row.try_get("autocommit").map_err(failed)?;
            let Some(host) = host else {
                return Err(Error::Store {
                    message: "the server's process list does not show this session: the store \
                              needs to see its own sessions in information_schema.PROCESSLIST"
                        .into(),
                    source: None,
                });
            };
            if autocommit != 1 {
                // The fence bump must commit by itself, before the reply.
                sqlx::query(AUTOCOMMIT_ON)
                    .execute(&mut conn)
                    .await
                    .map_err(|e| sql_error("turning autocommit on", e))?;
            }
            self.fence_table_ready
                .get_or_try_init(|| self.ensure_fence_table(&mut conn))
                .await?;
            Ok(Session {
                conn,
                id,
                host,
                fractional_wait: version.contains("MariaDB"),
                wait_timeout: None,
                idle_since: Instant::now(),
                _open: self.pool.count_open(),
            })
        };
        open_within(limit, self.config.redacted(), opening).await
    }

    /// Creates the fence table and its floor table if they are missing (only then: `CREATE
    /// TABLE` checks its privilege even when the table exists; never with
    /// `create_table=false`), then refuses a table that is
    /// not InnoDB, or that records a lock-id scheme or a fence scheme other than this build's
    /// (fence scheme 1 or 2: an earlier build's), and makes sure the floor row exists. Concurrent creators race
    /// harmlessly (`IF NOT EXISTS`, `INSERT IGNORE`).
    async fn ensure_fence_table(&self, conn: &mut MySqlConnection) -> fencelock_core::Result<()> {
        let fence_table = self.config.fence_table();
        let mut state = self.fence_table_state(conn).await?;
        if state.engine.is_none() && !self.config.create_table() {
            return Err(not_created(&fence_table, "fence_table_ddl"));
        }
        if state.engine.is_none() {
            sqlx::query(&self.sql.create_fence_table)
                .execute(&mut *conn)
                .await
                .map_err(|e| sql_error("creating the fence table", e))?;
            state = self.fence_table_state(conn).await?;
            tracing::info!(table = %fence_table, "created the fence table");
        }
        let Some(engine) = state.engine else {
            return Err(Error::Store {
                message: format!(
                    "the fence table {fence_table} is still missing after creating it"
                ),
                source: None,
            });
        };
        if !engine.eq_ignore_ascii_case("InnoDB") {
            return Err(Error::Store {
                message: format!(
                    "the fence table {fence_table} uses the {engine} engine; its counters must \
                     be InnoDB rows, committed durably"
                ),
                source: None,
            });
        }
        check_recorded_scheme(
            &fence_table,
            state.comment.as_deref().unwrap_or_default(),
            state.fence_scheme_column != 0,
        )?;
        if state.label_column == 0 && self.config.create_table() {
            match sqlx::query(&self.sql.add_label_column)
                .execute(&mut *conn)
                .await
            {
                Ok(_) => tracing::info!(table = %fence_table, "added the label column"),
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42S21") => {}
                Err(e) => return Err(sql_error("adding the label column", e)),
            }
        } else if state.label_column == 0 {
            self.labels.store(false, Ordering::Relaxed);
        }
        if state.floor_table == 0 && !self.config.create_table() {
            return Err(not_created(&self.config.floor_table(), "floor_table_ddl"));
        }
        if state.floor_table == 0 {
            sqlx::query(&self.sql.create_floor_table)
                .execute(&mut *conn)
                .await
                .map_err(|e| sql_error("creating the floor table", e))?;
        }
        sqlx::query(&self.sql.init_floor)
            .execute(&mut *conn)
            .await
            .map_err(|e| sql_error("writing the floor table's row", e))?;
        if state.flush != 1 && !self.warned_not_durable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                innodb_flush_log_at_trx_commit = state.flush,
                "the server does not flush every commit: a crash may lose the last fence \
                 bumps and hand out a fencing token twice; set innodb_flush_log_at_trx_commit=1"
            );
        }
        Ok(())
    }

    async fn fence_table_state(
        &self,
        conn: &mut MySqlConnection,
    ) -> fencelock_core::Result<FenceTableState> {
        let failed = |e| sql_error("looking for the fence table", e);
        let row: MySqlRow = sqlx::query(FENCE_TABLE_STATE)
            .bind(&self.config.database)
            .bind(&self.config.options.table)
            .bind(&self.config.database)
            .bind(format!("{}_floor", self.config.options.table))
            .bind(&self.config.database)
            .bind(&self.config.options.table)
            .bind(&self.config.database)
            .bind(&self.config.options.table)
            .fetch_one(conn)
            .await
            .map_err(failed)?;
        Ok(FenceTableState {
            flush: row.try_get("flush").map_err(failed)?,
            engine: row.try_get("engine").map_err(failed)?,
            comment: row.try_get("comment").map_err(failed)?,
            fence_scheme_column: row.try_get("fence_scheme_column").map_err(failed)?,
            floor_table: row.try_get("floor_table").map_err(failed)?,
            label_column: row.try_get("label_column").map_err(failed)?,
        })
    }

    /// Ends session `id` if it still belongs to client address `host` (see
    /// [`SESSION_PRESENT`]).
    pub(crate) async fn kill_waiter(&self, id: i64, host: &str) -> fencelock_core::Result<()> {
        let Checkout { mut session, .. } = self.checkout().await?;
        let limit = self.config.command_timeout();
        let present = bounded(
            limit,
            sqlx::query(SESSION_PRESENT)
                .bind(id)
                .bind(host)
                .fetch_one(&mut session.conn),
        )
        .await
        .map_err(|fault| fault.into_error("looking up a cancelled waiter's session"))?;
        let present: i64 = present
            .try_get("present")
            .map_err(|e| sql_error("looking up a cancelled waiter's session", e))?;
        if present == 0 {
            self.checkin(session);
            return Ok(());
        }
        let result = bounded(
            limit,
            sqlx::query(KILL_SESSION)
                .bind(id)
                .execute(&mut session.conn),
        )
        .await;
        match result {
            Ok(_) => {
                self.checkin(session);
                Ok(())
            }
            // The session had ended already.
            Err(fault) if fault.number() == Some(number::UNKNOWN_THREAD) => {
                self.checkin(session);
                Ok(())
            }
            Err(fault) => Err(fault.into_error("killing a cancelled waiter's session")),
        }
    }
}

/// The refusal of a missing `table` under `create_table=false`: it names the table and the
/// [`MysqlConfig`](crate::MysqlConfig) method (`ddl`) whose statement creates it.
fn not_created(table: &str, ddl: &str) -> Error {
    Error::Store {
        message: format!(
            "the table {table} does not exist, and create_table=false forbids creating it: have \
             an administrator run the statements of MysqlConfig::fence_table_ddl() and \
             MysqlConfig::floor_table_ddl() once (MysqlConfig::{ddl}() makes this one)"
        ),
        source: None,
    }
}

/// What [`FENCE_TABLE_STATE`] found.
struct FenceTableState {
    /// `innodb_flush_log_at_trx_commit`: 1 makes every commit durable.
    flush: i64,
    /// The table's engine, `None` if the table does not exist.
    engine: Option<String>,
    /// The table's comment, which records the lock-id scheme.
    comment: Option<String>,
    /// 1 if the table has the `fence_scheme` column (fence scheme 2 or later).
    fence_scheme_column: i64,
    /// 1 if the floor table exists.
    floor_table: i64,
    /// 1 if the fence table has the `label` column.
    label_column: i64,
}

/// Ends a lock wait whose future was dropped: the server does not notice a closed connection
/// while its session waits in `GET_LOCK`, and would take the lock for nobody once it is free,
/// so a task ends the session from another connection at once.
pub(crate) struct WaitGuard {
    target: Option<(Arc<Sessions>, i64, String)>,
}

impl WaitGuard {
    pub(crate) fn arm(sessions: &Arc<Sessions>, session: &Session) -> Self {
        WaitGuard {
            target: Some((sessions.clone(), session.id, session.host.clone())),
        }
    }

    pub(crate) fn disarm(mut self) {
        self.target = None;
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let Some((sessions, id, host)) = self.target.take() else {
            return;
        };
        // Without a runtime the session ends only when the server next writes to the closed
        // connection: at the latest when its wait is over.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                match sessions.kill_waiter(id, &host).await {
                    Ok(()) => tracing::debug!(id, "killed a cancelled waiter's session"),
                    Err(error) => tracing::warn!(id, %error, "could not kill a cancelled waiter's session; it ends when the server next writes to its closed connection"),
                }
            });
        }
    }
}
