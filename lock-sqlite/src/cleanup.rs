//! When a handle removes idle rows: at most one run at a time, at most one per [`interval`],
//! started by a release in the background so no acquire or release waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Rows one transaction removes at most: it holds SQLite's write lock for that long, so an
/// acquire waits for one batch at most.
pub(crate) const BATCH: i64 = 1_000;
/// Batches one run executes at most; the rest is left to the next run.
pub(crate) const MAX_BATCHES: usize = 10;

/// When a handle last removed idle rows, and whether a run is under way.
#[derive(Debug, Default)]
pub(crate) struct Cleanup {
    last: Mutex<Option<Instant>>,
    running: AtomicBool,
}

impl Cleanup {
    /// Claims the next run if it is due; the caller must call [`Cleanup::done`] afterwards.
    pub(crate) fn claim(&self, interval: Duration) -> bool {
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

    pub(crate) fn done(&self) {
        self.running.store(false, Ordering::Release);
    }
}

/// How often a handle looks for idle rows: a tenth of the retention window, between 100 ms and
/// 10 minutes.
pub(crate) fn interval(retention: Duration) -> Duration {
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
        let cleanup = Cleanup::default();
        assert!(cleanup.claim(Duration::ZERO));
        assert!(!cleanup.claim(Duration::ZERO), "one run at a time");
        cleanup.done();
        assert!(cleanup.claim(Duration::ZERO));
        cleanup.done();
        assert!(!cleanup.claim(Duration::from_secs(3600)), "not due yet");
    }
}
