//! [`PostgresStore`]: the acquire/extend/release flows on the handle's sessions, and the trait
//! impls.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw::session_pool::{confirmed, Answer, LeaseSession};
use fencelock_core::raw::ttl::whole_millis;
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, Error, HolderStatus, Instant, KeyStatus, Lease, ListCursor, Listing, Mode,
    OwnerId, PerKeyState, ReleaseOutcome, Result,
};
use sqlx::postgres::PgRow;
use sqlx::PgConnection;
use sqlx::Row;

use crate::config::{PostgresConfig, MIN_TTL};
use crate::error::{bounded, sql_error, Fault};
use crate::keys::{ModeLocks, Target};
use crate::session::{Checkout, Session, Sessions, WaitGuard};
use crate::sql::{
    Labelled, CONFIRM_HELD, DISARM_WAITER, END_TURN, GROUPS_HELD, KEEP_SHARED, RELEASE,
    RELEASE_ALL, TAKE_GATE, TAKE_SLOT, TERMINATE_HOLDER, TRY_SHARED, UNLOCK_ALL,
    WAIT_EXCLUSIVE_SIGNAL, WAIT_EXCLUSIVE_TURN, WAIT_SHARED,
};
use crate::watch::{Backend, Watch};

// ---- the store ------------------------------------------------------------------------------

/// What happens when PgBouncer (or any proxy) in transaction or statement pooling mode sits
/// between the store and the server.
const POOLING_PROXY: &str =
    "the connection's backend changed between statements: a transaction-pooling proxy \
     (PgBouncer pool_mode=transaction/statement) is in the way, and session advisory locks cannot \
     work through it; connect directly or use pool_mode=session";

/// What a lease carries: its dedicated session. Dropping the last clone of the lease without
/// releasing it closes the session, which frees the lock at once.
struct Held {
    lock_id: i64,
    /// A shared lease or a permit: its session holds the key's lock shared, a group lock and
    /// (permits) a slot lock, all released together.
    several_locks: bool,
    pid: i32,
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

/// A lock store on PostgreSQL session advisory locks. See the [crate docs](crate) for what it
/// guarantees.
///
/// Cheap to clone: clones share their idle sessions. Every held lease and every waiting
/// acquire has a connection of its own.
#[derive(Clone)]
pub struct PostgresStore {
    sessions: Arc<Sessions>,
    /// The held leases whose sessions the handle's task watches.
    watch: Arc<Watch>,
    _alive: Arc<HandleAlive>,
}

impl PostgresStore {
    /// Connects: opens one session (within the connect timeout), creates the fence table if it
    /// is missing, checks the lock-id scheme it records, and keeps the session for reuse.
    ///
    /// Fails with [`Error::Unavailable`] if the server cannot be reached in time, and with
    /// [`Error::Store`] if it refuses (authentication, a missing database, PostgreSQL older than
    /// 14, no privilege to create the fence table) or the fence table records a lock-id scheme
    /// other than [`LOCK_ID_SCHEME`](crate::LOCK_ID_SCHEME) (see the crate docs, "Upgrading the
    /// lock-id scheme").
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached in
    /// time; [`Store`](fencelock_core::ErrorKind::Store) when it refuses, or the fence table is
    /// missing and cannot be created or records another lock-id scheme.
    ///
    /// # Cancel safety
    /// Dropping the future closes the half-opened connection; nothing is held.
    pub async fn connect(config: PostgresConfig) -> Result<PostgresStore> {
        let store = Self::connect_lazy(config);
        let session = store.sessions.open().await?;
        store.sessions.checkin(session);
        Ok(store)
    }

