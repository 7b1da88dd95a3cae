//! Finding out fast that the server ended a lease's session: one task per store handle looks
//! up the backends of the held leases in `pg_stat_activity` and cancels the
//! [`Lease::revocation`](fencelock_core::Lease::revocation) of each lease whose backend is
//! gone, so [`KeepAlive`](fencelock_core::KeepAlive) reports the loss at once instead of at its next
//! extend.
//!
//! The task holds each lease's token and backend identity, never the lease or its session
//! (holding the session would keep the lock alive). It runs only while the handle has leases
//! to watch, and stops when the last clone of the handle is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fencelock_core::Revocation;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

use crate::error::bounded;
use crate::session::{Checkout, Session, Sessions};
use crate::sql::LIVE_BACKENDS;

/// The slowest the task looks: a lease whose session the server ended is reported within
/// about this long (plus one query), whatever its TTL.
pub(crate) const MAX_PERIOD: Duration = Duration::from_secs(1);

/// The fastest the task looks, for the shortest TTLs.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// How often to look for leases of `ttl`: six times per TTL, at least once a second.
pub(crate) fn period_for(ttl: Duration) -> Duration {
    (ttl / 6).clamp(MIN_PERIOD, MAX_PERIOD)
}

/// The backend a lease's session runs on: its pid, and when it started (µs since the epoch,
/// if the server showed it), so a pid reused by a new backend is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Backend {
    pub(crate) pid: i32,
    pub(crate) started_us: Option<i64>,
}

struct Watched {
    backend: Backend,
    period: Duration,
    revoked: Revocation,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    watched: HashMap<u64, Watched>,
    task_running: bool,
}

/// The leases one store handle watches.
pub(crate) struct Watch {
    registry: Mutex<Registry>,
    /// Cancelled when the last clone of the store handle is dropped.
    handle_dropped: CancellationToken,
}

impl Watch {
    pub(crate) fn new() -> Self {
        Watch {
            registry: Mutex::new(Registry::default()),
            handle_dropped: CancellationToken::new(),
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the task for good: the store handle is gone.
    pub(crate) fn stop(&self) {
        self.handle_dropped.cancel();
    }

    /// Stops watching entry `id` (the lease was released, or dropped).
    pub(crate) fn forget(&self, id: u64) {
        self.registry().watched.remove(&id);
    }

    /// A new entry id, taken before the lease exists (its `Held` carries the id).
    pub(crate) fn reserve(&self) -> u64 {
        let mut registry = self.registry();
        registry.next_id += 1;
        registry.next_id
    }

    /// How many leases are watched right now.
    pub(crate) fn watched_count(&self) -> usize {
        self.registry().watched.len()
    }

    /// Whether the task runs right now.
    pub(crate) fn task_running(&self) -> bool {
        self.registry().task_running
    }
}

impl Watch {
    /// Watches the session on `backend` for a lease of `ttl` as entry `id` (from
    /// [`Watch::reserve`]), revoking `revoked` once the server has ended it, and starts the
    /// handle's task (looking on a session from `sessions`) if it is not running. Outside a
    /// Tokio runtime nothing is watched (the lease then learns at its next extend, as without
    /// the task).
    pub(crate) fn add(
        self: &Arc<Self>,
        sessions: &Arc<Sessions>,
        id: u64,
        backend: Backend,
        ttl: Duration,
        revoked: Revocation,
    ) {
        let mut registry = self.registry();
        if self.handle_dropped.is_cancelled() {
            return;
        }
        registry.watched.insert(
            id,
            Watched {
                backend,
                period: period_for(ttl),
                revoked,
            },
        );
        if !registry.task_running {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                registry.task_running = true;
                runtime.spawn(run(self.clone(), sessions.clone()));
            }
        }
    }
}

/// The task: every period, one query for the watched backends on a session of the handle's
/// own; ends when nothing is watched or the handle is dropped, giving its session back.
async fn run(watch: Arc<Watch>, sessions: Arc<Sessions>) {
    let watch: &Watch = &watch;
    let mut running = Running {
        watch,
        ended: false,
    };
    let mut session: Option<Session> = None;
    loop {
        let period = {
            let mut registry = watch.registry();
            match registry.watched.values().map(|w| w.period).min() {
                Some(period) => period,
                None => {
                    // Under the lock that registrations take, so a new lease starts a new task.
                    registry.task_running = false;
                    running.ended = true;
                    break;
                }
            }
        };
        tokio::select! {
            () = watch.handle_dropped.cancelled() => break,
            () = tokio::time::sleep(period) => {}
        }
        let looked_for: Vec<Backend> = {
            let registry = watch.registry();
            let mut backends: Vec<Backend> = registry.watched.values().map(|w| w.backend).collect();
            backends.sort_unstable_by_key(|b| b.pid);
            backends.dedup();
            backends
        };
        if looked_for.is_empty() {
            continue;
        }
        let live = match look_up(&sessions, &mut session, &looked_for).await {
            Ok(live) => live,
            Err(reason) => {
                // Nothing is concluded from a failed look-up: the next extend tells.
                tracing::debug!(%reason, "could not look up the held sessions' backends");
                session = None;
                continue;
            }
        };
        let mut registry = watch.registry();
        registry.watched.retain(|_, watched| {
            let gone = looked_for.contains(&watched.backend) && !is_live(&watched.backend, &live);
            if gone {
                tracing::warn!(
                    pid = watched.backend.pid,
                    "the server ended a lease's session: the lock is free"
                );
                watched
                    .revoked
                    .revoke("the server ended the lease's session, which freed the lock");
            }
            !gone
        });
    }
    // A dropped handle keeps no idle session for this task's sake.
    if let Some(session) = session.filter(|_| !watch.handle_dropped.is_cancelled()) {
        sessions.checkin(session);
    }
}

/// Marks the task stopped when it ends other than by finding nothing to watch: the handle was
/// dropped, or its runtime shut down and dropped it mid-way (a handle shared between runtimes),
/// so the next lease starts a new task instead of relying on a dead one.
struct Running<'a> {
    watch: &'a Watch,
    ended: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.watch.registry().task_running = false;
        }
    }
}

