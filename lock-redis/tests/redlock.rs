//! The whole conformance suite against Redlock over five real, independent redis-servers.

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedlockConfig, RedlockStore};
use test_servers::{closed_ports, shared};

/// The five shared masters of this test process.
fn redlock_url() -> String {
    let hosts: Vec<String> = shared::redis_masters(5)
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    // Generous per-node timeouts: the cases run in parallel on a loaded machine.
    format!(
        "redlock://{}?connect_timeout=30s&command_timeout=2s",
        hosts.join(",")
    )
}

async fn store(url: &str) -> RedlockStore {
    RedlockStore::connect(RedlockConfig::from_url(url).expect("config"))
        .await
        .expect("connect")
}

struct RedlockFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for RedlockFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(store(&self.url).await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let hosts: Vec<String> = closed_ports(3)
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let url = format!(
            "redlock://{}?connect_timeout=1s&command_timeout=1s",
            hosts.join(",")
        );
        Arc::new(
            RedlockStore::connect_lazy(RedlockConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

fencelock_conformance::conformance_tests!(async {
    Arc::new(RedlockFactory { url: redlock_url() })
});

/// `drift_factor` widens the margin taken off the lease's validity (and the extend's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_factor_shortens_the_local_deadline() {
    use fencelock_core::{Acquire, Extend, Instant, Release};
    use std::time::Duration;

    let store = store(&format!("{}&drift_factor=0.5", redlock_url())).await;
    let ttl = Duration::from_secs(10);
    let lease = store
        .try_acquire("redlock:drift-factor", ttl)
        .await
        .expect("acquire");
    let answered = Instant::now();
    // Validity = TTL − elapsed − (TTL × 0.5 + 2 ms), counted from before the request: at
    // most 4.998 s after the answer (fencelock-core's own margin would leave 9.898 s).
    let margin = ttl / 2 + Duration::from_millis(2);
    assert!(
        lease.valid_until() <= answered + (ttl - margin),
        "the deadline is {:?} past the answer, more than TTL − drift",
        lease.valid_until() - answered
    );
    let first = lease.valid_until();
    store.extend(&lease).await.expect("extend");
    assert!(lease.valid_until() > first, "the extend moved the deadline");
    assert!(
        lease.valid_until() <= Instant::now() + (ttl - margin),
        "the extend kept the wider margin"
    );
    let _ = store.release(&lease).await.expect("release");
}