    /// A store that opens its first session only when first used, so an unreachable server (or
    /// a fence table of another lock-id scheme) is reported by that first operation.
    pub fn connect_lazy(config: PostgresConfig) -> PostgresStore {
        let sessions = Arc::new(Sessions::new(config));
        let watch = Arc::new(Watch::new());
        PostgresStore {
            _alive: Arc::new(HandleAlive(watch.clone())),
            sessions,
            watch,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.sessions.config
    }

    /// The advisory lock id `key` maps to in this store's fence table and namespace (see
    /// [`crate::lock_id`]).
    pub fn lock_id(&self, key: &str) -> i64 {
        Target::hashed(&self.sessions.config.space(), key).lock_id
    }

    /// Connections this handle has open right now: one per held lease and per waiting acquire,
    /// plus the idle ones.
    pub fn open_connections(&self) -> usize {
        self.sessions.open_count()
    }

    /// How many fence rows the table holds, in every namespace: the store's per-key state,
    /// bounded by the keys bumped within the retention window (see the crate docs, "Per-key
    /// state").
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

    /// Removes fence rows idle for longer than the retention window now, in bounded batches,
    /// rather than waiting for a release to start a background run; returns how many went. A
    /// key whose row went still gets a greater token.
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached or
    /// does not answer within the command timeout; [`Store`](fencelock_core::ErrorKind::Store) for
    /// any other server error, such as no privilege to delete from the fence table. Batches
    /// committed before the error stay removed.
    ///
    /// # Cancel safety
    /// Each batch commits on its own; a dropped future loses at most the batch in flight.
    pub async fn remove_idle_fences(&self) -> Result<u64> {
        crate::cleanup::remove_idle_fences(&self.sessions).await
    }

    /// Idle connections kept for reuse.
    pub fn idle_connections(&self) -> usize {
        self.sessions.idle_count()
    }

    /// Like [`LockStore::try_acquire`](fencelock_core::LockStore::try_acquire), for a raw advisory lock id: the lock that
    /// `pg_advisory_lock(lock_id)` takes, so the lease excludes other programs that lock the
    /// same id directly. The lease's key reads `pg_advisory_lock(<id>)`; its fencing counter is
    /// kept apart from every hashed key's.
    ///
    /// # Errors
    /// As [`LockStore::try_acquire`](fencelock_core::LockStore::try_acquire): [`Contended`](fencelock_core::ErrorKind::Contended) when the id
    /// is held; [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad TTL;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable);
    /// [`Store`](fencelock_core::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// As for [`LockStore::try_acquire`](fencelock_core::LockStore::try_acquire).
    pub async fn try_acquire_raw(&self, lock_id: i64, ttl: Duration) -> Result<Lease> {
        let target = Target::raw(lock_id);
        let request = AcquireRequest::new(&target.display, ttl);
        let attempt = self.try_in(&target, ttl, Mode::Exclusive);
        raw::acquire_checked(self, request, attempt).await
    }

    /// Like [`LockStore::acquire`](fencelock_core::LockStore::acquire), for a raw advisory lock id (see
    /// [`PostgresStore::try_acquire_raw`]).
    ///
    /// # Errors
    /// As [`LockStore::acquire`](fencelock_core::LockStore::acquire): those of [`PostgresStore::try_acquire_raw`], with
    /// [`Contended`](fencelock_core::ErrorKind::Contended) once the wait ran out and
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a wait above the maximum.
    ///
    /// # Cancel safety
    /// As for [`LockStore::acquire`](fencelock_core::LockStore::acquire).
    pub async fn acquire_raw(&self, lock_id: i64, ttl: Duration, wait: Duration) -> Result<Lease> {
        let target = Target::raw(lock_id);
        let request = AcquireRequest::new(&target.display, ttl).wait(wait);
        let attempt = self.wait_in(&target, ttl, wait, Mode::Exclusive);
        raw::acquire_checked(self, request, attempt).await
    }

    /// [`LockStore::evict`](fencelock_core::LockStore::evict) for a raw advisory lock id: ends the session that holds it.
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached or
    /// does not answer within the command timeout; [`Store`](fencelock_core::ErrorKind::Store) for
    /// any other server error, such as no right to end another role's backend.
    ///
    /// # Cancel safety
    /// As for [`LockStore::evict`](fencelock_core::LockStore::evict).
    pub async fn evict_raw(&self, lock_id: i64) -> Result<bool> {
        let Checkout { mut session, .. } = self.checkout(false).await?;
        let rows = bounded(
            self.sessions.config.command_timeout(),
            sqlx::query(TERMINATE_HOLDER)
                .bind(lock_id)
                .fetch_all(&mut session.conn),
        )
        .await
        .map_err(|fault| fault.into_error("terminating the holder's session"))?;
        self.sessions.checkin(session);
        let mut terminated = false;
        for row in &rows {
            terminated |= decode(row, |row| row.try_get::<bool, _>(0))?;
        }
        tracing::info!(lock_id, terminated, "terminated the holder's session");
        Ok(terminated)
    }

    /// A session for one operation; `fresh` skips the idle list (after a reused session turned
    /// out dead).
    async fn checkout(&self, fresh: bool) -> Result<Checkout> {
        if fresh {
            self.sessions.discard_idle();
        }
        self.sessions.checkout().await
    }

    /// The exclusive attempt: one statement that tries the key's lock and, if it is granted,
    /// bumps the fence. The outer `Err` is final (an answer that makes no sense, or a backend
    /// other than the session's); the inner result is the attempt, or the fault that ended it.
    async fn attempt_exclusive(
        &self,
        session: &mut Session,
        target: &Target,
        ttl: Duration,
        owner: OwnerId,
    ) -> Result<std::result::Result<Attempt, Fault>> {
        let reply = bounded(
            self.sessions.config.command_timeout(),
            self.grant(&self.sessions.sql.try_acquire, target, ttl, owner, |q| q)
                .fetch_one(&mut session.conn),
        )
        .await;
        let row = match reply {
            Ok(row) => row,
            Err(fault) => return Ok(Err(fault)),
        };
        let (granted, token, pid) = decode(&row, |row| {
            Ok((
                row.try_get::<bool, _>("granted")?,
                row.try_get::<Option<i64>, _>("token")?,
                row.try_get::<i32, _>("pid")?,
            ))
        })?;
        check_same_backend(session, pid)?;
        match (granted, token) {
            (true, Some(token)) => Ok(Ok(Attempt::Granted {
                token,
                pid,
                slot: None,
            })),
            (false, _) => Ok(Ok(Attempt::Blocked(Blocker::Main))),
            (true, None) => Err(Error::Store {
                message: "the acquire statement took the lock but returned no token".into(),
                source: None,
            }),
        }
    }

    /// One attempt in `mode`, on a session of its own: exclusive as one statement
    /// ([`attempt_exclusive`](Self::attempt_exclusive)), shared or permit as one transaction
    /// under the key's gate ([`attempt_mode`](Self::attempt_mode)); `Busy` if anything stands
    /// in the way.
    async fn try_in(&self, target: &Target, ttl: Duration, mode: Mode) -> Result<Lease> {
        // The server's timers count whole milliseconds: the lease carries the TTL they keep.
        let ttl = Duration::from_millis(whole_millis(ttl));
        let exclusive = mode == Mode::Exclusive;
        let mut fresh = false;
        loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            self.check_permit_column(mode)?;
            let owner = OwnerId::random();
            let sent_at = Instant::now();
            let attempt = if exclusive {
                self.attempt_exclusive(&mut session, target, ttl, owner)
                    .await?
            } else {
                let locks = ModeLocks::of(target.lock_id);
                self.attempt_mode(
                    &mut session,
                    target,
                    &locks,
                    mode,
                    ttl,
                    owner,
                    KeyLock::Nothing,
                    false,
                )
                .await
            };
            return match attempt {
                Ok(Attempt::Granted { token, pid, slot }) => {
                    check_same_backend(&session, pid)?;
                    let lease =
                        self.lease(target, owner, token, ttl, sent_at, session, (mode, slot));
                    self.won_back(lease, sent_at.elapsed()).await
                }
                Ok(Attempt::Blocked(_)) => {
                    self.sessions.checkin(session);
                    Err(Error::Busy {
                        key: target.display.clone(),
                    })
                }
                Ok(Attempt::Mismatch(held)) => {
                    self.sessions.checkin(session);
                    Err(mismatch(target, held, mode))
                }
                // The session died while idle: whatever it took died with it; try a new one.
                Err(fault) if reused && fault.session_ended() => {
                    tracing::debug!(reason = %fault.describe(), "an idle session was dead; retrying on a new one");
                    fresh = true;
                    continue;
                }
                // Whatever the attempt took is freed when the dropped session closes.
                Err(fault) => Err(fault.into_error(if exclusive {
                    "try_acquire"
                } else {
                    "try_acquire_as"
                })),
            };
        }
    }

    /// Waits up to `wait` in `mode`: [`wait_target`](Self::wait_target) (exclusive) or
    /// [`wait_mode`](Self::wait_mode); with no wait, one attempt.
    async fn wait_in(
        &self,
        target: &Target,
        ttl: Duration,
        wait: Duration,
        mode: Mode,
    ) -> Result<Lease> {
        let started = Instant::now();
        if wait.is_zero() {
            return self.try_in(target, ttl, mode).await;
        }
        if mode == Mode::Exclusive {
            self.wait_target(target, ttl, started + wait, started).await
        } else {
            self.wait_mode(target, ttl, started + wait, started, mode)
                .await
        }
    }

