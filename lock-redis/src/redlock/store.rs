//! [`RedlockStore`]: acquire rounds on every node, the fence raise, and the trait impls.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::cluster::Conn;
use async_trait::async_trait;
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, Error, Instant, KeyStatus, Lease, ListCursor, Listing, OwnerId, ReleaseOutcome,
    Result,
};
use tokio::sync::futures::Notified;
use tokio::time::{sleep, sleep_until};

use super::config::RedlockConfig;
use super::fanout::{FanOut, NodeOrder, Turn};
use super::quorum::{answered, count, evicting, failures, Answers, QuorumError};
use super::scripts::{
    acquire_on, raise_on, release_on, waiter_channel, withdraw_on, NodeAttempt, Raise,
    RedlockNames, Waiter,
};
use crate::config::TTL_GRANULARITY;
use crate::error::redis_error;
use crate::eviction::EvictionCheck;
use crate::keys::KeyNames;
use crate::script::{evict_on, extend_on, owner_hex, relabel_on, status_on, Attempt};
use crate::store::{RedisStore, WAIT_CAP};
use crate::subscriber::Listener;

/// How many raise rounds one acquisition tries before giving up: each round that finds a
/// fence ahead asks for one more than it, so only concurrent raises can make it take more.
const RAISE_ROUNDS: usize = 8;

/// A lock store over N ≥ 3 independent Redis masters (Redlock), with fencing tokens. See the
/// crate docs (`# Redlock`) for how it works, why its tokens only grow, and what it assumes.
/// Exclusive leases only: shared leases and semaphore permits are refused with
/// [`Error::Unsupported`], since a majority of independent semaphores does not bound the
/// permits (the crate docs, `# Redlock`, argue it).
///
/// A handle owns one [`RedisStore`] per node (one multiplexed connection each, and a pub/sub
/// connection once a waiter needs it). Clones share them.
#[derive(Clone)]
pub struct RedlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedlockConfig,
    nodes: Vec<RedisStore>,
}

/// What one acquire round found.
enum Round {
    Granted(Lease),
    /// At least a quorum of nodes hold the key for others: waiting is the only way.
    Held {
        expires_in: Option<Duration>,
    },
    /// No quorum, but no clear holder either (a split vote): retry after a random delay.
    Contended,
    /// Too many nodes failed, or the quorum came too late to leave any validity.
    Failed(Error),
}

