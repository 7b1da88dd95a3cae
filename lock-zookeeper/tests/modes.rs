//! Readers and permits in the default layout, seen from ZooKeeper's side (the conformance
//! suite checks what they guarantee): a lock node's name says its mode, a reader or permit
//! queued behind a writer is not marked, a granted one is (`shared`, `slot {n}`), and a
//! permit takes the lowest slot its elders leave free. `layout=curator` and `layout=kazoo`
//! keep exclusive leases only and refuse the other modes before creating anything. Against
//! test-servers' shared standalone ZooKeeper.

mod common;

use std::time::Duration;

use fencelock_core::{Error, LockStore, Mode, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::ZookeeperEnsemble;
use tokio::time::{sleep, Instant};

/// The longest TTL the test server allows (its `maxSessionTimeout`).
const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;
/// How long a node the test expects may take to appear.
const PATIENCE: Duration = Duration::from_secs(10);

fn url() -> String {
    ZookeeperEnsemble::shared_standalone().url()
}

async fn handle(prefix: &str, options: &str) -> ZookeeperStore {
    common::store(&url(), &format!("&prefix={prefix}{options}")).await
}

/// The container's children, oldest first, once there are `count` of them.
async fn queued(raw: &zookeeper_client::Client, path: &str, count: usize) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut children = raw.list_children(path).await.unwrap_or_default();
        if children.len() >= count {
            children.sort_by_key(|name| name.rsplit('-').next().unwrap_or("").to_owned());
            return children;
        }
        assert!(Instant::now() < deadline, "{path} has {children:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

/// A node's data and data version.
async fn data(raw: &zookeeper_client::Client, path: &str) -> (String, i32) {
    let (data, stat) = raw.get_data(path).await.expect("the node");
    (String::from_utf8(data).expect("text"), stat.version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_layouts_refuse_readers_and_permits() {
    let raw = common::raw(&url()).await;
    for layout in ["curator", "kazoo"] {
        let prefix = common::fresh_prefix(&format!("modes-{layout}"));
        let store = handle(&prefix, &format!("&layout={layout}")).await;
        let caps = store.capabilities();
        assert!(!caps.shared && !caps.permits, "{layout}: {caps:?}");
        for mode in [Mode::Shared, Mode::permits(2)] {
            match store.try_acquire_as("k", TTL, mode).await {
                Err(Error::Unsupported { .. }) => {}
                other => panic!("{layout}, {mode}: expected Unsupported, got {other:?}"),
            }
            match store
                .acquire_as("k", TTL, Duration::from_millis(100), mode)
                .await
            {
                Err(Error::Unsupported { .. }) => {}
                other => panic!("{layout}, {mode}: expected Unsupported, got {other:?}"),
            }
        }
        let path = store.config().lock_path("k");
        let made = raw.list_children(&path).await.unwrap_or_default();
        assert!(made.is_empty(), "{layout}: a refused mode made {made:?}");
    }
    let store = handle(&common::fresh_prefix("modes-default"), "").await;
    let caps = store.capabilities();
    assert!(caps.shared && caps.permits, "{caps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_name_their_mode_and_marks_record_grants() {
    let prefix = common::fresh_prefix("modes-marks");
    let (a, b) = (handle(&prefix, "").await, handle(&prefix, "").await);
    let raw = common::raw(&url()).await;

    // A reader behind a writer: queued, named a reader's, not marked; marked once granted.
    let path = a.config().lock_path("rw");
    let writer = a.try_acquire("rw", TTL).await.expect("a free key");
    let reader = tokio::spawn(async move {
        let lease = b.acquire_as("rw", TTL, TTL, Mode::Shared).await;
        (lease, b)
    });
    let nodes = queued(&raw, &path, 2).await;
    assert!(
        nodes[0].contains("-lock-") && !nodes[0].contains("-shared-"),
        "{nodes:?}"
    );
    assert!(nodes[1].contains("-shared-lock-"), "{nodes:?}");
    let reader_node = format!("{path}/{}", nodes[1]);
    assert_eq!(data(&raw, &reader_node).await, (String::new(), 0));
    assert_eq!(a.release(&writer).await.unwrap(), ReleaseOutcome::Released);
    let (lease, b) = reader.await.expect("the reader's task");
    let lease = lease.expect("a reader once the writer left");
    assert_eq!(lease.mode(), Mode::Shared);
    assert!(lease.fencing_token() > writer.fencing_token());
    assert_eq!(data(&raw, &reader_node).await, ("shared".into(), 1));
    assert_eq!(b.release(&lease).await.unwrap(), ReleaseOutcome::Released);

    // Permits of 3: each marked with its slot; a freed slot is the next permit's.
    let path = a.config().lock_path("sem");
    let mode = Mode::permits(3);
    let first = a.try_acquire_as("sem", TTL, mode).await.expect("a permit");
    let second = b.try_acquire_as("sem", TTL, mode).await.expect("a permit");
    let nodes = queued(&raw, &path, 2).await;
    assert!(
        nodes.iter().all(|name| name.contains("-permit3-lock-")),
        "{nodes:?}"
    );
    assert_eq!((first.slot(), second.slot()), (Some(0), Some(1)));
    assert_eq!(
        data(&raw, &format!("{path}/{}", nodes[0])).await,
        ("slot 0".into(), 1)
    );
    assert_eq!(
        data(&raw, &format!("{path}/{}", nodes[1])).await,
        ("slot 1".into(), 1)
    );
    assert_eq!(a.release(&first).await.unwrap(), ReleaseOutcome::Released);
    let third = a.try_acquire_as("sem", TTL, mode).await.expect("a permit");
    assert_eq!(third.slot(), Some(0), "the freed slot");
    assert!(third.fencing_token() > second.fencing_token());
    assert_eq!(a.release(&third).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(b.release(&second).await.unwrap(), ReleaseOutcome::Released);
}
