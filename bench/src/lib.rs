//! The measurement loops that every store's benchmark (this crate's bench targets) and
//! `lockctl bench` share.
//!
//! Nothing here asserts a timing: benchmarks print figures next to the raw store's own round
//! trip measured in the same run, and a person reads the ratio.

mod probe;

pub use crate::probe::{connections_to, cpu_time, live_bytes, rss_bytes, CountingAllocator};

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    Capabilities, DynLockStore, Error, KeepAlive, Lease, LockStore, Mode, Result,
};
use tokio::time::Instant;

/// The benchmark's command-line arguments: without the program's name, and without the
/// `--bench` flag that `cargo bench` passes.
pub fn args() -> impl Iterator<Item = String> {
    std::env::args().skip(1).filter(|arg| arg != "--bench")
}

/// Latency samples.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    sorted: Vec<Duration>,
}

impl Samples {
    /// Samples from unsorted durations.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Samples { sorted: samples }
    }

    /// The samples of every part, as one set (for a figure measured in rounds that
    /// alternate with another's, so both see the same machine).
    pub fn merged(parts: impl IntoIterator<Item = Samples>) -> Self {
        Samples::new(parts.into_iter().flat_map(|part| part.sorted).collect())
    }

    /// The `q` quantile (0.0 to 1.0); zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        self.sorted[index]
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }

    /// The largest sample; zero when empty.
    pub fn max(&self) -> Duration {
        self.quantile(1.0)
    }

    /// The arithmetic mean; zero when empty.
    pub fn mean(&self) -> Duration {
        let count = u32::try_from(self.sorted.len()).unwrap_or(u32::MAX).max(1);
        self.sorted.iter().sum::<Duration>() / count
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

/// Times `iterations` sequential calls of `op`, after `iterations / 10` warm-up calls.
///
/// # Errors
/// The first error `op` returns, as it is; no samples are kept.
///
/// # Cancel safety
/// Dropping the future drops the call of `op` in flight and the samples taken so far.
pub async fn time_each<F, Fut>(iterations: usize, mut op: F) -> Result<Samples>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    for i in 0..iterations / 10 {
        op(i).await?;
    }
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let started = Instant::now();
        op(i).await?;
        samples.push(started.elapsed());
    }
    Ok(Samples::new(samples))
}

/// Uncontended acquire + release cycles on one key.
///
/// # Errors
/// The first error of the store's `try_acquire` or `release`, as it is:
/// [`Contended`](fencelock_core::ErrorKind::Contended) when the key is held by someone else,
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key or TTL,
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
/// [`Store`](fencelock_core::ErrorKind::Store).
///
/// # Cancel safety
/// Dropping the future loses the samples taken so far; a lease granted but not yet released
/// may stay held until its TTL.
pub async fn cycle(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    iterations: usize,
) -> Result<Samples> {
    time_each(iterations, |_| async {
        let lease = store.try_acquire(key, ttl).await?;
        store.release(&lease).await.map(drop)
    })
    .await
}

/// Times `iterations` uncontended acquire + release cycles on `key`, with no warm-up, adding
/// the samples to `samples`: one turn of loops timed in alternating rounds, so that all of them
/// see the same machine load.
///
/// # Errors
/// The first error of the store's `try_acquire` or `release`, as it is:
/// [`Contended`](fencelock_core::ErrorKind::Contended) when the key is held by someone else,
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key or TTL,
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
/// [`Store`](fencelock_core::ErrorKind::Store).
///
/// # Cancel safety
/// Dropping the future keeps the samples already added; a lease granted but not yet released
/// may stay held until its TTL.
pub async fn cycle_into(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    iterations: usize,
    samples: &mut Vec<Duration>,
) -> Result<()> {
    for _ in 0..iterations {
        let started = Instant::now();
        let lease = store.try_acquire(key, ttl).await?;
        let _ = store.release(&lease).await?;
        samples.push(started.elapsed());
    }
    Ok(())
}

/// The limit of the semaphore whose permit cycle the benchmarks time.
pub const BENCH_PERMITS: u32 = 4;

/// Uncontended acquire + release cycles in `mode` on one key, as [`cycle`] times the
/// exclusive one.
///
/// # Errors
/// The first error of the store's `try_acquire_as` or `release`, as it is:
/// [`Contended`](fencelock_core::ErrorKind::Contended) when the key is held by someone else,
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key, TTL or limit,
/// [`Unsupported`](fencelock_core::ErrorKind::Unsupported) for a mode the store does not keep,
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
/// [`Store`](fencelock_core::ErrorKind::Store).
///
/// # Cancel safety
/// Dropping the future loses the samples taken so far; a lease granted but not yet released
/// may stay held until its TTL.
pub async fn cycle_as(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    mode: Mode,
    iterations: usize,
) -> Result<Samples> {
    time_each(iterations, |_| async {
        let lease = store.try_acquire_as(key, ttl, mode).await?;
        store.release(&lease).await.map(drop)
    })
    .await
}

/// As [`cycle_into`], in `mode`.
///
/// # Errors
/// The first error of the store's `try_acquire_as` or `release`, as it is:
/// [`Contended`](fencelock_core::ErrorKind::Contended) when the key is held by someone else,
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key, TTL or limit,
/// [`Unsupported`](fencelock_core::ErrorKind::Unsupported) for a mode the store does not keep,
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
/// [`Store`](fencelock_core::ErrorKind::Store).
///
/// # Cancel safety
/// Dropping the future keeps the samples already added; a lease granted but not yet released
/// may stay held until its TTL.
pub async fn cycle_as_into(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    mode: Mode,
    iterations: usize,
    samples: &mut Vec<Duration>,
) -> Result<()> {
    for _ in 0..iterations {
        let started = Instant::now();
        let lease = store.try_acquire_as(key, ttl, mode).await?;
        let _ = store.release(&lease).await?;
        samples.push(started.elapsed());
    }
    Ok(())
}

/// The cycles of the lock modes besides exclusive that a store keeps — a permit of a
/// [`BENCH_PERMITS`]-permit semaphore, then a shared lease — each on its own key, timed in
/// the same alternating rounds as the exclusive cycle, so a benchmark prints them next to it.
/// A mode the store's [`Capabilities`] do not declare is left out: no row, no request.
///
/// ```
/// # async fn demo() -> fencelock_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use fencelock_bench::{cycle_into, ModeCycles, Samples, Table};
/// use fencelock_core::{DynLockStore, LockStore, MemoryStore};
///
/// let store: DynLockStore = Arc::new(MemoryStore::new());
/// let ttl = Duration::from_secs(10);
/// let mut modes = ModeCycles::new(&store.capabilities());
/// modes.warm_up(&store, "cycle", ttl, 10).await?;
/// let mut exclusive = Vec::new();
/// for _round in 0..4 {
///     cycle_into(&store, "cycle", ttl, 25, &mut exclusive).await?;
///     modes.round(&store, "cycle", ttl, 25).await?;
/// }
/// let exclusive = Samples::new(exclusive);
/// let mut table = Table::default();
/// table.latency("ours: try_acquire + release p50", exclusive.p50());
/// modes.rows(&mut table, "ours: ", Some(exclusive.p50()), Some(exclusive.p99()));
/// assert_eq!(table.rows.len(), 5); // the memory store keeps both modes
/// # Ok(())
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
/// #     .block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct ModeCycles {
    cycles: Vec<(Mode, Vec<Duration>)>,
}

impl ModeCycles {
    /// The modes `capabilities` declare, besides exclusive.
    pub fn new(capabilities: &Capabilities) -> Self {
        let cycles = [Mode::permits(BENCH_PERMITS), Mode::Shared]
            .into_iter()
            .filter(|mode| capabilities.supports(*mode))
            .map(|mode| (mode, Vec::new()))
            .collect();
        ModeCycles { cycles }
    }

