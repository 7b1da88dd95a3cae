//! The Redis store against the raw commands it is built on, and against the `rslock` crate,
//! measured in one run from one client machine.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench redis
//! ```
//!
//! Starts its own server with test-servers, or uses `LOCK_BENCH_URL` if set. Prints one table:
//! the raw round trips (`PING`, `SET NX PX`, `EVALSHA` of a compare-and-delete) on the same
//! kind of connection the store uses (a `ConnectionManager`); the raw cycle — `SET NX PX` then
//! compare-and-delete by `EVALSHA`, the plainest correct Redis lock, without fencing or
//! wake-ups, kept as context — the raw *fenced floor*: the smallest correct fenced
//! cycle written by hand on the same client, two scripts by `EVALSHA` (`SET NX PX` then `INCR`
//! of a counter; compare, `DEL` and `PUBLISH`) — and our acquire + release cycle, exclusive, as a permit of a semaphore of 4 and
//! as a shared lease (where the store keeps those modes), the raw cycles, the floors and ours
//! one cycle each in turn, the modes in alternating rounds; throughput with 64 tasks on
//! distinct keys, raw, the floors and ours in ten alternating rounds, with
//! the server's time per cycle (its main thread's CPU, and the time `INFO commandstats` gives
//! the commands the client sent, each script once with the commands it calls);
//! handoff latency to another waiter with 8 waiters on one key (one store handle each), next to
//! its physical floor (a raw `PUBLISH` reaching a raw subscriber after the same idle time, plus
//! one round trip); the same cycle and handoff for `rslock` on the same server; and the peers'
//! protocol (8 contenders on one key, each holding 1 ms and pausing 30 ms after each release:
//! the acquire latency's p50, mean and p99, ours against `rslock` in interleaved rounds,
//! target each ≤ 1.0×, with the durable fenced floor in the same rounds: the least a token
//! that survives data loss costs in that protocol, where `rslock` mints none).

#[path = "redis_common/mod.rs"]
mod common;
#[path = "redis_common/floor.rs"]
mod floor;

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use common::{client_cpu, failed, raw_subscription, rslock_handoff_rows, server_version, Rslock};
use fencelock_bench::{
    cycle, cycle_into, handoff, handoff_to_another, lock_throughput, micros as us, server_or_env,
    store_contenders, throughput, time_each, Contender, ModeCycles, PeersProtocol, Samples, Table,
    PEERS_CONTENDERS,
};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore};
use floor::Floor;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

const ITERATIONS: usize = 4000;
const ROUNDS: usize = 20;
const TASKS: usize = 64;
const RUN_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 8;
const HANDOFFS: usize = 1000;
const PEER_HANDOFFS: usize = 100;
/// How long each holder keeps the key in the handoff runs.
const HOLD: Duration = Duration::from_millis(5);
const TTL: Duration = Duration::from_secs(30);
/// Alternating throughput rounds of raw, the floors and ours, each `RUN_FOR /
/// THROUGHPUT_ROUNDS`. Ten short rounds, not three long ones: with three, ours / the durable
/// floor moved between 0.91 and 1.13 from run to run; with ten, between 0.94 and 1.06 (seven
/// runs).
const THROUGHPUT_ROUNDS: u32 = 10;

/// Compare-and-delete, the release every correct Redis lock needs.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// `SET key raw-owner NX PX 30000`: `Some("OK")` if it set the key.
async fn set_nx(conn: &mut ConnectionManager, key: &str) -> fencelock_core::Result<Option<String>> {
    redis::cmd("SET")
        .arg(key)
        .arg("raw-owner")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .map_err(failed("SET NX PX"))
}

/// The raw cycle: the two round trips of the plainest correct Redis lock (no fencing token,
/// no wake-up): `SET key owner NX PX ttl`, then compare-and-delete by `EVALSHA`.
async fn raw_cycle(
    conn: &mut ConnectionManager,
    release: &redis::Script,
    key: &str,
) -> fencelock_core::Result<()> {
    if set_nx(conn, key).await?.is_none() {
        return Err(fencelock_core::Error::Busy {
            key: key.to_owned(),
        });
    }
    let deleted: i64 = release
        .key(key)
        .arg("raw-owner")
        .invoke_async(conn)
        .await
        .map_err(failed("EVALSHA compare-and-delete"))?;
    if deleted != 1 {
        return Err(fencelock_core::Error::Store {
            message: format!("raw release of {key} found another owner"),
            source: None,
        });
    }
    Ok(())
}

