#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod connect;
pub mod faults;
mod stores;

pub use connect::connect;
pub use fencelock_core::*;
pub use stores::{known_schemes, redact, store_for, KnownStore, KNOWN_STORES, STORES};

/// The resource side: a PostgreSQL row, a Redis key or a local file that refuses a superseded
/// holder's writes (the `fencelock-fence` crate), one feature each: `fence-postgres`,
/// `fence-redis`, `fence-file`.
#[cfg(any(
    feature = "fence-file",
    feature = "fence-postgres",
    feature = "fence-redis"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "fence-file",
        feature = "fence-postgres",
        feature = "fence-redis"
    )))
)]
pub use fencelock_fence as fence;

/// The Redis stores' own types (the eviction check, Redlock's quorum error), for code that
/// downcasts a [`DynLockStore`] to [`fencelock_redis::RedisStore`] or [`fencelock_redis::RedlockStore`].
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use fencelock_redis;

/// The etcd store's own types: its [`Layout`](fencelock_etcd::Layout), and
/// [`mutex_key`](fencelock_etcd::mutex_key), the `ETCD_LOCK_KEY` of a lease granted in etcd's own
/// layout.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use fencelock_etcd;

/// The PostgreSQL store's own type, for code that downcasts a [`DynLockStore`] to
/// [`fencelock_postgres::PostgresStore`] (`lockctl stats` counts its fence rows).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use fencelock_postgres;

/// The SQLite store's own type, for code that downcasts a [`DynLockStore`] to
/// [`fencelock_sqlite::SqliteStore`] (`lockctl stats` counts its rows).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use fencelock_sqlite;

/// The MySQL store's own type, for code that downcasts a [`DynLockStore`] to
/// [`fencelock_mysql::MysqlStore`] (`lockctl stats` counts its fence rows).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use fencelock_mysql;

/// The workspace's pages, whose Rust blocks compile (and run, unless marked otherwise) as
/// doctests of this crate, so no page shows code that does not build. They use every store and
/// resource, so they are compiled with all of them (`--all-features`, as `scripts/test.sh`).
#[cfg(all(
    doctest,
    feature = "full",
    feature = "fence-file",
    feature = "fence-postgres",
    feature = "fence-redis"
))]
mod pages {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../CONTRIBUTING.md")]
    struct Contributing;
    #[doc = include_str!("../../lockctl/README.md")]
    struct Lockctl;
    #[doc = include_str!("../../nemesis/README.md")]
    struct Nemesis;
    #[doc = include_str!("../../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../../docs/fencing.md")]
    struct Fencing;
    #[doc = include_str!("../../docs/interop.md")]
    struct Interop;
    #[doc = include_str!("../../docs/metrics.md")]
    struct Metrics;
    #[doc = include_str!("../../docs/modes.md")]
    struct Modes;
    #[doc = include_str!("../../docs/security.md")]
    struct Security;
    #[doc = include_str!("../../docs/stores.md")]
    struct Stores;
    #[doc = include_str!("../../docs/swaps.md")]
    struct Swaps;
}
