//! What a holder gets: the [`Lease`], its owner id and its fencing token.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{HolderStatus, Mode};

/// Anything that carries a fencing token: pass it to the protected resource with every write.
///
/// A token is strictly greater than every token the same store issued for the same key before,
/// so a resource that remembers the highest token it accepted can refuse a superseded holder
/// (see [`FenceGate`](crate::FenceGate)).
pub trait FencingToken {
    /// The token, a `u64` that only grows per key.
    fn fencing_token(&self) -> u64;
}

/// A 128-bit identity minted for one acquisition, never another's of the same store: random,
/// or made by the store of numbers it never repeats (etcd's: the entry's lease and create
/// revision). Release and extend compare it, so a stale lease can never act on its successor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(u128);

impl OwnerId {
    /// A fresh random id from the thread-local CSPRNG.
    pub fn random() -> Self {
        OwnerId(rand::random())
    }

    /// The id as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Parses the 32-hex-digit form written by `Display`.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 32 {
            return None;
        }
        u128::from_str_radix(text, 16).ok().map(OwnerId)
    }
}

impl From<u128> for OwnerId {
    fn from(value: u128) -> Self {
        OwnerId(value)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({self})")
    }
}

/// The safety margin taken off every local deadline for clock drift between the holder and the
/// store: 1% of the TTL plus 2 ms, as in Redlock.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A held lock: key, owner id, fencing token, TTL and a local validity deadline.
///
/// The deadline is `sent_at + ttl - drift(ttl)`, where `sent_at` is a monotonic clock reading
/// taken *before* the request that granted (or last extended) the lease was sent. The store's
/// own expiry starts no earlier than that, so the holder never believes it holds the lock longer
/// than the store does. It is a belief, not a guarantee: a process paused past the deadline still
/// runs on afterwards, which is why writes must carry the fencing token.
///
/// Cloning is cheap and clones share the deadline, so a keep-alive task and the holder see the
/// same renewals. Dropping a lease does not release it (some stores free it when their
/// connection closes, see [`Capabilities::frees_on_disconnect`](crate::Capabilities)); release it
/// with [`LockStore::release`](crate::LockStore::release) or let it expire. Only its store
/// builds, extends or revokes it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::time::Duration;
/// use fencelock_core::{LockStore, MemoryStore, ReleaseOutcome};
///
/// let store = MemoryStore::new();
/// let first = store.try_acquire("report", Duration::from_secs(10)).await?;
/// assert!(first.remaining() <= Duration::from_secs(10)); // the local deadline, conservative
/// store.extend(&first).await?;                           // moves it on
/// assert_eq!(store.release(&first).await?, ReleaseOutcome::Released);
/// let next = store.try_acquire("report", Duration::from_secs(10)).await?;
/// assert!(next.fencing_token() > first.fencing_token()); // tokens only grow per key
/// assert_eq!(store.release(&first).await?, ReleaseOutcome::Lost); // a stale release frees nothing
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    key: String,
    owner: OwnerId,
    token: u64,
    ttl: Duration,
    valid_until: Mutex<Instant>,
    mode: Mode,
    slot: Option<u32>,
    /// The holder's label: set by the acquire that asked for one, replaced by a relabel.
    label: Mutex<Option<Arc<str>>>,
    /// Made on the first call to `revocation`: most leases never have one, and it
    /// costs two allocations (about 1% of a Redis cycle's client CPU).
    revocation: OnceLock<Revocation>,
    store_state: Option<Box<dyn Any + Send + Sync>>,
    /// The `store` label of the metered store that granted it, for the keep-alive's metrics.
    #[cfg(feature = "metrics")]
    metered_as: OnceLock<&'static str>,
}

