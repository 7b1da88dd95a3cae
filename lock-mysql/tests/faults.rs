//! Faults against a real MariaDB, one per test: an operator killing the holder's session, a
//! holder silent past its TTL with its connection open, a dropped waiter, a crash and
//! restart, and 300 leases held at once.

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, KeepAlive, LockStore, ReleaseOutcome};
use fencelock_mysql::{MysqlConfig, MysqlStore};
use sqlx::{Connection, MySqlConnection, Row};
use test_servers::{shared, MariadbServer};
use tokio::time::{sleep, timeout, Instant};

/// The server of the tests that do not stop it.
fn shared_url() -> String {
    shared::mariadb().url()
}

async fn store(url: &str) -> MysqlStore {
    // Generous: other test processes may load this machine.
    let config = MysqlConfig::from_url(&format!("{url}?connect_timeout=30")).expect("config");
    MysqlStore::connect(config).await.expect("connect")
}

async fn admin(url: &str) -> MySqlConnection {
    MySqlConnection::connect(url)
        .await
        .expect("admin connection")
}

/// The session holding `lock_name`, as the server sees it.
async fn holder(admin: &mut MySqlConnection, lock_name: &str) -> Option<i64> {
    sqlx::query("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(lock_name)
        .fetch_one(admin)
        .await
        .expect("IS_USED_LOCK")
        .get(0)
}

/// Whether session `id` still exists on the server.
async fn session_exists(admin: &mut MySqlConnection, id: i64) -> bool {
    sqlx::query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?")
        .bind(id)
        .fetch_one(admin)
        .await
        .expect("PROCESSLIST")
        .get::<i64, _>(0)
        == 1
}

/// How many sessions wait in GET_LOCK on the server (MariaDB's state name).
async fn waiting_sessions(admin: &mut MySqlConnection) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'")
        .fetch_one(admin)
        .await
        .expect("PROCESSLIST")
        .get(0)
}

