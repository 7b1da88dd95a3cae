//! [`RedisStore`]: the Lua scripts, the per-node steps built on them, and the trait impls.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::validate::{check_key, check_request, check_wait};
use lock_core::{
    Acquire, Capabilities, Error, Extend, Instant, KeyStatus, Lease, LockStore, OwnerId, Release,
    ReleaseOutcome, Result,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::time::{sleep_until, timeout};

use crate::error::redis_error;
use crate::eviction::{self, EvictionCheck};
use crate::subscriber::ReleaseSubscriber;
use crate::RedisConfig;

// ---- Lua ------------------------------------------------------------------------------------
// KEYS[1] is the lock key, KEYS[2] the fence key: both carry the same `{key}` hash tag, so they
// live in one Cluster slot. Keys, owners and channels are always KEYS/ARGV, never script text.

/// Acquire: `SET lock owner NX PX ttl`; if it was set, mint the token as
/// max(fence + 1, server TIME in µs) and store it. Atomic: a script runs alone on the server.
/// ARGV: owner, ttl ms. Returns `{1, token}` if granted, `{0, pttl}` if held.
pub(crate) const ACQUIRE_LUA: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = redis.call('INCR', KEYS[2])
  if token < floor then
    token = floor
    redis.call('SET', KEYS[2], string.format('%d', token))
  end
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

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
static EVICT: LazyLock<Script> = LazyLock::new(|| Script::new(EVICT_LUA));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(STATUS_LUA));

/// The longest a waiter sleeps without a notification before it tries again, so a lost
/// release message costs at most this much delay.
pub const WAIT_CAP: Duration = Duration::from_millis(250);

// ---- per-node steps (shared with Redlock) ---------------------------------------------------

/// The Redis names of one lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyNames {
    /// `{prefix}{{key}}:lock`, holding the owner id with a PX expiry.
    pub(crate) lock: String,
    /// `{prefix}{{key}}:fence`, the last token minted; never expires.
    pub(crate) fence: String,
    /// `{prefix}{{key}}:released`, the pub/sub channel a release publishes on.
    pub(crate) channel: String,
}

impl KeyNames {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let tag = hash_tag(key);
        KeyNames {
            lock: format!("{prefix}{{{tag}}}:lock"),
            fence: format!("{prefix}{{{tag}}}:fence"),
            channel: format!("{prefix}{{{tag}}}:released"),
        }
    }
}

/// The key as a Cluster hash tag: `%` and `}` escaped (`%25`, `%7D`), so the tag is the whole
/// key, never empty, and two keys never share names. Other keys are written as they are.
fn hash_tag(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.contains(['%', '}']) {
        return key.into();
    }
    key.replace('%', "%25").replace('}', "%7D").into()
}

/// What one acquire script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock was free and is now ours, with this token.
    Granted { token: u64 },
    /// Another owner holds it; it expires in this long if the server knows (`None` for a key
    /// without expiry, which this store never writes).
    Held { expires_in: Option<Duration> },
}

/// TTLs travel as whole milliseconds, rounded up so the server never keeps a lease shorter
/// than asked (the local deadline is computed from the TTL asked for).
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Runs the acquire script on one connection (EVALSHA, loading the script on NOSCRIPT).
pub(crate) async fn acquire_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
) -> Result<Attempt> {
    let reply: Vec<i64> = ACQUIRE
        .key(&names.lock)
        .key(&names.fence)
        .arg(owner.to_string())
        .arg(ttl_millis(ttl))
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
        .arg(ttl_millis(ttl))
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

fn unexpected(what: &str, reply: &[i64]) -> Error {
    Error::Store {
        message: format!("{what}: the script answered {reply:?}, which it never returns"),
        source: None,
    }
}

fn timed_out(what: &str, after: Duration) -> Error {
    Error::Unavailable {
        message: format!("{what}: no answer from Redis within {after:?}"),
        source: None,
    }
}

// ---- the store ------------------------------------------------------------------------------

/// A lock store on one Redis server. See the crate docs for what it guarantees.
///
/// A handle owns one multiplexed command connection (reconnected on failure) and, once a
/// waiter needs it, one pub/sub connection shared by all its waiters. Clones share both.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    conn: ConnectionManager,
    subscriber: ReleaseSubscriber,
    /// Set by the first eviction check that let the store go on; a refusal is not kept, so a
    /// server reconfigured meanwhile is checked afresh.
    eviction: tokio::sync::OnceCell<EvictionCheck>,
    /// Whether a refusal was logged already.
    refusal_logged: AtomicBool,
}

