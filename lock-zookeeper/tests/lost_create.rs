//! A lock node's create whose reply is lost, the session reconnecting to a follower that has
//! not yet applied it: the acquisition must leave no node of its own behind, so once its lease
//! is released the key is free for everyone else.
//!
//! The ensemble's followers reach the leader through relays that delay every byte by
//! [`DELAY`], so the leader commits the create only once a follower's acknowledgement came
//! back, two delays after it proposed it, and the follower the client moves to applies it a
//! delay later still. The client's own way to the leader is a relay that is severed once the
//! leader holds the create, so its reply is lost and the client reconnects at once, to that
//! follower, which revalidates the session with the leader (two delays) before the commit
//! reaches it (three delays).

mod common;

use std::time::Duration;

use fencelock_core::{LockStore, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::zookeeper::TICK;
use test_servers::{FreezableRelay, ZookeeperEnsemble};
use tokio::task::block_in_place;
use tokio::time::{sleep, Instant};
use zookeeper_client as zk;

/// The holder's TTL, and so its session: long enough that the client's connection timeout on
/// the follower (2/5 of the session, 1.6 s) outlasts the follower's revalidation of the
/// session with the leader (two delays), and that a grant made at once still has validity
/// left after three creates of four delays each (the lost one, the one after it, and one the
/// token offset may redo).
const TTL: Duration = Duration::from_secs(4);
/// The delay of each follower's quorum traffic, each way: longer than the store's longest
/// pause between retries of a read on a reconnected session (50 ms) and a loopback round
/// trip, so the read after the reconnection reaches the follower before the commit does.
const DELAY: Duration = Duration::from_millis(150);

async fn own_ensemble() -> ZookeeperEnsemble {
    tokio::task::spawn_blocking(|| ZookeeperEnsemble::start_with_quorum_relays(3))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A handle on `url` whose session of [`TTL`] (opened by a first lease, released) is served by
/// member `wanted`. The client picks a server at random among the URL's two, so handles are
/// made until one lands there (fifty all missing: below 10⁻¹⁵).
async fn handle_on(ensemble: &ZookeeperEnsemble, url: &str, wanted: usize) -> ZookeeperStore {
    for _ in 0..50 {
        let store = common::store(url, "").await;
        let lease = store
            .try_acquire("lost-create:warm-up", TTL)
            .await
            .expect("a free key");
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        let serving = block_in_place(|| ensemble.members_serving_timeout(TTL));
        if serving == [wanted] {
            return store;
        }
        drop((store, lease));
        let started = Instant::now();
        while !block_in_place(|| ensemble.members_serving_timeout(TTL)).is_empty() {
            assert!(
                started.elapsed() < TTL * 2,
                "a dropped handle's session is still served"
            );
            sleep(TICK).await;
        }
    }
    panic!("no handle of 50 had its session served by member {wanted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_reply_was_lost_leaves_no_node_behind_on_a_follower_kept_behind() {
    let ensemble = own_ensemble().await;
    let leader = block_in_place(|| ensemble.leader()).expect("a leader");
    let followers: Vec<usize> = (0..3).filter(|&m| m != leader).collect();
    let behind = followers[0];
    let endpoints = ensemble.endpoints();
    let to_leader = FreezableRelay::start(&endpoints[leader]).expect("a relay");
    let url = format!("zookeeper://{},{}", to_leader.address(), endpoints[behind]);
    let key = "lost-create";
    // The key's container made beforehand, with a child that is no lock node (the queue
    // ignores it) so the server never sweeps it: the create is then the one multi.
    let raw = common::raw(&ensemble.url()).await;
    let container = format!("{}/{key}", fencelock_zookeeper::DEFAULT_PREFIX);
    let container_node = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let keeper = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    raw.mkdir(fencelock_zookeeper::DEFAULT_PREFIX, &keeper)
        .await
        .or_else(|e| match e {
            zk::Error::NodeExists => Ok(()),
            e => Err(e),
        })
        .expect("the prefix");
    raw.create(&container, &[], &container_node)
        .await
        .expect("the key's container");
    raw.create(&format!("{container}/not-a-lock-node"), &[], &keeper)
        .await
        .expect("a child that keeps the container");
    // Last: its warm-up create is the fresh token hint of the next (no redo for the offset).
    let holder = handle_on(&ensemble, &url, leader).await;

    for &follower in &followers {
        block_in_place(|| ensemble.delay_quorum(follower, DELAY)).expect("delay a follower");
    }
    let acquiring = tokio::spawn(async move {
        let acquired = holder.acquire(key, TTL, TTL * 3).await;
        (acquired, holder)
    });
    // The leader holds the create until a follower acknowledges it, two delays after it
    // proposed it: sever the client's connection to the leader within that.
    let started = Instant::now();
    while block_in_place(|| ensemble.outstanding_requests(leader)).unwrap_or(0) == 0 {
        assert!(
            started.elapsed() < TTL && !acquiring.is_finished(),
            "the leader never held the create while the test looked"
        );
        sleep(Duration::from_millis(2)).await;
    }
    to_leader.sever();
    let (acquired, holder) = acquiring.await.expect("join");
    for &follower in &followers {
        block_in_place(|| ensemble.delay_quorum(follower, Duration::ZERO)).expect("no delay");
    }
    println!("the acquisition after its lost create: {acquired:?}");
    if let Ok(lease) = &acquired {
        assert_eq!(
            holder.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }

    let other = common::store(&ensemble.url(), "").await;
    let next = other.try_acquire(key, TTL).await;
    raw.sync(&container).await.expect("sync");
    let left = raw.list_children(&container).await;
    assert!(
        next.is_ok(),
        "another handle could not take the key after the holder's acquisition ended ({:?}): \
         {next:?}; the key's lock nodes: {left:?}",
        acquired.as_ref().map(|_| "granted and released")
    );
    acquired.expect("the acquisition is granted after its create's lost reply");
    if let Ok(lease) = next {
        assert_eq!(
            other.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    drop(holder);
}
