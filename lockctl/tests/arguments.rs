//! Hostile arguments: generated durations, keys and URLs make `lockctl` exit 0 or
//! 64 (69/76 for a URL that parses but points nowhere), with one diagnostic line and never a
//! panic. Runs the binary on the in-memory store, so no server is needed; a bounded number of
//! cases per property keeps it to a few seconds.

use std::process::{Command, Output, Stdio};

use proptest::prelude::*;

const USAGE: i32 = 64;

fn lockctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .env_remove("LOCK_URL")
        .stdin(Stdio::null())
        .output()
        .expect("lockctl runs")
}

/// Whether `stderr` is exactly one line, `lockctl: …` and a newline, with no other line break
/// (no carriage return, vertical tab, form feed or Unicode line separator a terminal or a log
/// reader might split on).
fn is_one_line(stderr: &str) -> bool {
    stderr.starts_with("lockctl: ")
        && stderr.ends_with('\n')
        && !stderr[..stderr.len() - 1].contains(|c: char| {
            c.is_control() || c == '\u{85}' || c == '\u{2028}' || c == '\u{2029}'
        })
}

/// A refusal is exit 64 with exactly one line on stderr, `lockctl: …` (no usage line, no
/// `--help` hint), and no process ever panics.
fn check(output: &Output, allowed: &[i32], args: &[&str]) -> Result<i32, TestCaseError> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code().unwrap_or(-1);
    prop_assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    prop_assert!(allowed.contains(&code), "{args:?} exited {code}: {stderr}");
    if code == USAGE {
        prop_assert!(
            is_one_line(&stderr),
            "{:?}: not one line: {:?}",
            args,
            stderr
        );
    }
    Ok(code)
}

/// Refusals clap makes in several lines (a list of missing arguments, a tip, a usage line, a
/// `--help` hint) and values with line breaks in them: each is exit 64 and one line, which
/// still says what is wrong.
#[test]
fn every_argument_refusal_is_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "a command is required: run, elect, leader, status"),
        (&["bogus"], "unrecognized subcommand 'bogus'"),
        (&["run"], "<KEY>..., <COMMAND>"),
        (&["--url", "memory://", "run", "k"], "<COMMAND>"),
        (
            &["--url", "memory://", "run", "k", "--tl", "3s", "--", "true"],
            "'--tl'",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--ttl",
                "1s",
                "--ttl",
                "2s",
                "--",
                "true",
            ],
            "cannot be used multiple times",
        ),
        (
            &["--url", "memory://", "run", "k", "--ttl=xx", "--", "true"],
            "not a duration",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--ttl=1\n\nUsage: x",
                "--",
                "true",
            ],
            "--ttl",
        ),
        (
            &[
                "--url",
                "memory://",
                "run",
                "k",
                "--wait=\r\u{1b}[2K",
                "--",
                "true",
            ],
            "--wait",
        ),
        (
            &["--url", "memory://", "run", "k", "--x\ny", "--", "true"],
            "unexpected argument",
        ),
        (
            &["--url", "memory://", "conformance", "--parallel", "x"],
            "--parallel",
        ),
        (&["--url", "memory://", "status", "--", ""], "invalid key"),
        (&["--url", "nope://\nx", "status", "k"], "invalid url"),
        (&["status", "k"], "no store given"),
    ];
    // A key too long, of line breaks.
    let long_key = "\n\u{2028}".repeat(300);
    let long_key_args = ["--url", "memory://", "status", "--", &long_key];
    let cases = cases
        .iter()
        .copied()
        .chain([(&long_key_args[..], "invalid key")]);
    for (args, needle) in cases {
        let output = lockctl(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(USAGE), "{args:?}: {stderr}");
        assert!(is_one_line(&stderr), "{args:?}: not one line: {stderr:?}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr:?}"
        );
    }
}

/// `--help` and `--version` are clap's own text on stdout, exit 0, nothing on stderr.
#[test]
fn help_and_version_still_exit_0() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["run", "--help"],
        &["help", "run"],
        &["--version"],
    ] {
        let output = lockctl(args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stdout}");
        assert!(output.stderr.is_empty(), "{args:?}: {:?}", output.stderr);
        assert!(
            stdout.lines().count() > 1 || args == ["--version"],
            "{stdout}"
        );
    }
    let version = lockctl(&["--version"]);
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("lockctl "));
}

