//! The shortest correct way to hold a lock: `store.lock(key).await?` gives a [`LockGuard`] that
//! keeps its lease alive, says when it is lost, and releases on [`LockGuard::release`] or drop.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::kind::BoxFuture;
use crate::raw::AcquireRequest;
use crate::{
    DynLockStore, Error, FencingToken, KeepAlive, Lease, LockStore, Mode, ReleaseOutcome, Result,
};

/// The TTL of a [`LockRequest`] that does not set one: 30 s, kept alive every 7.5 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// `lock(key)` on every store held in an [`Arc`], including what `fencelock::connect` returns.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use fencelock_core::{DynLockStore, LockStoreExt, MemoryStore, ReleaseOutcome};
///
/// let store: DynLockStore = Arc::new(MemoryStore::new());
/// let guard = store.lock("nightly-export").wait(Duration::from_secs(10)).await?;
/// // ... pass guard.fencing_token() with every write, stop when guard.lost() completes ...
/// assert_eq!(guard.release().await?, ReleaseOutcome::Released); // Lost: it had run out
/// # Ok(()) }
/// ```
pub trait LockStoreExt {
    /// A request for `key`: exclusive, with a TTL of [`DEFAULT_TTL`] and one attempt (no wait)
    /// unless its builder methods say otherwise. Await it (or call
    /// [`LockRequest::acquire`]) for a [`LockGuard`].
    fn lock(&self, key: &str) -> LockRequest;

    /// The election `name` (the key its leader holds): campaign, observe, find its leader.
    /// See [`Election`](crate::Election).
    fn election(&self, name: &str) -> crate::Election;

    /// A request for every key of `keys` at once, or none: exclusive, with a TTL of
    /// [`DEFAULT_TTL`] and one attempt per key unless its builder methods say otherwise. Await
    /// it for a [`LockSetGuard`](crate::LockSetGuard). See
    /// [`LockSetRequest`](crate::LockSetRequest).
    fn lock_all<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) -> crate::LockSetRequest;
}

/// A lock request being built: `store.lock(key).ttl(..).wait(..).mode(..)`, then `.await` for
/// a [`LockGuard`], or hand it to [`with_lock`](crate::with_lock). The one builder of what an
/// acquire asks for.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockRequest {
    store: DynLockStore,
    key: String,
    ttl: Duration,
    wait: Duration,
    mode: Mode,
    label: Option<String>,
}

impl LockRequest {
    pub(crate) fn new(store: DynLockStore, key: &str) -> Self {
        LockRequest {
            store,
            key: key.to_owned(),
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            mode: Mode::Exclusive,
            label: None,
        }
    }

