//! Redlock on five local masters against the single-node store and against the `rslock`
//! crate on the same five masters, measured in one run from one client machine.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench redlock
//! ```
//!
//! Starts five redis-servers with test-servers. Prints one table: the raw floor (one `PING`
//! to all five nodes in parallel, and `SET NX PX` to all five in parallel); the acquire +
//! release cycle of the single-node store (on the first node), of our Redlock and of
//! `rslock`, timed in alternating rounds; throughput with 32 tasks on distinct keys (ours and
//! rslock's in alternating rounds, with the CPU per cycle of this process and of the five
//! servers, and the durable fenced floor on five: the single-node bench's durable floor run
//! on each node in parallel, the least the servers spend on a fenced cycle whose tokens
//! survive a node's data loss); and the handoff to another waiter with 8 waiters on one key (one handle each),
//! ours and rslock's, next to the floor of any handoff in two rounds (the holder releases on
//! every node, then the woken waiter acquires on a quorum) done by hand with plain commands,
//! the three in alternating rounds. Ours takes one round: each node's release grants the key
//! to the head of its waiter queue (the crate docs, `# Redlock`), so it can go below that
//! floor.
//!
//! That floor is measured after the same idle hold as the handoffs: on a virtual machine a
//! server or client that slept a few ms takes far longer to answer than in a back-to-back
//! loop (here a raw fan-out to five took about twice the raw RTT after 5 ms idle), so the
//! raw RTT alone understates what a handoff can cost. rslock's handoff over that floor is the
//! most any release-then-acquire handoff could be better than rslock's in the same run.
//!
//! Our cycle has the same parallel round trips as rslock's when a quorum of the granting
//! nodes minted the same token (the usual case: the raise is skipped, see the crate docs,
//! `# Redlock`), one more otherwise. rslock gives no fencing token.

#[path = "redis_common/mod.rs"]
mod common;
// Only the durable floor is used here.
#[allow(dead_code)]
#[path = "redis_common/floor.rs"]
mod floor;

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client_cpu, failed, raw_subscription, rslock_handoff_rows, server_version, Rslock};
use fencelock_bench::{
    cycle, cycle_into, handoff_to_another, lock_throughput, micros as us, throughput, time_each,
    Samples, Table,
};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore, RedlockConfig, RedlockStore};
use floor::Floor;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;

const ITERATIONS: usize = 2000;
const ROUNDS: usize = 20;
const TASKS: usize = 32;
const RUN_FOR: Duration = Duration::from_secs(3);
/// Ours and rslock's throughput alternate in this many rounds of `RUN_FOR / ROUNDS` each.
const THROUGHPUT_ROUNDS: usize = 6;
const WAITERS: usize = 8;
const HANDOFFS: usize = 500;
const PEER_HANDOFFS: usize = 200;
/// The handoff runs (the raw floor's, ours and rslock's) alternate in this many rounds.
const HANDOFF_ROUNDS: usize = 4;
const TTL: Duration = Duration::from_secs(30);
/// How long a holder keeps the key in the handoff run, so waiters are parked in their wait.
const HOLD: Duration = Duration::from_millis(5);

/// Runs `command` on every node at once; done when all answered.
async fn on_all(nodes: &[ConnectionManager], command: &redis::Cmd) -> fencelock_core::Result<()> {
    on_quorum(nodes, command, nodes.len()).await
}

/// Runs `command` on every node at once; done when `quorum` answered (the rest finish in the
/// background).
async fn on_quorum(
    nodes: &[ConnectionManager],
    command: &redis::Cmd,
    quorum: usize,
) -> fencelock_core::Result<()> {
    let mut replies: FuturesUnordered<_> = nodes
        .iter()
        .map(|node| {
            let (mut node, command) = (node.clone(), command.clone());
            async move { command.query_async::<redis::Value>(&mut node).await }
        })
        .collect();
    for _ in 0..quorum {
        match replies.next().await {
            Some(reply) => drop(reply.map_err(failed("raw command"))?),
            None => break,
        }
    }
    tokio::spawn(async move { while replies.next().await.is_some() {} });
    Ok(())
}

