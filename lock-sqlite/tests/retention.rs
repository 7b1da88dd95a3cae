//! Per-key state stays bounded: rows idle for the retention window are removed in bounded
//! background transactions that raise the floor table to their highest token, so a key whose
//! row was removed still gets a greater token, and it is the clock's (fence scheme 3). A table
//! made by an earlier build (fence scheme 1 or 2: plain counters) is refused until upgraded,
//! and the upgrade stops that build from minting.
//!
//! CI locks 10,000 distinct keys; `FENCELOCK_KEYS=100000 cargo test -p fencelock-sqlite
//! --all-features --test retention` locks more. The databases live on /dev/shm where it
//! exists: these tests are about rows, not about fsync, which would cost a disk's worth of
//! time per commit.

mod support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock_core::{Error, LockStore, ReleaseOutcome};
use fencelock_sqlite::{SqliteConfig, SqliteStore};
use sqlx::Connection;
use support::Scratch;
use tokio::time::{sleep, Instant};

/// The window the tests use: above their `max_ttl` of 1 s, as every window must be. The TTL
/// leaves room for an acquire that waits for SQLite's write lock behind a removal on a loaded
/// machine (500 ms was too short for 100,000 keys on two cores).
const RETENTION: Duration = Duration::from_secs(2);
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

fn unix_micros() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    u64::try_from(since.as_micros()).expect("micros fit")
}

/// A scratch directory in memory where the machine has one.
fn scratch(name: &str) -> Scratch {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        Scratch::under(shm, name)
    } else {
        Scratch::new(name)
    }
}

fn config(db: PathBuf) -> SqliteConfig {
    SqliteConfig::new(db)
        .with_retention(RETENTION, MAX_TTL)
        .expect("a window above the max TTL")
}

async fn store(db: PathBuf) -> SqliteStore {
    SqliteStore::connect(config(db)).await.expect("connect")
}

async fn lock_and_release(store: &SqliteStore, key: &str) -> u64 {
    let lease = store
        .try_acquire(key, MAX_TTL)
        .await
        .unwrap_or_else(|e| panic!("{key}: {e}"));
    let outcome = store.release(&lease).await.expect("release");
    assert_eq!(outcome, ReleaseOutcome::Released, "{key}");
    lease.fencing_token()
}

