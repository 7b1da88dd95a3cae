//! Leader election on the stores without an election recipe of their own to measure against
//! (Redis, Redlock on 3 masters, PostgreSQL, MariaDB, SQLite): handover after resign, observe
//! latency and failover after the leader's process is SIGKILLed, one store after another,
//! through the facade's `connect`, so every store runs the same code.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench stores-election
//! cargo bench -p fencelock-bench --bench stores-election -- redis sqlite        # only those
//! cargo bench -p fencelock-bench --bench stores-election -- --url redis://h:6379 # one live store
//! ```
//!
//! Starts each store's server(s) with test-servers just before its part, and stops them after
//! it (SQLite: a file in a directory of its own). Prints one table per store:
//!
//! - handover after resign, with no peer: a leader granted with nobody queued, then two
//!   candidates parked 150 ms in their campaigns (150 ms: past the observer's 100 ms poll, so
//!   it sees each leader), plus a moment that spreads the changes evenly over the observer's
//!   poll period across the trials; the leader resigns, then the candidate that led resigns to
//!   the other; the time from each resign being sent to the next candidate's campaign returning.
//!   Stores without a fair queue may grant the later candidate first: the figure is the time
//!   to whichever leads;
//! - observe, with no peer: in the same trials, an observer parked on the election; the time
//!   from each resign to the observer's first item naming the new leader. These stores'
//!   observers poll the status every `Capabilities::status_poll` (100 ms), so it is about
//!   half of that plus a status read, which is timed after each trial too;
//! - failover: the leader runs in a child process (this example in a leader mode) that is
//!   SIGKILLed at spread moments of its extend cycle (it extends at a quarter of the TTL); the
//!   time from the kill to the parked candidate's campaign returning, against the TTL (2 s)
//!   and against the TTL plus the delays the store documents for a waiter behind a dead
//!   holder (nemesis's fault table, rule 4, and the store's README), with the target max ≤
//!   that bound.

use std::collections::HashMap;
use std::error::Error;
use std::process::Stdio;
use std::time::Duration;

use fencelock::{DynLockStore, LockStoreExt};
use fencelock_bench::{against_rows, micros as us, Samples, Table};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

#[path = "servers/mod.rs"]
mod servers;

/// Trials per store; two handovers each.
const TRIALS: usize = 30;
/// Failovers per store.
const FAILOVERS: usize = 8;
/// The lease TTL of the handover trials (never reached).
const TTL: Duration = Duration::from_secs(10);
/// The lease TTL of the failover trials.
const FAILOVER_TTL: Duration = Duration::from_secs(2);
/// How long the candidates and the observer park before each change (see the module docs).
const PARK: Duration = Duration::from_millis(150);
/// Status reads timed per trial, on the observer's handle.
const READS: usize = 3;
/// How long any one step may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(30);

const NAME: &str = "bench-election";
const LEADER: &str = "leader-a";
const CANDIDATES: [&str; 2] = ["candidate-b", "candidate-c"];

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// A store of this bench: its name and what it documents for a waiter behind a dead holder.
struct Store {
    name: &'static str,
    /// The delays added to the TTL in the failover bound, each with where it is documented.
    delays: &'static [(&'static str, Duration)],
}

const STORES: [Store; 5] = [
    Store {
        name: "redis",
        // The writer's mark (1 s) keeps readers and permits out, not an exclusive waiter.
        delays: &[(
            "a waiter tries again when the holder's PTTL runs out and at least every WAIT_CAP",
            fencelock::fencelock_redis::WAIT_CAP,
        )],
    },
    Store {
        name: "redlock",
        // node_timeout is paid only for a node that does not answer; all three do here.
        delays: &[
            (
                "a waiter tries again when the holder's PTTL runs out and at least every WAIT_CAP",
                fencelock::fencelock_redis::WAIT_CAP,
            ),
            (
                "a failed round is retried after up to retry_jitter",
                Duration::from_millis(100),
            ),
        ],
    },
    Store {
        name: "postgres",
        // The server ends the session when the connection closes; MODE_POLL is for shared and
        // permit waiters only.
        delays: &[],
    },
    Store {
        name: "mysql",
        // As PostgreSQL: the session ends with its connection.
        delays: &[],
    },
    Store {
        name: "sqlite",
        delays: &[(
            "a waiter without an inotify watch polls every 100 ms",
            Duration::from_millis(100),
        )],
    },
];

