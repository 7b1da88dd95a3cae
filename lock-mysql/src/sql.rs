//! The SQL, one statement per atomic step, as named constants with one line each on why it is
//! atomic, and the statements with the fence table filled in.
//!
//! Everything here runs on MySQL 8 and MariaDB 10.3 or newer; only MariaDB 10.11 is tested.

use crate::keys::{scheme_comment, LOCK_ID_SCHEME};

// ---- SQL ------------------------------------------------------------------------------------
// `{fence}` stands for the quoted fence table, `{floor}` for its floor table, `{scheme}` for the lock-id scheme
// (LOCK_ID_SCHEME), `{comment}` for the comment that records it and `{clock}` for the server's
// clock in µs ([`CLOCK_US`]). Every statement runs in
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

/// Whether the fence table ($5 database, $6 table) exists, its engine and the comment that
/// records its lock-id scheme, whether it has the `fence_scheme` column ($1 database, $2
/// table), whether the floor table ($3 database, $4 table) exists, and whether commits are
/// durable. A single read.
pub(crate) const FENCE_TABLE_STATE: &str =
    "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED) AS flush,
        t.ENGINE AS engine, t.TABLE_COMMENT AS comment,
        (SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.COLUMNS c
          WHERE c.TABLE_SCHEMA = ? AND c.TABLE_NAME = ? AND c.COLUMN_NAME = 'fence_scheme')
          AS fence_scheme_column,
        (SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.TABLES f
          WHERE f.TABLE_SCHEMA = ? AND f.TABLE_NAME = ?) AS floor_table,
        (SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.COLUMNS c
          WHERE c.TABLE_SCHEMA = ? AND c.TABLE_NAME = ? AND c.COLUMN_NAME = 'label')
          AS label_column
   FROM (SELECT 1) AS one
   LEFT JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?";

/// The fence table: one durable counter per key (the key itself, as bytes, not its hash, so a
/// hash collision never merges two counters), plus who took it last, for `status`. InnoDB, so
/// a bump is a committed transaction. The comment records the lock-id scheme; the CHECK keeps
/// another scheme's rows out where the server enforces CHECK (MariaDB 10.2+, MySQL 8.0.16+).
/// `fence_scheme` records fence scheme 3 (clock-floored tokens; a new row starts above the floor
/// table), as the comment does; it has no default and must be 3, so a build of fence scheme 1
/// (which writes no scheme) or 2 (which writes 2) cannot write a row, new or existing: the
/// server checks the row it would insert before it looks for a duplicate. `label` is the
/// holder's label behind its owner id (`owner:label`), so a row taken by a build that does not
/// write labels (and leaves the column as it was) shows none.
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
    fence_scheme   TINYINT UNSIGNED NOT NULL CHECK (fence_scheme = 3),
    label          VARBINARY(300)   NULL,
    PRIMARY KEY (namespace, `key`)
) ENGINE=InnoDB COMMENT='{comment}'";

/// Adds the `label` column to a fence table made before labels (nullable, so existing rows
/// and earlier builds' writes need no value). One DDL statement; a creator that lost a race
/// to add it gets "duplicate column name" (1060), which is success.
const ADD_LABEL_COLUMN: &str = "ALTER TABLE {fence} ADD COLUMN label VARBINARY(300) NULL";

/// The floor table: one row, at least the highest token any removed fence row had. A new
/// fence row starts above it, so a key whose row was removed still gets a greater token.
const CREATE_FLOOR_TABLE: &str = "CREATE TABLE IF NOT EXISTS {floor} (
    one         TINYINT UNSIGNED NOT NULL PRIMARY KEY CHECK (one = 1),
    floor_token BIGINT UNSIGNED  NOT NULL
) ENGINE=InnoDB";

/// The floor's one row, at 0 for a new table; a row already there stays. One statement.
const INIT_FLOOR: &str = "INSERT IGNORE INTO {floor} (one, floor_token) VALUES (1, 0)";

/// Moves a fence table of fence scheme 1 (no `fence_scheme` column) or 2 (`fence_scheme = 2`)
/// to fence scheme 3, counters kept: drops the old column where there is one (MySQL has no
/// `DROP COLUMN IF EXISTS`, hence the prepared statement), adds it back checked to be 3 with a
/// default (existing rows need a value), drops the default, so no older build can write a row
/// afterwards, adds the floor table where it is missing, and last records the scheme in the
/// comment. `{database}` and `{table}` are the checked names as string literals. Not atomic
/// (MySQL commits each DDL statement): stop the older stores first; a run stopped half-way
/// leaves a table this build refuses and that no build can mint in, and running it again
/// finishes it (on a table of scheme 3 it changes nothing).
const UPGRADE_TO_FENCE_SCHEME_3: &str = "SET @fencelock_upgrade = IF(
    (SELECT COUNT(*) FROM information_schema.COLUMNS
      WHERE TABLE_SCHEMA = '{database}' AND TABLE_NAME = '{table}'
        AND COLUMN_NAME = 'fence_scheme') > 0,
    'ALTER TABLE {fence} DROP COLUMN fence_scheme', 'DO 0');
