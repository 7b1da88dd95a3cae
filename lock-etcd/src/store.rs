//! [`EtcdStore`]: the contract on etcd leases, transactions and watches. Its calls go through
//! the client layer ([`crate::client`]); a request that queues behind others waits in
//! [`crate::wait`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{GetOptions, KeyValue, WatchOptions};
use fencelock_core::raw::ttl::whole_secs;
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    raw::drift, Capabilities, Error, HolderStatus, Instant, KeyStatus, Lease, ListCursor, Listing,
    Mode, ReleaseOutcome, Result,
};
use tokio::time::{sleep_until, timeout, timeout_at};

use crate::client::{Connection, Resend};
use crate::config::{EtcdConfig, Layout, MIN_TTL, TTL_GRANULARITY};
use crate::error::{self, name_the_right, Right};
use crate::handoff::{self, Successor};
use crate::keys::{self, entry_owner};
use crate::modes::EntryMode;
use crate::offset;
use crate::revoke::{spawn_revoke, RevokeOnDrop};
use crate::txn::{self, answered_at};
use crate::wait::{Found, Waited, Waiter};

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
    /// The key of the holder's label in [`Layout::Fencelock`] (whether or not it has one
    /// yet); `None` in [`Layout::Etcd`], where the label is the entry's value.
    label_key: Option<String>,
    /// Whether `label_key` may exist: set by a labelled acquire, and before a relabel is sent,
    /// so a release deletes it with the entry (the etcd lease is kept for the next lock).
    labelled: AtomicBool,
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
    /// The connection and its calls, shared with the handle's waits and background revokes.
    etcd: Arc<Connection>,
    /// Released locks' etcd leases, holding no keys, by requested TTL in seconds.
    idle: Arc<Mutex<HashMap<u64, Vec<IdleLease>>>>,
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

/// One [`EtcdStore::attempt`]: the request, and what each of its steps reads.
struct Attempt<'a> {
    store: &'a EtcdStore,
    key: &'a str,
    ttl: Duration,
    /// The wait's bound; `None` for a request without a wait.
    deadline: Option<Instant>,
    mode: Mode,
    label: Option<&'a str>,
    layout: Layout,
    /// The key's queue directory.
    dir: String,
    /// The directory of its holders' labels, in [`Layout::Fencelock`].
    labels: Option<String>,
    started: Instant,
    /// When queueing again (our lease ended while we waited) stops.
    requeue_by: Instant,
}

/// An entry an attempt put in the key's queue, and the etcd lease it is on, which is revoked
/// when this is dropped unless the entry got the key.
struct Queued<'a> {
    lease_id: i64,
    /// The TTL of the etcd lease, as etcd granted it (it may be more than asked for).
    granted: Duration,
    entry: String,
    /// The key of the entry's label in [`Layout::Fencelock`] (whether or not it has one).
    label_key: Option<String>,
    enqueued: Enqueued,
    /// When the request that last renewed the etcd lease was sent: the enqueue's, or earlier
    /// for a fresh idle lease.
    confirmed_at: Instant,
    revoke: RevokeOnDrop<'a>,
}

/// What a queued entry's wait for its turn came to.
enum Turn {
    /// The entry got the key.
    Granted(Grant),
    /// It will not get it: its etcd lease is revoked in place, and the attempt fails with this.
    Refused(Error),
    /// Its etcd lease ended while it waited: queue again, within the wait's bound.
    LeaseEnded,
}

