//! The controller: starts the store (or takes `--url`, resolved by the facade), the workers
//! and the resource, injects faults at random times from a seeded RNG, stops everything, and
//! hands the merged history and the resource's end state to the checker. The store's servers
//! (`servers`), the worker pool (`pool`) and the fault injector (`injector`) are modules of
//! their own; none of them imports this one.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{DynLockStore, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use test_servers::PostgresServer;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::checker::{check, Verdict};
use crate::clock::now_ns;
use crate::delays::StoreDelays;
use crate::fault::Fault;
use crate::faults::{self, FaultProfile, Launch};
use crate::history::{Entry, Event, Recorder, WorkMode};
use crate::injector::Nemesis;
use crate::pool::Pool;
use crate::resource;
use crate::servers::{setup_error, Servers};
use crate::store::{memory, RestartingMemory};
use crate::worker::{self, WorkerConfig};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// A live store to run against (client faults only); `None` starts each of `stores`.
    pub url: Option<String>,
    /// The stores to start, in order, when `url` is `None`.
    pub stores: Vec<FaultProfile>,
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

/// The stores a run is against, each with the live store's URL (`None`: the run starts it):
/// the store the facade finds for `--url`, or the stores asked for.
fn targets(options: &Options) -> Result<Vec<(FaultProfile, Option<String>)>> {
    Ok(match &options.url {
        Some(url) => vec![(FaultProfile::of_url(url)?, Some(url.clone()))],
        None => options.stores.iter().map(|&p| (p, None)).collect(),
    })
}

/// Runs every store the options name, one after another.
pub fn run(options: &Options) -> Result<Vec<StoreReport>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(setup_error)?;
    let targets = targets(options)?;
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
    let mut reports = Vec::new();
    for (profile, url) in targets {
        let report = run_store(profile, url, options, &runtime, &resource_url)?;
        reports.push(report);
    }
    drop(own_resource);
    Ok(reports)
}

fn run_store(
    profile: FaultProfile,
    url: Option<String>,
    options: &Options,
    runtime: &Runtime,
    resource_url: &str,
) -> Result<StoreReport> {
    let schema = format!("nemesis_{}", profile.name().replace('-', "_"));
    runtime.block_on(resource::setup(resource_url, &schema, worker::PERMITS))?;
    let own = url.is_none();
    let (mut servers, store_url) = match url {
        Some(url) => (Servers::None, url),
        None => Servers::start(&profile)?,
    };
    let run = StoreRun {
        profile,
        options,
        runtime,
        resource_url,
        schema,
        store_url,
        recorder: Recorder::new(),
    };
    let faults = run.faults(own);
    let (shared, restarting) = in_process(profile);
    let modes = run.modes(shared.as_ref())?;
    // The election's observer, on a connection of its own that no client fault touches.
    let observing = fencelock::CancellationToken::new();
    let observer = run.spawn_observer(shared.clone(), observing.clone());
    let mut pool = run.start_pool(shared, modes)?;

    let delays = faults::delays_of(profile.name());
    let mut nemesis = Nemesis::new(
        StdRng::seed_from_u64(options.seed ^ seed_salt(profile)),
        options.ttl,
        delays,
        run.recorder.clone(),
    );
    let start = Instant::now();
    run.inject_faults(
        start,
        &faults,
        &mut nemesis,
        &mut pool,
        &mut servers,
        restarting.as_deref(),
    );
    run.wind_down(start, &mut pool, &observing, observer);
    let (verdict, history_path) = run.judge(delays)?;
    drop(servers);
    Ok(run.report(nemesis.injected, verdict, history_path))
}

/// The in-process store of a profile that runs one (the memory store, or its broken twin
/// whose tokens restart), shared by every worker, and the handle that restarts it; `None`
/// for a store the workers connect to.
fn in_process(profile: FaultProfile) -> (Option<DynLockStore>, Option<Arc<RestartingMemory>>) {
    if profile.in_process() {
        let (store, restarting) = if profile.launch == Some(Launch::Memory { broken: true }) {
            memory(Some(true))
        } else {
            memory(None)
        };
        (Some(store), restarting)
    } else {
        (None, None)
    }
}

/// One store's run ([`run_store`]), once its store is up: what its steps read.
struct StoreRun<'a> {
    profile: FaultProfile,
    options: &'a Options,
    runtime: &'a Runtime,
    resource_url: &'a str,
    /// The resource's schema for this store.
    schema: String,
    /// The URL the workers connect to.
    store_url: String,
    recorder: Recorder,
}

