#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): keys, sql, config, error, session, cleanup, watch, store, descriptor.
mod cleanup;
mod config;
mod descriptor;
mod error;
mod keys;
mod session;
mod sql;
mod store;
mod watch;

pub use config::{
    PostgresConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IDLE,
    DEFAULT_MAX_SKEW, DEFAULT_NAMESPACE, DEFAULT_SCHEMA, DEFAULT_TABLE, MIN_TTL, TOKEN_GRANULE,
    URL_SCHEMES,
};
pub use descriptor::POSTGRES;
pub use keys::{lock_id, pg_locks_ids, raw_key_name, FENCE_SCHEME, LOCK_ID_SCHEME};
pub use store::PostgresStore;
