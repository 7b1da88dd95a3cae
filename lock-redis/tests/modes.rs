//! Shared leases and semaphore permits on one Redis server, where the shared suite (run by
//! `tests/conformance.rs`) cannot look: the Redis keys a mode leaves behind, a dropped waiting
//! writer whose clean-up never runs, an ACL user with only the exclusive-lock rights, and what
//! status and evict say of a key held in a mode.

mod common;

use std::time::Duration;

use common::{admin, admin_query, store};
use fencelock_conformance::eventually;
use fencelock_core::{Error, KeyStatus, LockStore, Mode, ReleaseOutcome};
use test_servers::{shared, RedisServer};
use tokio::time::sleep;

const LONG: Duration = Duration::from_secs(30);

fn name(prefix: &str, key: &str, part: &str) -> String {
    format!("{prefix}{{{key}}}:{part}")
}

async fn exists(admin: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    admin_query::<i64>(admin, redis::cmd("EXISTS").arg(key)).await == 1
}

/// A key held in a mode keeps exactly two Redis keys next to its fence (the lock holding the
/// mode's tag, and the holders set), both gone at the last release, and both gone by
/// themselves when the holders expire unreleased: a mode leaves no per-key state beyond the
/// fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_leaves_no_keys_behind_after_release_or_expiry() {
    let url = shared::redis().url();
    let prefix = "modes-state:";
    let store = store(&url, &format!("prefix={prefix}")).await;
    let mut admin = admin(&url).await;

    let key = "released";
    let (lock, holders) = (name(prefix, key, "lock"), name(prefix, key, "holders"));
    let a = store
        .try_acquire_as(key, LONG, Mode::permits(3))
        .await
        .unwrap();
    let b = store
        .try_acquire_as(key, LONG, Mode::permits(3))
        .await
        .unwrap();
    let tag: String = admin_query(&mut admin, redis::cmd("GET").arg(&lock)).await;
    assert_eq!(tag, "fencelock:permits:3");
    let ttl: i64 = admin_query(&mut admin, redis::cmd("PTTL").arg(&lock)).await;
    assert!(ttl > 0, "the tag must expire with its holders, PTTL {ttl}");
    let count: i64 = admin_query(&mut admin, redis::cmd("ZCARD").arg(&holders)).await;
    assert_eq!(count, 2);
    assert_eq!(store.release(&a).await.unwrap(), ReleaseOutcome::Released);
    assert!(exists(&mut admin, &lock).await, "one permit is still held");
    assert_eq!(store.release(&b).await.unwrap(), ReleaseOutcome::Released);
    assert!(
        !exists(&mut admin, &lock).await,
        "the tag outlived the last release"
    );
    assert!(
        !exists(&mut admin, &holders).await,
        "the holders outlived the last release"
    );
    assert!(exists(&mut admin, &name(prefix, key, "fence")).await);

    let key = "expired";
    let (lock, holders) = (name(prefix, key, "lock"), name(prefix, key, "holders"));
    let short = Duration::from_millis(300);
    let _first = store
        .try_acquire_as(key, short, Mode::Shared)
        .await
        .unwrap();
    let second_reader = store
        .try_acquire_as(key, short, Mode::Shared)
        .await
        .unwrap();
    assert!(exists(&mut admin, &holders).await);
    // The server expires both keys; nothing else touches them meanwhile.
    assert!(
        eventually!(Duration::from_secs(10), {
            !exists(&mut admin, &lock).await && !exists(&mut admin, &holders).await
        }),
        "the tag or the holders of expired shared leases are still there"
    );
    // And the key is free for a writer, with a greater token.
    let writer = store.try_acquire(key, LONG).await.unwrap();
    assert!(writer.fencing_token() > second_reader.fencing_token());
    assert_eq!(
        store.release(&writer).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A waiting writer whose future is dropped with its runtime (so the clean-up it spawns never
/// runs) leaves its mark behind, which expires within a second of its last refresh: readers
/// are then admitted again, and the writers set is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_writers_mark_expires_when_its_clean_up_cannot_run() {
    let url = shared::redis().url();
    let prefix = "modes-dropped-writer:";
    let key = "k";
    let writers = name(prefix, key, "writers");
    let store = store(&url, &format!("prefix={prefix}")).await;
    let reader = store.try_acquire_as(key, LONG, Mode::Shared).await.unwrap();

    // The writer waits on its own runtime, which is dropped once the mark is seen.
    let (thread_url, thread_writers) = (url.clone(), writers.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let writer = common::store(&thread_url, &format!("prefix={prefix}")).await;
            let mut admin = common::admin(&thread_url).await;
            let waiting = writer.acquire_as(key, LONG, LONG, Mode::Exclusive);
            tokio::select! {
                result = waiting => panic!("the writer stopped waiting: {result:?}"),
                marked = async {
                    eventually!(Duration::from_secs(20), {
                        admin_query::<i64>(&mut admin, redis::cmd("ZCARD").arg(&thread_writers))
                            .await
                            == 1
                    })
                } => assert!(marked, "the waiting writer never marked itself"),
            }
        });
        // Dropping the runtime drops the spawned clean-up unrun.
        drop(runtime);
    })
    .join()
    .unwrap();

    // Whatever is left expires within a second of the server's clock.
    let mut admin = admin(&url).await;
    let left: Vec<i64> = admin_query(
        &mut admin,
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local now = t[1] * 1000000 + t[2] \
                 local m = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES') \
                 local out = {} for i = 2, #m, 2 do out[#out + 1] = m[i] - now end \
                 out[#out + 1] = redis.call('PTTL', KEYS[1]) return out",
            )
            .arg(1)
            .arg(&writers),
    )
    .await;
    let (marks, pttl) = left.split_at(left.len() - 1);
    assert!(marks.len() <= 1, "one writer waited: {marks:?}");
    assert!(
        marks.iter().all(|us| *us <= 1_000_000),
        "a mark outlives its second: {marks:?} µs left"
    );
    assert!(
        pttl[0] <= 1_010,
        "the writers set must expire with its marks: {pttl:?}"
    );
    // A reader waits out the mark; nobody else removes it.
    let second = store
        .acquire_as(key, LONG, Duration::from_secs(10), Mode::Shared)
        .await
        .expect("a reader after the dropped writer's mark expired");
    assert!(!exists(&mut admin, &writers).await);
    assert_eq!(
        store.release(&second).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        store.release(&reader).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A user with the rights exclusive locks needed before modes existed (no sorted-set commands)
/// still waits for an exclusive lock: the waiting writer's mark is refused inside the script
/// (under `pcall`) and the wait goes on unmarked. Its shared requests are refused with a
/// non-retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_only_acl_user_still_waits_for_exclusive_locks() {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    server
        .acl_setuser(
            "exclusive",
            &[
                "on",
                ">pw",
                "resetkeys",
                "~fencelock:*",
                "resetchannels",
                "&fencelock:*",
                "-@all",
                "+evalsha",
                "+script|load",
                "+subscribe",
                "+unsubscribe",
                "+ping",
                "+set",
                "+get",
                "+del",
                "+incr",
                "+pexpire",
                "+pttl",
                "+time",
                "+publish",
                "+info",
            ],
        )
        .unwrap();
    let limited = store(&server.url_as("exclusive", "pw"), "").await;
    let holder = store(&server.url(), "").await;
    let key = "acl";
    let held = holder.try_acquire(key, LONG).await.unwrap();
    let waiter = {
        let limited = limited.clone();
        tokio::spawn(async move { limited.acquire(key, LONG, Duration::from_secs(20)).await })
    };
    // Released only after the waiter made its marking attempts (every 250 ms at least).
    sleep(Duration::from_millis(800)).await;
    assert_eq!(
        holder.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let lease = waiter
        .await
        .unwrap()
        .expect("an exclusive-only user's waiting acquire");
    assert!(lease.fencing_token() > held.fencing_token());
    assert_eq!(
        limited.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );

    match limited.try_acquire_as(key, LONG, Mode::Shared).await {
        Err(error @ Error::Store { .. }) => assert!(!error.is_retryable(), "{error}"),
        other => panic!("a shared lease without the sorted-set rights: {other:?}"),
    }
}

/// Status names each permit's holder, token and slot; evict frees every holder of the key
/// (their extends fail, their releases report lost) and keeps the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_the_permits_and_evict_frees_them_all() {
    let url = shared::redis().url();
    let store = store(&url, "prefix=modes-status:").await;
    let key = "k";
    let mode = Mode::permits(4);
    let a = store.try_acquire_as(key, LONG, mode).await.unwrap();
    let b = store.try_acquire_as(key, LONG, mode).await.unwrap();
    let KeyStatus::Shared {
        mode: held,
        count,
        holders,
    } = store.status(key).await.unwrap()
    else {
        panic!("two permits held, status says otherwise");
    };
    assert_eq!((held, count), (mode, 2));
    for lease in [&a, &b] {
        let holder = holders
            .iter()
            .find(|h| h.token == Some(lease.fencing_token()))
            .unwrap_or_else(|| panic!("token {} not in {holders:?}", lease.fencing_token()));
        assert_eq!(holder.owner, Some(lease.owner()));
        assert_eq!(holder.slot, lease.slot());
        assert!(holder.remaining.is_some_and(|r| r <= LONG && !r.is_zero()));
    }
    assert_eq!((a.slot(), b.slot()), (Some(0), Some(1)));

    assert!(store.evict(key).await.unwrap());
    let mut admin = admin(&url).await;
    assert!(
        !exists(&mut admin, "modes-status:{k}:holders").await,
        "evict left the holders"
    );
    assert!(matches!(store.status(key).await.unwrap(), KeyStatus::Free));
    for lease in [&a, &b] {
        assert!(matches!(
            store.extend(lease).await,
            Err(Error::LeaseLost { .. })
        ));
        assert_eq!(store.release(lease).await.unwrap(), ReleaseOutcome::Lost);
    }
    // The key takes any mode again, and the fence went on.
    let next = store
        .try_acquire_as(key, LONG, Mode::permits(2))
        .await
        .unwrap();
    assert!(next.fencing_token() > b.fencing_token());
    assert_eq!(next.slot(), Some(0));
    assert_eq!(
        store.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(!store.evict(key).await.unwrap(), "nothing was held");
}
