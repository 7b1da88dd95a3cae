//! The SQL, one statement per atomic step, as named constants with one line each on why it is
//! atomic, and the statements with the fence table filled in.
//!
//! Everything here runs on MySQL 8 and MariaDB 10.3 or newer; only MariaDB 10.11 is tested.

use crate::keys::{scheme_comment, LOCK_ID_SCHEME};

// ---- SQL ------------------------------------------------------------------------------------
// `{fence}` stands for the quoted fence table, `{scheme}` for the lock-id scheme
// (LOCK_ID_SCHEME) and `{comment}` for the comment that records it. Every statement runs in
// autocommit: one statement, one transaction, durable before the reply when the server runs
// with innodb_flush_log_at_trx_commit=1 (the default; see the crate docs).

/// Who this session is: its connection id, the client address the server sees (to tell it
/// from a later session with the same id after a restart), the server's version and whether
/// autocommit is on. A single read.
pub(crate) const SESSION_INFO: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id,
        (SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()) AS host,
        VERSION() AS version, CAST(@@autocommit AS SIGNED) AS autocommit";

/// Turns autocommit back on where the server's `init_connect` turned it off.
pub(crate) const AUTOCOMMIT_ON: &str = "SET SESSION autocommit = 1";

/// Arms the server-side TTL: a session silent for $1 seconds is ended, and its lock with it.
pub(crate) const SET_WAIT_TIMEOUT: &str = "SET SESSION wait_timeout = ?";

/// Disarms the TTL of a session kept for the store's own look-ups: back to the server's
/// default, so a long-lived session is not ended between two look-ups by a short lease's TTL.
pub(crate) const RESET_WAIT_TIMEOUT: &str = "SET SESSION wait_timeout = @@GLOBAL.wait_timeout";

/// Whether the fence table ($1 database, $2 table) exists, its engine and the comment that
/// records its lock-id scheme, and whether commits are durable. A single read.
pub(crate) const FENCE_TABLE_STATE: &str =
    "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED) AS flush,
        t.ENGINE AS engine, t.TABLE_COMMENT AS comment
   FROM (SELECT 1) AS one
   LEFT JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?";

/// The fence table: one durable counter per key (the key itself, as bytes, not its hash, so a
/// hash collision never merges two counters), plus who took it last, for `status`. InnoDB, so
/// a bump is a committed transaction. The comment records the lock-id scheme; the CHECK keeps
/// another scheme's rows out where the server enforces CHECK (MariaDB 10.2+, MySQL 8.0.16+).
const CREATE_FENCE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {fence} (
    namespace      VARBINARY(63)    NOT NULL,
    `key`          VARBINARY(1024)  NOT NULL,
    lock_name      VARCHAR(64) CHARACTER SET ascii NOT NULL,
    lock_id_scheme TINYINT UNSIGNED NOT NULL CHECK (lock_id_scheme = {scheme}),
    token          BIGINT UNSIGNED  NOT NULL,
    owner          VARCHAR(64) CHARACTER SET ascii NOT NULL,
    holder_id      BIGINT UNSIGNED  NOT NULL,
    ttl_ms         BIGINT UNSIGNED  NOT NULL,
    updated_at     TIMESTAMP(6)     NOT NULL,
    PRIMARY KEY (namespace, `key`)
) ENGINE=InnoDB COMMENT='{comment}'";

/// Takes lock $6 (waiting up to $7 seconds in the server's queue; 0: one attempt) and, only if
/// granted, bumps the fence of ($1, $2). Atomic: one statement, one transaction; the WHERE
/// runs GET_LOCK before the row is written, so the bump commits while the lock is held and
/// before the reply. The token comes back as the reply's last-insert id (LAST_INSERT_ID(expr));
/// the affected rows say whether the lock was granted (0: not granted, 1: first lease of the
/// key, 2: a later one). Binds: namespace, key, lock name, owner, ttl ms, lock name, wait
/// seconds, lock name, owner, ttl ms.
const ACQUIRE: &str = "INSERT INTO {fence}
        (namespace, `key`, lock_name, lock_id_scheme, token, owner, holder_id, ttl_ms, updated_at)
    SELECT ?, ?, ?, {scheme}, LAST_INSERT_ID(1), ?, CONNECTION_ID(), ?, NOW(6)
      FROM DUAL
     WHERE GET_LOCK(?, ?) = 1
    ON DUPLICATE KEY UPDATE
        token = LAST_INSERT_ID(token + 1), lock_name = ?, owner = ?,
        holder_id = CONNECTION_ID(), ttl_ms = ?, updated_at = NOW(6)";

