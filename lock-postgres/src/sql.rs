//! The SQL, one statement per atomic step, as named constants with one line each on why it is
//! atomic, and the statements with the fence table filled in.

use crate::keys::{FENCE_SCHEME, LOCK_ID_SCHEME};

// ---- SQL ------------------------------------------------------------------------------------
// `{fence}` stands for the quoted fence table, `{scheme}` for the lock-id scheme
// (LOCK_ID_SCHEME), `{fence_scheme}` for the token scheme (FENCE_SCHEME) and
// `{unsynced_grants}` for `true`, or `false` with `durable_grants=true`. Every statement runs in
// autocommit: one statement, one transaction, committed with synchronous_commit=on (a session
// setting) before the reply, except a grant whose token is the clock reading it was minted from:
// see `grant_commit!`.

/// The backend of a new session, to detect a pooling proxy later and to tell it from a later
/// backend with its pid. A single read.
pub(crate) const SESSION_INFO: &str = "SELECT pg_backend_pid() AS pid,
        (SELECT (extract(epoch FROM backend_start) * 1000000)::int8 FROM pg_stat_activity
          WHERE pid = pg_backend_pid()) AS started_us";

/// Which of the backends $1 (pids) still exist, with their start times: the watch task's look
/// for sessions the server ended. A single read.
pub(crate) const LIVE_BACKENDS: &str =
    "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 AS started_us
       FROM pg_stat_activity WHERE pid = ANY($1::int4[])";

/// Ends a cancelled waiter's backend ($1), only while it still waits for lock $2. One statement.
pub(crate) const TERMINATE_WAITER: &str = "SELECT pg_terminate_backend(pid) FROM pg_locks
  WHERE pid = $1 AND locktype = 'advisory' AND NOT granted AND objsubid = 1
    AND classid = (($2::int8 >> 32) & 4294967295)::oid
    AND objid = ($2::int8 & 4294967295)::oid";

/// Whether the schema ($1) and the fence table ($2) exist, the lock-id schemes the table
/// records (the suffixes of its CHECK constraints named `fencelock_lock_id_scheme_<n>`) and its
/// token schemes (`fencelock_fence_scheme_<n>`), the session's role, and whether that role may
/// SELECT, INSERT, UPDATE (on the table or on any of its columns) and DELETE (NULL without
/// the table), and whether the table has the `permit_limit` column. A single read.
pub(crate) const FENCE_TABLE_STATE: &str =
    "SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL,
            ARRAY(SELECT substr(conname::text, 26) FROM pg_constraint
                   WHERE conrelid = to_regclass($2) AND contype = 'c'
                     AND starts_with(conname::text, 'fencelock_lock_id_scheme_')
                   ORDER BY 1),
            ARRAY(SELECT substr(conname::text, 24) FROM pg_constraint
                   WHERE conrelid = to_regclass($2) AND contype = 'c'
                     AND starts_with(conname::text, 'fencelock_fence_scheme_')
                   ORDER BY 1),
            current_user::text,
            has_any_column_privilege(to_regclass($2), 'SELECT'),
            has_any_column_privilege(to_regclass($2), 'INSERT'),
            has_any_column_privilege(to_regclass($2), 'UPDATE'),
            has_table_privilege(to_regclass($2), 'DELETE'),
            EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($2)
                     AND attname = 'permit_limit' AND NOT attisdropped),
            EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($2)
                     AND attname = 'label' AND NOT attisdropped)";

/// The fence table: one durable counter per key (the key itself, as bytes, not its hash, so a
/// hash collision never merges two counters), plus who took it last, for `status`. The
/// `lock_id_scheme` column records the scheme in the name of its CHECK constraint, and has no
/// default, so a store older than the column (scheme 1, other lock ids) cannot bump a counter
/// here: its acquire fails instead of granting a lock that this scheme's holders do not see.
/// `fence_scheme` does the same for the token scheme: a store of an earlier token scheme
/// (plain counters, or transaction-id floors) fails the column's NOT NULL or CHECK constraint
/// on every bump, so it never restarts a key whose row was removed below this scheme's tokens.
const CREATE_FENCE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {fence} (
    namespace      text        NOT NULL,
    key            bytea       NOT NULL,
    lock_id        bigint      NOT NULL,
    lock_id_scheme smallint    NOT NULL
        CONSTRAINT fencelock_lock_id_scheme_{scheme} CHECK (lock_id_scheme = {scheme}),
    fence_scheme   smallint    NOT NULL
        CONSTRAINT fencelock_fence_scheme_{fence_scheme} CHECK (fence_scheme = {fence_scheme}),
    token          bigint      NOT NULL,
    owner          text        NOT NULL,
    holder_pid     integer     NOT NULL,
    ttl_ms         bigint      NOT NULL,
    updated_at     timestamptz NOT NULL,
    permit_limit   integer,
    label          text,
    PRIMARY KEY (namespace, key)
)";

