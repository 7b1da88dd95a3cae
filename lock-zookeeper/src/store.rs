//! [`ZookeeperStore`]: the contract on ZooKeeper sessions and lock nodes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::validate::{check_granted, check_request, check_wait};
use fencelock_core::{
    Acquire, Capabilities, Error, Extend, KeyStatus, Lease, LockStore, OwnerId, PerKeyState,
    Release, ReleaseOutcome, Result,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ZookeeperConfig;
use crate::expiry::start_expiry;
use crate::held::{Held, Phase};
use crate::keys;
use crate::layout::Layout;
use crate::offset::{self, Offsets, TokenState};
use crate::session::{Failure, Session};
use crate::wait::{Enqueued, Place, Turn};

/// What a handle asks for as the timeout of its first session: less than the
/// `minSessionTimeout` of any server but one with a `tickTime` under 50 ms, so the server's
/// answer is that minimum (or, on such a server, this; either is the shortest session the
/// handle then asks for, so no session is ever lengthened).
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);
/// The most session classes a handle keeps: `minSessionTimeout × 2^k` for `k < 32`.
const MAX_CLASS: u32 = 31;

/// A handle to ZooKeeper: a session per class of TTL, lock nodes in Curator's queue, the
/// lock node's `czxid` as the fencing token. See the crate docs.
pub struct ZookeeperStore {
    config: ZookeeperConfig,
    /// The sessions by class `k` (timeout `min × 2^k`); opened on first use, one at a time.
    sessions: tokio::sync::Mutex<HashMap<u32, Arc<Session>>>,
    /// The server's `minSessionTimeout`, learned from the first session.
    min_session: OnceLock<Duration>,
    /// The lowest class the server shortened (its `maxSessionTimeout`), once one was seen.
    max_class: Mutex<Option<(u32, Duration)>>,
    /// The prefix's token offset as this handle last saw it ([`Layout::Fencelock`]).
    tokens: Mutex<TokenState>,
}

impl std::fmt::Debug for ZookeeperStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperStore")
            .field("config", &self.config)
            .field("min_session", &self.min_session.get())
            .finish_non_exhaustive()
    }
}

impl ZookeeperStore {
    /// Connects: opens the handle's first session (which learns the server's
    /// `minSessionTimeout`, and so the shortest TTL, [`Capabilities::min_ttl`]).
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when no server answered within
    /// the connect timeout; [`Store`](fencelock_core::ErrorKind::Store) when authentication
    /// was refused.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-open session; nothing is held.
    pub async fn connect(config: ZookeeperConfig) -> Result<Self> {
        let store = Self::connect_lazy(config).await?;
        store.session(0).await?;
        Ok(store)
    }