/// `SET NX PX` then a plain `DEL`: not a correct lock (it may delete a successor's key), only
/// the floor of two round trips of the cheapest commands.
async fn unsafe_cycle(conn: &mut ConnectionManager, key: &str) -> fencelock_core::Result<()> {
    let _ = set_nx(conn, key).await?;
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(failed("DEL"))?;
    Ok(())
}

/// The physical floor of a notified handoff: after the same idle `HOLD` as the handoff runs,
/// the time from sending a `PUBLISH` to a raw subscriber connection receiving the message.
/// Both ends wake from idle here, as a parked waiter and a holder that worked a while do.
async fn raw_notify(client: &redis::Client, samples: usize) -> fencelock_core::Result<Samples> {
    use futures_util::StreamExt;
    let messages = raw_subscription(client, "raw:notify").await?;
    futures_util::pin_mut!(messages);
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(failed("raw publisher"))?;
    let mut taken = Vec::with_capacity(samples);
    let mut publish_command = redis::cmd("PUBLISH");
    publish_command.arg("raw:notify").arg("");
    for _ in 0..samples {
        tokio::time::sleep(HOLD).await;
        let sent = Instant::now();
        let publish = publish_command.query_async::<i64>(&mut conn);
        let received = async {
            messages.next().await;
            Instant::now()
        };
        let (published, received) = tokio::join!(publish, received);
        published.map_err(failed("PUBLISH"))?;
        taken.push(received - sent);
    }
    Ok(Samples::new(taken))
}

/// What the server spent since the last [`reset_stats`]: its main thread's CPU (`INFO cpu`,
/// `used_cpu_*_main_thread`, minus what it was at the reset) and the time `INFO commandstats`
/// gives the commands in `sent`, the ones the client sends. Redis counts a command a script
/// calls in commandstats too, and inside the script's own time, so a sum over every line
/// would count a script's work twice.
struct ServerTime {
    cpu_at_reset: f64,
}

/// `INFO cpu`: the main thread's user + system CPU, in µs.
async fn main_thread_cpu(conn: &mut ConnectionManager) -> fencelock_core::Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .map_err(failed("INFO cpu"))?;
    Ok(info
        .lines()
        .filter(|l| {
            l.starts_with("used_cpu_sys_main_thread:")
                || l.starts_with("used_cpu_user_main_thread:")
        })
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum::<f64>()
        * 1e6)
}

async fn reset_stats(conn: &mut ConnectionManager) -> fencelock_core::Result<ServerTime> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(conn)
        .await
        .map_err(failed("CONFIG RESETSTAT"))?;
    Ok(ServerTime {
        cpu_at_reset: main_thread_cpu(conn).await?,
    })
}

impl ServerTime {
    /// Main-thread CPU µs and the commands' µs (`sent` only) since the reset.
    async fn read(
        &self,
        conn: &mut ConnectionManager,
        sent: &[&str],
    ) -> fencelock_core::Result<(f64, f64)> {
        let cpu = main_thread_cpu(conn).await? - self.cpu_at_reset;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .map_err(failed("INFO commandstats"))?;
        let commands = info
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
            .filter(|(name, _)| sent.contains(name))
            .filter_map(|(_, rest)| rest.split("usec=").nth(1)?.split(',').next())
            .filter_map(|usec| usec.parse::<u64>().ok())
            .sum::<u64>();
        Ok((cpu, commands as f64))
    }
}

/// Alternating throughput rounds: the rate and the server's time per cycle of each contender.
#[derive(Default, Clone, Copy)]
struct Rate {
    cycles: f64,
    seconds: f64,
    cpu_us: f64,
    command_us: f64,
    client_cpu_us: f64,
}

