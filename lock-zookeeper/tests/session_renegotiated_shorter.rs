//! A session that reconnects to a server whose `maxSessionTimeout` was lowered meanwhile: the
//! client negotiates again, the server grants less, and from then on expires the session that
//! much sooner after its last heartbeat. A lease on it may not keep the TTL it was granted.
//!
//! The bound is the contract's: the key is exclusive while a lease lasts, so the holder is told
//! its lease is lost before the server can let the next holder in (the crate docs' "TTLs,
//! sessions and loss").

mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{raw::drift, Error, KeepAlive, LockStore, ReleaseOutcome};
use test_servers::{FreezableRelay, ZookeeperEnsemble};
use tokio::time::{sleep, timeout, Instant};

/// The holder's TTL, and so its session's timeout when it opens: long enough that the client
/// does not give its silent connection up while the server restarts (2/5 of it: 12 s).
const TTL: Duration = Duration::from_secs(30);
/// The `maxSessionTimeout` the server restarts with: the holder's session is renegotiated to it.
/// The client itself gives a silent session up 7/5 of it after its last byte, the server may
/// expire it two ticks after one of it: 2 s leaves the server 600 ms ahead of the client.
const LOWERED_MAX: Duration = Duration::from_secs(2);
/// The waiter's TTL, within the lowered maximum (twice test-servers' `minSessionTimeout`).
const WAITER_TTL: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_renegotiated_shorter_is_told_before_the_server_lets_the_next_holder_in() {
    let server = tokio::task::spawn_blocking(ZookeeperEnsemble::start_standalone)
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{e}"));
    let relay = FreezableRelay::start(&server.endpoints()[0]).expect("a relay");
    let holder = Arc::new(common::store(&format!("zookeeper://{}", relay.address()), "").await);
    let key = "renegotiated:shorter";
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    assert_eq!(lease.ttl(), TTL);
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    let lost = kept.lost_token();
    let lost_at = tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    });

    // The holder's session reconnects to the restarted server, which grants it less. Its
    // connection is silent while the server restarts and ends at the thaw, so the client
    // reconnects at once (a connection refused meanwhile would put it in its backoff).
    relay.freeze(true);
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server
            .restart_with_max_session_timeout(0, LOWERED_MAX)
            .map(|()| server)
    })
    .await
    .expect("join")
    .unwrap_or_else(|e| panic!("{e}"));
    relay.freeze(false);
    // Later than its loss delay, the session's leases would be lost to the disconnection.
    let loss_delay = (TTL * 7 / 20).saturating_sub(drift(TTL));
    let reconnected_by = Instant::now() + loss_delay;
    while server.members_serving_timeout(LOWERED_MAX).is_empty() {
        assert!(
            Instant::now() < reconnected_by,
            "the holder's session did not reconnect within its loss delay, {loss_delay:?}: {:?}",
            kept.lost_reason()
        );
        sleep(Duration::from_millis(10)).await;
    }
    // A request on the session answered after the server's connect answer: the client read that
    // answer before the cut (whatever the extend says; the lease's loss is checked below).
    let _ = holder.extend(&lease).await;

    // Cut off from then on, the holder's session expires a lowered maximum after its last
    // heartbeat, far before its lease's deadline of 30 s.
    let waiter = common::store(&server.url(), "").await;
    let waiting = tokio::spawn(async move {
        let next = waiter.acquire(key, WAITER_TTL, TTL).await;
        (next, Instant::now(), waiter)
    });
    relay.freeze(true);
    let frozen_at = Instant::now();
    let (next, granted_at, waiter) = timeout(TTL * 2, waiting)
        .await
        .expect("the waiter is served once the server expires the holder's session")
        .expect("join");
    let next = next.expect("the next holder gets the key");
    let lost_at = timeout(TTL, lost_at)
        .await
        .expect("the lost signal fires")
        .expect("join");
    let lost = match lost_at.checked_duration_since(frozen_at) {
        Some(after) => format!("{after:?} after"),
        None => format!("{:?} before", frozen_at - lost_at),
    };
    println!(
        "renegotiated to {LOWERED_MAX:?}: lost signal {lost}, next grant {:?} after the freeze",
        granted_at - frozen_at,
    );
    assert!(
        lost_at < granted_at,
        "the next holder was granted {:?} before the lost signal ({:?})",
        lost_at - granted_at,
        kept.lost_reason()
    );
    assert!(next.fencing_token() > lease.fencing_token());

    // Back: the lease is lost, and a lease of the old TTL is no longer granted on a session
    // that the server would shorten.
    relay.freeze(false);
    let lease = kept.stop().await;
    assert!(matches!(
        holder.extend(&lease).await,
        Err(Error::LeaseLost { .. })
    ));
    let refused = holder.try_acquire("renegotiated:other", TTL).await;
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "a lease of {TTL:?} on a server whose maximum is {LOWERED_MAX:?} gave {refused:?}"
    );
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
    drop(server);
}
