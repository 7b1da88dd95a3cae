//! [`SqliteStore`]: the acquire/extend/release flows on the handle's connections, and the trait
//! impls.

use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw::cleanup::{interval, CleanupSchedule, BATCH_ROWS, MAX_BATCHES};
use fencelock_core::raw::ttl::whole_millis;
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, Error, Instant, KeyStatus, Lease, ListCursor, Listing, OwnerId, PerKeyState,
    ReleaseOutcome, Result,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection};
use tokio::sync::{watch, Mutex, MutexGuard};
use tokio::time::{sleep_until, timeout};

use crate::clock::{boot_id, monotonic_ns, unix_micros};
use crate::config::{SqliteConfig, MIN_TTL};
use crate::error::{open_error, sql_error};
use crate::keys::{stored_key, stored_owner, token_from_row, token_to_row};
use crate::local::LocalWakes;
use crate::sql::{recorded_fence_scheme, Statements, FENCE_SCHEME, JOURNAL_MODE, MAIN_FILE};
use crate::watch::{Waker, Watch, FALLBACK, POLL_WITHOUT_WATCH};

/// Connections in a handle's pool, besides its writing connection. SQLite lets one connection
/// write at a time whatever the count; more connections only let reads (waiters, `status`)
/// run beside a write.
const MAX_CONNECTIONS: u32 = 4;
/// How much longer than the command timeout an operation may take before it is abandoned: the
/// command timeout bounds the wait for SQLite's lock, this bounds everything else (a disk that
/// stops answering an `fsync`).
const BEYOND_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// A lock store in a SQLite database file, shared by every process of the host that opens the
/// same file. See the [crate docs](crate) for what it guarantees.
///
/// Cheap to clone: clones share the connections and the watch.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<HandleState>,
}

/// What every clone of one handle shares.
struct HandleState {
    config: SqliteConfig,
    /// The database file, absolute, so the watch and the messages name the same file whatever
    /// the working directory becomes.
    path: PathBuf,
    pool: SqlitePool,
    /// The connection the hot writes (acquire, release, extend) run on, taken out of the pool
    /// at the first of them (so set up as every connection is) and kept: a statement on a pool
    /// connection pays a second round trip to the connection's thread when it goes back (sqlx
    /// pings it), and SQLite lets one connection write at a time anyway. `None` until then,
    /// and again after its thread died.
    writer: Mutex<Option<SqliteConnection>>,
    /// The WAL file SQLite writes, learnt from SQLite at the first connection: the file a grant
    /// ahead of the clock syncs. A symlinked database's WAL is beside the link's target.
    wal: Arc<OnceLock<PathBuf>>,
    sql: Statements,
    boot_id: &'static str,
    pid: i64,
    waker: Waker,
    /// This process's waiters on the file, of every handle: a release wakes them directly.
    local: Arc<LocalWakes>,
    /// `None` where inotify cannot watch the directory: waiters then poll.
    watch: Option<Watch>,
    /// When this handle last removed idle rows.
    cleanup: CleanupSchedule,
    /// Whatever must live as long as the handle (the lock-out of [`SqliteStore::unreachable`]).
    _keep: Option<Box<dyn Any + Send + Sync>>,
}

/// The WAL file of the database SQLite opened as `file`: SQLite names it after the database,
/// `-wal` added.
fn wal_path(file: &str) -> PathBuf {
    PathBuf::from(format!("{file}-wal"))
}

/// The database file of `config`, made absolute (so the watch and the messages name the same
/// file whatever the working directory becomes), its missing parent directories created.
fn database_path(config: &SqliteConfig) -> Result<PathBuf> {
    let path = std::path::absolute(&config.path).map_err(|e| {
        Error::invalid(
            "url",
            format!("cannot resolve the path {}: {e}", config.path.display()),
        )
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::invalid(
                "url",
                format!(
                    "cannot create the directory {} for the SQLite database: {e}",
                    dir.display()
                ),
            )
        })?;
    }
    Ok(path)
}

/// The wake file beside the database at `path`, created with the handle: a directory it
/// cannot write to fails [`SqliteStore::connect_lazy`] at once, as its docs say.
fn open_waker(path: &Path) -> Result<Waker> {
    Waker::open(path).map_err(|e| {
        Error::invalid(
            "url",
            format!(
                "cannot create files beside the SQLite database {} (its directory must be \
                 writable): {e}",
                path.display()
            ),
        )
    })
}

