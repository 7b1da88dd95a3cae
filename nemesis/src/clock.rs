//! The one clock of a history: `CLOCK_MONOTONIC`, which every process on the machine reads
//! alike, so events written by different worker processes can be ordered in real time.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::time::Duration;

use fencelock::Instant;

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists on
    // Linux, so it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// `at` (a tokio instant, which outside paused tests is the same monotonic clock) in
/// nanoseconds on `CLOCK_MONOTONIC`.
pub fn to_ns(at: Instant) -> u64 {
    let (now, now_ns) = (Instant::now(), now_ns());
    if at >= now {
        now_ns.saturating_add(nanos(at - now))
    } else {
        now_ns.saturating_sub(nanos(now - at))
    }
}

/// A duration in whole nanoseconds, saturating.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
