//! Redlock on five local masters against the single-node store and against the `rslock`
//! crate on the same five masters, measured in one run from one client machine.
//!
//! ```sh
//! cargo run --release -p fencelock-redis --example redlock_bench
//! ```
//!
//! Starts five redis-servers with test-servers. Prints one table: the raw floor (one `PING`
//! to all five nodes in parallel, and `SET NX PX` to all five in parallel); the acquire +
//! release cycle of the single-node store (on the first node), of our Redlock and of
//! `rslock`, timed in alternating rounds; throughput with 32 tasks on distinct keys; and the
//! handoff to another waiter with 8 waiters on one key (one handle each), ours and rslock's.
//!
//! Our cycle has the same parallel round trips as rslock's when a quorum of the granting
//! nodes minted the same token (the usual case: the raise is skipped, see the crate docs,
//! `# Redlock`), one more otherwise. rslock gives no fencing token.

mod common;

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use common::{failed, rslock_handoff_rows, server_version, Rslock};
use fencelock_conformance::bench::{
    cycle, cycle_into, handoff_to_another, lock_throughput, micros as us, time_each, Samples, Table,
};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore, RedlockConfig, RedlockStore};
use redis::aio::ConnectionManager;

const ITERATIONS: usize = 2000;
const ROUNDS: usize = 20;
const TASKS: usize = 32;
const RUN_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 8;
const HANDOFFS: usize = 500;
const PEER_HANDOFFS: usize = 50;
const TTL: Duration = Duration::from_secs(30);
/// How long a holder keeps the key in the handoff run, so waiters are parked in their wait.
const HOLD: Duration = Duration::from_millis(5);

/// Runs `command` on every node at once; done when all answered.
async fn on_all(nodes: &[ConnectionManager], command: &redis::Cmd) -> fencelock_core::Result<()> {
    let replies = futures_util::future::join_all(nodes.iter().map(|node| {
        let mut node = node.clone();
        async move { command.query_async::<redis::Value>(&mut node).await }
    }))
    .await;
    for reply in replies {
        reply.map_err(failed("raw command"))?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let servers = test_servers::RedisServer::start_many(5)?;
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let config = RedlockConfig::from_url(&format!("redlock://{}?prefix=bench:", hosts.join(",")))?;
    println!("Redlock benchmark against {config}");
    let redlock = RedlockStore::connect(config.clone()).await?;
    let ours: DynLockStore = Arc::new(redlock.clone());
    let single_config = RedisConfig::from_url(&urls[0])?.with_prefix("bench-single:")?;
    let single: DynLockStore = Arc::new(RedisStore::connect(single_config.clone()).await?);
    let peer: DynLockStore = Arc::new(Rslock::new(urls.clone()));

    let mut raw = Vec::new();
    for url in &urls {
        raw.push(ConnectionManager::new(redis::Client::open(url.as_str())?).await?);
    }
    let version = server_version(&raw[0]).await?;
    println!(
        "5 × redis-server {version}, {} client cores\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    // The raw floor: one parallel round trip to all five.
    let ping = time_each(ITERATIONS, |_| {
        let raw = &raw;
        async move { on_all(raw, &redis::cmd("PING")).await }
    })
    .await?;
    let set_nx = time_each(ITERATIONS, |i| {
        let raw = &raw;
        async move {
            let mut set = redis::cmd("SET");
            set.arg(format!("raw:set:{i}"))
                .arg("x")
                .arg("NX")
                .arg("PX")
                .arg(1_000);
            on_all(raw, &set).await
        }
    })
    .await?;

    // The three cycles in alternating rounds, so all see the same machine load.
    for store in [&single, &ours, &peer] {
        cycle(store, "warm-up", TTL, 100).await?;
    }
    let (mut single_samples, mut our_samples, mut peer_samples) =
        (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let per_round = ITERATIONS / ROUNDS;
        cycle_into(&single, "cycle", TTL, per_round, &mut single_samples).await?;
        cycle_into(&ours, "cycle", TTL, per_round, &mut our_samples).await?;
        cycle_into(&peer, "rslock:cycle", TTL, per_round, &mut peer_samples).await?;
    }
    let single_cycles = Samples::new(single_samples);
    let our_cycles = Samples::new(our_samples);
    let peer_cycles = Samples::new(peer_samples);

    let single_rate = lock_throughput(single.clone(), "single:", TTL, TASKS, RUN_FOR).await?;
    let our_rate = lock_throughput(ours.clone(), "throughput:", TTL, TASKS, RUN_FOR).await?;
    let peer_rate =
        lock_throughput(peer.clone(), "rslock:throughput:", TTL, TASKS, RUN_FOR).await?;

    let mut handles: Vec<DynLockStore> = Vec::new();
    let mut peer_handles: Vec<DynLockStore> = Vec::new();
    for _ in 0..WAITERS {
        handles.push(Arc::new(RedlockStore::connect(config.clone()).await?));
        peer_handles.push(Arc::new(Rslock::new(urls.clone())));
    }
    let handoffs = handoff_to_another(handles, "handoff", TTL, HOLD, HANDOFFS).await?;
    let peer_handoffs =
        handoff_to_another(peer_handles, "rslock:handoff", TTL, HOLD, PEER_HANDOFFS).await?;

    let rtt = set_nx.p50();
    let mut table = Table::default();
    table.latency("raw PING to all five in parallel p50", ping.p50());
    table.latency("raw SET NX PX to all five in parallel p50 (raw RTT)", rtt);
    table
        .latency(
            "single node (RedisStore): try_acquire + release p50",
            single_cycles.p50(),
        )
        .ratio(us(single_cycles.p50()) / us(rtt), None);
    table
        .latency("rslock on five: lock + unlock p50", peer_cycles.p50())
        .ratio(us(peer_cycles.p50()) / us(rtt), None);
    let cycle_ratio = us(our_cycles.p50()) / us(peer_cycles.p50());
    table
        .latency("ours on five: try_acquire + release p50", our_cycles.p50())
        .ratio(
            cycle_ratio,
            Some(("≤ 1.5× rslock's cycle", cycle_ratio <= 1.5)),
        );
    table.latency("single node cycle p99", single_cycles.p99());
    table.latency("rslock cycle p99", peer_cycles.p99());
    table.latency("ours cycle p99", our_cycles.p99());
    table.rate(
        format!("single node, {TASKS} tasks, distinct keys"),
        single_rate,
    );
    table.rate(format!("rslock, {TASKS} tasks, distinct keys"), peer_rate);
    let rate_ratio = our_rate / peer_rate;
    table
        .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
        .ratio(rate_ratio, Some(("≥ 0.6× rslock", rate_ratio >= 0.6)));
    table
        .latency(
            format!("ours handoff p50, {WAITERS} waiters"),
            handoffs.p50(),
        )
        .ratio(us(handoffs.p50()) / us(rtt), None);
    table.latency(
        format!("ours handoff p99, {WAITERS} waiters"),
        handoffs.p99(),
    );
    rslock_handoff_rows(&mut table, WAITERS, &handoffs, &peer_handoffs);
    println!("{table}");
    println!(
        "ratios: single-node and rslock cycles to the raw RTT; our cycle to rslock's; our \
         throughput to rslock's; our handoff to the raw RTT; the rslock handoff row is \
         rslock's p50 over ours. Handoffs go to another waiter (the releaser waits for the \
         next grant before contending again)."
    );
    println!(
        "samples: {ITERATIONS} raw round trips and cycles each, throughput over {RUN_FOR:?} \
         each, {HANDOFFS} handoffs ({PEER_HANDOFFS} for rslock)"
    );
    Ok(())
}
