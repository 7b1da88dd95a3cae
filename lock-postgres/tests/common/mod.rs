//! Helpers shared by the integration tests: an admin connection and pg_locks lookups.
#![allow(dead_code)]

use fencelock_postgres::{PostgresConfig, PostgresStore};
use sqlx::{Connection, PgConnection, Row};

/// A plain sqlx connection, outside any store.
pub(crate) async fn admin(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("admin connection")
}

/// A store handle on `url` with extra query options (`"namespace=x&max_idle=0"`).
pub(crate) async fn store(url: &str, options: &str) -> PostgresStore {
    // Generous: other test processes may load this machine.
    let separator = if url.contains('?') { '&' } else { '?' };
    let mut url = format!("{url}{separator}connect_timeout=30");
    if !options.is_empty() {
        url = format!("{url}&{options}");
    }
    PostgresStore::connect(PostgresConfig::from_url(&url).expect("config"))
        .await
        .expect("connect")
}

/// The pids of the backends that hold advisory lock `lock_id`.
pub(crate) async fn holders(admin: &mut PgConnection, lock_id: i64) -> Vec<i32> {
    advisory_pids(admin, lock_id, true).await
}

/// How many backends wait for advisory lock `lock_id`.
pub(crate) async fn waiters(admin: &mut PgConnection, lock_id: i64) -> i64 {
    i64::try_from(waiter_pids(admin, lock_id).await.len()).expect("a count")
}

/// The backends waiting for advisory lock `lock_id` (not granted).
pub(crate) async fn waiter_pids(admin: &mut PgConnection, lock_id: i64) -> Vec<i32> {
    advisory_pids(admin, lock_id, false).await
}

/// The backends whose advisory lock `lock_id` is `granted`, or not yet (waiting).
async fn advisory_pids(admin: &mut PgConnection, lock_id: i64, granted: bool) -> Vec<i32> {
    sqlx::query(
        "SELECT pid FROM pg_locks
          WHERE locktype = 'advisory' AND granted = $2 AND objsubid = 1
            AND classid = (($1::int8 >> 32) & 4294967295)::oid
            AND objid = ($1::int8 & 4294967295)::oid",
    )
    .bind(lock_id)
    .bind(granted)
    .fetch_all(admin)
    .await
    .expect("pg_locks")
    .iter()
    .map(|row| row.get::<i32, _>(0))
    .collect()
}

/// Whether backend `pid` still exists.
pub(crate) async fn backend_exists(admin: &mut PgConnection, pid: i32) -> bool {
    sqlx::query("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(pid)
        .fetch_one(admin)
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// Ends the backend holding `lock_id`, as an operator would, and waits until it is gone.
pub(crate) async fn terminate_holder(admin: &mut PgConnection, lock_id: i64) -> usize {
    sqlx::query(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks
          WHERE locktype = 'advisory' AND granted AND objsubid = 1
            AND classid = (($1::int8 >> 32) & 4294967295)::oid
            AND objid = ($1::int8 & 4294967295)::oid",
    )
    .bind(lock_id)
    .fetch_all(admin)
    .await
    .expect("pg_terminate_backend")
    .len()
}
