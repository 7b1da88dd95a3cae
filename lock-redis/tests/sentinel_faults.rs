//! Failover on a real Redis Sentinel deployment (a master, two replicas, three sentinels), one
//! per test: the master killed after its replicas were cut off, with their clocks a day behind
//! (see `cluster_faults.rs` for why the clock must be behind, and how it is moved); the master
//! paused past the sentinels' `down-after-milliseconds`; and `SENTINEL FAILOVER` with a
//! sentinel down. Each shows what the crate docs' *Redis Sentinel* table says: an acknowledged
//! lease kept with `min_replicas`, tokens growing, the loss signalled where a lease is lost,
//! and the new master found within the stated bound.

mod common;

use std::time::{Duration, Instant};

use fencelock_core::{Error, LockStore, LockStoreExt, ReleaseOutcome};
use test_servers::{RedisSentinel, SentinelOptions, DOWN_AFTER};

const TTL: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

/// [`common::retrying`] 300 times (up to 30 s).
async fn retrying<T, F, Fut>(attempt: F) -> fencelock_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fencelock_core::Result<T>>,
{
    common::retrying(300, attempt).await
}

async fn start(options: SentinelOptions) -> RedisSentinel {
    tokio::task::spawn_blocking(move || RedisSentinel::start(options))
        .await
        .expect("join")
        .expect("a Sentinel deployment")
}

/// Runs `work` on the deployment on a blocking thread (redis-cli and polls).
async fn blocking<T: Send + 'static>(
    deployment: &std::sync::Arc<std::sync::Mutex<RedisSentinel>>,
    work: impl FnOnce(&mut RedisSentinel) -> T + Send + 'static,
) -> T {
    let deployment = deployment.clone();
    tokio::task::spawn_blocking(move || work(&mut deployment.lock().expect("deployment")))
        .await
        .expect("join")
}

/// The data nodes but `master`.
fn replicas_of(deployment: &RedisSentinel, master: u16) -> Vec<u16> {
    deployment
        .data_ports()
        .into_iter()
        .filter(|port| *port != master)
        .collect()
}