impl Rate {
    /// Runs `run` for `RUN_FOR / THROUGHPUT_ROUNDS` and adds what it did and cost.
    async fn round<Fut>(
        &mut self,
        admin: &mut ConnectionManager,
        sent: &[&str],
        run: Fut,
    ) -> fencelock_core::Result<()>
    where
        Fut: std::future::Future<Output = fencelock_core::Result<f64>>,
    {
        let stats = reset_stats(admin).await?;
        let client_before = client_cpu();
        let started = Instant::now();
        let rate = run.await?;
        let seconds = started.elapsed().as_secs_f64();
        self.client_cpu_us += client_cpu() - client_before;
        let (cpu, commands) = stats.read(admin, sent).await?;
        self.cycles += rate * seconds;
        self.seconds += seconds;
        self.cpu_us += cpu;
        self.command_us += commands;
        Ok(())
    }

    fn per_second(&self) -> f64 {
        self.cycles / self.seconds
    }

    fn cpu_per_cycle(&self) -> f64 {
        self.cpu_us / self.cycles
    }

    fn commands_per_cycle(&self) -> f64 {
        self.command_us / self.cycles
    }

    fn client_cpu_per_cycle(&self) -> f64 {
        self.client_cpu_us / self.cycles
    }
}

/// A contender of the durable fenced floor in the peers' protocol: its acquire script on its
/// own connection, and while the key is held, a wait for the release's `PUBLISH` on its own
/// subscription (two connections, as one store handle), then the script again.
struct FloorContender {
    floor: Floor,
    conn: ConnectionManager,
    /// Subscribed to the floor's lock key for the contender's whole life, so a release between
    /// a refused acquire and the wait is still in the stream: no wake-up is lost.
    releases: std::pin::Pin<Box<dyn futures_util::Stream<Item = redis::Msg> + Send>>,
    key: String,
}

impl FloorContender {
    async fn connect(
        client: &redis::Client,
        manager_config: ConnectionManagerConfig,
        floor: Floor,
        key: &str,
    ) -> fencelock_core::Result<Self> {
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config)
            .await
            .map_err(failed("floor connection"))?;
        let releases = Box::pin(raw_subscription(client, &floor.lock_key(key)).await?);
        Ok(FloorContender {
            floor,
            conn,
            releases,
            key: key.to_owned(),
        })
    }
}

#[async_trait::async_trait]
impl Contender for FloorContender {
    type Held = String;

    async fn take(&mut self) -> fencelock_core::Result<String> {
        use futures_util::{FutureExt, StreamExt};
        loop {
            // Releases already seen are older than the acquire about to be sent.
            while let Some(Some(_)) = self.releases.next().now_or_never() {}
            if let Some(owner) = self
                .floor
                .try_acquire(&mut self.conn, &self.key, TTL)
                .await?
            {
                return Ok(owner);
            }
            // Every holder here releases (none dies), so a release always wakes this wait;
            // the bound only keeps a lost message from stalling the run.
            let _ = tokio::time::timeout(Duration::from_secs(1), self.releases.next()).await;
        }
    }

    async fn give_back(&mut self, owner: String) -> fencelock_core::Result<()> {
        self.floor.release(&mut self.conn, &self.key, &owner).await
    }
}

/// What every scenario shares: the server's URL, our store, and the raw client on the same
/// kind of connection.
struct Bench {
    url: String,
    config: RedisConfig,
    ours: DynLockStore,
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    raw: ConnectionManager,
    compare_and_delete: redis::Script,
    floor: Floor,
    durable: Floor,
    /// Tags this run's keys, so "a new key per cycle" is new on a server used before.
    run: u128,
}

/// The cycles of the raw locks, the floors and ours, timed one cycle each in turn.
struct Cycles {
    raw: Samples,
    unsafe_: Samples,
    floor: Samples,
    durable: Samples,
    ours: Samples,
    modes: ModeCycles,
}

/// The throughput rounds of raw, the floors and ours.
struct Rates {
    raw: Rate,
    floor: Rate,
    durable: Rate,
    ours: Rate,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (_server, url) = server_or_env(test_servers::RedisServer::start, |s| s.url())?;
    let bench = Bench::connect(url).await?;
    let mut table = Table::default();
    let rtt = bench.raw_round_trips(&mut table).await?;
    let raw_cycles = bench.uncontended_cycles(&mut table).await?;
    let our_new_keys = bench.new_key_per_cycle(&mut table, &raw_cycles).await?;
    bench.throughput(&mut table).await?;
    let (handles, handoffs) = bench.handoff(&mut table, rtt).await?;
    let peer_handles = bench
        .rslock(&mut table, &raw_cycles, &our_new_keys, &handoffs)
        .await?;
    bench.versus_peer(&mut table, handles, peer_handles).await?;
    println!("{table}");
    print_notes();
    Ok(())
}

