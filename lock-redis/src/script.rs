//! The Lua scripts, one per atomic step, and the per-node steps that run them on one
//! connection (shared by [`RedisStore`](crate::RedisStore) and every Redlock node).

use std::sync::LazyLock;
use std::time::Duration;

use fencelock_core::ttl::whole_millis;
use fencelock_core::{Error, KeyStatus, OwnerId, Result};
use redis::aio::ConnectionLike;
use redis::Script;

use crate::error::redis_error;
use crate::keys::KeyNames;

// ---- Lua ------------------------------------------------------------------------------------
// KEYS[1] is the lock key, KEYS[2] the fence key: both carry the same `{key}` hash tag, so they
// live in one Cluster slot. Keys, owners and channels are always KEYS/ARGV, never script text.

/// Acquire: `SET lock owner NX PX ttl`; if it was set, mint the token as
/// max(fence + 1, server TIME in µs), store it and let the fence expire one retention window
/// later (the crate docs, `# Per-key state`, say why a later token is still greater).
/// Atomic: a script runs alone on the server.
/// ARGV: owner, ttl ms, retention ms. Returns `{1, token}` if granted, `{0, pttl}` if held.
pub(crate) const ACQUIRE_LUA: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = redis.call('INCR', KEYS[2])
  if token < floor then
    token = floor
    redis.call('SET', KEYS[2], string.format('%d', token))
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1, token}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// Release: delete the lock only if it still holds this owner, then wake waiters on the
/// key's channel. Atomic: compare, delete and publish in one script.
/// ARGV: owner, channel. Returns 1 if released, 0 if the lease was already gone.
pub(crate) const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
";

/// Extend: reset the TTL only if the lock still holds this owner; PEXPIRE never creates a
/// missing key. Atomic: compare and expire in one script.
/// ARGV: owner, ttl ms. Returns 1 if extended, 0 if the lease is gone.
pub(crate) const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Evict (the operator's "forget"): delete the lock whoever holds it, never the fence, and
/// wake waiters. Atomic: delete and publish in one script.
/// ARGV: channel. Returns 1 if a lock was deleted.
pub(crate) const EVICT_LUA: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], '')
  return 1
end
return 0
";

/// Status: the holder, its remaining TTL and the fence, read together. Atomic: one script,
/// so the three values belong to one instant. Returns `{owner or false, pttl, fence or false}`.
pub(crate) const STATUS_LUA: &str = r"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
";

/// Raise (Redlock only): set the fence to ARGV[1] if it is below that, else report the fence;
/// either way the fence expires one retention window (ARGV[2], ms) from now, as after an
/// acquire. Atomic: the read and the write run as one script, so a concurrent mint is either
/// before (and raised) or after. KEYS[1] is the fence key. Returns 0 if the fence now holds
/// ARGV[1], or the fence it found at or above ARGV[1] (the caller then asks again with more).
pub(crate) const RAISE_LUA: &str = r"
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
";

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
static EVICT: LazyLock<Script> = LazyLock::new(|| Script::new(EVICT_LUA));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(STATUS_LUA));
static RAISE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_LUA));

// ---- the steps ------------------------------------------------------------------------------

/// What one acquire script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock was free and is now ours, with this token.
    Granted { token: u64 },
    /// Another owner holds it; it expires in this long if the server knows (`None` for a key
    /// without expiry, which this store never writes).
    Held { expires_in: Option<Duration> },
}

/// Runs the acquire script on one connection (EVALSHA, loading the script on NOSCRIPT); a
/// granted acquire leaves the fence to expire `retention` later.
pub(crate) async fn acquire_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
) -> Result<Attempt> {
    let reply: Vec<i64> = ACQUIRE
        .key(&names.lock)
        .key(&names.fence)
        .arg(owner.to_string())
        .arg(whole_millis(ttl))
        .arg(whole_millis(retention))
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("acquire", e))?;
    match reply.as_slice() {
        [1, token] if *token > 0 => Ok(Attempt::Granted {
            token: *token as u64,
        }),
        [0, pttl] => Ok(Attempt::Held {
            expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        other => Err(unexpected("acquire", other)),
    }
}

/// Runs the release script on one connection; true if this owner's lock was deleted.
pub(crate) async fn release_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
) -> Result<bool> {
    let released: i64 = RELEASE
        .key(&names.lock)
        .arg(owner.to_string())
        .arg(&names.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("release", e))?;
    Ok(released == 1)
}

/// Runs the extend script on one connection; true if this owner's lock got a fresh TTL.
pub(crate) async fn extend_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
) -> Result<bool> {
    let extended: i64 = EXTEND
        .key(&names.lock)
        .arg(owner.to_string())
        .arg(whole_millis(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("extend", e))?;
    Ok(extended == 1)
}

/// Runs the evict script on one connection; true if a lock was deleted.
pub(crate) async fn evict_on<C: ConnectionLike>(conn: &mut C, names: &KeyNames) -> Result<bool> {
    let evicted: i64 = EVICT
        .key(&names.lock)
        .arg(&names.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("evict", e))?;
    Ok(evicted == 1)
}

/// Runs the status script on one connection.
pub(crate) async fn status_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
) -> Result<KeyStatus> {
    let (owner, pttl, fence): (Option<String>, i64, Option<String>) = STATUS
        .key(&names.lock)
        .key(&names.fence)
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("status", e))?;
    Ok(match owner {
        None => KeyStatus::Free,
        Some(owner) => KeyStatus::Held {
            owner: OwnerId::parse(&owner),
            token: fence.and_then(|f| f.parse().ok()),
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        },
    })
}

/// What one node's raise found.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raise {
    /// The fence was below the token and now holds it.
    Raised,
    /// The fence was already at this value, at or above the token.
    Ahead(u64),
}

/// Runs the raise script on one connection: raises the fence to `token`, unless it is already
/// there or beyond, and leaves it to expire `retention` later.
pub(crate) async fn raise_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    token: u64,
    retention: Duration,
) -> Result<Raise> {
    let found: i64 = RAISE
        .key(&names.fence)
        .arg(token)
        .arg(whole_millis(retention))
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("raise", e))?;
    match u64::try_from(found) {
        Ok(0) => Ok(Raise::Raised),
        Ok(fence) => Ok(Raise::Ahead(fence)),
        Err(_) => Err(Error::Store {
            message: format!("raise: the script answered {found}, not a fence"),
            source: None,
        }),
    }
}

fn unexpected(what: &str, reply: &[i64]) -> Error {
    Error::Store {
        message: format!("{what}: the script answered {reply:?}, which it never returns"),
        source: None,
    }
}