/// Adds the column that keeps the holder's label (`label`, behind its owner's id) to a fence
/// table made before labels. Nullable and without a default, as `permit_limit`: no rewrite, and
/// stores that do not know the column keep working beside it.
const ADD_LABEL: &str = "ALTER TABLE {fence} ADD COLUMN IF NOT EXISTS label text";

/// Adds the column that records a semaphore's limit (`permit_limit`) to a fence table made
/// before permits existed. Nullable and without a default: no rewrite, and stores that do not
/// know the column keep working beside it (their statements name their columns).
const ADD_PERMIT_LIMIT: &str = "ALTER TABLE {fence} ADD COLUMN IF NOT EXISTS permit_limit integer";

/// Moves a fence table made by a scheme-1 store to scheme {scheme}: the counters stay. Atomic:
/// one transaction, so the table is never left half-upgraded. Only with every older store
/// stopped (see the crate docs, "Upgrading the lock-id scheme").
const UPGRADE_FROM_SCHEME_1: &str = "BEGIN;
ALTER TABLE {fence} ADD COLUMN lock_id_scheme smallint NOT NULL DEFAULT {scheme}
    CONSTRAINT fencelock_lock_id_scheme_{scheme} CHECK (lock_id_scheme = {scheme});
ALTER TABLE {fence} ALTER COLUMN lock_id_scheme DROP DEFAULT;
ALTER TABLE {fence} ADD COLUMN fence_scheme smallint NOT NULL DEFAULT {fence_scheme}
    CONSTRAINT fencelock_fence_scheme_{fence_scheme} CHECK (fence_scheme = {fence_scheme});
ALTER TABLE {fence} ALTER COLUMN fence_scheme DROP DEFAULT;
COMMIT;
";

/// Moves a fence table of lock-id scheme {scheme} whose tokens an earlier build minted (fence
/// scheme 1, plain counters, no `fence_scheme` column; or fence scheme 2, transaction-id floors)
/// to fence scheme {fence_scheme}: the counters stay, and the next token of each key jumps once,
/// upward, to the server's clock. The column is dropped and added again with the new
/// constraint (no table rewrite: a constant default, then dropped), so an older store's bump,
/// which names the column with its own scheme or leaves it out, fails its CHECK or NOT NULL
/// constraint on both paths of its upsert (PostgreSQL checks the proposed row before the
/// conflict) instead of minting. Atomic: one transaction. Only with every older store stopped.
const UPGRADE_FENCE_SCHEME: &str = "BEGIN;
ALTER TABLE {fence} DROP COLUMN IF EXISTS fence_scheme;
ALTER TABLE {fence} ADD COLUMN fence_scheme smallint NOT NULL DEFAULT {fence_scheme}
    CONSTRAINT fencelock_fence_scheme_{fence_scheme} CHECK (fence_scheme = {fence_scheme});
ALTER TABLE {fence} ALTER COLUMN fence_scheme DROP DEFAULT;
COMMIT;
";

/// Removes up to $2 fence rows last bumped more than $1 ms ago whose token is at least $3 µs
/// (the smallest retention window, a granule plus `max_skew` plus 1 ms) below the server's
/// clock, skipping rows that are locked and rows whose key's lock (`lock_id`) anybody holds or
/// waits for. Atomic: one statement. Why a key whose row went restarts above it: the clock is
/// read at the statement's start (`statement_timestamp()`), before `pg_locks` is; every bump
/// takes its key's lock before it reads the clock for its token, so a bump missing from
/// `pg_locks` reads the clock after this statement's start: at least that reading less a step
/// back of at most `max_skew`, above the row's token. A bump seen there keeps its row, and one
/// that committed meanwhile is seen by `FOR UPDATE`'s recheck of the newest row. Returns the
/// number of rows removed.
const REMOVE_IDLE_FENCES: &str = "WITH gone AS (
    DELETE FROM {fence} WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {fence}
         WHERE updated_at < statement_timestamp() - make_interval(secs => $1::int8 / 1000.0)
           AND token <= floor(extract(epoch FROM statement_timestamp()) * 1000000)::int8 - $3::int8
           AND lock_id NOT IN (SELECT (l.classid::int8 << 32) | l.objid::int8 FROM pg_locks l
                                WHERE l.locktype = 'advisory' AND l.objsubid = 1
                                  AND l.database = (SELECT oid FROM pg_database
                                                     WHERE datname = current_database()))
         LIMIT $2::int8
         FOR UPDATE SKIP LOCKED))
    RETURNING 1)
SELECT count(*)::int8 AS removed FROM gone";

/// How many fence rows the table holds. A single read.
const COUNT_FENCES: &str = "SELECT count(*)::int8 AS fences FROM {fence}";

