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
use crate::raw::{self, AcquireRequest, LeaseExt};
use crate::{
    Capabilities, DynLockStore, Error, HolderStatus, KeyStatus, Lease, ListCursor, Listing, Mode,
    OwnerId, ReleaseOutcome, Result, StoreKind,
};

/// A lock store in this process's memory, on tokio's clock (so tests may run it under
/// `tokio::time::pause`).
///
/// Clones are handles to the same store. Waiters are woken by notification on release and
/// sleep exactly until the holder's expiry otherwise. Tokens come from one store-wide counter,
/// so they increase per key and across keys, in every mode. Shared leases and semaphore
/// permits are kept ([`Mode`]). The wait queue is fair across modes: a waiter is granted
/// before every conflicting request that arrived after it (a reader does not wait behind a
/// reader), so a waiting writer keeps new readers and permits out, and a waiting reader keeps
/// new permits out. Nothing survives the process.
///
/// Two fault switches serve tests: [`MemoryStore::set_reachable`] and
/// [`LockStore::evict`](crate::LockStore::evict), which
/// forgets whoever holds a key, as a store that lost its data would.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<HandleState>,
}

/// What every clone of a handle shares: the keys' state and the unreachable switch.
#[derive(Default)]
struct HandleState {
    state: Mutex<State>,
    unreachable: AtomicBool,
    /// Notified whenever any key's holders change (grant, release, evict, relabel): what
    /// observers of a status wait on.
    changed: Notify,
}

/// The process clock in µs since the Unix epoch: the floor of every token, as in every store
/// (see `docs/swaps.md`), so a resource fenced under another store accepts this one's leases.
/// A clock before the epoch reads as 0, and the counter alone keeps tokens growing.
fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// `max(last + 1, clock)`: strictly above every token before, and never below the clock.
/// Tokens stay below 2^63 for as long as the clock does (year 294,247).
fn next_token(last: u64, clock_micros: u64) -> u64 {
    (last + 1).max(clock_micros)
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    last_token: u64,
    /// The arrival order of waiters, across keys.
    last_arrival: u64,
}

#[derive(Default)]
struct Slot {
    /// The leases on the key: at most one exclusive, or shared ones, or permits of one limit.
    /// Expired ones are dropped at the next change.
    holders: Vec<Holder>,
    /// Requests waiting for the key, by arrival: each keeps out every conflicting request that
    /// arrived after it.
    waiters: Vec<Waiter>,
    // Waiters clone this Arc; a slot is only removed when nobody else holds it, so a waiter
    // always listens on the slot its key uses.
    wake: Arc<Notify>,
}

struct Waiter {
    arrival: u64,
    mode: Mode,
}

/// Whether a waiter in `waiting` keeps a later request in `asked` out: every pair but two
/// readers, which are granted together. A later permit waits behind an earlier one even with
/// a slot free, which the earlier one is about to take.
fn queued_behind(waiting: Mode, asked: Mode) -> bool {
    !(waiting == Mode::Shared && asked == Mode::Shared)
}

struct Holder {
    owner: OwnerId,
    token: u64,
    expires_at: Instant,
    mode: Mode,
    slot: Option<u32>,
    label: Option<String>,
}

impl Slot {
    fn live_holders(&self, now: Instant) -> impl Iterator<Item = &Holder> {
        self.holders.iter().filter(move |h| h.expires_at > now)
    }

