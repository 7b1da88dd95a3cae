//! A store that wraps another: every method forwards to the inner store unless the wrapper
//! says otherwise.

use std::any::Any;
use std::fmt::Debug;

use async_trait::async_trait;

use super::AcquireRequest;
use crate::{
    Capabilities, Instant, KeyStatus, Lease, ListCursor, Listing, LockStore, PerKeyState,
    ReleaseOutcome, Result,
};

/// A store that wraps another [`LockStore`] (metrics, fault injection, a test's probe): every
/// method forwards to [`Wrapper::inner`] unless the wrapper overrides it, so a method added to
/// the contract later is forwarded too, never answered by a default. Every `Wrapper` is a
/// [`Store`](super::Store), and so a [`LockStore`] whose requests are checked before they reach
/// the wrapper.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use fencelock_core::raw;
/// use fencelock_core::{DynLockStore, Lease, LockStore, MemoryStore, Result};
///
/// /// Counts the extends that reach the store.
/// #[derive(Debug)]
/// struct Counting(DynLockStore, AtomicUsize);
///
/// // Named by its path, as `raw::Store` is: its methods share their names with `LockStore`'s.
/// #[async_trait]
/// impl raw::Wrapper for Counting {
///     fn inner(&self) -> &dyn LockStore {
///         &*self.0
///     }
///
///     async fn extend(&self, lease: &Lease) -> Result<()> {
///         self.1.fetch_add(1, Ordering::SeqCst);
///         self.inner().extend(lease).await
///     }
/// }
/// # let _ = Counting(Arc::new(MemoryStore::new()), AtomicUsize::new(0));
/// ```
#[async_trait]
pub trait Wrapper: Debug + Send + Sync + Any {
    /// The store this one wraps.
    fn inner(&self) -> &dyn LockStore;

    /// The `store` field of the tracing spans. Default: `"wrapper"`.
    fn name(&self) -> &'static str {
        "wrapper"
    }

    /// Default: the inner store's.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// Default: none (the inner store checks its own when the request reaches it).
    ///
    /// # Errors
    /// As [`Store::check`](super::Store::check).
    fn check(&self, request: &AcquireRequest<'_>) -> Result<()> {
        let _ = request;
        Ok(())
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`Store::acquire`](super::Store::acquire).
    ///
    /// # Cancel safety
    /// As [`Store::acquire`](super::Store::acquire).
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        self.inner().acquire_request(*request).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::release`].
    ///
    /// # Cancel safety
    /// As [`LockStore::release`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.inner().release(lease).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::extend`].
    ///
    /// # Cancel safety
    /// As [`LockStore::extend`].
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.inner().extend(lease).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::status`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.inner().status(key).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::relabel`].
    ///
    /// # Cancel safety
    /// As [`LockStore::relabel`].
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        self.inner().relabel(lease, label).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::next_status`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        self.inner().next_status(key, seen, until).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::list`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.inner().list(prefix, from, limit).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::evict`].
    ///
    /// # Cancel safety
    /// As [`LockStore::evict`].
    async fn evict(&self, key: &str) -> Result<bool> {
        self.inner().evict(key).await
    }

    /// Default: forwarded.
    ///
    /// # Errors
    /// As [`LockStore::per_key_state`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        self.inner().per_key_state().await
    }

    /// Default: forwarded.
    fn diagnostics(&self) -> Vec<String> {
        self.inner().diagnostics()
    }

    /// Default: forwarded.
    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        self.inner().lease_env(lease)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<W: Wrapper> super::Store for W {
    fn name(&self) -> &'static str {
        Wrapper::name(self)
    }

    fn capabilities(&self) -> Capabilities {
        Wrapper::capabilities(self)
    }

    fn check(&self, request: &AcquireRequest<'_>) -> Result<()> {
        Wrapper::check(self, request)
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        Wrapper::acquire(self, request).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        Wrapper::release(self, lease).await
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        Wrapper::extend(self, lease).await
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        Wrapper::status(self, key).await
    }

    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        Wrapper::list(self, prefix, from, limit).await
    }

    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        Wrapper::relabel(self, lease, label).await
    }

    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        Wrapper::next_status(self, key, seen, until).await
    }

    async fn evict(&self, key: &str) -> Result<bool> {
        Wrapper::evict(self, key).await
    }

    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Wrapper::per_key_state(self).await
    }

    fn diagnostics(&self) -> Vec<String> {
        Wrapper::diagnostics(self)
    }

    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        Wrapper::lease_env(self, lease)
    }
}
