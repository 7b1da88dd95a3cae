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

/// The library's source.
const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long back_seconds;
static int back_read;

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
    if (!failed && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        ts->tv_sec -= back();
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
}
