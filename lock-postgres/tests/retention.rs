//! Per-key state stays bounded: fence rows not bumped for a retention window are removed in
//! bounded background batches, and a key whose row was removed still gets a greater token
//! (fence scheme 3: tokens are at least the server's clock in µs, and a row goes only once the
//! clock is past its token by the smallest window). A table made by an earlier build (plain
//! counters) is refused until upgraded, and its tokens then jump upward. The smallest window
//! is checked when the URL is read.
//!
//! CI locks 10,000 distinct keys; `FENCELOCK_KEYS=100000 cargo test -p fencelock-postgres
//! --all-features --test retention` locks more.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{admin, store};
use fencelock_core::{Error, LockStore, Mode, ReleaseOutcome};
use fencelock_postgres::{PostgresConfig, PostgresStore};
use sqlx::{PgConnection, Row};
use test_servers::shared;
use tokio::time::{sleep, Instant};

/// The window the tests use: above their `max_ttl` of 1 s, as every window must be.
const OPTIONS: &str = "retention=2s&max_ttl=1s";
/// A window of a few hundred ms, for the tests that wait it out: above `max_ttl` and above the
/// smallest window for `max_skew=50ms` (52 ms).
const SHORT: &str = "retention=300ms&max_ttl=200ms&max_skew=50ms";
/// [`SHORT`]'s window and a little more, so that the server's clock has passed it (the server
/// runs on this host's clock).
const PAST_SHORT: Duration = Duration::from_millis(400);
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

