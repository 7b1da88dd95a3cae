//! [`MysqlStore`]: the acquire/extend/release flows on the handle's sessions, and the trait
//! impls.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw::session_pool::{confirmed, Answer, LeaseSession};
use fencelock_core::raw::ttl::{whole_millis, whole_secs};
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, Error, Instant, KeyStatus, Lease, ListCursor, Listing, OwnerId, PerKeyState,
    ReleaseOutcome, Result,
};
use sqlx::mysql::{MySql, MySqlArguments, MySqlRow};
use sqlx::query::Query;
use sqlx::Row;

use crate::config::{MysqlConfig, MIN_TTL};
use crate::error::{bounded, number, sql_error, Fault};
use crate::keys::Target;
use crate::session::{Checkout, Session, Sessions, WaitGuard};
use crate::sql::{CONFIRM_HELD, HOLDER, KILL_HOLDER, RELEASE, SET_WAIT_TIMEOUT, TAKE_LOCK};
use crate::watch::{Backend, Watch};

/// The label of `owner` in a fence row's `label` (`owner:label`), if it is that owner's: a row
/// taken by a build that writes no label keeps the one before, which is not the new holder's.
fn label_of(owner: &str, stored: Option<Vec<u8>>) -> Option<String> {
    let stored = String::from_utf8(stored?).ok()?;
    let label = stored.strip_prefix(owner)?.strip_prefix(':')?;
    Some(label.to_owned())
}

/// What happens when a multiplexing proxy sits between the store and the server.
const POOLING_PROXY: &str =
    "the connection's server session changed between statements: a multiplexing proxy is in \
     the way, and GET_LOCK locks cannot work through it; connect directly, or turn \
     multiplexing off for this client";

/// How long [`LockStore::evict`] waits for the killed holder's lock to be freed.
const EVICT_WAIT: Duration = Duration::from_secs(5);

/// What a lease carries: its dedicated session. Dropping the last clone of the lease without
/// releasing it closes the session, which frees the lock as soon as the server notices.
struct Held {
    lock_name: String,
    session_id: i64,
    session: LeaseSession<Session>,
    sessions: Arc<Sessions>,
    /// The handle's watch, and the lease's entry in it.
    watch: Arc<Watch>,
    watch_id: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.watch.forget(self.watch_id);
    }
}

/// Stops the handle's watch task when the last clone of the handle is dropped.
struct HandleAlive(Arc<Watch>);

impl Drop for HandleAlive {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// A lock store on MySQL or MariaDB named locks (`GET_LOCK`). See the [crate docs](crate) for
/// what it guarantees.
///
/// Cheap to clone: clones share their idle sessions. Every held lease and every waiting
/// acquire has a connection of its own.
#[derive(Clone)]
pub struct MysqlStore {
    sessions: Arc<Sessions>,
    /// The held leases whose sessions the handle's task watches.
    watch: Arc<Watch>,
    _alive: Arc<HandleAlive>,
}

impl MysqlStore {
    /// Connects: opens one session (within the connect timeout), creates the fence table if it
    /// is missing, checks its engine and the lock-id scheme it records, and keeps the session
    /// for reuse.
    ///
    /// Fails with [`Error::Unavailable`] if the server cannot be reached in time, and with
    /// [`Error::Store`] if it refuses (authentication, a missing database, no privilege to
    /// create the fence table) or the fence table is not InnoDB or records a lock-id scheme
    /// other than [`LOCK_ID_SCHEME`](crate::LOCK_ID_SCHEME).
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached in
    /// time; [`Store`](fencelock_core::ErrorKind::Store) when it refuses, or the fence table is
    /// missing and cannot be created, is not InnoDB or records another lock-id scheme.
    ///
    /// # Cancel safety
    /// Dropping the future closes the half-opened connection; nothing is held.
    pub async fn connect(config: MysqlConfig) -> Result<MysqlStore> {
        let store = Self::connect_lazy(config);
        let session = store.sessions.open().await?;
        store.sessions.checkin(session);
        Ok(store)
    }