PREPARE fencelock_upgrade FROM @fencelock_upgrade;
EXECUTE fencelock_upgrade;
DEALLOCATE PREPARE fencelock_upgrade;
ALTER TABLE {fence}
    ADD COLUMN fence_scheme TINYINT UNSIGNED NOT NULL DEFAULT 3 CHECK (fence_scheme = 3);
ALTER TABLE {fence} ALTER COLUMN fence_scheme DROP DEFAULT;
{create_floor};
{init_floor};
ALTER TABLE {fence} COMMENT = '{comment}';";

/// Takes lock $1, waiting up to $2 seconds in the server's queue (0: one attempt); `granted`
/// is 1 if it was. A statement of its own, before [`BUMP`], so no InnoDB lock (the floor's) is
/// held while the session waits.
pub(crate) const TAKE_LOCK: &str = "SELECT CAST(GET_LOCK(?, ?) AS SIGNED) AS granted";

/// The server's clock in microseconds since the Unix epoch, at the start of the statement:
/// `UTC_TIMESTAMP(6)` against the epoch, plain arithmetic on two datetimes, so neither the
/// session's time zone nor a daylight-saving change moves it (`UNIX_TIMESTAMP(NOW(6))` goes
/// through the session's zone, and an hour repeats in autumn).
const CLOCK_US: &str =
    "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS UNSIGNED)";

/// Mints the token of ($1, $2) for a session that holds its lock (taken by [`TAKE_LOCK`]):
/// `max(counter + 1, {clock})`, the server's clock in µs (fence scheme 3), where a new row's
/// counter is the floor. Atomic: one statement, one transaction, committed before the reply
/// while the lock is held; the floor is read with a shared lock, so it waits for a removal in
/// flight and then sees the raised floor. The token comes back as the reply's last-insert id
/// (LAST_INSERT_ID(expr)); 1 row affected: a new row, 2: an existing one, 0: the floor row is
/// missing. Binds: namespace, key, lock name, owner, ttl ms, lock name, owner, ttl ms.
const BUMP: &str = "INSERT INTO {fence}
        (namespace, `key`, lock_name, lock_id_scheme, token, owner, holder_id, ttl_ms, updated_at,
         fence_scheme)
    SELECT ?, ?, ?, {scheme}, LAST_INSERT_ID(GREATEST(f.floor_token + 1, {clock})), ?,
           CONNECTION_ID(), ?, NOW(6), 3
      FROM {floor} AS f
     WHERE f.one = 1
     LOCK IN SHARE MODE
    ON DUPLICATE KEY UPDATE
        token = LAST_INSERT_ID(GREATEST(token + 1, {clock})), lock_name = ?, owner = ?,
        holder_id = CONNECTION_ID(), ttl_ms = ?, updated_at = NOW(6)";

/// [`BUMP`] that also writes the holder's label (`owner:label`, or NULL), for a fence table
/// with the `label` column. Binds: namespace, key, lock name, owner, ttl ms, label, lock name,
/// owner, ttl ms, label.
const BUMP_LABELLED: &str = "INSERT INTO {fence}
        (namespace, `key`, lock_name, lock_id_scheme, token, owner, holder_id, ttl_ms, updated_at,
         fence_scheme, label)
    SELECT ?, ?, ?, {scheme}, LAST_INSERT_ID(GREATEST(f.floor_token + 1, {clock})), ?,
           CONNECTION_ID(), ?, NOW(6), 3, ?
      FROM {floor} AS f
     WHERE f.one = 1
     LOCK IN SHARE MODE
    ON DUPLICATE KEY UPDATE
        token = LAST_INSERT_ID(GREATEST(token + 1, {clock})), lock_name = ?, owner = ?,
        holder_id = CONNECTION_ID(), ttl_ms = ?, updated_at = NOW(6), label = ?";

