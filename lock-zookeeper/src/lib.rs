#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): layout, keys, data (what a lock node's
// data holds: its label, and a reader's or permit's mark), config, error, tls (the
// TLS client settings and the handshake that names a refusal), limits (how a TTL maps to a
// session), offset, loss (the session-loss watcher), heard (which answered requests the leader
// provably heard of), session (the client layer), held, expiry (a lease's deadline task),
// cleanup (a dropped acquisition's nodes), wait (the queue), store, descriptor.
mod cleanup;
mod config;
mod data;
mod descriptor;
mod error;
mod expiry;
mod heard;
mod held;
mod keys;
mod layout;
mod limits;
mod loss;
mod offset;
mod session;
mod store;
#[cfg(feature = "tls")]
mod tls;
mod wait;

pub use config::{
    Auth, ZookeeperConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT,
    DEFAULT_PREFIX, URL_SCHEMES,
};
pub use descriptor::ZOOKEEPER;
pub use layout::Layout;
pub use offset::TOKEN_GRANULE;
pub use store::ZookeeperStore;
