//! How a lease holds its key: alone, shared with other readers, or as one permit of a
//! semaphore. See [`Mode`].

use std::fmt;
use std::time::Duration;

use crate::OwnerId;

/// How a lease holds its key. [`LockStore::try_acquire`](crate::LockStore::try_acquire) and
/// [`LockStore::acquire`](crate::LockStore::acquire) take [`Mode::Exclusive`];
/// [`LockStore::try_acquire_as`](crate::LockStore::try_acquire_as) and
/// [`LockStore::acquire_as`](crate::LockStore::acquire_as) take any mode the store's
/// [`Capabilities`](crate::Capabilities) declare.
///
/// | held \ asked | `Exclusive` | `Shared` | `Permit { limit: L }` |
/// | --- | --- | --- | --- |
/// | nothing | granted | granted, unless a writer waits | granted, slot 0 |
/// | `Exclusive` | busy | busy | busy |
/// | `Shared` | busy | granted, unless a writer waits | busy |
/// | `Permit { limit: L }` | busy | busy | granted while fewer than `L` are held |
/// | `Permit { limit: M ≠ L }` | busy | busy | [`Error::LimitMismatch`](crate::Error::LimitMismatch) |
///
/// **Writers do not starve:** while an exclusive request waits for a key
/// ([`LockStore::acquire_as`](crate::LockStore::acquire_as) with a non-zero wait), new shared
/// requests for the key are refused or wait behind it; readers that already hold keep their
/// leases until they release or expire. Every store keeps this policy.
///
/// **Tokens:** every lease of a key, in any mode, carries a fencing token greater than every
/// token granted for the key before. A reader's token is therefore greater than every earlier
/// writer's, so a reader can tell whether it saw the latest write. Permit holders share no
/// single "highest token wins" gate: each permit occupies a numbered slot
/// ([`Lease::slot`](crate::Lease::slot), `0..limit`), and a resource the permit holders share
/// fences per slot; a slot's tokens only grow.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::time::Duration;
/// use fencelock_core::{FenceGate, LockStore, MemoryStore, Mode};
///
/// let store = MemoryStore::new();
/// let ttl = Duration::from_secs(30);
/// // The resource the permit holders share keeps one fence per slot.
/// let slots: Vec<FenceGate> = (0..2).map(|_| FenceGate::new()).collect();
///
/// let a = store.try_acquire_as("exports", ttl, Mode::permits(2)).await?;
/// let b = store.try_acquire_as("exports", ttl, Mode::permits(2)).await?;
/// assert!(store.try_acquire_as("exports", ttl, Mode::permits(2)).await.is_err()); // both taken
/// let (slot_a, slot_b) = (a.slot().unwrap_or(0), b.slot().unwrap_or(0));
/// assert_ne!(slot_a, slot_b);
///
/// let gate = &slots[slot_a as usize];
/// gate.claim(a.fencing_token())?;                     // claim at read …
/// gate.write(a.fencing_token(), || { /* write */ })?; // … write only while the claim holds
///
/// // Another limit while permits are held is refused, never mixed.
/// let mixed = store.try_acquire_as("exports", ttl, Mode::permits(5)).await;
/// assert!(matches!(mixed, Err(fencelock_core::Error::LimitMismatch { held: 2, requested: 5, .. })));
/// # let _ = store.release(&a).await?;
/// # let _ = store.release(&b).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Mode {
    /// The only lease on the key: excludes every other lease.
    #[default]
    Exclusive,
    /// A reader: any number of shared leases coexist, and they exclude exclusive ones.
    Shared,
    /// One of at most `limit` permits of a semaphore (1 to [`MAX_PERMITS`](crate::limits::MAX_PERMITS)). The store
    /// records the limit while any permit of the key is held; a request with another limit
    /// then fails with [`Error::LimitMismatch`](crate::Error::LimitMismatch).
    Permit {
        /// How many permits the key has.
        limit: u32,
    },
}

impl Mode {
    /// A semaphore permit of a key with `limit` permits.
    pub fn permits(limit: u32) -> Self {
        Mode::Permit { limit }
    }

    /// Whether a lease in this mode may be held next to one in `other` (same key). Two
    /// permits are compatible only with the same limit.
    pub fn compatible_with(self, other: Mode) -> bool {
        match (self, other) {
            (Mode::Shared, Mode::Shared) => true,
            (Mode::Permit { limit: a }, Mode::Permit { limit: b }) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::Shared => f.write_str("shared"),
            Mode::Permit { limit } => write!(f, "permit of {limit}"),
        }
    }
}

/// One holder of a key held in shared or permit mode, as
/// [`KeyStatus::Shared`](crate::KeyStatus::Shared) reports it. Each field is `None` where
/// the store cannot tell.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderStatus {
    /// The holder's owner id.
    pub owner: Option<OwnerId>,
    /// The holder's fencing token.
    pub token: Option<u64>,
    /// The holder's permit slot (permits only).
    pub slot: Option<u32>,
    /// How long the store will keep the lease without an extend.
    pub remaining: Option<Duration>,
    /// The holder's label, where the store keeps labels
    /// ([`Capabilities::labels`](crate::Capabilities::labels)).
    pub label: Option<String>,
}

impl HolderStatus {
    /// A holder; for store implementations.
    pub fn new(
        owner: Option<OwnerId>,
        token: Option<u64>,
        slot: Option<u32>,
        remaining: Option<Duration>,
    ) -> Self {
        HolderStatus {
            owner,
            token,
            slot,
            remaining,
            label: None,
        }
    }

    /// The holder, labelled `label`; for store implementations.
    #[must_use]
    pub fn with_label(mut self, label: Option<String>) -> Self {
        self.label = label;
        self
    }
}
