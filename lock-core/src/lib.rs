#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod capabilities;
mod election;
mod error;
mod fence;
mod guard;
mod keepalive;
mod kind;
mod lease;
pub mod limits;
mod listing;
mod memory;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metered;
mod mode;
pub mod raw;
mod scoped;
#[cfg(feature = "serde")]
mod serialize;
mod set;
mod store;

pub use capabilities::Capabilities;
pub use election::{Election, Leader, Leadership, Observer, Term};
pub use error::{BodyOutput, BoxError, Error, ErrorKind, Result, SharedError};
pub use fence::FenceGate;
pub use guard::{LockGuard, LockRequest, LockStoreExt, DEFAULT_TTL};
pub use keepalive::{keep_alive, KeepAlive};
pub use kind::StoreKind;
pub use lease::{FencingToken, KeyStatus, Lease, OwnerId, ReleaseOutcome};
pub use listing::{HeldKey, ListCursor, Listing, MAX_LIST_LIMIT};
pub use memory::{MemoryStore, MEMORY};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use metered::Metered;
pub use mode::{HolderStatus, Mode};
pub use scoped::with_lock;
pub use set::{LockSetGuard, LockSetRequest};
pub use store::{DynLockStore, LockStore, PerKeyState};

/// Re-exported so stores and callers name the same clock and cancellation types.
pub use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;