/// Bumps the fence of the key whose lock this session has just taken. Used inside the acquire
/// statements, after the lock, never on its own. The token is `max(counter + 1, F)` (fence
/// scheme 3), `F` the server's clock in µs since the Unix epoch, read once per bump, after the
/// lock (the subquery over `$source`, kept apart by `OFFSET 0` so that its one reading feeds both
/// the token and `updated_at`). `counter + 1` keeps a key's tokens strictly increasing whatever
/// the clock does; `F` lets a key whose row was removed (see [`REMOVE_IDLE_FENCES`]) restart
/// above its last token, and tokens continue from another store's clock-floored ones after a
/// swap. A raw id (namespace '') is one lock whatever the fence table: its leases through two
/// tables are ordered by `F`.
macro_rules! bump_fence {
    ($source:literal) => {
        bump_fence!($source, returning: concat!("f.token, ", at_clock!("f"), " AS at_clock"))
    };
    // The same bump as the statement itself, whose RETURNING list (after the bumped row's
    // columns are set) is `$returning`: no CTE and outer SELECT to carry the row.
    ($source:literal, returning: $returning:expr) => {
        concat!(
            "INSERT INTO {fence} AS f (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at{label_column})
             SELECT $2::text, $3::bytea, $1::int8, {scheme}, {fence_scheme},
                    floor(extract(epoch FROM now.at) * 1000000)::int8,
                    $5::text, pg_backend_pid(), $4::int8, now.at{label_value}
               FROM (SELECT clock_timestamp() AS at FROM ",
            $source,
            " OFFSET 0) AS now
             ON CONFLICT (namespace, key) DO UPDATE
                SET token = GREATEST(f.token + 1, EXCLUDED.token),
                    lock_id = EXCLUDED.lock_id, owner = EXCLUDED.owner,
                    holder_pid = EXCLUDED.holder_pid, ttl_ms = EXCLUDED.ttl_ms,
                    updated_at = EXCLUDED.updated_at{label_set}
             RETURNING ",
            $returning
        )
    };
}

/// Whether the token of the fence row `$row` (just bumped) is the clock reading it was minted
/// from: `updated_at` holds that reading, and the token is `GREATEST(counter + 1, reading in
/// µs)`, so they are equal exactly when the reading won.
macro_rules! at_clock {
    ($row:literal) => {
        concat!(
            $row,
            ".token = floor(extract(epoch FROM ",
            $row,
            ".updated_at) * 1000000)::int8"
        )
    };
}

/// How the transaction of a grant commits, set for that transaction only (`is_local`): without
/// waiting for the WAL flush when the token is the clock reading it was minted from
/// (`$at_clock`, true) and `{unsynced_grants}`, durably (`on`, the session's setting) otherwise.
/// PostgreSQL reads `synchronous_commit` when the transaction commits, so a setting made by the
/// granting statement governs its own commit. Why it is safe: a crash loses only a suffix of the
/// WAL, so what it loses are grants of the first kind, whose tokens are clock readings from
/// before the crash; the next mint reads the clock after the restart, later (the crate docs,
/// "Crashes and the clock"). A token ahead of the clock (`counter + 1` won: the clock stepped
/// back, a swap from a store that was ahead) could be minted again if lost, so it commits durably,
/// and with it every commit before it in the WAL.
macro_rules! grant_commit {
    ($at_clock:expr) => {
        concat!(
            "set_config('synchronous_commit', CASE WHEN {unsynced_grants} AND (",
            $at_clock,
            ") THEN 'off' ELSE 'on' END, true) AS grant_commit"
        )
    };
}

/// `grant_commit!`'s rule in two halves, for a statement that settles what it can before it
/// waits: the commit set unsynced with `{unsynced_grants}` before the lock, then made durable
/// after the bump only when the token is not the clock reading (`$at_clock` false). The
/// setting that stands at the commit decides it, as with `grant_commit!`.
macro_rules! grant_commit_unsynced_first {
    () => {
        "CASE WHEN {unsynced_grants} THEN set_config('synchronous_commit', 'off', true) END"
    };
}

/// The second half of [`grant_commit_unsynced_first!`]: durable unless `$at_clock`.
macro_rules! grant_commit_durable_unless {
    ($at_clock:expr) => {
        concat!(
            "CASE WHEN {unsynced_grants} AND NOT (",
            $at_clock,
            ") THEN set_config('synchronous_commit', 'on', true) END"
        )
    };
}

/// This backend holds the single-`bigint` advisory lock $1 (pg_locks shows it as
/// classid = high 32 bits, objid = low 32 bits, objsubid = 1).
macro_rules! held_by_this_backend {
    () => {
        "SELECT 1 FROM pg_locks
          WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND classid = (($1::int8 >> 32) & 4294967295)::oid
            AND objid = ($1::int8 & 4294967295)::oid
            AND objsubid = 1"
    };
}

/// Somebody holds the single-`bigint` advisory lock `$n` shared (granted).
macro_rules! held_shared_by_anyone {
    ($param:literal) => {
        concat!(
            "SELECT 1 FROM pg_locks
              WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock'
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND classid = ((",
            $param,
            "::int8 >> 32) & 4294967295)::oid
                AND objid = (",
            $param,
            "::int8 & 4294967295)::oid
                AND objsubid = 1"
        )
    };
}

/// One attempt: take the lock ($1) as the transaction's if free; if taken, bump the fence of
/// ($2, $3), then take the lock for the session (at once: the backend holds it) and arm the
/// server-side TTL ($4 ms of silence ends the session). Atomic: one statement, one transaction;
/// the lock is taken (MATERIALIZED, read by the bump) before the bump, which commits before the
/// reply as `grant_commit!` says, and the session's take is its last step: any error before it
/// (a cancelled or failed bump) rolls the lock back. Returns granted, token (NULL if not
/// granted), the backend pid.
const TRY_ACQUIRE: &str = concat!(
    "WITH lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($1::int8) AS granted),
     bump AS (",
    bump_fence!("lock WHERE granted"),
    "),
     held AS MATERIALIZED (SELECT pg_advisory_lock($1::int8) AS locked, token, at_clock FROM bump)
     SELECT lock.granted, (SELECT token FROM held) AS token, pg_backend_pid() AS pid,
            set_config('idle_session_timeout',
                       CASE WHEN lock.granted THEN ($4::int8)::text ELSE '0' END, false),
            ",
    grant_commit!("SELECT at_clock FROM held"),
    "
       FROM lock"
);

/// Waits in the server's lock queue for at most $6 ms (lock_timeout, set before the wait by
/// the chained CTEs, for this statement's transaction only) for the lock as the transaction's,
/// bumps the fence, then takes the lock for the session (at once: the backend holds it).
/// Atomic as one statement; the session's take is in the bump's RETURNING list, so it comes
/// after the bump: any error before it, a lock timeout even as the lock is granted, rolls the
/// lock back with it. Returns the token and the backend pid.
///
/// Everything after the lock is on a handoff's path, so what can be settled before the wait is
/// settled there, in `settings`: the server-side TTL ($4 ms of silence ends the session) is
/// armed for the session, which a rollback undoes (a refused or failed wait leaves it as it
/// was); the grant's commit is set unsynced with `{unsynced_grants}`, and set back to durable
/// after the bump only when the token is not the clock reading (`grant_commit_unsynced_first!`,
/// `grant_commit_durable_unless!`). The client measures how long the wait took.
const WAIT_ACQUIRE: &str = concat!(
    "WITH settings AS MATERIALIZED (SELECT set_config('lock_timeout', ($6::int8)::text, true) AS lock_timeout,
                                      set_config('idle_session_timeout', ($4::int8)::text, false) AS ttl,
                                      ",
    grant_commit_unsynced_first!(),
    " AS grant_commit),
     lock AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::int8) AS locked FROM settings)
     ",
    bump_fence!(
        "lock",
        returning: concat!(
            "f.token, pg_advisory_lock($1::int8) AS locked, pg_backend_pid() AS pid, ",
            grant_commit_durable_unless!(at_clock!("f")),
            " AS durable"
        )
    )
);

/// Extend: any statement restarts the server's idle timer; this one also proves that the
/// session still holds the lock ($1). A single read.
pub(crate) const CONFIRM_HELD: &str = concat!(
    "SELECT pg_backend_pid() AS pid, EXISTS (",
    held_by_this_backend!(),
    ") AS held"
);

/// Operator action: end the backend that holds lock $1 and wait (up to 5 s) until it is gone,
/// so the lock is free when this returns. One statement.
pub(crate) const TERMINATE_HOLDER: &str = "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks
  WHERE locktype = 'advisory' AND granted AND objsubid = 1
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid = (($1::int8 >> 32) & 4294967295)::oid
    AND objid = ($1::int8 & 4294967295)::oid";

/// Relabel, on the lease's own session: sets the label of the fence row ($2, $3) of lock $1
/// to $4 only if this backend bumped it last for owner $5 with token $6 and still holds the
/// lock. One statement, a compare-and-set. No row changed: lost (or, for a reader or permit,
/// another holder bumped the row since).
const RELABEL: &str = concat!(
    "UPDATE {fence} SET label = $4::text
      WHERE namespace = $2::text AND key = $3::bytea AND lock_id = $1::int8 AND owner = $5::text
        AND token = $6::int8 AND holder_pid = pg_backend_pid() AND EXISTS (",
    held_by_this_backend!(),
    ")"
);

/// Release: unlock ($1) and disarm the TTL so the session can idle in the pool. One statement;
/// `false` means this session did not hold the lock.
pub(crate) const RELEASE: &str =
    "SELECT pg_advisory_unlock($1::int8) AS released, set_config('idle_session_timeout', '0', false)";

// ---- shared leases and semaphore permits ----------------------------------------------------
// A mode acquire runs as one transaction of several statements on the lease's session, under
// the key's gate (a transaction-level lock): the checks and the takes of one acquire never
// interleave with another's. Its takes are the transaction's, and the bump that grants takes
// them for the session as its last step, so an error before it (a failed or cancelled bump)
// rolls them back with the transaction, as it rolls back the TTL timers the attempt armed (a
// session lock would survive the rollback, with nothing left to bound it). A refused attempt
// holds no session lock but the key's lock a queue wait kept, which it lets go (UNLOCK_ALL).
//
// Whatever a mode acquire holds (the gate, the key's lock, a group's lock, a slot, an open
// transaction) is bounded by the server: the statements that take the gate and the key's lock
// in the queue also arm the waiter's TTL, so a waiter that falls silent for its TTL (a stopped
// process) loses its session and everything it held, as a silent holder does.

/// The key's gate ($1), held until the transaction ends, and the waiter's TTL ($2 ms) armed in
/// the same statement: the server ends the session after that much silence inside this
/// transaction (`idle_in_transaction_session_timeout`) and, once it commits, outside it
/// (`idle_session_timeout`). Blocks only for another acquire's checks (a few statements).
pub(crate) const TAKE_GATE: &str = "SELECT pg_advisory_xact_lock($1::int8),
        set_config('idle_in_transaction_session_timeout', ($2::int8)::text, false),
        set_config('idle_session_timeout', ($2::int8)::text, false)";

/// One attempt at lock $1, shared, as the transaction's: fails while it is held exclusively
/// or an exclusive request waits for it (PostgreSQL queues a new request behind a waiter it
/// conflicts with).
pub(crate) const TRY_SHARED: &str = "SELECT pg_try_advisory_xact_lock_shared($1::int8) AS granted";

/// Whether readers ($1) and permit holders ($2) hold their groups' locks (granted, shared).
/// Two reads of `pg_locks`.
pub(crate) const GROUPS_HELD: &str = concat!(
    "SELECT EXISTS (",
    held_shared_by_anyone!("$1"),
    ") AS readers, EXISTS (",
    held_shared_by_anyone!("$2"),
    ") AS permits"
);

/// The first free slot among the slot locks $1 (in slot order), taken as the transaction's:
/// its index, or no row. One statement; the scan stops at the first lock it gets.
pub(crate) const TAKE_SLOT: &str = "SELECT (s.ord - 1)::int8 AS slot
   FROM unnest($1::int8[]) WITH ORDINALITY AS s(id, ord)
  WHERE pg_try_advisory_xact_lock(s.id)
  ORDER BY s.ord
  LIMIT 1";

/// Releases every session-level advisory lock of this session: a lease's session holds only
/// its own, and a refused attempt only the key's lock a queue wait kept.
pub(crate) const UNLOCK_ALL: &str = "SELECT pg_advisory_unlock_all()";

/// Waits in the server's queue for lock $1, exclusively and as the transaction's, for at most
/// $2 ms, and lets it go as the statement commits: a wake-up, not a grant. It takes no session
/// lock, so nothing of it outlives the statement: on a lock timeout (55P03) the rollback frees
/// a lock granted in that very instant, with lock_timeout.
pub(crate) const WAIT_EXCLUSIVE_SIGNAL: &str = "WITH settings AS MATERIALIZED (SELECT set_config('lock_timeout', ($2::int8)::text, false) AS t),
     lock AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::int8) AS locked FROM settings)
SELECT set_config('lock_timeout', '0', false) FROM lock";

/// Waits in the server's queue for lock $1, shared, for at most $2 ms, as the transaction's,
/// then takes it for the session (at once: the backend holds it) as the statement's last step
/// and keeps it, with the waiter's TTL ($3 ms) armed by the same statement, between statements
/// and inside the transaction of the attempt that follows (the lock is held across both). On a
/// lock timeout (55P03) the rollback frees a lock granted in that very instant, as for
/// [`WAIT_EXCLUSIVE_SIGNAL`]: the session holds nothing afterwards.
pub(crate) const WAIT_SHARED: &str = "WITH settings AS MATERIALIZED (SELECT set_config('lock_timeout', ($2::int8)::text, false) AS t,
                                           set_config('idle_session_timeout', ($3::int8)::text, false) AS idle,
                                           set_config('idle_in_transaction_session_timeout', ($3::int8)::text, false) AS idle_in_transaction),
     lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared($1::int8) AS locked FROM settings),
     reset AS MATERIALIZED (SELECT set_config('lock_timeout', '0', false) AS t FROM lock)
