//! Leader election on any [`LockStore`]: the leader holds the election's key with its value as
//! the holder's label, and its term is the lease's fencing token.
//!
//! See `docs/election.md` for the guarantees, what a paused leader can still do, and each
//! store's bounds.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::limits::MAX_WAIT;
use crate::raw::validate::{check_key_named, check_label};
use crate::{
    DynLockStore, Error, FencingToken, Instant, KeyStatus, Lease, LockGuard, LockStore,
    LockStoreExt, ReleaseOutcome, Result, DEFAULT_TTL,
};

/// An election: the candidates that campaign under one name on one store. Built by
/// [`LockStoreExt::election`]; cheap to clone.
///
/// The leader holds the election's key (the name) exclusively, with its value as the holder's
/// label, so `lockctl status NAME` shows it too. Its term is the lease's fencing token: every
/// term is strictly greater than every earlier term of the election, so a resource that checks
/// terms (a [`FenceGate`](crate::FenceGate)) refuses a leader that was replaced, even one that
/// paused past its lease and does not know yet.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::sync::Arc;
/// use fencelock_core::{DynLockStore, LockStoreExt, MemoryStore};
///
/// let store: DynLockStore = Arc::new(MemoryStore::new());
/// let election = store.election("scheduler");
/// let leading = election.campaign("host-a:8080").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!((leader.term, leader.value.as_deref()), (leading.term(), Some("host-a:8080")));
/// leading.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    store: DynLockStore,
    name: String,
    ttl: Duration,
}

/// The current leader of an election, as [`Election::leader`] and [`Observer::next`] report
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's value (the label of its lease), or `None` where the store keeps no labels
    /// ([`Capabilities::labels`](crate::Capabilities::labels)).
    pub value: Option<String>,
    /// The leader's term: its lease's fencing token (0 where the store cannot tell).
    pub term: u64,
    /// How long the store keeps the leader's lease without an extend, where it can tell.
    pub remaining: Option<Duration>,
}

impl Leader {
    /// The leader a status reports, if the key is held exclusively.
    fn from_status(status: &KeyStatus) -> Option<Leader> {
        match status {
            KeyStatus::Held {
                token,
                remaining,
                label,
                ..
            } => Some(Leader {
                value: label.clone(),
                term: token.unwrap_or(0),
                remaining: *remaining,
            }),
            _ => None,
        }
    }
}

impl LockStoreExt for DynLockStore {
    fn lock(&self, key: &str) -> crate::LockRequest {
        crate::LockRequest::new(Arc::clone(self), key)
    }

    fn election(&self, name: &str) -> Election {
        Election::new(Arc::clone(self), name)
    }

    fn lock_all<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) -> crate::LockSetRequest {
        crate::LockSetRequest::new(Arc::clone(self), owned(keys))
    }
}

impl<S: LockStore + 'static> LockStoreExt for Arc<S> {
    fn lock(&self, key: &str) -> crate::LockRequest {
        crate::LockRequest::new(Arc::clone(self) as DynLockStore, key)
    }

    fn election(&self, name: &str) -> Election {
        Election::new(Arc::clone(self) as DynLockStore, name)
    }

    fn lock_all<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) -> crate::LockSetRequest {
        crate::LockSetRequest::new(Arc::clone(self) as DynLockStore, owned(keys))
    }
}

fn owned<K: AsRef<str>>(keys: impl IntoIterator<Item = K>) -> Vec<String> {
    keys.into_iter()
        .map(|key| key.as_ref().to_owned())
        .collect()
}

impl Election {
    fn new(store: DynLockStore, name: &str) -> Self {
        Election {
            store,
            name: name.to_owned(),
            ttl: DEFAULT_TTL,
        }
    }

    /// The leader's lease TTL (default [`DEFAULT_TTL`]): how long the election stays led by a
    /// leader that stopped (crashed, cut off, paused). The leadership extends it at a quarter
    /// of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The election's name: the key its leader holds.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Checks the name and `value` as a campaign would, sending nothing: for a caller that
    /// wants one clear line before it starts.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for an empty or over-long name or
    /// value (see [`limits`](crate::limits)), or a value with a control character.
    pub fn check(&self, value: &str) -> Result<()> {
        check_key_named("election name", &self.name)?;
        check_label("value", value)
    }

    /// Waits, however long it takes, until this candidate leads with `value`, through the
    /// store's transient outages, and returns its [`Leadership`]. Candidates are served in the
    /// store's wait order ([`Capabilities::fair_queue`](crate::Capabilities::fair_queue)).
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name, value or TTL (nothing
    /// is sent); [`Store`](crate::ErrorKind::Store) and any other error that cannot be retried.
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the candidacy: the store's waiter stops waiting and
    /// leaves nothing queued. A leadership the store granted but whose reply was not yet read
    /// is lost with it and ends at its TTL, as a dropped acquire's lease does.
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        self.campaign_until(value, None).await
    }

