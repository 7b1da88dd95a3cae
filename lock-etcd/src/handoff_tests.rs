//! The handoff on a real etcd (test-servers' shared single-member one): a release marks its
//! successor, the mark passes the rest of the queue on, a successor whose entry vanished is
//! never handed the lock, and `layout=etcd` never writes a mark.

use std::time::Duration;

use etcd_client::{Client, GetOptions, KeyValue, SortOrder, SortTarget};
use fencelock_core::{Lease, LockStore, OwnerId, ReleaseOutcome};
use test_servers::shared;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use crate::handoff::parse_mark;
use crate::store::created;
use crate::{EtcdConfig, EtcdStore};

const TTL: Duration = Duration::from_secs(30);
/// Generous: other test processes may load this machine.
const PATIENCE: Duration = Duration::from_secs(30);

async fn handle(options: &str) -> EtcdStore {
    let url = format!("{}?connect_timeout=30{options}", shared::etcd().url());
    EtcdStore::connect(EtcdConfig::from_url(&url).expect("config"))
        .await
        .expect("connect")
}

async fn raw() -> Client {
    Client::connect([shared::etcd().endpoint()], None)
        .await
        .expect("a raw client")
}

/// Every entry under `dir`, oldest first.
async fn queue(client: &mut Client, dir: &str) -> Vec<KeyValue> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let mut answer = client
        .get(dir, Some(options))
        .await
        .expect("read the queue");
    answer.take_kvs()
}

/// Waits until the queue under `dir` holds `n` entries.
async fn queued(client: &mut Client, dir: &str, n: usize) -> Vec<KeyValue> {
    let until = Instant::now() + PATIENCE;
    loop {
        let entries = queue(client, dir).await;
        if entries.len() == n {
            return entries;
        }
        assert!(
            Instant::now() < until,
            "the queue never held {n} entries (it holds {})",
            entries.len()
        );
        sleep(Duration::from_millis(10)).await;
    }
}

