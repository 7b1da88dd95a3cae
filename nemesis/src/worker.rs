//! A worker: takes the lock in its mode, keeps it alive, does its mode's work on the resource
//! with a random hold inside it, releases; and reports every step.
//!
//! - Exclusive: increments the three rows (claim-read-hold-write on the fenced one).
//! - Shared (a reader): reads the fenced row, holds, reads it again, each read refused if a
//!   writer with a greater token claimed it meanwhile.
//! - Permit: increments its slot's fenced row (claim-read-hold-write), one fence per slot.
//!
//! Some exclusive workers take the key as leaders of the election on it (`Election::campaign`,
//! its value the worker's name, `resign` to give it back): a leadership is the key's exclusive
//! lease, so every rule holds its leaders as it holds its lock holders (one valid leader at a
//! time, terms growing, no write under an older term accepted after a newer one wrote, no
//! candidate kept out longer than the bound).
//!
//! The hold sits between the reads and the writes, so a pause or a cut that hits a holder
//! lands inside its read-modify-write: exactly where a check at the write alone, or no check,
//! loses an update. The worker never looks at its lost signal before writing: the fence alone
//! must refuse what a stale holder sends.

use std::sync::Arc;
use std::time::Duration;

use fencelock::{DynLockStore, KeepAlive, Leadership, Lease, LockStoreExt, ReleaseOutcome};
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::{now_ns, to_ns};
use crate::history::{Entry, Event, Row, WorkMode};
use crate::resource::Resource;

/// The lock every worker contends for.
pub const KEY: &str = "nemesis-counter";

/// The history's worker number of the controller's observer of the election on [`KEY`].
pub const OBSERVER: u32 = 100_000;

