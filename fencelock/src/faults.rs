//! Faults for tests and `lockctl conformance`: a handle that cannot reach its store. (The
//! operator's eviction is [`LockStore::evict`](crate::LockStore::evict) on any handle.)

use std::sync::Arc;

use crate::{raw, DynLockStore, Error, Lease, MemoryStore, Result};

/// A handle to a store of `url`'s kind that cannot be reached: the same scheme and options,
/// pointed at a closed loopback port (the memory store: a store switched unreachable; a store
/// with no host, such as SQLite's file, makes its own through
/// [`StoreKind::unreachable`](crate::StoreKind::unreachable)).
///
/// If the store refuses to even construct a handle for an unreachable address, the handle
/// returned answers every call with that connect error, which is what a caller would see.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a URL [`connect`](crate::connect)
/// refuses as written (scheme, options); [`Unavailable`](crate::ErrorKind::Unavailable) when
/// no free loopback port can be found (SQLite: no locked-out database can be made);
/// [`Store`](crate::ErrorKind::Store) when the store refuses the handle for another reason
/// than being unreachable. An unreachable store is not
/// an error here: the handle fails with `Unavailable` on every call.
///
/// # Cancel safety
/// Nothing is held; dropping the future loses nothing.
pub async fn unreachable(url: &str) -> Result<DynLockStore> {
    let kind = crate::store_for(url)?;
    if kind.name == crate::MEMORY.name {
        let store = MemoryStore::new();
        store.set_reachable(false);
        return Ok(Arc::new(store));
    }
    if let Some(unreachable) = kind.unreachable {
        return unreachable(url).await;
    }
    // As many closed ports as the URL names hosts, so a store that needs a quorum of
    // distinct nodes (Redlock) still gets one, all of them closed.
    let hosts = closed_ports(host_count(url))?
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

/// How many comma-separated hosts `url`'s authority names (at least one).
fn host_count(url: &str) -> usize {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    hosts.split(',').count().max(1)
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

// Written out in full, defaults included: a refused handle must refuse everything.
#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl raw::Store for Refused {
    fn name(&self) -> &'static str {
        "refused"
    }
    fn capabilities(&self) -> crate::Capabilities {
        crate::Capabilities::new()
    }
    fn check(&self, _: &raw::AcquireRequest<'_>) -> Result<()> {
        Ok(())
    }
    async fn acquire(&self, _: &raw::AcquireRequest<'_>) -> Result<Lease> {
        Err(self.error())
    }
    async fn release(&self, _: &Lease) -> Result<crate::ReleaseOutcome> {
        Err(self.error())
    }
    async fn extend(&self, _: &Lease) -> Result<()> {
        Err(self.error())
    }
    async fn status(&self, _: &str) -> Result<crate::KeyStatus> {
        Err(self.error())
    }
    async fn list(
        &self,
        _: &str,
        _: Option<&crate::ListCursor>,
        _: usize,
    ) -> Result<crate::Listing> {
        Err(self.error())
    }
    async fn evict(&self, _: &str) -> Result<bool> {
        Err(self.error())
    }
    async fn relabel(&self, _: &Lease, _: &str) -> Result<()> {
        Err(self.error())
    }
    async fn next_status(
        &self,
        _: &str,
        _: &crate::KeyStatus,
        _: crate::Instant,
    ) -> Result<crate::KeyStatus> {
        Err(self.error())
    }
    async fn per_key_state(&self) -> Result<Option<crate::PerKeyState>> {
        Err(self.error())
    }
    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }
    // It never grants a lease, so it has nothing to add to one.
    fn lease_env(&self, _: &Lease) -> Vec<(String, String)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockStore;

    #[test]
    fn hosts_are_counted_past_the_user_info() {
        assert_eq!(host_count("redlock://u:p,w@a:1,b:2,c:3/0?prefix=x,y"), 3);
        assert_eq!(host_count("redis://h:6379"), 1);
        assert_eq!(host_count("postgres:///db"), 1);
    }

    #[tokio::test]
    async fn a_refused_handle_refuses_every_call() {
        let store = Refused("connection refused".into());
        assert!(store.status("k").await.is_err_and(|e| e.is_retryable()));
        assert!(store.evict("k").await.is_err_and(|e| e.is_retryable()));
        assert!(store.per_key_state().await.is_err_and(|e| e.is_retryable()));
    }

    /// A file has no host: retargeting would have turned the path into a relative one under
    /// `127.0.0.1:<port>/` and opened a working database there.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn an_unreachable_sqlite_handle_refuses_and_touches_nothing_at_the_path() {
        let dir =
            std::env::temp_dir().join(format!("fencelock-faults-sqlite-{}", std::process::id()));
        let url = format!(
            "sqlite://{}?command_timeout=1s&connect_timeout=1s",
            dir.join("locks.db").display()
        );
        let store = unreachable(&url).await.expect("an unreachable handle");
        let ttl = std::time::Duration::from_secs(5);
        match store.try_acquire("k", ttl).await {
            Err(error) => assert!(error.is_retryable(), "{error}"),
            Ok(lease) => panic!("an unreachable store granted {lease:?}"),
        }
        assert!(!dir.exists(), "{} was created", dir.display());
    }

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
