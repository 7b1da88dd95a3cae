//! The lock and its fencing counter come as a pair: handles on different fence tables never
//! share a lock with two counters, and a store refuses a fence table that records another
//! lock-id scheme (an older or newer fencelock-postgres would lock different ids for one key).

mod common;

use std::time::Duration;

use common::{admin, store};
use fencelock_core::{Error, FenceGate, LockStore, ReleaseOutcome};
use fencelock_postgres::{PostgresConfig, PostgresStore};
use sqlx::Row;
use test_servers::shared;

const TTL: Duration = Duration::from_secs(30);

/// The fence table as fencelock-postgres made it before the lock-id scheme was recorded (scheme 1).
const SCHEME_1_DDL: &str = "CREATE TABLE {fence} (
    namespace  text        NOT NULL,
    key        bytea       NOT NULL,
    lock_id    bigint      NOT NULL,
    token      bigint      NOT NULL,
    owner      text        NOT NULL,
    holder_pid integer     NOT NULL,
    ttl_ms     bigint      NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, key)
)";

/// The fence bump of a scheme-1 store, as it ran inside that store's acquire.
const SCHEME_1_BUMP: &str = "INSERT INTO {fence} AS f
        (namespace, key, lock_id, token, owner, holder_pid, ttl_ms, updated_at)
    VALUES ($1, $2, 7, 1, 'old', pg_backend_pid(), 30000, clock_timestamp())
    ON CONFLICT (namespace, key) DO UPDATE SET token = f.token + 1
    RETURNING f.token";

fn config(url: &str, options: &str) -> PostgresConfig {
    PostgresConfig::from_url(&format!("{url}?connect_timeout=30&{options}")).expect("config")
}

