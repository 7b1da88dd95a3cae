//! The SQLite store against the floors it is built on, measured in one run on one file system.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench sqlite
//! ```
//!
//! Works in a new directory under the system's temporary directory (or `LOCK_BENCH_DIR`), which
//! should be on the disk the store will use: every figure here includes `fsync`s. Prints one
//! table:
//! - the cycle (acquire + release) against the raw floor, the same sqlx connection settings
//!   (WAL, `synchronous = NORMAL`) running `BEGIN IMMEDIATE` + an insert + `COMMIT` + a delete:
//!   the two commits every cycle pays; and with `durable_grants=true` against the same floor at
//!   `synchronous = FULL` (two durable commits);
//! - the cycle against `flock(2)` with the same durability: lock, write the counter and
//!   `fdatasync`, unlock;
//! - the handoff between tasks of one process (2, and 8 as the Redis bench has, one handle
//!   each, on one file), each holder keeping the key for a moment and contending again only
//!   once another holds it: a release wakes the process's own waiters on the key directly;
//! - the handoff between two processes (this program run again as the second), from the
//!   holder starting its release to the other process holding the key, on the clock both
//!   share (`CLOCK_MONOTONIC`), for the store and for `flock(2)`: the kernel waking a blocked
//!   `flock` is the physical floor of a handoff between processes.
//!
//! `-- handoff` prints the handoff rows only.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::{
    cycle, cycle_into, handoff_to_another, micros as us, ModeCycles, Samples, Table,
};
use fencelock_core::{DynLockStore, KeyStatus, LockStore};
use fencelock_sqlite::{SqliteConfig, SqliteStore};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, SqliteConnection};

const ITERATIONS: usize = 500;
const ROUNDS: usize = 10;
const HANDOFFS: usize = 200;
const HOLD: Duration = Duration::from_millis(2);
const TTL: Duration = Duration::from_secs(30);
const KEY: &str = "bench-handoff";
/// The waiters of the larger in-process handoff, as many as the Redis bench's.
const WAITERS: usize = 8;

const ROLE: &str = "LOCK_SQLITE_BENCH_ROLE";

const RAW_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS raw (key BLOB PRIMARY KEY, token INTEGER NOT NULL) WITHOUT ROWID";
const RAW_TAKE: &str = "INSERT INTO raw (key, token) VALUES (?1, 1)
    ON CONFLICT (key) DO UPDATE SET token = token + 1 RETURNING token";
const RAW_GIVE: &str = "DELETE FROM raw WHERE key = ?1";