    /// Whether the store keeps none of them.
    pub fn is_empty(&self) -> bool {
        self.cycles.is_empty()
    }

    /// The key of `mode`'s cycle: `key_prefix` and the mode.
    fn key(key_prefix: &str, mode: Mode) -> String {
        match mode {
            Mode::Shared => format!("{key_prefix}:shared"),
            Mode::Permit { limit } => format!("{key_prefix}:permits-{limit}"),
            other => format!("{key_prefix}:{other}"),
        }
    }

    /// `iterations` untimed cycles of each mode.
    ///
    /// # Errors
    /// The first error of the store's `try_acquire_as` or `release`, as it is:
    /// [`Contended`](fencelock_core::ErrorKind::Contended) when the key is held by someone else,
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key, TTL or limit,
    /// [`Unsupported`](fencelock_core::ErrorKind::Unsupported) for a mode the store does not keep,
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
    /// [`Store`](fencelock_core::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing measured; a lease granted but not yet released may
    /// stay held until its TTL.
    pub async fn warm_up(
        &self,
        store: &DynLockStore,
        key_prefix: &str,
        ttl: Duration,
        iterations: usize,
    ) -> Result<()> {
        let mut discarded = Vec::new();
        for (mode, _) in &self.cycles {
            let key = Self::key(key_prefix, *mode);
            cycle_as_into(store, &key, ttl, *mode, iterations, &mut discarded).await?;
        }
        Ok(())
    }

    /// Times `iterations` cycles of each mode, one mode after the other, adding the samples.
    ///
    /// # Errors
    /// The first error of the store's `try_acquire_as` or `release`, as it is:
    /// [`Contended`](fencelock_core::ErrorKind::Contended) when the key is held by someone else,
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key, TTL or limit,
    /// [`Unsupported`](fencelock_core::ErrorKind::Unsupported) for a mode the store does not keep,
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
    /// [`Store`](fencelock_core::ErrorKind::Store).
    ///
    /// # Cancel safety
    /// Dropping the future keeps the samples already added; a lease granted but not yet released
    /// may stay held until its TTL.
    pub async fn round(
        &mut self,
        store: &DynLockStore,
        key_prefix: &str,
        ttl: Duration,
        iterations: usize,
    ) -> Result<()> {
        for (mode, samples) in &mut self.cycles {
            let key = Self::key(key_prefix, *mode);
            cycle_as_into(store, &key, ttl, *mode, iterations, samples).await?;
        }
        Ok(())
    }

    /// Each mode's samples so far, with the words for its rows: `"semaphore permit (of 4)"`,
    /// `"shared (reader)"`.
    pub fn samples(&self) -> Vec<(String, Samples)> {
        self.cycles
            .iter()
            .map(|(mode, samples)| (Self::label(*mode), Samples::new(samples.clone())))
            .collect()
    }

    fn label(mode: Mode) -> String {
        match mode {
            Mode::Shared => "shared (reader)".to_owned(),
            Mode::Permit { limit } => format!("semaphore permit (of {limit})"),
            other => other.to_string(),
        }
    }

    /// Adds a p50 and a p99 row per mode, `"{prefix}{label}: try_acquire_as + release p50"`,
    /// each with its ratio to `p50_base` / `p99_base` where given (the base the exclusive
    /// cycle's rows are divided by, so the ratio column keeps one meaning).
    pub fn rows(
        &self,
        table: &mut Table,
        prefix: &str,
        p50_base: Option<Duration>,
        p99_base: Option<Duration>,
    ) {
        for (label, samples) in self.samples() {
            let row = table.latency(
                format!("{prefix}{label}: try_acquire_as + release p50"),
                samples.p50(),
            );
            if let Some(base) = p50_base.filter(|b| !b.is_zero()) {
                row.ratio(micros(samples.p50()) / micros(base), None);
            }
            let row = table.latency(
                format!("{prefix}{label}: try_acquire_as + release p99"),
                samples.p99(),
            );
            if let Some(base) = p99_base.filter(|b| !b.is_zero()) {
                row.ratio(micros(samples.p99()) / micros(base), None);
            }
        }
    }
}

/// A benchmark task that panicked (or was cancelled), as the store error its loop reports.
fn panicked(e: tokio::task::JoinError) -> Error {
    Error::Store {
        message: format!("a benchmark task panicked: {e}"),
        source: None,
    }
}

