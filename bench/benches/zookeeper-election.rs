//! Leader election on the ZooKeeper store against Apache Curator's `LeaderSelector` (the recipe
//! whose queue the store shares), measured in one run against one server, the two sides in
//! alternating rounds.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench zookeeper-election
//! ```
//!
//! Starts its own standalone server with test-servers (`tickTime` 100 ms), or uses
//! `LOCK_BENCH_URL` if set. Compiles the Curator peer (`bench/peers/CuratorElectionBench.java`)
//! with `javac` and runs it in one JVM for the whole run, timing its own trials with
//! `System.nanoTime` (Debian's `default-jdk-headless` and `libcurator-recipes-java`). Prints
//! one table:
//!
//! - handover after resign: a leader granted with nobody queued, then two candidates queued
//!   behind it and parked 50 ms in their campaigns; the time from the leader's resign being
//!   sent to the first candidate's campaign returning (Curator: from `takeLeadership` being
//!   told to return to the next selector's `takeLeadership` being called), then the same from
//!   that candidate to the second (p50, mean, p99 of both, ours / Curator's, target ≤ 1.0×);
//! - observe: in the same trials, an observer parked on the election; the time from each
//!   resign to the observer's first item naming the new leader (target ≤ 1.0×). Curator's
//!   `LeaderSelector` has no observer of its own: its side is a `CuratorCache` on the election
//!   path, whose listener names the lowest-sequence child's data (the participant id);
//! - what each side reads to name a leader, timed after each trial: our status read, and
//!   `LeaderSelector.getLeader()`; next to the raw floor of a delete seen by another session's
//!   watch after the same idle;
//! - failover: the leader runs in a child process (this example in a leader mode, or the peer
//!   class in its leader mode in a JVM of its own) that is SIGKILLed at spread moments; the
//!   time from the kill to the parked candidate leading, against the session timeout (2 s
//!   both sides: our TTL, which is the lease's session timeout, and Curator's
//!   `sessionTimeoutMs`), and against that plus the two ticks by which the server may expire a
//!   session late (the crate README's "holder dies").

