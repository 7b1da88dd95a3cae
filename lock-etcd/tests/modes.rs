//! Shared leases and permits on etcd, beyond the conformance suite: what the queue holds
//! after a refused request, a reader behind a waiting writer, readers arriving together, and
//! what `status` lists. Against test-servers' shared single-member etcd.

mod common;

use std::time::Duration;

use etcd_client::GetOptions;
use fencelock_core::{Error, KeyStatus, LockStore, Mode, OwnerId, ReleaseOutcome};
use fencelock_etcd::EtcdStore;
use test_servers::shared;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(30);
/// Generous: other test processes may load this machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// A handle under a prefix of the test's own, and that prefix.
async fn handle(prefix: &str) -> EtcdStore {
    common::store(&shared::etcd().url(), &format!("&prefix={prefix}")).await
}

fn fresh_prefix(name: &str) -> String {
    format!("modes-{name}-{}/", OwnerId::random())
}

/// How many queue entries exist under `prefix` (every entry of every queue in it; the
/// prefix's token offset, `{prefix}~offset`, is none).
async fn keys_under(prefix: &str) -> i64 {
    let mut client = etcd_client::Client::connect([shared::etcd().endpoint()], None)
        .await
        .expect("a raw client");
    let offset = format!("{prefix}~offset");
    let answer = client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list the keys");
    answer
        .kvs()
        .iter()
        .filter(|kv| kv.key() != offset.as_bytes())
        .count() as i64
}

async fn until_keys(prefix: &str, n: i64) {
    let started = Instant::now();
    while keys_under(prefix).await != n {
        assert!(started.elapsed() < PATIENCE, "{prefix} never held {n} keys");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_leaves_nothing_queued() {
    let prefix = fresh_prefix("refused");
    let (a, b) = (handle(&prefix).await, handle(&prefix).await);
    let writer = a.try_acquire("k", TTL).await.expect("a free key");
    for mode in [Mode::Shared, Mode::permits(2)] {
        match b.try_acquire_as("k", TTL, mode).await {
            Err(Error::Busy { .. }) => {}
            other => panic!("{mode} next to a writer: expected Busy, got {other:?}"),
        }
        // Revoked before the call returned, not in the background.
        assert_eq!(
            keys_under(&prefix).await,
            1,
            "{mode}: a busy request left its entry"
        );
    }
    assert_eq!(a.release(&writer).await.unwrap(), ReleaseOutcome::Released);

    let three = Mode::permits(3);
    let first = a.try_acquire_as("k", TTL, three).await.expect("a permit");
    match b.try_acquire_as("k", TTL, Mode::permits(5)).await {
        Err(Error::LimitMismatch {
            held: 3,
            requested: 5,
            ..
        }) => {}
        other => panic!("a permit of 5 next to one of 3: got {other:?}"),
    }
    assert_eq!(
        keys_under(&prefix).await,
        1,
        "a refused limit left its entry"
    );
    assert_eq!(a.release(&first).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(keys_under(&prefix).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_arriving_after_a_waiting_writer_queues_behind_it() {
    let prefix = fresh_prefix("writer-first");
    let (a, b, c) = (
        handle(&prefix).await,
        handle(&prefix).await,
        handle(&prefix).await,
    );
    let reader = a
        .try_acquire_as("k", TTL, Mode::Shared)
        .await
        .expect("a reader on a free key");
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.acquire_as("k", TTL, PATIENCE, Mode::Exclusive).await }
    });
    until_keys(&prefix, 2).await;
    match c.try_acquire_as("k", TTL, Mode::Shared).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a reader behind a waiting writer: expected Busy, got {other:?}"),
    }
    let late = tokio::spawn({
        let c = c.clone();
        async move { c.acquire_as("k", TTL, PATIENCE, Mode::Shared).await }
    });
    until_keys(&prefix, 3).await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        !writer.is_finished(),
        "the writer was granted next to a reader"
    );
    assert!(
        !late.is_finished(),
        "a reader was granted ahead of a waiting writer"
    );
    assert_eq!(a.release(&reader).await.unwrap(), ReleaseOutcome::Released);
    let writer = writer
        .await
        .unwrap()
        .expect("the writer, once the reader left");
    assert!(writer.fencing_token() > reader.fencing_token());
    sleep(Duration::from_millis(200)).await;
    assert!(
        !late.is_finished(),
        "a reader was granted next to the writer"
    );
    assert_eq!(b.release(&writer).await.unwrap(), ReleaseOutcome::Released);
    let late = late
        .await
        .unwrap()
        .expect("the late reader, after the writer");
    assert!(late.fencing_token() > writer.fencing_token());
    assert_eq!(c.release(&late).await.unwrap(), ReleaseOutcome::Released);
}

/// Readers that arrive together are all granted without a wait (none is refused for another
/// reader that is still between its enqueue and its grant), and `status` lists them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_arriving_together_are_all_granted_and_listed() {
    const READERS: usize = 8;
    let prefix = fresh_prefix("together");
    let mut handles = Vec::new();
    for _ in 0..READERS {
        handles.push(handle(&prefix).await);
    }
    let tasks: Vec<_> = handles
        .iter()
        .cloned()
        .map(|store| {
            tokio::spawn(async move { store.try_acquire_as("k", TTL, Mode::Shared).await })
        })
        .collect();
    let mut leases = Vec::new();
    for task in tasks {
        leases.push(task.await.unwrap().expect("a reader next to readers"));
    }
    let status = handles[0].status("k").await.expect("status");
    let KeyStatus::Shared {
        mode,
        count,
        holders,
    } = status
    else {
        panic!("eight readers: status {status:?}");
    };
    assert_eq!(
        (mode, count as usize, holders.len()),
        (Mode::Shared, READERS, READERS)
    );
    for lease in &leases {
        let holder = holders
            .iter()
            .find(|h| h.token == Some(lease.fencing_token()))
            .expect("every reader is listed");
        assert_eq!(holder.owner, Some(lease.owner()));
        assert!(holder.remaining.is_some_and(|r| r <= TTL));
    }
    for (store, lease) in handles.iter().zip(&leases) {
        assert_eq!(
            store.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }

    let two = Mode::permits(2);
    let first = handles[0].try_acquire_as("k", TTL, two).await.unwrap();
    let second = handles[1].try_acquire_as("k", TTL, two).await.unwrap();
    let status = handles[2].status("k").await.expect("status");
    let KeyStatus::Shared { mode, holders, .. } = status else {
        panic!("two permits: status {status:?}");
    };
    assert_eq!(mode, two);
    let mut slots: Vec<_> = holders.iter().map(|h| h.slot).collect();
    slots.sort();
    assert_eq!(slots, [Some(0), Some(1)]);
    assert_eq!(
        handles[0].release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        handles[1].release(&second).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(handles[0].status("k").await.unwrap(), KeyStatus::Free);
}
