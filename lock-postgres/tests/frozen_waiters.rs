//! Waiters that freeze (a stopped process: its session sits idle and never sends its next
//! statement) in the shared and permit modes. The server ends such a session one of the
//! waiter's own TTLs after it fell silent, whatever it took for its acquire (the key's lock
//! from the queue, the gate, a group's lock, a slot, an open transaction), so the key is free
//! again within 2 TTLs; and `status` never counts a waiter as a holder. An exclusive waiter
//! frozen just as its lock timeout fires on a granted lock keeps the key at most its TTL too,
//! and so does an acquire in any mode (one attempt, or a wait's first) whose fence bump fails
//! after it took the key's lock.
//!
//! A waiter is frozen by polling its acquire future until the server shows it where the test
//! wants it, and never again: the future (and its connection) stays alive, silent.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{admin, holders, store, waiters};
use fencelock_core::{Error, KeyStatus, LockStore, Mode, ReleaseOutcome};
use fencelock_postgres::{PostgresStore, DEFAULT_NAMESPACE, DEFAULT_SCHEMA, DEFAULT_TABLE};
use sqlx::{PgConnection, Row};
use test_servers::{shared, PostgresServer};
use tokio::time::{sleep, timeout, Instant};

/// The TTL every lease and waiter of these tests asks for.
const TTL: Duration = Duration::from_secs(3);

/// The bound: a third acquirer gets the key within 2 of the frozen waiter's TTLs.
const BOUND: Duration = Duration::from_secs(6);

/// The frozen waiter's wait: far beyond the bound, so only the server can free the key.
const LONG_WAIT: Duration = Duration::from_secs(60);

const PERMIT: Mode = Mode::Permit { limit: 1 };

/// Polls `$condition` (an async expression) every 10 ms until it holds (boundedly: it is about
/// to hold).
macro_rules! until {
    ($what:expr, $condition:expr) => {{
        let started = Instant::now();
        while !$condition {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{} never happened",
                $what
            );
            sleep(Duration::from_millis(10)).await;
        }
    }};
}

/// Polls `waiter` until `condition` holds, then stops: from then on the waiter's session gets
/// no statement from it. Panics if the waiter returns first.
async fn freeze_when<T: std::fmt::Debug>(
    waiter: &mut (impl Future<Output = T> + Unpin),
    condition: impl Future<Output = ()>,
) {
    tokio::select! {
        result = waiter => panic!("the waiter returned before it was frozen: {result:?}"),
        () = condition => {}
    }
}

/// How many backends the backend `pid` blocks (waiting for a lock it holds).
async fn blocked_by(admin: &mut PgConnection, pid: i32) -> i64 {
    sqlx::query("SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))")
        .bind(pid)
        .fetch_one(admin)
        .await
        .expect("pg_blocking_pids")
        .get(0)
}

/// The key's status must not count the frozen waiter: no lease was granted.
async fn assert_free(store: &PostgresStore, key: &str, when: &str) {
    match store.status(key).await.expect("status") {
        KeyStatus::Free => {}
        other => panic!("{when}: a waiter was reported as a holder: {other:?}"),
    }
}

