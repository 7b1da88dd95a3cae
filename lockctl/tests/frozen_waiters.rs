//! `lockctl run --shared` and `--permits 1` waiters on PostgreSQL stopped with SIGSTOP while
//! they wait (as reproduced): once the holder ends, the key is free again
//! within 2 of the stopped waiter's TTLs, `lockctl status` does not count the stopped waiter as
//! a holder, and the waiter, continued, still gets the key within its wait.
#![cfg(feature = "postgres")]
// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The TTL of the holder, the stopped waiter and the third run.
const TTL: &str = "3s";

/// The bound: the third run gets the key within 2 of the stopped waiter's TTLs.
const BOUND: Duration = Duration::from_secs(6);

/// How long a step that is about to happen may take on a loaded machine.
const LIMIT: Duration = Duration::from_secs(30);

fn lockctl(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.env("LOCK_URL", url).stdin(Stdio::null());
    command
}

fn psql(server: &str, sql: &str) -> String {
    let output = Command::new("psql")
        .args([server, "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs (the Debian package postgresql)");
    assert!(
        output.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn scratch(name: &str) -> (PathBuf, String) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let unique = format!("{name}-{}-{nanos:x}", std::process::id());
    let dir = std::env::temp_dir().join(format!("lockctl-frozen-{unique}"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    (dir, unique)
}

fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < LIMIT, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("lockctl did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A spawned `lockctl`, killed (and reaped) if the test fails first: a stopped waiter must not
/// outlive it.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// How many backends hold (`granted`) or wait for the advisory lock `lock_id`.
fn on_lock(server: &str, lock_id: &str, granted: bool) -> String {
    psql(
        server,
        &format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
               AND granted = {granted}
               AND classid = (({lock_id}::int8 >> 32) & 4294967295)::oid
               AND objid = ({lock_id}::int8 & 4294967295)::oid"
        ),
    )
}

/// Holds `k` until `{dir}/go` exists (or a minute passed, so a failed test leaves nothing).
fn holder_script(dir: &Path) -> String {
    format!(
        "touch {dir}/held; i=0; while [ ! -e {dir}/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        dir = dir.display()
    )
}

fn stopped_waiter_keeps_the_key_at_most_its_ttl(mode: &[&str], name: &str) {
    let server = test_servers::shared::postgres().url();
    let (dir, namespace) = scratch(name);
    let separator = if server.contains('?') { '&' } else { '?' };
    let url = format!("{server}{separator}namespace={namespace}");

    let mut holder = Spawned(
        lockctl(&url)
            .args([
                "run",
                "k",
                "--ttl",
                TTL,
                "--",
                "sh",
                "-c",
                &holder_script(&dir),
            ])
            .spawn()
            .expect("the holder spawns"),
    );
    until("the holder running its command", || {
        dir.join("held").exists()
    });
    let lock_id = psql(
        &server,
        &format!("SELECT lock_id FROM public.fencelock_fence WHERE namespace = '{namespace}'"),
    );

    let mut waiter = Spawned(
        lockctl(&url)
            .args(["run", "k"])
            .args(mode)
            .args(["--ttl", TTL, "--wait", "60s", "--", "true"])
            .spawn()
            .expect("the waiter spawns"),
    );
    until("the waiter queueing", || {
        on_lock(&server, &lock_id, false) == "1"
    });
    signal(&waiter.0, libc::SIGSTOP);
    std::fs::write(dir.join("go"), "").expect("go");
    let status = wait_exit(&mut holder.0, LIMIT);
    assert!(status.success(), "the holder: {status}");
    let freed = Instant::now();
    // The server grants the stopped waiter's backend the key's lock in the queue.
    until("the stopped waiter granted in the queue", || {
        on_lock(&server, &lock_id, true) == "1"
    });

    let status = lockctl(&url)
        .args(["status", "k"])
        .output()
        .expect("status runs");
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "k: free\n",
        "a stopped waiter counted as a holder: {}",
        text(&status)
    );

    let third = lockctl(&url)
        .args(["run", "k", "--ttl", TTL, "--wait", "6s", "--", "true"])
        .output()
        .expect("the third run");
    assert_eq!(
        third.status.code(),
        Some(0),
        "the stopped waiter kept the key: {}",
        text(&third)
    );
    assert!(freed.elapsed() <= BOUND, "took {:?}", freed.elapsed());

    // Continued, the waiter finds its session ended and waits on with a new one.
    signal(&waiter.0, libc::SIGCONT);
    let status = wait_exit(&mut waiter.0, LIMIT);
    assert!(status.success(), "the continued waiter: {status}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stopped_shared_waiter_keeps_the_key_at_most_its_ttl() {
    stopped_waiter_keeps_the_key_at_most_its_ttl(&["--shared"], "shared");
}

#[test]
fn stopped_permit_waiter_keeps_the_key_at_most_its_ttl() {
    stopped_waiter_keeps_the_key_at_most_its_ttl(&["--permits", "1"], "permit");
}
