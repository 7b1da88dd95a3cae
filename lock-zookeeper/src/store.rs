//! [`ZookeeperStore`]: the contract on ZooKeeper sessions and lock nodes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw::{self, drift, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, Error, HolderStatus, KeyStatus, Lease, ListCursor, Listing, Mode, OwnerId,
    PerKeyState, ReleaseOutcome, Result,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;
use crate::data;
use crate::expiry::start_expiry;
use crate::held::{Held, Phase};
use crate::keys;
use crate::layout::Layout;
use crate::limits::Limits;
use crate::offset::{self, Offsets, TokenState};
use crate::session::{Failure, Session};
use crate::wait::{Enqueued, Place, Turn};

/// What a handle asks for, once, to learn the server's `minSessionTimeout`: less than the
/// minimum of any server but one with a `tickTime` under 50 ms, so the server's answer is that
/// minimum (or, on such a server, this; either way no later session, of at least twice it, is
/// lengthened). That session is closed at once.
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);
/// What a handle asks for, once, to learn the server's `maxSessionTimeout`: the contract's
/// longest TTL, more than any server grants. That session is closed at once.
const MAX_PROBE_TIMEOUT: Duration = fencelock_core::limits::MAX_TTL;
/// How many times a relabel's write is sent again after its expected data version moved.
const RELABEL_ATTEMPTS: usize = 8;
/// The longest a notified `next_status` waits on its watches before it reads again. The client
/// sets its one-shot watches again when it reconnects, and the server then sends what changed
/// meanwhile, so none should be lost; this bounds what a lost one would cost, for a read.
const WATCH_BACKSTOP: Duration = Duration::from_secs(5);
/// How long a session no lease and no acquisition has used stays open: the next acquire after
/// that closes it (the handle's first session, which `status` and `evict` use, stays).
const SESSION_IDLE: Duration = Duration::from_secs(60);

/// A handle to ZooKeeper: a session per TTL (rounded up to the server's tick), lock nodes in
/// Curator's queue, the lock node's `czxid` as the fencing token. See the crate docs.
pub struct ZookeeperStore {
    config: ZookeeperConfig,
    /// The sessions by their timeout; opened on first use, one at a time.
    sessions: tokio::sync::Mutex<HashMap<Duration, Arc<Session>>>,
    /// The server's session limits, learned from two probe sessions on first use.
    limits: OnceLock<Limits>,
    /// The prefix's token offset as this handle last saw it ([`Layout::Fencelock`]).
    tokens: Mutex<TokenState>,
}

impl std::fmt::Debug for ZookeeperStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperStore")
            .field("config", &self.config)
            .field("limits", &self.limits.get())
            .finish_non_exhaustive()
    }
}

