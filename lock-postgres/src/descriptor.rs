//! The descriptor the `fencelock` facade lists.

use std::sync::Arc;

use fencelock_core::raw::BoxFuture;
use fencelock_core::{DynLockStore, Result, StoreKind};

use crate::config::{PostgresConfig, URL_SCHEMES};
use crate::store::PostgresStore;

/// PostgreSQL advisory locks: `postgres://` and `postgresql://`, see [`PostgresConfig`].
pub const POSTGRES: StoreKind = StoreKind::new("postgres", URL_SCHEMES, "postgres", connect)
    .with_eviction("ends the holder's session (pg_terminate_backend), which frees its lock")
    .with_example("postgres://u@h/db")
    .with_tls_example("postgres://locks@pg.internal/app?tls_ca=/etc/fencelock/ca.pem")
    .with_options(crate::config::option_docs);

fn connect(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = PostgresStore::connect(PostgresConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}
