//! Per-key state stays bounded: fence rows not bumped for a retention window, whose keys nobody
//! holds, are removed in bounded background transactions that raise the floor table to their
//! highest token, so a key whose row was removed still gets a greater token, and it is the
//! server clock's (fence scheme 3). A fence table made by an earlier build (fence scheme 1 or
//! 2: plain counters) is refused until upgraded, and the upgrade stops that build from minting.
//!
//! CI locks 10,000 distinct keys; `FENCELOCK_KEYS=100000 cargo test -p fencelock-mysql
//! --all-features --test retention` locks more.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
mod common;

use std::time::Duration;

use common::unix_micros;
use fencelock_core::{Error, LockStore, ReleaseOutcome};
use fencelock_mysql::{MysqlConfig, MysqlStore};
use sqlx::{Connection, MySqlConnection};
use test_servers::shared;
use tokio::time::{sleep, Instant};

/// The window the tests use: above their `max_ttl` of 1 s, as every window must be.
const OPTIONS: &str = "retention=2s&max_ttl=1s";
const MAX_TTL: Duration = Duration::from_secs(1);
/// How long the rows may take to go once the window has passed: generous, never tuned.
const GONE_WITHIN: Duration = Duration::from_secs(30);

/// How many distinct keys to lock: 10,000, or `FENCELOCK_KEYS`.
fn key_count() -> usize {
    std::env::var("FENCELOCK_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

/// A config on a fence table of the test's own (the server is this test process's alone).
fn config(what: &str) -> MysqlConfig {
    common::config(&format!("table=retention_{what}&{OPTIONS}"))
}

async fn store(what: &str) -> MysqlStore {
    MysqlStore::connect(config(what)).await.expect("connect")
}

async fn admin() -> MySqlConnection {
    MySqlConnection::connect(&shared::mariadb().url())
        .await
        .expect("admin connection")
}

async fn lock_and_release(store: &MysqlStore, key: &str) -> u64 {
    let lease = store
        .try_acquire(key, MAX_TTL)
        .await
        .unwrap_or_else(|e| panic!("{key}: {e}"));
    let outcome = store.release(&lease).await.expect("release");
    assert_eq!(outcome, ReleaseOutcome::Released, "{key}");
    lease.fencing_token()
}

/// Locks and releases `keys` distinct keys, 16 at a time (one session each).
async fn lock_and_release_each(store: &MysqlStore, keys: usize) {
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
                lock_and_release(&store, &format!("order-{i}")).await;
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_rows_of_ten_thousand_distinct_keys_go_after_the_retention_window() {
    let store = store("many").await;
    let keys = key_count();
    lock_and_release_each(&store, keys).await;
    let after = store.fence_rows().await.expect("count");
    assert!(after <= keys as u64, "{after} rows for {keys} keys");
    sleep(Duration::from_secs(2)).await;
    // Releases start the background removal; one key stays in use, as a service's would.
    let until = Instant::now() + GONE_WITHIN;
    let mut left;
    loop {
        lock_and_release(&store, "in-use").await;
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
    // A key whose row went still gets a greater token than the one it had.
    let token = lock_and_release(&store, "order-0").await;
    assert!(token > 1, "token {token} after order-0's row went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_fence_row_was_removed_gets_a_greater_token() {
    let store = store("token").await;
    let mut last = 0;
    for round in 0..2 {
        let before = unix_micros();
        let token = lock_and_release(&store, "order-1").await;
        assert!(
            token > last,
            "round {round}: token {token} after {last}, whose row was removed"
        );
        // Clock-floored: a removed row's key starts from the clock, not from the floor + 1.
        assert!(
            token >= before,
            "round {round}: token {token} below the clock {before} µs"
        );
        last = token;
        sleep(Duration::from_millis(2_200)).await;
        let removed = store.remove_idle_fences().await.expect("remove");
        assert_eq!(removed, 1, "round {round}: the idle row goes");
        assert_eq!(store.fence_rows().await.expect("count"), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_bumped_within_the_window_or_held_is_kept() {
    let store = store("kept").await;
    lock_and_release(&store, "order-1").await;
    assert_eq!(store.remove_idle_fences().await.expect("remove"), 0);
    assert_eq!(store.fence_rows().await.expect("count"), 1);
    let capabilities = store.capabilities();
    assert_eq!(capabilities.retention, Some(Duration::from_secs(2)));
    assert_eq!(capabilities.max_ttl, MAX_TTL);
    // A lease kept alive past the window keeps its row: its key is held.
    let lease = store.try_acquire("held", MAX_TTL).await.expect("acquire");
    let until = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < until {
        sleep(Duration::from_millis(250)).await;
        store.extend(&lease).await.expect("extend");
    }
    // Only order-1's row is idle now.
    assert_eq!(store.remove_idle_fences().await.expect("remove"), 1);
    assert_eq!(
        store.fence_rows().await.expect("count"),
        1,
        "the held key's row stays"
    );
    let next = store.try_acquire("held", MAX_TTL).await;
    assert!(matches!(next, Err(Error::Busy { .. })), "{next:?}");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The fence bump of a fence-scheme-1 store (plain counters from 1, no fence_scheme column).
const FENCE_SCHEME_1_BUMP: &str = "INSERT INTO {fence}
        (namespace, `key`, lock_name, lock_id_scheme, token, owner, holder_id, ttl_ms, updated_at)
    VALUES ('default', ?, 'old', 2, LAST_INSERT_ID(1), 'old', CONNECTION_ID(), 30000, NOW(6))
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_of_fence_scheme_1_is_refused_until_upgraded_and_tokens_jump_to_the_clock() {
    let config = config("scheme1");
    let fence = config.fence_table();
    let mut admin = admin().await;
    for table in [&fence, &config.floor_table()] {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    // The table as the build before fence scheme 2 made it.
    let ddl = config.fence_table_ddl();
    let column = "    fence_scheme   TINYINT UNSIGNED NOT NULL CHECK (fence_scheme = 3),\n";
    assert!(ddl.contains(column), "{ddl}");
    sqlx::query(&ddl.replace(column, "").replace(", fence scheme 3'", "'"))
        .execute(&mut admin)
        .await
        .unwrap();
    let bump = FENCE_SCHEME_1_BUMP.replace("{fence}", &fence);
    for _ in 0..5 {
        sqlx::query(&bump)
            .bind(b"order-1".to_vec())
            .execute(&mut admin)
            .await
            .unwrap();
    }
    match MysqlStore::connect(config.clone()).await {
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
    let upgraded = MysqlStore::connect(config).await.expect("connect");
    let before = unix_micros();
    let token = lock_and_release(&upgraded, "order-1").await;
    assert!(
        token >= before,
        "token {token} jumped to the clock {before}"
    );
    // An older store started by mistake cannot bump a new key, nor one this version wrote.
    for key in ["order-2", "order-1"] {
        match sqlx::query(&bump)
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
        {
            Err(sqlx::Error::Database(_)) => {}
            other => panic!("{key}: expected the row refused, got {other:?}"),
        }
    }
}

/// The fence bump of a fence-scheme-2 store: a new row at the floor + 1, an existing one at its
/// counter + 1, `fence_scheme` 2.
const FENCE_SCHEME_2_BUMP: &str = "INSERT INTO {fence}
        (namespace, `key`, lock_name, lock_id_scheme, token, owner, holder_id, ttl_ms, updated_at,
         fence_scheme)
    SELECT 'default', ?, 'old', 2, LAST_INSERT_ID(f.floor_token + 1), 'old', CONNECTION_ID(),
           30000, NOW(6), 2
      FROM {floor} AS f WHERE f.one = 1 LOCK IN SHARE MODE
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_of_fence_scheme_2_is_refused_until_upgraded_and_then_stops_that_build() {
    let config = config("scheme2");
    let (fence, floor) = (config.fence_table(), config.floor_table());
    let mut admin = admin().await;
    for table in [&fence, &floor] {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    // The tables as the build of fence scheme 2 made them.
    let ddl = config
        .fence_table_ddl()
        .replace("CHECK (fence_scheme = 3)", "CHECK (fence_scheme = 2)")
        .replace(", fence scheme 3'", "'");
    sqlx::query(&ddl).execute(&mut admin).await.unwrap();
    sqlx::raw_sql(&config.floor_table_ddl())
        .execute(&mut admin)
        .await
        .unwrap();
    let bump = FENCE_SCHEME_2_BUMP
        .replace("{fence}", &fence)
        .replace("{floor}", &floor);
    for key in ["plain", "ahead"] {
        sqlx::query(&bump)
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
            .unwrap();
    }
    // A counter ahead of the clock (as if raised by hand): the upgrade must keep it.
    let ahead: u64 = 1 << 62;
    sqlx::query(&format!("UPDATE {fence} SET token = ? WHERE `key` = ?"))
        .bind(ahead)
        .bind(b"ahead".to_vec())
        .execute(&mut admin)
        .await
        .unwrap();
    match MysqlStore::connect(config.clone()).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("records fence scheme 2"), "{message}");
            assert!(message.contains("fence_scheme_upgrade_sql"), "{message}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    sqlx::raw_sql(&config.fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let upgraded = MysqlStore::connect(config.clone()).await.expect("connect");
    let before = unix_micros();
    let plain = lock_and_release(&upgraded, "plain").await;
    assert!(
        plain >= before,
        "token {plain} jumped to the clock {before}"
    );
    assert_eq!(
        lock_and_release(&upgraded, "ahead").await,
        ahead + 1,
        "the counter is kept"
    );
    // The build of scheme 2, started by mistake, bumps no key: new or old, the row is refused.
    for key in ["new", "plain"] {
        match sqlx::query(&bump)
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
        {
            Err(sqlx::Error::Database(e)) => {
                assert!(e.message().contains("CONSTRAINT"), "{key}: {e}")
            }
            other => panic!("{key}: expected the row refused, got {other:?}"),
        }
    }
    // Upgrading again changes nothing.
    sqlx::raw_sql(&config.fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let again = MysqlStore::connect(config).await.expect("connect");
    assert_eq!(lock_and_release(&again, "ahead").await, ahead + 2);
}

/// Handles with the short window, for the conformance case.
struct ShortWindow;

#[fencelock_conformance::async_trait]
impl fencelock_conformance::StoreFactory for ShortWindow {
    async fn handle(&self) -> fencelock_core::DynLockStore {
        Arc::new(store("case").await)
    }

    async fn unreachable_handle(&self) -> fencelock_core::DynLockStore {
        let url = format!(
            "mysql://fencelock@127.0.0.1:{}/fencelock?connect_timeout=1&command_timeout=1&{OPTIONS}",
            test_servers::closed_ports(1)[0]
        );
        Arc::new(MysqlStore::connect_lazy(
            MysqlConfig::from_url(&url).expect("config"),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_case_for_the_retention_window_passes() {
    let outcome = fencelock_conformance::run_case(
        "tokens_increase_after_the_retention_window",
        Arc::new(ShortWindow),
    )
    .await;
    assert_eq!(outcome, fencelock_conformance::Outcome::Passed);
}
