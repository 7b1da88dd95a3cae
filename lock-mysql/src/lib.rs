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
    min_retention, MysqlConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IDLE,
    DEFAULT_NAMESPACE, DEFAULT_TABLE, MAX_CLOCK_STEP_BACK, MIN_TTL, TOKEN_GRANULE, URL_SCHEMES,
};
pub use descriptor::MYSQL;
pub use keys::{lock_name, LOCK_ID_SCHEME};
pub use store::MysqlStore;