/// Runs `op(task, iteration)` in `tasks` concurrent loops for `duration`; returns completed
/// operations per second.
///
/// # Errors
/// An error `op` returned, as it is (the first task's, in task order, that failed), or
/// [`Store`](fencelock_core::ErrorKind::Store) if a loop panicked. Loops are awaited only
/// once `duration` has passed.
///
/// # Cancel safety
/// Dropping the future leaves the spawned loops running `op` until one fails or the runtime
/// shuts down: they stop only when the full `duration` has passed here.
///
/// # Panics
/// Outside a tokio runtime.
pub async fn throughput<F, Fut>(tasks: usize, duration: Duration, op: F) -> Result<f64>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut joins = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
        joins.push(tokio::spawn(async move {
            let mut iteration = 0;
            while !stop.load(Ordering::Relaxed) {
                op(task, iteration).await?;
                iteration += 1;
                done.fetch_add(1, Ordering::Relaxed);
                // An in-process store answers without ever yielding: without this, the tasks
                // would keep every worker busy and the timer that stops them would never fire.
                tokio::task::yield_now().await;
            }
            Ok::<_, Error>(())
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for join in joins {
        join.await.map_err(panicked)??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Acquire + release cycles per second with `tasks` tasks, each on its own key.
///
/// # Errors
/// As [`throughput`], with `op` the store's `try_acquire` and `release`:
/// [`Contended`](fencelock_core::ErrorKind::Contended),
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key or TTL,
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
/// [`Store`](fencelock_core::ErrorKind::Store).
///
/// # Cancel safety
/// As [`throughput`]: the loops keep acquiring and releasing until one fails or the runtime
/// shuts down.
///
/// # Panics
/// Outside a tokio runtime.
pub async fn lock_throughput(
    store: DynLockStore,
    key_prefix: &str,
    ttl: Duration,
    tasks: usize,
    duration: Duration,
) -> Result<f64> {
    let prefix = key_prefix.to_owned();
    throughput(tasks, duration, move |task, _| {
        let (store, key) = (store.clone(), format!("{prefix}{task}"));
        async move {
            let lease = store.try_acquire(&key, ttl).await?;
            store.release(&lease).await.map(drop)
        }
    })
    .await
}

/// Handoff latency: the time from a holder starting its release to the next waiter holding the
/// key, with one waiter task per handle all contending for `key`, until `handoffs` samples.
///
/// The releaser contends again at once, so a lock whose releaser simply re-takes the key (as a
/// polling lock's does, its waiters being asleep) reports its own unlock + lock as a handoff;
/// [`handoff_to_another`] rules that out.
///
/// # Errors
/// As [`handoff_between`], with the store's `acquire` (30 s wait) and `release`:
/// [`Contended`](fencelock_core::ErrorKind::Contended) when a wait runs out,
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key or TTL,
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable),
/// [`Store`](fencelock_core::ErrorKind::Store).
///
/// # Cancel safety
/// As [`handoff_between`].
pub async fn handoff(
    handles: Vec<DynLockStore>,
    key: &str,
    ttl: Duration,
    handoffs: usize,
) -> Result<Samples> {
    let contenders = store_contenders(handles, key, ttl, Duration::from_secs(30));
    handoff_between(contenders, handoffs, Handoff::AnyWaiter).await
}

/// Handoff to *another* waiter: as [`handoff`], but each holder keeps the key for `hold` (so
/// the other waiters are parked in their wait, not in the first attempt they made on joining,
/// when the release comes), and the releaser contends again only once someone else has taken
/// the key, so no lock can report its own unlock + lock as a handoff.
///
/// # Errors
/// As [`handoff`], with a 60 s wait.
///
/// # Cancel safety
/// As [`handoff_between`].
pub async fn handoff_to_another(
    handles: Vec<DynLockStore>,
    key: &str,
    ttl: Duration,
    hold: Duration,
    handoffs: usize,
) -> Result<Samples> {
    let contenders = store_contenders(handles, key, ttl, Duration::from_secs(60));
    handoff_between(contenders, handoffs, Handoff::ToAnother { hold }).await
}

/// One waiter of a handoff measurement: something that takes one key, waiting until it is
/// granted, and gives it back. A store handle is one ([`handoff`]); a benchmark's baseline (a
/// raw connection, another lock library) is another, so both are measured by the same loop.
#[async_trait]
pub trait Contender: Send + 'static {
    /// What holding the key leaves in hand, to give it back with.
    type Held: Send;

    /// Takes the key, waiting until it is granted.
    async fn take(&mut self) -> Result<Self::Held>;

    /// Gives the key back.
    async fn give_back(&mut self, held: Self::Held) -> Result<()>;
}

/// What a holder does around its release in [`handoff_between`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handoff {
    /// Releases at once and contends again at once: the next holder may be the releaser.
    AnyWaiter,
    /// Holds the key for `hold`, releases, and contends again only once another waiter holds
    /// the key: every sample is a handoff to someone else.
    ToAnother {
        /// How long each holder keeps the key before releasing it.
        hold: Duration,
    },
}

/// Handoff latency between `contenders`, one task each, all taking the same key: the time from
/// a holder starting its release to the next holder's grant, until `handoffs` samples. The
/// first task to finish ends the run; the others, parked with nothing left to hand them, are
/// aborted.
///
/// # Errors
/// The error of the first task to finish (its contender's `take` or `give_back`), as it is,
/// or [`Store`](fencelock_core::ErrorKind::Store) if it panicked.
///
/// # Cancel safety
/// Dropping the future detaches the contenders' tasks: they go on taking and giving back the
/// key until they finish or fail, or the runtime shuts down.
///
/// # Panics
/// Outside a tokio runtime.
pub async fn handoff_between<C: Contender>(
    contenders: Vec<C>,
    handoffs: usize,
    mode: Handoff,
) -> Result<Samples> {
    struct State {
        released_at: Option<Instant>,
        samples: Vec<Duration>,
    }
    let state = Arc::new(Mutex::new(State {
        released_at: None,
        samples: Vec::with_capacity(handoffs),
    }));
    let grants = Arc::new(tokio::sync::watch::channel(0u64).0);
    let mut joins = Vec::new();
    for mut contender in contenders {
        let (state, grants) = (state.clone(), grants.clone());
        joins.push(tokio::spawn(async move {
            loop {
                let held = contender.take().await?;
                let now = Instant::now();
                let finished = {
                    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(released_at) = state.released_at.take() {
                        state.samples.push(now - released_at);
                    }
                    state.samples.len() >= handoffs
                };
                // Nobody else can be granted while this holder has the key, so subscribing
                // right after counting this grant waits exactly for the next one.
                let mut granted = match mode {
                    Handoff::AnyWaiter => None,
                    Handoff::ToAnother { .. } => {
                        grants.send_modify(|g| *g += 1);
                        Some(grants.subscribe())
                    }
                };
                if !finished {
                    if let Handoff::ToAnother { hold } = mode {
                        tokio::time::sleep(hold).await;
                    }
                    state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .released_at = Some(Instant::now());
                }
                contender.give_back(held).await?;
                if finished {
                    return Ok::<_, Error>(());
                }
                if let Some(granted) = &mut granted {
                    let _ = granted.changed().await;
                }
            }
        }));
    }
    let (first, _, rest) = futures_util::future::select_all(joins).await;
    first.map_err(panicked)??;
    for join in rest {
        join.abort();
    }
    let samples = state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .samples
        .clone();
    Ok(Samples::new(samples))
}

/// A store handle as a [`Contender`] for `key`.
struct StoreContender {
    store: DynLockStore,
    key: String,
    ttl: Duration,
    wait: Duration,
}

/// One [`Contender`] per handle, each taking `key` with the store's `acquire` (`ttl`, waiting up
/// to `wait`) and giving it back with `release`: a store's side of [`handoff_between`] or of
/// [`PeersProtocol::run`].
pub fn store_contenders(
    handles: Vec<DynLockStore>,
    key: &str,
    ttl: Duration,
    wait: Duration,
) -> Vec<impl Contender<Held = Lease>> {
    handles
        .into_iter()
        .map(|store| StoreContender {
            store,
            key: key.to_owned(),
            ttl,
            wait,
        })
        .collect()
}

#[async_trait]
impl Contender for StoreContender {
    type Held = Lease;

    async fn take(&mut self) -> Result<Lease> {
        self.store.acquire(&self.key, self.ttl, self.wait).await
    }

    async fn give_back(&mut self, lease: Lease) -> Result<()> {
        self.store.release(&lease).await.map(drop)
    }
}

/// The peers' protocol: the load under which an independent harness compared
/// fencelock with each store's own lock. Contenders take one key in turn, each holding it for
/// [`hold`](Self::hold) and pausing [`pause`](Self::pause) after each release before asking
/// again; the figure is each take's latency, from asking to holding. The contenders of a round
/// start spread evenly over one period (hold + pause), as they run in a long run's steady
/// state, so that each round does not add a burst of every contender at once.
///
/// [`run`](Self::run) times ours and the peer in interleaved rounds (ours, peer, ours, peer …),
/// so the same noise hits both. Every contender finishes its takes before a round ends, so
/// nothing is left queued on the key for the next one.
///
/// ```
/// # async fn demo() -> fencelock_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use fencelock_bench::{store_contenders, PeersProtocol, Table};
/// use fencelock_core::{DynLockStore, MemoryStore};
///
/// let (ttl, wait) = (Duration::from_secs(10), Duration::from_secs(10));
/// let ours: DynLockStore = Arc::new(MemoryStore::new());
/// let peer: DynLockStore = Arc::new(MemoryStore::new());
/// let protocol = PeersProtocol { rounds: 2, takes: 3, ..PeersProtocol::HARNESS };
/// let versus = protocol
///     .run(
///         store_contenders(vec![ours.clone(); 8], "k", ttl, wait),
///         store_contenders(vec![peer.clone(); 8], "k", ttl, wait),
///     )
///     .await?;
/// assert_eq!((versus.ours.len(), versus.peer.len()), (48, 48));
/// let mut table = Table::default();
/// versus.rows(&mut table, "the peer", 1.0);
/// assert_eq!(table.rows.len(), 7); // a heading, then ours and the peer's p50, mean, p99
/// # Ok(())
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
/// #     .block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeersProtocol {
    /// How long each holder keeps the key.
    pub hold: Duration,
    /// How long each contender waits after its release before asking again.
    pub pause: Duration,
    /// Rounds of each side.
    pub rounds: usize,
    /// Takes per contender in each round.
    pub takes: usize,
}

/// Contenders in the harness's protocol.
pub const PEERS_CONTENDERS: usize = 8;

