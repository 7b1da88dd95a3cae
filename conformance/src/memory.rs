//! The factory for the in-memory reference store.

use std::sync::Arc;

use async_trait::async_trait;
use fencelock_core::{DynLockStore, MemoryStore};

use crate::StoreFactory;

/// Handles to one [`MemoryStore`]; its unreachable handle is a second store switched off.
#[derive(Debug, Clone, Default)]
pub struct MemoryFactory {
    store: MemoryStore,
}

impl MemoryFactory {
    /// A factory over a fresh store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl StoreFactory for MemoryFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(self.store.clone())
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let store = MemoryStore::new();
        store.set_reachable(false);
        Arc::new(store)
    }
}