impl Lease {
    fn build(
        key: &str,
        owner: OwnerId,
        token: u64,
        ttl: Duration,
        sent_at: Instant,
        store_state: Option<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        Lease {
            inner: Arc::new(LeaseInner {
                key: key.to_owned(),
                owner,
                token,
                ttl,
                valid_until: Mutex::new(deadline(sent_at, ttl)),
                mode: Mode::Exclusive,
                slot: None,
                label: Mutex::new(None),
                revocation: OnceLock::new(),
                store_state,
                #[cfg(feature = "metrics")]
                metered_as: OnceLock::new(),
            }),
        }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The owner id minted for this acquisition.
    pub fn owner(&self) -> OwnerId {
        self.inner.owner
    }

    /// The fencing token.
    pub fn fencing_token(&self) -> u64 {
        self.inner.token
    }

    /// How the lease holds its key: [`Mode::Exclusive`] unless it was taken with
    /// [`LockStore::try_acquire_as`](crate::LockStore::try_acquire_as) or
    /// [`LockStore::acquire_as`](crate::LockStore::acquire_as).
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The permit's slot, `0..limit`, for a [`Mode::Permit`] lease; `None` otherwise. At most
    /// one unexpired permit of a key holds a slot at any instant, and a slot's tokens only
    /// grow, so a resource the permit holders share fences writes per slot.
    pub fn slot(&self) -> Option<u32> {
        self.inner.slot
    }

    /// The holder's label, as the acquire asked for it
    /// ([`LockRequest::label`](crate::LockRequest::label)) or the last
    /// [`LockStore::relabel`](crate::LockStore::relabel) set it; `None` without one.
    pub fn label(&self) -> Option<Arc<str>> {
        self.inner
            .label
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the label the store now keeps beside this lease's holder.
    pub(crate) fn set_label(&self, label: Option<&str>) {
        *self
            .inner
            .label
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = label.map(Arc::from);
    }

    /// The TTL the store granted (some stores round the requested TTL up).
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The local deadline after which the holder must assume the lease is gone.
    pub fn valid_until(&self) -> Instant {
        *self
            .inner
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Time left before [`Lease::valid_until`], zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether the local deadline has passed.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until()
    }

    /// Whether the store has reported this lease gone (PostgreSQL: the server ended the lease's
    /// session): a [`KeepAlive`](crate::KeepAlive) on it reports it lost.
    pub fn is_revoked(&self) -> bool {
        self.inner
            .revocation
            .get()
            .is_some_and(Revocation::is_revoked)
    }

    /// Labels the lease with the metered store that granted it (the first label stays).
    #[cfg(feature = "metrics")]
    pub(crate) fn meter_as(&self, store: &'static str) {
        let _ = self.inner.metered_as.set(store);
    }

    /// The `store` label of the metered store that granted the lease, if one did.
    #[cfg(feature = "metrics")]
    pub(crate) fn metered_as(&self) -> Option<&'static str> {
        self.inner.metered_as.get().copied()
    }
}

/// Keeps [`LeaseExt`](crate::raw::LeaseExt) implemented for [`Lease`] only.
pub trait Sealed {}

impl Sealed for Lease {}

impl crate::raw::LeaseExt for Lease {
    fn new(key: &str, owner: OwnerId, token: u64, ttl: Duration, sent_at: Instant) -> Self {
        Self::build(key, owner, token, ttl, sent_at, None)
    }

    fn with_store_state<T: Any + Send + Sync>(
        key: &str,
        owner: OwnerId,
        token: u64,
        ttl: Duration,
        sent_at: Instant,
        state: T,
    ) -> Self {
        Self::build(key, owner, token, ttl, sent_at, Some(Box::new(state)))
    }

    fn in_mode(mut self, mode: Mode, slot: Option<u32>) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => {
                inner.mode = mode;
                inner.slot = slot;
            }
            None => debug_assert!(false, "Lease::in_mode called on a shared lease"),
        }
        self
    }

    fn confirm(&self, sent_at: Instant) {
        let mut valid_until = self
            .inner
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *valid_until = (*valid_until).max(deadline(sent_at, self.inner.ttl));
    }

    fn revocation(&self) -> Revocation {
        self.inner
            .revocation
            .get_or_init(Revocation::default)
            .clone()
    }

    fn store_state<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.inner.store_state.as_ref()?.downcast_ref()
    }
}

fn deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift(ttl))
}

