//! Grants commit without waiting for the WAL flush when their token is the server's clock
//! reading, and durably when it ran ahead of the clock (the crate docs, "Crashes and the
//! clock"). Each test runs a server that keeps unflushed WAL in memory, hands out tokens, kills
//! the server with SIGKILL and restarts it: the loss is checked to have happened (or not), then
//! the next token to be above every token handed out.

mod common;

use std::time::Duration;

use common::{admin, store};
use fencelock_core::{Lease, LockStore, ReleaseOutcome};
use fencelock_postgres::PostgresStore;
use sqlx::Row;
use test_servers::PostgresServer;

/// Settings that keep commits made with `synchronous_commit = off` in the server's WAL buffers,
/// where SIGKILL loses them: the WAL writer writes a partly filled page only every
/// `wal_writer_delay` (10 s, the longest allowed; it writes full pages as they fill, which
/// reach the kernel and survive a kill), and no background writer, autovacuum or timed
/// checkpoint flushes the WAL meanwhile.
const KEEP_WAL_IN_MEMORY: &[(&str, &str)] = &[
    ("wal_writer_delay", "10s"),
    ("wal_writer_flush_after", "1GB"),
    ("bgwriter_lru_maxpages", "0"),
    ("autovacuum", "off"),
    ("checkpoint_timeout", "1h"),
];

/// Grants in one burst: a few pages of WAL, so the last page is partly filled whatever the
/// size of a record.
const BURST: usize = 60;
/// Bursts before the test gives up seeing a loss: one loses its last grants unless its last
/// commit record happens to end on a page boundary the WAL writer wrote.
const ATTEMPTS: usize = 3;
const TTL: Duration = Duration::from_secs(10);

fn start() -> PostgresServer {
    PostgresServer::start_with_settings(KEEP_WAL_IN_MEMORY).unwrap_or_else(|e| panic!("{e}"))
}

/// SIGKILL to the server and its backends, then a restart on the same data (crash recovery).
fn kill_and_restart(server: &mut PostgresServer) {
    tokio::task::block_in_place(|| {
        server.kill().expect("kill");
        server.restart().expect("restart");
    });
}

/// The key's token in the default fence table, as the server has it; `None` without a row.
async fn fence(url: &str, key: &str) -> Option<u64> {
    let token: Option<i64> = sqlx::query(
        "SELECT token FROM public.fencelock_fence WHERE namespace = 'default' AND key = $1",
    )
    .bind(key.as_bytes())
    .fetch_optional(&mut admin(url).await)
    .await
    .expect("read the fence")
    .map(|row| row.get(0));
    token.map(|t| u64::try_from(t).expect("a positive token"))
}

/// How a burst takes its grants: each path has a statement of its own, which chooses how its
/// commit syncs.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// One attempt (`try_acquire`).
    Try,
    /// A wait in the server's queue (`acquire` with a wait), granted at once on a free key.
    Wait,
}

impl Path {
    async fn grant(self, store: &PostgresStore, key: &str) -> Lease {
        match self {
            Path::Try => store.try_acquire(key, TTL).await,
            Path::Wait => store.acquire(key, TTL, Duration::from_secs(5)).await,
        }
        .unwrap_or_else(|e| panic!("grant ({self:?}): {e}"))
    }
}

/// `count` grants of `key` by `path`, each released; the largest token handed out.
async fn burst(store: &PostgresStore, key: &str, count: usize, path: Path) -> u64 {
    let mut largest = 0;
    for _ in 0..count {
        let lease = path.grant(store, key).await;
        largest = largest.max(lease.fencing_token());
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    largest
}

/// The next grant after a restart: above `handed_out`.
async fn next_token_is_above(url: &str, key: &str, handed_out: u64) {
    let store = store(url, "").await;
    let next = store
        .try_acquire(key, TTL)
        .await
        .expect("grant after restart");
    assert!(
        next.fencing_token() > handed_out,
        "token {} after the crash, {handed_out} handed out before it",
        next.fencing_token()
    );
    assert_eq!(
        store.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_that_loses_grants_at_the_clock_leaves_the_next_token_above_them() {
    let mut server = start();
    let url = server.url();
    // Each path's statement chooses its own commit: each is shown to lose grants.
    for (key, path) in [
        ("crash:at-clock", Path::Try),
        ("crash:at-clock:waited", Path::Wait),
    ] {
        lose_grants_at_the_clock(&mut server, &url, key, path).await;
    }
}

/// Bursts of grants by `path`, each ended by a crash, until one crash loses grants; the next
/// token is above every token handed out after each.
async fn lose_grants_at_the_clock(server: &mut PostgresServer, url: &str, key: &str, path: Path) {
    for attempt in 1..=ATTEMPTS {
        let store = store(url, "").await;
        let handed_out = burst(&store, key, BURST, path).await;
        kill_and_restart(server);
        let after = fence(url, key).await;
        next_token_is_above(url, key, handed_out).await;
        if after.is_none_or(|token| token < handed_out) {
            return; // the crash lost grants, and the next token is above them
        }
        assert_eq!(after, Some(handed_out));
        eprintln!("burst {attempt} ({path:?}) lost nothing (its WAL reached the kernel); again");
    }
    panic!(
        "{ATTEMPTS} bursts of {BURST} grants ({path:?}), and no crash lost any: nothing was shown"
    );
}

/// Sets the fence of `key` an hour ahead of the clock, as after the clock stepped back by an
/// hour (this update commits durably); returns that token.
async fn set_ahead(url: &str, key: &str) -> u64 {
    let ahead: i64 = sqlx::query(
        "UPDATE public.fencelock_fence
            SET token = floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8 + 3600000000
          WHERE namespace = 'default' AND key = $1 RETURNING token",
    )
    .bind(key.as_bytes())
    .fetch_one(&mut admin(url).await)
    .await
    .expect("set the fence ahead")
    .get(0);
    u64::try_from(ahead).expect("a positive token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_ahead_of_the_clock_survives_a_crash() {
    let mut server = start();
    let url = server.url();
    let store = store(&url, "").await;
    let mut granted = Vec::new();
    for (key, path) in [
        ("crash:ahead", Path::Try),
        ("crash:ahead:waited", Path::Wait),
    ] {
        burst(&store, key, 1, path).await;
        let ahead = set_ahead(&url, key).await;
        // A few grants at the clock on another key first: WAL the durable commit must flush too.
        burst(&store, "crash:ahead:other", 5, path).await;
        let lease = path.grant(&store, key).await;
        assert_eq!(lease.fencing_token(), ahead + 1, "{path:?}");
        granted.push((key, path, lease.fencing_token()));
    }

    kill_and_restart(&mut server);
    for (key, path, token) in granted {
        assert_eq!(
            fence(&url, key).await,
            Some(token),
            "the grant ahead of the clock ({path:?}) was lost: it did not commit durably"
        );
        next_token_is_above(&url, key, token).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_durable_grants_a_crash_loses_no_grant() {
    let mut server = start();
    let url = server.url();
    let key = "crash:durable";
    let store = store(&url, "durable_grants=true").await;
    let mut handed_out = burst(&store, key, BURST / 2, Path::Try).await;
    handed_out = handed_out.max(burst(&store, key, BURST / 2, Path::Wait).await);
    kill_and_restart(&mut server);
    assert_eq!(fence(&url, key).await, Some(handed_out));
    next_token_is_above(&url, key, handed_out).await;
}