SELECT pg_advisory_lock_shared($1::int8) AS held FROM reset";

/// Waits in the server's queue for lock $1 (the key's), exclusively, for at most $2 ms, as
/// the transaction's, then takes it for the session, with the turn's lock $4 (shared, which
/// marks the hold as a waiter's), as the statement's last steps, with the waiter's TTL ($3 ms)
/// armed by the same statement, as [`WAIT_SHARED`] does. Queued exclusively, the waiter keeps
/// out every request that comes after it (PostgreSQL queues a new conflicting request behind
/// it) until its attempt, which holds both, is done ([`END_TURN`]).
pub(crate) const WAIT_EXCLUSIVE_TURN: &str = "WITH settings AS MATERIALIZED (SELECT set_config('lock_timeout', ($2::int8)::text, false) AS t,
                                           set_config('idle_session_timeout', ($3::int8)::text, false) AS idle,
                                           set_config('idle_in_transaction_session_timeout', ($3::int8)::text, false) AS idle_in_transaction),
     lock AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::int8) AS locked FROM settings),
     reset AS MATERIALIZED (SELECT set_config('lock_timeout', '0', false) AS t FROM lock)
SELECT pg_advisory_lock($1::int8) AS held, pg_advisory_lock_shared($4::int8) AS turn FROM reset";