/// The inotify watch of the database's directory, or `None` (with a warning) where it cannot
/// be had: waiters then poll.
fn open_watch(path: &Path) -> Option<Watch> {
    match Watch::new(path) {
        Ok(watch) => Some(watch),
        Err(error) => {
            tracing::warn!(%error, path = %path.display(), "cannot watch the database's directory with inotify; waiters poll every {POLL_WITHOUT_WATCH:?}");
            None
        }
    }
}

/// How each connection opens the database at `path`: created if missing, in WAL mode, synced
/// as `config` asks, and waiting for SQLite's lock up to the command timeout.
fn connect_options(config: &SqliteConfig, path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        // WAL: readers (waiters, status) never wait for the writer, and a commit is one
        // append to the WAL.
        .journal_mode(SqliteJournalMode::Wal)
        // NORMAL in WAL mode: the WAL is fsynced at checkpoints, not at every commit, so a
        // power loss may lose the last commits. A lost grant whose token is its clock reading
        // is harmless (the next one reads a later clock); one ahead of the clock is synced
        // before it is handed out (`attempt`). FULL syncs every commit: `durable_grants`.
        .synchronous(if config.durable_grants {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        })
        .busy_timeout(config.command_timeout)
}

/// The handle's pool, opening connections only when first needed, each set up by `setup`
/// before its first use.
fn pool(
    config: &SqliteConfig,
    options: SqliteConnectOptions,
    setup: ConnectionSetup,
) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .min_connections(0)
        .acquire_timeout(config.connect_timeout.max(config.command_timeout))
        // A SQLite connection cannot break behind our back; a ping would cost a round trip
        // to its worker thread for nothing.
        .test_before_acquire(false)
        .after_connect(move |conn, _| Box::pin(setup.clone().apply(conn)))
        .connect_lazy_with(options)
}

/// What every new connection of a handle runs before its first use: it makes the tables if
/// missing (adding the label column to an older lock table), checks WAL mode, and learns the
/// WAL's path at the handle's first connection.
#[derive(Clone)]
struct ConnectionSetup {
    /// The lock table's, the floor table's and the floor row's creation.
    prepare: [String; 3],
    has_label: &'static str,
    add_label: String,
    table: String,
    learnt_wal: Arc<OnceLock<PathBuf>>,
}

impl ConnectionSetup {
    /// Sets up `conn`; an error fails the connection's opening.
    async fn apply(self, conn: &mut SqliteConnection) -> std::result::Result<(), sqlx::Error> {
        for statement in &self.prepare {
            sqlx::query(statement).execute(&mut *conn).await?;
        }
        let labelled: i64 = sqlx::query_scalar(self.has_label)
            .bind(&self.table)
            .fetch_one(&mut *conn)
            .await?;
        if labelled == 0 {
            match sqlx::query(&self.add_label).execute(&mut *conn).await {
                Ok(_) => {}
                // Another connection added it first.
                Err(sqlx::Error::Database(e)) if e.message().contains("duplicate column name") => {}
                Err(error) => return Err(error),
            }
        }
        let mode: String = sqlx::query_scalar(JOURNAL_MODE)
            .fetch_one(&mut *conn)
            .await?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(sqlx::Error::Configuration(
                format!(
                    "the database stays in journal mode {mode:?}; this store needs \
                     WAL (is the file system one that cannot share memory maps?)"
                )
                .into(),
            ));
        }
        if self.learnt_wal.get().is_none() {
            let file: String = sqlx::query_scalar(MAIN_FILE).fetch_one(&mut *conn).await?;
            let _ = self.learnt_wal.set(wal_path(&file));
        }
        #[cfg(feature = "crash-hooks")]
        crate::crash_hooks::install(conn).await?;
        Ok(())
    }
}

/// `fdatasync`s the WAL file, which makes every commit in it durable: on Linux a sync through
/// any descriptor of a file writes all of the file's dirty pages. SQLite syncs the WAL's header
/// itself when it starts a WAL (it creates or restarts one only after a checkpoint, which syncs
/// the frames it moves), so the frames are what is missing at `NORMAL`. SQLite removes the WAL
/// only when its last connection closes, and the writer that just committed is open: a WAL
/// that is not there is not the file SQLite writes, and an error.
async fn sync_wal(wal: PathBuf) -> std::result::Result<(), sqlx::Error> {
    let synced = tokio::task::spawn_blocking(move || {
        std::fs::File::open(&wal)
            .and_then(|file| file.sync_data())
            .map_err(|error| {
                std::io::Error::new(
                    error.kind(),
                    format!("cannot sync the WAL {}: {error}", wal.display()),
                )
            })
    })
    .await
    .map_err(std::io::Error::other)?;
    synced.map_err(sqlx::Error::Io)
}

