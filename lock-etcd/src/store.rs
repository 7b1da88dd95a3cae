//! [`EtcdStore`]: the contract on etcd leases, transactions and watches.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, KeyValue, Txn, TxnResponse, WatchFilterType,
    WatchOptions,
};
use fencelock_core::ttl::whole_secs;
use fencelock_core::validate::{check_granted, check_mode, check_request, check_wait};
use fencelock_core::{
    drift, Acquire, Capabilities, Error, Extend, HolderStatus, Instant, KeyStatus, Lease,
    LockStore, Mode, OwnerId, Release, ReleaseOutcome, Result,
};
use tokio::time::{sleep, sleep_until, timeout, timeout_at};

use crate::config::{EtcdConfig, Layout, MIN_TTL, TTL_GRANULARITY};
use crate::error::{
    self, client_certificate_required, client_error, is_old_auth_revision, is_retryable,
    name_the_right, never_sent, ClosedConnections, Right,
};
use crate::handoff::{self, Successor};
use crate::keys::{self, entry_owner};
use crate::modes::{self, Decision, EntryMode, Seen};
use crate::offset;
use crate::renewer::Renewer;
use crate::txn;
use crate::watcher::{Watcher, Watching};

/// HTTP/2 pings keep idle connections checked; etcd refuses pings more often than every 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// What a granted [`Lease`] carries: the entry and the etcd lease it lives on.
#[derive(Debug)]
struct Held {
    entry: String,
    lease_id: i64,
    /// The entry's create revision, which release and extend compare. The token too, except in
    /// [`Layout::Etcd`], where the token is the revision of the reply that granted the lock.
    created: i64,
    layout: Layout,
    /// The TTL asked for, in whole seconds: a released lock's idle etcd lease is filed under
    /// it, as the next acquire asking for it looks (etcd may have granted more, its minimum).
    requested_secs: u64,
    /// Whom a release hands the lock to, if this holder knows its successors (see
    /// [`crate::handoff`]): an exclusive lease in [`Layout::Fencelock`] granted after a wait.
    handoff: Option<Handoff>,
    /// [`HELD`], then [`RECYCLED`] or [`DISCARDED`] once a release has decided the etcd
    /// lease's fate. Shared by the lease's clones, so a second release or an extend after the
    /// release never touches an etcd lease that may already carry another lock.
    state: AtomicU8,
}

/// A holder's successors, oldest first, and the directory they are in.
#[derive(Debug)]
struct Handoff {
    dir: String,
    next: Vec<Successor>,
}

/// The lock was granted and no release has finished.
const HELD: u8 = 0;
/// A release deleted the entry; the etcd lease went to the idle leases (or was revoked).
const RECYCLED: u8 = 1;
/// A release found the entry gone; the etcd lease is being revoked.
const DISCARDED: u8 = 2;

/// The key `etcdctl lock` exports as `ETCD_LOCK_KEY` for a lease granted in
/// [`Layout::Etcd`]: its holder entry `{prefix}{key}/{lease id in hex}`, which Go code can
/// guard its own writes with (`Compare(CreateRevision(key), ">", 0)`, as `Mutex.IsOwner` does).
/// The matching `ETCD_LOCK_REV` is [`Lease::fencing_token`]. `None` for a lease of another
/// layout or another store.
pub fn mutex_key(lease: &Lease) -> Option<&str> {
    let held = lease.store_state::<Held>()?;
    (held.layout == Layout::Etcd).then_some(held.entry.as_str())
}

/// The create revision of a lease's entry, which release and extend compare (the token is the
/// offset plus it, in [`Layout::Fencelock`]).
#[cfg(test)]
pub(crate) fn created(lease: &Lease) -> Option<i64> {
    Some(lease.store_state::<Held>()?.created)
}

/// A lock store on etcd v3 (3.4 or newer).
///
/// Cloning is cheap; clones share one connection and one keep-alive stream. See the crate docs
/// for how it works and what it guarantees.
#[derive(Clone)]
pub struct EtcdStore {
    shared: Arc<HandleState>,
}

/// What every clone of one handle shares.
struct HandleState {
    client: Client,
    config: EtcdConfig,
    renewer: Renewer,
    /// The handle's one watch stream, shared by its waits.
    watcher: Watcher,
    /// Released locks' etcd leases, holding no keys, by requested TTL in seconds.
    idle: Mutex<HashMap<u64, Vec<IdleLease>>>,
    /// How many times this handle fetched a fresh auth token after etcd called its token older
    /// than the auth store; the lock lets one request fetch it for every request that saw the
    /// same old token.
    auth_refreshes: AtomicU64,
    auth_refresh: tokio::sync::Mutex<()>,
    /// The hint a raise of the token offset counts from (see [`offset::RevisionHint`]).
    revision_seen: Mutex<offset::RevisionHint>,
}

/// An etcd lease whose lock was released: it holds no keys and is not kept alive. The next
/// acquire with the same TTL renews it instead of granting a new one (a Raft write saved), or
/// takes it as it is when its last confirmed renewal is recent (see [`FRESH_IDLE`]).
struct IdleLease {
    lease_id: i64,
    ttl: Duration,
    valid_until: Instant,
    /// When the request etcd last confirmed it by (its grant or a renewal) was sent.
    confirmed_at: Instant,
}

/// An idle lease confirmed less than this share of its TTL ago is reused without a renewal:
/// etcd keeps it at least a TTL from that confirmation, and the lock granted on it is measured
/// from it, so its holder believes it holds the lock for at most a tenth of a TTL less than
/// after a renewal, and never longer than etcd keeps it. A fast acquire-release cycle (a
/// handoff, a short critical section) then sends one request fewer per acquire. A lease etcd
/// no longer knows (revoked meanwhile) fails the enqueue's put, and a new one is granted.
const FRESH_IDLE: u32 = 10;

/// How long a waiter whose predecessor was itself waiting puts off the read that closes the
/// gap between its read of the queue and its watches (see `Waiter::watch_deletion`). Most
/// waits behind a waiter end by a handoff before it, so the read is usually never sent; a
/// deletion missed in the gap delays the wake-up by this much (etcd's own catch-up of a watch
/// started in the past runs every 100 ms).
const GAP_CHECK_DELAY: Duration = Duration::from_millis(50);

/// How many idle leases a handle keeps per TTL; more are revoked.
const MAX_IDLE_PER_TTL: usize = 8;

/// What one enqueue found.
struct Enqueued {
    /// Our entry's create revision, which release and extend compare.
    revision: i64,
    /// The prefix's token offset as of `revision` ([`Layout::Fencelock`]; 0 in
    /// [`Layout::Etcd`]): the token is their sum, if we get the lock.
    offset: u64,
    /// The store revision the transaction was answered at: the token in [`Layout::Etcd`], if
    /// our entry is the head.
    answered_at: i64,
    /// Whether our entry is the queue's head.
    first: bool,
    /// When our entry was the newest: the newest entry older than it (our predecessor, `None`
    /// when we are first), in the transaction's snapshot.
    predecessor: Option<Option<Vec<u8>>>,
    /// Whether that predecessor was certainly waiting in that snapshot: an exclusive entry
    /// behind the head.
    predecessor_waits: bool,
}

/// The holder's fencing token in [`Layout::Etcd`]: the store revision of the reply that showed
/// our entry as the queue's head, which is what etcd's `Mutex` keeps as its `Header()` and
/// `etcdctl lock` exports as `ETCD_LOCK_REV`.
fn answered_at(answer: &TxnResponse) -> Result<i64> {
    answer
        .header()
        .map(|header| header.revision())
        .ok_or_else(|| Error::Store {
            message: "etcd answered a transaction without a header".into(),
            source: None,
        })
}

