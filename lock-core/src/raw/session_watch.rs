//! For store implementers: finding out fast that the server ended a held lease's session.
//!
//! A store whose lock lives as long as a server session (a PostgreSQL advisory lock, a MySQL
//! named lock) loses the lock when the server ends that session, and would otherwise learn it
//! only at the lease's next extend. One [`SessionWatch`] per store handle runs one task (one
//! per runtime the handle takes leases on) that,
//! every period, asks the server (through the store's [`LookUp`]) which of the held leases'
//! sessions it still lists, and revokes the [`Revocation`] of each lease whose session is
//! gone, so [`KeepAlive`](crate::KeepAlive) reports the loss at once.
//!
//! The task holds each lease's revocation and session identity, never the lease or its session
//! (holding the session would keep the lock alive). It runs only while the handle has leases
//! to watch, and stops for good once [`SessionWatch::stop`] is called (when the last clone of
//! the handle is dropped), giving back the session it looked on.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::raw::Revocation;

/// The slowest the task looks: a lease whose session the server ended is reported within
/// about this long (plus one look-up), whatever its TTL.
pub const MAX_PERIOD: Duration = Duration::from_secs(1);

/// The fastest the task looks, for the shortest TTLs.
pub const MIN_PERIOD: Duration = Duration::from_millis(10);

/// How often to look for leases of `ttl`: six times per TTL, at least once a second.
pub fn period_for(ttl: Duration) -> Duration {
    (ttl / 6).clamp(MIN_PERIOD, MAX_PERIOD)
}

/// How a store asks its server which sessions are live.
#[async_trait]
pub trait LookUp: Send + Sync + 'static {
    /// A session as the server lists it (an id, and whatever tells a reused id apart).
    /// Sorted and deduplicated by its order before a look-up.
    type Identity: Clone + Ord + Debug + Send + Sync + 'static;

    /// The connection the task looks on, kept between look-ups.
    type Session: Send + 'static;

    /// The sessions among `looked_for` (sorted, no duplicates) that the server lists, on
    /// `session` (opened if `None`; set back to `None` by the task after a failure). An
    /// error concludes nothing: the lease learns at its next extend.
    async fn live(
        &self,
        session: &mut Option<Self::Session>,
        looked_for: &[Self::Identity],
    ) -> Result<Vec<Self::Identity>, String>;

    /// Whether `watched` is among the `live` sessions the server listed. Equality by
    /// default; a store whose listing may hide part of the identity says so here.
    fn is_live(&self, watched: &Self::Identity, live: &[Self::Identity]) -> bool {
        live.contains(watched)
    }

    /// Gives back the session the task looked on, when the task ends while the handle lives.
    fn check_in(&self, session: Self::Session);
}

struct Watched<I> {
    identity: I,
    period: Duration,
    revoked: Revocation,
}

struct Registry<I> {
    next_id: u64,
    watched: HashMap<u64, Watched<I>>,
    /// The runtimes a task of this handle runs on: one each. A runtime being shut down drops
    /// its task only later, in the background, so a lease taken meanwhile on another runtime
    /// must not count on that task (it would be gone without a successor).
    task_runtimes: Vec<tokio::runtime::Id>,
}

/// The leases one store handle watches, and its task. See the [module docs](self).
pub struct SessionWatch<L: LookUp> {
    registry: Mutex<Registry<L::Identity>>,
    /// Cancelled when the last clone of the store handle is dropped.
    handle_dropped: CancellationToken,
}