/// The handle's writing connection, locked for one statement. A statement dropped in flight
/// leaves the connection usable: its thread runs the statement to its end (or resets it), and
/// the next statement queues behind it.
struct Writer<'a>(MutexGuard<'a, Option<SqliteConnection>>);

impl Writer<'_> {
    fn connection(&mut self) -> std::result::Result<&mut SqliteConnection, sqlx::Error> {
        self.0.as_mut().ok_or(sqlx::Error::WorkerCrashed)
    }

    /// `result`, forgetting the connection if its thread died (the next write opens another).
    fn keep_unless_dead<T>(
        &mut self,
        result: std::result::Result<T, sqlx::Error>,
    ) -> std::result::Result<T, sqlx::Error> {
        if matches!(result, Err(sqlx::Error::WorkerCrashed)) {
            *self.0 = None;
        }
        result
    }
}

/// What one acquire attempt found.
enum Attempt {
    Granted(Lease),
    Held,
}

/// The live holder of a key, as read.
struct Holder {
    owner: Option<OwnerId>,
    token: u64,
    remaining: Duration,
    label: Option<String>,
}

/// A label as the lock table keeps it: behind its owner's id, so that a row taken over by a
/// build that does not know labels (and leaves the column as it was) shows none.
fn stored_label(owner: OwnerId, label: Option<&str>) -> Option<String> {
    label.map(|label| format!("{}:{label}", stored_owner(owner)))
}

/// The label of `owner` in a stored label, if it is that owner's.
fn label_of(owner: &str, stored: Option<String>) -> Option<String> {
    let stored = stored?;
    let label = stored.strip_prefix(owner)?.strip_prefix(':')?;
    Some(label.to_owned())
}

impl SqliteStore {
    /// Opens the database (creating the file and its missing parent directories), switches it
    /// to WAL mode, creates the lock and floor tables if they are missing, checks that the lock
    /// table records fence scheme 3, and starts nothing else: the watch
    /// starts with the first wait.
    ///
    /// Fails with [`Error::InvalidInput`] if the file cannot be created or opened (an
    /// unwritable directory, a path through a file), with [`Error::Store`] if it is not a
    /// SQLite database, cannot be put in WAL mode or holds a lock table of an earlier build
    /// (see [`SqliteConfig::fence_scheme_upgrade_sql`]), and with a retryable
    /// [`Error::Unavailable`] if another connection keeps it locked beyond the timeouts.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) when the file, its directories or
    /// the files beside it cannot be created or opened;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the database stays locked or
    /// does not answer in time; [`Store`](fencelock_core::ErrorKind::Store) for a file that is not
    /// a SQLite database or cannot be put in WAL mode, a lock table of an earlier build, or no boot
    /// id in `/proc`.
    ///
    /// # Cancel safety
    /// Dropping the future closes whatever it opened. The file, the directories and the table
    /// may have been created.
    pub async fn connect(config: SqliteConfig) -> Result<Self> {
        let store = Self::connect_lazy(config)?;
        let limit = store.shared.config.connect_timeout + BEYOND_COMMAND_TIMEOUT;
        let shared = &store.shared;
        match timeout(limit, shared.pool.acquire()).await {
            Ok(Ok(connection)) => drop(connection),
            Ok(Err(error)) => {
                return Err(open_error(
                    &shared.path,
                    shared.config.connect_timeout,
                    error,
                ))
            }
            Err(_) => {
                return Err(Error::Unavailable {
                    message: format!(
                        "opening the database {}: no answer within {limit:?}",
                        shared.path.display()
                    ),
                    source: None,
                })
            }
        }
        store.check_fence_scheme().await?;
        tracing::debug!(path = %shared.path.display(), notified = shared.watch.is_some(), "connected");
        Ok(store)
    }

