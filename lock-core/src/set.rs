//! Several keys at once: `store.lock_all(keys).await?` takes every key or none, within one wait,
//! and gives one [`LockSetGuard`] for the set.
//!
//! The keys are taken one by one in one total order (their bytes), so two callers whose sets
//! overlap never wait for each other in a cycle; each key taken is kept alive while the later
//! ones are waited for. If a key cannot be had in time, or one already taken is lost, every key
//! taken is released before the call returns.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::guard::LockRequest;
use crate::kind::BoxFuture;
use crate::raw::validate::{check_key, check_label, check_mode, check_ttl, check_wait};
use crate::{DynLockStore, Error, Lease, LockGuard, Mode, ReleaseOutcome, Result};

/// A request for a set of keys being built: `store.lock_all(keys).ttl(..).wait(..).mode(..)`,
/// then `.await` for a [`LockSetGuard`]. Every key is asked for as [`LockRequest`] asks for one
/// (one mode, TTL and label for the set); the wait bounds the whole set.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use fencelock_core::{DynLockStore, LockStoreExt, MemoryStore, ReleaseOutcome};
///
/// let store: DynLockStore = Arc::new(MemoryStore::new());
/// let both = store
///     .lock_all(["account:7", "account:3"])
///     .wait(Duration::from_secs(5))
///     .await?;
/// let debit = both.fencing_token("account:7").expect("a key of the set");
/// // ... write each account with its own key's token ...
/// assert!(debit > 0);
/// assert_eq!(both.release().await?, ReleaseOutcome::Released);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockSetRequest {
    /// The TTL, wait, mode and label every key is asked with; its key is unused.
    each: LockRequest,
    keys: Vec<String>,
}

impl LockSetRequest {
    pub(crate) fn new(store: DynLockStore, keys: Vec<String>) -> Self {
        LockSetRequest {
            each: LockRequest::new(store, ""),
            keys,
        }
    }

