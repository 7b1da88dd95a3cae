//! For store authors: the trait a store implements, and the tools stores share.
//!
//! An application never needs this module: it holds a [`LockStore`](crate::LockStore). A store
//! crate implements [`Store`], which is small: one [`Store::acquire`] taking an
//! [`AcquireRequest`], [`Store::release`], [`Store::extend`], [`Store::capabilities`],
//! [`Store::name`], and the defaulted methods for what some stores can do (`status`, `evict`,
//! `per_key_state`, `diagnostics`, `lease_env`). This crate makes every `Store` a
//! [`LockStore`](crate::LockStore), and does what every store must do once, for all of them:
//!
//! - the input checks (key, TTL against [`Store::capabilities`], mode, wait), before the store
//!   is asked anything;
//! - the expired-grant check: a lease whose local deadline passed before the store's reply was
//!   read is released and refused with [`Error::Unavailable`];
//! - a request with a wait that the store answers [`Error::Busy`] becomes
//!   [`Error::WaitTimedOut`];
//! - the tracing span of every operation, with the store's [`Store::name`].
//!
//! A store that wraps another (metrics, fault injection) implements [`Wrapper`]: every method
//! forwards to the store it wraps unless it overrides it.
//!
//! What is left to a store is its own: how it takes, releases and extends a key, mints tokens
//! that only grow per key, waits (notified or polling), and what it can tell about a key. It
//! builds the [`Lease`] it grants with [`LeaseExt`], from a clock reading taken *before* the
//! granting request was sent.
//!
//! ```
//! use std::time::Duration;
//! use async_trait::async_trait;
//! use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
//! use fencelock_core::{Capabilities, Error, Instant, Lease, LockStore, OwnerId, ReleaseOutcome, Result};
//!
//! /// A store that holds every key at once (a toy: it grants one lease and remembers nothing).
//! #[derive(Debug)]
//! struct Toy;
//!
//! // Named by its path, not imported: its methods share their names with `LockStore`'s.
//! #[async_trait]
//! impl raw::Store for Toy {
//!     fn name(&self) -> &'static str {
//!         "toy"
//!     }
//!
//!     fn capabilities(&self) -> Capabilities {
//!         Capabilities::new()
//!     }
//!
//!     async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
//!         let sent_at = Instant::now(); // read before the store is asked
//!         Ok(Lease::new(request.key, OwnerId::random(), 1, request.ttl, sent_at))
//!     }
//!
//!     async fn release(&self, _lease: &Lease) -> Result<ReleaseOutcome> {
//!         Ok(ReleaseOutcome::Released)
//!     }
//!
//!     async fn extend(&self, lease: &Lease) -> Result<()> {
//!         Err(Error::lost(lease, "a toy never extends"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! // Every `Store` is a `LockStore`, its input checked by this crate:
//! let empty_key = Toy.try_acquire("", Duration::from_secs(1)).await.unwrap_err();
//! assert_eq!(empty_key.kind(), fencelock_core::ErrorKind::InvalidInput);
//! let lease = Toy.try_acquire("k", Duration::from_secs(1)).await?;
//! assert_eq!(lease.fencing_token(), 1);
//! # Ok(()) }
//! ```

use std::any::Any;
use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

pub use crate::listing::{held_among, page_of, read_page, stored_after};
use crate::{
    Capabilities, Error, Instant, KeyStatus, Lease, ListCursor, Listing, Mode, PerKeyState,
    ReleaseOutcome, Result,
};

mod checked;
pub mod cleanup;
pub mod cleanup_task;
pub mod hint;
mod lease;
pub mod session_pool;
pub mod session_watch;
pub mod ttl;
pub mod url;
pub mod validate;
mod wrapper;

pub use crate::kind::{BoxFuture, ConnectFn};
pub use crate::lease::{drift, Revocation};
pub use checked::acquire_checked;
pub use lease::LeaseExt;
pub use wrapper::Wrapper;

