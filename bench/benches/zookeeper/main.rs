//! The ZooKeeper store against the raw requests it is built on, and against Apache Curator's
//! `InterProcessMutex` (the recipe whose queue it shares), measured in one run against one
//! server.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench zookeeper                # the whole run
//! cargo bench -p fencelock-bench --bench zookeeper -- --quick     # a short profile
//! cargo bench -p fencelock-bench --bench zookeeper -- many 10000  # leases held only
//! ```
//!
//! Starts its own standalone server with test-servers (`tickTime` 100 ms, `forceSync=yes`), or
//! uses `LOCK_BENCH_URL` if set. Compiles the Curator peer (`bench/peers/CuratorBench.java`)
//! with `javac` and runs it in one JVM for the whole run (Debian's `default-jdk-headless` and
//! `libcurator-recipes-java`). Prints one table: the raw round trips (a read, a write); the raw
//! cycle floor (an ephemeral sequential node created and deleted, the same client library,
//! `zookeeper-client`), and the three requests a queue lock makes (create, read the queue,
//! delete) by hand, one after another and with the read pipelined behind the create, and
//! that pipelined cycle with the create sent as our layout sends it, one `multi` with the
//! token offset's check (the fenced floor); our
//! try_acquire + release cycle and its ratio to the floor, and Curator's acquire() +
//! release(), all in alternating rounds; throughput on distinct
//! keys, raw and ours; handoff latency with 8 waiters on one key (ours, one handle each, and
//! Curator's, one client each, by the same loop, in alternating rounds, next to the raw floor
//! of a delete seen by another session's watch); the same handoff one waiter at a time,
//! parked 20 ms in its wait (ours, Curator's, the floor after the same idle); and 10,000
//! leases held at once from one handle, kept alive for 3 TTLs (TTL 10 s), with the sessions,
//! connections and client memory per lease.
//!
//! `--quick` runs every part with fewer samples and 500 leases of TTL 2 s (about half a
//! minute, most of it the JVM's compile and start); `many N` runs only the held leases, N of
//! them (with `--quick`: TTL 2 s).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::{
    cycle_into, handoff, lock_throughput, micros as us, server_or_env, throughput, time_each,
    Samples, Table,
};
use fencelock_core::DynLockStore;
use fencelock_zookeeper::{ZookeeperConfig, ZookeeperStore};
use tokio::time::Instant;
use zookeeper_client as zk;

mod curator;
mod many;
mod raw;

#[global_allocator]
static ALLOCATOR: many::CountingAllocator = many::CountingAllocator;

/// At most the test server's `maxSessionTimeout` (10 s), the longest TTL it allows.
const TTL: Duration = Duration::from_secs(10);
const TASKS: usize = 16;
const WAITERS: usize = 8;
/// Acquires in flight while taking the held leases.
const HELD_IN_FLIGHT: usize = 32;
/// How long a quiet handoff's waiter is parked in its wait before the release (as
/// `CuratorBench.java`'s `PARKED_MS`).
const PARKED: Duration = Duration::from_millis(20);

/// How many samples of each part: the whole run, or the short profile (`--quick`).
struct Profile {
    iterations: usize,
    rounds: usize,
    run_for: Duration,
    handoffs: usize,
    handoff_rounds: usize,
    quiet_handoffs: usize,
    held: usize,
    held_ttl: Duration,
}

const FULL: Profile = Profile {
    iterations: 600,
    rounds: 10,
    run_for: Duration::from_secs(2),
    handoffs: 800,
    handoff_rounds: 8,
    quiet_handoffs: 40,
    held: 10_000,
    held_ttl: Duration::from_secs(10),
};

const QUICK: Profile = Profile {
    iterations: 100,
    rounds: 4,
    run_for: Duration::from_millis(500),
    handoffs: 100,
    handoff_rounds: 2,
    quiet_handoffs: 8,
    held: 500,
    held_ttl: Duration::from_secs(2),
};

const USAGE: &str = "usage: bench [--quick] [many N]";

fn joined<T>(joined: Result<T, tokio::task::JoinError>) -> fencelock_core::Result<T> {
    joined.map_err(|e| fencelock_core::Error::store("a benchmark task failed", e))
}