impl RedisStore {
    /// Connects to the server named by `config`, checks that it answers, and that it cannot
    /// evict a held lock (see the crate docs, `# Eviction`).
    ///
    /// Fails with the retryable [`Error::Unavailable`] if the server cannot be reached and
    /// answer a `PING` within the connect timeout (refused, unroutable, or accepting but hung),
    /// and with [`Error::Store`] if it refuses the credentials or the database, or if it may
    /// evict keys (`maxmemory` set and a `maxmemory-policy` other than `noeviction`) and the
    /// URL does not say `allow_eviction=true`; that error names both settings, and its source
    /// is an [`EvictionRisk`](crate::EvictionRisk).
    ///
    /// # Cancel safety
    /// Dropping the future closes whatever connection it opened; nothing is held.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let store = Self::connect_lazy(config)?;
        let bound = store.inner.config.connect_timeout;
        let mut conn = store.inner.conn.clone();
        let ping_command = redis::cmd("PING");
        let ping = ping_command.query_async::<String>(&mut conn);
        match timeout(bound, ping).await {
            Ok(Ok(_)) => {
                let bound = store.inner.config.command_timeout;
                store.checked_eviction_within(bound).await?;
                Ok(store)
            }
            Ok(Err(e)) => Err(redis_error(
                &format!("connecting to {}", store.inner.config),
                e,
            )),
            Err(_) => Err(timed_out(
                &format!("connecting to {}", store.inner.config),
                bound,
            )),
        }
    }

    /// A handle that connects on first use: every operation fails with
    /// [`Error::Unavailable`] while the server cannot be reached. Must be called inside a
    /// tokio runtime.
    ///
    /// The eviction check runs before the first operation that reaches the server; while the
    /// server may evict (and `allow_eviction` is not set), every operation fails with the
    /// [`Error::Store`] that [`connect`](Self::connect) would return, and sends nothing else.
    pub fn connect_lazy(config: RedisConfig) -> Result<Self> {
        #[cfg(feature = "tls")]
        if matches!(
            config.connection.addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ) {
            install_crypto_provider();
        }
        let client = redis::Client::open(config.connection.clone())
            .map_err(|e| Error::store(format!("{config}: {:?}", e.kind()), e))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout))
            // A failed reconnect is retried by the next command; a long backoff here would
            // only make callers wait past their own timeouts.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(|e| redis_error(&format!("connecting to {config}"), e))?;
        let subscriber =
            ReleaseSubscriber::new(client, config.connect_timeout, config.command_timeout);
        Ok(RedisStore {
            inner: Arc::new(Inner {
                config,
                conn,
                subscriber,
                eviction: tokio::sync::OnceCell::new(),
                refusal_logged: AtomicBool::new(false),
            }),
        })
    }

    /// The configuration this handle was made from.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// What the eviction check found, `None` before it has let the store go on (a lazy
    /// handle before its first operation, or while the server refuses).
    pub fn eviction_check(&self) -> Option<&EvictionCheck> {
        self.inner.eviction.get()
    }

    /// Runs the eviction check unless one already let the store go on; concurrent callers
    /// share one check. Unbounded: callers put it under their own timeout.
    ///
    /// # Cancel safety
    /// Read-only; a dropped check is run again by the next caller.
    pub(crate) async fn checked_eviction(&self) -> Result<()> {
        if self.inner.config.allow_eviction {
            self.inner
                .eviction
                .get_or_init(|| async { EvictionCheck::Allowed })
                .await;
            return Ok(());
        }
        let node = self.inner.config.redacted();
        let conn = self.inner.conn.clone();
        let checked = self
            .inner
            .eviction
            .get_or_try_init(|| async move {
                let mut conn = conn;
                let found = eviction::check(&mut conn, node).await?;
                if let EvictionCheck::Unknown { reason } = &found {
                    tracing::warn!(
                        server = node,
                        reason = reason.as_str(),
                        "could not read maxmemory and maxmemory-policy: a held lock may be \
                         evicted without notice if this server evicts keys; allow CONFIG GET or \
                         INFO for this user, or set allow_eviction=true to accept the risk"
                    );
                }
                Ok(found)
            })
            .await;
        match checked {
            Ok(_) => Ok(()),
            Err(refused) => {
                // Said once per handle: a Redlock node refused this way only counts as a
                // failed node, which nothing else would report while a quorum remains.
                if eviction::risk_of(&refused).is_some()
                    && !self.inner.refusal_logged.swap(true, Relaxed)
                {
                    tracing::warn!(server = node, "{refused}");
                }
                Err(refused)
            }
        }
    }

    /// [`Self::checked_eviction`] under `bound`, and free once a check let the store go on.
    async fn checked_eviction_within(&self, bound: Duration) -> Result<()> {
        if self.inner.eviction.initialized() {
            return Ok(());
        }
        match timeout(bound, self.checked_eviction()).await {
            Ok(checked) => checked,
            Err(_) => Err(timed_out("eviction check", bound)),
        }
    }

    /// The operator's "forget": deletes the lock on `key` behind its holder's back (never the
    /// fencing counter, so the next token is still greater) and wakes its waiters. Returns
    /// whether a lock was deleted. The holder finds out at its next extend or release.
    ///
    /// For tooling and fault tests; a lock holder never needs it.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have deleted the lock.
    pub async fn evict(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let names = self.names(key);
        self.run("evict", |mut conn| async move {
            evict_on(&mut conn, &names).await
        })
        .await
    }

    /// A clone of the shared command connection, for Redlock's per-node fan-out.
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    /// The handle's pub/sub side, for Redlock's waiters.
    pub(crate) fn subscriber(&self) -> &ReleaseSubscriber {
        &self.inner.subscriber
    }

    pub(crate) fn names(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.inner.config.prefix, key)
    }

    /// Runs one command on a clone of the shared connection under the command timeout.
    async fn run<T, F, Fut>(&self, what: &str, command: F) -> Result<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let bound = self.inner.config.command_timeout;
        self.checked_eviction_within(bound).await?;
        match timeout(bound, command(self.inner.conn.clone())).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(what, bound)),
        }
    }

    /// One acquire attempt; the lease's deadline is measured from before the script was sent.
    async fn attempt(&self, key: &str, names: &KeyNames, ttl: Duration) -> Result<Granted> {
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let attempt = self
            .run("acquire", |mut conn| async move {
                acquire_on(&mut conn, names, owner, ttl).await
            })
            .await?;
        Ok(match attempt {
            Attempt::Granted { token } => Granted::Yes(Lease::new(key, owner, token, ttl, sent_at)),
            Attempt::Held { expires_in } => Granted::No { expires_in },
        })
    }
}

