//! The controller: starts the store (or takes `--url`), the workers and the resource, injects
//! faults at random times from a seeded RNG, stops everything, and hands the merged history
//! and the resource's end state to the checker.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fencelock::{CancellationToken, DynLockStore, Error, Result};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use test_servers::{EtcdCluster, FreezableRelay, MariadbServer, PostgresServer, RedisServer};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use crate::checker::{check, Verdict};
use crate::clock::now_ns;
use crate::delays::{self, StoreDelays};
use crate::faults::{Fault, StoreKind, Target};
use crate::history::{Entry, Event, Recorder, WorkMode};
use crate::resource;
use crate::store::{memory, Link, RestartingMemory};
use crate::worker::{self, Emit, WorkerConfig};

/// Ends the holders' sessions on the PostgreSQL lock store, as an operator would; one
/// statement, so the holders found are the ones terminated.
const TERMINATE_HOLDERS_SQL: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
     WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()";

/// The MySQL lock store's holder of a lock name: its session's connection id (NULL if free).
/// Not atomic with the `KILL` that follows, and need not be: the fault's window in the history
/// spans both statements, so whoever holds the lock in between is covered by rule 3's excuse.
const MYSQL_HOLDER_SQL: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED)";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// A live store to run against (client faults only); `None` starts each of `stores`.
    pub url: Option<String>,
    /// The stores to start, in order, when `url` is `None`.
    pub stores: Vec<StoreKind>,
    /// Only these faults (`None`: every fault that applies).
    pub faults: Option<Vec<Fault>>,
    /// How long faults are injected per store.
    pub duration: Duration,
    /// Workers at any time.
    pub workers: u32,
    /// The lease TTL.
    pub ttl: Duration,
    /// The longest hold inside the read-modify-write.
    pub hold_max: Duration,
    /// The nemesis's RNG seed.
    pub seed: u64,
    /// The resource's PostgreSQL (`None`: one is started).
    pub resource_url: Option<String>,
    /// The binary run as `worker` for process workers (normally this one).
    pub worker_binary: PathBuf,
    /// Where the histories are written (`None`: not written).
    pub history_dir: Option<PathBuf>,
    /// Progress lines on stderr.
    pub verbose: bool,
}

/// One store's run: what was done and what the checker found.
#[derive(Debug, Clone, Serialize)]
pub struct StoreReport {
    /// The store's name.
    pub store: String,
    /// The URL the workers used, password redacted (through their relays).
    pub url: String,
    /// The seed of the nemesis.
    pub seed: u64,
    /// The lease TTL in ms.
    pub ttl_ms: u64,
    /// Workers at any time.
    pub workers: u32,
    /// The faults injected, in order.
    pub faults: Vec<String>,
    /// The checker's findings.
    pub verdict: Verdict,
    /// Where the history was written.
    pub history: Option<PathBuf>,
}

fn setup_error(what: impl std::fmt::Display) -> Error {
    Error::Store {
        message: format!("nemesis setup: {what}"),
        source: None,
    }
}

/// Runs every store the options name, one after another.
pub fn run(options: &Options) -> Result<Vec<StoreReport>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(setup_error)?;
    let mut own_resource = None;
    let resource_url = match &options.resource_url {
        Some(url) => url.clone(),
        None => {
            let server = PostgresServer::start().map_err(setup_error)?;
            let url = server.url();
            own_resource = Some(server);
            url
        }
    };
    let targets: Vec<(StoreKind, Option<String>)> = match &options.url {
        Some(url) => {
            let kind = StoreKind::of_url(url)
                .ok_or_else(|| Error::invalid("url", "no store of this scheme"))?;
            vec![(kind, Some(url.clone()))]
        }
        None => options.stores.iter().map(|&k| (k, None)).collect(),
    };
    let mut reports = Vec::new();
    for (kind, url) in targets {
        let report = run_store(kind, url, options, &runtime, &resource_url)?;
        reports.push(report);
    }
    drop(own_resource);
    Ok(reports)
}