/// How a queued entry got the key.
struct Grant {
    /// When the request that last renewed the etcd lease was sent: the lease counts from it.
    confirmed_at: Instant,
    /// The store revision of the reply that found the entry the holder.
    answered_at: i64,
    /// A permit's slot.
    slot: Option<u32>,
    /// An exclusive holder's successors, for its release to hand the lock to.
    successors: Vec<Successor>,
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
            store.etcd.probe().await?;
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
        Ok(EtcdStore {
            etcd: Arc::new(Connection::open(config).await?),
            idle: Arc::default(),
        })
    }

    /// The configuration this handle was built from.
    pub fn config(&self) -> &EtcdConfig {
        self.etcd.config()
    }

    /// The token offset as of the end of store revision `created`, from `current`, the offset
    /// key as read later (absent: none was ever set, 0). Unless the offset changed since
    /// `created`, `current` is it; otherwise it is read as of `created`, which fails if etcd
    /// compacted that revision away.
    async fn offset_at(&self, current: Option<&KeyValue>, created: i64) -> Result<u64> {
        let key = offset::key(self.config().prefix());
        let Some(current) = current else {
            return Ok(0);
        };
        if current.mod_revision() <= created {
            return offset::parse(&key, current.value());
        }
        let then = self
            .etcd
            .kv_get(
                "read the token offset",
                key.clone(),
                txn::offset_at(created),
            )
            .await?;
        then.first()
            .map_or(Ok(0), |kv| offset::parse(&key, kv.value()))
    }

    /// In [`Layout::Etcd`]: whether the entry of `dir` created at `revision` was the queue's
    /// head at that revision, so its token is that revision (the enqueue's reply); `None` once
    /// etcd compacted it away.
    async fn first_at_creation(&self, dir: &str, revision: i64) -> Result<Option<bool>> {
        let head = self
            .etcd
            .kv_get(
                "read the queue as it was",
                dir.to_owned(),
                txn::queue_head_at(revision),
            )
            .await;
        match head {
            Ok(head) => Ok(Some(
                head.first()
                    .is_some_and(|kv| kv.create_revision() == revision),
            )),
            Err(error) if is_compacted(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn queue_head(&self, dir: &str) -> Result<Option<KeyValue>> {
        Ok(self
            .etcd
            .kv_get("read the queue's head", dir.to_owned(), txn::queue_head())
            .await?
            .into_iter()
            .next())
    }

    /// `label`: the holder's label, and in [`Layout::Fencelock`] the key it is kept in.
    async fn enqueue(
        &self,
        dir: &str,
        entry: &str,
        lease_id: i64,
        mode: Mode,
        label: Option<(Option<&str>, &str)>,
    ) -> Result<Enqueued> {
        let prefix = self.config().prefix();
        let (value, raise, hint) = match self.config().layout {
            // As etcd's own clients put it: no offset, and the value `etcdctl lock` puts (the
            // empty one) or, labelled, the leader's value as `etcdctl elect` puts it.
            Layout::Etcd => (
                label.map_or_else(String::new, |(_, label)| label.to_owned()),
                None,
                0,
            ),
            Layout::Fencelock => {
                let hint = self.etcd.revision_hint().await?;
                let raise = offset::raise(prefix, offset::clock_micros(), hint)?;
                (EntryMode::waiting(mode).value(), Some(raise), hint)
            }
        };
        let label_put = label.and_then(|(key, label)| Some((key?, label)));
        let txn = txn::enqueue(dir, entry, lease_id, value, raise.as_ref(), label_put);
        // Safe to send twice: a second put keeps the entry's create revision, read back here
        // (and the offset is taken as of that revision); a second raise only raises.
        let answer = self.etcd.txn("enqueue", Resend::Transient, txn).await?;
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
        let layout = self.config().layout;
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
        label: Option<&str>,
    ) -> Result<Lease> {
        let started = Instant::now();
        let layout = self.config().layout;
        let dir = self.dir(key);
        let attempt = Attempt {
            store: self,
            key,
            ttl,
            deadline,
            mode,
            label,
            layout,
            labels: (layout == Layout::Fencelock).then(|| keys::labels_dir(&dir)),
            dir,
            started,
            // Queueing again (our lease ended while we waited) stops here: the wait's bound, or
            // for a request without a wait, one command timeout after it started.
            requeue_by: deadline.unwrap_or(started + self.config().command_timeout),
        };
        let mut use_idle = true;
        loop {
            let queued = attempt.enqueue(use_idle);
            let Some(queued) = queued.await? else {
                // The idle lease had ended (its entry, if put, with it): grant afresh.
                use_idle = false;
                continue;
            };
            let grant = match attempt.wait_turn(&queued).await? {
                Turn::Granted(grant) => grant,
                Turn::Refused(error) => {
                    // Revoked in place, not from a spawned task: an entry left queued after
                    // the caller heard of the refusal (a timeout, say) would still stand in
                    // front of the next request, on any handle, until the revoke ran.
                    queued.revoke.now().await;
                    return Err(error);
                }
                // Our lease ended while we waited: queue again, at the back, within the
                // wait's bound.
                Turn::LeaseEnded => {
                    drop(queued);
                    if Instant::now() >= attempt.requeue_by {
                        return Err(attempt.gave_up());
                    }
                    continue;
                }
            };
            let token = attempt.token(&queued.enqueued, grant.answered_at).await?;
            return Ok(attempt.hold(token, queued, grant));
        }
    }

    /// An idle lease for `ttl` that is likely still alive (a quarter of its TTL left on the
    /// local clock); older ones are dropped, to expire on their own.
    fn take_idle(&self, ttl: Duration) -> Option<IdleLease> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
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
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
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
        spawn_revoke(&self.etcd, lease_id);
    }

    /// The queue directory of `key` in this handle's layout.
    fn dir(&self, key: &str) -> String {
        let config = self.config();
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
            let prefix = self.config().prefix();
            let grant_on = if !prefix.is_empty() && touched.starts_with(prefix) {
                prefix
            } else {
                touched.rfind('/').map_or(touched, |end| &touched[..=end])
            };
            name_the_right(error, operation, touched, right, grant_on)
        }
    }
}

