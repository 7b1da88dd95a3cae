//! What differs between stores, declared by each store and read by the conformance suite.

use std::time::Duration;

use crate::limits::{MAX_TTL, MIN_TTL};

/// What a store guarantees beyond the contract and where its limits lie. The conformance suite
/// derives its timings and its case list from these values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The shortest TTL the store accepts.
    pub min_ttl: Duration,
    /// The longest TTL the store accepts.
    pub max_ttl: Duration,
    /// TTLs are rounded up to a multiple of this (etcd leases are whole seconds).
    pub ttl_granularity: Duration,
    /// A holder that dies (its connection closes) frees its lock at once rather than at TTL.
    pub frees_on_disconnect: bool,
    /// Waiters are woken by the store's own notification, not by polling.
    pub notified_wait: bool,
    /// Waiters are served oldest first.
    pub fair_queue: bool,
    /// An operator can free a held key with [`LockStore::evict`](crate::LockStore::evict).
    pub evict: bool,
    /// How long the store keeps the state of a key no one holds (its fencing counter, its
    /// row) after the key was last locked; `None` if it keeps no per-key state past the lease,
    /// or keeps it forever. A key locked again after its state went gets a greater token all
    /// the same.
    pub retention: Option<Duration>,
    /// Shared leases ([`Mode::Shared`](crate::Mode::Shared), reader-writer locks) are kept;
    /// otherwise they are refused with [`Error::Unsupported`](crate::Error::Unsupported).
    pub shared: bool,
    /// Semaphore permits ([`Mode::Permit`](crate::Mode::Permit)) are kept; otherwise they are
    /// refused with [`Error::Unsupported`](crate::Error::Unsupported).
    pub permits: bool,
    /// Holder labels ([`LockRequest::label`](crate::LockRequest::label)) are kept beside
    /// their holders and reported by [`LockStore::status`](crate::LockStore::status), and
    /// [`LockStore::relabel`](crate::LockStore::relabel) replaces them. Otherwise a label
    /// stays on the lease only (an interop layout whose peer's format has no room for one).
    pub labels: bool,
    /// [`LockStore::next_status`](crate::LockStore::next_status) is woken by the store's own
    /// notification of a change; otherwise it reads the status every
    /// [`Capabilities::status_poll`].
    pub notified_status: bool,
    /// How often a polled [`LockStore::next_status`](crate::LockStore::next_status) reads the
    /// status: the bound, beyond a round trip, of how late an observer sees a change.
    pub status_poll: Duration,
    /// [`LockStore::list`](crate::LockStore::list) lists the keys held under a prefix;
    /// otherwise it is [`Unsupported`](crate::ErrorKind::Unsupported).
    pub listing: bool,
}

impl Capabilities {
    /// How often a store without notification reads a key's status for an observer:
    /// [`Capabilities::status_poll`] unless the store says otherwise.
    pub const DEFAULT_STATUS_POLL: Duration = Duration::from_millis(100);

    /// The baseline: millisecond TTLs from [`MIN_TTL`] to [`MAX_TTL`], polled waits, no
    /// disconnect detection, no fairness, no eviction, exclusive leases only. Adjust with the `with_*` methods.
    pub fn new() -> Self {
        Capabilities {
            min_ttl: MIN_TTL,
            max_ttl: MAX_TTL,
            ttl_granularity: Duration::from_millis(1),
            frees_on_disconnect: false,
            notified_wait: false,
            fair_queue: false,
            evict: false,
            shared: false,
            permits: false,
            retention: None,
            labels: false,
            notified_status: false,
            status_poll: Self::DEFAULT_STATUS_POLL,
            listing: false,
        }
    }

    /// Sets the shortest accepted TTL (at least [`MIN_TTL`]).
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl.max(MIN_TTL);
        self
    }

    /// Sets the longest accepted TTL (at most [`MAX_TTL`]).
    pub fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl.min(MAX_TTL);
        self
    }

    /// Sets the TTL granularity.
    pub fn with_ttl_granularity(mut self, granularity: Duration) -> Self {
        self.ttl_granularity = granularity.max(Duration::from_millis(1));
        self
    }

    /// Declares that a dead holder's lock is freed when its connection closes.
    pub fn with_frees_on_disconnect(mut self, yes: bool) -> Self {
        self.frees_on_disconnect = yes;
        self
    }

    /// Declares notification-based waiting.
    pub fn with_notified_wait(mut self, yes: bool) -> Self {
        self.notified_wait = yes;
        self
    }

    /// Declares a fair (oldest first) wait queue.
    pub fn with_fair_queue(mut self, yes: bool) -> Self {
        self.fair_queue = yes;
        self
    }

    /// Declares that [`LockStore::evict`](crate::LockStore::evict) works.
    pub fn with_evict(mut self, yes: bool) -> Self {
        self.evict = yes;
        self
    }

    /// Declares the retention window of per-key state.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Declares that shared leases (reader-writer locks) are kept.
    pub fn with_shared(mut self, yes: bool) -> Self {
        self.shared = yes;
        self
    }

    /// Declares that semaphore permits are kept.
    pub fn with_permits(mut self, yes: bool) -> Self {
        self.permits = yes;
        self
    }

    /// Declares that holder labels are kept and reported.
    pub fn with_labels(mut self, yes: bool) -> Self {
        self.labels = yes;
        self
    }

    /// Declares that the store lists held keys (see [`Capabilities::listing`]).
    pub fn with_listing(mut self, yes: bool) -> Self {
        self.listing = yes;
        self
    }

    /// Declares that status changes are notified (see [`Capabilities::notified_status`]).
    pub fn with_notified_status(mut self, yes: bool) -> Self {
        self.notified_status = yes;
        self
    }

    /// Sets how often a polled status is read (at least 1 ms).
    pub fn with_status_poll(mut self, poll: Duration) -> Self {
        self.status_poll = poll.max(Duration::from_millis(1));
        self
    }

    /// Whether the store keeps leases in `mode`.
    pub fn supports(&self, mode: crate::Mode) -> bool {
        match mode {
            crate::Mode::Exclusive => true,
            crate::Mode::Shared => self.shared,
            crate::Mode::Permit { .. } => self.permits,
        }
    }

    /// `ttl` rounded up to the granularity: what the store will actually grant.
    pub fn granted_ttl(&self, ttl: Duration) -> Duration {
        let step = self.ttl_granularity.as_nanos().max(1);
        let steps = ttl.as_nanos().div_ceil(step);
        Duration::from_nanos(u64::try_from(steps * step).unwrap_or(u64::MAX))
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Self::new()
    }
}