/// Extend: any statement restarts the server's idle timer; this one also proves that this
/// session still holds the lock ($1). A single read.
pub(crate) const CONFIRM_HELD: &str =
    "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id, CAST(IS_USED_LOCK(?) AS SIGNED) AS holder";

/// Release: unlock $1, then drop anything else this session still holds (it never should: a
/// session holds one lock, taken once), so the session goes back to the idle list clean. One
/// statement; `released` is 1 only if this session held the lock.
pub(crate) const RELEASE: &str = "SELECT CAST(RELEASE_LOCK(?) AS SIGNED) AS released,
            CAST(RELEASE_ALL_LOCKS() AS SIGNED) AS leftover";

/// Whether session $1 still belongs to client address $2 (not a later session that got the
/// id after a restart). A single read; [`KILL_SESSION`] follows on the same session, and a
/// restart between the two would have ended that session too.
pub(crate) const SESSION_PRESENT: &str = "SELECT COUNT(*) AS present
   FROM information_schema.PROCESSLIST WHERE ID = ? AND HOST = ?";

/// Ends session $1, a cancelled waiter: `KILL CONNECTION`, not `KILL QUERY`, since the wait may
/// already have been granted, and only the end of the session frees the lock. (KILL takes no
/// subquery, hence the look-up before it.)
pub(crate) const KILL_SESSION: &str = "KILL CONNECTION ?";

/// The session that holds lock $1 (NULL if free). A single read.
pub(crate) const HOLDER: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED) AS holder";

/// Operator action: end the session that holds lock $1. One statement, so the session ended
/// is the holder at that instant; fails with "unknown thread id" (1094) when the lock is free.
pub(crate) const KILL_HOLDER: &str = "KILL CONNECTION IS_USED_LOCK(?)";

/// Which of the sessions $1 (comma-separated connection ids) still exist, with their client
/// addresses: the watch task's look for sessions the server ended. A single read.
pub(crate) const LIVE_SESSIONS: &str = "SELECT CAST(ID AS SIGNED) AS id, HOST AS host
   FROM information_schema.PROCESSLIST WHERE FIND_IN_SET(ID, ?) > 0";

/// Status of lock $1 and the fence of ($2, $3): the holding session, how long it has been
/// silent (whole seconds), and the fence row (whose holder_id tells whether the row belongs to
/// that holder). A single read.
const STATUS: &str =
    "SELECT CAST(l.holder AS SIGNED) AS holder, CAST(f.token AS SIGNED) AS token, f.owner,
        CAST(f.holder_id AS SIGNED) AS holder_id, CAST(f.ttl_ms AS SIGNED) AS ttl_ms,
        p.COMMAND AS command, CAST(p.TIME AS SIGNED) AS silent_s
   FROM (SELECT IS_USED_LOCK(?) AS holder) AS l
   LEFT JOIN {fence} f ON f.namespace = ? AND f.`key` = ?
   LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.holder";

/// `sql` with the fence table, this build's lock-id scheme and its comment filled in.
fn fill(sql: &str, fence_table: &str) -> String {
    sql.replace("{fence}", fence_table)
        .replace("{scheme}", &LOCK_ID_SCHEME.to_string())
        .replace("{comment}", &scheme_comment(LOCK_ID_SCHEME))
}

pub(crate) fn fence_table_ddl(fence_table: &str) -> String {
    fill(CREATE_FENCE_TABLE, fence_table)
}

/// The statements with the fence table filled in.
pub(crate) struct Statements {
    pub(crate) acquire: String,
    pub(crate) status: String,
    pub(crate) create_fence_table: String,
}

impl Statements {
    pub(crate) fn new(fence_table: &str) -> Self {
        let fill = |sql: &str| fill(sql, fence_table);
        Statements {
            acquire: fill(ACQUIRE),
            status: fill(STATUS),
            create_fence_table: fill(CREATE_FENCE_TABLE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_configured_table_and_no_placeholder_is_left() {
        let sql = Statements::new("`d`.`t`");
        for statement in [&sql.acquire, &sql.status, &sql.create_fence_table] {
            assert!(statement.contains("`d`.`t`"), "{statement}");
            for placeholder in ["{fence}", "{scheme}", "{comment}"] {
                assert!(!statement.contains(placeholder), "{statement}");
            }
        }
        assert!(sql
            .create_fence_table
            .contains("COMMENT='fencelock fence table, lock-id scheme 2'"));
        // Ten binds, in the order the store sends them.
        assert_eq!(sql.acquire.matches('?').count(), 10);
    }
}