/// The refusal a store gives for this fence table, from `connect` and from a lazy handle's
/// first operation alike.
async fn refusal(url: &str, options: &str) -> String {
    let message = match PostgresStore::connect(config(url, options)).await {
        Err(Error::Store { message, .. }) => message,
        other => panic!("{options}: expected a store error, got {other:?}"),
    };
    let lazy = PostgresStore::connect_lazy(config(url, options));
    match lazy.try_acquire("scheme:lazy", TTL).await {
        Err(Error::Store { message: lazy, .. }) => assert_eq!(lazy, message),
        other => panic!("{options}: expected a store error, got {other:?}"),
    }
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_on_two_fence_tables_never_share_a_lock_with_two_counters() {
    let url = shared::postgres().url();
    let a = store(&url, "table=fence_a").await;
    let b = store(&url, "table=fence_b").await;
    let key = "scheme:two-tables";
    for _ in 0..5 {
        let lease = a.try_acquire(key, TTL).await.unwrap();
        assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::Released);
    }
    // A lock shared by the two tables would make b wait for a. Under scheme 2 the fence table
    // is part of the lock: b's key is its own.
    let held = a.try_acquire(key, TTL).await.unwrap();
    let other = b
        .try_acquire(key, TTL)
        .await
        .expect("another fence table is another lock, like another namespace");
    assert_ne!(a.lock_id(key), b.lock_id(key));
    assert_eq!(b.release(&other).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(a.release(&held).await.unwrap(), ReleaseOutcome::Released);

    // A raw id is one lock whatever the table, so its leases through both tables must be
    // ordered at the resource: each token passes the gate after the one before it.
    let raw = 7_770_101_i64;
    let gate = FenceGate::new();
    for store in [&a, &a, &a, &a, &a, &b, &a, &b] {
        let lease = store.try_acquire_raw(raw, TTL).await.unwrap();
        gate.claim(lease.fencing_token())
            .expect("a raw lease's token is greater than every earlier one, whatever the table");
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_of_scheme_1_is_refused_until_upgraded_and_keeps_its_counters() {
    let url = shared::postgres().url();
    let options = "table=fence_scheme_1";
    let fence = config(&url, options).fence_table();
    let mut admin = admin(&url).await;
    sqlx::query(&SCHEME_1_DDL.replace("{fence}", &fence))
        .execute(&mut admin)
        .await
        .unwrap();
    // An older store has used the key five times.
    for _ in 0..5 {
        sqlx::query(&SCHEME_1_BUMP.replace("{fence}", &fence))
            .bind("default")
            .bind(b"scheme:upgraded".to_vec())
            .execute(&mut admin)
            .await
            .unwrap();
    }

    let message = refusal(&url, options).await;
    assert!(message.contains("records no lock-id scheme"), "{message}");
    assert!(message.contains("scheme 1"), "{message}");
    assert!(message.contains("lock_id_scheme_upgrade_sql"), "{message}");
    assert!(message.contains(&fence), "{message}");

    // The documented upgrade, once every older store has stopped.
    sqlx::raw_sql(&config(&url, options).lock_id_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let upgraded = store(&url, options).await;
    let lease = upgraded.try_acquire("scheme:upgraded", TTL).await.unwrap();
    assert!(
        lease.fencing_token() > 5,
        "the counter survives the upgrade: token {} after 5",
        lease.fencing_token()
    );
    assert_eq!(
        upgraded.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );

    // An older store started by mistake after the upgrade cannot bump a counter here.
    let old = sqlx::query(&SCHEME_1_BUMP.replace("{fence}", &fence))
        .bind("default")
        .bind(b"scheme:upgraded".to_vec())
        .execute(&mut admin)
        .await;
    assert_not_null_violation(old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_recording_another_scheme_is_refused() {
    let url = shared::postgres().url();
    let options = "table=fence_scheme_3";
    let ddl = config(&url, options).fence_table_ddl();
    let ours = "fencelock_lock_id_scheme_2 CHECK (lock_id_scheme = 2)";
    assert!(ddl.contains(ours), "{ddl}");
    // What a future fencelock-postgres with scheme 3 would record.
    let newer = ddl.replace(
        ours,
        "fencelock_lock_id_scheme_3 CHECK (lock_id_scheme = 3)",
    );
    let mut admin = admin(&url).await;
    sqlx::query(&newer).execute(&mut admin).await.unwrap();

    let message = refusal(&url, options).await;
    assert!(message.contains("records lock-id scheme 3"), "{message}");
    assert!(message.contains("uses scheme 2"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheme_1_store_cannot_bump_a_counter_in_a_fence_table_this_version_made() {
    let url = shared::postgres().url();
    let options = "table=fence_made_by_scheme_2";
    let current = store(&url, options).await;
    let lease = current.try_acquire("scheme:shared", TTL).await.unwrap();
    assert_eq!(
        current.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let fence = current.config().fence_table();
    let mut admin = admin(&url).await;
    // Both paths of the older bump: a new row, and a row this version wrote.
    for key in ["scheme:new-row", "scheme:shared"] {
        let old = sqlx::query(&SCHEME_1_BUMP.replace("{fence}", &fence))
            .bind("default")
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await;
        assert_not_null_violation(old);
    }
}

/// The fence bump of a fence-scheme-2 store (transaction-id floors), as it ran inside that
/// store's acquire.
const FENCE_SCHEME_2_BUMP: &str = "INSERT INTO {fence} AS f
        (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at)
    SELECT $1, $2, 7, 2, 2, pg_current_xact_id()::text::int8, 'old', pg_backend_pid(), 30000,
           clock_timestamp()
    ON CONFLICT (namespace, key) DO UPDATE
       SET token = GREATEST(f.token + 1, pg_current_xact_id()::text::int8)
    RETURNING f.token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_of_fence_scheme_2_is_refused_then_upgraded_and_an_older_store_fails() {
    let url = shared::postgres().url();
    let options = "table=fence_scheme_2";
    let config = config(&url, options);
    let fence = config.fence_table();
    // The table as the build of fence scheme 2 made it.
    let ddl = config.fence_table_ddl();
    let ours = "fencelock_fence_scheme_3 CHECK (fence_scheme = 3)";
    assert!(ddl.contains(ours), "{ddl}");
    let mut admin = admin(&url).await;
    sqlx::query(&ddl.replace(ours, "fencelock_fence_scheme_2 CHECK (fence_scheme = 2)"))
        .execute(&mut admin)
        .await
        .unwrap();
    let bump = FENCE_SCHEME_2_BUMP.replace("{fence}", &fence);
    let mut last = 0;
    for _ in 0..3 {
        last = sqlx::query(&bump)
            .bind("default")
            .bind(b"scheme:clock".to_vec())
            .fetch_one(&mut admin)
            .await
            .unwrap()
            .get::<i64, _>(0);
    }

    let message = refusal(&url, options).await;
    assert!(message.contains("records fence scheme 2"), "{message}");
    assert!(message.contains("fence_scheme_upgrade_sql"), "{message}");
    assert!(message.contains(&fence), "{message}");

    sqlx::raw_sql(&config.fence_scheme_upgrade_sql())
        .execute(&mut admin)
        .await
        .unwrap();
    let clock: i64 =
        sqlx::query("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8")
            .fetch_one(&mut admin)
            .await
            .unwrap()
            .get(0);
    let upgraded = store(&url, options).await;
    let lease = upgraded.try_acquire("scheme:clock", TTL).await.unwrap();
    let token = lease.fencing_token() as i64;
    assert!(
        token > last && token >= clock,
        "the counter at {last} jumps once, upward, to the server's clock ({clock} µs): {token}"
    );
    assert_eq!(
        upgraded.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );

    // A fence-scheme-2 store started by mistake fails on a new key and on one this version
    // bumped, rather than minting a transaction id below the clock.
    for key in ["scheme:new-key", "scheme:clock"] {
        match sqlx::query(&bump)
            .bind("default")
            .bind(key.as_bytes().to_vec())
            .execute(&mut admin)
            .await
        {
            Err(sqlx::Error::Database(e)) => assert_eq!(e.code().as_deref(), Some("23514"), "{e}"),
            other => panic!("{key}: expected a check violation, got {other:?}"),
        }
    }
}

fn assert_not_null_violation<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) {
    match result {
        Err(sqlx::Error::Database(e)) => assert_eq!(e.code().as_deref(), Some("23502"), "{e}"),
        other => panic!("expected a not-null violation, got {other:?}"),
    }
}
