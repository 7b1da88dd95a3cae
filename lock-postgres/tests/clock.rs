//! The server's wall clock stepped back while it runs (test-servers' clock shim, in the
//! postmaster and every backend): the crate docs' promise across the removal of a key's row
//! (tokens grow as long as the clock steps back by at most `max_skew`), and the failure they
//! document beyond it.

mod common;

use std::time::Duration;

use common::{admin, store};
use fencelock_core::{LockStore, ReleaseOutcome};
use sqlx::Row;
use test_servers::PostgresServer;
use tokio::time::sleep;

/// A window of a few hundred ms, above its `max_ttl` and the smallest window for
/// `max_skew=50ms`.
const SHORT: &str = "retention=300ms&max_ttl=200ms&max_skew=50ms";
/// The window and a little more, so that the server's clock has passed it.
const PAST_SHORT: Duration = Duration::from_millis(400);
const MAX_SKEW_MICROS: i64 = 50_000;

/// One lease of `key`, released; its token.
async fn once(store: &fencelock_postgres::PostgresStore, key: &str) -> u64 {
    let lease = store
        .try_acquire(key, Duration::from_millis(200))
        .await
        .expect("acquire");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    lease.fencing_token()
}

/// A key's token, then its token again after its row was removed (the window passed) and the
/// server's clock stepped back by `back` µs.
async fn tokens_across_removal_and_step(back: i64) -> (u64, u64) {
    let server = PostgresServer::start_with_clock().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let store = store(&url, SHORT).await;
    let mut admin = admin(&url).await;
    let clock_us = |row: sqlx::postgres::PgRow| row.get::<i64, _>(0);
    let read_clock = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8";
    let key = "clock:removed";
    let first = once(&store, key).await;
    sleep(PAST_SHORT).await;
    store.remove_idle_fences().await.expect("remove");
    let left: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {}",
        store.config().fence_table()
    ))
    .fetch_one(&mut admin)
    .await
    .expect("count")
    .get(0);
    assert_eq!(left, 0, "the key's row went after the window");
    // The two reads are at most `elapsed` apart in real time, so without the step the second
    // is at most that much later (2 µs: each read is rounded to a microsecond).
    let started = std::time::Instant::now();
    let before = clock_us(sqlx::query(read_clock).fetch_one(&mut admin).await.unwrap());
    server
        .clock()
        .expect("a stepped clock")
        .step_micros(-back)
        .expect("step");
    let after = clock_us(sqlx::query(read_clock).fetch_one(&mut admin).await.unwrap());
    let elapsed = i64::try_from(started.elapsed().as_micros()).expect("elapsed µs");
    assert!(
        after <= before + elapsed + 2 - back,
        "the server's clock stepped back {back} µs: {before} then {after}, {elapsed} µs apart"
    );
    (first, once(&store, key).await)
}

/// Within: a step back of `max_skew` right after the row went, and the key's next token is
/// still above its last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_back_within_max_skew_after_a_rows_removal_keeps_tokens_growing() {
    let (first, second) = tokens_across_removal_and_step(MAX_SKEW_MICROS).await;
    assert!(second > first, "{second} after {first}");
}

/// Beyond: a step back far past `max_skew` right after the row went gives the key a token
/// that is not above its last one (the crate docs' `# What is not`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_back_beyond_max_skew_after_a_rows_removal_repeats_a_token() {
    let (first, second) = tokens_across_removal_and_step(5_000_000).await;
    assert!(second <= first, "{second} after {first}");
}
