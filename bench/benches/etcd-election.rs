//! Leader election on the etcd store against etcd's own election service (`etcd-client`'s
//! `campaign` / `resign` / `observe`, the Go `concurrency.Election` run inside the server),
//! measured in one run from one client, the two sides in alternating rounds.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench etcd-election
//! ```
//!
//! Starts its own single-member server with test-servers, or uses `LOCK_BENCH_URL` if set.
//! Prints one table:
//!
//! - handover after resign: a leader granted with nobody queued, then two candidates parked
//!   in their campaigns; the time from the leader's resign being sent to the first
//!   candidate's campaign returning (p50, mean, p99, ours / the election service's, target
//!   ≤ 1.0×); then the same from that candidate's resign to the second's, a successor the
//!   first knew from the read that granted it (our handoff mark);
//! - observe: in the same trials, an observer parked on the election; the time from each
//!   resign being sent to the observer's first item naming the new leader (target ≤ 1.0×);
//! - what each side pays after the watch event that wakes its observer, measured in the same
//!   rounds: our status read, etcd's `Leader()`, and a raw delete seen by another client's
//!   watch;
//! - failover: the leader runs in a child process (this example, in a leader mode) that is
//!   SIGKILLed at spread moments of its extend cycle; the time from the kill to the parked
//!   candidate's campaign returning, against the TTL (2 s) of each side's lease.
//!
//! Both sides' candidates park 150 ms before the change: etcd 3.4 syncs a watch that starts at
//! a past revision (as the election service's campaign does) only every 100 ms, and a waiter
//! that joined within that time would measure the sync, not the handover.

