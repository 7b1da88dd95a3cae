//! Shared by the integration tests: store handles with a generous connect timeout, and the
//! conformance suite's factory over any etcd URL (one member or a cluster).
#![allow(dead_code)]

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_etcd::{EtcdConfig, EtcdStore};

/// A connected store handle; `options` (`"&prefix=x"`) follow the generous connect timeout,
/// since other test processes may load this machine.
pub async fn store(url: &str, options: &str) -> EtcdStore {
    let config = EtcdConfig::from_url(&format!("{url}?connect_timeout=30{options}")).unwrap();
    EtcdStore::connect(config).await.expect("connect")
}

/// The conformance suite's handles on the etcd at `url`.
pub struct EtcdFactory {
    pub url: String,
}

#[async_trait]
impl StoreFactory for EtcdFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(store(&self.url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let config = EtcdConfig::from_url(&format!(
            "etcd://127.0.0.1:{}?connect_timeout=1&command_timeout=1",
            test_servers::closed_ports(1)[0]
        ))
        .expect("config");
        Arc::new(EtcdStore::connect_lazy(config).await.expect("lazy connect"))
    }
}
