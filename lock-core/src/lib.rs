#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod capabilities;
pub mod cleanup;
pub mod cleanup_task;
mod error;
mod fence;
mod guard;
pub mod hint;
mod keepalive;
pub mod kind;
mod lease;
mod memory;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metered;
mod mode;
mod scoped;
pub mod session_pool;
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
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use metered::Metered;
pub use mode::{HolderStatus, Mode, MAX_PERMITS};
pub use scoped::{with_lock, AsLockStore, LockOptions};
pub use store::{Acquire, DynLockStore, Extend, LockStore, PerKeyState, Release};

/// Re-exported so stores and callers name the same clock and cancellation types.
pub use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;