    /// A handle that opens the database at its first operation, which then fails as
    /// [`SqliteStore::connect`] would. Creates the missing parent directories and the wake file
    /// beside the database now (see the crate docs, "Waiting"), so a path that cannot be
    /// created fails here with [`Error::InvalidInput`].
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) when the path cannot be resolved
    /// or its directories or the wake file cannot be created;
    /// [`Store`](fencelock_core::ErrorKind::Store) when this boot's id cannot be read from `/proc`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn connect_lazy(config: SqliteConfig) -> Result<Self> {
        Self::build(config, None)
    }

    /// A handle on a fresh database that another holder keeps locked for as long as the handle
    /// lives, as a program stuck in a long exclusive transaction would: every operation fails
    /// with a retryable [`Error::Unavailable`] within the command timeout (plus the connect
    /// timeout for the first). The database is a new file in the system's temporary directory,
    /// removed with the handle; `config` gives the table and the timeouts, its path is not
    /// used. For fault tests (the conformance suite's unreachable handle); a lock holder never
    /// needs it.
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the locked-out database cannot
    /// be made in the temporary directory; otherwise as [`SqliteStore::connect_lazy`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn unreachable(config: &SqliteConfig) -> Result<Self> {
        let lockout = crate::lockout::Lockout::fresh()?;
        let config = SqliteConfig {
            path: lockout.path().to_owned(),
            ..config.clone()
        };
        Self::build(config, Some(Box::new(lockout)))
    }

    fn build(config: SqliteConfig, keep: Option<Box<dyn Any + Send + Sync>>) -> Result<Self> {
        let boot_id = boot_id()?;
        let path = database_path(&config)?;
        let waker = open_waker(&path)?;
        let watch = open_watch(&path);
        let sql = Statements::new(&config.table);
        let options = connect_options(&config, &path);
        let wal = Arc::new(OnceLock::new());
        let setup = ConnectionSetup {
            prepare: [
                sql.create_table.clone(),
                sql.create_floor.clone(),
                sql.init_floor.clone(),
            ],
            has_label: sql.has_label,
            add_label: sql.add_label.clone(),
            table: config.table.clone(),
            learnt_wal: Arc::clone(&wal),
        };
        let pool = pool(&config, options, setup);
        let local = LocalWakes::for_database(&path);
        Ok(SqliteStore {
            shared: Arc::new(HandleState {
                config,
                path,
                pool,
                writer: Mutex::new(None),
                wal,
                sql,
                boot_id,
                pid: i64::from(std::process::id()),
                waker,
                local,
                watch,
                cleanup: CleanupSchedule::default(),
                _keep: keep,
            }),
        })
    }

    /// The configuration this handle was built from.
    pub fn config(&self) -> &SqliteConfig {
        &self.shared.config
    }

    /// The database file, as an absolute path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Refuses a lock table of an earlier fence scheme: scheme 1 (no `fence_scheme`, new rows
    /// restart at 1) or scheme 2 (plain counters, far below the clock-floored tokens of scheme
    /// 3). A lazy handle finds out at its first acquire, which fails on the table's CHECK.
    async fn check_fence_scheme(&self) -> Result<()> {
        let shared = &self.shared;
        let create_sql: Option<String> = self
            .bounded(
                "reading the lock table's definition",
                sqlx::query_scalar(shared.sql.table_sql)
                    .bind(&shared.config.table)
                    .fetch_optional(&shared.pool),
            )
            .await?;
        let scheme = recorded_fence_scheme(create_sql.as_deref().unwrap_or_default());
        if scheme == FENCE_SCHEME {
            return Ok(());
        }
        let (records, tokens) = if scheme == 1 {
            ("no fence scheme", "whose new rows restart at 1")
        } else {
            (
                "fence scheme 2",
                "whose tokens are plain counters, far below the clock (a resource fenced under \
                 another store would refuse them)",
            )
        };
        Err(Error::Store {
            message: format!(
                "the lock table {:?} in {} records {records}: an earlier build made it, {tokens}. \
                 Stop every process of that build and run SqliteConfig::fence_scheme_upgrade_sql() \
                 once (counters are kept; tokens jump once, upward, to the clock)",
                shared.config.table,
                shared.path.display()
            ),
            source: None,
        })
    }

    /// How many rows the lock table holds: the keys held or locked within the retention window
    /// (see the crate docs, "Per-key state").
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the database stays locked by
    /// another connection or does not answer within the command timeout;
    /// [`Store`](fencelock_core::ErrorKind::Store) for any other SQLite error (the file cannot be
    /// opened or read, say).
    ///
    /// # Cancel safety
    /// A single read; dropping the future loses nothing.
    pub async fn stored_rows(&self) -> Result<u64> {
        let shared = &self.shared;
        let rows: i64 = self
            .bounded(
                "counting rows",
                sqlx::query_scalar(&shared.sql.count_rows).fetch_one(&shared.pool),
            )
            .await?;
        Ok(u64::try_from(rows).unwrap_or(0))
    }

    /// Removes rows idle for longer than the retention window now (the handle also does so in
    /// the background, at most once per tenth of the window, after a release), in transactions
    /// of at most 1,000 rows, at most 10 of them; returns how many rows went. Each raises the
    /// floor to the highest token it removed, in the same transaction, so those keys' next
    /// tokens are still greater.
    ///
    /// # Errors
    /// As [`SqliteStore::stored_rows`] (the file cannot be written, say). Transactions
    /// committed before the error stay removed.
    ///
    /// # Cancel safety
    /// Each transaction commits on its own; one dropped in flight rolls back whole.
    pub async fn remove_idle_rows(&self) -> Result<u64> {
        let mut removed = 0u64;
        for _ in 0..MAX_BATCHES {
            let batch = self
                .bounded("removing idle rows", self.remove_batch())
                .await?;
            removed += batch;
            if batch < u64::from(BATCH_ROWS) {
                break;
            }
        }
        Ok(removed)
    }

    /// One transaction of [`SqliteStore::remove_idle_rows`].
    async fn remove_batch(&self) -> std::result::Result<u64, sqlx::Error> {
        let shared = &self.shared;
        let retention_ns = i64::try_from(shared.config.retention.as_nanos()).unwrap_or(i64::MAX);
        let idle_before = monotonic_ns().saturating_sub(retention_ns);
        let mut tx = shared.pool.begin().await?;
        let tokens: Vec<i64> = sqlx::query_scalar(&shared.sql.remove_idle)
            .bind(shared.boot_id)
            .bind(idle_before)
            // A transaction holds SQLite's write lock throughout, so an acquire waits for one
            // batch at most.
            .bind(i64::from(BATCH_ROWS))
            .fetch_all(&mut *tx)
            .await?;
        if let Some(highest) = tokens.iter().max() {
            sqlx::query(&shared.sql.raise_floor)
                .bind(highest)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(tokens.len() as u64)
    }

    /// Starts a background [`SqliteStore::remove_idle_rows`] if one is due. Never waits.
    fn spawn_cleanup_if_due(&self) {
        let shared = &self.shared;
        if !shared.cleanup.claim(interval(shared.config.retention)) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            shared.cleanup.done();
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            match store.remove_idle_rows().await {
                Ok(0) => {}
                Ok(removed) => tracing::debug!(removed, "removed idle rows"),
                Err(error) => tracing::debug!(%error, "could not remove idle rows; next time"),
            }
            store.shared.cleanup.done();
        });
    }

    /// Runs one statement within the command timeout (plus a margin for everything that is not
    /// waiting for SQLite's lock), with errors as the contract's.
    async fn bounded<T>(
        &self,
        what: &str,
        statement: impl std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        let config = &self.shared.config;
        let limit = config.command_timeout.max(config.connect_timeout) + BEYOND_COMMAND_TIMEOUT;
        match timeout(limit, statement).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.error(what, error)),
            Err(_) => Err(Error::Unavailable {
                message: format!(
                    "{what} on {}: no answer within {limit:?}",
                    self.shared.path.display()
                ),
                source: None,
            }),
        }
    }

    /// The handle's writing connection, opened from the pool at the first write. Writes of the
    /// handle queue here, in order, rather than in SQLite's busy handler.
    async fn writer(&self) -> std::result::Result<Writer<'_>, sqlx::Error> {
        let mut slot = self.shared.writer.lock().await;
        if slot.is_none() {
            *slot = Some(self.shared.pool.acquire().await?.detach());
        }
        Ok(Writer(slot))
    }

    fn error(&self, what: &str, error: sqlx::Error) -> Error {
        let config = &self.shared.config;
        sql_error(what, &self.shared.path, config.command_timeout, error)
    }

    /// One attempt to take `key`: the acquire statement, with the clock read before it.
    async fn attempt(&self, key: &str, ttl: Duration, label: Option<&str>) -> Result<Attempt> {
        let shared = &self.shared;
        let owner = OwnerId::random();
        let ttl_ns = i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX);
        let ttl_ms = i64::try_from(whole_millis(ttl)).unwrap_or(i64::MAX);
        // The deadline's clock first, then the store's: the store's expiry (now + ttl) is never
        // earlier than the lease's local deadline (sent_at + ttl - drift).
        let sent_at = Instant::now();
        let now = monotonic_ns();
        // The token's clock floor, read after the expiry's base: a row's expiry never counts
        // from a moment later than its token's clock reading.
        let clock_us = unix_micros();
        let token: Option<i64> = self
            .bounded("acquire", async {
                let mut writer = self.writer().await?;
                let token = sqlx::query_scalar(&shared.sql.acquire)
                    .bind(stored_key(key))
                    .bind(stored_owner(owner))
                    .bind(shared.boot_id)
                    .bind(now)
                    .bind(ttl_ns)
                    .bind(ttl_ms)
                    .bind(shared.pid)
                    .bind(clock_us)
                    .bind(stored_label(owner, label))
                    .fetch_optional(writer.connection()?)
                    .await;
                writer.keep_unless_dead(token)
            })
            .await?;
        let Some(token) = token else {
            return Ok(Attempt::Held);
        };
        if token != clock_us && !shared.config.durable_grants {
            // Ahead of the clock (`counter + 1` or the floor won): if a crash of the host lost
            // this commit, the next mint could hand the same token out again, so it reaches the
            // disk before anybody sees it. If this fails, the key stays taken until its TTL, by
            // an owner nobody knows (as after a lost reply).
            // Set when the writer's connection was opened, before it could commit.
            let wal = shared.wal.get().cloned().ok_or_else(|| {
                let unknown = "the WAL's file name was not learnt from SQLite";
                self.error("syncing the WAL", sqlx::Error::Protocol(unknown.into()))
            })?;
            self.bounded("syncing the WAL", sync_wal(wal.clone()))
                .await?;
            #[cfg(feature = "crash-hooks")]
            crate::crash_hooks::wal_synced(&wal);
        }
        #[cfg(feature = "crash-hooks")]
        crate::crash_hooks::after_grant();
        Ok(Attempt::Granted(Lease::new(
            key,
            owner,
            token_from_row(token)?,
            ttl,
            sent_at,
        )))
    }

    /// The live holder of `key`, if any: a read, which never waits for writers.
    async fn holder(&self, key: &str) -> Result<Option<Holder>> {
        let shared = &self.shared;
        let now = monotonic_ns();
        let row = self
            .bounded(
                "reading the holder",
                sqlx::query(&shared.sql.holder)
                    .bind(stored_key(key))
                    .fetch_optional(&shared.pool),
            )
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = |row: &sqlx::sqlite::SqliteRow| -> sqlx::Result<_> {
            Ok((
                row.try_get::<i64, _>("token")?,
                row.try_get::<Option<String>, _>("owner")?,
                row.try_get::<String, _>("boot_id")?,
                row.try_get::<i64, _>("expires_ns")?,
                row.try_get::<Option<String>, _>("label")?,
            ))
        };
        let (token, owner, boot, expires_ns, label) =
            read(&row).map_err(|e| self.error("decoding the lock table", e))?;
        let live = owner.is_some() && boot == shared.boot_id && expires_ns > now;
        if !live {
            return Ok(None);
        }
        let remaining = u64::try_from(expires_ns.saturating_sub(now)).unwrap_or(0);
        Ok(Some(Holder {
            owner: owner.as_deref().and_then(OwnerId::parse),
            token: token_from_row(token)?,
            remaining: Duration::from_nanos(remaining),
            label: owner.as_deref().and_then(|owner| label_of(owner, label)),
        }))
    }

    /// Subscribes to the watch, if it runs.
    fn changes(&self) -> Option<watch::Receiver<u64>> {
        self.shared.watch.as_ref().and_then(Watch::subscribe)
    }

    /// Waits up to `wait` for `key`: [`Error::Busy`] once the wait ran out.
    async fn wait_for(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        label: Option<&str>,
    ) -> Result<Lease> {
        let deadline = Instant::now() + wait;
        // Before the first read, as the watch: a release in this process wakes it directly.
        let mut local = self.shared.local.subscribe(stored_key(key));
        let mut changes = self.changes();
        let fallback = if changes.is_some() {
            FALLBACK
        } else {
            POLL_WITHOUT_WATCH
        };
        // The first turn tries at once; later turns read first, and write only when the key
        // looks free, so parked waiters cost the writer nothing (except after a release of the
        // key in this process, see below).
        let mut looks_free = true;
        loop {
            // Seen before reading: a release committed after this read wakes the wait below.
            if let Some(changes) = changes.as_mut() {
                changes.borrow_and_update();
            }
            local.mark_seen();
            let mut held_for = None;
            if !looks_free {
                held_for = self.holder(key).await?.map(|holder| holder.remaining);
            }
            if held_for.is_none() {
                match self.attempt(key, ttl, label).await? {
                    Attempt::Granted(lease) => return Ok(lease),
                    // Taken by someone else first: learn until when.
                    Attempt::Held => held_for = self.holder(key).await?.map(|h| h.remaining),
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Busy {
                    key: key.to_owned(),
                });
            }
            if held_for.is_none() {
                // Freed between the attempt and the read: try again at once.
                looks_free = true;
                continue;
            }
            // Until the holder's expiry if it is known, the fallback otherwise.
            let wake_at = deadline
                .min(now + fallback)
                .min(now + held_for.unwrap_or(fallback));
            // A release of this very key in this process: it was free a moment ago, so try at
            // once (the waiters woken with this one would all read it free and try anyway).
            // The wake file names no key: read first, so waiters on other keys cost the writer
            // nothing.
            looks_free = match changes.as_mut() {
                Some(receiver) => {
                    tokio::select! {
                        changed = receiver.changed() => {
                            if changed.is_err() {
                                // The watch stopped (its runtime shut down): start it again.
                                changes = self.changes();
                            }
                            false
                        }
                        () = local.changed() => true,
                        () = sleep_until(wake_at) => false,
                    }
                }
                None => {
                    tokio::select! {
                        () = local.changed() => true,
                        () = sleep_until(wake_at) => false,
                    }
                }
            };
        }
    }

    async fn release_lease(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let shared = &self.shared;
        let token = token_to_row(lease.fencing_token())?;
        let now = monotonic_ns();
        let done = self
            .bounded("release", async {
                let mut writer = self.writer().await?;
                let done = sqlx::query(&shared.sql.release)
                    .bind(stored_key(lease.key()))
                    .bind(stored_owner(lease.owner()))
                    .bind(token)
                    .bind(shared.boot_id)
                    .bind(now)
                    .execute(writer.connection()?)
                    .await;
                writer.keep_unless_dead(done)
            })
            .await?;
        if done.rows_affected() == 1 {
            // This process's waiters first: they need no file event.
            shared.local.wake(stored_key(lease.key()));
            shared.waker.wake();
            self.spawn_cleanup_if_due();
            Ok(ReleaseOutcome::Released)
        } else {
            Ok(ReleaseOutcome::Lost)
        }
    }

    async fn relabel_lease(&self, lease: &Lease, label: &str) -> Result<()> {
        let shared = &self.shared;
        let token = token_to_row(lease.fencing_token())?;
        let now = monotonic_ns();
        let done = self
            .bounded("relabel", async {
                let mut writer = self.writer().await?;
                let done = sqlx::query(&shared.sql.relabel)
                    .bind(stored_key(lease.key()))
                    .bind(stored_owner(lease.owner()))
                    .bind(token)
                    .bind(shared.boot_id)
                    .bind(now)
                    .bind(stored_label(lease.owner(), Some(label)))
                    .execute(writer.connection()?)
                    .await;
                writer.keep_unless_dead(done)
            })
            .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::lost(
                lease,
                "expired, evicted, released or held by another owner",
            ))
        }
    }

    async fn extend_lease(&self, lease: &Lease) -> Result<()> {
        let shared = &self.shared;
        let token = token_to_row(lease.fencing_token())?;
        let ttl_ns = i64::try_from(lease.ttl().as_nanos()).unwrap_or(i64::MAX);
        let sent_at = Instant::now();
        let now = monotonic_ns();
        let done = self
            .bounded("extend", async {
                let mut writer = self.writer().await?;
                let done = sqlx::query(&shared.sql.extend)
                    .bind(stored_key(lease.key()))
                    .bind(stored_owner(lease.owner()))
                    .bind(token)
                    .bind(shared.boot_id)
                    .bind(now)
                    .bind(ttl_ns)
                    .execute(writer.connection()?)
                    .await;
                writer.keep_unless_dead(done)
            })
            .await?;
        if done.rows_affected() == 1 {
            lease.confirm(sent_at);
            Ok(())
        } else {
            Err(Error::lost(
                lease,
                "expired, evicted, released or held by another owner",
            ))
        }
    }
}

