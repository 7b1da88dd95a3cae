//! Bad input: a directory that cannot be written, a file that is not a database, a database
//! another connection keeps locked beyond the command timeout. Each gives a classified error,
//! and nothing is left held.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

mod support;

use std::time::{Duration, Instant};

use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use fencelock_sqlite::{Lockout, SqliteConfig, SqliteStore};
use sqlx::{Connection, SqliteConnection};
use support::Scratch;

const TTL: Duration = Duration::from_secs(30);

fn invalid_url(result: fencelock_core::Result<SqliteStore>) -> String {
    match result {
        Err(Error::InvalidInput { what: "url", rule }) => rule,
        other => panic!("expected an invalid url, got {other:?}"),
    }
}

#[tokio::test]
async fn a_directory_that_cannot_be_written_is_invalid_input() {
    // Nobody, root included, can create files in /proc.
    let rule =
        invalid_url(SqliteStore::connect(SqliteConfig::new("/proc/fencelock-test/locks.db")).await);
    assert!(rule.contains("/proc/fencelock-test"), "{rule}");
    let rule = invalid_url(SqliteStore::connect(SqliteConfig::new("/proc/locks.db")).await);
    assert!(rule.contains("/proc/locks.db"), "{rule}");

    // A path through a regular file.
    let dir = Scratch::new("through-a-file");
    let file = dir.path().join("file");
    std::fs::write(&file, "not a directory").unwrap();
    let rule = invalid_url(SqliteStore::connect(SqliteConfig::new(file.join("locks.db"))).await);
    assert!(rule.contains("cannot create"), "{rule}");

    // A directory without write permission, where permissions apply (not to root).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let locked = dir.path().join("read-only");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
        let rule =
            invalid_url(SqliteStore::connect(SqliteConfig::new(locked.join("locks.db"))).await);
        assert!(rule.contains("read-only"), "{rule}");
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_store_error_and_is_left_alone() {
    let dir = Scratch::new("not-a-database");
    let text = "this is a text file, not a SQLite database\n".repeat(200);
    std::fs::write(dir.db(), &text).unwrap();
    match SqliteStore::connect(SqliteConfig::new(dir.db())).await {
        Err(error @ Error::Store { .. }) => {
            assert!(
                error.to_string().contains("is not a SQLite database"),
                "{error}"
            );
            assert!(!error.is_retryable());
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(std::fs::read_to_string(dir.db()).unwrap(), text);
}

async fn retry_later(_: &std::io::Error) {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[tokio::test]
async fn a_database_locked_out_beyond_the_timeouts_is_unavailable_and_nothing_is_held() {
    let dir = Scratch::new("locked-out");
    drop(support::store(&dir.db()).await);
    let config = SqliteConfig::new(dir.db())
        .with_command_timeout(Duration::from_millis(300))
        .with_connect_timeout(Duration::from_millis(300));

    // The dropped handle's connections close in the background.
    let mut tries = 0;
    let lockout = loop {
        match Lockout::hold(&dir.db()) {
            Ok(lockout) => break lockout,
            Err(error) if tries < 500 => {
                tries += 1;
                retry_later(&error).await;
            }
            Err(error) => panic!("the closed handle kept its lock on the file: {error}"),
        }
    };
    let started = Instant::now();
    match SqliteStore::connect(config.clone()).await {
        Err(error @ Error::Unavailable { .. }) => assert!(
            error.to_string().contains("locked") || error.to_string().contains("within"),
            "{error}"
        ),
        other => panic!("expected a retryable error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // A lazy handle fails the same way at its first use.
    let lazy = SqliteStore::connect_lazy(config.clone()).unwrap();
    let error = lazy.try_acquire("k", TTL).await.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    drop(lockout);

    // Nothing was taken meanwhile.
    let store = SqliteStore::connect(config).await.unwrap();
    assert_eq!(store.status("k").await.unwrap(), KeyStatus::Free);
    let lease = store.try_acquire("k", TTL).await.unwrap();
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn a_write_transaction_held_beyond_the_command_timeout_makes_writes_unavailable() {
    let dir = Scratch::new("long-transaction");
    let store = SqliteStore::connect(
        SqliteConfig::new(dir.db()).with_command_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let before = store.try_acquire("k", TTL).await.unwrap();
    assert_eq!(
        store.release(&before).await.unwrap(),
        ReleaseOutcome::Released
    );

    let reader = SqliteStore::connect(
        SqliteConfig::new(dir.db()).with_command_timeout(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    // Another program sits in a write transaction.
    let mut other = SqliteConnection::connect(&format!("sqlite://{}", dir.db().display()))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let started = Instant::now();
    match store.try_acquire("k", TTL).await {
        Err(error @ Error::Unavailable { .. }) => {
            assert!(
                error.to_string().contains("locked by another connection"),
                "{error}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "took {waited:?}");
    // Reads go on in WAL mode: the key is seen free, and it is. Read through another handle
    // (opened before the transaction began: opening one writes): the refused attempt's
    // statement may still hold this handle's connection on its worker thread for up to the
    // busy timeout after the attempt gave up.
    assert_eq!(reader.status("k").await.unwrap(), KeyStatus::Free);
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let lease = store.try_acquire("k", TTL).await.unwrap();
    assert!(lease.fencing_token() > before.fencing_token());
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}