/// Relabel: sets the label of ($2, $3) to $1 only while owner $4 with token $5 holds it (the
/// session that bumped the row still holds its lock). One statement, a compare-and-set; it
/// also moves `updated_at`, so a relabel to the same text still changes the row. 0 rows: lost.
const RELABEL: &str = "UPDATE {fence} SET label = ?, updated_at = NOW(6)
  WHERE namespace = ? AND `key` = ? AND owner = ? AND token = ?
    AND holder_id = IS_USED_LOCK(lock_name)";

/// Fence rows that look idle: not bumped for $1 microseconds and nobody holds their lock; at
/// most $2. A plain read, no locks taken: [`CONFIRM_IDLE`] checks again under the floor's lock.
const FIND_IDLE: &str = "SELECT namespace, `key` FROM {fence}
  WHERE updated_at < NOW(6) - INTERVAL ? MICROSECOND AND IS_FREE_LOCK(lock_name) = 1
  LIMIT ?";

/// The removal's first step: locks the floor row, so no bump of a new row runs until the
/// removal commits (bumps in flight finish first). Part of one transaction with
/// [`CONFIRM_IDLE`], [`RAISE_FLOOR`] and [`DELETE_ROWS`].
const LOCK_FLOOR: &str = "SELECT floor_token FROM {floor} WHERE one = 1 FOR UPDATE";

/// Of the rows `{pairs}` (namespace, key), those still idle ($last: the window in µs), locked
/// for the transaction, with their tokens. A key locked after this read cannot be bumped before
/// the commit (its bump waits for the floor), so it then starts above the raised floor.
const CONFIRM_IDLE: &str = "SELECT namespace, `key`, token FROM {fence}
  WHERE (namespace, `key`) IN ({pairs})
    AND updated_at < NOW(6) - INTERVAL ? MICROSECOND AND IS_FREE_LOCK(lock_name) = 1
  FOR UPDATE";

/// Raises the floor to $1, the highest token of the confirmed rows, in their transaction.
const RAISE_FLOOR: &str = "UPDATE {floor} SET floor_token = GREATEST(floor_token, ?) WHERE one = 1";

/// Deletes the confirmed rows `{pairs}`, in the same transaction.
const DELETE_ROWS: &str = "DELETE FROM {fence} WHERE (namespace, `key`) IN ({pairs})";

/// How many fence rows the table holds (every namespace). A single read.
const COUNT_ROWS: &str = "SELECT CAST(COUNT(*) AS SIGNED) AS fence_rows FROM {fence}";

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
/// that holder), and with `{label}` filled in by [`Statements::new`], the row's label where
/// the table has the column. A single read.
const STATUS: &str =
    "SELECT CAST(l.holder AS SIGNED) AS holder, CAST(f.token AS SIGNED) AS token, f.owner,
        CAST(f.holder_id AS SIGNED) AS holder_id, CAST(f.ttl_ms AS SIGNED) AS ttl_ms,
        p.COMMAND AS command, CAST(p.TIME AS SIGNED) AS silent_s{label}
   FROM (SELECT IS_USED_LOCK(?) AS holder) AS l
   LEFT JOIN {fence} f ON f.namespace = ? AND f.`key` = ?
   LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.holder";

/// `sql` with the fence and floor tables, this build's lock-id scheme and its comment filled
/// in.
fn fill(sql: &str, fence_table: &str, floor_table: &str) -> String {
    sql.replace("{fence}", fence_table)
        .replace("{floor}", floor_table)
        .replace("{clock}", CLOCK_US)
        .replace("{scheme}", &LOCK_ID_SCHEME.to_string())
        .replace("{comment}", &scheme_comment(LOCK_ID_SCHEME))
}

pub(crate) fn fence_table_ddl(fence_table: &str) -> String {
    fill(CREATE_FENCE_TABLE, fence_table, "")
}

pub(crate) fn label_column_ddl(fence_table: &str) -> String {
    fill(ADD_LABEL_COLUMN, fence_table, "")
}

pub(crate) fn floor_table_ddl(floor_table: &str) -> String {
    format!(
        "{};\n{};",
        fill(CREATE_FLOOR_TABLE, "", floor_table),
        fill(INIT_FLOOR, "", floor_table)
    )
}

/// [`UPGRADE_TO_FENCE_SCHEME_3`] for the fence table `table` in `database` (checked names:
/// identifier characters only, so they are safe inside quotes).
pub(crate) fn upgrade_to_fence_scheme_3(database: &str, table: &str) -> String {
    let sql = UPGRADE_TO_FENCE_SCHEME_3
        .replace("{create_floor}", CREATE_FLOOR_TABLE)
        .replace("{init_floor}", INIT_FLOOR)
        .replace("{database}", database)
        .replace("{table}", table);
    fill(
        &sql,
        &format!("`{database}`.`{table}`"),
        &format!("`{database}`.`{table}_floor`"),
    )
}

