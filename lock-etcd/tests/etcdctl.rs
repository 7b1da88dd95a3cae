//! The etcd layout (`layout=etcd`) next to the real Go client: `etcdctl lock` (etcd's
//! `concurrency.Mutex`) and fencelock exclude each other on the same name, share one FIFO queue,
//! and their tokens (fencelock's `fencing_token`, `etcdctl lock`'s `ETCD_LOCK_REV`) grow across
//! each other's grants. Needs `etcdctl` (Debian package `etcd-client`).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::store;
use etcd_client::GetOptions;
use fencelock_core::{Error, Lease, LockStore, ReleaseOutcome};
use fencelock_etcd::{mutex_key, EtcdStore};
use test_servers::shared;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// Generous: other test processes may load this machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long a process that should stay queued is given to show it does not: only a broken
/// exclusion could make a test fail within it, never a slow machine.
const MARGIN: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_secs(10);

/// A name of this test run only; `etcdctl lock {name}` and fencelock's `{name}` are one lock.
fn name(test: &str) -> String {
    format!("interop-{test}-{:08x}", rand_suffix())
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

async fn etcd_layout_store() -> EtcdStore {
    store(&shared::etcd().url(), "&layout=etcd").await
}

/// How many entries the queue of `name` holds, whoever put them.
async fn queue_len(name: &str) -> usize {
    let mut client = etcd_client::Client::connect([shared::etcd().endpoint()], None)
        .await
        .expect("a raw client");
    let count = client
        .get(
            format!("{name}/"),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count the queue")
        .count();
    usize::try_from(count).expect("a count")
}

/// Waits until the queue of `name` holds `n` entries (a new waiter has joined).
async fn until_queued(name: &str, n: usize) {
    let started = Instant::now();
    while queue_len(name).await != n {
        assert!(
            started.elapsed() < PATIENCE,
            "the queue of {name} never held {n} entries"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// What `etcdctl lock` told the command it ran.
#[derive(Debug)]
struct Granted {
    /// The shell's pid; ending it ends the command, and `etcdctl` then unlocks.
    pid: u32,
    key: String,
    rev: u64,
}

/// `etcdctl lock {name} -- sh -c …`: once it holds the lock, the shell prints its pid,
/// `ETCD_LOCK_KEY` and `ETCD_LOCK_REV`, then waits until the test ends it.
struct EtcdctlLock {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl EtcdctlLock {
    fn start(name: &str) -> Self {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", shared::etcd().endpoint()))
            .args(["lock", "--ttl", "10", name, "--", "sh", "-c"])
            // The shell ends its sleep and exits 0 on SIGTERM, so etcdctl exits 0 too.
            .arg(concat!(
                r#"trap 'kill $!; exit 0' TERM; echo "$$ $ETCD_LOCK_KEY $ETCD_LOCK_REV"; "#,
                "sleep 600 & wait"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl runs (Debian package etcd-client)");
        let stdout = child.stdout.take().expect("piped stdout");
        EtcdctlLock {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Waits up to `limit` for the command to report that it holds the lock.
    async fn granted_within(&mut self, limit: Duration) -> Option<Granted> {
        let line = timeout(limit, self.lines.next_line()).await.ok()?;
        let line = line.expect("read etcdctl's output").expect("a line");
        let mut fields = line.split(' ');
        let mut field = || fields.next().expect("pid, key and rev").to_owned();
        Some(Granted {
            pid: field().parse().expect("a pid"),
            key: field(),
            rev: field().parse().expect("ETCD_LOCK_REV is a number"),
        })
    }

    async fn granted(&mut self) -> Granted {
        self.granted_within(PATIENCE)
            .await
            .expect("etcdctl lock was never granted")
    }

    /// Ends the command; `etcdctl` unlocks and exits.
    async fn release(mut self, granted: &Granted) {
        let killed = std::process::Command::new("kill")
            .arg(granted.pid.to_string())
            .status()
            .expect("kill runs");
        assert!(killed.success(), "the command {} was gone", granted.pid);
        let status = timeout(PATIENCE, self.child.wait())
            .await
            .expect("etcdctl exits after its command")
            .expect("wait for etcdctl");
        assert!(status.success(), "etcdctl lock failed: {status}");
    }
}

/// A fencelock waiter on `name`, on its own handle.
async fn fencelock_waiter(name: &str) -> JoinHandle<fencelock_core::Result<(EtcdStore, Lease)>> {
    let store = etcd_layout_store().await;
    let name = name.to_owned();
    tokio::spawn(async move {
        let lease = store.acquire(&name, TTL, PATIENCE).await?;
        Ok((store, lease))
    })
}

async fn joined(
    waiter: JoinHandle<fencelock_core::Result<(EtcdStore, Lease)>>,
) -> (EtcdStore, Lease) {
    timeout(PATIENCE, waiter)
        .await
        .expect("the fencelock waiter was never granted")
        .expect("the waiter task")
        .expect("the fencelock waiter's acquire")
}

async fn released(store: &EtcdStore, lease: &Lease) {
    assert_eq!(
        store.release(lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The lease's `ETCD_LOCK_KEY` is `{name}/{its etcd lease id in hex}`, and that key exists.
async fn check_mutex_key(name: &str, lease: &Lease) {
    let key = mutex_key(lease).expect("an etcd-layout lease has a mutex key");
    let hex = key
        .strip_prefix(&format!("{name}/"))
        .unwrap_or_else(|| panic!("{key} is not under {name}/"));
    assert!(
        i64::from_str_radix(hex, 16).is_ok_and(|id| id > 0),
        "{key} does not end in a lease id in hex"
    );
    let mut client = etcd_client::Client::connect([shared::etcd().endpoint()], None)
        .await
        .expect("a raw client");
    let kvs = client.get(key, None).await.expect("read the key");
    assert_eq!(kvs.kvs().len(), 1, "{key} does not exist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_holder_excludes_fencelock_until_it_unlocks() {
    let name = name("peer-holds");
    let store = etcd_layout_store().await;
    let mut peer = EtcdctlLock::start(&name);
    let granted = peer.granted().await;
    assert!(
        granted.key.starts_with(&format!("{name}/")),
        "ETCD_LOCK_KEY {} is not under {name}/",
        granted.key
    );

    match store.try_acquire(&name, TTL).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("fencelock took a name etcdctl lock holds: {other:?}"),
    }
    let waiter = fencelock_waiter(&name).await;
    until_queued(&name, 2).await;
    sleep(MARGIN).await;
    assert!(
        !waiter.is_finished(),
        "a fencelock waiter was granted while etcdctl lock held the name"
    );

    peer.release(&granted).await;
    let (store, lease) = joined(waiter).await;
    assert!(
        lease.fencing_token() > granted.rev,
        "token {} after an ETCD_LOCK_REV of {}",
        lease.fencing_token(),
        granted.rev
    );
    check_mutex_key(&name, &lease).await;
    released(&store, &lease).await;
    assert_eq!(queue_len(&name).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencelock_holder_excludes_etcdctl_lock_until_it_releases() {
    let name = name("fencelock-holds");
    let store = etcd_layout_store().await;
    let lease = store.try_acquire(&name, TTL).await.expect("a free name");
    check_mutex_key(&name, &lease).await;

    let mut peer = EtcdctlLock::start(&name);
    until_queued(&name, 2).await;
    if let Some(granted) = peer.granted_within(MARGIN).await {
        panic!("etcdctl lock was granted while fencelock held the name: {granted:?}");
    }

    released(&store, &lease).await;
    let granted = peer.granted().await;
    assert!(
        granted.rev > lease.fencing_token(),
        "ETCD_LOCK_REV {} after a fencelock token of {}",
        granted.rev,
        lease.fencing_token()
    );
    peer.release(&granted).await;
    assert_eq!(queue_len(&name).await, 0);
}

/// A fencelock holder, then waiters queued in the order etcdctl, fencelock, etcdctl, fencelock:
/// each is granted in that order, and every token (fencelock's or `ETCD_LOCK_REV`) is greater
/// than the one before, though all but the first had to queue (so their entries' create
/// revisions are all lower than the grants before them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_and_fencelock_waiters_are_served_in_queue_order_with_growing_tokens() {
    let name = name("fifo");
    let store = etcd_layout_store().await;
    let first = store.try_acquire(&name, TTL).await.expect("a free name");

    let mut peer_1 = EtcdctlLock::start(&name);
    until_queued(&name, 2).await;
    let waiter_2 = fencelock_waiter(&name).await;
    until_queued(&name, 3).await;
    let mut peer_3 = EtcdctlLock::start(&name);
    until_queued(&name, 4).await;
    let waiter_4 = fencelock_waiter(&name).await;
    until_queued(&name, 5).await;

    released(&store, &first).await;
    let granted_1 = peer_1.granted().await;
    assert!(granted_1.rev > first.fencing_token());
    assert!(
        !waiter_2.is_finished() && !waiter_4.is_finished(),
        "a fencelock waiter was granted while etcdctl lock held the name"
    );

    peer_1.release(&granted_1).await;
    let (store_2, lease_2) = joined(waiter_2).await;
    assert!(
        lease_2.fencing_token() > granted_1.rev,
        "the fencelock waiter's token {} is not above the etcdctl holder's ETCD_LOCK_REV {}",
        lease_2.fencing_token(),
        granted_1.rev
    );
    if let Some(granted) = peer_3.granted_within(MARGIN).await {
        panic!("etcdctl lock was granted while a fencelock waiter held the name: {granted:?}");
    }
    assert!(!waiter_4.is_finished(), "two fencelock holders at once");

    released(&store_2, &lease_2).await;
    let granted_3 = peer_3.granted().await;
    assert!(
        granted_3.rev > lease_2.fencing_token(),
        "ETCD_LOCK_REV {} is not above the fencelock holder's token {}",
        granted_3.rev,
        lease_2.fencing_token()
    );
    sleep(MARGIN).await;
    assert!(
        !waiter_4.is_finished(),
        "a fencelock waiter was granted while etcdctl lock held the name"
    );

    peer_3.release(&granted_3).await;
    let (store_4, lease_4) = joined(waiter_4).await;
    assert!(lease_4.fencing_token() > granted_3.rev);
    released(&store_4, &lease_4).await;
    assert_eq!(queue_len(&name).await, 0);
}
