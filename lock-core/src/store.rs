//! The contract, as applications hold it: [`LockStore`], held as [`DynLockStore`].

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::raw::AcquireRequest;
use crate::{Capabilities, KeyStatus, Lease, ListCursor, Listing, Mode, ReleaseOutcome, Result};

/// A lock store, as applications hold it: take a key, give it back, keep it, and what the store
/// can and cannot do.
///
/// Hold it as [`DynLockStore`] so code never names a concrete store; for a held lock that keeps
/// itself alive, ask it for a [`LockGuard`](crate::LockGuard) with
/// [`lock`](crate::LockStoreExt::lock). Every store crate's store is a `LockStore`: a store
/// implements the small [`raw::Store`](crate::raw::Store), and this crate turns it into a
/// `LockStore` that enforces the contract below once, for every store (input checks, the
/// expired-grant check, the wait's bound, tracing). What a tool asks of a particular store goes
/// through the methods with defaults here ([`LockStore::per_key_state`],
/// [`LockStore::diagnostics`], [`LockStore::lease_env`]); a store's own types stay reachable
/// with `store.downcast_ref::<ConcreteStore>()` (every store is [`Any`]).
///
/// # Contract
/// - At most one exclusive lease per key is held *in the store* at any instant, across all
///   handles and clients of the same store, and none next to it; leases in other modes
///   ([`Mode`]: shared, semaphore permits) follow the table on [`Mode`], in particular at most
///   `limit` unexpired permits of a key at any instant. A lease is held in the store from its
///   grant until its release, its expiry at the TTL, or an event the store documents as
///   freeing locks early (each store's [`StoreKind::eviction`](crate::StoreKind) and crate
///   docs).
/// - A holder's local deadline ([`Lease::valid_until`]) never runs past the store's own expiry.
///   It can run past an *early* free, which only the store sees first: the holder then learns
///   of it through its keep-alive within a third of the TTL ([`keep_alive`](crate::keep_alive)
///   extends at a quarter of it), sooner where the store revokes the lease itself. Meanwhile
///   another holder may hold the key, which is why the resource must check the fencing token.
/// - Every lease granted for a key carries a fencing token strictly greater than every token the
///   store granted for that key before, in any mode: across release, expiry, other clients and
///   contention.
/// - The key, TTL, mode and wait are validated first (see [`limits`](crate::limits)); a bad one
///   gives [`Error::InvalidInput`](crate::Error::InvalidInput) (or
///   [`Error::Unsupported`](crate::Error::Unsupported) for a mode the store does not keep) and
///   no request is sent.
/// - The returned lease's local deadline is measured from a clock reading taken before the
///   granting request was sent.
/// - A returned lease always has validity left ([`Lease::remaining`] > 0): a lease whose local
///   deadline passed before the store's reply was read is released and refused with
///   [`Error::Unavailable`](crate::Error::Unavailable).
/// - Release is compare-and-delete: the store deletes the key only if it is still held by this
///   lease's owner id (and token). A stale lease can never release its successor.
/// - Extend is compare-and-expire: it renews the lease for its TTL only if it is still held by
///   this lease's owner, and never recreates an expired or released lease. On success the
///   lease's local deadline moves to `sent_at + ttl - drift`, with `sent_at` read before the
///   request was sent.
#[async_trait]
pub trait LockStore: Debug + Send + Sync + Any {
    /// What this store guarantees beyond the contract, and its limits.
    fn capabilities(&self) -> Capabilities;

    /// The one acquire every other goes through: [`LockStore::try_acquire`] and its siblings
    /// and [`LockRequest`](crate::LockRequest) build an [`AcquireRequest`] and call this. Call
    /// those instead; a store that wraps another forwards this one.
    ///
    /// # Errors
    /// As [`LockStore::try_acquire`] for a request without a wait, as
    /// [`LockStore::acquire_as`] for one with a wait.
    ///
    /// # Cancel safety
    /// As [`LockStore::try_acquire`].
    async fn acquire_request(&self, request: AcquireRequest<'_>) -> Result<Lease>;

    /// Makes exactly one attempt to take `key` for `ttl`.
    ///
    /// Fails with [`Error::Busy`](crate::Error::Busy) if another lease holds the key.
    ///
    /// # Errors
    /// [`Contended`](crate::ErrorKind::Contended) (`Busy`) when another lease holds the key;
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad key or TTL;
    /// [`Unavailable`](crate::ErrorKind::Unavailable) when the store did not answer, or granted
    /// too late for the lease to have validity left; [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future may lose a lease the store granted but whose reply was not yet
    /// read. No such lease outlives its TTL, and nobody else can hold it meanwhile; stores that
    /// free a lock on disconnect free it at once. Stores document anything stronger.
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        self.acquire_request(AcquireRequest::new(key, ttl)).await
    }

