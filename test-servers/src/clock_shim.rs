//! A preloaded library (`LD_PRELOAD`) that sets a child process's wall clock back, for servers
//! that do not start under Debian's `faketime`.
//!
//! `redis-server` (Debian's, linked with the shared jemalloc) deadlocks at start under
//! libfaketime: jemalloc reads `clock_gettime` while it initialises, libfaketime's own
//! initialisation `malloc`s, and the two wait on each other (`lock-redis/tests/cluster_faults.rs`
//! lists what was tried). This library does neither: it overrides `clock_gettime` (only
//! `CLOCK_REALTIME` and `CLOCK_REALTIME_COARSE` are moved; every other clock, the monotonic
//! ones jemalloc and Redis time intervals with included, is the kernel's as it is),
//! `gettimeofday` and `time`, asks the kernel through `syscall(SYS_clock_gettime, …)` (no
//! `malloc`, no `dlsym`, no call into the C library's clock), and reads the offset once, on
//! the first call, with `getenv` (which does not allocate).
//!
//! A process started with a [`ClockControl`] also reads a step that can change while it runs:
//! eight bytes (µs, signed, added to the wall clock) in a file the library maps on the first
//! call (`openat` and `mmap` as raw system calls) and loads at every call, so a test or the
//! nemesis steps a running server's clock forward or back by writing the file.
//!
//! Redis 7.0 reads its wall clock through `gettimeofday` (`ustime()`, `mstime()`, the `TIME`
//! command, key expiry) and `time`; its monotonic clock (`CLOCK_MONOTONIC`, or the TSC where
//! built for it) is left alone, so timeouts and intervals keep their length.
//!
//! The library is built once per process with `cc -shared -fPIC -O2` (`cc` is the linker
//! rustc uses on Linux; Debian: `gcc`) into a temporary directory that lives as long as the
//! process.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::process::{self, TempDir};
use crate::{Error, Result};

/// The variable the library reads: whole seconds to subtract from the wall clock (negative:
/// add).
const BACK_VAR: &str = "FENCELOCK_CLOCK_BACK_SECONDS";

/// The variable naming the file of the changing step ([`ClockControl`]).
const STEP_VAR: &str = "FENCELOCK_CLOCK_STEP_FILE";

/// The library's source.
const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long back_seconds;
static int back_read;
static long long *step_micros;
static int step_mapped;

/* The step file's eight bytes, mapped once (two threads racing map it twice: harmless). */
static long long step(void) {
    if (!__atomic_load_n(&step_mapped, __ATOMIC_ACQUIRE)) {
        const char *path = getenv("FENCELOCK_CLOCK_STEP_FILE");
        if (path) {
            long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *page = (void *)syscall(SYS_mmap, 0, 8, PROT_READ, MAP_SHARED, fd, 0);
                if (page != MAP_FAILED)
                    __atomic_store_n(&step_micros, (long long *)page, __ATOMIC_RELAXED);
                syscall(SYS_close, fd);
            }
        }
        __atomic_store_n(&step_mapped, 1, __ATOMIC_RELEASE);
    }
    long long *page = __atomic_load_n(&step_micros, __ATOMIC_RELAXED);
    return page ? __atomic_load_n(page, __ATOMIC_RELAXED) : 0;
}

static long long back(void) {
    if (!__atomic_load_n(&back_read, __ATOMIC_ACQUIRE)) {
        const char *text = getenv("FENCELOCK_CLOCK_BACK_SECONDS");
        __atomic_store_n(&back_seconds, text ? strtoll(text, NULL, 10) : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&back_read, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&back_seconds, __ATOMIC_RELAXED);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long failed = syscall(SYS_clock_gettime, clock, ts);
    if (!failed && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long micros = step();
        long long nanos = ts->tv_nsec + (micros % 1000000) * 1000;
        ts->tv_sec += micros / 1000000 - back();
        while (nanos < 0) { nanos += 1000000000; ts->tv_sec -= 1; }
        while (nanos >= 1000000000) { nanos -= 1000000000; ts->tv_sec += 1; }
        ts->tv_nsec = nanos;
    }
    return (int)failed;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts)) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    if (tz) {
        struct timezone *zone = tz;
        zone->tz_minuteswest = 0;
        zone->tz_dsttime = 0;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts)) return (time_t)-1;
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// Makes `command` run with its wall clock `back` behind this host's (whole seconds).
pub(crate) fn set_back(command: &mut Command, back: Duration) -> Result<()> {
    let library = library()?;
    let mut preload = library.into_os_string();
    if let Some(earlier) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(earlier);
    }
    command
        .env("LD_PRELOAD", preload)
        .env(BACK_VAR, back.as_secs().to_string());
    Ok(())
}

/// A wall clock that a test steps while the process under it runs: a file of eight bytes
/// (the step, µs, signed) that the clock shim of each process started with
/// [`apply`](Self::apply) maps and adds to its wall clock at every read. Only the wall clock
/// moves (`CLOCK_REALTIME`, `gettimeofday`, `time`); monotonic clocks are the kernel's.
#[derive(Debug)]
pub struct ClockControl {
    file: std::fs::File,
    path: PathBuf,
    _dir: TempDir,
}

