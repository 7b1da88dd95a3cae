//! Faults against a real redis-server, one server per test: a server frozen past a lease's TTL
//! (SIGSTOP), a restart that loses every key, FLUSHALL, a killed server, an operator's evict.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{admin, admin_query, store};
use fencelock_conformance::eventually;
use fencelock_core::{Error, KeepAlive, KeyStatus, LockStore, ReleaseOutcome};
use test_servers::RedisServer;
use tokio::time::{sleep, timeout, Instant};

fn start() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
}

/// Generous: other test binaries share the two cores.
const SLACK: Duration = Duration::from_millis(750);

/// Acquires and releases `key` `n` times; gives the last token.
async fn cycles(store: &fencelock_redis::RedisStore, key: &str, n: usize) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let lease = store
            .try_acquire(key, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(lease.fencing_token() > last, "tokens grow");
        last = lease.fencing_token();
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_fires_the_lost_signal_and_leaves_no_stale_lease() {
    let server = start();
    let url = server.url();
    let holder = Arc::new(store(&url, "command_timeout=200ms").await);
    let other = store(&url, "").await;
    let key = "faults:frozen";
    let ttl = Duration::from_millis(1500);
    let requested = Instant::now();
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    // Let one extend succeed, then freeze the server with the holder's connection open.
    sleep(ttl / 2).await;
    server.pause().expect("SIGSTOP");
    let frozen_at = Instant::now();

    timeout(ttl + SLACK, kept.lost())
        .await
        .expect("the lost signal fires while the server is frozen");
    let lost_at = Instant::now();
    let reason = kept.lost_reason().expect("a reason");
    // The last confirmed extend was sent before the freeze: the server keeps the key at least
    // one TTL from then, so the signal came before the server could have freed the key.
    assert!(
        lost_at < frozen_at + ttl,
        "the lost signal fired {:?} after the freeze, past the TTL ({reason})",
        lost_at - frozen_at
    );
    assert!(lease.valid_until() <= lost_at, "fired before the deadline");
    assert!(lease.valid_until() < requested + ttl * 2);

    // Frozen past the TTL, then thawed: the key has expired by the server's clock.
    sleep(ttl).await;
    server.resume().expect("SIGCONT");
    let next = other
        .try_acquire(key, Duration::from_secs(10))
        .await
        .expect("nobody holds a stale lease after the thaw");
    assert!(next.fencing_token() > lease.fencing_token());
    let extended = holder.extend(&lease).await;
    assert!(
        extended.as_ref().is_err_and(Error::is_lease_lost),
        "{extended:?}"
    );
    assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_gives_a_retryable_error_within_the_command_timeout() {
    let server = start();
    let url = server.url();
    let store = store(&url, "command_timeout=300ms").await;
    let held = store
        .try_acquire("faults:held", Duration::from_secs(30))
        .await
        .unwrap();
    server.pause().expect("SIGSTOP");
    let started = Instant::now();
    let tried = store
        .try_acquire("faults:frozen-acquire", Duration::from_secs(5))
        .await;
    let extended = store.extend(&held).await;
    let waited = store
        .acquire(
            "faults:frozen-acquire",
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .await;
    let elapsed = started.elapsed();
    // A new handle: the frozen server accepts the TCP connection but never answers.
    let connecting = Instant::now();
    let fresh = fencelock_redis::RedisStore::connect(
        fencelock_redis::RedisConfig::from_url(&format!("{url}?connect_timeout=500ms")).unwrap(),
    )
    .await;
    let connect_took = connecting.elapsed();
    server.resume().expect("SIGCONT");
    assert!(
        matches!(fresh, Err(Error::Unavailable { .. })),
        "connecting to a frozen server: {fresh:?}"
    );
    assert!(
        connect_took < Duration::from_millis(500) + SLACK,
        "connecting to a frozen server gave up after {connect_took:?}, connect_timeout 500 ms"
    );
    for (what, result) in [
        ("try_acquire", tried.map(drop)),
        ("extend", extended),
        ("acquire", waited.map(drop)),
    ] {
        match result {
            Err(Error::Unavailable { .. }) => {}
            other => panic!("{what} on a frozen server: {other:?}"),
        }
    }
    assert!(
        elapsed < Duration::from_millis(900) + SLACK * 2,
        "three calls took {elapsed:?} with a 300 ms command timeout"
    );
    // Thawed, the same handle works again and the lease is still held.
    store.extend(&held).await.expect("extend after the thaw");
    assert_eq!(
        store.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_data_keeps_tokens_increasing() {
    let mut server = start();
    let url = server.url();
    let store = store(&url, "command_timeout=1s").await;
    let key = "faults:restart";
    cycles(&store, key, 3).await;
    let held = store
        .try_acquire(key, Duration::from_secs(30))
        .await
        .unwrap();
    let before = held.fencing_token();

    tokio::task::block_in_place(|| server.restart()).expect("restart");

    // The first command on the dead connection may fail (retryable); it reconnects.
    let mut extended = store.extend(&held).await;
    assert!(
        eventually!(Duration::from_secs(10), {
            if extended.as_ref().is_err_and(Error::is_retryable) {
                extended = store.extend(&held).await;
            }
            !extended.as_ref().is_err_and(Error::is_retryable)
        }),
        "the handle did not reconnect: {extended:?}"
    );
    assert!(
        extended.as_ref().is_err_and(Error::is_lease_lost),
        "a lease the server forgot is lost: {extended:?}"
    );
    let next = store
        .try_acquire(key, Duration::from_secs(30))
        .await
        .expect("acquire after the restart");
    assert!(
        next.fencing_token() > before,
        "token {} after the restart, {before} before",
        next.fencing_token()
    );
    assert_eq!(store.release(&held).await.unwrap(), ReleaseOutcome::Lost);
    assert_eq!(
        store.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_keeps_tokens_increasing() {
    let server = start();
    let url = server.url();
    let store = store(&url, "").await;
    let key = "faults:flushall";
    let before = cycles(&store, key, 3).await;
    let mut admin = admin(&url).await;
    let _: () = admin_query(&mut admin, &redis::cmd("FLUSHALL")).await;
    let after = cycles(&store, key, 3).await;
    assert!(
        after > before + 2,
        "token {after} after FLUSHALL, {before} before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_gives_retryable_errors_then_recovers_after_restart() {
    let mut server = start();
    let url = server.url();
    let store = store(&url, "connect_timeout=1s&command_timeout=1s").await;
    let key = "faults:killed";
    let before = cycles(&store, key, 2).await;
    let held = store
        .try_acquire("faults:killed-held", Duration::from_secs(30))
        .await
        .unwrap();
    server.kill().expect("SIGKILL");

    let started = Instant::now();
    let results = [
        (
            "try_acquire",
            store
                .try_acquire(key, Duration::from_secs(5))
                .await
                .map(drop),
        ),
        (
            "acquire",
            store
                .acquire(key, Duration::from_secs(5), Duration::from_secs(2))
                .await
                .map(drop),
        ),
        ("extend", store.extend(&held).await),
        ("release", store.release(&held).await.map(drop)),
        ("status", store.status(key).await.map(drop)),
        ("evict", store.evict(key).await.map(drop)),
    ];
    let elapsed = started.elapsed();
    for (what, result) in results {
        match result {
            Err(error) if error.is_retryable() => {}
            other => panic!("{what} on a killed server: {other:?}"),
        }
    }
    assert!(
        elapsed < Duration::from_secs(6) + SLACK * 4,
        "six calls with 1 s timeouts took {elapsed:?}"
    );
    let fresh = fencelock_redis::RedisStore::connect(
        fencelock_redis::RedisConfig::from_url(&format!("{url}?connect_timeout=1s")).unwrap(),
    )
    .await;
    assert!(
        matches!(fresh, Err(Error::Unavailable { .. })),
        "connecting to a killed server: {fresh:?}"
    );

    tokio::task::block_in_place(|| server.restart()).expect("restart");
    let mut next = store.try_acquire(key, Duration::from_secs(5)).await;
    assert!(
        eventually!(Duration::from_secs(10), {
            if next.as_ref().is_err_and(Error::is_retryable) {
                next = store.try_acquire(key, Duration::from_secs(5)).await;
            }
            !next.as_ref().is_err_and(Error::is_retryable)
        }),
        "no reconnect after the restart: {next:?}"
    );
    let next = next.expect("acquire after the restart");
    assert!(next.fencing_token() > before);
    assert_eq!(
        store.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_frees_the_key_wakes_waiters_and_keeps_the_fence() {
    let server = start();
    let url = server.url();
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let operator = store(&url, "").await;
    let key = "faults:evict {with braces} and 'quotes'";
    let ttl = Duration::from_secs(60);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let next = waiter.acquire(key, ttl, ttl).await;
        (waiter, next, started.elapsed())
    });
    sleep(Duration::from_millis(300)).await;

    assert!(operator.evict(key).await.unwrap(), "the lock was there");
    let (waiter, next, waited) = waiting.await.expect("waiter task");
    let next = next.expect("the waiter gets the evicted key");
    // Far below the holder's 60 s TTL: the evict's message woke the waiter.
    assert!(waited < Duration::from_secs(10), "woken after {waited:?}");
    assert!(
        next.fencing_token() > lease.fencing_token(),
        "the fence survived"
    );
    assert!(holder.extend(&lease).await.unwrap_err().is_lease_lost());
    assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    match operator.status(key).await.unwrap() {
        KeyStatus::Held { owner, token, .. } => {
            assert_eq!(owner, Some(next.owner()));
            assert_eq!(token, Some(next.fencing_token()));
        }
        other => panic!("status after the waiter took the key: {other:?}"),
    }
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(
        !operator.evict(key).await.unwrap(),
        "a free key: nothing to evict"
    );
}