    /// Waits until `deadline` for the key's lock in the server's queue (a wait that started at
    /// `started`).
    async fn wait_target(
        &self,
        target: &Target,
        ttl: Duration,
        deadline: Instant,
        started: Instant,
    ) -> Result<Lease> {
        // The server's timers count whole milliseconds: the lease carries the TTL they keep.
        let ttl = Duration::from_millis(whole_millis(ttl));
        let mut fresh = false;
        loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                self.sessions.checkin(session);
                return Err(Error::WaitTimedOut {
                    key: target.display.clone(),
                    waited: started.elapsed(),
                });
            }
            let owner = OwnerId::random();
            // The server's lock_timeout starts after this is sent: it never gives up early.
            let lock_timeout = Duration::from_millis(whole_millis(remaining));
            let guard = WaitGuard::arm(&self.sessions, &session, target.lock_id);
            let sent_at = Instant::now();
            let reply = bounded(
                lock_timeout + self.sessions.config.command_timeout(),
                self.grant(&self.sessions.sql.wait_acquire, target, ttl, owner, |q| {
                    q.bind(millis(lock_timeout))
                })
                .fetch_one(&mut session.conn),
            )
            .await;
            if !matches!(reply, Err(Fault::TimedOut(_))) {
                // The server answered: its backend is no longer waiting.
                guard.disarm();
            }
            match reply {
                Ok(row) => {
                    let (token, pid) = decode(&row, |row| {
                        Ok((
                            row.try_get::<i64, _>("token")?,
                            row.try_get::<i32, _>("pid")?,
                        ))
                    })?;
                    check_same_backend(&session, pid)?;
                    let lease = self.lease(target, owner, token, ttl, sent_at, session, EXCLUSIVE);
                    return self.won_back(lease, sent_at.elapsed()).await;
                }
                // The rollback takes the lock with it, even one granted as the timeout fired;
                // but the server sends the error before it rolls back. One more round trip
                // lets the rollback land before the caller hears that the key is free.
                Err(fault) if fault.code().as_deref() == Some("55P03") => {
                    let settled = bounded(
                        self.sessions.config.command_timeout(),
                        sqlx::Connection::ping(&mut session.conn),
                    )
                    .await;
                    // A session that cannot answer is closed, which frees whatever it holds.
                    if settled.is_ok() {
                        self.sessions.checkin(session);
                    }
                    return Err(Error::WaitTimedOut {
                        key: target.display.clone(),
                        waited: started.elapsed(),
                    });
                }
                Err(fault) if reused && fault.session_ended() => {
                    tracing::debug!(reason = %fault.describe(), "an idle session was dead; retrying on a new one");
                    fresh = true;
                    continue;
                }
                Err(fault) => return Err(fault.into_error("acquire")),
            }
        }
    }

    /// The lease a granted attempt hands out, held `as_` a mode (and a permit's slot), with
    /// `session` its own.
    #[allow(clippy::too_many_arguments)]
    fn lease(
        &self,
        target: &Target,
        owner: OwnerId,
        token: i64,
        ttl: Duration,
        sent_at: Instant,
        session: Session,
        (mode, slot): (Mode, Option<u32>),
    ) -> Lease {
        let backend = Backend {
            pid: session.pid,
            started_us: session.started_us,
        };
        let watch_id = self.watch.reserve();
        let held = Held {
            lock_id: target.lock_id,
            several_locks: mode != Mode::Exclusive,
            pid: session.pid,
            session: LeaseSession::new(session),
            sessions: self.sessions.clone(),
            watch: self.watch.clone(),
            watch_id,
        };
        // Tokens start at 1 and only grow, so they are never negative.
        let token = token.max(0).unsigned_abs();
        let lease = Lease::with_store_state(&target.display, owner, token, ttl, sent_at, held)
            .in_mode(mode, slot);
        self.watch
            .add(&self.sessions, watch_id, backend, ttl, lease.revocation());
        lease
    }

    async fn extend_lease(&self, lease: &Lease) -> Result<()> {
        let Some(held) = held(lease) else {
            return Err(Error::lost(lease, FOREIGN_LEASE));
        };
        let gone = || Error::lost(lease, "it was released, or its session had ended");
        let timeout = held.sessions.config.command_timeout();
        held.session
            .run(gone, async |session: &mut Session| {
                let sent_at = Instant::now();
                let reply = bounded(
                    timeout,
                    sqlx::query(CONFIRM_HELD)
                        .bind(held.lock_id)
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
                        row.try_get::<i32, _>("pid")?,
                        row.try_get::<bool, _>("held")?,
                    ))
                });
                match decoded {
                    Err(error) => Answer::Failed(error),
                    Ok((pid, still_held)) => confirmed(
                        lease,
                        sent_at,
                        pid == held.pid,
                        still_held,
                        POOLING_PROXY,
                        || held.watch.forget(held.watch_id),
                    ),
                }
            })
            .await
    }

    /// The relabel's compare-and-set, on the lease's own session (a statement there also
    /// restarts the server's idle timer, as an extend does).
    async fn relabel_lease(&self, lease: &Lease, label: &str) -> Result<()> {
        let Some(held) = held(lease) else {
            return Err(Error::lost(lease, FOREIGN_LEASE));
        };
        if !self.sessions.has_label_column() {
            return Err(Error::Unsupported {
                operation: "relabel (the fence table has no label column)",
            });
        }
        let target = Target::hashed(&self.sessions.config.space(), lease.key());
        if target.lock_id != held.lock_id {
            return Err(Error::Unsupported {
                operation: "relabel of a raw lock id",
            });
        }
        let Ok(token) = i64::try_from(lease.fencing_token()) else {
            return Err(Error::lost(lease, "its token is beyond this store's"));
        };
        let gone = || Error::lost(lease, "it was released, or its session had ended");
        let timeout = held.sessions.config.command_timeout();
        held.session
            .run(gone, async |session: &mut Session| {
                let reply = bounded(
                    timeout,
                    sqlx::query(&self.sessions.sql.relabel)
                        .bind(target.lock_id)
                        .bind(&target.namespace)
                        .bind(&target.fence_key)
                        .bind(format!("{}:{label}", lease.owner()))
                        .bind(lease.owner().to_string())
                        .bind(token)
                        .execute(&mut session.conn),
                )
                .await;
                match reply {
                    Ok(done) if done.rows_affected() == 1 => Answer::Kept(()),
                    Ok(_) if held.several_locks => Answer::Failed(Error::Unsupported {
                        operation: "relabel of a reader or permit that another holder joined after",
                    }),
                    Ok(_) => {
                        Answer::Failed(Error::lost(lease, "its session no longer holds the lock"))
                    }
                    Err(fault) if fault.session_is_dead() => {
                        held.watch.forget(held.watch_id);
                        Answer::Ended(Error::lost(lease, fault.describe()))
                    }
                    Err(fault) => Answer::Failed(fault.into_error("relabel")),
                }
            })
            .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let Some(held) = held(lease) else {
            // Not granted by this kind of store: whatever holds the key, it is not this lease.
            return Ok(ReleaseOutcome::Lost);
        };
        let Some(mut session) = held.session.take().await else {
            return Ok(ReleaseOutcome::Lost);
        };
        // Whatever the answer, the lease ends here: nothing is left to watch.
        held.watch.forget(held.watch_id);
        // From here on a dropped future drops the session, which frees the lock.
        let reply = bounded(
            held.sessions.config.command_timeout(),
            sqlx::query(if held.several_locks {
                RELEASE_ALL
            } else {
                RELEASE
            })
            .bind(held.lock_id)
            .fetch_one(&mut session.conn),
        )
        .await;
        match reply {
            Ok(row) => {
                let released = decode(&row, |row| row.try_get::<bool, _>("released"))?;
                if released {
                    held.sessions.checkin(session);
                    crate::cleanup::spawn_if_due(&held.sessions);
                    Ok(ReleaseOutcome::Released)
                } else {
                    Ok(ReleaseOutcome::Lost)
                }
            }
            // The server ended the session (its TTL ran out, or an operator terminated it).
            Err(fault) if fault.session_ended() => Ok(ReleaseOutcome::Lost),
            // The session is dropped, so the lock is freed as soon as the server notices.
            Err(fault) => Err(fault.into_error("release")),
        }
    }

    async fn status_of(&self, key: &str) -> Result<KeyStatus> {
        let target = Target::hashed(&self.sessions.config.space(), key);
        let mut fresh = false;
        loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            let reply = bounded(
                self.sessions.config.command_timeout(),
                sqlx::query(
                    self.sessions
                        .sql
                        .holders
                        .get(self.sessions.has_label_column()),
                )
                .bind(target.lock_id)
                .bind(&target.namespace)
                .bind(&target.fence_key)
                .fetch_all(&mut session.conn),
            )
            .await;
            let rows = match reply {
                Ok(rows) => rows,
                Err(fault) if reused && fault.session_ended() => {
                    fresh = true;
                    continue;
                }
                Err(fault) => return Err(fault.into_error("status")),
            };
            self.sessions.checkin(session);
            return self.status_from(&target, &rows);
        }
    }
}