impl RedlockStore {
    /// Connects to every node, checks that a quorum answers `PING`, and that no node that
    /// answers can evict a held lock (see the crate docs, `# Eviction`).
    ///
    /// Waits for every node's answer up to the connect timeout plus the command timeout, so
    /// each one is checked: a frozen node delays it by that much, a refused connection does
    /// not. Succeeds while a minority of nodes is down; each is checked when it first answers
    /// a later operation, and counts as a failed node until it passes. Fails with
    /// [`Error::Store`] naming the node and both settings when a node may evict keys
    /// (`maxmemory` and a policy other than `noeviction`) and the URL does not say
    /// `allow_eviction=true` (its source is an [`EvictionRisk`](crate::EvictionRisk)); with the
    /// retryable [`Error::Unavailable`] naming each node's reason when fewer than a quorum
    /// answer; or with [`Error::Store`] when a node refused (credentials, database) and no
    /// quorum answered.
    ///
    /// # Errors
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when fewer than a quorum of nodes
    /// answer and none refused; [`Store`](fencelock_core::ErrorKind::Store) when a node may evict
    /// keys, or a node refused and no quorum answered; those of
    /// [`connect_lazy`](Self::connect_lazy).
    ///
    /// # Cancel safety
    /// Dropping the future closes the connections it opened; nothing is held.
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        let store = Self::connect_lazy(config)?;
        let bound = store.config().connect_timeout() + store.config().command_timeout();
        let (nodes, quorum) = (store.config().node_count(), store.quorum());
        let answers = store
            .fan_out("ping", bound, |mut conn| async move {
                let ping = redis::cmd("PING");
                ping.query_async::<String>(&mut conn)
                    .await
                    .map_err(|e| redis_error("ping", e))
            })
            // Every node is heard, so a node that may evict is named, not outvoted.
            .await_until(|a| evicting(a).is_some() || failures(a) > nodes - quorum)
            .await;
        if let Some(risk) = evicting(&answers) {
            return Err(Error::Store {
                message: format!("connecting to {}: {risk}", store.config()),
                source: Some(Box::new(risk.clone())),
            });
        }
        if count(&answers, |_| true) >= quorum {
            return Ok(store);
        }
        let quorum = store.no_quorum(&answers, |_| "answered".into());
        let message = format!("connecting to {}: {quorum}", store.config());
        let source: Option<fencelock_core::BoxError> = Some(Box::new(quorum));
        let refused = answers
            .iter()
            .any(|a| matches!(a, Some(Err(e)) if !e.is_retryable()));
        Err(if refused {
            Error::Store { message, source }
        } else {
            Error::Unavailable { message, source }
        })
    }

    /// A handle that connects on first use: every operation fails with
    /// [`Error::Unavailable`] while no quorum can be reached. Must be called inside a tokio
    /// runtime.
    ///
    /// Each node's eviction check runs before its first request; a node that may evict (and
    /// `allow_eviction` is not set) fails every request it is sent, like a node that is down,
    /// and is logged once at warn level; [`eviction_checks`](Self::eviction_checks) shows
    /// which nodes passed.
    ///
    /// # Errors
    /// As [`RedisStore::connect_lazy`](crate::RedisStore::connect_lazy) for any node:
    /// [`Store`](fencelock_core::ErrorKind::Store) (or
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable)) when the client library refuses a
    /// node's configuration. Nothing is sent.
    pub fn connect_lazy(config: RedlockConfig) -> Result<Self> {
        let nodes = config
            .nodes
            .iter()
            .map(|node| RedisStore::connect_lazy(node.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(RedlockStore {
            inner: Arc::new(Inner { config, nodes }),
        })
    }

    /// The configuration this handle was made from.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// Each node (`host:port`, in URL order) with what its eviction check found, `None` for
    /// a node not checked yet (down so far) or refused.
    pub fn eviction_checks(&self) -> Vec<(&str, Option<&EvictionCheck>)> {
        self.config()
            .nodes()
            .iter()
            .zip(&self.inner.nodes)
            .map(|(label, node)| (label.as_str(), node.eviction_check()))
            .collect()
    }

    fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    fn names(&self, key: &str) -> Arc<RedlockNames> {
        Arc::new(RedlockNames::new(KeyNames::new(
            self.config().prefix(),
            key,
        )))
    }

    /// Starts `op` on every node at once, each in its own task under `bound`.
    fn fan_out<T, F, Fut>(&self, what: &'static str, bound: Duration, op: F) -> FanOut<T>
    where
        T: Send + 'static,
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        FanOut::start(&self.inner.nodes, what, bound, None, None, op)
    }

    /// Each node's answer or reason, as the typed source of a no-quorum error.
    fn no_quorum<T>(&self, answers: &Answers<T>, show: impl Fn(&T) -> String) -> QuorumError {
        QuorumError::from_answers(self.quorum(), self.config().nodes(), answers, show)
    }

    fn unavailable<T>(
        &self,
        what: &str,
        answers: &Answers<T>,
        show: impl Fn(&T) -> String,
    ) -> Error {
        let quorum = self.no_quorum(answers, show);
        Error::Unavailable {
            message: format!("{what}: {quorum}"),
            source: Some(Box::new(quorum)),
        }
    }

    /// `sent_at` moved back by however much the configured drift exceeds fencelock-core's, so the
    /// lease's deadline (which fencelock-core computes with its own drift) keeps the larger margin.
    fn deadline_base(&self, sent_at: Instant, ttl: Duration) -> Option<Instant> {
        let extra = self
            .config()
            .drift(ttl)
            .saturating_sub(fencelock_core::raw::drift(ttl));
        sent_at.checked_sub(extra)
    }

    /// A random delay of 1 ms to `retry_jitter`.
    fn jitter(&self) -> Duration {
        let most = self.config().retry_jitter().as_micros().max(1_001) as u64;
        Duration::from_micros(rand::random_range(1_000..=most))
    }

    /// Makes a quorum of the nodes this owner holds carry one token in their fence, taken
    /// from below, and returns it. `grants` are the granting nodes with the token each minted
    /// (its fence now). When a quorum of them minted the largest, that is the token and
    /// nothing is sent (the crate docs, `# Redlock`, argue why). Otherwise the nodes below it
    /// are raised to it; a node found at or beyond the token makes the next round ask every
    /// granting node for one more than the highest fence found (only a writer that does not
    /// check the lock's owner, such as an older build, can move a held node's fence).
    async fn raise(
        &self,
        names: &Arc<RedlockNames>,
        owner: OwnerId,
        grants: &[(usize, u64)],
        bound: Duration,
    ) -> Result<u64> {
        let quorum = self.quorum();
        let retention = self.config().retention();
        let mut token = grants.iter().map(|(_, minted)| *minted).max().unwrap_or(0);
        let mut settled = grants.iter().filter(|(_, m)| *m == token).count();
        if settled >= quorum {
            return Ok(token);
        }
        let mut targets = vec![false; self.config().node_count()];
        for (index, minted) in grants {
            targets[*index] = *minted < token;
        }
        for _ in 0..RAISE_ROUNDS {
            let sent = targets.iter().filter(|t| **t).count();
            let raise_names = names.clone();
            let answers = FanOut::start(
                &self.inner.nodes,
                "raise",
                bound,
                None,
                Some(&targets),
                move |mut conn| {
                    let names = raise_names.clone();
                    async move { raise_on(&mut conn, &names.key, owner, token, retention).await }
                },
            )
            .await_until(|a| {
                let raised = count(a, |r| *r == Raise::Raised);
                let lost = failures(a) + count(a, |r| *r == Raise::NotHeld);
                settled + raised >= quorum
                    || count(a, |r| matches!(r, Raise::Ahead(_))) > 0
                    || settled + sent - lost < quorum
            })
            .await;
            if settled + count(&answers, |r| *r == Raise::Raised) >= quorum {
                return Ok(token);
            }
            let ahead = answers
                .iter()
                .filter_map(|a| match a {
                    Some(Ok(Raise::Ahead(fence))) => Some(*fence),
                    _ => None,
                })
                .max();
            match ahead {
                Some(fence) => {
                    token = token.max(fence.saturating_add(1));
                    settled = 0;
                    for (index, _) in grants {
                        targets[*index] = true;
                    }
                }
                None => {
                    return Err(self.unavailable(
                        "acquire: raising the fencing counter",
                        &answers,
                        |r| format!("{r:?}"),
                    ))
                }
            }
        }
        Err(Error::Unavailable {
            message: format!(
                "acquire: the fencing counters kept moving ahead of {token} for {RAISE_ROUNDS} rounds"
            ),
            source: None,
        })
    }

    /// Removes `waiter`'s queue entry and request on the nodes `on` marks, and deletes the
    /// lock there if it holds one of the `stale` owners (server grants the waiter will not
    /// collect), in the background (the key's next waiter is granted or woken if either was
    /// there).
    fn withdraw(&self, names: &Arc<RedlockNames>, waiter: OwnerId, stale: &[OwnerId], on: &[bool]) {
        if on.iter().any(|on| *on) {
            tokio::spawn(
                self.withdrawal(names, waiter, stale, on)
                    .await_until(|_| false),
            );
        }
    }

    /// The requests of [`withdraw`](Self::withdraw), to be awaited.
    fn withdrawal(
        &self,
        names: &Arc<RedlockNames>,
        waiter: OwnerId,
        stale: &[OwnerId],
        on: &[bool],
    ) -> FanOut<()> {
        let names = names.clone();
        let retention = self.config().retention();
        let stale: Arc<[OwnerId]> = stale.into();
        FanOut::start(
            &self.inner.nodes,
            "withdraw",
            self.config().command_timeout(),
            None,
            Some(on),
            move |mut conn| {
                let (names, stale) = (names.clone(), stale.clone());
                async move { withdraw_on(&mut conn, &names, waiter, &stale, retention).await }
            },
        )
    }

    /// One Redlock round as `owner`: acquire on every node (as `waiter`, if given, entering
    /// its queue and leaving its request for `waiter.next`; a server grant already made to
    /// `owner` counts as this round's), and if a quorum granted in time, make a quorum's
    /// fences carry the token. Anything short of that is released on every node that granted,
    /// failed or did not answer (which hands those nodes to their queue's head). A `label` is
    /// kept beside the holder on every node that grants (and in the waiter's request).
    async fn round(
        &self,
        key: &str,
        names: &Arc<RedlockNames>,
        ttl: Duration,
        waiter: Option<Waiter>,
        owner: OwnerId,
        label: Option<&Arc<str>>,
    ) -> Round {
        let nodes = self.config().node_count();
        let quorum = self.quorum();
        let retention = self.config().retention();
        let bound = self.config().command_timeout().min(ttl);
        // Read before the first request is sent: validity counts from here.
        let sent_at = Instant::now();
        let round = OneRound {
            store: self,
            key,
            names,
            ttl,
            waiter,
            owner,
            label,
            nodes,
            quorum,
            retention,
            bound,
            order: NodeOrder::new(nodes),
        };
        let answers = round.acquire().await;
        let grants = grants(&answers);
        let outcome = if grants.len() >= quorum {
            match round.take(&answers, &grants, sent_at).await {
                Ok(lease) => return Round::Granted(lease),
                Err(error) => Err(error),
            }
        } else {
            Ok(())
        };
        round.release(&answers, &grants).await;
        if let Err(error) = outcome {
            return Round::Failed(error);
        }
        round.verdict(&answers)
    }
}

impl RedlockStore {
    /// One Redlock acquisition: a round, retried up to `retry_count` times after a random
    /// delay when it found no quorum but no clear holder (a split vote) or too many failed
    /// nodes. [`Error::Busy`] when a quorum of nodes holds the key for others or has waiters
    /// queued for it (or contention outlasted the retries); the retryable [`Error::Unavailable`] naming each node's reason
    /// when no quorum could be reached.
    ///
    async fn try_once(&self, key: &str, ttl: Duration, label: Option<&str>) -> Result<Lease> {
        let names = self.names(key);
        let label: Option<Arc<str>> = label.map(Arc::from);
        let mut retries = self.config().retry_count();
        loop {
            let owner = OwnerId::random();
            let round = self.round(key, &names, ttl, None, owner, label.as_ref());
            let last = match round.await {
                Round::Granted(lease) => return Ok(lease),
                Round::Held { .. } => {
                    return Err(Error::Busy {
                        key: key.to_owned(),
                    })
                }
                Round::Contended => Error::Busy {
                    key: key.to_owned(),
                },
                Round::Failed(error) => error,
            };
            if retries == 0 {
                return Err(last);
            }
            retries -= 1;
            sleep(self.jitter()).await;
        }
    }

    /// Rounds until the wait runs out. Every round enters or refreshes the waiter's entry in
    /// the key's queue on every node, with its request, and a node grants only to its
    /// queue's head (the crate docs, `# Redlock`, *Waiting in order*). Between rounds the
    /// waiter listens on its own channel of every node (each node's store shares one pub/sub
    /// connection per handle), where a release hands the lock to the queue's head and says
    /// so: a quorum of such grants is the lease, without a round of its own. It makes
    /// another round once a quorum of nodes woke it without that, when the holders' TTL runs
    /// out, and at least every [`WAIT_CAP`]; after a split vote or failed nodes it retries
    /// after a random delay. More than `retry_count` failed rounds in a row end the wait with
    /// the last error. A wait that ends without a lease withdraws its entries and requests
    /// and deletes the grants it did not collect (awaited until a quorum answered).
    ///
    async fn wait_for(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        label: Option<&str>,
    ) -> Result<Lease> {
        let names = self.names(key);
        let label: Option<Arc<str>> = label.map(Arc::from);
        let (id, first) = (OwnerId::random(), OwnerId::random());
        // Withdraws the queue entries (and deletes uncollected grants) if the future is
        // dropped during the wait.
        let mut queued = Queued {
            store: self,
            names: &names,
            waiter: id,
            owners: std::sync::Mutex::new([first, first]),
            armed: true,
        };
        let outcome = self
            .wait_in_queue(key, &names, ttl, wait, id, &queued.owners, label.as_ref())
            .await;
        if outcome.is_err() {
            // Awaited until a quorum answered, so a request right after this one finds the
            // queue without this waiter; the rest finish in the background. Still armed: a
            // future dropped meanwhile withdraws again, in the background.
            let every = vec![true; self.config().node_count()];
            let quorum = self.quorum();
            self.withdrawal(&names, id, &queued.owners(), &every)
                .await_until(|a| answered(a) >= quorum)
                .await;
        }
        queued.armed = false;
        outcome
    }

    /// The rounds of [`RedlockStore::wait_for`] as waiter `id`, until a lease or the end
    /// of the wait. `owners` is kept at the last round's owner and the waiter's current
    /// request (what releases grant it), for the withdrawal of a wait that ends without a
    /// lease. Every round, and so every request, carries the `label`.
    #[allow(clippy::too_many_arguments)]
    async fn wait_in_queue(
        &self,
        key: &str,
        names: &Arc<RedlockNames>,
        ttl: Duration,
        wait: Duration,
        id: OwnerId,
        owners: &std::sync::Mutex<[OwnerId; 2]>,
        label: Option<&Arc<str>>,
    ) -> Result<Lease> {
        let started = Instant::now();
        let queue = InQueue {
            store: self,
            key,
            names,
            ttl,
            label,
            started,
            deadline: started + wait,
            quorum: self.quorum(),
        };
        let deadline = queue.deadline;
        let mut requests = Requests::new(id, owners);
        let mut owner = owners.lock().unwrap_or_else(PoisonError::into_inner)[0];
        let mut waiter = requests.advance(owner);
        let mut failed_rounds = 0;
        let mut asked = Instant::now();
        let nap = match queue.round(waiter, owner).await {
            Round::Granted(lease) => return Ok(lease),
            Round::Held { .. } => Duration::ZERO,
            Round::Contended => self.jitter(),
            Round::Failed(error) => queue.retry(error, &mut failed_rounds)?,
        };
        if Instant::now() >= deadline {
            return Err(queue.timed_out(Instant::now()));
        }
        let listeners = queue.listen(id).await;
        let mut nap_until = Instant::now() + nap;
        let mut notified = arm(&listeners);
        loop {
            let listening =
                queue.between_rounds(&listeners, &mut notified, waiter, asked, nap_until);
            if let Some(lease) = listening.await {
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(queue.timed_out(now));
            }
            // Measured before the round: the holders' remaining TTL, and the validity of
            // grants to the request it leaves, count from here.
            asked = Instant::now();
            owner = waiter.next;
            waiter = requests.advance(owner);
            // Registered before the round, so a message during the round is not missed.
            notified = arm(&listeners);
            let nap = match queue.round(waiter, owner).await {
                Round::Granted(lease) => return Ok(lease),
                Round::Held { expires_in } => {
                    failed_rounds = 0;
                    until_expiry(expires_in)
                }
                Round::Contended => {
                    failed_rounds = 0;
                    self.jitter()
                }
                Round::Failed(error) => queue.retry(error, &mut failed_rounds)?,
            };
            nap_until = asked + nap;
            let now = Instant::now();
            if now >= deadline {
                return Err(queue.timed_out(now));
            }
        }
    }

    /// A lease from a quorum of server grants to `waiter.next` (`grants`: the nodes and the
    /// tokens they minted), made from the request of the round sent at `asked`. Each grant
    /// was made after its node read that request, so its lock lasts at least `ttl` from
    /// `asked`: the validity counts from there. `None` (a round then collects the grants,
    /// with a validity of its own) when less than half the TTL would be left or the raise
    /// failed. The nodes that have not granted yet drop the entry and request, and delete a
    /// grant they made meanwhile (a lock of this lease outside its quorum, which it does not
    /// need).
    async fn take_granted(
        &self,
        key: &str,
        names: &Arc<RedlockNames>,
        ttl: Duration,
        waiter: Waiter,
        grants: &[(usize, u64)],
        asked: Instant,
    ) -> Option<Lease> {
        let base = self.deadline_base(asked, ttl)?;
        let until = base + ttl.saturating_sub(fencelock_core::raw::drift(ttl));
        if Instant::now() + ttl / 2 >= until {
            return None;
        }
        let bound = self.config().command_timeout().min(ttl);
        let token = self.raise(names, waiter.next, grants, bound).await.ok()?;
        if Instant::now() >= until {
            return None;
        }
        let mut rest = vec![true; self.config().node_count()];
        for (index, _) in grants {
            rest[*index] = false;
        }
        self.withdraw(names, waiter.id, &[waiter.next], &rest);
        Some(Lease::new(key, waiter.next, token, ttl, base))
    }
}

/// One acquire round ([`RedlockStore::round`]): the request, and what its steps read.
struct OneRound<'a> {
    store: &'a RedlockStore,
    key: &'a str,
    names: &'a Arc<RedlockNames>,
    ttl: Duration,
    waiter: Option<Waiter>,
    owner: OwnerId,
    label: Option<&'a Arc<str>>,
    nodes: usize,
    quorum: usize,
    retention: Duration,
    /// Each request's bound: the command timeout, or the TTL if that is shorter.
    bound: Duration,
    /// The order of each node's requests, so its release never overtakes its acquire.
    order: NodeOrder,
}