impl PeersProtocol {
    /// The harness's protocol (hold 1 ms, pause 30 ms; with [`PEERS_CONTENDERS`] contenders a
    /// side), in 8 rounds of 20 takes per contender: 1,280 samples a side, about 11 s for both
    /// sides at a few milliseconds per take.
    pub const HARNESS: PeersProtocol = PeersProtocol {
        hold: Duration::from_millis(1),
        pause: Duration::from_millis(30),
        rounds: 8,
        takes: 20,
    };

    /// Runs the protocol on `ours` and on `peer` (the contenders of each side, all on one key),
    /// in [`rounds`](Self::rounds) interleaved rounds, after one untimed round of 2 takes each.
    ///
    /// # Errors
    /// The first error of a contender's `take` or `give_back` (the first in contender order of
    /// the round that failed), as it is, or [`Store`](fencelock_core::ErrorKind::Store) if a
    /// contender's task panicked.
    ///
    /// # Cancel safety
    /// Dropping the future detaches the round's contender tasks: they finish their takes (or
    /// fail), and the contenders are dropped with them.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn run<A: Contender, B: Contender>(
        &self,
        ours: Vec<A>,
        peer: Vec<B>,
    ) -> Result<VersusPeer> {
        self.run_sides(ours, peer, None::<Vec<A>>).await
    }

    /// [`run`](Self::run) with a third side, a `floor` (a store's smallest correct lock by
    /// hand, say), in the same interleaved rounds (ours, peer, floor, ours …), so the floor's
    /// takes see the same noise as the other two; its samples are
    /// [`VersusPeer::floor`].
    ///
    /// # Errors
    /// As [`run`](Self::run), the floor's contenders included.
    ///
    /// # Cancel safety
    /// As [`run`](Self::run).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn run_with_floor<A: Contender, B: Contender, F: Contender>(
        &self,
        ours: Vec<A>,
        peer: Vec<B>,
        floor: Vec<F>,
    ) -> Result<VersusPeer> {
        self.run_sides(ours, peer, Some(floor)).await
    }

    /// The rounds of [`run`](Self::run) and [`run_with_floor`](Self::run_with_floor).
    async fn run_sides<A: Contender, B: Contender, F: Contender>(
        &self,
        mut ours: Vec<A>,
        mut peer: Vec<B>,
        mut floor: Option<Vec<F>>,
    ) -> Result<VersusPeer> {
        let warm_up = PeersProtocol { takes: 2, ..*self };
        let mut discarded = Taken::default();
        ours = warm_up.round(ours, &mut discarded).await?;
        peer = warm_up.round(peer, &mut discarded).await?;
        if let Some(contenders) = floor.take() {
            floor = Some(warm_up.round(contenders, &mut discarded).await?);
        }
        let (mut our_samples, mut peer_samples, mut floor_samples) =
            (Taken::default(), Taken::default(), Taken::default());
        for _ in 0..self.rounds {
            ours = self.round(ours, &mut our_samples).await?;
            peer = self.round(peer, &mut peer_samples).await?;
            if let Some(contenders) = floor.take() {
                floor = Some(self.round(contenders, &mut floor_samples).await?);
            }
        }
        let has_floor = floor.is_some();
        Ok(VersusPeer {
            protocol: *self,
            contenders: (ours.len(), peer.len()),
            ours: Samples::new(our_samples.takes),
            peer: Samples::new(peer_samples.takes),
            floor: has_floor.then(|| Samples::new(floor_samples.takes)),
            handoffs: Handoffs {
                ours: Samples::new(our_samples.handoffs),
                peer: Samples::new(peer_samples.handoffs),
                floor: has_floor.then(|| Samples::new(floor_samples.handoffs)),
                ours_queued: Samples::new(our_samples.queued_handoffs),
                peer_queued: Samples::new(peer_samples.queued_handoffs),
            },
        })
    }

    /// One round: every contender takes the key [`takes`](Self::takes) times, adding each
    /// take's latency to `samples.takes`, and each grant to a contender that was already
    /// asking when the holder started its release, timed from that start, to
    /// `samples.handoffs`; the contenders come back for the next round.
    async fn round<C: Contender>(&self, contenders: Vec<C>, samples: &mut Taken) -> Result<Vec<C>> {
        let PeersProtocol {
            hold, pause, takes, ..
        } = *self;
        let count = u32::try_from(contenders.len()).unwrap_or(u32::MAX).max(1);
        // When the last holder started its release, and when it was granted; the first
        // contender granted after that release that had asked before it takes the sample.
        let released_at: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::new(Mutex::new(None));
        let joins: Vec<_> = contenders
            .into_iter()
            .zip(0u32..)
            .map(|(mut contender, i)| {
                let start = (hold + pause) * i / count;
                let released_at = released_at.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(start).await;
                    let mut taken = Taken::default();
                    for _ in 0..takes {
                        let asked = Instant::now();
                        let held = contender.take().await?;
                        let granted = Instant::now();
                        taken.takes.push(granted - asked);
                        {
                            let mut released =
                                released_at.lock().unwrap_or_else(PoisonError::into_inner);
                            if let Some((at, holder_granted)) =
                                released.filter(|&(at, _)| at > asked)
                            {
                                taken.handoffs.push(granted - at);
                                if asked < holder_granted {
                                    taken.queued_handoffs.push(granted - at);
                                }
                                *released = None;
                            }
                        }
                        tokio::time::sleep(hold).await;
                        *released_at.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some((Instant::now(), granted));
                        contender.give_back(held).await?;
                        tokio::time::sleep(pause).await;
                    }
                    Ok::<_, Error>((contender, taken))
                })
            })
            .collect();
        let mut back = Vec::with_capacity(joins.len());
        let mut failed = None;
        for join in joins {
            match join.await {
                Ok(Ok((contender, taken))) => {
                    back.push(contender);
                    samples.takes.extend(taken.takes);
                    samples.handoffs.extend(taken.handoffs);
                    samples.queued_handoffs.extend(taken.queued_handoffs);
                }
                Ok(Err(e)) => {
                    failed.get_or_insert(e);
                }
                Err(e) => {
                    failed.get_or_insert(panicked(e));
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(back),
        }
    }
}

/// What one side's contenders measured in [`PeersProtocol`] rounds.
#[derive(Debug, Default)]
struct Taken {
    /// Every take, asking to holding.
    takes: Vec<Duration>,
    /// Every grant to a contender that was asking when the holder started its release, from
    /// that start.
    handoffs: Vec<Duration>,
    /// Those of `handoffs` to a contender that was asking already when that holder was
    /// granted (queued behind it for its whole hold).
    queued_handoffs: Vec<Duration>,
}

/// Release-to-grant handoffs in a [`PeersProtocol`] run: from a holder starting its release
/// to the grant of a contender that was already asking (a take that found the key free is
/// not one).
#[derive(Debug, Clone)]
pub struct Handoffs {
    /// Ours.
    pub ours: Samples,
    /// The peer's.
    pub peer: Samples,
    /// The floor's, when run with one.
    pub floor: Option<Samples>,
    /// Ours, to a contender asking since the releasing holder's grant.
    pub ours_queued: Samples,
    /// The peer's, likewise.
    pub peer_queued: Samples,
}

impl VersusPeer {
    /// Adds the handoff rows: for each of p50, mean and p99, ours (label
    /// `"peers' protocol handoff {stat}: ours"`) with its ratio to the peer's and, where given,
    /// the target `≤ {target}× {peer}`, then the peer's, as [`versus_rows`] prints them, after a heading
    /// with the number of handoffs of each side.
    pub fn handoff_rows(&self, table: &mut Table, peer: &str, target: Option<f64>) {
        self.handoff_rows_reach(table, peer, target, None);
    }