/// Locks and releases `keys` distinct keys, 4 at a time.
async fn lock_and_release_each(store: &SqliteStore, keys: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
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
async fn rows_of_ten_thousand_distinct_keys_go_after_the_retention_window() {
    let dir = scratch("retention-many");
    let store = store(dir.db()).await;
    let keys = key_count();
    lock_and_release_each(&store, keys).await;
    let after = store.stored_rows().await.expect("count");
    assert!(after <= keys as u64, "{after} rows for {keys} keys");
    sleep(RETENTION + MAX_TTL).await;
    // Releases start the background removal; one key stays in use, as a service's would.
    let until = Instant::now() + GONE_WITHIN;
    let mut left;
    loop {
        lock_and_release(&store, "in-use").await;
        left = store.stored_rows().await.expect("count");
        if left <= 1 || Instant::now() >= until {
            break;
        }
        sleep(Duration::from_millis(250)).await;
    }
    assert!(
        left <= 1,
        "{left} rows left of {keys} keys {GONE_WITHIN:?} after the window (only `in-use` may stay)"
    );
    // A key whose row went still gets a greater token than the 1 it had.
    let token = lock_and_release(&store, "order-0").await;
    assert!(token > 1, "token {token} after order-0's row went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_row_was_removed_gets_a_greater_token() {
    let dir = scratch("retention-token");
    let store = store(dir.db()).await;
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
        sleep(RETENTION + MAX_TTL + Duration::from_millis(200)).await;
        let removed = store.remove_idle_rows().await.expect("remove");
        assert_eq!(removed, 1, "round {round}: the idle row goes");
        assert_eq!(store.stored_rows().await.expect("count"), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_used_within_the_window_is_kept() {
    let dir = scratch("retention-kept");
    let store = store(dir.db()).await;
    lock_and_release(&store, "order-1").await;
    assert_eq!(store.remove_idle_rows().await.expect("remove"), 0);
    assert_eq!(store.stored_rows().await.expect("count"), 1);
    let capabilities = store.capabilities();
    assert_eq!(capabilities.retention, Some(RETENTION));
    assert_eq!(capabilities.max_ttl, MAX_TTL);
    // A held row is never removed, however long ago its window started.
    let lease = store.try_acquire("held", MAX_TTL).await.expect("acquire");
    assert_eq!(store.remove_idle_rows().await.expect("remove"), 0);
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The lock table as the build before fence scheme 2 made it, and its acquire.
const FENCE_SCHEME_1_TABLE: &str = "CREATE TABLE fencelock_locks (
    key        BLOB    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL,
    owner      TEXT,
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    pid        INTEGER NOT NULL
) WITHOUT ROWID";
const FENCE_SCHEME_1_ACQUIRE: &str =
    "INSERT INTO fencelock_locks AS l (key, token, owner, boot_id, expires_ns, ttl_ms, pid)
VALUES (?1, 1, 'old', 'old-boot', 0, 1000, 1)
ON CONFLICT (key) DO UPDATE SET token = l.token + 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_fence_scheme_1_is_refused_until_upgraded_and_tokens_jump_to_the_clock() {
    let dir = scratch("retention-scheme1");
    let url = format!("sqlite://{}", dir.db().display());
    let mut admin = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
        .await
        .expect("open");
    sqlx::query(FENCE_SCHEME_1_TABLE)
        .execute(&mut admin)
        .await
        .unwrap();
    for _ in 0..5 {
        sqlx::query(FENCE_SCHEME_1_ACQUIRE)
            .bind(b"order-1".to_vec())
            .execute(&mut admin)
            .await
            .unwrap();
    }
    match SqliteStore::connect(config(dir.db())).await {
        Err(Error::Store { message, source }) => {
            let text = format!("{message} {source:?}");
            assert!(text.contains("records no fence scheme"), "{text}");
            assert!(text.contains("fence_scheme_upgrade_sql"), "{text}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    sqlx::raw_sql(&config(dir.db()).fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let upgraded = store(dir.db()).await;
    let before = unix_micros();
    let token = lock_and_release(&upgraded, "order-1").await;
    assert!(
        token >= before,
        "token {token} jumped to the clock {before}"
    );
    // An older build started by mistake cannot insert a row, for a new key or an old one.
    for key in ["order-2", "order-1"] {
        match sqlx::query(FENCE_SCHEME_1_ACQUIRE)
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
        {
            Err(sqlx::Error::Database(e)) => {
                assert!(e.message().contains("NOT NULL"), "{key}: {e}")
            }
            other => panic!("{key}: expected a not-null violation, got {other:?}"),
        }
    }
}

/// The lock table and the floor table as the build of fence scheme 2 made them, and its acquire
/// (a new row at the floor + 1, an existing one at its counter + 1).
const FENCE_SCHEME_2_TABLES: &str = "CREATE TABLE fencelock_locks (
    key        BLOB    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL,
    owner      TEXT,
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    pid        INTEGER NOT NULL,
    fence_scheme INTEGER NOT NULL CHECK (fence_scheme = 2)
) WITHOUT ROWID;
CREATE TABLE fencelock_locks_floor (
    one   INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
    floor INTEGER NOT NULL
);
INSERT INTO fencelock_locks_floor (one, floor) VALUES (1, 0);";
const FENCE_SCHEME_2_ACQUIRE: &str = "INSERT INTO fencelock_locks AS l
    (key, token, owner, boot_id, expires_ns, ttl_ms, pid, fence_scheme)
VALUES (?1, (SELECT f.floor + 1 FROM fencelock_locks_floor AS f WHERE f.one = 1),
        'old', 'old-boot', 0, 1000, 1, 2)
ON CONFLICT (key) DO UPDATE SET token = l.token + 1, owner = excluded.owner
RETURNING token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_fence_scheme_2_is_refused_until_upgraded_and_then_stops_that_build() {
    let dir = scratch("retention-scheme2");
    let url = format!("sqlite://{}", dir.db().display());
    let mut admin = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
        .await
        .expect("open");
    sqlx::raw_sql(FENCE_SCHEME_2_TABLES)
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(FENCE_SCHEME_2_ACQUIRE)
        .bind(b"plain".to_vec())
        .execute(&mut admin)
        .await
        .unwrap();
    // A counter ahead of the clock (as if raised by hand): the upgrade must keep it.
    let ahead: i64 = 1 << 62;
    sqlx::query(FENCE_SCHEME_2_ACQUIRE)
        .bind(b"ahead".to_vec())
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("UPDATE fencelock_locks SET token = ?1 WHERE key = ?2")
        .bind(ahead)
        .bind(b"ahead".to_vec())
        .execute(&mut admin)
        .await
        .unwrap();
    match SqliteStore::connect(config(dir.db())).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("records fence scheme 2"), "{message}");
            assert!(message.contains("fence_scheme_upgrade_sql"), "{message}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    sqlx::raw_sql(&config(dir.db()).fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let upgraded = store(dir.db()).await;
    let before = unix_micros();
    let plain = lock_and_release(&upgraded, "plain").await;
    assert!(
        plain >= before,
        "token {plain} jumped to the clock {before}"
    );
    assert_eq!(
        lock_and_release(&upgraded, "ahead").await,
        ahead as u64 + 1,
        "counter kept"
    );
    // The build of scheme 2, started by mistake, takes no key: new or old, it fails.
    for key in ["new", "plain"] {
        match sqlx::query(FENCE_SCHEME_2_ACQUIRE)
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
        {
            Err(sqlx::Error::Database(e)) => {
                assert!(e.message().contains("CHECK"), "{key}: {e}")
            }
            other => panic!("{key}: expected a check violation, got {other:?}"),
        }
    }
    // Upgrading again changes nothing.
    sqlx::raw_sql(&config(dir.db()).fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    assert_eq!(lock_and_release(&upgraded, "ahead").await, ahead as u64 + 2);
}

/// Handles with the short window, for the conformance case.
struct ShortWindow {
    dir: Scratch,
}

#[fencelock_conformance::async_trait]
impl fencelock_conformance::StoreFactory for ShortWindow {
    async fn handle(&self) -> fencelock_core::DynLockStore {
        Arc::new(store(self.dir.db()).await)
    }

    async fn unreachable_handle(&self) -> fencelock_core::DynLockStore {
        let config = config(self.dir.db())
            .with_command_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_secs(1));
        Arc::new(SqliteStore::unreachable(&config).expect("a locked-out handle"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_case_for_the_retention_window_passes() {
    let factory = Arc::new(ShortWindow {
        dir: scratch("retention-case"),
    });
    let outcome =
        fencelock_conformance::run_case("tokens_increase_after_the_retention_window", factory)
            .await;
    assert_eq!(outcome, fencelock_conformance::Outcome::Passed);
}
