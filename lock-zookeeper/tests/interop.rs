//! `layout=curator` and `layout=kazoo` next to the real clients, in both directions, on
//! test-servers' shared standalone ZooKeeper: a fencelock holder blocks a queued Curator
//! `InterProcessMutex` (kazoo `Lock`) until it releases, and a Curator (kazoo) holder makes
//! fencelock's `try_acquire` busy and its `acquire` wait until the peer releases. Every
//! fencelock token is its lock node's `czxid`, and the peer's token (its node's `czxid`) is
//! below the next fencelock token. A fencelock election and Curator's `LeaderSelector` (kazoo's
//! `Election`) on one path elect one leader at a time, each naming the other's by its value.
//!
//! The peers are `tests/peers/CuratorLock.java` and `CuratorElection.java` (compiled with
//! `javac` once per source into `target/zk-peers/`; Debian's `default-jdk-headless` and
//! `libcurator-recipes-java`) and `tests/peers/kazoo_lock.py` and `kazoo_election.py` (run by
//! `/usr/bin/python3`; Debian's `python3-kazoo`). A missing one fails the test naming its
//! package.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, KeepAlive, Leader, LockStore, LockStoreExt, Observer, ReleaseOutcome};
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

/// The directory of the compiled Curator peer `class` (`tests/peers/{class}.java`), compiled
/// once per source text.
fn curator_classes(class: &str) -> PathBuf {
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
    let source_path = peers().join(format!("{class}.java"));
    let source = std::fs::read(&source_path).expect("the Java peer");
    let hash = source.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let classes = target.join(format!("zk-peers/{class}-{hash:016x}"));
    if classes.join(format!("{class}.class")).exists() {
        return classes;
    }
    // Compiled aside and renamed into place: test processes running at once never see half.
    // One staging directory per class and process: two tests of one process compile two
    // classes at once, and a shared directory moved one's classes in with the other's.
    let staging = target.join(format!("zk-peers/staging-{class}-{}", std::process::id()));
    std::fs::create_dir_all(&staging).expect("a staging directory");
    let out = std::process::Command::new("javac")
        .args(["-implicit:none", "-d"])
        .arg(&staging)
        .arg("-cp")
        .arg(classpath(Path::new(".")))
        .arg(&source_path)
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
    /// The layout's lock peer on `path`.
    fn start(layout: &str, hosts: &str, path: &str) -> Peer {
        match layout {
            "curator" => Peer::spawn(java("CuratorLock").args([hosts, path])),
            _ => Peer::spawn(python("kazoo_lock.py").args([hosts, path])),
        }
    }

    /// The layout's election peer on `path`, campaigning as `id`.
    fn candidate(layout: &str, hosts: &str, path: &str, id: &str) -> Peer {
        match layout {
            "curator" => Peer::spawn(java("CuratorElection").args([hosts, path, id])),
            _ => Peer::spawn(python("kazoo_election.py").args([hosts, path, id])),
        }
    }

    fn spawn(command: &mut Command) -> Peer {
        let mut child = command
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

    /// Sends one command line.
    async fn send(&mut self, command: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("tell the peer");
        stdin.flush().await.expect("flush");
    }

    /// The next line, which must be `expected`.
    async fn expect(&mut self, expected: &str) {
        let line = self.line(PATIENCE).await;
        assert_eq!(line.as_deref(), Some(expected), "the peer's next line");
    }

    /// The election peer's leader as its own library names it (`getLeader()`,
    /// `contenders()[0]`): the value after `LEADER `, empty when nobody leads.
    async fn leader(&mut self) -> String {
        self.send("leader").await;
        let line = self.line(PATIENCE).await.expect("the peer's leader");
        match line.strip_prefix("LEADER ") {
            Some(leader) => leader.to_owned(),
            None => panic!("asked for its leader, the peer said {line:?}"),
        }
    }

    /// Ends the election peer's leadership; its node is gone when this returns.
    async fn resign(&mut self) {
        self.send("resign").await;
        self.expect("RESIGNED").await;
    }

    /// Closes its stdin: the election peer leaves and exits.
    async fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = timeout(PATIENCE, self.child.wait())
            .await
            .expect("the peer exits")
            .expect("wait");
        assert!(status.success(), "{status}");
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

/// The Curator peer `class`, run by `java`.
fn java(class: &str) -> Command {
    let classes = curator_classes(class);
    let mut command = Command::new("java");
    command.arg("-cp").arg(classpath(&classes)).arg(class);
    command
}

/// The kazoo peer `script`, run by `/usr/bin/python3`.
fn python(script: &str) -> Command {
    kazoo_installed();
    let mut command = Command::new("/usr/bin/python3");
    command.arg(peers().join(script));
    command
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
    let lease = kept.stop().await;
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

/// The node of `path` whose data is `value`, and its `czxid`.
async fn node_of(raw: &zookeeper_client::Client, path: &str, value: &str) -> (String, u64) {
    for child in raw.list_children(path).await.expect("the lock path") {
        let node = format!("{path}/{child}");
        if let Ok((data, stat)) = raw.get_data(&node).await {
            if data == value.as_bytes() {
                return (child, stat.czxid as u64);
            }
        }
    }
    panic!("no node of {path} holds {value:?}");
}

/// The first leader the observer reports with `value`, within the patience.
async fn observed(observer: &mut Observer, value: &str) -> Leader {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = timeout(left, observer.next())
            .await
            .unwrap_or_else(|_| panic!("no observed leader {value:?} within {PATIENCE:?}"))
            .expect("observe");
        if let Some(leader) = next.filter(|l| l.value.as_deref() == Some(value)) {
            return leader;
        }
    }
}

/// A fencelock election and the peer's (Curator `LeaderSelector`, kazoo `Election`, both on
/// their lock recipe) on one path: one leader at a time across both, each naming the other's
/// leader by its value (its lock node's data), a proclaimed value seen by the peer, and the
/// leadership handed over both ways on resign, the term growing.
async fn one_election(layout: &str) {
    let url = ZookeeperEnsemble::shared_standalone().url();
    let prefix = common::fresh_prefix(&format!("election-{layout}"));
    let store: Arc<ZookeeperStore> =
        Arc::new(common::store(&url, &format!("&prefix={prefix}&layout={layout}")).await);
    let hosts = store.config().endpoints().join(",");
    let path = store.config().lock_path("service:leader");
    let raw = common::raw(&url).await;
    let election = store.election("service:leader").ttl(TTL);
    let theirs = format!("{layout} b");

    // fencelock leads (kept alive by its leadership); the peer queues and names it.
    let first = election
        .campaign("fencelock a")
        .await
        .expect("nobody leads");
    assert_eq!(
        node_of(&raw, &path, "fencelock a").await.1,
        first.term(),
        "the leader's value is its node's data, its term the node's czxid"
    );
    let mut observer = election.observe();
    let seen = observed(&mut observer, "fencelock a").await;
    assert_eq!(seen.term, first.term());
    let mut peer = Peer::candidate(layout, &hosts, &path, &theirs);
    queued(&raw, &path, 2).await;
    assert_eq!(
        peer.line(SETTLE).await,
        None,
        "the peer was elected under a leader"
    );
    assert_eq!(peer.leader().await, "fencelock a");
    first.proclaim("fencelock a v2").await.expect("proclaim");
    assert_eq!(peer.leader().await, "fencelock a v2", "a proclaimed value");

    // fencelock resigns: the peer leads, and fencelock names it, its term its node's czxid.
    let first_term = first.term();
    assert_eq!(
        first.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    peer.expect("ELECTED").await;
    let (_, peer_term) = node_of(&raw, &path, &theirs).await;
    assert!(peer_term > first_term, "{peer_term} after {first_term}");
    let leader = election
        .leader()
        .await
        .expect("leader")
        .expect("the peer leads");
    assert_eq!(
        (leader.value.as_deref(), leader.term),
        (Some(theirs.as_str()), peer_term)
    );
    assert_eq!(observed(&mut observer, &theirs).await.term, peer_term);
    assert_eq!(peer.leader().await, theirs);

    // fencelock campaigns behind the peer, and leads once the peer resigns.
    let campaign = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("fencelock c").await }
    });
    queued(&raw, &path, 2).await;
    sleep(SETTLE).await;
    assert!(
        !campaign.is_finished(),
        "fencelock was elected while {layout} leads"
    );
    assert_eq!(peer.leader().await, theirs);
    peer.resign().await;
    let next = timeout(PATIENCE, campaign)
        .await
        .expect("elected after the peer resigned")
        .expect("the campaign")
        .expect("a campaign");
    assert!(next.term() > peer_term, "{} after {peer_term}", next.term());
    assert_eq!(peer.leader().await, "fencelock c");
    assert_eq!(
        observed(&mut observer, "fencelock c").await.term,
        next.term()
    );
    assert_eq!(
        next.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    assert_eq!(peer.leader().await, "", "nobody leads");
    assert_eq!(election.leader().await.expect("leader"), None);
    peer.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_selector_and_fencelock_elections_exclude_each_other() {
    one_election("curator").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_election_and_fencelock_elections_exclude_each_other() {
    one_election("kazoo").await;
}