/// What an acquire asks for: built by [`LockStore`](crate::LockStore)'s acquire methods and
/// [`LockRequest`](crate::LockRequest), checked by this crate, and handed to
/// [`Store::acquire`].
///
/// `#[non_exhaustive]`: later work adds fields (a holder's label, say), so a store reads the
/// fields it knows and a wrapper passes the request on whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The key, 1 to [`MAX_KEY_LEN`](crate::limits::MAX_KEY_LEN) bytes of UTF-8.
    pub key: &'a str,
    /// The lease's TTL, within the store's [`Capabilities`] bounds.
    pub ttl: Duration,
    /// How the lease holds the key; one the store's [`Capabilities::supports`].
    pub mode: Mode,
    /// `None`: one attempt, [`Error::Busy`] if the key is held. `Some(wait)`: wait up to
    /// `wait` (zero included) for the key; a store that gives up answers `Busy` too, and the
    /// caller gets [`Error::WaitTimedOut`].
    pub wait: Option<Duration>,
    /// The holder's label, 1 to [`MAX_LABEL_LEN`](crate::limits::MAX_LABEL_LEN) bytes of
    /// UTF-8, to keep beside the holder where [`Capabilities::labels`] says so: what
    /// [`Store::status`] reports as the holder's `label`, and an election's leader value.
    pub label: Option<&'a str>,
}

impl<'a> AcquireRequest<'a> {
    /// One exclusive attempt at `key` for `ttl`.
    pub fn new(key: &'a str, ttl: Duration) -> Self {
        AcquireRequest {
            key,
            ttl,
            mode: Mode::Exclusive,
            wait: None,
            label: None,
        }
    }

    /// Labels the holder with `label` (see [`AcquireRequest::label`]).
    #[must_use]
    pub fn label(mut self, label: &'a str) -> Self {
        self.label = Some(label);
        self
    }

    /// Waits up to `wait` for the key instead of making one attempt.
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Takes the key in `mode`.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The name of the [`LockStore`](crate::LockStore) method this request is, for messages
    /// that name the operation: `try_acquire`, `acquire`, `try_acquire_as` or `acquire_as`.
    pub fn operation(&self) -> &'static str {
        match (self.wait.is_some(), self.mode == Mode::Exclusive) {
            (false, true) => "try_acquire",
            (true, true) => "acquire",
            (false, false) => "try_acquire_as",
            (true, false) => "acquire_as",
        }
    }
}

/// The trait a store implements. Every `Store` is a [`LockStore`](crate::LockStore), with the
/// contract's checks done by this crate (see the [module docs](self)); each method here does
/// only what is the store's own.
///
/// Implement it by its path (`impl raw::Store for MyStore`) rather than importing it: its
/// methods share their names with [`LockStore`](crate::LockStore)'s, and a file with both in
/// scope must spell out which one each call means.
///
/// A store that wraps another (metrics, fault injection) implements [`Wrapper`] instead, which
/// forwards every method it does not override.
#[async_trait]
pub trait Store: Debug + Send + Sync + Any {
    /// The name of the store's descriptor ([`StoreKind::name`](crate::StoreKind)): the `store`
    /// field of the tracing spans.
    fn name(&self) -> &'static str;

    /// What this store guarantees beyond the contract, and its limits. The checks read the TTL
    /// bounds and the modes from it.
    fn capabilities(&self) -> Capabilities;

    /// The store's own rules for a request beyond what [`Store::capabilities`] declares,
    /// checked after the key and before the TTL bounds, so a refusal can name the store's
    /// reason (Redis with `min_replicas`: a TTL below twice `replica_timeout`). Nothing may be
    /// sent to the store here. Default: none.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a request this store refuses.
    fn check(&self, request: &AcquireRequest<'_>) -> Result<()> {
        let _ = request;
        Ok(())
    }

    /// Takes `request.key`: one attempt when `request.wait` is `None`, else waiting up to the
    /// wait for the holder to release it or for its lease to expire (woken by the store's own
    /// notification where [`Capabilities::notified_wait`] says so, else by bounded, jittered
    /// polling, and never giving up before the wait has passed).
    ///
    /// The request was checked: its key, TTL, mode and wait are valid for this store. The
    /// lease's local deadline is measured from a clock reading taken before the granting
    /// request was sent; a lease that comes back already expired is released and refused by
    /// the caller, so the store need not check.
    ///
    /// # Errors
    /// [`Error::Busy`] when the key stays held (after the wait, if any: the caller turns it
    /// into [`Error::WaitTimedOut`]); [`Error::LimitMismatch`] when the key's permits are held
    /// with another limit; [`Error::Unavailable`] when the store did not answer;
    /// [`Error::Store`].
    ///
    /// # Cancel safety
    /// Dropping the future may lose a lease the store granted but whose reply was not yet
    /// read; no such lease may outlive its TTL, and a dropped waiter must stop waiting (and
    /// stop keeping readers out). Document anything stronger on the impl.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease>;

