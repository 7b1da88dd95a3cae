//! The swap example, run as a program against every store compiled in: the same binary, only
//! `LOCK_URL` changes.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/swap`, built by `cargo test` alongside this test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    profile_dir.join("examples").join("swap")
}

fn run_swap(url: &str) {
    let output = Command::new(example())
        .env("LOCK_URL", url)
        .output()
        .expect("the swap example runs (cargo test builds it)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().last() == Some("ok"),
        "swap example against {url} failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn swap_example_runs_on_the_memory_store() {
    run_swap("memory://");
}

#[cfg(feature = "postgres")]
#[test]
fn swap_example_runs_on_postgres() {
    let server = test_servers::PostgresServer::start().expect("postgresql");
    run_swap(&server.url());
}

#[cfg(feature = "redis")]
#[test]
fn swap_example_runs_on_redis() {
    let server = test_servers::RedisServer::start().expect("redis-server");
    run_swap(&server.url());
}

#[cfg(feature = "etcd")]
#[test]
fn swap_example_runs_on_etcd() {
    let server = test_servers::EtcdServer::start().expect("etcd");
    run_swap(&server.url());
}

#[cfg(feature = "redis")]
#[test]
fn swap_example_runs_on_redlock() {
    let servers = test_servers::RedisServer::start_many(5).expect("redis-server");
    let hosts: Vec<String> = servers
        .iter()
        .map(|server| format!("127.0.0.1:{}", server.port()))
        .collect();
    run_swap(&format!("redlock://{}", hosts.join(",")));
}

#[cfg(feature = "mysql")]
#[test]
fn swap_example_runs_on_mysql() {
    let server = test_servers::MariadbServer::start().expect("mariadb-server");
    run_swap(&server.url());
}

#[cfg(feature = "sqlite")]
#[test]
fn swap_example_runs_on_sqlite() {
    // The directory does not exist yet: the store creates it, as on a fresh host.
    let dir = std::env::temp_dir().join(format!("fencelock-swap-sqlite-{}", std::process::id()));
    run_swap(&format!("sqlite://{}", dir.join("locks.db").display()));
    let _ = std::fs::remove_dir_all(&dir);
}
