//! Automatic extension of a held lease and the signal that it is lost.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::{Extend, Lease};

/// Extends `lease` until it can no longer be confirmed, then cancels `lost` and returns.
/// Returns at once if `lost` is already cancelled.
///
/// Each extend is planned from what the lease has left, at `min(ttl / 4, remaining / 2)`, so a
/// lease handed out with little validity (a slow acquire, Redlock's drift, a waiter that came
/// back late) is extended in time, and a lease the store dropped early is found out within a
/// third of the TTL (a quarter plus the extend's round trip).
///
/// A failed extend that may be retried (store unreachable) is retried after a short jittered
/// delay, again within what is left. `lost` is cancelled as soon as the store says the lease is
/// gone ([`Error::LeaseLost`](crate::Error::LeaseLost) from an extend, or
/// [`Revocation::revoke`](crate::Revocation::revoke) called by the store), or when the local deadline
/// ([`Lease::valid_until`]) passes without a confirmation, which is before the store's own
/// expiry. The reason is written to `reason`.
///
/// With the `metrics` feature, a lease granted through a [`Metered`](crate::Metered) store
/// counts each failed extend (`fencelock_keep_alive_failures_total`) and its loss
/// (`fencelock_leases_lost_total`) under that store.
///
/// # Cancel safety
/// Dropping the future stops the extensions; the lease then expires at its TTL unless released.
/// `lost` is not cancelled by the drop.
pub async fn keep_alive<S>(
    store: &S,
    lease: &Lease,
    lost: &CancellationToken,
    reason: &Mutex<Option<String>>,
) where
    S: Extend + ?Sized,
{
    let period = (lease.ttl() / 4).max(Duration::from_millis(1));
    let revocation = lease.revocation();
    let lose = |why: String| {
        tracing::warn!(key = lease.key(), token = lease.fencing_token(), reason = %why, "lease lost");
        #[cfg(feature = "metrics")]
        crate::metered::lease_lost(lease);
        *reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        lost.cancel();
    };
    let revoked = || {
        let why = revocation.reason().unwrap_or("no reason given");
        format!("the store reported the lease gone: {why}")
    };
    let mut next = plan(lease, period);
    loop {
        tokio::select! {
            biased;
            () = lost.cancelled() => return,
            () = revocation.revoked() => return lose(revoked()),
            () = sleep_until(lease.valid_until()) => {
                return lose("the local deadline passed before an extend was confirmed".into());
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
                return lose("the local deadline passed while an extend was in flight".into());
            }
            Ok(Ok(())) => next = plan(lease, period),
            Ok(Err(error)) if error.is_retryable() => {
                tracing::debug!(key = lease.key(), %error, "extend failed, will retry");
                next = Instant::now() + retry_delay(period).min(lease.remaining() / 2);
            }
            Ok(Err(error)) => return lose(error.to_string()),
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
/// Created by [`KeepAlive::start`]. Dropping it stops the extensions (it does not release).
#[derive(Debug)]
pub struct KeepAlive {
    lease: Lease,
    lost: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
    task: JoinHandle<()>,
}

impl KeepAlive {
    /// Starts extending `lease` on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start<S>(store: Arc<S>, lease: Lease) -> Self
    where
        S: Extend + ?Sized + 'static,
    {
        let lost = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        let task = tokio::spawn({
            let (lease, lost, reason) = (lease.clone(), lost.clone(), reason.clone());
            async move { keep_alive(&*store, &lease, &lost, &reason).await }
        });
        KeepAlive {
            lease,
            lost,
            reason,
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

    /// A token cancelled once the lease is lost, to hand to other tasks.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Why the lease was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops extending and hands the lease back, typically to release it.
    pub fn stop(self) -> Lease {
        self.task.abort();
        self.lease.clone()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}