impl Bench {
    /// Connects our store and the raw client, and prints the header.
    async fn connect(url: String) -> Result<Self, Box<dyn Error>> {
        let config = RedisConfig::from_url(&url)?.with_prefix("bench:")?;
        println!("Redis store benchmark against {config}");
        let store = RedisStore::connect(config.clone()).await?;
        let ours: DynLockStore = Arc::new(store.clone());

        // The raw client: the same connection type as the store's, with the same timeouts.
        let client = redis::Client::open(url.as_str())?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_response_timeout(Some(config.command_timeout()));
        let raw =
            ConnectionManager::new_with_config(client.clone(), manager_config.clone()).await?;
        let version = server_version(&raw).await?;
        println!(
            "server {version}, {} cores, load average {} (other work on this machine skews every figure)\n",
            num_cpus(),
            load_average()
        );
        Ok(Bench {
            url,
            config,
            ours,
            client,
            manager_config,
            raw,
            compare_and_delete: redis::Script::new(COMPARE_AND_DELETE),
            floor: Floor::new(),
            durable: Floor::durable(),
            run: run_id(),
        })
    }

    /// `PING`, `SET NX PX` and `EVALSHA` of a compare-and-delete; returns the raw round trip
    /// (the `SET NX PX` p50) that the handoff rows are measured against.
    async fn raw_round_trips(&self, table: &mut Table) -> fencelock_core::Result<Duration> {
        let ping = time_each(ITERATIONS, |_| {
            let mut raw = self.raw.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<String>(&mut raw)
                    .await
                    .map(drop)
                    .map_err(failed("PING"))
            }
        })
        .await?;
        let set_nx = time_each(ITERATIONS, |i| {
            let mut raw = self.raw.clone();
            async move {
                redis::cmd("SET")
                    .arg(format!("raw:set:{i}"))
                    .arg("x")
                    .arg("NX")
                    .arg("PX")
                    .arg(1_000)
                    .query_async::<Option<String>>(&mut raw)
                    .await
                    .map(drop)
                    .map_err(failed("SET NX PX"))
            }
        })
        .await?;
        let evalsha = time_each(ITERATIONS, |i| {
            let (mut raw, script) = (self.raw.clone(), self.compare_and_delete.clone());
            async move {
                script
                    .key(format!("raw:evalsha:{i}"))
                    .arg("nobody")
                    .invoke_async::<i64>(&mut raw)
                    .await
                    .map(drop)
                    .map_err(failed("EVALSHA"))
            }
        })
        .await?;
        let rtt = set_nx.p50();
        table.latency("raw PING p50", ping.p50());
        table.latency("raw SET NX PX p50 (the raw round trip)", rtt);
        table.latency("raw EVALSHA compare-and-delete p50", evalsha.p50());
        Ok(rtt)
    }

    /// The raw cycles, the floors and ours, exclusive and in the store's other modes; returns
    /// the raw cycle that later rows are measured against.
    async fn uncontended_cycles(&self, table: &mut Table) -> fencelock_core::Result<Samples> {
        let cycles = self.time_cycles().await?;
        cycles.rows(table);
        Ok(cycles.raw)
    }

    /// The raw cycles, the floors and ours one cycle each in turn, so all see the same machine
    /// load; ours also as a semaphore permit and as a shared lease, where the store keeps them,
    /// in alternating rounds.
    async fn time_cycles(&self) -> fencelock_core::Result<Cycles> {
        let (ours, floor, durable) = (&self.ours, &self.floor, &self.durable);
        cycle(ours, "cycle", TTL, 200).await?;
        let mut modes = ModeCycles::new(&ours.capabilities());
        modes.warm_up(ours, "cycle", TTL, 200).await?;
        for _ in 0..200 {
            floor.cycle(&mut self.raw.clone(), "cycle", TTL).await?;
            durable.cycle(&mut self.raw.clone(), "cycle", TTL).await?;
        }
        let (mut raw_samples, mut unsafe_samples, mut floor_samples, mut our_samples) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut durable_samples = Vec::new();
        let mut raw_conn = self.raw.clone();
        for _ in 0..ROUNDS {
            // One cycle of each in turn, so that a change in the machine's load falls on all of
            // them alike: in blocks of 200 cycles each, ours / the fenced floor moved between 1.04
            // and 1.13 from run to run; one at a time, between 1.02 and 1.09 (ten runs).
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                raw_cycle(&mut raw_conn, &self.compare_and_delete, "raw:cycle").await?;
                raw_samples.push(started.elapsed());
                let started = Instant::now();
                unsafe_cycle(&mut raw_conn, "raw:unsafe-cycle").await?;
                unsafe_samples.push(started.elapsed());
                let started = Instant::now();
                floor.cycle(&mut raw_conn, "cycle", TTL).await?;
                floor_samples.push(started.elapsed());
                let started = Instant::now();
                durable.cycle(&mut raw_conn, "cycle", TTL).await?;
                durable_samples.push(started.elapsed());
                cycle_into(ours, "cycle", TTL, 1, &mut our_samples).await?;
            }
            modes.round(ours, "cycle", TTL, ITERATIONS / ROUNDS).await?;
        }
        Ok(Cycles {
            raw: Samples::new(raw_samples),
            unsafe_: Samples::new(unsafe_samples),
            floor: Samples::new(floor_samples),
            durable: Samples::new(durable_samples),
            ours: Samples::new(our_samples),
            modes,
        })
    }

    /// The per-entity pattern: a key never locked before in every cycle (its fence is created,
    /// then left to expire after the retention window). Returns ours, for the rslock rows.
    async fn new_key_per_cycle(
        &self,
        table: &mut Table,
        raw_cycles: &Samples,
    ) -> fencelock_core::Result<Samples> {
        let run = self.run;
        let our_new_keys = time_each(ITERATIONS, |i| {
            let (ours, key) = (self.ours.clone(), format!("new-key:{run}:{i}"));
            async move {
                let lease = ours.try_acquire(&key, TTL).await?;
                ours.release(&lease).await.map(drop)
            }
        })
        .await?;
        table
            .latency("ours: a new key per cycle p50", our_new_keys.p50())
            .ratio(us(our_new_keys.p50()) / us(raw_cycles.p50()), None);
        table
            .latency("ours: a new key per cycle p99", our_new_keys.p99())
            .ratio(us(our_new_keys.p99()) / us(raw_cycles.p99()), None);
        Ok(our_new_keys)
    }

    /// Throughput: 64 tasks on distinct keys over one multiplexed connection each way, raw,
    /// the floors and ours in alternating rounds, with the server's own time per cycle.
    async fn throughput(&self, table: &mut Table) -> fencelock_core::Result<()> {
        let mut admin = self.raw.clone();
        let mut rates = Rates {
            raw: Rate::default(),
            floor: Rate::default(),
            durable: Rate::default(),
            ours: Rate::default(),
        };
        let slice = RUN_FOR / THROUGHPUT_ROUNDS;
        for _ in 0..THROUGHPUT_ROUNDS {
            let raw_run = throughput(TASKS, slice, {
                let (raw, script) = (self.raw.clone(), self.compare_and_delete.clone());
                move |task, _| {
                    let (mut raw, script) = (raw.clone(), script.clone());
                    async move { raw_cycle(&mut raw, &script, &format!("raw:throughput:{task}")).await }
                }
            });
            rates
                .raw
                .round(&mut admin, &["set", "evalsha"], raw_run)
                .await?;
            let floor_run = self.floor_throughput(&self.floor, slice);
            rates
                .floor
                .round(&mut admin, &["evalsha"], floor_run)
                .await?;
            let durable_run = self.floor_throughput(&self.durable, slice);
            rates
                .durable
                .round(&mut admin, &["evalsha"], durable_run)
                .await?;
            let our_run = lock_throughput(self.ours.clone(), "throughput:", TTL, TASKS, slice);
            rates.ours.round(&mut admin, &["evalsha"], our_run).await?;
        }
        rates.rows(table);
        rates.cost_rows(table);
        Ok(())
    }

    /// One throughput round of a fenced floor's cycle, `TASKS` tasks on distinct keys.
    fn floor_throughput(
        &self,
        floor: &Floor,
        slice: Duration,
    ) -> impl std::future::Future<Output = fencelock_core::Result<f64>> {
        throughput(TASKS, slice, {
            let (raw, floor) = (self.raw.clone(), floor.clone());
            move |task, _| {
                let (mut raw, floor) = (raw.clone(), floor.clone());
                async move {
                    floor
                        .cycle(&mut raw, &format!("throughput:{task}"), TTL)
                        .await
                }
            }
        })
    }

    /// Handoff: 8 waiters on one key, one store handle (two connections) each, next to its
    /// physical floor. Returns the handles, for the peers' protocol, and the handoffs.
    async fn handoff(
        &self,
        table: &mut Table,
        rtt: Duration,
    ) -> fencelock_core::Result<(Vec<DynLockStore>, Samples)> {
        let mut handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            handles.push(Arc::new(RedisStore::connect(self.config.clone()).await?));
        }
        let notify = raw_notify(&self.client, 500).await?;
        let handoffs = handoff_to_another(handles.clone(), "handoff", TTL, HOLD, HANDOFFS).await?;
        let reacquiring = handoff(handles.clone(), "handoff-any", TTL, HANDOFFS).await?;

        let handoff_rtts = us(handoffs.p50()) / us(rtt);
        table
            .latency(format!("handoff p50, {WAITERS} waiters"), handoffs.p50())
            .ratio(
                handoff_rtts,
                Some(("p50 ≤ 3 raw round trips", handoff_rtts <= 3.0)),
            );
        table
            .latency(format!("handoff p99, {WAITERS} waiters"), handoffs.p99())
            .ratio(us(handoffs.p99()) / us(rtt), None);
        table.latency("  raw PUBLISH → subscriber after idle p50", notify.p50());
        let floor = us(notify.p50()) + us(rtt);
        table.push(
            "  handoff p50 / (that + 1 raw round trip)",
            format!("{:.2}", us(handoffs.p50()) / floor),
        );
        table
            .latency(
                "  releaser may re-take (fencelock_bench) p50",
                reacquiring.p50(),
            )
            .ratio(us(reacquiring.p50()) / us(rtt), None);
        Ok((handles, handoffs))
    }

    /// The peer: rslock on the same server, its cycle, a new key per cycle and its handoff,
    /// one LockManager per waiter. Returns those handles, for the peers' protocol.
    async fn rslock(
        &self,
        table: &mut Table,
        raw_cycles: &Samples,
        our_new_keys: &Samples,
        handoffs: &Samples,
    ) -> fencelock_core::Result<Vec<DynLockStore>> {
        let peer: DynLockStore = Arc::new(Rslock::new(vec![self.url.clone()]));
        let peer_cycles = cycle(&peer, "rslock:cycle", TTL, ITERATIONS / 4).await?;
        let run = self.run;
        let peer_new_keys = time_each(ITERATIONS / 4, |i| {
            let (peer, key) = (peer.clone(), format!("rslock:new-key:{run}:{i}"));
            async move {
                let lease = peer.try_acquire(&key, TTL).await?;
                peer.release(&lease).await.map(drop)
            }
        })
        .await?;
        let mut peer_handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            peer_handles.push(Arc::new(Rslock::new(vec![self.url.clone()])));
        }
        let peer_handoffs = handoff_to_another(
            peer_handles.clone(),
            "rslock:handoff",
            TTL,
            HOLD,
            PEER_HANDOFFS,
        )
        .await?;

        table
            .latency("rslock: lock + unlock p50", peer_cycles.p50())
            .ratio(us(peer_cycles.p50()) / us(raw_cycles.p50()), None);
        table.latency("rslock: lock + unlock p99", peer_cycles.p99());
        table
            .latency("rslock: a new key per cycle p50", peer_new_keys.p50())
            .ratio(us(peer_new_keys.p50()) / us(raw_cycles.p50()), None);
        table.push(
            "  ours / rslock, a new key per cycle p50",
            format!("{:.2}", us(our_new_keys.p50()) / us(peer_new_keys.p50())),
        );
        rslock_handoff_rows(table, WAITERS, handoffs, &peer_handoffs);
        Ok(peer_handles)
    }

    /// The peers' protocol (8 contenders on one key, hold 1 ms, pause 30 ms): ours against
    /// rslock, in interleaved rounds, on the handles of the handoff runs, and the durable fenced
    /// floor in the same rounds (its acquire script, waiting on the release's PUBLISH).
    async fn versus_peer(
        &self,
        table: &mut Table,
        handles: Vec<DynLockStore>,
        peer_handles: Vec<DynLockStore>,
    ) -> fencelock_core::Result<()> {
        let wait = Duration::from_secs(60);
        let mut floor_contenders = Vec::with_capacity(PEERS_CONTENDERS);
        for _ in 0..PEERS_CONTENDERS {
            floor_contenders.push(
                FloorContender::connect(
                    &self.client,
                    self.manager_config.clone(),
                    self.durable.clone(),
                    "protocol",
                )
                .await?,
            );
        }
        let protocol = PeersProtocol::HARNESS
            .run_with_floor(
                store_contenders(handles[..PEERS_CONTENDERS].to_vec(), "protocol", TTL, wait),
                store_contenders(
                    peer_handles[..PEERS_CONTENDERS].to_vec(),
                    "rslock:protocol",
                    TTL,
                    wait,
                ),
                floor_contenders,
            )
            .await?;
        protocol.rows_with_floor(table, "rslock", 1.0, "the durable fenced floor");
        Ok(())
    }
}