/// Ends a granted waiter's turn: lets go of the key's lock held exclusively ($1) and of the
/// turn's lock ($2); the lease holds the key's lock shared. One statement.
pub(crate) const END_TURN: &str =
    "SELECT pg_advisory_unlock($1::int8) AS key_lock, pg_advisory_unlock_shared($2::int8) AS turn";

/// A waiter for a slot keeps the key's lock shared ($1), which its refused attempt's
/// transaction holds already, so that a later conflicting request queues behind it.
pub(crate) const KEEP_SHARED: &str = "SELECT pg_advisory_lock_shared($1::int8)";

/// A mode waiter that gives up (its wait ran out, or another limit holds the key): every lock
/// of its session goes and the TTL it armed is disarmed, so the session can idle in the pool.
/// One statement.
pub(crate) const DISARM_WAITER: &str = "SELECT pg_advisory_unlock_all(),
        set_config('idle_session_timeout', '0', false),
        set_config('idle_in_transaction_session_timeout', '0', false)";

/// The limit recorded for the key's permits ($1, $2), if any. A single read, inside the gate.
const RECORDED_LIMIT: &str =
    "SELECT permit_limit FROM {fence} WHERE namespace = $1::text AND key = $2::bytea";

/// Bumps the fence of a reader's key (as [`TRY_ACQUIRE`] does, $1..$5), then takes for the
/// session the key's lock ($1) and the readers' lock ($6), shared, which the transaction holds,
/// and arms the TTL; the recorded limit is left as it is (it means something only while permits
/// are held). Inside the gate's transaction, whose last statement before COMMIT it is, with the
/// session's takes its last step; the TTL timer starts once it commits.
const BUMP_SHARED: &str = concat!(
    "WITH bump AS (",
    bump_fence!("(SELECT 1) AS one"),
    "),
     held AS MATERIALIZED (SELECT pg_advisory_lock_shared($1::int8) AS key_lock,
                                  pg_advisory_lock_shared($6::int8) AS group_lock, token, at_clock
                             FROM bump)
     SELECT token, pg_backend_pid() AS pid, set_config('idle_session_timeout', ($4::int8)::text, false),
            ",
    grant_commit!("at_clock"),
    "
       FROM held"
);