impl OneRound<'_> {
    /// Sends the acquire to every node, and returns the answers once a quorum granted or too
    /// many answered otherwise for a quorum to grant.
    async fn acquire(&self) -> Answers<NodeAttempt> {
        let (nodes, quorum) = (self.nodes, self.quorum);
        let (owner, ttl, retention, waiter) = (self.owner, self.ttl, self.retention, self.waiter);
        let acquire_names = self.names.clone();
        let acquire_label = self.label.cloned();
        FanOut::start(
            &self.store.inner.nodes,
            "acquire",
            self.bound,
            Some((&self.order, Turn::First)),
            None,
            move |mut conn| {
                let (names, label) = (acquire_names.clone(), acquire_label.clone());
                async move {
                    acquire_on(
                        &mut conn,
                        &names,
                        owner,
                        ttl,
                        retention,
                        waiter,
                        label.as_deref(),
                    )
                    .await
                }
            },
        )
        .await_until(|a| {
            let granted = count(a, |x| matches!(x.attempt, Attempt::Granted { .. }));
            granted >= quorum || answered(a) - granted > nodes - quorum
        })
        .await
    }

    /// With a quorum of `grants`: makes a quorum's fences carry one token and, if the quorum
    /// came in time to leave validity, withdraws the waiter from the nodes that did not grant
    /// and returns the lease. An error leaves the round to release on every node.
    async fn take(
        &self,
        answers: &Answers<NodeAttempt>,
        grants: &[(usize, u64)],
        sent_at: Instant,
    ) -> Result<Lease> {
        let (store, ttl) = (self.store, self.ttl);
        let valid_until = store
            .deadline_base(sent_at, ttl)
            .map(|base| base + ttl.saturating_sub(fencelock_core::raw::drift(ttl)));
        let raised = store
            .raise(self.names, self.owner, grants, self.bound)
            .await;
        match (raised, valid_until) {
            (Err(error), _) => Err(error),
            (Ok(token), Some(until)) if Instant::now() < until => {
                if let Some(waiter) = self.waiter {
                    // The granting nodes dropped the entry and request in the script; the
                    // others would keep this waiter at their queue's head (and may grant
                    // its request) until it is withdrawn or lapses.
                    let rest: Vec<bool> = answers
                        .iter()
                        .map(|a| !matches!(a, Some(Ok(x)) if granted(x)))
                        .collect();
                    store.withdraw(self.names, waiter.id, &[waiter.next], &rest);
                }
                let base = store.deadline_base(sent_at, ttl).unwrap_or(sent_at);
                Ok(Lease::new(self.key, self.owner, token, ttl, base))
            }
            (Ok(_), _) => Err(Error::Unavailable {
                message: format!(
                    "acquire: the quorum took {:?}, leaving no validity for a TTL of {ttl:?}",
                    sent_at.elapsed()
                ),
                source: None,
            }),
        }
    }

    /// No lease: releases on every node that granted, failed or has not answered (each
    /// node's release waits for its acquire, so a late grant is released after it). Waits
    /// for the nodes that granted, so our own leftovers do not block the retry.
    async fn release(&self, answers: &Answers<NodeAttempt>, grants: &[(usize, u64)]) {
        let unsettled: Vec<bool> = answers
            .iter()
            .map(|a| !matches!(a, Some(Ok(x)) if !granted(x)))
            .collect();
        let release_names = self.names.clone();
        let (owner, retention) = (self.owner, self.retention);
        let labelled = self.label.is_some();
        FanOut::start(
            &self.store.inner.nodes,
            "release",
            self.bound,
            Some((&self.order, Turn::After)),
            Some(&unsettled),
            move |mut conn| {
                let names = release_names.clone();
                async move { release_on(&mut conn, &names, owner, retention, labelled).await }
            },
        )
        .await_until(|a| grants.iter().all(|(i, _)| a[*i].is_some()))
        .await;
    }

    /// What a round without a lease found: too many failed nodes, a quorum holding the key
    /// for others (with the soonest of their expiries), or neither (a split vote).
    fn verdict(&self, answers: &Answers<NodeAttempt>) -> Round {
        let show = |a: &NodeAttempt| match a.attempt {
            Attempt::Granted { token } => format!("granted with token {token}"),
            Attempt::Held { .. } if a.queued => "another waiter is ahead".to_owned(),
            Attempt::Held { .. } => "held by another owner".to_owned(),
        };
        if failures(answers) > self.nodes - self.quorum {
            return Round::Failed(self.store.unavailable("acquire", answers, show));
        }
        let held = count(answers, |a| matches!(a.attempt, Attempt::Held { .. }));
        if held >= self.quorum {
            let expires_in = answers
                .iter()
                .filter_map(|a| match a {
                    Some(Ok(NodeAttempt {
                        attempt: Attempt::Held { expires_in },
                        ..
                    })) => *expires_in,
                    _ => None,
                })
                .min();
            Round::Held { expires_in }
        } else {
            Round::Contended
        }
    }
}