impl Cycles {
    /// The cycle rows: the raw cycle, the floors and ours against it, then ours in each mode.
    fn rows(&self, table: &mut Table) {
        let (raw, ours) = (&self.raw, &self.ours);
        table.latency("raw cycle: SET NX PX + EVALSHA p50", raw.p50());
        table.latency("raw cycle p99", raw.p99());
        table
            .latency("SET NX PX + DEL (unsafe floor) p50", self.unsafe_.p50())
            .ratio(us(self.unsafe_.p50()) / us(raw.p50()), None);
        table
            .latency(
                "raw fenced floor: EVALSHA acquire + release p50",
                self.floor.p50(),
            )
            .ratio(us(self.floor.p50()) / us(raw.p50()), None);
        table
            .latency("raw fenced floor p99", self.floor.p99())
            .ratio(us(self.floor.p99()) / us(raw.p99()), None);
        let cycle_ratio = us(ours.p50()) / us(raw.p50());
        table
            .latency("ours: try_acquire + release p50", ours.p50())
            .ratio(
                cycle_ratio,
                Some(("≤ 1.15× the raw cycle", cycle_ratio <= 1.15)),
            );
        let floor_ratio = us(ours.p50()) / us(self.floor.p50());
        let durable_cycle_reach = us(self.durable.p50()) / us(self.floor.p50());
        table
            .push("  ours / the fenced floor, p50", String::new())
            .ratio(
                floor_ratio,
                Some((
                    if durable_cycle_reach > 1.1 {
                        "≤ 1.1× the fenced floor (out of reach of durable tokens in this run, below)"
                    } else {
                        "≤ 1.1× the fenced floor"
                    },
                    floor_ratio <= 1.1,
                )),
            );
        table
            .latency(
                "raw durable fenced floor (tokens survive data loss) p50",
                self.durable.p50(),
            )
            .ratio(us(self.durable.p50()) / us(raw.p50()), None);
        table.push(
            "  ours / the durable fenced floor, p50",
            format!("{:.2}", us(ours.p50()) / us(self.durable.p50())),
        );
        table.push(
            "  the durable floor / the fenced floor, p50: the least durable tokens allow",
            format!("{durable_cycle_reach:.2}"),
        );
        table
            .latency("ours: try_acquire + release p99", ours.p99())
            .ratio(us(ours.p99()) / us(raw.p99()), None);
        self.modes
            .rows(table, "ours: ", Some(raw.p50()), Some(raw.p99()));
    }
}

