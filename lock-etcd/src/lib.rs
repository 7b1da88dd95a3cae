#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): config, error, keys, modes, handoff,
// offset, txn, renewer, watcher, client, revoke, wait, store, descriptor. The client layer
// (client) and the wait state machine (wait) never import the store.
mod client;
mod config;
mod descriptor;
mod error;
mod handoff;
#[cfg(test)]
mod handoff_tests;
mod keys;
mod modes;
mod offset;
mod renewer;
mod revoke;
mod store;
mod txn;
mod wait;
mod watcher;

pub use config::{
    EtcdConfig, Layout, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT,
    DEFAULT_PREFIX, MIN_TTL, URL_SCHEMES,
};
pub use descriptor::ETCD;
pub use store::{mutex_key, EtcdStore};

/// Whether etcd server `version` (as `"3.4.23"`) has the stale-leader lease revocation that
/// etcd fixed in 3.4.31 and 3.5.13: a leader stopped past a lease's TTL and then resumed revokes the leases it
/// believes expired, though a newer leader kept them alive, which frees their locks early.
/// Fixed in 3.4.31 and 3.5.13. An unparseable version counts as affected.
pub fn stale_leader_revokes_leases(version: &str) -> bool {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .map(|part| part.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    match (major, minor) {
        (3, 4) => patch < 31,
        (3, 5) => patch < 13,
        (3, minor) => minor < 4,
        (major, _) => major < 3,
    }
}