/// The floor of any handoff in two rounds (the holder releases on every node, the woken
/// waiter then acquires on a quorum), by hand: after the same idle `HOLD` as the handoff runs,
/// the time from the holder sending `DEL` + `PUBLISH` to all five to a raw waiter, subscribed
/// on all five and woken by a quorum of messages, having a quorum of its `SET NX PX` answered.
/// No scripts, no queue, no token: cheaper than any real handoff of this shape.
async fn raw_two_round_handoff(
    urls: &[String],
    nodes: &[ConnectionManager],
    samples: usize,
) -> fencelock_core::Result<Samples> {
    let quorum = nodes.len() / 2 + 1;
    let mut streams = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).map_err(failed("raw subscriber"))?;
        streams.push(Box::pin(raw_subscription(&client, "raw:handoff").await?));
    }
    let mut messages = futures_util::stream::select_all(streams);
    let mut release = redis::cmd("EVAL");
    release
        .arg("redis.call('DEL', KEYS[1]) return redis.call('PUBLISH', ARGV[1], '')")
        .arg(1)
        .arg("raw:handoff:lock")
        .arg("raw:handoff");
    let mut acquire = redis::cmd("SET");
    acquire
        .arg("raw:handoff:lock")
        .arg("x")
        .arg("NX")
        .arg("PX")
        .arg(1_000);
    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        tokio::time::sleep(HOLD).await;
        let sent = Instant::now();
        let released = on_all(nodes, &release);
        let waiter = async {
            for _ in 0..quorum {
                messages.next().await;
            }
            let acquired = on_quorum(nodes, &acquire, quorum).await;
            (acquired, Instant::now())
        };
        let (released, (acquired, granted)) = tokio::join!(released, waiter);
        released?;
        acquired?;
        taken.push(granted - sent);
        // The rest of this sample's messages, so the next sample starts with none pending.
        for _ in quorum..nodes.len() {
            messages.next().await;
        }
    }
    Ok(Samples::new(taken))
}

/// What one side's throughput rounds added up to.
#[derive(Default)]
struct Load {
    cycles: f64,
    seconds: f64,
    client_us: f64,
    servers_us: f64,
}

impl Load {
    fn rate(&self) -> f64 {
        self.cycles / self.seconds
    }
}

/// The five servers' CPU so far in µs (`INFO cpu`: used_cpu_sys + used_cpu_user, every thread).
async fn servers_cpu(nodes: &[ConnectionManager]) -> fencelock_core::Result<f64> {
    let mut total = 0.0;
    for node in nodes {
        let mut node = node.clone();
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut node)
            .await
            .map_err(failed("INFO cpu"))?;
        total += info
            .lines()
            .filter_map(|line| line.split_once(':'))
            .filter(|(k, _)| *k == "used_cpu_sys" || *k == "used_cpu_user")
            .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(total * 1e6)
}

/// What every scenario shares: the five servers' URLs, ours, the single-node store on the
/// first, rslock on the five, and a raw connection to each.
struct Bench {
    urls: Vec<String>,
    config: RedlockConfig,
    ours: DynLockStore,
    single: DynLockStore,
    peer: DynLockStore,
    raw: Vec<ConnectionManager>,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let servers = test_servers::RedisServer::start_many(5)?;
    let bench = Bench::connect(&servers).await?;
    let mut table = Table::default();
    let rtt = bench.raw_round_trips(&mut table).await?;
    bench.uncontended_cycles(&mut table, rtt).await?;
    bench.throughput(&mut table).await?;
    bench.handoff(&mut table, rtt).await?;
    println!("{table}");
    println!(
        "ratios: single-node and rslock cycles to the raw RTT; our cycle to rslock's; our \
         throughput to rslock's; our handoff to the raw RTT; the rslock handoff row is \
         rslock's p50 over ours. Handoffs go to another waiter (the releaser waits for the \
         next grant before contending again); ours is one round (each node's release grants \
         the key to its queue's head). The raw two-round handoff: the holder's DEL + \
         PUBLISH to all five by hand and a raw waiter, woken by a quorum of messages, sending \
         SET NX PX to all five until a quorum answered, after the same {HOLD:?} idle as the \
         handoffs (each round wakes servers and client from idle, which a back-to-back round \
         trip never does)."
    );
    println!(
        "samples: {ITERATIONS} raw round trips and cycles each, throughput over {RUN_FOR:?} \
         each (ours and rslock's alternating in {THROUGHPUT_ROUNDS} rounds), {HANDOFFS} handoffs ({PEER_HANDOFFS} for rslock) and as many raw ones, the three alternating in \
         {HANDOFF_ROUNDS} rounds"
    );
    Ok(())
}

impl Bench {
    /// Connects the three stores and the raw connections, and prints the header.
    async fn connect(servers: &[test_servers::RedisServer]) -> Result<Self, Box<dyn Error>> {
        let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let config =
            RedlockConfig::from_url(&format!("redlock://{}?prefix=bench:", hosts.join(",")))?;
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
        Ok(Bench {
            urls,
            config,
            ours,
            single,
            peer,
            raw,
        })
    }