/// The servers of one store run, when the run started them.
enum Servers {
    None,
    Redis(RedisServer),
    Redlock(Vec<RedisServer>),
    Etcd(EtcdCluster),
    Postgres(PostgresServer),
    Mysql(MariadbServer),
    Sqlite(TempDatabase),
}

/// The directory of the SQLite run's database file, removed when the run ends.
struct TempDatabase {
    dir: PathBuf,
}

impl TempDatabase {
    fn create() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("nemesis-sqlite-{}", std::process::id()));
        // A directory left by an earlier run of this pid would carry its tokens over: start
        // from nothing, as the other stores do.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(setup_error)?;
        Ok(TempDatabase { dir })
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.dir.join("locks.db").display())
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Servers {
    fn start(kind: StoreKind) -> Result<(Self, String)> {
        let servers = match kind {
            StoreKind::Memory | StoreKind::BrokenMemory => Servers::None,
            StoreKind::Redis => Servers::Redis(RedisServer::start().map_err(setup_error)?),
            StoreKind::Redlock => {
                Servers::Redlock(RedisServer::start_many(5).map_err(setup_error)?)
            }
            StoreKind::Etcd => Servers::Etcd(EtcdCluster::start(3).map_err(setup_error)?),
            StoreKind::Postgres => Servers::Postgres(PostgresServer::start().map_err(setup_error)?),
            StoreKind::Mysql => Servers::Mysql(MariadbServer::start().map_err(setup_error)?),
            StoreKind::Sqlite => Servers::Sqlite(TempDatabase::create()?),
        };
        let url = match &servers {
            Servers::None => "memory://nemesis".to_string(),
            Servers::Redis(s) => s.url(),
            Servers::Redlock(nodes) => format!(
                "redlock://{}",
                nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Servers::Etcd(c) => c.url(),
            Servers::Postgres(s) => s.url(),
            Servers::Mysql(s) => s.url(),
            Servers::Sqlite(db) => db.url(),
        };
        Ok((servers, url))
    }
}

/// `scheme://[user@]` , the host list, and the rest of a URL.
fn split_hosts(url: &str) -> (String, Vec<String>, String) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (String::new(), Vec::new(), url.to_string());
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let hosts = hosts.split(',').map(str::to_string).collect();
    (format!("{scheme}://{user}"), hosts, tail.to_string())
}

