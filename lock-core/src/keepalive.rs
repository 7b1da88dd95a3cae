//! Automatic extension of a held lease and the signal that it is lost.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::raw::LeaseExt;
use crate::{Error, Lease, LockStore, SharedError};

/// Why a kept-alive lease was lost: fencelock's account, or the store's own, and the store's
/// error behind it. Cloned into every [`Error::LeaseLost`] built from it.
#[derive(Debug, Clone)]
pub(crate) struct Lost {
    reason: String,
    source: Option<SharedError>,
}

impl Lost {
    fn because(reason: impl Into<String>) -> Self {
        Lost {
            reason: reason.into(),
            source: None,
        }
    }

    /// The store's answer to an extend that cannot be retried. A `LeaseLost` is the store's
    /// own account and is passed on as it is, so the message says "lost" once; any other error
    /// is kept, typed, as the source.
    fn from_store(error: Error) -> Self {
        match error {
            Error::LeaseLost { reason, source, .. } => Lost { reason, source },
            other => Lost {
                reason: "an extend failed and cannot be retried".into(),
                source: Some(SharedError::new(other)),
            },
        }
    }

    /// The reason, and the store's error behind it (one level: a store error's own message
    /// already names its client's error).
    pub(crate) fn describe(&self) -> String {
        match &self.source {
            Some(source) => format!("{}: {source}", self.reason),
            None => self.reason.clone(),
        }
    }

    /// The [`Error::LeaseLost`] for `lease`.
    pub(crate) fn error(&self, lease: &Lease) -> Error {
        Error::LeaseLost {
            key: lease.key().to_owned(),
            token: lease.fencing_token(),
            reason: self.reason.clone(),
            source: self.source.clone(),
        }
    }
}

/// Extends `lease` until it can no longer be confirmed, then cancels `lost` and returns the
/// [`Error::LeaseLost`] that says why; returns `None` at once if `lost` is (or gets) cancelled
/// by someone else.
///
/// Each extend is planned from what the lease has left, at `min(ttl / 4, remaining / 2)`, so a
/// lease handed out with little validity (a slow acquire, Redlock's drift, a waiter that came
/// back late) is extended in time, and a lease the store dropped early is found out within a
/// third of the TTL (a quarter plus the extend's round trip).
///
/// A failed extend that may be retried (store unreachable) is retried after a short jittered
/// delay, again within what is left. It returns as soon as the store says the lease is gone
/// ([`Error::LeaseLost`] from an extend, passed on as it is; any other error that cannot be
/// retried is kept as the source), or [`Revocation::revoke`](crate::raw::Revocation::revoke) is
/// called by the store, or the local deadline ([`Lease::valid_until`]) passes without a
/// confirmation, which is before the store's own expiry.
///
/// With the `metrics` feature, a lease granted through a [`Metered`](crate::Metered) store
/// counts each failed extend (`fencelock_keep_alive_failures_total`) and its loss
/// (`fencelock_leases_lost_total`) under that store.
///
/// # Errors
/// None as such: the returned error is the outcome, of kind
/// [`LeaseLost`](crate::ErrorKind::LeaseLost).
///
/// # Cancel safety
/// Dropping the future stops the extensions; the lease then expires at its TTL unless released.
pub async fn keep_alive<S>(store: &S, lease: &Lease, lost: &CancellationToken) -> Option<Error>
where
    S: LockStore + ?Sized,
{
    let why = watch(store, lease, lost).await?;
    lost.cancel();
    Some(why.error(lease))
}

/// [`keep_alive`], keeping the cause in a form every later caller can turn into an error.
/// `stop` ends it between two extends, never during one: an extend in flight is answered
/// first, so the session it runs on is not left mid-statement for the release that follows
/// (a dropped SQL client future can leave its connection mid-packet).
pub(crate) async fn watch<S>(store: &S, lease: &Lease, stop: &CancellationToken) -> Option<Lost>
where
    S: LockStore + ?Sized,
{
    let period = (lease.ttl() / 4).max(Duration::from_millis(1));
    let revocation = lease.revocation();
    let lose = |why: Lost| {
        tracing::warn!(key = lease.key(), token = lease.fencing_token(), reason = %why.describe(), "lease lost");
        #[cfg(feature = "metrics")]
        crate::metered::lease_lost(lease);
        Some(why)
    };
    let revoked = || {
        let why = revocation.reason().unwrap_or("no reason given");
        Lost::because(format!("the store reported the lease gone: {why}"))
    };
    let mut next = plan(lease, period);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            () = revocation.revoked() => return lose(revoked()),
            () = sleep_until(lease.valid_until()) => {
                return lose(Lost::because("the local deadline passed before an extend was confirmed"));
            }
            () = sleep_until(next) => {}
        }
        let extend = timeout_at(lease.valid_until(), store.extend(lease));
        let answer = tokio::select! {
            biased;
            () = revocation.revoked() => return lose(revoked()),
            answer = extend => answer,
        };
        #[cfg(feature = "metrics")]
        if !matches!(answer, Ok(Ok(()))) {
            crate::metered::keep_alive_failed(lease);
        }
        match answer {
            Err(_) => {
                return lose(Lost::because(
                    "the local deadline passed while an extend was in flight",
                ));
            }
            Ok(Ok(())) => next = plan(lease, period),
            Ok(Err(error)) if error.is_retryable() => {
                tracing::debug!(key = lease.key(), %error, "extend failed, will retry");
                next = Instant::now() + retry_delay(period).min(lease.remaining() / 2);
            }
            Ok(Err(error)) => return lose(Lost::from_store(error)),
        }
    }
}

