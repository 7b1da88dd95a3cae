//! etcd keeps no per-key state past a lease: a lock is one key on the holder's etcd lease and
//! its token is a revision plus the prefix's one token offset. What this checks is that nothing
//! else is left behind: after 10,000 distinct keys are locked and released no key but that
//! offset is left under the prefix and at most
//! the handle's idle leases (8 per TTL) live on, ending with the handle; a dropped waiter's
//! queue key goes with its lease. Old revisions stay until the cluster is compacted, which is
//! the operator's business (`--auto-compaction-retention`), so only live keys are counted.
//!
//! `FENCELOCK_KEYS=100000 cargo test -p fencelock-etcd --all-features --test retention` locks more.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use fencelock_core::{LockStore, ReleaseOutcome};
use test_servers::shared;
use tokio::time::{sleep, Instant};

/// How long leftovers may take to go (a lease's TTL plus etcd's expiry sweep): generous.
const GONE_WITHIN: Duration = Duration::from_secs(20);
const TTL: Duration = Duration::from_secs(2);

fn key_count() -> usize {
    std::env::var("FENCELOCK_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

async fn client() -> Client {
    Client::connect([shared::etcd().endpoint()], None)
        .await
        .expect("etcd client")
}

/// Live keys under `prefix` but its token offset (old revisions are not keys).
async fn live_keys(client: &mut Client, prefix: &str) -> i64 {
    let offset = format!("{prefix}~offset");
    client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list")
        .kvs()
        .iter()
        .filter(|kv| kv.key() != offset.as_bytes())
        .count() as i64
}

/// Whether `prefix` holds its one token offset.
async fn has_offset(client: &mut Client, prefix: &str) -> bool {
    let offset = format!("{prefix}~offset");
    client
        .get(offset, Some(GetOptions::new().with_count_only()))
        .await
        .expect("count")
        .count()
        == 1
}

/// Leases the server holds (this test binary has the shared etcd to itself).
async fn live_leases(client: &mut Client) -> usize {
    client.leases().await.expect("leases").leases().len()
}

async fn until(mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_distinct_keys_leave_no_key_and_only_idle_leases_behind() {
    let url = shared::etcd().url();
    let prefix = "retention-many/";
    let store = common::store(&url, &format!("&prefix={prefix}")).await;
    let keys = key_count();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (store, next) = (store.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return;
                }
                let key = format!("order-{i}");
                let lease = store
                    .try_acquire(&key, TTL)
                    .await
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                let outcome = store.release(&lease).await.expect("release");
                assert_eq!(outcome, ReleaseOutcome::Released, "{key}");
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("worker");
    }
    let mut client = client().await;
    assert_eq!(live_keys(&mut client, prefix).await, 0, "no key left");
    assert!(
        has_offset(&mut client, prefix).await,
        "one offset per prefix"
    );
    // Revokes of leases beyond the idle ones run in the background.
    assert!(
        until(async || live_leases(&mut client).await <= 8).await,
        "{} leases left; a handle keeps at most 8 idle per TTL",
        live_leases(&mut client).await
    );
    drop(store);
    assert!(
        until(async || live_leases(&mut client).await == 0).await,
        "{} leases outlive their handle by more than their TTL",
        live_leases(&mut client).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiters_leave_no_queue_key_behind() {
    let url = shared::etcd().url();
    let prefix = "retention-waiters/";
    let store = common::store(&url, &format!("&prefix={prefix}")).await;
    let holder = store.try_acquire("order-1", TTL).await.expect("holder");
    let mut client = client().await;
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let store = store.clone();
        waiters.push(tokio::spawn(async move {
            store.acquire("order-1", TTL, Duration::from_secs(60)).await
        }));
    }
    assert!(
        until(async || live_keys(&mut client, prefix).await == 21).await,
        "the holder and 20 waiters are queued"
    );
    for waiter in &waiters {
        waiter.abort();
    }
    for waiter in waiters {
        assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
    }
    assert_eq!(
        store.release(&holder).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        until(async || live_keys(&mut client, prefix).await == 0).await,
        "{} queue keys left by dropped waiters",
        live_keys(&mut client, prefix).await
    );
    assert!(
        store.capabilities().retention.is_none(),
        "no per-key state to retain"
    );
}

/// A labelled holder's label key (fencelock's layout keeps it beside the queue, on the entry's
/// lease) goes with its release in every mode, as does the one a relabel put, and after a
/// handoff: the etcd lease kept idle for the next lock carries nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_go_with_their_release() {
    use fencelock_core::{LockStoreExt, Mode};
    let url = shared::etcd().url();
    let prefix = "retention-labels/";
    let store = Arc::new(common::store(&url, &format!("&prefix={prefix}")).await);
    let mut client = client().await;
    for mode in [Mode::Exclusive, Mode::Shared, Mode::permits(2)] {
        let lease = store
            .lock("labelled")
            .ttl(TTL)
            .mode(mode)
            .label("host-a")
            .lease()
            .await
            .expect("a free key");
        assert_eq!(
            live_keys(&mut client, prefix).await,
            2,
            "{mode}: entry and label"
        );
        let outcome = store.release(&lease).await.expect("release");
        assert_eq!(outcome, ReleaseOutcome::Released);
        assert_eq!(
            live_keys(&mut client, prefix).await,
            0,
            "{mode}: left behind"
        );
    }
    let unlabelled = store.try_acquire("relabelled", TTL).await.expect("free");
    assert_eq!(
        live_keys(&mut client, prefix).await,
        1,
        "an unlabelled entry"
    );
    store.relabel(&unlabelled, "later").await.expect("relabel");
    assert_eq!(live_keys(&mut client, prefix).await, 2, "relabelled");
    let waiter = |label: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .lock("relabelled")
                .ttl(TTL)
                .label(label)
                .wait(Duration::from_secs(30))
                .lease()
                .await
        })
    };
    let second = waiter("second");
    assert!(
        until(async || live_keys(&mut client, prefix).await == 4).await,
        "a labelled waiter queued"
    );
    let third = waiter("third");
    assert!(
        until(async || live_keys(&mut client, prefix).await == 6).await,
        "another labelled waiter queued"
    );
    assert_eq!(
        store.release(&unlabelled).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Granted after a wait, it knows the third behind it: its release hands the lock over.
    let second = second.await.expect("waiter").expect("granted");
    assert_eq!(
        live_keys(&mut client, prefix).await,
        4,
        "two labelled entries"
    );
    assert_eq!(
        store.release(&second).await.expect("release"),
        ReleaseOutcome::Released
    );
    let third = third.await.expect("waiter").expect("handed the lock");
    assert_eq!(live_keys(&mut client, prefix).await, 2, "the last holder's");
    assert_eq!(
        store.release(&third).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(live_keys(&mut client, prefix).await, 0, "left behind");
}

/// A busy key's entries are named by their etcd lease, which a handle reuses for its next lock,
/// so they reuse their names: etcd keeps every name a range has had in its index until a
/// compaction, and each sorted read of the queue visits them all. Hundreds of acquisitions in
/// every mode, waited for and handed off too, leave a few names (one per etcd lease the handle
/// used), not one per acquisition; and `status` names the holder's owner from its entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_keys_entries_reuse_their_names() {
    use etcd_client::{EventType, WatchOptions};
    use fencelock_core::{KeyStatus, LockStoreExt, Mode};
    use std::collections::HashMap;
    let url = shared::etcd().url();
    let prefix = "retention-names/";
    let store = Arc::new(common::store(&url, &format!("&prefix={prefix}")).await);
    let mut client = client().await;
    let start = client
        .get(prefix, None)
        .await
        .expect("a revision")
        .header()
        .expect("a header")
        .revision();
    let cycles = 50;
    for mode in [Mode::Exclusive, Mode::Shared, Mode::permits(2)] {
        for i in 0..cycles {
            let lock = store.lock("busy").ttl(TTL).mode(mode);
            let lock = if i % 2 == 0 {
                lock.label("host-a")
            } else {
                lock
            };
            let lease = lock.lease().await.expect("a free key");
            if mode == Mode::Exclusive && i == 0 {
                let status = store.status("busy").await.expect("status");
                assert!(
                    matches!(status, KeyStatus::Held { owner: Some(owner), .. } if owner == lease.owner()),
                    "status names the holder's owner: {status:?}"
                );
            }
            let outcome = store.release(&lease).await.expect("release");
            assert_eq!(outcome, ReleaseOutcome::Released, "{mode}");
        }
    }
    // Contended: each release hands the lock to a waiter or wakes one.
    let mut contenders = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let store = store.clone();
        contenders.spawn(async move {
            for _ in 0..cycles {
                let lease = store
                    .acquire("busy", TTL, Duration::from_secs(30))
                    .await
                    .expect("granted");
                let outcome = store.release(&lease).await.expect("release");
                assert_eq!(outcome, ReleaseOutcome::Released);
            }
        });
    }
    while let Some(done) = contenders.join_next().await {
        done.expect("contender");
    }
    // The last put under the prefix, for the history's read to stop at (other tests of this
    // binary write under their own prefixes meanwhile).
    let end_marker = format!("{prefix}~end");
    client
        .put(end_marker.as_str(), "", None)
        .await
        .expect("the end marker");
    // Every put under the prefix since `start`, as etcd's index has them: name to lease.
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start + 1);
    let mut stream = client.watch(prefix, Some(options)).await.expect("watch");
    let (mut names, mut puts, mut ended) = (HashMap::new(), 0, false);
    while !ended {
        let message = tokio::time::timeout(GONE_WITHIN, stream.message())
            .await
            .expect("the history up to the end marker, in time")
            .expect("history")
            .expect("a message");
        for event in message.events() {
            let kv = event.kv().expect("an event's key");
            let name = String::from_utf8_lossy(kv.key()).into_owned();
            ended |= name == end_marker;
            if event.event_type() == EventType::Put && !name.ends_with("~offset") && !ended {
                puts += 1;
                names.entry(name).or_insert(kv.lease());
            }
        }
    }
    client
        .delete(end_marker, None)
        .await
        .expect("delete the marker");
    let acquisitions = 3 * cycles + 4 * cycles;
    assert!(
        puts >= acquisitions,
        "{puts} puts for {acquisitions} acquisitions"
    );
    for (name, lease) in &names {
        assert!(
            name.ends_with(&format!("{lease:x}")),
            "{name} is not named by its etcd lease {lease:x}"
        );
    }
    // At most the handle's idle leases (8 per TTL) and the contenders' own, in each of the
    // names a lease can have: an exclusive, a reader's and a permit's entry, and a label.
    assert!(
        names.len() <= 4 * (8 + 4),
        "{} names for {acquisitions} acquisitions: {:?}",
        names.len(),
        names.keys().collect::<Vec<_>>()
    );
}
