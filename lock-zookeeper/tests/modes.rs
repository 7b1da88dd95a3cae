//! Readers and permits in the default layout, seen from ZooKeeper's side (the conformance
//! suite checks what they guarantee): a lock node's name says its mode, a reader or permit
//! queued behind a writer is not marked, a granted one is (`shared`, `slot {n}`), and a
//! permit takes the lowest slot its elders leave free; a holder's label is its node's data
//! (after a reader's or permit's mark), and data that is not UTF-8 is shown lossily. `layout=curator` and `layout=kazoo`
//! keep exclusive leases only and refuse the other modes before creating anything. Against
//! test-servers' shared standalone ZooKeeper.

mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, KeyStatus, LockStore, LockStoreExt, Mode, ReleaseOutcome};
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

/// The label `status` reports for the holder with `token`.
async fn reported(store: &ZookeeperStore, key: &str, token: u64) -> Option<String> {
    match store.status(key).await.expect("status") {
        KeyStatus::Held {
            token: Some(held),
            label,
            ..
        } if held == token => label,
        KeyStatus::Shared { holders, .. } => {
            holders
                .into_iter()
                .find(|h| h.token == Some(token))
                .expect("the holder")
                .label
        }
        other => panic!("{key} held by {token} is {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_the_node_data_after_the_mark() {
    let prefix = common::fresh_prefix("modes-labels");
    let a = Arc::new(handle(&prefix, "").await);
    let b = Arc::new(handle(&prefix, "").await);
    let raw = common::raw(&url()).await;

    // A labelled writer's node holds its label; a labelled reader behind it holds its own
    // until its mark, which puts `shared` and a newline before it.
    let path = a.config().lock_path("rw");
    let writer = a.lock("rw").ttl(TTL).label("writer w").lease().await;
    let writer = writer.expect("a free key");
    let reader = tokio::spawn({
        let b = b.clone();
        async move {
            b.lock("rw")
                .ttl(TTL)
                .mode(Mode::Shared)
                .label("reader r")
                .wait(TTL)
                .lease()
                .await
        }
    });
    let nodes = queued(&raw, &path, 2).await;
    let (writer_node, reader_node) = (
        format!("{path}/{}", nodes[0]),
        format!("{path}/{}", nodes[1]),
    );
    assert_eq!(data(&raw, &writer_node).await, ("writer w".into(), 0));
    assert_eq!(data(&raw, &reader_node).await, ("reader r".into(), 0));
    assert_eq!(a.release(&writer).await.unwrap(), ReleaseOutcome::Released);
    let lease = reader.await.expect("the reader's task").expect("a reader");
    assert_eq!(
        data(&raw, &reader_node).await,
        ("shared\nreader r".into(), 1)
    );
    assert_eq!(
        reported(&a, "rw", lease.fencing_token()).await.as_deref(),
        Some("reader r")
    );
    // A relabel rewrites the mark with the new label, one version on.
    b.relabel(&lease, "reader r2").await.expect("relabel");
    assert_eq!(
        data(&raw, &reader_node).await,
        ("shared\nreader r2".into(), 2)
    );
    assert_eq!(
        reported(&a, "rw", lease.fencing_token()).await.as_deref(),
        Some("reader r2")
    );
    assert_eq!(b.release(&lease).await.unwrap(), ReleaseOutcome::Released);

    // A permit's mark: its slot, then its label; unlabelled, only its slot.
    let path = a.config().lock_path("sem");
    let mode = Mode::permits(2);
    let first = a.lock("sem").ttl(TTL).mode(mode).label("p 1").lease().await;
    let first = first.expect("a permit");
    let second = b.try_acquire_as("sem", TTL, mode).await.expect("a permit");
    let nodes = queued(&raw, &path, 2).await;
    assert_eq!(
        data(&raw, &format!("{path}/{}", nodes[0])).await,
        ("slot 0\np 1".into(), 1)
    );
    assert_eq!(
        data(&raw, &format!("{path}/{}", nodes[1])).await,
        ("slot 1".into(), 1)
    );
    assert_eq!(
        reported(&b, "sem", first.fencing_token()).await.as_deref(),
        Some("p 1")
    );
    assert_eq!(reported(&a, "sem", second.fencing_token()).await, None);
    assert_eq!(a.release(&first).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(b.release(&second).await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_data_that_is_not_utf8_is_shown_lossily() {
    let prefix = common::fresh_prefix("modes-lossy");
    let store = handle(&prefix, "").await;
    let raw = common::raw(&url()).await;
    // A node written by hand (another client's, say) with bytes that are no UTF-8.
    let path = store.config().lock_path("k");
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    raw.mkdir(&path, &persistent).await.expect("the container");
    let node = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let owner = fencelock_core::OwnerId::random();
    let (_, sequence) = raw
        .create(&format!("{path}/{owner}-lock-"), b"peer \xff\xfe id", &node)
        .await
        .expect("a hand-made lock node");
    match store.status("k").await.expect("status") {
        KeyStatus::Held {
            owner: held, label, ..
        } => {
            assert_eq!(held, Some(owner));
            assert_eq!(label.as_deref(), Some("peer \u{fffd}\u{fffd} id"));
        }
        other => panic!("a key held by hand is {other:?}"),
    }
    raw.delete(&format!("{path}/{owner}-lock-{sequence}"), None)
        .await
        .expect("delete");
}
