//! Revoking an acquire's etcd lease off the caller's path: a lease is revoked from a spawned
//! task when the acquire that owns it is dropped or fails, or when a release leaves it
//! unused, so no queue entry of it blocks others until its TTL.

use std::sync::Arc;

use crate::client::Connection;

/// Revokes an etcd lease from a spawned task when dropped armed: a dropped or failed acquire
/// leaves no queue entry behind to block others until its TTL.
pub(crate) struct RevokeOnDrop<'s> {
    etcd: &'s Arc<Connection>,
    lease_id: i64,
    armed: bool,
}

impl<'s> RevokeOnDrop<'s> {
    pub(crate) fn new(etcd: &'s Arc<Connection>, lease_id: i64) -> Self {
        RevokeOnDrop {
            etcd,
            lease_id,
            armed: true,
        }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    /// Revokes in place (a `try_acquire` that found the key busy, a wait that ran out). Stays
    /// armed until the revoke succeeded, so a drop or a failure still revokes from a spawned
    /// task.
    pub(crate) async fn now(mut self) {
        match self
            .etcd
            .revoke("revoke a queued lease", self.lease_id)
            .await
        {
            Ok(_) => self.armed = false,
            Err(error) => tracing::debug!(%error, "revoke failed; trying again in the background"),
        }
    }
}

impl Drop for RevokeOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            spawn_revoke(self.etcd, self.lease_id);
        }
    }
}

/// Revokes `lease_id` in the background, bounded by the command timeout. Outside a runtime (or
/// if the revoke fails) the lease expires at its TTL instead.
pub(crate) fn spawn_revoke(etcd: &Arc<Connection>, lease_id: i64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let etcd = Arc::clone(etcd);
    runtime.spawn(async move {
        if let Err(error) = etcd.revoke("revoke a lease", lease_id).await {
            tracing::debug!(%error, lease_id, "background revoke failed; the lease expires at its TTL");
        }
    });
}