impl PostgresStore {
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
                    .bind(self.sessions.config.namespace())
                    .bind(prefix.as_bytes())
                    .bind(&after)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
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
}

// ---- shared leases and semaphore permits ----------------------------------------------------

/// The longest one wake-up wait on a slot or group lock lasts before the waiter looks again:
/// the bound on noticing a freed slot other than the one it waits on, or a slot or group
/// freed by the server ending a session (which nothing announces otherwise).
const MODE_POLL: Duration = Duration::from_millis(200);

/// What stood in a mode attempt's way.
enum Blocker {
    /// The key's lock: an exclusive holder, or an exclusive request waiting (writers first).
    Main,
    /// A group that must be gone first (the other group, or the own group with no limit on
    /// record), whose lock is this: wait in the key's queue for the key's lock exclusively,
    /// which keeps every later request out until this waiter's attempt is done; or, for a
    /// waiter that holds the key's lock shared already (woken by a writer's release with the
    /// other group's waiters, which reached the gate first), keep it, so that no later
    /// writer comes in first, and wait on the group's lock at most [`MODE_POLL`] at a time.
    Group(i64),
    /// Every slot of the semaphore is held: wait on this one's lock, keeping the key's lock
    /// shared (so a later conflicting request queues behind this waiter), then look again.
    Slot(i64),
}

/// How a mode waiter waits in the server's queue.
#[derive(Clone, Copy)]
enum Queue {
    /// For the key's lock, shared, kept.
    Shared,
    /// For the key's lock, exclusively, kept with the `turn` lock that marks it a waiter's.
    Exclusive { turn: i64 },
    /// For a slot's lock, exclusively, let go at once: a wake-up.
    Signal,
}

/// What a mode waiter's session holds of the key's lock between its attempts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum KeyLock {
    Nothing,
    /// Shared: from a queue wait behind a writer, or kept while waiting for a slot.
    Shared,
    /// Exclusive: granted in the queue once every holder of the other group had gone; no
    /// holder of the key can come in before this waiter's attempt, which lets it go.
    Exclusive,
}

/// How a mode attempt ended.
enum Attempt {
    Granted {
        token: i64,
        pid: i32,
        slot: Option<u32>,
    },
    Blocked(Blocker),
    /// The key's permits are held with this other limit.
    Mismatch(u32),
}

/// One check-and-take of a reader or permit ([`PostgresStore::checks_and_takes`]), on its
/// transaction's connection: what its statements read.
struct ModeTake<'a> {
    store: &'a PostgresStore,
    /// Each statement's bound: the command timeout.
    limit: Duration,
    conn: &'a mut PgConnection,
    target: &'a Target,
    locks: &'a ModeLocks,
    ttl: Duration,
    owner: OwnerId,
}

