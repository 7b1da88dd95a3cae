//! `lockctl stats` counts the per-key state a store holds: Redis keys under the prefix,
//! PostgreSQL and MySQL fence rows, SQLite rows; one more for every distinct key locked.

use std::process::{Command, Stdio};

use test_servers::shared;

fn lockctl(url: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("lockctl");
    assert!(out.status.success(), "lockctl {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Runs `true` under three distinct keys and returns `stats --json` before and after.
fn stats_around_three_keys(url: &str) -> (String, String) {
    let before = lockctl(url, &["stats", "--json"]);
    for key in ["order-1", "order-2", "order-3"] {
        lockctl(url, &["run", key, "--", "true"]);
    }
    (before, lockctl(url, &["stats", "--json"]))
}

#[test]
fn stats_counts_the_redis_keys_under_the_prefix() {
    let url = format!("{}?prefix=stats-test:", shared::redis().url());
    let (before, after) = stats_around_three_keys(&url);
    let window = "\"retention_ms\":604800000";
    assert_eq!(
        before.trim(),
        format!("{{\"store\":\"redis\",\"per_key_state\":0,\"unit\":\"keys under the prefix\",{window}}}")
    );
    assert!(after.contains("\"per_key_state\":3,"), "{after}");
}

#[test]
fn stats_counts_the_postgres_fence_rows() {
    let url = format!("{}?table=stats_test", shared::postgres().url());
    let (before, after) = stats_around_three_keys(&url);
    assert!(
        before.contains("\"store\":\"postgres\",\"per_key_state\":0,\"unit\":\"fence rows\""),
        "{before}"
    );
    assert!(after.contains("\"per_key_state\":3,"), "{after}");
    let line = lockctl(&url, &["stats"]);
    assert_eq!(
        line.trim(),
        "postgres: per-key state 3 fence rows, each kept 7d after its key's last acquire"
    );
}

#[cfg(feature = "mysql")]
#[test]
fn stats_counts_the_mysql_fence_rows() {
    let url = format!("{}?table=stats_test", shared::mariadb().url());
    let (before, after) = stats_around_three_keys(&url);
    assert!(
        before.contains("\"store\":\"mysql\",\"per_key_state\":0,\"unit\":\"fence rows\""),
        "{before}"
    );
    assert!(after.contains("\"per_key_state\":3,"), "{after}");
    assert!(after.contains("\"retention_ms\":604800000"), "{after}");
}

#[cfg(feature = "sqlite")]
#[test]
fn stats_counts_the_sqlite_rows() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lockctl-stats-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!(
        "sqlite://{}?retention=2h&max_ttl=1h",
        dir.join("locks.db").display()
    );
    let (before, after) = stats_around_three_keys(&url);
    assert!(
        before.contains("\"store\":\"sqlite\",\"per_key_state\":0,\"unit\":\"rows\""),
        "{before}"
    );
    assert!(after.contains("\"per_key_state\":3,"), "{after}");
    assert!(after.contains("\"retention_ms\":7200000"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}