// ---- the contract ---------------------------------------------------------------------------

#[async_trait]
impl raw::Store for SqliteStore {
    fn name(&self) -> &'static str {
        crate::SQLITE.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_min_ttl(MIN_TTL)
            .with_notified_wait(self.shared.watch.is_some())
            .with_evict(true)
            .with_max_ttl(self.shared.config.max_ttl)
            .with_retention(self.shared.config.retention)
            .with_labels(true)
            .with_listing(true)
    }

    /// One read of the lock table's rows with a holder under the prefix (the primary key's
    /// range), then each one's status.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        let shared = &self.shared;
        let after = raw::stored_after(from)?;
        let rows = self
            .bounded(
                "listing",
                sqlx::query(&shared.sql.list)
                    .bind(stored_key(prefix))
                    .bind(&after)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&shared.pool),
            )
            .await?;
        let stored = rows
            .iter()
            .map(|row| row.try_get::<Vec<u8>, _>("key"))
            .collect::<sqlx::Result<Vec<_>>>()
            .map_err(|e| self.error("decoding the lock table", e))?;
        let (names, next) = raw::read_page(stored, limit);
        raw::held_among(self, names, next).await
    }

    /// One attempt is one statement. A wait waits for the wake file (see the crate docs,
    /// "Waiting"), the holder's expiry, or the fallback, whichever comes first, reading the
    /// key's row each time and trying to take it only when it looks free.
    ///
    /// # Cancel safety
    /// The attempt is one statement, which SQLite runs to its end on the connection's thread
    /// even if the future is dropped: a lease it granted is then never seen, and expires at its
    /// TTL (nobody else can hold the key meanwhile). A waiter holds nothing between its
    /// attempts, so dropping it while it waits leaves nothing behind.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let (key, ttl, label) = (request.key, request.ttl, request.label);
        let Some(wait) = request.wait else {
            return match self.attempt(key, ttl, label).await? {
                Attempt::Granted(lease) => Ok(lease),
                Attempt::Held => Err(Error::Busy {
                    key: key.to_owned(),
                }),
            };
        };
        self.wait_for(key, ttl, wait, label).await
    }

    /// # Cancel safety
    /// The release is one statement that runs to its end once sent: dropping the future leaves
    /// the lease held (if it was not sent) or released (if it was); a later release then
    /// reports [`ReleaseOutcome::Lost`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.release_lease(lease).await
    }

    /// # Cancel safety
    /// Dropping the future leaves the lease as it was or extended in the table; the local
    /// deadline only moves once the answer is read.
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.extend_lease(lease).await
    }

    /// One statement, a compare-and-set on the holder's row.
    ///
    /// # Cancel safety
    /// Once sent, the statement runs to its end: dropping the future leaves the old label or
    /// the new one.
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        self.relabel_lease(lease, label).await
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        Ok(match self.holder(key).await? {
            Some(holder) => KeyStatus::Held {
                owner: holder.owner,
                token: Some(holder.token),
                remaining: Some(holder.remaining),
                label: holder.label,
            },
            None => KeyStatus::Free,
        })
    }

    /// Frees `key` whoever holds it, as deleting the holder would; its counter
    /// stays, so the next lease still gets a greater token. Waiters are woken. Returns whether a
    /// live lease was evicted. The evicted holder learns at its next extend (within a third of
    /// its TTL with a keep-alive) or release. For tooling and fault tests; a lock holder never
    /// needs it.
    ///
    /// # Cancel safety
    /// The eviction may or may not have happened when the future is dropped.
    async fn evict(&self, key: &str) -> Result<bool> {
        let shared = &self.shared;
        let now = monotonic_ns();
        let done = self
            .bounded(
                "evict",
                sqlx::query(&shared.sql.evict)
                    .bind(stored_key(key))
                    .bind(shared.boot_id)
                    .bind(now)
                    .execute(&shared.pool),
            )
            .await?;
        let evicted = done.rows_affected() == 1;
        if evicted {
            shared.local.wake(stored_key(key));
            shared.waker.wake();
        }
        tracing::debug!(key, evicted, "evict");
        Ok(evicted)
    }

    /// The lock table's rows, as [`SqliteStore::stored_rows`] counts them.
    ///
    /// # Errors
    /// As [`SqliteStore::stored_rows`].
    ///
    /// # Cancel safety
    /// A single read; dropping the future loses nothing.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Ok(Some(PerKeyState::new(self.stored_rows().await?, "rows")))
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.shared;
        f.debug_struct("SqliteStore")
            .field("path", &shared.path)
            .field("table", &shared.config.table)
            .field("open_connections", &shared.pool.size())
            .field("idle_connections", &shared.pool.num_idle())
            .field("notified_wait", &shared.watch.is_some())
            .field(
                "watch_running",
                &shared.watch.as_ref().is_some_and(Watch::task_running),
            )
            .finish()
    }
}