impl<'a> StoreRun<'a> {
    /// Prints `line` on stderr, tagged with the store, in a verbose run.
    fn say(&self, line: String) {
        if self.options.verbose {
            eprintln!("[nemesis {}] {line}", self.profile);
        }
    }

    /// The faults to inject: those of the profile that apply (`own`: the run started the
    /// store, so server faults apply too), narrowed to the ones asked for. Says them.
    fn faults(&self, own: bool) -> Vec<Fault> {
        let options = self.options;
        let faults: Vec<Fault> = self
            .profile
            .faults(own)
            .into_iter()
            .filter(|f| options.faults.as_ref().is_none_or(|only| only.contains(f)))
            .collect();
        self.say(format!(
            "seed {}, {} workers, TTL {:?}, faults {:?}",
            options.seed,
            options.workers,
            options.ttl,
            faults.iter().map(|f| f.name()).collect::<Vec<_>>()
        ));
        faults
    }

    /// The modes the workers mix: every mode the store keeps (it says which), asked of the
    /// `shared` store or of a connection of its own. Says them.
    fn modes(&self, shared: Option<&DynLockStore>) -> Result<Vec<WorkMode>> {
        let capabilities = match shared {
            Some(store) => store.capabilities(),
            None => self
                .runtime
                .block_on(fencelock::connect(&self.store_url))?
                .capabilities(),
        };
        let modes: Vec<WorkMode> = worker::MODE_MIX
            .into_iter()
            .filter(|m| capabilities.supports(m.to_mode()))
            .collect();
        self.say(format!(
            "modes {:?}",
            modes.iter().map(|m| m.name()).collect::<Vec<_>>()
        ));
        Ok(modes)
    }

    /// Starts the election's observer, on the `shared` store or a connection of its own
    /// (retried until `stop`), recording into the history until `stop`.
    fn spawn_observer(
        &self,
        shared: Option<DynLockStore>,
        stop: fencelock::CancellationToken,
    ) -> JoinHandle<()> {
        let (store_url, recorder) = (self.store_url.clone(), self.recorder.clone());
        self.runtime.spawn(async move {
            let store = match shared {
                Some(store) => store,
                None => loop {
                    match fencelock::connect(&store_url).await {
                        Ok(store) => break store,
                        Err(_) if stop.is_cancelled() => return,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                },
            };
            let emit: worker::Emit = Arc::new(move |entry| recorder.push(entry));
            worker::observe(store, emit, stop).await;
        })
    }

    /// The worker pool, with the run's workers started, each taking one of `modes`.
    fn start_pool(&self, shared: Option<DynLockStore>, modes: Vec<WorkMode>) -> Result<Pool<'a>> {
        let options = self.options;
        let mut pool = Pool::new(
            self.runtime,
            self.recorder.clone(),
            self.store_url.clone(),
            self.profile.cut,
            shared,
            WorkerConfig {
                id: 0,
                ttl: options.ttl,
                hold_max: options.hold_max,
                resource_url: self.resource_url.to_string(),
                schema: self.schema.clone(),
                mode: WorkMode::Exclusive,
            },
            modes,
            options.worker_binary.clone(),
        );
        for _ in 0..options.workers {
            pool.spawn(None)?;
        }
        Ok(pool)
    }

    /// Injects `faults` after random gaps (half a TTL to one and a half) until the next gap
    /// would end past the run's duration, every fault once per cycle, and says how each went.
    fn inject_faults(
        &self,
        start: Instant,
        faults: &[Fault],
        nemesis: &mut Nemesis,
        pool: &mut Pool<'_>,
        servers: &mut Servers,
        restarting: Option<&RestartingMemory>,
    ) {
        let options = self.options;
        let mut cycle: Vec<Fault> = Vec::new();
        while !faults.is_empty() {
            let gap = options.ttl.mul_f64(nemesis.rng.random_range(0.5..1.5));
            if start.elapsed() + gap >= options.duration {
                break;
            }
            thread::sleep(gap);
            if cycle.is_empty() {
                // Every fault once per round, in a random order, so short runs see each kind.
                cycle = faults.to_vec();
                cycle.shuffle(&mut nemesis.rng);
            }
            let Some(fault) = cycle.pop() else { break };
            match nemesis.inject(fault, pool, servers, restarting) {
                Ok(Some(detail)) => self.say(format!("{fault}: {detail}")),
                Ok(None) => self.say(format!("{fault}: skipped, no worker to hit")),
                Err(e) => self.say(format!("{fault}: failed: {e}")),
            }
        }
    }