    /// Compare-and-delete: releases `lease` if it is still held by its owner, and wakes waiters
    /// on its key. See [`LockStore::release`](crate::LockStore::release).
    ///
    /// # Errors
    /// As [`LockStore::release`](crate::LockStore::release).
    ///
    /// # Cancel safety
    /// As [`LockStore::release`](crate::LockStore::release).
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome>;

    /// Compare-and-expire: renews `lease` for its TTL if it is still held by its owner, then
    /// moves its local deadline with [`LeaseExt::confirm`]. See
    /// [`LockStore::extend`](crate::LockStore::extend).
    ///
    /// # Errors
    /// As [`LockStore::extend`](crate::LockStore::extend).
    ///
    /// # Cancel safety
    /// As [`LockStore::extend`](crate::LockStore::extend).
    async fn extend(&self, lease: &Lease) -> Result<()>;

    /// Replaces the label kept beside `lease`'s holder with `label` (already checked), if the
    /// lease is still held by its owner: compare-and-set, as extend is. Where
    /// [`Capabilities::labels`] says so; default [`Error::Unsupported`]. The caller records the
    /// new label on the lease.
    ///
    /// # Errors
    /// As [`LockStore::relabel`](crate::LockStore::relabel).
    ///
    /// # Cancel safety
    /// As [`LockStore::relabel`](crate::LockStore::relabel).
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        let _ = (lease, label);
        Err(Error::Unsupported {
            operation: "relabel",
        })
    }

    /// The status of `key` (already checked) once it differs from `seen` in anything but the
    /// time its holders have left ([`KeyStatus::same_holders`]), or its status at `until`,
    /// whichever is first. Default: [`Store::status`] read every
    /// [`Capabilities::status_poll`]; a store that is told of changes
    /// ([`Capabilities::notified_status`]) waits for its notification instead.
    ///
    /// # Errors
    /// As [`LockStore::next_status`](crate::LockStore::next_status).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        let poll = Store::capabilities(self).status_poll;
        loop {
            let status = Store::status(self, key).await?;
            let now = Instant::now();
            if !status.same_holders(seen) || now >= until {
                return Ok(status);
            }
            tokio::time::sleep_until((now + poll).min(until)).await;
        }
    }

    /// What the store can tell about `key` (already checked). Default:
    /// [`Error::Unsupported`].
    ///
    /// # Errors
    /// As [`LockStore::status`](crate::LockStore::status).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        let _ = key;
        Err(Error::Unsupported {
            operation: "status",
        })
    }

    /// A page of the keys held under `prefix` (already checked, as `limit`): the store's own
    /// query for the names under it, then [`held_among`] for their status. Default:
    /// [`Error::Unsupported`].
    ///
    /// # Errors
    /// As [`LockStore::list`](crate::LockStore::list).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        let _ = (prefix, from, limit);
        Err(Error::Unsupported { operation: "list" })
    }

    /// Frees `key` (already checked) behind its holder's back; where [`Capabilities::evict`]
    /// says so. Default: [`Error::Unsupported`].
    ///
    /// # Errors
    /// As [`LockStore::evict`](crate::LockStore::evict).
    ///
    /// # Cancel safety
    /// As [`LockStore::evict`](crate::LockStore::evict).
    async fn evict(&self, key: &str) -> Result<bool> {
        let _ = key;
        Err(Error::Unsupported { operation: "evict" })
    }

    /// How much per-key state the store holds now. Default: `None`, the store does not count.
    ///
    /// # Errors
    /// As [`LockStore::per_key_state`](crate::LockStore::per_key_state).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Ok(None)
    }

    /// Notes an operator should see about this handle. Default: none.
    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }

    /// The environment the store's own lock tool gives a command run under `lease`. Default:
    /// none.
    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        let _ = lease;
        Vec::new()
    }
}