    /// A store that opens its first session only when first used, so an unreachable server (or
    /// a fence table of another lock-id scheme) is reported by that first operation.
    pub fn connect_lazy(config: MysqlConfig) -> MysqlStore {
        let sessions = Arc::new(Sessions::new(config));
        let watch = Arc::new(Watch::new());
        MysqlStore {
            _alive: Arc::new(HandleAlive(watch.clone())),
            sessions,
            watch,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MysqlConfig {
        &self.sessions.config
    }

    /// The `GET_LOCK` name `key` maps to in this store's fence table and namespace (see
    /// [`crate::lock_name`]).
    pub fn lock_name(&self, key: &str) -> String {
        Target::hashed(&self.sessions.config.space(), key).lock_name
    }

    /// Connections this handle has open right now: one per held lease and per waiting acquire,
    /// plus the idle ones.
    pub fn open_connections(&self) -> usize {
        self.sessions.open_count()
    }

    /// Idle connections kept for reuse.
    pub fn idle_connections(&self) -> usize {
        self.sessions.idle_count()
    }

    /// A session for one operation; `fresh` skips the idle list (after a reused session turned
    /// out dead).
    async fn checkout(&self, fresh: bool) -> Result<Checkout> {
        if fresh {
            self.sessions.discard_idle();
        }
        self.sessions.checkout().await
    }

    /// How many fence rows the table holds (every namespace): the keys bumped within the
    /// retention window, plus the keys held (see the crate docs, "Per-key state").
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached or
    /// does not answer within the command timeout; [`Store`](fencelock_core::ErrorKind::Store) for
    /// any other server error, such as no privilege on the fence table.
    ///
    /// # Cancel safety
    /// A single read; dropping the future loses nothing.
    pub async fn fence_rows(&self) -> Result<u64> {
        crate::cleanup::count_fences(&self.sessions).await
    }

    /// Removes fence rows idle for longer than the retention window whose keys nobody holds,
    /// now (a release also starts this in the background, at most once per tenth of the
    /// window), in transactions of at most 1,000 rows, at most 10 of them; returns how many
    /// rows went. Each transaction raises the floor to the highest token it removed, so those
    /// keys' next tokens are still greater.
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached or
    /// does not answer within the command timeout, or a lock wait timeout or deadlock;
    /// [`Store`](fencelock_core::ErrorKind::Store) for any other server error. Transactions
    /// committed before the error stay removed.
    ///
    /// # Cancel safety
    /// Each transaction commits on its own; one dropped in flight rolls back whole.
    pub async fn remove_idle_fences(&self) -> Result<u64> {
        crate::cleanup::remove_idle_fences(&self.sessions).await
    }

    /// Takes `target`, waiting up to `wait` in the server's queue (zero: one attempt):
    /// [`Error::Busy`] if it stays held.
    async fn acquire_target(
        &self,
        target: &Target,
        ttl: Duration,
        wait: Duration,
        label: Option<&str>,
    ) -> Result<Lease> {
        let deadline = Instant::now() + wait;
        // The server's idle timeout counts whole seconds: the lease carries the TTL it keeps.
        let ttl_secs = whole_secs(ttl);
        let ttl = Duration::from_secs(ttl_secs);
        let not_granted = || Error::Busy {
            key: target.display.clone(),
        };
        let mut fresh = false;
        loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            match self.arm_ttl(&mut session, ttl_secs).await {
                Ok(()) => {}
                // The session died while idle; try a new one.
                Err(fault) if reused && fault.session_ended() => {
                    tracing::debug!(reason = %fault.describe(), "an idle session was dead; retrying on a new one");
                    fresh = true;
                    continue;
                }
                Err(fault) => return Err(fault.into_error("setting the session's TTL")),
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if !wait.is_zero() && remaining.is_zero() {
                self.sessions.checkin(session);
                return Err(not_granted());
            }
            let owner = OwnerId::random();
            let (sent_at, reply) = self.take_lock(target, wait, remaining, &mut session).await;
            let row = match reply {
                Ok(row) => row,
                // The session died while idle: whatever it took died with it; try a new one.
                Err(fault) if reused && fault.session_ended() => {
                    tracing::debug!(reason = %fault.describe(), "an idle session was dead; retrying on a new one");
                    fresh = true;
                    continue;
                }
                // A lock the statement took is freed when the dropped session closes.
                Err(fault) => return Err(fault.into_error("acquire")),
            };
            if decode(&row, |row| row.try_get::<Option<i64>, _>("granted"))? != Some(1) {
                self.sessions.checkin(session);
                return Err(not_granted());
            }
            // Held: the bump follows on the same session. Should it fail, or the future be
            // dropped, the session is dropped, which frees the lock; no token was handed out.
            return self
                .bump_fence(target, owner, ttl, label, sent_at, session)
                .await;
        }
    }

    /// Sets the session's idle timeout to the lease's TTL (`ttl_secs`), unless it has it
    /// already: the server ends the session, freeing the lock, once its holder goes quiet
    /// that long.
    async fn arm_ttl(&self, session: &mut Session, ttl_secs: u64) -> Result<(), Fault> {
        if session.wait_timeout != Some(ttl_secs) {
            bounded(
                self.sessions.config.command_timeout(),
                sqlx::query(SET_WAIT_TIMEOUT)
                    .bind(ttl_secs)
                    .execute(&mut session.conn),
            )
            .await?;
            session.wait_timeout = Some(ttl_secs);
        }
        Ok(())
    }

    /// Sends `GET_LOCK` for `target` on `session`, the server waiting up to `remaining` (no
    /// wait: one attempt), with the session marked as waiting meanwhile so a dropped future
    /// ends its wait; returns when it was sent (the lease counts from then) and the reply.
    async fn take_lock(
        &self,
        target: &Target,
        wait: Duration,
        remaining: Duration,
        session: &mut Session,
    ) -> (Instant, Result<MySqlRow, Fault>) {
        // The server's wait starts after this is sent: it never gives up early. MySQL
        // counts GET_LOCK's timeout in whole seconds, MariaDB takes fractions.
        let wait_secs = if wait.is_zero() {
            0.0
        } else if session.fractional_wait {
            whole_millis(remaining) as f64 / 1000.0
        } else {
            whole_secs(remaining) as f64
        };
        let guard = (!wait.is_zero()).then(|| WaitGuard::arm(&self.sessions, session));
        let sent_at = Instant::now();
        let reply = bounded(
            Duration::from_secs_f64(wait_secs) + self.sessions.config.command_timeout(),
            sqlx::query(TAKE_LOCK)
                .bind(&target.lock_name)
                .bind(wait_secs)
                .fetch_one(&mut session.conn),
        )
        .await;
        if let Some(guard) = guard {
            if !matches!(reply, Err(Fault::TimedOut(_))) {
                // The server answered: its session is no longer waiting.
                guard.disarm();
            }
        }
        (sent_at, reply)
    }

    /// Bumps `target`'s fence row for `owner` on the session that holds its lock, and makes
    /// the lease from the token the bump returns, its TTL restarted after a long wait.
    async fn bump_fence(
        &self,
        target: &Target,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        sent_at: Instant,
        mut session: Session,
    ) -> Result<Lease> {
        let owner_text = owner.to_string();
        let stored_label = label.map(|label| format!("{owner_text}:{label}"));
        let bump = self.bump_statement(target, &owner_text, ttl, stored_label.as_deref());
        let bumped = bounded(
            self.sessions.config.command_timeout(),
            bump.execute(&mut session.conn),
        )
        .await
        .map_err(|fault| fault.into_error("bumping the fence"))?;
        match (bumped.rows_affected(), bumped.last_insert_id()) {
            (1 | 2, token) if token > 0 => {
                let waited = sent_at.elapsed();
                let lease = self.lease(target, owner, token, ttl, sent_at, session);
                // The server's TTL runs from the end of the statement; `sent_at` is before
                // the wait. After a long wait, restart the TTL to win back the waited time.
                if waited > ttl / 16 {
                    self.extend_lease(&lease).await?;
                }
                Ok(lease)
            }
            (0, _) => Err(Error::Store {
                message: format!(
                    "the floor table {} has no row: it must hold one (see \
                     MysqlConfig::floor_table_ddl)",
                    self.sessions.config.floor_table()
                ),
                source: None,
            }),
            (rows, token) => Err(Error::Store {
                message: format!(
                    "the fence bump changed {rows} rows and returned token {token}; \
                     expected 1 or 2 rows and a token above 0"
                ),
                source: None,
            }),
        }
    }

    /// The fence bump's statement with its arguments: the one that also writes the holder's
    /// label (`owner:label`) once the fence table has a label column, else the one without.
    fn bump_statement<'q>(
        &'q self,
        target: &'q Target,
        owner_text: &'q str,
        ttl: Duration,
        stored_label: Option<&'q str>,
    ) -> Query<'q, MySql, MySqlArguments> {
        let labelled = self.sessions.labels.load(Ordering::Relaxed);
        if labelled {
            sqlx::query(&self.sessions.sql.bump_labelled)
                .bind(&target.namespace)
                .bind(&target.fence_key)
                .bind(&target.lock_name)
                .bind(owner_text)
                .bind(millis(ttl))
                .bind(stored_label.map(str::as_bytes))
                .bind(&target.lock_name)
                .bind(owner_text)
                .bind(millis(ttl))
                .bind(stored_label.map(str::as_bytes))
        } else {
            sqlx::query(&self.sessions.sql.bump)
                .bind(&target.namespace)
                .bind(&target.fence_key)
                .bind(&target.lock_name)
                .bind(owner_text)
                .bind(millis(ttl))
                .bind(&target.lock_name)
                .bind(owner_text)
                .bind(millis(ttl))
        }
    }

