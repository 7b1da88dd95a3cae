//! Per-key state stays bounded: a key's fence expires one retention window after its last
//! acquire, on one server and on every Redlock node, and a key whose fence expired still gets
//! a greater token.
//!
//! CI locks 10,000 distinct keys; `FENCELOCK_KEYS=100000 cargo test -p fencelock-redis
//! --all-features --test retention` locks more.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{LockStore, ReleaseOutcome};
use fencelock_redis::{RedisConfig, RedisStore, RedlockConfig, RedlockStore};
use test_servers::shared;
use tokio::time::{sleep, Instant};

/// The window the tests use: above their `max_ttl` of 1 s, as every window must be.
const OPTIONS: &str = "retention=2s&max_ttl=1s";
/// How long the keys may take to go once the window has passed: Redis expires keys in the
/// background (and SCAN skips expired ones), so this is generous, never tuned.
const GONE_WITHIN: Duration = Duration::from_secs(20);

/// How many distinct keys to lock: 10,000, or `FENCELOCK_KEYS`.
fn key_count(default: usize) -> usize {
    std::env::var("FENCELOCK_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn prefix(what: &str) -> String {
    format!("retention-{what}-{:016x}:", rand::random::<u64>())
}

/// Locks and releases `keys` distinct keys, 64 at a time.
async fn lock_and_release_each(store: Arc<dyn LockStore>, keys: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (store, next) = (store.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return;
                }
                let key = format!("order-{i}");
                let lease = store
                    .try_acquire(&key, Duration::from_secs(1))
                    .await
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                let outcome = store.release(&lease).await.expect("release");
                assert_eq!(outcome, ReleaseOutcome::Released, "{key}");
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("worker");
    }
}

/// The live keys under `prefix` on the server at `url` (SCAN skips keys past their expiry; the
/// test prefixes hold no character MATCH treats specially).
async fn live_keys(url: &str, prefix: &str) -> usize {
    let mut conn = common::admin(url).await;
    let mut cursor = 0u64;
    let mut count = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = common::admin_query(
            &mut conn,
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(1000),
        )
        .await;
        count += batch.len();
        if next == 0 {
            return count;
        }
        cursor = next;
    }
}

/// Polls until no key is left under `prefix`, and returns how many were left at the end.
async fn wait_until_gone(url: &str, prefix: &str) -> usize {
    let until = Instant::now() + GONE_WITHIN;
    loop {
        let left = live_keys(url, prefix).await;
        if left == 0 || Instant::now() >= until {
            return left;
        }
        sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_of_ten_thousand_distinct_keys_expire_after_the_retention_window() {
    let url = shared::redis().url();
    let prefix = prefix("many");
    let store = common::store(&url, &format!("prefix={prefix}&{OPTIONS}")).await;
    let keys = key_count(10_000);
    let started = Instant::now();
    lock_and_release_each(Arc::new(store), keys).await;
    let took = started.elapsed();
    // Right after, one fence per key (fewer only if the window already passed for some).
    let after = live_keys(&url, &prefix).await;
    if took < Duration::from_secs(1) {
        assert_eq!(after, keys, "one fence per key locked within the window");
    }
    assert!(
        after <= keys,
        "{after} keys for {keys} locked: more than a fence each"
    );
    let left = wait_until_gone(&url, &prefix).await;
    assert_eq!(
        left, 0,
        "{left} of {keys} fences left {GONE_WITHIN:?} after the 2 s window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_fence_expired_gets_a_greater_token() {
    let url = shared::redis().url();
    let prefix = prefix("token");
    let store = common::store(&url, &format!("prefix={prefix}&{OPTIONS}")).await;
    let first = store
        .try_acquire("order-1", Duration::from_millis(500))
        .await
        .expect("acquire");
    let mut admin = common::admin(&url).await;
    let fence = format!("{prefix}{{order-1}}:fence");
    let pttl: i64 = common::admin_query(&mut admin, redis::cmd("PTTL").arg(&fence)).await;
    assert!(
        (1..=2_000).contains(&pttl),
        "the fence expires within the 2 s window, PTTL {pttl}"
    );
    assert_eq!(
        store.release(&first).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(wait_until_gone(&url, &prefix).await, 0, "the fence expired");
    let second = store
        .try_acquire("order-1", Duration::from_millis(500))
        .await
        .expect("acquire again");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "token {} after the fence of {} expired",
        second.fencing_token(),
        first.fencing_token()
    );
    assert_eq!(
        store.release(&second).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn the_store_declares_its_window_and_max_ttl() {
    let config =
        RedisConfig::from_url(&format!("{}?{OPTIONS}", shared::redis().url())).expect("config");
    let store = RedisStore::connect(config).await.expect("connect");
    let capabilities = store.capabilities();
    assert_eq!(capabilities.retention, Some(Duration::from_secs(2)));
    assert_eq!(capabilities.max_ttl, Duration::from_secs(1));
    let over = store.try_acquire("k", Duration::from_millis(1_001)).await;
    assert!(
        matches!(
            over,
            Err(fencelock_core::Error::InvalidInput { what: "ttl", .. })
        ),
        "a TTL over max_ttl is refused: {over:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_fences_expire_on_every_node_and_tokens_still_grow() {
    let masters = shared::redis_masters(3);
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let prefix = prefix("redlock");
    let config = RedlockConfig::from_url(&format!(
        "redlock://{}?prefix={prefix}&command_timeout=2s&connect_timeout=30s&{OPTIONS}",
        hosts.join(",")
    ))
    .expect("config");
    let store = Arc::new(RedlockStore::connect(config).await.expect("connect"));
    let first = store
        .try_acquire("order-1", Duration::from_millis(500))
        .await
        .expect("acquire");
    assert_eq!(
        store.release(&first).await.expect("release"),
        ReleaseOutcome::Released
    );
    lock_and_release_each(store.clone(), key_count(10_000) / 10).await;
    for master in masters {
        let left = wait_until_gone(&master.url(), &prefix).await;
        assert_eq!(left, 0, "{left} fences left on {}", master.port());
    }
    let second = store
        .try_acquire("order-1", Duration::from_millis(500))
        .await
        .expect("acquire again");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "token {} after every node's fence of {} expired",
        second.fencing_token(),
        first.fencing_token()
    );
    assert_eq!(
        store.release(&second).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Handles with the short window, for the conformance case.
struct ShortWindow {
    url: String,
}

#[fencelock_conformance::async_trait]
impl fencelock_conformance::StoreFactory for ShortWindow {
    async fn handle(&self) -> fencelock_core::DynLockStore {
        Arc::new(common::store(&self.url, &format!("prefix={}&{OPTIONS}", prefix("case"))).await)
    }

    async fn unreachable_handle(&self) -> fencelock_core::DynLockStore {
        let url = format!(
            "redis://127.0.0.1:{}?connect_timeout=1s&command_timeout=1s&{OPTIONS}",
            test_servers::closed_ports(1)[0]
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_case_for_the_retention_window_passes() {
    let factory = Arc::new(ShortWindow {
        url: shared::redis().url(),
    });
    let outcome =
        fencelock_conformance::run_case("tokens_increase_after_the_retention_window", factory)
            .await;
    assert_eq!(outcome, fencelock_conformance::Outcome::Passed);
}
