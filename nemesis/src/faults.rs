//! The faults the nemesis injects, which of them the store documents as freeing locks early
//! (the checker's third rule accepts a refusal after those), and the fault table: which
//! faults hit which store, keyed by the facade's store names.

use std::fmt;

/// How the run starts a store by itself (without `--url`), which decides how its workers run
/// and which servers the store faults act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launch {
    /// A memory store in the controller, its workers tasks; `broken`: its tokens start over
    /// after a restart fault, so the run must fail.
    Memory {
        /// Whether a restart starts tokens over.
        broken: bool,
    },
    /// One Redis server.
    Redis,
    /// Redis masters, each on its own (Redlock's nodes).
    RedisMasters(usize),
    /// An etcd cluster of this many members.
    EtcdCluster(usize),
    /// One PostgreSQL server.
    Postgres,
    /// One MariaDB server.
    Mariadb,
    /// One SQLite file in a directory of its own, shared by the worker processes.
    SqliteFile,
}

/// A store's row of the fault table: how the run starts it and which faults hit it.
///
/// Keyed by the store's name, the [`fencelock::StoreKind::name`] of its descriptor; the list
/// of stores and their URL schemes is the facade's ([`fencelock::STORES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultProfile {
    /// The store's name, as in `--stores` and the report.
    pub store: &'static str,
    /// How the run starts the store (`None`: it cannot, the store is run against `--url` only).
    pub launch: Option<Launch>,
    /// Whether a worker's way to the store can be cut: relays on its TCP connections, or a
    /// memory store's link. Not a SQLite file (no connection), nor a store the table does not
    /// know (its client may connect to hosts beyond the URL's).
    pub cut: bool,
    /// The faults on the store's servers, when the run started them, in the order the run
    /// shuffles them from.
    pub store_faults: &'static [Fault],
}

/// Every store the run knows more of than the faults every store takes, keyed by name, in no
/// order of its own (the run takes the facade's). Every name is a facade store's.
pub const TABLE: &[FaultProfile] = &[
    FaultProfile {
        store: "memory",
        launch: Some(Launch::Memory { broken: false }),
        cut: true,
        store_faults: &[],
    },
    FaultProfile {
        store: "redis",
        launch: Some(Launch::Redis),
        cut: true,
        store_faults: &[Fault::RedisRestart],
    },
    FaultProfile {
        store: "redlock",
        launch: Some(Launch::RedisMasters(5)),
        cut: true,
        store_faults: &[Fault::RedlockRestartMinority, Fault::RedlockCutMinority],
    },
    FaultProfile {
        store: "etcd",
        launch: Some(Launch::EtcdCluster(3)),
        cut: true,
        store_faults: &[Fault::EtcdKillLeader, Fault::EtcdStopMinority],
    },
    FaultProfile {
        store: "postgres",
        launch: Some(Launch::Postgres),
        cut: true,
        store_faults: &[Fault::PgTerminate, Fault::PgRestart],
    },
    FaultProfile {
        store: "mysql",
        launch: Some(Launch::Mariadb),
        cut: true,
        store_faults: &[Fault::MysqlKill, Fault::MysqlRestart],
    },
    FaultProfile {
        store: "sqlite",
        launch: Some(Launch::SqliteFile),
        cut: false,
        store_faults: &[],
    },
];

/// Nemesis's own store, not the facade's: a memory store whose tokens start over after a
/// restart fault. The run started on it must fail (`--stores broken-memory`).
pub const BROKEN_MEMORY: FaultProfile = FaultProfile {
    store: "broken-memory",
    launch: Some(Launch::Memory { broken: true }),
    cut: true,
    store_faults: &[Fault::StoreRestart],
};

/// The faults every store takes: they hit the worker processes, whatever the store.
const CLIENT_FAULTS: [Fault; 3] = [Fault::Pause, Fault::PauseWaiter, Fault::Kill];

impl FaultProfile {
    /// The row of a facade store: the table's, or for a store the table does not know, the
    /// faults every store takes and no way to start it.
    pub fn of_store(kind: &'static fencelock::StoreKind) -> Self {
        TABLE
            .iter()
            .find(|profile| profile.store == kind.name)
            .copied()
            .unwrap_or(FaultProfile {
                store: kind.name,
                launch: None,
                cut: false,
                store_faults: &[],
            })
    }

    /// The row of the store that serves `url`, as the facade resolves it.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock::ErrorKind::InvalidInput) for a URL the facade has no
    /// compiled-in store for (as [`fencelock::store_for`]).
    pub fn of_url(url: &str) -> fencelock::Result<Self> {
        fencelock::store_for(url).map(Self::of_store)
    }

    /// Every store the run starts by itself, in the facade's order (`broken-memory` only when
    /// asked for).
    pub fn startable() -> impl Iterator<Item = Self> {
        fencelock::STORES
            .iter()
            .map(Self::of_store)
            .filter(|profile| profile.launch.is_some())
    }