/// H holds `key` exclusively; W waits for it in `mode` and is frozen while it waits; H
/// releases, so the server grants W's backend the key's lock (shared) in the queue, which W
/// never reads. A writer gets the key within 2 of W's TTLs.
async fn frozen_queued_waiter_keeps_the_key_at_most_its_ttl(mode: Mode, key: &str) {
    let url = shared::postgres().url();
    let (holder, waiter, third) = (
        store(&url, "").await,
        store(&url, "").await,
        store(&url, "").await,
    );
    let mut admin = admin(&url).await;
    let lock_id = holder.lock_id(key);
    let held = holder.try_acquire(key, TTL).await.unwrap();

    let mut frozen = Box::pin(waiter.acquire_as(key, TTL, LONG_WAIT, mode));
    freeze_when(&mut frozen, async {
        until!(
            "the waiter queueing",
            waiters(&mut admin, lock_id).await == 1
        )
    })
    .await;
    assert_eq!(
        holder.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let freed = Instant::now();
    until!(
        "the server granting the frozen waiter",
        holders(&mut admin, lock_id).await.len() == 1
    );
    assert_free(&third, key, "a waiter granted the key's lock in the queue").await;

    let lease = timeout(BOUND, third.acquire(key, TTL, BOUND))
        .await
        .unwrap_or_else(|_| panic!("the writer was still waiting after {BOUND:?}"))
        .unwrap_or_else(|e| panic!("the frozen waiter kept the key past {BOUND:?}: {e}"));
    assert!(freed.elapsed() <= BOUND, "took {:?}", freed.elapsed());
    assert_eq!(
        third.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    thawed_waiter_gets_a_lease_on_a_new_session(frozen, &waiter, lease.fencing_token()).await;
}

/// The frozen waiter, polled again, finds its session ended by the server and goes on
/// waiting on a new one: it gets the key, now free, above the token of the lease in between.
async fn thawed_waiter_gets_a_lease_on_a_new_session(
    frozen: impl Future<Output = fencelock_core::Result<fencelock_core::Lease>>,
    waiter: &PostgresStore,
    before: u64,
) {
    let lease = timeout(BOUND, frozen)
        .await
        .expect("the thawed waiter never returned")
        .expect("the thawed waiter did not wait on with a new session");
    assert!(lease.fencing_token() > before);
    assert_eq!(
        waiter.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_reader_waiter_keeps_the_key_at_most_its_ttl() {
    frozen_queued_waiter_keeps_the_key_at_most_its_ttl(Mode::Shared, "frozen:queued-reader").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_permit_waiter_keeps_the_key_at_most_its_ttl() {
    frozen_queued_waiter_keeps_the_key_at_most_its_ttl(PERMIT, "frozen:queued-permit").await;
}

/// W is frozen inside its acquire's transaction, holding the key's gate, the key's lock, its
/// group's lock (and a slot) and an uncommitted fence bump: the test holds the key's fence row
/// until W's bump waits for it, stops polling W, then lets the bump through. Another acquire in
/// the same mode gets the key within 2 of W's TTLs.
async fn waiter_frozen_in_the_gate_keeps_the_key_at_most_its_ttl(mode: Mode, key: &str) {
    let url = shared::postgres().url();
    let (first, waiter, third) = (
        store(&url, "").await,
        store(&url, "").await,
        store(&url, "").await,
    );
    let mut admin = admin(&url).await;
    let mut row_holder = admin_in_transaction(&url).await;
    // A fence row for the key, to hold.
    let lease = first.try_acquire_as(key, TTL, mode).await.unwrap();
    assert_eq!(
        first.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let fence = format!("\"{DEFAULT_SCHEMA}\".\"{DEFAULT_TABLE}\"");
    sqlx::query(&format!(
        "SELECT 1 FROM {fence} WHERE namespace = $1 AND key = $2 FOR UPDATE"
    ))
    .bind(DEFAULT_NAMESPACE)
    .bind(key.as_bytes())
    .fetch_one(&mut row_holder.0)
    .await
    .unwrap();

    let mut frozen = Box::pin(waiter.acquire_as(key, TTL, LONG_WAIT, mode));
    let row_holder_pid = row_holder.1;
    freeze_when(&mut frozen, async {
        until!(
            "the waiter's bump waiting for the fence row",
            blocked_by(&mut admin, row_holder_pid).await == 1
        )
    })
    .await;
    sqlx::query("ROLLBACK")
        .execute(&mut row_holder.0)
        .await
        .unwrap();
    // The bump goes through; W never sends its COMMIT.
    let frozen_at = Instant::now();
    until!(
        "the waiter's bump finishing",
        blocked_by(&mut admin, row_holder_pid).await == 0
    );
    assert_free(&third, key, "a waiter inside its acquire's transaction").await;

    let lease = timeout(BOUND, third.acquire_as(key, TTL, BOUND, mode))
        .await
        .unwrap_or_else(|_| panic!("the acquire was still running after {BOUND:?}"))
        .unwrap_or_else(|e| panic!("the frozen waiter kept the key past {BOUND:?}: {e}"));
    assert!(
        frozen_at.elapsed() <= BOUND,
        "took {:?}",
        frozen_at.elapsed()
    );
    assert_eq!(
        third.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    thawed_waiter_gets_a_lease_on_a_new_session(frozen, &waiter, lease.fencing_token()).await;
}

/// An admin connection inside a transaction, and its backend pid.
async fn admin_in_transaction(url: &str) -> (PgConnection, i32) {
    let mut conn = admin(url).await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    (conn, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_frozen_in_the_gate_keeps_the_key_at_most_its_ttl() {
    waiter_frozen_in_the_gate_keeps_the_key_at_most_its_ttl(Mode::Shared, "frozen:gate-reader")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_frozen_in_the_gate_keeps_the_key_at_most_its_ttl() {
    waiter_frozen_in_the_gate_keeps_the_key_at_most_its_ttl(PERMIT, "frozen:gate-permit").await;
}

/// `status` counts the leases that hold a key, never a waiter: with a frozen reader waiter
/// granted the key's lock in the queue, the key is free, and one reader's lease is one holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_no_waiter_as_a_holder() {
    let url = shared::postgres().url();
    let key = "frozen:status";
    let (holder, waiter, other) = (
        store(&url, "").await,
        store(&url, "").await,
        store(&url, "").await,
    );
    let mut admin = admin(&url).await;
    let lock_id = holder.lock_id(key);
    let held = holder.try_acquire(key, TTL).await.unwrap();
    let mut frozen = Box::pin(waiter.acquire_as(key, TTL, LONG_WAIT, Mode::Shared));
    freeze_when(&mut frozen, async {
        until!(
            "the waiter queueing",
            waiters(&mut admin, lock_id).await == 1
        )
    })
    .await;
    assert_eq!(
        holder.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
    until!(
        "the server granting the frozen waiter",
        holders(&mut admin, lock_id).await.len() == 1
    );
    assert_free(&other, key, "a reader waiter granted the key's lock").await;

    let reader = other.try_acquire_as(key, TTL, Mode::Shared).await.unwrap();
    match other.status(key).await.unwrap() {
        KeyStatus::Shared {
            mode: Mode::Shared,
            count: 1,
            holders,
        } if holders.len() == 1 => {}
        other => panic!("one reader and a frozen waiter: expected one holder, got {other:?}"),
    }
    assert_eq!(
        other.release(&reader).await.unwrap(),
        ReleaseOutcome::Released
    );
    drop(frozen);
}

// ---- an exclusive waiter whose lock timeout fires on a granted lock -------------------------

/// The exclusive waiters' TTL: short, so that a key kept past it fails the test quickly.
const RACE_TTL: Duration = Duration::from_secs(1);

/// Their wait, half the TTL: the steps before the lock timeout (a poll and a signal) fit in
/// it many times over, and its end comes well before the TTL's.
const RACE_WAIT: Duration = Duration::from_millis(500);

/// The TTL, plus half of it for the round trips of a loaded machine.
const RACE_BOUND: Duration = Duration::from_millis(1500);

/// The URL of a server on this host, whose backends the test can stop: the shared one unless
/// `LOCK_TEST_POSTGRES_URL` names another server.
fn local_server_url() -> String {
    static LOCAL: std::sync::OnceLock<PostgresServer> = std::sync::OnceLock::new();
    let shared = shared::postgres();
    if !shared.is_external() {
        return shared.url();
    }
    LOCAL
        .get_or_init(|| PostgresServer::start_with_settings(&[]).expect("a local PostgreSQL"))
        .url()
}

/// A backend stopped with SIGSTOP, run again (SIGCONT) when dropped, so that a failed test
/// never leaves it stopped.
struct Stopped(i32);

impl Stopped {
    async fn stop(pid: i32) -> Stopped {
        signal(pid, "-STOP");
        let stopped = Stopped(pid);
        until!("the backend stopping", process_state(pid) == Some('T'));
        stopped
    }

    fn resume(self) {
        drop(self);
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: i32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid} failed: {status}");
}

/// The state letter of process `pid` (`T` while stopped), from `/proc/<pid>/stat`.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the state follows its last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The one backend waiting for lock `lock_id`, and when its lock timeout of `wait` ends by
/// the server's clock (µs since the epoch): the wait's timers start at `waitstart`.
async fn queued(admin: &mut PgConnection, lock_id: i64, wait: Duration) -> (i32, i64) {
    let row = sqlx::query(
        "SELECT pid, (extract(epoch FROM waitstart) * 1000000)::int8 + $2::int8 FROM pg_locks
          WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
            AND classid = (($1::int8 >> 32) & 4294967295)::oid
            AND objid = ($1::int8 & 4294967295)::oid",
    )
    .bind(lock_id)
    .bind(i64::try_from(wait.as_micros()).expect("a short wait"))
    .fetch_one(admin)
    .await
    .expect("the queued waiter in pg_locks");
    (row.get(0), row.get(1))
}

/// Sleeps on the server until its clock passes `until_us` (µs since the epoch) by one
/// millisecond, the granularity of its lock timeout.
async fn server_sleep_past(admin: &mut PgConnection, until_us: i64) {
    sqlx::query(
        "SELECT pg_sleep(GREATEST(0, ($1::int8 + 1000) / 1000000.0
                                  - extract(epoch FROM clock_timestamp())))",
    )
    .bind(until_us)
    .execute(admin)
    .await
    .expect("pg_sleep");
}

/// Another acquirer gets the key within [`RACE_BOUND`] of `since`, and releases it.
async fn key_freed_within_the_ttl(third: &PostgresStore, key: &str, since: Instant) {
    let lease = timeout(RACE_BOUND * 2, third.acquire(key, RACE_TTL, RACE_BOUND))
        .await
        .unwrap_or_else(|_| panic!("the acquire was still running after {:?}", RACE_BOUND * 2))
        .unwrap_or_else(|e| panic!("the frozen acquirer kept the key past its TTL: {e}"));
    assert!(since.elapsed() <= RACE_BOUND, "took {:?}", since.elapsed());
    assert_eq!(
        third.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// The frozen waiter, polled again, reads its lock timeout: the wait ran out, nothing of it
/// holds the key, and its session went back to the idle ones.
async fn thawed_waiter_timed_out(
    frozen: impl Future<Output = fencelock_core::Result<fencelock_core::Lease>>,
    waiter: &PostgresStore,
    admin: &mut PgConnection,
    lock_id: i64,
) {
    match timeout(RACE_BOUND, frozen)
        .await
        .expect("the thawed waiter never returned")
    {
        Err(Error::WaitTimedOut { .. }) => {}
        other => panic!("the thawed waiter should have timed out: {other:?}"),
    }
    assert!(holders(admin, lock_id).await.is_empty());
    assert_eq!(waiter.open_connections(), waiter.idle_connections());
}

/// W waits exclusively; its backend is stopped while it waits, H releases, so the server
/// grants W the key in the queue, and W's backend runs again only once its lock timeout is
/// due: the timeout's error and the grant land together, and W's client is frozen from then
/// on. The key is free again within W's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_exclusive_waiter_granted_as_its_lock_timeout_fires_keeps_the_key_at_most_its_ttl() {
    let url = local_server_url();
    let key = "frozen:exclusive-granted-at-timeout";
    let (holder, waiter, third) = (
        store(&url, "").await,
        store(&url, "").await,
        store(&url, "").await,
    );
    let mut admin = admin(&url).await;
    let lock_id = holder.lock_id(key);
    let held = holder.try_acquire(key, RACE_TTL).await.unwrap();

    let mut frozen = Box::pin(waiter.acquire(key, RACE_TTL, RACE_WAIT));
    freeze_when(&mut frozen, async {
        until!(
            "the waiter queueing",
            waiters(&mut admin, lock_id).await == 1
        )
    })
    .await;
    let (pid, timeout_due_us) = queued(&mut admin, lock_id, RACE_WAIT).await;
    let stopped = Stopped::stop(pid).await;
    assert_eq!(
        waiters(&mut admin, lock_id).await,
        1,
        "the waiter's lock timeout fired before its backend was stopped"
    );
    assert_eq!(
        holder.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
    until!(
        "the server granting the stopped waiter",
        holders(&mut admin, lock_id).await == [pid]
    );
    server_sleep_past(&mut admin, timeout_due_us).await;
    stopped.resume();
    let fired = Instant::now();

    key_freed_within_the_ttl(&third, key, fired).await;
    thawed_waiter_timed_out(frozen, &waiter, &mut admin, lock_id).await;
}

/// W waits exclusively for a free key; its fence bump waits for the key's fence row, which
/// the test holds, until W's lock timeout fires, granted lock in hand; W's client is frozen
/// from before. The key is free again within W's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_exclusive_waiter_timed_out_in_its_fence_bump_keeps_the_key_at_most_its_ttl() {
    let url = shared::postgres().url();
    let key = "frozen:exclusive-timeout-in-bump";
    let (first, waiter, third) = (
        store(&url, "").await,
        store(&url, "").await,
        store(&url, "").await,
    );
    let mut admin = admin(&url).await;
    let mut row_holder = admin_in_transaction(&url).await;
    let lock_id = first.lock_id(key);
    // A fence row for the key, to hold.
    let lease = first.try_acquire(key, RACE_TTL).await.unwrap();
    assert_eq!(
        first.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let fence = format!("\"{DEFAULT_SCHEMA}\".\"{DEFAULT_TABLE}\"");
    sqlx::query(&format!(
        "SELECT 1 FROM {fence} WHERE namespace = $1 AND key = $2 FOR UPDATE"
    ))
    .bind(DEFAULT_NAMESPACE)
    .bind(key.as_bytes())
    .fetch_one(&mut row_holder.0)
    .await
    .unwrap();

    let mut frozen = Box::pin(waiter.acquire(key, RACE_TTL, RACE_WAIT));
    let row_holder_pid = row_holder.1;
    freeze_when(&mut frozen, async {
        until!(
            "the waiter's bump waiting for the fence row",
            blocked_by(&mut admin, row_holder_pid).await == 1
        )
    })
    .await;
    until!(
        "the waiter's lock timeout firing in its bump",
        blocked_by(&mut admin, row_holder_pid).await == 0
    );
    let fired = Instant::now();
    sqlx::query("ROLLBACK")
        .execute(&mut row_holder.0)
        .await
        .unwrap();

    key_freed_within_the_ttl(&third, key, fired).await;
    thawed_waiter_timed_out(frozen, &waiter, &mut admin, lock_id).await;
}

// ---- an acquire whose statement fails after it took the key's lock ---------------------------

/// The pid of the one backend that waits for a lock backend `pid` holds.
async fn blocked_backend(admin: &mut PgConnection, pid: i32) -> i32 {
    sqlx::query("SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))")
        .bind(pid)
        .fetch_one(admin)
        .await
        .expect("the backend the row holder blocks")
        .get(0)
}

/// How many advisory locks backend `pid` holds, in any mode, for its session or transaction.
async fn advisory_locks_of(admin: &mut PgConnection, pid: i32) -> i64 {
    sqlx::query(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1",
    )
    .bind(pid)
    .fetch_one(admin)
    .await
    .expect("pg_locks")
    .get(0)
}

/// A acquires in `mode` (one attempt, or waiting up to `wait`) a key whose fence row the test
/// holds, so A's fence bump waits for the row after A took the key's lock (and, in the shared
/// modes, its group's and a slot); A's client is frozen from then on. The bump then fails: the
/// test cancels it (`pg_cancel_backend`), as any error there ends it (an operator's cancel, a
/// failed write). A writer gets the key within A's TTL, and A's backend holds no advisory lock.
async fn acquire_frozen_as_its_fence_bump_fails_keeps_the_key_at_most_its_ttl(
    mode: Mode,
    wait: Option<Duration>,
    key: &str,
) {
    let url = shared::postgres().url();
    let (first, acquirer, third) = (
        store(&url, "").await,
        store(&url, "").await,
        store(&url, "").await,
    );
    let mut admin = admin(&url).await;
    let mut row_holder = admin_in_transaction(&url).await;
    let lock_id = first.lock_id(key);
    // A fence row for the key, to hold.
    let lease = first.try_acquire_as(key, RACE_TTL, mode).await.unwrap();
    assert_eq!(
        first.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let fence = format!("\"{DEFAULT_SCHEMA}\".\"{DEFAULT_TABLE}\"");
    sqlx::query(&format!(
        "SELECT 1 FROM {fence} WHERE namespace = $1 AND key = $2 FOR UPDATE"
    ))
    .bind(DEFAULT_NAMESPACE)
    .bind(key.as_bytes())
    .fetch_one(&mut row_holder.0)
    .await
    .unwrap();

    let mut frozen = Box::pin(async {
        match wait {
            None => acquirer.try_acquire_as(key, RACE_TTL, mode).await,
            Some(wait) => acquirer.acquire_as(key, RACE_TTL, wait, mode).await,
        }
    });
    let row_holder_pid = row_holder.1;
    freeze_when(&mut frozen, async {
        until!(
            "the acquirer's bump waiting for the fence row",
            blocked_by(&mut admin, row_holder_pid).await == 1
        )
    })
    .await;
    let pid = blocked_backend(&mut admin, row_holder_pid).await;
    assert!(
        !holders(&mut admin, lock_id).await.is_empty(),
        "the acquirer's bump waits with the key's lock held"
    );
    let cancelled: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(cancelled, "could not cancel the acquirer's statement");
    until!(
        "the acquirer's bump failing",
        blocked_by(&mut admin, row_holder_pid).await == 0
    );
    let failed = Instant::now();
    sqlx::query("ROLLBACK")
        .execute(&mut row_holder.0)
        .await
        .unwrap();

    key_freed_within_the_ttl(&third, key, failed).await;
    assert_eq!(
        advisory_locks_of(&mut admin, pid).await,
        0,
        "the acquirer's backend still holds advisory locks"
    );
    match timeout(RACE_BOUND, frozen)
        .await
        .expect("the thawed acquirer never returned")
    {
        Err(_) => {}
        Ok(lease) => panic!("a cancelled acquire handed out a lease: {lease:?}"),
    }
    assert_eq!(acquirer.open_connections(), acquirer.idle_connections());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_exclusive_try_acquire_failing_in_its_fence_bump_keeps_the_key_at_most_its_ttl() {
    acquire_frozen_as_its_fence_bump_fails_keeps_the_key_at_most_its_ttl(
        Mode::Exclusive,
        None,
        "frozen:exclusive-try-fails-in-bump",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_reader_try_acquire_failing_in_its_fence_bump_keeps_the_key_at_most_its_ttl() {
    acquire_frozen_as_its_fence_bump_fails_keeps_the_key_at_most_its_ttl(
        Mode::Shared,
        None,
        "frozen:reader-try-fails-in-bump",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_permit_try_acquire_failing_in_its_fence_bump_keeps_the_key_at_most_its_ttl() {
    acquire_frozen_as_its_fence_bump_fails_keeps_the_key_at_most_its_ttl(
        PERMIT,
        None,
        "frozen:permit-try-fails-in-bump",
    )
    .await;
}

/// The first attempt of a wait, before any of its statements committed the waiter's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_reader_waiter_failing_in_its_first_fence_bump_keeps_the_key_at_most_its_ttl() {
    acquire_frozen_as_its_fence_bump_fails_keeps_the_key_at_most_its_ttl(
        Mode::Shared,
        Some(RACE_WAIT),
        "frozen:reader-wait-fails-in-bump",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_permit_waiter_failing_in_its_first_fence_bump_keeps_the_key_at_most_its_ttl() {
    acquire_frozen_as_its_fence_bump_fails_keeps_the_key_at_most_its_ttl(
        PERMIT,
        Some(RACE_WAIT),
        "frozen:permit-wait-fails-in-bump",
    )
    .await;
}
