//! Redlock under faults, five real redis-servers per test: a minority stopped (SIGSTOP) or
//! killed, a majority down, a node whose counter runs far ahead leaving the majority, and a
//! randomized run where the live nodes change between acquisitions.

use std::time::Duration;

use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use fencelock_redis::{RedlockConfig, RedlockStore};
use rand::seq::SliceRandom;
use test_servers::RedisServer;
use tokio::time::{sleep, Instant};

/// Generous: other test binaries share the two cores.
const SLACK: Duration = Duration::from_millis(750);
const TTL: Duration = Duration::from_secs(5);

fn start_five() -> Vec<RedisServer> {
    RedisServer::start_many(5).unwrap_or_else(|e| panic!("{e}"))
}

/// A Redlock URL over `servers`: the per-node timeouts are short so stopped nodes cost little,
/// but far above a loopback round trip on a loaded machine, and five retries outlast a slow
/// moment.
fn url(servers: &[RedisServer]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    format!(
        "redlock://{}?connect_timeout=3s&command_timeout=1s&retry_count=5&retry_jitter=20ms",
        hosts.join(",")
    )
}

/// Connects, which must succeed while only a minority of `servers` is down.
async fn store(servers: &[RedisServer]) -> RedlockStore {
    RedlockStore::connect(RedlockConfig::from_url(&url(servers)).expect("config"))
        .await
        .expect("connect")
}

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

fn lock_key(key: &str) -> String {
    format!("fencelock:{{{key}}}:lock")
}

fn fence_key(key: &str) -> String {
    format!("fencelock:{{{key}}}:fence")
}

/// Stops a random set of up to two of the five nodes (SIGSTOP) and resumes the others that
/// `stopped` marks; `stopped` then marks the new set.
fn stop_up_to_two(servers: &[RedisServer], stopped: &mut [bool; 5]) {
    let mut indexes = [0usize, 1, 2, 3, 4];
    indexes.shuffle(&mut rand::rng());
    let down = rand::random_range(0..=2);
    for (position, node) in indexes.iter().enumerate() {
        let stop = position < down;
        if stop && !stopped[*node] {
            servers[*node].pause().expect("SIGSTOP");
        } else if !stop && stopped[*node] {
            servers[*node].resume().expect("SIGCONT");
        }
        stopped[*node] = stop;
    }
}

async fn exists(server: &RedisServer, name: &str) -> bool {
    let mut conn = admin(server).await;
    let found: i64 = redis::cmd("EXISTS")
        .arg(name)
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    found == 1
}

/// The owner `key`'s lock holds on `server`, if any.
async fn lock_owner(server: &RedisServer, key: &str) -> Option<String> {
    let mut conn = admin(server).await;
    redis::cmd("GET")
        .arg(lock_key(key))
        .query_async(&mut conn)
        .await
        .expect("GET lock")
}

async fn fence(server: &RedisServer, key: &str) -> u64 {
    let mut conn = admin(server).await;
    let fence: Option<u64> = redis::cmd("GET")
        .arg(fence_key(key))
        .query_async(&mut conn)
        .await
        .expect("GET fence");
    fence.unwrap_or(0)
}

