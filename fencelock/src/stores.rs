//! URL → store: the one list of stores this facade knows, and which of them this build has.

use fencelock_core::StoreKind;

pub use fencelock_core::raw::url::redact;

use crate::{Error, Result};

/// Every store crate the facade knows, one line each: the cargo feature that compiles it in,
/// the crate, and each of its descriptors with its name and schemes again for builds without
/// that feature (which cannot name the descriptor; a test checks the two agree). The line also
/// re-exports the crate, for code that downcasts a [`DynLockStore`](crate::DynLockStore) to a
/// store's own type. A new store is one line here and one feature in `Cargo.toml`.
macro_rules! stores {
    ($($feature:literal => $krate:ident {
        $($descriptor:ident: $name:literal, [$($scheme:literal),+ $(,)?];)+
    })+) => {
        /// The stores compiled into this build, the memory store first.
        pub static STORES: &[StoreKind] = &[
            fencelock_core::MEMORY,
            $($(#[cfg(feature = $feature)] $krate::$descriptor,)+)+
        ];

        /// Every store the facade knows, compiled in or not, the memory store first.
        pub static KNOWN_STORES: &[KnownStore] = &[
            KnownStore {
                name: "memory",
                schemes: &["memory"],
                feature: "",
                compiled: true,
            },
            $($(KnownStore {
                name: $name,
                schemes: &[$($scheme),+],
                feature: $feature,
                compiled: cfg!(feature = $feature),
            },)+)+
        ];

        $(
            #[doc = concat!("The `", stringify!($krate), "` crate (feature `", $feature, "`): its \
                own types, for code that downcasts a [`DynLockStore`](crate::DynLockStore) to \
                its store, and its configuration.")]
            #[cfg(feature = $feature)]
            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            pub use $krate;
        )+
    };
}

stores! {
    "redis" => fencelock_redis {
        REDIS: "redis", ["redis", "rediss"];
        REDIS_CLUSTER: "redis-cluster", ["redis+cluster"];
        REDIS_SENTINEL: "redis-sentinel", ["redis+sentinel", "rediss+sentinel"];
        REDLOCK: "redlock", ["redlock"];
    }
    "etcd" => fencelock_etcd { ETCD: "etcd", ["etcd", "etcds"]; }
    "postgres" => fencelock_postgres { POSTGRES: "postgres", ["postgres", "postgresql"]; }
    "mysql" => fencelock_mysql { MYSQL: "mysql", ["mysql", "mariadb"]; }
    "sqlite" => fencelock_sqlite { SQLITE: "sqlite", ["sqlite"]; }
    "zookeeper" => fencelock_zookeeper { ZOOKEEPER: "zookeeper", ["zookeeper", "zookeepers"]; }
}

/// A store the facade knows by name, whether or not this build compiled it in: enough to
/// tell a user which feature to enable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KnownStore {
    /// The store's name, as in its [`StoreKind::name`].
    pub name: &'static str,
    /// The URL schemes it serves.
    pub schemes: &'static [&'static str],
    /// The cargo feature of `fencelock` that compiles it in (empty: always compiled).
    pub feature: &'static str,
    /// Whether this build compiled it in.
    pub compiled: bool,
}

/// Every scheme spelling [`connect`](crate::connect) knows, compiled in or not, in list order.
pub fn known_schemes() -> impl Iterator<Item = &'static str> {
    KNOWN_STORES
        .iter()
        .flat_map(|known| known.schemes.iter().copied())
}