    /// Takes `key` for `ttl`, waiting up to `wait` for the current holder to release it or for
    /// its lease to expire.
    ///
    /// The waiter is woken by the store's own notification where
    /// [`Capabilities::notified_wait`] says so, otherwise by bounded, jittered polling. It never
    /// gives up before `wait` has passed, and returns
    /// [`Error::WaitTimedOut`](crate::Error::WaitTimedOut) shortly after. A zero `wait` makes one
    /// attempt.
    ///
    /// # Errors
    /// As [`LockStore::try_acquire`], with [`Contended`](crate::ErrorKind::Contended)
    /// (`WaitTimedOut`) once the wait ran out, and `InvalidInput` for a wait above
    /// [`MAX_WAIT`](crate::limits::MAX_WAIT).
    ///
    /// # Cancel safety
    /// As for [`LockStore::try_acquire`]: a dropped waiter stops waiting and leaves nothing held
    /// past its TTL.
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        self.acquire_request(AcquireRequest::new(key, ttl).wait(wait))
            .await
    }

    /// Like [`LockStore::try_acquire`], in `mode`: a shared lease (reader) or a semaphore
    /// permit as well as an exclusive lease. See [`Mode`] for what each excludes.
    ///
    /// Fails with [`Error::Unsupported`](crate::Error::Unsupported) where the store's
    /// [`Capabilities::supports`] says no, [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// for a limit outside `1..=`[`MAX_PERMITS`](crate::limits::MAX_PERMITS), and
    /// [`Error::LimitMismatch`](crate::Error::LimitMismatch) if the key's permits are held with
    /// another limit.
    ///
    /// # Errors
    /// As [`LockStore::try_acquire`], and [`Unsupported`](crate::ErrorKind::Unsupported) or
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) (`LimitMismatch` too) as above.
    ///
    /// # Cancel safety
    /// As for [`LockStore::try_acquire`].
    async fn try_acquire_as(&self, key: &str, ttl: Duration, mode: Mode) -> Result<Lease> {
        self.acquire_request(AcquireRequest::new(key, ttl).mode(mode))
            .await
    }

    /// Like [`LockStore::acquire`], in `mode` (see [`LockStore::try_acquire_as`]). An
    /// exclusive request that waits keeps new shared requests for the key out until it is
    /// served or gives up, so writers never starve behind a stream of readers.
    ///
    /// # Errors
    /// As [`LockStore::acquire`], and those of [`LockStore::try_acquire_as`] for the mode.
    ///
    /// # Cancel safety
    /// As for [`LockStore::acquire`]: a dropped waiter stops waiting (and stops keeping
    /// readers out) and leaves nothing held past its TTL.
    async fn acquire_as(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        mode: Mode,
    ) -> Result<Lease> {
        self.acquire_request(AcquireRequest::new(key, ttl).wait(wait).mode(mode))
            .await
    }

    /// Releases `lease` and wakes waiters on its key.
    ///
    /// Returns [`ReleaseOutcome::Released`] if the lease was still held, or
    /// [`ReleaseOutcome::Lost`] if it had already expired or been taken; in that case nothing is
    /// deleted. A release retried after a timeout reports `Lost` when the first attempt went
    /// through after all: the lease is gone either way.
    ///
    /// # Errors
    /// A lost lease is an outcome, not an error. [`Unavailable`](crate::ErrorKind::Unavailable)
    /// when the store did not answer (the lease may or may not be released; it expires at its
    /// TTL either way); [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lease held; it then expires at its TTL as if release had
    /// never been called. Calling release again is safe.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome>;

    /// Renews `lease` for another [`Lease::ttl`].
    ///
    /// Fails with [`Error::LeaseLost`](crate::Error::LeaseLost) if the lease expired or another
    /// owner holds the key; with a retryable error if the store could not be asked, in which
    /// case the lease may or may not still be held until its local deadline.
    ///
    /// # Errors
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost) when the lease expired, was released or
    /// evicted, or another owner holds the key; [`Unavailable`](crate::ErrorKind::Unavailable)
    /// when the store could not be asked (keep trying until the local deadline);
    /// [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the lease as it was or extended; the local deadline is only
    /// moved once the store's answer is read, so the holder never over-estimates it.
    async fn extend(&self, lease: &Lease) -> Result<()>;

    /// Replaces the label kept beside `lease`'s holder with `label`, if the lease is still held
    /// by its owner: compare-and-set, never recreating a lease that expired or was released.
    /// On success [`Lease::label`] says `label`, and [`LockStore::status`] reports it to
    /// everyone; what an election's leader does to proclaim a new value. Supported where
    /// [`Capabilities::labels`] says so.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for an empty label, one over
    /// [`MAX_LABEL_LEN`](crate::limits::MAX_LABEL_LEN) bytes or with a control character;
    /// [`LeaseLost`](crate::ErrorKind::LeaseLost) when the lease is no longer held;
    /// [`Unsupported`](crate::ErrorKind::Unsupported) where the store keeps no labels;
    /// [`Unavailable`](crate::ErrorKind::Unavailable) (the label may or may not be replaced);
    /// [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the old label or the new one in the store; the lease's own
    /// [`Lease::label`] moves only once the store's answer is read.
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()>;

    /// What the store can tell about `key`, for diagnostics only: the answer may be stale by
    /// the time it arrives.
    ///
    /// # Errors
    /// [`Unsupported`](crate::ErrorKind::Unsupported) where the store cannot tell;
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad key;
    /// [`Unavailable`](crate::ErrorKind::Unavailable); [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus>;

    /// A page of the keys held under `prefix` (any key that starts with it; empty: every key),
    /// each with its status, sorted: at most `limit` (1 to
    /// [`MAX_LIST_LIMIT`](crate::MAX_LIST_LIMIT)) names read from `from` on (`None`: the
    /// start), and the next page's cursor. A key held throughout a listing appears on at least
    /// one page; where the store's scan can repeat a key across pages (its README says so), on
    /// two. A key whose lease has expired is not listed. For diagnostics, as `status`.
    ///
    /// # Errors
    /// [`Unsupported`](crate::ErrorKind::Unsupported) where the store cannot list;
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a prefix over
    /// [`MAX_KEY_LEN`](crate::limits::MAX_KEY_LEN) bytes or a limit outside
    /// `1..=`[`MAX_LIST_LIMIT`](crate::MAX_LIST_LIMIT);
    /// [`Unavailable`](crate::ErrorKind::Unavailable); [`Store`](crate::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        let _ = (prefix, from, limit);
        Err(crate::Error::Unsupported { operation: "list" })
    }

    /// Waits for `key`'s status to differ from `seen` in anything but the time its holders
    /// have left ([`KeyStatus::same_holders`]) and returns it, or returns the status at `until`
    /// if nothing changed by then. Woken by the store's notification where
    /// [`Capabilities::notified_status`] says so, else it reads the status every
    /// [`Capabilities::status_poll`]. What an election's observer is built on.
    ///
    /// # Errors
    /// As [`LockStore::status`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn next_status(
        &self,
        key: &str,
        seen: &KeyStatus,
        until: crate::Instant,
    ) -> Result<KeyStatus>;

    /// The operator's eviction: frees `key` behind its holder's back, as an administrator
    /// deleting the lock (or ending the session that holds it) would. Returns whether a holder
    /// was evicted. The fencing counter is kept, so the next lease's token is still greater;
    /// the holder finds out at its next extend or release, or sooner where the store revokes
    /// the lease. Each store's [`StoreKind::eviction`] says what it does there.
    ///
    /// For tooling and fault tests; a lock holder never needs it. Supported where
    /// [`Capabilities::evict`] says so, else [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// [`StoreKind::eviction`]: crate::StoreKind::eviction
    ///
    /// # Errors
    /// As [`LockStore::status`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have evicted the holder.
    async fn evict(&self, key: &str) -> Result<bool>;

    /// How much per-key state the store holds now, for keys held or not (fencing counters,
    /// fence rows), where it can count it: what `lockctl stats` prints. `None` says the store
    /// does not count it.
    ///
    /// # Errors
    /// [`Unsupported`](crate::ErrorKind::Unsupported) where the store counts in some of its
    /// deployments only and not in this one (a clustered one, say);
    /// [`Unavailable`](crate::ErrorKind::Unavailable) when the store did not answer;
    /// [`Store`](crate::ErrorKind::Store) for any other failure to count.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>>;

    /// Notes an operator should see about this handle, one line each, passwords never
    /// printed: what the store could not check about itself (a server whose eviction settings
    /// could not be read, say).
    fn diagnostics(&self) -> Vec<String>;

    /// The environment a command run under `lease` gets beyond fencelock's own (`LOCK_KEY`,
    /// `LOCK_FENCING_TOKEN`, …): the names and values the store's own lock tool gives the
    /// command it runs, so scripts written for that tool run unchanged.
    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)>;
}