    /// A handle that opens its sessions on first use, without a round trip now.
    ///
    /// # Errors
    /// None today; kept fallible like [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Nothing is sent.
    pub async fn connect_lazy(config: ZookeeperConfig) -> Result<Self> {
        Ok(ZookeeperStore {
            config,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            min_session: OnceLock::new(),
            max_class: Mutex::new(None),
            tokens: Mutex::new(TokenState::default()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZookeeperConfig {
        &self.config
    }

    /// The server's `minSessionTimeout`, once a session has been opened.
    pub fn min_session_timeout(&self) -> Option<Duration> {
        self.min_session.get().copied()
    }

    /// The negotiated timeouts of the sessions this handle holds now, shortest first.
    pub async fn session_timeouts(&self) -> Vec<Duration> {
        let sessions = self.sessions.lock().await;
        let mut timeouts: Vec<Duration> = sessions.values().map(|s| s.timeout).collect();
        timeouts.sort();
        timeouts
    }

    /// The session of class `k` (opened if missing or lost).
    async fn session(&self, k: u32) -> Result<Arc<Session>> {
        let mut sessions = self.sessions.lock().await;
        if let Some(session) = sessions.get(&k).filter(|s| !s.is_ended()) {
            return Ok(session.clone());
        }
        let probing = self.min_session.get().is_none();
        let requested = match self.min_session.get() {
            Some(min) if k > 0 => *min * (1u32 << k),
            Some(min) => *min,
            None => PROBE_TIMEOUT,
        };
        let session = Session::open(&self.config, requested).await?;
        let negotiated = session.timeout;
        let min = *self.min_session.get_or_init(|| negotiated);
        let wanted = if probing { min } else { requested };
        if negotiated > wanted {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "the server lengthened a session of {wanted:?} to {negotiated:?}, which would \
                     keep a key past its TTL (its minSessionTimeout is {min:?})"
                ),
            ));
        }
        if negotiated < wanted {
            let mut max = self
                .max_class
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if max.is_none_or(|(class, _)| k < class) {
                *max = Some((k, negotiated));
            }
        }
        sessions.insert(k, session.clone());
        Ok(session)
    }

    /// The session a lease of `ttl` lives on: class `k` with `min × 2^k ≤ ttl / 2`, the
    /// largest such (no larger than the class the server already shortened to its maximum).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a TTL below twice the server's `minSessionTimeout`.
    async fn session_for(&self, ttl: Duration) -> Result<Arc<Session>> {
        let min = match self.min_session.get() {
            Some(min) => *min,
            None => self.session(0).await?.timeout,
        };
        let half = ttl / 2;
        if half < min {
            let max = self
                .max_class
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map_or_else(|| "not seen yet".to_owned(), |(_, max)| format!("{max:?}"));
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} is below this store's minimum of {:?}: a lease lives on a ZooKeeper \
                     session of at most half its TTL, and this server's sessions last at least \
                     minSessionTimeout {min:?} (its limits: minSessionTimeout {min:?}, \
                     maxSessionTimeout {max})",
                    min * 2
                ),
            ));
        }
        let mut k = 0;
        while k < MAX_CLASS && min * (1u32 << (k + 1)) <= half {
            k += 1;
        }
        if let Some((max_class, _)) = *self
            .max_class
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            k = k.min(max_class);
        }
        self.session(k).await
    }

    /// One acquisition, waiting up to `wait` (zero: one attempt).
    async fn attempt(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_wait(wait)?;
        let started = Instant::now();
        let until = started + wait;
        let session = self.session_for(ttl).await?;
        let container = keys::container(&self.config.prefix, key);
        let owner = OwnerId::random();
        let place = Place {
            prefix: &self.config.prefix,
            layout: self.config.layout,
            acls: self.config.acls(),
            tokens: (self.config.layout == Layout::Fencelock).then_some(&self.tokens),
        };
        // A lease granted at once counts from before its node's create (and whatever it took
        // to make the container and read the offset); one granted after a wait, from before
        // the read that found its node the oldest.
        let mut sent_at = Instant::now();
        let mut entry = Enqueued::create(session.clone(), &place, container, owner).await?;
        let sent_at = loop {
            let predecessor = match entry.turn().await? {
                Turn::Holder => break sent_at,
                Turn::Behind(predecessor) => predecessor,
            };
            if wait.is_zero() || Instant::now() >= until {
                entry.remove().await;
                return Err(if wait.is_zero() {
                    Error::Busy {
                        key: key.to_owned(),
                    }
                } else {
                    Error::WaitTimedOut {
                        key: key.to_owned(),
                        waited: started.elapsed(),
                    }
                });
            }
            entry.wait_for(&predecessor, until).await?;
            sent_at = Instant::now();
            if session.is_ended() {
                return Err(Error::Unavailable {
                    message: "the ZooKeeper session was lost while waiting".into(),
                    source: None,
                });
            }
        };
        let Some((path, czxid)) = entry.node.clone() else {
            return Err(Error::store(
                "a lock node without its create's answer",
                "ZooKeeper",
            ));
        };
        let token = entry.token;
        entry.disarm();
        let held = Held {
            session: session.clone(),
            path,
            czxid,
            phase: Mutex::new(Phase::Held),
            watch_id: OnceLock::new(),
            done: CancellationToken::new(),
        };
        let lease = Lease::with_store_state(key, owner, token, ttl, sent_at, held);
        if let Some(held) = lease.store_state::<Held>() {
            let _ = held.watch_id.set(session.leases.watch(lease.revocation()));
        }
        start_expiry(lease.clone());
        check_granted(self, lease).await
    }

    /// The token offset in force at `zxid`, read from the offset node (`None`: the node no
    /// longer knows it, or has none).
    async fn offset_at(&self, session: &Session, zxid: i64) -> Result<Option<u64>> {
        let path = offset::path(&self.config.prefix);
        let what = "reading the token offset";
        match session.call(what, || session.client.get_data(&path)).await {
            Ok((data, stat)) => {
                Ok(Offsets::parse(&path, &data, stat.mzxid, stat.version)?.at(zxid))
            }
            Err(Failure::NoNode) => Ok(None),
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// The key's lock nodes, oldest first, read after a `sync` (so no older than the call).
    async fn queue(&self, session: &Session, container: &str) -> Result<Vec<String>> {
        let client = &session.client;
        let sync = session.call("syncing", || client.sync(container));
        let list = session.call("listing a key's lock nodes", || {
            client.list_children(container)
        });
        let (synced, listed) = tokio::join!(sync, list);
        match synced {
            Ok(()) | Err(Failure::NoNode) => {}
            Err(other) => return Err(other.into_error("syncing")),
        }
        match listed {
            Ok(children) => Ok(keys::queue(self.config.layout, children)),
            Err(Failure::NoNode) => Ok(Vec::new()),
            Err(other) => Err(other.into_error("listing a key's lock nodes")),
        }
    }
}

#[async_trait]
impl Acquire for ZookeeperStore {
    /// Creates the lock node and takes the lock if it is the oldest; otherwise deletes it
    /// and fails with [`Error::Busy`].
    ///
    /// # Errors
    /// As [`Acquire::try_acquire`]'s contract; [`Error::InvalidInput`] also for a TTL below
    /// twice the server's `minSessionTimeout`.
    ///
    /// # Cancel safety
    /// Dropping the future deletes the lock node from a spawned task (it may have been
    /// created): nothing stays held, and waiters behind it are not kept waiting.
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        self.attempt(key, ttl, Duration::ZERO).await
    }

    /// Queues a lock node and waits, watching only the node just ahead, until it is the
    /// oldest or `wait` passes.
    ///
    /// # Errors
    /// As [`Acquire::acquire`]'s contract.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): the dropped waiter's node is deleted.
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        self.attempt(key, ttl, wait).await
    }
}