/// One handoff with nothing else running: `handles[0]` holds `key`, `handles[1]` queues
/// behind it (its node seen in the queue by `observer`, then parked in its wait for
/// [`PARKED`]); the time from the holder's release to the waiter's grant. As
/// `CuratorBench.java`'s `quiet`.
async fn quiet_handoff(
    handles: &[DynLockStore],
    observer: &zk::Client,
    container: &str,
    key: &str,
) -> fencelock_core::Result<Duration> {
    let holder = handles[0].try_acquire(key, TTL).await?;
    let waiter = tokio::spawn({
        let (store, key) = (handles[1].clone(), key.to_owned());
        async move {
            let lease = store.acquire(&key, TTL, Duration::from_secs(10)).await;
            (Instant::now(), lease)
        }
    });
    loop {
        match observer.list_children(container).await {
            Ok(children) if children.len() >= 2 => break,
            Ok(_) | Err(zk::Error::NoNode) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(e) => return Err(fencelock_core::Error::store("listing the queue", e)),
        }
    }
    tokio::time::sleep(PARKED).await;
    let released_at = Instant::now();
    let _ = handles[0].release(&holder).await?;
    let (granted_at, lease) = joined(waiter.await)?;
    let _ = handles[1].release(&lease?).await?;
    Ok(granted_at - released_at)
}

/// The server's version line from `srvr`, where the server answers it.
fn server_version(endpoint: &str) -> Option<String> {
    use std::io::{Read, Write};
    let address = endpoint.parse().ok()?;
    let mut socket =
        std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    socket.write_all(b"srvr").ok()?;
    let mut answer = String::new();
    socket.read_to_string(&mut answer).ok()?;
    let version = answer.lines().next()?.strip_prefix("Zookeeper version: ")?;
    Some(version.split(',').next()?.trim().to_owned())
}

/// Runs a blocking call of the Curator peer on this worker thread.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// What the scenarios before the held leases share: our store, a raw session of the same
/// library and Curator's clients. Closed before the held leases, which run with no other
/// session open.
struct Bench {
    profile: Profile,
    config: ZookeeperConfig,
    /// The connect string, with the chroot.
    connect: String,
    ours: DynLockStore,
    raw_client: zk::Client,
    curator: curator::Curator,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (profile, many_only) = parse_args()?;
    let (_server, url) = server_or_env(test_servers::ZookeeperEnsemble::start_standalone, |s| {
        s.url()
    })?;
    let config = ZookeeperConfig::from_url(&url)?;
    let endpoints = config.endpoints().to_vec();
    let ports: Vec<u16> = endpoints
        .iter()
        .filter_map(|e| e.rsplit(':').next()?.parse().ok())
        .collect();
    println!("ZooKeeper store benchmark against {config}");
    println!(
        "server ZooKeeper {}",
        server_version(&endpoints[0]).unwrap_or_else(|| "(version not known)".into())
    );

    if let Some(count) = many_only {
        println!();
        let mut table = Table::default();
        held_leases(&mut table, &config, count, profile.held_ttl, &ports).await?;
        println!("{table}");
        return Ok(());
    }

    let (held, held_ttl) = (profile.held, profile.held_ttl);
    let mut bench = Bench::connect(config.clone(), profile).await?;
    let mut table = Table::default();
    let raw_read = bench.raw_round_trips(&mut table).await?;
    let raw_floor = bench.uncontended_cycles(&mut table).await?;
    bench.throughput(&mut table).await?;
    let (handles, floor, handoff_floor) = bench.handoff(&mut table).await?;
    bench.quiet_handoff(&mut table, handles, floor).await?;
    let profile = bench.close();
    held_leases(&mut table, &config, held, held_ttl, &ports).await?;
    println!("{table}");
    println!(
        "samples: {} cycles each, {} handoffs each, {} quiet handoffs each; raw get_data p99 {:.1} µs, raw floor p99 {:.1} µs, raw handoff floor p99 {:.1} µs",
        profile.iterations,
        profile.handoffs,
        profile.quiet_handoffs,
        us(raw_read.p99()),
        us(raw_floor.p99()),
        us(handoff_floor.p99())
    );
    Ok(())
}

/// The node whose version the raw fenced floor's `multi` checks, as ours checks its token
/// offset's.
const FENCED_OFFSET: &str = "/bench-raw/fenced-offset";