async fn released(store: &EtcdStore, lease: &Lease) {
    assert_eq!(
        store.release(lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

fn wait_in_line(store: &EtcdStore, key: &str) -> JoinHandle<Lease> {
    let (store, key) = (store.clone(), key.to_owned());
    tokio::spawn(async move { store.acquire(&key, TTL, PATIENCE).await.expect("acquire") })
}

async fn granted(waiter: JoinHandle<Lease>) -> Lease {
    tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("granted in time")
        .expect("the waiter ran")
}

/// A key's queue: the holder `first` (granted at once, so it knows no successor) and the
/// waiters queued behind it, in order.
struct Line {
    client: Client,
    dir: String,
    first: Lease,
    waiters: Vec<JoinHandle<Lease>>,
}

async fn line_up(options: &str, waiters: usize) -> (EtcdStore, Line) {
    let prefix = format!("handoff-{}/", OwnerId::random());
    let store = handle(&format!("&prefix={prefix}{options}")).await;
    let key = "k".to_owned();
    let dir = crate::keys::dir(store.config().layout, &prefix, &key);
    let mut client = raw().await;
    let first = store.try_acquire(&key, TTL).await.expect("free key");
    let mut line = Vec::new();
    for n in 0..waiters {
        line.push(wait_in_line(&store, &key));
        queued(&mut client, &dir, n + 2).await;
    }
    let line = Line {
        client,
        dir,
        first,
        waiters: line,
    };
    (store, line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_down_the_queue() {
    let (store, mut line) = line_up("", 3).await;
    let entries = queue(&mut line.client, &line.dir).await;
    let mut waiters = line.waiters.into_iter();
    // The first holder knew no successor: its release only deletes, and the next one reads
    // the queue, which lists the two behind it.
    released(&store, &line.first).await;
    let second = granted(waiters.next().expect("a waiter")).await;
    assert_eq!(created(&second), Some(entries[1].create_revision()));
    let held = queue(&mut line.client, &line.dir).await;
    assert_eq!(
        held[0].value(),
        b"exclusive",
        "granted by a read, not by a mark"
    );
    // Its release marks the next entry, passing on the last one.
    released(&store, &second).await;
    let third = granted(waiters.next().expect("a waiter")).await;
    assert_eq!(created(&third), Some(entries[2].create_revision()));
    let held = queue(&mut line.client, &line.dir).await;
    assert_eq!(held[0].key(), entries[2].key());
    assert_eq!(held[0].create_revision(), entries[2].create_revision());
    assert_eq!(
        held[0].lease(),
        entries[2].lease(),
        "marked on its own lease"
    );
    let passed_on = parse_mark(held[0].value()).expect("a handoff mark");
    assert_eq!(passed_on.len(), 1);
    assert_eq!(passed_on[0].created, entries[3].create_revision());
    assert_eq!(passed_on[0].lease_id, entries[3].lease());
    // And that one is handed the lock in turn, with nobody left to pass on.
    released(&store, &third).await;
    let fourth = granted(waiters.next().expect("a waiter")).await;
    assert_eq!(created(&fourth), Some(entries[3].create_revision()));
    let held = queue(&mut line.client, &line.dir).await;
    assert_eq!(parse_mark(held[0].value()), Some(vec![]));
    assert!(second.fencing_token() < third.fencing_token());
    assert!(third.fencing_token() < fourth.fencing_token());
    released(&store, &fourth).await;
    assert!(queue(&mut line.client, &line.dir).await.is_empty());
}

/// A successor whose entry is gone (its lease revoked, or the entry deleted by hand) is never
/// handed the lock: the release only deletes, writes no entry back, and the waiter queues
/// again with a new entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_whose_entry_vanished_is_not_handed_the_lock() {
    for revoke in [true, false] {
        let (store, mut line) = line_up("", 2).await;
        let mut waiters = line.waiters.into_iter();
        released(&store, &line.first).await;
        // Granted by a read that listed the one behind it.
        let holder = granted(waiters.next().expect("a waiter")).await;
        let entries = queued(&mut line.client, &line.dir, 2).await;
        let successor = entries[1].clone();
        if revoke {
            line.client
                .lease_revoke(successor.lease())
                .await
                .expect("revoke the successor's lease");
        } else {
            line.client
                .delete(successor.key(), None)
                .await
                .expect("delete the successor's entry");
        }
        released(&store, &holder).await;
        let gone = line
            .client
            .get(successor.key(), None)
            .await
            .expect("read the old entry");
        assert!(
            gone.kvs().is_empty(),
            "the release wrote the vanished successor's entry back (revoke: {revoke})"
        );
        let requeued = granted(waiters.next().expect("a waiter")).await;
        assert!(created(&requeued) > Some(successor.create_revision()));
        let held = queue(&mut line.client, &line.dir).await;
        assert_eq!(held.len(), 1);
        assert_ne!(
            held[0].key(),
            successor.key(),
            "queued again, as a new entry"
        );
        assert_eq!(Some(held[0].create_revision()), created(&requeued));
        released(&store, &requeued).await;
    }
}

/// etcd's own clients know nothing of a mark: in their layout a release never writes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_layout_never_marks_an_entry() {
    let (store, mut line) = line_up("&layout=etcd", 2).await;
    let mut waiters = line.waiters.into_iter();
    released(&store, &line.first).await;
    let holder = granted(waiters.next().expect("a waiter")).await;
    released(&store, &holder).await;
    let last = granted(waiters.next().expect("a waiter")).await;
    let held = queue(&mut line.client, &line.dir).await;
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].value(),
        b"",
        "an entry of etcd's layout was rewritten"
    );
    released(&store, &last).await;
}

/// An older build named its entries by owner id, not by etcd lease. In a queue with such
/// entries, `status` reads the holder's owner from the name, a waiter of this build is granted
/// once the older holder goes, and its release hands the lock to the older waiter behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_builds_entries_are_read_and_handed_the_lock() {
    use etcd_client::PutOptions;
    use fencelock_core::KeyStatus;
    let prefix = format!("handoff-{}/", OwnerId::random());
    let store = handle(&format!("&prefix={prefix}")).await;
    let dir = crate::keys::dir(store.config().layout, &prefix, "k");
    let mut client = raw().await;
    let older = async |client: &mut Client| {
        let owner = OwnerId::random();
        let lease = client.lease_grant(30, None).await.expect("grant").id();
        let entry = format!("{dir}{owner}");
        let on_lease = PutOptions::new().with_lease(lease);
        client
            .put(entry.as_str(), "exclusive", Some(on_lease))
            .await
            .expect("an older build's entry");
        (owner, entry, lease)
    };
    let (first, first_entry, first_lease) = older(&mut client).await;
    let owner_held = |status: KeyStatus| match status {
        KeyStatus::Held { owner, .. } => owner,
        other => panic!("not held: {other:?}"),
    };
    assert_eq!(
        owner_held(store.status("k").await.expect("status")),
        Some(first)
    );
    let ours = wait_in_line(&store, "k");
    queued(&mut client, &dir, 2).await;
    let (last, last_entry, last_lease) = older(&mut client).await;
    queued(&mut client, &dir, 3).await;
    client
        .delete(first_entry, None)
        .await
        .expect("the older holder goes");
    let ours = granted(ours).await;
    assert_eq!(
        owner_held(store.status("k").await.expect("status")),
        Some(ours.owner())
    );
    // Granted by a read that listed the older waiter behind it: the release marks it.
    released(&store, &ours).await;
    let held = queue(&mut client, &dir).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key(), last_entry.as_bytes());
    assert_eq!(held[0].lease(), last_lease);
    assert_eq!(parse_mark(held[0].value()), Some(vec![]), "handed the lock");
    assert_eq!(
        owner_held(store.status("k").await.expect("status")),
        Some(last)
    );
    for lease in [first_lease, last_lease] {
        client.lease_revoke(lease).await.expect("revoke");
    }
}
