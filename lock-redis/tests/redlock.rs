//! The whole conformance suite against Redlock over five real, independent redis-servers.

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedlockConfig, RedlockStore};
use test_servers::{closed_ports, shared};

/// The five shared masters of this test process.
fn redlock_url() -> String {
    let hosts: Vec<String> = shared::redis_masters(5)
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    // Generous per-node timeouts: the cases run in parallel on a loaded machine.
    format!(
        "redlock://{}?connect_timeout=30s&command_timeout=2s",
        hosts.join(",")
    )
}

async fn store(url: &str) -> RedlockStore {
    RedlockStore::connect(RedlockConfig::from_url(url).expect("config"))
        .await
        .expect("connect")
}

struct RedlockFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for RedlockFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(store(&self.url).await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let hosts: Vec<String> = closed_ports(3)
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let url = format!(
            "redlock://{}?connect_timeout=1s&command_timeout=1s",
            hosts.join(",")
        );
        Arc::new(
            RedlockStore::connect_lazy(RedlockConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

fencelock_conformance::conformance_tests!(async {
    Arc::new(RedlockFactory { url: redlock_url() })
});

/// `drift_factor` widens the margin taken off the lease's validity (and the extend's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_factor_shortens_the_local_deadline() {
    use fencelock_core::{Instant, LockStore};
    use std::time::Duration;

    let store = store(&format!("{}&drift_factor=0.5", redlock_url())).await;
    let ttl = Duration::from_secs(10);
    let lease = store
        .try_acquire("redlock:drift-factor", ttl)
        .await
        .expect("acquire");
    let answered = Instant::now();
    // Validity = TTL − elapsed − (TTL × 0.5 + 2 ms), counted from before the request: at
    // most 4.998 s after the answer (fencelock-core's own margin would leave 9.898 s).
    let margin = ttl / 2 + Duration::from_millis(2);
    assert!(
        lease.valid_until() <= answered + (ttl - margin),
        "the deadline is {:?} past the answer, more than TTL − drift",
        lease.valid_until() - answered
    );
    let first = lease.valid_until();
    store.extend(&lease).await.expect("extend");
    assert!(lease.valid_until() > first, "the extend moved the deadline");
    assert!(
        lease.valid_until() <= Instant::now() + (ttl - margin),
        "the extend kept the wider margin"
    );
    let _ = store.release(&lease).await.expect("release");
}

/// The key's waiter queue on each node: while a waiter is queued, a request that does not
/// wait is refused even though the lock is gone (deleted here without a release, so the waiter
/// is not woken and stays queued until its next round), and the waiter gets the key; a wait
/// that times out withdraws its entries, so the key is free for others at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_before_requests_that_do_not_wait_and_withdraw_when_they_give_up() {
    use fencelock_core::{Error, LockStore};
    use std::time::{Duration, Instant};

    let (holder, waiter) = (store(&redlock_url()).await, store(&redlock_url()).await);
    let key = "redlock:queue-order";
    let (lock, queue) = (
        format!("fencelock:{{{key}}}:lock"),
        format!("fencelock:{{{key}}}:queue"),
    );
    let ttl = Duration::from_secs(30);
    let mut nodes = admin_connections().await;

    // A wait that runs out leaves no entry on a quorum: the key is free for try_acquire.
    let held = holder.try_acquire(key, ttl).await.expect("acquire");
    match waiter.acquire(key, ttl, Duration::from_millis(100)).await {
        Err(Error::WaitTimedOut { .. }) => {}
        other => panic!("expected a timed-out wait, got {other:?}"),
    }
    let mut withdrawn = 0;
    for node in &mut nodes {
        withdrawn += usize::from(zcard(node, &queue).await == 0);
    }
    assert!(
        withdrawn >= 3,
        "the entry is still on {} nodes",
        5 - withdrawn
    );
    let _ = holder.release(&held).await.expect("release");
    // The rest of the withdrawal finishes in the background; then the key is taken on all five.
    let started = Instant::now();
    let again = loop {
        let again = holder.try_acquire(key, ttl).await.expect("free");
        let mut locked = 0;
        for node in &mut nodes {
            let owner: Option<String> = redis::cmd("GET")
                .arg(&lock)
                .query_async(node)
                .await
                .expect("GET");
            locked += usize::from(owner.is_some());
        }
        if locked == nodes.len() {
            break again;
        }
        let _ = holder.release(&again).await.expect("release");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "withdrawal incomplete"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // A waiter queued behind the holder, seen on every node.
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(key, ttl, Duration::from_secs(20)).await }
    });
    let started = Instant::now();
    loop {
        let mut queued = 0;
        for node in &mut nodes {
            queued += usize::from(zcard(node, &queue).await > 0);
        }
        if queued == nodes.len() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the waiter is queued on only {queued} nodes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The lock vanishes without a release (no wake-up): the waiter is still queued.
    for node in &mut nodes {
        let _: () = redis::cmd("DEL")
            .arg(&lock)
            .query_async(node)
            .await
            .expect("DEL");
    }
    match holder.try_acquire(key, ttl).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a request that does not wait took the key from a waiter: {other:?}"),
    }
    let lease = waiting
        .await
        .expect("task")
        .expect("the waiter gets the key");
    assert!(lease.fencing_token() > again.fencing_token());
    let _ = waiter.release(&lease).await.expect("release");
}