/// Whether a node's answer to an acquire was a grant.
fn granted(attempt: &NodeAttempt) -> bool {
    matches!(attempt.attempt, Attempt::Granted { .. })
}

/// The nodes that granted an acquire, each with the token it minted.
fn grants(answers: &Answers<NodeAttempt>) -> Vec<(usize, u64)> {
    answers
        .iter()
        .enumerate()
        .filter_map(|(index, a)| match a {
            Some(Ok(NodeAttempt {
                attempt: Attempt::Granted { token },
                ..
            })) => Some((index, *token)),
            _ => None,
        })
        .collect()
}

/// One waiter's wait in a key's queue ([`RedlockStore::wait_in_queue`]): what its rounds, and
/// its listening between them, read.
struct InQueue<'a> {
    store: &'a RedlockStore,
    key: &'a str,
    names: &'a Arc<RedlockNames>,
    ttl: Duration,
    label: Option<&'a Arc<str>>,
    started: Instant,
    deadline: Instant,
    quorum: usize,
}

impl InQueue<'_> {
    /// The error of a wait that ran out at `now`.
    fn timed_out(&self, now: Instant) -> Error {
        Error::WaitTimedOut {
            key: self.key.to_owned(),
            waited: now - self.started,
        }
    }

    /// One round as `owner`, entering or refreshing the waiter's entry and request on every
    /// node.
    async fn round(&self, waiter: Waiter, owner: OwnerId) -> Round {
        let (key, names, ttl, label) = (self.key, self.names, self.ttl, self.label);
        self.store
            .round(key, names, ttl, Some(waiter), owner, label)
            .await
    }

    /// Counts a failed round in `failed_rounds`: more than `retry_count` in a row, or one at
    /// the deadline, end the wait with its `error`; otherwise the next round comes after a
    /// random delay, returned.
    fn retry(&self, error: Error, failed_rounds: &mut u32) -> Result<Duration> {
        *failed_rounds += 1;
        if *failed_rounds > self.store.config().retry_count() || Instant::now() >= self.deadline {
            return Err(error);
        }
        Ok(self.store.jitter())
    }

    /// Listens on waiter `id`'s channel of every node: releases and withdrawals reach only
    /// the queue's head, on its own channel. Waits for the servers to confirm, at most
    /// [`WAIT_CAP`] (and not past the deadline).
    async fn listen(&self, id: OwnerId) -> Vec<Listener> {
        let channel = waiter_channel(self.names, id);
        let listeners: Vec<_> = self
            .store
            .inner
            .nodes
            .iter()
            .map(|node| node.subscriber().listen(&channel))
            .collect();
        let confirm = WAIT_CAP.min(self.deadline.saturating_duration_since(Instant::now()));
        futures_util::future::join_all(listeners.iter().map(|l| l.subscribed(confirm))).await;
        listeners
    }

    /// Between rounds: a quorum of grants to `waiter`'s request is the lease (made from the
    /// round sent at `asked`). `None` when a quorum of nodes was heard from without one, at
    /// `nap_until` or at the deadline: time for the next round. Each wake-up in `notified`
    /// that fires is armed again.
    async fn between_rounds<'l>(
        &self,
        listeners: &'l [Listener],
        notified: &mut [Pin<Box<Notified<'l>>>],
        waiter: Waiter,
        asked: Instant,
        nap_until: Instant,
    ) -> Option<Lease> {
        let (quorum, deadline) = (self.quorum, self.deadline);
        let mut heard = vec![false; listeners.len()];
        loop {
            let grants: Vec<(usize, u64)> = listeners
                .iter()
                .enumerate()
                .filter_map(|(index, l)| Some((index, grant_to(&l.last_message()?, waiter.next)?)))
                .collect();
            if grants.len() >= quorum {
                let (key, names, ttl) = (self.key, self.names, self.ttl);
                return self
                    .store
                    .take_granted(key, names, ttl, waiter, &grants, asked)
                    .await;
            }
            if heard.iter().filter(|h| **h).count() >= quorum {
                return None;
            }
            let until = nap_until.max(Instant::now()).min(deadline);
            let woken = futures_util::future::select_all(notified.iter_mut());
            tokio::select! {
                ((), index, _) = woken => {
                    heard[index] = true;
                    let mut again = Box::pin(listeners[index].notified());
                    again.as_mut().enable();
                    notified[index] = again;
                }
                () = sleep_until(until) => return None,
            }
        }
    }
}

