//! The faults the nemesis injects, whom each hits, and which of them the store documents as
//! freeing locks early (the checker's third rule accepts a refusal after those). Which faults
//! hit which store is the fault table's ([`crate::faults`]).

use std::fmt;

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
    /// ZooKeeper: kill the leader of three, restart it after 1.5–2.5 TTLs.
    ZkKillLeader,
    /// ZooKeeper: `SIGSTOP` one member of three for 1.5–2.5 TTLs.
    ZkStopMinority,
    /// ZooKeeper: cut a follower (preferably one the workers' sessions are on) off from the
    /// quorum, its quorum links frozen, for 1.5–2.5 TTLs while its clients stay connected.
    ZkIsolateFollower,
    /// Redis Sentinel: `SIGKILL` the master; once the sentinels promoted a replica, start it
    /// again empty, as a replica of the new master.
    SentinelKillMaster,
    /// Redis Sentinel: `SIGSTOP` the master until the sentinels promoted a replica (past
    /// their `down-after-milliseconds`), then `SIGCONT`: the old master comes back believing
    /// it is one, until the sentinels demote it.
    SentinelPauseMaster,
    /// Redis Sentinel: `SENTINEL FAILOVER`, the old master alive and taking writes until it
    /// is demoted.
    SentinelFailover,
    /// Redis Sentinel: `SIGKILL` one of the three sentinels, start it again past the TTL.
    SentinelKillSentinel,
    /// The server's wall clock (Redis, one Redlock node, PostgreSQL, MariaDB: the stores whose
    /// tokens rest on it) stepped back by up to [`CLOCK_BACK_MAX`], and left there: within every
    /// such store's bound while its per-key state lives. A restart that empties the server
    /// (Redis, a Redlock node) sets its clock right again first.
    ClockBack,
    /// The same clock stepped forward by at most half the lease's drift margin (1% of the
    /// TTL + 2 ms), the most a step forward can be without shortening a lease below its local
    /// deadline where the server expires keys by its wall clock.
    ClockForward,
    /// A worker process's wall clock (etcd, ZooKeeper, SQLite: the stores that read the
    /// client's clock) stepped back by 1–3 s, and left there.
    WorkerClockBack,
    /// A worker process's wall clock stepped forward by 1–3 s, and left there.
    WorkerClockForward,
}

/// The largest step of [`Fault::ClockBack`]: a dead holder's lock lives that much longer where
/// the server expires by its wall clock, a delay its store's row of the fault table adds.
pub const CLOCK_BACK_MAX: std::time::Duration = std::time::Duration::from_millis(250);

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 25] = [
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
        Fault::ZkKillLeader,
        Fault::ZkStopMinority,
        Fault::ZkIsolateFollower,
        Fault::SentinelKillMaster,
        Fault::SentinelPauseMaster,
        Fault::SentinelFailover,
        Fault::SentinelKillSentinel,
        Fault::ClockBack,
        Fault::ClockForward,
        Fault::WorkerClockBack,
        Fault::WorkerClockForward,
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
            Fault::ZkKillLeader => "zk-kill-leader",
            Fault::ZkStopMinority => "zk-stop-minority",
            Fault::ZkIsolateFollower => "zk-isolate-follower",
            Fault::SentinelKillMaster => "sentinel-kill-master",
            Fault::SentinelPauseMaster => "sentinel-pause-master",
            Fault::SentinelFailover => "sentinel-failover",
            Fault::SentinelKillSentinel => "sentinel-kill-sentinel",
            Fault::ClockBack => "clock-back",
            Fault::ClockForward => "clock-forward",
            Fault::WorkerClockBack => "worker-clock-back",
            Fault::WorkerClockForward => "worker-clock-forward",
        }
    }

    /// The fault named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether the store documents this event as freeing locks early (the fencelock-core contract
    /// and each store's table in docs/stores.md): a PostgreSQL or MySQL session ended by the
    /// server, a Redis restart without persistence, a memory store that lost its data. A
    /// Redlock minority restarted after a TTL, an etcd leader change, a ZooKeeper leader's
    /// kill or a stopped ZooKeeper member (sessions, and with them lock nodes, outlive an
    /// election: the new leader gives each its whole timeout again), a ZooKeeper follower cut
    /// off from the quorum (the leader expires its sessions no earlier than a lease's deadline
    /// allows), a Sentinel master killed or paused (the run's URL asks `min_replicas=1`: every
    /// grant and extend a replica acknowledged is on the one promoted, the one with the most
    /// of the stream, and the old master gets no replica back to acknowledge more) and every
    /// client fault do not. `SENTINEL FAILOVER` does: the old master keeps running, and the
    /// replica not promoted acknowledges its grants until the sentinels move it, grants the
    /// promoted one never gets (the Redis store's docs, "Redis Sentinel", name it). An etcd member stop frees locks early only when
    /// it stops the leader of an affected etcd version; the run decides that when it injects
    /// the fault.
    pub fn frees_early(self) -> bool {
        matches!(
            self,
            Fault::StoreRestart
                | Fault::RedisRestart
                | Fault::PgTerminate
                | Fault::PgRestart
                | Fault::MysqlKill
                | Fault::MysqlRestart
                | Fault::SentinelFailover
        )
    }

    /// Which worker the fault hits, for the faults that hit one.
    pub fn target(self) -> Option<Target> {
        match self {
            Fault::Pause
            | Fault::Kill
            | Fault::Cut
            | Fault::RedlockCutMinority
            | Fault::WorkerClockBack
            | Fault::WorkerClockForward => Some(Target::Any),
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
    }

    #[test]
    fn mysql_kills_free_early() {
        assert!(Fault::MysqlKill.frees_early() && Fault::MysqlRestart.frees_early());
    }

    /// ZooKeeper's sessions outlive an election and a follower's cut (the leader expires none
    /// before a lease's deadline), so rule 3 excuses no refusal after these.
    #[test]
    fn zookeeper_faults_free_no_lock_early() {
        for fault in [
            Fault::ZkKillLeader,
            Fault::ZkStopMinority,
            Fault::ZkIsolateFollower,
        ] {
            assert!(!fault.frees_early(), "{fault}");
        }
    }
}