impl EtcdStore {
    /// Connects and proves the cluster answers with one read, within the connect timeout.
    ///
    /// Fails with a retryable [`Error::Unavailable`] if no member answers in time, or
    /// [`Error::Store`] if etcd refuses (for example wrong credentials, a user without `read`
    /// on the prefix, or, over TLS without `tls_cert`, a member that requires a client
    /// certificate: it refuses with a certificate alert, or closes three fresh connections in
    /// a row at their first request).
    ///
    /// # Cancel safety
    /// Dropping the future closes whatever connection it had opened; nothing is written.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore> {
        let (limit, endpoints) = (config.connect_timeout, config.endpoints.join(","));
        let connect = async {
            let store = Self::connect_lazy(config).await?;
            let prefix = store.shared.config.prefix().to_owned();
            if prefix.is_empty() {
                // etcd refuses a read of the empty key; the member's status needs no key
                // permission either.
                let client = &store.shared.client;
                store
                    .call("connect", Resend::Probe, || {
                        let mut maintenance = client.maintenance_client();
                        async move { maintenance.status().await }
                    })
                    .await?;
            } else {
                let client = &store.shared.client;
                store
                    .call("connect", Resend::Probe, || {
                        let (mut kv, key) = (client.kv_client(), prefix.clone());
                        let options = GetOptions::new().with_count_only();
                        async move { kv.get(key, Some(options)).await }
                    })
                    .await
                    .map_err(|error| {
                        name_the_right(error, "connect", &prefix, Right::ReadWrite, &prefix)
                    })?;
            }
            Ok(store)
        };
        // One bound for the whole: authenticating (with a user name) and the probe.
        match timeout(limit, connect).await {
            Ok(result) => result,
            Err(_) => Err(Error::Unavailable {
                message: format!("no etcd member of {endpoints} answered within {limit:?}"),
                source: None,
            }),
        }
    }

    /// Builds a handle without proving the cluster answers: the first operation connects. With
    /// a user name, the client authenticates here (one round trip, within the connect timeout).
    ///
    /// # Cancel safety
    /// As [`EtcdStore::connect`].
    pub async fn connect_lazy(config: EtcdConfig) -> Result<EtcdStore> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(PING_INTERVAL, config.command_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some((name, password)) = &config.user {
            // etcd's auth tokens expire (5 min idle by default, or a member restart): fetch a
            // new one instead of failing every request from then on.
            options = options
                .with_user(name.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        #[cfg(feature = "tls")]
        if config.tls {
            options = options.with_tls(config.tls_options());
        }
        let endpoints = config.endpoint_urls();
        // With a user, connecting sends the first request (authenticate): a member that
        // requires a client certificate closes the connection then; see `ClosedConnections`.
        let connect = async {
            let mut closed = ClosedConnections::default();
            loop {
                match Client::connect(endpoints.clone(), Some(options.clone())).await {
                    Ok(client) => return Ok(client),
                    Err(error) if config.lacks_client_cert() && config.user.is_some() => {
                        if closed.count(&error) {
                            return Err(client_certificate_required("connect", error));
                        }
                        if !error::closed_at_first_request(&error) {
                            return Err(client_error("connect", error));
                        }
                        sleep(Duration::from_millis(20)).await;
                    }
                    Err(error) => return Err(client_error("connect", error)),
                }
            }
        };
        let client = match timeout(config.connect_timeout, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                return Err(Error::Unavailable {
                    message: format!(
                        "connecting to {} took longer than {:?}",
                        config.endpoints.join(","),
                        config.connect_timeout
                    ),
                    source: None,
                })
            }
        };
        let renewer = Renewer::start(client.clone(), config.command_timeout);
        Ok(EtcdStore {
            shared: Arc::new(HandleState {
                client,
                config,
                renewer,
                watcher: Watcher::default(),
                idle: Mutex::default(),
                auth_refreshes: AtomicU64::new(0),
                auth_refresh: tokio::sync::Mutex::new(()),
                revision_seen: Mutex::default(),
            }),
        })
    }

    /// The configuration this handle was built from.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    // ---- requests, each bounded by the command timeout ----------------------------------

    /// Sends a request made by `request`, bounded by the command timeout. A request that
    /// failed before it reached any member (a member is down and the connection to it was
    /// refused) is sent again, to another member if the balancer picks one; with
    /// [`Resend::Transient`], so is one that failed in any retryable way (no leader, a broken
    /// connection), which only requests that are safe to apply twice may ask for. A request
    /// etcd refused for an auth token older than its auth store (users or roles changed) was
    /// not applied: it is sent again with a fresh token, whatever it does.
    async fn call<T, F, Fut>(&self, what: &'static str, resend: Resend, mut request: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let limit = self.shared.config.command_timeout;
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(5);
        let mut closed = ClosedConnections::default();
        loop {
            let token = self.shared.auth_refreshes.load(Ordering::SeqCst);
            let error = match timeout_at(deadline, request()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(error)) => error,
                Err(_) => {
                    return Err(Error::Unavailable {
                        message: format!("{what}: no answer from etcd within {limit:?}"),
                        source: None,
                    })
                }
            };
            if matches!(resend, Resend::Probe)
                && self.shared.config.lacks_client_cert()
                && closed.count(&error)
            {
                return Err(client_certificate_required(what, error));
            }
            let again = match resend {
                _ if is_old_auth_revision(&error) && self.shared.config.user.is_some() => {
                    match timeout_at(deadline, self.refresh_auth_token(token)).await {
                        Ok(Ok(())) => true,
                        Ok(Err(refresh)) => {
                            return Err(client_error("refresh the auth token", refresh))
                        }
                        Err(_) => false,
                    }
                }
                Resend::Transient | Resend::Probe => is_retryable(&error),
                Resend::IfUnsent => never_sent(&error),
            };
            if !again || Instant::now() + pause >= deadline {
                return Err(client_error(what, error));
            }
            tracing::debug!(%error, what, "sending again");
            sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Fetches a fresh auth token, unless another request did since `seen` (the count of
    /// refreshes when the refused request was sent).
    async fn refresh_auth_token(&self, seen: u64) -> std::result::Result<(), etcd_client::Error> {
        let _one_at_a_time = self.shared.auth_refresh.lock().await;
        if self.shared.auth_refreshes.load(Ordering::SeqCst) != seen {
            return Ok(());
        }
        tracing::debug!("etcd's auth store changed; fetching a fresh token");
        self.shared.client.refresh_token().await?;
        self.shared.auth_refreshes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn txn(&self, what: &'static str, resend: Resend, txn: Txn) -> Result<TxnResponse> {
        let client = &self.shared.client;
        let sent_at = Instant::now();
        let answer = self
            .call(what, resend, || {
                let (mut kv, txn) = (client.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        self.saw_revision(answer.header(), sent_at);
        Ok(answer)
    }

    /// Notes the store revision of an answer to a request sent at `sent_at`, for the next raise
    /// of the token offset. Only linearizable answers: every transaction and read that calls
    /// this is one, and so is a lease grant (a Raft write); the waiter's serializable read
    /// (`still_there`) does not call it.
    fn saw_revision(&self, header: Option<&etcd_client::ResponseHeader>, sent_at: Instant) {
        let Some(revision) = header.map(|header| header.revision()) else {
            return;
        };
        self.shared
            .revision_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .note(revision, sent_at);
    }

    /// A store revision no later than the next write's, and at least the store's revision at
    /// most [`offset::HINT_AGE`] before now (or, read now, before the read was sent): the last
    /// one an answer showed, if fresh enough, otherwise a linearizable read's (a serializable
    /// one may come from a member lagging by any amount, and a raise from an old revision puts
    /// tokens ahead of the clock by every revision written since).
    async fn revision_hint(&self) -> Result<i64> {
        let seen = self
            .shared
            .revision_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fresh(Instant::now());
        if let Some(revision) = seen {
            return Ok(revision);
        }
        let key = offset::key(self.shared.config.prefix());
        let client = &self.shared.client;
        let sent_at = Instant::now();
        let answer = self
            .call("read the store revision", Resend::Transient, || {
                let (mut kv, key) = (client.kv_client(), key.clone());
                let options = GetOptions::new().with_count_only();
                async move { kv.get(key, Some(options)).await }
            })
            .await?;
        self.saw_revision(answer.header(), sent_at);
        answer
            .header()
            .map(|header| header.revision())
            .ok_or_else(|| Error::Store {
                message: "etcd answered a read without a header".into(),
                source: None,
            })
    }

    /// The token offset as of the end of store revision `created`, from `current`, the offset
    /// key as read later (absent: none was ever set, 0). Unless the offset changed since
    /// `created`, `current` is it; otherwise it is read as of `created`, which fails if etcd
    /// compacted that revision away.
    async fn offset_at(&self, current: Option<&KeyValue>, created: i64) -> Result<u64> {
        let key = offset::key(self.shared.config.prefix());
        let Some(current) = current else {
            return Ok(0);
        };
        if current.mod_revision() <= created {
            return offset::parse(&key, current.value());
        }
        let then = self
            .kv_get(
                "read the token offset",
                key.clone(),
                txn::offset_at(created),
            )
            .await?;
        then.first()
            .map_or(Ok(0), |kv| offset::parse(&key, kv.value()))
    }

    async fn kv_get(
        &self,
        what: &'static str,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Result<Vec<KeyValue>> {
        let key = key.into();
        let client = &self.shared.client;
        let sent_at = Instant::now();
        let mut answer = self
            .call(what, Resend::Transient, || {
                let (mut kv, key, options) = (client.kv_client(), key.clone(), options.clone());
                async move { kv.get(key, Some(options)).await }
            })
            .await?;
        self.saw_revision(answer.header(), sent_at);
        Ok(answer.take_kvs())
    }

    /// Creates `watches` (key and options each, at least one) on the handle's watch stream,
    /// opening it with the first if none is open (see [`crate::watcher`]). Their creation
    /// replies are their first messages. `quiet_after`: they send (almost) nothing once the
    /// wait ends, so their cancellation may go out with the next wait's creations.
    async fn watch(
        &self,
        what: &'static str,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        quiet_after: bool,
    ) -> Result<Watching> {
        // Waiting for another wait that is opening the stream counts against the command
        // timeout too, so waits queued behind a failing open fail one timeout later, not one
        // per wait ahead of them.
        let limit = self.shared.config.command_timeout;
        let opening = match timeout(limit, self.shared.watcher.watch(watches, quiet_after)).await {
            Ok(Ok(watching)) => return Ok(watching),
            Ok(Err(opening)) => opening,
            Err(_) => {
                return Err(Error::Unavailable {
                    message: format!("{what}: etcd opened no watch stream within {limit:?}"),
                    source: None,
                })
            }
        };
        let Some((key, options)) = opening.first().cloned() else {
            return Err(Error::Store {
                message: format!("{what}: no key to watch"),
                source: None,
            });
        };
        let client = &self.shared.client;
        let stream = self
            .call(what, Resend::Transient, || {
                let (mut watches, key, options) =
                    (client.watch_client(), key.clone(), options.clone());
                async move { watches.watch(key, Some(options)).await }
            })
            .await?;
        Ok(opening.adopt(stream))
    }

    async fn revoke(&self, what: &'static str, lease_id: i64) -> Result<()> {
        let client = &self.shared.client;
        self.call(what, Resend::Transient, || {
            let mut leases = client.lease_client();
            async move { leases.revoke(lease_id).await }
        })
        .await
        .map(drop)
    }

    async fn queue_head(&self, dir: &str) -> Result<Option<KeyValue>> {
        Ok(self
            .kv_get("read the queue's head", dir.to_owned(), txn::queue_head())
            .await?
            .into_iter()
            .next())
    }

    /// Grants an etcd lease of `ttl` rounded up to whole seconds; returns its id and the TTL
    /// etcd granted (etcd may raise it to its own minimum).
    async fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let seconds = whole_secs(ttl);
        let requested = i64::try_from(seconds)
            .map_err(|_| Error::invalid("ttl", format!("{ttl:?} is too long for etcd")))?;
        let client = &self.shared.client;
        // Granting twice leaves an unused lease that expires on its own.
        let sent_at = Instant::now();
        let granted = self
            .call("grant a lease", Resend::Transient, || {
                let mut leases = client.lease_client();
                async move { leases.grant(requested, None).await }
            })
            .await?;
        self.saw_revision(granted.header(), sent_at);
        if !granted.error().is_empty() {
            return Err(Error::Store {
                message: format!("etcd refused a lease: {}", granted.error()),
                source: None,
            });
        }
        let seconds = u64::try_from(granted.ttl().max(requested)).unwrap_or(seconds);
        Ok((granted.id(), Duration::from_secs(seconds)))
    }

    async fn enqueue(&self, dir: &str, entry: &str, lease_id: i64, mode: Mode) -> Result<Enqueued> {
        let prefix = self.shared.config.prefix();
        let (value, raise, hint) = match self.shared.config.layout {
            // As etcd's own clients put it: no offset, the empty value.
            Layout::Etcd => (String::new(), None, 0),
            Layout::Fencelock => {
                let hint = self.revision_hint().await?;
                let raise = offset::raise(prefix, offset::clock_micros(), hint)?;
                (EntryMode::waiting(mode).value(), Some(raise), hint)
            }
        };
        let txn = txn::enqueue(dir, entry, lease_id, value, raise.as_ref());
        // Safe to send twice: a second put keeps the entry's create revision, read back here
        // (and the offset is taken as of that revision); a second raise only raises.
        let answer = self.txn("enqueue", Resend::Transient, txn).await?;
        let reads = txn::gets(&answer);
        let create_revision = |i: usize| {
            reads
                .get(i)
                .and_then(|kvs| kvs.first())
                .map(KeyValue::create_revision)
        };
        let revision = create_revision(0).ok_or_else(|| Error::Store {
            message: "etcd did not return the entry it had just put".into(),
            source: None,
        })?;
        // The two newest entries: ours and our predecessor, unless a resent put kept an older
        // create revision and newer entries joined meanwhile.
        let predecessor = reads.get(2).and_then(|newest| {
            let mut newest = newest.iter();
            let ours = newest.next()?;
            (ours.create_revision() == revision && ours.key() == entry.as_bytes())
                .then(|| newest.next().map(|kv| kv.key().to_vec()))
        });
        // An exclusive entry behind the head is waiting: an exclusive lock is only ever held
        // by the head. (A reader's or a permit's entry behind the head may hold the key; in
        // the etcd layout, so may an entry of a nested name, `a/b/…` in `a/`'s directory, as
        // etcd's own recipe lays them out.)
        let head = reads.get(1).and_then(|kvs| kvs.first()).map(KeyValue::key);
        let layout = self.shared.config.layout;
        let own_entry = |predecessor: &[u8]| {
            predecessor
                .get(dir.len()..)
                .is_some_and(|name| !name.contains(&b'/'))
        };
        let predecessor_waits = matches!(
            (&predecessor, head),
            (Some(Some(predecessor)), Some(head))
                if predecessor.as_slice() != head
                    && match layout {
                        Layout::Etcd => own_entry(predecessor),
                        Layout::Fencelock => handoff::is_exclusive_entry(dir, predecessor),
                    }
        );
        // A key on no lease ahead of ours (the head, or our predecessor) would never leave.
        let ahead = reads.get(1).into_iter().chain(reads.get(2)).flatten();
        if let Some(foreign) = ahead
            .into_iter()
            .find(|kv| offset::is_foreign(kv.lease()) && kv.create_revision() < revision)
        {
            return Err(offset::foreign_found(prefix, dir, foreign.key()));
        }
        let offset = match raise {
            None => 0,
            Some(_) => {
                // The head and our predecessor, with their values: an entry of a client that
                // mints raw revisions there would get smaller tokens after ours.
                let others = reads.get(1).into_iter().chain(reads.get(2)).flatten();
                if let Some(raw) = others.into_iter().find(|kv| {
                    kv.key() != entry.as_bytes() && offset::put_by_raw_minter(kv.value())
                }) {
                    return Err(offset::raw_minter_found(prefix, raw.key()));
                }
                let current = reads.get(3).and_then(|kvs| kvs.first());
                if current.is_some_and(|kv| {
                    Some(kv.mod_revision()) == answer.header().map(|h| h.revision())
                }) {
                    // This transaction raised it: its tokens lead the clock read before it by
                    // up to R − h µs, what an operator checks the swap delay D against.
                    tracing::debug!(
                        prefix,
                        revision,
                        hint,
                        lead_micros = revision - hint,
                        "raised the token offset"
                    );
                }
                self.offset_at(current, revision).await?
            }
        };
        Ok(Enqueued {
            revision,
            offset,
            answered_at: answered_at(&answer)?,
            first: create_revision(1) == Some(revision),
            predecessor,
            predecessor_waits,
        })
    }

    /// One attempt in `mode`: grant, enqueue, and either hold the lock or wait until
    /// `deadline` (none: give up at once; a shared or permit request still waits, at most the
    /// command timeout, for older compatible requests to settle their grants).
    async fn attempt(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Option<Instant>,
        mode: Mode,
    ) -> Result<Lease> {
        let started = Instant::now();
        let layout = self.shared.config.layout;
        let dir = self.dir(key);
        let mut use_idle = true;
        // Queueing again (our lease ended while we waited) stops here: the wait's bound, or for
        // a request without a wait, one command timeout after it started.
        let requeue_by = deadline.unwrap_or(started + self.shared.config.command_timeout);
        let gave_up = || match deadline {
            Some(_) => Error::WaitTimedOut {
                key: key.to_owned(),
                waited: started.elapsed(),
            },
            None => Error::Busy {
                key: key.to_owned(),
            },
        };
        loop {
            let owner = OwnerId::random();
            let sent_at = Instant::now();
            // When the request that last renewed the etcd lease was sent: `sent_at`, or earlier
            // for a fresh idle lease.
            let mut confirmed_at = sent_at;
            let idle = if use_idle { self.take_idle(ttl) } else { None };
            let entry_of = |lease_id| match mode {
                Mode::Exclusive => keys::entry(layout, &dir, owner, lease_id),
                mode => keys::mode_entry(&dir, owner, mode),
            };
            let (lease_id, granted, entry, enqueued, revoke) = match idle {
                Some(idle) => {
                    let revoke = RevokeOnDrop::new(self, idle.lease_id);
                    let entry = entry_of(idle.lease_id);
                    // The renewal restarts the idle lease's TTL after `sent_at`, in parallel
                    // with the enqueue; only a lease etcd still knows is used. A lease confirmed
                    // moments ago is measured from that confirmation instead.
                    let fresh = sent_at < idle.confirmed_at + idle.ttl / FRESH_IDLE;
                    let renew = async {
                        if fresh {
                            Ok(true)
                        } else {
                            self.shared.renewer.renew(idle.lease_id).await
                        }
                    };
                    let (renewed, enqueued) =
                        tokio::join!(renew, self.enqueue(&dir, &entry, idle.lease_id, mode));
                    if fresh {
                        confirmed_at = idle.confirmed_at;
                    }
                    match (renewed, enqueued) {
                        (Ok(true), Ok(enqueued)) => {
                            (idle.lease_id, idle.ttl, entry, enqueued, revoke)
                        }
                        // It ended while idle: its entry (if put) went with it. Grant afresh.
                        (Ok(false), _) => {
                            use_idle = false;
                            continue;
                        }
                        (Ok(true), Err(error)) if error::is_lease_not_found(&error) => {
                            use_idle = false;
                            continue;
                        }
                        (Err(error), _) | (_, Err(error)) => return Err(error),
                    }
                }
                None => {
                    let (lease_id, granted) = self.grant(ttl).await?;
                    let revoke = RevokeOnDrop::new(self, lease_id);
                    let entry = entry_of(lease_id);
                    let enqueued = self.enqueue(&dir, &entry, lease_id, mode).await?;
                    (lease_id, granted, entry, enqueued, revoke)
                }
            };
            let (confirmed_at, answered_at, slot, successors) = if mode != Mode::Exclusive {
                let wait = Waiter {
                    store: self,
                    dir: &dir,
                    entry: &entry,
                    lease_id,
                    revision: enqueued.revision,
                    ttl: granted,
                    confirmed_at,
                    deadline: requeue_by,
                };
                match wait.run_mode(mode, deadline.is_none()).await? {
                    Waited::Holder {
                        confirmed_at,
                        answered_at,
                        slot,
                        successors: _,
                    } => (confirmed_at, answered_at, slot, Vec::new()),
                    Waited::Busy | Waited::TimedOut if deadline.is_none() => {
                        revoke.now().await;
                        return Err(Error::Busy {
                            key: key.to_owned(),
                        });
                    }
                    Waited::Busy | Waited::TimedOut => {
                        drop(revoke);
                        return Err(Error::WaitTimedOut {
                            key: key.to_owned(),
                            waited: started.elapsed(),
                        });
                    }
                    Waited::Mismatch { held } => {
                        revoke.now().await;
                        let Mode::Permit { limit } = mode else {
                            return Err(Error::Store {
                                message: "a limit mismatch for a request without a limit".into(),
                                source: None,
                            });
                        };
                        return Err(Error::LimitMismatch {
                            key: key.to_owned(),
                            held,
                            requested: limit,
                        });
                    }
                    Waited::LeaseEnded => {
                        drop(revoke);
                        if Instant::now() >= requeue_by {
                            return Err(gave_up());
                        }
                        continue;
                    }
                }
            } else if enqueued.first {
                (confirmed_at, enqueued.answered_at, None, Vec::new())
            } else {
                let Some(deadline) = deadline else {
                    revoke.now().await;
                    return Err(Error::Busy {
                        key: key.to_owned(),
                    });
                };
                let wait = Waiter {
                    store: self,
                    dir: &dir,
                    entry: &entry,
                    lease_id,
                    revision: enqueued.revision,
                    ttl: granted,
                    confirmed_at,
                    deadline,
                };
                // The enqueue's snapshot already names our predecessor (our entry, just put on
                // our lease, was in it).
                let seen = enqueued.predecessor.clone().map(|predecessor| Found {
                    predecessor,
                    predecessor_waits: enqueued.predecessor_waits,
                    ours: true,
                    answered_at: enqueued.answered_at,
                    successors: Vec::new(),
                });
                match wait.run(seen).await? {
                    Waited::Holder {
                        confirmed_at,
                        answered_at,
                        slot: _,
                        successors,
                    } => (confirmed_at, answered_at, None, successors),
                    Waited::TimedOut | Waited::Busy | Waited::Mismatch { .. } => {
                        drop(revoke);
                        return Err(Error::WaitTimedOut {
                            key: key.to_owned(),
                            waited: started.elapsed(),
                        });
                    }
                    // Our lease ended while we waited: queue again, at the back, within the
                    // wait's bound.
                    Waited::LeaseEnded => {
                        drop(revoke);
                        if Instant::now() >= requeue_by {
                            return Err(gave_up());
                        }
                        continue;
                    }
                }
            };
            let token = match layout {
                Layout::Fencelock => offset::token(enqueued.offset, enqueued.revision)?,
                Layout::Etcd => u64::try_from(answered_at).map_err(|_| Error::Store {
                    message: format!("etcd gave a negative revision {answered_at}"),
                    source: None,
                })?,
            };
            revoke.disarm();
            tracing::debug!(key, token, lease_id, %mode, slot, "acquired");
            let lease = Lease::with_store_state(
                key,
                owner,
                token,
                granted,
                confirmed_at,
                Held {
                    entry,
                    lease_id,
                    created: enqueued.revision,
                    layout,
                    requested_secs: whole_secs(ttl),
                    // Only entries of this layout are ever handed the lock (etcd's own clients
                    // know nothing of a mark).
                    handoff: (layout == Layout::Fencelock
                        && mode == Mode::Exclusive
                        && !successors.is_empty())
                    .then(|| Handoff {
                        dir: dir.clone(),
                        next: successors,
                    }),
                    state: AtomicU8::new(HELD),
                },
            );
            return Ok(if mode == Mode::Exclusive {
                lease
            } else {
                lease.in_mode(mode, slot)
            });
        }
    }

    /// An idle lease for `ttl` that is likely still alive (a quarter of its TTL left on the
    /// local clock); older ones are dropped, to expire on their own.
    fn take_idle(&self, ttl: Duration) -> Option<IdleLease> {
        let now = Instant::now();
        let mut idle = self
            .shared
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let leases = idle.get_mut(&whole_secs(ttl))?;
        while let Some(lease) = leases.pop() {
            if lease.valid_until > now + lease.ttl / 4 {
                return Some(lease);
            }
        }
        None
    }

    /// Keeps a released lock's etcd lease for reuse by acquires asking for `requested_secs`,
    /// or revokes it.
    fn recycle(&self, lease: &Lease, lease_id: i64, requested_secs: u64) {
        let now = Instant::now();
        let fresh = lease.valid_until() > now + lease.ttl() / 2;
        if fresh {
            let mut idle = self
                .shared
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let leases = idle.entry(requested_secs).or_default();
            if leases.len() < MAX_IDLE_PER_TTL {
                leases.push(IdleLease {
                    lease_id,
                    ttl: lease.ttl(),
                    valid_until: lease.valid_until(),
                    // The inverse of the lease's deadline, `confirmed + ttl - drift(ttl)`.
                    confirmed_at: lease.valid_until()
                        - lease.ttl().saturating_sub(drift(lease.ttl())),
                });
                return;
            }
        }
        spawn_revoke(self, lease_id);
    }

    /// The queue directory of `key` in this handle's layout.
    fn dir(&self, key: &str) -> String {
        let config = &self.shared.config;
        keys::dir(config.layout, config.prefix(), key)
    }

    /// Makes etcd's "permission denied" during `operation` on `touched` (a queue directory or
    /// an entry in it) name the `right` the user needs: on this handle's prefix, or with the
    /// empty prefix of `layout=etcd`, on the lock's own directory.
    fn refused<'a>(
        &'a self,
        operation: &'static str,
        touched: &'a str,
        right: Right,
    ) -> impl FnOnce(Error) -> Error + 'a {
        move |error| {
            let prefix = self.shared.config.prefix();
            let grant_on = if !prefix.is_empty() && touched.starts_with(prefix) {
                prefix
            } else {
                touched.rfind('/').map_or(touched, |end| &touched[..=end])
            };
            name_the_right(error, operation, touched, right, grant_on)
        }
    }
}

/// Why a lease without an entry of this store is lost to it.
const FOREIGN_LEASE: &str =
    "it was not granted by an etcd store (it names no entry), so it holds nothing here";

/// Revokes an etcd lease from a spawned task when dropped armed: a dropped or failed acquire
/// leaves no queue entry behind to block others until its TTL.
struct RevokeOnDrop<'s> {
    store: &'s EtcdStore,
    lease_id: i64,
    armed: bool,
}

impl<'s> RevokeOnDrop<'s> {
    fn new(store: &'s EtcdStore, lease_id: i64) -> Self {
        RevokeOnDrop {
            store,
            lease_id,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }

    /// Revokes in place (a `try_acquire` that found the key busy). Stays armed until the
    /// revoke succeeded, so a drop or a failure still revokes from a spawned task.
    async fn now(mut self) {
        match self
            .store
            .revoke("revoke a queued lease", self.lease_id)
            .await
        {
            Ok(_) => self.armed = false,
            Err(error) => tracing::debug!(%error, "revoke failed; trying again in the background"),
        }
    }
}

impl Drop for RevokeOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            spawn_revoke(self.store, self.lease_id);
        }
    }
}