fn run_store(
    kind: StoreKind,
    url: Option<String>,
    options: &Options,
    runtime: &Runtime,
    resource_url: &str,
) -> Result<StoreReport> {
    let say = |line: String| {
        if options.verbose {
            eprintln!("[nemesis {kind}] {line}");
        }
    };
    let schema = format!("nemesis_{}", kind.name().replace('-', "_"));
    runtime.block_on(resource::setup(resource_url, &schema, worker::PERMITS))?;
    let own = url.is_none();
    let (mut servers, store_url) = match url {
        Some(url) => (Servers::None, url),
        None => Servers::start(kind)?,
    };
    let faults: Vec<Fault> = kind
        .faults(own)
        .into_iter()
        .filter(|f| options.faults.as_ref().is_none_or(|only| only.contains(f)))
        .collect();
    say(format!(
        "seed {}, {} workers, TTL {:?}, faults {:?}",
        options.seed,
        options.workers,
        options.ttl,
        faults.iter().map(|f| f.name()).collect::<Vec<_>>()
    ));

    let recorder = Recorder::new();
    let (shared, restarting) = if kind.in_process() {
        let (store, restarting) = if kind == StoreKind::BrokenMemory {
            memory(Some(true))
        } else {
            memory(None)
        };
        (Some(store), restarting)
    } else {
        (None, None)
    };
    // The store says which modes it keeps: every mode it keeps is in the mix.
    let capabilities = match &shared {
        Some(store) => store.capabilities(),
        None => runtime
            .block_on(fencelock::connect(&store_url))?
            .capabilities(),
    };
    let modes: Vec<WorkMode> = worker::MODE_MIX
        .into_iter()
        .filter(|m| capabilities.supports(m.to_mode()))
        .collect();
    say(format!(
        "modes {:?}",
        modes.iter().map(|m| m.name()).collect::<Vec<_>>()
    ));
    let mut pool = Pool {
        runtime,
        recorder: recorder.clone(),
        store_url: store_url.clone(),
        relayed: kind.over_network(),
        shared,
        template: WorkerConfig {
            id: 0,
            ttl: options.ttl,
            hold_max: options.hold_max,
            resource_url: resource_url.to_string(),
            schema: schema.clone(),
            mode: WorkMode::Exclusive,
        },
        modes,
        mode_of: HashMap::new(),
        binary: options.worker_binary.clone(),
        workers: BTreeMap::new(),
        next_id: 1,
        scanned: 0,
        phase: HashMap::new(),
    };
    for _ in 0..options.workers {
        pool.spawn(None)?;
    }

    let delays = delays::of(kind.name());
    let mut nemesis = Nemesis {
        rng: StdRng::seed_from_u64(options.seed ^ seed_salt(kind)),
        ttl: options.ttl,
        delays,
        recorder: recorder.clone(),
        next_fault: 1,
        injected: Vec::new(),
    };
    let start = Instant::now();
    let mut cycle: Vec<Fault> = Vec::new();
    while !faults.is_empty() {
        let gap = options.ttl.mul_f64(nemesis.rng.random_range(0.5..1.5));
        if start.elapsed() + gap >= options.duration {
            break;
        }
        thread::sleep(gap);
        if cycle.is_empty() {
            // Every fault once per round, in a random order, so short runs see each kind.
            cycle = faults.clone();
            cycle.shuffle(&mut nemesis.rng);
        }
        let Some(fault) = cycle.pop() else { break };
        match nemesis.inject(fault, &mut pool, &mut servers, restarting.as_deref()) {
            Ok(Some(detail)) => say(format!("{fault}: {detail}")),
            Ok(None) => say(format!("{fault}: skipped, no worker to hit")),
            Err(e) => say(format!("{fault}: failed: {e}")),
        }
    }
    if let Some(rest) = options.duration.checked_sub(start.elapsed()) {
        thread::sleep(rest);
    }
    // Time to recover, so the availability after the last fault is measured, not cut short.
    thread::sleep(options.ttl * 2);
    recorder.push(Entry {
        t: now_ns(),
        worker: 0,
        event: Event::Stop,
    });
    pool.stop_all(options.ttl);
    let history = recorder.snapshot();
    let state = runtime.block_on(resource::read_state(resource_url, &schema))?;
    let verdict = check(
        &history,
        &state,
        u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX),
        delays,
    );
    let history_path = match &options.history_dir {
        Some(dir) => Some(write_history(dir, kind, &history, &state)?),
        None => None,
    };
    drop(servers);
    Ok(StoreReport {
        store: kind.name().to_string(),
        url: fencelock::redact(&store_url),
        seed: options.seed,
        ttl_ms: u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX),
        workers: options.workers,
        faults: nemesis.injected,
        verdict,
        history: history_path,
    })
}

/// Each store's faults come from its own stream, so replaying one store with `--seed` repeats
/// its faults whatever other stores ran before.
fn seed_salt(kind: StoreKind) -> u64 {
    kind.name().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn write_history(
    dir: &std::path::Path,
    kind: StoreKind,
    history: &[Entry],
    state: &resource::ResourceState,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(setup_error)?;
    let path = dir.join(format!("{}-history.jsonl", kind.name()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).map_err(setup_error)?);
    for entry in history {
        let line = serde_json::to_string(entry).map_err(setup_error)?;
        writeln!(out, "{line}").map_err(setup_error)?;
    }
    let resource = dir.join(format!("{}-resource.json", kind.name()));
    let json = serde_json::to_string_pretty(state).map_err(setup_error)?;
    std::fs::write(resource, json).map_err(setup_error)?;
    out.flush().map_err(setup_error)?;
    Ok(path)
}

/// A worker's progress, as the controller follows it from the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between a release (or a failed wait) and the next acquire.
    Idle,
    Waiting,
    Granted,
    /// Claimed the fenced row: inside its read-modify-write.
    Working,
}