/// `(?, ?)` `n` times, comma-separated: the row list of [`CONFIRM_IDLE`] and [`DELETE_ROWS`].
fn pairs(n: usize) -> String {
    vec!["(?, ?)"; n].join(", ")
}

/// A page of listing: the fence rows of namespace ? whose key starts with ? (bytes, given
/// twice), after ?, in byte order, at most ?, whose named lock a session holds
/// (`IS_USED_LOCK`); the primary key's index serves the range. A single read.
const LIST: &str = "SELECT `key` FROM {fence}
  WHERE namespace = ? AND `key` >= ? AND LEFT(`key`, LENGTH(?)) = ? AND `key` > ?
    AND IS_USED_LOCK(lock_name) IS NOT NULL
  ORDER BY `key` LIMIT ?";

/// The statements with the fence table filled in.
pub(crate) struct Statements {
    pub(crate) bump: String,
    pub(crate) bump_labelled: String,
    pub(crate) relabel: String,
    pub(crate) add_label_column: String,
    pub(crate) status: String,
    pub(crate) status_labelled: String,
    pub(crate) create_fence_table: String,
    pub(crate) create_floor_table: String,
    pub(crate) init_floor: String,
    pub(crate) find_idle: String,
    pub(crate) lock_floor: String,
    confirm_idle: String,
    pub(crate) raise_floor: String,
    delete_rows: String,
    pub(crate) count_rows: String,
    pub(crate) list: String,
}

impl Statements {
    pub(crate) fn new(fence_table: &str, floor_table: &str) -> Self {
        let fill = |sql: &str| fill(sql, fence_table, floor_table);
        Statements {
            bump: fill(BUMP),
            bump_labelled: fill(BUMP_LABELLED),
            relabel: fill(RELABEL),
            add_label_column: fill(ADD_LABEL_COLUMN),
            status: fill(&STATUS.replace("{label}", "")),
            status_labelled: fill(&STATUS.replace("{label}", ", f.label")),
            create_fence_table: fill(CREATE_FENCE_TABLE),
            create_floor_table: fill(CREATE_FLOOR_TABLE),
            init_floor: fill(INIT_FLOOR),
            find_idle: fill(FIND_IDLE),
            lock_floor: fill(LOCK_FLOOR),
            confirm_idle: fill(CONFIRM_IDLE),
            raise_floor: fill(RAISE_FLOOR),
            delete_rows: fill(DELETE_ROWS),
            count_rows: fill(COUNT_ROWS),
            list: fill(LIST),
        }
    }

    /// [`CONFIRM_IDLE`] for `n` rows.
    pub(crate) fn confirm_idle(&self, n: usize) -> String {
        self.confirm_idle.replace("{pairs}", &pairs(n))
    }

    /// [`DELETE_ROWS`] for `n` rows.
    pub(crate) fn delete_rows(&self, n: usize) -> String {
        self.delete_rows.replace("{pairs}", &pairs(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_configured_table_and_no_placeholder_is_left() {
        let sql = Statements::new("`d`.`t`", "`d`.`t_floor`");
        for statement in [
            &sql.bump,
            &sql.status,
            &sql.create_fence_table,
            &sql.create_floor_table,
            &sql.init_floor,
            &sql.find_idle,
            &sql.lock_floor,
            &sql.confirm_idle(2),
            &sql.raise_floor,
            &sql.delete_rows(2),
            &sql.count_rows,
            &upgrade_to_fence_scheme_3("d", "t"),
        ] {
            assert!(statement.contains("`d`.`t"), "{statement}");
            for placeholder in [
                "{fence}",
                "{floor}",
                "{scheme}",
                "{comment}",
                "{pairs}",
                "{clock}",
                "{database}",
                "{table}",
                "{",
            ] {
                assert!(!statement.contains(placeholder), "{statement}");
            }
        }
        assert!(sql
            .create_fence_table
            .contains("COMMENT='fencelock fence table, lock-id scheme 2, fence scheme 3'"));
        assert!(upgrade_to_fence_scheme_3("d", "t")
            .contains("COMMENT = 'fencelock fence table, lock-id scheme 2, fence scheme 3'"));
        assert!(upgrade_to_fence_scheme_3("d", "t").contains("TABLE_NAME = 't'"));
        // Eight binds, in the order the store sends them.
        assert_eq!(sql.bump.matches('?').count(), 8);
        assert_eq!(sql.confirm_idle(3).matches('?').count(), 7);
        assert_eq!(sql.delete_rows(3).matches('?').count(), 6);
    }
}