/// Observes the election on [`KEY`] until `stop` is cancelled, recording each state it yields
/// (rule 5); an error is recorded and the observer starts over after a moment.
///
/// # Cancel safety
/// Dropping the future ends the observer; nothing is held.
pub async fn observe(store: DynLockStore, emit: Emit, stop: fencelock::CancellationToken) {
    let say = |event: Event| {
        emit(Entry {
            t: now_ns(),
            worker: OBSERVER,
            event,
        })
    };
    say(Event::Start { pid: 0 });
    loop {
        let mut observer = store.election(KEY).observe();
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                next = observer.next() => next,
            };
            match next {
                Ok(leader) => say(Event::Observed {
                    term: leader.map(|leader| leader.term),
                }),
                Err(error) => {
                    say(Event::Error {
                        what: format!("observe: {error}"),
                    });
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The number of permits of the key, for permit workers (fewer than a full run's permit
/// workers, so the limit is contended).
pub const PERMITS: u32 = 2;

/// The modes of a run's workers on a store that keeps shared leases and permits, in the order
/// workers are started: with 8 workers, 2 exclusive, 2 readers and 4 permits of 2.
pub const MODE_MIX: [WorkMode; 4] = [
    WorkMode::Exclusive,
    WorkMode::Shared,
    WorkMode::Permit { limit: PERMITS },
    WorkMode::Permit { limit: PERMITS },
];

/// What a worker does.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Its number in the history (1, 2, …).
    pub id: u32,
    /// The lease TTL it asks for.
    pub ttl: Duration,
    /// The longest hold between the reads and the writes.
    pub hold_max: Duration,
    /// The resource's PostgreSQL URL.
    pub resource_url: String,
    /// The resource's schema for this store run.
    pub schema: String,
    /// How it holds the key.
    pub mode: WorkMode,
}

/// Where a worker's steps go: a line on stdout, or the controller's recorder.
pub type Emit = Arc<dyn Fn(Entry) + Send + Sync>;

/// A switch that holds a worker at its next step while off (the in-process stand-in for
/// `SIGSTOP`, used with a cut [`Link`](crate::store::Link) so its keep-alive stalls too).
pub type Gate = watch::Receiver<bool>;

/// Runs the worker loop until `stop` is cancelled (checked before each acquisition).
///
/// # Cancel safety
/// Dropping the future (a killed worker) drops its lease without releasing it, and its
/// keep-alive with it: the lease expires at its TTL, as a killed process's would.
pub async fn run(
    store: DynLockStore,
    config: WorkerConfig,
    emit: Emit,
    stop: fencelock::CancellationToken,
    mut gate: Option<Gate>,
) {
    let id = config.id;
    let say = move |event: Event| {
        emit(Entry {
            t: now_ns(),
            worker: id,
            event,
        })
    };
    say(Event::Start {
        pid: if gate.is_some() {
            0
        } else {
            std::process::id()
        },
    });
    let mut resource: Option<Resource> = None;
    let wait = config.ttl * 3 + Duration::from_secs(2);
    let mut lease_no = 0u64;
    while !stop.is_cancelled() {
        lease_no += 1;
        pass(&mut gate).await;
        say(Event::Acquire {
            lease: lease_no,
            mode: config.mode,
        });
        let granted = tokio::select! {
            () = stop.cancelled() => return,
            granted = take(&store, &config, wait) => granted,
        };
        let (lease, kept) = match granted {
            Ok(granted) => granted,
            Err(error) => {
                say(Event::AcquireFailed {
                    lease: lease_no,
                    error: error.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        say(Event::Grant {
            lease: lease_no,
            token: lease.fencing_token(),
            ttl_ms: u64::try_from(lease.ttl().as_millis()).unwrap_or(u64::MAX),
            deadline: to_ns(lease.valid_until()),
            mode: config.mode,
            slot: lease.slot(),
            leader: leads(&config),
        });
        let watcher = watch_lost(&kept, lease.fencing_token(), lease_no, say.clone_box());
        if resource.is_none() {
            match Resource::connect(&config.resource_url, &config.schema).await {
                Ok(r) => resource = Some(r),
                Err(e) => say(Event::Error {
                    what: e.to_string(),
                }),
            }
        }
        if let Some(r) = resource.as_mut() {
            let step = Step {
                lease: &lease,
                lease_no,
                kept: &kept,
                worker: id,
            };
            if let Err(e) = work(r, &step, &config, &say, &mut gate).await {
                say(Event::Error {
                    what: e.to_string(),
                });
                resource = None;
            }
        }
        if leads(&config) {
            // A leader leads on past its work, so that the observer has a term to see: rule 5
            // asks it to see a leadership of twice its bound, which is at most 100 ms plus a
            // quarter of the TTL, so three quarters of a TTL are past it for any TTL over 400 ms.
            tokio::time::sleep(config.ttl * 3 / 4).await;
            pass(&mut gate).await;
        }
        drop(watcher);
        // A lock's keep-alive stops here, before a pause at the gate; a leadership keeps
        // itself alive until it resigns (a paused in-process worker's link is cut, so its
        // extends stall as a stopped process's would).
        let kept = match Arc::try_unwrap(kept) {
            Ok(kept) => Ok(kept.stopped().await),
            Err(shared) => Err(shared),
        };
        pass(&mut gate).await;
        let sent = now_ns();
        let given_back = match kept {
            Ok(kept) => kept.give_back(&store).await,
            // The watcher was the only other owner, and it is gone.
            Err(_) => store.release(&lease).await,
        };
        let outcome = match given_back {
            Ok(ReleaseOutcome::Released) => "released".to_string(),
            Ok(ReleaseOutcome::Lost) => "lost".to_string(),
            Err(e) => e.to_string(),
        };
        say(Event::Release {
            lease: lease_no,
            token: lease.fencing_token(),
            outcome,
            sent,
        });
        // A short breath, so the lock changes hands rather than going back to the same worker.
        let breath = rand::rng().random_range(0..=config.hold_max.as_millis() as u64 / 4 + 1);
        tokio::time::sleep(Duration::from_millis(breath)).await;
    }
}

/// Whether worker `config` takes the key as a leader of the election on it, so that both kinds
/// of writer run side by side: with the mixed modes (writers are workers 1, 5, 9, …), every
/// other writer; with exclusive workers only, the odd ones but every fifth (1, 3, 7 of 8 lead).
fn leads(config: &WorkerConfig) -> bool {
    let id = config.id.max(1);
    config.mode == WorkMode::Exclusive
        && if id % 4 == 1 {
            ((id - 1) / 4).is_multiple_of(2)
        } else {
            id % 2 == 1
        }
}

/// A granted lease, kept alive: by a keep-alive of its own, or by its leadership.
enum Kept {
    Lock(KeepAlive),
    Leading(Leadership),
}

impl Kept {
    fn is_lost(&self) -> bool {
        match self {
            Kept::Lock(kept) => kept.is_lost(),
            Kept::Leading(leading) => leading.is_lost(),
        }
    }

    fn lost_token(&self) -> fencelock::CancellationToken {
        match self {
            Kept::Lock(kept) => kept.lost_token(),
            Kept::Leading(leading) => leading.lost_token(),
        }
    }

    fn lost_reason(&self) -> Option<String> {
        match self {
            Kept::Lock(kept) => kept.lost_reason(),
            Kept::Leading(leading) => leading
                .is_lost()
                .then(|| "the leadership was lost".to_owned()),
        }
    }

    /// Stops a lock's keep-alive; a leadership stays as it is.
    async fn stopped(self) -> Given {
        match self {
            Kept::Lock(kept) => Given::Lock(kept.stop().await),
            Kept::Leading(leading) => Given::Leading(leading),
        }
    }
}

/// What is left to give back once the work is done.
enum Given {
    Lock(Lease),
    Leading(Leadership),
}

impl Given {
    /// Releases the lock, or resigns the leadership.
    async fn give_back(self, store: &DynLockStore) -> fencelock::Result<ReleaseOutcome> {
        match self {
            Given::Lock(lease) => store.release(&lease).await,
            Given::Leading(leading) => leading.resign().await,
        }
    }
}

/// Takes the key in the worker's mode, or leads the election on it.
async fn take(
    store: &DynLockStore,
    config: &WorkerConfig,
    wait: Duration,
) -> fencelock::Result<(Lease, Arc<Kept>)> {
    if leads(config) {
        let value = format!("worker {}", config.id);
        let leading = store
            .election(KEY)
            .ttl(config.ttl)
            .campaign_for(&value, wait)
            .await?;
        let lease = leading.lease().clone();
        return Ok((lease, Arc::new(Kept::Leading(leading))));
    }
    let lease = store
        .acquire_as(KEY, config.ttl, wait, config.mode.to_mode())
        .await?;
    let kept = KeepAlive::start(store.clone(), lease.clone());
    Ok((lease, Arc::new(Kept::Lock(kept))))
}

/// The current lease, for the steps' events.
struct Step<'a> {
    lease: &'a Lease,
    lease_no: u64,
    kept: &'a Kept,
    worker: u32,
}

impl Step<'_> {
    fn read(&self, row: Row, value: Option<i64>) -> Event {
        Event::Read {
            lease: self.lease_no,
            token: self.lease.fencing_token(),
            row,
            value,
            deadline: to_ns(self.lease.valid_until()),
            lost: self.kept.is_lost(),
        }
    }

    fn write(&self, row: Row, log_id: Option<i64>) -> Event {
        Event::Write {
            lease: self.lease_no,
            token: self.lease.fencing_token(),
            row,
            log_id,
            deadline: to_ns(self.lease.valid_until()),
            lost: self.kept.is_lost(),
        }
    }
}

/// A random hold inside the critical section, up to the configured longest.
async fn hold(config: &WorkerConfig) {
    let hold = rand::rng().random_range(0..=config.hold_max.as_millis() as u64);
    tokio::time::sleep(Duration::from_millis(hold)).await;
}

/// The critical section of the worker's mode.
async fn work(
    r: &mut Resource,
    step: &Step<'_>,
    config: &WorkerConfig,
    say: &(impl Fn(Event) + ?Sized),
    gate: &mut Option<Gate>,
) -> fencelock::Result<()> {
    let token = step.lease.fencing_token();
    match config.mode {
        WorkMode::Exclusive => {}
        WorkMode::Shared => {
            // Two reads, so the section spans the hold and a writer let in during it is seen.
            for i in 0..2 {
                if i > 0 {
                    hold(config).await;
                }
                pass(gate).await;
                let read = r.read_checked(Row::Fenced, token).await?;
                say(step.read(Row::Fenced, read));
                if read.is_none() {
                    break;
                }
            }
            return Ok(());
        }
        WorkMode::Permit { .. } => {
            // A permit without a slot is a store bug; the checker sees it in the grant.
            let row = Row::Slot(step.lease.slot().unwrap_or(0));
            pass(gate).await;
            let claimed = r.claim(row, token).await?;
            say(step.read(row, claimed));
            let Some(read) = claimed else {
                return Ok(());
            };
            hold(config).await;
            pass(gate).await;
            let log_id = r
                .write(row, token, read + 1, step.worker, step.lease_no)
                .await?;
            say(step.write(row, log_id));
            return Ok(());
        }
    }
    pass(gate).await;
    let claimed = r.claim(Row::Fenced, token).await?;
    say(step.read(Row::Fenced, claimed));
    pass(gate).await;
    let write_only = r.read(Row::WriteOnly).await?;
    say(step.read(Row::WriteOnly, Some(write_only)));
    let shadow = r.read(Row::Shadow).await?;
    say(step.read(Row::Shadow, Some(shadow)));

    hold(config).await;

    for (row, read) in [
        (Row::Fenced, claimed),
        (Row::WriteOnly, Some(write_only)),
        (Row::Shadow, Some(shadow)),
    ] {
        let Some(read) = read else {
            continue; // the claim was refused: nothing to write
        };
        pass(gate).await;
        let log_id = r
            .write(row, token, read + 1, step.worker, step.lease_no)
            .await?;
        say(step.write(row, log_id));
    }
    Ok(())
}

/// Waits while the gate is off.
async fn pass(gate: &mut Option<Gate>) {
    if let Some(gate) = gate {
        // The controller keeps the sender as long as the worker runs.
        let _ = gate.wait_for(|&on| on).await;
    }
}

/// Reports the lost signal when it fires. Holds the keep-alive only weakly, so a killed
/// worker's keep-alive dies with it; the watcher itself is aborted when its guard drops.
fn watch_lost(
    kept: &Arc<Kept>,
    token: u64,
    lease_no: u64,
    say: Box<dyn Fn(Event) + Send>,
) -> AbortOnDrop {
    let (lost, weak) = (kept.lost_token(), Arc::downgrade(kept));
    AbortOnDrop(tokio::spawn(async move {
        lost.cancelled().await;
        let reason = weak.upgrade().and_then(|k| k.lost_reason());
        say(Event::Lost {
            lease: lease_no,
            token,
            reason: reason.unwrap_or_default(),
        });
    }))
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A closure that can be cloned into a boxed one for another task.
trait CloneBox {
    fn clone_box(&self) -> Box<dyn Fn(Event) + Send>;
}

impl<F: Fn(Event) + Clone + Send + 'static> CloneBox for F {
    fn clone_box(&self) -> Box<dyn Fn(Event) + Send> {
        Box::new(self.clone())
    }
}

/// The hidden `worker` mode of the binary: connects to `store_url` (retrying while the store
/// is down), runs the loop, writes each step as a JSON line on stdout, and stops when stdin
/// closes (the controller's way to end the run).
pub fn run_process(store_url: &str, config: WorkerConfig) -> std::process::ExitCode {
    use std::io::{Read, Write};

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("worker {}: no runtime: {e}", config.id);
            return std::process::ExitCode::FAILURE;
        }
    };
    let stop = fencelock::CancellationToken::new();
    std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut sink = [0u8; 64];
            while std::io::stdin().read(&mut sink).is_ok_and(|n| n > 0) {}
            stop.cancel();
        }
    });
    let emit: Emit = Arc::new(|entry: Entry| {
        let mut out = std::io::stdout().lock();
        if let Ok(line) = serde_json::to_string(&entry) {
            // A closed stdout means the controller is gone; the parent-death signal follows.
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    });
    runtime.block_on(async move {
        let store = loop {
            match fencelock::connect(store_url).await {
                Ok(store) => break store,
                Err(e) if stop.is_cancelled() => {
                    eprintln!("worker {}: {e}", config.id);
                    return;
                }
                Err(e) => {
                    emit(Entry {
                        t: now_ns(),
                        worker: config.id,
                        event: Event::Error {
                            what: format!("connect: {e}"),
                        },
                    });
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        run(store, config, emit, stop, None).await;
    });
    std::process::ExitCode::SUCCESS
}