/// The requests of one waiter's rounds. Each round is made as the owner the previous one
/// requested, so it counts the grants releases made to that request since, and requests a
/// fresh owner.
struct Requests<'o> {
    id: OwnerId,
    ticket: u64,
    /// The last round's owner and the current request, for a withdrawal.
    owners: &'o std::sync::Mutex<[OwnerId; 2]>,
    rounds: u64,
}

impl<'o> Requests<'o> {
    /// Waiter `id`'s requests, its ticket taken now, before any round.
    fn new(id: OwnerId, owners: &'o std::sync::Mutex<[OwnerId; 2]>) -> Self {
        Requests {
            id,
            ticket: ticket(),
            owners,
            rounds: 0,
        }
    }

    /// The waiter of the next round, made as `owner`, with the fresh owner it requests.
    fn advance(&mut self, owner: OwnerId) -> Waiter {
        let next = OwnerId::random();
        *self.owners.lock().unwrap_or_else(PoisonError::into_inner) = [owner, next];
        self.rounds += 1;
        Waiter {
            id: self.id,
            ticket: self.ticket,
            next,
            round: self.rounds,
        }
    }
}

/// A wake-up for each listener's next message, enabled at once, so a message that comes
/// before it is polled (during a round) is not missed.
fn arm(listeners: &[Listener]) -> Vec<Pin<Box<Notified<'_>>>> {
    let mut notified: Vec<_> = listeners.iter().map(|l| Box::pin(l.notified())).collect();
    for wake in &mut notified {
        wake.as_mut().enable();
    }
    notified
}

/// The nap after a round that found the key held: one millisecond past the holders' PTTL,
/// which the server rounds down, and at most [`WAIT_CAP`].
fn until_expiry(expires_in: Option<Duration>) -> Duration {
    expires_in
        .map_or(WAIT_CAP, |left| left + Duration::from_millis(1))
        .min(WAIT_CAP)
}

/// The token of a release's grant to `owner` (`g:<token>:<owner>`), if `message` is one.
fn grant_to(message: &[u8], owner: OwnerId) -> Option<u64> {
    let message = std::str::from_utf8(message).ok()?.strip_prefix("g:")?;
    let (token, to) = message.split_once(':')?;
    let token: u64 = token.parse().ok()?;
    (to.as_bytes() == owner_hex(owner) && token > 0).then_some(token)
}

/// A waiter's ticket: the client's wall clock in µs when its wait began. Every node orders
/// the same waiters by the same tickets (ties by waiter id), which is all the queue needs;
/// a client whose clock is behind only waits less.
fn ticket() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// A waiter's queue entries while its wait may still end without a lease: dropped armed, it
/// withdraws them on every node in the background, deleting the grants made to its last
/// round's owner or its request.
struct Queued<'a> {
    store: &'a RedlockStore,
    names: &'a Arc<RedlockNames>,
    waiter: OwnerId,
    owners: std::sync::Mutex<[OwnerId; 2]>,
    armed: bool,
}

impl Queued<'_> {
    fn owners(&self) -> [OwnerId; 2] {
        *self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.armed && tokio::runtime::Handle::try_current().is_ok() {
            let every = vec![true; self.store.config().node_count()];
            self.store
                .withdraw(self.names, self.waiter, &self.owners(), &every);
        }
    }
}

impl RedlockStore {
    /// A page of [`raw::Store::list`]: the cursor is each node's `SCAN` cursor, `-` for a
    /// node whose walk is done.
    async fn list_page(
        &self,
        prefix: &str,
        from: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Listing> {
        let nodes = &self.inner.nodes;
        let cursors: Vec<Option<u64>> = match from {
            None => vec![Some(0); nodes.len()],
            Some(from) => {
                let parsed: Option<Vec<Option<u64>>> = from
                    .position()
                    .split(',')
                    .map(|c| {
                        if c == "-" {
                            Some(None)
                        } else {
                            c.parse().ok().map(Some)
                        }
                    })
                    .collect();
                parsed.filter(|c| c.len() == nodes.len()).ok_or_else(|| {
                    Error::invalid("from", "is not a cursor of this store's listing")
                })?
            }
        };
        let steps = nodes.iter().zip(&cursors).map(|(node, cursor)| async move {
            match cursor {
                Some(cursor) => Some(node.scan_names(prefix, *cursor, limit).await),
                None => None,
            }
        });
        let mut names = Vec::new();
        let mut next = Vec::with_capacity(nodes.len());
        let mut failed = None;
        let mut failures = 0;
        for (step, cursor) in futures_util::future::join_all(steps)
            .await
            .into_iter()
            .zip(&cursors)
        {
            match step {
                None => next.push(None),
                Some(Ok((found, 0))) => {
                    names.extend(found);
                    next.push(None);
                }
                Some(Ok((found, more))) => {
                    names.extend(found);
                    next.push(Some(more));
                }
                Some(Err(error)) => {
                    // Read again from the same place on the next page.
                    failures += 1;
                    failed.get_or_insert(error);
                    next.push(*cursor);
                }
            }
        }
        if failures > nodes.len() - self.quorum() {
            return Err(failed.unwrap_or(Error::Unavailable {
                message: "listing: too many nodes failed".into(),
                source: None,
            }));
        }
        let next = next.iter().any(Option::is_some).then(|| {
            let cursors: Vec<String> = next
                .iter()
                .map(|c| c.map_or_else(|| "-".to_owned(), |c| c.to_string()))
                .collect();
            ListCursor::new(cursors.join(","))
        });
        raw::held_among(self, names, next).await
    }
}

#[async_trait]
impl raw::Store for RedlockStore {
    fn name(&self) -> &'static str {
        crate::REDLOCK.name
    }