fn now_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// The raw floor's cycle: two durable commits, as an acquire and a release are.
async fn raw_cycle(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let _: i64 = sqlx::query_scalar(RAW_TAKE)
        .bind(b"raw".as_slice())
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    sqlx::query(RAW_GIVE)
        .bind(b"raw".as_slice())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `flock(2)` on `file`, blocking.
fn flock(file: &File, operation: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The `flock` cycle: lock, a durable counter bump (write + `fdatasync`), unlock.
fn flock_cycle(lock: &File, counter: &File, token: &mut u64) -> std::io::Result<()> {
    flock(lock, libc::LOCK_EX)?;
    *token += 1;
    counter.write_at(&token.to_le_bytes(), 0)?;
    counter.sync_data()?;
    flock(lock, libc::LOCK_UN)
}

fn open_rw(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// The release time and process id a holder wrote just before releasing.
fn read_stamp(stamp: &File) -> std::io::Result<(u64, u64)> {
    let mut bytes = [0u8; 16];
    stamp.read_exact_at(&mut bytes, 0)?;
    let (time, pid) = bytes.split_at(8);
    let read = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Ok((read(time), read(pid)))
}

fn write_stamp(stamp: &File) -> std::io::Result<()> {
    let mut bytes = now_ns().to_le_bytes().to_vec();
    bytes.extend(u64::from(std::process::id()).to_le_bytes());
    stamp.write_all_at(&bytes, 0)
}

/// The handoff time, if the key came from the other process (its stamp).
fn handoff_from_other(granted: u64, (released, pid): (u64, u64)) -> Option<u64> {
    (released > 0 && pid != u64::from(std::process::id())).then(|| granted.saturating_sub(released))
}

/// One side of the store's handoff between two processes: take the key, note how long after
/// the other side's release stamp it was granted, hold briefly, stamp, release, and wait until
/// the other side holds it (so every sample is a handoff to the other process). Returns the
/// samples.
async fn store_side(db: &Path, stamp: &Path, rounds: usize) -> Result<Vec<u64>, Box<dyn Error>> {
    let store = SqliteStore::connect(SqliteConfig::new(db)).await?;
    let stamp = open_rw(stamp)?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let lease = store.acquire(KEY, TTL, Duration::from_secs(60)).await?;
        let granted = now_ns();
        samples.extend(handoff_from_other(granted, read_stamp(&stamp)?));
        tokio::time::sleep(HOLD).await;
        write_stamp(&stamp)?;
        let _ = store.release(&lease).await?;
        // Until the other process holds the key (or has finished).
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            match store.status(KEY).await? {
                KeyStatus::Held { owner, .. } if owner != Some(lease.owner()) => break,
                _ => tokio::time::sleep(Duration::from_micros(200)).await,
            }
        }
    }
    Ok(samples)
}

/// The same for `flock(2)`, the waiter blocked in the kernel.
fn flock_side(lock: &Path, stamp: &Path, rounds: usize) -> Result<Vec<u64>, Box<dyn Error>> {
    let lock = open_rw(lock)?;
    let counter = open_rw(&lock_counter(stamp))?;
    let stamp = open_rw(stamp)?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        flock(&lock, libc::LOCK_EX)?;
        // Granted once the token is durable, as the store's grant is.
        let mut token = [0u8; 8];
        let _ = counter.read_at(&mut token, 0)?;
        let token = u64::from_le_bytes(token) + 1;
        counter.write_at(&token.to_le_bytes(), 0)?;
        counter.sync_data()?;
        let granted = now_ns();
        samples.extend(handoff_from_other(granted, read_stamp(&stamp)?));
        std::thread::sleep(HOLD);
        write_stamp(&stamp)?;
        flock(&lock, libc::LOCK_UN)?;
        // Give the blocked waiter the lock before contending again.
        std::thread::sleep(HOLD);
    }
    Ok(samples)
}

fn lock_counter(stamp: &Path) -> PathBuf {
    stamp.with_extension("counter")
}

/// Runs one side here and the other in a second process; returns both sides' samples.
async fn between_processes(
    kind: &str,
    target: &Path,
    stamp: &Path,
) -> Result<Samples, Box<dyn Error>> {
    std::fs::write(stamp, [0u8; 16])?;
    let other = Command::new(std::env::current_exe()?)
        .env(ROLE, kind)
        .env("LOCK_SQLITE_BENCH_TARGET", target)
        .env("LOCK_SQLITE_BENCH_STAMP", stamp)
        .stdout(Stdio::piped())
        .spawn()?;
    let here = match kind {
        "store" => store_side(target, stamp, HANDOFFS / 2).await?,
        _ => {
            let (target, stamp) = (target.to_owned(), stamp.to_owned());
            tokio::task::spawn_blocking(move || {
                flock_side(&target, &stamp, HANDOFFS / 2).map_err(|e| e.to_string())
            })
            .await??
        }
    };
    let output = other.wait_with_output()?;
    if !output.status.success() {
        return Err(format!("the second {kind} process failed: {}", output.status).into());
    }
    let there = String::from_utf8(output.stdout)?
        .lines()
        .filter_map(|line| line.parse::<u64>().ok())
        .collect::<Vec<_>>();
    let samples = here
        .into_iter()
        .chain(there)
        .map(Duration::from_nanos)
        .collect();
    Ok(Samples::new(samples))
}

