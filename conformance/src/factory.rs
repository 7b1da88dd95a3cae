//! What a store hands the suite: fresh handles and two fault hooks.

use std::sync::Arc;

use async_trait::async_trait;
use fencelock_core::{DynLockStore, KeepAlive, Lease, LockStore};

/// One store under test.
///
/// Every method must be callable many times; cases run concurrently and use their own random
/// keys, so one factory (and one server) serves the whole suite.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// A new handle to the store, with connections of its own where the store has them. Leases
    /// from one handle must exclude leases from every other handle.
    async fn handle(&self) -> DynLockStore;

    /// A handle to the same kind of store that cannot be reached (for example a closed port, or
    /// an address that swallows packets). Every operation on it must fail with a retryable
    /// error within the store's configured timeouts.
    async fn unreachable_handle(&self) -> DynLockStore;

    /// Makes the store forget `lease` behind its holder's back, as a store that lost its data or
    /// a session killed by an operator would: afterwards the key is free for others. Used to
    /// prove that the lost signal fires and that stale leases cannot act.
    ///
    /// The default is the operator's eviction,
    /// [`LockStore::evict`](fencelock_core::LockStore::evict), through a fresh
    /// [`handle`](Self::handle); it panics if that fails or finds nobody holding the key. A
    /// store without eviction ([`Capabilities::evict`](fencelock_core::Capabilities) is false)
    /// overrides this with its own way of losing a lease.
    async fn forget(&self, lease: &Lease) {
        let key = lease.key();
        match self.handle().await.evict(key).await {
            Ok(true) => {}
            Ok(false) => panic!("nothing held {key:?} to forget"),
            Err(error) => panic!("cannot evict {key:?} to forget the lease: {error}"),
        }
    }

    /// Starts keeping `lease` alive through `store` for the keep-alive cases. The default is
    /// [`KeepAlive::start`], which every store should keep: the suite's own tests override it
    /// with deliberately broken keep-alives to prove that those cases can fail.
    ///
    /// # Panics
    /// Outside a tokio runtime, as [`KeepAlive::start`].
    fn keep_alive(&self, store: Arc<dyn LockStore>, lease: Lease) -> KeepAlive {
        KeepAlive::start(store, lease)
    }
}