    fn lease(
        &self,
        target: &Target,
        owner: OwnerId,
        token: u64,
        ttl: Duration,
        sent_at: Instant,
        session: Session,
    ) -> Lease {
        let backend = Backend {
            id: session.id,
            host: session.host.clone(),
        };
        let watch_id = self.watch.reserve();
        let held = Held {
            lock_name: target.lock_name.clone(),
            session_id: session.id,
            session: LeaseSession::new(session),
            sessions: self.sessions.clone(),
            watch: self.watch.clone(),
            watch_id,
        };
        let lease = Lease::with_store_state(&target.display, owner, token, ttl, sent_at, held);
        self.watch
            .add(&self.sessions, watch_id, backend, ttl, lease.revocation());
        lease
    }

    async fn extend_lease(&self, lease: &Lease) -> Result<()> {
        let held = held(lease)?;
        let gone = || Error::lost(lease, "it was released, or its session had ended");
        let timeout = held.sessions.config.command_timeout();
        held.session
            .run(gone, async |session: &mut Session| {
                let sent_at = Instant::now();
                let reply = bounded(
                    timeout,
                    sqlx::query(CONFIRM_HELD)
                        .bind(&held.lock_name)
                        .fetch_one(&mut session.conn),
                )
                .await;
                let row = match reply {
                    Ok(row) => row,
                    Err(fault) if fault.session_is_dead() => {
                        held.watch.forget(held.watch_id);
                        return Answer::Ended(Error::lost(lease, fault.describe()));
                    }
                    Err(fault) => return Answer::Failed(fault.into_error("extend")),
                };
                let decoded = decode(&row, |row| {
                    Ok((
                        row.try_get::<i64, _>("id")?,
                        row.try_get::<Option<i64>, _>("holder")?,
                    ))
                });
                match decoded {
                    Err(error) => Answer::Failed(error),
                    Ok((id, holder)) => confirmed(
                        lease,
                        sent_at,
                        id == held.session_id,
                        holder == Some(held.session_id),
                        POOLING_PROXY,
                        || held.watch.forget(held.watch_id),
                    ),
                }
            })
            .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let held = held(lease)?;
        let Some(mut session) = held.session.take().await else {
            return Ok(ReleaseOutcome::Lost);
        };
        // Whatever the answer, the lease ends here: nothing is left to watch.
        held.watch.forget(held.watch_id);
        // From here on a dropped future drops the session, which frees the lock.
        let reply = bounded(
            held.sessions.config.command_timeout(),
            sqlx::query(RELEASE)
                .bind(&held.lock_name)
                .fetch_one(&mut session.conn),
        )
        .await;
        match reply {
            Ok(row) => {
                let (released, leftover) = decode(&row, |row| {
                    Ok((
                        row.try_get::<Option<i64>, _>("released")?,
                        row.try_get::<Option<i64>, _>("leftover")?,
                    ))
                })?;
                if released != Some(1) {
                    return Ok(ReleaseOutcome::Lost);
                }
                // Only a session that holds nothing goes back to the idle list: GET_LOCK is
                // reentrant, and a later lease on it must not inherit a lock.
                if leftover == Some(0) {
                    held.sessions.checkin(session);
                }
                crate::cleanup::spawn_if_due(&held.sessions);
                Ok(ReleaseOutcome::Released)
            }
            // The server ended the session (its TTL ran out, or an operator killed it).
            Err(fault) if fault.session_ended() => Ok(ReleaseOutcome::Lost),
            // The session is dropped, so the lock is freed as soon as the server notices.
            Err(fault) => Err(fault.into_error("release")),
        }
    }

