//! The whole conformance suite against a real single-member etcd started by test-servers, in
//! both layouts: fencelock's own, and etcd's `Mutex` names (`layout=etcd`).

mod common;

use std::sync::Arc;

use common::EtcdFactory;
use test_servers::shared;

fencelock_conformance::conformance_tests!(async {
    Arc::new(EtcdFactory {
        url: shared::etcd().url(),
    })
});

/// The same cases (but `HOLD_CASES`) with every lock named as `etcdctl lock` names it: the empty prefix, unescaped
/// keys, `{key}/{lease id in hex}` entries, the granting reply's revision as the token.
mod etcd_layout {
    use std::sync::Arc;

    use fencelock_conformance::{async_trait, StoreFactory};
    use fencelock_core::DynLockStore;
    use fencelock_etcd::{EtcdConfig, EtcdStore, Layout};
    use test_servers::shared;

    use super::common::store;

    struct EtcdLayoutFactory {
        url: String,
    }

    #[async_trait]
    impl StoreFactory for EtcdLayoutFactory {
        async fn handle(&self) -> DynLockStore {
            let store = store(&self.url, "&layout=etcd").await;
            assert_eq!(store.config().layout(), Layout::Etcd);
            assert_eq!(store.config().prefix(), "");
            Arc::new(store)
        }

        async fn unreachable_handle(&self) -> DynLockStore {
            let config = EtcdConfig::from_url(&format!(
                "etcd://127.0.0.1:{}?layout=etcd&connect_timeout=1&command_timeout=1",
                test_servers::closed_ports(1)[0]
            ))
            .expect("config");
            Arc::new(EtcdStore::connect_lazy(config).await.expect("lazy connect"))
        }
    }

    /// Every case but `HOLD_CASES` (they hold a lease over several TTLs through the extend
    /// that other cases exercise in this layout, 4 to 15 s each), four at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_suite_passes_in_the_etcd_layout() {
        let factory = Arc::new(EtcdLayoutFactory {
            url: shared::etcd().url(),
        });
        fencelock_conformance::expect_cases_except(factory, 4, fencelock_conformance::HOLD_CASES)
            .await;
    }
}
