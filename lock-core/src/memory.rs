//! The in-memory store: the reference implementation of the contract and the embedded default.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use crate::kind::BoxFuture;
use crate::validate::{check_request, check_wait};
use crate::{
    Acquire, Capabilities, DynLockStore, Error, Extend, KeyStatus, Lease, LockStore, OwnerId,
    Release, ReleaseOutcome, Result, StoreKind,
};

/// A lock store in this process's memory, on tokio's clock (so tests may run it under
/// `tokio::time::pause`).
///
/// Clones are handles to the same store. Waiters are woken by notification on release and
/// sleep exactly until the holder's expiry otherwise. Tokens come from one store-wide counter,
/// so they increase per key and across keys. Nothing survives the process.
///
/// Two fault switches serve tests: [`MemoryStore::set_reachable`] and [`LockStore::evict`], which
/// forgets whoever holds a key, as a store that lost its data would.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    unreachable: AtomicBool,
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    last_token: u64,
}

#[derive(Default)]
struct Slot {
    holder: Option<Holder>,
    // Waiters clone this Arc; a slot is only removed when nobody else holds it, so a waiter
    // always listens on the slot its key uses.
    wake: Arc<Notify>,
}

struct Holder {
    owner: OwnerId,
    token: u64,
    expires_at: Instant,
}

impl Slot {
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }

    fn is_held_by(&self, lease: &Lease, now: Instant) -> bool {
        self.live_holder(now)
            .is_some_and(|h| h.owner == lease.owner() && h.token == lease.fencing_token())
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.live_holder(now).is_none() && Arc::strong_count(&self.wake) == 1
    }
}

enum Attempt {
    Granted(Lease),
    Held { expires_at: Instant },
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fault switch: while unreachable, every operation fails with
    /// [`Error::Unavailable`] and changes nothing.
    pub fn set_reachable(&self, reachable: bool) {
        self.shared.unreachable.store(!reachable, Ordering::SeqCst);
    }

    /// The process-wide store called `name`: every call with the same name, from anywhere in
    /// the process, gets a handle to the same store. What `memory://name` connects to.
    pub fn named(name: &str) -> Self {
        static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
        let mut stores = STORES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        stores.entry(name.to_owned()).or_default().clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn check_reachable(&self) -> Result<()> {
        if self.shared.unreachable.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                message: "the memory store is switched unreachable".into(),
                source: None,
            });
        }
        Ok(())
    }

    fn attempt(&self, key: &str, ttl: Duration) -> Result<Attempt> {
        self.check_reachable()?;
        let sent_at = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let slot = state.slots.entry(key.to_owned()).or_default();
        if let Some(holder) = slot.live_holder(sent_at) {
            return Ok(Attempt::Held {
                expires_at: holder.expires_at,
            });
        }
        state.last_token += 1;
        let owner = OwnerId::random();
        slot.holder = Some(Holder {
            owner,
            token: state.last_token,
            expires_at: sent_at + ttl,
        });
        Ok(Attempt::Granted(Lease::new(
            key,
            owner,
            state.last_token,
            ttl,
            sent_at,
        )))
    }

    fn wake_handle(&self, key: &str) -> Arc<Notify> {
        self.lock()
            .slots
            .entry(key.to_owned())
            .or_default()
            .wake
            .clone()
    }
}

impl State {
    fn tidy(&mut self, key: &str, now: Instant) {
        if self.slots.get(key).is_some_and(|slot| slot.is_idle(now)) {
            self.slots.remove(key);
        }
    }
}

#[async_trait]
impl Acquire for MemoryStore {
    /// # Cancel safety
    /// Cancel safe: the grant happens in one synchronous step, so a dropped future either took
    /// nothing or never ran.
    #[tracing::instrument(
        level = "debug",
        name = "try_acquire",
        skip(self),
        fields(store = "memory")
    )]
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        match self.attempt(key, ttl)? {
            Attempt::Granted(lease) => {
                tracing::debug!(key, token = lease.fencing_token(), "acquired");
                Ok(lease)
            }
            Attempt::Held { .. } => Err(Error::Busy {
                key: key.to_owned(),
            }),
        }
    }

    /// # Cancel safety
    /// Cancel safe: a dropped waiter holds nothing.
    #[tracing::instrument(
        level = "debug",
        name = "acquire",
        skip(self),
        fields(store = "memory")
    )]
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_wait(wait)?;
        let started = Instant::now();
        let deadline = started + wait;
        let wake = self.wake_handle(key);
        let result = loop {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let expires_at = match self.attempt(key, ttl) {
                Ok(Attempt::Granted(lease)) => break Ok(lease),
                Ok(Attempt::Held { expires_at }) => expires_at,
                Err(error) => break Err(error),
            };
            let now = Instant::now();
            if now >= deadline {
                break Err(Error::WaitTimedOut {
                    key: key.to_owned(),
                    waited: now - started,
                });
            }
            tokio::select! {
                () = notified => {}
                () = sleep_until(expires_at.min(deadline)) => {}
            }
        };
        drop(wake);
        self.lock().tidy(key, Instant::now());
        match &result {
            Ok(lease) => tracing::debug!(
                key,
                token = lease.fencing_token(),
                waited_ms = started.elapsed().as_millis() as u64,
                "acquired after waiting"
            ),
            Err(error) => tracing::debug!(key, %error, "acquire gave up"),
        }
        result
    }
}

