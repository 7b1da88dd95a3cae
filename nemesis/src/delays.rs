//! A store's documented delays: what rule 4 (unavailability) adds to its bound of two TTLs,
//! and the store faults during which the store's docs say it answers no one (rule 4 is off
//! while one is in progress). Each store's are in its row of the fault table
//! ([`crate::faults`]).
//!
//! A frozen or dead client keeps the key at most until its lease runs out (one TTL after its
//! last extend, which came before the fault began); the next waiter is then granted within
//! the store's own delays (how often a waiter looks again, how late the server notices an
//! expiry). Two TTLs leave a TTL of room for everything else: a holder's critical section
//! begun before the fault, a new waiter's connection.

use std::time::Duration;

use crate::fault::Fault;

/// One delay a store documents, with where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delay {
    /// What the delay is, and where the store documents it.
    pub what: &'static str,
    /// How long it lasts at most.
    pub at_most: Duration,
}

/// One store's delays, in its row of the fault table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreDelays {
    /// TTLs are raised to at least this (the store's `Capabilities::min_ttl`).
    pub min_ttl: Duration,
    /// And rounded up to a multiple of this (`Capabilities::ttl_granularity`).
    pub ttl_granularity: Duration,
    /// Added to the bound after every client fault.
    pub delays: &'static [Delay],
    /// Store faults during which the store answers no one, by its docs; rule 4 is off from
    /// such a fault's start until it is healed, and counts again from then.
    pub unavailable_during: &'static [Fault],
    /// In which order the store's docs say it serves its waiters (rule 6).
    pub order: Order,
}

/// The order in which a store serves its waiters, as its docs state it (rule 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Not declared fair (`Capabilities::fair_queue` off): a waiter can be passed, so rule 6
    /// asks nothing (rule 4 still bounds how long no one is granted).
    Unordered,
    /// A fair queue across modes: no request asked after a waiter, in a mode that conflicts
    /// with the waiter's, is granted before it.
    Fair,
    /// A fair queue for every pair with an exclusive request in it; readers and permits are
    /// not ordered among themselves (PostgreSQL's crate docs, "Waiting").
    WritersOrdered,
}

impl Order {
    /// Whether a waiter in `waiting` must be granted before a request in `later` asked after
    /// it.
    pub fn orders(
        self,
        waiting: crate::history::WorkMode,
        later: crate::history::WorkMode,
    ) -> bool {
        use crate::history::WorkMode::{Exclusive, Shared};
        match self {
            Order::Unordered => false,
            Order::Fair => !(waiting == Shared && later == Shared),
            Order::WritersOrdered => waiting == Exclusive || later == Exclusive,
        }
    }
}

/// No delays: the bound is two TTLs (a store the fault table has no row for).
pub const NONE: StoreDelays = StoreDelays {
    min_ttl: fencelock::limits::MIN_TTL,
    ttl_granularity: Duration::from_millis(1),
    delays: &[],
    unavailable_during: &[],
    order: Order::Unordered,
};

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