impl ZookeeperStore {
    /// Connects: learns the server's `minSessionTimeout` and `maxSessionTimeout` (and so the
    /// shortest and longest TTL, [`Capabilities::min_ttl`] and [`Capabilities::max_ttl`]) from
    /// two sessions it closes, and opens the handle's first session, of the shortest TTL.
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when no server answered within
    /// the connect timeout; [`Store`](fencelock_core::ErrorKind::Store) when authentication
    /// was refused (a wrong SASL password) or, over TLS, the handshake was (an unknown CA, a
    /// certificate for another host, a missing client certificate): retrying cannot fix
    /// either; [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for TLS files the
    /// client cannot use.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-open sessions; nothing is held.
    pub async fn connect(config: ZookeeperConfig) -> Result<Self> {
        let store = Self::connect_lazy(config).await?;
        store.first_session().await?;
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
            limits: OnceLock::new(),
            tokens: Mutex::new(TokenState::default()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZookeeperConfig {
        &self.config
    }

    /// The server's `minSessionTimeout` (half the shortest TTL), once a session has been
    /// opened.
    pub fn min_session_timeout(&self) -> Option<Duration> {
        self.limits.get().map(|limits| limits.min)
    }

    /// The server's `maxSessionTimeout`, once a session has been opened.
    pub fn max_session_timeout(&self) -> Option<Duration> {
        self.limits.get().map(|limits| limits.max)
    }

    /// The most sessions this handle opens for its leases, once a session has been opened:
    /// one per TTL granule from the shortest TTL to the longest,
    /// `(max_ttl − min_ttl) / ttl_granularity + 1` of [`Capabilities`] (its first session,
    /// of the shortest TTL, among them).
    pub fn max_sessions(&self) -> Option<u64> {
        self.limits.get().map(Limits::max_sessions)
    }

    /// The negotiated timeouts of the sessions this handle holds now, shortest first.
    pub async fn session_timeouts(&self) -> Vec<Duration> {
        let sessions = self.sessions.lock().await;
        let mut timeouts: Vec<Duration> = sessions.values().map(|s| s.timeout).collect();
        timeouts.sort();
        timeouts
    }

    /// The handle's first session, of the shortest TTL: it serves `status`, `evict` and
    /// `per_key_state`, and leases of that TTL, which [`connect`](Self::connect) opens so that
    /// the TTL an acquire's latency weighs on most never waits for a session to open.
    async fn first_session(&self) -> Result<Arc<Session>> {
        let mut sessions = self.sessions.lock().await;
        let limits = self.limits().await?;
        self.open(&mut sessions, limits, limits.min_ttl()).await
    }

    /// The server's limits, learned if not yet: from a session asked for less than any
    /// server's minimum and one for more than any server's maximum, opened at once and closed.
    async fn limits(&self) -> Result<Limits> {
        if let Some(limits) = self.limits.get() {
            return Ok(*limits);
        }
        let (shortest, longest) = tokio::join!(
            Session::open(&self.config, PROBE_TIMEOUT),
            Session::open(&self.config, MAX_PROBE_TIMEOUT),
        );
        let (shortest, longest) = (shortest?, longest?);
        // Dropped, the probes' clients close their sessions.
        Ok(*self
            .limits
            .get_or_init(|| Limits::negotiated(shortest.timeout, longest.timeout)))
    }

    /// The session of `timeout` (opened if missing or lost; sessions unused for
    /// [`SESSION_IDLE`] are closed first).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the server negotiated another timeout than the one asked
    /// for (a server whose limits changed since the handle learned them).
    async fn open(
        &self,
        sessions: &mut HashMap<Duration, Arc<Session>>,
        limits: Limits,
        timeout: Duration,
    ) -> Result<Arc<Session>> {
        // Only the map holds an idle session: no lease, no acquisition, no cleanup has it.
        sessions.retain(|&kept, session| {
            kept == limits.min_ttl()
                || kept == timeout
                || Arc::strong_count(session) > 1
                || session.unused_for() < SESSION_IDLE
        });
        if let Some(session) = sessions.get(&timeout).filter(|s| !s.is_ended()) {
            session.touch();
            return Ok(session.clone());
        }
        let session = Session::open(&self.config, timeout).await?;
        let negotiated = session.timeout;
        if negotiated != timeout {
            let longer = if negotiated > timeout {
                "lengthened"
            } else {
                "shortened"
            };
            return Err(Error::invalid(
                "ttl",
                format!(
                    "the server {longer} a session of {timeout:?} to {negotiated:?}, so a lease \
                     on it could not last its TTL exactly (this handle learned its limits as \
                     minSessionTimeout {:?}, maxSessionTimeout {:?})",
                    limits.min, limits.max
                ),
            ));
        }
        session.start_heartbeat(limits.report_delay());
        sessions.insert(timeout, session.clone());
        Ok(session)
    }

    /// The session a lease of `ttl` lives on, of `ttl` rounded up to the granule (the TTL the
    /// lease is granted).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a TTL outside the server's session limits (named).
    async fn session_for(&self, ttl: Duration) -> Result<Arc<Session>> {
        let mut sessions = self.sessions.lock().await;
        let limits = self.limits().await?;
        let timeout = limits.session_for(ttl)?;
        self.open(&mut sessions, limits, timeout).await
    }

    /// One acquisition of `request`, waiting up to its wait (none: one attempt):
    /// [`Error::Busy`] if the key stays held.
    async fn attempt(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let AcquireRequest {
            key,
            ttl,
            mode,
            label,
            ..
        } = *request;
        let wait = request.wait.unwrap_or(Duration::ZERO);
        let started = Instant::now();
        let session = self.session_for(ttl).await?;
        let container = keys::container(&self.config.prefix, key);
        let owner = OwnerId::random();
        let place = Place {
            prefix: &self.config.prefix,
            layout: self.config.layout,
            acls: self.config.acls(),
            tokens: (self.config.layout == Layout::Fencelock).then_some(&self.tokens),
        };
        // The label is the node's data from its create: no request of its own.
        let entry =
            Enqueued::create(session.clone(), &place, container, owner, mode, label).await?;
        let grant = self
            .take_turn(entry, &session, key, mode, wait, started)
            .await?;
        granted_lease(key, owner, mode, &session, grant)
    }

    /// Waits for `entry`'s turn in its key's queue, up to `wait` after `started` (none: one
    /// look, bar compatible requests about to be marked), marking a reader's or permit's node
    /// once it may hold. A node that will not hold is removed before the error is returned.
    async fn take_turn(
        &self,
        mut entry: Enqueued,
        session: &Session,
        key: &str,
        mode: Mode,
        wait: Duration,
        started: Instant,
    ) -> Result<Grant> {
        let until = started + wait;
        // A lease granted at once counts from the call's start (before its session was
        // looked up, or opened for a TTL not used before, and before its node's create); one
        // granted after a wait, from before the read that found its node the oldest.
        let mut sent_at = started;
        // A request that finds only compatible requests between their grant and their mark
        // ahead waits for them even without a wait of its own, up to the command timeout.
        let settle_until = until.max(started + self.config.command_timeout);
        loop {
            let turn = entry.turn().await?;
            let compatible = match &turn {
                Turn::Holder { slot } => {
                    // The node's data version once granted: 0 from its create, the mark's
                    // after it.
                    let version = if mode != Mode::Exclusive {
                        entry.mark(*slot).await?
                    } else {
                        0
                    };
                    return Ok(Grant {
                        entry,
                        sent_at,
                        slot: *slot,
                        version,
                    });
                }
                Turn::Wait { compatible, .. } => *compatible,
                Turn::Full { .. } => false,
                Turn::LimitMismatch { held, requested } => {
                    let (held, requested) = (*held, *requested);
                    entry.remove().await;
                    return Err(Error::LimitMismatch {
                        key: key.to_owned(),
                        held,
                        requested,
                    });
                }
            };
            let now = Instant::now();
            let gives_up = if compatible {
                now >= settle_until
            } else {
                wait.is_zero() || now >= until
            };
            if gives_up {
                entry.remove().await;
                return Err(Error::Busy {
                    key: key.to_owned(),
                });
            }
            wait_out(&entry, turn, until, settle_until).await?;
            sent_at = Instant::now();
            if session.is_ended() {
                return Err(Error::Unavailable {
                    message: "the ZooKeeper session was lost while waiting".into(),
                    source: None,
                });
            }
        }
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

    /// [`queue`](Self::queue), leaving a watch in `watches` that fires when the container's
    /// children change, or, with no container, when it is made. A container made between the
    /// two reads leaves no watch: the caller reads again at once.
    async fn watched_queue(
        &self,
        session: &Session,
        container: &str,
        watches: &mut Vec<zk::OneshotWatcher>,
    ) -> Result<Vec<String>> {
        let client = &session.client;
        let what = "watching a key's lock nodes";
        let sync = session.call("syncing", || client.sync(container));
        let list = session.call(what, || client.list_and_watch_children(container));
        let (synced, listed) = tokio::join!(sync, list);
        match synced {
            Ok(()) | Err(Failure::NoNode) => {}
            Err(other) => return Err(other.into_error("syncing")),
        }
        match listed {
            Ok((children, watch)) => {
                watches.push(watch);
                Ok(keys::queue(self.config.layout, children))
            }
            Err(Failure::NoNode) => {
                let what = "watching for a key's container node";
                match session
                    .call(what, || client.check_and_watch_stat(container))
                    .await
                {
                    Ok((None, watch)) => watches.push(watch),
                    Ok((Some(_), _)) => {}
                    Err(other) => return Err(other.into_error(what)),
                }
                Ok(Vec::new())
            }
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// The key's status (see [`raw::Store::status`] below); with `watches`, read with watches
    /// left there on everything that would change it: the container's children (a holder or
    /// waiter comes or goes) and the data of every node read (a relabel, a reader's or
    /// permit's mark).
    async fn read_status(
        &self,
        key: &str,
        mut watches: Option<&mut Vec<zk::OneshotWatcher>>,
    ) -> Result<KeyStatus> {
        let session = self.first_session().await?;
        let container = keys::container(&self.config.prefix, key);
        let layout = self.config.layout;
        let mut held: Option<Mode> = None;
        let mut holders = Vec::new();
        let queue = match watches.as_deref_mut() {
            Some(watches) => self.watched_queue(&session, &container, watches).await?,
            None => self.queue(&session, &container).await?,
        };
        for name in queue {
            let mode = keys::node_mode(layout, &name);
            if held.is_some_and(|held| held != mode) {
                break;
            }
            let path = format!("{container}/{name}");
            let what = "reading a lock node";
            let client = &session.client;
            let read = match watches.as_deref_mut() {
                Some(watches) => session
                    .call(what, || client.get_and_watch_data(&path))
                    .await
                    .map(|(data, stat, watch)| {
                        watches.push(watch);
                        (data, stat)
                    }),
                None => session.call(what, || client.get_data(&path)).await,
            };
            let (data, stat) = match read {
                Ok(answer) => answer,
                Err(Failure::NoNode) => continue,
                Err(other) => return Err(other.into_error(what)),
            };
            let token = match layout {
                Layout::Fencelock => self
                    .offset_at(&session, stat.czxid)
                    .await?
                    .and_then(|o| offset::token(o, stat.czxid).ok()),
                _ => u64::try_from(stat.czxid).ok(),
            };
            let owner = keys::owner(layout, &name);
            if mode == Mode::Exclusive {
                return Ok(KeyStatus::Held {
                    owner,
                    token,
                    remaining: None,
                    label: data::label(&data, false),
                });
            }
            if stat.version < 1 {
                break; // not granted yet (nor is anything behind it)
            }
            held = Some(mode);
            let slot = match mode {
                Mode::Permit { .. } => data::parse_slot(&data),
                _ => None,
            };
            holders.push(
                HolderStatus::new(owner, token, slot, None).with_label(data::label(&data, true)),
            );
        }
        Ok(match held {
            Some(mode) => KeyStatus::Shared {
                mode,
                count: u32::try_from(holders.len()).unwrap_or(u32::MAX),
                holders,
            },
            None => KeyStatus::Free,
        })
    }
}

/// Waits for what `turn` waits on (the node ahead, or the container's children) to change, up
/// to `until`, or to `settle_until` behind a compatible request about to be marked.
async fn wait_out(
    entry: &Enqueued,
    turn: Turn,
    until: Instant,
    settle_until: Instant,
) -> Result<()> {
    match turn {
        Turn::Wait {
            name,
            version,
            compatible,
        } => {
            let deadline = if compatible { settle_until } else { until };
            entry.wait_for(&name, version, deadline).await?;
        }
        Turn::Full { older } => entry.wait_children(older, until).await?,
        Turn::Holder { .. } | Turn::LimitMismatch { .. } => {}
    }
    Ok(())
}

/// A lock node whose turn came ([`ZookeeperStore::take_turn`]), still armed.
struct Grant {
    entry: Enqueued,
    /// When the request that found it may hold (or the call) was sent.
    sent_at: Instant,
    /// A permit's slot.
    slot: Option<u32>,
    /// The node's data version: 0 from its create, the mark's after it.
    version: i32,
}

/// The lease of `owner` on the node of `grant`, on `session`: the node is disarmed (the
/// lease's release deletes it now), and the lease watched for its session's end and expiry.
fn granted_lease(
    key: &str,
    owner: OwnerId,
    mode: Mode,
    session: &Arc<Session>,
    grant: Grant,
) -> Result<Lease> {
    let Grant {
        mut entry,
        sent_at,
        slot,
        version,
    } = grant;
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
        version: AtomicI32::new(version),
        phase: Mutex::new(Phase::Held),
        hold_until: Mutex::new(sent_at + session.timeout - drift(session.timeout)),
        watch_id: OnceLock::new(),
        done: CancellationToken::new(),
    };
    // The lease's TTL is its session's timeout, counted from the latest moment the leader
    // provably heard of the session at or after (`limits`): the create, the sync of the
    // last turn or the mark, each forwarded to the leader, was sent after `sent_at`.
    let heard = session.heard_by(sent_at);
    let lease = Lease::with_store_state(key, owner, token, session.timeout, heard, held)
        .in_mode(mode, slot);
    if let Some(held) = lease.store_state::<Held>() {
        let _ = held.watch_id.set(session.leases.watch(lease.revocation()));
    }
    start_expiry(lease.clone());
    Ok(lease)
}

#[async_trait]
impl raw::Store for ZookeeperStore {
    fn name(&self) -> &'static str {
        crate::ZOOKEEPER.name
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new()
            .with_notified_wait(true)
            .with_fair_queue(true)
            .with_evict(true)
            .with_labels(true)
            .with_notified_status(true)
            .with_shared(self.config.layout == Layout::Fencelock)
            .with_permits(self.config.layout == Layout::Fencelock)
            .with_listing(true);
        if let Some(limits) = self.limits.get() {
            capabilities = capabilities
                .with_min_ttl(limits.min_ttl())
                .with_max_ttl(limits.max_ttl())
                .with_ttl_granularity(limits.granule);
        }
        capabilities
    }

    /// Creates the lock node in the request's mode and takes the key if the mode's rule lets
    /// it in (see the crate docs, "Lock modes"; exclusive: it is the oldest). Without a wait it
    /// otherwise deletes it and fails with [`Error::Busy`]; a request that finds only
    /// compatible requests ahead, granted but not yet marked, waits for their marks (at most
    /// the command timeout). With a wait it queues and waits, watching only the node just ahead
    /// (or, for the permit at the head of a full semaphore, the key's children), until the
    /// mode's rule lets it in or the wait passes.
    ///
    /// # Errors
    /// As the contract's; [`Error::InvalidInput`] also for a TTL outside the server's session
    /// limits (below twice its `minSessionTimeout`, or above its `maxSessionTimeout` once
    /// rounded up to the granule), naming them; [`Error::LimitMismatch`] next to a granted
    /// permit of another limit.
    ///
    /// # Cancel safety
    /// Dropping the future deletes the lock node from a spawned task (it may have been
    /// created): nothing stays held, waiters behind it are not kept waiting, a dropped waiter
    /// stops keeping newer readers out, and never takes the key later.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        self.attempt(request).await
    }

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
        // From the latest moment the leader provably heard of the session: the sync, which
        // the leader answered, was sent at `sent_at` (`limits`).
        lease.confirm(session.heard_by(sent_at));
        held.hold_from(sent_at, lease.ttl());
        Ok(())
    }

    /// Writes the label into the lease's own node: the node's data (after a reader's or
    /// permit's mark), a `setData` expecting the data version this lease last wrote, so only
    /// while the node is still the one its acquire created. A version that moved (a relabel
    /// of the same lease at once, or this one's write retried after its answer was lost) is
    /// read again and the write retried, while the node keeps its `czxid`.
    ///
    /// # Errors
    /// [`LeaseLost`](fencelock_core::ErrorKind::LeaseLost) when the node is gone (released,
    /// evicted, or its session expired), or the lease is past its local deadline, released or
    /// revoked; [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when ZooKeeper did not
    /// answer.
    ///
    /// # Cancel safety
    /// The write is sent when the call starts; dropping the future may leave the node
    /// relabelled or not (the lease keeps its old label either way).
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
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
        if *held.phase() != Phase::Held || lease.is_expired() {
            return Err(Error::lost(lease, "the lease was released or expired"));
        }
        let session = &held.session;
        let data = data::granted(lease.mode(), lease.slot(), Some(label));
        let what = "relabelling a lock node";
        let gone = |held: &Held| {
            held.gone();
            Error::lost(
                lease,
                "its lock node is gone (evicted, or its ZooKeeper session expired)",
            )
        };
        let mut expected = held.version.load(Ordering::Acquire);
        for _ in 0..RELABEL_ATTEMPTS {
            let write = session
                .call(what, || {
                    session.client.set_data(&held.path, &data, Some(expected))
                })
                .await;
            match write {
                Ok(stat) => {
                    held.version.fetch_max(stat.version, Ordering::AcqRel);
                    return Ok(());
                }
                Err(Failure::NoNode) => return Err(gone(held)),
                Err(Failure::BadVersion) => {}
                Err(other) => return Err(other.into_error(what)),
            }
            let read = "reading a lock node";
            match session
                .call(read, || session.client.check_stat(&held.path))
                .await
            {
                Ok(Some(stat)) if stat.czxid == held.czxid => expected = stat.version,
                Ok(_) | Err(Failure::NoNode) => return Err(gone(held)),
                Err(other) => return Err(other.into_error(read)),
            }
        }
        Err(Error::Unavailable {
            message: format!(
                "the lock node {}'s data version changed under each of {RELABEL_ATTEMPTS} \
                 relabels",
                held.path
            ),
            source: None,
        })
    }

