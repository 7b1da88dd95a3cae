//! Replica acknowledgement and failover on a real Redis Cluster (3 masters, each with a
//! replica): a master is killed after its replica was cut off, and the replica is promoted.
//!
//! # The promoted replica's clock is a day behind
//!
//! Every node shares this host's clock, so a token minted from `TIME` alone would pass a
//! monotonicity test across any failover: the replica promoted here runs with its wall clock a
//! day behind every other node's ([`RedisCluster::start_with_replica_clock_back`]), so that
//! only the replicated fence can keep its tokens above those acknowledged before the failover.
//! The test checks that its `TIME` is a day behind its master's, and that a lease replicated
//! to it expires by its own clock (a day later than its master would have expired it).
//!
//! The clock is moved by a small preloaded library of `test-servers` (`clock_shim.rs`: it
//! overrides `clock_gettime` for the wall clocks, `gettimeofday` and `time`, and asks the
//! kernel directly), not by Debian's `faketime`, which an earlier report named: with Debian's packages
//! (bookworm: `redis-server` 7.0.15, linked with the shared `libjemalloc.so.2` 5.3.0, and
//! `libfaketime` 0.9.10) the server never starts under it. Every variant tried (`faketime -f
//! -1d`, an absolute date, `LD_PRELOAD` of `libfaketime.so.1` and `libfaketimeMT.so.1` with
//! `FAKETIME=-1d`, each with `DONT_FAKE_MONOTONIC=1`, `FAKETIME_NO_CACHE=1` or
//! `FAKETIME_FORCE_MONOTONIC_FIX=0`) prints libfaketime's "Cannot recover from unexpected
//! recursive calls to clock_gettime()" and hangs before it listens: the first `malloc` starts
//! jemalloc's initialisation, which reads `clock_gettime(CLOCK_MONOTONIC)`; libfaketime then
//! initialises itself, and its failed `dlsym(RTLD_NEXT, "__ftime")` (glibc 2.36 has none)
//! makes glibc `malloc` the error message, re-entering jemalloc inside its own initialisation
//! (wolfcw/libfaketime issues 130, 327 and 478). Helpers preloaded to answer those look-ups or
//! the monotonic clocks only moved the deadlock (libfaketime's `sem_open` and its
//! `pthread_cond_init` wrapper `malloc` too), and redis calls jemalloc's own `mallctl`, so no
//! other allocator can be preloaded in its place. The shim has none of that: no `malloc`, no
//! `dlsym`, and the offset read with `getenv` on first use.
//!
//! With that clock, an acquire script that returned `max(fence + 1, TIME)` but wrote back only
//! `fence + 1` fails here: the promoted replica's fence would be far below the acknowledged
//! token, and its `TIME` a day below it.

mod common;

use std::time::Duration;

use fencelock_core::{Error, LockStore, ReleaseOutcome};
use test_servers::RedisCluster;

const TTL: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

/// The node's `TIME`, in whole seconds.
fn time_s(cluster: &RedisCluster, port: u16) -> u64 {
    let answer = cluster.query(port, &["TIME"]).expect("TIME");
    answer
        .lines()
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("TIME on {port} answered {answer:?}"))
}

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

/// [`common::retrying`] 100 times (up to 10 s).
async fn retrying<T, F, Fut>(attempt: F) -> fencelock_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fencelock_core::Result<T>>,
{
    common::retrying(100, attempt).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_keeps_acknowledged_locks_and_tokens_across_a_failover_and_plain_grants_can_be_lost(
) {
    let mut cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start_with_replica_clock_back(3, 1, DAY))
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
    // The first master's replica runs a day behind.
    let master = cluster.ports()[0];
    let replica = cluster.replica_of(master).expect("replica");
    assert_eq!(replica, cluster.ports()[3]);
    let key = key_on(&cluster, master, "failover");
    let held_key = key_on(&cluster, master, "held");

    // Its TIME is a day behind its master's (and this host's).
    let (on_master, on_replica) = (time_s(&cluster, master), time_s(&cluster, replica));
    let behind = on_master - on_replica;
    assert!(
        (DAY.as_secs() - 60..=DAY.as_secs() + 60).contains(&behind),
        "the replica's TIME is {on_replica}, its master's {on_master}: {behind} s behind, not a day"
    );

    // Acknowledged: granted.
    let first = acked
        .try_acquire(&key, TTL)
        .await
        .expect("acknowledged grant");
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
    let refused = acked.try_acquire(&key, TTL).await;
    assert!(
        matches!(&refused, Err(Error::Unavailable { message, .. }) if message.contains("min_replicas")),
        "{refused:?}"
    );
    // Without WAIT the same grant is handed out, unreplicated.
    let lost = plain
        .try_acquire(&key, TTL)
        .await
        .expect("unacknowledged grant");
    assert!(lost.fencing_token() > first.fencing_token());

    // The master dies before the replica saw that grant; the replica is promoted.
    cluster.kill(master).expect("kill");
    cluster.resume(replica).expect("resume");
    // Blocks this worker for the promotion (redis-cli and a poll); the store needs none meanwhile.
    cluster.promote(replica).expect("promote");

    // The acknowledged lease survived: a second client is refused it.
    let contended = retrying(|| other.try_acquire(&held_key, TTL)).await;
    assert!(
        matches!(contended, Err(Error::Busy { .. })),
        "the promoted master must still hold the acknowledged lease: {contended:?}"
    );
    // Replicated with its master's absolute expiry, which the promoted master reads on its own
    // clock: the lease has a day more to live there.
    let pttl: u64 = cluster
        .query(
            replica,
            &["PTTL", &format!("fencelock:{{{held_key}}}:lock")],
        )
        .expect("PTTL")
        .trim()
        .parse()
        .expect("a PTTL");
    assert!(
        pttl > DAY.as_millis() as u64,
        "the held lease expires in {pttl} ms on the promoted master"
    );
    // The promoted master has no replica: an extend needs min_replicas acknowledgements as a
    // grant does, so it is refused and the lease keeps its deadline (a day more to live here).
    let mut left = 100;
    let unacknowledged = loop {
        match acked.extend(&held).await {
            Err(Error::Unavailable { message, .. })
                if !message.contains("min_replicas") && left > 0 =>
            {
                left -= 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => break answer,
        }
    };
    assert!(
        matches!(&unacknowledged, Err(Error::Unavailable { message, .. }) if message.contains("min_replicas")),
        "an extend no replica can acknowledge: {unacknowledged:?}"
    );

    // The lock granted without WAIT is gone: a second holder gets it while the first still
    // believes it holds it (it learns at its next extend), and the next token is not above it.
    let after = retrying(|| plain.try_acquire(&key, TTL))
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
    // Every acknowledged token survived: the new one is above the acknowledged first, minted
    // from the replicated fence (the promoted master's TIME is a day below it).
    assert!(
        after.fencing_token() > first.fencing_token(),
        "the promoted replica minted {} after the acknowledged {}",
        after.fencing_token(),
        first.fencing_token()
    );
    assert_eq!(after.fencing_token(), first.fencing_token() + 1);

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