/// When to extend next: a quarter of the TTL from now, or sooner if the lease has less than
/// twice that left, so the extend is answered well before the local deadline.
fn plan(lease: &Lease, period: Duration) -> Instant {
    Instant::now() + period.min(lease.remaining() / 2)
}

/// A quarter of the extend period, jittered by ±25%, so retries fit several times before the
/// deadline and many holders do not retry in step.
fn retry_delay(period: Duration) -> Duration {
    let base = period / 4;
    base.mul_f64(rand::random_range(0.75..1.25))
        .max(Duration::from_millis(1))
}

/// A lease kept alive by a background task, with a signal that fires when it is lost.
///
/// Created by [`KeepAlive::start`]. Dropping it stops the extensions at once, abandoning an
/// extend in flight (it does not release); [`stop`](KeepAlive::stop) lets that extend finish.
/// A [`LockGuard`](crate::LockGuard) is one of these with the release added: prefer it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use fencelock_core::{KeepAlive, LockStore, MemoryStore};
///
/// let store = Arc::new(MemoryStore::new());
/// let lease = store.try_acquire("report", Duration::from_secs(3)).await?;
/// let held = KeepAlive::start(store.clone(), lease);
/// tokio::select! {
///     () = held.lost() => return Err(held.lost_error().expect("lost, so an error")),
///     () = tokio::time::sleep(Duration::from_secs(4)) => {} // the work, past one TTL
/// }
/// store.release(&held.stop().await).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct KeepAlive {
    lease: Lease,
    lost: CancellationToken,
    reason: Arc<Mutex<Option<Lost>>>,
    /// Ends the task between two extends ([`stop`](Self::stop)).
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl KeepAlive {
    /// Starts extending `lease` on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start<S>(store: Arc<S>, lease: Lease) -> Self
    where
        S: LockStore + ?Sized + 'static,
    {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        let task = tokio::spawn({
            let (lease, lost, stop, reason) =
                (lease.clone(), lost.clone(), stop.clone(), reason.clone());
            async move {
                if let Some(why) = watch(&*store, &lease, &stop).await {
                    // Recorded before the signal, so whoever wakes on it finds the reason.
                    *reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
                    lost.cancel();
                }
            }
        });
        KeepAlive {
            lease,
            lost,
            reason,
            stop,
            task,
        }
    }

    /// The lease being kept alive.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Completes once the lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing, and a later call still completes.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// A token cancelled once the lease is lost, to hand to other tasks. It is a child of the
    /// keep-alive's own: cancelling it (or dropping its `drop_guard`) stops nothing.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Why the lease was lost, once it is, with the store's error behind it.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost_cause().map(|lost| lost.describe())
    }

    /// The [`Error::LeaseLost`] that says why the lease was lost, once it is: the store's own,
    /// or one whose [`source`](std::error::Error::source) is the store's error.
    pub fn lost_error(&self) -> Option<Error> {
        self.lost_cause().map(|lost| lost.error(&self.lease))
    }

    pub(crate) fn lost_cause(&self) -> Option<Lost> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops extending and hands the lease back, typically to release it. An extend already
    /// sent is answered first (at most until the lease's local deadline,
    /// [`Lease::valid_until`]), so the release that follows never finds the store's session
    /// mid-statement; otherwise it returns at once.
    ///
    /// # Cancel safety
    /// Dropping the future drops the keep-alive, which abandons an extend in flight; the lease
    /// is not released and expires at its TTL unless released from a clone.
    pub async fn stop(mut self) -> Lease {
        self.stop.cancel();
        // The task ends on its own; a panic in it has nothing left to report here.
        let _ = (&mut self.task).await;
        self.lease.clone()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}
