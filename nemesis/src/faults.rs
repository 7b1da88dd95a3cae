//! nemesis's fault table, keyed by store name: for each store of the facade that nemesis
//! knows more of than the faults every store takes, how the run starts it, which faults hit
//! it and its documented delays (rule 4's bound); and what the store faults ask of a store's
//! own crate. The stores themselves, their names and URL schemes, are the facade's
//! ([`fencelock::STORES`]); a store without a row is run against `--url` with the client
//! faults that need no knowledge of it.

use std::fmt;
use std::time::Duration;

use crate::delays::{self, Delay, Order, StoreDelays};
use crate::fault::{Fault, CLOCK_BACK_MAX};

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
    /// A ZooKeeper ensemble of this many members.
    ZookeeperEnsemble(usize),
    /// A Redis Sentinel deployment: a master, two replicas, three sentinels.
    RedisSentinel,
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
    /// The store's documented delays: rule 4's bound, and when it answers no one.
    pub delays: StoreDelays,
}

/// What a server clock stepped back adds: the server's timers (Redis's key expiry, a
/// PostgreSQL timeout's end time) are wall-clock times, so a dead holder's lock lives that much
/// longer; the nemesis steps back by at most [`CLOCK_BACK_MAX`].
const CLOCK_BACK_DELAY: Delay = Delay {
    what: "a server clock stepped back (clock-back) keeps a dead holder's lock that much longer",
    at_most: CLOCK_BACK_MAX,
};

/// A Redis waiter's delays, with one server or a cluster.
const REDIS_DELAYS: StoreDelays = StoreDelays {
    min_ttl: fencelock::limits::MIN_TTL,
    ttl_granularity: Duration::from_millis(1),
    delays: &[
        Delay {
            what: "a waiter looks again at least every WAIT_CAP (fencelock_redis::WAIT_CAP)",
            at_most: fencelock::fencelock_redis::WAIT_CAP,
        },
        Delay {
            what: "a waiter's mark in the key's queue keeps later requests out for 1 s after \
                   the waiter stops refreshing it (fencelock-redis, \"Waiting in order\")",
            at_most: Duration::from_secs(1),
        },
        CLOCK_BACK_DELAY,
    ],
    unavailable_during: &[],
    order: Order::Fair,
};

