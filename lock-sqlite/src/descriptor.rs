//! The descriptor the `fencelock` facade lists.

use std::sync::Arc;

use fencelock_core::raw::BoxFuture;
use fencelock_core::{DynLockStore, Result, StoreKind};

use crate::config::{SqliteConfig, URL_SCHEMES};
use crate::store::SqliteStore;

/// A SQLite file shared by the processes of one host: `sqlite://`, see [`SqliteConfig`].
pub const SQLITE: StoreKind = StoreKind::new("sqlite", URL_SCHEMES, "sqlite", connect)
    .with_eviction("clears the key's holder in its row (never its counter) and wakes its waiters")
    .with_unreachable(unreachable)
    .with_example("sqlite:///var/lib/myapp/locks.db")
    .with_options(crate::config::option_docs);

fn connect(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = SqliteStore::connect(SqliteConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}

/// A file has no port to close: the unreachable handle is a fresh database kept locked
/// ([`SqliteStore::unreachable`]), with the URL's table and timeouts.
fn unreachable(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = SqliteStore::unreachable(&SqliteConfig::from_url(url)?)?;
        Ok(Arc::new(store) as DynLockStore)
    })
}
