//! When a handle removes idle rows: at most one run at a time, at most one per [`interval`],
//! started by a release in the background so no acquire or release waits for it.

/// Rows one transaction removes at most: it holds SQLite's write lock for that long, so an
/// acquire waits for one batch at most.
pub(crate) const BATCH: i64 = 1_000;
/// Batches one run executes at most; the rest is left to the next run.
pub(crate) const MAX_BATCHES: usize = 10;

/// When a handle last removed idle rows, and whether a run is under way (shared with the
/// other stores that keep fence rows).
pub(crate) use fencelock_core::cleanup::{interval, CleanupSchedule as Cleanup};
