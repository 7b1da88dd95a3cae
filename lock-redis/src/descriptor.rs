//! The descriptors the `fencelock` facade lists: one per store this crate implements.

use std::sync::Arc;

use fencelock_core::raw::BoxFuture;
use fencelock_core::{DynLockStore, Result, StoreKind};

use crate::config::{
    RedisConfig, REDIS_CLUSTER_URL_SCHEMES, REDIS_SENTINEL_URL_SCHEMES, REDIS_URL_SCHEMES,
};
use crate::redlock::{RedlockConfig, RedlockStore, REDLOCK_URL_SCHEMES};
use crate::store::RedisStore;

/// One Redis server: `redis://` and `rediss://` (TLS, crate feature `tls`), see
/// [`RedisConfig`].
pub const REDIS: StoreKind = StoreKind::new("redis", REDIS_URL_SCHEMES, "redis", redis)
    .with_eviction("deletes the key's lock (never its fencing counter) and wakes its waiters")
    .with_example("redis://127.0.0.1:6379")
    .with_tls_example("rediss://:PASSWORD@redis.internal:6380/0?tls_ca=/etc/fencelock/ca.pem")
    .with_options(crate::config::option_docs);

/// A Redis Cluster: `redis+cluster://host:port[,host:port…]`, see [`RedisConfig`]; the same
/// [`RedisStore`] on the Cluster client.
pub const REDIS_CLUSTER: StoreKind = StoreKind::new(
    "redis-cluster",
    REDIS_CLUSTER_URL_SCHEMES,
    "redis",
    redis,
)
.with_eviction(
    "deletes the key's lock (never its fencing counter) on its slot's master and wakes its \
         waiters",
)
.with_example("redis+cluster://a:7000,b:7001,c:7002")
.with_options(crate::config::cluster_option_docs);

/// The master of a Redis Sentinel deployment:
/// `redis+sentinel://host:26379[,host:26379…]/MASTER` and `rediss+sentinel://` (TLS, crate
/// feature `tls`), see [`RedisConfig`]; the same
/// [`RedisStore`] on the master the sentinels name, found again after a failover.
pub const REDIS_SENTINEL: StoreKind = StoreKind::new(
    "redis-sentinel",
    REDIS_SENTINEL_URL_SCHEMES,
    "redis",
    redis,
)
.with_eviction(
    "deletes the key's lock (never its fencing counter) on the master and wakes its waiters",
)
.with_example("redis+sentinel://a:26379,b:26379,c:26379/mymaster")
.with_tls_example(
    "rediss+sentinel://:PASSWORD@a:26380,b:26380,c:26380/mymaster?tls_ca=/etc/fencelock/ca.pem",
)
.with_options(crate::config::sentinel_option_docs);

/// Redlock over independent Redis masters: `redlock://host:port,host:port,host:port`, see
/// [`RedlockConfig`].
pub const REDLOCK: StoreKind = StoreKind::new("redlock", REDLOCK_URL_SCHEMES, "redis", redlock)
    .with_eviction("deletes the key's lock on every node (never the fencing counters)")
    .with_example("redlock://a:6379,b:6379,c:6379")
    .with_tls_example("redlock://a:6380,b:6380,c:6380?tls=true&tls_ca=/etc/fencelock/ca.pem")
    .with_options(crate::redlock::config::option_docs);

fn redis(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = RedisStore::connect(RedisConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}

fn redlock(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    Box::pin(async move {
        let store = RedlockStore::connect(RedlockConfig::from_url(url)?).await?;
        Ok(Arc::new(store) as DynLockStore)
    })
}