/// `[--quick] [many N]`: the profile, and the count of leases to hold when only that runs.
fn parse_args() -> Result<(Profile, Option<usize>), Box<dyn Error>> {
    let mut args = fencelock_bench::args().peekable();
    let (mut quick, mut many_only) = (false, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "many" => {
                let n = args.next().and_then(|n| n.parse::<usize>().ok());
                many_only = Some(n.ok_or(USAGE)?);
            }
            _ => return Err(USAGE.into()),
        }
    }
    Ok((if quick { QUICK } else { FULL }, many_only))
}

/// Many leases held at once from one handle, each kept alive; no other session open.
async fn held_leases(
    table: &mut Table,
    config: &ZookeeperConfig,
    count: usize,
    ttl: Duration,
    ports: &[u16],
) -> fencelock_core::Result<()> {
    let held = many::hold(config, "bench:held:", count, ttl, HELD_IN_FLIGHT, ports).await?;
    held_rows(table, &held, ttl);
    Ok(())
}

impl Bench {
    /// Connects our store, the raw session and Curator's clients (compiling Curator's side),
    /// and prints the last line of the heading.
    async fn connect(config: ZookeeperConfig, profile: Profile) -> Result<Self, Box<dyn Error>> {
        let connect = format!("{}{}", config.endpoints().join(","), config.chroot());
        let store = ZookeeperStore::connect(config.clone()).await?;
        let ours: DynLockStore = Arc::new(store);
        let raw_client = raw::connect(&connect).await?;
        let curator = blocking(|| curator::Curator::start(&connect, WAITERS))?;
        println!(
            // In the heading, before the blank line that starts the table (scripts/bench_charts.py).
            "Curator peer compiled in {:.1} s, {WAITERS} clients connected\n",
            curator.compiled_in.as_secs_f64()
        );
        Ok(Bench {
            profile,
            config,
            connect,
            ours,
            raw_client,
            curator,
        })
    }

    /// Closes Curator's clients, our store and the raw session, so the held leases run with
    /// no other session open; returns the profile.
    fn close(self) -> Profile {
        let Bench {
            profile,
            ours,
            raw_client,
            curator,
            ..
        } = self;
        blocking(|| drop(curator));
        drop((ours, raw_client));
        profile
    }

    /// Raw round trips with the same client library: a read, a write. Returns the read.
    async fn raw_round_trips(&self, table: &mut Table) -> fencelock_core::Result<Samples> {
        let raw_client = &self.raw_client;
        raw::ensure(raw_client, "/bench-raw/read").await?;
        let raw_read = time_each(self.profile.iterations, |_| {
            let raw_client = raw_client.clone();
            async move {
                raw_client
                    .get_data("/bench-raw/read")
                    .await
                    .map(drop)
                    .map_err(|e| fencelock_core::Error::store("raw get_data", e))
            }
        })
        .await?;
        let raw_write = time_each(self.profile.iterations, |_| {
            let raw_client = raw_client.clone();
            async move {
                raw_client
                    .set_data("/bench-raw/read", b"x", None)
                    .await
                    .map(drop)
                    .map_err(|e| fencelock_core::Error::store("raw set_data", e))
            }
        })
        .await?;
        table.latency("raw round trip: get_data p50", raw_read.p50());
        table.latency("raw round trip: set_data p50", raw_write.p50());
        Ok(raw_read)
    }

