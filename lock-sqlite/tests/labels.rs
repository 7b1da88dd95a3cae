//! Holder labels in the lock table: a table made before labels gains the column and keeps its
//! counters, and a label is never shown for a holder it does not belong to.

mod support;

use std::time::Duration;

use fencelock_core::{KeyStatus, LockStore, LockStoreExt, ReleaseOutcome};
use sqlx::{Connection, SqliteConnection};
use support::{store, Scratch};

const TTL: Duration = Duration::from_secs(30);

/// The lock table as the builds before labels made it (fence scheme 3, no `label`).
const TABLE_BEFORE_LABELS: &str = "CREATE TABLE fencelock_locks (
    key        BLOB    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL,
    owner      TEXT,
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    pid        INTEGER NOT NULL,
    fence_scheme INTEGER NOT NULL CHECK (fence_scheme = 3)
) WITHOUT ROWID";

fn label(status: &KeyStatus) -> Option<&str> {
    match status {
        KeyStatus::Held { label, .. } => label.as_deref(),
        other => panic!("expected a held key, got {other:?}"),
    }
}

#[tokio::test]
async fn a_table_made_before_labels_gains_the_column_and_keeps_its_counters() {
    let dir = Scratch::new("before-labels");
    let url = format!("sqlite://{}?mode=rwc", dir.db().display());
    let mut old = SqliteConnection::connect(&url).await.unwrap();
    sqlx::query(TABLE_BEFORE_LABELS)
        .execute(&mut old)
        .await
        .unwrap();
    let far_ahead: i64 = 9_000_000_000_000_000;
    sqlx::query(
        "INSERT INTO fencelock_locks VALUES (CAST('k' AS BLOB), ?1, NULL, 'another boot', 0, 1, 1, 3)",
    )
    .bind(far_ahead)
    .execute(&mut old)
    .await
    .unwrap();
    old.close().await.unwrap();

    let store = std::sync::Arc::new(store(&dir.db()).await);
    let guard = store
        .lock("k")
        .ttl(TTL)
        .label("host-a pid 1")
        .await
        .unwrap();
    assert!(
        guard.fencing_token() > far_ahead as u64,
        "the counter was kept"
    );
    assert_eq!(
        label(&store.status("k").await.unwrap()),
        Some("host-a pid 1")
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A build that does not know labels takes a key without touching the column: the label
/// left by the holder before must not be shown as the new holder's.
#[tokio::test]
async fn a_label_is_shown_only_for_the_holder_it_belongs_to() {
    let dir = Scratch::new("label-owner");
    let store = std::sync::Arc::new(store(&dir.db()).await);
    let lease = store
        .lock("k")
        .ttl(TTL)
        .label("first")
        .lease()
        .await
        .unwrap();
    assert_eq!(label(&store.status("k").await.unwrap()), Some("first"));
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    // What an earlier build's acquire writes: a new owner and token, the label as it was.
    let url = format!("sqlite://{}", dir.db().display());
    let mut other = SqliteConnection::connect(&url).await.unwrap();
    sqlx::query(
        "UPDATE fencelock_locks SET owner = '0123456789abcdef0123456789abcdef',
             token = token + 1, expires_ns = expires_ns + 60000000000",
    )
    .execute(&mut other)
    .await
    .unwrap();
    other.close().await.unwrap();
    assert_eq!(label(&store.status("k").await.unwrap()), None);
}
