//! The raw fenced floors the Redis benchmark measures ours against, written by hand with the
//! same client: the fenced floor's two scripts, and the durable floor whose tokens survive the loss of
//! the counter. Shared by `bench.rs` and `cycle_cost.rs`.

use std::time::Duration;

use fencelock_core::OwnerId;
use redis::aio::ConnectionManager;

/// Maps the raw client's error to a store error naming `what` failed.
fn failed_as(what: &'static str) -> impl Fn(redis::RedisError) -> fencelock_core::Error {
    move |e| fencelock_core::Error::store(what, e)
}

/// The fenced floor's acquire, exactly as the fenced floor defines it: `SET NX PX`, then the token from a
/// counter. KEYS: lock, counter. ARGV: owner, ttl ms. Returns the token, 0 if held.
pub(crate) const FLOOR_ACQUIRE: &str = "if redis.call('SET',KEYS[1],ARGV[1],'NX','PX',ARGV[2]) then return redis.call('INCR',KEYS[2]) end return 0";

/// The fenced floor's release, exactly as the fenced floor defines it: compare, delete, wake waiters.
/// KEYS: lock. ARGV: owner. Returns 1 if released.
pub(crate) const FLOOR_RELEASE: &str = "if redis.call('GET',KEYS[1])==ARGV[1] then redis.call('DEL',KEYS[1]) redis.call('PUBLISH',KEYS[1],'') return 1 end return 0";

/// The acquire of the *durable* fenced floor: the smallest by hand whose tokens survive the
/// loss of the counter, as ours must (the crate docs, `# Per-key state`): `SET NX PX`, then
/// the token max(counter + 1, server µs) written with the counter's expiry in one `SET … GET`
/// (Redis 6.2+), the clock kept as the digits `TIME` gave (µs padded by one concatenation, as
/// ours) and compared as strings (no number conversion, the cheapest way found). KEYS: lock,
/// counter. ARGV: owner, ttl ms, retention ms. Returns the token (its digits), 0 if held.
pub(crate) const DURABLE_ACQUIRE: &str = "if redis.call('SET',KEYS[1],ARGV[1],'NX','PX',ARGV[2]) then local t=redis.call('TIME') local now=t[1]..string.sub('00000',#t[2])..t[2] local old=redis.call('SET',KEYS[2],now,'PX',ARGV[3],'GET') if old and (#old>#now or (#old==#now and old>=now)) then now=tonumber(old)+1 redis.call('SET',KEYS[2],now,'PX',ARGV[3]) end return now end return 0";

/// The retention window the durable floor gives its counter: the store's default, 7 days.
pub(crate) const RETENTION_MS: u64 = 7 * 86_400_000;

/// The two scripts of a fenced floor.
#[derive(Clone)]
pub(crate) struct Floor {
    acquire: redis::Script,
    release: redis::Script,
    /// The durable floor's retention argument, `None` for the floor.
    retention: Option<u64>,
    /// Where its keys live: `floor:` or `durable:`.
    prefix: &'static str,
}

impl Floor {
    /// The floor.
    pub(crate) fn new() -> Self {
        Floor {
            acquire: redis::Script::new(FLOOR_ACQUIRE),
            release: redis::Script::new(FLOOR_RELEASE),
            retention: None,
            prefix: "floor:",
        }
    }

    /// The durable floor: tokens that survive losing the counter, the same release.
    pub(crate) fn durable() -> Self {
        Floor {
            acquire: redis::Script::new(DURABLE_ACQUIRE),
            release: redis::Script::new(FLOOR_RELEASE),
            retention: Some(RETENTION_MS),
            prefix: "durable:",
        }
    }

    /// The floor's lock key for `key`; its release publishes on it.
    pub(crate) fn lock_key(&self, key: &str) -> String {
        format!("{}{{{key}}}:lock", self.prefix)
    }

    /// The floor's counter key for `key`.
    fn counter_key(&self, key: &str) -> String {
        format!("{}{{{key}}}:fence", self.prefix)
    }

    /// One fenced cycle by hand on `key`: the acquire script with a fresh random owner (as a
    /// correct lock needs; the same 32 hex digits as ours), a token checked to be there, then
    /// the release script.
    pub(crate) async fn cycle(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
        ttl: Duration,
    ) -> fencelock_core::Result<()> {
        let owner =
            self.try_acquire(conn, key, ttl)
                .await?
                .ok_or_else(|| fencelock_core::Error::Busy {
                    key: key.to_owned(),
                })?;
        self.release(conn, key, &owner).await
    }

    /// The acquire script once on `key` with a fresh random owner: the owner if it minted a
    /// token, `None` if the key is held.
    pub(crate) async fn try_acquire(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
        ttl: Duration,
    ) -> fencelock_core::Result<Option<String>> {
        let owner = OwnerId::random().to_string();
        let (lock, counter) = (self.lock_key(key), self.counter_key(key));
        let mut acquire = self.acquire.key(&lock);
        acquire
            .key(&counter)
            .arg(&owner)
            .arg(ttl.as_millis() as u64);
        if let Some(retention) = self.retention {
            acquire.arg(retention);
        }
        let token: i64 = acquire
            .invoke_async(conn)
            .await
            .map_err(failed_as("EVALSHA floor acquire"))?;
        Ok((token > 0).then_some(owner))
    }

    /// The release script on `key` for `owner`, checked to have released.
    pub(crate) async fn release(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
        owner: &str,
    ) -> fencelock_core::Result<()> {
        let released: i64 = self
            .release
            .key(self.lock_key(key))
            .arg(owner)
            .invoke_async(conn)
            .await
            .map_err(failed_as("EVALSHA floor release"))?;
        if released != 1 {
            return Err(fencelock_core::Error::Store {
                message: format!("floor release of {key} found another owner"),
                source: None,
            });
        }
        Ok(())
    }
}