impl ClockControl {
    /// A control whose step is 0.
    pub fn new() -> Result<Self> {
        let dir = TempDir::new("clock-step", 0, None)?;
        let path = dir.path().join("step");
        let start = |e: std::io::Error| Error::Start {
            server: "the clock step file".into(),
            reason: e.to_string(),
            log_tail: String::new(),
        };
        std::fs::write(&path, 0i64.to_le_bytes()).map_err(start)?;
        // Servers that drop root (PostgreSQL, MariaDB) still read it.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(start)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).map_err(start)?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(start)?;
        Ok(ClockControl {
            file,
            path,
            _dir: dir,
        })
    }

    /// Makes `command` run under the shim with this control's step (and no fixed offset).
    pub fn apply(&self, command: &mut Command) -> Result<()> {
        set_back(command, Duration::ZERO)?;
        command.env(STEP_VAR, &self.path);
        Ok(())
    }

    /// Sets the step: the processes' wall clocks read this host's plus `micros` (negative:
    /// behind), from their next read on. Written in place (never truncated: the processes map
    /// the file, and a shorter file would fault their reads).
    pub fn set_micros(&self, micros: i64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&micros.to_le_bytes(), 0)
            .map_err(|e| Error::Start {
                server: "the clock step file".into(),
                reason: e.to_string(),
                log_tail: String::new(),
            })
    }

    /// The step now, µs.
    pub fn micros(&self) -> i64 {
        std::fs::read(&self.path)
            .ok()
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, i64::from_le_bytes)
    }

    /// Steps the clocks by `micros` more (negative: back).
    pub fn step_micros(&self, micros: i64) -> Result<()> {
        self.set_micros(self.micros().saturating_add(micros))
    }
}

/// The library's path, built on the first call.
fn library() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<(TempDir, PathBuf), String>> = OnceLock::new();
    let cc = process::find_binary("cc", "gcc")?;
    let built = BUILT.get_or_init(|| {
        let dir = TempDir::new("clock-shim", 0, None).map_err(|e| e.to_string())?;
        let source = dir.path().join("clock_shim.c");
        let library = dir.path().join("clock_shim.so");
        std::fs::write(&source, SOURCE).map_err(|e| e.to_string())?;
        let output = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", cc.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} failed ({}): {}",
                cc.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok((dir, library))
    });
    match built {
        Ok((_, library)) => Ok(library.clone()),
        Err(reason) => Err(Error::Start {
            server: "the clock shim (cc -shared -fPIC -O2)".into(),
            reason: reason.clone(),
            log_tail: String::new(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64
    }

    /// `date` (coreutils: `clock_gettime(CLOCK_REALTIME)`) under the library reads a day back,
    /// and without it this host's clock.
    #[test]
    fn a_child_under_the_shim_reads_the_wall_clock_a_day_back() {
        let mut date = Command::new("date");
        date.arg("+%s");
        set_back(&mut date, Duration::from_secs(86_400)).expect("the clock shim");
        let before = now();
        let output = date.output().expect("date");
        let after = now();
        assert!(output.status.success(), "{output:?}");
        let shown: i64 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("seconds");
        assert!(
            (before - 86_400..=after - 86_400).contains(&shown),
            "date said {shown}, this host {before}..{after}"
        );

        let mut plain = Command::new("date");
        plain.arg("+%s");
        let output = plain.output().expect("date");
        let shown: i64 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("seconds");
        assert!(shown >= before, "without the shim date said {shown}");
    }

    /// A running process under a [`ClockControl`] reads each new step at its next read: one
    /// Python process that prints `time.time()` (`clock_gettime(CLOCK_REALTIME)`) when told,
    /// its clock stepped an hour ahead, then a day back, between two of its reads.
    #[test]
    fn a_running_child_reads_each_new_step() {
        use std::io::{BufRead, BufReader, Write};
        let control = ClockControl::new().expect("a clock control");
        let mut shell = Command::new("python3");
        shell
            .args([
                "-c",
                "import sys, time\nfor _ in sys.stdin:\n    print(time.time(), flush=True)",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        control.apply(&mut shell).expect("the clock shim");
        let mut child = shell.spawn().expect("sh");
        let mut stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut read = |stdin: &mut std::process::ChildStdin| -> f64 {
            stdin.write_all(b"\n").expect("write");
            lines
                .next()
                .expect("a line")
                .expect("read")
                .parse()
                .expect("seconds")
        };
        let host = || now() as f64;
        let first = read(&mut stdin);
        assert!(
            (first - host()).abs() < 5.0,
            "no step: {first} vs {}",
            host()
        );
        control.set_micros(3_600_000_000).expect("step");
        let ahead = read(&mut stdin);
        assert!(
            (ahead - host() - 3600.0).abs() < 5.0,
            "an hour ahead: {ahead}"
        );
        control
            .step_micros(-3_600_000_000 - 86_400_000_000)
            .expect("step");
        let back = read(&mut stdin);
        assert!((back - host() + 86_400.0).abs() < 5.0, "a day back: {back}");
        control.set_micros(-1_500).expect("step");
        let close = read(&mut stdin);
        assert!((close - host()).abs() < 5.0, "1.5 ms back: {close}");
        drop(stdin);
        let _ = child.wait();
    }
}