use std::error::Error;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::{against_rows, micros as us, server_or_env, versus_rows};
use fencelock_bench::{Samples, Table};
use fencelock_core::{DynLockStore, LockStoreExt};
use fencelock_zookeeper::{ZookeeperConfig, ZookeeperStore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use zookeeper_client as zk;

// Only the peer's start and its pipes are used here.
#[allow(dead_code)]
#[path = "zookeeper/curator.rs"]
mod curator;
// Only the connect and the handoff floor are used here.
#[allow(dead_code)]
#[path = "zookeeper/raw.rs"]
mod raw;

const SOURCE: &str = include_str!("../peers/CuratorElectionBench.java");

/// Trials per side, in [`ROUNDS`] alternating rounds; two handovers each.
const TRIALS: usize = 60;
const ROUNDS: usize = 6;
/// Failovers per side, alternating.
const FAILOVERS: usize = 8;
/// The lease TTL of the handover trials (never reached).
const TTL: Duration = Duration::from_secs(10);
/// The session timeout of the failover trials' leaders, each side.
const FAILOVER_TTL: Duration = Duration::from_secs(2);
/// How long the candidates and the observer park before each change.
const PARK: Duration = Duration::from_millis(50);
/// Status reads (ours) and `getLeader()` calls (the peer's, in its own trials) per trial.
const READS: usize = 3;
/// The Curator peer's clients: a leader, two candidates, an observer.
const PEER_CLIENTS: usize = 4;

const NAME: &str = "bench-election";
const PEER_PATH: &str = "/bench-curator/election";
const LEADER: &str = "leader-a";
const SUCCESSOR: &str = "candidate-b";
const THIRD: &str = "candidate-c";

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn joined<T>(joined: Result<T, tokio::task::JoinError>) -> fencelock_core::Result<T> {
    joined.map_err(|e| fencelock_core::Error::store("a benchmark task failed", e))
}

/// Runs a blocking call of the Curator peer on this worker thread.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The values of a trial's leaders, in the order they lead.
const VALUES: [&str; 3] = [LEADER, SUCCESSOR, THIRD];

/// Which of the trial's successions an observer's item names, and when it named each.
#[derive(Default)]
struct Named {
    seen: usize,
    at: [Option<Instant>; 2],
}

impl Named {
    /// Notes an item naming `value`; true once both successors were named, in order. An item
    /// naming the second first is an error: the observer skipped the first.
    fn note(&mut self, value: Option<&str>) -> fencelock_core::Result<bool> {
        let position = VALUES[1..].iter().position(|v| Some(*v) == value);
        match position {
            Some(p) if p == self.seen => {
                self.at[p] = Some(Instant::now());
                self.seen += 1;
            }
            Some(p) if p > self.seen => {
                return Err(fencelock_core::Error::Store {
                    message: format!("the observer skipped {}", VALUES[self.seen + 1]),
                    source: None,
                })
            }
            _ => {}
        }
        Ok(self.seen == 2)
    }

    fn times(&self) -> [Instant; 2] {
        self.at.map(|at| at.unwrap_or_else(Instant::now))
    }
}

/// Waits until the election's queue has `count` nodes (read on a raw session).
async fn queued(raw: &zk::Client, container: &str, count: usize) -> fencelock_core::Result<()> {
    loop {
        match raw.list_children(container).await {
            Ok(children) if children.len() >= count => return Ok(()),
            Ok(_) | Err(zk::Error::NoNode) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(e) => return Err(fencelock_core::Error::store("listing the queue", e)),
        }
    }
}

/// Our side: a leader, two candidates and an observer, each on its own handle (sessions).
struct Ours {
    leader: DynLockStore,
    candidates: [DynLockStore; 2],
    observer: DynLockStore,
    raw: zk::Client,
    config: ZookeeperConfig,
}

/// One trial's figures: two handovers, and the observer's two items.
struct Trial {
    handover: [Duration; 2],
    observed: [Duration; 2],
}

impl Ours {
    async fn trial(&self, reads: &mut Vec<Duration>) -> BenchResult<Trial> {
        let leading = self.leader.election(NAME).ttl(TTL).campaign(LEADER).await?;
        let mut observer = self.observer.election(NAME).observe();
        let first = observer.next().await?;
        if first.and_then(|l| l.value).as_deref() != Some(LEADER) {
            return Err("the observer's first item is not the leader".into());
        }
        let observed = tokio::spawn(async move {
            let mut named = Named::default();
            loop {
                let value = observer.next().await?.and_then(|l| l.value);
                if named.note(value.as_deref())? {
                    return Ok::<_, fencelock_core::Error>(named.times());
                }
            }
        });
        let mut campaigns = Vec::new();
        for (i, (store, value)) in self.candidates.iter().zip(&VALUES[1..]).enumerate() {
            let election = store.election(NAME).ttl(TTL);
            campaigns.push(tokio::spawn(async move {
                let leadership = election.campaign(value).await;
                (Instant::now(), leadership)
            }));
            // Queued in this order.
            queued(&self.raw, &self.config.lock_path(NAME), i + 2).await?;
        }
        let mut handover = [Duration::ZERO; 2];
        let mut resigned = [Instant::now(); 2];
        let mut leading = leading;
        for (i, campaign) in campaigns.into_iter().enumerate() {
            tokio::time::sleep(PARK).await;
            resigned[i] = Instant::now();
            let _ = leading.resign().await?;
            let (led_at, next) = joined(campaign.await)?;
            handover[i] = led_at - resigned[i];
            leading = next?;
        }
        let observed_at = joined(observed.await)??;
        // What naming the leader costs our observer after each watch event: a status read.
        for _ in 0..READS {
            let started = Instant::now();
            let _ = self.observer.status(NAME).await?;
            reads.push(started.elapsed());
        }
        let _ = leading.resign().await?;
        Ok(Trial {
            handover,
            observed: [0, 1].map(|i| observed_at[i] - resigned[i]),
        })
    }
}

/// The peer's trials, run in its JVM: handovers, observed, `getLeader()` calls.
fn peer_trials(curator: &mut curator::Curator, n: usize) -> BenchResult<[Vec<Duration>; 3]> {
    let command = format!("trial {PEER_PATH} {n} {}", PARK.as_millis());
    let answer = curator.ask(&command)?;
    let parts: Vec<&str> = answer.split('|').collect();
    let [handovers, observed, reads] = parts.as_slice() else {
        return Err(format!("the Curator peer's answer to {command}: {answer}").into());
    };
    let nanos = |part: &str| {
        part.split_whitespace()
            .map(|ns| ns.parse().map(Duration::from_nanos))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok([nanos(handovers)?, nanos(observed)?, nanos(reads)?])
}

/// Reads the first line of a leader child and checks that it leads.
async fn leading(child: &mut Child, mode: &str) -> BenchResult<()> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    if !line.starts_with("leading") {
        return Err(format!("the {mode} child did not lead: {line:?}").into());
    }
    Ok(())
}

/// A leader child of ours: this example in its leader mode.
async fn spawn_ours(url: &str, name: &str) -> BenchResult<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["leader-ours", url, name])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    leading(&mut child, "leader-ours").await?;
    Ok(child)
}