impl ModeTake<'_> {
    /// Takes the key's gate for the transaction, which serialises the checks of its shared
    /// and permit requests; its statement arms the session's TTL.
    async fn gate(&mut self) -> std::result::Result<(), Fault> {
        bounded(
            self.limit,
            sqlx::query(TAKE_GATE)
                .bind(self.locks.gate)
                .bind(millis(self.ttl))
                .execute(&mut *self.conn),
        )
        .await?;
        Ok(())
    }

    /// Whether the lock `id` could be taken shared for the transaction (it then holds it).
    async fn try_shared(&mut self, id: i64) -> std::result::Result<bool, Fault> {
        let query = sqlx::query_scalar::<_, bool>(TRY_SHARED).bind(id);
        bounded(self.limit, query.fetch_one(&mut *self.conn)).await
    }

    /// Whether the readers' group, and the permits' group, are held now.
    async fn groups_held(&mut self) -> std::result::Result<(bool, bool), Fault> {
        let groups = bounded(
            self.limit,
            sqlx::query(GROUPS_HELD)
                .bind(self.locks.readers)
                .bind(self.locks.permits)
                .fetch_one(&mut *self.conn),
        )
        .await?;
        let readers: bool = groups.try_get("readers").map_err(Fault::Sql)?;
        let permits: bool = groups.try_get("permits").map_err(Fault::Sql)?;
        Ok((readers, permits))
    }

    /// A permit of `wanted`: blocked while readers hold the key, refused while permits of
    /// another limit do; otherwise a free slot is taken with the fence's bump, or with every
    /// slot held, one picked at random is the one to wait on.
    async fn permit(
        &mut self,
        wanted: u32,
        readers: bool,
        permits: bool,
    ) -> std::result::Result<Attempt, Fault> {
        let (store, target, locks) = (self.store, self.target, self.locks);
        if readers {
            return Ok(Attempt::Blocked(Blocker::Group(locks.readers)));
        }
        if permits {
            if let Some(refused) = self.held_limit(wanted).await? {
                return Ok(refused);
            }
        }
        // Refused only while an exclusive request waits for the group's lock: an earlier
        // release of this crate waited for a group that way.
        if !self.try_shared(locks.permits).await? {
            return Ok(Attempt::Blocked(Blocker::Group(locks.permits)));
        }
        let slot: Option<i64> = bounded(
            self.limit,
            sqlx::query_scalar(TAKE_SLOT)
                .bind(locks.slots(wanted))
                .fetch_optional(&mut *self.conn),
        )
        .await?;
        let Some(slot) = slot.and_then(|s| u32::try_from(s).ok()) else {
            let pick = (OwnerId::random().as_u128() % u128::from(wanted)) as u32;
            return Ok(Attempt::Blocked(Blocker::Slot(locks.slot(pick))));
        };
        let sql = &store.sessions.sql.bump_permit;
        let row = bounded(
            self.limit,
            store
                .grant(sql, target, self.ttl, self.owner, |q| {
                    q.bind(i32::try_from(wanted).unwrap_or(i32::MAX))
                        .bind(locks.permits)
                        .bind(locks.slot(slot))
                })
                .fetch_one(&mut *self.conn),
        )
        .await?;
        granted(&row, Some(slot))
    }

    /// With permits held: the refusal of a permit of `wanted` unless that is the limit on
    /// record (`None`: it is).
    async fn held_limit(&mut self, wanted: u32) -> std::result::Result<Option<Attempt>, Fault> {
        let recorded: Option<Option<i32>> = bounded(
            self.limit,
            sqlx::query_scalar(&self.store.sessions.sql.recorded_limit)
                .bind(&self.target.namespace)
                .bind(&self.target.fence_key)
                .fetch_optional(&mut *self.conn),
        )
        .await?;
        Ok(match recorded.flatten() {
            Some(held) if held.max(0).unsigned_abs() != wanted => {
                Some(Attempt::Mismatch(held.max(0).unsigned_abs()))
            }
            Some(_) => None,
            // Held, but no limit on record (its row was removed after the
            // retention window): wait until that group is gone.
            None => Some(Attempt::Blocked(Blocker::Group(self.locks.permits))),
        })
    }

    /// A reader: blocked while permits hold the key, or while the readers' group cannot be
    /// joined; otherwise it joins with the fence's bump.
    async fn reader(&mut self, permits: bool) -> std::result::Result<Attempt, Fault> {
        let (store, target, locks) = (self.store, self.target, self.locks);
        if permits {
            return Ok(Attempt::Blocked(Blocker::Group(locks.permits)));
        }
        if !self.try_shared(locks.readers).await? {
            return Ok(Attempt::Blocked(Blocker::Group(locks.readers)));
        }
        let sql = &store.sessions.sql.bump_shared;
        let row = bounded(
            self.limit,
            store
                .grant(sql, target, self.ttl, self.owner, |q| q.bind(locks.readers))
                .fetch_one(&mut *self.conn),
        )
        .await?;
        granted(&row, None)
    }
}

/// The grant a fence bump answered with `row`, in the permit `slot` if any.
fn granted(row: &PgRow, slot: Option<u32>) -> std::result::Result<Attempt, Fault> {
    let token: i64 = row.try_get("token").map_err(Fault::Sql)?;
    let pid: i32 = row.try_get("pid").map_err(Fault::Sql)?;
    Ok(Attempt::Granted { token, pid, slot })
}

impl PostgresStore {
    fn check_permit_column(&self, mode: Mode) -> Result<()> {
        if matches!(mode, Mode::Permit { .. }) && !self.sessions.has_permit_limit_column() {
            return Err(Error::Store {
                message: format!(
                    "the fence table {} has no permit_limit column (an earlier \
                     fencelock-postgres made it), so it cannot record a semaphore's limit: have \
                     the table's owner run PostgresConfig::permits_upgrade_sql() once (crate \
                     docs: \"Shared leases and semaphore permits\"); exclusive and shared \
                     leases work without it",
                    self.sessions.config.fence_table()
                ),
                source: None,
            });
        }
        Ok(())
    }

    /// One attempt in `mode`, as one transaction under the key's gate, whose statement arms
    /// the TTL on the session. Its locks are the transaction's until the bump takes them for
    /// the session; `have` says what the session already holds of the key's lock (from a
    /// wait in the queue). A refused attempt releases it before it returns (it holds no other
    /// session lock), except that a `waiting` one blocked by a full semaphore keeps the key's
    /// lock shared, taking it if it had not. A granted attempt that held the key's lock
    /// exclusively lets that go once it has committed (the lease holds it shared). A refused
    /// attempt of a `waiting` acquire commits (it wrote nothing), so the TTL stays armed for
    /// the rest of the wait; a lone attempt rolls back, which disarms it for the idle pool.
    #[allow(clippy::too_many_arguments)]
    async fn attempt_mode(
        &self,
        session: &mut Session,
        target: &Target,
        locks: &ModeLocks,
        mode: Mode,
        ttl: Duration,
        owner: OwnerId,
        have: KeyLock,
        waiting: bool,
    ) -> std::result::Result<Attempt, Fault> {
        let limit = self.sessions.config.command_timeout();
        bounded(limit, sqlx::query("BEGIN").execute(&mut session.conn)).await?;
        let outcome = self
            .checks_and_takes(session, target, locks, mode, ttl, owner, have)
            .await?;
        if !matches!(outcome, Attempt::Granted { .. }) {
            let keep_shared = waiting
                && match outcome {
                    Attempt::Blocked(Blocker::Slot(_)) => true,
                    Attempt::Blocked(Blocker::Group(_)) => have == KeyLock::Shared,
                    _ => false,
                };
            if keep_shared && have == KeyLock::Nothing {
                // The transaction holds it shared (its check took it): at once.
                bounded(
                    limit,
                    sqlx::query(KEEP_SHARED)
                        .bind(target.lock_id)
                        .execute(&mut session.conn),
                )
                .await?;
            } else if !keep_shared && have != KeyLock::Nothing {
                bounded(limit, sqlx::query(UNLOCK_ALL).execute(&mut session.conn)).await?;
            }
            let end = if waiting { "COMMIT" } else { "ROLLBACK" };
            bounded(limit, sqlx::query(end).execute(&mut session.conn)).await?;
            return Ok(outcome);
        }
        bounded(limit, sqlx::query("COMMIT").execute(&mut session.conn)).await?;
        if have == KeyLock::Exclusive {
            bounded(
                limit,
                sqlx::query(END_TURN)
                    .bind(target.lock_id)
                    .bind(locks.turn)
                    .execute(&mut session.conn),
            )
            .await?;
        }
        Ok(outcome)
    }