    /// Millisecond TTLs, notified waits (each node's pub/sub), a queue ordered by the
    /// clients' clocks (so not declared fair), a dead
    /// holder's lock lives until its TTL on every node, and holder labels (the crate docs,
    /// `# Labels`).
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_notified_wait(true)
            .with_frees_on_disconnect(false)
            .with_fair_queue(false)
            .with_ttl_granularity(TTL_GRANULARITY)
            .with_evict(true)
            .with_max_ttl(self.config().max_ttl())
            .with_retention(self.config().retention())
            .with_labels(true)
            .with_listing(true)
    }

    /// One `SCAN` step on every node whose walk is not done, the names they found together,
    /// then each key's status (a quorum's): a key held on a quorum is on one of any quorum of
    /// nodes, so up to a minority of nodes may fail a step. A key may be listed again on a
    /// later page, found on another node.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.list_page(prefix, from, limit).await
    }

    /// One attempt is a Redlock round, retried after a random delay on a split vote or too
    /// many failed nodes; a wait makes rounds in the key's queue on every node until it is
    /// granted or the wait runs out (the crate docs, `# Redlock`). Exclusive leases only.
    ///
    /// # Cancel safety
    /// Dropping the future after the requests were sent may leave a lease nobody knows of on
    /// some nodes: it expires at its TTL and blocks the key until then. Dropped while waiting,
    /// nothing is held: the subscriptions are given up, and the queue entries withdrawn and
    /// the grants made to the waiter deleted in the background (inside a tokio runtime;
    /// otherwise entries lapse after 1.5 s, and a grant made to the waiter holds the key until
    /// its TTL).
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let AcquireRequest {
            key,
            ttl,
            wait,
            label,
            ..
        } = *request;
        match wait {
            None => self.try_once(key, ttl, label).await,
            Some(wait) => self.wait_for(key, ttl, wait, label).await,
        }
    }

    /// Compare-and-delete on every node. `Released` once a quorum deleted this owner's lock,
    /// `Lost` once so many nodes did not hold it that it cannot have been held by a quorum,
    /// and the retryable [`Error::Unavailable`] naming each node's reason when too many
    /// nodes failed to tell. Nodes still answering keep their request in flight, so the lock
    /// is deleted there too.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lease held on some nodes until its TTL; calling
    /// release again is safe.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let (nodes, quorum) = (self.config().node_count(), self.quorum());
        let names = self.names(lease.key());
        let (owner, retention) = (lease.owner(), self.config().retention());
        let labelled = lease.label().is_some();
        let answers = self
            .fan_out(
                "release",
                self.config().command_timeout(),
                move |mut conn| {
                    let names = names.clone();
                    async move { release_on(&mut conn, &names, owner, retention, labelled).await }
                },
            )
            .await_until(|a| {
                count(a, |released| *released) >= quorum
                    || count(a, |released| !*released) > nodes - quorum
            })
            .await;
        if count(&answers, |released| *released) >= quorum {
            Ok(ReleaseOutcome::Released)
        } else if count(&answers, |released| !*released) > nodes - quorum {
            Ok(ReleaseOutcome::Lost)
        } else {
            Err(self.unavailable("release", &answers, |released| {
                if *released { "released" } else { "not held" }.into()
            }))
        }
    }

    /// Compare-and-expire on every node; succeeds once a quorum extended within the validity
    /// (`sent_at + ttl − drift`). [`Error::LeaseLost`] once so many nodes no longer hold it
    /// that no quorum can; the retryable [`Error::Unavailable`] otherwise.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease on some nodes; the local
    /// deadline only moves once a quorum's answers are read.
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let (nodes, quorum) = (self.config().node_count(), self.quorum());
        let names = self.names(lease.key());
        let (owner, ttl) = (lease.owner(), lease.ttl());
        let labelled = lease.label().is_some();
        let sent_at = Instant::now();
        let answers = self
            .fan_out(
                "extend",
                self.config().command_timeout().min(ttl),
                move |mut conn| {
                    let names = names.clone();
                    async move { extend_on(&mut conn, &names.key, owner, ttl, labelled).await }
                },
            )
            .await_until(|a| {
                count(a, |extended| *extended) >= quorum
                    || answered(a) - count(a, |extended| *extended) > nodes - quorum
            })
            .await;
        let base = self.deadline_base(sent_at, ttl);
        if count(&answers, |extended| *extended) >= quorum {
            if let Some(base) = base {
                if Instant::now() < base + ttl.saturating_sub(fencelock_core::raw::drift(ttl)) {
                    lease.confirm(base);
                    return Ok(());
                }
            }
            return Err(Error::Unavailable {
                message: format!(
                    "extend: the quorum took {:?}, leaving no validity for a TTL of {ttl:?}",
                    sent_at.elapsed()
                ),
                source: None,
            });
        }
        if count(&answers, |extended| !*extended) > nodes - quorum {
            return Err(Error::lost(
                lease,
                format!(
                    "a quorum of {quorum} out of {nodes} Redis nodes no longer holds it (expired, released, or held by another owner)"
                ),
            ));
        }
        Err(self.unavailable("extend", &answers, |extended| {
            if *extended { "extended" } else { "not held" }.into()
        }))
    }

    /// Compare-and-set of the holder's label key on every node, as extend is: succeeds once a
    /// quorum relabelled (held by this owner there); [`Error::LeaseLost`] once so many nodes no
    /// longer hold it that no quorum can; the retryable [`Error::Unavailable`] otherwise. Nodes
    /// still answering keep their request in flight, so the label changes there too.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the new label on some nodes and the old one on others
    /// (status then reports the label a quorum agrees on, if any); the lease's label only
    /// changes once a quorum's answers are read.
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        let (nodes, quorum) = (self.config().node_count(), self.quorum());
        let names = self.names(lease.key());
        let owner = lease.owner();
        let label: Arc<str> = Arc::from(label);
        let answers = self
            .fan_out(
                "relabel",
                self.config().command_timeout(),
                move |mut conn| {
                    let (names, label) = (names.clone(), label.clone());
                    async move { relabel_on(&mut conn, &names.key, owner, &label).await }
                },
            )
            .await_until(|a| {
                count(a, |relabelled| *relabelled) >= quorum
                    || answered(a) - count(a, |relabelled| *relabelled) > nodes - quorum
            })
            .await;
        if count(&answers, |relabelled| *relabelled) >= quorum {
            return Ok(());
        }
        if count(&answers, |relabelled| !*relabelled) > nodes - quorum {
            return Err(Error::lost(
                lease,
                format!(
                    "a quorum of {quorum} out of {nodes} Redis nodes no longer holds it (expired, released, or held by another owner)"
                ),
            ));
        }
        Err(self.unavailable("relabel", &answers, |relabelled| {
            if *relabelled {
                "relabelled"
            } else {
                "not held"
            }
            .into()
        }))
    }

    /// Deletes the lock on `key` on every node (never the fencing counters, so the next token
    /// is still greater) and wakes its waiters. Returns whether a lock was deleted on any node.
    /// The holder finds out at its next extend or release.
    ///
    /// Fails with [`Error::Unavailable`] naming each node's reason when fewer than a quorum
    /// answered; the nodes that did answer have deleted the lock.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lock deleted on some nodes and not others; the
    /// requests already sent still run.
    async fn evict(&self, key: &str) -> Result<bool> {
        let names = self.names(key);
        let answers = self
            .fan_out("evict", self.config().command_timeout(), move |mut conn| {
                let names = names.clone();
                async move { evict_on(&mut conn, &names.key).await }
            })
            .await_until(|_| false)
            .await;
        if answered(&answers) - failures(&answers) < self.quorum() {
            return Err(self.unavailable("evict", &answers, |deleted| {
                if *deleted { "deleted" } else { "no lock" }.into()
            }));
        }
        Ok(count(&answers, |deleted| *deleted) > 0)
    }

    /// `Held` when one owner holds the key on a quorum of nodes, with the token and the label a
    /// quorum of them agrees on (else `None`) and the time until fewer than a quorum hold it; `Free`
    /// when a quorum answered and no owner holds a quorum; [`Error::Unavailable`] otherwise.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        let quorum = self.quorum();
        let names = self.names(key);
        let answers = self
            .fan_out(
                "status",
                self.config().command_timeout(),
                move |mut conn| {
                    let names = names.clone();
                    async move { status_on(&mut conn, &names.key).await }
                },
            )
            .await_until(|_| false)
            .await;
        type Holder<'a> = (
            Option<OwnerId>,
            Option<u64>,
            Option<Duration>,
            Option<&'a str>,
        );
        let held: Vec<Holder<'_>> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(KeyStatus::Held {
                    owner,
                    token,
                    remaining,
                    label,
                })) => Some((*owner, *token, *remaining, label.as_deref())),
                _ => None,
            })
            .collect();
        for (owner, _, _, _) in &held {
            let mine: Vec<_> = held.iter().filter(|(o, ..)| o == owner).collect();
            if owner.is_none() || mine.len() < quorum {
                continue;
            }
            let token = mine
                .iter()
                .filter_map(|(_, t, _, _)| *t)
                .find(|t| mine.iter().filter(|(_, u, _, _)| *u == Some(*t)).count() >= quorum);
            // A relabel that reached only some nodes (or a dropped one) leaves two labels:
            // the one a quorum agrees on is the holder's.
            let label = mine
                .iter()
                .filter_map(|(.., l)| *l)
                .find(|l| mine.iter().filter(|(.., m)| *m == Some(*l)).count() >= quorum);
            let mut remaining: Vec<Duration> = mine.iter().filter_map(|(_, _, r, _)| *r).collect();
            remaining.sort_unstable_by(|a, b| b.cmp(a));
            return Ok(KeyStatus::Held {
                owner: *owner,
                token,
                remaining: remaining.get(quorum - 1).copied(),
                label: label.map(str::to_owned),
            });
        }
        if answered(&answers) - failures(&answers) >= quorum {
            return Ok(KeyStatus::Free);
        }
        Err(self.unavailable("status", &answers, |status| match status {
            KeyStatus::Free => "free".into(),
            _ => "held".into(),
        }))
    }

    /// A note for each node whose eviction check could not tell
    /// ([`EvictionCheck::Unknown`](crate::EvictionCheck::Unknown)) or has not answered yet.
    fn diagnostics(&self) -> Vec<String> {
        crate::eviction::notes(self.eviction_checks())
    }
}