/// The server's clock in µs since the Unix epoch, as the minting statement reads it.
async fn server_clock_us(admin: &mut PgConnection) -> i64 {
    sqlx::query("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8")
        .fetch_one(admin)
        .await
        .expect("clock")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_token_on_a_fresh_table_is_at_least_the_server_clock_at_grant() {
    let url = shared::postgres().url();
    let store = store(&url, &table("fresh")).await;
    let mut admin = admin(&url).await;
    let ttl = Duration::from_secs(30);
    let held = store.try_acquire("waited", ttl).await.expect("acquire");
    let mut waiter = Some({
        let store = store.clone();
        tokio::spawn(async move { store.acquire("waited", ttl, Duration::from_secs(30)).await })
    });
    // Every statement that mints: a try, a wait granted by a release, a reader, a permit, a raw
    // id. Each makes a new row but `waited`, whose row its holder made: there the clock wins
    // over counter + 1.
    for grant in ["try", "waited", "shared", "permit", "raw"] {
        let before = server_clock_us(&mut admin).await;
        let lease = match (grant, waiter.take()) {
            ("waited", Some(waiter)) => {
                assert_eq!(
                    store.release(&held).await.unwrap(),
                    ReleaseOutcome::Released
                );
                waiter.await.expect("waiter")
            }
            ("try", rest) => {
                waiter = rest;
                store.try_acquire("try", ttl).await
            }
            ("shared", _) => store.try_acquire_as("shared", ttl, Mode::Shared).await,
            ("permit", _) => {
                let permit = Mode::Permit { limit: 2 };
                store.try_acquire_as("permit", ttl, permit).await
            }
            _ => store.try_acquire_raw(7_770_202, ttl).await,
        }
        .unwrap_or_else(|e| panic!("{grant}: {e}"));
        let after = server_clock_us(&mut admin).await;
        let token = i64::try_from(lease.fencing_token()).expect("below 2^63");
        assert!(
            (before..=after).contains(&token),
            "{grant}: token {token} is the server's clock at the grant, between {before} and \
             {after} µs"
        );
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// The keys that have a row in `fence`, in order.
async fn rows(admin: &mut PgConnection, fence: &str) -> Vec<String> {
    sqlx::query(&format!(
        "SELECT convert_from(key, 'UTF8') FROM {fence} ORDER BY key"
    ))
    .fetch_all(admin)
    .await
    .expect("rows")
    .iter()
    .map(|row| row.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_grow_across_row_removal_and_a_row_ahead_of_the_clock_stays() {
    let url = shared::postgres().url();
    let store = store(&url, &format!("{}&{SHORT}", table("token"))).await;
    let fence = store.config().fence_table();
    let mut admin = admin(&url).await;
    let ttl = Duration::from_millis(200);
    let once = |key: &'static str| {
        let store = store.clone();
        async move {
            let lease = store.try_acquire(key, ttl).await.expect("acquire");
            assert_eq!(
                store.release(&lease).await.unwrap(),
                ReleaseOutcome::Released
            );
            lease.fencing_token()
        }
    };
    let first = once("order-1").await;
    // A key whose lock is held (here by a plain session, as a bump in progress holds it) keeps
    // its row: that bump may have read the clock before the removal did.
    once("in-use").await;
    let in_use = store.lock_id("in-use");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(in_use)
        .execute(&mut admin)
        .await
        .unwrap();
    sleep(PAST_SHORT).await;
    // Releases also start removals in the background: ask which rows are left, not who removed.
    store.remove_idle_fences().await.expect("remove");
    assert_eq!(
        rows(&mut admin, &fence).await,
        ["in-use"],
        "order-1 goes, in-use stays"
    );
    let second = once("order-1").await;
    assert!(
        second > first,
        "token {second} after {first}, whose row was removed"
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(in_use)
        .execute(&mut admin)
        .await
        .unwrap();

    // A counter ahead of the clock (what a clock that stepped back leaves: counter + 1 wins
    // over the clock) stays past the window, until the clock has passed it.
    let ahead: i64 = sqlx::query(&format!(
        "UPDATE {fence} SET token = token + 5000000 WHERE key = $1 RETURNING token"
    ))
    .bind(b"order-1".to_vec())
    .fetch_one(&mut admin)
    .await
    .unwrap()
    .get(0);
    sleep(PAST_SHORT).await;
    store.remove_idle_fences().await.expect("remove");
    assert_eq!(
        rows(&mut admin, &fence).await,
        ["order-1"],
        "in-use goes once free; order-1, 5 s ahead of the clock, stays"
    );
    let third = once("order-1").await;
    assert!(
        third > ahead as u64,
        "token {third} after {ahead}, a row ahead of the clock"
    );
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
        CONSTRAINT fencelock_fence_scheme_3 CHECK (fence_scheme = 3),\n";
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

/// What `from_url` refuses `url` with.
fn refused(url: &str) -> String {
    match PostgresConfig::from_url(url) {
        Err(Error::InvalidInput { rule, .. }) => rule,
        other => panic!("{url}: expected invalid input, got {other:?}"),
    }
}

#[test]
fn a_window_below_a_granule_plus_max_skew_plus_1ms_is_refused_when_the_url_is_read() {
    // The default max_skew (1 s): the smallest window is 1 µs + 1 s + 1 ms, rounded up to 1002 ms.
    let config = PostgresConfig::from_url("postgres://u@h/db?retention=1002ms&max_ttl=1s")
        .expect("the smallest window");
    assert_eq!(config.max_skew(), fencelock_postgres::DEFAULT_MAX_SKEW);
    assert_eq!(config.min_retention(), Duration::from_millis(1002));
    let rule = refused("postgres://u@h/db?retention=1001ms&max_ttl=1s");
    assert!(
        rule.contains("too short") && rule.contains("1002ms"),
        "{rule}"
    );
    // A promised skew moves the bound: 300 ms allows up to 298 ms of skew.
    let config =
        PostgresConfig::from_url("postgres://u@h/db?retention=300ms&max_ttl=200ms&max_skew=298ms")
            .expect("300 ms with a skew of 298 ms");
    assert_eq!(config.min_retention(), Duration::from_millis(300));
    let rule = refused("postgres://u@h/db?retention=300ms&max_ttl=200ms&max_skew=299ms");
    assert!(
        rule.contains("301ms") && rule.contains("max_skew"),
        "{rule}"
    );
    assert!(refused("postgres://u@h/db?max_skew=0").contains("max_skew must be"));
    assert!(refused("postgres://u@h/db?max_skew=soon").contains("max_skew must be"));
}
