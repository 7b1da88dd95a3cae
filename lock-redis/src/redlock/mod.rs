//! [`RedlockStore`]: Redlock over N independent Redis masters, with fencing tokens that stay
//! strictly increasing when the granting majority changes.
//!
//! Each node runs the single-node store's extend, evict and status scripts (`crate::script`)
//! and Redlock's own ([`scripts`]: an acquire minting from a coarse clock behind the key's
//! waiter queue, a release that wakes the queue's head, the raise of a held node's fence, the
//! withdrawal of a waiter) on its own [`RedisStore`](crate::RedisStore) connection. Here: the
//! `redlock://` config ([`config`]), the quorum arithmetic and its error ([`quorum`]), sending
//! one request to every node ([`fanout`]), the scripts, and the store built on them
//! ([`store`]).
//!
//! The argument for the tokens and its assumptions are in the crate docs (`# Redlock`).

// Module order (each imports only from those before it): config, quorum, fanout, scripts, store.
pub(crate) mod config;
mod fanout;
mod quorum;
mod scripts;
mod store;

#[cfg(test)]
pub(crate) use config::{min_retention, TOKEN_GRANULE};
pub use config::{RedlockConfig, REDLOCK_URL_SCHEMES};
pub use quorum::QuorumError;
pub use store::RedlockStore;
