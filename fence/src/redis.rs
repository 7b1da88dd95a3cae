//! A Redis key as a fenced resource: one Lua script per step, so each check and its write are
//! one atomic step on the server.
//!
//! The value lives in a plain string key, readable with `GET`; the highest token that claimed
//! it lives in a second key beside it, which never expires. Tokens travel as decimal strings
//! and are compared as such (by length, then digits), so every `u64` compares exactly; Lua's
//! numbers would round beyond 2^53.

use std::sync::LazyLock;

use fencelock_core::{Error, Result};
use redis::aio::ConnectionLike;
use redis::{RedisError, Script};

/// Lua shared by the scripts: the fence key's token (0 if absent, an error if it holds
/// anything else) and the comparison of two tokens as decimal strings.
macro_rules! prelude {
    () => {
        r"
local function fence_of(key)
  local fence = redis.call('GET', key)
  if not fence then return '0' end
  if not string.match(fence, '^%d+$') then
    return redis.error_reply('fence key ' .. key .. ' does not hold a fencing token')
  end
  return fence
end
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local fence = fence_of(KEYS[2])
if type(fence) == 'table' then return fence end
"
    };
}

/// Claim: records the token unless a greater one claimed the key, and returns the value.
/// Atomic: the check, the record and the read are one script, so no write slips between.
/// KEYS: value, fence. ARGV: token. Returns `{1, token, value or nil}` or `{0, fence, nil}`.
pub const CLAIM_LUA: &str = concat!(
    prelude!(),
    r"
if below(ARGV[1], fence) then return {0, fence, false} end
redis.call('SET', KEYS[2], ARGV[1])
return {1, ARGV[1], redis.call('GET', KEYS[1])}
"
);

/// Write: sets the value only while the fence still holds this claim. Atomic: compare and set
/// in one script. KEYS: value, fence. ARGV: value, token. Returns `{1, token}` or `{0, fence}`.
pub const WRITE_LUA: &str = concat!(
    prelude!(),
    r"
if fence ~= ARGV[2] then return {0, fence} end
redis.call('SET', KEYS[1], ARGV[1])
return {1, fence}
"
);

/// Set: the one-step fenced `SET`, applied if no greater token claimed the key, recording the
/// token. Atomic: compare and set in one script. KEYS: value, fence. ARGV: value, token.
/// Returns `{1, token}` or `{0, fence}`.
pub const SET_LUA: &str = concat!(
    prelude!(),
    r"
if below(ARGV[2], fence) then return {0, fence} end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return {1, ARGV[2]}
"
);

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
static WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE_LUA));
static SET: LazyLock<Script> = LazyLock::new(|| Script::new(SET_LUA));

/// A Redis key whose writes are fenced: [`claim`](FencedKey::claim) then
/// [`write`](FencedKey::write) for a read-modify-write, [`set`](FencedKey::set) for a
/// one-step write.
///
/// A claim records its token even when the value key does not exist yet, so creating the
/// value is fenced like any other write.
///
/// In Redis Cluster both keys must hash to one slot: give the key a hash tag
/// (`{account:7}`), which `{account:7}:fence` shares. A script on two slots fails with
/// `CROSSSLOT`, never silently.
///
/// ```no_run
/// # async fn job(conn: &mut redis::aio::MultiplexedConnection, token: u64) -> fencelock_core::Result<()> {
/// use fencelock_fence::FencedKey;
///
/// let balance = FencedKey::new("{account:7}");
/// let read = balance.claim(conn, token).await?;          // every lower token is refused now
/// let cents: i64 = read.as_deref().and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0);
/// balance.write(conn, token, (cents + 100).to_string()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedKey {
    value: String,
    fence: String,
}

impl FencedKey {
    /// The value at `key`, its fence at `"{key}:fence"`.
    pub fn new(key: impl Into<String>) -> Self {
        let value = key.into();
        let fence = format!("{value}:fence");
        FencedKey { value, fence }
    }

