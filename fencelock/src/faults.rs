//! Operator actions for fault tests and `lockctl conformance`. A lock holder never needs these.

use std::sync::Arc;

use crate::{DynLockStore, Error, Lease, MemoryStore, Result, Scheme};

/// A handle to a store of `url`'s kind that cannot be reached: the same scheme and options,
/// pointed at a closed loopback port (the memory store: a store switched unreachable).
///
/// If the store refuses to even construct a handle for an unreachable address, the handle
/// returned answers every call with that connect error, which is what a caller would see.
///
/// # Cancel safety
/// Nothing is held; dropping the future loses nothing.
pub async fn unreachable(url: &str) -> Result<DynLockStore> {
    let scheme = Scheme::of(url)?;
    if scheme == Scheme::Memory {
        let store = MemoryStore::new();
        store.set_reachable(false);
        return Ok(Arc::new(store));
    }
    // Redlock needs a quorum of distinct nodes, all of them closed.
    let nodes = if scheme == Scheme::Redlock { 3 } else { 1 };
    let hosts = closed_ports(nodes)?
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",");
    let target = retarget(url, &hosts);
    match crate::connect(&target).await {
        Ok(store) => Ok(store),
        Err(error) if error.is_retryable() => Ok(Arc::new(Refused(error.to_string()))),
        Err(error) => Err(error),
    }
}

/// Makes the store behind `url` forget `lease` behind its holder's back, as an operator
/// deleting the key (or killing the session) would.
///
/// # Cancel safety
/// The forgetting may or may not have happened when the future is dropped.
pub async fn forget(url: &str, lease: &Lease) -> Result<()> {
    match Scheme::of(url)? {
        Scheme::Memory => {
            crate::connect::named_memory(url).forget(lease.key());
            Ok(())
        }
        #[cfg(feature = "redis")]
        Scheme::Redis => {
            // Deleting the lock key is how an operator frees a Redis lock.
            let config = lock_redis::RedisConfig::from_url(url)?;
            let store = lock_redis::RedisStore::connect(config).await?;
            store.evict(lease.key()).await.map(drop)
        }
        #[cfg(feature = "redis")]
        Scheme::Redlock => {
            // Deleting the lock key on every master frees a Redlock lock.
            let config = lock_redis::RedlockConfig::from_url(url)?;
            let store = lock_redis::RedlockStore::connect(config).await?;
            store.evict(lease.key()).await.map(drop)
        }
        #[cfg(feature = "etcd")]
        Scheme::Etcd => {
            // Deleting the holder's key frees an etcd lock; its lease may serve others.
            let config = lock_etcd::EtcdConfig::from_url(url)?;
            let store = lock_etcd::EtcdStore::connect(config).await?;
            store.evict(lease.key()).await.map(drop)
        }
        #[cfg(feature = "postgres")]
        Scheme::Postgres => {
            // Ending the holder's session is how an operator frees an advisory lock.
            let config = lock_postgres::PostgresConfig::from_url(url)?;
            let store = lock_postgres::PostgresStore::connect(config).await?;
            store.terminate_holder(lease.key()).await.map(drop)
        }
        // Reached only in builds without some store's feature.
        #[allow(unreachable_patterns)]
        scheme if !scheme.is_enabled() => Err(scheme.not_enabled()),
        #[allow(unreachable_patterns)]
        _ => Err(Error::Unsupported {
            operation: "forget on this store",
        }),
    }
}

/// `count` distinct ports on loopback that nothing listens on (bound together, read, released).
fn closed_ports(count: usize) -> Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::unavailable("cannot find a free loopback port", e))?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::unavailable("cannot find a free loopback port", e))
}

/// `url` with its host list replaced by `hosts`, keeping scheme, user info, path and query.
fn retarget(url: &str, hosts: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("{scheme}://{user}{hosts}{tail}")
}

/// A store whose every call fails with the connect error that made it.
#[derive(Debug)]
struct Refused(String);

impl Refused {
    fn error(&self) -> Error {
        Error::Unavailable {
            message: self.0.clone(),
            source: None,
        }
    }
}

#[async_trait::async_trait]
impl crate::Acquire for Refused {
    async fn try_acquire(&self, _: &str, _: std::time::Duration) -> Result<Lease> {
        Err(self.error())
    }
    async fn acquire(
        &self,
        _: &str,
        _: std::time::Duration,
        _: std::time::Duration,
    ) -> Result<Lease> {
        Err(self.error())
    }
}

#[async_trait::async_trait]
impl crate::Release for Refused {
    async fn release(&self, _: &Lease) -> Result<crate::ReleaseOutcome> {
        Err(self.error())
    }
}

#[async_trait::async_trait]
impl crate::Extend for Refused {
    async fn extend(&self, _: &Lease) -> Result<()> {
        Err(self.error())
    }
}

#[async_trait::async_trait]
impl crate::LockStore for Refused {
    fn capabilities(&self) -> crate::Capabilities {
        crate::Capabilities::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retargeting_keeps_everything_but_the_hosts() {
        assert_eq!(
            retarget("redis://u:p@h:6379/2?prefix=x", "127.0.0.1:9"),
            "redis://u:p@127.0.0.1:9/2?prefix=x"
        );
        assert_eq!(
            retarget("etcd://a:1,b:2?prefix=x", "127.0.0.1:9"),
            "etcd://127.0.0.1:9?prefix=x"
        );
        assert_eq!(
            retarget(
                "redlock://a:1,b:2,c:3?prefix=x",
                "127.0.0.1:7,127.0.0.1:8,127.0.0.1:9"
            ),
            "redlock://127.0.0.1:7,127.0.0.1:8,127.0.0.1:9?prefix=x"
        );
    }
}