enum Handle {
    Process {
        child: Child,
        stdin: Option<ChildStdin>,
        relays: Vec<FreezableRelay>,
        reader: Option<JoinHandle<()>>,
    },
    Task {
        task: tokio::task::JoinHandle<()>,
        link: Link,
        gate: watch::Sender<bool>,
        stop: CancellationToken,
    },
}

struct Pool<'rt> {
    runtime: &'rt Runtime,
    recorder: Recorder,
    store_url: String,
    /// Whether process workers reach the store through relays (not SQLite: a file).
    relayed: bool,
    /// The store of in-process workers.
    shared: Option<DynLockStore>,
    template: WorkerConfig,
    /// The modes new workers take, in turn.
    modes: Vec<WorkMode>,
    mode_of: HashMap<u32, WorkMode>,
    binary: PathBuf,
    workers: BTreeMap<u32, Handle>,
    next_id: u32,
    scanned: usize,
    phase: HashMap<u32, Phase>,
}

impl Pool<'_> {
    /// Starts a worker in `mode`, or in the next mode of the mix.
    fn spawn(&mut self, mode: Option<WorkMode>) -> Result<u32> {
        let id = self.next_id;
        self.next_id += 1;
        let mode = mode.unwrap_or_else(|| {
            let i = (id as usize - 1) % self.modes.len().max(1);
            self.modes.get(i).copied().unwrap_or_default()
        });
        self.mode_of.insert(id, mode);
        let config = WorkerConfig {
            id,
            mode,
            ..self.template.clone()
        };
        let handle = match &self.shared {
            Some(store) => {
                let link = Link::new(store.clone());
                let gate = watch::Sender::new(true);
                let stop = CancellationToken::new();
                let recorder = self.recorder.clone();
                let emit: Emit = Arc::new(move |e| recorder.push(e));
                let task = self.runtime.spawn(worker::run(
                    Arc::new(link.clone()),
                    config,
                    emit,
                    stop.clone(),
                    Some(gate.subscribe()),
                ));
                Handle::Task {
                    task,
                    link,
                    gate,
                    stop,
                }
            }
            None => self.spawn_process(config)?,
        };
        self.workers.insert(id, handle);
        Ok(id)
    }

    fn spawn_process(&self, config: WorkerConfig) -> Result<Handle> {
        let (relays, url) = if self.relayed {
            let (prefix, hosts, tail) = split_hosts(&self.store_url);
            let relays = hosts
                .iter()
                .map(|h| FreezableRelay::start(h).map_err(setup_error))
                .collect::<Result<Vec<_>>>()?;
            let url = format!(
                "{prefix}{}{tail}",
                relays
                    .iter()
                    .map(FreezableRelay::address)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            (relays, url)
        } else {
            (Vec::new(), self.store_url.clone())
        };
        let mut cmd = Command::new(&self.binary);
        cmd.arg("worker")
            .args(["--id", &config.id.to_string()])
            .args(["--store-url", &url])
            .args(["--resource-url", &config.resource_url])
            .args(["--schema", &config.schema])
            .args(["--ttl-ms", &config.ttl.as_millis().to_string()])
            .args(["--hold-ms", &config.hold_max.as_millis().to_string()])
            .args(["--mode", &config.mode.arg()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe; a worker must not outlive the controller.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(setup_error)?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| setup_error("worker without stdout"))?;
        let recorder = self.recorder.clone();
        let id = config.id;
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Entry>(&line) {
                    Ok(entry) => recorder.push(entry),
                    Err(e) => recorder.push(Entry {
                        t: now_ns(),
                        worker: id,
                        event: Event::Error {
                            what: format!("unreadable line {line:?}: {e}"),
                        },
                    }),
                }
            }
        });
        Ok(Handle::Process {
            child,
            stdin,
            relays,
            reader: Some(reader),
        })
    }

    /// Follows the history recorded since the last call.
    fn follow(&mut self) {
        let (scanned, phase) = (&mut self.scanned, &mut self.phase);
        self.recorder.with(|entries| {
            for e in &entries[*scanned..] {
                let next = match &e.event {
                    Event::Acquire { .. } => Phase::Waiting,
                    Event::Grant { .. } => Phase::Granted,
                    Event::Read { row, .. } if row.is_fenced() => Phase::Working,
                    Event::Release { .. } | Event::AcquireFailed { .. } => Phase::Idle,
                    _ => continue,
                };
                phase.insert(e.worker, next);
            }
            *scanned = entries.len();
        });
    }

    /// The live workers in `phase`, in id order.
    fn in_phase(&self, phase: Phase) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .phase
            .iter()
            .filter(|(id, p)| **p == phase && self.workers.contains_key(id))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// A live worker for a fault aimed at `target`: for [`Target::Any`], a holder (preferably
    /// inside its read-modify-write) or a waiter, each half the time when both exist.
    fn pick(&mut self, target: Target, rng: &mut StdRng) -> Option<u32> {
        self.follow();
        let waiting = self.in_phase(Phase::Waiting);
        let working = self.in_phase(Phase::Working);
        let holding = if working.is_empty() {
            self.in_phase(Phase::Granted)
        } else {
            working
        };
        let from = match target {
            Target::Waiter => waiting,
            Target::Any if holding.is_empty() => waiting,
            Target::Any if waiting.is_empty() || rng.random_bool(0.5) => holding,
            Target::Any => waiting,
        };
        from.choose(rng).copied()
    }

    fn wait_for_target(
        &mut self,
        target: Target,
        within: Duration,
        rng: &mut StdRng,
    ) -> Option<u32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(id) = self.pick(target, rng) {
                return Some(id);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, id: u32, sig: libc::c_int) {
        if let Some(Handle::Process { child, .. }) = self.workers.get(&id) {
            // SAFETY: plain system call on our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    }

    /// Stops (`true`) or resumes (`false`) a worker as a whole.
    fn pause(&self, id: u32, paused: bool) {
        match self.workers.get(&id) {
            Some(Handle::Process { .. }) => {
                self.signal(id, if paused { libc::SIGSTOP } else { libc::SIGCONT })
            }
            Some(Handle::Task { link, gate, .. }) => {
                // Link first on pause (the keep-alive stalls at once), gate first on resume.
                if paused {
                    link.cut(true);
                    gate.send_replace(false);
                } else {
                    gate.send_replace(true);
                    link.cut(false);
                }
            }
            None => {}
        }
    }

    /// Cuts (`true`) or restores a worker's way to the store: all of it, or the relays to
    /// the nodes `only` lists.
    fn cut(&self, id: u32, cut: bool, only: Option<&[usize]>) {
        match self.workers.get(&id) {
            Some(Handle::Process { relays, .. }) => {
                for (i, relay) in relays.iter().enumerate() {
                    if only.is_none_or(|o| o.contains(&i)) {
                        relay.freeze(cut);
                    }
                }
            }
            Some(Handle::Task { link, .. }) => link.cut(cut),
            None => {}
        }
    }

    fn kill(&mut self, id: u32) {
        match self.workers.remove(&id) {
            Some(Handle::Process {
                mut child, reader, ..
            }) => {
                let _ = child.kill();
                let _ = child.wait();
                if let Some(reader) = reader {
                    let _ = reader.join();
                }
            }
            Some(Handle::Task { task, .. }) => {
                task.abort();
                let _ = self.runtime.block_on(task);
            }
            None => {}
        }
    }

    /// Asks every worker to stop after its current round, then kills what is left.
    fn stop_all(&mut self, ttl: Duration) {
        let ids: Vec<u32> = self.workers.keys().copied().collect();
        for id in &ids {
            self.pause(*id, false);
            self.cut(*id, false, None);
        }
        for handle in self.workers.values_mut() {
            match handle {
                Handle::Process { stdin, .. } => drop(stdin.take()),
                Handle::Task { stop, .. } => stop.cancel(),
            }
        }
        let deadline = Instant::now() + ttl * 4 + Duration::from_secs(10);
        for (_, handle) in std::mem::take(&mut self.workers) {
            match handle {
                Handle::Process {
                    mut child, reader, ..
                } => {
                    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                        thread::sleep(Duration::from_millis(10));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    if let Some(reader) = reader {
                        let _ = reader.join();
                    }
                }
                Handle::Task { task, .. } => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.runtime.block_on(async {
                        let abort = task.abort_handle();
                        if tokio::time::timeout(left, task).await.is_err() {
                            abort.abort();
                        }
                    });
                }
            }
        }
    }
}

