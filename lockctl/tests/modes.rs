//! `lockctl run --permits N` and `--shared`, and `lockctl status` of such keys.
//!
//! The memory store is per process, so the single-process paths (the command's environment,
//! the argument refusals) run on `memory://`; a store without the modes (SQLite) shows the
//! refusal; contention between `lockctl` processes runs on a real Redis server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a holder's script waits for its `go` file before giving up by itself, so a failed
/// test never leaves a holder running (and keeping its lease alive) for long.
const HOLD_LIMIT_TENTHS: u32 = 600;

fn lockctl(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command
        .env("LOCK_URL", url)
        .env_remove("LOCK_SLOT")
        .env_remove("LOCK_PERMITS")
        .env_remove("LOCK_MODE")
        .stdin(Stdio::null());
    command
}

fn output(command: &mut Command) -> Output {
    command.output().expect("lockctl runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Exit `code`, and exactly one line on stderr starting `lockctl: `, which is returned.
fn refused(output: &Output, code: i32) -> String {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(code), "stderr: {text}");
    assert!(
        text.starts_with("lockctl: ") && text.ends_with('\n') && text.lines().count() == 1,
        "not one line: {text:?}"
    );
    text
}

fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "lockctl-modes-{}-{name}-{nanos:x}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A unique key per test and run, for the shared Redis server.
fn key(name: &str) -> String {
    format!("modes-{name}-{}", scratch_suffix())
}

fn scratch_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos:x}", std::process::id())
}

/// A script that writes `$LOCK_MODE $LOCK_SLOT $LOCK_FENCING_TOKEN` to `{dir}/{name}`, then
/// holds until `{dir}/go` exists (or its own limit passes).
fn holder_script(dir: &Path, name: &str) -> String {
    format!(
        "echo \"$LOCK_MODE ${{LOCK_SLOT-none}} $LOCK_FENCING_TOKEN\" > {dir}/{name}.tmp && \
         mv {dir}/{name}.tmp {dir}/{name}; i=0; \
         while [ ! -e {dir}/go ] && [ $i -lt {HOLD_LIMIT_TENTHS} ]; do sleep 0.1; i=$((i+1)); done",
        dir = dir.display()
    )
}

