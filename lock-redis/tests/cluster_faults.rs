//! Replica acknowledgement and failover on a real Redis Cluster (3 masters, each with a
//! replica): a master is killed after its replica was cut off, and the replica is promoted.
//!
//! # Why the fence is set a day ahead, and not the replica's clock a day back
//!
//! Every node shares this host's clock, so a token minted from `TIME` alone would pass a
//! monotonicity test across any failover. Issue 16 asks for the replica to run under Debian's
//! `faketime` with its clock set back, so that only the replicated counter can keep tokens
//! growing. That does not work with Debian's packages (bookworm: `redis-server` 7.0.15, which
//! links the system's `libjemalloc.so.2` 5.3.0, and `libfaketime` 0.9.10): the server never
//! starts. What was tried, each as `env … redis-server --port P --save ''`:
//!
//! - `faketime -f -1d redis-server`, `faketime '2020-01-01 00:00:00' redis-server`, and
//!   `LD_PRELOAD=…/faketime/libfaketime.so.1 FAKETIME=-1d` and `libfaketimeMT.so.1`, each with
//!   `FAKETIME_DONT_FAKE_MONOTONIC=1`, `DONT_FAKE_MONOTONIC=1`, `FAKETIME_NO_CACHE=1` or
//!   `FAKETIME_FORCE_MONOTONIC_FIX=0`: every one prints libfaketime's "Cannot recover from
//!   unexpected recursive calls to clock_gettime()" and hangs before it listens. gdb shows why:
//!   the first `malloc` (libgpg-error's constructor) starts jemalloc's initialisation, which
//!   reads `clock_gettime(CLOCK_MONOTONIC)`; libfaketime, not yet initialised, starts itself,
//!   and its `dlsym(RTLD_NEXT, "__ftime")` fails (glibc 2.36 has no `__ftime`), and glibc
//!   `malloc`s the error message: jemalloc again, inside its own initialisation. Upstream knows
//!   this and has no fix on libfaketime's side (wolfcw/libfaketime issues 130, 327 and 478).
//! - A preloaded helper exporting `__ftime` and `timer_settime`/`timer_gettime@GLIBC_2.2` (the
//!   other two failed look-ups), so no `dlsym` fails: libfaketime then gets past `dlsym`, but its
//!   initialisation calls `sem_open` (its shared-memory clock for child processes), which
//!   `malloc`s and deadlocks on jemalloc's initialisation lock.
//! - A helper preloaded before libfaketime that answers every clock but the wall clock with
//!   the raw system call, so jemalloc's monotonic reads never reach libfaketime: jemalloc's
//!   initialisation also calls `pthread_cond_init`, which libfaketime interposes and which
//!   starts libfaketime's initialisation (same deadlock). Forwarding that call to the C
//!   library's own version needs a handle on libc: `dlopen("libc.so.6", RTLD_NOLOAD)`
//!   `malloc`s (deadlock), and `dlvsym` on libc's link map (from `dladdr1`) crashed.
//! - `ldd $(command -v redis-server)`: jemalloc is a shared library, but redis calls
//!   jemalloc's own `mallctl`, so another allocator cannot be preloaded in its place; jemalloc
//!   reads the clock and initialises its condition variables whatever `MALLOC_CONF` says.
//!
//! So the test sets the fence key a day ahead of every clock and waits for the replica to have
//! it: from then on `max(fence + 1, TIME)` is the counter on every node, exactly as it would be
//! on a promoted replica whose clock is a day behind. What this cannot catch is an acquire
//! script that returns `max(fence + 1, TIME)` but writes back only `fence + 1` (a clock a day
//! back would); `script.rs`'s unit test
//! `the_token_is_the_fence_plus_one_or_the_clock_and_the_fence_expires_after_retention` checks
//! that the fence holds the token handed out.

mod common;

use std::time::Duration;

use fencelock_core::{Acquire, Error, Extend, Release, ReleaseOutcome};
use test_servers::{RedisCluster, RedisServer};

const TTL: Duration = Duration::from_secs(30);

/// A key whose fence (and so whose lock) lives on the master on `master`.
fn key_on(cluster: &RedisCluster, master: u16, stem: &str) -> String {
    for i in 0..200 {
        let key = format!("{stem}-{i}");
        let slot = cluster
            .keyslot(&format!("fencelock:{{{key}}}:fence"))
            .expect("slot");
        if cluster.master_of_slot(slot).expect("master") == master {
            return key;
        }
    }
    panic!("no key of 200 lives on the master on {master}");
}

