//! The SQL, one statement per atomic step, as named constants with one line each on why it is
//! atomic, and the statements with the lock table filled in.
//!
//! `{table}` stands for the quoted lock table. Every statement runs on its own in autocommit
//! mode: SQLite makes one statement one transaction, taking the database's single write lock
//! for its whole run (waiting up to the command timeout for it), and with `synchronous = FULL`
//! in WAL mode the commit is on disk (the WAL `fsync`ed) before the answer comes back.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds read by the caller just before sending (see
//! `clock.rs`), bound as parameters: SQLite has no monotonic clock of its own.

/// The lock table: one row per key ever locked, holding the key's durable fencing counter and
/// its current holder. `owner` is NULL while nobody holds the key; a holder recorded under
/// another boot, or whose expiry has passed, holds nothing. The key is stored as the bytes of
/// its UTF-8 (a BLOB), so any character, NUL included, is data.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    key        BLOB    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL,
    owner      TEXT,
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    pid        INTEGER NOT NULL
) WITHOUT ROWID";

/// Takes key ?1 for owner ?2 (boot ?3, now ?4, for ?5 ns; ?6 ms and pid ?7 for `status`) if
/// nobody holds it, and bumps its counter. Atomic: one statement under the write lock, so the
/// holder check, the take and the bump commit together or not at all. No row back: held.
const ACQUIRE: &str =
    "INSERT INTO {table} AS l (key, token, owner, boot_id, expires_ns, ttl_ms, pid)
VALUES (?1, 1, ?2, ?3, ?4 + ?5, ?6, ?7)
ON CONFLICT (key) DO UPDATE
   SET token = l.token + 1, owner = excluded.owner, boot_id = excluded.boot_id,
       expires_ns = excluded.expires_ns, ttl_ms = excluded.ttl_ms, pid = excluded.pid
 WHERE l.owner IS NULL OR l.boot_id <> excluded.boot_id OR l.expires_ns <= ?4
RETURNING token";

/// Release: clears the holder of key ?1 only if it is still owner ?2 with token ?3, of boot ?4
/// and not expired at ?5. Atomic: one statement, a compare-and-delete. No row changed: lost.
const RELEASE: &str = "UPDATE {table} SET owner = NULL
 WHERE key = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ns > ?5";

/// Extend: moves the expiry of key ?1 to ?5 + ?6 ns only if it is still held by owner ?2 with
/// token ?3, of boot ?4, not expired at ?5. Atomic: one statement, a compare-and-expire that
/// never revives an expired or released lease. No row changed: lost.
const EXTEND: &str = "UPDATE {table} SET expires_ns = ?5 + ?6
 WHERE key = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ns > ?5";

/// Operator action: clears whoever holds key ?1 (of boot ?2, live at ?3); the counter stays.
/// Atomic: one statement. One row changed: a live lease was evicted.
const EVICT: &str = "UPDATE {table} SET owner = NULL
 WHERE key = ?1 AND owner IS NOT NULL AND boot_id = ?2 AND expires_ns > ?3";

/// The row of key ?1, for waiting and `status`; the caller judges whether its holder is live.
/// A single read, which WAL mode serves without waiting for writers.
const HOLDER: &str = "SELECT token, owner, boot_id, expires_ns, ttl_ms FROM {table} WHERE key = ?1";

/// What journal mode the database is in: the store needs `wal`. A single read.
pub(crate) const JOURNAL_MODE: &str = "PRAGMA journal_mode";

/// `sql` with the lock table filled in.
fn fill(sql: &str, table: &str) -> String {
    sql.replace("{table}", table)
}

/// The statements with the lock table filled in.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) create_table: String,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) evict: String,
    pub(crate) holder: String,
}

impl Statements {
    pub(crate) fn new(quoted_table: &str) -> Self {
        let fill = |sql: &str| fill(sql, quoted_table);
        Statements {
            create_table: fill(CREATE_TABLE),
            acquire: fill(ACQUIRE),
            release: fill(RELEASE),
            extend: fill(EXTEND),
            evict: fill(EVICT),
            holder: fill(HOLDER),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_configured_table_and_no_placeholder_is_left() {
        let sql = Statements::new("\"t\"");
        for statement in [
            &sql.create_table,
            &sql.acquire,
            &sql.release,
            &sql.extend,
            &sql.evict,
            &sql.holder,
        ] {
            assert!(statement.contains("\"t\""), "{statement}");
            assert!(!statement.contains("{table}"), "{statement}");
        }
    }
}