/// rustls needs a process-wide crypto provider and the redis crate picks none: install ring,
/// unless the application installed one already.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is in place either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

enum Granted {
    Yes(Lease),
    No { expires_in: Option<Duration> },
}

#[async_trait]
impl Acquire for RedisStore {
    /// # Cancel safety
    /// Dropping the future after the script was sent may leave a lease nobody knows of: it
    /// expires at its TTL and blocks the key until then.
    #[tracing::instrument(
        level = "debug",
        name = "try_acquire",
        skip(self),
        fields(store = "redis"),
        ret(level = "debug"),
        err(level = "debug")
    )]
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        match self.attempt(key, &self.names(key), ttl).await? {
            Granted::Yes(lease) => Ok(lease),
            Granted::No { .. } => Err(Error::Busy {
                key: key.to_owned(),
            }),
        }
    }

    /// Tries once; if the key is held, subscribes to the key's release channel (confirmed
    /// before the next attempt, so a release between the attempt and the wait still wakes
    /// it), then tries again on every release message, when the holder's TTL runs out, and at
    /// least every [`WAIT_CAP`].
    ///
    /// An attempt that cannot reach the server ends the wait at once with the retryable
    /// [`Error::Unavailable`], as in every store: the wait bound is only spent waiting for the
    /// lock, and an attempt in flight is bounded by the command timeout, not by the wait.
    ///
    /// # Cancel safety
    /// As for `try_acquire` while an attempt is in flight; dropped while waiting, nothing is
    /// held and the subscription is given up.
    #[tracing::instrument(
        level = "debug",
        name = "acquire",
        skip(self),
        fields(store = "redis"),
        ret(level = "debug"),
        err(level = "debug")
    )]
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_wait(wait)?;
        let started = Instant::now();
        let deadline = started + wait;
        let names = self.names(key);
        let timed_out = |now: Instant| Error::WaitTimedOut {
            key: key.to_owned(),
            waited: now - started,
        };
        if let Granted::Yes(lease) = self.attempt(key, &names, ttl).await? {
            return Ok(lease);
        }
        if Instant::now() >= deadline {
            return Err(timed_out(Instant::now()));
        }
        let listener = self.inner.subscriber.listen(&names.channel);
        listener
            .subscribed(WAIT_CAP.min(deadline.saturating_duration_since(Instant::now())))
            .await;
        loop {
            let notified = listener.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Measured before the attempt: the holder's remaining TTL counts from here.
            let asked = Instant::now();
            let expires_in = match self.attempt(key, &names, ttl).await? {
                Granted::Yes(lease) => return Ok(lease),
                Granted::No { expires_in } => expires_in,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(timed_out(now));
            }
            // One millisecond past the PTTL, which the server rounds down.
            let nap = expires_in
                .map_or(WAIT_CAP, |left| left + Duration::from_millis(1))
                .min(WAIT_CAP);
            tokio::select! {
                () = notified => {}
                () = sleep_until((asked + nap).max(now).min(deadline)) => {}
            }
        }
    }
}

