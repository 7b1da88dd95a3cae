//! Elections in the etcd layout (`layout=etcd`) next to the real Go client: `etcdctl elect`
//! (etcd's `concurrency.Election`) and fencelock's [`Election`] are one election on the same
//! name. A fencelock leader is what `etcdctl elect -l` prints, its value included; an
//! `etcdctl elect` leader keeps fencelock's candidates out, and is fencelock's leader, its
//! proposal the value. Needs `etcdctl` (Debian package `etcd-client`).

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::store;
use fencelock_core::{DynLockStore, Election, Error, LockStoreExt, ReleaseOutcome};
use test_servers::shared;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{timeout, Instant};

/// Generous: other test processes may load this machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long a candidate that should stay out is given to show it does not: only a broken
/// exclusion could make a test fail within it, never a slow machine.
const MARGIN: Duration = Duration::from_millis(500);

/// A name of this test run only; `etcdctl elect {name}` and fencelock's `{name}` are one
/// election.
fn name(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "elect-{test}-{:08x}",
        nanos ^ std::process::id().rotate_left(16)
    )
}

async fn election(name: &str) -> Election {
    let store: DynLockStore = Arc::new(store(&shared::etcd().url(), "&layout=etcd").await);
    store.election(name)
}

/// An `etcdctl elect` process, campaigning (`elect NAME VALUE`) or observing (`elect -l NAME`),
/// and the lines it prints: the leader's key, then its value, for each leader.
struct Etcdctl {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Etcdctl {
    fn start<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(args: I) -> Self {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", shared::etcd().endpoint()))
            .arg("elect")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl runs (Debian package etcd-client)");
        let stdout = child.stdout.take().expect("piped stdout");
        Etcdctl {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    fn campaign(name: &str, value: &[u8]) -> Self {
        Self::start([OsStr::new(name), OsStr::from_bytes(value)])
    }

    fn observe(name: &str) -> Self {
        Self::start(["-l", name])
    }

    /// The next leader it prints (key, value), within `limit`.
    async fn leader_within(&mut self, limit: Duration) -> Option<(String, String)> {
        let deadline = Instant::now() + limit;
        let key = self.line_by(deadline).await?;
        let value = self.line_by(deadline).await?;
        Some((key, value))
    }

    async fn line_by(&mut self, deadline: Instant) -> Option<String> {
        let line = tokio::time::timeout_at(deadline, self.lines.next_line())
            .await
            .ok()?;
        Some(line.expect("read etcdctl's output").expect("a line"))
    }

    async fn leader(&mut self) -> (String, String) {
        self.leader_within(PATIENCE)
            .await
            .expect("etcdctl elect printed no leader")
    }

    /// Interrupts it: a campaigning `etcdctl elect` resigns on SIGINT, then exits.
    async fn interrupt(mut self) {
        let pid = self.child.id().expect("etcdctl still runs");
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "etcdctl {pid} was gone");
        timeout(PATIENCE, self.child.wait())
            .await
            .expect("etcdctl exits on SIGINT")
            .expect("wait for etcdctl");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencelock_leader_is_what_etcdctl_elect_listens_to() {
    let name = name("fencelock-leads");
    let election = election(&name).await;
    let leading = timeout(PATIENCE, election.campaign("host-a:8080 ✓"))
        .await
        .expect("a campaign nobody contests leads")
        .expect("campaign");

    let mut listener = Etcdctl::observe(&name);
    let (key, value) = listener.leader().await;
    let hex = key
        .strip_prefix(&format!("{name}/"))
        .unwrap_or_else(|| panic!("etcdctl's leader {key} is not under {name}/"));
    assert!(
        i64::from_str_radix(hex, 16).is_ok_and(|id| id > 0),
        "etcdctl's leader {key} does not end in a lease id in hex"
    );
    assert_eq!(value, "host-a:8080 ✓", "etcdctl sees another value");
    assert_eq!(
        Some(key.as_str()),
        fencelock_etcd::mutex_key(leading.lease()),
        "etcdctl's leader is not the fencelock leader's key"
    );

    // Proclaim is etcd's: a put of the leader's key, which `etcdctl elect -l` reports.
    leading.proclaim("host-a:9090").await.expect("proclaim");
    let (again, value) = listener.leader().await;
    assert_eq!(
        (again.as_str(), value.as_str()),
        (key.as_str(), "host-a:9090")
    );

    assert_eq!(
        leading.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcdctl_elect_leader_leads_fencelock_until_it_resigns() {
    let name = name("etcdctl-leads");
    let election = election(&name).await;
    let mut peer = Etcdctl::campaign(&name, b"etcdctl at 10.0.0.9");
    let (key, value) = peer.leader().await;
    assert!(key.starts_with(&format!("{name}/")), "{key}");
    assert_eq!(value, "etcdctl at 10.0.0.9");

    // fencelock sees it as the leader, its proposal as the value.
    let leader = election
        .leader()
        .await
        .expect("leader")
        .expect("etcdctl leads");
    assert_eq!(leader.value.as_deref(), Some("etcdctl at 10.0.0.9"));
    let mut observer = election.observe();
    let observed = timeout(PATIENCE, observer.next())
        .await
        .expect("an observer's first item comes at once")
        .expect("observe");
    assert_eq!(observed, Some(leader.clone()));

    // It keeps fencelock's candidates out.
    match election.campaign_for("fencelock", MARGIN).await {
        Err(Error::WaitTimedOut { .. }) => {}
        Ok(_) => panic!("fencelock led an election etcdctl elect leads"),
        Err(other) => panic!("a contested campaign failed otherwise: {other}"),
    }
    let candidate = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("fencelock").await }
    });
    tokio::time::sleep(MARGIN).await;
    assert!(
        !candidate.is_finished(),
        "a fencelock candidate led while etcdctl elect did"
    );

    // Once it resigns, the waiting candidate leads, in a later term.
    peer.interrupt().await;
    let leading = timeout(PATIENCE, candidate)
        .await
        .expect("the fencelock candidate never led after etcdctl resigned")
        .expect("the candidate task")
        .expect("campaign");
    assert!(
        leading.term() > leader.term,
        "term {} after etcdctl's {}",
        leading.term(),
        leader.term
    );
    let now = election
        .leader()
        .await
        .expect("leader")
        .expect("fencelock leads");
    assert_eq!(now.value.as_deref(), Some("fencelock"));
    assert_eq!(
        leading.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
}

/// A peer's value that is not UTF-8 is reported with each invalid sequence replaced by
/// U+FFFD, as the crate docs say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_value_that_is_not_utf8_is_reported_lossily() {
    let name = name("not-utf8");
    let election = election(&name).await;
    // `--hex`: etcdctl prints the value it leads with in hex, as it is not text.
    let mut peer = Etcdctl::start([
        OsStr::new("--hex"),
        OsStr::new(&name),
        OsStr::from_bytes(b"node-\xff-7"),
    ]);
    let (_, value) = peer.leader().await;
    assert_eq!(value, r"\x6e\x6f\x64\x65\x2d\xff\x2d\x37");
    let leader = election
        .leader()
        .await
        .expect("leader")
        .expect("etcdctl leads");
    assert_eq!(leader.value.as_deref(), Some("node-\u{fffd}-7"));
    peer.interrupt().await;
}