    /// The names of one page of [`raw::Store::list`], then their status.
    async fn list_page(
        &self,
        prefix: &str,
        from: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Listing> {
        let after = raw::stored_after(from)?;
        let mut fresh = false;
        let rows = loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            let reply = bounded(
                self.sessions.config.command_timeout(),
                sqlx::query(&self.sessions.sql.list)
                    .bind(self.sessions.config.namespace().as_bytes())
                    .bind(prefix.as_bytes())
                    .bind(prefix.as_bytes())
                    .bind(prefix.as_bytes())
                    .bind(&after)
                    .bind(u64::try_from(limit).unwrap_or(u64::MAX))
                    .fetch_all(&mut session.conn),
            )
            .await;
            match reply {
                Ok(rows) => {
                    self.sessions.checkin(session);
                    break rows;
                }
                Err(fault) if reused && fault.session_ended() => fresh = true,
                Err(fault) => return Err(fault.into_error("list")),
            }
        };
        let stored = rows
            .iter()
            .map(|row| decode(row, |row| row.try_get::<Vec<u8>, _>("key")))
            .collect::<Result<Vec<_>>>()?;
        let (names, next) = raw::read_page(stored, limit);
        raw::held_among(self, names, next).await
    }

    async fn status_of(&self, key: &str) -> Result<KeyStatus> {
        let target = Target::hashed(&self.sessions.config.space(), key);
        let mut fresh = false;
        loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            let labelled = self.sessions.labels.load(Ordering::Relaxed);
            let statement = if labelled {
                &self.sessions.sql.status_labelled
            } else {
                &self.sessions.sql.status
            };
            let reply = bounded(
                self.sessions.config.command_timeout(),
                sqlx::query(statement)
                    .bind(&target.lock_name)
                    .bind(&target.namespace)
                    .bind(&target.fence_key)
                    .fetch_one(&mut session.conn),
            )
            .await;
            let row = match reply {
                Ok(row) => row,
                Err(fault) if reused && fault.session_ended() => {
                    fresh = true;
                    continue;
                }
                Err(fault) => return Err(fault.into_error("status")),
            };
            self.sessions.checkin(session);
            return decode(&row, |row| {
                let Some(holder) = row.try_get::<Option<i64>, _>("holder")? else {
                    return Ok(KeyStatus::Free);
                };
                let holder_id: Option<i64> = row.try_get("holder_id")?;
                // The fence row describes the holder only if that session bumped it; otherwise
                // another key (a hash collision) or another program holds the lock.
                if holder_id != Some(holder) {
                    return Ok(KeyStatus::Held {
                        owner: None,
                        token: None,
                        remaining: None,
                        label: None,
                    });
                }
                let token: Option<i64> = row.try_get("token")?;
                let owner: Option<String> = row.try_get("owner")?;
                let ttl_ms: Option<i64> = row.try_get("ttl_ms")?;
                let command: Option<String> = row.try_get("command")?;
                let silent_s: Option<i64> = row.try_get("silent_s")?;
                // The server's idle timer runs only while the session sleeps between commands.
                let remaining = match (ttl_ms, command.as_deref(), silent_s) {
                    (Some(ttl), Some("Sleep"), Some(silent)) => {
                        Some(ttl.saturating_sub(silent.saturating_mul(1000)))
                    }
                    (Some(ttl), Some(_), _) => Some(ttl),
                    _ => None,
                }
                .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs()));
                let stored: Option<Vec<u8>> = if labelled {
                    row.try_get("label")?
                } else {
                    None
                };
                Ok(KeyStatus::Held {
                    label: owner.as_deref().and_then(|owner| label_of(owner, stored)),
                    owner: owner.as_deref().and_then(OwnerId::parse),
                    token: token.map(|t| t.max(0).unsigned_abs()),
                    remaining,
                })
            });
        }
    }
}