/// One failover of ours: the leader leads in a child, a candidate parks in its campaign, the
/// child is killed `phase` after the park; the time from the kill to the candidate leading.
async fn our_failover(
    ours: &Ours,
    url: &str,
    name: &str,
    phase: Duration,
) -> BenchResult<Duration> {
    let mut child = spawn_ours(url, name).await?;
    let election = ours.candidates[0].election(name).ttl(FAILOVER_TTL);
    let candidate = tokio::spawn(async move {
        let leading = election.campaign("successor").await?;
        let led_at = Instant::now();
        let _ = leading.resign().await?;
        Ok::<_, fencelock_core::Error>(led_at)
    });
    queued(&ours.raw, &ours.config.lock_path(name), 2).await?;
    tokio::time::sleep(PARK + phase).await;
    if candidate.is_finished() {
        return Err("our candidate led before the kill".into());
    }
    let killed = Instant::now();
    child.start_kill()?;
    let led_at = joined(candidate.await)??;
    child.wait().await?;
    Ok(led_at - killed)
}

/// One failover of Curator's: the leader in a JVM of its own (a `sessionTimeoutMs` of
/// [`FAILOVER_TTL`]), the candidate a selector in the peer's JVM, which says when it is
/// queued and when it leads; timed here, from the kill to that line.
async fn peer_failover(
    curator: &mut curator::Curator,
    connect: &str,
    path: &str,
    phase: Duration,
) -> BenchResult<Duration> {
    let session_ms = FAILOVER_TTL.as_millis().to_string();
    let mut command = Command::from(curator.java(&["leader", connect, path, &session_ms]));
    let mut child = command
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    leading(&mut child, "Curator leader").await?;
    blocking(|| -> BenchResult<()> {
        curator.send(&format!("failover {path}"))?;
        match curator.line()?.as_str() {
            "QUEUED" => Ok(()),
            other => Err(format!("the Curator candidate said {other:?}, not QUEUED").into()),
        }
    })?;
    tokio::time::sleep(PARK + phase).await;
    let killed = Instant::now();
    child.start_kill()?;
    let answer = blocking(|| curator.line())?;
    let led_at = Instant::now();
    if answer != "OK" {
        return Err(format!("the Curator candidate said {answer:?}, not OK").into());
    }
    child.wait().await?;
    Ok(led_at - killed)
}