/// Revokes `lease_id` in the background, bounded by the command timeout. Outside a runtime (or
/// if the revoke fails) the lease expires at its TTL instead.
fn spawn_revoke(store: &EtcdStore, lease_id: i64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let store = store.clone();
    runtime.spawn(async move {
        if let Err(error) = store.revoke("revoke a lease", lease_id).await {
            tracing::debug!(%error, lease_id, "background revoke failed; the lease expires at its TTL");
        }
    });
}

/// What one renewal of a waiter's lease told.
enum Renewed {
    Confirmed,
    Unconfirmed,
    Ended,
}

enum Waited {
    /// The read at store revision `answered_at` found no predecessor and our entry alive (or,
    /// for a shared or permit request, the transaction that marked it granted, with the
    /// permit's slot).
    Holder {
        confirmed_at: Instant,
        answered_at: i64,
        slot: Option<u32>,
        /// An exclusive holder's successors, for its release to hand the lock to.
        successors: Vec<Successor>,
    },
    TimedOut,
    LeaseEnded,
    /// A request without a wait found the key held in a mode that excludes it.
    Busy,
    /// The key's permits are held with another limit.
    Mismatch {
        held: u32,
    },
}

/// A queued entry waiting for every older entry to go, keeping its own lease alive meanwhile.
struct Waiter<'a> {
    store: &'a EtcdStore,
    dir: &'a str,
    entry: &'a str,
    lease_id: i64,
    revision: i64,
    ttl: Duration,
    /// When the last renewal (or the grant) that etcd confirmed was sent.
    confirmed_at: Instant,
    deadline: Instant,
}