    /// The store named `name` that the run can start (`broken-memory` too).
    pub fn parse(name: &str) -> Option<Self> {
        [BROKEN_MEMORY]
            .into_iter()
            .chain(Self::startable())
            .find(|profile| profile.store == name)
    }

    /// The store's name.
    pub fn name(&self) -> &'static str {
        self.store
    }

    /// Whether workers are tasks in the controller (the store lives in its memory).
    pub fn in_process(&self) -> bool {
        matches!(self.launch, Some(Launch::Memory { .. }))
    }

    /// The faults that make sense on this store; `own_servers` says whether the run started
    /// the servers (an external store gets the client faults only).
    pub fn faults(&self, own_servers: bool) -> Vec<Fault> {
        let mut faults = CLIENT_FAULTS.to_vec();
        if self.cut {
            faults.push(Fault::Cut);
        }
        if own_servers {
            faults.extend_from_slice(self.store_faults);
        }
        faults
    }
}

impl fmt::Display for FaultProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.store)
    }
}

/// A fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// `SIGSTOP` a worker, holding or waiting, for longer than its TTL, then `SIGCONT` (tasks:
    /// hold it at its next step and cut its link).
    Pause,
    /// `SIGSTOP` a worker while it waits for the key, for longer than the store's
    /// unavailability bound (rule 4), then `SIGCONT`: a frozen waiter must not keep the key
    /// from everyone.
    PauseWaiter,
    /// `SIGKILL` a worker, holding or waiting, and start a replacement worker.
    Kill,
    /// Freeze every relay between a worker, holding or waiting, and the store for longer than
    /// its TTL (not on SQLite: no connection).
    Cut,
    /// The memory store forgets every lock (broken-memory: and starts tokens over).
    StoreRestart,
    /// Redis: `SIGKILL` and restart without persistence.
    RedisRestart,
    /// Redlock: kill 2 of 5 masters, restart them empty after more than a TTL.
    RedlockRestartMinority,
    /// Redlock: freeze a worker's relays to 2 of the 5 masters for longer than its TTL.
    RedlockCutMinority,
    /// etcd: kill the leader, restart it after two TTLs.
    EtcdKillLeader,
    /// etcd: `SIGSTOP` one member of three for two TTLs.
    EtcdStopMinority,
    /// PostgreSQL lock store: `pg_terminate_backend` of the holder's session.
    PgTerminate,
    /// PostgreSQL lock store: a fast restart of the server.
    PgRestart,
    /// MySQL lock store: `KILL CONNECTION` of the holder's session.
    MysqlKill,
    /// MySQL lock store: a clean, fast restart of the MariaDB server.
    MysqlRestart,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 14] = [
        Fault::Pause,
        Fault::PauseWaiter,
        Fault::Kill,
        Fault::Cut,
        Fault::StoreRestart,
        Fault::RedisRestart,
        Fault::RedlockRestartMinority,
        Fault::RedlockCutMinority,
        Fault::EtcdKillLeader,
        Fault::EtcdStopMinority,
        Fault::PgTerminate,
        Fault::PgRestart,
        Fault::MysqlKill,
        Fault::MysqlRestart,
    ];

    /// The name used in `--faults` and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Pause => "pause",
            Fault::PauseWaiter => "pause-waiter",
            Fault::Kill => "kill",
            Fault::Cut => "cut",
            Fault::StoreRestart => "store-restart",
            Fault::RedisRestart => "redis-restart",
            Fault::RedlockRestartMinority => "redlock-restart-minority",
            Fault::RedlockCutMinority => "redlock-cut-minority",
            Fault::EtcdKillLeader => "etcd-kill-leader",
            Fault::EtcdStopMinority => "etcd-stop-minority",
            Fault::PgTerminate => "pg-terminate",
            Fault::PgRestart => "pg-restart",
            Fault::MysqlKill => "mysql-kill",
            Fault::MysqlRestart => "mysql-restart",
        }
    }

    /// The fault named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether the store documents this event as freeing locks early (the fencelock-core contract
    /// and each store's table in docs/stores.md): a PostgreSQL or MySQL session ended by the
    /// server, a Redis restart without persistence, a memory store that lost its data. A
    /// Redlock minority restarted after a TTL, an etcd leader change and every client fault
    /// do not. An etcd member stop frees locks early only when it stops the leader of an
    /// affected etcd version; the run decides that when it injects the fault.
    pub fn frees_early(self) -> bool {
        matches!(
            self,
            Fault::StoreRestart
                | Fault::RedisRestart
                | Fault::PgTerminate
                | Fault::PgRestart
                | Fault::MysqlKill
                | Fault::MysqlRestart
        )
    }

    /// Which worker the fault hits, for the faults that hit one.
    pub fn target(self) -> Option<Target> {
        match self {
            Fault::Pause | Fault::Kill | Fault::Cut | Fault::RedlockCutMinority => {
                Some(Target::Any)
            }
            Fault::PauseWaiter => Some(Target::Waiter),
            _ => None,
        }
    }

    /// Whether the fault hits a client rather than the store: rule 4 counts its bound from the
    /// start of the last one.
    pub fn is_client(self) -> bool {
        self.target().is_some()
    }

    /// Whether the fault stops its target from taking part (a paused or cut-off worker cannot
    /// be granted the key, so rule 4 does not count its wait).
    pub fn silences_target(self) -> bool {
        matches!(self, Fault::Pause | Fault::PauseWaiter | Fault::Cut)
    }
}