/// Every store the run knows more of than the faults every store takes, keyed by name, in no
/// order of its own (the run takes the facade's). Every name is a facade store's.
pub const TABLE: &[FaultProfile] = &[
    FaultProfile {
        store: "memory",
        launch: Some(Launch::Memory { broken: false }),
        cut: true,
        store_faults: &[],
        delays: StoreDelays {
            min_ttl: fencelock::limits::MIN_TTL,
            ttl_granularity: Duration::from_millis(1),
            delays: &[],
            unavailable_during: &[],
            order: Order::Fair,
        },
    },
    FaultProfile {
        store: "redis",
        launch: Some(Launch::Redis),
        cut: true,
        store_faults: &[Fault::RedisRestart, Fault::ClockBack, Fault::ClockForward],
        delays: StoreDelays {
            unavailable_during: &[Fault::RedisRestart],
            ..REDIS_DELAYS
        },
    },
    // The cluster's client waits and marks as one server's does; the run cannot start a
    // cluster, and a cut of the URL's hosts would miss the nodes the cluster names.
    FaultProfile {
        store: "redis-cluster",
        launch: None,
        cut: false,
        store_faults: &[],
        delays: REDIS_DELAYS,
    },
    // The workers reach the master the sentinels name, not the URL's hosts: no cut. The run's
    // URL asks min_replicas=1, so a failover keeps every acknowledged lease (the crate docs,
    // "Redis Sentinel"); the store answers no one until the sentinels promote a replica.
    FaultProfile {
        store: "redis-sentinel",
        launch: Some(Launch::RedisSentinel),
        cut: false,
        store_faults: &[
            Fault::SentinelKillMaster,
            Fault::SentinelPauseMaster,
            Fault::SentinelFailover,
            Fault::SentinelKillSentinel,
        ],
        delays: StoreDelays {
            unavailable_during: &[
                Fault::SentinelKillMaster,
                Fault::SentinelPauseMaster,
                Fault::SentinelFailover,
            ],
            ..REDIS_DELAYS
        },
    },
    FaultProfile {
        store: "redlock",
        launch: Some(Launch::RedisMasters(5)),
        cut: true,
        store_faults: &[
            Fault::RedlockRestartMinority,
            Fault::RedlockCutMinority,
            Fault::ClockBack,
            Fault::ClockForward,
        ],
        delays: StoreDelays {
            min_ttl: fencelock::limits::MIN_TTL,
            ttl_granularity: Duration::from_millis(1),
            delays: &[
                Delay {
                    what: "a node that does not answer costs node_timeout (default 250 ms)",
                    at_most: Duration::from_millis(250),
                },
                Delay {
                    what: "a failed round is retried after up to retry_jitter (default 100 ms)",
                    at_most: Duration::from_millis(100),
                },
                CLOCK_BACK_DELAY,
            ],
            unavailable_during: &[],
            order: Order::Unordered,
        },
    },
    FaultProfile {
        store: "etcd",
        launch: Some(Launch::EtcdCluster(3)),
        cut: true,
        store_faults: &[
            Fault::EtcdKillLeader,
            Fault::EtcdStopMinority,
            Fault::WorkerClockBack,
            Fault::WorkerClockForward,
        ],
        delays: StoreDelays {
            min_ttl: fencelock::fencelock_etcd::MIN_TTL,
            ttl_granularity: Duration::from_secs(1),
            delays: &[Delay {
                what: "etcd's lessor revokes expired leases in a loop every 500 ms (etcd's \
                       lessor.go), so a lease outlives its TTL by up to that",
                at_most: Duration::from_millis(500),
            }],
            // A leader's death or a stopped member: a client of that member waits out its
            // command_timeout before trying another (fencelock-etcd's table, "store fails").
            unavailable_during: &[Fault::EtcdKillLeader, Fault::EtcdStopMinority],
            order: Order::Fair,
        },
    },
    FaultProfile {
        store: "postgres",
        launch: Some(Launch::Postgres),
        cut: true,
        store_faults: &[
            Fault::PgTerminate,
            Fault::PgRestart,
            Fault::ClockBack,
            Fault::ClockForward,
        ],
        delays: StoreDelays {
            min_ttl: fencelock::fencelock_postgres::MIN_TTL,
            ttl_granularity: Duration::from_millis(1),
            delays: &[
                Delay {
                    what: "a shared or permit waiter re-checks at most every 200 ms (MODE_POLL, \
                           docs/stores.md's modes table), with up to as much jitter",
                    at_most: Duration::from_millis(400),
                },
                CLOCK_BACK_DELAY,
            ],
            unavailable_during: &[Fault::PgRestart],
            order: Order::WritersOrdered,
        },
    },
    FaultProfile {
        store: "mysql",
        launch: Some(Launch::Mariadb),
        cut: true,
        store_faults: &[
            Fault::MysqlKill,
            Fault::MysqlRestart,
            Fault::ClockBack,
            Fault::ClockForward,
        ],
        delays: StoreDelays {
            min_ttl: fencelock::fencelock_mysql::MIN_TTL,
            ttl_granularity: Duration::from_secs(1),
            delays: &[CLOCK_BACK_DELAY],
            unavailable_during: &[Fault::MysqlRestart],
            order: Order::Unordered,
        },
    },
    FaultProfile {
        store: "sqlite",
        launch: Some(Launch::SqliteFile),
        cut: false,
        store_faults: &[Fault::WorkerClockBack, Fault::WorkerClockForward],
        delays: StoreDelays {
            min_ttl: fencelock::fencelock_sqlite::MIN_TTL,
            ttl_granularity: Duration::from_millis(1),
            delays: &[Delay {
                what: "a waiter without an inotify watch polls every 100 ms (fencelock-sqlite)",
                at_most: Duration::from_millis(100),
            }],
            unavailable_during: &[],
            order: Order::Unordered,
        },
    },
    FaultProfile {
        store: "zookeeper",
        launch: Some(Launch::ZookeeperEnsemble(3)),
        cut: true,
        store_faults: &[
            Fault::ZkKillLeader,
            Fault::ZkStopMinority,
            Fault::ZkIsolateFollower,
            Fault::WorkerClockBack,
            Fault::WorkerClockForward,
        ],
        delays: StoreDelays {
            // Twice the servers' minSessionTimeout (fencelock-zookeeper's "TTL" row).
            min_ttl: Duration::from_millis(
                2 * test_servers::zookeeper::MIN_SESSION_TIMEOUT.as_millis() as u64,
            ),
            // A TTL is rounded up to a tick, estimated as minSessionTimeout / 2.
            ttl_granularity: Duration::from_millis(
                test_servers::zookeeper::MIN_SESSION_TIMEOUT.as_millis() as u64 / 2,
            ),
            // Waiters are woken by a watch on the node ahead; a dead, paused or cut-off
            // holder's session (as long as its granted TTL) ends within its timeout plus two
            // ticks (fencelock-zookeeper's "holder dies").
            delays: &[Delay {
                what: "the server expires a session up to two ticks after its timeout \
                       (ZooKeeper's expiry buckets; a tick is 100 ms on the run's servers)",
                at_most: Duration::from_millis(
                    test_servers::zookeeper::MIN_SESSION_TIMEOUT.as_millis() as u64,
                ),
            }],
            // An election: the ensemble answers no one until a leader is elected and synced,
            // and clients reconnect with their backoff (after a stopped member, only when it
            // led, or when a client was on it). A follower cut off from the quorum answers its
            // clients' writes and syncs no more, and drops them only after syncLimit
            // (test_servers::zookeeper::SYNC_LIMIT_TICKS, 1 s), when they reconnect elsewhere.
            unavailable_during: &[
                Fault::ZkKillLeader,
                Fault::ZkStopMinority,
                Fault::ZkIsolateFollower,
            ],
            order: Order::Fair,
        },
    },
];

