//! Holder labels in the fence table: a table made before labels gains the `label` column where
//! the store may alter it, and where it may not, labels stay on the lease and `status` shows
//! none until an administrator adds it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::config;
use fencelock_core::{Error, KeyStatus, LockStore, LockStoreExt, ReleaseOutcome};
use fencelock_mysql::{MysqlConfig, MysqlStore};
use sqlx::{Connection, MySqlConnection};
use test_servers::shared;

const TTL: Duration = Duration::from_secs(30);
const LABEL_COLUMN: &str = "    label          VARBINARY(300)   NULL,\n";

async fn admin() -> MySqlConnection {
    MySqlConnection::connect(&shared::mariadb().url())
        .await
        .expect("admin connection")
}

/// The fence and floor tables of `config` as a build before labels made them.
async fn tables_before_labels(config: &MysqlConfig) -> MySqlConnection {
    let mut admin = admin().await;
    for table in [config.fence_table(), config.floor_table()] {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let ddl = config.fence_table_ddl();
    assert!(ddl.contains(LABEL_COLUMN), "{ddl}");
    sqlx::query(&ddl.replace(LABEL_COLUMN, ""))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::raw_sql(&config.floor_table_ddl())
        .execute(&mut admin)
        .await
        .unwrap();
    admin
}

fn label(status: KeyStatus) -> Option<String> {
    match status {
        KeyStatus::Held { label, .. } => label,
        other => panic!("expected a held key, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_made_before_labels_gains_the_label_column() {
    let config = config("table=labels_added");
    drop(tables_before_labels(&config).await);
    let store = Arc::new(MysqlStore::connect(config).await.expect("connect"));
    assert!(store.capabilities().labels);
    let guard = store
        .lock("k")
        .ttl(TTL)
        .label("host-a pid 1")
        .await
        .unwrap();
    assert_eq!(
        label(store.status("k").await.unwrap()).as_deref(),
        Some("host-a pid 1")
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_label_column_labels_stay_on_the_lease_until_an_administrator_adds_it() {
    let config = config("table=labels_missing&create_table=false");
    let mut admin = tables_before_labels(&config).await;
    let store = Arc::new(MysqlStore::connect(config.clone()).await.expect("connect"));
    assert!(!store.capabilities().labels);
    let note = store.diagnostics().join("\n");
    assert!(note.contains("label_column_ddl"), "{note}");
    let lease = store
        .lock("k")
        .ttl(TTL)
        .label("host-a")
        .lease()
        .await
        .unwrap();
    assert_eq!(lease.label().as_deref(), Some("host-a"));
    assert_eq!(label(store.status("k").await.unwrap()), None);
    match store.relabel(&lease, "host-b").await {
        Err(Error::Unsupported { .. }) => {}
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );

    sqlx::query(&config.label_column_ddl())
        .execute(&mut admin)
        .await
        .unwrap();
    let store = Arc::new(MysqlStore::connect(config).await.expect("connect"));
    assert!(store.capabilities().labels && store.diagnostics().is_empty());
    let lease = store
        .lock("k")
        .ttl(TTL)
        .label("host-a")
        .lease()
        .await
        .unwrap();
    assert_eq!(
        label(store.status("k").await.unwrap()).as_deref(),
        Some("host-a")
    );
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}