    #[allow(clippy::too_many_arguments)]
    async fn checks_and_takes(
        &self,
        session: &mut Session,
        target: &Target,
        locks: &ModeLocks,
        mode: Mode,
        ttl: Duration,
        owner: OwnerId,
        have: KeyLock,
    ) -> std::result::Result<Attempt, Fault> {
        let mut take = ModeTake {
            store: self,
            limit: self.sessions.config.command_timeout(),
            conn: &mut session.conn,
            target,
            locks,
            ttl,
            owner,
        };
        take.gate().await?;
        if have == KeyLock::Nothing && !take.try_shared(target.lock_id).await? {
            return Ok(Attempt::Blocked(Blocker::Main));
        }
        let (readers, permits) = take.groups_held().await?;
        match mode {
            Mode::Permit { limit: wanted } => take.permit(wanted, readers, permits).await,
            _ => take.reader(permits).await,
        }
    }

    /// Waits until `deadline` in a shared or permit mode (a wait that started at `started`): in
    /// the server's queue for the key's lock, shared behind any writer, or exclusively while
    /// the other group holds the key (so it keeps out every request that comes after it, as a
    /// writer does); while a full semaphore holds it, keeping the key's lock shared, in the
    /// queue of one slot's lock for at most [`MODE_POLL`] at a time.
    /// From its first attempt on, the session carries the waiter's TTL (see `sql.rs`); if the
    /// server ended it (this waiter was silent that long, or it died idle in the pool), nothing
    /// was granted, and the wait goes on with a new session.
    async fn wait_mode(
        &self,
        target: &Target,
        ttl: Duration,
        deadline: Instant,
        started: Instant,
        mode: Mode,
    ) -> Result<Lease> {
        let ttl = Duration::from_millis(whole_millis(ttl));
        let locks = ModeLocks::of(target.lock_id);
        let timed_out = || Error::WaitTimedOut {
            key: target.display.clone(),
            waited: started.elapsed(),
        };
        let mut fresh = false;
        'session: loop {
            let Checkout {
                mut session,
                reused,
            } = self.checkout(fresh).await?;
            self.check_permit_column(mode)?;
            let mut have = KeyLock::Nothing;
            let mut first = true;
            loop {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    self.give_up_wait(session).await;
                    return Err(timed_out());
                }
                let owner = OwnerId::random();
                let sent_at = Instant::now();
                let attempt = self
                    .attempt_mode(&mut session, target, &locks, mode, ttl, owner, have, true)
                    .await;
                let waited = match attempt {
                    Ok(Attempt::Granted { token, pid, slot }) => {
                        check_same_backend(&session, pid)?;
                        let lease =
                            self.lease(target, owner, token, ttl, sent_at, session, (mode, slot));
                        return self.won_back(lease, sent_at.elapsed()).await;
                    }
                    Ok(Attempt::Mismatch(held)) => {
                        self.give_up_wait(session).await;
                        return Err(mismatch(target, held, mode));
                    }
                    Ok(Attempt::Blocked(blocker)) => {
                        let remaining = deadline.saturating_duration_since(Instant::now());
                        let main = target.lock_id;
                        let jitter =
                            Duration::from_millis((OwnerId::random().as_u128() % 50) as u64);
                        let poll = remaining.min(MODE_POLL + jitter);
                        let (id, queue, bound) = match blocker {
                            Blocker::Main => (main, Queue::Shared, remaining),
                            Blocker::Group(_) if have != KeyLock::Shared => {
                                (main, Queue::Exclusive { turn: locks.turn }, remaining)
                            }
                            // The session keeps the key's lock shared through these waits.
                            Blocker::Group(id) | Blocker::Slot(id) => (id, Queue::Signal, poll),
                        };
                        self.wait_in_queue(&mut session, id, queue, bound, ttl)
                            .await
                            .map(|held| match queue {
                                Queue::Signal => KeyLock::Shared,
                                _ => held,
                            })
                    }
                    Err(fault) => Err(fault),
                };
                match waited {
                    Ok(held) => have = held,
                    // Whatever the session held went with it, and no lease was handed out.
                    Err(fault) if fault.session_ended() => {
                        tracing::debug!(reason = %fault.describe(), "the waiting session ended; waiting on a new one");
                        // A reused session dead at once: the other idle ones likely are too.
                        fresh = first && reused;
                        continue 'session;
                    }
                    Err(fault) => return Err(fault.into_error("acquire_as")),
                }
                first = false;
            }
        }
    }

    /// A lease whose granting statement took `waited` from its sending to its reply (in the
    /// server's queue, or behind a gate held by another acquire, which a frozen one holds up to
    /// its TTL), with that time won back: the server's TTL runs from the end of the statement,
    /// while the local deadline counts from before it was sent, so a long wait could hand out a
    /// lease with little or no validity left. Past a sixteenth of the TTL, the TTL is restarted
    /// (an extend, which confirms a fresh deadline). Every waiting path, exclusive or not, goes
    /// through here.
    async fn won_back(&self, lease: Lease, waited: Duration) -> Result<Lease> {
        if waited > lease.ttl() / 16 {
            self.extend_lease(&lease).await?;
        }
        Ok(lease)
    }

    /// Ends a mode wait without a lease: the session's locks go and its TTL is disarmed, then
    /// it idles in the pool; a session that fails at that is closed (which frees everything).
    async fn give_up_wait(&self, mut session: Session) {
        let reply = bounded(
            self.sessions.config.command_timeout(),
            sqlx::query(DISARM_WAITER).execute(&mut session.conn),
        )
        .await;
        match reply {
            Ok(_) => self.sessions.checkin(session),
            Err(fault) => {
                tracing::debug!(reason = %fault.describe(), "closed a waiting session that could not be reset")
            }
        }
    }

    /// Waits in the server's queue for lock `id` for at most `bound`: the key's lock, shared
    /// or exclusive, kept (with `ttl` armed by the same statement), or a slot's lock,
    /// exclusive and let go as the statement ends (a wake-up: the transaction's lock, never
    /// the session's). Returns what the session holds of the lock afterwards. A dropped future
    /// terminates the waiting backend as a dropped exclusive waiter's is.
    async fn wait_in_queue(
        &self,
        session: &mut Session,
        id: i64,
        queue: Queue,
        bound: Duration,
        ttl: Duration,
    ) -> std::result::Result<KeyLock, Fault> {
        let lock_timeout = Duration::from_millis(whole_millis(bound).max(1));
        let guard = WaitGuard::arm(&self.sessions, session, id);
        let (statement, kept) = match queue {
            Queue::Shared => (
                sqlx::query(WAIT_SHARED)
                    .bind(id)
                    .bind(millis(lock_timeout))
                    .bind(millis(ttl)),
                KeyLock::Shared,
            ),
            Queue::Exclusive { turn } => (
                sqlx::query(WAIT_EXCLUSIVE_TURN)
                    .bind(id)
                    .bind(millis(lock_timeout))
                    .bind(millis(ttl))
                    .bind(turn),
                KeyLock::Exclusive,
            ),
            Queue::Signal => (
                sqlx::query(WAIT_EXCLUSIVE_SIGNAL)
                    .bind(id)
                    .bind(millis(lock_timeout)),
                KeyLock::Nothing,
            ),
        };
        let reply = bounded(
            lock_timeout + self.sessions.config.command_timeout(),
            statement.execute(&mut session.conn),
        )
        .await;
        if !matches!(reply, Err(Fault::TimedOut(_))) {
            guard.disarm();
        }
        match reply {
            Ok(_) => Ok(kept),
            // The wait was the transaction's: its rollback freed the lock, even one granted as
            // the timeout fired, and the session holds nothing of it.
            Err(fault) if fault.code().as_deref() == Some("55P03") => Ok(KeyLock::Nothing),
            Err(fault) => Err(fault),
        }
    }

    /// The status of a key from every holder of its lock: one exclusive holder, or the
    /// readers or permit holders (those holding their group's lock outside an acquire's
    /// transaction). A session that holds the key's lock shared without its group's, or holds
    /// the gate, is a waiter (its lease is not granted, and may never be): not counted.
    fn status_from(&self, target: &Target, rows: &[PgRow]) -> Result<KeyStatus> {
        let locks = ModeLocks::of(target.lock_id);
        let Some(first) = rows.first() else {
            return Ok(KeyStatus::Free);
        };
        for row in rows {
            let mode: String = decode(row, |row| row.try_get("mode"))?;
            if mode != "ExclusiveLock" {
                continue;
            }
            // A mode waiter granted the key's lock exclusively in the queue holds it, with its
            // turn's lock, until its attempt is done: a waiter, not an exclusive holder.
            let held: Vec<i64> = decode(row, |row| row.try_get("locks"))?;
            if !held.contains(&locks.turn) {
                return decode(row, exclusive_status);
            }
        }
        let mut readers = 0u32;
        let mut permits = 0u32;
        let mut holders = Vec::new();
        let recorded: Option<i32> = decode(first, |row| row.try_get("permit_limit"))?;
        let limit = recorded.map(|l| l.max(0).unsigned_abs());
        let slots = locks.slots(limit.unwrap_or(0).min(fencelock_core::limits::MAX_PERMITS));
        for row in rows {
            let mode: String = decode(row, |row| row.try_get("mode"))?;
            if mode == "ExclusiveLock" {
                continue;
            }
            let held: Vec<i64> = decode(row, |row| row.try_get("locks"))?;
            let slot = if held.contains(&locks.gate) {
                // Inside its acquire's transaction: granted only once that commits.
                continue;
            } else if held.contains(&locks.permits) {
                permits += 1;
                slots
                    .iter()
                    .position(|id| held.contains(id))
                    .and_then(|i| u32::try_from(i).ok())
            } else if held.contains(&locks.readers) {
                readers += 1;
                None
            } else {
                // A waiter granted the key's lock in the queue, before its attempt (or another
                // program that locks this store's ids).
                continue;
            };
            let (owner, token, remaining, label) = decode(row, holder_fields)?;
            holders.push(HolderStatus::new(owner, token, slot, remaining).with_label(label));
        }
        if permits > 0 {
            Ok(KeyStatus::Shared {
                mode: Mode::Permit {
                    limit: limit.unwrap_or(0),
                },
                count: permits,
                holders,
            })
        } else if readers > 0 {
            Ok(KeyStatus::Shared {
                mode: Mode::Shared,
                count: readers,
                holders,
            })
        } else {
            Ok(KeyStatus::Free)
        }
    }
}

