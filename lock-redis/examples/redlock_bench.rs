//! Redlock on five local masters against the single-node store and against the `rslock`
//! crate on the same five masters, measured in one run from one client machine.
//!
//! ```sh
//! cargo run --release -p lock-redis --example redlock_bench
//! ```
//!
//! Starts five redis-servers with test-servers. Prints one table: the raw floor (one `PING`
//! to all five nodes in parallel, and `SET NX PX` to all five in parallel); the acquire +
//! release cycle of the single-node store (on the first node), of our Redlock and of
//! `rslock`, timed in alternating rounds; throughput with 32 tasks on distinct keys; and the
//! handoff to another waiter with 8 waiters on one key (one handle each), ours and rslock's.
//!
//! Our cycle has one more parallel round trip than rslock's: the raise of a quorum's fencing
//! counters to the token before the lease is handed out. rslock gives no fencing token.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::bench::{cycle, lock_throughput, time_each, Samples, Table};
use lock_core::{
    Acquire, Capabilities, DynLockStore, Extend, Lease, LockStore, OwnerId, Release, ReleaseOutcome,
};
use lock_redis::{RedisConfig, RedisStore, RedlockConfig, RedlockStore};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

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

fn failed(what: &'static str) -> impl Fn(redis::RedisError) -> lock_core::Error {
    move |e| lock_core::Error::store(what, e)
}

/// Runs `command` on every node at once; done when all answered.
async fn on_all(nodes: &[ConnectionManager], command: &redis::Cmd) -> lock_core::Result<()> {
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

/// Handoff to *another* waiter (as in `examples/bench.rs`): from a holder starting its release
/// to the next holder's grant; the releaser contends again only once someone else holds the
/// key, so a polling lock's releaser cannot report its own unlock + lock as a handoff.
async fn handoff_to_another(
    handles: Vec<DynLockStore>,
    key: &str,
    handoffs: usize,
) -> lock_core::Result<Samples> {
    struct State {
        released_at: Option<Instant>,
        samples: Vec<Duration>,
    }
    let state = Arc::new(std::sync::Mutex::new(State {
        released_at: None,
        samples: Vec::with_capacity(handoffs),
    }));
    let grants = Arc::new(tokio::sync::watch::channel(0u64).0);
    let mut joins = Vec::new();
    for store in handles {
        let (key, state, grants) = (key.to_owned(), state.clone(), grants.clone());
        joins.push(tokio::spawn(async move {
            loop {
                let lease = store.acquire(&key, TTL, Duration::from_secs(60)).await?;
                let now = Instant::now();
                let finished = {
                    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(released_at) = state.released_at.take() {
                        state.samples.push(now - released_at);
                    }
                    state.samples.len() >= handoffs
                };
                grants.send_modify(|g| *g += 1);
                let mut granted = grants.subscribe();
                if !finished {
                    tokio::time::sleep(HOLD).await;
                    state.lock().unwrap_or_else(|e| e.into_inner()).released_at =
                        Some(Instant::now());
                }
                let _ = store.release(&lease).await?;
                if finished {
                    return Ok::<_, lock_core::Error>(());
                }
                let _ = granted.changed().await;
            }
        }));
    }
    let (first, _, rest) = futures_util::future::select_all(joins).await;
    first.map_err(|e| lock_core::Error::Store {
        message: format!("a benchmark task panicked: {e}"),
        source: None,
    })??;
    for join in rest {
        join.abort();
    }
    let samples = state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .samples
        .clone();
    Ok(Samples::new(samples))
}

/// `rslock` behind our traits, so the same loops run on it. No fencing token (the lease says
/// 0), an unlock that reports nothing (release always says `Released`), and its waiting
/// acquire is its own retry loop.
#[derive(Debug)]
struct Rslock {
    manager: rslock::LockManager,
}

#[async_trait]
impl Acquire for Rslock {
    async fn try_acquire(&self, key: &str, ttl: Duration) -> lock_core::Result<Lease> {
        let sent_at = Instant::now();
        match self.manager.lock(key.as_bytes(), ttl).await {
            Ok(lock) => Ok(Lease::with_store_state(
                key,
                OwnerId::random(),
                0,
                ttl,
                sent_at,
                lock,
            )),
            Err(_) => Err(lock_core::Error::Busy {
                key: key.to_owned(),
            }),
        }
    }

    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> lock_core::Result<Lease> {
        let sent_at = Instant::now();
        match tokio::time::timeout(wait, self.manager.acquire_no_guard(key.as_bytes(), ttl)).await {
            Ok(Ok(lock)) => Ok(Lease::with_store_state(
                key,
                OwnerId::random(),
                0,
                ttl,
                sent_at,
                lock,
            )),
            Ok(Err(e)) => Err(lock_core::Error::Store {
                message: format!("rslock: {e}"),
                source: None,
            }),
            Err(_) => Err(lock_core::Error::WaitTimedOut {
                key: key.to_owned(),
                waited: wait,
            }),
        }
    }
}

#[async_trait]
impl Release for Rslock {
    async fn release(&self, lease: &Lease) -> lock_core::Result<ReleaseOutcome> {
        if let Some(lock) = lease.store_state::<rslock::Lock>() {
            self.manager.unlock(lock).await;
        }
        Ok(ReleaseOutcome::Released)
    }
}

#[async_trait]
impl Extend for Rslock {
    async fn extend(&self, _: &Lease) -> lock_core::Result<()> {
        Err(lock_core::Error::Unsupported {
            operation: "extend in this benchmark adapter",
        })
    }
}

#[async_trait]
impl LockStore for Rslock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn time_cycle(
    store: &DynLockStore,
    key: &str,
    into: &mut Vec<Duration>,
) -> lock_core::Result<()> {
    for _ in 0..ITERATIONS / ROUNDS {
        let started = Instant::now();
        let lease = store.try_acquire(key, TTL).await?;
        let _ = store.release(&lease).await?;
        into.push(started.elapsed());
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
    let peer: DynLockStore = Arc::new(Rslock {
        manager: rslock::LockManager::new(urls.clone()),
    });

    let mut raw = Vec::new();
    for url in &urls {
        raw.push(ConnectionManager::new(redis::Client::open(url.as_str())?).await?);
    }
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut raw[0].clone())
        .await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?");
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
        time_cycle(&single, "cycle", &mut single_samples).await?;
        time_cycle(&ours, "cycle", &mut our_samples).await?;
        time_cycle(&peer, "rslock:cycle", &mut peer_samples).await?;
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
        peer_handles.push(Arc::new(Rslock {
            manager: rslock::LockManager::new(urls.clone()),
        }));
    }
    let handoffs = handoff_to_another(handles, "handoff", HANDOFFS).await?;
    let peer_handoffs = handoff_to_another(peer_handles, "rslock:handoff", PEER_HANDOFFS).await?;

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
            Some((
                "≤ 2× rslock's cycle (one more round trip)",
                cycle_ratio <= 2.0,
            )),
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
        .ratio(rate_ratio, Some(("≥ 0.5× rslock", rate_ratio >= 0.5)));
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
    let better = us(peer_handoffs.p50()) / us(handoffs.p50());
    table
        .latency(
            format!("rslock handoff p50, {WAITERS} waiters"),
            peer_handoffs.p50(),
        )
        .ratio(better, Some(("ours ≥ 10× better", better >= 10.0)));
    table.latency(
        format!("rslock handoff p99, {WAITERS} waiters"),
        peer_handoffs.p99(),
    );
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
