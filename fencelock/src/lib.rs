//! fencelock: distributed locks that are honest about what they guarantee.
//!
//! One contract ([`LockStore`], re-exported from `lock-core`), many stores, one conformance
//! suite. Pick stores with cargo features (`redis`, `etcd`, `postgres`, `mysql`, `sqlite`, or
//! `full`; the in-memory store is always there) and choose one at run time by URL with
//! [`connect`], so swapping stores is a configuration change. Each store crate describes itself in one
//! [`StoreKind`]; [`STORES`] lists those compiled in.
//!
//! A lease is exclusive while it lasts and carries a fencing token that only grows per key. No
//! lock can stop a paused process from writing after its lease ends, so a lock alone is an
//! efficiency tool: for correctness, make the resource check the token ([`FenceGate`], or
//! `UPDATE … WHERE fence < $token`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> fencelock::Result<()> {
//! use std::time::Duration;
//! let store = fencelock::connect("memory://").await?;
//! let lease = store.try_acquire("nightly-export", Duration::from_secs(30)).await?;
//! println!("token {}", lease.fencing_token());
//! store.release(&lease).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod connect;
pub mod faults;
mod stores;

pub use connect::connect;
pub use lock_core::*;
pub use stores::{known_schemes, redact, store_for, KnownStore, KNOWN_STORES, STORES};

/// The Redis stores' own types (the eviction check, Redlock's quorum error), for code that
/// downcasts a [`DynLockStore`] to [`lock_redis::RedisStore`] or [`lock_redis::RedlockStore`].
#[cfg(feature = "redis")]
pub use lock_redis;

/// The etcd store's own types: its [`Layout`](lock_etcd::Layout), and
/// [`mutex_key`](lock_etcd::mutex_key), the `ETCD_LOCK_KEY` of a lease granted in etcd's own
/// layout.
#[cfg(feature = "etcd")]
pub use lock_etcd;

/// The PostgreSQL store's own type, for code that downcasts a [`DynLockStore`] to
/// [`lock_postgres::PostgresStore`] (`lockctl stats` counts its fence rows).
#[cfg(feature = "postgres")]
pub use lock_postgres;

/// The SQLite store's own type, for code that downcasts a [`DynLockStore`] to
/// [`lock_sqlite::SqliteStore`] (`lockctl stats` counts its rows).
#[cfg(feature = "sqlite")]
pub use lock_sqlite;

/// The MySQL store's own type, for code that downcasts a [`DynLockStore`] to
/// [`lock_mysql::MysqlStore`] (`lockctl stats` counts its fence rows).
#[cfg(feature = "mysql")]
pub use lock_mysql;
