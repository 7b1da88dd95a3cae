//! The built `lockctl` over TLS, against real servers with a throwaway CA from
//! test-servers: `rediss://`, `rediss+sentinel://` and `redlock://…?tls=true` with `tls_ca`,
//! `etcds://` with `tls_ca`,
//! and `postgres://…?tls_ca=` (sslmode=verify-full implied). On each, `lockctl run KEY -- true`
//! runs the command, a second `lockctl run --wait 0s` is refused with exit 75 while a first one
//! holds the key, and a run that trusts the wrong CA exits 76 (the store's error) with one line
//! that does not show the password, without running the command.
#![cfg(feature = "tls")]
// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_servers::TestCa;

/// The store refused: sysexits' EX_PROTOCOL.
const STORE_ERROR: i32 = 76;
/// The lock is held by someone else: EX_TEMPFAIL.
const BUSY: i32 = 75;
const SECRET: &str = "lockctl-tls-hunter2";

fn lockctl(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    // Never the developer's terminal: lockctl would hand it to the command's group.
    command.env("LOCK_URL", url).stdin(Stdio::null());
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A `lockctl run` holding a key; killed if the test fails before it ends it.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for_file(path: &Path, holder: &mut Holder) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.trim().is_empty() {
                return text;
            }
        }
        if let Some(status) = holder.0.try_wait().expect("try_wait") {
            panic!("the holding lockctl exited {status} before its command ran");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `url` (a TLS URL trusting the right CA): `lockctl run KEY -- true` exits 0; while a first
/// `lockctl run` holds the key (its command has run with a fencing token), a second with
/// `--wait 0s` exits 75; the first, sent SIGTERM, passes it to its command (128 + 15).
fn runs_and_excludes_over(url: &str, scratch: &Path) {
    let output = lockctl(url)
        .args(["run", "tls-run", "--", "true"])
        .output()
        .expect("lockctl runs");
    assert_eq!(output.status.code(), Some(0), "{url}: {}", stderr(&output));

    let marker = scratch.join("token");
    let mut holder = Holder(
        lockctl(url)
            .args(["run", "tls-busy", "--ttl", "10s", "--", "sh", "-c"])
            .arg(format!(
                "echo $LOCK_FENCING_TOKEN > {}; exec sleep 60",
                marker.display()
            ))
            .stderr(Stdio::null())
            .spawn()
            .expect("holder spawns"),
    );
    let token: u64 = wait_for_file(&marker, &mut holder)
        .trim()
        .parse()
        .expect("a fencing token");
    assert!(token > 0, "{url}: token {token}");
    let output = lockctl(url)
        .args(["run", "tls-busy", "--wait", "0s", "--", "true"])
        .output()
        .expect("lockctl runs");
    assert_eq!(
        output.status.code(),
        Some(BUSY),
        "{url}: {}",
        stderr(&output)
    );
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(holder.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let started = Instant::now();
    let status = loop {
        if let Some(status) = holder.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{url}: the holder did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143), "{url}: {status}");
}

/// `url` (with `SECRET` as its password, trusting a CA that did not sign the server): exit 76
/// with exactly one line on stderr that speaks of the certificate and names no password, and
/// the command never ran.
fn wrong_ca_is_one_line_without_the_password(url: &str, scratch: &Path) {
    assert!(url.contains(SECRET), "{url}");
    let ran = scratch.join("ran");
    let output = lockctl(url)
        .args([
            "--connect-timeout",
            "30s",
            "run",
            "tls-wrong-ca",
            "--",
            "sh",
        ])
        .arg("-c")
        .arg(format!("touch {}", ran.display()))
        .output()
        .expect("lockctl runs");
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(STORE_ERROR), "{text}");
    assert!(!text.contains(SECRET), "the password shows: {text}");
    assert!(
        text.contains("certificate"),
        "says nothing of the certificate: {text}"
    );
    assert!(
        text.starts_with("lockctl: ") && text.ends_with('\n') && text.lines().count() == 1,
        "not one line: {text:?}"
    );
    assert!(
        !ran.exists(),
        "the command ran against a server of the wrong CA"
    );
}