/// Acquires (waiting a little, since a stopped node's stale grant may linger), extends and
/// releases `key`, asserting the token is above `last`; gives the token.
async fn cycle(store: &RedlockStore, key: &str, last: u64) -> u64 {
    let lease = store
        .acquire(key, TTL, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("acquire after token {last}: {e}"));
    assert!(
        lease.fencing_token() > last,
        "token {} after {last}",
        lease.fencing_token()
    );
    store.extend(&lease).await.expect("extend with a quorum up");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    lease.fencing_token()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_stopped_locks_still_work_and_tokens_grow() {
    let servers = start_five();
    let store = store(&servers).await;
    let key = "faults:two-stopped";
    let mut last = cycle(&store, key, 0).await;
    servers[1].pause().expect("SIGSTOP");
    servers[3].pause().expect("SIGSTOP");
    for _ in 0..10 {
        last = cycle(&store, key, last).await;
    }
    // A held key is still exclusive with two nodes frozen.
    let lease = store.try_acquire(key, TTL).await.expect("acquire");
    assert!(lease.fencing_token() > last);
    match store.try_acquire(key, TTL).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a second holder with two nodes stopped: {other:?}"),
    }
    match store.status(key).await.expect("status") {
        KeyStatus::Held { owner, .. } => assert_eq!(owner, Some(lease.owner())),
        other => panic!("status of a held key: {other:?}"),
    }
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    servers[1].resume().expect("SIGCONT");
    servers[3].resume().expect("SIGCONT");
    cycle(&store, key, lease.fencing_token()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_killed_then_restarted_empty_keep_tokens_growing() {
    let mut servers = start_five();
    let store = store(&servers).await;
    let key = "faults:two-killed";
    let mut last = cycle(&store, key, 0).await;
    servers[0].kill().expect("kill");
    servers[4].kill().expect("kill");
    for _ in 0..10 {
        last = cycle(&store, key, last).await;
    }
    // A new handle connects with a minority down, and its tokens continue the sequence.
    let late = crate::store(&servers).await;
    last = cycle(&late, key, last).await;
    // The documented assumption: a node that lost its data stays down longer than the TTL.
    sleep(TTL + SLACK).await;
    servers[0].restart().expect("restart empty");
    servers[4].restart().expect("restart empty");
    assert_eq!(
        fence(&servers[0], key).await,
        0,
        "the restart lost the fence"
    );
    // Now stop two of the nodes that kept their data: the majority is the two empty nodes
    // and one that remembers.
    servers[1].pause().expect("SIGSTOP");
    servers[2].pause().expect("SIGSTOP");
    for _ in 0..10 {
        last = cycle(&store, key, last).await;
    }
    servers[1].resume().expect("SIGCONT");
    servers[2].resume().expect("SIGCONT");
    cycle(&store, key, last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_far_ahead_does_not_pull_tokens_back_when_its_node_leaves_the_majority() {
    let servers = start_five();
    let store = store(&servers).await;
    let key = "faults:far-ahead";
    let first = cycle(&store, key, 0).await;
    // Node 0's counter runs far ahead of every other node's (a fast clock, many grants).
    let ahead = first + 1_000_000_000_000;
    let mut conn = admin(&servers[0]).await;
    let _: () = redis::cmd("SET")
        .arg(fence_key(key))
        .arg(ahead)
        .query_async(&mut conn)
        .await
        .expect("SET fence");
    // With nodes 3 and 4 frozen, the granting and the raising quorum are exactly 0, 1 and 2.
    servers[3].pause().expect("SIGSTOP");
    servers[4].pause().expect("SIGSTOP");
    let lease = store.try_acquire(key, TTL).await.expect("acquire");
    assert!(
        lease.fencing_token() > ahead,
        "node 0 granted, so the maximum is its token: {}",
        lease.fencing_token()
    );
    let raised = futures_util::future::join_all(servers[..3].iter().map(|s| fence(s, key))).await;
    assert!(
        raised.iter().all(|f| *f >= lease.fencing_token()),
        "nodes 1 and 2 were raised to the token before it was handed out: {raised:?}"
    );
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Nodes 0 and 1 leave: the next majority, 2, 3 and 4, shares only node 2 with the last
    // one, and node 2 never minted anything near node 0's counter: it only got the raise.
    servers[3].resume().expect("SIGCONT");
    servers[4].resume().expect("SIGCONT");
    servers[0].pause().expect("SIGSTOP");
    servers[1].pause().expect("SIGSTOP");
    let next = cycle(&store, key, lease.fencing_token()).await;
    assert!(next > ahead);
    servers[0].resume().expect("SIGCONT");
    servers[1].resume().expect("SIGCONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_down_give_a_quorum_error_and_leave_nothing_held_past_the_ttl() {
    let mut servers = start_five();
    let store = store(&servers).await;
    let key = "faults:majority-down";
    let ttl = Duration::from_secs(2);
    servers[0].pause().expect("SIGSTOP");
    servers[2].pause().expect("SIGSTOP");
    servers[4].kill().expect("kill");

    let started = Instant::now();
    let error = store
        .try_acquire(key, ttl)
        .await
        .expect_err("no quorum with three of five down");
    assert!(error.is_retryable(), "{error}");
    let quorum = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<fencelock_redis::QuorumError>())
        .unwrap_or_else(|| panic!("no typed quorum error behind {error}"));
    assert_eq!(quorum.quorum(), 3);
    assert_eq!(quorum.nodes().len(), 5, "{quorum}");
    let message = error.to_string();
    assert!(message.contains("no quorum of 3 out of 5"), "{message}");
    for server in &servers {
        assert!(
            message.contains(&format!("127.0.0.1:{}", server.port())),
            "the error names every node: {message}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the error came within the retries' bounds, not a hang: {:?}",
        started.elapsed()
    );
    // The failed round released what the two live nodes granted.
    for live in [&servers[1], &servers[3]] {
        assert!(
            !exists(live, &lock_key(key)).await,
            "a live node kept the failed round's lock"
        );
    }
    match store.acquire(key, ttl, Duration::from_secs(1)).await {
        Err(error) => assert!(error.is_retryable(), "{error}"),
        Ok(lease) => panic!("a lease without a quorum: {lease:?}"),
    }
    // A new handle cannot connect either, and says why for each node.
    match RedlockStore::connect(RedlockConfig::from_url(&url(&servers)).expect("config")).await {
        Err(Error::Unavailable { message, .. }) => {
            assert!(message.contains("no quorum"), "{message}");
            assert!(
                message.contains(&format!("127.0.0.1:{}", servers[4].port())),
                "{message}"
            );
        }
        other => panic!("connect with a majority down: {other:?}"),
    }

    // The frozen nodes wake up with the requests they were sent still queued: whatever
    // they grant is released in order or expires at its TTL.
    servers[0].resume().expect("SIGCONT");
    servers[2].resume().expect("SIGCONT");
    sleep(ttl + SLACK).await;
    for live in &servers[..4] {
        assert!(
            !exists(live, &lock_key(key)).await,
            "a lock outlived its TTL on 127.0.0.1:{}",
            live.port()
        );
    }
    servers[4].restart().expect("restart");
    cycle(&store, key, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_while_the_live_nodes_change_between_acquisitions() {
    let servers = start_five();
    let store = store(&servers).await;
    let key = "faults:randomized";
    let mut stopped = [false; 5];
    let mut last = 0;
    for round in 0..200 {
        // Up to two nodes down, a different set each time.
        stop_up_to_two(&servers, &mut stopped);
        let lease = store
            .acquire(key, TTL, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("round {round} with nodes {stopped:?} stopped: {e}"));
        assert!(
            lease.fencing_token() > last,
            "round {round} with nodes {stopped:?} stopped: token {} after {last}",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        // Released on the live nodes; a stopped node runs its queued acquire and release in
        // order when it resumes.
        let _ = store.release(&lease).await;
    }
    for (node, stopped) in stopped.iter().enumerate() {
        if *stopped {
            servers[node].resume().expect("SIGCONT");
        }
    }
}

/// A release cut off after a minority of nodes grants the queued waiter only there. The waiter
/// cannot use a minority; when its wait ends without a lease, it deletes those grants (they
/// hold the owner its request named) along with its entries. The stopped nodes, once resumed,
/// run what was sent to them meanwhile (or lose it with the connection): either way no node is
/// left held by anyone but the old holder (whose own lock there lapses at its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_a_waiter_did_not_collect_are_deleted_when_its_wait_ends() {
    let servers = start_five();
    let (holder, waiter) = (store(&servers).await, store(&servers).await);
    let key = "faults:uncollected-grant";
    let ttl = Duration::from_secs(60);
    let request = format!("fencelock:{{{key}}}:request:*");
    let queued = || async {
        let started = Instant::now();
        for server in &servers {
            let mut conn = admin(server).await;
            loop {
                let (_, found): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(0)
                    .arg("MATCH")
                    .arg(&request)
                    .query_async(&mut conn)
                    .await
                    .expect("SCAN");
                if !found.is_empty() {
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(15), "not queued");
                sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // Every script is loaded on every node first: a handoff, and a wait that runs out (a
    // script sent to a stopped node for the first time is refused when it resumes, with
    // nobody left to load it).
    let held = holder.try_acquire(key, ttl).await.expect("acquire");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(key, ttl, Duration::from_secs(20)).await }
    });
    queued().await;
    let _ = holder.release(&held).await.expect("release");
    let lease = waiting.await.expect("task").expect("handed over");
    match waiter.acquire(key, ttl, Duration::from_millis(50)).await {
        Err(Error::WaitTimedOut { .. }) => {}
        other => panic!("a wait behind a holder: {other:?}"),
    }
    let _ = waiter.release(&lease).await.expect("release");

    let held = holder.try_acquire(key, ttl).await.expect("acquire");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(key, ttl, Duration::from_secs(3)).await }
    });
    queued().await;
    // Three nodes of five stop: the release reaches nodes 0 and 1, which grant the waiter.
    for server in &servers[2..] {
        server.pause().expect("SIGSTOP");
    }
    match holder.release(&held).await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("a release heard by two nodes of five: {other:?}"),
    }
    for server in &servers[..2] {
        let granted = lock_owner(server, key)
            .await
            .expect("the node granted the queued waiter on release");
        assert_ne!(granted, held.owner().to_string());
    }

    let outcome = waiting.await.expect("task");
    assert!(
        outcome.is_err(),
        "a lease from two nodes of five: {outcome:?}"
    );
    for server in &servers[..2] {
        assert!(
            !exists(server, &lock_key(key)).await,
            "a grant outlived the wait"
        );
    }
    for server in &servers[2..] {
        server.resume().expect("SIGCONT");
    }
    // What the stopped nodes were sent runs now, each connection's in order.
    sleep(SLACK * 2).await;
    for server in &servers {
        let owner = lock_owner(server, key).await;
        assert!(
            owner.is_none() || owner == Some(held.owner().to_string()),
            "node {} is held by {owner:?}, not the old holder",
            server.port()
        );
    }
}

/// Three clients hand one key to each other, by the releases' grants and by rounds, while up
/// to two of five nodes stop and resume at random (so releases and grants are cut off after
/// some nodes, and grants are left on a minority): every lease's token is above the one
/// before it, no two leases are held at once, and handoffs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_keep_tokens_growing_while_the_live_nodes_change() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    const HANDOFFS: usize = 400;
    let servers = Arc::new(start_five());
    let key = "faults:randomized-handoffs";
    // The last lease's token, and whether a lease is held now.
    let last = Arc::new(Mutex::new((0u64, false)));
    let (handed, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut workers = Vec::new();
    for _ in 0..3 {
        let store = store(&servers).await;
        let (last, handed, done) = (last.clone(), handed.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut failures = 0;
            while !done.load(Ordering::SeqCst) {
                let lease = match store.acquire(key, TTL, Duration::from_secs(10)).await {
                    Ok(lease) => lease,
                    Err(_) => {
                        failures += 1;
                        continue;
                    }
                };
                {
                    let mut last = last.lock().expect("lock");
                    assert!(
                        !last.1,
                        "two leases at once (token {})",
                        lease.fencing_token()
                    );
                    assert!(
                        lease.fencing_token() > last.0,
                        "token {} after {}",
                        lease.fencing_token(),
                        last.0
                    );
                    *last = (lease.fencing_token(), true);
                }
                sleep(Duration::from_micros(rand::random_range(0..3_000))).await;
                last.lock().expect("lock").1 = false;
                let _ = store.release(&lease).await;
                if handed.fetch_add(1, Ordering::SeqCst) + 1 >= HANDOFFS {
                    done.store(true, Ordering::SeqCst);
                }
            }
            failures
        }));
    }
    let chaos = tokio::spawn({
        let (servers, done) = (servers.clone(), done.clone());
        async move {
            let mut stopped = [false; 5];
            while !done.load(Ordering::SeqCst) {
                stop_up_to_two(&servers, &mut stopped);
                sleep(Duration::from_millis(rand::random_range(20..80))).await;
            }
            for (node, stopped) in stopped.iter().enumerate() {
                if *stopped {
                    servers[node].resume().expect("SIGCONT");
                }
            }
        }
    });
    let started = Instant::now();
    let mut failures = 0;
    for worker in workers {
        failures += tokio::time::timeout(Duration::from_secs(120), worker)
            .await
            .expect("handoffs stalled")
            .expect("worker");
    }
    chaos.await.expect("chaos");
    eprintln!(
        "{HANDOFFS} handoffs in {:?}, {failures} waits ended without a lease",
        started.elapsed()
    );
}
