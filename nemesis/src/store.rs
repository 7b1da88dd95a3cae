//! Stores for in-process workers: a per-worker [`Link`] that can be cut like a frozen relay,
//! and [`RestartingMemory`], a memory store that can be "restarted", honestly (tokens go on) or
//! deliberately broken (tokens start over), to prove the checker catches a broken store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use fencelock::raw::{self, AcquireRequest, LeaseExt};
use fencelock::{
    Capabilities, DynLockStore, KeyStatus, Lease, LockStore, MemoryStore, PerKeyState,
    ReleaseOutcome, Result,
};
use tokio::sync::watch;

/// One worker's way to a shared store. While cut, every call waits until the link is restored,
/// as a request through a frozen TCP relay would.
#[derive(Debug, Clone)]
pub struct Link {
    inner: DynLockStore,
    open: watch::Sender<bool>,
}

impl Link {
    /// A link to `inner`, open.
    pub fn new(inner: DynLockStore) -> Self {
        Link {
            inner,
            open: watch::Sender::new(true),
        }
    }

    /// Cuts (`true`) or restores (`false`) the link.
    pub fn cut(&self, cut: bool) {
        self.open.send_replace(!cut);
    }

    async fn through(&self) {
        let mut open = self.open.subscribe();
        // The sender lives in `self`, so the wait cannot fail.
        let _ = open.wait_for(|&open| open).await;
    }
}

// Every call goes through the link, defaults included: nothing reaches the store while cut.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl raw::Wrapper for Link {
    fn inner(&self) -> &dyn LockStore {
        &*self.inner
    }

    fn name(&self) -> &'static str {
        "link"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn check(&self, _: &AcquireRequest<'_>) -> Result<()> {
        Ok(())
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        self.through().await;
        let lease = self.inner.acquire_request(*request).await;
        self.through().await;
        lease
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.through().await;
        let outcome = self.inner.release(lease).await;
        self.through().await;
        outcome
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.through().await;
        // An extend sent before a cut may be applied; its answer is held back, like a relay's.
        let answer = self.inner.extend(lease).await;
        self.through().await;
        answer
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.through().await;
        self.inner.status(key).await
    }

    async fn list(
        &self,
        prefix: &str,
        from: Option<&fencelock::ListCursor>,
        limit: usize,
    ) -> Result<fencelock::Listing> {
        self.through().await;
        self.inner.list(prefix, from, limit).await
    }

    async fn evict(&self, key: &str) -> Result<bool> {
        self.through().await;
        self.inner.evict(key).await
    }

    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        self.through().await;
        let answer = self.inner.relabel(lease, label).await;
        self.through().await;
        answer
    }

    async fn next_status(
        &self,
        key: &str,
        seen: &KeyStatus,
        until: fencelock::Instant,
    ) -> Result<KeyStatus> {
        self.through().await;
        let status = self.inner.next_status(key, seen, until).await;
        self.through().await;
        status
    }

    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        self.through().await;
        self.inner.per_key_state().await
    }

    fn diagnostics(&self) -> Vec<String> {
        self.inner.diagnostics()
    }

    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        self.inner.lease_env(lease)
    }
}

/// A memory store that a fault can restart: it forgets every lock. An honest restart keeps
/// the token counter going (as Redis keeps its tokens growing from the server's clock); a
/// broken one starts tokens over from 1, so the next holder's token is below the resource's
/// fence while that holder believes it holds the lock.
#[derive(Debug)]
pub struct RestartingMemory {
    current: Mutex<MemoryStore>,
    tokens_restart: bool,
    /// Added to the memory store's token (which is floored at the clock, so a new memory
    /// store alone would go on growing): set at each restart so that an honest one goes on
    /// above every token handed out and a broken one starts over near 1. Tokens keep the
    /// memory store's order, which is its grant order.
    offset: Mutex<i128>,
    /// The highest token handed out.
    highest: Mutex<u64>,
    restarted: AtomicBool,
}

impl RestartingMemory {
    /// A store whose restarts keep tokens growing (`tokens_restart: false`), or the broken one.
    pub fn new(tokens_restart: bool) -> Self {
        RestartingMemory {
            current: Mutex::new(MemoryStore::new()),
            tokens_restart,
            offset: Mutex::new(0),
            highest: Mutex::new(0),
            restarted: AtomicBool::new(false),
        }
    }

    /// Forgets every lock, as a server restarted without persistence would.
    pub fn restart(&self) {
        // Every token the new memory store mints is at least the clock now.
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as i128);
        let highest = *self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        *self.offset.lock().unwrap_or_else(PoisonError::into_inner) = if self.tokens_restart {
            1 - clock
        } else {
            (i128::from(highest) + 1 - clock).max(0)
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = MemoryStore::new();
        self.restarted.store(true, Ordering::SeqCst);
    }