    /// The oldest lock node of the key: its owner id, token (`czxid`) and label (its data,
    /// see the crate docs, *Labels and elections*); for readers and permits, every marked node
    /// of the mode at the head of the queue.
    ///
    /// # Errors
    /// As [`LockStore::status`](fencelock_core::LockStore::status).
    ///
    /// # Cancel safety
    /// Read-only.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.read_status(key, None).await
    }

    /// The status read with watches on what would change it (the container's children, the
    /// data of each node read), then again when one fires, until it differs from `seen`. A
    /// holder's expiry is a change too: its session's end, or the handle's delete at its
    /// local deadline, deletes its node. The watches are set by the reads themselves, so a change
    /// after them is not missed; the session's end, and a backstop of 5 s, also end the wait
    /// for another read. Dropped, a watch is removed from the client.
    ///
    /// # Errors
    /// As [`LockStore::next_status`](fencelock_core::LockStore::next_status).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future drops its watches.
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        loop {
            let mut watches = Vec::new();
            let status = self.read_status(key, Some(&mut watches)).await?;
            let now = Instant::now();
            if !status.same_holders(seen) || now >= until {
                return Ok(status);
            }
            if watches.is_empty() {
                continue; // the container was made between its two reads
            }
            let session = self.first_session().await?;
            let mut fired: Vec<_> = watches
                .into_iter()
                .map(|watch| Box::pin(watch.changed()))
                .collect();
            let any = std::future::poll_fn(|cx| {
                if fired
                    .iter_mut()
                    .any(|watch| Future::poll(watch.as_mut(), cx).is_ready())
                {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            });
            tokio::select! {
                () = any => {}
                () = tokio::time::sleep_until(until.min(now + WATCH_BACKSTOP)) => {}
                () = session.ended() => {}
            }
        }
    }

    /// Deletes the key's oldest lock node: the holder's, or with readers or permits holding,
    /// the oldest of them (one lease per call).
    ///
    /// # Errors
    /// As [`LockStore::evict`](fencelock_core::LockStore::evict).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have deleted the node.
    async fn evict(&self, key: &str) -> Result<bool> {
        let session = self.first_session().await?;
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

    /// The prefix's children read at once (ZooKeeper has no paged read of children: the
    /// crate docs say what that costs), the container names under the key prefix kept in key
    /// order from the cursor on, then each key's status.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        let session = self.first_session().await?;
        let what = "listing the prefix";
        let children = match session
            .call(what, || session.client.list_children(&self.config.prefix))
            .await
        {
            Ok(children) => children,
            Err(Failure::NoNode) => Vec::new(),
            Err(other) => return Err(other.into_error(what)),
        };
        let under = children
            .iter()
            .filter(|name| !offset::is_offset(name))
            .filter_map(|name| keys::unescape(name))
            .filter(|key| key.starts_with(prefix));
        let (keys, next) = raw::page_of(under, from, limit);
        raw::held_among(self, keys, next).await
    }

    /// The key container nodes under the prefix (held keys, and keys not yet swept).
    ///
    /// # Errors
    /// As [`LockStore::per_key_state`](fencelock_core::LockStore::per_key_state).
    ///
    /// # Cancel safety
    /// Read-only.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        let session = self.first_session().await?;
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
