//! A follower cut off from the quorum right after its holders' extends. Only the leader
//! expires sessions, and it hears of a follower's sessions only in the follower's replies to
//! its pings (every half tick), not from the requests the follower forwards: the leader must
//! not let a waiter of its own in before the local deadline of any holder behind the cut
//! follower (the crate docs, "TTLs, sessions and loss").
//!
//! Each cut checks [`HOLDERS`] holders, each idle for a different part of two ticks before
//! its extend (so the leader's last word of its session is that much older, before the fix),
//! and the cuts are [`ROUNDS`] rounds a quarter tick apart in phase, so the leader's expiry,
//! rounded up to its next tick, falls at every quarter of a tick after the extends.

mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Lease, LockStore, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::zookeeper::TICK;
use test_servers::ZookeeperEnsemble;
use tokio::task::block_in_place;
use tokio::time::{sleep, sleep_until, Instant};

/// The holders' TTL, and so their session: nine ticks, below the `syncLimit` of ten ticks
/// after which a follower that hears nothing from its leader stops serving (its clients
/// would then see the cut).
const TTL: Duration = Duration::from_millis(900);
/// Holders per cut, taking their keys a quarter tick apart.
const HOLDERS: u32 = 8;
/// Cuts, a quarter tick apart in phase.
const ROUNDS: u32 = 4;

async fn own_ensemble() -> ZookeeperEnsemble {
    tokio::task::spawn_blocking(|| ZookeeperEnsemble::start_with_quorum_relays(3))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The first instant at least three ticks from now that is `phase` past `origin` plus a
/// whole number of ticks.
fn in_phase(origin: Instant, phase: Duration) -> Instant {
    let earliest = Instant::now() + TICK * 3;
    let ticks = (earliest - origin).as_nanos().div_ceil(TICK.as_nanos());
    origin + phase + TICK * u32::try_from(ticks).expect("a test's length in ticks")
}

/// One cut: holders on `follower` take their keys, a quarter tick apart, extend together at
/// `extend_at`, and the follower is cut off from the quorum; a waiter on the leader queues
/// behind each. Returns every holder whose waiter was granted the key before the holder's
/// local deadline.
async fn cut_round(
    ensemble: &ZookeeperEnsemble,
    follower: usize,
    on_follower: &str,
    waiter: &Arc<ZookeeperStore>,
    round: u32,
    origin: Instant,
) -> Vec<String> {
    let mut holders = Vec::new();
    for _ in 0..HOLDERS {
        let holder = common::store(on_follower, "").await;
        // The session of the TTL opened beforehand: the round's acquire is one create.
        let warm_up = holder
            .try_acquire("follower-cut:warm-up", TTL)
            .await
            .expect("a free key");
        assert_eq!(
            holder.release(&warm_up).await.expect("release"),
            ReleaseOutcome::Released
        );
        holders.push(Arc::new(holder));
    }
    let extend_at = in_phase(origin, TICK * round / ROUNDS);
    let taking: Vec<_> = (0..HOLDERS)
        .map(|k| {
            let holder = holders[k as usize].clone();
            tokio::spawn(async move {
                sleep_until(extend_at - TICK * k / 4).await;
                let key = format!("follower-cut:{round}:{k}");
                let lease = holder.try_acquire(&key, TTL).await.expect("a free key");
                (holder, lease)
            })
        })
        .collect();
    let mut leases: Vec<(Arc<ZookeeperStore>, Lease)> = Vec::new();
    let mut waiting = Vec::new();
    for taken in taking {
        let (holder, lease) = taken.await.expect("join");
        let (waiter, key) = (waiter.clone(), lease.key().to_owned());
        waiting.push(tokio::spawn(async move {
            let next = waiter.acquire(&key, TTL, TTL * 10).await;
            (next, Instant::now())
        }));
        leases.push((holder, lease));
    }
    sleep_until(extend_at).await;
    let extends: Vec<_> = leases
        .iter()
        .map(|(holder, lease)| {
            let (holder, lease) = (holder.clone(), lease.clone());
            tokio::spawn(async move { holder.extend(&lease).await })
        })
        .collect();
    for extend in extends {
        extend.await.expect("join").expect("the extend");
    }
    block_in_place(|| ensemble.isolate(follower, true)).expect("cut the follower");
    let cut_at = Instant::now();
    let mut early = Vec::new();
    for ((_, lease), waiting) in leases.iter().zip(waiting) {
        let (next, granted_at) = waiting.await.expect("join");
        let next = next.expect("the waiter gets the key once the holder's session expires");
        println!(
            "round {round}, {}: deadline {:?} after the cut, granted to the waiter {:?} after",
            lease.key(),
            lease.valid_until().saturating_duration_since(cut_at),
            granted_at - cut_at,
        );
        if granted_at < lease.valid_until() {
            early.push(format!(
                "{}: the waiter was granted the key {:?} before the holder's deadline",
                lease.key(),
                lease.valid_until() - granted_at
            ));
        }
        let _ = waiter.release(&next).await;
    }
    block_in_place(|| ensemble.isolate(follower, false)).expect("mend the cut");
    early
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_waiter_on_the_leader_is_granted_before_the_deadline_of_a_holder_behind_a_cut_follower()
{
    let ensemble = own_ensemble().await;
    let leader = block_in_place(|| ensemble.leader()).expect("a leader");
    let follower = (0..3).find(|&m| m != leader).expect("a follower");
    let endpoints = ensemble.endpoints();
    // The holders can reach the follower only, and the waiter the leader only.
    let on_follower = format!("zookeeper://{}", endpoints[follower]);
    let waiter = Arc::new(common::store(&format!("zookeeper://{}", endpoints[leader]), "").await);
    let mut early = Vec::new();
    let origin = Instant::now();
    for round in 0..ROUNDS {
        // The follower may have noticed the last cut (a loaded machine) and be rejoining.
        while !block_in_place(|| ensemble.is_serving(follower)) {
            sleep(TICK).await;
        }
        let cut = cut_round(&ensemble, follower, &on_follower, &waiter, round, origin);
        early.extend(cut.await);
    }
    assert!(early.is_empty(), "{early:#?}");
}