/// `lockctl --help` names an example URL of every store this build has.
#[test]
fn help_names_every_store() {
    let help = lockctl(&["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for kind in fencelock::STORES {
        assert!(
            kind.example.is_empty() || text.contains(kind.example),
            "lockctl --help does not name the {} store ({}): {text}",
            kind.name,
            kind.example
        );
    }
}

/// `lockctl run --help` shows every example URL of the README's TLS table (one per store:
/// Redis, Redlock, etcd, ZooKeeper, PostgreSQL, MySQL).
#[test]
fn run_help_shows_the_readme_tls_examples() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
            .expect("docs/security.md");
    let section = readme
        .split("\n### TLS\n")
        .nth(1)
        .and_then(|rest| rest.split("\n### ").next())
        .expect("README has a ### TLS section");
    let examples: Vec<(&str, &str)> = section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            let store = cells.first()?.trim();
            let example = cells.last()?.trim().strip_prefix('`')?.strip_suffix('`')?;
            example.contains("://").then_some((store, example))
        })
        .collect();
    let stores: Vec<&str> = examples.iter().map(|(store, _)| *store).collect();
    assert_eq!(
        stores,
        [
            "Redis",
            "Redis Sentinel",
            "Redlock",
            "etcd",
            "ZooKeeper",
            "PostgreSQL",
            "MySQL / MariaDB"
        ],
        "the README's TLS table changed: {section}"
    );
    let help = lockctl(&["run", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "{text}");
    for (store, example) in examples {
        assert!(
            text.contains(example),
            "{store}: {example} is not in `lockctl run --help`:\n{text}"
        );
    }
}

/// Text a shell can pass as one argument: no NUL, anything else.
fn argument() -> impl Strategy<Value = String> {
    "[^\\x00]{0,24}"
}

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,25}(ms|s|m|h|d|)",
        "-?[0-9]{0,4}\\.?[0-9]{0,4}(ms|s|m|h|us|)",
        "[0-9eE+.-]{1,12}(s|)",
        Just("NaN".to_owned()),
        Just("inf".to_owned()),
        argument(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn any_duration_is_accepted_or_refused_with_exit_64(text in duration_text()) {
        let ttl = format!("--ttl={text}");
        let args = ["--url", "memory://", "run", "k", &ttl, "--", "true"];
        check(&lockctl(&args), &[0, USAGE], &args)?;
        let wait = format!("--wait={text}");
        let args = ["--url", "memory://", "run", "k", &wait, "--", "true"];
        check(&lockctl(&args), &[0, USAGE], &args)?;
        let timeout = format!("--connect-timeout={text}");
        let args = ["--url", "memory://", &timeout, "status", "k"];
        check(&lockctl(&args), &[0, USAGE], &args)?;
    }

    #[test]
    fn any_key_is_looked_up_or_refused_with_exit_64(
        key in prop_oneof![argument(), Just(String::new()), "[é]{513,520}"],
    ) {
        let args = ["--url", "memory://", "status", "--", &key];
        let code = check(&lockctl(&args), &[0, USAGE], &args)?;
        let valid = !key.is_empty() && key.len() <= fencelock::limits::MAX_KEY_LEN;
        prop_assert_eq!(code == 0, valid, "{} bytes", key.len());
    }

    #[test]
    fn any_url_is_connected_or_refused_without_a_panic(
        url in prop_oneof![
            argument(),
            ("(redis|rediss|redlock|etcd|etcds|postgres|memory|mysql|zk)",
             "[a-z0-9:@/?&=%.,\\[\\]]{0,24}")
                .prop_map(|(scheme, rest)| format!("{scheme}://{rest}")),
        ],
    ) {
        // sqlite:// would create a database file where the text points.
        prop_assume!(!url.to_ascii_lowercase().contains("sqlite"));
        let args = ["--url", &url, "--connect-timeout", "2s", "status", "k"];
        check(&lockctl(&args), &[0, USAGE, 69, 76], &args)?;
    }
}
