//! The whole conformance suite against a real MariaDB started by test-servers. A lease is
//! forgotten by the store's own eviction (the factory's default): its session is killed.

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_mysql::{MysqlConfig, MysqlStore};
use test_servers::shared;

/// The shared server of this test process.
fn server_url() -> String {
    shared::mariadb().url()
}

struct MysqlFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for MysqlFactory {
    async fn handle(&self) -> DynLockStore {
        // Generous: other test processes may load this machine.
        let config =
            MysqlConfig::from_url(&format!("{}?connect_timeout=30", self.url)).expect("config");
        Arc::new(MysqlStore::connect(config).await.expect("connect"))
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let port = test_servers::closed_ports(1)[0];
        let config = MysqlConfig::from_url(&format!(
            "mysql://fencelock@127.0.0.1:{port}/fencelock?connect_timeout=1&command_timeout=1"
        ))
        .expect("config");
        Arc::new(MysqlStore::connect_lazy(config))
    }
}

fencelock_conformance::conformance_tests!(async { Arc::new(MysqlFactory { url: server_url() }) });
