//! Metrics on the [`metrics`] crate's facade (feature `metrics`): [`Metered`] wraps a store
//! and records what it grants and refuses and how long it takes; a [`KeepAlive`] records its
//! failed extends and its lost leases. Install any `metrics` exporter (Prometheus,
//! OpenTelemetry, statsd) to collect them; with none installed, recording costs next to nothing.
//!
//! | name | kind | unit | recorded when |
//! | --- | --- | --- | --- |
//! | `fencelock_grants_total` | counter | leases | `try_acquire` or `acquire` granted a lease |
//! | `fencelock_busy_total` | counter | answers | `try_acquire` (or `acquire` with a zero wait) found the key held ([`Error::Busy`]) |
//! | `fencelock_wait_timeouts_total` | counter | answers | `acquire` waited its whole bound ([`Error::WaitTimedOut`]) |
//! | `fencelock_acquire_seconds` | histogram | seconds | every `try_acquire`, whatever its outcome |
//! | `fencelock_wait_seconds` | histogram | seconds | every `acquire` (waiting included), whatever its outcome |
//! | `fencelock_extend_seconds` | histogram | seconds | every `extend`, whatever its outcome, keep-alive's included |
//! | `fencelock_keep_alive_failures_total` | counter | extends | an extend sent by a keep-alive failed or outlived the local deadline |
//! | `fencelock_leases_lost_total` | counter | leases | a keep-alive's lost signal fired (the store said the lease is gone, revoked it, or the local deadline passed unconfirmed) |
//!
//! Every metric carries one label, `store`: the name of the store's [`StoreKind`] (`memory`,
//! `redis`, `redlock`, `etcd`, `postgres`, …), as given to [`Metered::new`]. The keep-alive
//! metrics are recorded for leases granted through a [`Metered`] store (each lease carries its
//! store's label), so nothing is recorded for a store that is not metered.
//!
//! [`KeepAlive`]: crate::KeepAlive
//! [`StoreKind`]: crate::StoreKind

use std::sync::Once;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};

use crate::raw::{self, AcquireRequest};
use crate::{DynLockStore, Error, Lease, LockStore, Result};

/// Counter: leases granted.
pub const GRANTS: &str = "fencelock_grants_total";
/// Counter: `try_acquire` answers that the key is held.
pub const BUSY: &str = "fencelock_busy_total";
/// Counter: waiting acquires that gave up at their bound.
pub const WAIT_TIMEOUTS: &str = "fencelock_wait_timeouts_total";
/// Histogram, seconds: `try_acquire` latency.
pub const ACQUIRE_SECONDS: &str = "fencelock_acquire_seconds";
/// Histogram, seconds: waiting `acquire` latency.
pub const WAIT_SECONDS: &str = "fencelock_wait_seconds";
/// Histogram, seconds: `extend` latency.
pub const EXTEND_SECONDS: &str = "fencelock_extend_seconds";
/// Counter: failed extends sent by a keep-alive.
pub const KEEP_ALIVE_FAILURES: &str = "fencelock_keep_alive_failures_total";
/// Counter: leases a keep-alive found lost.
pub const LEASES_LOST: &str = "fencelock_leases_lost_total";

/// The label every metric carries: the store's name.
pub const STORE_LABEL: &str = "store";

/// Registers each metric's unit and description with the installed recorder. [`Metered::new`]
/// calls it; call it yourself after installing a recorder later than the first store.
pub fn describe() {
    describe_counter!(GRANTS, Unit::Count, "Leases granted.");
    describe_counter!(
        BUSY,
        Unit::Count,
        "try_acquire answers that the key is held."
    );
    describe_counter!(
        WAIT_TIMEOUTS,
        Unit::Count,
        "Waiting acquires that gave up at their bound."
    );
    describe_histogram!(ACQUIRE_SECONDS, Unit::Seconds, "try_acquire latency.");
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Waiting acquire latency, the wait included."
    );
    describe_histogram!(EXTEND_SECONDS, Unit::Seconds, "extend latency.");
    describe_counter!(
        KEEP_ALIVE_FAILURES,
        Unit::Count,
        "Extends sent by a keep-alive that failed."
    );
    describe_counter!(LEASES_LOST, Unit::Count, "Leases a keep-alive found lost.");
}

/// A store that records metrics for everything it does, labelled with the store's name, and
/// forwards every call, unchanged, to the store it wraps.
///
/// `fencelock::connect` wraps every store in one when the `metrics` feature is on. The leases
/// it grants carry its label, so a [`KeepAlive`](crate::KeepAlive) on them records its
/// failures and losses under the same store.
#[derive(Debug, Clone)]
pub struct Metered {
    inner: DynLockStore,
    store: &'static str,
}

impl Metered {
    /// Wraps `inner`, labelling its metrics `store = name` (use the store's
    /// [`StoreKind::name`](crate::StoreKind)).
    pub fn new(inner: DynLockStore, name: &'static str) -> Self {
        static DESCRIBED: Once = Once::new();
        DESCRIBED.call_once(describe);
        Metered { inner, store: name }
    }

    /// The store this one wraps.
    pub fn inner(&self) -> &DynLockStore {
        &self.inner
    }

    /// The `store` label of this store's metrics.
    pub fn name(&self) -> &'static str {
        self.store
    }

    fn count(&self, name: &'static str) {
        counter!(name, STORE_LABEL => self.store).increment(1);
    }

    fn time(&self, name: &'static str, elapsed: Duration) {
        histogram!(name, STORE_LABEL => self.store).record(elapsed.as_secs_f64());
    }

    fn granted(&self, result: &Result<Lease>) {
        match result {
            Ok(lease) => {
                lease.meter_as(self.store);
                self.count(GRANTS);
            }
            Err(Error::Busy { .. }) => self.count(BUSY),
            Err(Error::WaitTimedOut { .. }) => self.count(WAIT_TIMEOUTS),
            Err(_) => {}
        }
    }
}

/// A failed extend sent by a keep-alive, counted under the lease's store.
pub(crate) fn keep_alive_failed(lease: &Lease) {
    if let Some(store) = lease.metered_as() {
        counter!(KEEP_ALIVE_FAILURES, STORE_LABEL => store).increment(1);
    }
}

/// A lease found lost by a keep-alive, counted under the lease's store.
pub(crate) fn lease_lost(lease: &Lease) {
    if let Some(store) = lease.metered_as() {
        counter!(LEASES_LOST, STORE_LABEL => store).increment(1);
    }
}

#[async_trait]
impl raw::Wrapper for Metered {
    fn inner(&self) -> &dyn LockStore {
        &*self.inner
    }

    fn name(&self) -> &'static str {
        self.store
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let started = Instant::now();
        let result = self.inner.acquire_request(*request).await;
        let took = if request.wait.is_some() {
            WAIT_SECONDS
        } else {
            ACQUIRE_SECONDS
        };
        self.time(took, started.elapsed());
        self.granted(&result);
        result
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        let started = Instant::now();
        let result = self.inner.extend(lease).await;
        self.time(EXTEND_SECONDS, started.elapsed());
        result
    }
}
