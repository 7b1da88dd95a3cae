//! `layout=curator` and `layout=kazoo` next to the real clients, in both directions, on
//! test-servers' shared standalone ZooKeeper: a fencelock holder blocks a queued Curator
//! `InterProcessMutex` (kazoo `Lock`) until it releases, and a Curator (kazoo) holder makes
//! fencelock's `try_acquire` busy and its `acquire` wait until the peer releases. Every
//! fencelock token is its lock node's `czxid`, and the peer's token (its node's `czxid`) is
//! below the next fencelock token.
//!
//! The peers are `tests/peers/CuratorLock.java` (compiled with `javac` once per source into
//! `target/zk-peers/`; Debian's `default-jdk-headless` and `libcurator-recipes-java`) and
//! `tests/peers/kazoo_lock.py` (run by `/usr/bin/python3`; Debian's `python3-kazoo`). A missing
//! one fails the test naming its package.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, KeepAlive, LockStore, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::ZookeeperEnsemble;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

/// The longest TTL the test server allows (its `maxSessionTimeout`); a lease held while a peer
/// starts is kept alive (a JVM starting on a loaded machine may take longer).
const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;
/// Generous: a JVM starting on a loaded machine, other test processes.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a queued peer is watched for a wrong grant once its node is in the queue: it
/// decides from one list of the children right after its create, which takes a round trip.
const SETTLE: Duration = Duration::from_millis(500);

const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];

fn peers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

fn classpath(extra: &Path) -> String {
    let mut parts = vec![extra.display().to_string()];
    parts.extend(JARS.iter().map(|jar| format!("/usr/share/java/{jar}")));
    parts.join(":")
}

