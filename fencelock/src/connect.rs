//! `connect(url)`: the one entry point that turns a URL into a store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::{DynLockStore, MemoryStore, Result, Scheme};

/// Connects to the store `url` names and returns it as the contract's trait object.
///
/// | URL | store | feature |
/// | --- | --- | --- |
/// | `memory://[name]` | in-process; the same name gives the same store within a process | always |
/// | `redis://[user:pass@]host:port[/db]`, `rediss://…` | single Redis server | `redis` |
/// | `redlock://host:port,host:port,host:port` | Redlock over independent masters | `redis` |
/// | `etcd://host:port[,host:port…]`, `etcds://…` | etcd | `etcd` |
/// | `postgres://…`, `postgresql://…` | PostgreSQL advisory locks | `postgres` |
///
/// Store options ride in the query string (key prefix, timeouts, namespace); each store
/// crate documents its own. Errors: [`Error::InvalidInput`](crate::Error::InvalidInput) for a
/// malformed URL, an unknown scheme (the message lists the known ones) or a scheme whose
/// feature is off (the message names the feature); [`Error::Unavailable`](crate::Error::Unavailable)
/// when the store cannot be reached within its connect timeout.
///
/// # Cancel safety
/// Dropping the future drops any half-made connection; nothing is held yet.
pub async fn connect(url: &str) -> Result<DynLockStore> {
    let scheme = Scheme::of(url)?;
    if !scheme.is_enabled() {
        return Err(scheme.not_enabled());
    }
    match scheme {
        Scheme::Memory => Ok(Arc::new(named_memory(url))),
        #[cfg(feature = "redis")]
        Scheme::Redis => {
            let config = lock_redis::RedisConfig::from_url(url)?;
            Ok(Arc::new(lock_redis::RedisStore::connect(config).await?))
        }
        #[cfg(feature = "redis")]
        Scheme::Redlock => {
            let config = lock_redis::RedlockConfig::from_url(url)?;
            Ok(Arc::new(lock_redis::RedlockStore::connect(config).await?))
        }
        #[cfg(feature = "etcd")]
        Scheme::Etcd => {
            let config = lock_etcd::EtcdConfig::from_url(url)?;
            Ok(Arc::new(lock_etcd::EtcdStore::connect(config).await?))
        }
        #[cfg(feature = "postgres")]
        Scheme::Postgres => {
            let config = lock_postgres::PostgresConfig::from_url(url)?;
            Ok(Arc::new(
                lock_postgres::PostgresStore::connect(config).await?,
            ))
        }
        #[allow(unreachable_patterns)]
        other => Err(other.not_enabled()),
    }
}

/// Named memory stores live as long as the process, so two `connect("memory://x")` meet.
pub(crate) fn named_memory(url: &str) -> MemoryStore {
    static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
    let name = url
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .trim_end_matches('/');
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    stores.entry(name.to_owned()).or_default().clone()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Error;

    #[tokio::test]
    async fn the_same_memory_name_is_the_same_store() {
        let a = connect("memory://shared-name").await.unwrap();
        let b = connect("memory://shared-name").await.unwrap();
        let c = connect("memory://other-name").await.unwrap();
        let lease = a.try_acquire("k", Duration::from_secs(5)).await.unwrap();
        assert!(matches!(
            b.try_acquire("k", Duration::from_secs(5)).await,
            Err(Error::Busy { .. })
        ));
        let other = c.try_acquire("k", Duration::from_secs(5)).await.unwrap();
        let _ = a.release(&lease).await.unwrap();
        let _ = c.release(&other).await.unwrap();
    }

    #[tokio::test]
    async fn disabled_and_unknown_schemes_say_what_to_do() {
        for (url, needle) in [
            ("redis://127.0.0.1:1", "`redis` feature"),
            ("redlock://a:1,b:2,c:3", "`redis` feature"),
            ("etcd://127.0.0.1:1", "`etcd` feature"),
            ("postgres://127.0.0.1:1/db", "`postgres` feature"),
            ("zookeeper://h:2181", "known schemes"),
        ] {
            let scheme = Scheme::of(url);
            if scheme.as_ref().is_ok_and(|s| s.is_enabled()) {
                continue; // compiled in: connect would try the network
            }
            match connect(url).await {
                Err(Error::InvalidInput { what: "url", rule }) => {
                    assert!(rule.contains(needle), "{url}: {rule}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
