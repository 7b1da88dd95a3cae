//! Real Redis (one server or a Cluster), etcd, PostgreSQL, MariaDB and ZooKeeper servers for
//! tests, and a clock shim that steps a server's or a process's wall clock while it runs.
//!
//! Each server is started as a child process on free loopback ports, in its
//! own temporary directory (which also holds its log), and the constructor
//! returns only once the server answers. Dropping the handle kills the
//! process, reaps it and removes the temporary directory.
//!
//! Fault injection: [`RedisServer::pause`] (`SIGSTOP`), [`RedisServer::resume`]
//! (`SIGCONT`), [`RedisServer::kill`] (`SIGKILL`, stays down) and
//! [`RedisServer::restart`] (same port), and the same on [`EtcdServer`],
//! on each member of an [`EtcdCluster`] and on [`PostgresServer`] (which adds
//! [`PostgresServer::crash_and_restart`]). [`FreezableRelay`] cuts one client off from a
//! server while the server and every other client go on.
//!
//! Everything is synchronous (`std::process`, `std::net`), so it can be used
//! from plain `#[test]`s and from `#[tokio::test]`s alike.
//!
//! # Binaries
//!
//! The servers come from Debian packages: `redis-server`, `etcd-server` and
//! `postgresql` (`scripts/test.sh` installs them). A missing binary is an
//! error ([`Error::MissingBinary`]), never a silent skip.
//!
//! # External servers
//!
//! If `LOCK_TEST_REDIS_URL`, `LOCK_TEST_ETCD_URL` or `LOCK_TEST_POSTGRES_URL`
//! is set (and not empty), [`RedisServer::start`], [`EtcdServer::start`] and
//! [`PostgresServer::start`] return a handle to that server instead of
//! starting one; fault injection on such a handle returns
//! [`Error::Unsupported`]. [`RedisServer::start_many`] and
//! [`EtcdCluster::start`] always start their own servers.
//!
//! # Another server binary
//!
//! `LOCK_TEST_REDIS_SERVER`, the path of a server that speaks as `redis-server` does (Valkey's
//! `valkey-server`), is what every local Redis server starts instead: how `scripts/test.sh`
//! runs the Redis store's tests on Valkey. A path that is not an executable is
//! [`Error::NotExecutable`].
//!
//! # Processes never outlive the test
//!
//! Besides `Drop`, every server is started with the Linux parent-death signal
//! set to `SIGKILL` (from a helper thread that lives as long as the test
//! process), so servers die with the test process even when it is killed or
//! when a handle is kept in a `static` and never dropped.
//!
//! # Example
//!
//! ```no_run
//! let mut redis = test_servers::RedisServer::start()?;
//! println!("connect to {}", redis.url()); // redis://127.0.0.1:PORT
//! redis.pause()?; // the server stops answering
//! redis.resume()?;
//! redis.restart()?; // same port, empty data set
//! # Ok::<(), test_servers::Error>(())
//! ```
#![cfg(unix)]

mod clock_shim;
pub use clock_shim::ClockControl;
mod etcd;
mod mariadb;
mod ports;
mod postgres;
mod process;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod relay;
pub mod shared;
mod tls;
pub mod zookeeper;

pub use etcd::{EtcdCluster, EtcdServer};
pub use mariadb::MariadbServer;
pub use ports::closed_ports;
pub use postgres::PostgresServer;
pub use redis::RedisServer;
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::{
    RedisSentinel, SentinelOptions, SentinelTls, DOWN_AFTER, SENTINEL_MASTER_NAME,
};
pub use relay::FreezableRelay;
pub use tls::{ServerCert, TestCa, TlsEtcd, TlsRedis, CLIENT_CN};
pub use zookeeper::ZookeeperEnsemble;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong starting or controlling a test server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A server binary is not installed.
    #[error(
        "`{binary}` not found on PATH: install the Debian package `{package}` (scripts/test.sh does this)"
    )]
    MissingBinary {
        /// The executable that was looked for, e.g. `redis-server`.
        binary: String,
        /// The Debian package that provides it, e.g. `redis-server`.
        package: String,
    },

    /// An environment variable names a server binary that is not an executable file.
    #[error("{variable} names {path}, which is not an executable file")]
    NotExecutable {
        /// The variable, e.g. `LOCK_TEST_REDIS_SERVER`.
        variable: &'static str,
        /// The path it names.
        path: String,
    },

    /// A server (or a setup step such as `initdb`) did not come up.
    #[error("failed to start {server}: {reason}\n--- last lines of its log ---\n{log_tail}")]
    Start {
        /// Which server, e.g. `redis-server on 127.0.0.1:6379`.
        server: String,
        /// What went wrong, e.g. "exited with exit status: 1 before it was ready".
        reason: String,
        /// The last lines of the server's log (stdout and stderr).
        log_tail: String,
    },

    /// A server could not be stopped as asked (e.g. `pg_ctl stop` failed).
    #[error("failed to stop {server}: {reason}")]
    Stop {
        /// Which server.
        server: String,
        /// What went wrong, including the tool's output where there is one.
        reason: String,
    },

    /// The operation needs a running server, but it was killed.
    #[error("{0} is not running (it was killed; restart it first)")]
    NotRunning(String),

    /// An I/O error while setting up (temporary directory, log file, spawn).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    /// Fault injection on a server this crate did not start (one given
    /// through a `LOCK_TEST_*_URL` variable).
    #[error("unsupported on an external server: {0}")]
    Unsupported(String),

    /// A bad argument, such as a member index out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An etcd query (member status, leader) failed or gave no answer in time.
    #[error("etcd: {0}")]
    Etcd(String),
}

/// Reads an external server's URL from `var`, if set and not blank.
fn external_url(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The port of a `scheme://[user@]host:port/...` URL, or `default`.
fn url_port(url: &str, default: u16) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', ',']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let port = match host_port.rfind(']') {
        Some(i) => host_port[i + 1..].strip_prefix(':'),
        None => host_port.rsplit_once(':').map(|(_, p)| p),
    };
    port.and_then(|p| p.parse().ok()).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_message_names_the_package() {
        let e = Error::MissingBinary {
            binary: "redis-server".into(),
            package: "redis-server".into(),
        };
        assert_eq!(
            e.to_string(),
            "`redis-server` not found on PATH: install the Debian package `redis-server` (scripts/test.sh does this)"
        );
    }

    #[test]
    fn url_ports() {
        assert_eq!(url_port("redis://127.0.0.1:6380", 6379), 6380);
        assert_eq!(url_port("redis://127.0.0.1", 6379), 6379);
        assert_eq!(url_port("redis://:pw@host:7000/2", 6379), 7000);
        assert_eq!(
            url_port("postgres://postgres@127.0.0.1:5433/postgres", 5432),
            5433
        );
        assert_eq!(url_port("postgres://[::1]:5434/db?x=1", 5432), 5434);
        assert_eq!(url_port("etcd://127.0.0.1:2380,127.0.0.1:2381", 2379), 2380);
    }
}

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    /// Handles can be shared across threads and tokio tasks (e.g. in an `Arc`).
    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<crate::RedisServer>();
        assert_send_sync::<crate::EtcdServer>();
        assert_send_sync::<crate::EtcdCluster>();
        assert_send_sync::<crate::PostgresServer>();
        assert_send_sync::<crate::Error>();
    }
}
