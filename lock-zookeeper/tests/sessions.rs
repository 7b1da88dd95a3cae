//! How TTLs map to sessions on a real standalone server (`tickTime` 100 ms,
//! `minSessionTimeout` 200 ms, `maxSessionTimeout` 10 s): the shortest TTL (twice the server's
//! minimum) and the longest (its maximum), the refusals naming the server's limits, and a
//! session per TTL rounded up to the tick (two TTLs of one tick share one, two of different
//! ticks do not), at most one per tick between the shortest TTL and the longest.

mod common;

use std::time::Duration;

use fencelock_core::{raw::drift, Error, Lease, LockStore, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::zookeeper::{MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT, TICK};
use test_servers::ZookeeperEnsemble;
use tokio::time::Instant;

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

async fn store() -> ZookeeperStore {
    common::store(&ZookeeperEnsemble::shared_standalone().url(), "").await
}

/// A handle that learns the server's limits only at its first acquire, so a TTL outside them
/// meets the store's own rule (which names the limits), not the shared bounds check.
async fn lazy(store: &ZookeeperStore) -> ZookeeperStore {
    ZookeeperStore::connect_lazy(store.config().clone())
        .await
        .expect("a lazy handle")
}

/// Takes `key` for `ttl` and checks the lease's TTL and deadline: the TTL rounded up to the
/// tick, and the deadline that TTL, less its drift, after a request sent before the call
/// returned (one the leader has provably heard of, so possibly before the call: the crate
/// docs), still ahead when the call started.
async fn take(store: &ZookeeperStore, key: &str, ttl: Duration) -> Lease {
    let started = Instant::now();
    let lease = store.try_acquire(key, ttl).await.expect("a free key");
    let returned = Instant::now();
    let granted = ttl.as_millis().div_ceil(TICK.as_millis()) as u32 * TICK;
    assert_eq!(lease.ttl(), granted, "the TTL granted for {ttl:?}");
    let deadline = lease.valid_until() + drift(granted);
    assert!(started < lease.valid_until() && deadline <= returned + granted);
    lease
}

async fn release(store: &ZookeeperStore, leases: Vec<Lease>) {
    for lease in leases {
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_bounds_are_the_servers_session_limits() {
    let store = store().await;
    assert_eq!(store.min_session_timeout(), Some(MIN_SESSION_TIMEOUT));
    assert_eq!(store.max_session_timeout(), Some(MAX_SESSION_TIMEOUT));
    let capabilities = store.capabilities();
    assert_eq!(capabilities.min_ttl, MIN_SESSION_TIMEOUT * 2);
    assert_eq!(capabilities.max_ttl, MAX_SESSION_TIMEOUT);
    assert_eq!(capabilities.ttl_granularity, TICK);
    release(
        &store,
        vec![
            take(&store, "sessions:bounds:min", MIN_SESSION_TIMEOUT * 2).await,
            take(&store, "sessions:bounds:max", MAX_SESSION_TIMEOUT).await,
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_server_would_lengthen_is_refused_naming_its_limits() {
    let store = store().await;
    let short = MIN_SESSION_TIMEOUT * 2 - ms(1);
    match store.try_acquire("sessions:short", short).await {
        Err(Error::InvalidInput { what: "ttl", rule }) => {
            assert!(rule.contains("minimum of 400ms"), "{rule}");
        }
        other => panic!("a TTL of {short:?} gave {other:?}"),
    }
    match lazy(&store)
        .await
        .try_acquire("sessions:short", short)
        .await
    {
        Err(Error::InvalidInput { what: "ttl", rule }) => {
            assert!(
                rule.contains(&format!("minSessionTimeout {MIN_SESSION_TIMEOUT:?}"))
                    && rule.contains(&format!("maxSessionTimeout {MAX_SESSION_TIMEOUT:?}")),
                "{rule}"
            );
        }
        other => panic!("a TTL of {short:?} gave {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_server_would_shorten_is_refused_naming_its_maximum() {
    let store = store().await;
    for long in [MAX_SESSION_TIMEOUT + ms(1), MAX_SESSION_TIMEOUT * 6] {
        match store.try_acquire("sessions:long", long).await {
            Err(Error::InvalidInput { what: "ttl", rule }) => {
                assert!(
                    rule.contains(&format!("maximum of {MAX_SESSION_TIMEOUT:?}")),
                    "{rule}"
                );
            }
            other => panic!("a TTL of {long:?} gave {other:?}"),
        }
        match lazy(&store).await.try_acquire("sessions:long", long).await {
            Err(Error::InvalidInput { what: "ttl", rule }) => {
                assert!(
                    rule.contains(&format!("maxSessionTimeout of {MAX_SESSION_TIMEOUT:?}")),
                    "{rule}"
                );
            }
            other => panic!("a TTL of {long:?} gave {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_of_one_tick_share_a_session_and_of_different_ticks_do_not() {
    let store = store().await;
    // Held at once: 1,501 ms, 1,550 ms and 1,600 ms round up to the 1.6 s tick; 1,601 ms to
    // the 1.7 s one.
    let mut leases = Vec::new();
    for (i, ttl) in [1_501, 1_550, 1_600, 1_601].into_iter().enumerate() {
        leases.push(take(&store, &format!("sessions:tick:{i}"), ms(ttl)).await);
    }
    assert_eq!(
        store.session_timeouts().await,
        [ms(400), ms(1_600), ms(1_700)],
        "the handle's first session (of the shortest TTL), then one per tick"
    );
    release(&store, leases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_opens_at_most_one_session_per_tick_between_the_limits() {
    let store = store().await;
    // One per 100 ms from 400 ms to the server's maximum, the handle's first (400 ms) among
    // them.
    let shortest = MIN_SESSION_TIMEOUT * 2;
    let bound = (MAX_SESSION_TIMEOUT - shortest).as_millis() / TICK.as_millis() + 1;
    assert_eq!(store.max_sessions(), Some(bound as u64));
    let ttls = [
        400, 450, 499, 500, 999, 1_000, 5_000, 9_901, 10_000, 400, 5_000,
    ];
    for (i, ttl) in ttls.into_iter().enumerate() {
        let lease = take(&store, &format!("sessions:bound:{i}"), ms(ttl)).await;
        release(&store, vec![lease]).await;
    }
    let timeouts = store.session_timeouts().await;
    assert_eq!(
        timeouts,
        [400, 500, 1_000, 5_000, 10_000].map(ms),
        "one session per tick the TTLs round up to"
    );
    assert!(timeouts.len() as u128 <= bound);
}
