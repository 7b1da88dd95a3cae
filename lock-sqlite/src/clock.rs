//! The clock every process on the host shares, and the boot it belongs to.
//!
//! Expiry times are `CLOCK_MONOTONIC` readings in nanoseconds, stored with the boot id
//! (`/proc/sys/kernel/random/boot_id`). Why this clock:
//! - It is the clock of the holder's local deadline: tokio's `Instant` is `std::time::Instant`,
//!   which is `CLOCK_MONOTONIC` on Linux. The store's expiry and the holder's deadline run on
//!   one clock, read in that order, so the deadline can never run past the expiry, drift or no
//!   drift.
//! - Wall time (`CLOCK_REALTIME`) can jump (NTP steps, an operator's `date`): a jump forward
//!   would expire every lease at once, behind holders that still trust their deadlines.
//! - `CLOCK_BOOTTIME` would keep running through a suspend while the holders' deadlines stand
//!   still: after a resume, a holder would trust a lease the store had already let go. With
//!   `CLOCK_MONOTONIC` a suspend pauses the store and every holder alike, and a lease resumes
//!   with the time it had left. The cost: a lock held when the machine went to sleep is still
//!   held for the rest of its TTL after it wakes.
//! - The clock restarts at every boot, so a reading is only meaningful with its boot id; a
//!   lease recorded under another boot id is dead whatever its expiry says (a reboot ended its
//!   holder).
//!
//! Tokens are the exception: they are floored by wall time ([`unix_micros`], `CLOCK_REALTIME`),
//! the clock every store shares with the rest of the world, so a resource fenced under another
//! store accepts this one's tokens after a swap (the crate docs, "Fencing tokens"). No expiry
//! or deadline depends on it.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use fencelock_core::{Error, Result};

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock all processes of the host (in one time
/// namespace) share.
pub(crate) fn monotonic_ns() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; CLOCK_MONOTONIC is
    // always supported on Linux, so it cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    now.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec)
}

/// Microseconds since the Unix epoch on `CLOCK_REALTIME` (the clock floor of a token), or 0
/// for a clock set before 1970 (the counter then decides alone).
pub(crate) fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
}

/// This boot's id, read once per process.
pub(crate) fn boot_id() -> Result<&'static str> {
    static BOOT_ID: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let read = BOOT_ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().to_owned())
            .map_err(|e| e.to_string())
            .and_then(|id| {
                if id.is_empty() {
                    Err("it is empty".to_owned())
                } else {
                    Ok(id)
                }
            })
    });
    match read {
        Ok(id) => Ok(id),
        Err(reason) => Err(Error::Store {
            message: format!(
                "cannot read this boot's id from /proc/sys/kernel/random/boot_id ({reason}): \
                 the SQLite store needs Linux with /proc mounted"
            ),
            source: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_clock_is_the_clock_of_tokio_instants() {
        // A store reading taken between two Instants lies between them.
        let before = std::time::Instant::now();
        let store_now = monotonic_ns();
        let after = std::time::Instant::now();
        let base = monotonic_ns();
        let since_before = i64::try_from(before.elapsed().as_nanos()).unwrap();
        let since_after = i64::try_from(after.elapsed().as_nanos()).unwrap();
        assert!(
            store_now >= base - since_before - 1_000_000,
            "{store_now} vs {base}"
        );
        assert!(
            store_now <= base - since_after + 1_000_000,
            "{store_now} vs {base}"
        );
    }

    #[test]
    fn the_boot_id_is_read_and_stable() {
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(boot_id().unwrap(), id);
    }
}
