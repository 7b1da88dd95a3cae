//! The plain layout (`layout=plain`) next to a real peer client: redis-py's `Lock` (Debian
//! package `python3-redis`), run by `tests/peers/redis_py_lock.py`. Both lock the Redis key
//! itself with `SET NX PX` and release by compare-and-delete, so they exclude each other on the
//! same key; a fencelock waiter sees a peer's release (which publishes nothing) by its retry at
//! least every `WAIT_CAP`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{admin, admin_query, store};
use fencelock_core::{Error, LockStore, ReleaseOutcome};
use fencelock_redis::{Layout, RedisStore, WAIT_CAP};
use test_servers::shared;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

/// Generous: other test processes may load this machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// Long enough that only a release, never an expiry, frees a key within a test.
const TTL: Duration = Duration::from_secs(60);

fn name(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("peer-{test}-{nanos:x}")
}

async fn plain_store() -> RedisStore {
    let store = store(&shared::redis().url(), "layout=plain").await;
    assert_eq!(store.config().layout(), Layout::Plain);
    store
}

/// Debian's interpreter, which has `python3-redis`, even where another `python3` (pyenv) comes
/// first on the PATH.
fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// One redis-py `Lock` on `key`, in its own process.
struct Peer {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    fn start(key: &str) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/redis_py_lock.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(shared::redis().url())
            .arg(key)
            .arg(TTL.as_secs().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        Peer {
            stdin: child.stdin.take().expect("piped stdin"),
            lines: BufReader::new(child.stdout.take().expect("piped stdout")).lines(),
            _child: child,
        }
    }

    async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to the peer");
        timeout(PATIENCE, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the peer did not answer {command:?}"))
            .expect("read the peer")
            .unwrap_or_else(|| panic!("the peer exited (is python3-redis installed?)"))
    }
}

async fn value_of(key: &str) -> Option<String> {
    let mut conn = admin(&shared::redis().url()).await;
    admin_query(&mut conn, redis::cmd("GET").arg(key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_holder_excludes_fencelock_until_it_releases() {
    let key = name("peer-holds");
    let store = plain_store().await;
    let before = store.try_acquire(&key, TTL).await.expect("a free key");
    assert_eq!(
        store.release(&before).await.unwrap(),
        ReleaseOutcome::Released
    );

    let mut peer = Peer::start(&key);
    assert_eq!(peer.ask("try").await, "acquired");
    let token = peer.ask("token").await;
    assert_eq!(
        value_of(&key).await,
        Some(token),
        "the peer's lock is the key itself"
    );
    match store.try_acquire(&key, TTL).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("fencelock took a key redis-py's Lock holds: {other:?}"),
    }

    assert_eq!(peer.ask("release").await, "released");
    let after = store
        .try_acquire(&key, TTL)
        .await
        .expect("the peer released");
    assert!(
        after.fencing_token() > before.fencing_token(),
        "the fence kept growing across the peer's hold"
    );
    assert_eq!(
        store.release(&after).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencelock_holder_excludes_the_peer_until_it_releases() {
    let key = name("fencelock-holds");
    let store = plain_store().await;
    let lease = store.try_acquire(&key, TTL).await.expect("a free key");
    assert_eq!(
        value_of(&key).await,
        Some(lease.owner().to_string()),
        "the lock is the key itself, holding the owner id"
    );

    let mut peer = Peer::start(&key);
    assert_eq!(peer.ask("try").await, "busy");
    // The peer cannot release what it does not hold: its compare-and-delete spares our lock.
    assert_eq!(peer.ask("release").await, "lost");
    assert_eq!(value_of(&key).await, Some(lease.owner().to_string()));

    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(peer.ask("try").await, "acquired");
    assert_eq!(peer.ask("release").await, "released");
}

/// A peer's release publishes nothing: the fencelock waiter sees it at its next retry, at
/// most `WAIT_CAP` (250 ms) later, plus a round trip. The waiter retries on its own schedule,
/// so the peer releases at three points of it (a quarter, half and three quarters of a
/// `WAIT_CAP` past two whole ones); the bound asserted is generous (a loaded machine), far
/// below the peer's TTL, and the delays measured are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencelock_waiter_gets_the_key_within_the_wait_cap_after_a_peer_release() {
    let store = plain_store().await;
    assert!(
        !store.capabilities().notified_wait,
        "the plain layout must not claim notified waits: peers publish nothing"
    );
    let mut delays = Vec::new();
    for quarter in 1..=3 {
        let key = name(&format!("wake-{quarter}"));
        let mut peer = Peer::start(&key);
        assert_eq!(peer.ask("try").await, "acquired");
        let waiter = {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.acquire(&key, TTL, PATIENCE).await })
        };
        sleep(WAIT_CAP * 2 + WAIT_CAP * quarter / 4).await;
        assert!(
            !waiter.is_finished(),
            "granted while redis-py's Lock held the key"
        );

        let released_at = Instant::now();
        assert_eq!(peer.ask("release").await, "released");
        let lease = timeout(PATIENCE, waiter)
            .await
            .expect("the waiter never saw the peer's release")
            .expect("the waiter task")
            .expect("the waiter's acquire");
        let delay = released_at.elapsed();
        assert!(
            delay < WAIT_CAP + Duration::from_secs(5),
            "the waiter took {delay:?} after the peer's release"
        );
        delays.push(delay);
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    println!("fencelock waiters saw redis-py's releases after {delays:?} (WAIT_CAP {WAIT_CAP:?})");
}