impl<L: LookUp> std::fmt::Debug for SessionWatch<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionWatch")
            .field("handle_dropped", &self.handle_dropped.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<L: LookUp> Default for SessionWatch<L> {
    fn default() -> Self {
        SessionWatch {
            registry: Mutex::new(Registry {
                next_id: 0,
                watched: HashMap::new(),
                task_runtimes: Vec::new(),
            }),
            handle_dropped: CancellationToken::new(),
        }
    }
}

impl<L: LookUp> SessionWatch<L> {
    /// Nothing watched, no task.
    pub fn new() -> Self {
        Self::default()
    }

    fn registry(&self) -> MutexGuard<'_, Registry<L::Identity>> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the task for good: the store handle is gone.
    pub fn stop(&self) {
        self.handle_dropped.cancel();
    }

    /// Stops watching entry `id` (the lease was released, or dropped).
    pub fn forget(&self, id: u64) {
        self.registry().watched.remove(&id);
    }

    /// A new entry id, taken before the lease exists (the store's lease state carries it).
    pub fn reserve(&self) -> u64 {
        let mut registry = self.registry();
        registry.next_id += 1;
        registry.next_id
    }

    /// How many leases are watched right now.
    pub fn watched_count(&self) -> usize {
        self.registry().watched.len()
    }

    /// Whether a task runs right now (one per runtime the handle took leases on).
    pub fn task_running(&self) -> bool {
        !self.registry().task_runtimes.is_empty()
    }

    /// Watches the session `identity` for a lease of `ttl` as entry `id` (from
    /// [`reserve`](Self::reserve)), revoking `revoked` once the server no longer lists it,
    /// and starts the handle's task (looking through `look_up`) if it is not running.
    /// Outside a Tokio runtime nothing is watched (the lease then learns at its next
    /// extend, as without the task); after [`stop`](Self::stop), neither.
    pub fn add(
        self: &Arc<Self>,
        look_up: &Arc<L>,
        id: u64,
        identity: L::Identity,
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
                identity,
                period: period_for(ttl),
                revoked,
            },
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let here = runtime.id();
            if !registry.task_runtimes.contains(&here) {
                registry.task_runtimes.push(here);
                runtime.spawn(run(self.clone(), look_up.clone(), here));
            }
        }
    }
}

