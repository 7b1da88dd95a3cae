//! `with_lock`: acquire, keep alive, run, release.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{keep_alive, BodyOutput, Error, Lease, LockStore, ReleaseOutcome, Result};

/// How [`with_lock`] acquires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    /// The lease TTL; the lease is extended at a quarter of it (see [`keep_alive`](crate::keep_alive)).
    pub ttl: Duration,
    /// How long to wait for the key; zero makes one attempt.
    pub wait: Duration,
}

impl LockOptions {
    /// One attempt with `ttl`.
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            wait: Duration::ZERO,
        }
    }

    /// Waits up to `wait` for the key.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

/// Acquires `key`, runs `body` with the lease while keeping it alive, and releases it.
///
/// - If the lease is lost while `body` runs, `body` is dropped at its next await point and the
///   call returns [`Error::LeaseLost`]. `body`'s writes must still carry the fencing token,
///   since a paused process cannot be stopped in time.
/// - If `body` completes and the release finds the lease already gone, the work may have
///   overlapped another holder: the call returns [`Error::LostAfterBody`], which is not
///   retryable and carries the output ([`Error::take_output`]).
/// - If `body` completes and the release cannot be done (the store is unreachable), the output
///   is returned all the same: the work is done, and returning an error would invite a retry
///   loop to run it twice. The failed release is logged through `tracing`; the lease expires
///   at its TTL.
///
/// # Cancel safety
/// Dropping the future drops `body` and stops the extensions without releasing: the lease then
/// expires at its TTL.
pub async fn with_lock<S, F, Fut, T>(
    store: &S,
    key: &str,
    options: LockOptions,
    body: F,
) -> Result<T>
where
    S: LockStore + ?Sized,
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let lease = if options.wait.is_zero() {
        store.try_acquire(key, options.ttl).await?
    } else {
        store.acquire(key, options.ttl, options.wait).await?
    };
    let lost = CancellationToken::new();
    let reason = Mutex::new(None);
    let output = tokio::select! {
        biased;
        () = keep_alive(store, &lease, &lost, &reason) => None,
        output = body(lease.clone()) => Some(output),
    };
    match output {
        Some(output) => match store.release(&lease).await {
            Ok(ReleaseOutcome::Released) => Ok(output),
            Ok(ReleaseOutcome::Lost) => Err(Error::LostAfterBody {
                key: lease.key().to_owned(),
                token: lease.fencing_token(),
                reason: "the lease was already gone when the body finished".into(),
                output: BodyOutput::new(output),
            }),
            Err(error) => {
                tracing::warn!(
                    key = lease.key(),
                    token = lease.fencing_token(),
                    %error,
                    "the body finished but its lease could not be released; it expires at its TTL"
                );
                Ok(output)
            }
        },
        None => {
            // Best effort: the store may still hold it if only confirmation failed.
            let _ = store.release(&lease).await;
            let why = reason
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .unwrap_or_default();
            Err(Error::lost(&lease, format!("body cancelled: {why}")))
        }
    }
}
