//! The whole conformance suite against a real Redis started by test-servers, in both layouts:
//! fencelock's own, and the plain one (`layout=plain`, the lock is the key itself).

mod common;

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore};
use test_servers::{closed_ports, shared};

struct RedisFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for RedisFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(common::store(&self.url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let url = format!(
            "redis://127.0.0.1:{}?connect_timeout=1s&command_timeout=1s",
            closed_ports(1)[0]
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

fencelock_conformance::conformance_tests!(async {
    Arc::new(RedisFactory {
        url: shared::redis().url(),
    })
});

/// The same cases (but `HOLD_CASES`) with every lock named as `SET NX PX` clients name it. Waits are not declared
/// notified there (peers publish nothing), so the notified-wait case does not apply.
mod plain_layout {
    use std::sync::Arc;

    use fencelock_conformance::{async_trait, StoreFactory};
    use fencelock_core::DynLockStore;
    use fencelock_redis::{Layout, RedisConfig, RedisStore};
    use test_servers::{closed_ports, shared};

    struct PlainFactory {
        url: String,
    }

    #[async_trait]
    impl StoreFactory for PlainFactory {
        async fn handle(&self) -> DynLockStore {
            let store = super::common::store(&self.url, "layout=plain").await;
            assert_eq!(store.config().layout(), Layout::Plain);
            Arc::new(store)
        }

        async fn unreachable_handle(&self) -> DynLockStore {
            let url = format!(
                "redis://127.0.0.1:{}?layout=plain&connect_timeout=1s&command_timeout=1s",
                closed_ports(1)[0]
            );
            Arc::new(
                RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                    .expect("lazy handle"),
            )
        }
    }

    /// Every case but `HOLD_CASES` (they hold a lease over several TTLs through the extend
    /// that other cases exercise in this layout, 4 to 15 s each), four at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_suite_passes_in_the_plain_layout() {
        let factory = Arc::new(PlainFactory {
            url: shared::redis().url(),
        });
        fencelock_conformance::expect_cases_except(factory, 4, fencelock_conformance::HOLD_CASES)
            .await;
    }
}