impl fmt::Debug for RedlockStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn admin(server: &test_servers::RedisServer) -> redis::aio::MultiplexedConnection {
        redis::Client::open(server.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("admin")
    }

    async fn set(conn: &mut redis::aio::MultiplexedConnection, key: &str, value: &[u8]) {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query_async(conn)
            .await
            .expect("SET");
    }

    async fn get<T: redis::FromRedisValue>(
        conn: &mut redis::aio::MultiplexedConnection,
        key: &str,
    ) -> Option<T> {
        redis::cmd("GET")
            .arg(key)
            .query_async(conn)
            .await
            .expect("GET")
    }

    /// The raise: skipped when a quorum minted the largest token; a held node whose fence is
    /// already at or beyond the token makes it go past that fence (taken from below on a
    /// quorum); a node that no longer holds this owner's lock is not written and does not
    /// count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raise_skips_goes_past_fences_ahead_and_writes_only_held_nodes() {
        let servers = test_servers::RedisServer::start_many(3).unwrap_or_else(|e| panic!("{e}"));
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let config =
            RedlockConfig::from_url(&format!("redlock://{}?command_timeout=1s", hosts.join(",")))
                .expect("config");
        let store = RedlockStore::connect(config).await.expect("connect");
        let names = store.names("raise:ahead");
        let owner = OwnerId::random();
        let hex = crate::script::owner_hex(owner);
        let bound = Duration::from_secs(1);
        let (mut a, mut b) = (admin(&servers[0]).await, admin(&servers[1]).await);
        for conn in [&mut a, &mut b] {
            set(conn, &names.key.lock, &hex).await;
        }
        set(&mut a, &names.key.fence, b"1000").await;
        set(&mut b, &names.key.fence, b"10").await;

        // Node 1 minted the largest (10), node 0 less (9) but its fence is at 1000.
        let token = store
            .raise(&names, owner, &[(0, 9), (1, 10)], bound)
            .await
            .expect("raise on two held nodes");
        assert_eq!(token, 1001);
        assert_eq!(get::<u64>(&mut a, &names.key.fence).await, Some(1001));
        assert_eq!(get::<u64>(&mut b, &names.key.fence).await, Some(1001));

        // A quorum minted the largest: nothing is written.
        let token = store
            .raise(&names, owner, &[(0, 5000), (1, 5000)], bound)
            .await
            .expect("skipped");
        assert_eq!(token, 5000);
        assert_eq!(get::<u64>(&mut a, &names.key.fence).await, Some(1001));

