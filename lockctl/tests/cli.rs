//! The built `lockctl` binary: exit codes, messages and the command's environment.

use std::process::{Command, Output};

fn lockctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .env_remove("LOCK_URL")
        .output()
        .expect("lockctl runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_command_runs_with_the_lock_in_its_environment_and_its_exit_code_is_passed_on() {
    let output = lockctl(&[
        "--url",
        "memory://",
        "run",
        "nightly-export",
        "--",
        "sh",
        "-c",
        "echo \"$LOCK_KEY $LOCK_FENCING_TOKEN\"; exit 3",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let token = stdout
        .strip_prefix("nightly-export ")
        .and_then(|rest| rest.strip_suffix('\n'))
        .and_then(|token| token.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the key and a token: {stdout:?}"));
    // The memory store floors tokens at the clock in µs (docs/swaps.md): after 2020.
    assert!(token > 1_577_836_800_000_000, "{token}");
}

#[test]
fn bad_input_exits_64_with_a_message_naming_it() {
    let cases: &[(&[&str], &str)] = &[
        (&["--url", "memory://", "run", "", "--", "true"], "key"),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--ttl",
                "0s",
                "--",
                "true",
            ],
            "greater than zero",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--ttl",
                "soon",
                "--",
                "true",
            ],
            "duration",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--wait",
                "5 fortnights",
                "--",
                "true",
            ],
            "unit",
        ),
        (
            &["--url", "consul://h:8500", "run", "k", "--", "true"],
            "known schemes",
        ),
        (&["run", "k", "--", "true"], "LOCK_URL"),
        (&["--url", "memory://", "run", "k"], "required"),
        (
            &["--url", "memory://", "run", &"k".repeat(1025), "--", "true"],
            "1024",
        ),
    ];
    for (args, needle) in cases {
        let output = lockctl(args);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(needle),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

/// `--wait 0`, `0s` and `0ms` are one attempt: accepted, and on a free key the command runs.
/// (`tests/stores.rs` shows the same waits exit 75 on a busy key.)
#[test]
fn a_zero_wait_is_one_attempt_and_runs_the_command_on_a_free_key() {
    for zero in ["0", "0s", "0ms"] {
        let output = lockctl(&[
            "--url",
            "memory://",
            "run",
            "k",
            "--wait",
            zero,
            "--",
            "sh",
            "-c",
            "exit 5",
        ]);
        assert_eq!(output.status.code(), Some(5), "{zero}: {}", stderr(&output));
    }
}

#[test]
fn a_missing_command_exits_127() {
    let output = lockctl(&["--url", "memory://", "run", "k", "--", "/no/such/command"]);
    assert_eq!(output.status.code(), Some(127), "{}", stderr(&output));
}

#[test]
fn status_of_a_free_key_prints_json() {
    let output = lockctl(&["--url", "memory://", "status", "k", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "{\"key\":\"k\",\"held\":false}\n"
    );
}

#[test]
fn urls_never_print_passwords() {
    let output = lockctl(&["--url", "zookeeper://admin:hunter2@h:2181", "status", "k"]);
    assert!(!stderr(&output).contains("hunter2"), "{}", stderr(&output));
}

#[test]
fn conformance_passes_on_the_memory_store() {
    let output = lockctl(&["--url", "memory://", "conformance"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", stderr(&output));
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

/// `--case` runs only the cases whose name contains the text; a text no case contains is
/// refused in one line with exit 64, before anything is connected.
#[test]
fn conformance_runs_only_the_selected_cases() {
    let output = lockctl(&[
        "--url",
        "memory://",
        "conformance",
        "--case",
        "tokens_increase_sequentially",
        "--case",
        "empty_key",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", stderr(&output));
    assert!(stdout.contains("2 passed, 0 failed"), "{stdout}");
    assert!(stdout.contains("empty_key_is_rejected"), "{stdout}");
    assert!(!stdout.contains("tokens_increase_after_expiry"), "{stdout}");

    let output = lockctl(&[
        "--url",
        "memory://",
        "conformance",
        "--case",
        "no such case",
    ]);
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(stderr(&output).contains("no conformance case matches"));
}

/// The bench finishes on a store that answers without ever yielding (the in-process one used
/// to spin its throughput tasks forever) and prints every row.
#[test]
fn bench_finishes_on_the_memory_store() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", "memory://", "bench", "--iterations", "50"])
        .env_remove("LOCK_URL")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("lockctl runs");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("lockctl bench did not finish within 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let output = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(status.success(), "{status}\n{stdout}");
    for row in [
        "cycle, p50",
        "throughput, 16 tasks",
        "handoff to another of 8 waiters, p50",
    ] {
        assert!(stdout.contains(row), "no {row:?} row:\n{stdout}");
    }
}