impl Rates {
    /// The rate rows: raw, the floors and ours, with ours against raw and the floors.
    fn rows(&self, table: &mut Table) {
        let (raw, floor, durable, ours) = (
            self.raw.per_second(),
            self.floor.per_second(),
            self.durable.per_second(),
            self.ours.per_second(),
        );
        table.rate(format!("raw cycle, {TASKS} tasks, distinct keys"), raw);
        table
            .rate(
                format!("raw fenced floor, {TASKS} tasks, distinct keys"),
                floor,
            )
            .ratio(floor / raw, None);
        let rate_ratio = ours / raw;
        table
            .rate(format!("ours, {TASKS} tasks, distinct keys"), ours)
            .ratio(rate_ratio, Some(("≥ 0.8× raw", rate_ratio >= 0.8)));
        let floor_rate_ratio = ours / floor;
        let durable_reach = durable / floor;
        table
            .push("  ours / the fenced floor, throughput", String::new())
            .ratio(
                floor_rate_ratio,
                Some((
                    if durable_reach < 0.9 {
                        "≥ 0.9× the fenced floor (out of reach of durable tokens in this run, below)"
                    } else {
                        "≥ 0.9× the fenced floor"
                    },
                    floor_rate_ratio >= 0.9,
                )),
            );
        table.rate(
            format!("raw durable fenced floor, {TASKS} tasks, distinct keys"),
            durable,
        );
        table.push(
            "  ours / the durable fenced floor, throughput",
            format!("{:.2}", ours / durable),
        );
        table.push(
            "  the durable floor / the fenced floor: the most durable tokens allow",
            format!(
                "{durable_reach:.2}{}",
                if durable_reach < 0.9 {
                    " (0.9× is out of reach of tokens that survive data loss in this run)"
                } else {
                    ""
                }
            ),
        );
    }

