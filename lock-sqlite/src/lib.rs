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
//!   key only if it is free and mints its token in the same statement (see "Fencing tokens"); release is a
//!   compare-and-delete on owner and token; extend a compare-and-expire. SQLite runs each
//!   statement as one transaction under the database's single write lock, across every
//!   connection of every process, waiting up to the command timeout (`busy_timeout`) for it.
//! - **WAL mode**, so waiters and `status` read without waiting for the writer.
//! - **Tokens are durable**: `synchronous = FULL` fsyncs the WAL at every commit, so a token
//!   the store handed out survives a crash of any process and a power loss, and the next one is
//!   greater. What it costs: one `fsync` per acquire, release and extend (the benchmark shows
//!   the figure on this machine). `NORMAL` would skip it, and could hand a token out again
//!   after a power loss. Deleting the database file drops the counters, like dropping a
//!   PostgreSQL fence table: tokens then start again from the clock, greater than the old ones
//!   unless the clock stepped back.
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
//! - Tokens per key strictly increase, through crashes of any process, power loss, reboots and
//!   steps of the wall clock, as long as the file survives (`tests/processes.rs` and `tests/crash.rs` kill holders in
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
//! # Fencing tokens
//! A key's token is `max(its counter + 1, F)`, where `F` is the host's wall clock
//! (`CLOCK_REALTIME`) in microseconds since the Unix epoch, read by the acquiring process just
//! before it sends the statement that mints (SQLite is embedded: the client is the server), and
//! a key without a row counts from the floor (see "Per-key state"). So tokens strictly increase
//! per key whatever the clock does (the counter), and they follow the clock (about 1.8e15
//! today, below 2^63 for the next 290,000 years), as Redis's and every other store's default
//! layout do: a resource fenced under another store accepts this one's first token after a
//! swap, and the other way round, once the delay `D` below has passed. What a swap needs to
//! know about this store:
//! - **Granule `G` = 1 µs**: the clock is read in whole microseconds, nothing rounds it further.
//! - **Runahead** (how far a token can be ahead of the clock): none while the clock does not
//!   step back, since `F` is read before the mint and a key's counter needs a grant per µs to
//!   outrun it (each grant here is a committed, `fsync`ed statement, and the key must be freed
//!   in between). A step back of the wall clock by `s` (an NTP step, an operator's `date`)
//!   leaves the tokens minted before it up to `s` ahead until the clock catches up; the
//!   counter keeps them increasing meanwhile. The processes of one host share one clock: no
//!   skew between handles.
//! - **Swap delay `D`**: a store `B` that takes over from this one hands out a greater first
//!   token once `D > skew(this host's clock, B's clock) + runahead + G(B)` has passed between
//!   this store's last grant and `B`'s first; swapping into this store from `A`, `D > skew +
//!   runahead(A) + 1 µs`. `F` is read inside the acquire call, so a grant is never dated
//!   earlier than the call that asked for it.
//!
//! # Per-key state
//! The lock table holds one row per key held or locked within the retention window
//! (`retention`, 7 days by default, which must exceed `max_ttl`, 24 h by default), never one
//! per key ever locked. A release starts, at most once per tenth of the window (between 100 ms
//! and 10 minutes) and one at a time per handle, a background run that removes rows whose last
//! lease expired a window ago, or that an earlier boot left (nobody can hold them), in
//! transactions of at most 1,000 rows (an acquire waits for one such transaction at most). A
//! second table, `<table>_floor`, holds one row: the highest token any removed row had, raised
//! in the same transaction as the removal. A new row's token is `max(floor + 1, F)`, and
//! SQLite's single write lock orders every acquire before or after a removal, so a key whose
//! row was removed still gets a token greater than any it had, whatever the clock did: the
//! floor, not the clock, carries that guarantee. The window only keeps recently used rows (and
//! their counters) in place; it is measured on `CLOCK_MONOTONIC`, like expiry.
//!
//! **The smallest window.** With clock-floored tokens the key's next token after a removal
//! would be `F` alone without the floor, and the floor keeps this store sound anyway; but a
//! removal must not make tokens run ahead of the clock either (that would lengthen every swap's
//! `D`). A row goes once its expiry (the acquire's `CLOCK_MONOTONIC` reading plus the TTL,
//! moved later by each extend) is a window behind; its token was at most the wall clock read
//! just after that expiry's base, so at the removal the wall clock is past the token by at
//! least `TTL + retention − s`, `s` the clock's step back meanwhile. The floor then stays at or
//! below the clock as long as `retention ≥ G + max_skew + 1 ms` (1 ms for the gap between the
//! two readings), `max_skew` being the largest step back this store allows for: one second,
//! [`MAX_CLOCK_STEP_BACK`], the same default Redlock uses for its skew. It is not a URL option:
//! one host has one clock, no deployment tunes a skew between nodes here, and no guarantee but
//! the runahead depends on it. So `retention` below [`min_retention()`] (1002 ms) is refused
//! when the URL is read, as Redlock's is (`retention` must also exceed `max_ttl`). A larger
//! step back than that never repeats a token here (the counter and the floor), it only puts
//! the tokens up to the step ahead of the clock until the clock catches up: a swap to another
//! store within that time needs `D` to cover it.
//!
//! **Fence scheme 3** (clock-floored tokens): the lock table has a `fence_scheme` column, NOT
//! NULL without a default and checked to be 3, and SQLite checks it before it looks for a
//! conflicting row, so a build of an earlier scheme (1: no column, new rows start at 1; 2: the
//! column is 2, tokens are plain counters from the floor) cannot take any key in it, new or
//! not: it fails, it never mints. A table of scheme 1 or 2 is refused by
//! [`SqliteStore::connect`] with an [`Error::Store`](fencelock_core::Error) naming the fix:
//! stop every process of the older build and run [`SqliteConfig::fence_scheme_upgrade_sql`]
//! once. It rebuilds the table in one transaction, keeping the counters (and adding the floor
//! table where it is missing), so each key's next token is `max(counter + 1, F)`: one jump,
//! upward, to the clock, and a resource fenced under the old counters accepts it.
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
    min_retention, SqliteConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TABLE,
    MAX_CLOCK_STEP_BACK, MIN_TTL, TOKEN_GRANULE, URL_SCHEMES,
};
pub use descriptor::SQLITE;
pub use lockout::Lockout;
pub use store::SqliteStore;
