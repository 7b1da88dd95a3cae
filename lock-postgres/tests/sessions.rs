//! How the store uses server sessions: one per lease, never shared by two leases on one key,
//! closed when a lease or waiter is dropped, served in arrival order; raw ids, status,
//! namespaces and configured tables.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{admin, backend_exists, holders, store, waiter_pids, waiters};
use fencelock_conformance::eventually;
use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use sqlx::Row;
use test_servers::shared;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handle_never_grants_one_key_twice() {
    let url = shared::postgres().url();
    let store = store(&url, "max_idle=4").await;
    let mut admin = admin(&url).await;
    let key = "sessions:reentrancy";
    let id = store.lock_id(key);
    let mut last = 0;
    for round in 0..5 {
        // After the first round the lease runs on a session reused from the idle list.
        let lease = store.try_acquire(key, TTL).await.unwrap();
        assert!(lease.fencing_token() > last);
        last = lease.fencing_token();
        assert!(
            matches!(store.try_acquire(key, TTL).await, Err(Error::Busy { .. })),
            "round {round}: the same handle granted the key twice"
        );
        assert!(matches!(
            store.acquire(key, TTL, Duration::from_millis(100)).await,
            Err(Error::WaitTimedOut { .. })
        ));
        assert_eq!(holders(&mut admin, id).await.len(), 1);
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(
            holders(&mut admin, id).await.is_empty(),
            "a released session still holds the lock"
        );
    }
    assert!(store.idle_connections() <= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_held_lease_has_its_own_connection() {
    let url = shared::postgres().url();
    let store = store(&url, "max_idle=2").await;
    let mut leases = Vec::new();
    for i in 0..20 {
        leases.push(
            store
                .try_acquire(&format!("sessions:many:{i}"), TTL)
                .await
                .unwrap(),
        );
    }
    assert_eq!(store.open_connections(), 20);
    assert_eq!(store.idle_connections(), 0);
    for lease in &leases {
        assert_eq!(
            store.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    assert_eq!(store.idle_connections(), 2);
    assert_eq!(store.open_connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_lease_closes_its_session() {
    let url = shared::postgres().url();
    let store = store(&url, "").await;
    let mut admin = admin(&url).await;
    let key = "sessions:dropped-lease";
    let lease = store.try_acquire(key, TTL).await.unwrap();
    let pid = holders(&mut admin, store.lock_id(key)).await[0];
    drop(lease);
    assert!(
        eventually!(
            Duration::from_secs(2),
            !backend_exists(&mut admin, pid).await
        ),
        "the dropped lease's backend lives on"
    );
    assert_eq!(store.open_connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_leaves_the_queue_and_never_takes_the_lock() {
    let url = shared::postgres().url();
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let mut admin = admin(&url).await;
    let key = "sessions:dropped-waiter";
    let id = holder.lock_id(key);
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    let task = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(key, TTL, TTL).await }
    });
    assert!(eventually!(
        Duration::from_secs(5),
        waiters(&mut admin, id).await == 1
    ));
    task.abort();
    let _ = task.await;
    // The waiting backend is terminated, not left in the queue until it polls its socket.
    assert!(
        eventually!(Duration::from_secs(2), waiters(&mut admin, id).await == 0),
        "the dropped waiter is still queued"
    );
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    sleep(Duration::from_millis(200)).await;
    assert!(holders(&mut admin, id).await.is_empty());
    assert_eq!(waiter.open_connections(), waiter.idle_connections());
}

/// Releases timed to land near the waiter's lock timeout: whichever wins, no lock is left
/// behind and every grant is a proper lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_races_leave_no_stray_lock() {
    let url = shared::postgres().url();
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let mut admin = admin(&url).await;
    let key = "sessions:timeout-race";
    let id = holder.lock_id(key);
    let (mut granted, mut timed_out, mut last) = (0, 0, 0);
    for round in 0..30u64 {
        let lease = holder.try_acquire(key, TTL).await.unwrap();
        assert!(lease.fencing_token() > last);
        last = lease.fencing_token();
        let task = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire(key, TTL, Duration::from_millis(40)).await }
        });
        sleep(Duration::from_millis(30 + round % 20)).await;
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        match task.await.unwrap() {
            Ok(next) => {
                granted += 1;
                assert!(next.fencing_token() > last);
                last = next.fencing_token();
                assert_eq!(
                    waiter.release(&next).await.unwrap(),
                    ReleaseOutcome::Released
                );
            }
            Err(Error::WaitTimedOut { waited, .. }) => {
                timed_out += 1;
                assert!(waited >= Duration::from_millis(40));
            }
            Err(other) => panic!("round {round}: {other}"),
        }
        assert!(
            holders(&mut admin, id).await.is_empty(),
            "round {round}: a lock was left behind"
        );
    }
    println!("{granted} grants, {timed_out} timeouts");
    assert_eq!(waiters(&mut admin, id).await, 0);
}

/// A wait arms the session's TTL before it blocks; a wait that times out rolls that back with
/// its transaction, so the session it leaves in the pool is not ended by the server after
/// the waiter's TTL of idling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_times_out_leaves_its_session_unarmed_in_the_pool() {
    const SHORT_TTL: Duration = Duration::from_millis(200);
    let url = shared::postgres().url();
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let mut admin = admin(&url).await;
    let key = "sessions:timed-out-wait";
    let id = holder.lock_id(key);
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    let task = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(key, SHORT_TTL, Duration::from_secs(1)).await }
    });
    assert!(eventually!(
        Duration::from_secs(5),
        waiters(&mut admin, id).await == 1
    ));
    let [pid] = waiter_pids(&mut admin, id).await[..] else {
        panic!("one waiter's backend")
    };
    assert!(matches!(
        task.await.unwrap(),
        Err(Error::WaitTimedOut { .. })
    ));
    assert_eq!(waiter.idle_connections(), 1);
    // Four of the waiter's TTLs of idling: an armed session would have been ended by now.
    sleep(SHORT_TTL * 4).await;
    assert!(
        backend_exists(&mut admin, pid).await,
        "the pooled session of a timed-out wait was ended: its TTL stayed armed"
    );
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order_and_nobody_jumps_the_queue() {
    let url = shared::postgres().url();
    let holder = store(&url, "").await;
    let mut admin = admin(&url).await;
    let key = "sessions:fifo";
    let id = holder.lock_id(key);
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let releasing = Arc::new(AtomicUsize::new(0));
    let count = 6;
    let mut tasks = Vec::new();
    for i in 0..count {
        let store = store(&url, "").await;
        let (order, releasing) = (order.clone(), releasing.clone());
        tasks.push(tokio::spawn(async move {
            let lease = store.acquire(key, TTL, TTL).await?;
            order.lock().unwrap().push(i);
            sleep(Duration::from_millis(30)).await;
            releasing.fetch_add(1, Ordering::SeqCst);
            store.release(&lease).await
        }));
        // The next waiter starts only once this one is queued: arrival order is known.
        assert!(eventually!(
            Duration::from_secs(5),
            waiters(&mut admin, id).await == i64::from(i) + 1
        ));
    }
    let intruder = store(&url, "").await;
    let barged = Arc::new(AtomicBool::new(false));
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    // While any queued waiter has not yet released, a newcomer's try must fail. A waiter counts
    // itself releasing before it sends its release, so a try that succeeded while the count
    // (read once the try returned) was still short took the key from a waiter that held it or
    // was queued; read before the try, the count would flag the last waiter's own release.
    while releasing.load(Ordering::SeqCst) < count as usize {
        if let Ok(lease) = intruder.try_acquire(key, TTL).await {
            if releasing.load(Ordering::SeqCst) < count as usize {
                barged.store(true, Ordering::SeqCst);
            }
            let _ = intruder.release(&lease).await;
        }
        sleep(Duration::from_millis(3)).await;
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(*order.lock().unwrap(), (0..count).collect::<Vec<_>>());
    assert!(
        !barged.load(Ordering::SeqCst),
        "a try_acquire took the key while waiters were queued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_ids_exclude_programs_that_lock_the_same_id() {
    let url = shared::postgres().url();
    let store = store(&url, "").await;
    let mut other_program = admin(&url).await;
    let raw = 7_770_001_i64;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(raw)
        .execute(&mut other_program)
        .await
        .unwrap();
    assert!(matches!(
        store.try_acquire_raw(raw, TTL).await,
        Err(Error::Busy { .. })
    ));
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(raw)
        .execute(&mut other_program)
        .await
        .unwrap();
    let lease = store.try_acquire_raw(raw, TTL).await.unwrap();
    assert_eq!(lease.key(), "pg_advisory_lock(7770001)");
    let taken: bool = sqlx::query("SELECT pg_try_advisory_lock($1)")
        .bind(raw)
        .fetch_one(&mut other_program)
        .await
        .unwrap()
        .get(0);
    assert!(!taken, "the program got a lock the lease holds");
    // A hashed key that reads the same is another lock.
    let hashed = store.try_acquire(lease.key(), TTL).await.unwrap();
    store.extend(&lease).await.unwrap();
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        store.release(&hashed).await.unwrap(),
        ReleaseOutcome::Released
    );
    let again = store
        .acquire_raw(raw, TTL, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(again.fencing_token() > lease.fencing_token());
    assert_eq!(
        store.release(&again).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_what_the_server_will_do() {
    let url = shared::postgres().url();
    let store = store(&url, "").await;
    let key = "sessions:status";
    let ttl = Duration::from_secs(10);
    let lease = store.try_acquire(key, ttl).await.unwrap();
    sleep(Duration::from_millis(300)).await;
    let KeyStatus::Held {
        owner,
        token,
        remaining,
        ..
    } = store.status(key).await.unwrap()
    else {
        panic!("a held key is not reported held");
    };
    assert_eq!(owner, Some(lease.owner()));
    assert_eq!(token, Some(lease.fencing_token()));
    let remaining = remaining.expect("the server's idle timer");
    assert!(
        remaining <= ttl - Duration::from_millis(250),
        "{remaining:?}"
    );
    assert!(remaining >= ttl - Duration::from_secs(3), "{remaining:?}");
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(store.status(key).await.unwrap(), KeyStatus::Free);

    // Held by a program that is not a fencelock store: held, nothing more is known.
    let mut other_program = admin(&url).await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(store.lock_id(key))
        .execute(&mut other_program)
        .await
        .unwrap();
    assert_eq!(
        store.status(key).await.unwrap(),
        KeyStatus::Held {
            owner: None,
            token: None,
            remaining: None,
            label: None,
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_do_not_contend_and_tables_are_created_where_configured() {
    let url = shared::postgres().url();
    let options = "schema=fence_test&table=fence_ns";
    let a = store(&url, &format!("namespace=a&{options}")).await;
    let b = store(&url, &format!("namespace=b&{options}")).await;
    let key = "sessions:namespaced";
    let in_a = a.try_acquire(key, TTL).await.unwrap();
    let in_b = b
        .try_acquire(key, TTL)
        .await
        .expect("another namespace does not contend");
    assert!(matches!(
        a.try_acquire(key, TTL).await,
        Err(Error::Busy { .. })
    ));
    let mut admin = admin(&url).await;
    let rows: i64 = sqlx::query("SELECT count(*) FROM fence_test.fence_ns")
        .fetch_one(&mut admin)
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2);
    assert!(a.capabilities().fair_queue && a.capabilities().frees_on_disconnect);
    assert_eq!(a.release(&in_a).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(b.release(&in_b).await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_are_classified() {
    let url = shared::postgres().url();
    // No such database: the server refuses, retrying cannot help.
    let mut missing = url::Url::parse(&url).unwrap();
    missing.set_path("/no_such_db");
    missing.set_query(Some("connect_timeout=30"));
    let missing = fencelock_postgres::PostgresConfig::from_url(missing.as_str()).unwrap();
    let error = fencelock_postgres::PostgresStore::connect(missing)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Store { .. }), "{error}");
    assert!(error.to_string().contains("no_such_db"), "{error}");
    // A closed port: retryable, and fast.
    let port = test_servers::closed_ports(1)[0];
    let closed = fencelock_postgres::PostgresConfig::from_url(&format!(
        "postgres://postgres:secret@127.0.0.1:{port}/postgres?connect_timeout=2"
    ))
    .unwrap();
    let started = std::time::Instant::now();
    let error = fencelock_postgres::PostgresStore::connect(closed)
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(!error.to_string().contains("secret"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_can_end_the_holder_of_a_key() {
    let url = shared::postgres().url();
    let holder = store(&url, "").await;
    let operator = store(&url, "").await;
    let key = "sessions:operator";
    assert!(!operator.evict(key).await.unwrap(), "nobody holds it yet");
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    assert!(operator.evict(key).await.unwrap());
    // Free at once for others; the holder learns at its next extend or release.
    let next = operator
        .try_acquire(key, TTL)
        .await
        .expect("free after termination");
    assert!(holder.extend(&lease).await.unwrap_err().is_lease_lost());
    assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    assert_eq!(
        operator.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_all_find_or_create_the_fence_table() {
    let url = shared::postgres().url();
    for round in 0..3 {
        let options = format!("schema=race_{round}&table=fence_{round}");
        let connects: Vec<_> = (0..8)
            .map(|_| {
                let (url, options) = (url.clone(), options.clone());
                tokio::spawn(async move { store(&url, &options).await })
            })
            .collect();
        for connect in connects {
            let store = connect.await.expect("every racing connect succeeds");
            let lease = store.try_acquire("sessions:race", TTL).await.unwrap();
            assert_eq!(
                store.release(&lease).await.unwrap(),
                ReleaseOutcome::Released
            );
        }
    }
}