    /// What a cycle cost the server and this process, per contender.
    fn cost_rows(&self, table: &mut Table) {
        let each = |f: fn(&Rate) -> f64| {
            [&self.raw, &self.floor, &self.durable, &self.ours]
                .map(|r| format!("{:.1}", f(r)))
                .join(" / ")
                + " µs"
        };
        table.push(
            "  server CPU per cycle (main thread): raw / floor / durable / ours",
            each(Rate::cpu_per_cycle),
        );
        table.push(
            "  client CPU per cycle (this process): raw / floor / durable / ours",
            each(Rate::client_cpu_per_cycle),
        );
        table.push(
            "  server time in commands per cycle: raw / floor / durable / ours",
            each(Rate::commands_per_cycle),
        );
    }
}

/// The notes under the table: what the floors are, what each ratio divides, the samples.
fn print_notes() {
    println!(
        "the raw fenced floor: the two scripts of the fenced floor by EVALSHA on the same kind of \
         connection (SET NX PX + INCR of a counter; GET, DEL, PUBLISH), a fresh random owner \
         per cycle; it has no expiring fence and no clock floor, so its tokens do not survive \
         the loss of the counter. The durable floor adds what ours must do for that (TIME, \
         and the counter written as max(counter + 1, TIME µs) with its retention expiry in \
         one SET … GET instead of INCR), by hand, with the same release. Server time: the main thread's CPU (INFO cpu), and the \
         commandstats time of the commands the client sent (a script counted once, with the \
         commands it calls)."
    );
    println!(
        "ratios: cycle rows to the raw cycle; handoff rows to the raw SET NX PX round trip; \
         the rslock handoff row is rslock's p50 over ours; the peers' protocol rows are \
         ours (and the durable fenced floor's, taking the key by its acquire script and \
         waiting on its release's PUBLISH, in the same rounds) over rslock's. Handoffs go to another waiter (the releaser waits for the next \
         grant before contending again), except the \"releaser may re-take\" row."
    );
    println!("load average at the end: {}", load_average());
    println!(
        "samples: {ITERATIONS} round trips and cycles each (the raw cycles, the floors and \
         ours one cycle each in turn), {} rslock cycles, {HANDOFFS} handoffs ({PEER_HANDOFFS} \
         for rslock), throughput over {RUN_FOR:?} each (raw, the floors and ours alternating \
         in {THROUGHPUT_ROUNDS} rounds)",
        ITERATIONS / 4
    );
}

/// A tag for this run's keys, so "a new key per cycle" is new on a server used before.
fn run_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The 1, 5 and 15 minute load averages, where Linux tells them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