/// The compiled Curator peer's directory, compiled once per source text.
fn curator_classes() -> PathBuf {
    for jar in JARS {
        let path = Path::new("/usr/share/java").join(jar);
        assert!(
            path.exists(),
            "{} is missing: install Debian's libcurator-recipes-java (it brings Curator, \
             ZooKeeper's client, Guava and SLF4J)",
            path.display()
        );
    }
    let javac = std::process::Command::new("javac").arg("-version").output();
    assert!(
        javac.is_ok_and(|out| out.status.success()),
        "javac is missing: install Debian's default-jdk-headless"
    );
    let source = std::fs::read(peers().join("CuratorLock.java")).expect("the Java peer");
    let hash = source.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let classes = target.join(format!("zk-peers/{hash:016x}"));
    if classes.join("CuratorLock.class").exists() {
        return classes;
    }
    // Compiled aside and renamed into place: test processes running at once never see half.
    let staging = target.join(format!("zk-peers/staging-{}", std::process::id()));
    std::fs::create_dir_all(&staging).expect("a staging directory");
    let out = std::process::Command::new("javac")
        .args(["-implicit:none", "-d"])
        .arg(&staging)
        .arg("-cp")
        .arg(classpath(Path::new(".")))
        .arg(peers().join("CuratorLock.java"))
        .output()
        .expect("run javac");
    assert!(
        out.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if std::fs::rename(&staging, &classes).is_err() {
        // Another process put its copy there first.
        let _ = std::fs::remove_dir_all(&staging);
    }
    classes
}

fn kazoo_installed() {
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import kazoo"])
        .output();
    assert!(
        out.is_ok_and(|out| out.status.success()),
        "kazoo is missing for /usr/bin/python3: install Debian's python3-kazoo (and python3)"
    );
}

/// A running peer: its stdin (a line releases) and its stdout's lines.
struct Peer {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    fn start(layout: &str, hosts: &str, path: &str) -> Peer {
        let mut command = match layout {
            "curator" => {
                let classes = curator_classes();
                let mut command = Command::new("java");
                command
                    .arg("-cp")
                    .arg(classpath(&classes))
                    .arg("CuratorLock");
                command
            }
            _ => {
                kazoo_installed();
                let mut command = Command::new("/usr/bin/python3");
                command.arg(peers().join("kazoo_lock.py"));
                command
            }
        };
        let mut child = command
            .args([hosts, path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the peer");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Peer { child, lines }
    }

    /// The next line, within `within`; `None` if none came.
    async fn line(&mut self, within: Duration) -> Option<String> {
        match timeout(within, self.lines.next_line()).await {
            Ok(line) => Some(line.expect("read the peer").expect("the peer ended early")),
            Err(_) => None,
        }
    }

    /// Waits for `HELD <node> <czxid>`: the node's name and czxid.
    async fn held(&mut self) -> (String, u64) {
        let line = self.line(PATIENCE).await.expect("the peer took the lock");
        let mut words = line.split(' ');
        assert_eq!(words.next(), Some("HELD"), "{line}");
        let node = words.next().expect("a node").to_owned();
        let czxid = words.next().and_then(|z| z.parse().ok()).expect("a czxid");
        (node, czxid)
    }

    async fn release(mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"release\n").await.expect("tell the peer");
        stdin.flush().await.expect("flush");
        assert_eq!(self.line(PATIENCE).await.as_deref(), Some("RELEASED"));
        let status = timeout(PATIENCE, self.child.wait())
            .await
            .expect("the peer exits")
            .expect("wait");
        assert!(status.success(), "{status}");
    }
}

async fn queued(raw: &zookeeper_client::Client, path: &str, count: usize) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let children = raw.list_children(path).await.unwrap_or_default();
        if children.len() >= count {
            return children;
        }
        assert!(Instant::now() < deadline, "{path} has {children:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

async fn czxid(raw: &zookeeper_client::Client, path: &str) -> u64 {
    raw.check_stat(path)
        .await
        .expect("stat")
        .expect("the node")
        .czxid as u64
}

async fn both_directions(layout: &str) {
    let url = ZookeeperEnsemble::shared_standalone().url();
    let prefix = common::fresh_prefix(&format!("interop-{layout}"));
    let store: Arc<ZookeeperStore> =
        Arc::new(common::store(&url, &format!("&prefix={prefix}&layout={layout}")).await);
    let hosts = store.config().endpoints().join(",");
    let path = store.config().lock_path("jobs:nightly");
    assert_eq!(path, format!("{prefix}/jobs:nightly"));
    let raw = common::raw(&url).await;

    // fencelock holds; the peer queues behind it and waits until the release.
    let lease = store
        .try_acquire("jobs:nightly", TTL)
        .await
        .expect("a free key");
    let ours = queued(&raw, &path, 1).await;
    let node = match layout {
        "curator" => {
            assert!(
                ours[0].starts_with("_c_") && ours[0].contains("-lock-"),
                "{ours:?}"
            );
            &ours[0]
        }
        _ => {
            assert!(ours[0].contains("__lock__"), "{ours:?}");
            &ours[0]
        }
    };
    assert_eq!(
        lease.fencing_token(),
        czxid(&raw, &format!("{path}/{node}")).await,
        "the token is the node's czxid"
    );
    let kept = KeepAlive::start(store.clone(), lease);
    let mut peer = Peer::start(layout, &hosts, &path);
    queued(&raw, &path, 2).await;
    assert_eq!(peer.line(SETTLE).await, None, "the peer took a held lock");
    let lease = kept.stop();
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    let (peer_node, peer_token) = peer.held().await;
    assert!(peer_token > lease.fencing_token());

    // The peer holds: fencelock is busy, and a waiting acquire gets the lock at its release.
    match store.try_acquire("jobs:nightly", TTL).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("{layout} holds {peer_node}, but try_acquire gave {other:?}"),
    }
    let waiter = tokio::spawn({
        let store = common::store(&url, &format!("&prefix={prefix}&layout={layout}")).await;
        async move {
            let lease = store.acquire("jobs:nightly", TTL, PATIENCE).await;
            (store, lease)
        }
    });
    queued(&raw, &path, 2).await;
    sleep(SETTLE).await;
    assert!(
        !waiter.is_finished(),
        "fencelock took a lock {layout} holds"
    );
    peer.release().await;
    let (waiting, lease) = waiter.await.expect("the waiter");
    let lease = lease.expect("granted after the peer's release");
    assert!(
        lease.fencing_token() > peer_token,
        "{} after the peer's {peer_token}",
        lease.fencing_token()
    );
    assert_eq!(
        waiting.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_fencelock_exclude_each_other() {
    both_directions("curator").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_fencelock_exclude_each_other() {
    both_directions("kazoo").await;
}