/// Leader mode: `leader-ours URL NAME` campaigns with a [`FAILOVER_TTL`] lease, prints
/// `leading`, and keeps it alive until killed.
async fn leader_child(url: &str, name: &str) -> BenchResult<()> {
    let store: DynLockStore =
        Arc::new(ZookeeperStore::connect(ZookeeperConfig::from_url(url)?).await?);
    let leading = store
        .election(name)
        .ttl(FAILOVER_TTL)
        .campaign("killed")
        .await?;
    println!("leading in term {}", leading.term());
    leading.lost().await;
    Err("leadership lost before the kill".into())
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

/// What both scenarios share: the server, our side, Curator's clients and the raw watch
/// floor.
struct Bench {
    url: String,
    /// The connect string, with the chroot.
    connect: String,
    ours: Ours,
    curator: curator::Curator,
    floor: raw::HandoffFloor,
}

/// Both sides' handovers and observations, what each pays to name the leader, and the raw
/// floor.
struct Handovers {
    trials: usize,
    ours: Samples,
    our_observed: Samples,
    peer: Samples,
    peer_observed: Samples,
    our_reads: Samples,
    peer_reads: Samples,
    watch_floor: Samples,
}

/// The peers' names in the rows.
const PEER: &str = "Curator's LeaderSelector";
const CACHE: &str = "Curator: CuratorCache";

#[tokio::main(flavor = "multi_thread")]
async fn main() -> BenchResult<()> {
    let args: Vec<String> = fencelock_bench::args().collect();
    if let [mode, url, name] = args.as_slice() {
        if mode == "leader-ours" {
            return leader_child(url, name).await;
        }
    }
    let (_server, url) = server_or_env(test_servers::ZookeeperEnsemble::start_standalone, |s| {
        s.url()
    })?;
    let mut bench = Bench::connect(url).await?;
    let mut table = Table::default();
    let handovers = bench.handover(&mut table).await?;
    let in_order = bench.failover(&mut table).await?;
    blocking(|| drop(bench.curator));
    println!("{table}");
    println!(
        "p99 of {} samples a side; raw floor p99 {:.1} µs; status read p99 {:.1} µs, getLeader() p99 {:.1} µs",
        handovers.ours.len(),
        us(handovers.watch_floor.p99()),
        us(handovers.our_reads.p99()),
        us(handovers.peer_reads.p99())
    );
    println!("{in_order}");
    Ok(())
}

impl Bench {
    /// Starts Curator's side (compiling it), connects ours and the floor, and prints the
    /// header.
    async fn connect(url: String) -> BenchResult<Self> {
        let config = ZookeeperConfig::from_url(&url)?;
        let endpoints = config.endpoints().to_vec();
        let connect = format!("{}{}", endpoints.join(","), config.chroot());
        println!("ZooKeeper election benchmark against {config}");
        println!(
            "server ZooKeeper {}",
            server_version(&endpoints[0]).unwrap_or_else(|| "(version not known)".into())
        );
        let curator = blocking(|| {
            curator::Curator::start_class(
                "CuratorElectionBench",
                SOURCE,
                &[&connect, &PEER_CLIENTS.to_string()],
            )
        })?;
        println!(
            "Curator peer compiled in {:.1} s, {PEER_CLIENTS} clients connected\n",
            curator.compiled_in.as_secs_f64()
        );

        let handle = || async {
            let store: DynLockStore = Arc::new(ZookeeperStore::connect(config.clone()).await?);
            Ok::<_, fencelock_core::Error>(store)
        };
        let ours = Ours {
            leader: handle().await?,
            candidates: [handle().await?, handle().await?],
            observer: handle().await?,
            raw: raw::connect(&connect).await?,
            config: config.clone(),
        };
        let floor = raw::HandoffFloor::connect(&connect, "/bench-raw/election-watch").await?;
        Ok(Bench {
            url,
            connect,
            ours,
            curator,
            floor,
        })
    }

    /// Handover and observe, ours and Curator's in alternating rounds, after two untimed
    /// trials each, with the raw watch floor in the same rounds.
    async fn handover(&mut self, table: &mut Table) -> BenchResult<Handovers> {
        let mut our_reads = Vec::new();
        for _ in 0..2 {
            self.ours.trial(&mut Vec::new()).await?;
        }
        blocking(|| peer_trials(&mut self.curator, 2))?;
        let mut our_trials = Vec::new();
        let (mut peer_handovers, mut peer_observed, mut peer_reads) =
            (Vec::new(), Vec::new(), Vec::new());
        let mut watch_floor = Vec::new();
        for _ in 0..ROUNDS {
            for _ in 0..TRIALS / ROUNDS {
                our_trials.push(self.ours.trial(&mut our_reads).await?);
            }
            let [handovers, observed, reads] =
                blocking(|| peer_trials(&mut self.curator, TRIALS / ROUNDS))?;
            peer_handovers.extend(handovers);
            peer_observed.extend(observed);
            peer_reads.extend(reads);
            for _ in 0..TRIALS / ROUNDS {
                watch_floor.push(self.floor.sample(PARK).await?);
            }
        }
        let handovers = Handovers {
            trials: our_trials.len(),
            ours: Samples::new(our_trials.iter().flat_map(|t| t.handover).collect()),
            our_observed: Samples::new(our_trials.iter().flat_map(|t| t.observed).collect()),
            peer: Samples::new(peer_handovers),
            peer_observed: Samples::new(peer_observed),
            our_reads: Samples::new(our_reads),
            peer_reads: Samples::new(peer_reads),
            watch_floor: Samples::new(watch_floor),
        };
        handovers.rows(table);
        Ok(handovers)
    }

    /// Failover: the leader killed in a child at spread moments (our sessions are heard from
    /// every half tick; Curator's ZooKeeper client pings a third of its session timeout after
    /// its last request). Returns the line that lists the failovers in kill order.
    async fn failover(&mut self, table: &mut Table) -> BenchResult<String> {
        let (mut our_failovers, mut peer_failovers) = (Vec::new(), Vec::new());
        for i in 0..FAILOVERS {
            let phase = FAILOVER_TTL / 2 * u32::try_from(i).unwrap_or(0) / FAILOVERS as u32;
            let name = format!("bench-failover-{i}");
            our_failovers.push(our_failover(&self.ours, &self.url, &name, phase).await?);
            let path = format!("/bench-curator/failover/{i}");
            peer_failovers
                .push(peer_failover(&mut self.curator, &self.connect, &path, phase).await?);
        }
        let in_order = format!(
            "failovers in kill order (kill at {} ms + i × {} ms after the candidate started), ms: ours {}; Curator {}",
            PARK.as_millis(),
            (FAILOVER_TTL / 2 / FAILOVERS as u32).as_millis(),
            millis(&our_failovers),
            millis(&peer_failovers)
        );
        let (our_failovers, peer_failovers) =
            (Samples::new(our_failovers), Samples::new(peer_failovers));
        failover_rows(table, &our_failovers, &peer_failovers);
        Ok(in_order)
    }
}

impl Handovers {
    /// The handover and observe rows, ours against Curator's, and what each side pays to name
    /// the leader next to the raw floor.
    fn rows(&self, table: &mut Table) {
        table.push(
            format!(
                "election: a leader granted with nobody queued, 2 candidates parked {} ms, an observer",
                PARK.as_millis()
            ),
            format!(
                "{} trials a side, 2 handovers each, rounds interleaved",
                self.trials
            ),
        );
        versus_rows(
            table,
            "handover, resign sent → candidate leads",
            &self.ours,
            PEER,
            &self.peer,
            Some(1.0),
        );
        versus_rows(
            table,
            "observe, resign sent → observer names the new leader",
            &self.our_observed,
            CACHE,
            &self.peer_observed,
            Some(1.0),
        );
        table
            .latency(
                "  naming the leader, ours: a status read p50",
                self.our_reads.p50(),
            )
            .ratio(us(self.our_reads.p50()) / us(self.peer_reads.p50()), None);
        table.latency(
            "  naming the leader, Curator: getLeader() p50",
            self.peer_reads.p50(),
        );
        table.latency(
            format!(
                "  raw floor: delete → another session's watch event, after {} ms idle p50",
                PARK.as_millis()
            ),
            self.watch_floor.p50(),
        );
    }
}

/// The failover rows: each side against the session timeout, its largest against the bound
/// the server's ticks set, and ours against Curator's.
fn failover_rows(table: &mut Table, our_failovers: &Samples, peer_failovers: &Samples) {
    let tick = test_servers::zookeeper::TICK;
    let bound = FAILOVER_TTL + tick * 2;
    table.push(
        format!(
            "failover: the leader SIGKILLed in a child, session timeout {} s each side",
            FAILOVER_TTL.as_secs()
        ),
        format!("{} kills a side, alternating", our_failovers.len()),
    );
    for (side, samples) in [("ours", our_failovers), (PEER, peer_failovers)] {
        against_rows(
            table,
            "failover, kill → candidate leads (ratio: / session timeout)",
            side,
            samples,
            FAILOVER_TTL,
        );
    }
    let target = format!("≤ 1.0× the timeout + 2 ticks ({} ms)", bound.as_millis());
    for (side, samples) in [("ours", our_failovers), (PEER, peer_failovers)] {
        let max = samples.max();
        table
            .latency(format!("  failover max (ratio: / that bound): {side}"), max)
            .ratio(us(max) / us(bound), Some((target.as_str(), max <= bound)));
    }
    table.push(
        "  failover p50 ours / Curator's LeaderSelector",
        format!("{:.2}", us(our_failovers.p50()) / us(peer_failovers.p50())),
    );
}

/// Durations in whole ms, comma separated.
fn millis(samples: &[Duration]) -> String {
    let each: Vec<String> = samples.iter().map(|d| d.as_millis().to_string()).collect();
    each.join(", ")
}
