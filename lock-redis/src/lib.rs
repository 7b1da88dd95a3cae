#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): config, error, keys, script, eviction, sentinel, cluster, subscriber, store, stats, redlock (config, quorum, fanout, store), descriptor.
mod cluster;
mod config;
mod descriptor;
mod error;
mod eviction;
#[cfg(test)]
mod floor_model;
mod keys;
mod redlock;
mod script;
mod sentinel;
mod stats;
mod store;
mod subscriber;

pub use config::{
    Layout, RedisConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    MAX_PREFIX_LEN, REDIS_CLUSTER_URL_SCHEMES, REDIS_SENTINEL_URL_SCHEMES, REDIS_URL_SCHEMES,
};
pub use descriptor::{REDIS, REDIS_CLUSTER, REDIS_SENTINEL, REDLOCK};
pub use eviction::{EvictionCheck, EvictionRisk, EvictionSettings};
pub use redlock::{QuorumError, RedlockConfig, RedlockStore, REDLOCK_URL_SCHEMES};
pub use store::{RedisStore, WAIT_CAP};