#[async_trait]
impl Release for ZookeeperStore {
    /// Deletes the lease's lock node (its path is unique to this lease).
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when ZooKeeper did not answer
    /// (the node is then deleted at the lease's local deadline anyway). A lease whose session
    /// the ensemble expired is [`ReleaseOutcome::Lost`]: its node went with the session.
    ///
    /// # Cancel safety
    /// The delete is sent when the call starts; dropping the future may leave the lease held
    /// until its local deadline, when the handle deletes it.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let Some(held) = lease.store_state::<Held>() else {
            return Ok(ReleaseOutcome::Lost);
        };
        let outcome = {
            let mut phase = held.phase();
            match *phase {
                Phase::Held | Phase::Releasing => {
                    *phase = Phase::Releasing;
                    if lease.is_expired() || lease.is_revoked() {
                        ReleaseOutcome::Lost
                    } else {
                        ReleaseOutcome::Released
                    }
                }
                Phase::Expired | Phase::Gone => return Ok(ReleaseOutcome::Lost),
            }
        };
        // A session the ensemble ended took its ephemeral node with it: the lease is lost.
        let deleted = match held.delete().await {
            Ok(deleted) => deleted,
            Err(_) if held.session.is_terminal() => false,
            Err(error) => return Err(error),
        };
        *held.phase() = Phase::Gone;
        held.done.cancel();
        held.forget();
        Ok(if deleted {
            outcome
        } else {
            ReleaseOutcome::Lost
        })
    }
}