/// How much per-key state a store holds: the answer of [`LockStore::per_key_state`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PerKeyState {
    /// How many items the store holds now.
    pub count: u64,
    /// What an item is, plural (`fence rows`, `keys under the prefix`).
    pub unit: &'static str,
}

impl PerKeyState {
    /// `count` items of `unit`.
    pub const fn new(count: u64, unit: &'static str) -> Self {
        PerKeyState { count, unit }
    }
}

impl dyn LockStore {
    /// The concrete store behind this handle, if it is a `T`, seeing through the wrapper this
    /// crate puts around stores (`Metered`, feature `metrics`). For code that wants a store's
    /// own types; what a tool asks of any store goes through [`LockStore`]'s methods
    /// ([`LockStore::per_key_state`], [`LockStore::diagnostics`], [`LockStore::lease_env`]).
    pub fn downcast_ref<T: LockStore>(&self) -> Option<&T> {
        let any: &dyn Any = self;
        if let Some(store) = any.downcast_ref::<T>() {
            return Some(store);
        }
        #[cfg(feature = "metrics")]
        if let Some(metered) = any.downcast_ref::<crate::Metered>() {
            return metered.inner().downcast_ref::<T>();
        }
        None
    }
}

/// The store as a trait object: what applications hold.
pub type DynLockStore = Arc<dyn LockStore>;
