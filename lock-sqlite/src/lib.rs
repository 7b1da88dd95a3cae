//! fencelock in a SQLite file: locks shared by the processes of one host, with no server.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! use std::time::Duration;
//! use fencelock_core::{Acquire, Release};
//! use fencelock_sqlite::{SqliteConfig, SqliteStore};
//!
//! let config = SqliteConfig::from_url("sqlite:///var/lib/myapp/locks.db")?;
//! let store = SqliteStore::connect(config).await?;
//! let lease = store.acquire("nightly-export", Duration::from_secs(30), Duration::from_secs(5)).await?;
//! // ... every write carries lease.fencing_token() ...
//! store.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//! - **One row per key** in a table (default `fencelock_locks`, created if missing) holds the
//!   key's fencing counter and its holder: owner id, expiry, boot id. A key whose owner is NULL,
//!   whose expiry has passed or whose boot id is not this boot's is free.
//! - **Every step is one SQL statement** (see `sql.rs`): acquire is an upsert that takes the
//!   key only if it is free and bumps the counter in the same statement; release is a
//!   compare-and-delete on owner and token; extend a compare-and-expire. SQLite runs each
//!   statement as one transaction under the database's single write lock, across every
//!   connection of every process, waiting up to the command timeout (`busy_timeout`) for it.
//! - **WAL mode**, so waiters and `status` read without waiting for the writer.
//! - **Tokens are durable**: `synchronous = FULL` fsyncs the WAL at every commit, so a token
//!   the store handed out survives a crash of any process and a power loss, and the next one is
//!   greater. What it costs: one `fsync` per acquire, release and extend (the benchmark shows
//!   the figure on this machine). `NORMAL` would skip it, and could hand a token out again
//!   after a power loss. Deleting the database file restarts the counters, like dropping a
//!   PostgreSQL fence table.
//!
//! # Clocks and reboots
//! Expiry times are `CLOCK_MONOTONIC` readings, the clock of tokio's `Instant`: the store's
//! expiry and the holder's local deadline are read from one clock, the deadline first, so the
//! deadline never runs past the expiry. Wall time can jump; `CLOCK_BOOTTIME` keeps running in a
//! suspend while the holders' deadlines stand still, which would let a resumed holder trust a
//! lease the store had let go. With `CLOCK_MONOTONIC` a suspended machine pauses the store and
//! its holders alike (a lock held at suspend is held for the rest of its TTL after resume).
//! The clock restarts at boot, so every row records the boot id
//! (`/proc/sys/kernel/random/boot_id`): a lease from an earlier boot is dead, and the counters
//! carry on.
//!
//! # Waiting
//! A release commits, then writes a byte to `<database>-wake`, a file beside the database.
//! Every handle watches the database's directory with inotify (one task per handle, started by
//! the first wait), and its waiters re-read the key when that file is written; a waiter
//! otherwise wakes at the holder's expiry and at least every 500 ms (every 100 ms where inotify
//! cannot watch the directory, and then [`Capabilities::notified_wait`](fencelock_core::Capabilities)
//! is false). A lock freed by other means (a row edited by hand) is noticed by that fallback.
//! Waiters race for a released key: no fair queue.
//!
//! # When a holder dies or pauses
//! Its lease expires at its TTL, as with Redis: nothing frees it sooner (a holder's process
//! ending is not seen). A paused holder (SIGSTOP, a swapped-out process) past its TTL is
//! superseded by the next holder, with a greater token, and its next extend fails with
//! `LeaseLost`. A machine reboot frees every lock.
//!
//! # What is guaranteed
//! - At most one live lease per key among all processes of the host that open the same file
//!   (through any path that names the same file).
//! - Tokens per key strictly increase, through crashes of any process, power loss and reboots,
//!   as long as the file survives (`tests/processes.rs` and `tests/crash.rs` kill holders in
//!   the middle of a commit).
//! - A lease's local deadline is never later than its expiry in the table.
//!
//! # What is not
//! - One host only. A file on a network file system shared by two hosts is not supported:
//!   their clocks and boot ids differ, and SQLite's own locking is unreliable there.
//! - All processes must share one time namespace (containers with their own `CLOCK_MONOTONIC`
//!   offset would disagree on expiry); they share the boot id, which cannot tell.
//! - As with every lock, a holder that keeps working past its deadline is not stopped: check
//!   the fencing token at the resource.
//!
//! # Files
//! Beside `locks.db`: `locks.db-wal` and `locks.db-shm` (SQLite's), `locks.db-wake` (ours).
//! The directory must be writable by every process that uses the store.
//!
//! # Per-key state
//! The lock table holds one row per key held or locked within the retention window
//! (`retention`, 7 days by default, which must exceed `max_ttl`, 24 h by default), never one
//! per key ever locked. A release starts, at most once per tenth of the window (between 100 ms
//! and 10 minutes) and one at a time per handle, a background run that removes rows whose last
//! lease expired a window ago, or that an earlier boot left (nobody can hold them), in
//! transactions of at most 1,000 rows (an acquire waits for one such transaction at most). A
//! second table, `<table>_floor`, holds one row: the highest token any removed row had, raised
//! in the same transaction as the removal. A new row starts at the floor plus one, and SQLite's
//! single write lock orders every acquire before or after a removal, so a key whose row was
//! removed still gets a token greater than any it had. The window only keeps recently used
//! rows (and their counters) in place; it is measured on `CLOCK_MONOTONIC`, like expiry.
//!
//! Fence scheme 2: the lock table has a `fence_scheme` column, NOT NULL without a default, so a
//! build before this one (which would start a new row at 1) cannot insert a row in it. A table
//! such a build made is refused by [`SqliteStore::connect`] until
//! [`SqliteConfig::fence_scheme_upgrade_sql`] is run once: it rebuilds the table in one
//! transaction, keeping the counters, so tokens go on from where they were (no jump).
//! [`SqliteStore::stored_rows`] counts the rows (`lockctl stats`), and
//! [`SqliteStore::remove_idle_rows`] removes idle rows at once. `cargo test -p fencelock-sqlite
//! --all-features --test retention` locks 10,000 distinct keys (`FENCELOCK_KEYS=100000` for
//! more) and checks that one row is left after a 2 s window.
//!
//! # Bad input
//! A path that cannot be created or opened is [`Error::InvalidInput`](fencelock_core::Error) on the
//! `"url"`; a file that is not a SQLite database is [`Error::Store`](fencelock_core::Error); a
//! database that another connection keeps locked beyond the command timeout is a retryable
//! [`Error::Unavailable`](fencelock_core::Error) (the conformance suite's unreachable store, made
//! with [`SqliteStore::unreachable`] and [`Lockout`]). In every case nothing is left held.
//!
//! # Operator actions
//! [`LockStore::evict`](fencelock_core::LockStore::evict) frees a key whoever holds it (its counter
//! stays); the holder learns at its next extend.
//!
//! # The URL
//! `sqlite:///absolute/path.db` or `sqlite://relative/path.db`, with `table`,
//! `command_timeout`, `connect_timeout`, `retention` and `max_ttl`: see [`SqliteConfig`] for the grammar.
//!
//! # Cancel safety
//! Each operation is one statement that SQLite, once it was sent, runs to its end on the
//! connection's thread, whatever happens to the future. See each method's `# Cancel safety`.
#![warn(missing_docs)]

// Module order (each imports only from those before it): clock, keys, sql, config, error,
// lockout, watch, crash_hooks, cleanup, store, descriptor.
mod cleanup;
mod clock;
mod config;
#[cfg(feature = "crash-hooks")]
pub mod crash_hooks;
mod descriptor;
mod error;
mod keys;
mod lockout;
mod sql;
mod store;
mod watch;

pub use config::{
    SqliteConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TABLE, MIN_TTL,
    URL_SCHEMES,
};
pub use descriptor::SQLITE;
pub use lockout::Lockout;
pub use store::SqliteStore;