use std::error::Error;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ResignOptions};
use fencelock_bench::{against_rows, micros as us, server_or_env, versus_rows};
use fencelock_bench::{Samples, Table};
use fencelock_core::{DynLockStore, LockStoreExt};
use fencelock_etcd::{EtcdConfig, EtcdStore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Handover trials per side, in [`ROUNDS`] alternating rounds.
const TRIALS: usize = 60;
const ROUNDS: usize = 6;
/// Failovers per side, alternating.
const FAILOVERS: usize = 8;
/// The lease TTL of the handover trials (never reached).
const TTL: Duration = Duration::from_secs(10);
/// The lease TTL of the failover trials, each side.
const FAILOVER_TTL: Duration = Duration::from_secs(2);
/// How long the candidate and the observer park before the change (see the module docs).
const PARK: Duration = Duration::from_millis(150);
/// The peer's leases: one per client, granted once, revoked at the end.
const PEER_LEASE_SECS: i64 = 600;
/// Status reads (ours) and `Leader()` calls (the peer) timed per trial.
const READS: usize = 3;

const NAME: &str = "bench-election";
const PEER_NAME: &str = "bench/peer/election";
const LEADER: &str = "leader-a";
const SUCCESSOR: &str = "candidate-b";
const THIRD: &str = "candidate-c";

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn raw_error(what: &'static str) -> impl Fn(etcd_client::Error) -> fencelock_core::Error {
    move |e| fencelock_core::Error::store(what, e)
}

fn joined<T>(joined: Result<T, tokio::task::JoinError>) -> fencelock_core::Result<T> {
    joined.map_err(|e| fencelock_core::Error::Store {
        message: format!("a benchmark task failed: {e}"),
        source: None,
    })
}

/// One trial's figures, each from a resign being sent: the next candidate leads, the observer
/// names it. Twice: the first leader was granted with nobody queued, so it knows no successor
/// when it resigns; the second was granted by a read of the queue that listed the third.
struct Trial {
    handover: [Duration; 2],
    observed: [Duration; 2],
}

/// The values of a trial's leaders, in the order they lead.
const VALUES: [&str; 3] = [LEADER, SUCCESSOR, THIRD];

/// Which of the trial's successions an observer's item names: how many of [`VALUES`] after
/// the first it has named so far, and when it named each.
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

/// Our side: a leader, two candidates and an observer, each on its own handle (connection).
struct Ours {
    leader: DynLockStore,
    candidates: [DynLockStore; 2],
    observer: DynLockStore,
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
        for (store, value) in self.candidates.iter().zip(&VALUES[1..]) {
            let election = store.election(NAME).ttl(TTL);
            campaigns.push(tokio::spawn(async move {
                let leadership = election.campaign(value).await;
                (Instant::now(), leadership)
            }));
            // Queued in this order.
            tokio::time::sleep(Duration::from_millis(5)).await;
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
        // What an observer pays after each watch event: a status read.
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

/// etcd's election service: a leader, two candidates and an observer, each with its own
/// client and lease.
struct Peer {
    leader: (Client, i64),
    candidates: [(Client, i64); 2],
    observer: Client,
}

async fn peer_client(endpoints: &[String]) -> BenchResult<(Client, i64)> {
    let mut client = Client::connect(endpoints, None).await?;
    let lease = client.lease_grant(PEER_LEASE_SECS, None).await?.id();
    Ok((client, lease))
}

impl Peer {
    async fn trial(&mut self, reads: &mut Vec<Duration>) -> BenchResult<Trial> {
        let (leader, leader_lease) = &mut self.leader;
        let mut leading = leader.campaign(PEER_NAME, LEADER, *leader_lease).await?;
        let mut key = leading.take_leader().ok_or("campaign named no leader")?;
        let mut stream = self.observer.observe(PEER_NAME).await?;
        let first = stream.message().await?;
        if first.as_ref().and_then(|r| r.kv()).map(|kv| kv.value()) != Some(LEADER.as_bytes()) {
            return Err("the observer's first item is not the leader".into());
        }
        let observed = tokio::spawn(async move {
            let mut named = Named::default();
            loop {
                let answer = stream.message().await.map_err(raw_error("observe"))?;
                let Some(answer) = answer else {
                    return Err(fencelock_core::Error::Store {
                        message: "the observe stream ended".into(),
                        source: None,
                    });
                };
                let value = answer.kv().map(|kv| String::from_utf8_lossy(kv.value()));
                if named.note(value.as_deref())? {
                    return Ok(named.times());
                }
            }
        });
        let mut campaigns = Vec::new();
        for ((client, lease), value) in self.candidates.iter().zip(&VALUES[1..]) {
            let (mut client, lease) = (client.clone(), *lease);
            campaigns.push(tokio::spawn(async move {
                let answer = client.campaign(PEER_NAME, *value, lease).await;
                (Instant::now(), answer)
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut handover = [Duration::ZERO; 2];
        let mut resigned = [Instant::now(); 2];
        let mut holder = self.leader.0.clone();
        for (i, campaign) in campaigns.into_iter().enumerate() {
            tokio::time::sleep(PARK).await;
            resigned[i] = Instant::now();
            holder
                .resign(Some(ResignOptions::new().with_leader(key)))
                .await?;
            let (led_at, answer) = joined(campaign.await)?;
            handover[i] = led_at - resigned[i];
            key = answer?.take_leader().ok_or("campaign named no leader")?;
            holder = self.candidates[i].0.clone();
        }
        let observed_at = joined(observed.await)??;
        for _ in 0..READS {
            let started = Instant::now();
            let _ = self.observer.leader(PEER_NAME).await?;
            reads.push(started.elapsed());
        }
        holder
            .resign(Some(ResignOptions::new().with_leader(key)))
            .await?;
        Ok(Trial {
            handover,
            observed: [0, 1].map(|i| observed_at[i] - resigned[i]),
        })
    }
}

/// The raw floor under any observer's wake-up: a key put, a pause, then its deletion timed
/// until another client's watch reports it.
struct WatchFloor {
    writer: Client,
    stream: etcd_client::WatchStream,
}

impl WatchFloor {
    const KEY: &'static str = "bench/raw/election-watch";

    async fn connect(endpoints: &[String]) -> BenchResult<Self> {
        let writer = Client::connect(endpoints, None).await?;
        let mut watcher = Client::connect(endpoints, None).await?;
        let options =
            etcd_client::WatchOptions::new().with_filters([etcd_client::WatchFilterType::NoPut]);
        let mut stream = watcher.watch(Self::KEY, Some(options)).await?;
        stream.message().await?;
        Ok(WatchFloor { writer, stream })
    }

    async fn sample(&mut self) -> BenchResult<Duration> {
        self.writer.put(Self::KEY, "", None).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let stream = &mut self.stream;
        let seen = async {
            let event = stream.message().await;
            (event, started.elapsed())
        };
        let (deleted, (event, seen_after)) =
            tokio::join!(self.writer.delete(Self::KEY, None), seen);
        deleted?;
        event?;
        Ok(seen_after)
    }
}

/// A leader in a child process (this example in a leader mode), to be killed.
async fn spawn_leader(mode: &str, target: &str, name: &str) -> BenchResult<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([mode, target, name])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    if !line.starts_with("leading") {
        return Err(format!("the {mode} child did not lead: {line:?}").into());
    }
    Ok(child)
}

/// One failover: the leader leads in a child, a candidate parks in its campaign, the child is
/// killed `phase` after the park; the time from the kill to the candidate leading.
async fn failover<F, Fut>(
    mode: &str,
    target: &str,
    name: &str,
    phase: Duration,
    campaign: F,
) -> BenchResult<Duration>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = BenchResult<()>> + Send + 'static,
{
    let mut child = spawn_leader(mode, target, name).await?;
    let candidate = tokio::spawn({
        let campaign = campaign();
        async move {
            campaign.await?;
            Ok::<_, Box<dyn Error + Send + Sync>>(Instant::now())
        }
    });
    tokio::time::sleep(PARK + phase).await;
    if candidate.is_finished() {
        return Err(format!("the {mode} candidate led before the kill").into());
    }
    let killed = Instant::now();
    child.start_kill()?;
    let led_at = joined(candidate.await)??;
    child.wait().await?;
    Ok(led_at - killed)
}

/// Leader modes: `leader-ours URL NAME` and `leader-peer ENDPOINTS NAME` campaign with a
/// [`FAILOVER_TTL`] lease, print `leading`, and keep it alive until killed.
async fn leader_child(mode: &str, target: &str, name: &str) -> BenchResult<()> {
    match mode {
        "leader-ours" => {
            let store: DynLockStore =
                Arc::new(EtcdStore::connect(EtcdConfig::from_url(target)?).await?);
            let leading = store
                .election(name)
                .ttl(FAILOVER_TTL)
                .campaign("killed")
                .await?;
            println!("leading in term {}", leading.term());
            leading.lost().await;
            Err("leadership lost before the kill".into())
        }
        _ => {
            let endpoints: Vec<&str> = target.split(',').collect();
            let mut client = Client::connect(endpoints, None).await?;
            let lease = client
                .lease_grant(FAILOVER_TTL.as_secs() as i64, None)
                .await?
                .id();
            // As Go's concurrency.Session keeps its lease: a keep-alive every third of the TTL.
            let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
            client.campaign(name, "killed", lease).await?;
            println!("leading");
            loop {
                tokio::time::sleep(FAILOVER_TTL / 3).await;
                keeper.keep_alive().await?;
                answers.message().await?;
            }
        }
    }
}

/// What both scenarios share: the server, a raw client, our side, etcd's election service
/// and the raw watch floor.
struct Bench {
    url: String,
    endpoints: Vec<String>,
    raw: Client,
    ours: Ours,
    peer: Peer,
    floor: WatchFloor,
}

/// The handover trials of both sides, and what each pays after its observer's wake-up.
struct Handovers {
    ours: Vec<Trial>,
    peer: Vec<Trial>,
    our_reads: Samples,
    peer_reads: Samples,
    watch_floor: Samples,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> BenchResult<()> {
    let args: Vec<String> = fencelock_bench::args().collect();
    if let [mode, target, name] = args.as_slice() {
        return leader_child(mode, target, name).await;
    }
    let (_server, url) = server_or_env(test_servers::EtcdServer::start, |s| s.url())?;
    let mut bench = Bench::connect(url).await?;
    let mut table = Table::default();
    let handovers = bench.handover(&mut table).await?;
    bench.failover(&mut table).await?;
    println!("{table}");
    println!(
        "p99 of {} samples a side is their second largest; raw floor p99 {:.1} µs; status read p99 {:.1} µs, Leader() p99 {:.1} µs",
        handovers.ours.len(),
        us(handovers.watch_floor.p99()),
        us(handovers.our_reads.p99()),
        us(handovers.peer_reads.p99())
    );
    Ok(())
}

impl Bench {
    /// Connects both sides' handles and clients, and prints the header.
    async fn connect(url: String) -> BenchResult<Self> {
        let config = EtcdConfig::from_url(&url)?;
        println!("etcd election benchmark against {config}");
        let endpoints = config.endpoints().to_vec();
        let mut raw = Client::connect(&endpoints, None).await?;
        let status = raw.status().await?;
        println!("server etcd {}\n", status.version());

        let handle = || async {
            let store: DynLockStore = Arc::new(EtcdStore::connect(config.clone()).await?);
            Ok::<_, fencelock_core::Error>(store)
        };
        let ours = Ours {
            leader: handle().await?,
            candidates: [handle().await?, handle().await?],
            observer: handle().await?,
        };
        let peer = Peer {
            leader: peer_client(&endpoints).await?,
            candidates: [
                peer_client(&endpoints).await?,
                peer_client(&endpoints).await?,
            ],
            observer: Client::connect(&endpoints, None).await?,
        };
        let floor = WatchFloor::connect(&endpoints).await?;
        Ok(Bench {
            url,
            endpoints,
            raw,
            ours,
            peer,
            floor,
        })
    }

    /// Handover and observe, ours and the election service's in alternating rounds, after two
    /// untimed trials each, with the raw watch floor in the same rounds.
    async fn handover(&mut self, table: &mut Table) -> BenchResult<Handovers> {
        let (mut our_reads, mut peer_reads) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            self.ours.trial(&mut Vec::new()).await?;
            self.peer.trial(&mut Vec::new()).await?;
        }
        let (mut our_trials, mut peer_trials, mut watch_floor) =
            (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            for _ in 0..TRIALS / ROUNDS {
                our_trials.push(self.ours.trial(&mut our_reads).await?);
            }
            for _ in 0..TRIALS / ROUNDS {
                peer_trials.push(self.peer.trial(&mut peer_reads).await?);
            }
            for _ in 0..TRIALS / ROUNDS {
                watch_floor.push(self.floor.sample().await?);
            }
        }
        let handovers = Handovers {
            ours: our_trials,
            peer: peer_trials,
            our_reads: Samples::new(our_reads),
            peer_reads: Samples::new(peer_reads),
            watch_floor: Samples::new(watch_floor),
        };
        handovers.rows(table);
        Ok(handovers)
    }

    /// Failover: the leader killed in a child, spread over the extend cycles of both sides
    /// (ours extends every quarter of the TTL, the peer's keep-alive every third). The peer's
    /// leases are revoked after it.
    async fn failover(&mut self, table: &mut Table) -> BenchResult<()> {
        let (mut our_failovers, mut peer_failovers) = (Vec::new(), Vec::new());
        for i in 0..FAILOVERS {
            let phase = FAILOVER_TTL / 2 * u32::try_from(i).unwrap_or(0) / FAILOVERS as u32;
            our_failovers.push(self.our_failover(i, phase).await?);
            peer_failovers.push(self.peer_failover(i, phase).await?);
        }
        let (our_failovers, peer_failovers) =
            (Samples::new(our_failovers), Samples::new(peer_failovers));
        for lease in [
            self.peer.leader.1,
            self.peer.candidates[0].1,
            self.peer.candidates[1].1,
        ] {
            let _ = self.raw.lease_revoke(lease).await;
        }

        table.push(
            format!(
                "failover: the leader SIGKILLed in a child, TTL {} s each side",
                FAILOVER_TTL.as_secs()
            ),
            format!("{} kills a side, alternating", our_failovers.len()),
        );
        for (side, failovers) in [("ours", &our_failovers), (SERVICE, &peer_failovers)] {
            against_rows(
                table,
                "failover, kill → candidate's campaign returns (ratio: / TTL)",
                side,
                failovers,
                FAILOVER_TTL,
            );
        }
        table.push(
            "  failover p50 ours / etcd's election service",
            format!("{:.2}", us(our_failovers.p50()) / us(peer_failovers.p50())),
        );
        Ok(())
    }

    /// Our `i`th failover: our leader killed in a child `phase` into its cycle, our first
    /// candidate parked in its campaign.
    async fn our_failover(&self, i: usize, phase: Duration) -> BenchResult<Duration> {
        let name = format!("bench-failover-{i}");
        let election = self.ours.candidates[0].election(&name).ttl(FAILOVER_TTL);
        failover("leader-ours", &self.url, &name, phase, move || async move {
            let leading = election.campaign("successor").await?;
            let _ = leading.resign().await?;
            Ok(())
        })
        .await
    }

    /// The election service's `i`th failover, as [`Bench::our_failover`].
    async fn peer_failover(&self, i: usize, phase: Duration) -> BenchResult<Duration> {
        let name = format!("bench/peer/failover/{i}");
        let (mut client, lease) = (self.peer.candidates[0].0.clone(), self.peer.candidates[0].1);
        let campaign_name = name.clone();
        failover(
            "leader-peer",
            &self.endpoints.join(","),
            &name,
            phase,
            move || async move {
                let mut answer = client.campaign(campaign_name, "successor", lease).await?;
                let key = answer.take_leader().ok_or("campaign named no leader")?;
                client
                    .resign(Some(ResignOptions::new().with_leader(key)))
                    .await?;
                Ok(())
            },
        )
        .await
    }
}

/// The peer's name in the rows.
const SERVICE: &str = "etcd's election service";

impl Handovers {
    /// The trials' `i`th handover and its observation.
    fn split(trials: &[Trial], i: usize) -> (Samples, Samples) {
        (
            Samples::new(trials.iter().map(|t| t.handover[i]).collect()),
            Samples::new(trials.iter().map(|t| t.observed[i]).collect()),
        )
    }

    /// The handover and observe rows, ours against the election service's, and what each
    /// side pays after the wake-up next to the raw floor.
    fn rows(&self, table: &mut Table) {
        let (our_handover, our_observed) = Self::split(&self.ours, 0);
        let (peer_handover, peer_observed) = Self::split(&self.peer, 0);
        let (our_marked, our_marked_observed) = Self::split(&self.ours, 1);
        let (peer_marked, peer_marked_observed) = Self::split(&self.peer, 1);
        table.push(
            format!(
                "election: a leader granted with nobody queued, 2 candidates parked {} ms, an observer",
                PARK.as_millis()
            ),
            format!("{} trials a side, rounds interleaved", self.ours.len()),
        );
        for (what, ours, peer, target) in [
            (
                "handover, resign sent → candidate's campaign returns",
                &our_handover,
                &peer_handover,
                Some(1.0),
            ),
            (
                "observe, resign sent → observer names the new leader",
                &our_observed,
                &peer_observed,
                Some(1.0),
            ),
            (
                "  handover to a successor known at the grant (a handoff mark)",
                &our_marked,
                &peer_marked,
                None,
            ),
            (
                "  observe, that handover",
                &our_marked_observed,
                &peer_marked_observed,
                None,
            ),
        ] {
            versus_rows(table, what, ours, SERVICE, peer, target);
        }
        table
            .latency(
                "  after the wake-up, ours: a status read p50",
                self.our_reads.p50(),
            )
            .ratio(us(self.our_reads.p50()) / us(self.peer_reads.p50()), None);
        table.latency(
            "  after the wake-up, theirs: Leader() p50",
            self.peer_reads.p50(),
        );
        table.latency(
            "  raw floor: delete → another client's watch event p50",
            self.watch_floor.p50(),
        );
    }
}
