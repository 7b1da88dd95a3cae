//! fencelock on PostgreSQL (14 or newer): session advisory locks, a durable fencing counter
//! and a lease whose TTL the server enforces.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! use std::time::Duration;
//! use fencelock_core::{Acquire, Release};
//! use fencelock_postgres::{PostgresConfig, PostgresStore};
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
//!   `pg_advisory_lock`) on a 64-bit id hashed from (fence table, namespace, key): see
//!   [`lock_id`] for the stable hash, lock-id scheme [`LOCK_ID_SCHEME`] (2). The fence table is
//!   part of the id so that a lock and its counter always come as a pair: handles with
//!   different `schema=` or `table=` never contend, like different namespaces.
//!   [`PostgresStore::try_acquire_raw`] takes a raw id instead, to interoperate with programs
//!   that call `pg_advisory_lock(id)` themselves; a raw id is one lock in the whole database,
//!   so its tokens are ordered across fence tables (see below).
//! - **One session per lease.** Each held lease owns a dedicated connection, carried inside the
//!   [`Lease`](fencelock_core::Lease). Advisory locks are reentrant per session, so sharing a session
//!   would let two leases on one key both be granted; here a session goes back to the store's
//!   idle list only after its release statement unlocked exactly the one lock it held.
//! - **The fencing token** is a per-key counter in a table (default
//!   `public.fencelock_fence`, created if missing), bumped by the same statement that takes the
//!   lock, after taking it, and committed with `synchronous_commit = on` before the reply. A
//!   crash cannot hand out a token twice: the client only ever sees committed, flushed tokens.
//!   (A sequence would not do: `nextval()` may lose increments in a crash.) The table is keyed
//!   by the key's bytes, so keys may contain NUL and a hash collision never merges two counters.
//!   A token is `max(counter + 1, the server's clock in µs since the Unix epoch)` (fence
//!   scheme 3): it keeps growing from another store's tokens after a swap (see "Tokens across
//!   a swap of stores"), and a key whose row was removed restarts above its last token (see
//!   "Per-key state"). Raw leases through different fence tables are ordered by that clock.
//! - **The TTL is enforced by the server**: the acquire statement sets `idle_session_timeout`
//!   to the TTL on the lease's session, and every extend (any statement) restarts that timer. A
//!   holder that stops talking (paused process, partition) loses its session — and its lock —
//!   the TTL after its last extend, though its connection is still open. A holder whose process
//!   dies frees the lock at once: the server ends the session when the connection closes. A
//!   shared or permit *waiter* is bounded the same way, by its own requested TTL (see "Shared
//!   leases and semaphore permits").
//! - **Extend** checks `pg_locks` for this backend and this lock, and fails with `LeaseLost`
//!   once the session is gone.
//! - **Watching** (see "When a lock is freed early"): while a handle holds leases, one task
//!   looks up their backends in `pg_stat_activity` and revokes a lease whose backend is gone.
//! - **Waiting** uses the server's lock queue: `pg_advisory_lock` under `lock_timeout`, so a
//!   waiter is woken by the release itself. After a lock timeout (SQLSTATE 55P03) the store
//!   checks `pg_locks` once more, since the lock can be granted in the very instant the timeout
//!   fires (a session lock survives the rolled-back statement); if it was, the grant completes.
//!
//! # Shared leases and semaphore permits
//! [`Acquire::try_acquire_as`](fencelock_core::Acquire::try_acquire_as) and
//! [`acquire_as`](fencelock_core::Acquire::acquire_as) keep [`Mode::Shared`] and
//! [`Mode::Permit`] as well (see [`Mode`] for the table), on the lease's own session like the
//! exclusive lock, with the same fence row (one counter per key, every mode) and the same
//! server-enforced TTL, which also bounds a waiter (see "What the server bounds" below).
//! Besides the key's lock `M`, a key has a few derived advisory locks
//! (ids hashed from `M`: a gate, a readers' lock, a permits' lock and one lock per slot):
//! - a **reader** holds `M` shared (`pg_try_advisory_lock_shared`) and the readers' lock
//!   shared;
//! - a **permit** holds `M` shared, the permits' lock shared and one slot lock, the lowest free
//!   of `0..limit` (`Lease::slot`);
//! - an exclusive lease holds `M` exclusively, as always, so it excludes both and both exclude
//!   it in PostgreSQL's lock manager.
//!
//! Readers and permits exclude each other, and permits check their limit, inside one
//! transaction per acquire under the key's gate (`pg_advisory_xact_lock`), so no two acquires'
//! checks interleave: it reads `pg_locks` for the other group, reads the limit recorded in
//! the fence row's `permit_limit` column while permits are held (another limit:
//! [`Error::LimitMismatch`](fencelock_core::Error::LimitMismatch); the first permit of a free
//! key records its own), takes its locks, bumps the fence and commits. Releases and ended
//! sessions only remove holders, so a check that sees one in the middle of going is
//! conservative (busy, or a mismatch while the last permit of another limit is going). A
//! release unlocks every advisory lock of the lease's session. Permits held continuously for
//! longer than the retention window with no new permit taken may have lost their row: new
//! permits then wait until that group is gone.
//!
//! **Writers first.** A waiting writer waits in `M`'s queue; PostgreSQL refuses a new shared
//! request that conflicts with a *waiting* request (`lock.c`: `conflictTab[mode] &
//! lock->waitMask`), so while a writer waits a reader's `pg_try_advisory_lock_shared` fails
//! (busy) and a waiting reader queues behind it; readers that hold keep their leases. A writer
//! that gives up (its `lock_timeout`) leaves the queue at once. `tests/modes.rs` checks this
//! on the server.
//!
//! **Waiting** in these modes is in the server's queue: first for `M` shared (behind any
//! writer), then, while the other group or a full semaphore stands in the way, for the
//! blocking group's lock or one slot's lock (chosen at random), at most 200 ms at a time, then
//! the waiter looks again: a slot freed elsewhere, or a group emptied by the server ending a
//! session, is noticed within that bound. A waiting reader therefore also keeps new permits
//! out, and the other way round, so neither group starves the other.
//!
//! **What the server bounds, and by what.** A mode acquire holds things before it has a lease:
//! the gate and an open transaction during each attempt, `M` shared from the moment the queue
//! grants it until its attempt, and, inside the attempt, the group's lock, a slot and an
//! uncommitted fence bump. Each is bounded by the server with the requested TTL, armed by the
//! statement that takes the lock: the gate's statement sets `idle_in_transaction_session_timeout`
//! (silence inside the attempt's transaction) and `idle_session_timeout` (silence between
//! statements) to the TTL, and the queue wait that keeps `M` sets both again. A waiting
//! acquire's refused attempt commits (it wrote nothing), so both stay armed for the rest of the
//! wait, across the next queue wait and a lock granted as its `lock_timeout` fires. A waiter
//! that stops talking (a stopped process, a client that stops reading) therefore loses its
//! session, and everything it held, one TTL after its last statement: the key is never kept
//! longer by a waiter than by a holder. A live waiter is never cut: it is silent only for a
//! round trip between statements (waits in a queue are statements, and the server's idle timers
//! do not run during a statement). When such a waiter runs again and finds its session ended, it
//! holds nothing and no lease was granted: it goes on waiting, within its wait, on a new
//! session. Once an attempt commits a grant, the lease's session keeps `idle_session_timeout` at
//! the TTL, restarted by each extend exactly as for an exclusive lease; its release (or a
//! waiter's giving up, or a lone `try_acquire_as` rolling back) sets both timers back to 0 before
//! the session idles in the pool. `tests/frozen_waiters.rs` freezes waiters at each stage.
//!
//! **Status** reports [`KeyStatus::Shared`](fencelock_core::KeyStatus::Shared) with the
//! count from `pg_locks` (the holders of the group's lock) and every holder; owner, token and
//! remaining time only for the holder that took the latest lease (the fence row keeps one),
//! slots for all permits. A waiter is never counted: a session that holds `M` shared without
//! its group's lock (granted in the queue, before its attempt) or that holds the gate (inside
//! an attempt, not yet committed) has no lease. With only such sessions the key is
//! [`KeyStatus::Free`](fencelock_core::KeyStatus::Free), although an exclusive request waits
//! for them (at most their TTL).
//!
//! **Upgrading a fence table made before permits.** New tables have the nullable
//! `permit_limit` column. On an older table exclusive and shared leases work unchanged, and
//! a permit request fails with a non-retryable [`Error::Store`](fencelock_core::Error::Store)
//! naming the fix: have the table's owner run [`PostgresConfig::permits_upgrade_sql`] once
//! (`ALTER TABLE … ADD COLUMN IF NOT EXISTS permit_limit integer`: no rewrite, no default;
//! older stores keep working beside it, and cannot take permits anyway). A handle checks the
//! column when it opens its first session: handles connected before the upgrade keep refusing
//! permits until they are replaced. No new rights are needed (the role's `UPDATE` must cover
//! the column if granted per column).
//!
//! [`Mode`]: fencelock_core::Mode
//! [`Mode::Shared`]: fencelock_core::Mode::Shared
//! [`Mode::Permit`]: fencelock_core::Mode::Permit
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
//! # When a lock is freed early
//! The lock lives exactly as long as the lease's server session, so these events free it
//! before the TTL, at once, and the next holder may take the key (with a greater token):
//! - the server ends the session: `pg_terminate_backend` (an administrator, or
//!   [`LockStore::evict`]), a server shutdown, restart or crash (a crash of any
//!   backend makes PostgreSQL end every session), a failover (the promoted server has no
//!   sessions);
//! - the connection breaks and the server notices: the holder's process exits or drops the
//!   [`Lease`](fencelock_core::Lease) unreleased (the socket closes), a TCP reset, or the server's
//!   own TCP keepalive (`tcp_keepalives_idle` and friends, two hours by default) giving up on a
//!   silent peer — set lower, it can end a partitioned holder's session before its TTL.
//!
//! A silent holder's session is ended by `idle_session_timeout` one TTL after its last extend:
//! that is the TTL, not early. Nothing else unlocks: the lease's session runs only this
//! store's statements (a pooling proxy that would share it is detected, see below).
//!
//! **How fast the holder finds out.** While a handle holds leases, one task per handle looks
//! up their backends (`SELECT … FROM pg_stat_activity WHERE pid = ANY($1)`, pid and start time)
//! every `min(1 s, TTL/6)` (the shortest TTL held; at least 10 ms), on a session of the handle's
//! own, and revokes ([`Lease::revocation`](fencelock_core::Lease::revocation)) each lease
//! whose backend is gone; [`KeepAlive`](fencelock_core::KeepAlive) then reports the loss at once.
//! So a holder learns within that period plus one query (a 30 s lease: about a second), not
//! at its next extend. The task holds only each lease's token and backend pid, never the
//! lease or its session; it runs only while leases are held (costing one session, reused from
//! the idle ones when there are) and stops when the last clone of the handle is dropped. When
//! it cannot reach the server (down, restarting) it concludes nothing, and the next extend
//! tells: within TTL/3 with keep-alive. `tests/watch.rs` measures the bound.
//!
//! # What is guaranteed
//! - At most one live lease per key (per advisory id) at any instant, across all clients of the
//!   server, as long as the server runs. A server crash or restart ends every session and so
//!   every lease; tokens stay monotonic across it.
//! - A key's tokens strictly increase while its fence row exists, whatever the clock does
//!   (`counter + 1`, committed durably), and across the removal of its row as long as the
//!   server's clock steps back by at most `max_skew` (see "Per-key state").
//! - A lease's local deadline (`sent_at + ttl − drift`) is never later than the moment the
//!   server kills its silent session: the server's idle timer starts only after the statement
//!   that granted or extended the lease has run, which is after `sent_at`, and it runs for the
//!   whole TTL (rounded up to milliseconds).
//! - A lease whose session the server ended is revoked within `min(1 s, TTL/6)` plus one
//!   query while the server answers the watch task's look-up.
//! - A waiter after a long wait gets its TTL restarted (one extra round trip), so its lease is
//!   not shortened by the time it waited.
//! - A shared or permit waiter that falls silent holds nothing for longer than its own TTL
//!   after its last statement (see "Shared leases and semaphore permits"). An exclusive waiter
//!   holds nothing before its grant, and the statement that grants it arms its TTL; a lock
//!   granted in the very instant its `lock_timeout` fires is armed by the store's next
//!   statement (the check described under "Waiting" above).
//!
//! # What is not
//! - Like every lock, no protection against a holder that keeps working after its deadline:
//!   check the fencing token at the resource.
//! - A lock is freed early when its session ends (see "When a lock is freed early"); the holder
//!   learns fast but afterwards, so, as always, the resource must check the fencing token.
//! - Two different keys can hash to the same id (chance 2⁻⁶⁴ per pair). That is false
//!   contention — the keys exclude each other — never a safety problem.
//! - The server's clock drives the TTL; the client's deadline is measured on the client. Rate
//!   differences between the two are covered by the drift margin (1% + 2 ms), as everywhere.
//! - Advisory locks live on one server: a failover to a replica loses every lock (the promoted
//!   server has no sessions), and the fence table only keeps monotonic tokens if replication is
//!   synchronous.
//! - A server clock that steps back by more than `max_skew` just after an idle row was removed
//!   can give that key a token that is not above its last one; raw leases through two fence
//!   tables, ordered by the clock alone, likewise. The resource refuses such a token
//!   (`StaleToken`): safe, but the key is unusable there until the clock has passed the old
//!   token.
//!
//! # Connection cost
//! Every held lease and every waiting acquire occupies one server connection (a backend
//! process, typically a few MB of server memory). One store handle has no limit of its own: the
//! server's `max_connections` is the limit, and beyond it acquire fails with a retryable
//! [`Error::Unavailable`](fencelock_core::Error::Unavailable). Released sessions are kept for reuse
//! (`max_idle`, default 16). Opening a session costs a TCP connect plus a backend fork (a few
//! milliseconds), paid again for every lease beyond the idle ones. The benchmark (`cargo run
//! --release -p fencelock-postgres --example bench`) holds 500 leases with keep-alive on one handle
//! and prints the connection count, the server memory per held session and the extend latency
//! under that load (each extend reads `pg_locks`, whose cost grows with the number of locks).
//! While a handle holds leases its watch task uses one more session.
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
//! [`LockStore::evict`] ends the session that holds a key, as an administrator's
//! `pg_terminate_backend` would: the key is free at once and the holder's lease is revoked
//! within its handle's watch period (its next extend or release fails in any case). For fault
//! tests and tooling; a lock holder never needs it.
//!
//! # Upgrading the lock-id scheme
//! The lock id of a key depends on the scheme: stores of two schemes lock different ids for
//! one key and do not exclude each other. So every fence table records its scheme, in the
//! name of a CHECK constraint on its `lock_id_scheme` column (`fencelock_lock_id_scheme_2`,
//! visible with `\d` in `psql`), and a store refuses to start (`connect`, or a lazy handle's
//! first operation, fails with a non-retryable [`Error::Store`](fencelock_core::Error::Store)
//! saying what to do) on a table that records another scheme. Scheme 1 (earlier builds of
//! this crate, lock ids from (namespace, key) only) recorded nothing; its tables have no
//! `lock_id_scheme` column and are refused the same way.
//!
//! From scheme 1 to scheme 2, on each fence table:
//! 1. Stop every store that uses the table (old binaries; a rolling upgrade would leave old and
//!    new holders of one key unaware of each other).
//! 2. Run [`PostgresConfig::lock_id_scheme_upgrade_sql`] once (one transaction; `psql` or
//!    `sqlx::raw_sql`). It adds the column and its constraint; the counters stay, so tokens
//!    keep growing.
//! 3. Start the new binaries.
//!
//! The column has no default, so an old binary started by mistake after step 2 cannot bump a
//! counter: its acquires fail (a not-null violation) instead of granting locks that new
//! holders do not see. A new table is created at scheme 2 directly.
//!
//! # Per-key state
//! The fence table holds one row per key bumped within the retention window (`retention`, 7
//! days by default, which must exceed `max_ttl`, 24 h by default, and be at least
//! [`PostgresConfig::min_retention`]), never one per key ever locked: a release spawns, at most
//! once per tenth of the window (between 100 ms and 10 min), a background run that deletes rows
//! not bumped for a window (and whose token the clock has passed, see below), in statements of
//! at most 1,000 rows that skip locked rows (`FOR UPDATE SKIP LOCKED`), on a session of its
//! own. No acquire
//! waits for it beyond one batch touching the very row it bumps, and it never waits for an
//! acquire. [`PostgresStore::fence_rows`] counts the rows (`lockctl stats` shows it);
//! [`PostgresStore::remove_idle_fences`] runs a removal at once. Locks themselves leave
//! nothing behind: an advisory lock lives in its session.
//!
//! **Tokens after a row went (fence scheme 3).** A token is `max(counter + 1, F)`, where `F`
//! is the server's clock (`clock_timestamp()`) in whole µs since the Unix epoch, read once by
//! the statement that bumps, after it took the key's lock. While a key's row exists its tokens
//! grow by the counter whatever the clock does; a key whose row was removed starts again at
//! `F` alone. So the removal deletes a row only if, besides not having been bumped for the
//! window, its token is at least [`PostgresConfig::min_retention`] (a granule plus `max_skew`
//! plus 1 ms) below the server's clock at the removing statement's start
//! (`statement_timestamp()`), and no session holds or waits for the key's lock in `pg_locks`
//! (read after that start). Every bump takes its key's lock before it reads the clock, so a
//! bump that `pg_locks` does not show reads the clock after the removal started: at least that
//! reading less a step back of at most `max_skew`, so more than 1 ms above the removed token.
//! A bump that committed meanwhile is seen by `FOR UPDATE`'s recheck of the newest row
//! version. A row whose token is ahead of the clock (`counter + 1` winning after the clock
//! stepped back, or a table copied to a server whose clock is behind) is kept until the clock
//! has passed it. The window is what lets rows go: a row not bumped for `retention` holds a
//! token `retention` behind the clock (unless the clock stepped back since), so with
//! `retention` at least `min_retention` the check holds as soon as the window has passed, and
//! [`PostgresConfig::from_url`] refuses a shorter window (1002 ms with the default `max_skew`
//! of 1 s; see [`PostgresConfig`] for why `max_skew` is a URL option). What a larger step back
//! does is under "What is not".
//!
//! **Upgrading from fence scheme 1 or 2.** Earlier builds minted plain counters (1, 2, 3, … per
//! key, fence scheme 1, recording nothing) or floored them at the bumping transaction's id
//! (fence scheme 2, constraint `fencelock_fence_scheme_2`); both are far below the clock, so a
//! key whose row this build removed would restart below its last token under an older store.
//! A new table records fence scheme 3 in a CHECK constraint on its `fence_scheme` column
//! (`fencelock_fence_scheme_3`), next to the lock-id scheme, and a store refuses a table that
//! records another ([`Error::Store`](fencelock_core::Error::Store) naming the fix). The lock ids
//! do not change, so lock-id scheme 2 stays. On each existing fence table: stop every store
//! that uses it, run [`PostgresConfig::fence_scheme_upgrade_sql`] once (one transaction, no
//! table rewrite, counters kept), start the new binaries. Each key's next token then jumps
//! once, upward, from its counter to the clock (about 1.8 × 10¹⁵ µs today). The upgrade drops
//! the `fence_scheme` column and adds it again without a default and with the new constraint,
//! so an older store started by mistake afterwards fails every bump, on a new key and on an
//! existing one alike (PostgreSQL checks the proposed row before the conflict): a fence-scheme-1
//! build with a not-null violation, a fence-scheme-2 build with a check violation, and the
//! latter refuses to start on the table, which records a scheme it does not know. None of them
//! mints. A table still at lock-id scheme 1 gets both columns from
//! [`PostgresConfig::lock_id_scheme_upgrade_sql`]. `cargo test -p fencelock-postgres
//! --all-features --test retention` locks 10,000 distinct keys (`FENCELOCK_KEYS=100000` for
//! more) with a short window and counts the rows back down.
//!
//! # Tokens across a swap of stores
//! Every fencelock store in its default layout mints `max(previous token + 1, F)`, `F` a clock
//! in µs since the Unix epoch rounded down to the store's granule, so a resource fenced under
//! one store accepts the next store's first lease, with no reset, once the swap waited long
//! enough. For this store:
//! - **Granule `G` = 1 µs** ([`TOKEN_GRANULE`]): `F` is the server's clock in whole µs, read
//!   by the statement that mints. The server's clock, never a client's: the hosts that run the
//!   clients do not enter `D`.
//! - **Runahead** (how far a token can be ahead of the server's clock when it is minted): none
//!   while the clock never steps back, since a key's grants are serialised by its lock and each
//!   commits durably, far slower than one per µs, so `counter + 1` never outruns the clock by
//!   itself. Otherwise the largest step back of the server's clock since the key's last tokens
//!   were minted: an NTP step, a failover to a replica whose clock is behind the old primary's;
//!   `max_skew` where the deployment keeps that promise. Counters from a table upgraded from
//!   fence scheme 1 or 2 are far below the clock and add nothing.
//! - **The delay `D`.** A swap from store A to this store keeps tokens increasing if this
//!   store's first grant comes at least `D` after A's last grant, with
//!   `D > skew(A's clock, this server's clock) + runahead(A) + 1 µs`; a swap from this store
//!   to B needs `D > skew + runahead(this server) + G(B)`. Why: A's last token is at most A's
//!   clock at that grant plus `runahead(A)`; `D` later, A's clock has moved on by `D`, and B's
//!   first token is at least B's clock less `G(B)`, which is at least A's clock less the skew
//!   less `G(B)`: above it. Back again (A → B → A) is the same argument the other way; a
//!   counter kept by A only adds. With this server's clock kept by NTP (skew to another NTP
//!   host of a few ms, no step back), a few ms plus the other store's granule is enough.
//!
//! This store has no interop layout: every key and raw id mints as above, and no URL option
//! changes its tokens. A resource fenced by something other than a fencelock store must be
//! fenced afresh.
//!
//! # The URL
//! `postgres://` or `postgresql://`, with libpq's usual parameters (`sslmode`, `user`,
//! `password`, …) and this store's own options (`namespace`, `schema`, `table`,
//! `connect_timeout`, `command_timeout`, `max_idle`, `retention`, `max_ttl`, `max_skew`,
//! `create_table`):
//! see [`PostgresConfig`].
//!
//! # Server requirements
//! PostgreSQL 14 or newer (`idle_session_timeout`, `client_connection_check_interval`). The
//! role needs `CONNECT` on the database (PostgreSQL grants it to `PUBLIC` by default),
//! `USAGE` on the fence table's schema, and `SELECT`, `INSERT`, `UPDATE` and `DELETE` on the
//! table; `connect` checks the four and refuses a role lacking one, naming it and its
//! `GRANT`. It needs `CREATE` on the schema only to create the table the first time; an
//! administrator can instead run [`PostgresConfig::fence_table_ddl`] once, and
//! `create_table=false` ([`PostgresConfig::with_create_table`]) then makes sure the store never
//! tries. Advisory locks, `idle_session_timeout`, reading `pg_locks`, `pg_constraint` and
//! `pg_stat_activity`, and ending its own role's backends (a cancelled waiter's, or a holder's
//! for [`LockStore::evict`]) need no grant; evicting a holder of another role needs
//! `pg_signal_backend`. `cargo test -p fencelock-postgres --all-features --test
//! least_privilege` runs the conformance suite as such a role.
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
    PostgresConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IDLE,
    DEFAULT_MAX_SKEW, DEFAULT_NAMESPACE, DEFAULT_SCHEMA, DEFAULT_TABLE, MIN_TTL, TOKEN_GRANULE,
};
pub use descriptor::POSTGRES;
pub use keys::{lock_id, pg_locks_ids, raw_key_name, FENCE_SCHEME, LOCK_ID_SCHEME};
pub use store::PostgresStore;
