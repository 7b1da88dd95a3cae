//! The cases `tests/stores.rs` runs against every real store: exclusion across processes,
//! busy keys, dead and stopped holders, unreachable stores.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn lockctl(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    // Never the developer's terminal: lockctl would hand it to the command's group.
    command.env("LOCK_URL", url).stdin(Stdio::null());
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
pub(crate) fn ten_concurrent_runs_never_overlap(url: &str) {
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

/// A key held by another run gives exit 75 at once, with a zero wait, and after a short wait.
pub(crate) fn busy_key_exits_75(url: &str) {
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
    // A zero wait, however written, is one attempt.
    for zero in ["0", "0s", "0ms"] {
        let output = lockctl(url)
            .args(["run", "busy", "--wait", zero, "--", "true"])
            .output()
            .expect("runs");
        assert_eq!(
            output.status.code(),
            Some(75),
            "{zero}: {}",
            stderr(&output)
        );
    }
    signal(&holder, libc::SIGTERM);
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    // SIGTERM is passed to the command, which dies of it: 128 + 15.
    assert_eq!(status.code(), Some(143), "{status}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Several keys run together or not at all: a set with a busy key exits 75 and leaves its
/// other keys free; a free set gives the command each key and its token by its place on the
/// command line; a key named twice is a usage error (64).
pub(crate) fn several_keys_run_together_or_not_at_all(url: &str) {
    let dir = scratch("pair");
    let marker = dir.join("held");
    let mut holder = lockctl(url)
        .args(["run", "pair-b", "--ttl", "10s", "--", "sh", "-c"])
        .arg(format!("echo held > {}; sleep 30", marker.display()))
        .spawn()
        .expect("holder spawns");
    wait_for_file(&marker, Duration::from_secs(30));
    let output = lockctl(url)
        .args(["run", "pair-a", "pair-b", "--wait", "300ms", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(stderr(&output).contains("pair-b"), "{}", stderr(&output));
    let status = lockctl(url)
        .args(["status", "pair-a"])
        .output()
        .expect("runs");
    let shown = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(shown.contains("free"), "the set left pair-a held: {shown}");
    signal(&holder, libc::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(30));
    let output = lockctl(url)
        .args(["run", "pair-b", "pair-a", "--wait", "10s", "--", "sh", "-c"])
        .arg("echo $LOCK_KEYS $LOCK_KEY_0 $LOCK_FENCING_TOKEN_0 $LOCK_KEY_1 $LOCK_FENCING_TOKEN_1")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let line = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words.len(), 5, "{line}");
    assert_eq!(
        (words[0], words[1], words[3]),
        ("2", "pair-b", "pair-a"),
        "{line}"
    );
    for token in [words[2], words[4]] {
        assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{line}");
    }
    let output = lockctl(url)
        .args(["run", "pair-a", "pair-a", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).trim().lines().count(),
        1,
        "{}",
        stderr(&output)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `lockctl ls PREFIX` prints one line per key held under the prefix and none outside it,
/// JSON lines with `--json`, at most N with `--limit N`, nothing (exit 0) when none is held;
/// a bad limit is one line and exit 64. A store that does not list yet says so in one line
/// (exit 64) and the case ends there.
pub(crate) fn ls_lists_the_held_keys_under_a_prefix(url: &str) {
    let dir = scratch("ls");
    let base = format!("ls-{}", rand_suffix());
    let prefix = format!("{base}/");
    let mut holders = Vec::new();
    // The last shares all of the prefix but its last byte.
    let keys = [
        format!("{prefix}b"),
        format!("{prefix}a"),
        format!("{base}-outside"),
    ];
    for (i, key) in keys.iter().enumerate() {
        let marker = dir.join(format!("held-{i}"));
        holders.push(
            lockctl(url)
                .args(["run", key, "--label", "ls-holder", "--ttl", "10s"])
                .args(["--", "sh", "-c"])
                .arg(format!("echo held > {}; sleep 30", marker.display()))
                .spawn()
                .expect("holder spawns"),
        );
        wait_for_file(&marker, Duration::from_secs(30));
    }
    let output = lockctl(url).args(["ls", &prefix]).output().expect("runs");
    if output.status.code() == Some(64) && stderr(&output).contains("not supported") {
        assert_eq!(
            stderr(&output).trim().lines().count(),
            1,
            "{}",
            stderr(&output)
        );
    } else {
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with(&format!("{prefix}a: held")), "{text}");
        assert!(lines[1].starts_with(&format!("{prefix}b: held")), "{text}");
        let output = lockctl(url)
            .args(["ls", &prefix, "--json", "--limit", "1"])
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with(&format!(
                r#"{{"key":"{prefix}a","held":true,"mode":"exclusive""#
            )),
            "{text}"
        );
        let output = lockctl(url)
            .args(["ls", &format!("{prefix}none")])
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(output.stdout.is_empty());
    }
    let output = lockctl(url)
        .args(["ls", &prefix, "--limit", "0"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).trim().lines().count(),
        1,
        "{}",
        stderr(&output)
    );
    for holder in &holders {
        signal(holder, libc::SIGTERM);
    }
    for mut holder in holders {
        wait_exit(&mut holder, Duration::from_secs(30));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `kill -9` of the holding lockctl: the lock is free again within its TTL.
pub(crate) fn killed_holder_is_free_within_its_ttl(url: &str) {
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
pub(crate) fn stopped_holder_is_superseded_and_exits_70(url: &str) {
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
pub(crate) fn unreachable_store_exits_69(url: &str) {
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

/// The cases `lockctl conformance` runs against each live store here: one of each kind. Each
/// store crate runs the whole suite against its own servers; this checks the command end to
/// end (connect by URL, handles, eviction, the unreachable handle, the table, the exit code).
const LOCKCTL_CASES: &[&str] = &[
    "try_acquire_grants_a_free_key",
    "acquire_is_exclusive_under_contention",
    "release_by_non_owner_is_rejected",
    "tokens_increase_across_handles",
    "waiter_is_woken_promptly_after_release",
    "lost_signal_fires_within_a_third_of_the_ttl_of_a_forget",
    "status_reports_the_holder",
    "unreachable_store_gives_a_retryable_error",
    "permits_never_exceed_the_limit_under_contention",
    "unsupported_modes_are_refused",
];

/// `lockctl conformance --case …` against the live store: every selected case passes (or does
/// not apply) and the table says so.
pub(crate) fn conformance_command_passes(url: &str) {
    let mut command = lockctl(url);
    // Two of these run at once in this binary, beside the servers: four cases each keeps a
    // starved two-core machine from missing one-second keep-alives.
    command.args(["conformance", "--parallel", "4"]);
    for case in LOCKCTL_CASES {
        command.args(["--case", case]);
    }
    let output = command.output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        stderr(&output)
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    for case in LOCKCTL_CASES {
        assert!(
            stdout.contains(case),
            "{case} is not in the table:\n{stdout}"
        );
    }
}

/// The parent of every process, from `/proc/<pid>/stat`.
fn parents() -> Vec<(i32, i32)> {
    let mut pairs = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pairs;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command name: state, ppid.
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1))
            .and_then(|ppid| ppid.parse().ok());
        if let Some(ppid) = ppid {
            pairs.push((pid, ppid));
        }
    }
    pairs
}

/// `root` and every live process descended from it.
fn tree(root: i32) -> Vec<i32> {
    let pairs = parents();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            pairs
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        next += 1;
    }
    found.retain(|pid| is_running(*pid));
    found
}

/// Forking commands for the tree tests: (name, script after `echo $$ > root;`, how many
/// processes its tree has once it is running, whether it ignores SIGTERM).
const FORKING_COMMANDS: [(&str, &str, usize, bool); 3] = [
    ("background", "sleep 300 & wait", 2, false),
    ("pipeline", "sleep 300 | cat", 3, false),
    // Ignored signals stay ignored across fork and exec, so `sleep` ignores SIGTERM too.
    ("ignores-term", "trap '' TERM; sleep 300 & wait", 2, true),
];

/// Starts `lockctl run KEY --ttl 2s --grace 1s -- sh -c '<script>'` for each forking command and
/// returns each holder with the pids of its command's whole tree once it has formed.
fn start_forking_holders(url: &str, dir: &Path, prefix: &str) -> Vec<(Child, Vec<i32>)> {
    let holders: Vec<(Child, PathBuf, usize)> = FORKING_COMMANDS
        .iter()
        .map(|(name, script, size, _)| {
            let root = dir.join(format!("{name}.root"));
            let child = lockctl(url)
                .args(["run", &format!("{prefix}-{name}"), "--ttl", "2s"])
                .args(["--grace", "1s", "--", "sh", "-c"])
                .arg(format!("echo $$ > {}; {script}", root.display()))
                // A file, not a pipe: a surviving process would hold a pipe open.
                .stderr(
                    std::fs::File::create(dir.join(format!("{name}.err"))).expect("stderr file"),
                )
                .spawn()
                .expect("holder spawns");
            (child, root, *size)
        })
        .collect();
    holders
        .into_iter()
        .map(|(child, root, size)| {
            let root: i32 = wait_for_file(&root, Duration::from_secs(30))
                .trim()
                .parse()
                .expect("pid");
            let started = Instant::now();
            let mut pids = tree(root);
            while pids.len() < size {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the command's tree never reached {size} processes: {pids:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
                pids = tree(root);
            }
            (child, pids)
        })
        .collect()
}

fn assert_tree_gone(case: &str, pids: &[i32]) {
    let running: Vec<i32> = pids.iter().copied().filter(|p| is_running(*p)).collect();
    assert!(
        running.is_empty(),
        "{case}: processes {running:?} of the command's tree {pids:?} outlived lockctl"
    );
}

/// A lost lease ends the command's whole process tree, not only the command: lockctl exits 70
/// only once no process of the tree runs, and one that ignores SIGTERM is killed after `--grace`.
pub(crate) fn lost_lease_ends_the_whole_process_tree(url: &str) {
    let dir = scratch("tree-lost");
    let holders = start_forking_holders(url, &dir, "tree-lost");
    for (holder, _) in &holders {
        signal(holder, libc::SIGSTOP);
    }
    // Successors on every key, past the stopped holders' TTLs.
    let successors: Vec<Child> = FORKING_COMMANDS
        .iter()
        .map(|(name, ..)| {
            lockctl(url)
                .args([
                    "run",
                    &format!("tree-lost-{name}"),
                    "--wait",
                    "30s",
                    "--",
                    "true",
                ])
                .stderr(Stdio::piped())
                .spawn()
                .expect("successor spawns")
        })
        .collect();
    for mut successor in successors {
        let status = wait_exit(&mut successor, Duration::from_secs(60));
        assert!(status.success(), "a successor failed: {status}");
    }
    for (holder, _) in &holders {
        signal(holder, libc::SIGCONT);
    }
    let resumed = Instant::now();
    for ((mut holder, pids), (name, _, _, ignores_term)) in
        holders.into_iter().zip(FORKING_COMMANDS)
    {
        let status = wait_exit(&mut holder, Duration::from_secs(30));
        let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
        assert_eq!(status.code(), Some(70), "{name}: {status} {err}");
        assert_tree_gone(name, &pids);
        if ignores_term {
            // It took the SIGKILL sent after the grace to end it.
            assert!(
                resumed.elapsed() >= Duration::from_secs(1),
                "{name}: lockctl exited {:?} after resuming, within its 1 s grace",
                resumed.elapsed()
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `kill -9` of lockctl ends the command's whole process tree, not only the command.
pub(crate) fn killed_lockctl_ends_the_whole_process_tree(url: &str) {
    let dir = scratch("tree-killed");
    let holders = start_forking_holders(url, &dir, "tree-killed");
    for (mut holder, pids) in holders {
        holder.kill().expect("SIGKILL");
        let _ = holder.wait();
        let killed = Instant::now();
        while pids.iter().any(|pid| is_running(*pid)) && killed.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_tree_gone("killed lockctl", &pids);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A command that exits leaving a background child (here one that ignores SIGTERM, so it lives
/// through the grace): the child is gone before the next holder gets the lock, and lockctl
/// exits with the command's own code.
pub(crate) fn leftover_processes_end_before_the_release(url: &str) {
    let dir = scratch("leftover");
    let child_file = dir.join("child");
    let seen = dir.join("seen");
    let mut holder = lockctl(url)
        .args([
            "run", "leftover", "--ttl", "5s", "--grace", "1s", "--", "sh", "-c",
        ])
        .arg(format!(
            "trap '' TERM; sleep 300 & echo $! > {}; exit 7",
            child_file.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .expect("holder spawns");
    let child: i32 = wait_for_file(&child_file, Duration::from_secs(30))
        .trim()
        .parse()
        .expect("pid");
    // The next holder records the child's state the moment it holds the lock.
    let output = lockctl(url)
        .args(["run", "leftover", "--wait", "30s", "--", "sh", "-c"])
        .arg(format!(
            "cat /proc/{child}/stat > {} 2>/dev/null; true",
            seen.display()
        ))
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(7), "{status}");
    let stat = std::fs::read_to_string(&seen).unwrap_or_default();
    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert!(
        matches!(state, None | Some("Z" | "X")),
        "the command's background child {child} still ran when the next holder got the lock: {stat}"
    );
    assert!(
        !is_running(child),
        "the background child {child} outlived lockctl"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A child killed and reaped when dropped, so a failing case leaves no process running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `child`'s stdout a line at a time, in a thread, into a channel.
fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// The next line of `lines` that contains `text`, within `limit`.
fn line_with(lines: &std::sync::mpsc::Receiver<String>, text: &str, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(_) => panic!("no line with {text:?} within {limit:?}"),
        }
    }
}

/// The `"term":N` of a JSON line of `lockctl leader --json`.
fn term_of(line: &str) -> u64 {
    line.split("\"term\":")
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|term| term.parse().ok())
        .unwrap_or_else(|| panic!("no term in {line}"))
}

/// `lockctl elect`: one leader at a time, its value and term in its command's environment,
/// what `lockctl leader` (once and `--watch`) and `lockctl status` show; the next candidate
/// leads once the leader's command ends, with a greater term; bad input is one line, exit 64.
pub(crate) fn elect_leads_one_at_a_time_and_leader_shows_it(url: &str) {
    let dir = scratch("elect");
    let name = format!("elect-{:x}", rand_suffix());
    let leader = |args: &[&str]| {
        lockctl(url)
            .args(["leader", &name])
            .args(args)
            .output()
            .expect("lockctl leader")
    };
    let nobody = leader(&[]);
    assert_eq!(nobody.status.code(), Some(1), "{}", stderr(&nobody));
    assert_eq!(
        String::from_utf8_lossy(&nobody.stdout).trim(),
        format!("{name}: no leader")
    );

    let mut watch = Reaped(
        lockctl(url)
            .args(["leader", &name, "--watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lockctl leader --watch"),
    );
    let watched = lines_of(&mut watch.0);
    line_with(&watched, "\"leader\":false", Duration::from_secs(30));

    let candidate = |value: &str, file: &Path, command: &str| {
        lockctl(url)
            .args([
                "elect", &name, "--value", value, "--ttl", "5s", "--", "sh", "-c",
            ])
            .arg(format!(
                "echo \"$LOCK_LEADER_VALUE $LOCK_FENCING_TOKEN\" > {}; {command}",
                file.display()
            ))
            .stderr(Stdio::piped())
            .spawn()
            .expect("lockctl elect")
    };
    let (first_file, second_file) = (dir.join("first"), dir.join("second"));
    let mut first = Reaped(candidate("host-a:80", &first_file, "sleep 300"));
    let led = wait_for_file(&first_file, Duration::from_secs(30));
    let (value, token) = led.trim().rsplit_once(' ').expect("value and token");
    assert_eq!(value, "host-a:80");
    let token: u64 = token.parse().expect("a token");

    let shown = leader(&["--json"]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("\"value\":\"host-a:80\""), "{shown}");
    assert_eq!(term_of(&shown), token, "{shown}");
    let status = lockctl(url)
        .args(["status", &name])
        .output()
        .expect("status");
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains("by \"host-a:80\""), "{status}");
    let seen = line_with(&watched, "host-a:80", Duration::from_secs(30));
    let first_term = term_of(&seen);
    assert_eq!(first_term, token, "{seen}");

    // It leads for a second, past the observers' bound (a poll of 100 ms and a round trip),
    // so the watch must show it.
    let mut second = candidate("host-b:80", &second_file, "sleep 1");
    // A second of the leader's 5 s TTL, kept alive: the second must not lead meanwhile.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !second_file.exists(),
        "a second candidate led while the first did"
    );
    signal(&first.0, libc::SIGTERM);
    let status = wait_exit(&mut first.0, Duration::from_secs(30));
    assert!(
        !status.success(),
        "the leader's command was ended: {status}"
    );
    let led = wait_for_file(&second_file, Duration::from_secs(30));
    let (value, next) = led.trim().rsplit_once(' ').expect("value and token");
    assert_eq!(value, "host-b:80");
    assert!(next.parse::<u64>().expect("a token") > token, "{led}");
    let status = wait_exit(&mut second, Duration::from_secs(30));
    assert!(status.success(), "the second leader's run: {status}");
    let seen = line_with(&watched, "host-b:80", Duration::from_secs(30));
    assert!(term_of(&seen) > first_term, "{seen}");
    line_with(&watched, "\"leader\":false", Duration::from_secs(30));
    signal(&watch.0, libc::SIGINT);
    let status = wait_exit(&mut watch.0, Duration::from_secs(30));
    assert!(status.success(), "leader --watch after SIGINT: {status}");
    assert_eq!(leader(&[]).status.code(), Some(1));

    for (args, what) in [
        (vec!["elect", "", "--", "true"], "election name"),
        (vec!["elect", &name, "--value", "", "--", "true"], "value"),
        (vec!["elect", &name, "--ttl", "0s", "--", "true"], "ttl"),
    ] {
        let output = lockctl(url).args(&args).output().expect("lockctl elect");
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
    assert_eq!(
        leader(&[]).status.code(),
        Some(1),
        "bad input left a leader"
    );
}