/// Owner, token and remaining time of a holder row, where the fence row is this holder's (it
/// describes the last lease granted).
type HolderFields = (
    Option<OwnerId>,
    Option<u64>,
    Option<Duration>,
    Option<String>,
);

fn holder_fields(row: &PgRow) -> sqlx::Result<HolderFields> {
    let pid: i32 = row.try_get("pid")?;
    let holder_pid: Option<i32> = row.try_get("holder_pid")?;
    if holder_pid != Some(pid) {
        return Ok((None, None, None, None));
    }
    // Read only where the fence table has the column (the statement then selects it).
    let stored: Option<String> = match row.try_get("label") {
        Ok(label) => label,
        Err(sqlx::Error::ColumnNotFound(_)) => None,
        Err(error) => return Err(error),
    };
    let token: Option<i64> = row.try_get("token")?;
    let owner: Option<String> = row.try_get("owner")?;
    let ttl_ms: Option<i64> = row.try_get("ttl_ms")?;
    let state: Option<String> = row.try_get("state")?;
    let silent_ms: Option<i64> = row.try_get("silent_ms")?;
    // The server's idle timer runs only while the backend is idle.
    let remaining = match (ttl_ms, state.as_deref(), silent_ms) {
        (Some(ttl), Some("idle"), Some(silent)) => Some(ttl.saturating_sub(silent)),
        (Some(ttl), Some(_), _) => Some(ttl),
        _ => None,
    }
    .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs()));
    // The label is the holder's only if it is behind its owner id (see `Target::stored_label`).
    let label = owner.as_deref().and_then(|owner| {
        let label = stored?.strip_prefix(owner)?.strip_prefix(':')?.to_owned();
        Some(label)
    });
    Ok((
        owner.as_deref().and_then(OwnerId::parse),
        token.map(|t| t.max(0).unsigned_abs()),
        remaining,
        label,
    ))
}

fn exclusive_status(row: &PgRow) -> sqlx::Result<KeyStatus> {
    let (owner, token, remaining, label) = holder_fields(row)?;
    Ok(KeyStatus::Held {
        owner,
        token,
        remaining,
        label,
    })
}

fn mismatch(target: &Target, held: u32, mode: Mode) -> Error {
    let requested = match mode {
        Mode::Permit { limit } => limit,
        _ => 0,
    };
    Error::LimitMismatch {
        key: target.display.clone(),
        held,
        requested,
    }
}

/// How an exclusive lease is held: no mode but the exclusive one, no slot.
const EXCLUSIVE: (Mode, Option<u32>) = (Mode::Exclusive, None);