    /// The current memory store, as the contract's trait object (its own `raw::Store`
    /// methods would be candidates too inside the wrapper's impl).
    fn store(&self) -> DynLockStore {
        Arc::new(
            self.current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }

    /// The memory store's lease with its token moved by the offset.
    fn rebase(&self, lease: Lease) -> Lease {
        let offset = *self.offset.lock().unwrap_or_else(PoisonError::into_inner);
        let token = u64::try_from(i128::from(lease.fencing_token()) + offset)
            .unwrap_or(1)
            .max(1);
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        *highest = (*highest).max(token);
        drop(highest);
        let sent_at = lease.valid_until() + fencelock::raw::drift(lease.ttl()) - lease.ttl();
        let (key, owner, ttl) = (lease.key().to_string(), lease.owner(), lease.ttl());
        let (mode, slot) = (lease.mode(), lease.slot());
        Lease::with_store_state(&key, owner, token, ttl, sent_at, lease).in_mode(mode, slot)
    }

    /// The memory store's own lease inside one of ours, if it is from the current store.
    fn inner_lease(lease: &Lease) -> Option<&Lease> {
        lease.store_state::<Lease>()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl raw::Store for RestartingMemory {
    fn name(&self) -> &'static str {
        "restarting-memory"
    }

    fn capabilities(&self) -> Capabilities {
        self.store().capabilities()
    }

    fn check(&self, _: &AcquireRequest<'_>) -> Result<()> {
        Ok(())
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let lease = self.store().acquire_request(*request).await?;
        Ok(self.rebase(lease))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        match Self::inner_lease(lease) {
            // A lease of a store since restarted is unknown to the new one: owner ids differ.
            Some(inner) => self.store().release(inner).await,
            None => Ok(ReleaseOutcome::Lost),
        }
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        let Some(inner) = Self::inner_lease(lease) else {
            return Err(fencelock::Error::lost(lease, "not a lease of this store"));
        };
        let sent_at = fencelock::Instant::now();
        self.store().extend(inner).await?;
        lease.confirm(sent_at);
        Ok(())
    }

    /// The nemesis never lists: its checker reads each key's status.
    async fn list(
        &self,
        prefix: &str,
        from: Option<&fencelock::ListCursor>,
        limit: usize,
    ) -> Result<fencelock::Listing> {
        let _ = (prefix, from, limit);
        Err(fencelock::Error::Unsupported { operation: "list" })
    }

    /// The current store's status, its tokens moved by the offset as its leases' are.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        let offset = *self.offset.lock().unwrap_or_else(PoisonError::into_inner);
        let rebase = |token: Option<u64>| {
            token.map(|t| u64::try_from(i128::from(t) + offset).unwrap_or(1).max(1))
        };
        Ok(match self.store().status(key).await? {
            KeyStatus::Held {
                owner,
                token,
                remaining,
                label,
                ..
            } => KeyStatus::Held {
                owner,
                token: rebase(token),
                remaining,
                label,
            },
            KeyStatus::Shared {
                mode,
                count,
                mut holders,
            } => {
                for holder in &mut holders {
                    holder.token = rebase(holder.token);
                }
                KeyStatus::Shared {
                    mode,
                    count,
                    holders,
                }
            }
            other => other,
        })
    }

    async fn evict(&self, key: &str) -> Result<bool> {
        self.store().evict(key).await
    }

    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        match Self::inner_lease(lease) {
            Some(inner) => self.store().relabel(inner, label).await,
            None => Err(fencelock::Error::lost(lease, "not a lease of this store")),
        }
    }

    /// Polled: the status is this store's (rebased), not the memory store's.
    async fn next_status(
        &self,
        key: &str,
        seen: &KeyStatus,
        until: fencelock::Instant,
    ) -> Result<KeyStatus> {
        loop {
            let status = raw::Store::status(self, key).await?;
            let now = fencelock::Instant::now();
            if !status.same_holders(seen) || now >= until {
                return Ok(status);
            }
            tokio::time::sleep_until((now + std::time::Duration::from_millis(10)).min(until)).await;
        }
    }

    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        self.store().per_key_state().await
    }

    fn diagnostics(&self) -> Vec<String> {
        self.store().diagnostics()
    }

    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        self.store().lease_env(lease)
    }
}

/// A shared store for in-process workers: plain memory, or memory that faults may restart.
pub fn memory(tokens_restart: Option<bool>) -> (DynLockStore, Option<Arc<RestartingMemory>>) {
    match tokens_restart {
        None => (Arc::new(MemoryStore::new()), None),
        Some(broken) => {
            let store = Arc::new(RestartingMemory::new(broken));
            (store.clone(), Some(store))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_honest_restart_keeps_tokens_growing_and_a_broken_one_does_not() {
        for (broken, grows) in [(false, true), (true, false)] {
            let store = RestartingMemory::new(broken);
            let ttl = Duration::from_secs(5);
            let first = store.try_acquire("k", ttl).await.unwrap();
            let _ = store.try_acquire("k", ttl).await.unwrap_err();
            store.restart();
            let second = store.try_acquire("k", ttl).await.unwrap();
            assert_eq!(
                second.fencing_token() > first.fencing_token(),
                grows,
                "broken={broken}"
            );
            assert_eq!(store.release(&first).await.unwrap(), ReleaseOutcome::Lost);
            store.extend(&second).await.unwrap();
            assert_eq!(
                store.release(&second).await.unwrap(),
                ReleaseOutcome::Released
            );
        }
    }

    #[tokio::test]
    async fn a_cut_link_holds_calls_until_restored() {
        let link = Link::new(Arc::new(MemoryStore::new()));
        link.cut(true);
        let call = link.try_acquire("k", Duration::from_secs(5));
        assert!(tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err());
        link.cut(false);
        let lease = link.try_acquire("k", Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            link.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}
