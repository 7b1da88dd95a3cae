//! The fenced floor's statements, shared by `postgres.rs` and `postgres-cycle-cost.rs`.

/// The blocking lock and the fence upsert as one statement: a grant's least work, one round
/// trip (on a session with synchronous_commit = off, as our grants at the clock commit).
pub(crate) const RAW_LOCK_AND_BUMP: &str = "WITH lock AS MATERIALIZED (SELECT pg_advisory_lock($1) AS locked)
    INSERT INTO public.fencelock_fence AS f
        (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at)
    SELECT 'bench-raw', $2, $1, 2, 3, floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8,
           'raw', pg_backend_pid(), 0, clock_timestamp()
      FROM lock
    ON CONFLICT (namespace, key) DO UPDATE
       SET token = GREATEST(f.token + 1, EXCLUDED.token)
    RETURNING f.token";

/// The unlock that ends a raw cycle.
pub(crate) const RAW_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