/// Why a lease without a session of this store is lost to it.
const FOREIGN_LEASE: &str =
    "it was not granted by a PostgreSQL store (it carries no session), so it holds nothing here";

fn held(lease: &Lease) -> Option<&Held> {
    lease.store_state::<Held>()
}

fn check_same_backend(session: &Session, pid: i32) -> Result<()> {
    if pid == session.pid {
        Ok(())
    } else {
        Err(Error::Store {
            message: POOLING_PROXY.into(),
            source: None,
        })
    }
}

fn decode<T>(row: &PgRow, read: impl FnOnce(&PgRow) -> sqlx::Result<T>) -> Result<T> {
    read(row).map_err(|e| sql_error("decoding the server's answer", e))
}

/// A statement that grants `target` and bumps its fence, with the parameters every such statement
/// starts with: the lock id, the namespace, the fence key, the TTL in ms and the owner.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

impl PostgresStore {
    /// A granting statement: its first five parameters ($1 lock id, $2 namespace, $3 key,
    /// $4 TTL ms, $5 owner), then the statement's own (`rest`), then, where the fence table
    /// has the column, the label last.
    fn grant<'q>(
        &self,
        sql: &'q Labelled,
        target: &'q Target,
        ttl: Duration,
        owner: OwnerId,
        rest: impl FnOnce(PgQuery<'q>) -> PgQuery<'q>,
    ) -> PgQuery<'q> {
        let labels = self.sessions.has_label_column();
        let query = sqlx::query(sql.get(labels))
            .bind(target.lock_id)
            .bind(&target.namespace)
            .bind(&target.fence_key)
            .bind(millis(ttl))
            .bind(owner.to_string());
        let query = rest(query);
        if labels {
            query.bind(target.stored_label(owner))
        } else {
            query
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

// ---- the contract ---------------------------------------------------------------------------

#[async_trait]
impl raw::Store for PostgresStore {
    fn name(&self) -> &'static str {
        crate::POSTGRES.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_min_ttl(MIN_TTL)
            .with_frees_on_disconnect(true)
            .with_notified_wait(true)
            // PostgreSQL's lock queue is first come, first served: see the crate docs.
            .with_fair_queue(true)
            .with_evict(true)
            .with_shared(true)
            .with_permits(true)
            .with_max_ttl(self.sessions.config.max_ttl())
            .with_retention(self.sessions.config.retention())
            .with_labels(self.sessions.has_label_column())
            .with_listing(true)
    }

    /// One read: the fence rows under the prefix whose key's lock a session holds, then each
    /// one's status.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future closes the session the read runs on, nothing else.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.list_page(prefix, from, limit).await
    }

    /// An exclusive attempt is one statement; a reader takes the key's lock shared
    /// (`pg_try_advisory_lock_shared`), a permit takes it shared and one of `limit` slot locks
    /// (see the crate docs, "Shared leases and semaphore permits"). An exclusive wait waits in
    /// PostgreSQL's own lock queue (`pg_advisory_xact_lock` under `lock_timeout`, the session's
    /// lock taken once granted), so the server wakes the waiter the moment the holder releases
    /// or its session ends. A reader or permit waits in that queue for the key's lock: shared
    /// behind any waiting writer, exclusively (as a writer, so every later request queues
    /// behind it) while the other group holds the key; while a full semaphore holds it, in
    /// the queue of one slot, looking again at least every 200 ms (the fallback for a slot
    /// freed elsewhere or a session the server ended). Whatever the wait
    /// holds is bounded by the server with the TTL: a waiter silent for its TTL (a stopped
    /// process) loses its session and all it held, and when it runs again it waits on, within
    /// the wait, on a new session (see the crate docs, "What the server bounds, and by what").
    ///
    /// # Cancel safety
    /// The attempt runs on a session owned by the future. Dropping the future closes that
    /// connection, and the server frees whatever the attempt took as soon as it reads the
    /// close, at the latest when the session has been silent for the TTL. A dropped wait also
    /// terminates the waiting backend from a spawned task (matched by pid and by the lock it
    /// waits for), so a dropped waiter never takes the lock later; should that task fail, the
    /// backend notices the closed connection within 500 ms (`client_connection_check_interval`).
    /// A lock granted in the instant of the drop is freed when the server reads the close.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let target =
            Target::hashed(&self.sessions.config.space(), request.key).labelled(request.label);
        let (ttl, mode) = (request.ttl, request.mode);
        match request.wait {
            None => self.try_in(&target, ttl, mode).await,
            Some(wait) => self.wait_in(&target, ttl, wait, mode).await,
        }
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

    /// One statement on the lease's own session: a compare-and-set on the key's fence row,
    /// which this backend must have bumped last and still hold the lock of. A reader or permit
    /// that another holder joined after (the row is that holder's) gets
    /// [`Error::Unsupported`].
    ///
    /// # Cancel safety
    /// Once sent, the statement runs to its end: dropping the future leaves the old label or
    /// the new one, and closes the lease's session as a dropped extend does (the lease is
    /// then lost).
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        self.relabel_lease(lease, label).await
    }

    fn diagnostics(&self) -> Vec<String> {
        if self.sessions.has_label_column() {
            return Vec::new();
        }
        vec![format!(
            "the fence table {} has no label column: holder labels are not kept; its owner \
             adds it with PostgresConfig::label_column_ddl() ({})",
            self.sessions.config.fence_table(),
            self.sessions.config.label_column_ddl()
        )]
    }

    /// Ends the server session that holds `key`'s lock (in this store's namespace), as an
    /// administrator's `pg_terminate_backend` would, and waits until the backend is gone, so the key is free when this returns. The
    /// holder's lease is revoked within its handle's watch period (see the crate docs, "When a
    /// lock is freed early"), and its next extend or release fails ([`Error::LeaseLost`] /
    /// [`ReleaseOutcome::Lost`]). Returns whether a holder was found. Needs the privilege to
    /// signal that backend (the same role, or `pg_signal_backend`).
    ///
    /// # Cancel safety
    /// The termination may or may not have happened when the future is dropped.
    async fn evict(&self, key: &str) -> Result<bool> {
        self.evict_raw(self.lock_id(key)).await
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.status_of(key).await
    }

    /// The fence table's rows, as [`PostgresStore::fence_rows`] counts them.
    ///
    /// # Errors
    /// As [`PostgresStore::fence_rows`].
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

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.sessions.config.redacted())
            .field("namespace", &self.sessions.config.namespace())
            .field("open_connections", &self.open_connections())
            .field("idle_connections", &self.idle_connections())
            .field("watched_leases", &self.watch.watched_count())
            .field("watch_task_running", &self.watch.task_running())
            .finish()
    }
}
