//! `lockctl run` on etcd's own layout (`etcd://…?layout=etcd`) gives its command what
//! `etcdctl lock` gives: `ETCD_LOCK_KEY` (the holder key `{name}/{lease id in hex}`) and
//! `ETCD_LOCK_REV` (the token), so a script written for `etcdctl lock` runs unchanged under
//! either, and the revisions grow across both. Needs `etcdctl` (Debian package `etcd-client`).
#![cfg(feature = "etcd")]

use std::process::{Command, Stdio};

use test_servers::shared;

/// Prints `ETCD_LOCK_KEY`, `ETCD_LOCK_REV`, the key as etcd lists it right now (empty if it is
/// not there), and `LOCK_FENCING_TOKEN` (`-` when unset, as under `etcdctl lock`).
fn script() -> String {
    format!(
        r#"echo "$ETCD_LOCK_KEY $ETCD_LOCK_REV $(ETCDCTL_API=3 etcdctl --endpoints={} get "$ETCD_LOCK_KEY" --keys-only) ${{LOCK_FENCING_TOKEN:--}}""#,
        shared::etcd().endpoint()
    )
}

fn name(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("lockctl-{test}-{nanos:x}")
}

/// What the script printed.
#[derive(Debug)]
struct Seen {
    key: String,
    rev: u64,
    listed: String,
    token: String,
}

fn seen(output: std::process::Output, who: &str) -> Seen {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{who} failed: {}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    let [key, rev, listed, token] = fields[..] else {
        panic!("{who} printed {stdout:?}");
    };
    Seen {
        key: key.to_owned(),
        rev: rev
            .parse()
            .unwrap_or_else(|_| panic!("{who}: ETCD_LOCK_REV {rev:?}")),
        listed: listed.to_owned(),
        token: token.to_owned(),
    }
}

fn lockctl_run(url: &str, name: &str, script: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .env("LOCK_URL", url)
        .args([
            "run", name, "--ttl", "10s", "--wait", "30s", "--", "sh", "-c", script,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("lockctl runs")
}

fn etcdctl_lock(name: &str, script: &str) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", shared::etcd().endpoint()))
        .args(["lock", name, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("etcdctl runs (Debian package etcd-client)")
}

fn check_holder_key(name: &str, seen: &Seen, who: &str) {
    let hex = seen
        .key
        .strip_prefix(&format!("{name}/"))
        .unwrap_or_else(|| panic!("{who}: ETCD_LOCK_KEY {} is not under {name}/", seen.key));
    assert!(
        i64::from_str_radix(hex, 16).is_ok_and(|id| id > 0),
        "{who}: ETCD_LOCK_KEY {} does not end in a lease id in hex",
        seen.key
    );
    assert_eq!(
        seen.listed, seen.key,
        "{who}: ETCD_LOCK_KEY was not in etcd while the command ran"
    );
}

#[test]
fn run_in_the_etcd_layout_exports_etcdctl_locks_variables() {
    let name = name("exports");
    let url = format!("{}?layout=etcd", shared::etcd().url());
    let seen = seen(lockctl_run(&url, &name, &script()), "lockctl run");
    check_holder_key(&name, &seen, "lockctl run");
    assert_eq!(
        seen.token,
        seen.rev.to_string(),
        "ETCD_LOCK_REV is not the fencing token"
    );
}

#[test]
fn run_in_the_default_layout_exports_no_etcd_variables() {
    let output = lockctl_run(
        &shared::etcd().url(),
        &name("default"),
        r#"echo "${ETCD_LOCK_KEY-unset} ${ETCD_LOCK_REV-unset}""#,
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "unset unset"
    );
}

/// One script written for `etcdctl lock`, run by it, then by `lockctl run`, then by it again:
/// each sees its holder key in etcd and a revision above the one before.
#[test]
fn one_etcdctl_lock_script_runs_under_both_with_growing_revisions() {
    let name = name("both");
    let url = format!("{}?layout=etcd", shared::etcd().url());
    let first = seen(etcdctl_lock(&name, &script()), "etcdctl lock");
    check_holder_key(&name, &first, "etcdctl lock");
    let ours = seen(lockctl_run(&url, &name, &script()), "lockctl run");
    check_holder_key(&name, &ours, "lockctl run");
    let last = seen(etcdctl_lock(&name, &script()), "etcdctl lock");
    check_holder_key(&name, &last, "etcdctl lock");
    assert!(
        first.rev < ours.rev && ours.rev < last.rev,
        "ETCD_LOCK_REV {} (etcdctl), {} (lockctl), {} (etcdctl) do not grow",
        first.rev,
        ours.rev,
        last.rev
    );
}
