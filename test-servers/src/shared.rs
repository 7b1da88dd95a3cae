//! One server of each kind per test process, started on first use and shared by every test in
//! it, for tests that only lock and unlock (each on its own keys).
//!
//! A test that pauses, kills or restarts a server, or needs one configured differently, starts
//! its own ([`RedisServer::start`] and the like) instead: a shared server must stay as every
//! other test expects it. Shared servers are never dropped; the parent-death signal ends them
//! with the test process.
//!
//! A server that fails to start fails every test that asks for it, with the first start's
//! error, which names what is missing (a package, a free port).
//!
//! ```no_run
//! let url = test_servers::shared::redis().url();
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::{
    EtcdCluster, EtcdServer, MariadbServer, PostgresServer, RedisSentinel, RedisServer, Result,
};

/// How many members [`etcd_cluster`] has: the smallest cluster that survives losing one.
pub const ETCD_CLUSTER_MEMBERS: usize = 3;

/// The shared Redis server ([`RedisServer::start`], so `LOCK_TEST_REDIS_URL` is honoured).
///
/// # Panics
///
/// If the server cannot be started.
pub fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<Result<RedisServer, String>> = OnceLock::new();
    shared(&SERVER, RedisServer::start)
}

/// `n` shared independent Redis masters, as a Redlock store needs; always local. The same `n`
/// gives the same servers; they are never the server of [`redis`].
///
/// # Panics
///
/// If the servers cannot be started.
pub fn redis_masters(n: usize) -> &'static [RedisServer] {
    type Started = Result<&'static [RedisServer], String>;
    static SETS: OnceLock<Mutex<HashMap<usize, Started>>> = OnceLock::new();
    let started = {
        let mut sets = SETS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The lock is held while starting, so callers asking at once share one set.
        sets.entry(n)
            .or_insert_with(|| {
                RedisServer::start_many(n)
                    .map(|servers| &*Box::leak(servers.into_boxed_slice()))
                    .map_err(|e| e.to_string())
            })
            .clone()
    };
    started.unwrap_or_else(|error| panic!("{error}"))
}

/// The shared Redis Sentinel deployment ([`RedisServer::start_sentinel`]); always local.
///
/// # Panics
///
/// If the deployment cannot be started.
pub fn redis_sentinel() -> &'static RedisSentinel {
    static SERVER: OnceLock<Result<RedisSentinel, String>> = OnceLock::new();
    shared(&SERVER, RedisServer::start_sentinel)
}

/// The shared single-member etcd ([`EtcdServer::start`], so `LOCK_TEST_ETCD_URL` is honoured).
///
/// # Panics
///
/// If the server cannot be started.
pub fn etcd() -> &'static EtcdServer {
    static SERVER: OnceLock<Result<EtcdServer, String>> = OnceLock::new();
    shared(&SERVER, EtcdServer::start)
}

/// The shared etcd cluster of [`ETCD_CLUSTER_MEMBERS`] members; always local.
///
/// # Panics
///
/// If the cluster cannot be started.
pub fn etcd_cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<Result<EtcdCluster, String>> = OnceLock::new();
    shared(&CLUSTER, || EtcdCluster::start(ETCD_CLUSTER_MEMBERS))
}

/// The shared PostgreSQL server ([`PostgresServer::start`], so `LOCK_TEST_POSTGRES_URL` is
/// honoured).
///
/// # Panics
///
/// If the server cannot be started.
pub fn postgres() -> &'static PostgresServer {
    static SERVER: OnceLock<Result<PostgresServer, String>> = OnceLock::new();
    shared(&SERVER, PostgresServer::start)
}

/// The shared MariaDB server ([`MariadbServer::start`], so whatever it honours is honoured).
///
/// # Panics
///
/// If the server cannot be started.
pub fn mariadb() -> &'static MariadbServer {
    static SERVER: OnceLock<Result<MariadbServer, String>> = OnceLock::new();
    shared(&SERVER, MariadbServer::start)
}

/// The server in `cell`, started by `start` on first use; the first start's error otherwise.
fn shared<T>(
    cell: &'static OnceLock<Result<T, String>>,
    start: impl FnOnce() -> Result<T>,
) -> &'static T {
    match cell.get_or_init(|| start().map_err(|e| e.to_string())) {
        Ok(server) => server,
        Err(error) => panic!("{error}"),
    }
}
