//! The conformance suite against SQLite: several handles (each with its own connections) on
//! one database file in a fresh directory per case; the unreachable handle is a database that
//! another holder keeps locked beyond the command timeout. A lease is forgotten by the store's
//! own eviction (the factory's default).

mod support;

use std::sync::Arc;
use std::time::Duration;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_sqlite::{SqliteConfig, SqliteStore};
use support::Scratch;

struct SqliteFactory {
    dir: Scratch,
}

impl SqliteFactory {
    fn config(&self) -> SqliteConfig {
        SqliteConfig::new(self.dir.db())
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(support::store(&self.dir.db()).await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        // Locked by another holder: every operation waits out the (short) timeouts.
        let config = self
            .config()
            .with_command_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_secs(1));
        Arc::new(SqliteStore::unreachable(&config).expect("a locked-out handle"))
    }
}

fencelock_conformance::conformance_tests!(async {
    Arc::new(SqliteFactory {
        dir: Scratch::new("conformance"),
    })
});
