//! The whole conformance suite against a real PostgreSQL started by test-servers.

use std::sync::Arc;

use conformance::{async_trait, StoreFactory};
use lock_core::{DynLockStore, Lease};
use lock_postgres::{PostgresConfig, PostgresStore};
use sqlx::Connection;
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

    /// An operator ends the holder's session: the lock goes with it.
    async fn forget(&self, lease: &Lease) {
        let lock_id = lock_postgres::lock_id(
            lock_postgres::DEFAULT_SCHEMA,
            lock_postgres::DEFAULT_TABLE,
            lock_postgres::DEFAULT_NAMESPACE,
            lease.key(),
        );
        let mut admin = sqlx::PgConnection::connect(&self.url)
            .await
            .expect("admin connection");
        sqlx::query(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks
              WHERE locktype = 'advisory' AND granted AND objsubid = 1
                AND classid = (($1::int8 >> 32) & 4294967295)::oid
                AND objid = ($1::int8 & 4294967295)::oid",
        )
        .bind(lock_id)
        .fetch_all(&mut admin)
        .await
        .expect("terminate the holder's backend");
        let _ = admin.close().await;
    }
}

conformance::conformance_tests!(async {
    Arc::new(PostgresFactory {
        url: shared::postgres().url(),
    })
});