    /// The value at `key`, its fence at `fence_key`.
    pub fn with_fence_key(key: impl Into<String>, fence_key: impl Into<String>) -> Self {
        FencedKey {
            value: key.into(),
            fence: fence_key.into(),
        }
    }

    /// The key holding the value.
    pub fn key(&self) -> &str {
        &self.value
    }

    /// The key holding the highest token that claimed the value.
    pub fn fence_key(&self) -> &str {
        &self.fence
    }

    /// Claims the key for `token` and returns its value (`None` if it has none). From then on
    /// every lower token is refused. Refused with [`Error::StaleToken`] if a greater token
    /// claimed it.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed the key;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached,
    /// times out or drops the connection; [`Store`](fencelock_core::ErrorKind::Store) for any other
    /// Redis error, such as a fence key that holds no token.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the claim made or not; either is safe, since a claim
    /// only refuses lower tokens.
    pub async fn claim<C>(&self, conn: &mut C, token: u64) -> Result<Option<Vec<u8>>>
    where
        C: ConnectionLike + Send,
    {
        let (claimed, fence, value): (i64, String, Option<Vec<u8>>) = CLAIM
            .key(&self.value)
            .key(&self.fence)
            .arg(token.to_string())
            .invoke_async(conn)
            .await
            .map_err(|e| redis_error("claim", e))?;
        if claimed == 1 {
            return Ok(value);
        }
        Err(crate::refused(token, parse_fence(&fence)?))
    }

    /// Sets the value only while the key still carries the claim `token`. Refused with
    /// [`Error::StaleToken`] if a greater token claimed it since; a token that never claimed
    /// it is refused as [`Error::InvalidInput`].
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed the key
    /// since; [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a token that never
    /// claimed it; [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot
    /// be reached, times out or drops the connection; [`Store`](fencelock_core::ErrorKind::Store)
    /// for any other Redis error, such as a fence key that holds no token.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the write applied or not; if applied, it was applied
    /// under a valid claim.
    pub async fn write<C>(&self, conn: &mut C, token: u64, value: impl AsRef<[u8]>) -> Result<()>
    where
        C: ConnectionLike + Send,
    {
        let (written, fence): (i64, String) = WRITE
            .key(&self.value)
            .key(&self.fence)
            .arg(value.as_ref())
            .arg(token.to_string())
            .invoke_async(conn)
            .await
            .map_err(|e| redis_error("write", e))?;
        if written == 1 {
            return Ok(());
        }
        Err(crate::refused(token, parse_fence(&fence)?))
    }

    /// The fenced `SET`, a one-step write: sets the value if no greater token claimed the
    /// key, and records `token`. Refused with [`Error::StaleToken`] otherwise. For values
    /// that do not depend on an earlier read.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed the key;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server cannot be reached,
    /// times out or drops the connection; [`Store`](fencelock_core::ErrorKind::Store) for any other
    /// Redis error, such as a fence key that holds no token.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the value set or not; if set, it was set under a token
    /// no lower than any before.
    pub async fn set<C>(&self, conn: &mut C, token: u64, value: impl AsRef<[u8]>) -> Result<()>
    where
        C: ConnectionLike + Send,
    {
        let (set, fence): (i64, String) = SET
            .key(&self.value)
            .key(&self.fence)
            .arg(value.as_ref())
            .arg(token.to_string())
            .invoke_async(conn)
            .await
            .map_err(|e| redis_error("set", e))?;
        if set == 1 {
            return Ok(());
        }
        Err(crate::refused(token, parse_fence(&fence)?))
    }
}

fn parse_fence(fence: &str) -> Result<u64> {
    fence.parse().map_err(|_| Error::Store {
        message: format!("the fence key holds {fence:?}, not a fencing token"),
        source: None,
    })
}

/// The driver's error as ours: retryable when the server could not be reached or was busy.
fn redis_error(what: &str, error: RedisError) -> Error {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
    {
        Error::unavailable(format!("{what}: {error}"), error)
    } else {
        Error::store(format!("{what}: {error}"), error)
    }
}