impl Waiter<'_> {
    /// Waits for every older entry to go. `seen`: a read of the queue already made (by the
    /// enqueue), used instead of a first one.
    async fn run(mut self, seen: Option<Found>) -> Result<Waited> {
        let period = (self.ttl / 3).max(Duration::from_millis(100));
        // A read made already (by the enqueue, or while watching, raced against a handoff),
        // used instead of a new one.
        let mut read_meanwhile: Option<Found> = seen;
        loop {
            // Renew alongside the check, so the lease handed out is measured from now; unless
            // the last confirmed renewal is recent (the grant, or a renewal moments ago), which
            // then measures it, a little earlier.
            let sent_at = Instant::now();
            let recent = sent_at < self.confirmed_at + period / 2;
            let renew = async {
                if recent {
                    Ok(true)
                } else {
                    self.store.shared.renewer.renew(self.lease_id).await
                }
            };
            let pending = read_meanwhile.take();
            let read = async {
                match pending {
                    Some(found) => Ok(found),
                    None => self.predecessor().await,
                }
            };
            let (renewed, found) = tokio::join!(renew, read);
            let sent_at = if recent { self.confirmed_at } else { sent_at };
            let found = found?;
            match self.renewed(renewed, sent_at)? {
                Renewed::Ended => return Ok(Waited::LeaseEnded),
                _ if !found.ours => {
                    tracing::debug!(entry = self.entry, "queued entry vanished while waiting");
                    return Ok(Waited::LeaseEnded);
                }
                Renewed::Confirmed | Renewed::Unconfirmed => {}
            }
            let Some(predecessor) = found.predecessor else {
                // Measured from the last confirmed renewal: this one, or an earlier one if this
                // one got no answer.
                return Ok(Waited::Holder {
                    confirmed_at: self.confirmed_at,
                    answered_at: found.answered_at,
                    slot: None,
                    successors: found.successors,
                });
            };
            if Instant::now() >= self.deadline {
                return Ok(Waited::TimedOut);
            }
            match self
                .watch_deletion(
                    predecessor,
                    found.answered_at,
                    found.predecessor_waits,
                    period,
                )
                .await?
            {
                Woken::Look => {}
                Woken::Read(found) => read_meanwhile = Some(found),
                Woken::Done(outcome) => return Ok(outcome),
                Woken::HandedOff {
                    answered_at,
                    successors,
                } => {
                    // The mark proves our entry the oldest, alive on our lease, at
                    // `answered_at`. Renew first only if the last confirmed renewal is old, so
                    // the lease handed out is measured as after a read.
                    if Instant::now() >= self.confirmed_at + period / 2 {
                        let sent_at = Instant::now();
                        let renewed = self.store.shared.renewer.renew(self.lease_id).await;
                        if let Renewed::Ended = self.renewed(renewed, sent_at)? {
                            return Ok(Waited::LeaseEnded);
                        }
                    }
                    return Ok(Waited::Holder {
                        confirmed_at: self.confirmed_at,
                        answered_at,
                        slot: None,
                        successors,
                    });
                }
            }
        }
    }

    /// Settles one renewal sent at `sent_at`. A renewal that got no answer is tolerated while
    /// the last confirmed one still covers the lease (the cluster may be electing a leader);
    /// past that, the lease may have expired: the waiter queues again.
    fn renewed(&mut self, renewed: Result<bool>, sent_at: Instant) -> Result<Renewed> {
        match renewed {
            Ok(true) => {
                self.confirmed_at = sent_at;
                Ok(Renewed::Confirmed)
            }
            Ok(false) => {
                tracing::debug!(entry = self.entry, "queued lease ended while waiting");
                Ok(Renewed::Ended)
            }
            Err(error) if error.is_retryable() => {
                let covered_until = self.confirmed_at + self.ttl.saturating_sub(drift(self.ttl));
                if Instant::now() < covered_until {
                    tracing::debug!(%error, "renewal unconfirmed; trying again");
                    Ok(Renewed::Unconfirmed)
                } else {
                    Ok(Renewed::Ended)
                }
            }
            Err(error) => Err(error),
        }
    }

    /// `step`'s outcome, or `None` if the wait's deadline came first (`step` is dropped).
    async fn by_deadline<T>(&self, step: impl Future<Output = Result<T>>) -> Result<Option<T>> {
        match timeout_at(self.deadline, step).await {
            Ok(outcome) => outcome.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Creates `watches` on the handle's stream (see [`EtcdStore::watch`]) and waits for etcd
    /// to confirm each, within the command timeout and the wait's deadline.
    async fn create_watches(
        &self,
        what: &'static str,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        quiet_after: bool,
    ) -> Result<Created> {
        let count = watches.len();
        let limit = self.store.shared.config.command_timeout;
        let Some(mut stream) = self
            .by_deadline(self.store.watch(what, watches, quiet_after))
            .await?
        else {
            return Ok(Created::TimedOut);
        };
        // Each watch delivers every event after the revision its creation reply names.
        let (mut created, mut covered_after) = (0, 0);
        let confirm_by = (Instant::now() + limit).min(self.deadline);
        while created < count {
            match timeout_at(confirm_by, stream.message()).await {
                Ok(Some(message)) if message.created() && !message.canceled() => {
                    created += 1;
                    let from = message.header().map_or(i64::MAX, |h| h.revision());
                    covered_after = covered_after.max(from);
                }
                // An event before every watch exists, a refused watch or a broken stream.
                Ok(_) => return Ok(Created::Look),
                Err(_) if confirm_by == self.deadline => return Ok(Created::TimedOut),
                Err(_) => return Err(unconfirmed_watch(&stream, limit)),
            }
        }
        Ok(Created::Watching {
            stream,
            covered_after,
        })
    }

    /// Whether releases may hand the lock to this waiter (see [`crate::handoff`]).
    fn takes_handoffs(&self) -> bool {
        self.store.shared.config.layout == Layout::Fencelock
    }

    async fn predecessor(&self) -> Result<Found> {
        read_predecessor(
            self.store,
            self.dir,
            self.entry,
            self.revision,
            self.lease_id,
            self.takes_handoffs(),
        )
        .await
    }

    /// Waits until `predecessor` is deleted, or (in [`Layout::Fencelock`]) a release hands
    /// us the lock, renewing our lease every `period`.
    ///
    /// Two watches on the handle's stream (see [`crate::watcher`]): the predecessor's
    /// deletions, and our own entry's puts (a handoff mark). Neither sends anything once the
    /// wait is over (the predecessor is gone, or a later deletion of it is one stray message;
    /// our entry is put only by a mark), so their cancellation goes out with the next wait's
    /// creations. Our own entry's deletion is not watched: it is the end of our lease (which
    /// the renewal every `period` finds) or an operator's delete (which the read after the
    /// predecessor's deletion finds, as a release hands off only to an entry still there).
    /// Both start from the current revision, not from the revision the
    /// queue was read at: etcd serves a watch from a past revision as "unsynced", catching it
    /// up only every 100 ms, which would delay the wake-up. The gap between the read and the
    /// watches is closed by reading the predecessor again once they exist (a handoff in that
    /// gap deleted the predecessor too, so the read after it finds us first). When the
    /// predecessor was certainly waiting at the read (`predecessor_waits`), that read is put off
    /// by [`GAP_CHECK_DELAY`], and skipped if the wait ends first: such a predecessor leaves
    /// within the gap only if it gives up, its lease ends, or it is granted and released
    /// within one round trip, and a deletion missed then only delays us, by at most that.
    ///
    /// When the predecessor's deletion arrives, the queue is read again at once; a handoff mark
    /// of the same transaction (its event goes out on the other watch, in either order) that
    /// arrives before that read's answer ends the wait without it.
    async fn watch_deletion(
        &mut self,
        predecessor: Vec<u8>,
        read_at: i64,
        predecessor_waits: bool,
        period: Duration,
    ) -> Result<Woken> {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut watches = vec![(predecessor.clone(), options)];
        if self.takes_handoffs() {
            let options = WatchOptions::new().with_filters([WatchFilterType::NoDelete]);
            watches.push((self.entry.as_bytes().to_vec(), options));
        }
        let (mut stream, covered_after) = match self
            .create_watches("watch the predecessor", watches, true)
            .await?
        {
            Created::Watching {
                stream,
                covered_after,
            } => (stream, covered_after),
            Created::Look => return Ok(Woken::Look),
            Created::TimedOut => return Ok(Woken::Done(Waited::TimedOut)),
        };
        // Nothing written between the read and the watches: they miss nothing since the read.
        let mut gap_check = None;
        if covered_after > read_at {
            if predecessor_waits {
                gap_check = Some(Instant::now() + GAP_CHECK_DELAY);
            } else if let Some(woken) = self.check_gap(&predecessor, covered_after).await? {
                return Ok(woken);
            }
        }
        let mut next_renewal = self.confirmed_at + period;
        // The read sent on the predecessor's deletion, while a handoff may still arrive.
        let mut reading: Option<std::pin::Pin<Box<dyn Future<Output = Result<Found>> + Send>>> =
            None;
        loop {
            tokio::select! {
                message = stream.message() => {
                    // Ended or broken: re-list, which also tells whether etcd answers.
                    let Some(message) = message else {
                        return Ok(Woken::Look);
                    };
                    if message.canceled() || message.compact_revision() > 0 {
                        tracing::debug!(
                            compact_revision = message.compact_revision(),
                            reason = message.cancel_reason(),
                            "watch cancelled; re-listing the queue"
                        );
                        return Ok(Woken::Look);
                    }
                    if let Some(woken) = self.own_event(&message) {
                        return Ok(woken);
                    }
                    let deleted = message.events().iter().any(|event| {
                        event.event_type() == EventType::Delete
                            && event.kv().is_some_and(|kv| kv.key() == predecessor.as_slice())
                    });
                    if deleted && reading.is_none() {
                        // A handoff's mark, of the same transaction, goes out on the other
                        // watch right behind this event: if it is here already (or once the
                        // connection's task has run), no read.
                        for peek in 0..2 {
                            if peek > 0 {
                                tokio::task::yield_now().await;
                            }
                            match stream.ready() {
                                Ok(None) => continue,
                                Ok(Some(next))
                                    if !next.canceled() && next.compact_revision() == 0 =>
                                {
                                    if let Some(woken) = self.own_event(&next) {
                                        return Ok(woken);
                                    }
                                    break;
                                }
                                _ => return Ok(Woken::Look),
                            }
                        }
                        let (store, dir, entry) =
                            (self.store.clone(), self.dir.to_owned(), self.entry.to_owned());
                        let (revision, lease_id) = (self.revision, self.lease_id);
                        let successors = self.takes_handoffs();
                        reading = Some(Box::pin(async move {
                            read_predecessor(&store, &dir, &entry, revision, lease_id, successors)
                                .await
                        }));
                    }
                }
                found = async {
                    match reading.as_mut() {
                        Some(read) => read.await,
                        None => std::future::pending().await,
                    }
                }, if reading.is_some() => return Ok(Woken::Read(found?)),
                () = sleep_until(gap_check.unwrap_or(self.deadline)),
                    if gap_check.is_some() && reading.is_none() =>
                {
                    gap_check = None;
                    if let Some(woken) = self.check_gap(&predecessor, covered_after).await? {
                        return Ok(woken);
                    }
                }
                () = sleep_until(next_renewal), if reading.is_none() => {
                    let sent_at = Instant::now();
                    let renewed = self.store.shared.renewer.renew(self.lease_id).await;
                    next_renewal = match self.renewed(renewed, sent_at)? {
                        Renewed::Ended => return Ok(Woken::Done(Waited::LeaseEnded)),
                        Renewed::Confirmed => sent_at + period,
                        Renewed::Unconfirmed => Instant::now() + period / 4,
                    };
                }
                () = sleep_until(self.deadline) => return Ok(Woken::Done(Waited::TimedOut)),
            }
        }
    }
}

impl Waiter<'_> {
    /// Closes the gap between a read of the queue and watches created at revision `at`:
    /// `None` if `predecessor` was still there then (keep watching), otherwise how the wait
    /// goes on (read again, or its deadline came first).
    async fn check_gap(&self, predecessor: &[u8], at: i64) -> Result<Option<Woken>> {
        Ok(
            match self.by_deadline(self.still_there(predecessor, at)).await? {
                None => Some(Woken::Done(Waited::TimedOut)),
                Some(false) => Some(Woken::Look),
                Some(true) => None,
            },
        )
    }

    /// Whether `predecessor` (older than our entry) still existed at store revision `at` or
    /// later, so no deletion of it up to `at` was missed. A serializable read (no consensus
    /// round) answers when the member it reaches has applied `at`, as the member that
    /// created the watches at `at` has; a lagging member's answer is checked by a
    /// linearizable read instead. An entry of that name created after ours is not our
    /// predecessor: it counts as gone.
    async fn still_there(&self, predecessor: &[u8], at: i64) -> Result<bool> {
        let client = &self.store.shared.client;
        let read = |options: GetOptions| {
            self.store
                .call("read the predecessor again", Resend::Transient, move || {
                    let (mut kv, key, options) =
                        (client.kv_client(), predecessor.to_vec(), options.clone());
                    async move { kv.get(key, Some(options)).await }
                })
        };
        let mut answer = read(GetOptions::new().with_keys_only().with_serializable()).await?;
        if answer.header().map_or(0, |h| h.revision()) < at {
            answer = read(GetOptions::new().with_keys_only()).await?;
        }
        Ok(answer
            .kvs()
            .iter()
            .any(|kv| kv.create_revision() < self.revision))
    }

    /// What an event on our own entry in `message` means: a handoff mark (on our entry, with
    /// its create revision and lease) hands us the lock; a deletion (not watched for now, but
    /// it would mean this) sends us to read the queue (which finds our entry gone). Anything
    /// else: `None`.
    fn own_event(&self, message: &etcd_client::WatchResponse) -> Option<Woken> {
        for event in message.events() {
            let Some(kv) = event.kv().filter(|kv| kv.key() == self.entry.as_bytes()) else {
                continue;
            };
            if event.event_type() == EventType::Delete {
                return Some(Woken::Look);
            }
            if kv.create_revision() != self.revision || kv.lease() != self.lease_id {
                continue;
            }
            if let Some(successors) = handoff::parse_mark(kv.value()) {
                tracing::trace!(entry = self.entry, "handed the lock by a release");
                return Some(Woken::HandedOff {
                    answered_at: kv.mod_revision(),
                    successors,
                });
            }
        }
        None
    }
}