fn time_s(deployment: &RedisSentinel, port: u16) -> u64 {
    let answer = deployment.query(port, &["TIME"]).expect("TIME");
    answer
        .lines()
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("TIME on {port} answered {answer:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_keeps_acknowledged_locks_and_tokens_across_a_killed_master_and_plain_grants_can_be_lost(
) {
    let deployment = start(SentinelOptions {
        replica_clock_back: Some(DAY),
        ..SentinelOptions::default()
    })
    .await;
    let url = deployment.url();
    let acked = common::store(
        &url,
        "min_replicas=1&replica_timeout=300ms&command_timeout=3s",
    )
    .await;
    let plain = common::store(&url, "command_timeout=3s").await;
    let other = common::store(&url, "min_replicas=1&command_timeout=3s").await;
    let master = deployment.master().expect("master");
    let replicas = replicas_of(&deployment, master);
    let (on_master, on_replica) = (
        time_s(&deployment, master),
        time_s(&deployment, replicas[0]),
    );
    let behind = on_master - on_replica;
    assert!(
        (DAY.as_secs() - 60..=DAY.as_secs() + 60).contains(&behind),
        "the replica's TIME is {on_replica}, its master's {on_master}: {behind} s behind, not a day"
    );

    let first = acked
        .try_acquire("failover", TTL)
        .await
        .expect("acknowledged");
    assert_eq!(
        acked.release(&first).await.expect("release"),
        ReleaseOutcome::Released
    );
    let held = acked
        .try_acquire("held", TTL)
        .await
        .expect("acknowledged, held");

    // Both replicas frozen and cut off: the grant is not acknowledged, so it is refused.
    for replica in &replicas {
        deployment.pause(*replica).expect("pause");
    }
    deployment
        .query(master, &["CLIENT", "KILL", "TYPE", "replica"])
        .expect("cut the replicas off");
    let refused = acked.try_acquire("failover", TTL).await;
    assert!(
        matches!(&refused, Err(Error::Unavailable { message, .. }) if message.contains("min_replicas")),
        "{refused:?}"
    );
    let lost = plain
        .try_acquire("failover", TTL)
        .await
        .expect("unacknowledged grant");
    assert!(lost.fencing_token() > first.fencing_token());

    // The master dies before a replica saw that grant; the sentinels promote one.
    let deployment = std::sync::Arc::new(std::sync::Mutex::new(deployment));
    let promoted = blocking(&deployment, move |d| {
        d.kill(master).expect("kill");
        for replica in &replicas {
            d.resume(*replica).expect("resume");
        }
        d.wait_master_other_than(master, Duration::from_secs(60))
            .expect("a promoted replica")
    })
    .await;

    // The acknowledged lease survived, and its holder extends it on the promoted master.
    let contended = retrying(|| other.try_acquire("held", TTL)).await;
    assert!(
        matches!(contended, Err(Error::Busy { .. })),
        "the promoted master must still hold the acknowledged lease: {contended:?}"
    );
    let pttl: u64 = blocking(&deployment, move |d| {
        d.query(promoted, &["PTTL", "fencelock:{held}:lock"])
            .expect("PTTL")
    })
    .await
    .trim()
    .parse()
    .expect("a PTTL");
    assert!(
        pttl > DAY.as_millis() as u64,
        "the held lease expires in {pttl} ms on the promoted master, whose clock is a day behind"
    );
    retrying(|| acked.extend(&held))
        .await
        .expect("the holder extends its acknowledged lease on the promoted master");

    // The unacknowledged grant is gone: its holder learns at its next extend, and the next
    // token is minted from the replicated fence (the promoted master's TIME is a day below).
    let after = retrying(|| plain.try_acquire("failover", TTL))
        .await
        .expect("a grant on the promoted master");
    let stale = plain.extend(&lost).await;
    assert!(stale.as_ref().is_err_and(Error::is_lease_lost), "{stale:?}");
    assert!(
        after.fencing_token() <= lost.fencing_token(),
        "the unreplicated grant's token {} is lost; the promoted master minted {}",
        lost.fencing_token(),
        after.fencing_token()
    );
    assert_eq!(after.fencing_token(), first.fencing_token() + 1);

    // The other replica follows the new master: acknowledged grants resume, tokens growing.
    assert_eq!(
        acked.release(&held).await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = retrying(|| other.try_acquire("held", TTL))
        .await
        .expect("acknowledged again once the other replica follows the new master");
    assert!(next.fencing_token() > held.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_is_replaced_within_the_bound_the_acknowledged_lease_kept_and_a_lost_one_outgrown(
) {
    let deployment = start(SentinelOptions::default()).await;
    let url = deployment.url();
    // The bound the crate docs state: one command timeout (a command already sent to the
    // paused master) and one connect timeout (asking the sentinels, connecting, ROLE).
    let (command_timeout, connect_timeout) = (Duration::from_secs(1), Duration::from_secs(2));
    let timeouts = format!(
        "command_timeout={}ms&connect_timeout={}ms",
        command_timeout.as_millis(),
        connect_timeout.as_millis()
    );
    let connect = |options: String| {
        let url = common::with_options(&url, &options);
        async move {
            fencelock_redis::RedisStore::connect(
                fencelock_redis::RedisConfig::from_url(&url).expect("config"),
            )
            .await
            .expect("connect")
        }
    };
    let store = connect(format!("min_replicas=1&replica_timeout=300ms&{timeouts}")).await;
    let plain = connect(timeouts.clone()).await;
    let held = store.try_acquire("held", TTL).await.expect("acknowledged");
    let master = deployment.master().expect("master");
    let replicas = replicas_of(&deployment, master);

    // A grant no replica gets: the replicas frozen and cut off, then the master frozen.
    for replica in &replicas {
        deployment.pause(*replica).expect("pause");
    }
    deployment
        .query(master, &["CLIENT", "KILL", "TYPE", "replica"])
        .expect("cut the replicas off");
    let lost = plain
        .try_acquire("lost", TTL)
        .await
        .expect("unacknowledged grant");
    let deployment = std::sync::Arc::new(std::sync::Mutex::new(deployment));
    blocking(&deployment, move |d| {
        d.pause(master).expect("pause");
        for replica in &replicas {
            d.resume(*replica).expect("resume");
        }
    })
    .await;
    // A command in flight to the paused master runs out its command timeout.
    let frozen = store.extend(&held).await;
    assert!(
        matches!(frozen, Err(Error::Unavailable { .. })),
        "an extend on the paused master: {frozen:?}"
    );
    let promoted = blocking(&deployment, move |d| {
        d.wait_master_other_than(master, DOWN_AFTER * 10)
            .expect("a promoted replica")
    })
    .await;
    let named = Instant::now();
    retrying(|| store.extend(&held))
        .await
        .expect("the acknowledged lease extends on the promoted master");
    let took = named.elapsed();
    // One retry interval (100 ms) above the bound, for the attempt that found it.
    let bound = command_timeout + connect_timeout + Duration::from_millis(100);
    assert!(
        took <= bound,
        "the store reached the promoted master {took:?} after the sentinels named it (bound {bound:?})"
    );

    // The unacknowledged grant is gone; its holder learns at its next extend, and the next
    // holder's token is greater, minted from the promoted replica's clock (this host's).
    let after = retrying(|| plain.try_acquire("lost", TTL))
        .await
        .expect("the lost key is free on the promoted master");
    assert!(
        after.fencing_token() > lost.fencing_token(),
        "the promoted master minted {} after the lost {}",
        after.fencing_token(),
        lost.fencing_token()
    );
    let stale = plain.extend(&lost).await;
    assert!(stale.as_ref().is_err_and(Error::is_lease_lost), "{stale:?}");

    // The old master comes back and is made a replica: the store stays on the new master.
    blocking(&deployment, move |d| d.resume(master).expect("resume")).await;
    let busy = plain.try_acquire("held", TTL).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    assert_eq!(
        store.release(&held).await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = plain.try_acquire("held", TTL).await.expect("free again");
    assert!(next.fencing_token() > held.fencing_token());
    let on_promoted = blocking(&deployment, move |d| {
        d.query(promoted, &["EXISTS", "fencelock:{held}:lock"])
            .expect("EXISTS")
    })
    .await;
    assert_eq!(
        on_promoted.trim(),
        "1",
        "the new grant is on the promoted master"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_rides_out_sentinel_failover_with_a_sentinel_down() {
    let mut deployment = start(SentinelOptions::default()).await;
    // The first sentinel of the URL is down for good: discovery asks past it.
    let first = deployment.sentinel_ports()[0];
    deployment.kill(first).expect("kill a sentinel");
    let url = deployment.url();
    let store = std::sync::Arc::new(
        common::store(
            &url,
            "min_replicas=1&replica_timeout=300ms&command_timeout=2s",
        )
        .await,
    );
    let ttl = Duration::from_secs(6);
    let guard = store.lock("kept").ttl(ttl).acquire().await.expect("lock");
    let token = guard.fencing_token();
    let old = deployment.master().expect("master");

    let deployment = std::sync::Arc::new(std::sync::Mutex::new(deployment));
    let new = blocking(&deployment, |d| d.failover().expect("SENTINEL FAILOVER")).await;
    assert_ne!(new, old);
    // Held past a TTL after the switch: only extends on the new master can have kept it.
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert!(
        !guard.is_lost(),
        "the kept lease was lost across the failover"
    );
    let other = common::store(&url, "").await;
    let busy = other.try_acquire("kept", TTL).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    // Past a TTL after the switch, so extends on the new master kept it there (the old
    // master may still say it is one: the sentinels demote it seconds later).
    let on_new = blocking(&deployment, move |d| {
        d.query(new, &["EXISTS", "fencelock:{kept}:lock"])
            .expect("EXISTS")
    })
    .await;
    assert_eq!(on_new.trim(), "1", "the lease lives on the new master");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = other.try_acquire("kept", TTL).await.expect("free");
    assert!(next.fencing_token() > token);
}
