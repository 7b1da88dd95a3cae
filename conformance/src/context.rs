//! What every case gets: the store, a second handle on demand, its capabilities and timings.

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Capabilities, DynLockStore};

use crate::StoreFactory;

/// The timings the suite uses for a store, derived from its capabilities so that a store with
/// whole-second TTLs gets whole-second cases.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The TTL of leases meant to expire during a case.
    pub short_ttl: Duration,
    /// The TTL of leases that must not expire during a case.
    pub long_ttl: Duration,
    /// The TTL of leases a case keeps alive or extends over several TTLs: at least three
    /// seconds, so that an extend held up for a second or two by a loaded machine (a slow
    /// fsync, a starved thread, a starved server) does not lose the lease and fail a case
    /// about something else.
    pub hold_ttl: Duration,
    /// How late after its due time an expiry or wake-up may be observed.
    pub slack: Duration,
    /// How soon after a release a waiter must hold the key.
    pub wake_bound: Duration,
    /// The median handoff (release sent to waiter granted) a store that declares
    /// [`Capabilities::notified_wait`] must meet: only a notification meets it, a poller
    /// does not.
    pub notified_wake_median: Duration,
    /// How late after the store forgets a lease its holder's lost signal may fire, beyond a
    /// third of the TTL: one extend round trip and the scheduling of a loaded machine.
    pub loss_detection_slack: Duration,
    /// How long one case may run before it counts as hung.
    pub case_limit: Duration,
}

impl Timing {
    /// The timings for a store with `capabilities`.
    pub fn for_store(capabilities: &Capabilities) -> Self {
        let short_ttl =
            capabilities.granted_ttl(capabilities.min_ttl.max(Duration::from_millis(300)));
        let long_ttl = capabilities.granted_ttl(Duration::from_secs(30).min(capabilities.max_ttl));
        let hold_ttl = capabilities.granted_ttl(
            short_ttl
                .max(Duration::from_secs(3))
                .min(capabilities.max_ttl),
        );
        Timing {
            short_ttl,
            long_ttl,
            hold_ttl,
            slack: short_ttl.max(Duration::from_millis(500)),
            wake_bound: Duration::from_secs(2),
            notified_wake_median: Duration::from_millis(150),
            loss_detection_slack: Duration::from_millis(250),
            case_limit: Duration::from_secs(60) + short_ttl * 20,
        }
    }
}

/// The context of one case run.
#[derive(Clone)]
pub struct Ctx {
    /// The factory, for more handles and the fault hooks.
    pub factory: Arc<dyn StoreFactory>,
    /// The first handle.
    pub store: DynLockStore,
    /// The store's capabilities.
    pub capabilities: Capabilities,
    /// The timings derived from them.
    pub timing: Timing,
    prefix: String,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("store", &self.store)
            .field("capabilities", &self.capabilities)
            .field("timing", &self.timing)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    pub(crate) async fn new(factory: Arc<dyn StoreFactory>) -> Self {
        let store = factory.handle().await;
        let capabilities = store.capabilities();
        Ctx {
            timing: Timing::for_store(&capabilities),
            capabilities,
            store,
            factory,
            prefix: format!("conformance:{:016x}", rand::random::<u64>()),
        }
    }

    /// A key of this run only, so concurrent cases on one server never meet.
    pub fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// Another handle to the same store.
    ///
    /// # Cancel safety
    /// As the factory's [`handle`](crate::StoreFactory::handle): dropping the future drops
    /// the handle being made; nothing is held.
    pub async fn handle(&self) -> DynLockStore {
        self.factory.handle().await
    }
}