/// What a waiter's read of the queue found: the newest entry older than its own, whether its
/// own is still there, the store revision both were read at, and (when asked) the exclusive
/// entries right behind its own, for a release to hand the lock to.
struct Found {
    predecessor: Option<Vec<u8>>,
    /// Whether the predecessor was certainly waiting at the read (an exclusive entry behind
    /// the head); `false` when not known.
    predecessor_waits: bool,
    ours: bool,
    answered_at: i64,
    successors: Vec<Successor>,
}

/// What creating a wait's watches came to.
enum Created {
    /// Every watch exists; together they deliver every event after revision `covered_after`.
    Watching {
        stream: Watching,
        covered_after: i64,
    },
    /// An event came before every watch existed, a watch was refused, or the stream broke:
    /// read the queue again.
    Look,
    /// The wait's deadline came first.
    TimedOut,
}

/// How a wait for the predecessor ended.
enum Woken {
    /// Read the queue again.
    Look,
    /// The queue was read again already (after the predecessor's deletion).
    Read(Found),
    /// A release handed us the lock at store revision `answered_at`, and these successors.
    HandedOff {
        answered_at: i64,
        successors: Vec<Successor>,
    },
    Done(Waited),
}

/// Reads the waiter's view of the queue (see [`Found`]) in one transaction.
async fn read_predecessor(
    store: &EtcdStore,
    dir: &str,
    entry: &str,
    revision: i64,
    lease_id: i64,
    successors: bool,
) -> Result<Found> {
    let txn = txn::predecessor(dir, entry, revision, successors);
    let answer = store
        .txn("read the predecessor", Resend::Transient, txn)
        .await?;
    let mut reads = txn::gets(&answer).into_iter();
    let predecessor = reads.next().and_then(|kvs| kvs.into_iter().next());
    if let Some(foreign) = predecessor
        .as_ref()
        .filter(|kv| offset::is_foreign(kv.lease()))
    {
        return Err(offset::foreign_found(
            store.shared.config.prefix(),
            dir,
            foreign.key(),
        ));
    }
    let predecessor = predecessor.map(|kv| kv.key().to_vec());
    let ours = reads.next().is_some_and(|kvs| {
        kvs.iter()
            .any(|kv| kv.create_revision() == revision && kv.lease() == lease_id)
    });
    let successors = reads
        .next()
        .map(|newer| handoff::successors(dir, &newer))
        .unwrap_or_default();
    Ok(Found {
        predecessor,
        predecessor_waits: false,
        ours,
        answered_at: answered_at(&answer)?,
        successors,
    })
}

