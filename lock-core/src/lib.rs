//! The fencelock contract: distributed locks that are honest about what they guarantee.
//!
//! A lock store grants [`Lease`]s. A lease is exclusive per key while it lasts, expires at its
//! TTL unless extended, and carries a fencing token that only grows per key. The lease's local
//! deadline is conservative: the holder never believes it holds the lock longer than the store
//! does.
//!
//! What no lock can promise: that a holder stops working when its lease ends. A process can
//! pause (GC, swap, a stopped VM) past any TTL and resume believing it still holds the lock. A
//! lock on its own is therefore an efficiency tool; correctness needs the protected resource to
//! check the fencing token: claimed when the holder reads, checked when it writes
//! ([`FenceGate`] in process; in a database, see the `fencelock-fence` crate).
//!
//! # The pieces
//! - [`Acquire`], [`Release`], [`Extend`]: the operations, combined in [`LockStore`] and held as
//!   [`DynLockStore`]. [`FencingToken`] is anything that carries a token.
//! - [`LockStoreExt::lock`]: `store.lock(key).await?` gives a [`LockGuard`] that keeps its lease
//!   alive, says when it is lost and releases on [`LockGuard::release`] or drop: the shortest
//!   correct way to hold a lock.
//! - [`KeepAlive`] / [`keep_alive`]: automatic extension and the lost signal.
//! - [`with_lock`]: acquire, keep alive, run a body, release; the body is cancelled on loss.
//! - [`FenceGate`]: the resource-side check, claim at the read and write while the claim holds.
//! - [`MemoryStore`]: the reference store, always compiled.
//! - `Metered` (feature `metrics`): a store wrapper that records metrics on the `metrics`
//!   crate's facade; the names and units are tabled in the `metered` module.
//! - [`StoreKind`]: a store's descriptor (name, URL schemes, feature, connect), one per store
//!   crate, listed once by the `fencelock` facade.
//! - For store implementers: [`validate`] (the request checks every store makes), [`ttl`],
//!   [`url`], [`cleanup`] (when to remove idle fence rows) and [`session_watch`] (revoking a
//!   lease whose server session ended, for locks that live as long as a session).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> fencelock_core::Result<()> {
//! use std::time::Duration;
//! use fencelock_core::{Acquire, Release, ReleaseOutcome, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let lease = store.try_acquire("nightly-export", Duration::from_secs(10)).await?;
//! // ... pass lease.fencing_token() with every write ...
//! assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod capabilities;
pub mod cleanup;
mod error;
mod fence;
mod guard;
mod keepalive;
pub mod kind;
mod lease;
mod memory;
#[cfg(feature = "metrics")]
pub mod metered;
mod mode;
mod scoped;
pub mod session_watch;
mod store;
pub mod ttl;
pub mod url;
pub mod validate;

pub use capabilities::Capabilities;
pub use error::{BodyOutput, BoxError, Error, ErrorKind, Result, SharedError};
pub use fence::FenceGate;
pub use guard::{LockGuard, LockRequest, LockStoreExt, DEFAULT_TTL};
pub use keepalive::{keep_alive, KeepAlive};
pub use kind::StoreKind;
pub use lease::{drift, FencingToken, KeyStatus, Lease, OwnerId, ReleaseOutcome, Revocation};
pub use memory::{MemoryStore, MEMORY};
#[cfg(feature = "metrics")]
pub use metered::Metered;
pub use mode::{HolderStatus, Mode, MAX_PERMITS};
pub use scoped::{with_lock, AsLockStore, LockOptions};
pub use store::{Acquire, DynLockStore, Extend, LockStore, Release};

/// Re-exported so stores and callers name the same clock and cancellation types.
pub use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;
