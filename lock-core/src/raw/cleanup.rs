//! For store implementers: when a handle removes idle per-key state (fence rows not bumped for
//! a retention window): at most one run at a time, at most one per [`interval`], started in
//! the background by a release, so no acquire or release waits for it; and how much one run
//! removes: at most [`MAX_BATCHES`] batches of at most [`BATCH_ROWS`] rows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Rows one batch removes at most. A batch is one statement or one short transaction, so a
/// lock operation that has to wait for a run waits for one batch at most.
pub const BATCH_ROWS: u32 = 1_000;

/// Batches one run executes at most; what is left stays for the next run, so a run's length
/// is bounded however many rows are idle.
pub const MAX_BATCHES: u32 = 10;

/// When a handle last removed idle state, and whether a run is under way.
#[derive(Debug, Default)]
pub struct CleanupSchedule {
    last: Mutex<Option<Instant>>,
    running: AtomicBool,
}

impl CleanupSchedule {
    /// Claims the next run if none is under way and the last one started at least `interval`
    /// ago; the caller must call [`done`](Self::done) once the run ends (or is not started).
    pub fn claim(&self, interval: Duration) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < interval) {
            return false;
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// The claimed run ended: the next one may be claimed once due.
    pub fn done(&self) {
        self.running.store(false, Ordering::Release);
    }
}

/// How often a handle looks for idle state: a tenth of the retention window, between 100 ms
/// and 10 minutes.
pub fn interval(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_millis(100), Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_come_a_tenth_of_the_window_apart_within_bounds() {
        assert_eq!(interval(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(
            interval(Duration::from_millis(500)),
            Duration::from_millis(100)
        );
        assert_eq!(
            interval(Duration::from_secs(7 * 86_400)),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn a_run_is_claimed_once_until_done_and_then_once_per_interval() {
        let cleanup = CleanupSchedule::default();
        assert!(cleanup.claim(Duration::ZERO));
        assert!(!cleanup.claim(Duration::ZERO), "one run at a time");
        cleanup.done();
        assert!(cleanup.claim(Duration::ZERO));
        cleanup.done();
        assert!(!cleanup.claim(Duration::from_secs(3600)), "not due yet");
    }
}
