//! The whole conformance suite against a real PostgreSQL started by test-servers.

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_postgres::{PostgresConfig, PostgresStore};
use test_servers::{closed_ports, shared};

struct PostgresFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for PostgresFactory {
    async fn handle(&self) -> DynLockStore {
        // Generous: other test processes may load this machine.
        let separator = if self.url.contains('?') { '&' } else { '?' };
        let config =
            PostgresConfig::from_url(&format!("{}{separator}connect_timeout=30", self.url))
                .expect("config");
        Arc::new(PostgresStore::connect(config).await.expect("connect"))
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let port = closed_ports(1)[0];
        let config = PostgresConfig::from_url(&format!(
            "postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=1&command_timeout=1"
        ))
        .expect("config");
        Arc::new(PostgresStore::connect_lazy(config))
    }
}

fencelock_conformance::conformance_tests!(async {
    Arc::new(PostgresFactory {
        url: shared::postgres().url(),
    })
});