    fn holder_of(&mut self, lease: &Lease, now: Instant) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| {
            h.expires_at > now && h.owner == lease.owner() && h.token == lease.fencing_token()
        })
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.live_holders(now).next().is_none()
            && self.waiters.is_empty()
            && Arc::strong_count(&self.wake) == 1
    }

    /// Whether a request in `mode` that arrived at `arrival` (a new one: `None`) may be granted
    /// now; `Err` for a limit mismatch. On `Ok(false)` the earliest expiry of a live holder, if
    /// any, says when to look again.
    fn admits(&self, key: &str, mode: Mode, arrival: Option<u64>, now: Instant) -> Result<bool> {
        let queued = self
            .waiters
            .iter()
            .any(|w| arrival.is_none_or(|a| w.arrival < a) && queued_behind(w.mode, mode));
        let mut live = self.live_holders(now).peekable();
        let Some(first) = live.peek().map(|h| h.mode) else {
            return Ok(!queued);
        };
        if let (Mode::Permit { limit: held }, Mode::Permit { limit: requested }) = (first, mode) {
            if held != requested {
                return Err(Error::LimitMismatch {
                    key: key.to_owned(),
                    held,
                    requested,
                });
            }
        }
        if queued || !mode.compatible_with(first) {
            return Ok(false);
        }
        Ok(match mode {
            Mode::Shared => true,
            Mode::Permit { limit } => live.count() < limit as usize,
            _ => false,
        })
    }

    fn free_slot(&self, mode: Mode, now: Instant) -> Option<u32> {
        let Mode::Permit { limit } = mode else {
            return None;
        };
        (0..limit).find(|slot| !self.live_holders(now).any(|h| h.slot == Some(*slot)))
    }
}

enum Attempt {
    Granted(Lease),
    Held { expires_at: Option<Instant> },
}

/// A waiter's place in a key's queue while it lives, keeping later conflicting requests out.
struct Queued<'a> {
    store: &'a MemoryStore,
    key: &'a str,
    arrival: u64,
}

