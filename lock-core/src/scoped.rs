//! `with_lock`: acquire, keep alive, run, release.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::keepalive::watch;
use crate::{BodyOutput, Error, Lease, LockRequest, ReleaseOutcome};

/// Acquires what `request` asks for (`store.lock(key)` with its TTL, wait and mode), runs
/// `body` with the lease while keeping it alive, and releases it. The
/// body returns a `Result` whose error type can hold a fencelock [`Error`] (`Error` itself,
/// `anyhow::Error`, `Box<dyn Error + Send + Sync>`, your own `From<Error>`), and so does
/// `with_lock`: one `?`, no `Result` in a `Result`. Errors of this crate reach `E` through
/// `E::from`, so keep the [`Error`] in `E` (or downcast to it) to get at
/// [`Error::take_output`] and [`Error::kind`].
///
/// - If the lease is lost while `body` runs, `body` is dropped at its next await point and the
///   call returns [`Error::LeaseLost`]. `body`'s writes must still carry the fencing token,
///   since a paused process cannot be stopped in time.
/// - If `body` returns an error, the key is released and that error is returned.
/// - If `body` succeeds and the release finds the lease already gone, the work may have
///   overlapped another holder: the call returns [`Error::LostAfterBody`], which is not
///   retryable and carries the output ([`Error::take_output`]).
/// - If `body` succeeds and the release cannot be done (the store is unreachable), the output
///   is returned all the same: the work is done, and returning an error would invite a retry
///   loop to run it twice. The failed release is logged through `tracing`; the lease expires
///   at its TTL.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use fencelock_core::{with_lock, DynLockStore, Error, LockStoreExt, MemoryStore};
///
/// let store: DynLockStore = Arc::new(MemoryStore::new());
/// let request = store.lock("nightly-export").wait(Duration::from_secs(5));
/// let token = with_lock(request, |lease| async move {
///     // ... pass lease.fencing_token() with every write ...
///     Ok::<_, Error>(lease.fencing_token())
/// })
/// .await?;
/// assert!(token > 0);
/// # Ok(()) }
/// ```
///
/// # Errors
/// Those of the acquire ([`Contended`](crate::ErrorKind::Contended),
/// [`Unavailable`](crate::ErrorKind::Unavailable), [`InvalidInput`](crate::ErrorKind::InvalidInput),
/// [`Unsupported`](crate::ErrorKind::Unsupported), [`Store`](crate::ErrorKind::Store)),
/// [`LeaseLost`](crate::ErrorKind::LeaseLost) as above, and the body's own errors.
///
/// # Cancel safety
/// Dropping the future drops `body` and stops the extensions without releasing: the lease then
/// expires at its TTL.
pub async fn with_lock<F, Fut, T, E>(request: LockRequest, body: F) -> Result<T, E>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Send + 'static,
    E: From<Error>,
{
    let lease = request.lease().await?;
    let store = request.store();
    let key = lease.key();
    let stop = CancellationToken::new();
    let watching = watch(store, &lease, &stop);
    tokio::pin!(watching);
    let output = tokio::select! {
        biased;
        why = &mut watching => Err(why),
        output = body(lease.clone()) => Ok(output),
    };
    if output.is_ok() {
        // An extend in flight is answered before the release below uses the same session.
        stop.cancel();
        let _ = watching.await;
    }
    let output = match output {
        Ok(output) => output,
        Err(why) => {
            // Best effort: the store may still hold it if only confirmation failed.
            let _ = store.release(&lease).await;
            let error = match why {
                Some(why) => why.error(&lease),
                None => Error::lost(&lease, "the keep-alive stopped"),
            };
            return Err(error.into());
        }
    };
    let output = match output {
        Ok(output) => output,
        Err(error) => {
            if let Err(release) = store.release(&lease).await {
                tracing::debug!(key, %release, "the body failed and its lease could not be released; it expires at its TTL");
            }
            return Err(error);
        }
    };
    match store.release(&lease).await {
        Ok(ReleaseOutcome::Released) => Ok(output),
        Ok(ReleaseOutcome::Lost) => Err(Error::LostAfterBody {
            key: lease.key().to_owned(),
            token: lease.fencing_token(),
            reason: "the lease was already gone when the body finished".into(),
            output: BodyOutput::new(output),
        }
        .into()),
        Err(error) => {
            tracing::warn!(
                key = lease.key(),
                token = lease.fencing_token(),
                %error,
                "the body finished but its lease could not be released; it expires at its TTL"
            );
            Ok(output)
        }
    }
}
