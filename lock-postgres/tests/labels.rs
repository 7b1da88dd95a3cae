//! Holder labels in the fence table: a table made before labels gains the `label` column where
//! the store may alter it, and where it may not (`create_table=false`), labels stay on the
//! lease and `status` shows none until its owner adds it. A label shows only for its owner.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{admin, store};
use fencelock_core::{Error, KeyStatus, LockStore, LockStoreExt, Mode, ReleaseOutcome};
use test_servers::shared;

const TTL: Duration = Duration::from_secs(30);

fn label(status: KeyStatus) -> Option<String> {
    match status {
        KeyStatus::Held { label, .. } => label,
        other => panic!("expected a held key, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_made_before_labels_gains_the_column_or_keeps_labels_on_the_lease() {
    let url = shared::postgres().url();
    let mut admin = admin(&url).await;
    let options = "schema=fencelock_labels_upgrade";
    sqlx::raw_sql("DROP SCHEMA IF EXISTS fencelock_labels_upgrade CASCADE")
        .execute(&mut admin)
        .await
        .unwrap();
    let first = store(&url, options).await;
    let table = first.config().fence_table();
    drop(first);
    let drop_column = format!("ALTER TABLE {table} DROP COLUMN label");
    sqlx::raw_sql(&drop_column)
        .execute(&mut admin)
        .await
        .unwrap();

    // Not allowed to alter the table: labels stay on the lease.
    let kept = Arc::new(store(&url, &format!("{options}&create_table=false")).await);
    assert!(!kept.capabilities().labels);
    let note = kept.diagnostics().join("\n");
    assert!(note.contains("label_column_ddl"), "{note}");
    let lease = kept
        .lock("k")
        .ttl(TTL)
        .label("host-a")
        .lease()
        .await
        .unwrap();
    assert_eq!(lease.label().as_deref(), Some("host-a"));
    assert_eq!(label(kept.status("k").await.unwrap()), None);
    match kept.relabel(&lease, "host-b").await {
        Err(Error::Unsupported { .. }) => {}
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert_eq!(
        kept.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );

    // Allowed: the first session adds the column.
    let added = Arc::new(store(&url, options).await);
    assert!(added.capabilities().labels && added.diagnostics().is_empty());
    let guard = added
        .lock("k")
        .ttl(TTL)
        .label("host-a pid 1")
        .await
        .unwrap();
    assert_eq!(
        label(added.status("k").await.unwrap()).as_deref(),
        Some("host-a pid 1")
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A build that writes no label takes a key without touching the column: the label the
/// holder before left must not be shown as the new holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_is_shown_only_for_the_holder_it_belongs_to() {
    let url = shared::postgres().url();
    let store = Arc::new(store(&url, "namespace=labels_owner").await);
    let reader = store
        .lock("k")
        .ttl(TTL)
        .mode(Mode::Shared)
        .label("first")
        .lease()
        .await
        .unwrap();
    match store.status("k").await.unwrap() {
        KeyStatus::Shared { holders, .. } => {
            assert_eq!(holders[0].label.as_deref(), Some("first"))
        }
        other => panic!("a held reader's status is {other:?}"),
    }
    // What an earlier build's bump writes: its own owner, the label as it was.
    let mut admin = admin(&url).await;
    let table = store.config().fence_table();
    sqlx::raw_sql(&format!(
        "UPDATE {table} SET owner = '0123456789abcdef0123456789abcdef' WHERE namespace = 'labels_owner'"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    match store.status("k").await.unwrap() {
        KeyStatus::Shared { holders, .. } => assert_eq!(holders[0].label, None),
        other => panic!("a held reader's status is {other:?}"),
    }
    assert_eq!(
        store.release(&reader).await.unwrap(),
        ReleaseOutcome::Released
    );
}