/// The compiled-in store that serves `url`'s scheme (any case).
///
/// Messages never print the URL's password.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a URL without a scheme or with an
/// unknown one (the message lists the known schemes), or a store this build did not compile
/// in (the message names the feature to enable).
pub fn store_for(url: &str) -> Result<&'static StoreKind> {
    let known = || known_schemes().collect::<Vec<_>>().join(", ");
    let Some((scheme, _)) = url.split_once("://") else {
        // Not echoed: text without a scheme may be `user:password@host`, which redact keeps.
        return Err(Error::invalid(
            "url",
            format!(
                "the URL has no scheme (`scheme://…`); expected one of {}",
                known()
            ),
        ));
    };
    if let Some(kind) = STORES.iter().find(|kind| kind.serves(scheme)) {
        return Ok(kind);
    }
    let Some(absent) = KNOWN_STORES
        .iter()
        .find(|known| known.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
    else {
        // The scheme is the user's text before `://`, never the password.
        return Err(Error::invalid(
            "url",
            format!("unknown scheme {scheme:?}; known schemes: {}", known()),
        ));
    };
    Err(Error::invalid(
        "url",
        format!(
            "the {} store is not compiled in: enable fencelock's `{}` feature (or `full`)",
            absent.name, absent.feature
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_find_their_store() {
        let table: &[(&str, Option<&str>)] = &[
            ("memory://", Some("memory")),
            ("memory://shared", Some("memory")),
            ("redis://127.0.0.1:6379/0", Some("redis")),
            ("rediss://user:pw@example.com:6380", Some("redis")),
            ("REDIS://127.0.0.1", Some("redis")),
            ("redlock://a:1,b:2,c:3", Some("redlock")),
            ("etcd://a:2379,b:2379", Some("etcd")),
            ("etcds://a:2379", Some("etcd")),
            ("postgres://u:p@h/db?sslmode=require", Some("postgres")),
            ("postgresql://h/db", Some("postgres")),
            ("mysql://u:p@h:3306/db?namespace=billing", Some("mysql")),
            ("mariadb://h/db", Some("mysql")),
            ("sqlite:///var/lib/myapp/locks.db", Some("sqlite")),
            ("sqlite://locks.db?table=app_locks", Some("sqlite")),
            ("consul://h", None),
            ("127.0.0.1:6379", None),
            ("", None),
        ];
        for (url, expected) in table {
            let compiled = expected.is_some_and(|name| {
                KNOWN_STORES
                    .iter()
                    .any(|known| known.name == name && known.compiled)
            });
            match (store_for(url), expected) {
                (Ok(kind), Some(expected)) => assert_eq!(kind.name, *expected, "{url}"),
                (Err(Error::InvalidInput { what, rule }), Some(_)) if !compiled => {
                    assert_eq!(what, "url");
                    assert!(rule.contains("feature"), "{url}: {rule}");
                }
                (Err(Error::InvalidInput { what, rule }), None) => {
                    assert_eq!(what, "url");
                    assert!(rule.contains("redis, rediss"), "{url}: {rule}");
                }
                (other, _) => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn errors_never_print_the_password() {
        for url in ["user:hunter2@h:6379", "zk://user:hunter2@h:2181"] {
            match store_for(url) {
                Err(error) => assert!(!error.to_string().contains("hunter2"), "{error}"),
                Ok(kind) => panic!("{url}: {kind:?}"),
            }
        }
    }

    /// A store's line in `stores!` repeats its name and schemes for builds without it; with
    /// the feature on they must be the descriptor's own.
    #[test]
    fn every_compiled_store_matches_its_known_line() {
        for kind in STORES {
            let known = KNOWN_STORES
                .iter()
                .find(|known| known.name == kind.name)
                .unwrap_or_else(|| panic!("{} has no known line", kind.name));
            assert_eq!(known.schemes, kind.schemes, "{}", kind.name);
            assert_eq!(known.feature, kind.feature, "{}", kind.name);
            assert!(known.compiled, "{}", kind.name);
        }
        let compiled = KNOWN_STORES.iter().filter(|known| known.compiled).count();
        assert_eq!(
            compiled,
            STORES.len(),
            "a known store is compiled but not listed"
        );
    }

    #[test]
    fn no_scheme_is_served_twice() {
        let schemes: Vec<&str> = known_schemes().collect();
        for (i, scheme) in schemes.iter().enumerate() {
            assert!(!schemes[i + 1..].contains(scheme), "{scheme} twice");
        }
    }
}
