#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// Module order (each imports only from those before it): clock, keys, sql, config, error,
// lockout, watch, local, crash_hooks, store, descriptor.
mod clock;
mod config;
#[cfg(feature = "crash-hooks")]
#[cfg_attr(docsrs, doc(cfg(feature = "crash-hooks")))]
pub mod crash_hooks;
mod descriptor;
mod error;
mod keys;
mod local;
mod lockout;
mod sql;
mod store;
mod watch;

pub use config::{
    min_retention, SqliteConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TABLE,
    MAX_CLOCK_STEP_BACK, MIN_TTL, TOKEN_GRANULE, URL_SCHEMES,
};
pub use descriptor::SQLITE;
pub use lockout::Lockout;
pub use store::SqliteStore;