#[async_trait]
impl Release for RedisStore {
    /// # Cancel safety
    /// Dropping the future may or may not have released the lease; calling release again is
    /// safe (it answers `Lost` if the first one went through).
    #[tracing::instrument(
        level = "debug",
        name = "release",
        skip_all,
        fields(store = "redis", key = lease.key(), token = lease.fencing_token()),
        ret(level = "debug"), err(level = "debug")
    )]
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let names = self.names(lease.key());
        let owner = lease.owner();
        let released = self
            .run("release", |mut conn| async move {
                release_on(&mut conn, &names, owner).await
            })
            .await?;
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        })
    }
}

#[async_trait]
impl Extend for RedisStore {
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease on the server; the local
    /// deadline only moves once the answer is read.
    #[tracing::instrument(
        level = "trace",
        name = "extend",
        skip_all,
        fields(store = "redis", key = lease.key(), token = lease.fencing_token()),
        err(level = "debug")
    )]
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let names = self.names(lease.key());
        let (owner, ttl) = (lease.owner(), lease.ttl());
        let sent_at = Instant::now();
        let extended = self
            .run("extend", |mut conn| async move {
                extend_on(&mut conn, &names, owner, ttl).await
            })
            .await?;
        if extended {
            lease.confirm(sent_at);
            Ok(())
        } else {
            Err(Error::lost(
                lease,
                "the Redis key expired, was released, or is held by another owner",
            ))
        }
    }
}

#[async_trait]
impl LockStore for RedisStore {
    /// Millisecond TTLs (`PX`), notified waits (pub/sub), no fair queue, and a dead holder's
    /// lock lives until its TTL.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_notified_wait(true)
            .with_frees_on_disconnect(false)
            .with_fair_queue(false)
            .with_ttl_granularity(Duration::from_millis(1))
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        check_key(key)?;
        let names = self.names(key);
        self.run("status", |mut conn| async move {
            status_on(&mut conn, &names).await
        })
        .await
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.inner.config)
            .field("waited_channels", &self.inner.subscriber.channels())
            .field("eviction", &self.inner.eviction.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_share_a_hash_tag() {
        let names = KeyNames::new("fencelock:", "jobs/nightly");
        assert_eq!(names.lock, "fencelock:{jobs/nightly}:lock");
        assert_eq!(names.fence, "fencelock:{jobs/nightly}:fence");
        assert_eq!(names.channel, "fencelock:{jobs/nightly}:released");
        // Braces and percent signs: the tag (first `{` to the first `}` after it) is the whole
        // escaped key, the same in all three names, never empty, and distinct keys stay apart.
        let tag = |name: &str| {
            let open = name.find('{').unwrap();
            let close = open + name[open..].find('}').unwrap();
            name[open + 1..close].to_owned()
        };
        for key in ["a}b{c", "}leading", "%7D", "}", "100%", "{x}"] {
            let names = KeyNames::new("p:", key);
            assert!(!tag(&names.lock).is_empty(), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.fence), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.channel), "{key:?}");
        }
        assert_ne!(KeyNames::new("p:", "}"), KeyNames::new("p:", "%7D"));
        assert_eq!(KeyNames::new("p:", "}x").lock, "p:{%7Dx}:lock");
    }

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(10)), 10);
        assert_eq!(ttl_millis(Duration::from_micros(10_001)), 11);
        assert_eq!(ttl_millis(Duration::from_secs(86_400)), 86_400_000);
    }
}
