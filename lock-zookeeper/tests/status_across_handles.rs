//! `status` from another handle (its own session, as another process has) names the token the
//! holder was granted, and an election's `leader()` the leadership's term, starting with the
//! first grant on a fresh prefix (the one that makes the offset node, with no zxid seen yet to
//! raise it from). No other lock node is ever made for it: a reader, or an observer woken
//! meanwhile, would take that node for the holder and its token for the lease's. Against
//! test-servers' shared standalone ZooKeeper, on prefixes no other test uses.

mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{KeyStatus, LockStore, LockStoreExt, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::ZookeeperEnsemble;
use zookeeper_client::{AddWatchMode, EventType, PersistentWatcher};

/// The longest TTL the test server allows (its `maxSessionTimeout`).
const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;

async fn handle(prefix: &str) -> ZookeeperStore {
    let url = ZookeeperEnsemble::shared_standalone().url();
    common::store(&url, &format!("&prefix={prefix}")).await
}

async fn status_token(store: &ZookeeperStore, key: &str) -> Option<u64> {
    match store.status(key).await.expect("status") {
        KeyStatus::Held { token, .. } => token,
        other => panic!("held, but status says {other:?}"),
    }
}

/// The lock nodes queued under `key`'s container, as a plain client lists them.
async fn queued(store: &ZookeeperStore, key: &str) -> Vec<String> {
    let raw = common::raw(&ZookeeperEnsemble::shared_standalone().url()).await;
    raw.list_children(&store.config().lock_path(key))
        .await
        .expect("the key's container")
}

/// A plain client's watch on everything made under `prefix` (which need not exist yet).
async fn watch_creates(prefix: &str) -> (zookeeper_client::Client, PersistentWatcher) {
    let raw = common::raw(&ZookeeperEnsemble::shared_standalone().url()).await;
    let watcher = raw
        .watch(prefix, AddWatchMode::PersistentRecursive)
        .await
        .expect("a recursive watch");
    (raw, watcher)
}

/// The nodes made under `container` that `watcher` was told of, once `raw`'s `sync` says
/// every event before it has been delivered.
async fn created_under(
    raw: &zookeeper_client::Client,
    watcher: &mut PersistentWatcher,
    container: &str,
) -> Vec<String> {
    raw.sync(container).await.expect("sync");
    let mut created = Vec::new();
    while let Ok(event) = tokio::time::timeout(Duration::from_millis(300), watcher.changed()).await
    {
        let under = event.path.strip_prefix(container);
        if let (EventType::NodeCreated, Some(name)) = (event.event_type, under) {
            if let Some(name) = name.strip_prefix('/') {
                created.push(name.to_owned());
            }
        }
    }
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_handle_reads_the_first_grant_on_a_fresh_prefix() {
    let prefix = common::fresh_prefix("status-across");
    let (raw, mut watcher) = watch_creates(&prefix).await;
    let holder = handle(&prefix).await;
    let lease = holder.try_acquire("k", TTL).await.expect("a free key");
    let token = lease.fencing_token();

    let other = handle(&prefix).await;
    assert_eq!(
        status_token(&other, "k").await,
        Some(token),
        "another handle"
    );
    assert_eq!(
        status_token(&holder, "k").await,
        Some(token),
        "the holder's"
    );
    let nodes = queued(&holder, "k").await;
    assert_eq!(nodes.len(), 1, "one node of the holder: {nodes:?}");
    assert!(
        nodes[0].starts_with(&lease.owner().to_string()),
        "{nodes:?} not {}'s",
        lease.owner()
    );
    let made = created_under(&raw, &mut watcher, &holder.config().lock_path("k")).await;
    assert_eq!(made, nodes, "the lock nodes ever made for the grant");
    assert_eq!(
        holder.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_handle_reads_the_first_leaders_term_on_a_fresh_prefix() {
    let prefix = common::fresh_prefix("leader-across");
    let (raw, mut watcher) = watch_creates(&prefix).await;
    // An observer from before the first grant, as `lockctl leader --watch` is: woken by the
    // key's first lock node, it must report the leader's term, not another node's.
    let observing = Arc::new(handle(&prefix).await);
    let mut observer = observing.election("scheduler").observe();
    assert_eq!(observer.next().await.expect("nobody leads yet"), None);
    let candidate = Arc::new(handle(&prefix).await);
    let leadership = candidate
        .election("scheduler")
        .ttl(TTL)
        .campaign("host-a:80")
        .await
        .expect("the only candidate leads");
    let term = leadership.term();
    let observed = tokio::time::timeout(Duration::from_secs(30), observer.next())
        .await
        .expect("the observer wakes")
        .expect("observed")
        .expect("someone leads");
    assert_eq!(observed.term, term, "the observer's first leader");

    let other = Arc::new(handle(&prefix).await);
    let leader = other
        .election("scheduler")
        .leader()
        .await
        .expect("leader")
        .expect("someone leads");
    assert_eq!(
        (leader.term, leader.value.as_deref()),
        (term, Some("host-a:80"))
    );
    assert_eq!(status_token(&other, "scheduler").await, Some(term));
    let nodes = queued(&other, "scheduler").await;
    assert_eq!(nodes.len(), 1, "one node of the leader: {nodes:?}");
    let made = created_under(&raw, &mut watcher, &other.config().lock_path("scheduler")).await;
    assert_eq!(made, nodes, "the lock nodes ever made for the leader");
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
}