struct Nemesis {
    rng: StdRng,
    ttl: Duration,
    delays: &'static StoreDelays,
    recorder: Recorder,
    next_fault: u32,
    injected: Vec<String>,
}

impl Nemesis {
    /// Longer than the TTL, so the lock is taken over meanwhile.
    fn past_ttl(&mut self) -> Duration {
        self.ttl.mul_f64(self.rng.random_range(1.5..2.5))
    }

    fn record(&mut self, fault: Fault, target: Option<u32>, detail: &str) -> u32 {
        self.record_as(fault, target, detail, fault.frees_early())
    }

    /// Records a fault whose early freeing depends on the moment (which member led).
    fn record_as(
        &mut self,
        fault: Fault,
        target: Option<u32>,
        detail: &str,
        frees_early: bool,
    ) -> u32 {
        let id = self.next_fault;
        self.next_fault += 1;
        self.recorder.push(Entry {
            t: now_ns(),
            worker: 0,
            event: Event::Fault {
                id,
                kind: fault.name().to_string(),
                target,
                frees_early,
                detail: detail.to_string(),
            },
        });
        self.injected.push(fault.name().to_string());
        id
    }

    fn healed(&self, id: u32) {
        self.recorder.push(Entry {
            t: now_ns(),
            worker: 0,
            event: Event::Healed { id },
        });
    }

