//! The cases `tests/stores.rs` runs against every real store: exclusion across processes,
//! busy keys, dead and stopped holders, unreachable stores.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn lockctl(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.env("LOCK_URL", url);
    command
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "lockctl-test-{}-{name}-{:x}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.trim().is_empty() {
                return text;
            }
        }
        assert!(
            started.elapsed() < limit,
            "{} never appeared",
            path.display()
        );
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

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
}

/// Alive and not a zombie waiting to be reaped.
fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Ten `lockctl run`s on one key at once: their critical sections never interleave and each
/// sees a greater token than the one before.
pub fn ten_concurrent_runs_never_overlap(url: &str) {
    let dir = scratch("overlap");
    let log = dir.join("log");
    let script = format!(
        "echo \"start $LOCK_FENCING_TOKEN\" >> {log}; sleep 0.1; echo \"end $LOCK_FENCING_TOKEN\" >> {log}",
        log = log.display()
    );
    let mut children: Vec<Child> = (0..10)
        .map(|_| {
            lockctl(url)
                .args([
                    "run", "overlap", "--ttl", "5s", "--wait", "120s", "--", "sh", "-c", &script,
                ])
                .stderr(Stdio::piped())
                .spawn()
                .expect("lockctl spawns")
        })
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(150));
        assert!(status.success(), "a run failed: {status}");
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20, "{text}");
    let mut last = 0u64;
    for pair in lines.chunks(2) {
        let start: u64 = pair[0]
            .strip_prefix("start ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        let end: u64 = pair[1]
            .strip_prefix("end ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(start, end, "two runs overlapped:\n{text}");
        assert!(start > last, "tokens did not increase:\n{text}");
        last = start;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A key held by another run gives exit 75 at once, and 75 again after a short wait.
pub fn busy_key_exits_75(url: &str) {
    let dir = scratch("busy");
    let marker = dir.join("held");
    let mut holder = lockctl(url)
        .args(["run", "busy", "--ttl", "10s", "--", "sh", "-c"])
        .arg(format!("echo held > {}; sleep 30", marker.display()))
        .spawn()
        .expect("holder spawns");
    wait_for_file(&marker, Duration::from_secs(30));
    let output = lockctl(url)
        .args(["run", "busy", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    let output = lockctl(url)
        .args(["run", "busy", "--wait", "1s", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    signal(&holder, libc::SIGTERM);
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    // SIGTERM is passed to the command, which dies of it: 128 + 15.
    assert_eq!(status.code(), Some(143), "{status}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `kill -9` of the holding lockctl: the lock is free again within its TTL.
pub fn killed_holder_is_free_within_its_ttl(url: &str) {
    let dir = scratch("killed");
    let marker = dir.join("pid");
    let ttl = Duration::from_secs(2);
    let mut holder = lockctl(url)
        .args(["run", "killed", "--ttl", "2s", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 60", marker.display()))
        .spawn()
        .expect("holder spawns");
    let command_pid: i32 = wait_for_file(&marker, Duration::from_secs(30))
        .trim()
        .parse()
        .expect("pid");
    holder.kill().expect("SIGKILL");
    let _ = holder.wait();
    let killed_at = Instant::now();
    // The command must not run on unguarded: the kernel kills it with its guard.
    let gone = Instant::now();
    while is_running(command_pid) {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "the command outlived its killed lockctl"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = lockctl(url)
        .args(["run", "killed", "--wait", "30s", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        killed_at.elapsed() <= ttl + Duration::from_secs(3),
        "the lock was free only {:?} after its holder died (TTL {ttl:?})",
        killed_at.elapsed()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A holder stopped past its TTL is superseded by a holder with a greater token; once resumed
/// it terminates its command and exits 70.
pub fn stopped_holder_is_superseded_and_exits_70(url: &str) {
    let dir = scratch("stopped");
    let first = dir.join("first");
    let mut holder = lockctl(url)
        .args([
            "run", "stopped", "--ttl", "2s", "--grace", "1s", "--", "sh", "-c",
        ])
        .arg(format!(
            "echo $LOCK_FENCING_TOKEN > {}; sleep 60",
            first.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .expect("holder spawns");
    let first_token: u64 = wait_for_file(&first, Duration::from_secs(30))
        .trim()
        .parse()
        .expect("token");
    signal(&holder, libc::SIGSTOP);
    let output = lockctl(url)
        .args([
            "run",
            "stopped",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "echo $LOCK_FENCING_TOKEN",
        ])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let second_token: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("token");
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    signal(&holder, libc::SIGCONT);
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(70), "{status}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An unreachable store is exit 69 within the connect bound.
pub fn unreachable_store_exits_69(url: &str) {
    let started = Instant::now();
    let output = lockctl(url)
        .args(["--connect-timeout", "3s", "run", "k", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}

/// `lockctl conformance` against the live store: every case passes and the table says so.
pub fn conformance_command_passes(url: &str) {
    let output = lockctl(url)
        .args(["conformance", "--parallel", "8"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        stderr(&output)
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}