/// The session that holds `lock_name` right now, if any.
async fn holder(session: &mut Session, lock_name: &str, limit: Duration) -> Result<Option<i64>> {
    let row = bounded(
        limit,
        sqlx::query(HOLDER)
            .bind(lock_name)
            .fetch_one(&mut session.conn),
    )
    .await
    .map_err(|fault| fault.into_error("looking up the lock's holder"))?;
    decode(&row, |row| row.try_get::<Option<i64>, _>("holder"))
}

fn held(lease: &Lease) -> Result<&Held> {
    lease.store_state::<Held>().ok_or_else(|| {
        Error::invalid(
            "lease",
            "it was not granted by a MySQL store (it carries no session)",
        )
    })
}

fn decode<T>(row: &MySqlRow, read: impl FnOnce(&MySqlRow) -> sqlx::Result<T>) -> Result<T> {
    read(row).map_err(|e| sql_error("decoding the server's answer", e))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

// ---- the contract ---------------------------------------------------------------------------

#[async_trait]
impl raw::Store for MysqlStore {
    fn name(&self) -> &'static str {
        crate::MYSQL.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_min_ttl(MIN_TTL)
            // wait_timeout counts whole seconds.
            .with_ttl_granularity(Duration::from_secs(1))
            .with_frees_on_disconnect(true)
            .with_notified_wait(true)
            .with_evict(true)
            .with_max_ttl(self.sessions.config.max_ttl())
            .with_retention(self.sessions.config.retention())
            .with_labels(self.sessions.labels.load(Ordering::Relaxed))
            .with_listing(true)
    }

    /// One read: the fence rows under the prefix whose named lock a session holds, then each
    /// one's status.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future closes the session the read runs on, nothing else.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.list_page(prefix, from, limit).await
    }

    /// A wait waits in the server's own queue (`GET_LOCK` with a timeout), so the server wakes
    /// the waiter the moment the holder releases or its session ends.
    ///
    /// # Cancel safety
    /// The attempt runs on a session owned by the future. Dropping the future closes that
    /// connection; a lock the attempt took is freed when the server writes its reply to the
    /// closed connection (at once: `GET_LOCK(name, 0)` does not wait), or, dropped between the
    /// lock and the fence bump, when the idle server session reads the close; at the latest
    /// when the session has been silent for the TTL. A bump that committed unseen only skips a
    /// token.
    ///
    /// A dropped wait also kills the waiting session from a spawned task (`KILL CONNECTION`,
    /// matched by connection id and client address): the server does not notice a closed
    /// connection while its session waits, and a dropped waiter must never take the lock
    /// later. Should that task fail (the server unreachable), the session ends when the server
    /// writes its reply to the closed connection, after the wait.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let target = Target::hashed(&self.sessions.config.space(), request.key);
        let wait = request.wait.unwrap_or(Duration::ZERO);
        self.acquire_target(&target, request.ttl, wait, request.label)
            .await
    }

    /// # Cancel safety
    /// Dropping the future before the lease's session is taken changes nothing. Dropping it
    /// after closes the session, which frees the lock as soon as the server reads the close;
    /// a later release reports [`ReleaseOutcome::Lost`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.release_lease(lease).await
    }

    /// # Cancel safety
    /// Dropping the future before the statement is sent changes nothing. Dropping it after
    /// closes the lease's session, which frees the lock: a connection dropped mid-answer may
    /// be mid-packet, unfit for another statement. The lease is then lost: a later extend
    /// fails with [`Error::LeaseLost`] and a release reports [`ReleaseOutcome::Lost`].
    /// ([`KeepAlive::stop`](fencelock_core::KeepAlive::stop) and a guard's release let an
    /// extend in flight finish.)
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.extend_lease(lease).await
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.status_of(key).await
    }

    fn diagnostics(&self) -> Vec<String> {
        if self.sessions.labels.load(Ordering::Relaxed) {
            return Vec::new();
        }
        vec![format!(
            "the fence table {} has no label column: holder labels are not kept; an \
             administrator adds it with MysqlConfig::label_column_ddl() ({})",
            self.sessions.config.fence_table(),
            self.sessions.config.label_column_ddl()
        )]
    }

    /// One statement on any session: a compare-and-set on the key's fence row, while the
    /// session that bumped it still holds the lock.
    ///
    /// # Cancel safety
    /// Once sent, the statement runs to its end: dropping the future leaves the old label or
    /// the new one.
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        if !self.sessions.labels.load(Ordering::Relaxed) {
            return Err(Error::Unsupported {
                operation: "relabel (the fence table has no label column)",
            });
        }
        let target = Target::hashed(&self.sessions.config.space(), lease.key());
        let owner = lease.owner().to_string();
        let stored = format!("{owner}:{label}");
        let mut fresh = false;
        loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            let reply = bounded(
                self.sessions.config.command_timeout(),
                sqlx::query(&self.sessions.sql.relabel)
                    .bind(stored.as_bytes())
                    .bind(&target.namespace)
                    .bind(&target.fence_key)
                    .bind(&owner)
                    .bind(lease.fencing_token())
                    .execute(&mut session.conn),
            )
            .await;
            let done = match reply {
                Ok(done) => done,
                Err(fault) if reused && fault.session_ended() => {
                    fresh = true;
                    continue;
                }
                Err(fault) => return Err(fault.into_error("relabel")),
            };
            self.sessions.checkin(session);
            return if done.rows_affected() == 1 {
                Ok(())
            } else {
                Err(Error::lost(
                    lease,
                    "released, expired, evicted or held by another owner",
                ))
            };
        }
    }

    /// Ends the server session that holds
    /// `key`'s lock (in this store's namespace) with `KILL CONNECTION`, as an administrator
    /// would, and waits (up to 5 s) until the lock is free. The holder's lease is revoked
    /// within its handle's watch period (see the crate docs, "When a lock is freed early"), and
    /// its next extend or release fails ([`Error::LeaseLost`] / [`ReleaseOutcome::Lost`]).
    /// Returns whether a holder was found. Needs the privilege to kill that session (the same
    /// user, or `CONNECTION ADMIN` / `SUPER`).
    ///
    /// The look-up and the kill are one statement; the wait that follows is a second one.
    ///
    /// # Cancel safety
    /// The kill may or may not have happened when the future is dropped.
    async fn evict(&self, key: &str) -> Result<bool> {
        let lock_name = self.lock_name(key);
        let limit = self.sessions.config.command_timeout();
        let Checkout { mut session, .. } = self.checkout(false).await?;
        let found = holder(&mut session, &lock_name, limit).await?;
        let Some(holder_id) = found else {
            self.sessions.checkin(session);
            return Ok(false);
        };
        let killed = bounded(
            limit,
            sqlx::query(KILL_HOLDER)
                .bind(&lock_name)
                .execute(&mut session.conn),
        )
        .await;
        match killed {
            Ok(_) => {}
            // Freed in the meantime: nobody to kill.
            Err(fault) if fault.number() == Some(number::UNKNOWN_THREAD) => {
                self.sessions.checkin(session);
                return Ok(false);
            }
            Err(fault) => return Err(fault.into_error("killing the holder's session")),
        }
        // KILL returns before the killed session has ended and freed its lock.
        let deadline = Instant::now() + EVICT_WAIT;
        while holder(&mut session, &lock_name, limit).await? == Some(holder_id) {
            if Instant::now() >= deadline {
                return Err(Error::Unavailable {
                    message: format!(
                        "the holder's session {holder_id} was killed but still held the lock \
                         after {EVICT_WAIT:?}"
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.sessions.checkin(session);
        tracing::info!(key, holder_id, "killed the holder's session");
        Ok(true)
    }

    /// The fence table's rows, as [`MysqlStore::fence_rows`] counts them.
    ///
    /// # Errors
    /// As [`MysqlStore::fence_rows`].
    ///
    /// # Cancel safety
    /// A single read; dropping the future loses nothing.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Ok(Some(PerKeyState::new(
            self.fence_rows().await?,
            "fence rows",
        )))
    }
}