    /// The raw floor, our cycle and Curator's in alternating rounds, so all three see the same
    /// machine load; each warmed up first. Returns the raw floor.
    async fn uncontended_cycles(&mut self, table: &mut Table) -> fencelock_core::Result<Samples> {
        let (raw_client, ours) = (&self.raw_client, &self.ours);
        for parent in [
            "/bench-raw/cycle",
            "/bench-raw/queue",
            "/bench-raw/pipelined",
            "/bench-raw/fenced",
            FENCED_OFFSET,
        ] {
            raw::ensure(raw_client, parent).await?;
        }
        for _ in 0..50 {
            raw::cycle(raw_client, "/bench-raw/cycle").await?;
            raw::queue_cycle(raw_client, "/bench-raw/queue", false).await?;
            raw::queue_cycle(raw_client, "/bench-raw/pipelined", true).await?;
            raw::fenced_queue_cycle(raw_client, "/bench-raw/fenced", FENCED_OFFSET).await?;
            let lease = ours.try_acquire("bench:cycle", TTL).await?;
            let _ = ours.release(&lease).await?;
        }
        blocking(|| self.curator.run("cycle /bench-curator/cycle 200"))?;
        let per_round = self.profile.iterations / self.profile.rounds;
        let (mut raw_samples, mut our_samples, mut curator_rounds) =
            (Vec::new(), Vec::new(), Vec::new());
        let (mut queue_samples, mut pipelined_samples, mut fenced_samples) =
            (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..self.profile.rounds {
            for _ in 0..per_round {
                let started = Instant::now();
                raw::cycle(raw_client, "/bench-raw/cycle").await?;
                raw_samples.push(started.elapsed());
                let started = Instant::now();
                raw::queue_cycle(raw_client, "/bench-raw/queue", false).await?;
                queue_samples.push(started.elapsed());
                let started = Instant::now();
                raw::queue_cycle(raw_client, "/bench-raw/pipelined", true).await?;
                pipelined_samples.push(started.elapsed());
                let started = Instant::now();
                raw::fenced_queue_cycle(raw_client, "/bench-raw/fenced", FENCED_OFFSET).await?;
                fenced_samples.push(started.elapsed());
            }
            cycle_into(ours, "bench:cycle", TTL, per_round, &mut our_samples).await?;
            let command = format!("cycle /bench-curator/cycle {per_round}");
            curator_rounds.push(blocking(|| self.curator.run(&command))?);
        }
        let raw_floor = Samples::new(raw_samples);
        cycle_rows(
            table,
            &raw_floor,
            &Samples::new(queue_samples),
            &Samples::new(pipelined_samples),
            &Samples::new(fenced_samples),
            &Samples::new(our_samples),
            &Samples::merged(curator_rounds),
        );
        Ok(raw_floor)
    }

    /// Throughput: 16 tasks on distinct keys, raw floor and ours, one session each side.
    async fn throughput(&self, table: &mut Table) -> fencelock_core::Result<()> {
        for task in 0..TASKS {
            raw::ensure(&self.raw_client, &format!("/bench-raw/throughput/{task}")).await?;
        }
        let raw_rate =
            throughput(TASKS, self.profile.run_for, {
                let raw_client = self.raw_client.clone();
                move |task, _| {
                    let raw_client = raw_client.clone();
                    async move {
                        raw::cycle(&raw_client, &format!("/bench-raw/throughput/{task}")).await
                    }
                }
            })
            .await?;
        let our_rate = lock_throughput(
            self.ours.clone(),
            "bench:throughput:",
            TTL,
            TASKS,
            self.profile.run_for,
        )
        .await?;
        table.rate(
            format!("raw floor, {TASKS} tasks, distinct parents"),
            raw_rate,
        );
        table
            .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
            .ratio(our_rate / raw_rate, None);
        Ok(())
    }

    /// Handoff: 8 waiters on one key, ours (a handle each) and Curator's (a client each) by the
    /// same loop in alternating rounds, and the raw floor (a delete seen by another session's
    /// watch) between them. Each round on a key of its own: the waiters a round ends with are
    /// aborted, and what they leave queued must not stand in front of the next round. Returns
    /// our handles and the floor, for the quiet handoff, and the floor's samples.
    async fn handoff(
        &mut self,
        table: &mut Table,
    ) -> fencelock_core::Result<(Vec<DynLockStore>, raw::HandoffFloor, Samples)> {
        let mut handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            handles.push(Arc::new(
                ZookeeperStore::connect(self.config.clone()).await?,
            ));
        }
        let mut floor = raw::HandoffFloor::connect(&self.connect, "/bench-raw/handoff").await?;
        let _ = handoff(handles.clone(), "bench:handoff:warm", TTL, 50).await?;
        blocking(|| self.curator.run("handoff /bench-curator/handoff/warm 50"))?;
        let (mut ours_rounds, mut curator_rounds, mut floor_rounds) =
            (Vec::new(), Vec::new(), Vec::new());
        let per_round = self.profile.handoffs / self.profile.handoff_rounds;
        for round in 0..self.profile.handoff_rounds {
            let key = format!("bench:handoff:{round}");
            ours_rounds.push(handoff(handles.clone(), &key, TTL, per_round).await?);
            let command = format!("handoff /bench-curator/handoff/{round} {per_round}");
            curator_rounds.push(blocking(|| self.curator.run(&command))?);
            floor_rounds.push(floor.run(per_round).await?);
        }
        let handoff_floor = Samples::merged(floor_rounds);
        handoff_rows(
            table,
            &Samples::merged(ours_rounds),
            &Samples::merged(curator_rounds),
            &handoff_floor,
        );
        Ok((handles, floor, handoff_floor))
    }

