//! The descriptor the `fencelock` facade lists.

use std::sync::Arc;

use fencelock_core::raw::BoxFuture;
use fencelock_core::{DynLockStore, Result, StoreKind};

use crate::config::{ZookeeperConfig, URL_SCHEMES};
use crate::store::ZookeeperStore;

/// ZooKeeper: `zookeeper://host:port[,host:port…][/chroot]` and `zookeepers://` (TLS, crate
/// feature `tls`), see [`ZookeeperConfig`].
pub const ZOOKEEPER: StoreKind = StoreKind::new("zookeeper", URL_SCHEMES, "zookeeper", connect)
    .with_eviction("deletes the holder's lock node")
    .with_example("zookeeper://zk1:2181,zk2:2181,zk3:2181/apps")
    .with_tls_example("zookeepers://zk1:2281,zk2:2281/apps?tls_ca=/etc/fencelock/ca.pem&tls_cert=/etc/fencelock/client.pem&tls_key=/etc/fencelock/client.key")
    .with_options(crate::config::option_docs);

fn connect(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = ZookeeperStore::connect(ZookeeperConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}