/// The backend is live if the server lists its pid with the same start time (or without one).
fn is_live(backend: &Backend, live: &[Backend]) -> bool {
    live.iter().any(|seen| {
        seen.pid == backend.pid
            && (seen.started_us.is_none()
                || backend.started_us.is_none()
                || seen.started_us == backend.started_us)
    })
}

/// The backends among `looked_for` that the server lists, on `session` (opened if `None`).
async fn look_up(
    sessions: &Sessions,
    session: &mut Option<Session>,
    looked_for: &[Backend],
) -> Result<Vec<Backend>, String> {
    if session.is_none() {
        let Checkout {
            session: opened, ..
        } = sessions.checkout().await.map_err(|e| e.to_string())?;
        *session = Some(opened);
    }
    let Some(conn) = session.as_mut().map(|s| &mut s.conn) else {
        return Err("no session".into());
    };
    let pids: Vec<i32> = looked_for.iter().map(|b| b.pid).collect();
    let rows = bounded(
        sessions.config.command_timeout,
        sqlx::query(LIVE_BACKENDS).bind(pids).fetch_all(conn),
    )
    .await
    .map_err(|fault| fault.describe())?;
    rows.iter()
        .map(|row| {
            Ok(Backend {
                pid: row.try_get("pid")?,
                started_us: row.try_get("started_us")?,
            })
        })
        .collect::<sqlx::Result<Vec<Backend>>>()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_sixth_of_the_ttl_and_at_most_a_second() {
        assert_eq!(period_for(Duration::from_secs(30)), MAX_PERIOD);
        assert_eq!(
            period_for(Duration::from_secs(3)),
            Duration::from_millis(500)
        );
        assert_eq!(
            period_for(Duration::from_millis(100)),
            Duration::from_nanos(16_666_666)
        );
        assert_eq!(period_for(Duration::from_millis(1)), MIN_PERIOD);
    }

    #[test]
    fn a_reused_pid_is_not_the_watched_backend() {
        let watched = Backend {
            pid: 7,
            started_us: Some(100),
        };
        let same = Backend {
            pid: 7,
            started_us: Some(100),
        };
        let reused = Backend {
            pid: 7,
            started_us: Some(200),
        };
        let hidden = Backend {
            pid: 7,
            started_us: None,
        };
        assert!(is_live(&watched, &[same]));
        assert!(!is_live(&watched, &[reused]));
        assert!(is_live(&watched, &[hidden]));
        assert!(!is_live(&watched, &[]));
    }
}
