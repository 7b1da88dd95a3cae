//! The whole conformance suite against a real three-member etcd cluster started by
//! test-servers: every handle is given all three endpoints.

use std::sync::{Arc, OnceLock};

use conformance::{async_trait, StoreFactory};
use lock_core::{DynLockStore, Lease};
use lock_etcd::{EtcdConfig, EtcdStore};
use test_servers::EtcdCluster;

/// One cluster for every test of this file. test-servers kills it when the test process exits
/// (parent-death signal), although a static is never dropped.
static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();

fn cluster_url() -> String {
    CLUSTER
        .get_or_init(|| EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}")))
        .url()
}

struct EtcdFactory {
    url: String,
}

impl EtcdFactory {
    async fn connect(&self) -> EtcdStore {
        // Generous: other test processes may load this machine.
        let config =
            EtcdConfig::from_url(&format!("{}?connect_timeout=30", self.url)).expect("config");
        EtcdStore::connect(config).await.expect("connect")
    }
}

#[async_trait]
impl StoreFactory for EtcdFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(self.connect().await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let config = EtcdConfig::from_url(&format!(
            "etcd://127.0.0.1:{port}?connect_timeout=1&command_timeout=1"
        ))
        .expect("config");
        Arc::new(EtcdStore::connect_lazy(config).await.expect("lazy connect"))
    }

    /// An operator deletes the holder's entry (and revokes its lease) behind its back.
    async fn forget(&self, lease: &Lease) {
        let evicted = self
            .connect()
            .await
            .evict(lease.key())
            .await
            .expect("evict");
        assert!(evicted, "nothing held {:?} to forget", lease.key());
    }
}

conformance::conformance_tests!(async { Arc::new(EtcdFactory { url: cluster_url() }) });
