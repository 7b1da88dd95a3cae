//! Shared leases and semaphore permits on PostgreSQL, beyond the conformance suite: the
//! server's own queue keeps new readers out while a writer waits (the writer policy rests on
//! it), and a fence table made before permits refuses them until its upgrade ran.

mod common;

use std::time::Duration;

use common::{admin, store, waiters};
use fencelock_core::{Error, LockStore, Mode, ReleaseOutcome};
use test_servers::shared;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(30);

/// Waits (boundedly) until `count` backends wait for `lock_id`.
async fn until_waiting(admin: &mut sqlx::PgConnection, lock_id: i64, count: i64) {
    let started = Instant::now();
    while waiters(admin, lock_id).await < count {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{count} waiters never showed in pg_locks"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// PostgreSQL refuses `pg_try_advisory_lock_shared` while an exclusive request waits, though
/// only shared holders hold the lock (lock.c: a new request that conflicts with a waiter's
/// mode, `conflictTab[mode] & lock->waitMask`, does not jump the queue). The store's readers
/// rely on it: while a writer waits, `try_acquire_as(Shared)` is busy, and the writer is
/// served when the readers that hold release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_new_readers_out() {
    let url = shared::postgres().url();
    let mut watcher = admin(&url).await;

    // The server alone, on a raw id.
    let id: i64 = 0x6d6f_6465_7321;
    let mut reader = admin(&url).await;
    let mut writer = admin(&url).await;
    let mut late = admin(&url).await;
    sqlx::query("SELECT pg_advisory_lock_shared($1)")
        .bind(id)
        .execute(&mut reader)
        .await
        .unwrap();
    let shared_ok: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock_shared($1)")
        .bind(id)
        .fetch_one(&mut late)
        .await
        .unwrap();
    assert!(
        shared_ok,
        "a second reader was refused with no writer waiting"
    );
    sqlx::query("SELECT pg_advisory_unlock_shared($1)")
        .bind(id)
        .execute(&mut late)
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(id)
            .execute(&mut writer)
            .await
            .unwrap();
        writer
    });
    until_waiting(&mut watcher, id, 1).await;
    let shared_ok: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock_shared($1)")
        .bind(id)
        .fetch_one(&mut late)
        .await
        .unwrap();
    assert!(
        !shared_ok,
        "pg_try_advisory_lock_shared was granted while an exclusive request waited"
    );
    sqlx::query("SELECT pg_advisory_unlock_shared($1)")
        .bind(id)
        .execute(&mut reader)
        .await
        .unwrap();
    let _writer = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the writer was not served after the reader released")
        .unwrap();

    // The store on top of it.
    let key = "modes:writer-waits";
    let readers = store(&url, "").await;
    let writers = store(&url, "").await;
    let lock_id = readers.lock_id(key);
    let held = readers
        .try_acquire_as(key, TTL, Mode::Shared)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let writers = writers.clone();
        async move {
            writers
                .acquire(key, TTL, Duration::from_secs(20))
                .await
                .unwrap()
        }
    });
    until_waiting(&mut watcher, lock_id, 1).await;
    match readers.try_acquire_as(key, TTL, Mode::Shared).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a reader while a writer waits: expected Busy, got {other:?}"),
    }
    assert_eq!(
        readers.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let lease = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiting writer was not served")
        .unwrap();
    assert!(lease.fencing_token() > held.fencing_token());
    assert_eq!(
        writers.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A fence table made before permits (no `permit_limit` column) refuses permits with an error
/// naming `permits_upgrade_sql()`, keeps exclusive and shared leases, and keeps permits once
/// the upgrade ran (for handles connected afterwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_wait_for_the_permit_limit_column() {
    let url = shared::postgres().url();
    let mut admin = admin(&url).await;
    let options = "schema=fencelock_modes_upgrade";
    sqlx::raw_sql("DROP SCHEMA IF EXISTS fencelock_modes_upgrade CASCADE")
        .execute(&mut admin)
        .await
        .unwrap();
    let first = store(&url, options).await;
    let table = first.config().fence_table();
    drop(first);
    sqlx::raw_sql(&format!("ALTER TABLE {table} DROP COLUMN permit_limit"))
        .execute(&mut admin)
        .await
        .unwrap();

    let old = store(&url, options).await;
    let key = "modes:upgrade";
    match old.try_acquire_as(key, TTL, Mode::permits(2)).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("permits_upgrade_sql"), "{message}");
            assert!(message.contains("permit_limit"), "{message}");
        }
        other => panic!("a permit without the column: expected a store error, got {other:?}"),
    }
    match old
        .acquire_as(key, TTL, Duration::from_millis(200), Mode::permits(2))
        .await
    {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("permits_upgrade_sql"), "{message}")
        }
        other => panic!("a waiting permit without the column: got {other:?}"),
    }
    let reader = old.try_acquire_as(key, TTL, Mode::Shared).await.unwrap();
    assert_eq!(
        old.release(&reader).await.unwrap(),
        ReleaseOutcome::Released
    );
    let writer = old.try_acquire(key, TTL).await.unwrap();
    assert_eq!(
        old.release(&writer).await.unwrap(),
        ReleaseOutcome::Released
    );

    let upgrade = old.config().permits_upgrade_sql();
    sqlx::raw_sql(&upgrade).execute(&mut admin).await.unwrap();
    // Twice: the statement is idempotent.
    sqlx::raw_sql(&upgrade).execute(&mut admin).await.unwrap();
    let new = store(&url, options).await;
    let permit = new
        .try_acquire_as(key, TTL, Mode::permits(2))
        .await
        .unwrap();
    assert_eq!(permit.slot(), Some(0));
    assert!(permit.fencing_token() > writer.fencing_token());
    match new.status(key).await.unwrap() {
        fencelock_core::KeyStatus::Shared {
            mode,
            count,
            holders,
        } => {
            assert_eq!(mode, Mode::permits(2));
            assert_eq!(count, 1);
            assert_eq!(holders.len(), 1);
            assert_eq!(holders[0].token, Some(permit.fencing_token()));
            assert_eq!(holders[0].slot, Some(0));
        }
        other => panic!("status of a held permit: {other:?}"),
    }
    assert_eq!(
        new.release(&permit).await.unwrap(),
        ReleaseOutcome::Released
    );
    sqlx::raw_sql("DROP SCHEMA fencelock_modes_upgrade CASCADE")
        .execute(&mut admin)
        .await
        .unwrap();
}