#[async_trait]
impl Extend for ZookeeperStore {
    /// Confirms the lock node still exists (a `sync`, then a read of it, in one round trip)
    /// and moves the local deadline.
    ///
    /// # Errors
    /// [`LeaseLost`](fencelock_core::ErrorKind::LeaseLost) when the node is gone, the lease is
    /// past its local deadline, released, or revoked (its session lost);
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when ZooKeeper did not answer.
    ///
    /// # Cancel safety
    /// Read-only: dropping the future leaves the lease as it was.
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let Some(held) = lease.store_state::<Held>() else {
            return Err(Error::lost(
                lease,
                "the lease was not granted by this store",
            ));
        };
        if lease.is_revoked() {
            return Err(Error::lost(
                lease,
                lease.revocation().reason().unwrap_or("revoked").to_owned(),
            ));
        }
        if *held.phase() != Phase::Held {
            return Err(Error::lost(lease, "the lease was released or expired"));
        }
        let sent_at = Instant::now();
        let session = &held.session;
        let sync = session.call("syncing", || session.client.sync(&held.path));
        let read = session.call("reading a lock node", || {
            session.client.check_stat(&held.path)
        });
        let (synced, read) = tokio::join!(sync, read);
        match synced {
            Ok(()) | Err(Failure::NoNode) => {}
            Err(other) => return Err(other.into_error("syncing")),
        }
        let stat = match read {
            Ok(stat) => stat,
            Err(Failure::NoNode) => None,
            Err(other) => return Err(other.into_error("reading a lock node")),
        };
        let mut phase = held.phase();
        match stat {
            Some(stat) if stat.czxid == held.czxid => {}
            _ => {
                *phase = Phase::Gone;
                held.done.cancel();
                drop(phase);
                held.forget();
                return Err(Error::lost(
                    lease,
                    "its lock node is gone (evicted, or its ZooKeeper session expired)",
                ));
            }
        }
        if *phase != Phase::Held || lease.is_expired() || lease.is_revoked() {
            if *phase == Phase::Held {
                *phase = Phase::Expired;
            }
            return Err(Error::lost(
                lease,
                "the lease reached its local deadline before the extend was confirmed",
            ));
        }
        lease.confirm(sent_at);
        Ok(())
    }
}

#[async_trait]
impl LockStore for ZookeeperStore {
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new()
            .with_notified_wait(true)
            .with_fair_queue(true)
            .with_evict(true);
        if let Some(min) = self.min_session.get() {
            capabilities = capabilities.with_min_ttl(*min * 2);
        }
        capabilities
    }

    /// The oldest lock node of the key: its owner id and token (`czxid`).
    ///
    /// # Errors
    /// As [`LockStore::status`].
    ///
    /// # Cancel safety
    /// Read-only.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        fencelock_core::validate::check_key(key)?;
        let session = self.session(0).await?;
        let container = keys::container(&self.config.prefix, key);
        for name in self.queue(&session, &container).await? {
            let path = format!("{container}/{name}");
            match session
                .call("reading a lock node", || session.client.check_stat(&path))
                .await
            {
                Ok(Some(stat)) => {
                    let token = match self.config.layout {
                        Layout::Fencelock => self
                            .offset_at(&session, stat.czxid)
                            .await?
                            .and_then(|o| offset::token(o, stat.czxid).ok()),
                        _ => u64::try_from(stat.czxid).ok(),
                    };
                    return Ok(KeyStatus::Held {
                        owner: keys::owner(self.config.layout, &name),
                        token,
                        remaining: None,
                    });
                }
                Ok(None) | Err(Failure::NoNode) => continue,
                Err(other) => return Err(other.into_error("reading a lock node")),
            }
        }
        Ok(KeyStatus::Free)
    }

    /// Deletes the key's oldest lock node (the holder's).
    ///
    /// # Errors
    /// As [`LockStore::evict`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have deleted the node.
    async fn evict(&self, key: &str) -> Result<bool> {
        fencelock_core::validate::check_key(key)?;
        let session = self.session(0).await?;
        let container = keys::container(&self.config.prefix, key);
        for name in self.queue(&session, &container).await? {
            let path = format!("{container}/{name}");
            match session
                .call("deleting a lock node", || {
                    session.client.delete(&path, None)
                })
                .await
            {
                Ok(()) => return Ok(true),
                Err(Failure::NoNode) => continue,
                Err(other) => return Err(other.into_error("deleting a lock node")),
            }
        }
        Ok(false)
    }

    /// The key container nodes under the prefix (held keys, and keys not yet swept).
    ///
    /// # Errors
    /// As [`LockStore::per_key_state`].
    ///
    /// # Cancel safety
    /// Read-only.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        let session = self.session(0).await?;
        let what = "listing the prefix";
        let count = match session
            .call(what, || session.client.list_children(&self.config.prefix))
            .await
        {
            Ok(children) => children
                .iter()
                .filter(|name| !offset::is_offset(name))
                .count(),
            Err(Failure::NoNode) => 0,
            Err(other) => return Err(other.into_error(what)),
        };
        Ok(Some(PerKeyState::new(
            count as u64,
            "key container nodes under the prefix",
        )))
    }
}