/// What a shared or permit waiter read at one revision: the older entries its decision rests
/// on, whether its own entry is still there, and the revision.
struct ModeView {
    older: Vec<Seen>,
    decision: Decision,
    ours: bool,
}

impl ModeView {
    /// The older entries as read: any change to them (a delete, a mark) changes this.
    fn fingerprint(&self) -> Vec<(&[u8], i64)> {
        self.older
            .iter()
            .map(|seen| (seen.key.as_slice(), seen.modified))
            .collect()
    }
}

/// The most older entries a permit waiter watches at once (one watch each, over one stream);
/// past that it also reads the queue again at every renewal.
const MAX_WATCHED: usize = fencelock_core::MAX_PERMITS as usize;

impl Waiter<'_> {
    /// Waits as a shared or permit request (`mode`), until its entry may be marked granted
    /// (see [`crate::modes`]), then marks it. With `without_wait`, returns [`Waited::Busy`] as
    /// soon as something other than a compatible request still settling its grant is in front.
    async fn run_mode(mut self, mode: Mode, without_wait: bool) -> Result<Waited> {
        let period = (self.ttl / 3).max(Duration::from_millis(100));
        loop {
            // As in `run`: renew alongside the read unless the last confirmed renewal is recent.
            let sent_at = Instant::now();
            let recent = sent_at < self.confirmed_at + period / 2;
            let renew = async {
                if recent {
                    Ok(true)
                } else {
                    self.store.shared.renewer.renew(self.lease_id).await
                }
            };
            let (renewed, view) = tokio::join!(renew, self.mode_view(mode));
            let sent_at = if recent { self.confirmed_at } else { sent_at };
            let view = view?;
            match self.renewed(renewed, sent_at)? {
                Renewed::Ended => return Ok(Waited::LeaseEnded),
                _ if !view.ours => {
                    tracing::debug!(entry = self.entry, "queued entry vanished while waiting");
                    return Ok(Waited::LeaseEnded);
                }
                Renewed::Confirmed | Renewed::Unconfirmed => {}
            }
            match &view.decision {
                Decision::Grant { mark, slot } => {
                    let txn = txn::mark(self.entry, self.revision, mark.value(), self.lease_id);
                    // Safe to send twice: the same value on the same entry.
                    let answer = self
                        .store
                        .txn("record the grant", Resend::Transient, txn)
                        .await?;
                    if !answer.succeeded() {
                        return Ok(Waited::LeaseEnded);
                    }
                    return Ok(Waited::Holder {
                        confirmed_at: self.confirmed_at,
                        answered_at: answered_at(&answer)?,
                        slot: *slot,
                        successors: Vec::new(),
                    });
                }
                Decision::Mismatch { held } => return Ok(Waited::Mismatch { held: *held }),
                Decision::Blocked { pending, .. } if without_wait && !pending => {
                    return Ok(Waited::Busy)
                }
                Decision::Blocked { watch, .. } => {
                    if Instant::now() >= self.deadline {
                        return Ok(Waited::TimedOut);
                    }
                    let truncated = watch.len() > MAX_WATCHED;
                    // The newest older entries: those most likely to change next are the
                    // oldest, but a waiter that truncates re-reads at every renewal anyway.
                    let watched = &watch[watch.len().saturating_sub(MAX_WATCHED)..];
                    match self
                        .watch_changes(mode, watched, &view, truncated, period)
                        .await?
                    {
                        Some(outcome) => return Ok(outcome),
                        None => continue,
                    }
                }
            }
        }
    }

    /// Fails for a key on no lease among the older entries read (see [`offset::is_foreign`]).
    fn refuse_foreign(&self, older: &[KeyValue]) -> Result<()> {
        match older.iter().find(|kv| offset::is_foreign(kv.lease())) {
            Some(foreign) => Err(offset::foreign_found(
                self.store.shared.config.prefix(),
                self.dir,
                foreign.key(),
            )),
            None => Ok(()),
        }
    }

    /// Reads what a `mode` request's grant depends on, at one revision.
    async fn mode_view(&self, mode: Mode) -> Result<ModeView> {
        let seen = |kv: &KeyValue| Seen {
            key: kv.key().to_vec(),
            mode: EntryMode::parse(kv.value()),
            modified: kv.mod_revision(),
        };
        let ours = |kvs: Option<Vec<KeyValue>>| {
            kvs.is_some_and(|kvs| {
                kvs.iter()
                    .any(|kv| kv.create_revision() == self.revision && kv.lease() == self.lease_id)
            })
        };
        match mode {
            Mode::Permit { limit } => {
                let txn = txn::permit_view(self.dir, self.entry, self.revision);
                let answer = self
                    .store
                    .txn("read the permits ahead", Resend::Transient, txn)
                    .await?;
                let mut reads = txn::gets(&answer).into_iter();
                let older = reads.next().unwrap_or_default();
                self.refuse_foreign(&older)?;
                let older: Vec<Seen> = older.iter().map(seen).collect();
                let decision = modes::decide_permit(limit, &older);
                Ok(ModeView {
                    older,
                    decision,
                    ours: ours(reads.next()),
                })
            }
            _ => {
                let txn = txn::reader_view(self.dir, self.entry, self.revision);
                let answer = self
                    .store
                    .txn("read the writers ahead", Resend::Transient, txn)
                    .await?;
                let mut reads = txn::gets(&answer).into_iter();
                let (writers, readers) = (reads.next(), reads.next());
                for kvs in [&writers, &readers].into_iter().flatten() {
                    self.refuse_foreign(kvs)?;
                }
                let first = |kvs: Option<Vec<KeyValue>>| kvs.and_then(|kvs| kvs.first().map(seen));
                let (writer, reader) = (first(writers), first(readers));
                let decision = modes::decide_shared(writer.as_ref(), reader.as_ref());
                Ok(ModeView {
                    older: writer.into_iter().chain(reader).collect(),
                    decision,
                    ours: ours(reads.next()),
                })
            }
        }
    }

    /// Watches `keys` (older entries only, never the newer ones) for any change, renewing our
    /// lease every `period`. `None`: read again (a change, a watch that ended or was
    /// cancelled, or, when `truncated`, a renewal). As in `watch_deletion`, the watches start
    /// at the current revision, and once they exist the view is read again: if it differs
    /// from `seen`, something changed in between.
    async fn watch_changes(
        &mut self,
        mode: Mode,
        keys: &[Vec<u8>],
        seen: &ModeView,
        truncated: bool,
        period: Duration,
    ) -> Result<Option<Waited>> {
        if keys.is_empty() {
            return Ok(None);
        }
        let watches = keys
            .iter()
            .map(|key| (key.clone(), WatchOptions::new()))
            .collect();
        let mut stream = match self
            .create_watches("watch the entries ahead", watches, false)
            .await?
        {
            Created::Watching { stream, .. } => stream,
            Created::Look => return Ok(None),
            Created::TimedOut => return Ok(Some(Waited::TimedOut)),
        };
        let Some(again) = self.by_deadline(self.mode_view(mode)).await? else {
            return Ok(Some(Waited::TimedOut));
        };
        if !again.ours || again.fingerprint() != seen.fingerprint() {
            return Ok(None);
        }
        let mut next_renewal = self.confirmed_at + period;
        loop {
            tokio::select! {
                message = stream.message() => {
                    let Some(message) = message else {
                        return Ok(None);
                    };
                    if message.canceled()
                        || message.compact_revision() > 0
                        || !message.events().is_empty()
                    {
                        return Ok(None);
                    }
                }
                () = sleep_until(next_renewal) => {
                    let sent_at = Instant::now();
                    let renewed = self.store.shared.renewer.renew(self.lease_id).await;
                    next_renewal = match self.renewed(renewed, sent_at)? {
                        Renewed::Ended => return Ok(Some(Waited::LeaseEnded)),
                        Renewed::Confirmed if truncated => return Ok(None),
                        Renewed::Confirmed => sent_at + period,
                        Renewed::Unconfirmed => Instant::now() + period / 4,
                    };
                }
                () = sleep_until(self.deadline) => return Ok(Some(Waited::TimedOut)),
            }
        }
    }
}

