//! How TTLs map to sessions on a real standalone server (`minSessionTimeout` 200 ms,
//! `maxSessionTimeout` 10 s): the shortest TTL, the refusal naming the server's limits, and one
//! session per class of TTL.

mod common;

use std::time::Duration;

use fencelock_core::{Acquire, Error, LockStore, Release, ReleaseOutcome};
use test_servers::zookeeper::{MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT};
use test_servers::ZookeeperEnsemble;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_server_would_lengthen_is_refused_naming_its_limits() {
    let store = common::store(&ZookeeperEnsemble::shared_standalone().url(), "").await;
    assert_eq!(store.min_session_timeout(), Some(MIN_SESSION_TIMEOUT));
    assert_eq!(store.capabilities().min_ttl, MIN_SESSION_TIMEOUT * 2);
    let short = MIN_SESSION_TIMEOUT * 2 - Duration::from_millis(1);
    match store.try_acquire("sessions:short", short).await {
        Err(Error::InvalidInput { what: "ttl", rule }) => {
            assert!(rule.contains("minimum"), "{rule}");
        }
        other => panic!("a TTL of {short:?} gave {other:?}"),
    }
    // The store's own rule, naming the server's limits, once past the shared bounds check.
    let lazy = fencelock_zookeeper::ZookeeperStore::connect_lazy(store.config().clone())
        .await
        .unwrap();
    match lazy.try_acquire("sessions:short", short).await {
        Err(Error::InvalidInput { what: "ttl", rule }) => {
            assert!(rule.contains("minSessionTimeout 200ms"), "{rule}");
        }
        other => panic!("a TTL of {short:?} gave {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_opens_one_session_per_class_of_ttl() {
    let store = common::store(&ZookeeperEnsemble::shared_standalone().url(), "").await;
    let ttls = [400u64, 500, 799, 800, 1_700, 60_000, 86_400_000].map(Duration::from_millis);
    for (i, ttl) in ttls.into_iter().enumerate() {
        let lease = store
            .try_acquire(&format!("sessions:class:{i}"), ttl)
            .await
            .unwrap();
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // 400 and 500 ms: 200 ms; 799 ms: 200 ms; 800 ms: 400 ms; 1.7 s: 800 ms; a minute and a
    // day: the server's maximum, on one session.
    let expected = [200, 400, 800, 10_000].map(Duration::from_millis);
    assert_eq!(store.session_timeouts().await, expected);
    assert_eq!(expected[3], MAX_SESSION_TIMEOUT);
}
