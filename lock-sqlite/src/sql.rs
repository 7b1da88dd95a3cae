//! The SQL, one statement per atomic step, as named constants with one line each on why it is
//! atomic, and the statements with the lock table filled in.
//!
//! `{table}` stands for the quoted lock table, `{floor}` for its floor table. Every statement runs on its own in autocommit
//! mode: SQLite makes one statement one transaction, taking the database's single write lock
//! for its whole run (waiting up to the command timeout for it). The connections run at
//! `synchronous = NORMAL` in WAL mode: a commit reaches the disk at the next checkpoint, except
//! a grant whose token ran ahead of the clock, whose WAL the store syncs before it answers
//! (`FULL`, every commit synced, with `durable_grants=true`).
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds read by the caller just before sending (see
//! `clock.rs`), bound as parameters: SQLite has no monotonic clock of its own. The token's
//! clock floor is the wall clock in µs, read and bound the same way (SQLite's own `'now'`
//! counts milliseconds).

/// The fence scheme this build writes and reads: tokens are clock-floored (see the crate docs,
/// "Fencing tokens"). Recorded in the lock table as the CHECK on `fence_scheme`.
pub(crate) const FENCE_SCHEME: i64 = 3;

/// The lock table: one row per key locked within the retention window (or held), holding the
/// key's durable fencing counter and its current holder. `fence_scheme` records fence scheme 3
/// (clock-floored tokens; a new row starts above the floor): it has no default and is checked to
/// be 3, and SQLite checks it before it looks for a conflicting row, so a build of an earlier
/// scheme (which writes no scheme, or 2) cannot take a key at all, new or not. `owner` is NULL
/// while nobody holds the key; a holder recorded under another boot, or whose expiry has passed,
/// holds nothing. The key is stored as the bytes of its UTF-8 (a BLOB), so any character, NUL
/// included, is data. `label` is the holder's label, prefixed with its owner id (see
/// [`ACQUIRE`]); a table made before labels gets the column from [`ADD_LABEL`].
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    key        BLOB    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL,
    owner      TEXT,
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL,
    ttl_ms     INTEGER NOT NULL,
    pid        INTEGER NOT NULL,
    fence_scheme INTEGER NOT NULL CHECK (fence_scheme = 3),
    label      TEXT
) WITHOUT ROWID";

/// Whether the lock table has the `label` column (?1: the unquoted table name). A single read.
const HAS_LABEL: &str = "SELECT count(*) FROM pragma_table_info(?1) WHERE name = 'label'";

/// Adds the `label` column to a lock table made before labels. Atomic: one statement; a
/// connection that lost the race to add it gets "duplicate column name", which is success.
/// Rows of earlier builds have none, and a build that does not know the column leaves it as
/// it was when it takes a key: which is why a label is stored behind its owner's id, and
/// reported only while that owner holds the key.
const ADD_LABEL: &str = "ALTER TABLE {table} ADD COLUMN label TEXT";

/// The floor table: one row, the highest token any removed row of the lock table had. A new
/// row starts above it, so a key whose row was removed still gets a greater token.
const CREATE_FLOOR: &str = "CREATE TABLE IF NOT EXISTS {floor} (
    one   INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
    floor INTEGER NOT NULL
)";

/// The floor's one row, at 0 for a new table. Atomic: one statement; a row already there stays.
const INIT_FLOOR: &str = "INSERT OR IGNORE INTO {floor} (one, floor) VALUES (1, 0)";

/// The statement that made the lock table, as SQLite keeps it: [`recorded_fence_scheme`] reads
/// the scheme from it. ?1 is the unquoted table name. A single read.
const TABLE_SQL: &str = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1";

/// Removes at most ?3 rows idle for the retention window, returning their tokens: rows of
/// another boot than ?1 (nobody holds them) and rows whose expiry is at or before ?2 (now minus
/// the window, which exceeds every TTL, so they are not held either). Runs in one transaction
/// with [`RAISE_FLOOR`], see there.
const REMOVE_IDLE: &str = "DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE boot_id <> ?1 OR expires_ns <= ?2 LIMIT ?3
) RETURNING token";

/// Raises the floor to ?1 (the highest token [`REMOVE_IDLE`] removed). Atomic with it: both run
/// in one transaction under SQLite's write lock, so no acquire sees a row gone and the floor
/// still below its token.
const RAISE_FLOOR: &str = "UPDATE {floor} SET floor = max(floor, ?1) WHERE one = 1";