    /// The same handoff one waiter at a time, parked in its wait first: ours, Curator's, the
    /// floor after the same idle, alternating. Our handles and the floor are closed after it.
    async fn quiet_handoff(
        &mut self,
        table: &mut Table,
        handles: Vec<DynLockStore>,
        mut floor: raw::HandoffFloor,
    ) -> fencelock_core::Result<()> {
        let (mut quiet_ours, mut quiet_curator, mut quiet_floor) =
            (Vec::new(), Vec::new(), Vec::new());
        for i in 0..self.profile.quiet_handoffs {
            let key = format!("bench:quiet:{i}");
            let container = self.config.lock_path(&key);
            quiet_ours.push(quiet_handoff(&handles, &self.raw_client, &container, &key).await?);
            let command = format!("quiet /bench-curator/quiet/{i} 1");
            quiet_curator.push(blocking(|| self.curator.run(&command))?.p50());
            quiet_floor.push(floor.sample(PARKED).await?);
        }
        let (quiet_ours, quiet_curator, quiet_floor) = (
            Samples::new(quiet_ours),
            Samples::new(quiet_curator),
            Samples::new(quiet_floor),
        );
        drop((handles, floor));
        table
            .latency(
                "quiet handoff p50, one waiter parked 20 ms: ours",
                quiet_ours.p50(),
            )
            .ratio(us(quiet_ours.p50()) / us(quiet_floor.p50()), None);
        table
            .latency("quiet handoff p50: Curator", quiet_curator.p50())
            .ratio(us(quiet_curator.p50()) / us(quiet_floor.p50()), None);
        table.latency(
            "quiet handoff p50: raw floor after the same idle",
            quiet_floor.p50(),
        );
        let quiet_versus = us(quiet_ours.p50()) / us(quiet_curator.p50());
        table
            .push(
                "quiet handoff p50 ours / Curator",
                format!("{quiet_versus:.2}"),
            )
            .target = Some(("≤ 1.0× Curator's handoff".into(), quiet_versus <= 1.0));
        Ok(())
    }
}

/// The cycle rows: the raw floor, ours, the raw queue cycles (the requests ours makes) and
/// Curator's, each against the raw floor.
fn cycle_rows(
    table: &mut Table,
    raw_floor: &Samples,
    queue_floor: &Samples,
    pipelined_floor: &Samples,
    fenced_floor: &Samples,
    ours: &Samples,
    curator_cycle: &Samples,
) {
    table.latency(
        "raw floor: create ephemeral sequential + delete p50",
        raw_floor.p50(),
    );
    let ratio = us(ours.p50()) / us(raw_floor.p50());
    table
        .latency("ours: try_acquire + release p50", ours.p50())
        .ratio(ratio, Some(("≤ 1.2× raw floor", ratio <= 1.2)));
    table.latency("ours: try_acquire + release p99", ours.p99());
    table
        .latency(
            "  raw queue cycle: create, then list_children, then delete p50",
            queue_floor.p50(),
        )
        .ratio(us(queue_floor.p50()) / us(raw_floor.p50()), None);
    table
        .latency(
            "  raw queue cycle, create and list_children pipelined p50",
            pipelined_floor.p50(),
        )
        .ratio(us(pipelined_floor.p50()) / us(raw_floor.p50()), None);
    table.push(
        "  ours / raw queue cycle (the same three requests)",
        format!("{:.2}", us(ours.p50()) / us(queue_floor.p50())),
    );
    table
        .latency(
            "  raw fenced floor: pipelined, the create our multi (offset check, container write) p50",
            fenced_floor.p50(),
        )
        .ratio(us(fenced_floor.p50()) / us(raw_floor.p50()), None);
    let fenced_versus_pipelined = us(fenced_floor.p50()) / us(pipelined_floor.p50());
    table.push(
        "  the fenced floor / raw queue cycle pipelined",
        format!("{fenced_versus_pipelined:.2}"),
    );
    table.push(
        "  ours / the fenced floor",
        format!("{:.2}", us(ours.p50()) / us(fenced_floor.p50())),
    );
    let versus_pipelined = us(ours.p50()) / us(pipelined_floor.p50());
    let target = if fenced_versus_pipelined > 1.05 {
        "≤ 1.05× the pipelined queue cycle (out of reach of the fenced floor in this run, above)"
    } else {
        "≤ 1.05× the pipelined queue cycle"
    };
    table
        .push(
            "  ours / raw queue cycle pipelined (as far as the protocol allows)",
            format!("{versus_pipelined:.2}"),
        )
        .ratio(versus_pipelined, Some((target, versus_pipelined <= 1.05)));
    table
        .latency("Curator: acquire() + release() p50", curator_cycle.p50())
        .ratio(us(curator_cycle.p50()) / us(raw_floor.p50()), None);
    table.latency("Curator: acquire() + release() p99", curator_cycle.p99());
}