impl fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlStore")
            .field("url", &self.sessions.config.redacted())
            .field("namespace", &self.sessions.config.namespace())
            .field("open_connections", &self.open_connections())
            .field("idle_connections", &self.idle_connections())
            .field("watched_leases", &self.watch.watched_count())
            .field("watch_task_running", &self.watch.task_running())
            .finish()
    }
}

/// The rare paths a live server rarely takes on its own, driven by hand.
#[cfg(test)]
mod server_tests {
    use super::*;
    use fencelock_core::LockStore;

    fn url() -> String {
        static SERVER: std::sync::OnceLock<test_servers::MariadbServer> =
            std::sync::OnceLock::new();
        SERVER
            .get_or_init(|| test_servers::MariadbServer::start().unwrap_or_else(|e| panic!("{e}")))
            .url()
    }

    async fn store() -> MysqlStore {
        MysqlStore::connect(MysqlConfig::from_url(&url()).unwrap())
            .await
            .unwrap()
    }

    /// A cancelled waiter whose connection the server still sees open (the close not yet
    /// noticed, or lost on the way) would take the lock when it is freed. The guard a waiting
    /// acquire drops with its future kills that session first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_wait_guard_kills_a_waiter_the_server_still_sees() {
        let store = store().await;
        let target = Target::hashed(&store.sessions.config.space(), "guard:abandoned");
        let ttl = Duration::from_secs(30);
        let lease = store
            .acquire_target(&target, ttl, Duration::ZERO, None)
            .await
            .unwrap();