    /// Injects `fault` and heals it; `None` if it needed a holder and there was none.
    fn inject(
        &mut self,
        fault: Fault,
        pool: &mut Pool<'_>,
        servers: &mut Servers,
        restarting: Option<&RestartingMemory>,
    ) -> Result<Option<String>> {
        let holder = match fault.target() {
            Some(target) => {
                let within = self.ttl * 3 + Duration::from_secs(2);
                match pool.wait_for_target(target, within, &mut self.rng) {
                    Some(id) => Some(id),
                    None => return Ok(None),
                }
            }
            None => None,
        };
        let fail = |e: test_servers::Error| setup_error(format!("{fault}: {e}"));
        let detail = match (fault, &mut *servers) {
            (Fault::Pause, _) => {
                let (w, pause) = (holder.unwrap_or(0), self.past_ttl());
                let id = self.record(fault, holder, &format!("worker {w} for {pause:?}"));
                pool.pause(w, true);
                thread::sleep(pause);
                pool.pause(w, false);
                self.healed(id);
                format!("worker {w} paused for {pause:?}")
            }
            (Fault::PauseWaiter, _) => {
                // Past rule 4's bound, so a waiter that keeps the key while frozen is seen.
                let w = holder.unwrap_or(0);
                let pause =
                    self.delays.bound(self.ttl) + self.ttl.mul_f64(self.rng.random_range(0.5..1.5));
                let id = self.record(fault, holder, &format!("waiting worker {w} for {pause:?}"));
                pool.pause(w, true);
                thread::sleep(pause);
                pool.pause(w, false);
                self.healed(id);
                format!("waiting worker {w} paused for {pause:?}")
            }
            (Fault::Kill, _) => {
                let w = holder.unwrap_or(0);
                let id = self.record(fault, holder, &format!("worker {w}"));
                let mode = pool.mode_of.get(&w).copied();
                pool.kill(w);
                let replacement = pool.spawn(mode)?;
                self.healed(id);
                format!("worker {w} killed, worker {replacement} started")
            }
            (Fault::Cut, _) => {
                let (w, cut) = (holder.unwrap_or(0), self.past_ttl());
                let id = self.record(fault, holder, &format!("worker {w} for {cut:?}"));
                pool.cut(w, true, None);
                thread::sleep(cut);
                pool.cut(w, false, None);
                self.healed(id);
                format!("worker {w} cut off for {cut:?}")
            }
            (Fault::RedlockCutMinority, Servers::Redlock(nodes)) => {
                let (w, cut) = (holder.unwrap_or(0), self.past_ttl());
                let mut picked: Vec<usize> = (0..nodes.len()).collect();
                picked.shuffle(&mut self.rng);
                picked.truncate(nodes.len().saturating_sub(1) / 2);
                let what = format!("worker {w} from nodes {picked:?} for {cut:?}");
                let id = self.record(fault, holder, &what);
                pool.cut(w, true, Some(&picked));
                thread::sleep(cut);
                pool.cut(w, false, Some(&picked));
                self.healed(id);
                what
            }
            (Fault::StoreRestart, _) => {
                let store = restarting.ok_or_else(|| setup_error("not a restartable store"))?;
                let id = self.record(fault, None, "memory store restarted");
                store.restart();
                self.healed(id);
                "memory store restarted".to_string()
            }
            (Fault::RedisRestart, Servers::Redis(server)) => {
                let id = self.record(fault, None, "SIGKILL, restart empty");
                server.restart().map_err(fail)?;
                self.healed(id);
                "killed and restarted empty".to_string()
            }
            (Fault::RedlockRestartMinority, Servers::Redlock(nodes)) => {
                let mut picked: Vec<usize> = (0..nodes.len()).collect();
                picked.shuffle(&mut self.rng);
                picked.truncate(nodes.len().saturating_sub(1) / 2);
                let down = self.past_ttl();
                let what = format!("nodes {picked:?} killed, restarted empty after {down:?}");
                let id = self.record(fault, None, &what);
                for &i in &picked {
                    nodes[i].kill().map_err(fail)?;
                }
                thread::sleep(down);
                for &i in &picked {
                    nodes[i].restart().map_err(fail)?;
                }
                self.healed(id);
                what
            }
            (Fault::EtcdKillLeader, Servers::Etcd(cluster)) => {
                let leader = cluster.leader().map_err(fail)?;
                let down = self.past_ttl();
                let what = format!("leader (member {leader}) killed, restarted after {down:?}");
                let id = self.record(fault, None, &what);
                cluster.kill(leader).map_err(fail)?;
                thread::sleep(down);
                cluster.restart(leader).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::EtcdStopMinority, Servers::Etcd(cluster)) => {
                let member = self.rng.random_range(0..cluster.member_count());
                let stopped = self.past_ttl();
                // A leader stopped past a TTL and resumed revokes leases a newer leader kept
                // alive, on etcd before 3.4.31/3.5.13 (etcd issue 15247): an early free the
                // fencelock-etcd docs name, so the checker must not blame the store for it.
                let leader = cluster.leader().ok() == Some(member);
                let affected = EtcdCluster::version().is_ok_and(|version| {
                    fencelock::fencelock_etcd::stale_leader_revokes_leases(&version)
                });
                let frees_early = leader && affected;
                let what = format!(
                    "member {member}{} stopped for {stopped:?}",
                    if leader { " (the leader)" } else { "" }
                );
                let id = self.record_as(fault, None, &what, frees_early);
                cluster.pause(member).map_err(fail)?;
                thread::sleep(stopped);
                cluster.resume(member).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::PgTerminate, Servers::Postgres(server)) => {
                // Whoever holds an advisory lock when the statement runs is hit, which may be a
                // holder granted after this line: no single target.
                let id = self.record(fault, None, "pg_terminate_backend of advisory-lock holders");
                let url = server.url();
                let ended = pool.runtime.block_on(async move {
                    use sqlx::Connection;
                    let mut conn = sqlx::PgConnection::connect(&url).await?;
                    sqlx::query_scalar::<_, i64>(TERMINATE_HOLDERS_SQL)
                        .fetch_one(&mut conn)
                        .await
                });
                self.healed(id);
                match ended {
                    Ok(n) => format!("{n} holder session(s) terminated"),
                    Err(e) => format!("terminate failed: {e}"),
                }
            }
            (Fault::PgRestart, Servers::Postgres(server)) => {
                let id = self.record(fault, None, "pg_ctl restart -m fast");
                server.restart().map_err(fail)?;
                self.healed(id);
                "fast restart".to_string()
            }
            (Fault::MysqlKill, Servers::Mysql(server)) => {
                // As with pg-terminate, the session hit is whoever holds the lock when the
                // look-up runs: no single target.
                let id = self.record(fault, None, "KILL CONNECTION of the lock's holder");
                let url = server.url();
                let killed = pool.runtime.block_on(kill_mysql_holder(url));
                self.healed(id);
                match killed {
                    Ok(Some(session)) => format!("holder session {session} killed"),
                    Ok(None) => "no holder at the look-up".to_string(),
                    Err(e) => format!("KILL failed: {e}"),
                }
            }
            (Fault::MysqlRestart, Servers::Mysql(server)) => {
                let id = self.record(fault, None, "mariadbd shutdown and start");
                server.restart().map_err(fail)?;
                self.healed(id);
                "fast restart".to_string()
            }
            (fault, _) => return Err(setup_error(format!("{fault} does not apply to this store"))),
        };
        Ok(Some(detail))
    }
}