/// The handoff rows: ours and Curator's against the raw floor, and ours against Curator's.
fn handoff_rows(
    table: &mut Table,
    handoffs: &Samples,
    curator_handoffs: &Samples,
    handoff_floor: &Samples,
) {
    table
        .latency(
            format!("handoff p50, {WAITERS} waiters: ours"),
            handoffs.p50(),
        )
        .ratio(us(handoffs.p50()) / us(handoff_floor.p50()), None);
    table.latency(
        format!("handoff p99, {WAITERS} waiters: ours"),
        handoffs.p99(),
    );
    table
        .latency(
            format!("handoff p50, {WAITERS} waiters: Curator"),
            curator_handoffs.p50(),
        )
        .ratio(us(curator_handoffs.p50()) / us(handoff_floor.p50()), None);
    table.latency(
        format!("handoff p99, {WAITERS} waiters: Curator"),
        curator_handoffs.p99(),
    );
    let versus = us(handoffs.p50()) / us(curator_handoffs.p50());
    table
        .push("handoff p50 ours / Curator", format!("{versus:.2}"))
        .target = Some(("≤ 1.0× Curator's handoff".into(), versus <= 1.0));
    table.latency(
        "raw handoff floor: delete → another session's watch event p50",
        handoff_floor.p50(),
    );
}

/// The held leases' rows.
fn held_rows(table: &mut Table, held: &many::Held, ttl: Duration) {
    let n = held.count;
    table
        .push(
            format!("{n} leases held with keep-alive from one handle, TTL {ttl:?}, for 3 TTLs"),
            format!("{} lost", held.lost),
        )
        .target = Some((format!("{n} held, none lost"), held.lost == 0));
    table.push(
        "  leases already gone at their release after the hold",
        held.gone_at_release.to_string(),
    );
    let timeouts: Vec<String> = held
        .sessions
        .iter()
        .map(|t| format!("{} ms", t.as_millis()))
        .collect();
    table.push(
        "  ZooKeeper sessions of the handle (negotiated timeouts)",
        format!("{} ({})", held.sessions.len(), timeouts.join(", ")),
    );
    table.push(
        "  client TCP connections to ZooKeeper while held",
        format!(
            "{}; {} before the handle",
            held.connections
                .map_or("not measured".into(), |(lo, hi)| if lo == hi {
                    format!("{lo} (constant)")
                } else {
                    format!("{lo}–{hi} (NOT constant)")
                }),
            held.connections_before
                .map_or("not measured".into(), |c| c.to_string())
        ),
    );
    table.push(
        "  client memory per lease: heap live / RSS growth",
        format!("{:.0} B / {:.0} B", held.heap_per_lease, held.rss_per_lease),
    );
    table.push(
        format!("  time to acquire {n} ({HELD_IN_FLIGHT} in flight)"),
        format!("{:.0} ms", held.acquired_in.as_secs_f64() * 1e3),
    );
    table.latency("  extend p50 while they are kept alive", held.extends.p50());
    table.latency("  extend p99 while they are kept alive", held.extends.p99());
    table.push(
        "  extends of one more lease that failed and would be retried",
        format!(
            "{} of {}",
            held.extends_failed,
            held.extends.len() + held.extends_failed
        ),
    );
}