/// How many rows the lock table holds. A single read.
const COUNT_ROWS: &str = "SELECT count(*) FROM {table}";

/// Takes key ?1 for owner ?2 (boot ?3, now ?4, for ?5 ns; ?6 ms and pid ?7 for `status`; ?9
/// its label behind its owner id, or NULL) if nobody holds it, and mints its token:
/// `max(counter + 1, ?8)`, ?8 being the wall clock in µs (fence scheme 3); a new row's counter
/// is the floor. Atomic: one statement under the write
/// lock, so the floor read, the holder check, the take and the mint commit together or not at
/// all. No row back: held.
const ACQUIRE: &str =
    "INSERT INTO {table} AS l (key, token, owner, boot_id, expires_ns, ttl_ms, pid, fence_scheme, label)
VALUES (?1, max((SELECT f.floor + 1 FROM {floor} AS f WHERE f.one = 1), ?8),
        ?2, ?3, ?4 + ?5, ?6, ?7, 3, ?9)
ON CONFLICT (key) DO UPDATE
   SET token = max(l.token + 1, ?8), owner = excluded.owner, boot_id = excluded.boot_id,
       expires_ns = excluded.expires_ns, ttl_ms = excluded.ttl_ms, pid = excluded.pid,
       label = excluded.label
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

/// Relabel: sets the label of key ?1 to ?6 (behind its owner id) only if it is still held by
/// owner ?2 with token ?3, of boot ?4, not expired at ?5. Atomic: one statement, a
/// compare-and-set. No row changed: lost.
const RELABEL: &str = "UPDATE {table} SET label = ?6
 WHERE key = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ns > ?5";

/// Operator action: clears whoever holds key ?1 (of boot ?2, live at ?3); the counter stays.
/// Atomic: one statement. One row changed: a live lease was evicted.
const EVICT: &str = "UPDATE {table} SET owner = NULL
 WHERE key = ?1 AND owner IS NOT NULL AND boot_id = ?2 AND expires_ns > ?3";

/// The row of key ?1, for waiting and `status`; the caller judges whether its holder is live.
/// A single read, which WAL mode serves without waiting for writers.
const HOLDER: &str =
    "SELECT token, owner, boot_id, expires_ns, ttl_ms, label FROM {table} WHERE key = ?1";

/// A page of listing: the keys with a holder, live or not, that start with ?1 (bytes), after ?2,
/// in byte order, at most ?3; the primary key's index serves the range. A single read.
const LIST: &str = "SELECT key FROM {table}
 WHERE key >= ?1 AND substr(key, 1, length(?1)) = ?1 AND key > ?2 AND owner IS NOT NULL
 ORDER BY key LIMIT ?3";

/// What journal mode the database is in: the store needs `wal`. A single read.
pub(crate) const JOURNAL_MODE: &str = "PRAGMA journal_mode";

/// The file SQLite opened for the main database, symlinks resolved as SQLite resolves them: its
/// WAL is this name with `-wal` added. A single read.
pub(crate) const MAIN_FILE: &str = "SELECT file FROM pragma_database_list WHERE name = 'main'";

/// Rebuilds a lock table of fence scheme 1 (no `fence_scheme`) or 2 (`fence_scheme = 2`) as
/// fence scheme 3, counters kept, and adds the floor table where it is missing. SQLite can
/// change neither a CHECK nor add a NOT NULL column without a default, so the rows move to a
/// new table ({create_upgrade}: [`CREATE_TABLE`] under the new table's name). Atomic: one
/// transaction (`BEGIN IMMEDIATE` takes the write lock first, so no acquire runs in between).
const UPGRADE_TO_FENCE_SCHEME_3: &str = "BEGIN IMMEDIATE;
{create_upgrade};
INSERT INTO {upgrade} (key, token, owner, boot_id, expires_ns, ttl_ms, pid, fence_scheme)
    SELECT key, token, owner, boot_id, expires_ns, ttl_ms, pid, 3 FROM {table};
DROP TABLE {table};
ALTER TABLE {upgrade} RENAME TO {table};
{create_floor};
{init_floor};
COMMIT;";