impl Queued<'_> {
    fn join<'a>(store: &'a MemoryStore, key: &'a str, mode: Mode) -> Queued<'a> {
        let mut state = store.lock();
        state.last_arrival += 1;
        let arrival = state.last_arrival;
        state
            .slots
            .entry(key.to_owned())
            .or_default()
            .waiters
            .push(Waiter { arrival, mode });
        Queued {
            store,
            key,
            arrival,
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut state = self.store.lock();
        if let Some(slot) = state.slots.get_mut(self.key) {
            let before = slot.waiters.len();
            slot.waiters.retain(|w| w.arrival != self.arrival);
            if slot.waiters.len() < before {
                // Requests queued behind this one may go now.
                slot.wake.notify_waiters();
            }
        }
    }
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

    fn attempt(
        &self,
        key: &str,
        ttl: Duration,
        mode: Mode,
        label: Option<&str>,
        arrival: Option<u64>,
    ) -> Result<Attempt> {
        self.check_reachable()?;
        let sent_at = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let slot = state.slots.entry(key.to_owned()).or_default();
        slot.holders.retain(|h| h.expires_at > sent_at);
        if !slot.admits(key, mode, arrival, sent_at)? {
            return Ok(Attempt::Held {
                expires_at: slot.live_holders(sent_at).map(|h| h.expires_at).min(),
            });
        }
        state.last_token = next_token(state.last_token, clock_micros());
        let owner = OwnerId::random();
        let permit = slot.free_slot(mode, sent_at);
        slot.holders.push(Holder {
            owner,
            token: state.last_token,
            expires_at: sent_at + ttl,
            mode,
            slot: permit,
            label: label.map(str::to_owned),
        });
        self.shared.changed.notify_waiters();
        Ok(Attempt::Granted(
            Lease::new(key, owner, state.last_token, ttl, sent_at).in_mode(mode, permit),
        ))
    }

    fn try_acquire_in(
        &self,
        key: &str,
        ttl: Duration,
        mode: Mode,
        label: Option<&str>,
    ) -> Result<Lease> {
        match self.attempt(key, ttl, mode, label, None)? {
            Attempt::Granted(lease) => {
                tracing::debug!(key, token = lease.fencing_token(), %mode, "acquired");
                Ok(lease)
            }
            Attempt::Held { .. } => Err(Error::Busy {
                key: key.to_owned(),
            }),
        }
    }

    async fn acquire_in(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        mode: Mode,
        label: Option<&str>,
    ) -> Result<Lease> {
        let started = Instant::now();
        let deadline = started + wait;
        let wake = self.wake_handle(key);
        let mut queued: Option<Queued<'_>> = None;
        let result = loop {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let arrival = queued.as_ref().map(|q| q.arrival);
            let expires_at = match self.attempt(key, ttl, mode, label, arrival) {
                Ok(Attempt::Granted(lease)) => break Ok(lease),
                Ok(Attempt::Held { expires_at }) => expires_at,
                Err(error) => break Err(error),
            };
            if Instant::now() >= deadline {
                break Err(Error::Busy {
                    key: key.to_owned(),
                });
            }
            if queued.is_none() {
                queued = Some(Queued::join(self, key, mode));
                // Joined after the refusal: look again before sleeping, in case the key
                // freed in between.
                continue;
            }
            let until = expires_at.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                () = notified => {}
                () = sleep_until(until) => {}
            }
        };
        drop(queued);
        drop(wake);
        self.lock().tidy(key, Instant::now());
        match &result {
            Ok(lease) => tracing::debug!(
                key,
                token = lease.fencing_token(),
                %mode,
                waited_ms = started.elapsed().as_millis() as u64,
                "acquired after waiting"
            ),
            Err(error) => tracing::debug!(key, %error, "acquire gave up"),
        }
        result
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
impl raw::Store for MemoryStore {
    fn name(&self) -> &'static str {
        crate::MEMORY.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_notified_wait(true)
            .with_fair_queue(true)
            .with_evict(true)
            .with_shared(true)
            .with_permits(true)
            .with_labels(true)
            .with_listing(true)
            .with_notified_status(true)
    }

    /// # Cancel safety
    /// Cancel safe: the grant happens in one synchronous step, so a dropped future either took
    /// nothing or never ran; a dropped waiter holds nothing, and leaves its place in the queue
    /// at once.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let AcquireRequest {
            key,
            ttl,
            mode,
            wait,
            label,
            ..
        } = *request;
        match wait {
            None => self.try_acquire_in(key, ttl, mode, label),
            Some(wait) => self.acquire_in(key, ttl, wait, mode, label).await,
        }
    }

    /// # Cancel safety
    /// Cancel safe: one synchronous step.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut state = self.lock();
        let Some(slot) = state.slots.get_mut(lease.key()) else {
            return Ok(ReleaseOutcome::Lost);
        };
        let outcome = if slot.holder_of(lease, now).is_some() {
            slot.holders
                .retain(|h| h.expires_at > now && h.token != lease.fencing_token());
            slot.wake.notify_waiters();
            self.shared.changed.notify_waiters();
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

    /// # Cancel safety
    /// Cancel safe: one synchronous step.
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.check_reachable()?;
        let sent_at = Instant::now();
        let mut state = self.lock();
        match state
            .slots
            .get_mut(lease.key())
            .and_then(|slot| slot.holder_of(lease, sent_at))
        {
            Some(holder) => {
                holder.expires_at = sent_at + lease.ttl();
                lease.confirm(sent_at);
                tracing::trace!(key = lease.key(), token = lease.fencing_token(), "extended");
                Ok(())
            }
            None => Err(Error::lost(lease, "expired or held by another owner")),
        }
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
                let live = slot.live_holders(now).next().is_some();
                slot.holders.clear();
                live.then(|| slot.wake.clone())
            })
            .inspect(|wake| wake.notify_waiters());
        state.tidy(key, now);
        self.shared.changed.notify_waiters();
        Ok(evicted.is_some())
    }

    /// # Cancel safety
    /// Cancel safe: one synchronous step.
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut state = self.lock();
        match state
            .slots
            .get_mut(lease.key())
            .and_then(|slot| slot.holder_of(lease, now))
        {
            Some(holder) => {
                holder.label = Some(label.to_owned());
                self.shared.changed.notify_waiters();
                Ok(())
            }
            None => Err(Error::lost(lease, "expired or held by another owner")),
        }
    }

    /// Woken by every change of any key's holders, and at the earliest expiry of the key's.
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let status = raw::Store::status(self, key).await?;
            let now = Instant::now();
            if !status.same_holders(seen) || now >= until {
                return Ok(status);
            }
            let expiry = self
                .lock()
                .slots
                .get(key)
                .and_then(|slot| slot.live_holders(now).map(|h| h.expires_at).min());
            tokio::select! {
                () = notified => {}
                () = sleep_until(expiry.map_or(until, |at| at.min(until))) => {}
            }
        }
    }

    /// The names of the map's slots under the prefix, past the cursor, in byte order; the
    /// cursor is the last name of the page.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.check_reachable()?;
        let under: Vec<String> = self
            .lock()
            .slots
            .keys()
            .filter(|key| key.starts_with(prefix))
            .cloned()
            .collect();
        let (names, next) = raw::page_of(under, from, limit);
        raw::held_among(self, names, next).await
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.check_reachable()?;
        let now = Instant::now();
        let state = self.lock();
        let Some(slot) = state.slots.get(key) else {
            return Ok(KeyStatus::Free);
        };
        let live: Vec<&Holder> = slot.live_holders(now).collect();
        Ok(match live.as_slice() {
            [] => KeyStatus::Free,
            [holder] if holder.mode == Mode::Exclusive => KeyStatus::Held {
                owner: Some(holder.owner),
                token: Some(holder.token),
                remaining: Some(holder.expires_at - now),
                label: holder.label.clone(),
            },
            [first, ..] => KeyStatus::Shared {
                mode: first.mode,
                count: u32::try_from(live.len()).unwrap_or(u32::MAX),
                holders: live
                    .iter()
                    .map(|h| {
                        HolderStatus::new(
                            Some(h.owner),
                            Some(h.token),
                            h.slot,
                            Some(h.expires_at - now),
                        )
                        .with_label(h.label.clone())
                    })
                    .collect(),
            },
        })
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
    .with_eviction("forgets the key's holder, as a store that lost its data would")
    .with_example("memory://");