    /// [`handoff_rows`](Self::handoff_rows), and with the [`Handoffs::floor`] of a run with a
    /// floor, named `floor`: a target the floor's handoffs miss themselves says
    /// `(out of reach of {floor} in this run, below)`, and after the rows of the handoffs
    /// since the holder's grant come the floor's handoff p50, mean and p99, each with its ratio
    /// to the peer's (labels `"peers' protocol handoff p50: {floor}"` …), and ours over the
    /// floor's p50.
    pub fn handoff_rows_with_floor(
        &self,
        table: &mut Table,
        peer: &str,
        target: Option<f64>,
        floor: &str,
    ) {
        let Some(floor_samples) = &self.handoffs.floor else {
            return self.handoff_rows(table, peer, target);
        };
        self.handoff_rows_reach(table, peer, target, Some((floor, floor_samples)));
        for (name, stat) in STATS {
            let (least, theirs) = (stat(floor_samples), stat(&self.handoffs.peer));
            table
                .latency(format!("peers' protocol handoff {name}: {floor}"), least)
                .ratio(ratio(least, theirs), None);
        }
        table.push(
            format!("  peers' protocol handoff p50 ours / {floor}"),
            format!(
                "{:.2}",
                ratio(self.handoffs.ours.p50(), floor_samples.p50())
            ),
        );
    }

    fn handoff_rows_reach(
        &self,
        table: &mut Table,
        peer: &str,
        target: Option<f64>,
        floor: Option<(&str, &Samples)>,
    ) {
        table.push(
            "peers' protocol handoff: a holder's release to a waiting contender's grant",
            format!(
                "{} and {} handoffs",
                self.handoffs.ours.len(),
                self.handoffs.peer.len()
            ),
        );
        versus_rows_reach(
            table,
            "peers' protocol handoff",
            &self.handoffs.ours,
            peer,
            &self.handoffs.peer,
            target,
            floor,
        );
        self.queued_handoff_rows(table, peer);
    }

    /// The handoffs' p50 to a contender asking since the releasing holder's grant, ours with
    /// its ratio to the peer's, then the peer's: the same handoffs with the contender's
    /// arrival taken out, as a lock whose acquire is quicker has fewer queued contenders and
    /// more handoffs to one still enqueueing, each of which starts later.
    fn queued_handoff_rows(&self, table: &mut Table, peer: &str) {
        let Handoffs {
            ours_queued,
            peer_queued,
            ..
        } = &self.handoffs;
        let what = "peers' protocol handoff to a contender asking since the holder's grant";
        table.push(
            what,
            format!("{} and {} handoffs", ours_queued.len(), peer_queued.len()),
        );
        // A side with no such handoff has no p50 (and ours no ratio to it).
        let (own, other) = (ours_queued.p50(), peer_queued.p50());
        if !ours_queued.is_empty() {
            let row = table.latency(format!("{what}, p50: ours"), own);
            if !peer_queued.is_empty() {
                row.ratio(ratio(own, other), None);
            }
        }
        if !peer_queued.is_empty() {
            table.latency(format!("{what}, p50: {peer}"), other);
        }
    }
}

/// Acquire latencies of ours and a peer in the same [`PeersProtocol`] run.
#[derive(Debug, Clone)]
pub struct VersusPeer {
    /// The protocol they were measured in.
    pub protocol: PeersProtocol,
    /// How many contenders each side had: (ours, the peer's).
    pub contenders: (usize, usize),
    /// Ours: asking to holding, every take.
    pub ours: Samples,
    /// The peer's.
    pub peer: Samples,
    /// The floor's, from its own contenders in the same rounds, when run with one
    /// ([`PeersProtocol::run_with_floor`]).
    pub floor: Option<Samples>,
    /// The release-to-grant handoffs of the same rounds.
    pub handoffs: Handoffs,
}

impl VersusPeer {
    /// Adds the rows: a heading naming the protocol and the samples, then for each of p50,
    /// mean and p99 ours, with its ratio to the peer's and the target `≤ {target}× {peer}`,
    /// and the peer's. Labels: `"peers' protocol acquire p50: ours"`,
    /// `"peers' protocol acquire p50: {peer}"`. With a [`floor`](Self::floor), as
    /// [`rows_with_floor`](Self::rows_with_floor) naming it "the floor".
    pub fn rows(&self, table: &mut Table, peer: &str, target: f64) {
        self.rows_with_floor(table, peer, target, "the floor");
    }

    /// [`rows`](Self::rows), and with a [`floor`](Self::floor) named `floor`: a target the
    /// floor itself misses (the floor's figure over the peer's above `target`) says
    /// `(out of reach of {floor} in this run, below)`, and after the peer's p99 come the
    /// floor's p50, mean and p99, each with its ratio to the peer's (labels
    /// `"peers' protocol acquire p50: {floor}"` …), then the floor's p50 over the peer's (the
    /// least a lock like the floor costs in this protocol) and ours over the floor's. Without a
    /// floor, exactly the rows of [`rows`](Self::rows).
    pub fn rows_with_floor(&self, table: &mut Table, peer: &str, target: f64, floor: &str) {
        let PeersProtocol { hold, pause, .. } = self.protocol;
        let contenders = if self.contenders.0 == self.contenders.1 {
            self.contenders.0.to_string()
        } else {
            format!(
                "{} (ours) and {} ({peer})",
                self.contenders.0, self.contenders.1
            )
        };
        table.push(
            format!(
                "peers' protocol: {contenders} contenders on one key, hold {} ms, pause {} ms",
                hold.as_millis(),
                pause.as_millis()
            ),
            format!(
                "{} and {} takes, rounds interleaved",
                self.ours.len(),
                self.peer.len()
            ),
        );
        for (name, stat) in STATS {
            let (ours, theirs) = (stat(&self.ours), stat(&self.peer));
            let out_of_reach = self
                .floor
                .as_ref()
                .is_some_and(|f| ratio(stat(f), theirs) > target);
            let target_text = if out_of_reach {
                format!("≤ {target:.1}× {peer} (out of reach of {floor} in this run, below)")
            } else {
                format!("≤ {target:.1}× {peer}")
            };
            let ours_ratio = ratio(ours, theirs);
            table
                .latency(format!("peers' protocol acquire {name}: ours"), ours)
                .ratio(ours_ratio, Some((&target_text, ours_ratio <= target)));
            table.latency(format!("peers' protocol acquire {name}: {peer}"), theirs);
        }
        let Some(floor_samples) = &self.floor else {
            return;
        };
        for (name, stat) in STATS {
            let (own, theirs) = (stat(floor_samples), stat(&self.peer));
            table
                .latency(format!("peers' protocol acquire {name}: {floor}"), own)
                .ratio(ratio(own, theirs), None);
        }
        table.push(
            format!("  {floor} p50 / {peer} p50: the least it costs in this protocol"),
            format!("{:.2}", ratio(floor_samples.p50(), self.peer.p50())),
        );
        table.push(
            format!("  ours / {floor}, p50"),
            format!("{:.2}", ratio(self.ours.p50(), floor_samples.p50())),
        );
    }
}

/// `a` over `b` (infinite over nothing), as the comparison rows print their ratios.
fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        f64::INFINITY
    } else {
        micros(a) / micros(b)
    }
}

/// The statistics the rows of [`versus_rows`] and [`against_rows`] print.
type Stat = fn(&Samples) -> Duration;

/// The p50, mean and p99, each with its name, as the comparison rows print them.
const STATS: [(&str, Stat); 3] = [
    ("p50", Samples::p50),
    ("mean", Samples::mean),
    ("p99", Samples::p99),
];