fn spawn_holder(url: &str, key: &str, mode_args: &[&str], dir: &Path, name: &str) -> Child {
    lockctl(url)
        .args(["run", key, "--ttl", "10s", "--wait", "30s"])
        .args(mode_args)
        .args(["--", "sh", "-c", &holder_script(dir, name)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockctl spawns")
}

/// What a holder wrote once it held: `(mode, slot, token)`.
fn wait_held(dir: &Path, name: &str) -> (String, String, u64) {
    let path = dir.join(name);
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            let fields: Vec<&str> = text.split_whitespace().collect();
            if let [mode, slot, token] = fields[..] {
                let token = token.parse().unwrap_or_else(|_| panic!("{text:?}"));
                return (mode.to_owned(), slot.to_owned(), token);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} never held",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child) -> (std::process::ExitStatus, String) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut text = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut err, &mut text);
            }
            return (status, text);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("lockctl did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lets every holder of `dir` finish.
fn go(dir: &Path) {
    std::fs::write(dir.join("go"), "").expect("go file");
}

#[test]
fn a_permit_gives_the_command_its_mode_limit_and_slot() {
    let out = output(lockctl("memory://").args([
        "run",
        "pool",
        "--permits",
        "4",
        "--",
        "sh",
        "-c",
        "echo \"$LOCK_MODE $LOCK_PERMITS $LOCK_SLOT $LOCK_FENCING_TOKEN\"",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let printed = stdout(&out);
    let token = printed
        .strip_prefix("permit 4 0 ")
        .and_then(|rest| rest.strip_suffix('\n'))
        .and_then(|token| token.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("mode, limit, slot and a token: {printed:?}"));
    // The memory store floors tokens at the clock in µs (docs/swaps.md): after 2020.
    assert!(token > 1_577_836_800_000_000, "{token}");
}

#[test]
fn shared_and_exclusive_leases_never_pass_on_an_inherited_slot() {
    let script = "echo \"$LOCK_MODE ${LOCK_PERMITS-unset} ${LOCK_SLOT-unset}\"";
    for (mode_args, expected) in [
        (&["--shared"][..], "shared unset unset\n"),
        (&[][..], "exclusive unset unset\n"),
    ] {
        // As inside an outer `lockctl run --permits 9`.
        let out = output(
            lockctl("memory://")
                .env("LOCK_SLOT", "7")
                .env("LOCK_PERMITS", "9")
                .args(["run", "doc"])
                .args(mode_args)
                .args(["--", "sh", "-c", script]),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(stdout(&out), expected, "{mode_args:?}");
    }
}

#[test]
fn conflicting_or_out_of_range_mode_flags_exit_64_in_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--shared", "--permits", "2"], "cannot be used with"),
        (&["--permits", "0"], "1..=1024"),
        (&["--permits", "1025"], "1..=1024"),
        (&["--permits", "many"], "--permits"),
        (&["--permits"], "--permits"),
    ];
    for (mode_args, needle) in cases {
        let out = output(
            lockctl("memory://")
                .args(["run", "k"])
                .args(*mode_args)
                .args(["--", "sh", "-c", "echo ran"]),
        );
        let text = refused(&out, 64);
        assert!(text.contains(needle), "{mode_args:?}: {text}");
        assert_eq!(stdout(&out), "", "{mode_args:?}: the command ran");
    }
}

/// SQLite keeps exclusive leases only: it refuses the modes at once (even with a wait), in one
/// line, exit 64, and the command never runs.
#[test]
fn a_store_without_the_mode_refuses_it_with_exit_64() {
    let dir = scratch("sqlite");
    let url = format!("sqlite://{}", dir.join("locks.db").display());
    for (mode_args, needle) in [
        (&["--shared"][..], "shared mode"),
        (&["--permits", "3", "--wait", "30s"][..], "permit mode"),
    ] {
        let started = Instant::now();
        let out = output(
            lockctl(&url)
                .args(["run", "k"])
                .args(mode_args)
                .args(["--", "sh", "-c", "echo ran"]),
        );
        let text = refused(&out, 64);
        assert!(
            text.contains(needle) && text.contains("not supported"),
            "{mode_args:?}: {text}"
        );
        assert_eq!(stdout(&out), "", "{mode_args:?}: the command ran");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{mode_args:?}: waited for a mode the store refuses"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lockctl bench` times a permit cycle and a shared cycle next to the exclusive one on a
/// store that keeps them (the memory store), keeping the exclusive rows.
#[test]
fn bench_prints_the_mode_cycles_next_to_the_exclusive_cycle() {
    let mut child = lockctl("memory://")
        .args(["bench", "--iterations", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockctl runs");
    let (status, errors) = wait_exit(&mut child);
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut out, &mut text);
    }
    assert!(status.success(), "{status}\n{text}{errors}");
    let rows: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split("  ").next())
        .collect();
    let at = |row: &str| {
        rows.iter()
            .position(|r| *r == row)
            .unwrap_or_else(|| panic!("no {row:?} row:\n{text}"))
    };
    let order = [
        at("acquire+release cycle, p50"),
        at("acquire+release cycle, p99"),
        at("semaphore permit (of 4) cycle, p50"),
        at("semaphore permit (of 4) cycle, p99"),
        at("shared (reader) cycle, p50"),
        at("shared (reader) cycle, p99"),
        at("throughput, 16 tasks on distinct keys"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
}

mod redis {
    use super::*;
    use test_servers::shared;

    fn url() -> String {
        shared::redis().url()
    }

    /// Two processes hold the two permits of a key in distinct slots; a third is refused with
    /// the permits taken, `status` shows both holders, and a request with another limit is bad
    /// input.
    #[test]
    fn permits_are_shared_across_processes_up_to_their_limit() {
        let (url, key, dir) = (url(), key("permits"), scratch("permits"));
        let mut holders: Vec<Child> = ["a", "b"]
            .iter()
            .map(|name| spawn_holder(&url, &key, &["--permits", "2"], &dir, name))
            .collect();
        let (mode_a, slot_a, token_a) = wait_held(&dir, "a");
        let (mode_b, slot_b, token_b) = wait_held(&dir, "b");
        assert_eq!((mode_a.as_str(), mode_b.as_str()), ("permit", "permit"));
        let mut slots = [slot_a.clone(), slot_b.clone()];
        slots.sort();
        assert_eq!(slots, ["0", "1"], "the two permits share a slot");

        let third = output(
            lockctl(&url)
                .args(["run", &key, "--permits", "2", "--wait", "0s"])
                .args(["--", "sh", "-c", "echo ran"]),
        );
        let text = refused(&third, 75);
        assert!(text.contains("2 of 2 permits taken"), "{text}");
        assert_eq!(stdout(&third), "", "a third permit holder ran");

        let other_limit = output(
            lockctl(&url)
                .args(["run", &key, "--permits", "3", "--wait", "5s"])
                .args(["--", "sh", "-c", "echo ran"]),
        );
        let text = refused(&other_limit, 64);
        assert!(text.contains("semaphore of 2 permits"), "{text}");
        assert_eq!(stdout(&other_limit), "", "a holder of another limit ran");

        let status = output(lockctl(&url).args(["status", &key]));
        assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
        let text = stdout(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], format!("{key}: 2 of 2 permits taken"));
        for (slot, token) in [(&slot_a, token_a), (&slot_b, token_b)] {
            let line = format!("  slot {slot}, fencing token {token}, owner ");
            assert!(lines[1..].iter().any(|l| l.starts_with(&line)), "{text}");
        }
        // Each holder is labelled as `lockctl run` labels its lease: `<host> pid <pid>`.
        assert!(
            lines[1..]
                .iter()
                .all(|l| l.contains(", by \"") && l.contains(" pid ")),
            "{text}"
        );

        let json = output(lockctl(&url).args(["status", &key, "--json"]));
        assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
        let text = stdout(&json);
        assert!(
            text.contains(r#""held":true,"mode":"permit","limit":2,"count":2,"holders":["#),
            "{text}"
        );
        for (slot, token) in [(&slot_a, token_a), (&slot_b, token_b)] {
            assert!(
                text.contains(&format!(r#"{{"slot":{slot},"token":{token},"owner":""#)),
                "{text}"
            );
        }

        go(&dir);
        for holder in &mut holders {
            let (status, text) = wait_exit(holder);
            assert!(status.success(), "a holder failed: {status} {text}");
        }
        let free = output(lockctl(&url).args(["status", &key, "--json"]));
        assert_eq!(
            stdout(&free).trim(),
            format!(r#"{{"key":"{key}","held":false}}"#)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Two readers hold together; a writer that tries once is refused, one that waits runs
    /// after them with a greater token; `status` counts the readers.
    #[test]
    fn readers_hold_together_and_a_writer_runs_after_them() {
        let (url, key, dir) = (url(), key("shared"), scratch("shared"));
        let mut readers: Vec<Child> = ["r1", "r2"]
            .iter()
            .map(|name| spawn_holder(&url, &key, &["--shared"], &dir, name))
            .collect();
        let (mode_1, slot_1, token_1) = wait_held(&dir, "r1");
        let (mode_2, slot_2, token_2) = wait_held(&dir, "r2");
        assert_eq!((mode_1.as_str(), mode_2.as_str()), ("shared", "shared"));
        assert_eq!((slot_1.as_str(), slot_2.as_str()), ("none", "none"));

        let status = output(lockctl(&url).args(["status", &key]));
        let text = stdout(&status);
        assert_eq!(
            text.lines().next(),
            Some(format!("{key}: held shared by 2 readers").as_str()),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3, "{text}");

        let once = output(
            lockctl(&url)
                .args(["run", &key, "--wait", "0s"])
                .args(["--", "sh", "-c", "echo ran"]),
        );
        let text = refused(&once, 75);
        assert!(text.contains("held shared by 2 readers"), "{text}");
        assert_eq!(stdout(&once), "", "a writer ran beside readers");

        let mut writer = spawn_holder(&url, &key, &[], &dir, "w");
        // Not granted while the readers hold: the readers' scripts are still waiting for `go`,
        // so any write the writer made now would be beside them.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !dir.join("w").exists(),
            "the writer holds beside the readers"
        );
        go(&dir);
        let (mode_w, slot_w, token_w) = wait_held(&dir, "w");
        assert_eq!((mode_w.as_str(), slot_w.as_str()), ("exclusive", "none"));
        assert!(
            token_w > token_1.max(token_2),
            "writer token {token_w} not above the readers' {token_1}, {token_2}"
        );
        for child in readers.iter_mut().chain([&mut writer]) {
            let (status, text) = wait_exit(child);
            assert!(status.success(), "a run failed: {status} {text}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