/// Kills the session holding the workers' lock on the MariaDB server at `url` (which names
/// the database; the store's default table and namespace, as the workers use).
async fn kill_mysql_holder(url: String) -> std::result::Result<Option<i64>, sqlx::Error> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(&url).await?;
    let database = url.rsplit('/').next().unwrap_or_default();
    let database = database.split('?').next().unwrap_or_default();
    let name = fencelock_mysql::lock_name(
        database,
        fencelock_mysql::DEFAULT_TABLE,
        fencelock_mysql::DEFAULT_NAMESPACE,
        worker::KEY,
    );
    let holder = sqlx::query_scalar::<_, Option<i64>>(MYSQL_HOLDER_SQL)
        .bind(name)
        .fetch_one(&mut conn)
        .await?;
    if let Some(session) = holder {
        // KILL takes no placeholder; the id is an integer the server gave.
        sqlx::raw_sql(&format!("KILL CONNECTION {session}"))
            .execute(&mut conn)
            .await?;
    }
    Ok(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_split_from_the_rest_of_the_url() {
        assert_eq!(
            split_hosts("redlock://u:p@a:1,b:2/0?prefix=x"),
            (
                "redlock://u:p@".to_string(),
                vec!["a:1".to_string(), "b:2".to_string()],
                "/0?prefix=x".to_string()
            )
        );
        assert_eq!(
            split_hosts("postgres://postgres@127.0.0.1:5/postgres"),
            (
                "postgres://postgres@".to_string(),
                vec!["127.0.0.1:5".to_string()],
                "/postgres".to_string()
            )
        );
    }
}
