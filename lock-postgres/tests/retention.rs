//! Per-key state stays bounded: fence rows not bumped for a retention window are removed in
//! bounded background batches, and a key whose row was removed still gets a greater token
//! (fence scheme 2: tokens are at least the bumping transaction's id). A table made by an
//! earlier build (plain counters) is refused until upgraded, and its tokens then jump upward.
//!
//! CI locks 10,000 distinct keys; `FENCELOCK_KEYS=100000 cargo test -p fencelock-postgres
//! --all-features --test retention` locks more.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{admin, store};
use fencelock_core::{Acquire, Error, LockStore, Release, ReleaseOutcome};
use fencelock_postgres::{PostgresConfig, PostgresStore};
use test_servers::shared;
use tokio::time::{sleep, Instant};

/// The window the tests use: above their `max_ttl` of 1 s, as every window must be.
const OPTIONS: &str = "retention=2s&max_ttl=1s";
/// How long the rows may take to go once the window has passed: generous, never tuned.
const GONE_WITHIN: Duration = Duration::from_secs(30);

/// How many distinct keys to lock: 10,000, or `FENCELOCK_KEYS`.
fn key_count() -> usize {
    std::env::var("FENCELOCK_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

/// A fence table of the test's own (the server is this test process's alone).
fn table(what: &str) -> String {
    format!("table=retention_{what}")
}

/// Locks and releases `keys` distinct keys, 16 at a time (one connection each).
async fn lock_and_release_each(store: &PostgresStore, keys: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..16 {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_rows_of_ten_thousand_distinct_keys_go_after_the_retention_window() {
    let url = shared::postgres().url();
    let store = store(&url, &format!("{}&{OPTIONS}", table("many"))).await;
    let keys = key_count();
    lock_and_release_each(&store, keys).await;
    let after = store.fence_rows().await.expect("count");
    assert!(after <= keys as u64, "{after} rows for {keys} keys");
    sleep(Duration::from_secs(2)).await;
    // Releases start the background removal; one key stays in use, as a service's would.
    let until = Instant::now() + GONE_WITHIN;
    let mut left;
    loop {
        let lease = store
            .try_acquire("in-use", Duration::from_secs(1))
            .await
            .expect("acquire");
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        left = store.fence_rows().await.expect("count");
        if left <= 1 || Instant::now() >= until {
            break;
        }
        sleep(Duration::from_millis(250)).await;
    }
    assert!(
        left <= 1,
        "{left} rows left of {keys} keys {GONE_WITHIN:?} after the window (only `in-use` may stay)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_fence_row_was_removed_gets_a_greater_token() {
    let url = shared::postgres().url();
    let store = store(&url, &format!("{}&{OPTIONS}", table("token"))).await;
    let mut last = 0;
    for round in 0..3 {
        let lease = store
            .try_acquire("order-1", Duration::from_secs(1))
            .await
            .expect("acquire");
        assert!(
            lease.fencing_token() > last,
            "round {round}: token {} after {last}, whose row was removed",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        sleep(Duration::from_millis(2_200)).await;
        let removed = store.remove_idle_fences().await.expect("remove");
        assert_eq!(removed, 1, "round {round}: the idle row goes");
        assert_eq!(store.fence_rows().await.expect("count"), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_bumped_within_the_window_is_kept() {
    let url = shared::postgres().url();
    let store = store(&url, &format!("{}&{OPTIONS}", table("kept"))).await;
    let lease = store
        .try_acquire("order-1", Duration::from_secs(1))
        .await
        .expect("acquire");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(store.remove_idle_fences().await.expect("remove"), 0);
    assert_eq!(store.fence_rows().await.expect("count"), 1);
    let capabilities = store.capabilities();
    assert_eq!(capabilities.retention, Some(Duration::from_secs(2)));
    assert_eq!(capabilities.max_ttl, Duration::from_secs(1));
}

/// The fence bump of a fence-scheme-1 store (lock-id scheme 2, plain counters).
const FENCE_SCHEME_1_BUMP: &str = "INSERT INTO {fence} AS f
        (namespace, key, lock_id, lock_id_scheme, token, owner, holder_pid, ttl_ms, updated_at)
    VALUES ($1, $2, 7, 2, 1, 'old', pg_backend_pid(), 30000, clock_timestamp())
    ON CONFLICT (namespace, key) DO UPDATE SET token = f.token + 1
    RETURNING f.token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_of_fence_scheme_1_is_refused_until_upgraded_and_tokens_jump_upward() {
    let url = shared::postgres().url();
    let options = table("scheme1");
    let config =
        PostgresConfig::from_url(&format!("{url}?connect_timeout=30&{options}")).expect("config");
    let fence = config.fence_table();
    // The table as the build before fence scheme 2 made it.
    let ddl = config.fence_table_ddl();
    let column = "    fence_scheme   smallint    NOT NULL
        CONSTRAINT fencelock_fence_scheme_2 CHECK (fence_scheme = 2),\n";
    assert!(ddl.contains(column), "{ddl}");
    let mut admin = admin(&url).await;
    sqlx::query(&ddl.replace(column, ""))
        .execute(&mut admin)
        .await
        .unwrap();
    let bump = FENCE_SCHEME_1_BUMP.replace("{fence}", &fence);
    for _ in 0..5 {
        sqlx::query(&bump)
            .bind("default")
            .bind(b"order-1".to_vec())
            .execute(&mut admin)
            .await
            .unwrap();
    }
    match PostgresStore::connect(config.clone()).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("records no fence scheme"), "{message}");
            assert!(message.contains("fence_scheme_upgrade_sql"), "{message}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    sqlx::raw_sql(&config.fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let upgraded = store(&url, &options).await;
    let lease = upgraded
        .try_acquire("order-1", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        lease.fencing_token() > 5,
        "the counter at 5 jumps upward, to {}",
        lease.fencing_token()
    );
    assert_eq!(
        upgraded.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    // An older store started by mistake cannot bump a new key, nor one this version wrote.
    for key in ["order-2", "order-1"] {
        match sqlx::query(&bump)
            .bind("default")
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
        {
            Err(sqlx::Error::Database(e)) => {
                assert_eq!(e.code().as_deref(), Some("23502"), "{e}")
            }
            other => panic!("{key}: expected a not-null violation, got {other:?}"),
        }
    }
}

/// Handles with the short window, for the conformance case.
struct ShortWindow {
    url: String,
}

#[fencelock_conformance::async_trait]
impl fencelock_conformance::StoreFactory for ShortWindow {
    async fn handle(&self) -> fencelock_core::DynLockStore {
        Arc::new(store(&self.url, &format!("{}&{OPTIONS}", table("case"))).await)
    }

    async fn unreachable_handle(&self) -> fencelock_core::DynLockStore {
        let url = format!(
            "postgres://u@127.0.0.1:{}/db?connect_timeout=1s&command_timeout=1s&{OPTIONS}",
            test_servers::closed_ports(1)[0]
        );
        Arc::new(PostgresStore::connect_lazy(
            PostgresConfig::from_url(&url).expect("config"),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_case_for_the_retention_window_passes() {
    let factory = Arc::new(ShortWindow {
        url: shared::postgres().url(),
    });
    let outcome =
        fencelock_conformance::run_case("tokens_increase_after_the_retention_window", factory)
            .await;
    assert_eq!(outcome, fencelock_conformance::Outcome::Passed);
}
