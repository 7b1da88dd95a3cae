//! The SQL of the fencing pattern (docs/fencing.md), for one table of counters. These are the exact
//! statements the README shows and `tests/postgres.rs` runs, so every snippet there is tested.
//!
//! Placeholders: `$1` is the row's id, `$2` the lease's fencing token, `$3` a value computed by
//! the holder.

/// The table: the fence column keeps the highest token that claimed the row.
pub const CREATE_TABLE: &str = "CREATE TABLE counters (
  id    bigint PRIMARY KEY,
  value bigint NOT NULL,
  fence bigint NOT NULL DEFAULT 0
);";

/// A write computed by the database, checked and applied in one statement: safe with `<=`.
pub const INCREMENT: &str = "UPDATE counters SET value = value + 1, fence = $2
 WHERE id = $1 AND fence <= $2;";

/// The read of a read-modify-write: claims the row for `$2` and returns the value. No row back
/// means a newer holder claimed it.
pub const CLAIM: &str = "UPDATE counters SET fence = $2
 WHERE id = $1 AND fence <= $2
RETURNING value;";

/// The write of a read-modify-write: applied only while the row still carries the claim `$2`.
pub const WRITE_CLAIMED: &str = "UPDATE counters SET value = $3
 WHERE id = $1 AND fence = $2;";

/// The read of the transaction form: locks the row until commit, if no newer holder claimed it.
pub const LOCKED_READ: &str = "SELECT value FROM counters
 WHERE id = $1 AND fence <= $2
   FOR UPDATE;";

/// The write of the transaction form, in the same transaction as [`LOCKED_READ`].
pub const LOCKED_WRITE: &str = "UPDATE counters SET value = $3, fence = $2
 WHERE id = $1;";

/// UNSAFE, shown to be avoided: a plain read, whose later write checks the token only then.
pub const NAIVE_READ: &str = "SELECT value FROM counters WHERE id = $1;";

/// UNSAFE, shown to be avoided: the write after [`NAIVE_READ`]. A stale holder that writes
/// between a newer holder's read and write is accepted, and the newer holder's write then
/// overwrites it with a value computed before it: a lost update that passed every check.
pub const NAIVE_WRITE: &str = "UPDATE counters SET value = $3, fence = $2
 WHERE id = $1 AND fence < $2;";

/// Every statement above, for the test that docs/fencing.md shows only these.
pub const ALL: &[&str] = &[
    CREATE_TABLE,
    INCREMENT,
    CLAIM,
    WRITE_CLAIMED,
    LOCKED_READ,
    LOCKED_WRITE,
    NAIVE_READ,
    NAIVE_WRITE,
];