/// One plain connection to each of the five shared masters.
async fn admin_connections() -> Vec<redis::aio::MultiplexedConnection> {
    let mut nodes = Vec::new();
    for server in shared::redis_masters(5) {
        let client = redis::Client::open(server.url()).expect("client");
        nodes.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("node"),
        );
    }
    nodes
}

async fn zcard(node: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(node)
        .await
        .expect("ZCARD")
}

/// A release hands the key to the queued waiter itself: each node's release script sets the
/// lock to the owner the waiter's request names and tells the waiter, which takes the lease
/// from a quorum of those grants without an acquire round of its own. Such a lease's validity
/// counts from the round that left the request, sent before the release began; a lease from a
/// round made after the release would count from that round. A waiter refreshes its request
/// with a round at least every 250 ms, which may coincide with a handoff (about one in 250):
/// so five handoffs are made and at least one must come from the grants. Without grants on
/// release (a wake-up and a round), none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_key_to_the_queued_waiter_without_a_round() {
    use fencelock_core::LockStore;
    use std::time::{Duration, Instant};

    let (holder, waiter) = (store(&redlock_url()).await, store(&redlock_url()).await);
    let ttl = Duration::from_secs(30);
    let mut nodes = admin_connections().await;
    let mut by_grants = 0;
    for i in 0..5 {
        // A key of its own each time: no request key of an earlier wait matches the pattern.
        let key = format!("redlock:grant-on-release:{i}");
        let pattern = format!("fencelock:{{{key}}}:request:*");
        let held = holder.try_acquire(&key, ttl).await.expect("acquire");
        let waiting = tokio::spawn({
            let (waiter, key) = (waiter.clone(), key.clone());
            async move { waiter.acquire(&key, ttl, Duration::from_secs(20)).await }
        });
        // The waiter's request is on every node.
        let started = Instant::now();
        loop {
            let mut requested = 0;
            for node in &mut nodes {
                let (_, found): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(0)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(node)
                    .await
                    .expect("SCAN");
                requested += usize::from(!found.is_empty());
            }
            if requested == nodes.len() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "the waiter's request is on only {requested} nodes"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released_at = Instant::now();
        let _ = holder.release(&held).await.expect("release");
        let lease = waiting
            .await
            .expect("task")
            .expect("the waiter gets the key");
        assert!(lease.fencing_token() > held.fencing_token());
        let from_a_later_round = released_at + ttl - fencelock_core::raw::drift(ttl);
        by_grants += usize::from(lease.valid_until() < from_a_later_round.into());
        let _ = waiter.release(&lease).await.expect("release");
    }
    assert!(
        by_grants > 0,
        "no handoff of five came from the release's grants"
    );
}