/// The second process of a handoff: its side, its samples on stdout.
async fn second_process(kind: &str) -> Result<(), Box<dyn Error>> {
    let target = PathBuf::from(std::env::var("LOCK_SQLITE_BENCH_TARGET")?);
    let stamp = PathBuf::from(std::env::var("LOCK_SQLITE_BENCH_STAMP")?);
    let samples = match kind {
        "store" => store_side(&target, &stamp, HANDOFFS / 2).await?,
        _ => flock_side(&target, &stamp, HANDOFFS / 2)?,
    };
    let mut out = std::io::stdout().lock();
    for sample in samples {
        writeln!(out, "{sample}")?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    if let Ok(kind) = std::env::var(ROLE) {
        return second_process(&kind).await;
    }
    let base = std::env::var_os("LOCK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("lock-sqlite-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let handoffs_only = std::env::args().any(|arg| arg == "handoff");
    let result = run(&dir, handoffs_only).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A raw connection to `file` in WAL mode at `synchronous`.
async fn raw_connection(
    file: &Path,
    synchronous: SqliteSynchronous,
) -> Result<SqliteConnection, sqlx::Error> {
    SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .connect()
        .await
}

/// The handoff between `waiters` tasks of this process, one handle each on `db`.
async fn in_process(db: &Path, waiters: usize) -> Result<Samples, Box<dyn Error>> {
    let mut handles: Vec<DynLockStore> = Vec::new();
    for _ in 0..waiters {
        handles.push(Arc::new(SqliteStore::connect(SqliteConfig::new(db)).await?));
    }
    let key = format!("bench-in-process-{waiters}");
    Ok(handoff_to_another(handles, &key, TTL, HOLD, HANDOFFS).await?)
}

/// The handoff rows: between tasks of this process, and between two processes next to
/// `flock(2)`.
async fn handoff_rows(dir: &Path, table: &mut Table) -> Result<(), Box<dyn Error>> {
    let db = dir.join("locks.db");
    let two = in_process(&db, 2).await?;
    let eight = in_process(&db, WAITERS).await?;
    let store_handoff = between_processes("store", &db, &dir.join("store.stamp")).await?;
    let flock_handoff =
        between_processes("flock", &dir.join("handoff.lock"), &dir.join("flock.stamp")).await?;
    table.latency("handoff between 2 tasks of one process (p50)", two.p50());
    table.latency("handoff between 2 tasks of one process (p99)", two.p99());
    table.latency(
        format!("handoff among {WAITERS} tasks of one process (p50)"),
        eight.p50(),
    );
    table.latency(
        format!("handoff among {WAITERS} tasks of one process (p99)"),
        eight.p99(),
    );
    table.latency(
        "handoff between 2 processes, store (p50)",
        store_handoff.p50(),
    );
    table.latency(
        "handoff between 2 processes, store (p99)",
        store_handoff.p99(),
    );
    table
        .latency(
            "handoff between 2 processes, flock(2) + fdatasync (p50)",
            flock_handoff.p50(),
        )
        .ratio(us(store_handoff.p50()) / us(flock_handoff.p50()), None);
    table.latency(
        "handoff between 2 processes, flock(2) (p99)",
        flock_handoff.p99(),
    );
    Ok(())
}

async fn run(dir: &Path, handoffs_only: bool) -> Result<(), Box<dyn Error>> {
    println!(
        "fencelock-sqlite bench in {} ({ITERATIONS} cycles, {HANDOFFS} handoffs each)\n",
        dir.display()
    );
    if handoffs_only {
        let mut table = Table::default();
        handoff_rows(dir, &mut table).await?;
        println!("{table}");
        return Ok(());
    }
    let mut table = Table::default();
    let mut cycles = Cycles::open(dir).await?;
    cycles.warm_up().await?;
    cycles.rounds().await?.rows(&mut table, &cycles.modes);
    // `cycles` lives to the end: the handoffs are measured with its connections open, ours
    // on the same file.
    handoff_rows(dir, &mut table).await?;
    println!("{table}");
    println!(
        "ratios: the cycle against the raw floor, the cycle and the handoff between processes \
         against flock(2)"
    );
    Ok(())
}

/// What the uncontended cycles run on: the raw floor's connections, ours (and with
/// `durable_grants=true`), the flock(2) files and a file to time one fdatasync on.
struct Cycles {
    raw: SqliteConnection,
    raw_full: SqliteConnection,
    store: DynLockStore,
    durable: DynLockStore,
    modes: ModeCycles,
    lock: Arc<File>,
    counter: Arc<File>,
    fsync_file: Arc<File>,
}

/// The uncontended cycles' samples.
struct CycleSamples {
    fsync: Samples,
    raw_cycle: Samples,
    ours: Samples,
    raw_full: Samples,
    durable: Samples,
    flock_cycles: Samples,
}

impl Cycles {
    /// The raw floor: the same settings as the store's connections (WAL, synchronous =
    /// NORMAL); and at FULL, as the store's connections with durable_grants=true.
    async fn open(dir: &Path) -> Result<Self, Box<dyn Error>> {
        let db = dir.join("locks.db");
        let mut raw = raw_connection(&dir.join("raw.db"), SqliteSynchronous::Normal).await?;
        sqlx::query(RAW_TABLE).execute(&mut raw).await?;
        let mut raw_full =
            raw_connection(&dir.join("raw-full.db"), SqliteSynchronous::Full).await?;
        sqlx::query(RAW_TABLE).execute(&mut raw_full).await?;
        let store: DynLockStore = Arc::new(SqliteStore::connect(SqliteConfig::new(&db)).await?);
        let durable: DynLockStore = Arc::new(
            SqliteStore::connect(
                SqliteConfig::new(dir.join("durable.db")).with_durable_grants(true),
            )
            .await?,
        );
        // Ours also as a semaphore permit and as a shared lease, where the store keeps them.
        let modes = ModeCycles::new(&store.capabilities());
        Ok(Cycles {
            raw,
            raw_full,
            store,
            durable,
            modes,
            lock: Arc::new(open_rw(&dir.join("flock.lock"))?),
            counter: Arc::new(open_rw(&dir.join("flock.counter"))?),
            fsync_file: Arc::new(open_rw(&dir.join("fsync"))?),
        })
    }

    /// Warm-up, before the alternating rounds.
    async fn warm_up(&mut self) -> Result<(), Box<dyn Error>> {
        for _ in 0..ITERATIONS / 10 {
            raw_cycle(&mut self.raw).await?;
            raw_cycle(&mut self.raw_full).await?;
        }
        cycle(&self.store, "bench-cycle", TTL, ITERATIONS / 10).await?;
        cycle(&self.durable, "bench-cycle", TTL, ITERATIONS / 10).await?;
        self.modes
            .warm_up(&self.store, "bench-cycle", TTL, ITERATIONS / 10)
            .await?;
        Ok(())
    }

    /// Alternating rounds, so that every loop sees the same disk and machine load (an fsync's
    /// cost swings with whatever else the disk is flushing).
    async fn rounds(&mut self) -> Result<CycleSamples, Box<dyn Error>> {
        let (mut raw_samples, mut ours, mut flocks, mut fsyncs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut raw_full_samples, mut durable_samples) = (Vec::new(), Vec::new());
        let mut token = 0;
        for _ in 0..ROUNDS {
            // Each loop runs its round back to back, as `cycle_into` runs ours: a NORMAL floor
            // cycle timed right after a FULL one's fsync starts on threads that slept through
            // it, which made the floor 3-4× its back-to-back figure (119 against 30 µs).
            for _ in 0..ITERATIONS / ROUNDS {
                let started = std::time::Instant::now();
                raw_cycle(&mut self.raw).await?;
                raw_samples.push(started.elapsed());
            }
            cycle_into(
                &self.store,
                "bench-cycle",
                TTL,
                ITERATIONS / ROUNDS,
                &mut ours,
            )
            .await?;
            for _ in 0..ITERATIONS / ROUNDS {
                let started = std::time::Instant::now();
                raw_cycle(&mut self.raw_full).await?;
                raw_full_samples.push(started.elapsed());
            }
            cycle_into(
                &self.durable,
                "bench-cycle",
                TTL,
                ITERATIONS / ROUNDS,
                &mut durable_samples,
            )
            .await?;
            self.modes
                .round(&self.store, "bench-cycle", TTL, ITERATIONS / ROUNDS)
                .await?;
            let (flock_round, fsync_round, last) = self.flock_round(token).await?;
            token = last;
            flocks.extend(flock_round);
            fsyncs.extend(fsync_round);
        }
        Ok(CycleSamples {
            fsync: Samples::new(fsyncs),
            raw_cycle: Samples::new(raw_samples),
            ours: Samples::new(ours),
            raw_full: Samples::new(raw_full_samples),
            durable: Samples::new(durable_samples),
            flock_cycles: Samples::new(flocks),
        })
    }

    /// One round of flock(2) cycles and of single fdatasyncs, on a blocking thread; returns
    /// both, and the counter's last token.
    async fn flock_round(
        &self,
        mut token: u64,
    ) -> Result<(Vec<Duration>, Vec<Duration>, u64), Box<dyn Error>> {
        let (lock, counter, file) = (
            self.lock.clone(),
            self.counter.clone(),
            self.fsync_file.clone(),
        );
        Ok(tokio::task::spawn_blocking(move || {
            let (mut flocks, mut fsyncs) = (Vec::new(), Vec::new());
            for i in 0..ITERATIONS / ROUNDS {
                let started = std::time::Instant::now();
                flock_cycle(&lock, &counter, &mut token)?;
                flocks.push(started.elapsed());
                let started = std::time::Instant::now();
                file.write_at(&(i as u64).to_le_bytes(), 0)?;
                file.sync_data()?;
                fsyncs.push(started.elapsed());
            }
            Ok::<_, std::io::Error>((flocks, fsyncs, token))
        })
        .await??)
    }
}

impl CycleSamples {
    /// The cycle rows: one fdatasync, the raw floors and ours against them, and flock(2).
    fn rows(&self, table: &mut Table, modes: &ModeCycles) {
        let (raw_cycle, ours) = (&self.raw_cycle, &self.ours);
        table.latency("one write + fdatasync (p50)", self.fsync.p50());
        table.latency(
            "raw floor: BEGIN IMMEDIATE + insert + COMMIT + delete, NORMAL (p50)",
            raw_cycle.p50(),
        );
        table
            .latency("cycle: try_acquire + release (p50)", ours.p50())
            .ratio(
                us(ours.p50()) / us(raw_cycle.p50()),
                Some(("≤ 1.2× raw", us(ours.p50()) <= 1.2 * us(raw_cycle.p50()))),
            );
        table.latency("cycle p99", ours.p99());
        modes.rows(table, "cycle: ", Some(raw_cycle.p50()), None);
        table.latency(
            "raw floor at synchronous = FULL: two durable commits (p50)",
            self.raw_full.p50(),
        );
        table
            .latency(
                "cycle with durable_grants=true (FULL) (p50)",
                self.durable.p50(),
            )
            .ratio(us(self.durable.p50()) / us(self.raw_full.p50()), None);
        table
            .latency(
                "flock(2) + counter write + fdatasync + unlock (p50)",
                self.flock_cycles.p50(),
            )
            .ratio(us(ours.p50()) / us(self.flock_cycles.p50()), None);
    }
}
