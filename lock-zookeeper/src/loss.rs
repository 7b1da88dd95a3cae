//! The background task of a session: its loss watcher, and the leases it revokes.
//!
//! A session is lost when ZooKeeper expires it (`Expired`), when it is closed, when it has
//! been disconnected for [`loss_delay`] of its negotiated timeout (past that, the ensemble may
//! expire it and delete its lock nodes at any moment, so its leases are revoked first), or when
//! a reconnection negotiated a shorter timeout than its leases were granted. A reconnection
//! before the loss delay, at the same timeout or a longer one, keeps the session and its leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_core::raw::{drift, Revocation};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

/// How long after the client saw its connection drop a session's leases stay valid:
/// `0.35 × timeout − drift(timeout)`.
///
/// The client declares a connection lost after `2/5` of the negotiated timeout without a byte
/// from the server, checked every `1/20` of it, so the last reply came at most `0.45 ×
/// timeout` before the disconnection is seen; the server touched the session when that reply's
/// request arrived, and expires it no earlier than `timeout` after. What is left, `0.55 ×
/// timeout`, less a fifth of the timeout for that request's round trip and the drift margin,
/// is the delay: the loss signal fires before the ensemble can expire the session as long as a
/// round trip takes less than a fifth of the session timeout.
pub(crate) fn loss_delay(timeout: Duration) -> Duration {
    (timeout * 7 / 20).saturating_sub(drift(timeout))
}

/// The leases granted on one session that are still held, and whether the session is lost.
#[derive(Debug)]
pub(crate) struct SessionLeases {
    /// The session's id, for the log line of its loss.
    session_id: zk::SessionId,
    /// The held leases' revocations, by a registration number.
    leases: Mutex<HashMap<u64, Revocation>>,
    next: AtomicU64,
    /// Cancelled once the session is lost (expired, closed, or disconnected too long): its
    /// leases are revoked and no new lease is granted on it.
    ended: CancellationToken,
}

impl SessionLeases {
    pub(crate) fn new(session_id: zk::SessionId) -> Self {
        SessionLeases {
            session_id,
            leases: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            ended: CancellationToken::new(),
        }
    }

    /// Whether the session is lost: no lease may be granted on it.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Completes once the session is lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn ended(&self) {
        self.ended.cancelled().await
    }

    /// Registers a granted lease's revocation, revoked when the session is lost (at once if it
    /// already is). Returns the number to [`forget`](Self::forget) it by.
    pub(crate) fn watch(&self, revocation: Revocation) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, revocation.clone());
        if self.is_ended() {
            revocation.revoke("the ZooKeeper session of the lease was lost as it was granted");
        }
        id
    }

    /// Drops a lease that is released or expired from the session's watch.
    pub(crate) fn forget(&self, id: u64) {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Marks the session lost and revokes every lease on it, for `reason`.
    fn end(&self, reason: &str) {
        self.ended.cancel();
        let leases: Vec<Revocation> = self
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, revocation)| revocation)
            .collect();
        if !leases.is_empty() {
            tracing::warn!(
                session = ?self.session_id,
                leases = leases.len(),
                reason,
                "ZooKeeper session lost; its leases are revoked"
            );
        }
        for revocation in leases {
            revocation.revoke(reason);
        }
    }
}

/// The background task of a session: ends it on `Expired`, `Closed` or `AuthFailed`, when a
/// disconnection lasts [`loss_delay`], and when a reconnection negotiates less than `timeout`
/// (the timeout its leases were granted); a reconnection before the delay keeps it.
///
/// It holds the session's leases, not the session: it ends when `dropped` is cancelled (the
/// session dropped) or the session is lost.
pub(crate) async fn watch_state(
    leases: Arc<SessionLeases>,
    mut states: zk::StateWatcher,
    dropped: CancellationToken,
    timeout: Duration,
) {
    let end = |reason: &str| leases.end(reason);
    let mut disconnected_since: Option<Instant> = None;
    let mut negotiated = timeout;
    // The client may have reconnected before this task watched it.
    if let Some(reason) = renegotiated(&states, &mut negotiated, timeout) {
        end(&reason);
        return;
    }
    loop {
        let lost_at = disconnected_since.map(|since| since + loss_delay(timeout));
        let state = tokio::select! {
            () = dropped.cancelled() => return,
            state = states.changed() => state,
            () = sleep_until(lost_at) => {
                end(&format!(
                    "the ZooKeeper session was disconnected for {:?}, past which the ensemble may \
                     expire it (negotiated session timeout {timeout:?})",
                    loss_delay(timeout)
                ));
                return;
            }
        };
        match state {
            zk::SessionState::Disconnected => {
                disconnected_since.get_or_insert_with(Instant::now);
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                disconnected_since = None;
                if let Some(reason) = renegotiated(&states, &mut negotiated, timeout) {
                    end(&reason);
                    return;
                }
            }
            terminal => {
                end(&format!("the ZooKeeper session ended: {terminal:?}"));
                return;
            }
        }
    }
}

/// Why the session's leases are lost, if its latest connection negotiated less than `timeout`:
/// the ensemble now expires it that much sooner after its last heartbeat, before their
/// deadlines. `last` is the timeout last seen, so a longer one (the leases' deadlines still come
/// first; a dead holder's key stays held up to it) is logged once per change.
fn renegotiated(
    states: &zk::StateWatcher,
    last: &mut Duration,
    timeout: Duration,
) -> Option<String> {
    let negotiated = states.negotiated_session_timeout();
    if negotiated < timeout {
        return Some(format!(
            "the ZooKeeper session reconnected with a timeout of {negotiated:?}, below the \
             {timeout:?} its leases were granted (the server's maxSessionTimeout was lowered), so \
             the ensemble may expire it before their deadlines"
        ));
    }
    if negotiated != std::mem::replace(last, negotiated) && negotiated > timeout {
        tracing::warn!(
            ?negotiated,
            ?timeout,
            "a ZooKeeper session reconnected with a longer timeout than its leases' TTL: they \
             stay valid, but a dead holder's key stays held up to the longer timeout"
        );
    }
    None
}

/// Sleeps until `at`, or forever for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
