//! The client's wall clock stepped, for the stores that read it (etcd, ZooKeeper, SQLite):
//! `lockctl run` under test-servers' clock shim, a minute back, then two minutes ahead.
//! What each store's table says: tokens keep growing whatever the client's clock does while
//! the store keeps its state (a revision, a counter); SQLite's tokens start again from the
//! clock once its database file is gone, so a clock behind then hands out a smaller token.

use std::process::Command;

use test_servers::ClockControl;

const MINUTE_MICROS: i64 = 60_000_000;

/// One `lockctl run` of `key` on `url` under `clock`: the token it handed the command.
fn token(url: &str, key: &str, clock: &ClockControl) -> u64 {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.env("LOCK_URL", url).args([
        "run",
        key,
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        "echo $LOCK_FENCING_TOKEN",
    ]);
    clock.apply(&mut command).expect("the clock shim");
    let output = command.output().expect("lockctl runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{url}: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a token, not {stdout:?}"))
}

/// Tokens on `url` across a step a minute back and one two minutes ahead of the client's clock.
fn tokens_grow_across_client_clock_steps(url: &str, key: &str) {
    let clock = ClockControl::new().expect("a clock control");
    let mut last = token(url, key, &clock);
    for step in [-MINUTE_MICROS, 2 * MINUTE_MICROS] {
        clock.step_micros(step).expect("step");
        let next = token(url, key, &clock);
        assert!(
            next > last,
            "{url}: after a step of {step} µs, {next} after {last}"
        );
        last = next;
    }
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_tokens_grow_whatever_the_clients_clock_does() {
    tokens_grow_across_client_clock_steps(&test_servers::shared::etcd().url(), "clock:etcd");
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_tokens_grow_whatever_the_clients_clock_does() {
    tokens_grow_across_client_clock_steps(
        &test_servers::ZookeeperEnsemble::shared_standalone().url(),
        "clock:zookeeper",
    );
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    fn database(name: &str) -> std::path::PathBuf {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("lockctl-clock-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory");
        dir.join("locks.db")
    }

    /// Within: the database keeps the key's counter, so a clock a minute back or two ahead
    /// changes nothing but how far tokens lead the clock.
    #[test]
    fn sqlite_tokens_grow_whatever_the_clients_clock_does_while_the_file_lives() {
        let path = database("within");
        tokens_grow_across_client_clock_steps(&format!("sqlite://{}", path.display()), "k");
    }

    /// Beyond: with the file deleted the counter is gone, and the next token is the clock, a
    /// minute behind: smaller than the last (the crate docs: "greater than the old ones unless
    /// the clock stepped back").
    #[test]
    fn sqlite_a_deleted_file_and_a_clock_a_minute_back_hand_out_a_smaller_token() {
        let path = database("beyond");
        let url = format!("sqlite://{}", path.display());
        let clock = ClockControl::new().expect("a clock control");
        let before = token(&url, "k", &clock);
        for suffix in ["", "-wal", "-shm", "-wake"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        clock.step_micros(-MINUTE_MICROS).expect("step");
        let after = token(&url, "k", &clock);
        assert!(after < before, "{after} after {before}");
        let behind = before - after;
        assert!(
            (50_000_000..=70_000_000).contains(&behind),
            "{behind} µs behind"
        );
    }
}
