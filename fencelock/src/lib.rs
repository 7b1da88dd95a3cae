//! fencelock: distributed locks that are honest about what they guarantee.
//!
//! One contract ([`LockStore`], re-exported from `fencelock-core`), many stores, one conformance
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
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod connect;
pub mod faults;
mod stores;

pub use connect::connect;
pub use fencelock_core::*;
pub use stores::{known_schemes, redact, store_for, KnownStore, KNOWN_STORES, STORES};

/// The Redis stores' own types (the eviction check, Redlock's quorum error), for code that
/// downcasts a [`DynLockStore`] to [`fencelock_redis::RedisStore`] or [`fencelock_redis::RedlockStore`].
#[cfg(feature = "redis")]
pub use fencelock_redis;

/// The etcd store's own types: its [`Layout`](fencelock_etcd::Layout), and
/// [`mutex_key`](fencelock_etcd::mutex_key), the `ETCD_LOCK_KEY` of a lease granted in etcd's own
/// layout.
#[cfg(feature = "etcd")]
pub use fencelock_etcd;

/// The PostgreSQL store's own type, for code that downcasts a [`DynLockStore`] to
/// [`fencelock_postgres::PostgresStore`] (`lockctl stats` counts its fence rows).
#[cfg(feature = "postgres")]
pub use fencelock_postgres;

/// The SQLite store's own type, for code that downcasts a [`DynLockStore`] to
/// [`fencelock_sqlite::SqliteStore`] (`lockctl stats` counts its rows).
#[cfg(feature = "sqlite")]
pub use fencelock_sqlite;

/// The MySQL store's own type, for code that downcasts a [`DynLockStore`] to
/// [`fencelock_mysql::MysqlStore`] (`lockctl stats` counts its fence rows).
#[cfg(feature = "mysql")]
pub use fencelock_mysql;