    /// As [`Election::campaign`], giving up after `wait`.
    ///
    /// # Errors
    /// As [`Election::campaign`], and [`Contended`](crate::ErrorKind::Contended)
    /// ([`Error::WaitTimedOut`]) when another candidate still leads after `wait`.
    ///
    /// # Cancel safety
    /// As [`Election::campaign`].
    pub async fn campaign_for(&self, value: &str, wait: Duration) -> Result<Leadership> {
        crate::raw::validate::check_wait(wait)?;
        self.campaign_until(value, Some(Instant::now() + wait))
            .await
    }

    async fn campaign_until(&self, value: &str, deadline: Option<Instant>) -> Result<Leadership> {
        self.check(value)?;
        let mut failures = 0u32;
        loop {
            let wait = deadline.map_or(MAX_WAIT, |at| at.saturating_duration_since(Instant::now()));
            let request = self
                .store
                .lock(&self.name)
                .ttl(self.ttl)
                .label(value)
                .wait(wait.max(Duration::from_millis(1)));
            match request.acquire().await {
                Ok(guard) => {
                    return Ok(Leadership {
                        guard,
                        name: self.name.clone(),
                    })
                }
                Err(Error::WaitTimedOut { .. }) if deadline.is_none() => failures = 0,
                Err(error) if error.is_retryable() && !past(deadline) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(election = %self.name, %error, "campaign failed, will retry");
                    let pause = backoff(failures, self.ttl);
                    let pause = deadline.map_or(pause, |at| {
                        pause.min(at.saturating_duration_since(Instant::now()))
                    });
                    tokio::time::sleep(pause).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The current leader, or `None` when nobody leads.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name; those of
    /// [`LockStore::status`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        check_key_named("election name", &self.name)?;
        let status = self.store.status(&self.name).await?;
        Ok(Leader::from_status(&status))
    }

    /// The leader as it changes: [`Observer::next`] yields the current state first, then each
    /// change.
    pub fn observe(&self) -> Observer {
        Observer {
            store: Arc::clone(&self.store),
            name: self.name.clone(),
            seen: None,
            last_term: None,
            ended: false,
        }
    }

    /// A service's leader loop: campaigns with `value`, runs `work` while leading, stops it
    /// (drops its future) once leadership is lost, resigns when it returns, waits a moment and
    /// campaigns again, until the returned future is dropped.
    ///
    /// `work` gets the term as a [`Term`]: pass [`Term::fencing_token`] with every write, so
    /// the resource refuses this leader once another one wrote.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fencelock_core::Result<()> {
    /// # use std::sync::Arc;
    /// # use fencelock_core::{DynLockStore, LockStoreExt, MemoryStore};
    /// # let store: DynLockStore = Arc::new(MemoryStore::new());
    /// # let _ = tokio::time::timeout(std::time::Duration::from_millis(10), async {
    /// store.election("scheduler").serve("host-a:8080", |term| async move {
    ///     println!("leading in term {}", term.fencing_token());
    ///     term.lost().await; // the work: here, lead until replaced
    /// }).await?;
    /// # Ok::<(), fencelock_core::Error>(()) }).await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Only those a campaign cannot retry: [`InvalidInput`](crate::ErrorKind::InvalidInput)
    /// for a bad name, value or TTL, [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future drops the work and resigns (in the background, as a dropped
    /// [`Leadership`] does) or withdraws the candidacy.
    pub async fn serve<F, Fut>(&self, value: &str, mut work: F) -> Result<Infallible>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let leadership = self.campaign(value).await?;
            let term = Term {
                term: leadership.term(),
                lost: leadership.lost_token(),
            };
            let outcome = leadership.run(work(term)).await;
            let lost = outcome.is_err();
            if let Err(error) = leadership.resign().await {
                tracing::debug!(election = %self.name, %error, "resign failed; the lease ends at its TTL");
            }
            // A lost leader stands back a moment so a healthier candidate can take over.
            let pause = if lost {
                self.ttl / 10
            } else {
                Duration::from_millis(10)
            };
            tokio::time::sleep(pause.mul_f64(rand::random_range(0.5..1.0))).await;
        }
    }
}

fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|at| Instant::now() >= at)
}

/// Exponential from 50 ms, at most a tenth of the TTL, jittered by half.
fn backoff(failures: u32, ttl: Duration) -> Duration {
    let base = Duration::from_millis(50).saturating_mul(1 << failures.min(10));
    base.min(ttl / 10)
        .max(Duration::from_millis(10))
        .mul_f64(rand::random_range(0.5..1.0))
}

/// This candidate's leadership of an election: the guard of its lease, with its term.
///
/// It keeps itself alive in the background; [`Leadership::lost`] completes once it is lost
/// (the store said so, or no extend was confirmed before the local deadline).
/// **Dropping it resigns**, in the background, as dropping a [`LockGuard`] releases; call
/// [`Leadership::resign`] to know the outcome.
#[derive(Debug)]
#[must_use = "dropping a leadership resigns it"]
pub struct Leadership {
    guard: LockGuard,
    name: String,
}