        // A waiter whose future is gone but whose connection stays open.
        let mut abandoned = store.sessions.open().await.unwrap();
        let waiting = sqlx::query("SELECT GET_LOCK(?, 60)")
            .bind(&target.lock_name)
            .execute(&mut abandoned.conn);
        assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err());
        drop(WaitGuard::arm(&store.sessions, &abandoned));

        // Its session ends, although its connection is still open.
        let Checkout { mut session, .. } = store.sessions.checkout().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let alive: i64 =
                sqlx::query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?")
                    .bind(abandoned.id)
                    .fetch_one(&mut session.conn)
                    .await
                    .unwrap()
                    .get(0);
            if alive == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the abandoned waiter still runs");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            store.release_lease(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        // Nobody took the key in between: its counter is still the lease's token.
        let counter: u64 = sqlx::query(&format!(
            "SELECT token FROM {} WHERE namespace = ? AND `key` = ?",
            store.sessions.config.fence_table()
        ))
        .bind(&target.namespace)
        .bind(&target.fence_key)
        .fetch_one(&mut session.conn)
        .await
        .unwrap()
        .get(0);
        assert_eq!(counter, lease.fencing_token());
        let next = store
            .acquire_target(&target, ttl, Duration::ZERO, None)
            .await
            .expect("the key is free");
        assert!(next.fencing_token() > lease.fencing_token());
        assert_eq!(
            store.release_lease(&next).await.unwrap(),
            ReleaseOutcome::Released
        );
        drop(abandoned);
    }

    /// `create_table=false` creates neither table, even for a user that may: `connect` fails
    /// naming the missing one and the DDL that makes it; once an administrator ran both, the
    /// store works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn create_table_false_never_creates_the_tables() {
        let options = "table=lp_premade&create_table=false";
        let config = MysqlConfig::from_url(&format!("{}?{options}", url())).unwrap();
        let admin = store().await;
        let Checkout { mut session, .. } = admin.sessions.checkout().await.unwrap();
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {};",
            config.fence_table(),
            config.floor_table()
        ))
        .execute(&mut session.conn)
        .await
        .unwrap();
        let refused = |result: fencelock_core::Result<MysqlStore>| match result {
            Err(error @ Error::Store { .. }) if !error.is_retryable() => error.to_string(),
            other => panic!("expected a non-retryable store error, got {other:?}"),
        };

        let message = refused(MysqlStore::connect(config.clone()).await);
        for part in [
            &format!("{} does not exist", config.fence_table()),
            "create_table=false",
            "MysqlConfig::fence_table_ddl()",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        async fn count(conn: &mut sqlx::MySqlConnection) -> i64 {
            sqlx::query(
                "SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'lp\\_premade%'",
            )
            .fetch_one(conn)
            .await
            .unwrap()
            .get::<i64, _>(0)
        }
        assert_eq!(count(&mut session.conn).await, 0, "a table was created");

        // The fence table alone: the floor table is still missing, and still not created.
        sqlx::raw_sql(&config.fence_table_ddl())
            .execute(&mut session.conn)
            .await
            .unwrap();
        let message = refused(MysqlStore::connect(config.clone()).await);
        for part in [
            &format!("{} does not exist", config.floor_table()),
            "MysqlConfig::floor_table_ddl() makes this one",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        assert_eq!(
            count(&mut session.conn).await,
            1,
            "the floor table was created"
        );

        sqlx::raw_sql(&config.floor_table_ddl())
            .execute(&mut session.conn)
            .await
            .unwrap();
        let store = MysqlStore::connect(config).await.expect("both tables made");
        let lease = store
            .try_acquire("premade", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}
