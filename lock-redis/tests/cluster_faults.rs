//! Replica acknowledgement and failover on a real Redis Cluster (3 masters, each with a
//! replica). Every node shares this host's clock, so the fence is first set a day ahead of it:
//! tokens then come from the replicated counter alone, as they would after the promoted
//! replica's clock was set back a day (Debian's redis-server, linked with jemalloc, does not
//! start under libfaketime).

mod common;

use std::time::Duration;

use fencelock_core::{Acquire, Error, Release};
use test_servers::RedisServer;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_refuses_unacknowledged_grants_and_keeps_tokens_across_a_failover() {
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
    let key = "failover";
    let slot = cluster.keyslot("fencelock:{failover}:fence").expect("slot");
    let master = cluster.master_of_slot(slot).expect("master");
    let replica = cluster.replica_of(master).expect("replica");

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
    assert_eq!(released, fencelock_core::ReleaseOutcome::Released);

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

    // The lock granted without WAIT is gone, and the next token is not above it.
    let mut after = None;
    for _ in 0..100 {
        match plain.try_acquire(key, TTL).await {
            Ok(lease) => {
                after = Some(lease);
                break;
            }
            Err(error) if error.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(error) => panic!("{error}"),
        }
    }
    let after = after.expect("a grant on the promoted replica");
    assert!(
        after.fencing_token() <= lost.fencing_token(),
        "without WAIT the unreplicated grant's token {} is lost; the promoted replica minted {}",
        lost.fencing_token(),
        after.fencing_token()
    );
    // Every acknowledged token survived: the new one is above the acknowledged first.
    assert!(after.fencing_token() > first.fencing_token());
}