impl Leadership {
    /// The term: the lease's fencing token, strictly greater than every earlier term of this
    /// election. Pass it with every write the leader makes.
    pub fn term(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// The leader's value: what it campaigned with, or last proclaimed.
    pub fn value(&self) -> Arc<str> {
        self.guard.lease().label().unwrap_or_default()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease behind the leadership.
    pub fn lease(&self) -> &Lease {
        self.guard.lease()
    }

    /// Completes once leadership is lost: stop leading.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing, and a later call still completes.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// A token cancelled once leadership is lost, to hand to other tasks.
    pub fn lost_token(&self) -> CancellationToken {
        self.guard.lost_token()
    }

    /// Whether leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Runs `work` while leading: its output, or [`Error::LeaseLost`] as soon as leadership is
    /// lost, when `work` is dropped at its next await point. Its writes must still carry the
    /// term: a paused process cannot be stopped in time.
    ///
    /// # Errors
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost) when leadership is lost before `work`
    /// finishes.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work`; the leadership stays.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        self.guard.run(work).await
    }

    /// Changes the leader's value without giving up the term: a compare-and-set on its own
    /// lease. Observers see the new value.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad value;
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost) when this leadership is over;
    /// [`Unsupported`](crate::ErrorKind::Unsupported) where the store keeps no labels;
    /// [`Unavailable`](crate::ErrorKind::Unavailable) (the value may or may not have changed).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the old value or the new one; [`Leadership::value`] moves
    /// only once the store answered.
    pub async fn proclaim(&self, value: &str) -> Result<()> {
        check_label("value", value)?;
        self.guard.store().relabel(self.guard.lease(), value).await
    }

    /// Gives up leadership: the next candidate leads at once (woken by the store's
    /// notification where it has one). [`ReleaseOutcome::Lost`] if it was already lost.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// Dropping the future may leave the leadership held until its TTL.
    pub async fn resign(self) -> Result<ReleaseOutcome> {
        self.guard.release().await
    }
}

impl FencingToken for Leadership {
    fn fencing_token(&self) -> u64 {
        self.term()
    }
}

/// A term of [`Election::serve`]'s loop, handed to the work it runs while leading.
#[derive(Debug, Clone)]
pub struct Term {
    term: u64,
    lost: CancellationToken,
}

impl Term {
    /// The term: pass it with every write.
    pub fn fencing_token(&self) -> u64 {
        self.term
    }

    /// Completes once this term's leadership is lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Whether this term's leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

impl FencingToken for Term {
    fn fencing_token(&self) -> u64 {
        self.term
    }
}

/// The leader of an election as it changes, from [`Election::observe`].
#[derive(Debug)]
pub struct Observer {
    store: DynLockStore,
    name: String,
    /// The status last read, `None` before the first.
    seen: Option<KeyStatus>,
    /// The highest term yielded, and whether its end (no leader, or a later term) was too.
    last_term: Option<u64>,
    ended: bool,
}

impl Observer {
    /// The current leader on the first call, then the next change: a new leader, a proclaimed
    /// value, or `None` once nobody leads. Changes may be coalesced, and it never yields a
    /// state older than one it yielded (a lower term, or a term that already ended). Through a
    /// transient outage it keeps trying, and resumes with the current state.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name, and any store error
    /// that cannot be retried; the observer is then over.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses no change that a later call would not report.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        check_key_named("election name", &self.name)?;
        let mut failures = 0u32;
        loop {
            let read = match &self.seen {
                None => self.store.status(&self.name).await,
                Some(seen) => {
                    let until = Instant::now() + Duration::from_secs(60);
                    self.store.next_status(&self.name, seen, until).await
                }
            };
            let status = match read {
                Ok(status) => status,
                Err(error) if error.is_retryable() => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(election = %self.name, %error, "observe failed, will retry");
                    tokio::time::sleep(backoff(failures, Duration::from_secs(10))).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            failures = 0;
            let first = self.seen.is_none();
            let changed = first || !self.seen.as_ref().is_some_and(|s| s.same_holders(&status));
            self.seen = Some(status.clone());
            if !changed {
                continue;
            }
            let leader = Leader::from_status(&status);
            match &leader {
                // A term of 0 is one the store cannot tell: it is ordered by nothing, and
                // yielded whenever the holders change.
                Some(leader) if leader.term == 0 => self.ended = false,
                Some(leader) => {
                    let older = self.last_term.is_some_and(|last| {
                        leader.term < last || (leader.term == last && self.ended)
                    });
                    if older {
                        continue;
                    }
                    self.ended = false;
                    self.last_term = Some(leader.term);
                }
                None => {
                    if self.ended && !first {
                        continue;
                    }
                    self.ended = true;
                }
            }
            return Ok(leader);
        }
    }
}
