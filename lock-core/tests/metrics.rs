//! What the `metrics` feature records, read back through a recording recorder (metrics-util's
//! `DebuggingRecorder`) on a current-thread runtime, so the keep-alive task records into it
//! too, under tokio's paused clock.
#![cfg(feature = "metrics")]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::metered::{BUSY, GRANTS, KEEP_ALIVE_FAILURES, LEASES_LOST, WAIT_TIMEOUTS};
use fencelock_core::{KeepAlive, LockStore, MemoryStore, Metered};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

const TTL: Duration = Duration::from_secs(3);

/// Runs `test` with a fresh recorder and returns every counter it recorded, as
/// `(name, store label, value)`.
fn counters<F: Future<Output = ()>>(test: F) -> Vec<(String, String, u64)> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime")
            .block_on(test)
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match (key.kind(), value) {
            (MetricKind::Counter, DebugValue::Counter(count)) => {
                let (_, key) = key.into_parts();
                let store = key
                    .labels()
                    .find(|label| label.key() == "store")
                    .map_or(String::new(), |label| label.value().to_owned());
                Some((key.name().to_owned(), store, count))
            }
            _ => None,
        })
        .collect()
}

fn count(counters: &[(String, String, u64)], name: &str, store: &str) -> u64 {
    counters
        .iter()
        .filter(|(n, s, _)| n == name && s == store)
        .map(|(_, _, count)| count)
        .sum()
}

#[test]
fn a_lost_lease_is_counted_under_its_store() {
    let recorded = counters(async {
        let memory = MemoryStore::new();
        let store = Arc::new(Metered::new(Arc::new(memory.clone()), "memory"));
        let lease = store.try_acquire("k", TTL).await.unwrap();
        let held = KeepAlive::start(store.clone(), lease);
        // An operator frees the key: the keep-alive's next extend is told the lease is gone.
        assert!(memory.evict("k").await.unwrap());
        held.lost().await;
    });
    assert_eq!(count(&recorded, LEASES_LOST, "memory"), 1, "{recorded:?}");
    assert_eq!(
        count(&recorded, KEEP_ALIVE_FAILURES, "memory"),
        1,
        "{recorded:?}"
    );
    assert_eq!(count(&recorded, GRANTS, "memory"), 1, "{recorded:?}");
}

#[test]
fn a_lease_lost_at_its_deadline_counts_each_failed_extend() {
    let recorded = counters(async {
        let memory = MemoryStore::new();
        let store = Arc::new(Metered::new(Arc::new(memory.clone()), "memory"));
        let lease = store.try_acquire("k", TTL).await.unwrap();
        let held = KeepAlive::start(store.clone(), lease);
        memory.set_reachable(false);
        held.lost().await;
    });
    assert_eq!(count(&recorded, LEASES_LOST, "memory"), 1, "{recorded:?}");
    assert!(
        count(&recorded, KEEP_ALIVE_FAILURES, "memory") >= 2,
        "the keep-alive retries before the deadline: {recorded:?}"
    );
}

#[test]
fn busy_answers_and_wait_timeouts_are_counted() {
    let recorded = counters(async {
        let store = Metered::new(Arc::new(MemoryStore::new()), "memory");
        let _held = store.try_acquire("k", TTL).await.unwrap();
        assert!(store.try_acquire("k", TTL).await.is_err());
        assert!(store
            .acquire("k", TTL, Duration::from_secs(1))
            .await
            .is_err());
    });
    assert_eq!(count(&recorded, GRANTS, "memory"), 1, "{recorded:?}");
    assert_eq!(count(&recorded, BUSY, "memory"), 1, "{recorded:?}");
    assert_eq!(count(&recorded, WAIT_TIMEOUTS, "memory"), 1, "{recorded:?}");
}

#[test]
fn a_store_that_is_not_metered_records_nothing() {
    let recorded = counters(async {
        let store = Arc::new(MemoryStore::new());
        let lease = store.try_acquire("k", TTL).await.unwrap();
        let held = KeepAlive::start(store.clone(), lease);
        assert!(store.evict("k").await.unwrap());
        held.lost().await;
    });
    assert!(recorded.is_empty(), "{recorded:?}");
}

#[test]
fn a_wrapped_store_is_still_reachable_by_its_type() {
    let store: fencelock_core::DynLockStore =
        Arc::new(Metered::new(Arc::new(MemoryStore::new()), "memory"));
    assert!(store.downcast_ref::<MemoryStore>().is_some());
    assert!(store.downcast_ref::<Metered>().is_some());
    assert_eq!(store.capabilities(), MemoryStore::new().capabilities());
}