    /// Each key's TTL (default [`DEFAULT_TTL`](crate::DEFAULT_TTL)), as
    /// [`LockRequest::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.each = self.each.ttl(ttl);
        self
    }

    /// How long to wait for the whole set (default zero: one attempt per key,
    /// [`Error::Busy`] naming the first key held).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.each = self.each.wait(wait);
        self
    }

    /// The mode of every key (default [`Mode::Exclusive`]), as [`LockRequest::mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.each = self.each.mode(mode);
        self
    }

    /// The label of every key's holder, as [`LockRequest::label`].
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.each = self.each.label(label);
        self
    }

    /// Refuses a set that could not be held, before any key is taken: an empty set, a key
    /// twice, a key, TTL, wait, mode or label any one key would be refused for.
    fn check(&mut self) -> Result<()> {
        if self.keys.is_empty() {
            return Err(Error::invalid("keys", "must name at least one key"));
        }
        self.keys.sort_unstable();
        if let Some(twice) = self.keys.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Error::invalid("keys", format!("name {:?} twice", twice[0])));
        }
        for key in &self.keys {
            check_key(key)?;
        }
        let capabilities = self.each.store().capabilities();
        check_ttl(self.each.ttl_asked(), &capabilities)?;
        check_wait(self.each.wait_asked())?;
        check_mode(self.each.mode_asked(), &capabilities)?;
        if let Some(label) = self.each.label_asked() {
            check_label("label", label)?;
        }
        Ok(())
    }

    /// Takes every key in the order of their bytes, each kept alive from the moment it is
    /// taken.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) or
    /// [`Unsupported`](crate::ErrorKind::Unsupported) for a set that could not be held (none
    /// is taken); [`Contended`](crate::ErrorKind::Contended) when a key stays held past the
    /// wait ([`Error::Busy`] without a wait, [`Error::WaitTimedOut`] naming the key and the
    /// whole wait with one); [`LeaseLost`](crate::ErrorKind::LeaseLost) naming a key taken
    /// and lost while a later one was waited for; otherwise a key's acquire error. Every key
    /// taken is released before an error is returned.
    ///
    /// # Cancel safety
    /// Dropping the future releases the keys already taken in the background, as dropping
    /// their [`LockGuard`]s does; a key whose grant was in flight is lost as for the store's
    /// acquire, and expires at its TTL.
    ///
    /// # Panics
    /// Outside a tokio runtime (the keep-alives are tasks on it).
    pub async fn acquire(mut self) -> Result<LockSetGuard> {
        self.check()?;
        let wait = self.each.wait_asked();
        let started = Instant::now();
        let deadline = started + wait;
        let mut held: Vec<LockGuard> = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let taken = if !wait.is_zero() && remaining.is_zero() {
                Err(Error::WaitTimedOut {
                    key: key.clone(),
                    waited: started.elapsed(),
                })
            } else {
                let request = self.each.for_key(key, remaining);
                // A key already taken that is lost meanwhile ends the attempt.
                tokio::select! {
                    biased;
                    lost = any_lost(&held) => Err(held[lost].lost_error()),
                    taken = request.acquire() => taken,
                }
            };
            match taken {
                Ok(guard) => held.push(guard),
                Err(error) => {
                    release_all(held).await;
                    return Err(match error {
                        Error::WaitTimedOut { key, .. } => Error::WaitTimedOut {
                            key,
                            waited: started.elapsed(),
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(LockSetGuard { guards: held })
    }
}

impl IntoFuture for LockSetRequest {
    type Output = Result<LockSetGuard>;
    type IntoFuture = BoxFuture<'static, Result<LockSetGuard>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

/// Gives the keys back, the last taken first; a release that fails leaves its lease to expire
/// at its TTL.
async fn release_all(held: Vec<LockGuard>) {
    for guard in held.into_iter().rev() {
        let key = guard.lease().key().to_owned();
        if let Err(error) = guard.release().await {
            tracing::debug!(%key, %error, "a key of an unfinished set was not released; it expires at its TTL");
        }
    }
}

/// The index of the first guard whose lease is lost; never completes for none.
async fn any_lost(guards: &[LockGuard]) -> usize {
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = guards
        .iter()
        .map(|guard| Box::pin(guard.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>)
        .collect();
    std::future::poll_fn(|cx| {
        for (index, wait) in waits.iter_mut().enumerate() {
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(index);
            }
        }
        Poll::Pending
    })
    .await
}

/// A set of held keys, each with its own lease and fencing token, kept alive together until the
/// set is released, dropped or lost: the loss of any key is the loss of the set.
///
/// Dropping the guard releases every key in the background, as dropping a [`LockGuard`] does.
#[derive(Debug)]
#[must_use = "dropping a guard releases the locks (in the background, not at once)"]
pub struct LockSetGuard {
    /// In the order the keys were taken (their bytes).
    guards: Vec<LockGuard>,
}

impl LockSetGuard {
    /// The keys, in the order they were taken (their bytes).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(|guard| guard.lease().key())
    }

    /// The leases, in the order their keys were taken.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.guards.iter().map(LockGuard::lease)
    }

    /// `key`'s fencing token: pass it with every write to what `key` protects. `None` for a
    /// key not in the set.
    pub fn fencing_token(&self, key: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|guard| guard.lease().key() == key)
            .map(LockGuard::fencing_token)
    }

    /// Completes once any key's lease is lost: stop the work the set protects.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing, and a later call still completes.
    pub async fn lost(&self) {
        any_lost(&self.guards).await;
    }

    /// The first key whose lease is known to be lost, if any.
    pub fn lost_key(&self) -> Option<&str> {
        self.guards
            .iter()
            .find(|guard| guard.is_lost())
            .map(|guard| guard.lease().key())
    }

    /// Why the first key known lost was lost ([`Error::LeaseLost`] naming it), if any is.
    pub fn lost_error(&self) -> Option<Error> {
        self.guards
            .iter()
            .find(|guard| guard.is_lost())
            .map(LockGuard::lost_error)
    }

    /// Whether any key's lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost_key().is_some()
    }

    /// Runs `work` under the set: its output, or [`Error::LeaseLost`] naming the key as soon as
    /// any key's lease is lost, when `work` is dropped at its next await point.
    ///
    /// # Errors
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost) when a key is lost before `work` finishes.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work`; the keys stay held.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        tokio::select! {
            biased;
            lost = any_lost(&self.guards) => Err(self.guards[lost].lost_error()),
            output = work => Ok(output),
        }
    }

    /// Stops every keep-alive and releases every key, the last taken first:
    /// [`ReleaseOutcome::Released`] when each lease was still held, [`ReleaseOutcome::Lost`]
    /// when any had expired or been taken (the work may have overlapped another holder's).
    ///
    /// # Errors
    /// The first key's release error ([`Unavailable`](crate::ErrorKind::Unavailable),
    /// [`Store`](crate::ErrorKind::Store)), once every key was tried; a key not released
    /// expires at its TTL.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the keys not yet released held; each expires at its TTL.
    pub async fn release(self) -> Result<ReleaseOutcome> {
        let mut outcome = ReleaseOutcome::Released;
        let mut failed = None;
        for guard in self.guards.into_iter().rev() {
            match guard.release().await {
                Ok(ReleaseOutcome::Released) => {}
                Ok(lost) => outcome = lost,
                Err(error) => {
                    failed.get_or_insert(error);
                }
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(outcome),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{ErrorKind, KeyStatus, LockStoreExt, MemoryStore};

    fn store() -> DynLockStore {
        Arc::new(MemoryStore::new())
    }

    #[test]
    fn a_set_guard_can_move_into_a_task() {
        fn send_static<T: Send + 'static>() {}
        send_static::<LockSetGuard>();
        send_static::<LockSetRequest>();
    }

    #[tokio::test]
    async fn bad_sets_are_refused_before_any_key_is_taken() {
        let store = store();
        let empty: [&str; 0] = [];
        for (keys, rule) in [
            (&empty[..], "at least one key"),
            (&["b", "a", "b"][..], "\"b\" twice"),
            (&["a", ""][..], "must not be empty"),
        ] {
            let error = store.lock_all(keys).await.expect_err("a bad set");
            assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
            assert!(error.to_string().contains(rule), "{error}");
            assert!(store.status("a").await.unwrap() == KeyStatus::Free);
        }
    }

    #[tokio::test]
    async fn the_keys_are_taken_in_byte_order_each_with_its_own_token() {
        let store = store();
        let set = store.lock_all(["b", "a", "c"]).await.unwrap();
        assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        let tokens: Vec<u64> = set.leases().map(Lease::fencing_token).collect();
        assert_eq!(set.fencing_token("b"), Some(tokens[1]));
        assert_eq!(set.fencing_token("d"), None);
        assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Released);
        for key in ["a", "b", "c"] {
            assert!(store.status(key).await.unwrap() == KeyStatus::Free);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_last_key_leaves_none_held_and_times_out_on_the_whole_wait() {
        let store = store();
        let held = store.lock("c").await.unwrap();
        let error = store
            .lock_all(["a", "b", "c"])
            .wait(Duration::from_secs(2))
            .await
            .expect_err("c stays held");
        match &error {
            Error::WaitTimedOut { key, waited } => {
                assert_eq!(key, "c");
                assert!(*waited >= Duration::from_secs(2));
            }
            other => panic!("{other}"),
        }
        for key in ["a", "b"] {
            assert!(
                store.status(key).await.unwrap() == KeyStatus::Free,
                "{key} held"
            );
        }
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn the_loss_of_one_key_ends_the_set() {
        let store = store();
        let set = store
            .lock_all(["a", "b"])
            .ttl(Duration::from_secs(4))
            .await
            .unwrap();
        assert!(store.evict("b").await.unwrap());
        let error = set
            .run(std::future::pending::<()>())
            .await
            .expect_err("the work outlived a key");
        assert_eq!(error.kind(), ErrorKind::LeaseLost, "{error}");
        assert!(error.to_string().contains("\"b\""), "{error}");
        assert_eq!(set.lost_key(), Some("b"));
        assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Lost);
        assert!(store.status("a").await.unwrap() == KeyStatus::Free);
    }
}