/// Adds, for each of p50, mean and p99, a row of ours (`"{what} {stat}: ours"`) with its ratio
/// to the peer's and, where `target` is given, the target `≤ {target}× {peer}`, then the
/// peer's (`"{what} {stat}: {peer}"`). For figures of ours and a peer measured in the same
/// interleaved run outside the [`PeersProtocol`] (an election's handover, say), so both sides
/// print as the protocol's rows do.
pub fn versus_rows(
    table: &mut Table,
    what: &str,
    ours: &Samples,
    peer: &str,
    theirs: &Samples,
    target: Option<f64>,
) {
    versus_rows_reach(table, what, ours, peer, theirs, target, None);
}

/// [`versus_rows`], where a target the `floor` (its name and samples, of the same run) itself
/// misses says `(out of reach of {floor} in this run, below)`.
fn versus_rows_reach(
    table: &mut Table,
    what: &str,
    ours: &Samples,
    peer: &str,
    theirs: &Samples,
    target: Option<f64>,
    floor: Option<(&str, &Samples)>,
) {
    for (name, stat) in STATS {
        let (own, other) = (stat(ours), stat(theirs));
        let ours_ratio = ratio(own, other);
        let text = target.map(|t| {
            let text = match floor {
                Some((floor, samples)) if ratio(stat(samples), other) > t => {
                    format!("≤ {t:.1}× {peer} (out of reach of {floor} in this run, below)")
                }
                _ => format!("≤ {t:.1}× {peer}"),
            };
            (text, ours_ratio <= t)
        });
        table
            .latency(format!("{what} {name}: ours"), own)
            .ratio(ours_ratio, text.as_ref().map(|(t, met)| (t.as_str(), *met)));
        table.latency(format!("{what} {name}: {peer}"), other);
    }
}

/// Adds the p50, mean and largest of `samples` as rows `"{what} {stat}: {side}"`, each with
/// its ratio to `base`: for a figure that is read against a setting rather than a peer (a
/// failover against the lease's TTL, which bounds it from below).
pub fn against_rows(table: &mut Table, what: &str, side: &str, samples: &Samples, base: Duration) {
    const STATS: [(&str, Stat); 3] = [
        ("p50", Samples::p50),
        ("mean", Samples::mean),
        ("max", Samples::max),
    ];
    for (name, stat) in STATS {
        let own = stat(samples);
        let row = table.latency(format!("{what} {name}: {side}"), own);
        if !base.is_zero() {
            row.ratio(micros(own) / micros(base), None);
        }
    }
}

/// Locks held at once on one handle, each kept alive by a [`KeepAlive`]: what
/// [`hold_kept_alive`] leaves running.
#[derive(Debug)]
pub struct KeptAlive {
    /// The keep-alives, one per lock.
    pub kept: Vec<KeepAlive>,
    /// How long acquiring them took, one at a time.
    pub acquired_in: Duration,
    /// The latency of extending one more lock while they are kept alive.
    pub extends: Samples,
}

impl KeptAlive {
    /// How many of the locks their keep-alive has lost so far.
    pub fn lost(&self) -> usize {
        self.kept.iter().filter(|k| k.is_lost()).count()
    }

    /// Stops every keep-alive and releases its lock on `store`; the figures stay.
    ///
    /// # Errors
    /// The first error of the store's `release`
    /// ([`Unavailable`](fencelock_core::ErrorKind::Unavailable),
    /// [`Store`](fencelock_core::ErrorKind::Store)); the locks not reached yet stay kept alive.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the locks not reached yet kept alive; a lock whose
    /// keep-alive was stopped but whose release was not confirmed expires at its TTL.
    pub async fn release<S: LockStore + ?Sized>(&mut self, store: &S) -> Result<()> {
        for keep in self.kept.drain(..) {
            let lease = keep.stop().await;
            let _ = store.release(&lease).await?;
        }
        Ok(())
    }
}

/// Acquires `count` locks (`{key_prefix}0`, `{key_prefix}1`, …) with `ttl` one at a time on
/// `store`, each kept alive, then extends one more lock (`{key_prefix}probe`, TTL 30 s) 200
/// times spread over three `ttl`s, so the hold is also the keep-alives' test. The probe is
/// released; the locks are still held and kept alive when this returns.
///
/// # Errors
/// The first error of the store's `try_acquire`
/// ([`Contended`](fencelock_core::ErrorKind::Contended) when a key is held,
/// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a bad key or TTL), `extend` of the
/// probe ([`LeaseLost`](fencelock_core::ErrorKind::LeaseLost)) or `release`;
/// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) and
/// [`Store`](fencelock_core::ErrorKind::Store) from any of them. The locks taken so far are then no
/// longer kept alive and expire at their TTL.
///
/// # Cancel safety
/// Dropping the future stops the keep-alives started so far without releasing: those locks
/// and the probe expire at their TTLs.
///
/// # Panics
/// Outside a tokio runtime.
pub async fn hold_kept_alive<S: LockStore + ?Sized + 'static>(
    store: &Arc<S>,
    key_prefix: &str,
    count: usize,
    ttl: Duration,
) -> Result<KeptAlive> {
    const EXTENDS: u32 = 200;
    let started = Instant::now();
    let mut kept = Vec::with_capacity(count);
    for i in 0..count {
        let lease = store.try_acquire(&format!("{key_prefix}{i}"), ttl).await?;
        kept.push(KeepAlive::start(store.clone(), lease));
    }
    let acquired_in = started.elapsed();
    let probe = store
        .try_acquire(&format!("{key_prefix}probe"), Duration::from_secs(30))
        .await?;
    let mut extends = Vec::with_capacity(EXTENDS as usize);
    for _ in 0..EXTENDS {
        let sent = Instant::now();
        store.extend(&probe).await?;
        extends.push(sent.elapsed());
        tokio::time::sleep(ttl * 3 / EXTENDS).await;
    }
    let _ = store.release(&probe).await?;
    Ok(KeptAlive {
        kept,
        acquired_in,
        extends: Samples::new(extends),
    })
}

/// `d` in microseconds, for ratios between figures.
pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The URL of the server a benchmark runs against: `LOCK_BENCH_URL` when it is set and not
/// blank (then no server is started), else the URL of the server `start` starts, which is
/// returned too and stops when dropped.
pub fn server_or_env<S, E>(
    start: impl FnOnce() -> std::result::Result<S, E>,
    url: impl FnOnce(&S) -> String,
) -> std::result::Result<(Option<S>, String), E> {
    match std::env::var("LOCK_BENCH_URL") {
        Ok(env_url) if !env_url.trim().is_empty() => Ok((None, env_url)),
        _ => {
            let server = start()?;
            let url = url(&server);
            Ok((Some(server), url))
        }
    }
}

/// One line of a benchmark table.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// The figure, formatted.
    pub figure: String,
    /// The ratio to the raw floor, if any.
    pub ratio: Option<f64>,
    /// The target, in words, and whether it was met.
    pub target: Option<(String, bool)>,
}

/// A benchmark table, printed as aligned text.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Its rows.
    pub rows: Vec<Row>,
}

impl Table {
    /// Adds a latency row.
    pub fn latency(&mut self, what: impl Into<String>, value: Duration) -> &mut Row {
        self.push(what, format!("{:.1} µs", value.as_secs_f64() * 1e6))
    }

    /// Adds a rate row.
    pub fn rate(&mut self, what: impl Into<String>, per_second: f64) -> &mut Row {
        self.push(what, format!("{per_second:.0} /s"))
    }

    /// Adds a row with a preformatted figure.
    pub fn push(&mut self, what: impl Into<String>, figure: String) -> &mut Row {
        self.rows.push(Row {
            what: what.into(),
            figure,
            ratio: None,
            target: None,
        });
        self.rows.last_mut().expect("just pushed")
    }
}