#[async_trait]
impl Release for MemoryStore {
    /// # Cancel safety
    /// Cancel safe: one synchronous step.
    #[tracing::instrument(
        level = "debug",
        name = "release",
        skip_all,
        fields(store = "memory", key = lease.key(), token = lease.fencing_token())
    )]
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut state = self.lock();
        let Some(slot) = state.slots.get_mut(lease.key()) else {
            return Ok(ReleaseOutcome::Lost);
        };
        let outcome = if slot.is_held_by(lease, now) {
            slot.holder = None;
            slot.wake.notify_waiters();
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        };
        state.tidy(lease.key(), now);
        tracing::debug!(
            key = lease.key(),
            token = lease.fencing_token(),
            ?outcome,
            "released"
        );
        Ok(outcome)
    }
}

#[async_trait]
impl Extend for MemoryStore {
    /// # Cancel safety
    /// Cancel safe: one synchronous step.
    #[tracing::instrument(
        level = "trace",
        name = "extend",
        skip_all,
        fields(store = "memory", key = lease.key(), token = lease.fencing_token())
    )]
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.check_reachable()?;
        let sent_at = Instant::now();
        let mut state = self.lock();
        match state.slots.get_mut(lease.key()) {
            Some(slot) if slot.is_held_by(lease, sent_at) => {
                if let Some(holder) = slot.holder.as_mut() {
                    holder.expires_at = sent_at + lease.ttl();
                }
                lease.confirm(sent_at);
                tracing::trace!(key = lease.key(), token = lease.fencing_token(), "extended");
                Ok(())
            }
            _ => Err(Error::lost(lease, "expired or held by another owner")),
        }
    }
}

#[async_trait]
impl LockStore for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_notified_wait(true)
            .with_evict(true)
    }

    /// Forgets whoever holds `key`, as a store that lost its data would, and wakes its
    /// waiters. Tokens stay monotonic. Returns whether a live lease was forgotten.
    ///
    /// # Cancel safety
    /// Runs to completion at its first poll; dropping the future before that evicts nothing.
    async fn evict(&self, key: &str) -> Result<bool> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut state = self.lock();
        let evicted = state
            .slots
            .get_mut(key)
            .and_then(|slot| {
                let live = slot.live_holder(now).is_some();
                slot.holder.take();
                live.then(|| slot.wake.clone())
            })
            .inspect(|wake| wake.notify_waiters());
        state.tidy(key, now);
        Ok(evicted.is_some())
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        // As every store does: an invalid key is refused, never reported free.
        crate::validate::check_key(key)?;
        self.check_reachable()?;
        let now = Instant::now();
        let state = self.lock();
        Ok(
            match state.slots.get(key).and_then(|slot| slot.live_holder(now)) {
                Some(holder) => KeyStatus::Held {
                    owner: Some(holder.owner),
                    token: Some(holder.token),
                    remaining: Some(holder.expires_at - now),
                },
                None => KeyStatus::Free,
            },
        )
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.lock().slots.len())
            .field(
                "reachable",
                &!self.shared.unreachable.load(Ordering::SeqCst),
            )
            .finish()
    }
}

/// The memory store's descriptor: `memory://[name]`, one store per name within the process
/// ([`MemoryStore::named`]), always compiled in.
pub const MEMORY: StoreKind = StoreKind::new("memory", &["memory"], "", connect_memory)
    .with_eviction("forgets the key's holder, as a store that lost its data would");

fn connect_memory(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    let name = url
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .trim_end_matches('/');
    let store: DynLockStore = Arc::new(MemoryStore::named(name));
    Box::pin(std::future::ready(Ok(store)))
}