/// Nemesis's own store, not the facade's: a memory store whose tokens start over after a
/// restart fault. The run started on it must fail (`--stores broken-memory`).
pub const BROKEN_MEMORY: FaultProfile = FaultProfile {
    store: "broken-memory",
    launch: Some(Launch::Memory { broken: true }),
    cut: true,
    store_faults: &[Fault::StoreRestart],
    delays: StoreDelays {
        min_ttl: fencelock::limits::MIN_TTL,
        ttl_granularity: Duration::from_millis(1),
        delays: &[],
        unavailable_during: &[Fault::StoreRestart],
        order: Order::Unordered,
    },
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
                delays: delays::NONE,
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

/// The row of the store named `store`, nemesis's own `broken-memory` among them.
fn row(store: &str) -> Option<&'static FaultProfile> {
    TABLE
        .iter()
        .chain([&BROKEN_MEMORY])
        .find(|profile| profile.store == store)
}

/// The delays of the store named `store` (none, the bound two TTLs, for a store without a
/// row).
pub fn delays_of(store: &str) -> &'static StoreDelays {
    row(store).map_or(&delays::NONE, |profile| &profile.delays)
}

/// Whether an etcd leader stopped past a TTL and resumed revokes leases a newer leader kept
/// alive, on the etcd server of this version (etcd before 3.4.31 and 3.5.13).
pub(crate) fn etcd_stale_leader_revokes_leases(version: &str) -> bool {
    fencelock::fencelock_etcd::stale_leader_revokes_leases(version)
}

/// The server-side lock name of `key` for a MySQL store with its default table and namespace
/// on `database`, as the workers use it.
pub(crate) fn mysql_lock_name(database: &str, key: &str) -> String {
    fencelock_mysql::lock_name(
        database,
        fencelock_mysql::DEFAULT_TABLE,
        fencelock_mysql::DEFAULT_NAMESPACE,
        key,
    )
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
        for store in every_profile() {
            assert_eq!(FaultProfile::parse(store.name()), Some(store));
        }
    }

    #[test]
    fn a_sqlite_run_has_no_cut() {
        let of_url = |url| FaultProfile::of_url(url).map(|p| p.store).ok();
        let sqlite = FaultProfile::parse("sqlite").unwrap();
        let mysql = FaultProfile::parse("mysql").unwrap();
        for own in [true, false] {
            assert!(!sqlite.faults(own).contains(&Fault::Cut));
            assert!(mysql.faults(own).contains(&Fault::Cut));
        }
        assert_eq!(of_url("mariadb://h/db"), Some("mysql"));
        assert_eq!(of_url("sqlite:///tmp/l.db"), Some("sqlite"));
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
    /// found, and its store would silently get the client faults only and no delays.
    #[test]
    fn every_name_in_the_faults_is_a_facade_store() {
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

    /// Every scheme the facade serves finds its store's row.
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

    /// Redis Cluster is run against `--url` with the faults every store takes: no cut (its
    /// client follows the cluster's own node addresses, past any relay on the URL's hosts),
    /// no store fault, and the run cannot start it. Its waiters' delays are Redis's.
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
        assert_eq!(profile.delays.delays, delays_of("redis").delays);
    }

    /// A store the table has no row for (the next one, before its row is written) is run
    /// with the client faults that need no knowledge of it, and rule 4's plain bound.
    #[test]
    fn a_store_without_a_row_gets_the_client_faults_and_no_delays() {
        static NEXT: fencelock::StoreKind =
            fencelock::StoreKind::new("next", &["next"], "next", fencelock::MEMORY.connect);
        let profile = FaultProfile::of_store(&NEXT);
        assert_eq!(profile.store, "next");
        assert_eq!(profile.launch, None);
        for own in [true, false] {
            assert_eq!(profile.faults(own), CLIENT_FAULTS.to_vec());
        }
        assert_eq!(profile.delays, delays::NONE);
        assert_eq!(*delays_of("next"), delays::NONE);
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
                Fault::RedlockCutMinority,
                Fault::ClockBack,
                Fault::ClockForward
            ]
        );
        assert_eq!(
            redlock.faults(false),
            [Fault::Pause, Fault::PauseWaiter, Fault::Kill, Fault::Cut]
        );
    }

    #[test]
    fn a_store_is_unavailable_only_during_its_own_faults() {
        for profile in TABLE.iter().copied().chain([BROKEN_MEMORY]) {
            for fault in profile.delays.unavailable_during {
                assert!(profile.faults(true).contains(fault), "{profile}: {fault}");
            }
        }
    }

    #[test]
    fn the_bound_is_two_granted_ttls_plus_the_delays() {
        let second = Duration::from_secs(1);
        assert_eq!(delays_of("memory").bound(second), 2 * second);
        // etcd grants whole seconds: 1.2 s is 2 s.
        assert_eq!(
            delays_of("etcd").bound(Duration::from_millis(1200)),
            Duration::from_millis(4500)
        );
        // Its re-check (400 ms) and a clock-back's longer life of a dead holder's lock.
        assert_eq!(
            delays_of("postgres").bound(second),
            Duration::from_millis(2650)
        );
    }
}