        // Node 0 no longer holds this owner's lock: not raised, no quorum.
        set(&mut a, &names.key.lock, b"someone else").await;
        let refused = store
            .raise(&names, owner, &[(0, 1), (1, 1002)], bound)
            .await;
        assert!(
            matches!(refused, Err(Error::Unavailable { .. })),
            "{refused:?}"
        );
        assert_eq!(get::<u64>(&mut a, &names.key.fence).await, Some(1001));
    }

    /// The TTL and retention of the script tests.
    const SCRIPT_TTL: Duration = Duration::from_secs(30);
    const SCRIPT_RETENTION: Duration = Duration::from_secs(600);

    /// A real server of its own, a connection to it, and `key`'s names there.
    async fn one_node(
        key: &str,
    ) -> (
        test_servers::RedisServer,
        redis::aio::MultiplexedConnection,
        RedlockNames,
    ) {
        let server = test_servers::RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
        let conn = admin(&server).await;
        (
            server,
            conn,
            RedlockNames::new(KeyNames::new("fencelock:", key)),
        )
    }

    fn owners(n: usize) -> Vec<OwnerId> {
        (0..n).map(|_| OwnerId::random()).collect()
    }

    /// Round `n` of waiter `id`'s wait: it requests `owners[n]` (and is made as
    /// `owners[n - 1]`, the owner the round before requested).
    fn round(id: OwnerId, owners: &[OwnerId], n: usize) -> Waiter {
        Waiter {
            id,
            ticket: 1,
            next: owners[n],
            round: n as u64,
        }
    }

    /// A waiter's round that reaches a node after a newer round of the same wait, after a
    /// release granted that wait's request, or after the waiter withdrew (held up by a
    /// stopped node or a reconnection) changes nothing there: it neither queues the waiter
    /// again nor leaves a request a release would grant. A release grants a queued request; a
    /// round newer than it collects that grant and marks its own request granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_round_changes_nothing_once_a_newer_one_a_grant_or_a_withdrawal_came() {
        use super::super::scripts::{acquire_on, release_on, withdraw_on};
        let (_server, mut conn, names) = one_node("late-rounds").await;
        let (ttl, retention) = (SCRIPT_TTL, SCRIPT_RETENTION);
        let (id, owners) = (OwnerId::random(), owners(5));
        let round = |n: usize| round(id, &owners, n);
        let hex = |owner: OwnerId| owner.to_string();
        let request = names.request(id);
        let queued = |a: NodeAttempt| matches!(a.attempt, Attempt::Held { .. }) && a.queued;

        // Another owner holds the lock; round 2 (as owner 1) leaves a request for owner 2.
        let holder = OwnerId::random();
        let held = acquire_on(&mut conn, &names, holder, ttl, retention, None, None)
            .await
            .expect("holder");
        assert!(matches!(held.attempt, Attempt::Granted { .. }), "{held:?}");
        let waiting = acquire_on(
            &mut conn,
            &names,
            owners[1],
            ttl,
            retention,
            Some(round(2)),
            None,
        )
        .await
        .expect("round 2");
        assert!(
            matches!(waiting.attempt, Attempt::Held { .. }),
            "{waiting:?}"
        );
        // Round 1 arrives late: nothing changes.
        let late = acquire_on(
            &mut conn,
            &names,
            owners[0],
            ttl,
            retention,
            Some(round(1)),
            None,
        )
        .await
        .expect("round 1");
        assert!(queued(late), "{late:?}");
        let left = format!("2:{}:{}", hex(owners[2]), ttl.as_millis());
        assert_eq!(get::<String>(&mut conn, &request).await, Some(left));
        assert_eq!(
            get::<String>(&mut conn, &names.key.lock).await,
            Some(hex(holder))
        );

        // The release grants the request (owner 2); round 2 again is stale.
        assert!(release_on(&mut conn, &names, holder, retention, false)
            .await
            .expect("release"));
        assert_eq!(
            get::<String>(&mut conn, &names.key.lock).await,
            Some(hex(owners[2]))
        );
        assert_eq!(
            get::<String>(&mut conn, &request).await,
            Some(format!("2:{}:", hex(owners[2])))
        );
        let late = acquire_on(
            &mut conn,
            &names,
            owners[1],
            ttl,
            retention,
            Some(round(2)),
            None,
        )
        .await
        .expect("round 2 again");
        assert!(queued(late), "{late:?}");
        assert_eq!(
            get::<String>(&mut conn, &names.key.lock).await,
            Some(hex(owners[2]))
        );

        // Round 3, made as owner 2, collects the grant, and marks its own request granted.
        let collected = acquire_on(
            &mut conn,
            &names,
            owners[2],
            ttl,
            retention,
            Some(round(3)),
            None,
        )
        .await
        .expect("round 3");
        assert!(
            matches!(collected.attempt, Attempt::Granted { .. }),
            "{collected:?}"
        );
        assert_eq!(
            get::<String>(&mut conn, &request).await,
            Some(format!("3:{}:", hex(owners[2])))
        );

        // Withdrawn (deleting the grant to owner 3): round 4 arriving after it changes nothing.
        withdraw_on(&mut conn, &names, id, &[owners[3]], retention)
            .await
            .expect("withdraw");
        assert_eq!(
            get::<String>(&mut conn, &request).await,
            Some("w".to_owned())
        );
        let late = acquire_on(
            &mut conn,
            &names,
            owners[3],
            ttl,
            retention,
            Some(round(4)),
            None,
        )
        .await
        .expect("round 4");
        assert!(queued(late), "{late:?}");
        let entries: u64 = redis::cmd("ZCARD")
            .arg(&names.queue)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        assert_eq!(entries, 0);
        assert_eq!(
            get::<String>(&mut conn, &request).await,
            Some("w".to_owned())
        );
    }

    /// A grant made from a round's request on a node that the next round never reached (its
    /// request lost with a connection) is still this wait's: a later round collects it, and
    /// a withdrawal deletes what the node's request key names, whatever owners the client
    /// passes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_to_an_earlier_request_is_collected_or_withdrawn() {
        use super::super::scripts::{acquire_on, release_on, withdraw_on};
        let (_server, mut conn, names) = one_node("missed-round").await;
        let (ttl, retention) = (SCRIPT_TTL, SCRIPT_RETENTION);
        let (id, owners) = (OwnerId::random(), owners(4));
        let round = |n: usize| round(id, &owners, n);
        let holder = OwnerId::random();
        acquire_on(&mut conn, &names, holder, ttl, retention, None, None)
            .await
            .expect("holder");
        // Round 1 (as owner 0) leaves a request for owner 1; the release grants it.
        acquire_on(
            &mut conn,
            &names,
            owners[0],
            ttl,
            retention,
            Some(round(1)),
            None,
        )
        .await
        .expect("round 1");
        assert!(release_on(&mut conn, &names, holder, retention, false)
            .await
            .expect("release"));
        assert_eq!(
            get::<String>(&mut conn, &names.key.lock).await,
            Some(owners[1].to_string())
        );
        // Round 2 (as owner 1) never reaches this node; round 3 (as owner 2) collects it.
        let collected = acquire_on(
            &mut conn,
            &names,
            owners[2],
            ttl,
            retention,
            Some(round(3)),
            None,
        )
        .await
        .expect("round 3");
        assert!(
            matches!(collected.attempt, Attempt::Granted { .. }),
            "{collected:?}"
        );
        assert_eq!(
            get::<String>(&mut conn, &names.key.lock).await,
            Some(owners[2].to_string())
        );
        // Withdrawn naming other owners: the grant the node's key names is deleted.
        withdraw_on(&mut conn, &names, id, &[owners[3]], retention)
            .await
            .expect("withdraw");
        assert_eq!(get::<String>(&mut conn, &names.key.lock).await, None);
    }

    /// A labelled waiter's request carries its label, so a release that grants it labels the
    /// holder in the same script; a round that collects a grant made to an earlier owner of
    /// its wait moves the label to its own owner; a withdrawal that deletes a grant deletes its
    /// label; a labelled release leaves none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_labelled_waiters_grants_carry_its_label_and_leave_none_behind() {
        use super::super::scripts::{acquire_on, release_on, withdraw_on};
        let (_server, mut conn, names) = one_node("labelled-waiter").await;
        let (ttl, retention) = (SCRIPT_TTL, SCRIPT_RETENTION);
        let (id, owners) = (OwnerId::random(), owners(4));
        let round = |n: usize| round(id, &owners, n);
        let label = Some("leader: host-a");
        let label_of = |owner: OwnerId| names.key.label(owner);
        let holder = OwnerId::random();
        let held = acquire_on(&mut conn, &names, holder, ttl, retention, None, label)
            .await
            .expect("holder");
        assert!(matches!(held.attempt, Attempt::Granted { .. }), "{held:?}");
        assert_eq!(
            get::<String>(&mut conn, &label_of(holder)).await.as_deref(),
            label
        );
        // Round 1 (as owner 0) leaves a labelled request for owner 1; the release grants it.
        acquire_on(
            &mut conn,
            &names,
            owners[0],
            ttl,
            retention,
            Some(round(1)),
            label,
        )
        .await
        .expect("round 1");
        assert!(release_on(&mut conn, &names, holder, retention, true)
            .await
            .expect("release"));
        assert_eq!(get::<String>(&mut conn, &label_of(holder)).await, None);
        assert_eq!(
            get::<String>(&mut conn, &names.key.lock).await,
            Some(owners[1].to_string())
        );
        assert_eq!(
            get::<String>(&mut conn, &label_of(owners[1]))
                .await
                .as_deref(),
            label
        );
        let left: i64 = redis::cmd("PTTL")
            .arg(label_of(owners[1]))
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(
            left > 20_000,
            "the granted label expires in {left} ms, not the TTL"
        );
        // Round 3 (as owner 2) collects the grant made to owner 1: the label moves with it.
        let collected = acquire_on(
            &mut conn,
            &names,
            owners[2],
            ttl,
            retention,
            Some(round(3)),
            label,
        )
        .await
        .expect("round 3");
        assert!(
            matches!(collected.attempt, Attempt::Granted { .. }),
            "{collected:?}"
        );
        assert_eq!(get::<String>(&mut conn, &label_of(owners[1])).await, None);
        assert_eq!(
            get::<String>(&mut conn, &label_of(owners[2]))
                .await
                .as_deref(),
            label
        );
        // Withdrawn: the grant and its label are deleted.
        withdraw_on(&mut conn, &names, id, &[owners[3]], retention)
            .await
            .expect("withdraw");
        assert_eq!(get::<String>(&mut conn, &names.key.lock).await, None);
        assert_eq!(get::<String>(&mut conn, &label_of(owners[2])).await, None);
    }
}
