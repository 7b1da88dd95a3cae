//! A stopped etcd leader, resumed after longer than a TTL, against locks kept alive meanwhile
//! through the new leader (the nemesis run's `etcd-stop-minority` finding).
//!
//! Root cause, outside this crate: an etcd server before 3.4.31 / 3.5.13 (fixed in those
//! releases) revokes, when a stalled leader runs again, every lease
//! that looks expired to its own lessor; the revoke proposals are forwarded to the new leader
//! and committed, deleting entries whose renewals etcd had confirmed. No client request can
//! prevent it, so this test pins what the client owes in both cases: on a fixed server, every
//! lease survives; on an affected one, every lock it frees is reported lost to its holder and
//! the next holder gets a greater token.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::store;
use fencelock_core::{Error, KeepAlive, LockStore, ReleaseOutcome};
use test_servers::EtcdCluster;
use tokio::time::{sleep, timeout};

#[test]
fn affected_etcd_versions() {
    for (version, affected) in [
        ("3.4.23", true),
        ("3.4.30", true),
        ("3.4.31", false),
        ("3.5.12", true),
        ("3.5.13", false),
        ("3.6.0", false),
        ("3.3.27", true),
    ] {
        assert_eq!(
            fencelock_etcd::stale_leader_revokes_leases(version),
            affected,
            "{version}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_leader_frees_no_kept_lock_or_tells_its_holder() {
    let cluster = EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let version = {
        let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("a raw client");
        client.status().await.expect("status").version().to_owned()
    };
    let affected = fencelock_etcd::stale_leader_revokes_leases(&version);
    // TTL 3 s, renewed every 750 ms by KeepAlive; a renewal stuck behind the stopped leader is
    // given up after the 1 s command timeout, so the holders ride through the election.
    let ttl = Duration::from_secs(3);
    let stopped = Duration::from_secs(4);
    let (mut kept_locks, mut freed) = (0, 0);
    for round in 0..4 {
        let leader = cluster.leader().expect("a leader");
        // Only the followers' endpoints: every renewal reaches the new leader, none is
        // answered by the stopped member itself.
        let followers: Vec<String> = (cluster.endpoints().into_iter().enumerate())
            .filter_map(|(i, endpoint)| (i != leader).then_some(endpoint))
            .collect();
        let url = format!("etcd://{}", followers.join(","));
        let holder = Arc::new(store(&url, "&command_timeout=1").await);
        let other = store(&url, "").await;
        let mut kept = Vec::new();
        for k in 0..4 {
            let key = format!("stopped-leader:{round}:{k}");
            let lease = holder.try_acquire(&key, ttl).await.expect("acquire");
            kept.push((key, KeepAlive::start(holder.clone(), lease)));
        }
        sleep(Duration::from_millis(200)).await;

        cluster.pause(leader).expect("SIGSTOP the leader");
        sleep(stopped).await;
        for (key, keep) in &kept {
            assert!(
                !keep.is_lost(),
                "{key} was lost while the new leader kept it: {:?}",
                keep.lost_reason()
            );
        }
        cluster.resume(leader).expect("SIGCONT the leader");
        // The stale leader's revokes, if any, land within moments; a TTL covers the holders'
        // next extends.
        sleep(ttl).await;

        for (key, keep) in kept {
            let tried = timeout(Duration::from_secs(20), other.try_acquire(&key, ttl))
                .await
                .expect("try_acquire after the resume hung");
            if keep.is_lost() {
                // Freed early: the holder was told, and whoever takes the key fences it out.
                freed += 1;
                let lease = keep.stop().await;
                let next = tried.expect("a freed key is free");
                assert!(next.fencing_token() > lease.fencing_token());
                assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
                assert_eq!(
                    other.release(&next).await.unwrap(),
                    ReleaseOutcome::Released
                );
            } else {
                kept_locks += 1;
                assert!(
                    matches!(tried, Err(Error::Busy { .. })),
                    "{key}: its holder was not told, yet another handle got {tried:?}"
                );
                let lease = keep.stop().await;
                assert_eq!(
                    holder.release(&lease).await.unwrap(),
                    ReleaseOutcome::Released
                );
            }
        }
    }
    println!("etcd {version}: {kept_locks} locks kept, {freed} freed early by the resumed leader");
    if !affected {
        assert_eq!(
            freed, 0,
            "etcd {version} freed kept locks after a leader stop"
        );
    }
}
