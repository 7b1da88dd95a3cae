//! A granted lease's state: its lock node, its phase, and the delete that ends it (its
//! background task, the expiry, is in `expiry`).

use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_core::raw::drift;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::session::{Failure, Session};

/// Where a held lease is in its life; changed under the lock, so a release, an extend and the
/// expiry never both win.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Held: extend may confirm it.
    Held,
    /// A release took it (and may have to try again).
    Releasing,
    /// Past [`Held::hold_until`]: the expiry deletes its node; nothing confirms it again.
    Expired,
    /// Its node is known gone.
    Gone,
}

/// What a lease granted by this store carries ([`Lease::store_state`]).
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) session: Arc<Session>,
    /// The lock node's path.
    pub(crate) path: String,
    /// The lock node's `czxid`: the fencing token.
    pub(crate) czxid: i64,
    /// The node's data version as this lease last wrote it (0 from its create, 1 once a
    /// reader or permit marked it): what a relabel's compare-and-set expects.
    pub(crate) version: AtomicI32,
    pub(crate) phase: Mutex<Phase>,
    /// Until when the expiry keeps the node: the TTL, less its drift, after the last acquire
    /// or extend was sent. Later than the lease's local deadline, which counts from a request
    /// the leader provably heard of (`heard`): the key stays held for the whole TTL.
    pub(crate) hold_until: Mutex<Instant>,
    /// Its registration in the session's watch, set once the lease exists.
    pub(crate) watch_id: std::sync::OnceLock<u64>,
    /// Cancelled once the node is deleted by a release, so the expiry task ends.
    pub(crate) done: CancellationToken,
}

impl Drop for Held {
    /// The last clone of the lease is gone: its session counts as used until now.
    fn drop(&mut self) {
        self.session.touch();
    }
}

impl Held {
    /// The phase, under its lock.
    pub(crate) fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Until when the expiry keeps the node.
    pub(crate) fn hold_until(&self) -> Instant {
        *self
            .hold_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the node `ttl`, less its drift, after `sent_at` (an extend sent then was
    /// confirmed), never for less than before.
    pub(crate) fn hold_from(&self, sent_at: Instant, ttl: Duration) {
        let mut until = self
            .hold_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *until = (*until).max(sent_at + ttl - drift(ttl));
    }

    /// Its node is known gone (evicted, or its session expired): nothing confirms or writes it
    /// again, and the expiry task ends.
    pub(crate) fn gone(&self) {
        *self.phase() = Phase::Gone;
        self.done.cancel();
        self.forget();
    }

    /// Drops the lease from its session's watch.
    pub(crate) fn forget(&self) {
        if let Some(id) = self.watch_id.get() {
            self.session.leases.forget(*id);
        }
    }

    /// Deletes the lock node, retrying a lost connection while the session lives; gives whether
    /// this call deleted it (`false`: it was already gone).
    ///
    /// # Cancel safety
    /// The delete is sent when it is made; dropping the future may leave it deleted or not.
    pub(crate) async fn delete(&self) -> fencelock_core::Result<bool> {
        let what = "deleting a lock node";
        match self
            .session
            .call(what, || self.session.client.delete(&self.path, None))
            .await
        {
            Ok(()) => Ok(true),
            Err(Failure::NoNode) => Ok(false),
            Err(other) => Err(other.into_error(what)),
        }
    }
}