impl<'a> Attempt<'a> {
    /// The key of the label of the acquisition on etcd lease `lease_id`, in
    /// [`Layout::Fencelock`] (whether or not it has one).
    fn label_key(&self, lease_id: i64) -> Option<String> {
        self.labels
            .as_deref()
            .map(|labels| keys::label_key(labels, lease_id))
    }

    /// The error of an attempt that ran out of time to queue again: its wait timed out, or a
    /// request without a wait found the key busy.
    fn gave_up(&self) -> Error {
        match self.deadline {
            Some(_) => Error::WaitTimedOut {
                key: self.key.to_owned(),
                waited: self.started.elapsed(),
            },
            None => Error::Busy {
                key: self.key.to_owned(),
            },
        }
    }

    /// Puts an entry in the key's queue: on an idle etcd lease if `use_idle` and one is likely
    /// alive (a grant saved), else on a new one. `None` when the idle lease had ended.
    async fn enqueue(&self, use_idle: bool) -> Result<Option<Queued<'a>>> {
        let sent_at = Instant::now();
        let idle = if use_idle {
            self.store.take_idle(self.ttl)
        } else {
            None
        };
        match idle {
            Some(idle) => self.enqueue_on_idle(idle, sent_at).await,
            None => self.enqueue_on_grant(sent_at).await.map(Some),
        }
    }

    /// Puts the entry of this attempt's mode on etcd lease `lease_id`, with its label if asked.
    async fn put_entry(
        &self,
        lease_id: i64,
        entry: &str,
        label_key: Option<&str>,
    ) -> Result<Enqueued> {
        let put_label = self.label.map(|label| (label_key, label));
        self.store
            .enqueue(&self.dir, entry, lease_id, self.mode, put_label)
            .await
    }

    /// Enqueues on an idle etcd lease, renewing it alongside (the request sent at `sent_at`)
    /// unless it was confirmed moments ago. `None` when etcd no longer knows it.
    async fn enqueue_on_idle(
        &self,
        idle: IdleLease,
        sent_at: Instant,
    ) -> Result<Option<Queued<'a>>> {
        let store = self.store;
        let revoke = RevokeOnDrop::new(&store.etcd, idle.lease_id);
        let entry = keys::entry(&self.dir, idle.lease_id, self.mode);
        let label_key = self.label_key(idle.lease_id);
        // The renewal restarts the idle lease's TTL after `sent_at`, in parallel with the
        // enqueue; only a lease etcd still knows is used. A lease confirmed moments ago is
        // measured from that confirmation instead.
        let fresh = sent_at < idle.confirmed_at + idle.ttl / FRESH_IDLE;
        let renew = async {
            if fresh {
                Ok(true)
            } else {
                store.etcd.renew(idle.lease_id).await
            }
        };
        let (renewed, enqueued) = tokio::join!(
            renew,
            self.put_entry(idle.lease_id, &entry, label_key.as_deref())
        );
        let confirmed_at = if fresh { idle.confirmed_at } else { sent_at };
        match (renewed, enqueued) {
            (Ok(true), Ok(enqueued)) => Ok(Some(Queued {
                lease_id: idle.lease_id,
                granted: idle.ttl,
                entry,
                label_key,
                enqueued,
                confirmed_at,
                revoke,
            })),
            // It ended while idle: its entry (if put) went with it. Grant afresh.
            (Ok(false), _) => Ok(None),
            (Ok(true), Err(error)) if error::is_lease_not_found(&error) => Ok(None),
            (Err(error), _) | (_, Err(error)) => Err(error),
        }
    }

    /// Grants a new etcd lease (the request sent at `sent_at`) and enqueues on it.
    async fn enqueue_on_grant(&self, sent_at: Instant) -> Result<Queued<'a>> {
        let store = self.store;
        let (lease_id, granted) = store.etcd.grant(self.ttl).await?;
        let revoke = RevokeOnDrop::new(&store.etcd, lease_id);
        let entry = keys::entry(&self.dir, lease_id, self.mode);
        let label_key = self.label_key(lease_id);
        let enqueued = self
            .put_entry(lease_id, &entry, label_key.as_deref())
            .await?;
        Ok(Queued {
            lease_id,
            granted,
            entry,
            label_key,
            enqueued,
            confirmed_at: sent_at,
            revoke,
        })
    }

    /// A wait of `queued`'s entry for the entries ahead of it, until `deadline`, keeping its
    /// etcd lease alive meanwhile.
    fn waiter<'w>(&'w self, queued: &'w Queued<'_>, deadline: Instant) -> Waiter<'w> {
        Waiter {
            etcd: &self.store.etcd,
            dir: &self.dir,
            entry: &queued.entry,
            lease_id: queued.lease_id,
            revision: queued.enqueued.revision,
            ttl: queued.granted,
            confirmed_at: queued.confirmed_at,
            deadline,
        }
    }

    /// Waits for `queued`'s turn: a shared or permit request as its mode orders it; an
    /// exclusive one holds the key at once as the queue's head, or else waits to become it
    /// (without a wait, it is refused at once).
    async fn wait_turn(&self, queued: &Queued<'_>) -> Result<Turn> {
        if self.mode != Mode::Exclusive {
            return self.wait_in_mode(queued).await;
        }
        if queued.enqueued.first {
            return Ok(Turn::Granted(Grant {
                confirmed_at: queued.confirmed_at,
                answered_at: queued.enqueued.answered_at,
                slot: None,
                successors: Vec::new(),
            }));
        }
        let Some(deadline) = self.deadline else {
            return Ok(Turn::Refused(Error::Busy {
                key: self.key.to_owned(),
            }));
        };
        self.wait_exclusive(queued, deadline).await
    }

    /// A shared or permit request's wait, at most until `requeue_by` (without a wait, only for
    /// older compatible requests to settle their grants).
    async fn wait_in_mode(&self, queued: &Queued<'_>) -> Result<Turn> {
        let wait = self.waiter(queued, self.requeue_by);
        Ok(
            match wait.run_mode(self.mode, self.deadline.is_none()).await? {
                Waited::Holder {
                    confirmed_at,
                    answered_at,
                    slot,
                    successors: _,
                } => Turn::Granted(Grant {
                    confirmed_at,
                    answered_at,
                    slot,
                    successors: Vec::new(),
                }),
                Waited::Busy | Waited::TimedOut if self.deadline.is_none() => {
                    Turn::Refused(Error::Busy {
                        key: self.key.to_owned(),
                    })
                }
                Waited::Busy | Waited::TimedOut => Turn::Refused(Error::WaitTimedOut {
                    key: self.key.to_owned(),
                    waited: self.started.elapsed(),
                }),
                Waited::Mismatch { held } => {
                    let Mode::Permit { limit } = self.mode else {
                        return Ok(Turn::Refused(Error::Store {
                            message: "a limit mismatch for a request without a limit".into(),
                            source: None,
                        }));
                    };
                    Turn::Refused(Error::LimitMismatch {
                        key: self.key.to_owned(),
                        held,
                        requested: limit,
                    })
                }
                Waited::LeaseEnded => Turn::LeaseEnded,
            },
        )
    }

    /// An exclusive request's wait, until `deadline`, for every older entry to go.
    async fn wait_exclusive(&self, queued: &Queued<'_>, deadline: Instant) -> Result<Turn> {
        let wait = self.waiter(queued, deadline);
        let enqueued = &queued.enqueued;
        // The enqueue's snapshot already names our predecessor (our entry, just put on our
        // lease, was in it).
        let seen = enqueued.predecessor.clone().map(|predecessor| Found {
            predecessor,
            predecessor_waits: enqueued.predecessor_waits,
            ours: true,
            answered_at: enqueued.answered_at,
            successors: Vec::new(),
        });
        Ok(match wait.run(seen).await? {
            Waited::Holder {
                confirmed_at,
                answered_at,
                slot: _,
                successors,
            } => Turn::Granted(Grant {
                confirmed_at,
                answered_at,
                slot: None,
                successors,
            }),
            Waited::TimedOut | Waited::Busy | Waited::Mismatch { .. } => {
                Turn::Refused(Error::WaitTimedOut {
                    key: self.key.to_owned(),
                    waited: self.started.elapsed(),
                })
            }
            Waited::LeaseEnded => Turn::LeaseEnded,
        })
    }

    /// The token of an entry that got the key, found the holder at store revision
    /// `answered_at`: the offset plus its create revision, or in [`Layout::Etcd`] a revision.
    async fn token(&self, enqueued: &Enqueued, answered_at: i64) -> Result<u64> {
        // A resent enqueue was answered after its entry's creation: the entry's create
        // revision is the token if it was first then, as `status` reports it; otherwise a
        // holder may have come and gone in between, and the reply's revision is.
        let answered_at = match self.layout {
            Layout::Etcd if enqueued.first && answered_at != enqueued.revision => {
                match self
                    .store
                    .first_at_creation(&self.dir, enqueued.revision)
                    .await?
                {
                    Some(true) => enqueued.revision,
                    _ => answered_at,
                }
            }
            _ => answered_at,
        };
        match self.layout {
            Layout::Fencelock => offset::token(enqueued.offset, enqueued.revision),
            Layout::Etcd => u64::try_from(answered_at).map_err(|_| Error::Store {
                message: format!("etcd gave a negative revision {answered_at}"),
                source: None,
            }),
        }
    }

    /// The lease of `queued`'s entry, which got the key by `grant` with `token`. From here the
    /// etcd lease is the lock's: no longer revoked when the attempt ends.
    fn hold(&self, token: u64, queued: Queued<'_>, grant: Grant) -> Lease {
        let (key, mode, layout) = (self.key, self.mode, self.layout);
        let (lease_id, slot, successors) = (queued.lease_id, grant.slot, grant.successors);
        let (owner, label_key) = (
            keys::owner(lease_id, queued.enqueued.revision),
            queued.label_key,
        );
        queued.revoke.disarm();
        tracing::debug!(key, token, lease_id, %mode, slot, "acquired");
        let lease = Lease::with_store_state(
            key,
            owner,
            token,
            queued.granted,
            grant.confirmed_at,
            Held {
                entry: queued.entry,
                lease_id,
                created: queued.enqueued.revision,
                layout,
                requested_secs: whole_secs(self.ttl),
                labelled: AtomicBool::new(self.label.is_some() && label_key.is_some()),
                label_key,
                // Only entries of this layout are ever handed the lock (etcd's own clients
                // know nothing of a mark).
                handoff: (layout == Layout::Fencelock
                    && mode == Mode::Exclusive
                    && !successors.is_empty())
                .then(|| Handoff {
                    dir: self.dir.clone(),
                    next: successors,
                }),
                state: AtomicU8::new(HELD),
            },
        );
        if mode == Mode::Exclusive {
            lease
        } else {
            lease.in_mode(mode, slot)
        }
    }
}