/// Retries `attempt` while the store is unavailable (the cluster client finding the promoted
/// master), up to 100 times; any other answer, `Busy` included, is returned.
async fn retrying<T, F, Fut>(mut attempt: F) -> fencelock_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fencelock_core::Result<T>>,
{
    let mut left = 100;
    loop {
        match attempt().await {
            Err(Error::Unavailable { .. }) if left > 0 => {
                left -= 1;
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            answer => return answer,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_keeps_acknowledged_locks_and_tokens_across_a_failover_and_plain_grants_can_be_lost(
) {
    let mut cluster = tokio::task::spawn_blocking(|| RedisServer::start_cluster(3, 1))
        .await
        .expect("join")
        .expect("a Redis Cluster");
    let url = cluster.url();
    let acked = common::store(
        &url,
        "min_replicas=1&replica_timeout=300ms&command_timeout=3s",
    )
    .await;
    let plain = common::store(&url, "command_timeout=3s").await;
    let other = common::store(&url, "min_replicas=1&command_timeout=3s").await;
    let key = "failover";
    let slot = cluster.keyslot("fencelock:{failover}:fence").expect("slot");
    let master = cluster.master_of_slot(slot).expect("master");
    let replica = cluster.replica_of(master).expect("replica");
    let held_key = key_on(&cluster, master, "held");

    // The fence a day ahead of every clock, replicated before anything else happens.
    let ahead = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64)
        + 86_400_000_000;
    cluster
        .query(
            master,
            &["SET", "fencelock:{failover}:fence", &ahead.to_string()],
        )
        .expect("set the fence");
    cluster.query(master, &["WAIT", "1", "5000"]).expect("wait");

    // Acknowledged: granted.
    let first = acked
        .try_acquire(key, TTL)
        .await
        .expect("acknowledged grant");
    assert!(first.fencing_token() > ahead);
    let released = acked.release(&first).await.expect("release");
    assert_eq!(released, ReleaseOutcome::Released);
    // An acknowledged lease on the same master, held across the failover.
    let held = acked
        .try_acquire(&held_key, TTL)
        .await
        .expect("acknowledged grant of the held lock");

    // The replica frozen: the grant is not acknowledged, so it is refused and released.
    cluster.pause(replica).expect("pause");
    // And cut off: a paused replica would still find the stream in its socket buffer later.
    cluster
        .query(master, &["CLIENT", "KILL", "TYPE", "replica"])
        .expect("cut the replica off");
    let refused = acked.try_acquire(key, TTL).await;
    assert!(
        matches!(&refused, Err(Error::Unavailable { message, .. }) if message.contains("min_replicas")),
        "{refused:?}"
    );
    // Without WAIT the same grant is handed out, unreplicated.
    let lost = plain
        .try_acquire(key, TTL)
        .await
        .expect("unacknowledged grant");
    assert!(lost.fencing_token() > first.fencing_token());

    // The master dies before the replica saw that grant; the replica is promoted.
    cluster.kill(master).expect("kill");
    cluster.resume(replica).expect("resume");
    // Blocks this worker for the promotion (redis-cli and a poll); the store needs none meanwhile.
    cluster.promote(replica).expect("promote");

    // The acknowledged lease survived: a second client is refused it, its holder extends it.
    let contended = retrying(|| other.try_acquire(&held_key, TTL)).await;
    assert!(
        matches!(contended, Err(Error::Busy { .. })),
        "the promoted master must still hold the acknowledged lease: {contended:?}"
    );
    retrying(|| acked.extend(&held))
        .await
        .expect("the holder extends its acknowledged lease on the promoted master");

    // The lock granted without WAIT is gone: a second holder gets it while the first still
    // believes it holds it (it learns at its next extend), and the next token is not above it.
    let after = retrying(|| plain.try_acquire(key, TTL))
        .await
        .expect("a grant on the promoted replica");
    assert!(
        after.fencing_token() <= lost.fencing_token(),
        "without WAIT the unreplicated grant's token {} is lost; the promoted replica minted {}",
        lost.fencing_token(),
        after.fencing_token()
    );
    let stale = plain.extend(&lost).await;
    assert!(stale.as_ref().is_err_and(Error::is_lease_lost), "{stale:?}");
    // Every acknowledged token survived: the new one is above the acknowledged first.
    assert!(after.fencing_token() > first.fencing_token());

    // The held lease is released on the promoted master. The key is free again, but the
    // promoted master has no replica until one rejoins: with min_replicas=1 every grant on its
    // slots is refused meanwhile; without, it gets a greater token.
    let released = acked.release(&held).await.expect("release the held lease");
    assert_eq!(released, ReleaseOutcome::Released);
    let unreplicated = other.try_acquire(&held_key, TTL).await;
    assert!(
        matches!(&unreplicated, Err(Error::Unavailable { message, .. }) if message.contains("min_replicas")),
        "{unreplicated:?}"
    );
    let next = plain
        .try_acquire(&held_key, TTL)
        .await
        .expect("the released key is free");
    assert!(next.fencing_token() > held.fencing_token());
}
