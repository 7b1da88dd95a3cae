//! Shared by the integration tests: store handles with a generous connect timeout, and the
//! conformance suite's factory over any ZooKeeper URL (standalone or an ensemble).
#![allow(dead_code)]

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_zookeeper::{ZookeeperConfig, ZookeeperStore};

/// A connected store handle; the generous connect timeout (other test processes may load this
/// machine) joins `url`'s query, if it has one, and `options` (`"&prefix=/x"`) follow it.
pub(crate) async fn store(url: &str, options: &str) -> ZookeeperStore {
    let separator = if url.contains('?') { '&' } else { '?' };
    let config =
        ZookeeperConfig::from_url(&format!("{url}{separator}connect_timeout=30{options}")).unwrap();
    ZookeeperStore::connect(config).await.expect("connect")
}

/// The conformance suite's handles on the ZooKeeper at `url`.
pub(crate) struct ZookeeperFactory {
    pub url: String,
}

#[async_trait]
impl StoreFactory for ZookeeperFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(store(&self.url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let config = ZookeeperConfig::from_url(&format!(
            "zookeeper://127.0.0.1:{}?connect_timeout=1&command_timeout=1",
            test_servers::closed_ports(1)[0]
        ))
        .expect("config");
        Arc::new(
            ZookeeperStore::connect_lazy(config)
                .await
                .expect("lazy connect"),
        )
    }
}

/// A plain client of the ZooKeeper at `url` (no chroot, no auth), to look at or write the nodes
/// the store made.
pub(crate) async fn raw(url: &str) -> zookeeper_client::Client {
    let config = ZookeeperConfig::from_url(url).expect("config");
    zookeeper_client::Client::connector()
        .with_session_timeout(std::time::Duration::from_secs(10))
        .connect(&config.endpoints().join(","))
        .await
        .expect("a raw ZooKeeper client")
}

/// A prefix no other test uses.
pub(crate) fn fresh_prefix(name: &str) -> String {
    format!("/{name}-{}", fencelock_core::OwnerId::random())
}
