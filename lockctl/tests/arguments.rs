//! Hostile arguments (issue 17): generated durations, keys and URLs make `lockctl` exit 0 or
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

/// A refusal is exit 64 with exactly one diagnostic line (clap's `error:` or our `lockctl:`;
/// clap may add a usage hint after it), and no process ever panics.
fn check(output: &Output, allowed: &[i32], args: &[&str]) -> Result<i32, TestCaseError> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code().unwrap_or(-1);
    prop_assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    prop_assert!(allowed.contains(&code), "{args:?} exited {code}: {stderr}");
    if code == USAGE {
        let diagnostics = stderr
            .lines()
            .filter(|line| line.starts_with("error:") || line.starts_with("lockctl:"))
            .count();
        prop_assert_eq!(diagnostics, 1, "{:?}: {}", args, stderr);
    }
    Ok(code)
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
        let valid = !key.is_empty() && key.len() <= fencelock::validate::MAX_KEY_LEN;
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