/// How late after its TTL the server may end a silent session and the next waiter get the key.
const SLACK: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_frees_the_key_at_once_and_fires_the_lost_signal_within_the_watch_period() {
    let url = shared_url();
    let holder_store = Arc::new(store(&url).await);
    let other = store(&url).await;
    let key = "faults:killed";
    // Long enough that the next extend (at TTL/3) cannot be what reports the loss: the watch
    // looks every second for a 30 s lease.
    let ttl = Duration::from_secs(30);
    let lease = holder_store.try_acquire(key, ttl).await.unwrap();
    let kept = KeepAlive::start(holder_store.clone(), lease.clone());
    let mut admin = admin(&url).await;
    let id = holder(&mut admin, &holder_store.lock_name(key))
        .await
        .expect("a holder");

    sqlx::query("KILL CONNECTION ?")
        .bind(id)
        .execute(&mut admin)
        .await
        .expect("KILL");
    let killed = Instant::now();
    // The lock went with the session: free for others at once (KILL returns before the
    // session has ended, so allow the server a moment).
    let next = other
        .acquire(key, ttl, Duration::from_secs(1))
        .await
        .expect("the key is free");
    assert!(next.fencing_token() > lease.fencing_token());

    // The documented bound: min(1 s, TTL/6) plus one query; the rest is margin for a loaded
    // machine.
    timeout(Duration::from_secs(3), kept.lost())
        .await
        .expect("keep-alive reports the loss within the watch period");
    assert!(killed.elapsed() < ttl / 3, "not found out by an extend");
    let reason = kept.lost_reason().expect("a reason");
    assert!(reason.contains("session"), "{reason}");
    assert_eq!(
        holder_store.release(&lease).await.unwrap(),
        ReleaseOutcome::Lost,
        "the killed lease cannot release its successor"
    );
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_holder_is_ended_by_the_server_at_its_ttl_though_connected() {
    let url = shared_url();
    let holder_store = store(&url).await;
    let other = store(&url).await;
    let key = "faults:silent";
    let ttl = Duration::from_secs(1);
    let requested = Instant::now();
    let lease = holder_store.try_acquire(key, ttl).await.unwrap();
    let mut admin = admin(&url).await;
    let id = holder(&mut admin, &holder_store.lock_name(key))
        .await
        .expect("a holder");

    // Half way: still held, the holder's session is there, idle.
    sleep(ttl / 2).await;
    assert!(matches!(
        other.try_acquire(key, ttl).await,
        Err(Error::Busy { .. })
    ));
    assert!(session_exists(&mut admin, id).await);

    // The holder never extends and never closes its connection (the lease, which owns it, is
    // alive until the end of the test). The server ends the silent session at its TTL.
    let next = other
        .acquire(key, ttl, ttl * 3)
        .await
        .expect("the key is freed by the server");
    let elapsed = requested.elapsed();
    assert!(elapsed >= ttl, "freed after {elapsed:?}, before the TTL");
    assert!(elapsed <= ttl + SLACK, "freed only after {elapsed:?}");
    // The server frees the session's locks before it takes the session off its process list,
    // so the session may still be listed for a moment: it is gone within the same slack.
    let freed = Instant::now();
    while session_exists(&mut admin, id).await {
        assert!(
            freed.elapsed() <= SLACK,
            "the server had not ended the session {SLACK:?} after freeing its lock"
        );
        sleep(Duration::from_millis(10)).await;
    }
    assert!(
        lease.is_expired(),
        "the local deadline came before the server's"
    );
    assert!(holder_store
        .extend(&lease)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        holder_store.release(&lease).await.unwrap(),
        ReleaseOutcome::Lost
    );
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A waiter whose future is dropped mid-wait must never take the lock later, although the
/// server does not notice its closed connection while it waits in GET_LOCK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_never_acquires_later() {
    let url = shared_url();
    let holder_store = store(&url).await;
    let waiter = store(&url).await;
    let other = store(&url).await;
    let key = "faults:dropped-waiter";
    let ttl = Duration::from_secs(30);
    let lease = holder_store.try_acquire(key, ttl).await.unwrap();
    let lock_name = holder_store.lock_name(key);
    let mut admin = admin(&url).await;

    let waiting = waiter.acquire(key, ttl, Duration::from_secs(60));
    assert!(
        timeout(Duration::from_millis(300), waiting).await.is_err(),
        "the key is held: the waiter waits"
    );
    // The waiter's future is gone. Its session is killed from another connection: it no
    // longer waits on the server.
    let deadline = Instant::now() + Duration::from_secs(3);
    while waiting_sessions(&mut admin).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the dropped waiter still waits on the server"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        holder_store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        holder(&mut admin, &lock_name).await,
        None,
        "nobody took the key after its release"
    );
    // Tokens follow the clock (fence scheme 3): the key's counter tells whether anyone was
    // granted it in between.
    let counter: u64 = sqlx::query(&format!(
        "SELECT token FROM {} WHERE namespace = 'default' AND `key` = ?",
        holder_store.config().fence_table()
    ))
    .bind(key.as_bytes())
    .fetch_one(&mut admin)
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        counter,
        lease.fencing_token(),
        "nobody was granted the key in between"
    );
    let next = other
        .try_acquire(key, ttl)
        .await
        .expect("the key is free for the next caller");
    assert!(next.fencing_token() > lease.fencing_token());
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// GET_LOCK is reentrant per session: a second lease on a held key from the same handle must
/// be refused, and every held lease must sit on a session of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handle_never_gives_one_session_two_leases() {
    let url = shared_url();
    let handle = store(&url).await;
    let ttl = Duration::from_secs(30);
    let first = handle.try_acquire("faults:reentrant", ttl).await.unwrap();
    assert!(matches!(
        handle.try_acquire("faults:reentrant", ttl).await,
        Err(Error::Busy { .. })
    ));
    // Released sessions are reused for other keys, never while they hold a lock.
    let mut leases = Vec::new();
    for round in 0..3 {
        for i in 0..5 {
            leases.push(
                handle
                    .try_acquire(&format!("faults:reentrant:{round}:{i}"), ttl)
                    .await
                    .unwrap(),
            );
        }
        for lease in leases.drain(1..) {
            assert_eq!(
                handle.release(&lease).await.unwrap(),
                ReleaseOutcome::Released
            );
        }
    }
    let mut admin = admin(&url).await;
    let mut holders = Vec::new();
    for key in ["faults:reentrant", "faults:reentrant:0:0"] {
        holders.push(holder(&mut admin, &handle.lock_name(key)).await.unwrap());
    }
    assert_ne!(holders[0], holders[1], "two leases on one session");
    for round in 0..3 {
        for i in 1..5 {
            let name = handle.lock_name(&format!("faults:reentrant:{round}:{i}"));
            assert_eq!(
                holder(&mut admin, &name).await,
                None,
                "a released key is held"
            );
        }
    }
    for lease in [first, leases.remove(0)] {
        assert_eq!(
            handle.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_restart_keeps_tokens_increasing() {
    let mut server = MariadbServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let store = store(&url).await;
    let key = "faults:crash";
    let ttl = Duration::from_secs(10);
    // Tokens follow the clock (fence scheme 3), which would hide a lost bump: the counter is
    // put far ahead of it, so only the committed counter orders the tokens.
    let lease = store.try_acquire(key, ttl).await.unwrap();
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let ahead: u64 = 1 << 62;
    sqlx::query(&format!(
        "UPDATE {} SET token = ? WHERE `key` = ?",
        store.config().fence_table()
    ))
    .bind(ahead)
    .bind(key.as_bytes())
    .execute(&mut admin(&url).await)
    .await
    .unwrap();
    for _ in 0..5 {
        let lease = store.try_acquire(key, ttl).await.unwrap();
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // The last token before the crash is handed out to a holder the crash will kill.
    let held = store.try_acquire(key, ttl).await.unwrap();
    let before = held.fencing_token();
    assert_eq!(before, ahead + 6);

    tokio::task::block_in_place(|| server.crash_and_restart()).expect("crash and restart");

    // The crash ended the holder's session and its lock.
    let extended = store.extend(&held).await;
    assert!(
        extended.as_ref().is_err_and(Error::is_lease_lost),
        "{extended:?}"
    );
    assert_eq!(store.release(&held).await.unwrap(), ReleaseOutcome::Lost);
    // Same handle: its idle sessions died too; it opens new ones.
    let next = store
        .try_acquire(key, ttl)
        .await
        .expect("acquire after restart");
    assert!(
        next.fencing_token() > before,
        "token {} after the crash, {before} before",
        next.fencing_token()
    );
    assert_eq!(
        store.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_held_leases_are_kept_alive_on_one_handle() {
    const HELD: usize = 300;
    let url = shared_url();
    let handle = Arc::new(store(&url).await);
    let ttl = Duration::from_secs(2);
    let mut kept = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let lease = handle
            .try_acquire(&format!("faults:held:{i}"), ttl)
            .await
            .unwrap();
        kept.push(KeepAlive::start(handle.clone(), lease));
    }
    // Past three TTLs: each lease lives only because its keep-alive extends it.
    sleep(ttl * 3).await;
    let lost = kept.iter().filter(|k| k.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of {HELD} leases lost");
    assert!(handle.open_connections() >= HELD);
    let other = store(&url).await;
    assert!(matches!(
        other.try_acquire("faults:held:123", ttl).await,
        Err(Error::Busy { .. })
    ));
    for keep in kept {
        let lease = keep.stop().await;
        assert_eq!(
            handle.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}