    /// The raw floor: one parallel round trip to all five. Returns the raw RTT (`SET NX PX`'s
    /// p50) that later rows are measured against.
    async fn raw_round_trips(&self, table: &mut Table) -> fencelock_core::Result<Duration> {
        let raw = &self.raw;
        let ping = time_each(ITERATIONS, |_| async move {
            on_all(raw, &redis::cmd("PING")).await
        })
        .await?;
        let set_nx = time_each(ITERATIONS, |i| async move {
            let mut set = redis::cmd("SET");
            set.arg(format!("raw:set:{i}"))
                .arg("x")
                .arg("NX")
                .arg("PX")
                .arg(1_000);
            on_all(raw, &set).await
        })
        .await?;
        let rtt = set_nx.p50();
        table.latency("raw PING to all five in parallel p50", ping.p50());
        table.latency("raw SET NX PX to all five in parallel p50 (raw RTT)", rtt);
        Ok(rtt)
    }

    /// The three cycles in alternating rounds, so all see the same machine load.
    async fn uncontended_cycles(
        &self,
        table: &mut Table,
        rtt: Duration,
    ) -> fencelock_core::Result<()> {
        let (single, ours, peer) = (&self.single, &self.ours, &self.peer);
        for store in [single, ours, peer] {
            cycle(store, "warm-up", TTL, 100).await?;
        }
        let (mut single_samples, mut our_samples, mut peer_samples) =
            (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let per_round = ITERATIONS / ROUNDS;
            cycle_into(single, "cycle", TTL, per_round, &mut single_samples).await?;
            cycle_into(ours, "cycle", TTL, per_round, &mut our_samples).await?;
            cycle_into(peer, "rslock:cycle", TTL, per_round, &mut peer_samples).await?;
        }
        let single_cycles = Samples::new(single_samples);
        let our_cycles = Samples::new(our_samples);
        let peer_cycles = Samples::new(peer_samples);

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
        Ok(())
    }

    /// Throughput with 32 tasks on distinct keys: the single node, then ours, rslock's and
    /// the durable fenced floor on five in alternating rounds, with the CPU per cycle.
    async fn throughput(&self, table: &mut Table) -> fencelock_core::Result<()> {
        let single_rate =
            lock_throughput(self.single.clone(), "single:", TTL, TASKS, RUN_FOR).await?;
        let [ours_load, peer_load, floor_load] = self.throughput_rounds().await?;
        let (our_rate, peer_rate, floor_rate) =
            (ours_load.rate(), peer_load.rate(), floor_load.rate());

        table.rate(
            format!("single node, {TASKS} tasks, distinct keys"),
            single_rate,
        );
        table.rate(format!("rslock, {TASKS} tasks, distinct keys"), peer_rate);
        let rate_ratio = our_rate / peer_rate;
        table
            .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
            .ratio(rate_ratio, Some(("≥ 0.9× rslock", rate_ratio >= 0.9)));
        table
            .rate(
                format!("durable fenced floor on five, {TASKS} tasks, distinct keys"),
                floor_rate,
            )
            .ratio(floor_rate / peer_rate, None);
        table.push(
            "  ours / durable fenced floor",
            format!("{:.2}", our_rate / floor_rate),
        );
        for (who, load) in [
            ("rslock", &peer_load),
            ("ours", &ours_load),
            ("durable fenced floor", &floor_load),
        ] {
            table.push(
                format!("{who}: CPU per cycle, client / five servers"),
                format!(
                    "{:.1} / {:.1} µs",
                    load.client_us / load.cycles,
                    load.servers_us / load.cycles
                ),
            );
        }
        Ok(())
    }

