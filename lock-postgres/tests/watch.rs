//! A holder finds out fast when the server ended its session (the lock was freed early): the
//! handle's watch task sees the backend gone from `pg_stat_activity` and revokes the lease,
//! long before its next extend. The task costs nothing without leases and stops with the
//! handle.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{admin, store, terminate_holder};
use fencelock_conformance::eventually;
use fencelock_core::raw::LeaseExt;
use fencelock_core::{KeepAlive, LockStore, ReleaseOutcome};
use sqlx::{PgConnection, Row};
use test_servers::shared;
use tokio::time::{timeout, Instant};

/// Long enough that the next extend (at TTL/3 or sooner) cannot be what reports the loss.
const LONG_TTL: Duration = Duration::from_secs(30);

/// The bound: the watch looks every second for a 30 s lease; the rest is margin for a loaded
/// machine.
const FOUND_OUT_WITHIN: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_holder_with_a_30_s_ttl_learns_within_3_s_while_the_key_is_taken() {
    let url = shared::postgres().url();
    let holder = Arc::new(store(&url, "").await);
    let other = store(&url, "").await;
    let key = "watch:terminated";
    let lease = holder.try_acquire(key, LONG_TTL).await.unwrap();
    let kept = KeepAlive::start(holder.clone(), lease.clone());

    let mut admin = admin(&url).await;
    assert_eq!(terminate_holder(&mut admin, holder.lock_id(key)).await, 1);
    let terminated = Instant::now();
    // The key is free at once: the lock went with the session.
    let next = other
        .try_acquire(key, LONG_TTL)
        .await
        .expect("the key is free");
    assert!(next.fencing_token() > lease.fencing_token());

    timeout(FOUND_OUT_WITHIN, lease.revocation().revoked())
        .await
        .expect("the store revokes the lease within the bound");
    timeout(FOUND_OUT_WITHIN, kept.lost())
        .await
        .expect("keep-alive reports the loss within the bound");
    let found_out = terminated.elapsed();
    assert!(
        found_out <= FOUND_OUT_WITHIN,
        "found out after {found_out:?}"
    );
    assert!(lease.is_revoked());
    // Meanwhile the key stayed with its new holder.
    assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_session_lives_is_never_revoked() {
    let url = shared::postgres().url();
    let holder = store(&url, "application_name=watch_alive").await;
    let key = "watch:alive";
    // Six watch periods of a 600 ms lease (100 ms each), extended by hand.
    let ttl = Duration::from_millis(600);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    for _ in 0..6 {
        tokio::time::sleep(ttl / 6).await;
        fencelock_core::LockStore::extend(&holder, &lease)
            .await
            .unwrap();
    }
    assert!(!lease.is_revoked());
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    // A released lease is not watched: ending its (now idle) session revokes nothing.
    let mut admin = admin(&url).await;
    sqlx::query(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
          WHERE application_name = 'watch_alive'",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    tokio::time::sleep(ttl / 2).await;
    assert!(!lease.is_revoked());
}

/// Backends whose application_name is `name`.
async fn backends(admin: &mut PgConnection, name: &str) -> i64 {
    sqlx::query("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(name)
        .fetch_one(admin)
        .await
        .expect("pg_stat_activity")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_runs_only_while_leases_are_held_and_stops_with_the_handle() {
    let url = shared::postgres().url();
    let name = "watch_cost";
    // No idle sessions, so every open backend is a held lease or the watch's own session.
    let handle = store(&url, &format!("application_name={name}&max_idle=0")).await;
    let mut admin = admin(&url).await;
    let limit = Duration::from_secs(5);
    assert!(eventually!(limit, backends(&mut admin, name).await == 0));
    assert!(format!("{handle:?}").contains("watch_task_running: false"));

    let lease = handle.try_acquire("watch:cost", LONG_TTL).await.unwrap();
    // The lease's session and, from the first look on, the watch's.
    assert!(eventually!(limit, backends(&mut admin, name).await == 2));
    assert!(format!("{handle:?}").contains("watched_leases: 1"));
    assert_eq!(
        handle.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Nothing held: the task ends and gives its session back (closed, as max_idle is 0).
    assert!(eventually!(limit, backends(&mut admin, name).await == 0));
    assert!(eventually!(
        limit,
        format!("{handle:?}").contains("watch_task_running: false")
    ));

    let kept = handle.try_acquire("watch:cost", LONG_TTL).await.unwrap();
    assert!(eventually!(limit, backends(&mut admin, name).await == 2));
    // The handle goes; the lease stays held on its own session, unwatched.
    drop(handle);
    assert!(eventually!(limit, backends(&mut admin, name).await == 1));
    drop(kept);
    assert!(eventually!(limit, backends(&mut admin, name).await == 0));
}

/// A handle shared between runtimes: the first runtime's shutdown drops its watch task, and a
/// lease taken on the next runtime is still watched.
#[test]
fn a_lease_is_watched_after_the_runtime_that_ran_the_task_shut_down() {
    let url = shared::postgres().url();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let key = "watch:runtimes";
    let first = runtime();
    let holder = first.block_on(async {
        let holder = store(&url, "").await;
        let lease = holder.try_acquire(key, LONG_TTL).await.unwrap();
        // The task has started; the release leaves it to end at its next look.
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        holder
    });
    first.shutdown_background();
    runtime().block_on(async {
        let lease = holder.try_acquire(key, LONG_TTL).await.unwrap();
        let mut admin = admin(&url).await;
        assert_eq!(terminate_holder(&mut admin, holder.lock_id(key)).await, 1);
        timeout(FOUND_OUT_WITHIN, lease.revocation().revoked())
            .await
            .expect("the lease is watched by a task on this runtime");
    });
}
