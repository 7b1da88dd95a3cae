//! The descriptor the `fencelock` facade lists.

use std::sync::Arc;

use fencelock_core::raw::BoxFuture;
use fencelock_core::{DynLockStore, Result, StoreKind};

use crate::config::{EtcdConfig, URL_SCHEMES};
use crate::store::EtcdStore;

/// etcd: `etcd://host:port[,host:port…]` and `etcds://` (TLS, crate feature `tls`), see
/// [`EtcdConfig`].
pub const ETCD: StoreKind = StoreKind::new("etcd", URL_SCHEMES, "etcd", connect)
    .with_eviction("deletes the holder's queue entry and revokes its etcd lease")
    .with_example("etcd://h:2379")
    .with_tls_example("etcds://etcd1:2379,etcd2:2379?tls_ca=/etc/fencelock/ca.pem&tls_cert=/etc/fencelock/client.pem&tls_key=/etc/fencelock/client.key")
    .with_options(crate::config::option_docs);

fn connect(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = EtcdStore::connect(EtcdConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}