    /// Ours and rslock's in alternating rounds, so both see the same machine load; with the
    /// CPU each cycle took in this process (the client) and on the five servers.
    /// And the durable fenced floor on five, in the same rounds: each node runs the single-node
    /// bench's durable floor (`SET NX PX` and a token that survives losing the counter, then
    /// compare-delete-publish), the five in parallel; the least a fenced Redlock cycle whose
    /// tokens survive a node's data loss costs the servers. Returns ours, rslock's, the floor's.
    async fn throughput_rounds(&self) -> fencelock_core::Result<[Load; 3]> {
        let (mut ours_load, mut peer_load, mut floor_load) =
            (Load::default(), Load::default(), Load::default());
        let durable = Floor::durable();
        for _ in 0..THROUGHPUT_ROUNDS {
            let round = RUN_FOR / THROUGHPUT_ROUNDS as u32;
            for (store, prefix, load) in [
                (Some(&self.ours), "throughput:", &mut ours_load),
                (Some(&self.peer), "rslock:throughput:", &mut peer_load),
                (None, "floor:throughput:", &mut floor_load),
            ] {
                let (client, servers) = (client_cpu(), servers_cpu(&self.raw).await?);
                let rate = match store {
                    Some(store) => {
                        lock_throughput(store.clone(), prefix, TTL, TASKS, round).await?
                    }
                    None => durable_floor_on_five(&self.raw, &durable, prefix, round).await?,
                };
                load.cycles += rate * round.as_secs_f64();
                load.seconds += round.as_secs_f64();
                load.client_us += client_cpu() - client;
                load.servers_us += servers_cpu(&self.raw).await? - servers;
            }
        }
        Ok([ours_load, peer_load, floor_load])
    }

    /// Handoff to another waiter, 8 waiters on one key (one handle each): the raw floor, ours
    /// and rslock's in alternating rounds, so all see the same machine.
    async fn handoff(&self, table: &mut Table, rtt: Duration) -> Result<(), Box<dyn Error>> {
        let mut handles: Vec<DynLockStore> = Vec::new();
        let mut peer_handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            handles.push(Arc::new(RedlockStore::connect(self.config.clone()).await?));
            peer_handles.push(Arc::new(Rslock::new(self.urls.clone())));
        }
        let (mut floor_parts, mut our_parts, mut peer_parts) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..HANDOFF_ROUNDS {
            floor_parts.push(
                raw_two_round_handoff(&self.urls, &self.raw, HANDOFFS / HANDOFF_ROUNDS).await?,
            );
            let key = format!("handoff:{round}");
            our_parts.push(
                handoff_to_another(handles.clone(), &key, TTL, HOLD, HANDOFFS / HANDOFF_ROUNDS)
                    .await?,
            );
            let key = format!("rslock:handoff:{round}");
            peer_parts.push(
                handoff_to_another(
                    peer_handles.clone(),
                    &key,
                    TTL,
                    HOLD,
                    PEER_HANDOFFS / HANDOFF_ROUNDS,
                )
                .await?,
            );
        }
        let floor_handoffs = Samples::merged(floor_parts);
        let handoffs = Samples::merged(our_parts);
        let peer_handoffs = Samples::merged(peer_parts);
        handoff_rows(table, rtt, &handoffs, &peer_handoffs, &floor_handoffs);
        Ok(())
    }
}

/// One throughput round of the durable fenced floor on five: `TASKS` tasks on distinct
/// keys, each cycle the single-node durable floor on every node in parallel.
async fn durable_floor_on_five(
    raw: &[ConnectionManager],
    durable: &Floor,
    prefix: &'static str,
    round: Duration,
) -> fencelock_core::Result<f64> {
    let (nodes, durable) = (raw.to_vec(), durable.clone());
    throughput(TASKS, round, move |task, _| {
        let (nodes, durable) = (nodes.clone(), durable.clone());
        async move {
            let key = format!("{prefix}{task}");
            let mut cycles: FuturesUnordered<_> = nodes
                .into_iter()
                .map(|mut node| {
                    let (durable, key) = (durable.clone(), key.clone());
                    async move { durable.cycle(&mut node, &key, TTL).await }
                })
                .collect();
            while let Some(done) = cycles.next().await {
                done?;
            }
            Ok(())
        }
    })
    .await
}

/// The handoff rows: ours and rslock's, and both against the raw two-round floor.
fn handoff_rows(
    table: &mut Table,
    rtt: Duration,
    handoffs: &Samples,
    peer_handoffs: &Samples,
    floor_handoffs: &Samples,
) {
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
    rslock_handoff_rows(table, WAITERS, handoffs, peer_handoffs);
    table
        .latency(
            "raw two-round handoff after the same idle p50",
            floor_handoffs.p50(),
        )
        .ratio(us(floor_handoffs.p50()) / us(rtt), None);
    table.push(
        "  ours / that floor, p50",
        format!("{:.2}", us(handoffs.p50()) / us(floor_handoffs.p50())),
    );
    table.push(
        "  rslock's handoff / that floor: the most a two-round handoff can be better",
        format!("{:.2}", us(peer_handoffs.p50()) / us(floor_handoffs.p50())),
    );
}