/// Why a lease without an entry of this store is lost to it.
const FOREIGN_LEASE: &str =
    "it was not granted by an etcd store (it names no entry), so it holds nothing here";

#[async_trait]
impl raw::Store for EtcdStore {
    fn name(&self) -> &'static str {
        crate::ETCD.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(TTL_GRANULARITY)
            .with_notified_wait(true)
            .with_fair_queue(true)
            .with_frees_on_disconnect(false)
            .with_evict(true)
            .with_labels(true)
            .with_notified_status(true)
            // etcdctl's and Go's clients know only exclusive entries: in their layout, modes
            // are refused rather than mixed with entries they would misread.
            .with_shared(self.config().layout == Layout::Fencelock)
            .with_permits(self.config().layout == Layout::Fencelock)
            .with_listing(true)
    }

    /// One range read of the queue entries under the prefix (keys only, in key order, `limit`
    /// entries from the cursor on), then each key's status: a key with many waiters takes as
    /// many of the page's entries.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        let layout = self.config().layout;
        let start = keys::listing_start(layout, self.config().prefix(), prefix);
        let end = keys::range_end(start.as_bytes());
        // From just after the last entry the previous page read.
        let from = match from {
            Some(from) => format!("{}\0", from.position()).into_bytes(),
            None => start.clone().into_bytes(),
        };
        let options = GetOptions::new()
            .with_range(end)
            .with_keys_only()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let answer = self
            .etcd
            .get("list the queues", &from, options)
            .await
            .map_err(self.refused("list", &start, Right::Read))?;
        let kvs = answer.kvs();
        let names = kvs
            .iter()
            .filter_map(|kv| keys::key_of_entry(layout, self.config().prefix(), kv.key()))
            .collect();
        let next = match kvs.last() {
            Some(last) if answer.more() => Some(ListCursor::new(
                String::from_utf8_lossy(last.key()).into_owned(),
            )),
            _ => None,
        };
        raw::held_among(self, names, next).await
    }

    /// Every mode joins the key's one queue (see the crate docs, *Semaphores and
    /// reader-writer locks*). Without a wait, a shared or permit request that only older
    /// compatible requests stand in front of (readers, or permits of its limit, queued but not
    /// yet marked granted) waits for them to settle, at most the command timeout; anything
    /// else in front makes it [`Error::Busy`] at once, its entry revoked.
    ///
    /// # Cancel safety
    /// A dropped attempt revokes its etcd lease from a spawned task, which deletes its queue
    /// entry (and the lock, if it had been granted) at once; if the revoke cannot run, the lease
    /// expires at its TTL. A lease granted but whose reply was never read holds nothing and
    /// expires at its TTL. A dropped waiter's entry is deleted the same way, so it stops holding
    /// its place in the queue (and keeping newer readers out) at once, and never takes the key
    /// later.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let dir = self.dir(request.key);
        let deadline = request.wait.map(|wait| Instant::now() + wait);
        self.attempt(
            request.key,
            request.ttl,
            deadline,
            request.mode,
            request.label,
        )
        .await
        .map_err(self.refused(request.operation(), &dir, Right::ReadWrite))
    }

    /// # Cancel safety
    /// Dropping the future may leave the entry in place; it then expires with its lease at the
    /// TTL (the lease is kept alive by nobody). Once the delete is answered, the lease is kept
    /// for reuse or revoked without further waiting, so nothing is lost after that point.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let Some(held) = lease.store_state::<Held>() else {
            // It holds nothing here, whoever made it: no entry of this store is its.
            return Ok(ReleaseOutcome::Lost);
        };
        if held.state.load(Ordering::SeqCst) != HELD {
            return Ok(ReleaseOutcome::Lost);
        }
        // Only a label key that may exist is deleted: an unlabelled release sends what it
        // always did.
        let labelled = held.labelled.load(Ordering::SeqCst);
        let label = held.label_key.as_deref().filter(|_| labelled);
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
                label,
            ),
            None => txn::delete_if_created_at(held.entry.as_str(), held.created, label),
        };
        // Sent again only if unsent: a second delete would find nothing and report Lost.
        let deleted = self
            .etcd
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
        // A relabel that raced this release may have put a label key the delete did not
        // name: that lease is revoked rather than kept.
        let clean = labelled || !held.labelled.load(Ordering::SeqCst);
        if deleted {
            if settle(RECYCLED) {
                if clean {
                    // The lease holds nothing now: keep it for the next acquire with this TTL.
                    self.recycle(lease, held.lease_id, held.requested_secs);
                } else {
                    spawn_revoke(&self.etcd, held.lease_id);
                }
            }
        } else if settle(DISCARDED) {
            // Lost: its lease may still be alive (the entry was evicted); revoke it off the
            // caller's path.
            spawn_revoke(&self.etcd, held.lease_id);
        }
        let outcome = if deleted {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        };
        Ok(outcome)
    }

    /// # Cancel safety
    /// Dropping the future may leave the lease renewed; the local deadline only moves once both
    /// answers are read.
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let Some(held) = lease.store_state::<Held>() else {
            return Err(Error::lost(lease, FOREIGN_LEASE));
        };
        if held.state.load(Ordering::SeqCst) != HELD {
            return Err(Error::lost(lease, "it was released"));
        }
        let sent_at = Instant::now();
        let (renewed, entry) = tokio::join!(
            self.etcd.renew(held.lease_id),
            self.etcd.kv_get(
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
        let dir = self.dir(key);
        let refused = || self.refused("evict", &dir, Right::ReadWrite);
        let Some(head) = self.queue_head(&dir).await.map_err(refused())? else {
            return Ok(false);
        };
        // Not a holder: another prefix's token offset, which must never be deleted.
        if offset::is_foreign(head.lease()) {
            return Err(offset::foreign_found(
                self.config().prefix(),
                &dir,
                head.key(),
            ));
        }
        // Compare-and-delete, so a holder that released meanwhile never costs its successor.
        // The holder's label key is on the lease revoked below.
        let txn = txn::delete_if_created_at(head.key(), head.create_revision(), None);
        // Sent again only if unsent: a second delete would find nothing and report false.
        let deleted = self
            .etcd
            .txn("evict", Resend::IfUnsent, txn)
            .await
            .map_err(refused())?
            .succeeded();
        // Only a lease whose entry this call deleted: its holder can no longer release it, so it
        // never goes back to its handle's idle leases to carry another lock.
        if deleted && head.lease() != 0 {
            // Not found is fine: the lease ended on its own.
            let _ = self
                .etcd
                .revoke("revoke the evicted holder's lease", head.lease())
                .await;
        }
        tracing::info!(key, created = head.create_revision(), deleted, "evicted");
        Ok(deleted)
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        let dir = self.dir(key);
        let refused = || self.refused("status", &dir, Right::Read);
        // Each holder's label, by its entry's name ([`Layout::Fencelock`]; in [`Layout::Etcd`]
        // it is the entry's value).
        let mut labels = HashMap::new();
        let queue = match self.config().layout {
            Layout::Fencelock => {
                let labels_dir = keys::labels_dir(&dir);
                let txn = txn::queue_and_labels(&dir, &labels_dir);
                let answer = self
                    .etcd
                    .txn("read the queue", Resend::Transient, txn)
                    .await
                    .map_err(refused())?;
                let mut reads = txn::gets(&answer).into_iter();
                let queue = reads.next().unwrap_or_default();
                for kv in reads.next().unwrap_or_default() {
                    if let Some(name) = keys::label_name(&labels_dir, kv.key()) {
                        labels.insert(name.to_owned(), kv.value().to_vec());
                    }
                }
                queue
            }
            Layout::Etcd => self
                .queue_head(&dir)
                .await
                .map_err(refused())?
                .into_iter()
                .collect(),
        };
        let label_of = |kv: &KeyValue| match self.config().layout {
            Layout::Fencelock => keys::entry_name(&dir, kv.key())
                .and_then(|name| labels.get(name))
                .and_then(|value| keys::label_text(value)),
            Layout::Etcd => keys::label_text(kv.value()),
        };
        // In [`Layout::Etcd`] an entry may be any client's: no owner is named.
        let owner_of = |kv: &KeyValue| match self.config().layout {
            Layout::Fencelock => entry_owner(&dir, kv.key(), kv.lease(), kv.create_revision()),
            Layout::Etcd => None,
        };
        let Some(head) = queue.first() else {
            return Ok(KeyStatus::Free);
        };
        if offset::is_foreign(head.lease()) {
            return Err(offset::foreign_found(
                self.config().prefix(),
                &dir,
                head.key(),
            ));
        }
        // Read after the queue: an offset changed since an entry's creation is read as of it.
        let offset = match self.config().layout {
            Layout::Fencelock => self
                .etcd
                .kv_get(
                    "read the token offset",
                    offset::key(self.config().prefix()),
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
            offset::parse(&offset::key(self.config().prefix()), current.value())?;
        }
        let head_mode = match self.config().layout {
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
                    self.etcd.remaining(kv.lease()).await.map_err(refused())?
                } else {
                    None
                };
                holders.push(
                    HolderStatus::new(
                        owner_of(kv),
                        tokens.get(&kv.create_revision()).copied().flatten(),
                        slot,
                        remaining,
                    )
                    .with_label(label_of(kv)),
                );
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
        let remaining = self.etcd.remaining(head.lease()).await.map_err(refused())?;
        // In the etcd layout the token (the granting reply's revision) is kept nowhere in etcd,
        // but a holder that was first when it was created got the lock in that very reply, at
        // its create revision. Of one that queued first, the token is not known.
        let token = match self.config().layout {
            Layout::Fencelock => OffsetHistory::new(offset.as_ref())
                .token(self, head.create_revision())
                .await
                .map_err(refused())?,
            Layout::Etcd => self
                .first_at_creation(&dir, head.create_revision())
                .await
                .map_err(refused())?
                .filter(|first| *first)
                .and_then(|_| u64::try_from(head.create_revision()).ok()),
        };
        Ok(KeyStatus::Held {
            owner: owner_of(head),
            token,
            remaining,
            label: label_of(head),
        })
    }

    /// A compare-and-set on the holder's own entry, as etcd's `Election.Proclaim` is: the
    /// label is put (into the entry in [`Layout::Etcd`], into its label key in
    /// [`Layout::Fencelock`]) only if the entry still has the create revision its grant saw.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the old label or the new one.
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        let Some(held) = lease.store_state::<Held>() else {
            return Err(Error::lost(lease, FOREIGN_LEASE));
        };
        if held.state.load(Ordering::SeqCst) != HELD {
            return Err(Error::lost(lease, "it was released"));
        }
        let key = match &held.label_key {
            Some(key) => {
                // Before the put is sent, so a release from now on deletes the key too.
                held.labelled.store(true, Ordering::SeqCst);
                key.as_str()
            }
            None => held.entry.as_str(),
        };
        let txn = txn::relabel(&held.entry, held.created, key, label, held.lease_id);
        // Safe to send twice: a second put of the same label on a live entry changes nothing.
        let answer = self
            .etcd
            .txn("relabel", Resend::Transient, txn)
            .await
            .map_err(self.refused("relabel", &held.entry, Right::ReadWrite))?;
        if !answer.succeeded() {
            return Err(Error::lost(lease, "its etcd entry was deleted"));
        }
        Ok(())
    }

    /// Woken by a watch on the key's queue directory (and in [`Layout::Fencelock`] its label
    /// directory): every grant, release, expiry (etcd deletes the entry with its lease),
    /// relabel and mark is a put or a delete there. The watches exist before the status is
    /// read, so no change after that read is missed; a change before it only wakes once more.
    /// While watches cannot be had (a broken stream), the status is read every
    /// [`Capabilities::status_poll`].
    ///
    /// # Cancel safety
    /// Read-only; dropping the future cancels its watches and loses nothing.
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        let dir = self.dir(key);
        let prefix = || WatchOptions::new().with_prefix();
        let mut watches = vec![(dir.clone().into_bytes(), prefix())];
        if self.config().layout == Layout::Fencelock {
            watches.push((keys::labels_dir(&dir).into_bytes(), prefix()));
        }
        let poll = raw::Store::capabilities(self).status_poll;
        loop {
            let stream = timeout_at(
                until,
                self.etcd
                    .watch("watch the key's status", watches.clone(), false),
            )
            .await;
            let mut stream = match stream {
                Ok(Ok(stream)) => Some(stream),
                Ok(Err(error)) if error.is_retryable() => None,
                Ok(Err(error)) => {
                    return Err(self.refused("next_status", &dir, Right::Read)(error))
                }
                Err(_) => None,
            };
            // Each watch's creation reply comes before any of its events.
            let mut created = 0;
            while let Some(watching) = stream.as_mut().filter(|_| created < watches.len()) {
                match timeout_at(until, watching.message()).await {
                    Ok(Some(message)) if message.created() && !message.canceled() => created += 1,
                    _ => stream = None,
                }
            }
            let status = raw::Store::status(self, key).await?;
            let now = Instant::now();
            if !status.same_holders(seen) || now >= until {
                return Ok(status);
            }
            let Some(mut watching) = stream else {
                sleep_until((now + poll).min(until)).await;
                continue;
            };
            // Any event: read again. The end of the watches (a broken stream, a cancel): read
            // again after a poll's pause, so a failing stream is not retried in a loop.
            let ended = loop {
                tokio::select! {
                    message = watching.message() => match message {
                        Some(message) if message.canceled() || message.compact_revision() > 0 => {
                            break true
                        }
                        Some(message) if message.events().is_empty() => {}
                        Some(_) => break false,
                        None => break true,
                    },
                    () = sleep_until(until) => break false,
                }
            };
            drop(watching);
            if ended {
                sleep_until((Instant::now() + poll).min(until)).await;
            }
        }
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
        let key = offset::key(store.config().prefix());
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
                        .etcd
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

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", self.config())
            .finish_non_exhaustive()
    }
}
