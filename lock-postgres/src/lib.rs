//! fencelock on PostgreSQL (14 or newer): session advisory locks, a durable fencing counter
//! and a lease whose TTL the server enforces.
//!
//! ```no_run
//! # async fn demo() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{Acquire, Release};
//! use lock_postgres::{PostgresConfig, PostgresStore};
//!
//! let config = PostgresConfig::from_url("postgres://app@db.internal/app?namespace=billing")?;
//! let store = PostgresStore::connect(config).await?;
//! let lease = store.acquire("nightly-export", Duration::from_secs(30), Duration::from_secs(5)).await?;
//! // ... every write carries lease.fencing_token() ...
//! store.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//! - **The lock** is a session-level advisory lock (`pg_try_advisory_lock` /
//!   `pg_advisory_lock`) on a 64-bit id hashed from (namespace, key): see [`lock_id`] for the
//!   stable, versioned hash. [`PostgresStore::try_acquire_raw`] takes a raw id instead, to
//!   interoperate with programs that call `pg_advisory_lock(id)` themselves.
//! - **One session per lease.** Each held lease owns a dedicated connection, carried inside the
//!   [`Lease`](lock_core::Lease). Advisory locks are reentrant per session, so sharing a session
//!   would let two leases on one key both be granted; here a session goes back to the store's
//!   idle list only after its release statement unlocked exactly the one lock it held.
//! - **The fencing token** is a per-key counter in a table (default
//!   `public.fencelock_fence`, created if missing), bumped by the same statement that takes the
//!   lock, after taking it, and committed with `synchronous_commit = on` before the reply. A
//!   crash cannot hand out a token twice: the client only ever sees committed, flushed tokens.
//!   (A sequence would not do: `nextval()` may lose increments in a crash.) The table is keyed
//!   by the key's bytes, so keys may contain NUL and a hash collision never merges two counters.
//! - **The TTL is enforced by the server**: the acquire statement sets `idle_session_timeout`
//!   to the TTL on the lease's session, and every extend (any statement) restarts that timer. A
//!   holder that stops talking (paused process, partition) loses its session — and its lock —
//!   the TTL after its last extend, though its connection is still open. A holder whose process
//!   dies frees the lock at once: the server ends the session when the connection closes.
//! - **Extend** checks `pg_locks` for this backend and this lock, and fails with `LeaseLost`
//!   once the session is gone.
//! - **Waiting** uses the server's lock queue: `pg_advisory_lock` under `lock_timeout`, so a
//!   waiter is woken by the release itself. After a lock timeout (SQLSTATE 55P03) the store
//!   checks `pg_locks` once more, since the lock can be granted in the very instant the timeout
//!   fires (a session lock survives the rolled-back statement); if it was, the grant completes.
//!
//! # Fairness
//! Waiters are served in the order their wait reached the server, and a `try_acquire` never
//! jumps the queue. This is PostgreSQL's lock manager (`lock.c`, `proc.c`): a new request that
//! conflicts with a *waiter's* request must queue even if the lock is momentarily free
//! (`conflictTab[mode] & lock->waitMask`), a new waiter is appended at the tail unless it
//! already holds a lock on the same object (a session here never does: a session holds at most
//! the one lock of its lease, and waits only while it holds none), and a release grants the lock
//! to the head of the queue before anyone else can ask. The one exception is the deadlock
//! detector, which may reorder a queue to break a cycle; a cycle needs a waiter that holds a
//! lock another waits for, and a waiting session holds only a `ROW EXCLUSIVE` lock on the fence
//! table, which only DDL on that table conflicts with. `tests/sessions.rs` checks the order with
//! staggered waiters, and the conformance case `fair_queue_serves_the_oldest_waiter_first` runs.
//!
//! # What is guaranteed
//! - At most one live lease per key (per advisory id) at any instant, across all clients of the
//!   server, as long as the server runs. A server crash or restart ends every session and so
//!   every lease; tokens stay monotonic across it.
//! - A lease's local deadline (`sent_at + ttl − drift`) is never later than the moment the
//!   server kills its silent session: the server's idle timer starts only after the statement
//!   that granted or extended the lease has run, which is after `sent_at`, and it runs for the
//!   whole TTL (rounded up to milliseconds).
//! - A waiter after a long wait gets its TTL restarted (one extra round trip), so its lease is
//!   not shortened by the time it waited.
//!
//! # What is not
//! - Like every lock, no protection against a holder that keeps working after its deadline:
//!   check the fencing token at the resource.
//! - Two different keys can hash to the same id (chance 2⁻⁶⁴ per pair). That is false
//!   contention — the keys exclude each other — never a safety problem.
//! - The server's clock drives the TTL; the client's deadline is measured on the client. Rate
//!   differences between the two are covered by the drift margin (1% + 2 ms), as everywhere.
//! - Advisory locks live on one server: a failover to a replica loses every lock (the promoted
//!   server has no sessions), and the fence table only keeps monotonic tokens if replication is
//!   synchronous.
//!
//! # Connection cost
//! Every held lease and every waiting acquire occupies one server connection (a backend
//! process, typically a few MB of server memory). One store handle has no limit of its own: the
//! server's `max_connections` is the limit, and beyond it acquire fails with a retryable
//! [`Error::Unavailable`](lock_core::Error::Unavailable). Released sessions are kept for reuse
//! (`max_idle`, default 16). Opening a session costs a TCP connect plus a backend fork (a few
//! milliseconds), paid again for every lease beyond the idle ones. The benchmark (`cargo run
//! --release -p lock-postgres --example bench`) holds 500 leases with keep-alive on one handle
//! and prints the connection count, the server memory per held session and the extend latency
//! under that load (each extend reads `pg_locks`, whose cost grows with the number of locks).
//!
//! An acquire that cannot reach the server fails at once with `Unavailable`: its wait bound is
//! only ever spent waiting for the lock.
//!
//! # PgBouncer and other pooling proxies
//! Session advisory locks, `idle_session_timeout` and the startup options this store sends
//! need a real server session. Through PgBouncer in `transaction` or `statement` pooling mode,
//! a lock would be taken on a server connection that other clients then use. The store detects
//! it — every acquire and extend compares the backend pid with the one the session started
//! with, and fails with a store error naming the proxy — but only after the fact. Connect
//! directly, or through `pool_mode=session`.
//!
//! # Cancel safety
//! Every operation on a lease runs on the lease's own session, every acquire on a session the
//! future owns. Dropping an acquire future closes its connection, and a waiting acquire also
//! terminates its backend from a spawned task: a dropped waiter never takes the lock later. See
//! each method's `# Cancel safety`.
//!
//! # Operator actions
//! [`PostgresStore::terminate_holder`] ends the session that holds a key, as an administrator's
//! `pg_terminate_backend` would: the key is free at once and the holder finds out at its next
//! extend or release. For fault tests and tooling; a lock holder never needs it.
//!
//! # The URL
//! `postgres://` or `postgresql://`, with libpq's usual parameters (`sslmode`, `user`,
//! `password`, …) and this store's own options (`namespace`, `schema`, `table`,
//! `connect_timeout`, `command_timeout`, `max_idle`): see [`PostgresConfig`].
//!
//! # Server requirements
//! PostgreSQL 14 or newer (`idle_session_timeout`, `client_connection_check_interval`). The
//! role needs `CREATE` on the schema the first time (or create the table yourself with
//! [`PostgresConfig::fence_table_ddl`]), then `SELECT`, `INSERT` and `UPDATE` on
//! the table, and may read `pg_locks` and `pg_stat_activity` (everyone can).
#![warn(missing_docs)]

mod config;
mod key;
mod session;
mod store;
mod watch;

use std::time::Duration;

pub use config::{
    PostgresConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IDLE,
    DEFAULT_NAMESPACE, DEFAULT_SCHEMA, DEFAULT_TABLE,
};
pub use key::{lock_id, pg_locks_ids, raw_key_name, LOCK_ID_SCHEME};
pub use store::PostgresStore;

/// The shortest TTL this store accepts. A shorter lease would spend most of its life on the
/// round trips and the durable commit of its own acquire.
pub const MIN_TTL: Duration = Duration::from_millis(100);