/// A scratch directory for one test; removed when it ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("lockctl-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `url` (a TLS URL without options) trusting the test CA runs and excludes
/// ([`runs_and_excludes_over`]); `with_password` (the same URL with [`SECRET`] as the
/// password) trusting another CA is refused in one line ([`wrong_ca_is_one_line_without_the_password`]).
fn runs_over_and_refuses_the_wrong_ca(name: &str, url: &str, with_password: &str) {
    let scratch = Scratch::new(name);
    let ca = TestCa::shared();
    runs_and_excludes_over(&ca.with_ca_option(url), &scratch.0);
    wrong_ca_is_one_line_without_the_password(
        &format!("{with_password}?{}", ca.other_ca_option()),
        &scratch.0,
    );
}

#[cfg(feature = "redis")]
#[test]
fn redis_over_tls() {
    use test_servers::{ServerCert, TlsRedis};
    let server = TlsRedis::start(TestCa::shared(), ServerCert::Valid).expect("redis with TLS");
    let url = server.tls_url();
    let with_password = url.replacen("rediss://", &format!("rediss://:{SECRET}@"), 1);
    runs_over_and_refuses_the_wrong_ca("redis", &url, &with_password);
}

#[cfg(feature = "redis")]
#[test]
fn redlock_over_tls() {
    use test_servers::{ServerCert, TlsRedis};
    let scratch = Scratch::new("redlock");
    let nodes: Vec<TlsRedis> = (0..3)
        .map(|_| TlsRedis::start(TestCa::shared(), ServerCert::Valid).expect("redis with TLS"))
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.tls_port()))
        .collect();
    let url = format!(
        "redlock://{}?tls=true&{}",
        hosts.join(","),
        TestCa::shared().ca_option()
    );
    runs_and_excludes_over(&url, &scratch.0);
}

#[cfg(feature = "redis")]
#[test]
fn sentinel_over_tls() {
    use test_servers::{RedisSentinel, SentinelOptions, SentinelTls};
    let ca = TestCa::shared();
    let deployment = RedisSentinel::start(SentinelOptions {
        tls: Some(SentinelTls::from_ca(ca)),
        ..SentinelOptions::default()
    })
    .expect("a Sentinel deployment with TLS");
    // rediss+sentinel://…/fencelock?tls_ca=…: the sentinels and the master over TLS.
    let url = deployment.url();
    let scratch = Scratch::new("sentinel");
    runs_and_excludes_over(&url, &scratch.0);
    let wrong = url
        .replacen(
            "rediss+sentinel://",
            &format!("rediss+sentinel://:{SECRET}@"),
            1,
        )
        .replace(&ca.ca_option(), &ca.other_ca_option());
    wrong_ca_is_one_line_without_the_password(&wrong, &scratch.0);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_over_tls() {
    use test_servers::{ServerCert, TlsEtcd};
    let server = TlsEtcd::start(TestCa::shared(), ServerCert::Valid).expect("etcd with TLS");
    let url = server.tls_url();
    let with_password = url.replacen("etcds://", &format!("etcds://root:{SECRET}@"), 1);
    runs_over_and_refuses_the_wrong_ca("etcd", &url, &with_password);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_over_tls() {
    use test_servers::{PostgresServer, ServerCert};
    let server =
        PostgresServer::start_tls(TestCa::shared(), ServerCert::Valid).expect("postgres with TLS");
    let url = server.url();
    let with_password = url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{SECRET}@"),
        1,
    );
    runs_over_and_refuses_the_wrong_ca("postgres", &url, &with_password);
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_over_tls() {
    use test_servers::zookeeper::Security;
    use test_servers::{ServerCert, ZookeeperEnsemble};
    let security = Security {
        tls: Some(ServerCert::Valid),
        ..Security::default()
    };
    let server =
        ZookeeperEnsemble::start_secure(TestCa::shared(), &security).expect("zookeeper with TLS");
    let url = server.tls_url().expect("a secureClientPort");
    let with_password = url.replacen("zookeepers://", &format!("zookeepers://app:{SECRET}@"), 1);
    runs_over_and_refuses_the_wrong_ca("zookeeper", &url, &with_password);
}