    /// Waits out the run's duration and two TTLs more, records the stop, and stops the
    /// workers and (through `observing`) the observer, waiting for it.
    fn wind_down(
        &self,
        start: Instant,
        pool: &mut Pool<'_>,
        observing: &fencelock::CancellationToken,
        observer: JoinHandle<()>,
    ) {
        let options = self.options;
        if let Some(rest) = options.duration.checked_sub(start.elapsed()) {
            thread::sleep(rest);
        }
        // Time to recover, so the availability after the last fault is measured, not cut short.
        thread::sleep(options.ttl * 2);
        self.recorder.push(Entry {
            t: now_ns(),
            worker: 0,
            event: Event::Stop,
        });
        pool.stop_all(options.ttl);
        observing.cancel();
        let _ = self.runtime.block_on(observer);
    }

    /// The checker's verdict on the history and the resource's end state, and where the
    /// history was written, if the options ask for it.
    fn judge(&self, delays: &StoreDelays) -> Result<(Verdict, Option<PathBuf>)> {
        let options = self.options;
        let history = self.recorder.snapshot();
        let state = self
            .runtime
            .block_on(resource::read_state(self.resource_url, &self.schema))?;
        let verdict = check(
            &history,
            &state,
            u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX),
            delays,
        );
        let history_path = match &options.history_dir {
            Some(dir) => Some(write_history(dir, self.profile, &history, &state)?),
            None => None,
        };
        Ok((verdict, history_path))
    }

    /// The store's report: the run, the `faults` injected, the `verdict`, and the history's
    /// file.
    fn report(
        &self,
        faults: Vec<String>,
        verdict: Verdict,
        history: Option<PathBuf>,
    ) -> StoreReport {
        let options = self.options;
        StoreReport {
            store: self.profile.name().to_string(),
            url: fencelock::redact(&self.store_url),
            seed: options.seed,
            ttl_ms: u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX),
            workers: options.workers,
            faults,
            verdict,
            history,
        }
    }
}

/// Each store's faults come from its own stream, so replaying one store with `--seed` repeats
/// its faults whatever other stores ran before.
fn seed_salt(profile: FaultProfile) -> u64 {
    profile.name().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn write_history(
    dir: &std::path::Path,
    profile: FaultProfile,
    history: &[Entry],
    state: &resource::ResourceState,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(setup_error)?;
    let path = dir.join(format!("{}-history.jsonl", profile.name()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).map_err(setup_error)?);
    for entry in history {
        let line = serde_json::to_string(entry).map_err(setup_error)?;
        writeln!(out, "{line}").map_err(setup_error)?;
    }
    let resource = dir.join(format!("{}-resource.json", profile.name()));
    let json = serde_json::to_string_pretty(state).map_err(setup_error)?;
    std::fs::write(resource, json).map_err(setup_error)?;
    out.flush().map_err(setup_error)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use fencelock::Error;

    use super::*;

    fn options(url: Option<&str>, stores: Vec<FaultProfile>) -> Options {
        Options {
            url: url.map(str::to_string),
            stores,
            faults: None,
            duration: Duration::from_secs(1),
            workers: 1,
            ttl: Duration::from_secs(1),
            hold_max: Duration::from_millis(100),
            seed: 1,
            resource_url: None,
            worker_binary: PathBuf::new(),
            history_dir: None,
            verbose: false,
        }
    }

    /// `--url` takes every scheme the facade serves, Redis Cluster's among them, with the
    /// faults every store takes; the stores asked for go through as they are.
    #[test]
    fn a_url_is_run_against_the_store_the_facade_finds() {
        let cluster = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001";
        let found = targets(&options(Some(cluster), Vec::new())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found.len(), 1);
        let (profile, url) = &found[0];
        assert_eq!(profile.name(), "redis-cluster");
        assert_eq!(url.as_deref(), Some(cluster));
        assert_eq!(
            profile.faults(false),
            [Fault::Pause, Fault::PauseWaiter, Fault::Kill]
        );

        let unknown = targets(&options(Some("consul://h"), Vec::new()));
        assert!(
            matches!(unknown, Err(Error::InvalidInput { what: "url", .. })),
            "{unknown:?}"
        );

        let asked: Vec<FaultProfile> = FaultProfile::startable().collect();
        let found = targets(&options(None, asked.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            found,
            asked.into_iter().map(|p| (p, None)).collect::<Vec<_>>()
        );
    }
}
