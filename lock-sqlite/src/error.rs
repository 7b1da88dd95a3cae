//! sqlx's SQLite errors as [`fencelock_core::Error`]: which ones a caller may retry, and which name
//! a file that cannot serve as a lock database.

use std::path::Path;
use std::time::Duration;

use fencelock_core::Error;

// SQLite's primary result codes (the low byte of an extended code).
const SQLITE_PERM: i32 = 3;
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_NOTADB: i32 = 26;

/// The primary SQLite result code of `error`, if SQLite reported one.
fn primary_code(error: &sqlx::Error) -> Option<i32> {
    match error {
        sqlx::Error::Database(e) => e
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff),
        _ => None,
    }
}

/// Whether the same call may succeed later: the database was locked by another connection for
/// longer than the command timeout, or no connection of the handle's pool was free in time.
fn is_retryable(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::PoolTimedOut)
        || matches!(primary_code(error), Some(SQLITE_BUSY | SQLITE_LOCKED))
}

/// A failed statement during `what` on the database at `path` as a contract error.
///
/// - Locked by another connection beyond the command timeout (`SQLITE_BUSY`, `SQLITE_LOCKED`),
///   or no pooled connection in time: [`Error::Unavailable`], retryable.
/// - Not a database (`SQLITE_NOTADB`): [`Error::Store`] saying so.
/// - Cannot be opened or written (`SQLITE_CANTOPEN`, `SQLITE_READONLY`, `SQLITE_PERM`): an
///   [`Error::Store`] naming the file.
/// - Anything else: [`Error::Store`] with SQLite's message.
pub(crate) fn sql_error(what: &str, path: &Path, timeout: Duration, error: sqlx::Error) -> Error {
    let file = path.display();
    let what = match primary_code(&error) {
        Some(SQLITE_BUSY | SQLITE_LOCKED) => format!(
            "{what}: the database {file} stayed locked by another connection for longer than \
             the command timeout ({timeout:?})"
        ),
        Some(SQLITE_NOTADB) => format!("{what}: {file} is not a SQLite database"),
        Some(SQLITE_CANTOPEN) => format!(
            "{what}: cannot open or create the database {file} (and its -wal and -shm files \
             beside it)"
        ),
        Some(SQLITE_READONLY | SQLITE_PERM) => {
            format!("{what}: the database {file} cannot be written")
        }
        _ if matches!(error, sqlx::Error::PoolTimedOut) => {
            format!("{what}: no connection to {file} was free within {timeout:?}")
        }
        _ => format!("{what} on {file}"),
    };
    Error::from_client(&what, error, is_retryable)
}

/// A failure to open the database at `path` as a contract error: a path that cannot be
/// created or opened is bad input ([`Error::InvalidInput`] on the `"url"`: no retry will
/// help), anything else as [`sql_error`].
pub(crate) fn open_error(path: &Path, timeout: Duration, error: sqlx::Error) -> Error {
    if primary_code(&error) == Some(SQLITE_CANTOPEN) {
        return Error::invalid(
            "url",
            format!(
                "cannot open or create the SQLite database {} (the directory must be \
                 writable for its -wal and -shm files): {error}",
                path.display()
            ),
        );
    }
    sql_error("opening the database", path, timeout, error)
}
