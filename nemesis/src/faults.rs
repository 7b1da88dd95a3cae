//! The faults the nemesis injects, which stores they apply to, and which of them the store
//! documents as freeing locks early (the checker's third rule accepts a refusal after those).

use std::fmt;

/// The store a run is against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreKind {
    /// `memory://`, workers as tasks in the controller.
    Memory,
    /// A memory store whose tokens start over after a restart fault: must fail the check.
    BrokenMemory,
    /// One Redis server.
    Redis,
    /// Redlock over five Redis masters.
    Redlock,
    /// A three-member etcd cluster.
    Etcd,
    /// PostgreSQL advisory locks.
    Postgres,
    /// MySQL/MariaDB named locks (`GET_LOCK`), on one MariaDB server.
    Mysql,
    /// One SQLite file shared by the worker processes (no server, no network).
    Sqlite,
}

impl StoreKind {
    /// Every store the run starts by itself, in the order it runs them (`broken-memory` only
    /// when asked for).
    pub const ALL: [StoreKind; 7] = [
        StoreKind::Memory,
        StoreKind::Redis,
        StoreKind::Redlock,
        StoreKind::Etcd,
        StoreKind::Postgres,
        StoreKind::Mysql,
        StoreKind::Sqlite,
    ];

    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::BrokenMemory => "broken-memory",
            StoreKind::Redis => "redis",
            StoreKind::Redlock => "redlock",
            StoreKind::Etcd => "etcd",
            StoreKind::Postgres => "postgres",
            StoreKind::Mysql => "mysql",
            StoreKind::Sqlite => "sqlite",
        }
    }

    /// The store named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [StoreKind::BrokenMemory]
            .into_iter()
            .chain(Self::ALL)
            .find(|k| k.name() == name)
    }

    /// The store a URL's scheme names.
    pub fn of_url(url: &str) -> Option<Self> {
        match url.split_once("://")?.0 {
            "memory" => Some(StoreKind::Memory),
            "redis" | "rediss" => Some(StoreKind::Redis),
            "redlock" => Some(StoreKind::Redlock),
            "etcd" | "etcds" => Some(StoreKind::Etcd),
            "postgres" | "postgresql" => Some(StoreKind::Postgres),
            "mysql" | "mariadb" => Some(StoreKind::Mysql),
            "sqlite" => Some(StoreKind::Sqlite),
            _ => None,
        }
    }

    /// Whether workers are tasks in the controller (the store lives in its memory).
    pub fn in_process(self) -> bool {
        matches!(self, StoreKind::Memory | StoreKind::BrokenMemory)
    }

    /// Whether workers reach the store over TCP, through relays a cut can freeze. A SQLite
    /// file has no connection to cut: its workers open the file itself.
    pub fn over_network(self) -> bool {
        !matches!(self, StoreKind::Sqlite)
    }

    /// The faults that make sense on this store; `own_servers` says whether the run started
    /// the servers (an external store gets the client faults only).
    pub fn faults(self, own_servers: bool) -> Vec<Fault> {
        let mut faults = vec![Fault::Pause, Fault::PauseWaiter, Fault::Kill];
        if self.over_network() {
            faults.push(Fault::Cut);
        }
        if !own_servers {
            return faults;
        }
        faults.extend(match self {
            StoreKind::Memory => vec![],
            StoreKind::BrokenMemory => vec![Fault::StoreRestart],
            StoreKind::Redis => vec![Fault::RedisRestart],
            StoreKind::Redlock => vec![Fault::RedlockRestartMinority, Fault::RedlockCutMinority],
            StoreKind::Etcd => vec![Fault::EtcdKillLeader, Fault::EtcdStopMinority],
            StoreKind::Postgres => vec![Fault::PgTerminate, Fault::PgRestart],
            StoreKind::Mysql => vec![Fault::MysqlKill, Fault::MysqlRestart],
            StoreKind::Sqlite => vec![],
        });
        faults
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

    #[test]
    fn names_round_trip() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()), Some(fault));
        }
        for store in StoreKind::ALL.into_iter().chain([StoreKind::BrokenMemory]) {
            assert_eq!(StoreKind::parse(store.name()), Some(store));
        }
    }

    #[test]
    fn a_sqlite_run_has_no_cut_and_mysql_kills_free_early() {
        for own in [true, false] {
            assert!(!StoreKind::Sqlite.faults(own).contains(&Fault::Cut));
            assert!(StoreKind::Mysql.faults(own).contains(&Fault::Cut));
        }
        assert_eq!(StoreKind::of_url("mariadb://h/db"), Some(StoreKind::Mysql));
        assert_eq!(
            StoreKind::of_url("sqlite:///tmp/l.db"),
            Some(StoreKind::Sqlite)
        );
        assert!(Fault::MysqlKill.frees_early() && Fault::MysqlRestart.frees_early());
    }

    #[test]
    fn every_fault_applies_to_some_store() {
        for fault in Fault::ALL {
            assert!(
                StoreKind::ALL
                    .into_iter()
                    .chain([StoreKind::BrokenMemory])
                    .any(|s| s.faults(true).contains(&fault)),
                "{fault}"
            );
        }
    }
}