fn joined<T>(joined: Result<T, tokio::task::JoinError>) -> fencelock::Result<T> {
    joined.map_err(|e| fencelock::Error::Store {
        message: format!("a benchmark task failed: {e}"),
        source: None,
    })
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> BenchResult<T> {
    tokio::time::timeout(PATIENCE, future)
        .await
        .map_err(|_| format!("{what}: nothing within {PATIENCE:?}").into())
}

/// A leader, two candidates and an observer, each on its own handle.
struct Handles {
    leader: DynLockStore,
    candidates: [DynLockStore; 2],
    observer: DynLockStore,
}

/// One trial's figures: two handovers, and the observer's two items.
struct Trial {
    handover: [Duration; 2],
    observed: [Duration; 2],
}

/// A moment in the observer's poll period for handover `i` of trial `t`, so the changes fall
/// evenly over it: the observer's polls follow the trial's own start, and a fixed park would
/// meet them at the same phase every time.
fn spread(poll: Duration, t: usize, i: usize) -> Duration {
    poll * u32::try_from((2 * t + i) * 7 % SPREAD_STEPS).unwrap_or(0) / SPREAD_STEPS as u32
}

/// How many moments of the poll period [`spread`] uses.
const SPREAD_STEPS: usize = 20;

impl Handles {
    async fn trial(&self, t: usize, reads: &mut Vec<Duration>) -> BenchResult<Trial> {
        let mut leading = self.leader.election(NAME).ttl(TTL).campaign(LEADER).await?;
        let mut observer = self.observer.election(NAME).observe();
        let first = observer.next().await?;
        if first.and_then(|l| l.value).as_deref() != Some(LEADER) {
            return Err("the observer's first item is not the leader".into());
        }
        let observed = tokio::spawn(async move {
            let mut named: HashMap<String, Instant> = HashMap::new();
            while named.len() < CANDIDATES.len() {
                let value = observer.next().await?.and_then(|l| l.value);
                if let Some(value) = value.filter(|v| CANDIDATES.contains(&v.as_str())) {
                    named.entry(value).or_insert_with(Instant::now);
                }
            }
            Ok::<_, fencelock::Error>(named)
        });
        // Each campaign reports when it returns; whichever leads first is the next leader.
        let (led, mut leads) = tokio::sync::mpsc::unbounded_channel();
        let mut campaigns = Vec::new();
        for (store, value) in self.candidates.iter().zip(CANDIDATES) {
            let (election, led) = (store.election(NAME).ttl(TTL), led.clone());
            campaigns.push(tokio::spawn(async move {
                let leadership = election.campaign(value).await;
                let _ = led.send((Instant::now(), value, leadership));
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut handover = [Duration::ZERO; 2];
        let mut resigned = [Instant::now(); 2];
        let mut successors = [""; 2];
        let poll = self.observer.capabilities().status_poll;
        for i in 0..2 {
            tokio::time::sleep(PARK + spread(poll, t, i)).await;
            resigned[i] = Instant::now();
            let _ = leading.resign().await?;
            let (led_at, value, next) = within("a candidate to lead", leads.recv())
                .await?
                .ok_or("a campaign ended without a word")?;
            handover[i] = led_at - resigned[i];
            successors[i] = value;
            leading = next?;
        }
        let named = joined(within("the observer", observed).await?)??;
        for campaign in campaigns {
            joined(campaign.await)?;
        }
        // What a polled observer pays at each poll: a status read.
        for _ in 0..READS {
            let started = Instant::now();
            let _ = self.observer.status(NAME).await?;
            reads.push(started.elapsed());
        }
        let _ = leading.resign().await?;
        let mut observed = [Duration::ZERO; 2];
        for i in 0..2 {
            let at = named
                .get(successors[i])
                .ok_or("the observer never named a leader")?;
            observed[i] = at.saturating_duration_since(resigned[i]);
        }
        Ok(Trial { handover, observed })
    }
}

/// A leader in a child process (this example in its leader mode), to be killed.
async fn spawn_leader(url: &str, name: &str) -> BenchResult<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["leader", url, name])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    within(
        "the leader child",
        BufReader::new(stdout).read_line(&mut line),
    )
    .await??;
    if !line.starts_with("leading") {
        return Err(format!("the leader child did not lead: {line:?}").into());
    }
    Ok(child)
}

/// One failover: the leader leads in a child, a candidate parks in its campaign, the child is
/// killed `phase` after the park; the time from the kill to the candidate leading.
async fn failover(
    candidate: &DynLockStore,
    url: &str,
    name: &str,
    phase: Duration,
) -> BenchResult<Duration> {
    let mut child = spawn_leader(url, name).await?;
    let election = candidate.election(name).ttl(FAILOVER_TTL);
    let campaign = tokio::spawn(async move {
        let leading = election.campaign("successor").await?;
        let led_at = Instant::now();
        let _ = leading.resign().await?;
        Ok::<_, fencelock::Error>(led_at)
    });
    tokio::time::sleep(PARK + phase).await;
    if campaign.is_finished() {
        return Err("the candidate led before the kill".into());
    }
    let killed = Instant::now();
    child.start_kill()?;
    let led_at = joined(within("the candidate after the kill", campaign).await?)??;
    child.wait().await?;
    Ok(led_at - killed)
}

/// Leader mode: `leader URL NAME` campaigns with a [`FAILOVER_TTL`] lease, prints `leading`,
/// and keeps it alive until killed.
async fn leader_child(url: &str, name: &str) -> BenchResult<()> {
    let store = fencelock::connect(url).await?;
    let leading = store
        .election(name)
        .ttl(FAILOVER_TTL)
        .campaign("killed")
        .await?;
    println!("leading in term {}", leading.term());
    leading.lost().await;
    Err("leadership lost before the kill".into())
}

/// One store's part: the trials, then the failovers; its table, and a line of its failovers
/// in kill order.
async fn bench(store: &Store, url: &str) -> BenchResult<(Table, String)> {
    let handle = || fencelock::connect(url);
    let handles = Handles {
        leader: handle().await?,
        candidates: [handle().await?, handle().await?],
        observer: handle().await?,
    };
    let poll = handles.observer.capabilities().status_poll;
    let notified = handles.observer.capabilities().notified_status;
    for t in 0..2 {
        handles.trial(t, &mut Vec::new()).await?;
    }
    let (mut trials, mut reads) = (Vec::new(), Vec::new());
    for t in 0..TRIALS {
        trials.push(handles.trial(t, &mut reads).await?);
    }
    let handover = Samples::new(trials.iter().flat_map(|t| t.handover).collect());
    let observed = Samples::new(trials.iter().flat_map(|t| t.observed).collect());
    let reads = Samples::new(reads);

    // Kills spread over one extend cycle (a quarter of the TTL).
    let mut failovers = Vec::new();
    for i in 0..FAILOVERS {
        let phase = FAILOVER_TTL / 4 * u32::try_from(i).unwrap_or(0) / FAILOVERS as u32;
        let name = format!("bench-failover-{i}");
        failovers.push(failover(&handles.candidates[0], url, &name, phase).await?);
    }
    let in_order: Vec<String> = failovers
        .iter()
        .map(|d| d.as_millis().to_string())
        .collect();
    let in_order = format!(
        "{}: failovers in kill order (kill at {} ms + i × {} ms after the candidate started), ms: {}",
        store.name,
        PARK.as_millis(),
        (FAILOVER_TTL / 4 / FAILOVERS as u32).as_millis(),
        in_order.join(", ")
    );
    let failovers = Samples::new(failovers);

    let mut table = Table::default();
    table.push(
        format!(
            "{}: a leader granted with nobody queued, 2 candidates parked {} ms, an observer",
            store.name,
            PARK.as_millis()
        ),
        format!("{} trials, 2 handovers each, no peer", trials.len()),
    );
    table.push(
        "  parked before each change",
        format!(
            "{} ms + 0–{} ms, spread over the observer's poll period",
            PARK.as_millis(),
            (poll * (SPREAD_STEPS as u32 - 1) / SPREAD_STEPS as u32).as_millis()
        ),
    );
    for (what, samples) in [
        (
            "handover, resign sent → a candidate's campaign returns",
            &handover,
        ),
        (
            "observe, resign sent → observer names the new leader",
            &observed,
        ),
    ] {
        table.latency(format!("{what} p50"), samples.p50());
        table.latency(format!("{what} mean"), samples.mean());
        table.latency(format!("{what} p99"), samples.p99());
    }
    table.push(
        "  observer",
        if notified {
            "notified".to_owned()
        } else {
            format!("polled every {} ms", poll.as_millis())
        },
    );
    table.latency("  a status read p50", reads.p50());
    let bound = FAILOVER_TTL + store.delays.iter().map(|(_, d)| *d).sum::<Duration>();
    table.push(
        format!(
            "failover: the leader SIGKILLed in a child, TTL {} s",
            FAILOVER_TTL.as_secs()
        ),
        format!("{} kills", failovers.len()),
    );
    against_rows(
        &mut table,
        "failover, kill → candidate's campaign returns (ratio: / TTL)",
        "ours",
        &failovers,
        FAILOVER_TTL,
    );
    for (what, delay) in store.delays {
        table.push(
            format!("  documented delay: {what}"),
            format!("{} ms", delay.as_millis()),
        );
    }
    let max = failovers.max();
    let target = format!(
        "≤ 1.0× the TTL + documented delays ({} ms)",
        bound.as_millis()
    );
    table
        .latency("  failover max (ratio: / that bound)", max)
        .ratio(us(max) / us(bound), Some((target.as_str(), max <= bound)));
    Ok((table, in_order))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> BenchResult<()> {
    let args: Vec<String> = fencelock_bench::args().collect();
    if let [mode, url, name] = args.as_slice() {
        if mode == "leader" {
            return leader_child(url, name).await;
        }
    }
    if let [flag, url] = args.as_slice() {
        if flag == "--url" {
            let kind = fencelock::store_for(url)?;
            let store = STORES
                .iter()
                .find(|s| s.name == kind.name)
                .ok_or_else(|| format!("{} is not one of this bench's stores", kind.name))?;
            let (table, in_order) = bench(store, url).await?;
            println!("{table}\n{in_order}");
            return Ok(());
        }
    }
    let wanted: Vec<&Store> = if args.is_empty() {
        STORES.iter().collect()
    } else {
        args.iter()
            .map(|name| {
                STORES.iter().find(|s| s.name == name).ok_or_else(|| {
                    format!("unknown store {name:?}: redis, redlock, postgres, mysql or sqlite")
                })
            })
            .collect::<Result<_, _>>()?
    };
    println!("election benchmark on the stores without an election peer, one after another");
    for store in wanted {
        let started = Instant::now();
        let running = tokio::task::block_in_place(|| servers::start(store.name, "election"))?;
        println!(
            "\n{} at {} (servers up in {:.1} s)\n",
            store.name,
            running.url,
            started.elapsed().as_secs_f64()
        );
        let (table, in_order) = bench(store, &running.url).await?;
        println!("{table}\n{in_order}");
        println!(
            "({} took {:.0} s; load average {})",
            store.name,
            started.elapsed().as_secs_f64(),
            std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        );
    }
    Ok(())
}