/// Bumps the fence of a permit's key ($1..$5) and records its limit ($6), then takes for the
/// session the key's lock ($1) and the permits' lock ($7), shared, and the slot's lock ($8),
/// which the transaction holds, and arms the TTL. As [`BUMP_SHARED`], the takes last.
const BUMP_PERMIT: &str = concat!("WITH bump AS (INSERT INTO {fence} AS f (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at, permit_limit{label_column})
     SELECT $2::text, $3::bytea, $1::int8, {scheme}, {fence_scheme},
            floor(extract(epoch FROM now.at) * 1000000)::int8,
            $5::text, pg_backend_pid(), $4::int8, now.at, $6::int4{label_value}
       FROM (SELECT clock_timestamp() AS at OFFSET 0) AS now
     ON CONFLICT (namespace, key) DO UPDATE
        SET token = GREATEST(f.token + 1, EXCLUDED.token),
            lock_id = EXCLUDED.lock_id, owner = EXCLUDED.owner,
            holder_pid = EXCLUDED.holder_pid, ttl_ms = EXCLUDED.ttl_ms,
            updated_at = EXCLUDED.updated_at, permit_limit = EXCLUDED.permit_limit{label_set}
     RETURNING f.token AS token, ",
    at_clock!("f"),
    " AS at_clock),
     held AS MATERIALIZED (SELECT pg_advisory_lock_shared($1::int8) AS key_lock,
                                  pg_advisory_lock_shared($7::int8) AS group_lock,
                                  pg_advisory_lock($8::int8) AS slot_lock, token, at_clock
                             FROM bump)
     SELECT token, pg_backend_pid() AS pid, set_config('idle_session_timeout', ($4::int8)::text, false),
            ",
    grant_commit!("at_clock"),
    "
       FROM held"
);