impl Row {
    /// Sets the ratio and, optionally, a target it must meet.
    pub fn ratio(&mut self, ratio: f64, target: Option<(&str, bool)>) -> &mut Self {
        self.ratio = Some(ratio);
        self.target = target.map(|(t, met)| (t.to_owned(), met));
        self
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .rows
            .iter()
            .map(|r| r.what.chars().count())
            .max()
            .unwrap_or(0);
        for row in &self.rows {
            let ratio = row.ratio.map(|r| format!("{r:.2}×")).unwrap_or_default();
            let target = match &row.target {
                Some((target, true)) => format!("target {target}: met"),
                Some((target, false)) => format!("target {target}: MISSED"),
                None => String::new(),
            };
            writeln!(
                f,
                "{:<width$}  {:>14}  {:>8}  {target}",
                row.what, row.figure, ratio
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every program in `benches/` is declared a bench with `harness = false`: otherwise cargo
    /// wraps it in libtest, which runs no test and never calls its `main`.
    #[test]
    fn every_bench_is_its_own_program() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(root.join("benches"))
            .expect("benches/")
            .flatten()
        {
            let path = entry.path();
            let name = match path.extension() {
                Some(ext) if ext == "rs" => path.file_stem(),
                None if path.join("main.rs").exists() => path.file_name(),
                _ => continue,
            };
            let name = name.and_then(|n| n.to_str()).expect("a UTF-8 name");
            if !manifest.contains(&format!("[[bench]]\nname = \"{name}\"\nharness = false\n")) {
                missing.push(name.to_owned());
            }
        }
        assert!(
            missing.is_empty(),
            "benches without a [[bench]] harness = false entry: {missing:?}"
        );
    }
    use fencelock_core::MemoryStore;

    /// A store handle that records which contender each grant went to.
    struct Recording {
        id: usize,
        store: DynLockStore,
        grants: Arc<Mutex<Vec<usize>>>,
    }

    #[async_trait]
    impl Contender for Recording {
        type Held = Lease;

        async fn take(&mut self) -> Result<Lease> {
            let lease = self
                .store
                .acquire("k", Duration::from_secs(30), Duration::from_secs(30))
                .await?;
            self.grants.lock().unwrap().push(self.id);
            Ok(lease)
        }

        async fn give_back(&mut self, lease: Lease) -> Result<()> {
            self.store.release(&lease).await.map(drop)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handoff_to_another_never_counts_a_releaser_retaking_the_key() {
        let store: DynLockStore = Arc::new(MemoryStore::new());
        let grants: Arc<Mutex<Vec<usize>>> = Arc::default();
        let contenders = (0..3)
            .map(|id| Recording {
                id,
                store: store.clone(),
                grants: grants.clone(),
            })
            .collect();
        let hold = Duration::from_millis(1);
        let samples = handoff_between(contenders, 20, Handoff::ToAnother { hold })
            .await
            .unwrap();
        assert_eq!(samples.len(), 20);
        let grants = grants.lock().unwrap().clone();
        // The first grant gives no sample; grants after the 20th sample may follow while the
        // run stops.
        assert!(grants.len() > 20, "{grants:?}");
        assert!(
            grants.windows(2).all(|pair| pair[0] != pair[1]),
            "a releaser took the key back: {grants:?}"
        );
    }

    #[tokio::test]
    async fn mode_cycles_time_only_the_modes_a_store_keeps() {
        let memory: DynLockStore = Arc::new(MemoryStore::new());
        let mut modes = ModeCycles::new(&memory.capabilities());
        modes
            .warm_up(&memory, "m", Duration::from_secs(5), 3)
            .await
            .unwrap();
        modes
            .round(&memory, "m", Duration::from_secs(5), 5)
            .await
            .unwrap();
        modes
            .round(&memory, "m", Duration::from_secs(5), 5)
            .await
            .unwrap();
        let samples = modes.samples();
        let labels: Vec<&str> = samples.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["semaphore permit (of 4)", "shared (reader)"]);
        assert!(samples.iter().all(|(_, s)| s.len() == 10));
        let mut table = Table::default();
        modes.rows(&mut table, "ours: ", Some(Duration::from_micros(1)), None);
        let rows: Vec<(&str, bool)> = table
            .rows
            .iter()
            .map(|r| (r.what.as_str(), r.ratio.is_some()))
            .collect();
        assert_eq!(
            rows,
            [
                (
                    "ours: semaphore permit (of 4): try_acquire_as + release p50",
                    true
                ),
                (
                    "ours: semaphore permit (of 4): try_acquire_as + release p99",
                    false
                ),
                ("ours: shared (reader): try_acquire_as + release p50", true),
                ("ours: shared (reader): try_acquire_as + release p99", false),
            ]
        );
        // Every cycle released its lease.
        for key in ["m:shared", "m:permits-4"] {
            assert_eq!(
                memory.status(key).await.unwrap(),
                fencelock_core::KeyStatus::Free
            );
        }

        // A store that keeps exclusive leases only: no mode, no row.
        let exclusive = Capabilities::new();
        let none = ModeCycles::new(&exclusive);
        assert!(none.is_empty());
        let mut table = Table::default();
        none.rows(&mut table, "ours: ", None, None);
        assert!(table.rows.is_empty());
        let partial = ModeCycles::new(&Capabilities::new().with_shared(true));
        let labels: Vec<String> = partial.samples().into_iter().map(|(l, _)| l).collect();
        assert_eq!(labels, ["shared (reader)"]);
    }

    #[tokio::test(start_paused = true)]
    async fn peers_protocol_times_a_handoff_only_for_a_contender_that_was_waiting() {
        let (ttl, wait) = (Duration::from_secs(10), Duration::from_secs(10));
        let store: DynLockStore = Arc::new(MemoryStore::new());
        // Three contenders a third of a hold apart, no pause: after the first take, every
        // grant goes to one that asked while the key was held; the first found it free.
        let protocol = PeersProtocol {
            hold: Duration::from_millis(6),
            pause: Duration::ZERO,
            rounds: 1,
            takes: 4,
        };
        let only_ours = |n| store_contenders(vec![store.clone(); n], "k", ttl, wait);
        let versus = protocol.run(only_ours(3), only_ours(1)).await.unwrap();
        assert_eq!(versus.ours.len(), 12);
        assert_eq!(versus.handoffs.ours.len(), 11);
        // A lone contender never waits: no handoff.
        assert_eq!(versus.handoffs.peer.len(), 0);
        let mut table = Table::default();
        versus.handoff_rows(&mut table, "the peer", Some(1.0));
        assert_eq!(table.rows[1].what, "peers' protocol handoff p50: ours");
    }

    #[tokio::test]
    async fn peers_protocol_with_a_floor_times_it_in_the_same_rounds_and_prints_its_rows() {
        let (ttl, wait) = (Duration::from_secs(10), Duration::from_secs(10));
        let store = |_| -> DynLockStore { Arc::new(MemoryStore::new()) };
        let (ours, peer, floor) = (store(0), store(1), store(2));
        let protocol = PeersProtocol {
            hold: Duration::from_millis(1),
            pause: Duration::from_millis(2),
            rounds: 2,
            takes: 3,
        };
        let versus = protocol
            .run_with_floor(
                store_contenders(vec![ours; 2], "k", ttl, wait),
                store_contenders(vec![peer; 2], "k", ttl, wait),
                store_contenders(vec![floor; 2], "k", ttl, wait),
            )
            .await
            .unwrap();
        assert_eq!(versus.floor.as_ref().map(Samples::len), Some(12));

        // Ours 90 µs against the peer's p50 of 60 and the floor's 75: the floor misses the p50
        // target itself, not the mean or p99 ones.
        let micros =
            |us: &[u64]| Samples::new(us.iter().map(|&u| Duration::from_micros(u)).collect());
        let versus = VersusPeer {
            protocol,
            contenders: (8, 8),
            ours: micros(&[90, 90, 90]),
            peer: micros(&[60, 60, 600]),
            floor: Some(micros(&[75, 75, 75])),
            handoffs: Handoffs {
                ours: micros(&[40]),
                peer: micros(&[50]),
                floor: None,
                ours_queued: micros(&[40]),
                peer_queued: micros(&[50]),
            },
        };
        let mut table = Table::default();
        versus.rows_with_floor(&mut table, "the peer", 1.0, "the floor");
        let rows: Vec<(&str, Option<&str>)> = table
            .rows
            .iter()
            .map(|r| (r.what.as_str(), r.target.as_ref().map(|(t, _)| t.as_str())))
            .collect();
        let reach = Some("≤ 1.0× the peer (out of reach of the floor in this run, below)");
        assert_eq!(
            rows[1..],
            [
                ("peers' protocol acquire p50: ours", reach),
                ("peers' protocol acquire p50: the peer", None),
                (
                    "peers' protocol acquire mean: ours",
                    Some("≤ 1.0× the peer")
                ),
                ("peers' protocol acquire mean: the peer", None),
                ("peers' protocol acquire p99: ours", Some("≤ 1.0× the peer")),
                ("peers' protocol acquire p99: the peer", None),
                ("peers' protocol acquire p50: the floor", None),
                ("peers' protocol acquire mean: the floor", None),
                ("peers' protocol acquire p99: the floor", None),
                (
                    "  the floor p50 / the peer p50: the least it costs in this protocol",
                    None
                ),
                ("  ours / the floor, p50", None),
            ]
        );
        assert_eq!(table.rows[10].figure, "1.25");
        assert_eq!(table.rows[11].figure, "1.20");

        // Without a floor, the rows of the two sides only, none out of reach.
        let two = VersusPeer {
            floor: None,
            ..versus
        };
        let mut table = Table::default();
        two.rows(&mut table, "the peer", 1.0);
        assert_eq!(table.rows.len(), 7);
        assert_eq!(
            table.rows[1].target.as_ref().map(|(t, _)| t.as_str()),
            Some("≤ 1.0× the peer")
        );
    }

    #[test]
    fn handoff_rows_with_a_floor_say_when_the_floor_misses_the_target() {
        let micros =
            |us: &[u64]| Samples::new(us.iter().map(|&u| Duration::from_micros(u)).collect());
        // Ours 150 µs against the peer's p50 of 100 and the floor's 125: the floor misses the
        // p50 target itself, not the mean or p99 ones (the peer's tail is long).
        let versus = VersusPeer {
            protocol: PeersProtocol::HARNESS,
            contenders: (8, 8),
            ours: micros(&[1]),
            peer: micros(&[1]),
            floor: Some(micros(&[1])),
            handoffs: Handoffs {
                ours: micros(&[150, 150, 150]),
                peer: micros(&[100, 100, 5000]),
                floor: Some(micros(&[125, 125, 125])),
                ours_queued: micros(&[140]),
                peer_queued: micros(&[100]),
            },
        };
        let mut table = Table::default();
        versus.handoff_rows_with_floor(&mut table, "the peer", Some(1.0), "the floor");
        let rows: Vec<(&str, Option<&str>, &str)> = table
            .rows
            .iter()
            .map(|r| {
                let target = r.target.as_ref().map(|(t, _)| t.as_str());
                (r.what.as_str(), target, r.figure.as_str())
            })
            .collect();
        let reach = Some("≤ 1.0× the peer (out of reach of the floor in this run, below)");
        let plain = Some("≤ 1.0× the peer");
        let what: Vec<_> = rows.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            what[1..],
            [
                ("peers' protocol handoff p50: ours", reach),
                ("peers' protocol handoff p50: the peer", None),
                ("peers' protocol handoff mean: ours", plain),
                ("peers' protocol handoff mean: the peer", None),
                ("peers' protocol handoff p99: ours", plain),
                ("peers' protocol handoff p99: the peer", None),
                (
                    "peers' protocol handoff to a contender asking since the holder's grant",
                    None
                ),
                (
                    "peers' protocol handoff to a contender asking since the holder's grant, \
                     p50: ours",
                    None
                ),
                (
                    "peers' protocol handoff to a contender asking since the holder's grant, \
                     p50: the peer",
                    None
                ),
                ("peers' protocol handoff p50: the floor", None),
                ("peers' protocol handoff mean: the floor", None),
                ("peers' protocol handoff p99: the floor", None),
                ("  peers' protocol handoff p50 ours / the floor", None),
            ]
        );
        assert_eq!(rows[13].2, "1.20");

        // Without a floor, no floor rows and no target out of reach.
        let mut table = Table::default();
        versus.handoff_rows(&mut table, "the peer", Some(1.0));
        assert_eq!(table.rows.len(), 10);
        assert_eq!(
            table.rows[1].target.as_ref().map(|(t, _)| t.as_str()),
            plain
        );

        // A side with no handoff to a contender asking already: no p50 of nothing, no ratio.
        let mut none_queued = versus.clone();
        none_queued.handoffs.peer_queued = micros(&[]);
        let mut table = Table::default();
        none_queued.handoff_rows(&mut table, "the peer", Some(1.0));
        let queued: Vec<_> = table
            .rows
            .iter()
            .filter(|r| r.what.contains("asking since"))
            .map(|r| (r.what.as_str(), r.ratio))
            .collect();
        assert_eq!(
            queued,
            [
                (
                    "peers' protocol handoff to a contender asking since the holder's grant",
                    None
                ),
                (
                    "peers' protocol handoff to a contender asking since the holder's grant, \
                     p50: ours",
                    None
                ),
            ]
        );
    }

    #[test]
    fn versus_and_against_rows_name_both_sides_and_their_ratios() {
        let micros =
            |us: &[u64]| Samples::new(us.iter().map(|&u| Duration::from_micros(u)).collect());
        let (ours, peer) = (micros(&[50, 50, 260]), micros(&[100, 100, 100]));
        let mut table = Table::default();
        versus_rows(&mut table, "handover", &ours, "the peer", &peer, Some(1.0));
        let rows: Vec<(&str, Option<bool>)> = table
            .rows
            .iter()
            .map(|r| (r.what.as_str(), r.target.as_ref().map(|(_, met)| *met)))
            .collect();
        assert_eq!(
            rows,
            [
                ("handover p50: ours", Some(true)),
                ("handover p50: the peer", None),
                ("handover mean: ours", Some(false)),
                ("handover mean: the peer", None),
                ("handover p99: ours", Some(false)),
                ("handover p99: the peer", None),
            ]
        );
        assert_eq!(table.rows[0].ratio, Some(0.5));
        let mut table = Table::default();
        against_rows(
            &mut table,
            "failover",
            "ours",
            &ours,
            Duration::from_micros(100),
        );
        let ratios: Vec<Option<f64>> = table.rows.iter().map(|r| r.ratio).collect();
        assert_eq!(ratios, [Some(0.5), Some(1.2), Some(2.6)]);
        assert_eq!(table.rows[2].what, "failover max: ours");
    }

    #[test]
    fn quantiles_pick_sorted_samples() {
        let samples = Samples::new((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(samples.p50(), Duration::from_millis(51));
        assert_eq!(samples.p99(), Duration::from_millis(99));
        assert_eq!(Samples::default().p50(), Duration::ZERO);
        assert_eq!(samples.mean(), Duration::from_micros(50_500));
        assert_eq!(Samples::default().mean(), Duration::ZERO);
    }
}
