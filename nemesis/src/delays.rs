//! Each store's documented delays, one table keyed by store name: what rule 4
//! (unavailability) adds to its bound of two TTLs, and the store faults during which the
//! store's docs say it answers no one (rule 4 is off while one is in progress).
//!
//! A frozen or dead client keeps the key at most until its lease runs out (one TTL after its
//! last extend, which came before the fault began); the next waiter is then granted within
//! the store's own delays (how often a waiter looks again, how late the server notices an
//! expiry). Two TTLs leave a TTL of room for everything else: a holder's critical section
//! begun before the fault, a new waiter's connection.

use std::time::Duration;

use crate::faults::Fault;

/// One delay a store documents, with where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay {
    /// What the delay is, and where the store documents it.
    pub what: &'static str,
    /// How long it lasts at most.
    pub at_most: Duration,
}

/// One store's row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreDelays {
    /// The store's name, as in `--stores` and the report.
    pub store: &'static str,
    /// TTLs are raised to at least this (the store's `Capabilities::min_ttl`).
    pub min_ttl: Duration,
    /// And rounded up to a multiple of this (`Capabilities::ttl_granularity`).
    pub ttl_granularity: Duration,
    /// Added to the bound after every client fault.
    pub delays: &'static [Delay],
    /// Store faults during which the store answers no one, by its docs; rule 4 is off from
    /// such a fault's start until it is healed, and counts again from then.
    pub unavailable_during: &'static [Fault],
}

/// Every store's delays. A store not listed has none (the bound is two TTLs).
pub const TABLE: &[StoreDelays] = &[
    StoreDelays {
        store: "memory",
        min_ttl: fencelock::validate::MIN_TTL,
        ttl_granularity: Duration::from_millis(1),
        delays: &[],
        unavailable_during: &[],
    },
    StoreDelays {
        store: "broken-memory",
        min_ttl: fencelock::validate::MIN_TTL,
        ttl_granularity: Duration::from_millis(1),
        delays: &[],
        unavailable_during: &[Fault::StoreRestart],
    },
    StoreDelays {
        store: "redis",
        min_ttl: fencelock::validate::MIN_TTL,
        ttl_granularity: Duration::from_millis(1),
        delays: &[
            Delay {
                what: "a waiter looks again at least every WAIT_CAP (fencelock_redis::WAIT_CAP)",
                at_most: fencelock::fencelock_redis::WAIT_CAP,
            },
            Delay {
                what: "a waiting writer's mark keeps readers and permits out for 1 s after the \
                       writer stops refreshing it (docs/stores.md, Redis)",
                at_most: Duration::from_secs(1),
            },
        ],
        unavailable_during: &[Fault::RedisRestart],
    },
    StoreDelays {
        store: "redlock",
        min_ttl: fencelock::validate::MIN_TTL,
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
        ],
        unavailable_during: &[],
    },
    StoreDelays {
        store: "etcd",
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
    },
    StoreDelays {
        store: "postgres",
        min_ttl: fencelock::fencelock_postgres::MIN_TTL,
        ttl_granularity: Duration::from_millis(1),
        delays: &[Delay {
            what: "a shared or permit waiter re-checks at most every 200 ms (MODE_POLL, docs/stores.md's \
                   modes table), with up to as much jitter",
            at_most: Duration::from_millis(400),
        }],
        unavailable_during: &[Fault::PgRestart],
    },
    StoreDelays {
        store: "mysql",
        min_ttl: fencelock::fencelock_mysql::MIN_TTL,
        ttl_granularity: Duration::from_secs(1),
        delays: &[],
        unavailable_during: &[Fault::MysqlRestart],
    },
    StoreDelays {
        store: "sqlite",
        min_ttl: fencelock::fencelock_sqlite::MIN_TTL,
        ttl_granularity: Duration::from_millis(1),
        delays: &[Delay {
            what: "a waiter without an inotify watch polls every 100 ms (fencelock-sqlite)",
            at_most: Duration::from_millis(100),
        }],
        unavailable_during: &[],
    },
];

/// No delays: the bound is two TTLs.
const NONE: StoreDelays = StoreDelays {
    store: "",
    min_ttl: fencelock::validate::MIN_TTL,
    ttl_granularity: Duration::from_millis(1),
    delays: &[],
    unavailable_during: &[],
};

/// The row of the store named `store` (no delays for a store not in the table).
pub fn of(store: &str) -> &'static StoreDelays {
    TABLE.iter().find(|d| d.store == store).unwrap_or(&NONE)
}

impl StoreDelays {
    /// The TTL the store grants for a request of `ttl`.
    pub fn granted_ttl(&self, ttl: Duration) -> Duration {
        let ttl = ttl.max(self.min_ttl);
        let step = self.ttl_granularity.as_nanos().max(1);
        let rounded = ttl.as_nanos().div_ceil(step) * step;
        Duration::from_nanos(u64::try_from(rounded).unwrap_or(u64::MAX))
    }

    /// Rule 4's bound for workers asking for `ttl`: two granted TTLs plus every delay.
    pub fn bound(&self, ttl: Duration) -> Duration {
        self.granted_ttl(ttl) * 2 + self.delays.iter().map(|d| d.at_most).sum::<Duration>()
    }

    /// Whether the store is documented as answering no one while `fault` is in progress.
    pub fn unavailable_during(&self, fault: Fault) -> bool {
        self.unavailable_during.contains(&fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{FaultProfile, BROKEN_MEMORY};

    #[test]
    fn every_store_has_a_row() {
        for profile in FaultProfile::startable().chain([BROKEN_MEMORY]) {
            assert_eq!(of(profile.name()).store, profile.name());
            for fault in of(profile.name()).unavailable_during {
                assert!(profile.faults(true).contains(fault), "{profile}: {fault}");
            }
        }
    }

    /// Keyed as the fault table is: a row under a name the facade does not know would never
    /// be found, and its store's bound would silently be two TTLs.
    #[test]
    fn every_row_is_a_store_of_the_facade_or_broken_memory() {
        for row in TABLE {
            assert!(
                row.store == BROKEN_MEMORY.store
                    || fencelock::KNOWN_STORES.iter().any(|k| k.name == row.store),
                "{}: not a store of the facade",
                row.store
            );
        }
    }

    #[test]
    fn the_bound_is_two_granted_ttls_plus_the_delays() {
        let second = Duration::from_secs(1);
        assert_eq!(of("memory").bound(second), 2 * second);
        // etcd grants whole seconds: 1.2 s is 2 s.
        assert_eq!(
            of("etcd").bound(Duration::from_millis(1200)),
            Duration::from_millis(4500)
        );
        assert_eq!(of("postgres").bound(second), Duration::from_millis(2400));
    }
}
