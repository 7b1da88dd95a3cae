//! `connect(url)`: the one entry point that turns a URL into a store.

use crate::{store_for, DynLockStore, Result};

/// Connects to the store `url` names and returns it as the contract's trait object.
///
/// The stores this build knows, their URL schemes and the cargo feature of each are the
/// facade's one list: [`STORES`](crate::STORES) (compiled in) and
/// [`KNOWN_STORES`](crate::KNOWN_STORES) (every store, compiled in or not); the workspace
/// README's URL table shows each store's options.
///
/// The store is picked from [`STORES`](crate::STORES) by the URL's scheme and connected
/// through its descriptor. With the `metrics` feature the store comes wrapped in
/// [`Metered`](crate::Metered), labelled with the descriptor's name; reach the store inside
/// with [`downcast_ref`](crate::LockStore#method.downcast_ref).
///
/// Store options ride in the query string (key prefix, timeouts, namespace); each store
/// crate documents its own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{ErrorKind, LockStoreExt};
///
/// let store = fencelock::connect("memory://orders").await?;
/// let guard = store.lock("order-42").await?;
/// // A second handle on the same named store sees the key held.
/// let other = fencelock::connect("memory://orders").await?;
/// assert_eq!(other.lock("order-42").await.unwrap_err().kind(), ErrorKind::Contended);
/// guard.release().await?;
///
/// let unknown = fencelock::connect("gopher://127.0.0.1:70").await.unwrap_err();
/// assert_eq!(unknown.kind(), ErrorKind::InvalidInput); // the message lists the known schemes
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a malformed URL, an unknown scheme
/// (the message lists the known ones) or a scheme whose feature is off (the message names the
/// feature); [`Unavailable`](crate::ErrorKind::Unavailable) when the store cannot be reached
/// within its connect timeout; [`Store`](crate::ErrorKind::Store) when it refuses the
/// connection (credentials, a table of another layout).
///
/// # Cancel safety
/// Dropping the future drops any half-made connection; nothing is held yet.
pub async fn connect(url: &str) -> Result<DynLockStore> {
    let kind = store_for(url)?;
    let store = (kind.connect)(url).await?;
    #[cfg(feature = "metrics")]
    let store: DynLockStore = std::sync::Arc::new(crate::Metered::new(store, kind.name));
    Ok(store)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Error, KNOWN_STORES};

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

    #[cfg(feature = "metrics")]
    #[tokio::test]
    async fn connect_meters_the_store_under_its_descriptors_name() {
        let store = connect("memory://metered").await.unwrap();
        let metered = store.downcast_ref::<crate::Metered>().expect("metered");
        assert_eq!(metered.name(), crate::MEMORY.name);
        assert!(store.downcast_ref::<crate::MemoryStore>().is_some());
    }

    #[tokio::test]
    async fn disabled_and_unknown_schemes_say_what_to_do() {
        for (url, needle) in [
            ("redis://127.0.0.1:1", "`redis` feature"),
            ("redlock://a:1,b:2,c:3", "`redis` feature"),
            ("etcd://127.0.0.1:1", "`etcd` feature"),
            ("postgres://127.0.0.1:1/db", "`postgres` feature"),
            ("mysql://127.0.0.1:1/db", "`mysql` feature"),
            ("mariadb://127.0.0.1:1/db", "`mysql` feature"),
            ("sqlite:///nonexistent/locks.db", "`sqlite` feature"),
            ("zookeeper://h:2181", "known schemes"),
        ] {
            let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
            let compiled = KNOWN_STORES
                .iter()
                .any(|known| known.compiled && known.schemes.contains(&scheme));
            if compiled {
                continue; // connect would try the network
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
