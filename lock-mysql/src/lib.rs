//! fencelock on MySQL and MariaDB: named locks (`GET_LOCK`), a durable fencing counter and a
//! lease whose TTL the server enforces.
//!
//! Tested on MariaDB 10.11 only (Debian 12 ships no MySQL server). Nothing here is
//! MariaDB-only, except that MySQL counts `GET_LOCK`'s wait in whole seconds: on MySQL a
//! waiting acquire may wait up to a second longer than asked before it times out.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! use std::time::Duration;
//! use fencelock_core::{Acquire, Release};
//! use fencelock_mysql::{MysqlConfig, MysqlStore};
//!
//! let config = MysqlConfig::from_url("mysql://app@db.internal/app?namespace=billing")?;
//! let store = MysqlStore::connect(config).await?;
//! let lease = store.acquire("nightly-export", Duration::from_secs(30), Duration::from_secs(5)).await?;
//! // ... every write carries lease.fencing_token() ...
//! store.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//! - **The lock** is a named lock, `GET_LOCK(name, timeout)` / `RELEASE_LOCK(name)`, held by
//!   the lease's server session. Names are server-wide and at most 64 characters, so the name
//!   is a hash of (database, fence table, namespace, key): see [`lock_name`] for the stable
//!   hash, lock-id scheme [`LOCK_ID_SCHEME`] (2, the layout of the PostgreSQL store's scheme
//!   2). Handles with different databases, `table=` or `namespace=` never contend.
//! - **One session per lease.** Each held lease owns a dedicated connection, carried inside the
//!   [`Lease`](fencelock_core::Lease). `GET_LOCK` is reentrant per session, so sharing a session
//!   would let two leases on one key both be granted; here a session takes at most one lock,
//!   once, and goes back to the store's idle list only after its release statement freed that
//!   lock and `RELEASE_ALL_LOCKS()` found nothing else.
//! - **The fencing token** is a per-key counter in an InnoDB table (default
//!   `<database>.fencelock_fence`, created if missing), bumped on the lease's session right
//!   after `GET_LOCK` granted the lock (a statement of its own, so the wait holds no InnoDB
//!   lock), while the session holds it, and committed before the reply; a session that ends in
//!   between frees the lock and hands out no token. The token is `max(counter + 1, the server's
//!   clock in µs)` (see "Fencing tokens"); a new row counts from the floor table (see
//!   "Per-key state"). The table is keyed by the key's bytes, so keys may
//!   contain NUL and a hash collision never merges two counters. A crash cannot hand out a
//!   token twice as long as the server makes every commit durable
//!   (`innodb_flush_log_at_trx_commit=1`, the default; the store logs a warning otherwise).
//! - **The TTL is enforced by the server**: the session's `wait_timeout` is set to the TTL in
//!   whole seconds (rounded up; [`Capabilities`](fencelock_core::Capabilities) declares the
//!   one-second granularity, and the shortest TTL is [`MIN_TTL`], one second), and every
//!   extend (any statement) restarts that timer. A holder that stops talking (paused process,
//!   partition) loses its session — and its lock — the TTL after its last extend, though its
//!   connection is still open. A holder whose process dies frees the lock at once: the server
//!   ends the session when the connection closes.
//! - **Extend** asks `IS_USED_LOCK(name)` and fails with `LeaseLost` unless this session holds
//!   the lock.
//! - **Watching** (see "When a lock is freed early"): while a handle holds leases, one task
//!   looks up their sessions in `information_schema.PROCESSLIST` and revokes a lease whose
//!   session is gone.
//! - **Waiting** uses the server's queue: `GET_LOCK` with the remaining wait as its timeout,
//!   so a waiter is woken by the release itself. The wait is a statement of its own, which
//!   touches no table.
//!
//! # Fencing tokens
//! A key's token is `max(its counter + 1, F)`, where `F` is the **server's** wall clock in
//! microseconds since the Unix epoch (`UTC_TIMESTAMP(6)` against the epoch, read at the start
//! of the minting statement: no time zone or daylight-saving change moves it), and a key
//! without a row counts from the floor (see "Per-key state"). So tokens strictly increase per
//! key whatever the clock does (the counter), and they follow the clock (about 1.8e15 today,
//! far below 2^63), as Redis's and every other store's default layout do: a resource fenced
//! under another store accepts this one's first token after a swap, and the other way round,
//! once the delay `D` below has passed. What a swap needs to know about this store:
//! - **Granule `G` = 1 µs**: the server's clock is read in whole microseconds.
//! - **Runahead** (how far a token can be ahead of the server's clock): none while that clock
//!   does not step back, since `F` is read in the minting statement and a key's counter needs
//!   more than a grant per µs to outrun it (each grant is a `GET_LOCK` and a committed bump,
//!   and the key must be freed in between). A step back of the server's clock by `s` (an NTP
//!   step, an operator's `date`), or a failover to a server whose clock is `s` behind, leaves
//!   the tokens minted before it up to `s` ahead until the clock catches up; the counter keeps
//!   them increasing meanwhile. Clients' clocks play no part: every client of the server mints
//!   from one clock.
//! - **Swap delay `D`**: a store `B` that takes over from this one hands out a greater first
//!   token once `D > skew(this server's clock, B's clock) + runahead + G(B)` has passed
//!   between this store's last grant and `B`'s first; swapping into this store from `A`,
//!   `D > skew + runahead(A) + 1 µs`. `F` is read during the acquire call (after `GET_LOCK`
//!   granted), so a grant is never dated earlier than the call that asked for it.
//!
//! # Per-key state
//! The fence table holds one row per key held or bumped within the retention window
//! (`retention`, 7 days by default, which must exceed `max_ttl`, 24 h by default), never one
//! per key ever locked. A release starts, at most once per tenth of the window (between 100 ms
//! and 10 minutes) and one at a time per handle, a background run on its own session: a plain
//! read (no locks) finds up to 1,000 rows not bumped for the window whose lock is free
//! (`IS_FREE_LOCK`), then one short transaction locks the floor table's row
//! (`<table>_floor`, `FOR UPDATE`), checks those rows again under row locks, raises the floor to
//! their highest token and deletes them; at most 10 such batches a run. The bump reads the
//! floor with a shared lock (`LOCK IN SHARE MODE`, so also under `READ COMMITTED`): a bump in
//! flight delays the removal's floor lock until it commits (milliseconds: it never waits for a
//! lock), and a bump that comes during a removal waits for its commit and then sees the raised
//! floor. A key locked after the removal's check cannot be bumped before the floor is raised,
//! so its new row's token, `max(floor + 1, F)`, is above every removed token: a key whose row
//! went still gets a greater token, whatever the clock did; the floor, not the clock, carries
//! that guarantee. The window only keeps recently used counters in place; it is measured on
//! the server's clock (`updated_at`, `NOW(6)`).
//!
//! **The smallest window.** With clock-floored tokens the key's next token after a removal
//! would be `F` alone without the floor, and the floor keeps this store sound anyway; but a
//! removal must not make tokens run ahead of the clock either (that would lengthen every
//! swap's `D`). A row goes once the server's clock is a window past its last bump (`updated_at`
//! and `F` are the same statement's start), and its token was at most `F` then, so at the
//! removal the clock is past the token by at least the window less `s`, the clock's step back
//! meanwhile. The floor then stays at or below the clock as long as the window is at least
//! `G + max_skew + 1 ms` (1 ms: the design's margin between the two readings, one here),
//! `max_skew` being the largest step back this store allows for: one second,
//! [`MAX_CLOCK_STEP_BACK`], the same default Redlock uses for its skew. It is not a URL option:
//! one server's clock mints and measures idleness, no deployment tunes a skew between nodes
//! here, and no guarantee but the runahead depends on it. So `retention` below
//! [`min_retention()`] (1002 ms) is refused when the URL is read, as Redlock's is. A larger
//! step back than that never repeats a token here (the counter and the floor), it only puts
//! the tokens up to the step ahead of the clock until the clock catches up: a swap to another
//! store within that time needs `D` to cover it.
//!
//! **Fence scheme 3** (clock-floored tokens): the fence table's comment records it
//! (`fencelock fence table, lock-id scheme 2, fence scheme 3`), and its `fence_scheme` column
//! is NOT NULL without a default and checked to be 3. A build of an earlier scheme refuses a
//! table with that comment (it takes it for a table it did not make), and its bump cannot
//! write a row, new or existing: scheme 1 writes no `fence_scheme`, scheme 2 writes 2, and the
//! server checks the row it would insert before it looks for a duplicate (the CHECK is
//! enforced by MariaDB 10.2 and MySQL 8.0.16 and later; on an older MySQL 8 only the comment
//! stops such a build, at its next connection, so stop it first). It fails; it never mints.
//! A table of fence scheme 1 or 2 is refused (`connect`, or a lazy handle's first operation,
//! fails with [`Error::Store`](fencelock_core::Error::Store) naming the fix) until
//! [`MysqlConfig::fence_scheme_upgrade_sql`] is run once, with the older stores stopped: it
//! puts the checked column in place of the old one, adds the floor table where it is missing
//! and records the scheme in the comment; counters are kept, so each key's next token is
//! `max(counter + 1, F)`: one jump, upward, to the clock, which a resource fenced under the old
//! counters accepts. [`MysqlStore::fence_rows`] counts the rows (`lockctl stats`) and
//! [`MysqlStore::remove_idle_fences`] removes idle ones at once. `cargo test -p fencelock-mysql
//! --all-features --test retention` locks 10,000 distinct keys (`FENCELOCK_KEYS=100000` for
//! more) and checks that one row is left after a 2 s window.
//!
//! # When a lock is freed early
//! The lock lives exactly as long as the lease's server session, so these events free it
//! before the TTL, at once, and the next holder may take the key (with a greater token):
//! - the server ends the session: `KILL` (an administrator, or [`LockStore::evict`]), a
//!   server shutdown, restart or crash, a failover (the promoted server has no sessions);
//! - the connection breaks and the server notices: the holder's process exits or drops the
//!   [`Lease`](fencelock_core::Lease) unreleased (the socket closes), or a TCP reset.
//!
//! A silent holder's session is ended by `wait_timeout` one TTL after its last extend: that is
//! the TTL, not early. Nothing else unlocks: the lease's session runs only this store's
//! statements.
//!
//! **How fast the holder finds out.** While a handle holds leases, one task per handle looks
//! up their sessions (`SELECT … FROM information_schema.PROCESSLIST`, connection id and client
//! address) every `min(1 s, TTL/6)` (the shortest TTL held), on a session of the handle's own,
//! and revokes [`Lease::revocation`](fencelock_core::Lease::revocation) of each lease whose
//! session is gone; [`KeepAlive`](fencelock_core::KeepAlive) then reports the loss at once. So a
//! holder learns within that period plus one query, not at its next extend. When the task
//! cannot reach the server it concludes nothing, and the next extend tells: within TTL/3
//! with keep-alive. `tests/faults.rs` measures the bound.
//!
//! # What is guaranteed
//! - At most one live lease per key at any instant, across all clients of the server, as long
//!   as the server runs. A restart ends every session and so every lease; tokens stay
//!   monotonic across it (and across a crash, with durable commits), and across steps of the
//!   server's clock.
//! - A lease's local deadline (`sent_at + ttl − drift`) is never later than the moment the
//!   server ends its silent session: the idle timer starts only after the statement that
//!   granted or extended the lease has run, which is after `sent_at`, and it runs for the
//!   whole TTL.
//! - A lease whose session the server ended is revoked within `min(1 s, TTL/6)` plus one
//!   query while the server answers the watch task's look-up.
//! - A waiter after a long wait gets its TTL restarted (one extra round trip), so its lease is
//!   not shortened by the time it waited.
//!
//! # What is not
//! - Like every lock, no protection against a holder that keeps working after its deadline:
//!   check the fencing token at the resource.
//! - Two different keys can hash to the same name (chance 2⁻¹⁶⁰ per pair): false contention,
//!   never a safety problem.
//! - Fairness: waiters are not promised to be served oldest first
//!   ([`Capabilities::fair_queue`](fencelock_core::Capabilities) is off).
//! - Named locks live on one server: a failover to a replica loses every lock, and the fence
//!   table only keeps monotonic tokens if replication is semi-synchronous or synchronous.
//!
//! # Connection cost
//! Every held lease and every waiting acquire occupies one server connection (one server
//! thread). One store handle has no limit of its own: the server's `max_connections` (151 by
//! default) is the limit, and beyond it acquire fails with a retryable
//! [`Error::Unavailable`](fencelock_core::Error::Unavailable). Size it for the leases held at once
//! plus waiters plus your application's own connections. Released sessions are kept for reuse
//! (`max_idle`, default 16); an idle session whose `wait_timeout` (the last lease's TTL) is
//! half spent is closed rather than reused. While a handle holds leases its watch task uses
//! one more session.
//!
//! # Cancel safety
//! Every operation on a lease runs on the lease's own session, every acquire on a session the
//! future owns. Dropping an acquire future closes its connection, and a waiting acquire also
//! kills its session (`KILL CONNECTION`, from a spawned task): the server does not notice a
//! closed connection while a session waits in `GET_LOCK`, and `KILL QUERY` would not do, since
//! the lock may already have been granted. See each method's `# Cancel safety`.
//!
//! # Operator actions
//! [`LockStore::evict`] kills the session that holds a key, as an administrator's `KILL`
//! would: the key is free at once and the holder's lease is revoked within its handle's watch
//! period. For fault tests and tooling; a lock holder never needs it.
//!
//! # Lock-id scheme
//! The lock name of a key depends on the scheme, so every fence table records its scheme in
//! its comment (`fencelock fence table, lock-id scheme 2, fence scheme 3`, shown by
//! `SHOW CREATE TABLE`), and a store refuses to start (`connect`, or a lazy handle's first operation, fails with a
//! non-retryable [`Error::Store`](fencelock_core::Error::Store)) on a table that records another
//! scheme or none.
//!
//! # The URL
//! `mysql://` or `mariadb://`, with user, password, host, port and the database that holds the
//! fence table, and this store's options (`namespace`, `table`, `connect_timeout`,
//! `command_timeout`, `max_idle`, `retention`, `max_ttl`, `create_table`, `sslmode`, and for TLS `tls_ca`,
//! `tls_cert`, `tls_key`, the names the other stores use, or the libpq names `sslrootcert`,
//! `sslcert`, `sslkey`): see [`MysqlConfig`]. `tls_ca` alone means `sslmode=verify-full`: the
//! server's certificate must chain to that CA and name the URL's host.
//!
//! # Server requirements
//! MySQL 8 or MariaDB 10.3 or newer (`RELEASE_ALL_LOCKS`, `KILL` with an expression), InnoDB.
//! The user needs `CREATE` on the database the first time (or create the tables yourself with
//! [`MysqlConfig::fence_table_ddl`] and [`MysqlConfig::floor_table_ddl`], and connect with
//! `create_table=false` ([`MysqlConfig::with_create_table`]) so the store never tries), then
//! `SELECT`, `INSERT`, `UPDATE` and `DELETE` on both; it
//! sees and kills its own sessions in the process list, which is all the store needs.
//!
//! [`LockStore::evict`]: fencelock_core::LockStore::evict
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): keys, sql, config, error, session, cleanup, watch, store, descriptor.
mod cleanup;
mod config;
mod descriptor;
mod error;
mod keys;
mod session;
mod sql;
mod store;
mod watch;

pub use config::{
    min_retention, MysqlConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IDLE,
    DEFAULT_NAMESPACE, DEFAULT_TABLE, MAX_CLOCK_STEP_BACK, MIN_TTL, TOKEN_GRANULE,
};
pub use descriptor::MYSQL;
pub use keys::{lock_name, LOCK_ID_SCHEME};
pub use store::MysqlStore;
