//! Removal of idle fence rows, in bounded batches, off the path of every acquire.
//!
//! A release that finds a run due spawns one in the background (at most one per handle at a
//! time, at most one per [`interval`]); it takes a pooled session of its own, so no acquire or
//! release waits for it. Each batch is one statement over at most [`BATCH`] rows that skips
//! locked rows, so a bump never waits for more than one batch and the batch never waits for a
//! bump; a run stops after [`MAX_BATCHES`] batches and leaves the rest to the next one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_core::Result;
use sqlx::Row;
use tokio::time::Instant;

use crate::error::bounded;
use crate::session::{Checkout, Sessions};

/// Rows one statement removes at most.
pub(crate) const BATCH: i64 = 1_000;
/// Batches one run executes at most.
pub(crate) const MAX_BATCHES: usize = 10;

/// When a handle last removed idle rows, and whether a run is under way.
#[derive(Debug, Default)]
pub(crate) struct Cleanup {
    last: Mutex<Option<Instant>>,
    running: AtomicBool,
}

impl Cleanup {
    /// Claims the next run if it is due; the caller must call [`Cleanup::done`] afterwards.
    fn claim(&self, interval: Duration) -> bool {
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

    fn done(&self) {
        self.running.store(false, Ordering::Release);
    }
}

/// How often a handle looks for idle rows: a tenth of the retention window, between 100 ms and
/// 10 minutes.
pub(crate) fn interval(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_millis(100), Duration::from_secs(600))
}

/// Spawns a background run if one is due. Never waits.
pub(crate) fn spawn_if_due(sessions: &Arc<Sessions>) {
    if !sessions.cleanup.claim(interval(sessions.config.retention)) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        sessions.cleanup.done();
        return;
    };
    let sessions = sessions.clone();
    runtime.spawn(async move {
        match remove_idle_fences(&sessions).await {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(removed, "removed idle fence rows"),
            Err(error) => tracing::debug!(%error, "could not remove idle fence rows; next time"),
        }
        sessions.cleanup.done();
    });
}

/// Removes fence rows not bumped for a retention window (and whose token is below every
/// transaction id still to come), at most [`MAX_BATCHES`] × [`BATCH`]; returns how many.
///
/// # Cancel safety
/// Each batch commits on its own; dropping the future loses at most the batch in flight (its
/// session is closed, so the statement rolls back).
pub(crate) async fn remove_idle_fences(sessions: &Sessions) -> Result<u64> {
    let Checkout { mut session, .. } = sessions.checkout().await?;
    let retention_ms = i64::try_from(sessions.config.retention.as_millis()).unwrap_or(i64::MAX);
    let mut removed = 0u64;
    for _ in 0..MAX_BATCHES {
        let row = bounded(
            sessions.config.command_timeout,
            sqlx::query(&sessions.sql.remove_idle_fences)
                .bind(retention_ms)
                .bind(BATCH)
                .fetch_one(&mut session.conn),
        )
        .await
        .map_err(|fault| fault.into_error("removing idle fence rows"))?;
        let batch: i64 = row
            .try_get("removed")
            .map_err(|e| fencelock_core::Error::Store {
                message: format!("removing idle fence rows: {e}"),
                source: None,
            })?;
        removed += u64::try_from(batch).unwrap_or(0);
        if batch < BATCH {
            break;
        }
    }
    sessions.checkin(session);
    Ok(removed)
}

/// How many fence rows the table holds (every namespace).
///
/// # Cancel safety
/// A single read; dropping the future loses nothing.
pub(crate) async fn count_fences(sessions: &Sessions) -> Result<u64> {
    let Checkout { mut session, .. } = sessions.checkout().await?;
    let row = bounded(
        sessions.config.command_timeout,
        sqlx::query(&sessions.sql.count_fences).fetch_one(&mut session.conn),
    )
    .await
    .map_err(|fault| fault.into_error("counting fence rows"))?;
    sessions.checkin(session);
    let fences: i64 = row
        .try_get("fences")
        .map_err(|e| fencelock_core::Error::Store {
            message: format!("counting fence rows: {e}"),
            source: None,
        })?;
    Ok(u64::try_from(fences).unwrap_or(0))
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
