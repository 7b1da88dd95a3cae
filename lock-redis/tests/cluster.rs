//! The whole conformance suite on a real Redis Cluster (3 masters, each with a replica) started
//! by test-servers, one per test binary, through `redis+cluster://`.

mod common;

use std::sync::{Arc, OnceLock};

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore};
use test_servers::{closed_ports, RedisCluster, RedisServer};

/// The binary's one cluster, started by the first case that needs it.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisServer::start_cluster(3, 1).expect("a Redis Cluster"))
}

struct ClusterFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for ClusterFactory {
    async fn handle(&self) -> DynLockStore {
        let store = common::store(&self.url, "").await;
        assert!(store.config().is_cluster());
        Arc::new(store)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let ports = closed_ports(3);
        let url = format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?connect_timeout=1s&command_timeout=1s",
            ports[0], ports[1], ports[2]
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

fencelock_conformance::conformance_tests!(async {
    let url = tokio::task::spawn_blocking(|| cluster().url())
        .await
        .expect("cluster start");
    Arc::new(ClusterFactory { url })
});
