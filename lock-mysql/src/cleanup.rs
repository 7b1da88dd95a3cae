//! Removal of idle fence rows, in bounded batches, off the path of every acquire.
//!
//! A release that finds a run due spawns one in the background (with
//! [`spawn_if_due`](fencelock_core::raw::cleanup_task::spawn_if_due): at most one per handle at a
//! time, at most one per [`interval`](fencelock_core::raw::cleanup::interval)); it runs on a session
//! of its own, a spare idle one or a new one (`Sessions::checkout_spare`), so no acquire or
//! release waits for it and the session the release gave back stays for the next acquire. Each batch first looks for idle rows with
//! a plain read (no locks), then, in one short transaction, locks the floor row, checks the rows again under row locks, raises
//! the floor to their highest token and deletes them. Only bumps of new rows wait, for that
//! transaction at most; a run stops after [`MAX_BATCHES`] batches and leaves the rest to the
//! next one.

use std::sync::Arc;

use fencelock_core::raw::cleanup::{BATCH_ROWS, MAX_BATCHES};
use fencelock_core::Result;
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Row};

use crate::error::{bounded, sql_error};
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

/// Removes fence rows not bumped for a retention window whose keys nobody holds, at most
/// [`MAX_BATCHES`] × [`BATCH_ROWS`], raising the floor above their tokens; returns how many.
///
/// # Cancel safety
/// Each batch commits on its own; dropping the future drops its session, so a batch in flight
/// rolls back whole.
pub(crate) async fn remove_idle_fences(sessions: &Sessions) -> Result<u64> {
    let mut session = sessions.checkout_spare().await?;
    let window_us = u64::try_from(sessions.config.retention().as_micros()).unwrap_or(u64::MAX);
    // A batch is a few short statements; the whole of it is bounded as one.
    let limit = sessions.config.command_timeout();
    let mut removed = 0u64;
    for _ in 0..MAX_BATCHES {
        let batch = bounded(limit, remove_batch(sessions, &mut session.conn, window_us))
            .await
            .map_err(|fault| fault.into_error("removing idle fence rows"))?;
        removed += batch;
        if batch < u64::from(BATCH_ROWS) {
            break;
        }
    }
    sessions.checkin(session);
    Ok(removed)
}

/// One batch: see the module docs. Returns how many rows it removed.
async fn remove_batch(
    sessions: &Sessions,
    conn: &mut MySqlConnection,
    window_us: u64,
) -> std::result::Result<u64, sqlx::Error> {
    let sql = &sessions.sql;
    let candidates = sqlx::query(&sql.find_idle)
        .bind(window_us)
        .bind(u64::from(BATCH_ROWS))
        .fetch_all(&mut *conn)
        .await?;
    if candidates.is_empty() {
        return Ok(0);
    }
    let keys = rows_keys(&candidates)?;
    let mut tx = conn.begin().await?;
    sqlx::query(&sql.lock_floor).fetch_all(&mut *tx).await?;
    // Not kept in the statement cache: its text depends on the batch's size.
    let confirm_sql = sql.confirm_idle(keys.len());
    let mut confirm = sqlx::query(&confirm_sql).persistent(false);
    for (namespace, key) in &keys {
        confirm = confirm.bind(namespace).bind(key);
    }
    let confirmed = confirm.bind(window_us).fetch_all(&mut *tx).await?;
    if confirmed.is_empty() {
        tx.commit().await?;
        // Every candidate was taken meanwhile; more may be idle behind them.
        return Ok(candidates.len() as u64);
    }
    let mut highest = 0u64;
    for row in &confirmed {
        highest = highest.max(row.try_get::<u64, _>("token")?);
    }
    sqlx::query(&sql.raise_floor)
        .bind(highest)
        .execute(&mut *tx)
        .await?;
    let keys = rows_keys(&confirmed)?;
    let delete_sql = sql.delete_rows(keys.len());
    let mut delete = sqlx::query(&delete_sql).persistent(false);
    for (namespace, key) in &keys {
        delete = delete.bind(namespace).bind(key);
    }
    delete.execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(candidates.len() as u64)
}

/// A fence row's primary key: (namespace, key).
type RowKey = (Vec<u8>, Vec<u8>);

/// The primary key of each row.
fn rows_keys(rows: &[sqlx::mysql::MySqlRow]) -> std::result::Result<Vec<RowKey>, sqlx::Error> {
    rows.iter()
        .map(|row| Ok((row.try_get("namespace")?, row.try_get("key")?)))
        .collect()
}

/// How many fence rows the table holds (every namespace).
///
/// # Cancel safety
/// A single read; dropping the future loses nothing.
pub(crate) async fn count_fences(sessions: &Sessions) -> Result<u64> {
    let Checkout { mut session, .. } = sessions.checkout().await?;
    let row = bounded(
        sessions.config.command_timeout(),
        sqlx::query(&sessions.sql.count_rows).fetch_one(&mut session.conn),
    )
    .await
    .map_err(|fault| fault.into_error("counting fence rows"))?;
    sessions.checkin(session);
    let rows: i64 = row
        .try_get("fence_rows")
        .map_err(|e| sql_error("counting fence rows", e))?;
    Ok(u64::try_from(rows).unwrap_or(0))
}