/// Which worker a client fault picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Any live worker: a holder or a waiter, each half the time (a holder preferably inside
    /// its read-modify-write), so faults still land inside critical sections.
    Any,
    /// A worker waiting for the key.
    Waiter,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every store the run can be asked for: the ones it starts, and its own broken one.
    fn every_profile() -> impl Iterator<Item = FaultProfile> {
        FaultProfile::startable().chain([BROKEN_MEMORY])
    }

    #[test]
    fn names_round_trip() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()), Some(fault));
        }
        for store in every_profile() {
            assert_eq!(FaultProfile::parse(store.name()), Some(store));
        }
    }

    #[test]
    fn a_sqlite_run_has_no_cut_and_mysql_kills_free_early() {
        let of_url = |url| FaultProfile::of_url(url).map(|p| p.store).ok();
        let sqlite = FaultProfile::parse("sqlite").unwrap();
        let mysql = FaultProfile::parse("mysql").unwrap();
        for own in [true, false] {
            assert!(!sqlite.faults(own).contains(&Fault::Cut));
            assert!(mysql.faults(own).contains(&Fault::Cut));
        }
        assert_eq!(of_url("mariadb://h/db"), Some("mysql"));
        assert_eq!(of_url("sqlite:///tmp/l.db"), Some("sqlite"));
        assert!(Fault::MysqlKill.frees_early() && Fault::MysqlRestart.frees_early());
    }

    #[test]
    fn every_fault_applies_to_some_store() {
        for fault in Fault::ALL {
            assert!(
                every_profile().any(|s| s.faults(true).contains(&fault)),
                "{fault}"
            );
        }
    }

    /// The table is keyed by the facade's names: a row under any other name would never be
    /// found, and its store would silently get the client faults only.
    #[test]
    fn every_name_in_the_fault_table_is_a_facade_store() {
        for profile in TABLE {
            assert!(
                fencelock::KNOWN_STORES
                    .iter()
                    .any(|known| known.name == profile.store),
                "{}: not a store of the facade",
                profile.store
            );
            assert_eq!(
                TABLE.iter().filter(|p| p.store == profile.store).count(),
                1,
                "{} twice",
                profile.store
            );
        }
        assert!(
            fencelock::KNOWN_STORES
                .iter()
                .all(|known| known.name != BROKEN_MEMORY.store),
            "nemesis's own store shadows a facade store"
        );
    }

    /// Every scheme the facade serves finds a row: the table's, or the client faults.
    #[test]
    fn every_scheme_of_the_facade_is_accepted() {
        for kind in fencelock::STORES {
            for scheme in kind.schemes {
                let profile = FaultProfile::of_url(&format!("{scheme}://127.0.0.1:1"))
                    .unwrap_or_else(|e| panic!("{scheme}: {e}"));
                assert_eq!(profile.store, kind.name, "{scheme}");
            }
        }
        assert!(FaultProfile::of_url("consul://h").is_err());
    }

    /// A store the table does not know (Redis Cluster) is run against `--url` with the faults
    /// every store takes: no cut (its client follows the cluster's own node addresses, past
    /// any relay on the URL's hosts), no store fault, and the run cannot start it.
    #[test]
    fn a_redis_cluster_url_gets_the_client_faults() {
        let profile = FaultProfile::of_url("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(profile.store, "redis-cluster");
        assert_eq!(profile.launch, None);
        assert!(!profile.in_process());
        for own in [true, false] {
            assert_eq!(profile.faults(own), CLIENT_FAULTS.to_vec());
        }
        assert_eq!(FaultProfile::parse("redis-cluster"), None);
    }

    /// A store's faults: the client faults first, then its own, in the table's order (the
    /// order the seeded shuffle starts from, so `--seed` replays as before).
    #[test]
    fn a_store_started_by_the_run_gets_its_own_faults_after_the_client_faults() {
        let redlock = FaultProfile::parse("redlock").unwrap();
        assert_eq!(
            redlock.faults(true),
            [
                Fault::Pause,
                Fault::PauseWaiter,
                Fault::Kill,
                Fault::Cut,
                Fault::RedlockRestartMinority,
                Fault::RedlockCutMinority
            ]
        );
        assert_eq!(
            redlock.faults(false),
            [Fault::Pause, Fault::PauseWaiter, Fault::Kill, Fault::Cut]
        );
    }
}
