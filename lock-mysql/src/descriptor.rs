//! The descriptor the `fencelock` facade lists.

use std::sync::Arc;

use fencelock_core::raw::BoxFuture;
use fencelock_core::{DynLockStore, Result, StoreKind};

use crate::config::{MysqlConfig, URL_SCHEMES};
use crate::store::MysqlStore;

/// MySQL and MariaDB named locks: `mysql://` and `mariadb://`, see [`MysqlConfig`].
pub const MYSQL: StoreKind = StoreKind::new("mysql", URL_SCHEMES, "mysql", connect)
    .with_eviction("kills the holder's session (KILL CONNECTION), which frees its lock")
    .with_example("mysql://u@h/db")
    .with_tls_example("mysql://locks@db.internal/app?tls_ca=/etc/fencelock/ca.pem")
    .with_options(crate::config::option_docs);

fn connect(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = MysqlStore::connect(MysqlConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}
