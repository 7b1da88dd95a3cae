//! [`RedlockStore`]: Redlock over N independent Redis masters, with fencing tokens that stay
//! strictly increasing when the granting majority changes.
//!
//! Each node runs the single-node store's scripts (`crate::script`: acquire, release, extend,
//! evict, status, and the one Redlock needs on top, raising a node's fence to the token handed
//! out) on its own [`RedisStore`](crate::RedisStore) connection. Here: the `redlock://` config
//! ([`config`]), the quorum arithmetic and its error ([`quorum`]), sending one request to every
//! node ([`fanout`]), and the store built on them ([`store`]).
//!
//! The argument for the tokens and its assumptions are in the crate docs (`# Redlock`).

// Module order (each imports only from those before it): config, quorum, fanout, scripts, store.
mod config;
mod fanout;
mod quorum;
mod scripts;
mod store;

pub use config::RedlockConfig;
pub use quorum::QuorumError;
pub use store::RedlockStore;