/// The task: every period, one look-up of the watched sessions on a session of the handle's
/// own; ends when nothing is watched or the handle is dropped, giving its session back.
async fn run<L: LookUp>(watch: Arc<SessionWatch<L>>, look_up: Arc<L>, runtime: tokio::runtime::Id) {
    let watch: &SessionWatch<L> = &watch;
    let mut running = Running {
        watch,
        runtime,
        ended: false,
    };
    let mut session: Option<L::Session> = None;
    loop {
        let period = {
            let mut registry = watch.registry();
            match registry.watched.values().map(|w| w.period).min() {
                Some(period) => period,
                None => {
                    // Under the lock that registrations take, so a new lease starts a new task.
                    registry.task_runtimes.retain(|id| *id != runtime);
                    running.ended = true;
                    break;
                }
            }
        };
        tokio::select! {
            () = watch.handle_dropped.cancelled() => break,
            () = tokio::time::sleep(period) => {}
        }
        let looked_for: Vec<L::Identity> = {
            let registry = watch.registry();
            let mut identities: Vec<L::Identity> = registry
                .watched
                .values()
                .map(|w| w.identity.clone())
                .collect();
            identities.sort_unstable();
            identities.dedup();
            identities
        };
        if looked_for.is_empty() {
            continue;
        }
        let live = match look_up.live(&mut session, &looked_for).await {
            Ok(live) => live,
            Err(reason) => {
                // Nothing is concluded from a failed look-up: the next extend tells.
                tracing::debug!(%reason, "could not look up the held leases' sessions");
                session = None;
                continue;
            }
        };
        let mut registry = watch.registry();
        registry.watched.retain(|_, watched| {
            let gone = looked_for.binary_search(&watched.identity).is_ok()
                && !look_up.is_live(&watched.identity, &live);
            if gone {
                tracing::warn!(
                    session = ?watched.identity,
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
        look_up.check_in(session);
    }
}

/// Marks the task stopped when it ends other than by finding nothing to watch: the handle was
/// dropped, or its runtime shut down and dropped it mid-way (a handle shared between runtimes),
/// so the next lease starts a new task instead of relying on a dead one.
struct Running<'a, L: LookUp> {
    watch: &'a SessionWatch<L>,
    runtime: tokio::runtime::Id,
    ended: bool,
}

impl<L: LookUp> Drop for Running<'_, L> {
    fn drop(&mut self) {
        if !self.ended {
            let runtime = self.runtime;
            self.watch
                .registry()
                .task_runtimes
                .retain(|id| *id != runtime);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::LeaseExt;
    use crate::{Lease, OwnerId};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_period_is_a_sixth_of_the_ttl_between_the_bounds() {
        assert_eq!(period_for(Duration::from_secs(30)), MAX_PERIOD);
        assert_eq!(
            period_for(Duration::from_secs(1)),
            Duration::from_nanos(166_666_666)
        );
        assert_eq!(period_for(Duration::from_millis(30)), MIN_PERIOD);
    }

    /// A server that lists the sessions in `live`, counting look-ups and check-ins.
    struct Listed {
        live: Mutex<Vec<u32>>,
        look_ups: AtomicUsize,
        checked_in: AtomicUsize,
    }

    #[async_trait]
    impl LookUp for Listed {
        type Identity = u32;
        type Session = ();

        async fn live(
            &self,
            session: &mut Option<()>,
            looked_for: &[u32],
        ) -> Result<Vec<u32>, String> {
            *session = Some(());
            self.look_ups.fetch_add(1, Ordering::SeqCst);
            let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            Ok(looked_for
                .iter()
                .filter(|s| live.contains(s))
                .copied()
                .collect())
        }

        fn check_in(&self, (): ()) {
            self.checked_in.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A server listing the sessions `live`, nothing looked up or checked in yet.
    fn listed(live: Vec<u32>) -> Arc<Listed> {
        Arc::new(Listed {
            live: Mutex::new(live),
            look_ups: AtomicUsize::new(0),
            checked_in: AtomicUsize::new(0),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_session_revokes_its_lease_only_and_the_task_ends_with_the_last() {
        let server = listed(vec![1, 2]);
        let watch = Arc::new(SessionWatch::<Listed>::new());
        let ttl = Duration::from_secs(3);
        let lease = |token| {
            Lease::new(
                "k",
                OwnerId::random(),
                token,
                ttl,
                tokio::time::Instant::now(),
            )
        };
        let (first, second) = (lease(1), lease(2));
        let (a, b) = (watch.reserve(), watch.reserve());
        watch.add(&server, a, 1, ttl, first.revocation());
        watch.add(&server, b, 2, ttl, second.revocation());
        assert!(watch.task_running());

        tokio::time::sleep(period_for(ttl) * 2).await;
        assert!(server.look_ups.load(Ordering::SeqCst) >= 1);
        assert!(!first.revocation().is_revoked() && !second.revocation().is_revoked());

        server.live.lock().unwrap().retain(|s| *s != 1);
        tokio::time::sleep(period_for(ttl) * 2).await;
        assert!(first.revocation().is_revoked(), "session 1 is gone");
        assert!(!second.revocation().is_revoked(), "session 2 is live");
        assert_eq!(watch.watched_count(), 1);

        watch.forget(b);
        tokio::time::sleep(period_for(ttl) * 2).await;
        assert!(!watch.task_running(), "nothing left to watch");
        assert_eq!(server.checked_in.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn after_stop_nothing_is_watched_and_the_session_is_dropped() {
        let server = listed(vec![]);
        let watch = Arc::new(SessionWatch::<Listed>::new());
        let ttl = Duration::from_secs(3);
        let held = Lease::new("k", OwnerId::random(), 1, ttl, tokio::time::Instant::now());
        server.live.lock().unwrap().push(7);
        watch.add(&server, watch.reserve(), 7, ttl, held.revocation());
        tokio::time::sleep(period_for(ttl) * 2).await;
        watch.stop();
        tokio::time::sleep(period_for(ttl) * 2).await;
        assert!(!watch.task_running());
        assert_eq!(server.checked_in.load(Ordering::SeqCst), 0);
        watch.add(&server, watch.reserve(), 7, ttl, held.revocation());
        assert_eq!(watch.watched_count(), 1, "the entry before stop is kept");
        assert!(!watch.task_running(), "no task after stop");
    }

    /// A handle shared between runtimes: the first runtime's task can no longer run (a
    /// runtime being shut down drops it only later, in the background; here a current-thread
    /// runtime nobody drives stands for it), and a lease taken on another runtime meanwhile is
    /// still watched, by a task of its own runtime.
    #[test]
    fn a_lease_on_another_runtime_is_watched_while_the_first_runtimes_task_cannot_run() {
        let server = listed(vec![1]);
        let watch = Arc::new(SessionWatch::<Listed>::new());
        let ttl = Duration::from_secs(3);
        let lease = |token| {
            Lease::new(
                "k",
                OwnerId::random(),
                token,
                ttl,
                tokio::time::Instant::now(),
            )
        };
        let current_thread = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("runtime")
        };
        let stalled = current_thread();
        let first = stalled.block_on(async { lease(1) });
        stalled.block_on(async {
            watch.add(&server, watch.reserve(), 1, ttl, first.revocation());
        });
        // `stalled` is never driven again: its task never looks.
        let second = current_thread().block_on(async {
            let second = lease(2);
            watch.add(&server, watch.reserve(), 2, ttl, second.revocation());
            tokio::time::sleep(period_for(ttl) * 3).await;
            second
        });
        assert!(
            second.revocation().is_revoked(),
            "session 2 is not listed, so a task on the second runtime revoked its lease"
        );
        assert!(!first.revocation().is_revoked());
        drop(stalled);
    }
}
