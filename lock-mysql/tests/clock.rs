//! The server's wall clock stepped back while it runs (test-servers' clock shim on
//! `mariadbd`): within [`fencelock_mysql::MAX_CLOCK_STEP_BACK`] after a key's row was removed,
//! tokens keep growing and stay at or below the clock; beyond it, as the crate docs say, a
//! token still never repeats, and only runs ahead of the clock by up to the step.

use std::time::Duration;

use fencelock_core::{LockStore, ReleaseOutcome};
use fencelock_mysql::{MysqlConfig, MysqlStore};
use sqlx::{Connection, MySqlConnection, Row};
use test_servers::MariadbServer;
use tokio::time::sleep;

/// The smallest window there is (`min_retention()`, 1002 ms) and a `max_ttl` below it.
const OPTIONS: &str = "retention=1100ms&max_ttl=1s";
/// The window and a little more, so that the server's clock has passed it.
const PAST_WINDOW: Duration = Duration::from_millis(1300);

async fn once(store: &MysqlStore, key: &str) -> u64 {
    let lease = store
        .try_acquire(key, Duration::from_secs(1))
        .await
        .expect("acquire");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    lease.fencing_token()
}

/// The server's clock, µs.
async fn server_clock(admin: &mut MySqlConnection) -> u64 {
    let row = sqlx::query("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)")
        .fetch_one(admin)
        .await
        .expect("NOW(6)");
    row.get::<u64, _>(0)
}

/// A key's token; its token after its row was removed and the server's clock stepped back by
/// `back` µs; and the server's clock just after that second grant.
async fn tokens_across_removal_and_step(back: i64) -> (u64, u64, u64) {
    let server = MariadbServer::start_with_clock().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let config =
        MysqlConfig::from_url(&format!("{url}?connect_timeout=30&{OPTIONS}")).expect("config");
    let store = MysqlStore::connect(config).await.expect("connect");
    let mut admin = MySqlConnection::connect(&url).await.expect("admin");
    let key = "clock:removed";
    let first = once(&store, key).await;
    sleep(PAST_WINDOW).await;
    let removed = store.remove_idle_fences().await.expect("remove");
    assert_eq!(removed, 1, "the key's row went after the window");
    // The two reads are at most `elapsed` apart in real time, so without the step the second
    // is at most that much later (2 µs: each read is rounded to a microsecond).
    let started = std::time::Instant::now();
    let before = server_clock(&mut admin).await;
    server
        .clock()
        .expect("a stepped clock")
        .step_micros(-back)
        .expect("step");
    let after = server_clock(&mut admin).await;
    let elapsed = i64::try_from(started.elapsed().as_micros()).expect("elapsed µs");
    assert!(
        (after as i64) <= before as i64 + elapsed + 2 - back,
        "the server's clock stepped back {back} µs: {before} then {after}, {elapsed} µs apart"
    );
    let second = once(&store, key).await;
    (first, second, server_clock(&mut admin).await)
}

/// Within: a step back of the whole allowance right after the removal: the next token is
/// above the last and not ahead of the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_back_within_the_allowance_after_a_rows_removal_keeps_tokens_growing() {
    let back = fencelock_mysql::MAX_CLOCK_STEP_BACK.as_micros() as i64;
    let (first, second, clock) = tokens_across_removal_and_step(back).await;
    assert!(second > first, "{second} after {first}");
    assert!(second <= clock, "{second} ahead of the clock {clock}");
}

/// Beyond: a step back of 5 s, five times the allowance: the token still never repeats, and
/// runs ahead of the clock by at most the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_back_beyond_the_allowance_runs_tokens_ahead_of_the_clock_without_repeating() {
    let back = 5_000_000;
    let (first, second, clock) = tokens_across_removal_and_step(back).await;
    assert!(second > first, "{second} after {first}");
    assert!(second > clock, "{second} is not ahead of the clock {clock}");
    assert!(
        second - clock <= back as u64,
        "{second} is more than the step ahead of {clock}"
    );
}