/// Release of a shared lease or a permit: whether the session still held the key's lock $1
/// (in any mode), then every lock of the session (key, group, slot) goes, and the TTL (both
/// timers its acquire armed) is disarmed. One statement; the check is read before the unlock.
pub(crate) const RELEASE_ALL: &str = concat!(
    "WITH held AS MATERIALIZED (SELECT EXISTS (",
    held_by_this_backend!(),
    ") AS released),
     gone AS MATERIALIZED (SELECT h.released, pg_advisory_unlock_all() AS unlocked FROM held h)
     SELECT released, set_config('idle_session_timeout', '0', false),
            set_config('idle_in_transaction_session_timeout', '0', false)
       FROM gone"
);

/// Every holder of the key's lock $1 (pid, lock mode), with the advisory locks each holds (as
/// ids), whether its backend is idle and for how long, and the key's fence row ($2, $3) if it
/// is this lock's. For the status of a key held in shared or permit mode.
const HOLDERS: &str = "SELECT l.pid, l.mode,
        ARRAY(SELECT ((p.classid::int8 << 32) | p.objid::int8) FROM pg_locks p
               WHERE p.pid = l.pid AND p.locktype = 'advisory' AND p.granted
                 AND p.objsubid = 1 AND p.database = l.database) AS locks,
        a.state, (extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::int8 AS silent_ms,
        f.token, f.owner, f.holder_pid, f.ttl_ms, f.permit_limit{label_select}
   FROM pg_locks l
   LEFT JOIN pg_stat_activity a ON a.pid = l.pid
   LEFT JOIN {fence} f ON f.namespace = $2::text AND f.key = $3::bytea AND f.lock_id = $1::int8
  WHERE l.locktype = 'advisory' AND l.granted
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND l.classid = (($1::int8 >> 32) & 4294967295)::oid
    AND l.objid = ($1::int8 & 4294967295)::oid
    AND l.objsubid = 1
  ORDER BY l.pid";

/// A page of listing: the fence rows of namespace $1 whose key starts with $2 (bytes), after
/// $3, in byte order, at most $4, whose key's lock a session holds (in any mode: the lock
/// `status` reads); the primary key's index serves the range. A single read.
const LIST: &str = "SELECT f.key FROM {fence} f
  WHERE f.namespace = $1::text AND f.key >= $2::bytea
    AND substring(f.key FROM 1 FOR length($2::bytea)) = $2::bytea AND f.key > $3::bytea
    AND EXISTS (SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND l.classid = ((f.lock_id >> 32) & 4294967295)::oid
                   AND l.objid = (f.lock_id & 4294967295)::oid)
  ORDER BY f.key LIMIT $4";

/// `sql` with the fence table and this build's lock-id scheme filled in.
fn fill(sql: &str, fence_table: &str) -> String {
    sql.replace("{fence}", fence_table)
        .replace("{scheme}", &LOCK_ID_SCHEME.to_string())
        .replace("{fence_scheme}", &FENCE_SCHEME.to_string())
}

pub(crate) fn fence_table_ddl(fence_table: &str) -> String {
    fill(CREATE_FENCE_TABLE, fence_table)
}

pub(crate) fn upgrade_from_scheme_1(fence_table: &str) -> String {
    fill(UPGRADE_FROM_SCHEME_1, fence_table)
}

pub(crate) fn upgrade_fence_scheme(fence_table: &str) -> String {
    fill(UPGRADE_FENCE_SCHEME, fence_table)
}

pub(crate) fn add_label(fence_table: &str) -> String {
    fill(ADD_LABEL, fence_table)
}

pub(crate) fn add_permit_limit(fence_table: &str) -> String {
    fill(ADD_PERMIT_LIMIT, fence_table)
}

/// The statements with the fence table filled in.
pub(crate) struct Statements {
    pub(crate) try_acquire: Labelled,
    pub(crate) wait_acquire: Labelled,
    pub(crate) relabel: String,
    pub(crate) add_label: String,
    pub(crate) create_schema: String,
    pub(crate) create_fence_table: String,
    pub(crate) remove_idle_fences: String,
    pub(crate) count_fences: String,
    pub(crate) recorded_limit: String,
    pub(crate) bump_shared: Labelled,
    pub(crate) bump_permit: Labelled,
    pub(crate) holders: Labelled,
    pub(crate) list: String,
}

/// A statement in two forms: for a fence table without the `label` column, and with it (the
/// grant writes the label as its last parameter, the status reads it).
#[derive(Debug)]
pub(crate) struct Labelled {
    plain: String,
    labelled: String,
}

impl Labelled {
    /// `sql` whose label parameter, where it has one, is `$param`.
    fn new(sql: &str, param: usize) -> Self {
        let fill = |column: &str, value: &str, set: &str, select: &str| {
            sql.replace("{label_column}", column)
                .replace("{label_value}", value)
                .replace("{label_set}", set)
                .replace("{label_select}", select)
        };
        Labelled {
            plain: fill("", "", "", ""),
            labelled: fill(
                ", label",
                &format!(", ${param}::text"),
                ", label = EXCLUDED.label",
                ", f.label",
            ),
        }
    }

    /// The form for a table with the `label` column (`labels`) or without.
    pub(crate) fn get(&self, labels: bool) -> &str {
        if labels {
            &self.labelled
        } else {
            &self.plain
        }
    }
}

impl Statements {
    /// `durable_grants`: every grant commits durably (the URL option), not only those whose
    /// token ran ahead of the clock.
    pub(crate) fn new(fence_table: &str, schema: &str, durable_grants: bool) -> Self {
        let unsynced = if durable_grants { "false" } else { "true" };
        let fill = |sql: &str| fill(sql, fence_table).replace("{unsynced_grants}", unsynced);
        Statements {
            try_acquire: Labelled::new(&fill(TRY_ACQUIRE), 6),
            wait_acquire: Labelled::new(&fill(WAIT_ACQUIRE), 7),
            relabel: fill(RELABEL),
            add_label: fill(ADD_LABEL),
            create_schema: format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""),
            create_fence_table: fill(CREATE_FENCE_TABLE),
            remove_idle_fences: fill(REMOVE_IDLE_FENCES),
            count_fences: fill(COUNT_FENCES),
            recorded_limit: fill(RECORDED_LIMIT),
            bump_shared: Labelled::new(&fill(BUMP_SHARED), 7),
            bump_permit: Labelled::new(&fill(BUMP_PERMIT), 9),
            holders: Labelled::new(&fill(HOLDERS), 0),
            list: fill(LIST),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_configured_table_and_no_placeholder_is_left() {
        let sql = Statements::new("\"s\".\"t\"", "s", false);
        for statement in [
            sql.try_acquire.get(false),
            sql.try_acquire.get(true),
            sql.wait_acquire.get(false),
            sql.wait_acquire.get(true),
            &sql.relabel,
            &sql.add_label,
            &sql.create_fence_table,
            &sql.remove_idle_fences,
            &sql.count_fences,
            &sql.recorded_limit,
            sql.bump_shared.get(false),
            sql.bump_shared.get(true),
            sql.bump_permit.get(false),
            sql.bump_permit.get(true),
            sql.holders.get(false),
            sql.holders.get(true),
        ] {
            assert!(statement.contains("\"s\".\"t\""), "{statement}");
            assert!(!statement.contains("{fence}"), "{statement}");
            assert!(!statement.contains("{scheme}"), "{statement}");
            assert!(!statement.contains("{fence_scheme}"), "{statement}");
            assert!(!statement.contains("{unsynced_grants}"), "{statement}");
            assert!(!statement.contains("{label"), "{statement}");
        }
        assert_eq!(sql.create_schema, "CREATE SCHEMA IF NOT EXISTS \"s\"");
    }

    #[test]
    fn grants_commit_unsynced_only_at_the_clock_unless_durable_grants() {
        let fast = Statements::new("\"s\".\"t\"", "s", false);
        let durable = Statements::new("\"s\".\"t\"", "s", true);
        for (fast, durable) in [
            (fast.try_acquire.get(true), durable.try_acquire.get(true)),
            (fast.bump_shared.get(true), durable.bump_shared.get(true)),
            (fast.bump_permit.get(true), durable.bump_permit.get(true)),
        ] {
            assert!(
                fast.contains("set_config('synchronous_commit', CASE WHEN true AND ("),
                "{fast}"
            );
            assert!(fast.contains("THEN 'off' ELSE 'on' END, true)"), "{fast}");
            assert!(
                durable.contains("set_config('synchronous_commit', CASE WHEN false AND ("),
                "{durable}"
            );
        }
        // A waiter settles its commit before the wait, and makes it durable after the bump
        // only when the token is not the clock reading.
        let (fast, durable) = (fast.wait_acquire.get(true), durable.wait_acquire.get(true));
        assert!(
            fast.contains("CASE WHEN true THEN set_config('synchronous_commit', 'off', true)"),
            "{fast}"
        );
        assert!(
            fast.contains("CASE WHEN true AND NOT (f.token = floor(extract(epoch FROM f.updated_at) * 1000000)::int8) THEN set_config('synchronous_commit', 'on', true)"),
            "{fast}"
        );
        assert!(
            durable.contains("CASE WHEN false THEN set_config('synchronous_commit', 'off', true)"),
            "{durable}"
        );
    }
}
