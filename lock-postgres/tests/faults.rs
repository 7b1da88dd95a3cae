//! Faults against real servers, one per test: an operator ending the holder's session, holders
//! that go silent past their TTL with their connection open, and a server crash.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{admin, backend_exists, holders, store, terminate_holder};
use fencelock_conformance::eventually;
use fencelock_core::{Error, KeepAlive, LockStore, ReleaseOutcome};
use test_servers::PostgresServer;
use tokio::time::{sleep, timeout, Instant};

fn start() -> PostgresServer {
    PostgresServer::start().unwrap_or_else(|e| panic!("{e}"))
}

/// How late after its TTL the server may end a silent session and the next waiter get the key.
const SLACK: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_session_fires_the_lost_signal_and_frees_the_key() {
    let server = start();
    let url = server.url();
    let holder = Arc::new(store(&url, "").await);
    let other = store(&url, "").await;
    let key = "faults:terminated";
    let ttl = Duration::from_secs(3);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let kept = KeepAlive::start(holder.clone(), lease.clone());

    let mut admin = admin(&url).await;
    assert_eq!(terminate_holder(&mut admin, holder.lock_id(key)).await, 1);
    // The lock went with the session: free for others at once.
    let next = other.try_acquire(key, ttl).await.expect("the key is free");
    assert!(next.fencing_token() > lease.fencing_token());

    // The holder learns at its next extend, well before its TTL would have run out.
    timeout(ttl, kept.lost())
        .await
        .expect("the lost signal fires within the TTL");
    let reason = kept.lost_reason().expect("a reason");
    assert!(reason.contains("session"), "{reason}");
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Lost,
        "the terminated lease cannot release its successor"
    );
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_holder_loses_the_lock_within_its_ttl_though_connected() {
    let server = start();
    let url = server.url();
    let holder = store(&url, "").await;
    let other = store(&url, "").await;
    let key = "faults:silent";
    let ttl = Duration::from_secs(1);
    let requested = Instant::now();
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let mut admin = admin(&url).await;
    let pid = holders(&mut admin, holder.lock_id(key)).await[0];

    // Half way: still held, the holder's session is there, idle.
    sleep(ttl / 2).await;
    assert!(matches!(
        other.try_acquire(key, ttl).await,
        Err(Error::Busy { .. })
    ));
    assert!(backend_exists(&mut admin, pid).await);

    // The holder never extends and never closes its connection (the lease, which owns it, is
    // alive until the end of the test). The server ends the silent session at its TTL.
    let next = other
        .acquire(key, ttl, ttl * 3)
        .await
        .expect("the key is freed by the server");
    let elapsed = requested.elapsed();
    assert!(
        elapsed + Duration::from_millis(5) >= ttl,
        "freed after {elapsed:?}, before the TTL"
    );
    assert!(elapsed <= ttl + SLACK, "freed only after {elapsed:?}");
    // The backend frees its locks on its way out, before it leaves pg_stat_activity, and a
    // grant that does not wait for a WAL flush can come back inside that gap.
    assert!(
        eventually!(SLACK, !backend_exists(&mut admin, pid).await),
        "the silent holder's backend lives on"
    );
    assert!(
        lease.is_expired(),
        "the local deadline came before the server's"
    );
    assert!(holder.extend(&lease).await.unwrap_err().is_lease_lost());
    assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A holder whose whole process stalls (here: its runtime's only thread blocks, as in a long
/// GC pause) with keep-alive running: no extend goes out, the connection stays open, and the
/// server still frees the lock at the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_with_keep_alive_loses_the_lock_at_its_ttl() {
    let server = start();
    let url = server.url();
    let other = store(&url, "").await;
    let key = "faults:stalled";
    let ttl = Duration::from_secs(1);
    let (granted, grants) = std::sync::mpsc::channel();
    let stalled = std::thread::spawn({
        let url = url.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let holder = Arc::new(store(&url, "").await);
                let lease = holder.try_acquire(key, ttl).await.expect("acquire");
                let kept = KeepAlive::start(holder.clone(), lease.clone());
                granted.send(lease.fencing_token()).expect("send");
                // The runtime stops: keep-alive cannot run, the socket stays open.
                std::thread::sleep(ttl * 3);
                let lost = timeout(ttl, kept.lost()).await.is_ok();
                let extend = holder.extend(&lease).await;
                (lost, extend.is_err_and(|e| e.is_lease_lost()))
            })
        }
    });
    let token = grants.recv().expect("the stalled holder got the lock");
    let started = Instant::now();
    // The next holder's lease must outlast the rest of the stall.
    let next = other
        .acquire(key, Duration::from_secs(30), ttl * 2)
        .await
        .expect("the server frees a stalled holder's lock");
    assert!(
        started.elapsed() <= ttl + SLACK,
        "freed after {:?}",
        started.elapsed()
    );
    assert!(next.fencing_token() > token);
    let (lost, extend_lost) = stalled.join().expect("the stalled holder");
    assert!(
        lost,
        "keep-alive reported the loss once the holder ran again"
    );
    assert!(extend_lost, "an extend after the stall is refused");
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_restart_keeps_tokens_increasing() {
    let mut server = start();
    let url = server.url();
    let store = store(&url, "").await;
    let key = "faults:crash";
    let ttl = Duration::from_secs(10);
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
    assert!(before >= 6);

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
    let mut admin = admin(&url).await;
    assert!(holders(&mut admin, store.lock_id(key)).await.is_empty());
}
