//! `with_lock`: acquire, keep alive, run, release.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::keepalive::watch;
use crate::{BodyOutput, Error, Lease, LockStore, Mode, ReleaseOutcome, DEFAULT_TTL};

/// How [`with_lock`] acquires: `LockOptions::new().ttl(..).wait(..).mode(..)`.
///
/// `#[non_exhaustive]`: build it with [`LockOptions::new`] (or [`Default`]) and the builder
/// methods, so an option added later breaks no caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// The lease TTL (default [`DEFAULT_TTL`]); the lease is extended at a quarter of it.
    pub ttl: Duration,
    /// How long to wait for the key (default zero: one attempt).
    pub wait: Duration,
    /// The lock mode (default [`Mode::Exclusive`]).
    pub mode: Mode,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            mode: Mode::Exclusive,
        }
    }
}

impl LockOptions {
    /// Exclusive, one attempt, a TTL of [`DEFAULT_TTL`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lease TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Waits up to `wait` for the key.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Takes the key in `mode`: a reader ([`Mode::Shared`]) or a semaphore permit
    /// ([`Mode::Permit`]) where the store keeps them.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

/// What [`with_lock`] accepts as its store: a store, `dyn LockStore`, or an [`Arc`] of either,
/// including the [`DynLockStore`](crate::DynLockStore) that `fencelock::connect` returns.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lock store `with_lock` takes",
    note = "pass a store or an `Arc` of one by reference: `with_lock(&store, ..)`, or `with_lock(&*store, ..)` when `store` is already a reference"
)]
pub trait AsLockStore {
    /// The store behind it.
    fn as_lock_store(&self) -> &dyn LockStore;
}

impl<S: LockStore> AsLockStore for S {
    fn as_lock_store(&self) -> &dyn LockStore {
        self
    }
}

impl AsLockStore for dyn LockStore {
    fn as_lock_store(&self) -> &dyn LockStore {
        self
    }
}

impl<S: LockStore> AsLockStore for Arc<S> {
    fn as_lock_store(&self) -> &dyn LockStore {
        &**self
    }
}

impl AsLockStore for Arc<dyn LockStore> {
    fn as_lock_store(&self) -> &dyn LockStore {
        &**self
    }
}

/// Acquires `key`, runs `body` with the lease while keeping it alive, and releases it. The
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
/// use fencelock_core::{with_lock, DynLockStore, Error, LockOptions, MemoryStore};
///
/// let store: DynLockStore = Arc::new(MemoryStore::new());
/// let options = LockOptions::new().wait(Duration::from_secs(5));
/// let token = with_lock(&store, "nightly-export", options, |lease| async move {
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
pub fn with_lock<'a, R, F, Fut, T, E>(
    store: &'a R,
    key: &'a str,
    options: LockOptions,
    body: F,
) -> impl Future<Output = Result<T, E>> + 'a
where
    R: AsLockStore + ?Sized,
    F: FnOnce(Lease) -> Fut + 'a,
    Fut: Future<Output = Result<T, E>> + 'a,
    T: Send + 'static,
    E: From<Error> + 'a,
{
    // The store as `dyn LockStore` (a store's futures are boxed already, so this costs one
    // indirect call): an async body over a projection such as `R::Target` has a `Send` that
    // rustc cannot prove for every lifetime.
    run_locked(store.as_lock_store(), key, options, body)
}

async fn run_locked<F, Fut, T, E>(
    store: &dyn LockStore,
    key: &str,
    options: LockOptions,
    body: F,
) -> Result<T, E>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Send + 'static,
    E: From<Error>,
{
    let lease = if options.wait.is_zero() {
        store.try_acquire_as(key, options.ttl, options.mode).await?
    } else {
        store
            .acquire_as(key, options.ttl, options.wait, options.mode)
            .await?
    };
    let lost = CancellationToken::new();
    let output = tokio::select! {
        biased;
        why = watch(store, &lease, &lost) => Err(why),
        output = body(lease.clone()) => Ok(output),
    };
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