/// The fence scheme the lock table made by `create_sql` records: 3 (this build's) if it checks
/// `fence_scheme = 3`, 2 if it has a `fence_scheme` column checked otherwise, 1 if it has none.
/// Spaces and case are ignored; the text is the one this crate's builds wrote.
pub(crate) fn recorded_fence_scheme(create_sql: &str) -> i64 {
    let text: String = create_sql
        .chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect();
    if text.contains(&format!("check(fence_scheme={FENCE_SCHEME})")) {
        FENCE_SCHEME
    } else if text.contains("fence_scheme") {
        2
    } else {
        1
    }
}

/// `sql` with the lock table and its floor table filled in.
fn fill(sql: &str, table: &str) -> String {
    sql.replace("{table}", &quote(table))
        .replace("{floor}", &quote(&format!("{table}_floor")))
        .replace("{upgrade}", &quote(&format!("{table}_upgrade")))
}

/// A checked table name (plain identifier characters) quoted for SQL.
fn quote(table: &str) -> String {
    format!("\"{table}\"")
}

/// The statements that upgrade `table` (unquoted) from fence scheme 1 or 2, for the operator.
pub(crate) fn upgrade_to_fence_scheme_3(table: &str) -> String {
    let create_upgrade = CREATE_TABLE.replace("IF NOT EXISTS {table}", "{upgrade}");
    let statement = UPGRADE_TO_FENCE_SCHEME_3
        .replace("{create_upgrade}", &create_upgrade)
        .replace("{create_floor}", CREATE_FLOOR)
        .replace("{init_floor}", INIT_FLOOR);
    fill(&statement, table)
}

/// The statements with the lock table filled in.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) create_table: String,
    pub(crate) create_floor: String,
    pub(crate) init_floor: String,
    pub(crate) table_sql: &'static str,
    pub(crate) remove_idle: String,
    pub(crate) raise_floor: String,
    pub(crate) count_rows: String,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) relabel: String,
    pub(crate) has_label: &'static str,
    pub(crate) add_label: String,
    pub(crate) evict: String,
    pub(crate) holder: String,
    pub(crate) list: String,
}

impl Statements {
    /// The statements for the lock table `table` (unquoted, already checked).
    pub(crate) fn new(table: &str) -> Self {
        let fill = |sql: &str| fill(sql, table);
        Statements {
            create_table: fill(CREATE_TABLE),
            create_floor: fill(CREATE_FLOOR),
            init_floor: fill(INIT_FLOOR),
            table_sql: TABLE_SQL,
            remove_idle: fill(REMOVE_IDLE),
            raise_floor: fill(RAISE_FLOOR),
            count_rows: fill(COUNT_ROWS),
            acquire: fill(ACQUIRE),
            release: fill(RELEASE),
            extend: fill(EXTEND),
            relabel: fill(RELABEL),
            has_label: HAS_LABEL,
            add_label: fill(ADD_LABEL),
            evict: fill(EVICT),
            holder: fill(HOLDER),
            list: fill(LIST),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_configured_table_and_no_placeholder_is_left() {
        let sql = Statements::new("t");
        for statement in [
            &sql.create_table,
            &sql.create_floor,
            &sql.init_floor,
            &sql.remove_idle,
            &sql.raise_floor,
            &sql.count_rows,
            &upgrade_to_fence_scheme_3("t"),
            &sql.acquire,
            &sql.release,
            &sql.extend,
            &sql.relabel,
            &sql.add_label,
            &sql.evict,
            &sql.holder,
        ] {
            assert!(
                statement.contains("\"t\"") || statement.contains("\"t_floor\""),
                "{statement}"
            );
            assert!(!statement.contains('{'), "{statement}");
        }
        assert!(upgrade_to_fence_scheme_3("t").contains("CREATE TABLE \"t_upgrade\" ("));
    }

    #[test]
    fn the_recorded_fence_scheme_is_read_from_the_table_statement() {
        assert_eq!(recorded_fence_scheme(&Statements::new("t").create_table), 3);
        let scheme_2 = CREATE_TABLE.replace("fence_scheme = 3", "fence_scheme = 2");
        assert_eq!(recorded_fence_scheme(&scheme_2), 2);
        let scheme_1 = "CREATE TABLE t (key BLOB NOT NULL PRIMARY KEY, token INTEGER NOT NULL)";
        assert_eq!(recorded_fence_scheme(scheme_1), 1);
        // As SQLite keeps it after the upgrade's rename.
        let renamed = "CREATE TABLE \"t\" (fence_scheme INTEGER NOT NULL CHECK(FENCE_SCHEME=3))";
        assert_eq!(recorded_fence_scheme(renamed), 3);
    }
}
