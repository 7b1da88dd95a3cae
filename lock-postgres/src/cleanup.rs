//! Removal of idle fence rows, in bounded batches, off the path of every acquire.
//!
//! A release that finds a run due spawns one in the background (with
//! [`spawn_if_due`](fencelock_core::raw::cleanup_task::spawn_if_due): at most one per handle at a
//! time, at most one per [`interval`](fencelock_core::raw::cleanup::interval)); it runs on a
//! session of its own, a spare idle one or a new one (`Sessions::checkout_spare`), so no
//! acquire or release waits for it and the session the release gave back stays for the next
//! acquire. Each batch is one statement over at most [`BATCH_ROWS`] rows that
//! skips locked rows, so a bump never waits for more than one batch and the batch never waits
//! for a bump; a run stops after [`MAX_BATCHES`] batches and leaves the rest to the next one.

use std::sync::Arc;

use fencelock_core::raw::cleanup::{BATCH_ROWS, MAX_BATCHES};
use fencelock_core::Result;
use sqlx::Row;

use crate::error::bounded;
use crate::session::{Checkout, Sessions};

/// Spawns a background run if one is due. Never waits.
pub(crate) fn spawn_if_due(sessions: &Arc<Sessions>) {
    fencelock_core::raw::cleanup_task::spawn_if_due(
        sessions,
        |sessions| &sessions.cleanup,
        sessions.config.retention(),
        |sessions| async move { remove_idle_fences(&sessions).await },
    );
}

/// Removes fence rows not bumped for a retention window whose token the server's clock has
/// passed by the smallest window (and whose key nobody holds), at most [`MAX_BATCHES`] ×
/// [`BATCH_ROWS`]; returns how many.
///
/// # Cancel safety
/// Each batch commits on its own; dropping the future loses at most the batch in flight (its
/// session is closed, so the statement rolls back).
pub(crate) async fn remove_idle_fences(sessions: &Sessions) -> Result<u64> {
    let mut session = sessions.checkout_spare().await?;
    let retention_ms = i64::try_from(sessions.config.retention().as_millis()).unwrap_or(i64::MAX);
    let behind_us = i64::try_from(sessions.config.min_retention().as_micros()).unwrap_or(i64::MAX);
    let mut removed = 0u64;
    for _ in 0..MAX_BATCHES {
        let row = bounded(
            sessions.config.command_timeout(),
            sqlx::query(&sessions.sql.remove_idle_fences)
                .bind(retention_ms)
                .bind(i64::from(BATCH_ROWS))
                .bind(behind_us)
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
        if batch < i64::from(BATCH_ROWS) {
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
        sessions.config.command_timeout(),
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