    /// The lease's TTL (default [`DEFAULT_TTL`]): how long the key stays held if this process
    /// stops keeping it alive. The guard extends it at a quarter of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for the key (default zero: one attempt, [`Error::Busy`] if held).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lock mode (default [`Mode::Exclusive`]): a reader ([`Mode::Shared`]) or a
    /// semaphore permit ([`Mode::Permit`]) where the store keeps them.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// A label kept beside the holder (default none): 1 to
    /// [`MAX_LABEL_LEN`](crate::limits::MAX_LABEL_LEN) bytes of UTF-8 without control
    /// characters, such as `host-a pid 4242`. Where [`Capabilities::labels`](crate::Capabilities::labels)
    /// says so, [`LockStore::status`] reports it, so an operator sees who holds the key;
    /// elsewhere it stays on the lease ([`Lease::label`]).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// What the store is asked: a zero wait is one attempt ([`Error::Busy`] if the key is
    /// held), any other wait waits ([`Error::WaitTimedOut`]).
    fn request(&self) -> AcquireRequest<'_> {
        let mut request = AcquireRequest::new(&self.key, self.ttl).mode(self.mode);
        if let Some(label) = &self.label {
            request = request.label(label);
        }
        if self.wait.is_zero() {
            request
        } else {
            request.wait(self.wait)
        }
    }

    /// The store the request goes to.
    pub(crate) fn store(&self) -> &dyn LockStore {
        &*self.store
    }

    /// The same request for `key`, waiting at most `wait`.
    pub(crate) fn for_key(&self, key: &str, wait: Duration) -> LockRequest {
        LockRequest {
            key: key.to_owned(),
            wait,
            ..self.clone()
        }
    }

    pub(crate) fn ttl_asked(&self) -> Duration {
        self.ttl
    }

    pub(crate) fn wait_asked(&self) -> Duration {
        self.wait
    }

    pub(crate) fn mode_asked(&self) -> Mode {
        self.mode
    }

    pub(crate) fn label_asked(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Acquires the key and returns the bare lease: nothing keeps it alive. For a caller that
    /// keeps it itself ([`KeepAlive::start`]); most want [`LockRequest::acquire`].
    ///
    /// # Errors
    /// Those of [`LockStore::try_acquire_as`] without a wait, of [`LockStore::acquire_as`]
    /// with one: [`Contended`](crate::ErrorKind::Contended) when the key stays held,
    /// [`Unavailable`](crate::ErrorKind::Unavailable), [`InvalidInput`](crate::ErrorKind::InvalidInput),
    /// [`Unsupported`](crate::ErrorKind::Unsupported) for a mode the store does not keep,
    /// [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// As for the store's acquire: dropping the future may lose a lease the store granted but
    /// whose reply was not yet read; it expires at its TTL.
    pub async fn lease(&self) -> Result<Lease> {
        self.store.acquire_request(self.request()).await
    }

    /// Acquires the key and starts keeping the lease alive on the current tokio runtime.
    ///
    /// # Errors
    /// As [`LockRequest::lease`].
    ///
    /// # Cancel safety
    /// As for the store's acquire: dropping the future may lose a lease the store granted but
    /// whose reply was not yet read; it expires at its TTL.
    ///
    /// # Panics
    /// Outside a tokio runtime (the keep-alive is a task on it).
    pub async fn acquire(self) -> Result<LockGuard> {
        let lease = self.lease().await?;
        let store = self.store;
        let keep_alive = KeepAlive::start(Arc::clone(&store), lease);
        Ok(LockGuard {
            store,
            keep_alive: Some(keep_alive),
        })
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard>;
    type IntoFuture = BoxFuture<'static, Result<LockGuard>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

/// A held lock: its lease, kept alive in the background until it is released, dropped or lost.
///
/// - [`LockGuard::fencing_token`]: pass it with every write to the protected resource.
/// - [`LockGuard::lost`] completes, [`LockGuard::lost_token`] is cancelled and
///   [`LockGuard::run`] stops its work once the lease is lost (the store said so, or no extend
///   was confirmed before the local deadline).
/// - [`LockGuard::release`] gives the key back and says whether the lease was still held.
///
/// **Dropping a guard releases the key in the background, not at once.** The drop stops the
/// keep-alive and spawns the release on the current tokio runtime, which sends it as soon as a
/// worker runs it: another waiter gets the key about one round trip later. Without a runtime,
/// or when the runtime shuts down before the task runs, nothing is sent and the lease expires at
/// its TTL. Call [`LockGuard::release`] to know the outcome.
///
/// The guard owns what it needs (an `Arc` of the store), so it is `Send + 'static` and can move
/// into a task.
#[derive(Debug)]
#[must_use = "dropping a guard releases the lock (in the background, not at once)"]
pub struct LockGuard {
    store: DynLockStore,
    /// `None` once released.
    keep_alive: Option<KeepAlive>,
}

impl LockGuard {
    /// The store that holds the lease.
    pub(crate) fn store(&self) -> &dyn LockStore {
        &*self.store
    }

    fn keep_alive(&self) -> &KeepAlive {
        // Only `release`, which consumes the guard, and `drop` take it.
        self.keep_alive
            .as_ref()
            .expect("a live guard keeps its keep-alive")
    }

    /// The lease: key, owner, fencing token, mode, local deadline.
    pub fn lease(&self) -> &Lease {
        self.keep_alive().lease()
    }

    /// The fencing token: pass it with every write to the protected resource.
    pub fn fencing_token(&self) -> u64 {
        self.lease().fencing_token()
    }

    /// Completes once the lease is lost: stop the work it protects.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing, and a later call still completes.
    pub async fn lost(&self) {
        self.keep_alive().lost().await
    }

    /// A token cancelled once the lease is lost, to hand to other tasks.
    pub fn lost_token(&self) -> CancellationToken {
        self.keep_alive().lost_token()
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.keep_alive().is_lost()
    }

    /// Runs `work` under the lease: its output, or [`Error::LeaseLost`] (kind
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost)) as soon as the lease is lost, when `work` is
    /// dropped at its next await point. Its writes must still carry the fencing token: a
    /// paused process cannot be stopped in time.
    ///
    /// # Errors
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost) when the lease is lost before `work`
    /// finishes (the store's own reason, or its error as the source). `work`'s own errors are
    /// in its output.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work`; the lease stays held.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        tokio::select! {
            biased;
            () = self.lost() => Err(self.lost_error()),
            output = work => Ok(output),
        }
    }

    pub(crate) fn lost_error(&self) -> Error {
        self.keep_alive()
            .lost_error()
            .unwrap_or_else(|| Error::lost(self.lease(), "the keep-alive stopped"))
    }

    /// Stops the keep-alive and releases the key: [`ReleaseOutcome::Released`], or
    /// [`ReleaseOutcome::Lost`] if the lease had already expired or been taken.
    ///
    /// # Errors
    /// As [`LockStore::release`]:
    /// [`Unavailable`](crate::ErrorKind::Unavailable) when the store did not answer (the lease
    /// then expires at its TTL), [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lease held; it then expires at its TTL.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        let keep_alive = self
            .keep_alive
            .take()
            .expect("a live guard keeps its keep-alive");
        let lease = keep_alive.stop().await;
        self.store.release(&lease).await
    }
}

