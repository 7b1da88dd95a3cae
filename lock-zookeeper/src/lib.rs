#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): config, error, keys, offset, session,
// held, wait, store, descriptor.
mod config;
mod descriptor;
mod error;
mod held;
mod keys;
mod offset;
mod session;
mod store;
mod wait;

pub use config::{
    Layout, ZookeeperConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT,
    DEFAULT_PREFIX, URL_SCHEMES,
};
pub use descriptor::ZOOKEEPER;
pub use store::ZookeeperStore;