/// etcd did not confirm the watches of `stream` within `limit`: the stream is closed for
/// every wait on it (the next wait opens another), and the wait fails as unavailable.
fn unconfirmed_watch(stream: &Watching, limit: Duration) -> Error {
    stream.close_stream();
    Error::Unavailable {
        message: format!("etcd did not confirm a watch within {limit:?}"),
        source: None,
    }
}

/// When [`EtcdStore::call`] may send a request again.
#[derive(Clone, Copy)]
enum Resend {
    /// After any retryable failure: the request is safe to apply twice.
    Transient,
    /// Only if it certainly reached no member.
    IfUnsent,
    /// As `Transient`, for the request that proves a new handle can talk to the cluster: with
    /// TLS and no client certificate, connections closed at their first request several times
    /// in a row end it as a missing client certificate (see `ClosedConnections`).
    Probe,
}

#[async_trait]
impl Acquire for EtcdStore {
    /// # Cancel safety
    /// A dropped attempt revokes its etcd lease from a spawned task, which deletes its queue
    /// entry (and the lock, if it had been granted) at once; if the revoke cannot run, the lease
    /// expires at its TTL. A lease granted but whose reply was never read holds nothing and
    /// expires at its TTL.
    #[tracing::instrument(
        level = "debug",
        name = "try_acquire",
        skip(self),
        fields(store = "etcd")
    )]
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        let dir = self.dir(key);
        let lease = self
            .attempt(key, ttl, None, Mode::Exclusive)
            .await
            .map_err(self.refused("try_acquire", &dir, Right::ReadWrite))?;
        check_granted(self, lease).await
    }

    /// # Cancel safety
    /// As [`Acquire::try_acquire`]: a dropped waiter's entry is deleted by a spawned revoke, so
    /// it stops holding its place in the queue at once, and never takes the lock later.
    #[tracing::instrument(level = "debug", name = "acquire", skip(self), fields(store = "etcd"))]
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_wait(wait)?;
        let started = Instant::now();
        let dir = self.dir(key);
        let attempt = self
            .attempt(key, ttl, Some(started + wait), Mode::Exclusive)
            .await
            .map_err(self.refused("acquire", &dir, Right::ReadWrite));
        match attempt {
            Err(Error::Busy { key }) => Err(Error::WaitTimedOut {
                key,
                waited: started.elapsed(),
            }),
            Ok(lease) => check_granted(self, lease).await,
            other => other,
        }
    }

    /// Shared and permit requests join the key's one queue (see the crate docs, *Semaphores
    /// and reader-writer locks*). Without a wait, a request that only older compatible
    /// requests stand in front of (readers, or permits of its limit, queued but not yet
    /// marked granted) waits for them to settle, at most the command timeout; anything else
    /// in front makes it [`Error::Busy`] at once, its entry revoked.
    ///
    /// # Cancel safety
    /// As [`Acquire::try_acquire`]: a dropped attempt's entry is deleted by a spawned revoke.
    #[tracing::instrument(
        level = "debug",
        name = "try_acquire_as",
        skip(self),
        fields(store = "etcd")
    )]
    async fn try_acquire_as(&self, key: &str, ttl: Duration, mode: Mode) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_mode(mode, &self.capabilities())?;
        let dir = self.dir(key);
        let lease = self
            .attempt(key, ttl, None, mode)
            .await
            .map_err(self.refused("try_acquire_as", &dir, Right::ReadWrite))?;
        check_granted(self, lease).await
    }

    /// # Cancel safety
    /// As [`Acquire::acquire`]: a dropped waiter's entry is deleted by a spawned revoke, so
    /// it stops holding its place (and stops keeping newer readers out) at once, and never
    /// takes the key later.
    #[tracing::instrument(
        level = "debug",
        name = "acquire_as",
        skip(self),
        fields(store = "etcd")
    )]
    async fn acquire_as(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        mode: Mode,
    ) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_mode(mode, &self.capabilities())?;
        check_wait(wait)?;
        let started = Instant::now();
        let dir = self.dir(key);
        let attempt = self
            .attempt(key, ttl, Some(started + wait), mode)
            .await
            .map_err(self.refused("acquire_as", &dir, Right::ReadWrite));
        match attempt {
            Err(Error::Busy { key }) => Err(Error::WaitTimedOut {
                key,
                waited: started.elapsed(),
            }),
            Ok(lease) => check_granted(self, lease).await,
            other => other,
        }
    }
}

#[async_trait]
impl Release for EtcdStore {
    /// # Cancel safety
    /// Dropping the future may leave the entry in place; it then expires with its lease at the
    /// TTL (the lease is kept alive by nobody). Once the delete is answered, the lease is kept
    /// for reuse or revoked without further waiting, so nothing is lost after that point.
    #[tracing::instrument(
        level = "debug",
        name = "release",
        skip_all,
        fields(store = "etcd", key = lease.key(), token = lease.fencing_token())
    )]
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let Some(held) = lease.store_state::<Held>() else {
            // It holds nothing here, whoever made it: no entry of this store is its.
            return Ok(ReleaseOutcome::Lost);
        };
        if held.state.load(Ordering::SeqCst) != HELD {
            return Ok(ReleaseOutcome::Lost);
        }
        let txn = match held
            .handoff
            .as_ref()
            .and_then(|h| Some((h, h.next.split_first()?)))
        {
            Some((handoff, (next, after))) => txn::release_to(
                &held.entry,
                held.created,
                &handoff.dir,
                next,
                handoff::mark(after),
            ),
            None => txn::delete_if_created_at(held.entry.as_str(), held.created),
        };
        // Sent again only if unsent: a second delete would find nothing and report Lost.
        let deleted = self
            .txn("release", Resend::IfUnsent, txn)
            .await
            .map_err(self.refused("release", &held.entry, Right::ReadWrite))?
            .succeeded();
        // Whichever of two racing releases decides first settles the etcd lease's fate.
        let settle = |to| {
            held.state
                .compare_exchange(HELD, to, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        };
        if deleted {
            if settle(RECYCLED) {
                // The lease holds nothing now: keep it for the next acquire with this TTL.
                self.recycle(lease, held.lease_id, held.requested_secs);
            }
        } else if settle(DISCARDED) {
            // Lost: its lease may still be alive (the entry was evicted); revoke it off the
            // caller's path.
            spawn_revoke(self, held.lease_id);
        }
        let outcome = if deleted {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        };
        tracing::debug!(key = lease.key(), ?outcome, "released");
        Ok(outcome)
    }
}

#[async_trait]
impl Extend for EtcdStore {
    /// # Cancel safety
    /// Dropping the future may leave the lease renewed; the local deadline only moves once both
    /// answers are read.
    #[tracing::instrument(
        level = "trace",
        name = "extend",
        skip_all,
        fields(store = "etcd", key = lease.key(), token = lease.fencing_token())
    )]
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let Some(held) = lease.store_state::<Held>() else {
            return Err(Error::lost(lease, FOREIGN_LEASE));
        };
        if held.state.load(Ordering::SeqCst) != HELD {
            return Err(Error::lost(lease, "it was released"));
        }
        let sent_at = Instant::now();
        let (renewed, entry) = tokio::join!(
            self.shared.renewer.renew(held.lease_id),
            self.kv_get(
                "check the holder's entry",
                held.entry.clone(),
                GetOptions::new().with_keys_only()
            )
        );
        if let Ok(kvs) = &entry {
            if !kvs.iter().any(|kv| kv.create_revision() == held.created) {
                return Err(Error::lost(lease, "its etcd entry was deleted"));
            }
        }
        if let Ok(false) = renewed {
            return Err(Error::lost(lease, "its etcd lease expired or was revoked"));
        }
        renewed?;
        entry.map_err(self.refused("extend", &held.entry, Right::Read))?;
        // A release that ran meanwhile may have handed the etcd lease to another lock: the
        // renewal then vouches for that lock, not this one.
        if held.state.load(Ordering::SeqCst) != HELD {
            return Err(Error::lost(lease, "it was released"));
        }
        lease.confirm(sent_at);
        Ok(())
    }
}