impl FencingToken for LockGuard {
    fn fencing_token(&self) -> u64 {
        LockGuard::fencing_token(self)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(keep_alive) = self.keep_alive.take() else {
            return;
        };
        // Without a runtime nothing can be sent: the lease expires at its TTL (and dropping the
        // keep-alive stops its extends).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            runtime.spawn(async move {
                let lease = keep_alive.stop().await;
                if let Err(error) = store.release(&lease).await {
                    tracing::debug!(key = lease.key(), %error, "a dropped guard's release failed; the lease expires at its TTL");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{ErrorKind, MemoryStore};

    fn store() -> DynLockStore {
        Arc::new(MemoryStore::new())
    }

    #[test]
    fn a_guard_can_move_into_a_task() {
        fn send_static<T: Send + 'static>() {}
        send_static::<LockGuard>();
        send_static::<LockRequest>();
    }

    #[tokio::test]
    async fn a_guard_holds_the_key_and_its_release_frees_it() {
        let store = store();
        let guard = store.lock("k").await.unwrap();
        let err = store.lock("k").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
        let token = guard.fencing_token();
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        let next = store.lock("k").acquire().await.unwrap();
        assert!(next.fencing_token() > token);
    }

    /// The issue's test: with a 30 s TTL, after an early `?` drops a guard, another handle
    /// gets the key within 5 s (a sixth of the TTL: only the background release can free it).
    #[tokio::test]
    async fn a_guard_dropped_by_an_early_return_frees_the_key_long_before_its_ttl() {
        async fn job(store: &DynLockStore, token: &mut u64) -> Result<()> {
            let guard = store.lock("job").ttl(Duration::from_secs(30)).await?;
            *token = guard.fencing_token();
            Err(Error::invalid("input", "the job failed half-way"))?;
            Ok(())
        }
        let store = store();
        let mut dropped = 0;
        assert!(job(&store, &mut dropped).await.is_err());
        let started = tokio::time::Instant::now();
        let lease = store
            .acquire("job", Duration::from_secs(30), Duration::from_secs(5))
            .await
            .expect("the dropped guard's key is free within 5 s");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(lease.fencing_token() > dropped);
    }

    #[tokio::test(start_paused = true)]
    async fn run_stops_its_work_once_the_lease_is_lost() {
        let store = store();
        let guard = store.lock("k").ttl(Duration::from_secs(4)).await.unwrap();
        assert!(store.evict("k").await.unwrap(), "an operator frees the key");
        let err = guard
            .run(std::future::pending::<()>())
            .await
            .expect_err("the work outlived its lease");
        assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
        assert!(guard.is_lost() && guard.lost_token().is_cancelled());
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Lost);
    }

    #[tokio::test]
    async fn a_guard_takes_the_mode_asked() {
        let store = store();
        let first = store.lock("k").mode(Mode::Shared).await.unwrap();
        let second = store.lock("k").mode(Mode::Shared).await.unwrap();
        assert_eq!(first.lease().mode(), Mode::Shared);
        assert!(store.lock("k").await.is_err());
        drop((first, second));
    }
}