fn connect_memory(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
    let name = url
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .trim_end_matches('/');
    // A misspelt option must not quietly become part of the store's name.
    if name.contains(['?', '#']) {
        return Box::pin(std::future::ready(Err(Error::invalid(
            "url",
            "a memory:// URL takes a name and no options",
        ))));
    }
    let store: DynLockStore = Arc::new(MemoryStore::named(name));
    Box::pin(std::future::ready(Ok(store)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockStore;

    #[tokio::test]
    async fn a_memory_url_with_options_is_refused() {
        let error = connect_memory("memory://jobs?retention=1s").await.err();
        assert!(
            error.is_some_and(|e| e.to_string().contains("no options")),
            "an option became part of the name"
        );
        assert!(connect_memory("memory://jobs/").await.is_ok());
    }

    #[test]
    fn a_token_is_the_clock_or_one_past_the_last() {
        assert_eq!(next_token(0, 1_800_000_000_000_000), 1_800_000_000_000_000);
        assert_eq!(
            next_token(1_800_000_000_000_005, 1_800_000_000_000_000),
            1_800_000_000_000_006
        );
    }

    /// A resource fenced under a store on the clock (Redis: µs since the epoch) accepts the
    /// memory store's first lease (docs/swaps.md).
    #[tokio::test]
    async fn the_first_token_is_at_least_the_clock_at_grant() {
        let before = clock_micros();
        let store = MemoryStore::new();
        let first = store
            .try_acquire("k", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(
            first.fencing_token() >= before,
            "{} < {before}",
            first.fencing_token()
        );
        let second = store
            .try_acquire("other", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(second.fencing_token() > first.fencing_token());
    }
}