impl FencingToken for Lease {
    fn fencing_token(&self) -> u64 {
        self.inner.token
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.inner.key)
            .field("owner", &self.inner.owner)
            .field("fencing_token", &self.inner.token)
            .field("ttl", &self.inner.ttl)
            .field("mode", &self.inner.mode)
            .field("slot", &self.inner.slot)
            .field("label", &self.label())
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// A store's report that a lease is gone, taken from
/// [`LeaseExt::revocation`](crate::raw::LeaseExt::revocation). Cloning is cheap; every clone
/// reports the same revocation.
#[derive(Clone, Default)]
pub struct Revocation {
    inner: Arc<RevocationInner>,
}

#[derive(Default)]
struct RevocationInner {
    done: CancellationToken,
    reason: OnceLock<String>,
}

impl Revocation {
    /// Reports the lease gone, for `reason` (kept from the first call only).
    pub fn revoke(&self, reason: impl Into<String>) {
        let _ = self.inner.reason.set(reason.into());
        self.inner.done.cancel();
    }

    /// Whether the lease was reported gone.
    pub fn is_revoked(&self) -> bool {
        self.inner.done.is_cancelled()
    }

    /// Why the lease was reported gone, once it was.
    pub fn reason(&self) -> Option<&str> {
        self.inner.reason.get().map(String::as_str)
    }

    /// Completes once the lease is reported gone.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing, and a later call still completes.
    pub async fn revoked(&self) {
        self.inner.done.cancelled().await
    }
}

impl fmt::Debug for Revocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Revocation")
            .field("reason", &self.reason())
            .finish()
    }
}

/// What [`LockStore::release`](crate::LockStore::release) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost lease means the protected work may have overlapped another holder"]
pub enum ReleaseOutcome {
    /// The lease was still held and is now released.
    Released,
    /// The lease was already gone (expired, forgotten, or taken by another owner); nothing was
    /// deleted.
    Lost,
}

/// What a store can tell about a key, for diagnostics (`lockctl status`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// Nobody holds the key.
    Free,
    /// Somebody holds the key; each field is `None` where the store cannot tell.
    Held {
        /// The holder's owner id.
        owner: Option<OwnerId>,
        /// The holder's fencing token.
        token: Option<u64>,
        /// How long the store will keep the lease without an extend.
        remaining: Option<Duration>,
        /// The holder's label ([`Lease::label`]), where the store keeps labels
        /// ([`Capabilities::labels`](crate::Capabilities::labels)).
        label: Option<String>,
    },
    /// The key is held in [`Mode::Shared`] or [`Mode::Permit`] mode by `count` leases.
    Shared {
        /// The mode the key is held in (for permits, with the recorded limit).
        mode: Mode,
        /// How many leases hold the key.
        count: u32,
        /// The holders, where the store can tell them (empty where it counts only).
        holders: Vec<HolderStatus>,
    },
}

impl KeyStatus {
    /// Whether `self` and `other` report the same holders (owners, tokens, labels, modes,
    /// slots), whatever time each has left: what changes when the key changes hands or a
    /// holder is relabelled, not as its lease runs down.
    pub fn same_holders(&self, other: &KeyStatus) -> bool {
        match (self, other) {
            (KeyStatus::Free, KeyStatus::Free) => true,
            (
                KeyStatus::Held {
                    owner,
                    token,
                    label,
                    ..
                },
                KeyStatus::Held {
                    owner: other_owner,
                    token: other_token,
                    label: other_label,
                    ..
                },
            ) => owner == other_owner && token == other_token && label == other_label,
            (
                KeyStatus::Shared {
                    mode,
                    count,
                    holders,
                },
                KeyStatus::Shared {
                    mode: other_mode,
                    count: other_count,
                    holders: other_holders,
                },
            ) => {
                mode == other_mode
                    && count == other_count
                    && holders.len() == other_holders.len()
                    && holders.iter().zip(other_holders).all(|(a, b)| {
                        HolderStatus {
                            remaining: None,
                            ..a.clone()
                        } == HolderStatus {
                            remaining: None,
                            ..b.clone()
                        }
                    })
            }
            _ => false,
        }
    }
}
