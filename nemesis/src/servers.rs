//! The servers a run starts for its store (none with `--url`), and the error of a setup step
//! that fails.

use std::path::PathBuf;

use fencelock::{Error, Result};
use test_servers::{
    EtcdCluster, MariadbServer, PostgresServer, RedisSentinel, RedisServer, ZookeeperEnsemble,
};

use crate::faults::{FaultProfile, Launch};

/// A setup step of the run (a server, a file, a process) failed.
pub(crate) fn setup_error(what: impl std::fmt::Display) -> Error {
    Error::Store {
        message: format!("nemesis setup: {what}"),
        source: None,
    }
}

/// The servers of one store run, when the run started them.
pub(crate) enum Servers {
    None,
    Redis(RedisServer),
    Redlock(Vec<RedisServer>),
    Etcd(EtcdCluster),
    Postgres(PostgresServer),
    Mysql(MariadbServer),
    Sqlite(TempDatabase),
    Zookeeper(ZookeeperEnsemble),
    Sentinel(RedisSentinel),
}

/// The directory of the SQLite run's database file, removed when the run ends.
pub(crate) struct TempDatabase {
    dir: PathBuf,
}

impl TempDatabase {
    fn create() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("nemesis-sqlite-{}", std::process::id()));
        // A directory left by an earlier run of this pid would carry its tokens over: start
        // from nothing, as the other stores do.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(setup_error)?;
        Ok(TempDatabase { dir })
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.dir.join("locks.db").display())
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first URL scheme of the facade's store named `store`: its URLs are the facade's.
fn scheme_of(store: &str) -> Result<&'static str> {
    fencelock::STORES
        .iter()
        .find(|kind| kind.name == store)
        .and_then(|kind| kind.schemes.first().copied())
        .ok_or_else(|| setup_error(format!("{store} is not a store of this build")))
}

impl Servers {
    /// Starts the store's servers as its row of the fault table says, and the URL the
    /// workers reach them at.
    pub(crate) fn start(profile: &FaultProfile) -> Result<(Self, String)> {
        let Some(launch) = profile.launch else {
            return Err(setup_error(format!(
                "nemesis cannot start {} by itself: run it against a live store with --url",
                profile.store
            )));
        };
        let servers = match launch {
            Launch::Memory { .. } => Servers::None,
            // Under a stepped clock, for clock-back and clock-forward.
            Launch::Redis => Servers::Redis(RedisServer::start_with_clock().map_err(setup_error)?),
            Launch::RedisMasters(n) => Servers::Redlock(
                (0..n)
                    .map(|_| RedisServer::start_with_clock())
                    .collect::<std::result::Result<_, _>>()
                    .map_err(setup_error)?,
            ),
            Launch::EtcdCluster(n) => Servers::Etcd(EtcdCluster::start(n).map_err(setup_error)?),
            Launch::Postgres => {
                Servers::Postgres(PostgresServer::start_with_clock().map_err(setup_error)?)
            }
            Launch::Mariadb => {
                Servers::Mysql(MariadbServer::start_with_clock().map_err(setup_error)?)
            }
            Launch::SqliteFile => Servers::Sqlite(TempDatabase::create()?),
            // Quorum relays, so a follower can be cut off from the quorum (zk-isolate-follower).
            Launch::ZookeeperEnsemble(n) => Servers::Zookeeper(
                ZookeeperEnsemble::start_with_quorum_relays(n).map_err(setup_error)?,
            ),
            Launch::RedisSentinel => {
                Servers::Sentinel(RedisServer::start_sentinel().map_err(setup_error)?)
            }
        };
        let url = match &servers {
            Servers::None => format!("{}://nemesis", scheme_of(fencelock::MEMORY.name)?),
            Servers::Redis(s) => s.url(),
            Servers::Redlock(nodes) => format!(
                "{}://{}",
                scheme_of(profile.store)?,
                nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Servers::Etcd(c) => c.url(),
            Servers::Postgres(s) => s.url(),
            Servers::Mysql(s) => s.url(),
            Servers::Sqlite(db) => db.url(scheme_of(profile.store)?),
            Servers::Zookeeper(e) => e.url(),
            // Acknowledged grants and extends, so a failover keeps them (the store's docs).
            Servers::Sentinel(s) => format!("{}?min_replicas=1&replica_timeout=300ms", s.url()),
        };
        Ok((servers, url))
    }
}