#[async_trait]
impl LockStore for EtcdStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(TTL_GRANULARITY)
            .with_notified_wait(true)
            .with_fair_queue(true)
            .with_frees_on_disconnect(false)
            .with_evict(true)
            // etcdctl's and Go's clients know only exclusive entries: in their layout, modes
            // are refused rather than mixed with entries they would misread.
            .with_shared(self.shared.config.layout == Layout::Fencelock)
            .with_permits(self.shared.config.layout == Layout::Fencelock)
    }

    /// Deletes the entry that holds `key` behind its holder's back and revokes the holder's
    /// etcd lease, as an administrator with `etcdctl del` would. The key is free at once (the
    /// next waiter takes it); the holder finds out at its next extend or release, and its lost
    /// signal fires. Only that one lock is affected: every lock has its own etcd lease. Returns
    /// whether something was deleted.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the entry deleted and its lease not yet revoked; the lease
    /// then holds nothing and expires at its TTL.
    async fn evict(&self, key: &str) -> Result<bool> {
        fencelock_core::validate::check_key(key)?;
        let dir = self.dir(key);
        let refused = || self.refused("evict", &dir, Right::ReadWrite);
        let Some(head) = self.queue_head(&dir).await.map_err(refused())? else {
            return Ok(false);
        };
        // Not a holder: another prefix's token offset, which must never be deleted.
        if offset::is_foreign(head.lease()) {
            return Err(offset::foreign_found(
                self.shared.config.prefix(),
                &dir,
                head.key(),
            ));
        }
        // Compare-and-delete, so a holder that released meanwhile never costs its successor.
        let txn = txn::delete_if_created_at(head.key(), head.create_revision());
        // Sent again only if unsent: a second delete would find nothing and report false.
        let deleted = self
            .txn("evict", Resend::IfUnsent, txn)
            .await
            .map_err(refused())?
            .succeeded();
        // Only a lease whose entry this call deleted: its holder can no longer release it, so it
        // never goes back to its handle's idle leases to carry another lock.
        if deleted && head.lease() != 0 {
            // Not found is fine: the lease ended on its own.
            let _ = self
                .revoke("revoke the evicted holder's lease", head.lease())
                .await;
        }
        tracing::info!(key, created = head.create_revision(), deleted, "evicted");
        Ok(deleted)
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        fencelock_core::validate::check_key(key)?;
        let dir = self.dir(key);
        let refused = || self.refused("status", &dir, Right::Read);
        let queue = match self.shared.config.layout {
            Layout::Fencelock => self
                .kv_get("read the queue", dir.clone(), txn::whole_queue())
                .await
                .map_err(refused())?,
            Layout::Etcd => self
                .queue_head(&dir)
                .await
                .map_err(refused())?
                .into_iter()
                .collect(),
        };
        let Some(head) = queue.first() else {
            return Ok(KeyStatus::Free);
        };
        if offset::is_foreign(head.lease()) {
            return Err(offset::foreign_found(
                self.shared.config.prefix(),
                &dir,
                head.key(),
            ));
        }
        // Read after the queue: an offset changed since an entry's creation is read as of it.
        let offset = match self.shared.config.layout {
            Layout::Fencelock => self
                .kv_get(
                    "read the token offset",
                    offset::key(self.shared.config.prefix()),
                    GetOptions::new(),
                )
                .await
                .map_err(refused())?
                .into_iter()
                .next(),
            Layout::Etcd => None,
        };
        // As acquire does: an offset of another scheme is that scheme's prefix now.
        if let Some(current) = &offset {
            offset::parse(&offset::key(self.shared.config.prefix()), current.value())?;
        }
        let head_mode = match self.shared.config.layout {
            Layout::Fencelock => EntryMode::parse(head.value()),
            Layout::Etcd => EntryMode::Exclusive,
        };
        if head_mode != EntryMode::Exclusive {
            // Granted entries of a mode are the queue's front (each was granted only once
            // every older one was); a front entry not yet marked holds nothing yet.
            let mode = head_mode.mode();
            let granted: Vec<&KeyValue> = queue
                .iter()
                .take_while(|kv| {
                    let entry = EntryMode::parse(kv.value());
                    entry.granted() && entry.mode() == mode
                })
                .collect();
            // Newest first, so one read of the offset as of a holder's revision serves every
            // older holder back to that offset's last raise.
            let mut tokens = HashMap::with_capacity(granted.len());
            let mut offsets = OffsetHistory::new(offset.as_ref());
            for kv in granted.iter().rev() {
                let token = offsets
                    .token(self, kv.create_revision())
                    .await
                    .map_err(refused())?;
                tokens.insert(kv.create_revision(), token);
            }
            let mut holders = Vec::new();
            for kv in granted {
                let slot = match EntryMode::parse(kv.value()) {
                    EntryMode::Permit { slot, .. } => slot,
                    _ => None,
                };
                let remaining = if holders.len() < STATUS_TTL_READS {
                    self.remaining(kv.lease()).await.map_err(refused())?
                } else {
                    None
                };
                holders.push(HolderStatus::new(
                    entry_owner(&dir, kv.key()),
                    tokens.get(&kv.create_revision()).copied().flatten(),
                    slot,
                    remaining,
                ));
            }
            if holders.is_empty() {
                return Ok(KeyStatus::Free);
            }
            return Ok(KeyStatus::Shared {
                mode,
                count: u32::try_from(holders.len()).unwrap_or(u32::MAX),
                holders,
            });
        }
        let remaining = self.remaining(head.lease()).await.map_err(refused())?;
        // In the etcd layout the token (the granting reply's revision) is kept nowhere in etcd.
        let token = match self.shared.config.layout {
            Layout::Fencelock => OffsetHistory::new(offset.as_ref())
                .token(self, head.create_revision())
                .await
                .map_err(refused())?,
            Layout::Etcd => None,
        };
        Ok(KeyStatus::Held {
            owner: entry_owner(&dir, head.key()),
            token,
            remaining,
        })
    }

    /// For a lease granted in [`Layout::Etcd`], what `etcdctl lock` gives its command:
    /// `ETCD_LOCK_KEY`, the holder entry ([`mutex_key`]), and `ETCD_LOCK_REV`, the fencing
    /// token. Nothing for a lease of the fencelock layout.
    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        mutex_key(lease).map_or_else(Vec::new, |entry| {
            vec![
                ("ETCD_LOCK_KEY".to_owned(), entry.to_owned()),
                (
                    "ETCD_LOCK_REV".to_owned(),
                    lease.fencing_token().to_string(),
                ),
            ]
        })
    }
}

/// How many holders of a shared or permit key `status` reads the remaining TTL of (one
/// request each); the others are listed without it.
const STATUS_TTL_READS: usize = 32;

/// How many reads of the offset's history one `status` call makes (one per raise between the
/// holders' entries); holders past them are listed without a token.
const STATUS_OFFSET_READS: usize = STATUS_TTL_READS;

/// The token offset as of holders' revisions, for one `status` call: the current offset, and
/// what reads of its history found, each valid from the offset's raise it shows up to the
/// revision it was read at.
struct OffsetHistory<'a> {
    current: Option<&'a KeyValue>,
    /// `(raised at, read at, offset)`: the offset over revisions `raised at..=read at`.
    read: Vec<(i64, i64, u64)>,
}

impl<'a> OffsetHistory<'a> {
    fn new(current: Option<&'a KeyValue>) -> Self {
        OffsetHistory {
            current,
            read: Vec::new(),
        }
    }

    /// The token of an entry created at `created`, as its grant computed it. `None` once etcd
    /// compacted the revision whose offset it needs, or past [`STATUS_OFFSET_READS`] reads;
    /// [`Error::Store`] for an offset this build does not read (acquire refuses it too).
    async fn token(&mut self, store: &EtcdStore, created: i64) -> Result<Option<u64>> {
        let key = offset::key(store.shared.config.prefix());
        let offset = match self.current {
            None => 0,
            Some(current) if current.mod_revision() <= created => {
                offset::parse(&key, current.value())?
            }
            Some(_) => match self
                .read
                .iter()
                .find(|(raised, read, _)| (*raised..=*read).contains(&created))
            {
                Some((_, _, offset)) => *offset,
                None if self.read.len() >= STATUS_OFFSET_READS => return Ok(None),
                None => {
                    let then = match store
                        .kv_get(
                            "read the token offset",
                            key.clone(),
                            txn::offset_at(created),
                        )
                        .await
                    {
                        Ok(then) => then,
                        Err(error) if is_compacted(&error) => return Ok(None),
                        Err(error) => return Err(error),
                    };
                    // Absent then: never raised before (an offset is never deleted).
                    let (raised, offset) = match then.first() {
                        Some(kv) => (kv.mod_revision(), offset::parse(&key, kv.value())?),
                        None => (0, 0),
                    };
                    self.read.push((raised, created, offset));
                    offset
                }
            },
        };
        offset::token(offset, created).map(Some)
    }
}

/// Whether etcd refused a read of a revision it compacted away.
fn is_compacted(error: &Error) -> bool {
    error
        .to_string()
        .contains("required revision has been compacted")
}

impl EtcdStore {
    /// What is left of etcd lease `lease_id` (`None` for no lease, or one that is gone).
    async fn remaining(&self, lease_id: i64) -> Result<Option<Duration>> {
        if lease_id == 0 {
            return Ok(None);
        }
        let client = &self.shared.client;
        let ttl = self
            .call("read the holder's lease", Resend::Transient, || {
                let mut leases = client.lease_client();
                async move { leases.time_to_live(lease_id, None).await }
            })
            .await?
            .ttl();
        Ok(u64::try_from(ttl).ok().map(Duration::from_secs))
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}
