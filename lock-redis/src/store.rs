//! [`RedisStore`]: one Redis server, its connections, the eviction check, and the trait impls.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, Error, Instant, KeyStatus, Lease, ListCursor, Listing, Mode, OwnerId,
    PerKeyState, ReleaseOutcome, Result,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::{sleep_until, timeout};

use crate::cluster::{Acked, Conn};
use crate::config::TTL_GRANULARITY;
use crate::config::{Layout, RedisConfig};
use crate::error::redis_error;
use crate::eviction::{self, EvictionCheck};
use crate::keys::{KeyNames, Name, NameArg};
use crate::script::{
    acquire_as_waiting_on, acquire_keys_on, acquire_on, acquire_waiting_on, evict_on, extend_as_on,
    extend_on, member, relabel_as_on, relabel_on, release_as_on, release_keys_on,
    release_labelled_on, status_on, tag_of, withdraw_on, Attempt, ModeAttempt, Place,
};
use crate::sentinel::SentinelConn;
use crate::subscriber::ReleaseSubscriber;

/// The longest a waiter sleeps without a notification before it tries again, so a lost
/// release message costs at most this much delay.
pub const WAIT_CAP: Duration = Duration::from_millis(250);

/// The longest a waiter's mark in the key's queue keeps later requests out without being
/// refreshed; a waiter whose TTL is shorter marks for its TTL, so a waiter that died keeps the
/// key from others no longer than a holder would. The waiter refreshes it at every attempt, at
/// least every half of it, and removes it when it stops waiting; the expiry bounds the mark of
/// a waiter that was dropped and could not remove it.
pub(crate) const WRITER_MARK: Duration = Duration::from_secs(1);

/// How long the marks of a waiter whose TTL is `ttl` live.
fn mark_for(ttl: Duration) -> Duration {
    WRITER_MARK.min(ttl)
}

fn timed_out(what: &str, after: Duration) -> Error {
    Error::Unavailable {
        message: format!("{what}: no answer from Redis within {after:?}"),
        source: None,
    }
}

/// After a `rediss://` connect timed out: whether the port answers a plain-text `PING` (`+PONG`,
/// or an error such as `-NOAUTH`), so the server does not speak TLS there. A TLS client never
/// learns this by itself: the server waits for a line end that the ClientHello never sends.
/// The probe sends no credentials.
#[cfg(feature = "tls")]
async fn speaks_plain_text(connection: &redis::ConnectionInfo, bound: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis::ConnectionAddr::TcpTls { host, port, .. } = connection.addr() else {
        return false;
    };
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.ok()?;
        Some(matches!(first[0], b'+' | b'-'))
    };
    let bound = bound.min(Duration::from_secs(2));
    matches!(timeout(bound, probe).await, Ok(Some(true)))
}

/// A lock store on one Redis server. See the crate docs for what it guarantees.
///
/// A handle owns one multiplexed command connection (reconnected on failure) and, once a
/// waiter needs it, one pub/sub connection shared by all its waiters. Clones share both.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    conn: Conn,
    subscriber: ReleaseSubscriber,
    /// Set by the first eviction check that let the store go on; a refusal is not kept, so a
    /// server reconfigured meanwhile is checked afresh.
    eviction: tokio::sync::OnceCell<EvictionCheck>,
    /// Whether a refusal was logged already.
    refusal_logged: AtomicBool,
    /// Whether a waiting writer's refused mark was logged already.
    mark_refusal_logged: AtomicBool,
}

impl RedisStore {
    /// Connects to the server named by `config`, checks that it answers, and that it cannot
    /// evict a held lock (see the crate docs, `# Eviction`).
    ///
    /// Fails with the retryable [`Error::Unavailable`] if the server cannot be reached and
    /// answer a `PING` within the connect timeout (refused, unroutable, or accepting but hung),
    /// and with [`Error::Store`] if it refuses the credentials or the database, if it refuses
    /// the TLS handshake (a certificate from another CA or for another host, a missing client
    /// certificate), if a `rediss://` port answers in plain text (found after the connect
    /// timeout, by a plain `PING` bounded by the smaller of that timeout and 2 s), or if it may
    /// evict keys (`maxmemory` set and a `maxmemory-policy` other than `noeviction`) and the
    /// URL does not say `allow_eviction=true`; that error names both settings, and its source
    /// is an [`EvictionRisk`](crate::EvictionRisk).
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a Cluster config with
    /// `layout=plain` or a `replica_timeout` not below `command_timeout`;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the server does not answer
    /// `PING` or the eviction check in time; [`Store`](fencelock_core::ErrorKind::Store) for
    /// refused credentials, database or TLS, plain text on a TLS port, or a server that may evict
    /// keys.
    ///
    /// # Cancel safety
    /// Dropping the future closes whatever connection it opened; nothing is held.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let store = Self::connect_lazy(config)?;
        let config = &store.inner.config;
        let bound = match store.inner.conn {
            // Discovery bounds itself by the connect timeout and the PING after it by the
            // command timeout, and says why it gave up: a bound of its own would race them.
            Conn::Sentinel(_) => config.connect_timeout + config.command_timeout,
            _ => config.connect_timeout,
        };
        let mut conn = store.inner.conn.clone();
        let ping_command = redis::cmd("PING");
        let ping = ping_command.query_async::<String>(&mut conn);
        match timeout(bound, ping).await {
            Ok(Ok(_)) => {
                let bound = store.inner.config.command_timeout;
                store.checked_eviction_within(bound).await?;
                Ok(store)
            }
            Ok(Err(e)) => Err(redis_error(
                &format!("connecting to {}", store.inner.config),
                e,
            )),
            Err(_) => {
                let what = format!("connecting to {}", store.inner.config);
                #[cfg(feature = "tls")]
                if speaks_plain_text(&store.inner.config.connection, bound).await {
                    return Err(Error::Store {
                        message: format!(
                            "{what}: the server answers in plain text, not TLS, on this port \
                             (use redis://, or the server's tls-port)"
                        ),
                        source: None,
                    });
                }
                Err(timed_out(&what, bound))
            }
        }
    }

    /// A handle that connects on first use: every operation fails with
    /// [`Error::Unavailable`] while the server cannot be reached. Must be called inside a
    /// tokio runtime.
    ///
    /// The eviction check runs before the first operation that reaches the server; while the
    /// server may evict (and `allow_eviction` is not set), every operation fails with the
    /// [`Error::Store`] that [`connect`](Self::connect) would return, and sends nothing else.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) as [`connect`](Self::connect) for
    /// a Cluster config; [`Store`](fencelock_core::ErrorKind::Store) when the client library
    /// refuses the configuration (or [`Unavailable`](fencelock_core::ErrorKind::Unavailable), as it
    /// classifies the failure). Nothing is sent.
    pub fn connect_lazy(config: RedisConfig) -> Result<Self> {
        config.check()?;
        #[cfg(feature = "tls")]
        if matches!(
            config.connection.addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ) {
            install_crypto_provider();
        }
        if let Some(cluster) = &config.cluster {
            let client = redis::cluster::ClusterClientBuilder::new(cluster.nodes.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.command_timeout)
                .retries(2)
                .build()
                .map_err(|e| Error::store(format!("{config}: {:?}", e.kind()), e))?;
            let cluster_config = redis::cluster::ClusterConfig::new()
                .set_connection_timeout(config.connect_timeout)
                .set_response_timeout(config.command_timeout);
            let conn =
                Conn::Cluster(client.get_pending_async_connection_with_config(cluster_config));
            let clients = cluster
                .nodes
                .iter()
                .map(|node| redis::Client::open(node.clone()))
                .collect::<redis::RedisResult<Vec<_>>>()
                .map_err(|e| Error::store(format!("{config}: {:?}", e.kind()), e))?;
            let subscriber =
                ReleaseSubscriber::new(clients, config.connect_timeout, config.command_timeout);
            return Ok(Self::assemble(config, conn, subscriber));
        }
        if let Some(sentinel) = &config.sentinel {
            let conn = SentinelConn::new(
                sentinel.clone(),
                config.connection.clone(),
                config.connect_timeout,
                config.command_timeout,
            );
            let subscriber = ReleaseSubscriber::on_master_of(
                conn.clone(),
                config.connect_timeout,
                config.command_timeout,
            );
            return Ok(Self::assemble(config, Conn::Sentinel(conn), subscriber));
        }
        let client = redis::Client::open(config.connection.clone())
            .map_err(|e| Error::store(format!("{config}: {:?}", e.kind()), e))?;
        // No response timeout of the client's own: every command on this connection runs
        // under a timeout of ours (`run_on`, Redlock's fan-out, the eviction check, `stats`)
        // no longer than the command timeout, which also bounds a wait for a reconnect; a
        // second timer per command cost about 650 instructions (callgrind), 4% of a cycle.
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(None)
            // A failed reconnect is retried by the next command; a long backoff here would
            // only make callers wait past their own timeouts.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(|e| redis_error(&format!("connecting to {config}"), e))?;
        let subscriber =
            ReleaseSubscriber::new(vec![client], config.connect_timeout, config.command_timeout);
        Ok(Self::assemble(config, Conn::Single(conn), subscriber))
    }

    fn assemble(config: RedisConfig, conn: Conn, subscriber: ReleaseSubscriber) -> Self {
        RedisStore {
            inner: Arc::new(Inner {
                config,
                conn,
                subscriber,
                eviction: tokio::sync::OnceCell::new(),
                refusal_logged: AtomicBool::new(false),
                mark_refusal_logged: AtomicBool::new(false),
            }),
        }
    }

    /// The configuration this handle was made from.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// What the eviction check found, `None` before it has let the store go on (a lazy
    /// handle before its first operation, or while the server refuses).
    pub fn eviction_check(&self) -> Option<&EvictionCheck> {
        self.inner.eviction.get()
    }

    /// Runs the eviction check unless one already let the store go on; concurrent callers
    /// share one check. Unbounded: callers put it under their own timeout.
    ///
    /// # Cancel safety
    /// Read-only; a dropped check is run again by the next caller.
    pub(crate) async fn checked_eviction(&self) -> Result<()> {
        if self.inner.config.allow_eviction {
            self.inner
                .eviction
                .get_or_init(|| async { EvictionCheck::Allowed })
                .await;
            return Ok(());
        }
        let node = self.inner.config.redacted();
        let conn = self.inner.conn.clone();
        let checked = self
            .inner
            .eviction
            .get_or_try_init(|| async move {
                let found = match conn {
                    Conn::Cluster(conn) => crate::cluster::check_eviction(&conn, node).await?,
                    mut conn => eviction::check(&mut conn, node).await?,
                };
                if let EvictionCheck::Unknown { reason } = &found {
                    tracing::warn!(
                        server = node,
                        reason = reason.as_str(),
                        "could not read maxmemory and maxmemory-policy: a held lock may be \
                         evicted without notice if this server evicts keys; allow CONFIG GET or \
                         INFO for this user, or set allow_eviction=true to accept the risk"
                    );
                }
                Ok(found)
            })
            .await;
        match checked {
            Ok(_) => Ok(()),
            Err(refused) => {
                // Said once per handle: a Redlock node refused this way only counts as a
                // failed node, which nothing else would report while a quorum remains.
                if eviction::risk_of(&refused).is_some()
                    && !self.inner.refusal_logged.swap(true, Relaxed)
                {
                    tracing::warn!(server = node, "{refused}");
                }
                Err(refused)
            }
        }
    }

    /// [`Self::checked_eviction`] under `bound`, and free once a check let the store go on.
    async fn checked_eviction_within(&self, bound: Duration) -> Result<()> {
        if self.inner.eviction.initialized() {
            return Ok(());
        }
        // Boxed: the check's future is large (about 1.9 kB), and held inline it would be copied
        // with every acquire's and release's future, though it runs once per handle.
        match timeout(bound, Box::pin(self.checked_eviction())).await {
            Ok(checked) => checked,
            Err(_) => Err(timed_out("eviction check", bound)),
        }
    }

    /// A clone of the shared command connection, for Redlock's per-node fan-out.
    pub(crate) fn connection(&self) -> Conn {
        self.inner.conn.clone()
    }

    /// The handle's pub/sub side, for Redlock's waiters.
    pub(crate) fn subscriber(&self) -> &ReleaseSubscriber {
        &self.inner.subscriber
    }

    pub(crate) fn names(&self, key: &str) -> KeyNames {
        let config = &self.inner.config;
        KeyNames::in_layout(config.layout, &config.prefix, key)
    }

    /// One of `key`'s [`names`](Self::names), without building the others (an exclusive
    /// acquire or release uses two of the five), as an argument written into the command in
    /// place.
    fn name<'a>(&'a self, key: &'a str, which: Name) -> NameArg<'a> {
        let config = &self.inner.config;
        KeyNames::arg(config.layout, &config.prefix, key, which)
    }

    /// Runs one command on a clone of the shared connection under the command timeout.
    async fn run<T, F, Fut>(&self, what: &str, command: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.run_on(self.inner.conn.clone(), what, command).await
    }

    /// The connection an acquire script runs on: on a Cluster with `min_replicas`, one that
    /// follows the script with `WAIT`, and where it leaves the count of acknowledging replicas.
    fn acquire_connection(&self) -> (Conn, Option<Arc<AtomicI64>>) {
        let replicas = self.inner.config.min_replicas();
        match &self.inner.conn {
            conn @ (Conn::Cluster(_) | Conn::Sentinel(_)) if replicas > 0 => {
                let timeout = self.inner.config.replica_timeout();
                let (conn, acked) = Acked::new(conn.clone(), replicas, timeout);
                (Conn::Acked(conn), Some(acked))
            }
            conn => (conn.clone(), None),
        }
    }

    /// A granted lease, if `min_replicas` replicas acknowledged its acquire (or none were
    /// asked for); else the lease is released (with its label, if the acquire asked for one:
    /// the lease does not carry it yet) and the acquire fails with the retryable
    /// [`Error::Unavailable`]: a lease whose token a failover may lose is never handed out.
    async fn acknowledged(
        &self,
        lease: Lease,
        acked: Option<Arc<AtomicI64>>,
        labelled: bool,
    ) -> Result<Lease> {
        let Some(acked) = acked else {
            return Ok(lease);
        };
        let wanted = self.inner.config.min_replicas();
        let got = acked.load(std::sync::atomic::Ordering::SeqCst);
        if got >= i64::from(wanted) {
            return Ok(lease);
        }
        if let Err(error) = self.release_in(&lease, labelled).await {
            tracing::debug!(%error, "an unacknowledged lease was left to expire");
        }
        Err(Error::Unavailable {
            message: format!(
                "acquire {:?}: {} of the {wanted} replicas required (min_replicas) acknowledged \
                 the grant within {:?}; the lease was released, since a failover could lose it \
                 and its token",
                lease.key(),
                got.max(0),
                self.inner.config.replica_timeout()
            ),
            source: None,
        })
    }

    /// After an extend the master applied: `Ok` if `min_replicas` replicas acknowledged it (or
    /// none were asked for); else the retryable [`Error::Unavailable`], and the lease keeps
    /// the deadline it had, which the replicas do have.
    fn extension_acknowledged(&self, lease: &Lease, acked: Option<Arc<AtomicI64>>) -> Result<()> {
        let Some(acked) = acked else {
            return Ok(());
        };
        let wanted = self.inner.config.min_replicas();
        let got = acked.load(std::sync::atomic::Ordering::SeqCst);
        if got >= i64::from(wanted) {
            return Ok(());
        }
        Err(Error::Unavailable {
            message: format!(
                "extend {:?}: {} of the {wanted} replicas required (min_replicas) acknowledged \
                 the new deadline within {:?}; the lease keeps its previous one",
                lease.key(),
                got.max(0),
                self.inner.config.replica_timeout()
            ),
            source: None,
        })
    }

    /// [`Self::run`] on `conn`.
    async fn run_on<T, F, Fut>(&self, conn: Conn, what: &str, command: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let bound = self.inner.config.command_timeout;
        self.checked_eviction_within(bound).await?;
        match timeout(bound, command(conn)).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(what, bound)),
        }
    }

    /// Releases `lease`, with its holder's label key if it is `labelled` (only a labelled
    /// release names and deletes it, so an unlabelled one costs what it did before labels).
    async fn release_in(&self, lease: &Lease, labelled: bool) -> Result<ReleaseOutcome> {
        let owner = lease.owner();
        let released = match tag_of(lease.mode()) {
            None if labelled => {
                let names = self.names(lease.key());
                self.run("release", |mut conn| async move {
                    release_labelled_on(&mut conn, &names, owner).await
                })
                .await?
            }
            None => {
                let lock = self.name(lease.key(), Name::Lock);
                let channel = self.name(lease.key(), Name::Channel);
                self.run("release", |mut conn| async move {
                    release_keys_on(&mut conn, &lock, &channel, owner).await
                })
                .await?
            }
            Some(tag) => {
                let names = self.names(lease.key());
                let member = member(owner, lease.fencing_token(), lease.slot());
                let label = labelled.then(|| names.label(owner));
                self.run("release", |mut conn| async move {
                    release_as_on(&mut conn, &names, &member, &tag, label.as_deref()).await
                })
                .await?
            }
        };
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        })
    }

    /// One acquire attempt in `mode`; the lease's deadline is measured from before the script
    /// was first sent. A resend inside the Cluster client (after an I/O error) runs later and
    /// counts the TTL from its own run, so the server's expiry only moves later than that
    /// deadline. An exclusive attempt with a `mark` also marks the request as a waiting writer
    /// while the key is held (see [`WriterMark`]); without one it is the plain acquire script.
    /// A `label` is kept beside the holder by the granting script.
    async fn attempt(
        &self,
        key: &str,
        names: &KeyNames,
        ttl: Duration,
        mode: Mode,
        label: Option<&str>,
        mut mark: Option<&mut WriterMark>,
    ) -> Result<Granted> {
        let owner = OwnerId::random();
        let retention = self.inner.config.retention;
        let sent_at = Instant::now();
        let (conn, acked) = self.acquire_connection();
        if mode != Mode::Exclusive {
            let window = self.inner.config.command_timeout;
            if let Some(mark) = mark.as_deref_mut() {
                // Set before the script is sent: a future dropped meanwhile still removes it.
                mark.set = true;
            }
            let place = mark.as_deref().map(|mark| mark.place(ttl));
            let (attempt, arrival) = self
                .run_on(conn, "acquire", |mut conn| async move {
                    acquire_as_waiting_on(
                        &mut conn, names, owner, ttl, retention, mode, window, label, place,
                    )
                    .await
                })
                .await?;
            if let Some(mark) = mark {
                mark.marked(arrival, matches!(attempt, ModeAttempt::Granted { .. }));
            }
            return match attempt {
                ModeAttempt::Granted { token, slot } => {
                    let lease = Lease::new(key, owner, token, ttl, sent_at).in_mode(mode, slot);
                    let lease = self.acknowledged(lease, acked, label.is_some()).await?;
                    Ok(Granted::Yes(lease))
                }
                ModeAttempt::Held { expires_in } => Ok(Granted::No { expires_in }),
                ModeAttempt::LimitMismatch { held } => Err(Error::LimitMismatch {
                    key: key.to_owned(),
                    held,
                    requested: match mode {
                        Mode::Permit { limit } => limit,
                        _ => 0,
                    },
                }),
            };
        }
        let attempt = match mark {
            None => {
                self.run_on(conn, "acquire", |mut conn| async move {
                    acquire_on(&mut conn, names, owner, ttl, retention, label).await
                })
                .await?
            }
            Some(mark) => {
                // Set before the script is sent: a future dropped meanwhile still removes it.
                mark.set = true;
                let place = mark.place(ttl);
                let (attempt, marked) = self
                    .run_on(conn, "acquire", |mut conn| async move {
                        acquire_waiting_on(&mut conn, names, owner, ttl, retention, place, label)
                            .await
                    })
                    .await?;
                let granted = matches!(attempt, Attempt::Granted { .. });
                mark.marked(marked.unwrap_or(0), granted);
                if !granted
                    && marked.is_none()
                    && !self.inner.mark_refusal_logged.swap(true, Relaxed)
                {
                    tracing::warn!(
                        server = self.inner.config.redacted(),
                        "the server refused to mark a waiting exclusive request in the key's \
                         queue (ZADD on its :writers set): later requests may overtake it while \
                         it waits; allow +zadd +zrem +zremrangebyscore +zrange +zcard for this \
                         user"
                    );
                }
                attempt
            }
        };
        Ok(match attempt {
            Attempt::Granted { token } => {
                let lease = Lease::new(key, owner, token, ttl, sent_at);
                Granted::Yes(self.acknowledged(lease, acked, label.is_some()).await?)
            }
            Attempt::Held { expires_in } => Granted::No { expires_in },
        })
    }

    /// [`Self::attempt`] for an unlabelled exclusive lease without a writer's mark, naming only
    /// the lock and the fence.
    async fn try_exclusive(&self, key: &str, ttl: Duration) -> Result<Granted> {
        let (lock, fence, queue) = (
            self.name(key, Name::Lock),
            self.name(key, Name::Fence),
            self.name(key, Name::Queue),
        );
        let owner = OwnerId::random();
        let retention = self.inner.config.retention;
        let sent_at = Instant::now();
        let (conn, acked) = self.acquire_connection();
        let attempt = self
            .run_on(conn, "acquire", |mut conn| async move {
                acquire_keys_on(&mut conn, &lock, &fence, &queue, owner, ttl, retention).await
            })
            .await?;
        Ok(match attempt {
            Attempt::Granted { token } => {
                let lease = Lease::new(key, owner, token, ttl, sent_at);
                Granted::Yes(self.acknowledged(lease, acked, false).await?)
            }
            Attempt::Held { expires_in } => Granted::No { expires_in },
        })
    }

    /// One attempt in `mode`, refused as [`Error::Busy`].
    async fn try_acquire_in(
        &self,
        key: &str,
        ttl: Duration,
        mode: Mode,
        label: Option<&str>,
    ) -> Result<Lease> {
        let attempt = if mode == Mode::Exclusive && label.is_none() {
            self.try_exclusive(key, ttl).await?
        } else {
            let names = self.names(key);
            self.attempt(key, &names, ttl, mode, label, None).await?
        };
        match attempt {
            Granted::Yes(lease) => Ok(lease),
            Granted::No { .. } => Err(Error::Busy {
                key: key.to_owned(),
            }),
        }
    }

    /// Waits for `key` in `mode` as [`raw::Store::acquire`] describes ([`Error::Busy`] once
    /// the wait ran out); a refused attempt marks the request's place in the key's queue,
    /// from its first on (see [`WriterMark`]).
    async fn acquire_in(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        mode: Mode,
        label: Option<&str>,
    ) -> Result<Lease> {
        let deadline = Instant::now() + wait;
        let names = self.names(key);
        let timed_out = || Error::Busy {
            key: key.to_owned(),
        };
        let mut mark = Some(WriterMark::new(self, &names));
        let first = self.attempt(key, &names, ttl, mode, label, mark.as_mut());
        if let Granted::Yes(lease) = first.await? {
            return Ok(lease);
        }
        if Instant::now() >= deadline {
            if let Some(mark) = mark.take() {
                mark.withdraw().await;
            }
            return Err(timed_out());
        }
        let listener = self.inner.subscriber.listen(&names.channel);
        listener
            .subscribed(WAIT_CAP.min(deadline.saturating_duration_since(Instant::now())))
            .await;
        // Every attempt refreshes the mark, at least twice within its life.
        let cap = WAIT_CAP.min(mark_for(ttl) / 2);
        loop {
            let notified = listener.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Measured before the attempt: the holder's remaining TTL counts from here.
            let asked = Instant::now();
            let attempt = self.attempt(key, &names, ttl, mode, label, mark.as_mut());
            let expires_in = match attempt.await? {
                Granted::Yes(lease) => return Ok(lease),
                Granted::No { expires_in } => expires_in,
            };
            let now = Instant::now();
            if now >= deadline {
                if let Some(mark) = mark.take() {
                    mark.withdraw().await;
                }
                return Err(timed_out());
            }
            // One millisecond past the PTTL, which the server rounds down.
            let nap = expires_in
                .map_or(cap, |left| left + Duration::from_millis(1))
                .min(cap);
            tokio::select! {
                () = notified => {}
                () = sleep_until((asked + nap).max(now).min(deadline)) => {}
            }
        }
    }
}

/// A waiting request's place in the key's queue (the `:writers` set, named when only
/// writers waited): a mark, as of its first refused attempt's arrival, that keeps out every
/// later request it conflicts with while it lives, so no waiter starves behind a stream of
/// later ones, whatever their modes. Every attempt of the waiter refreshes it for
/// [`mark_for`] its TTL; a grant removes it in the same script, a waiter that gives up removes
/// it before it returns, and a dropped one removes it from a spawned task (its expiry bounds
/// it if that cannot run). Each removal wakes the key's waiters.
pub(crate) struct WriterMark {
    store: RedisStore,
    names: KeyNames,
    /// A random id of this wait, the end of its member in the queue.
    waiter: String,
    /// The server's clock (µs) at its first mark, 0 before it has one.
    arrival: u64,
    /// Whether the mark may be on the server.
    set: bool,
}

impl WriterMark {
    fn new(store: &RedisStore, names: &KeyNames) -> Self {
        WriterMark {
            store: store.clone(),
            names: names.clone(),
            waiter: OwnerId::random().to_string(),
            arrival: 0,
            set: false,
        }
    }

    /// Where the next attempt of a waiter with `ttl` stands in the queue.
    fn place(&self, ttl: Duration) -> Place<'_> {
        Place {
            waiter: &self.waiter,
            arrival: self.arrival,
            mark: mark_for(ttl),
        }
    }

    /// After an attempt: the arrival it marked (0: none), or a grant, which removed the marks.
    fn marked(&mut self, arrival: u64, granted: bool) {
        if granted {
            self.set = false;
        } else if self.arrival == 0 {
            self.arrival = arrival;
        }
    }

    /// Removes the mark now, if it may be set; a failure is left to the mark's expiry.
    async fn withdraw(mut self) {
        if std::mem::take(&mut self.set) {
            remove_mark(&self.store, &self.names, &self.waiter).await;
        }
    }
}

async fn remove_mark(store: &RedisStore, names: &KeyNames, waiter: &str) {
    let removed = store
        .run("withdraw", |mut conn| async move {
            withdraw_on(&mut conn, names, waiter).await
        })
        .await;
    if let Err(error) = removed {
        tracing::debug!(%error, "a waiting writer's mark was left to expire");
    }
}

impl Drop for WriterMark {
    fn drop(&mut self) {
        if !self.set {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, names) = (self.store.clone(), self.names.clone());
        let waiter = std::mem::take(&mut self.waiter);
        runtime.spawn(async move { remove_mark(&store, &names, &waiter).await });
    }
}

/// rustls needs a process-wide crypto provider and the redis crate picks none: install ring,
/// unless the application installed one already.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is in place either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

enum Granted {
    Yes(Lease),
    No { expires_in: Option<Duration> },
}

#[async_trait]
impl raw::Store for RedisStore {
    fn name(&self) -> &'static str {
        crate::REDIS.name
    }

    /// Millisecond TTLs (`PX`), notified waits (pub/sub), a fair queue (each waiter's mark in
    /// the key's queue keeps out every later request it conflicts with; the crate docs, *Waiting in order*),
    /// and a dead holder's lock lives until its TTL. In [`Layout::Plain`] waits are not declared notified: peer
    /// clients publish nothing when they release, so a waiter sees their releases only by
    /// trying again, at least every [`WAIT_CAP`] (fencelock's own releases still wake it).
    /// Shared leases, semaphore permits and holder labels are kept in both layouts (the crate
    /// docs, `# Shared leases and permits` and `# Labels`). With `min_replicas` the shortest TTL is twice
    /// `replica_timeout` (acquires refuse shorter ones, naming that rule).
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_notified_wait(self.inner.config.layout == Layout::Fencelock)
            .with_frees_on_disconnect(false)
            .with_fair_queue(true)
            .with_ttl_granularity(TTL_GRANULARITY)
            .with_min_ttl(self.inner.config.acknowledged_min_ttl().unwrap_or_default())
            .with_evict(true)
            .with_max_ttl(self.inner.config.max_ttl)
            .with_retention(self.inner.config.retention)
            .with_shared(true)
            .with_permits(true)
            .with_labels(true)
            .with_listing(true)
    }

    /// One `SCAN` step over the held keys' names under the prefix (on a Cluster, on every
    /// master), then each one's status: a key held throughout appears at least once, and may
    /// appear twice across pages (a `SCAN` can return a name again while the server rehashes,
    /// or a slot moves).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.list_page(prefix, from, limit).await
    }

    /// With `min_replicas`, a TTL below twice `replica_timeout` is refused naming that rule.
    fn check(&self, request: &AcquireRequest<'_>) -> Result<()> {
        self.inner.config.check_acknowledged_ttl(request.ttl)
    }

    /// One attempt: for an exclusive lease one script over the lock, else one script over the
    /// key's holders (see the crate docs, `# Shared leases and permits`). A wait tries once;
    /// if the key is held, subscribes to the key's release channel (confirmed before the next
    /// attempt, so a release between the attempt and the wait still wakes it), then tries
    /// again on every release message, when the holder's TTL runs out, and at least every
    /// [`WAIT_CAP`]. An exclusive request that has to wait marks itself as a waiting writer
    /// from its second attempt on, which keeps new shared requests out until it is served or
    /// stops waiting.
    ///
    /// An attempt that cannot reach the server ends the wait at once with the retryable
    /// [`Error::Unavailable`], as in every store: the wait bound is only spent waiting for the
    /// lock, and an attempt in flight is bounded by the command timeout, not by the wait.
    ///
    /// # Cancel safety
    /// Dropping the future after a script was sent may leave a lease nobody knows of: it
    /// expires at its TTL and blocks the key (takes a permit, keeps writers out) until then.
    /// Dropped while waiting, nothing is held and the subscription is given up. A dropped
    /// exclusive waiter's mark is removed by a spawned task, and expires within a second if
    /// that cannot run; meanwhile it keeps new readers out.
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
            None => self.try_acquire_in(key, ttl, mode, label).await,
            Some(wait) => self.acquire_in(key, ttl, wait, mode, label).await,
        }
    }

    /// # Cancel safety
    /// Dropping the future may or may not have released the lease; calling release again is
    /// safe (it answers `Lost` if the first one went through).
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.release_in(lease, lease.label().is_some()).await
    }

    /// With `min_replicas` (Cluster, Sentinel) the new deadline is followed by `WAIT` as a
    /// grant is: if fewer replicas acknowledge it in time, the extend fails with the retryable
    /// [`Error::Unavailable`] and the lease keeps its previous deadline (a keep-alive tries
    /// again).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease on the server; the local
    /// deadline only moves once the answer is read.
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let names = self.names(lease.key());
        let (owner, ttl) = (lease.owner(), lease.ttl());
        // Only a labelled lease's label key is renewed with it.
        let labelled = lease.label().is_some();
        let sent_at = Instant::now();
        // With `min_replicas` the new deadline counts only once the replicas have it, as a
        // grant does: a failover may otherwise promote a replica that still has the old one.
        let (conn, acked) = self.acquire_connection();
        let extended = match tag_of(lease.mode()) {
            None => {
                self.run_on(conn, "extend", |mut conn| async move {
                    extend_on(&mut conn, &names, owner, ttl, labelled).await
                })
                .await?
            }
            Some(tag) => {
                let member = member(owner, lease.fencing_token(), lease.slot());
                let label = labelled.then(|| names.label(owner));
                self.run_on(conn, "extend", |mut conn| async move {
                    extend_as_on(&mut conn, &names, &member, &tag, ttl, label.as_deref()).await
                })
                .await?
            }
        };
        if extended {
            self.extension_acknowledged(lease, acked)?;
            lease.confirm(sent_at);
            Ok(())
        } else {
            Err(Error::lost(
                lease,
                "the Redis key expired, was released, or is held by another owner",
            ))
        }
    }

    /// Compare-and-set of the holder's label key, in any mode: only while `lease` still holds
    /// the key (owner, and in shared or permit mode token, under its mode's tag), and expiring
    /// with the holder.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have relabelled the holder on the server; the lease's
    /// label only changes once the answer is read. Either way the lease stays releasable (its
    /// label key is named by its owner, not by its label). A lease without a label whose
    /// relabel was dropped releases without naming the key: the label then stays until the
    /// holder's TTL would have run out, unread (no later holder has that owner).
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        let names = self.names(lease.key());
        let owner = lease.owner();
        let relabelled = match tag_of(lease.mode()) {
            None => {
                self.run("relabel", |mut conn| async move {
                    relabel_on(&mut conn, &names, owner, label).await
                })
                .await?
            }
            Some(tag) => {
                let member = member(owner, lease.fencing_token(), lease.slot());
                let key = names.label(owner);
                self.run("relabel", |mut conn| async move {
                    relabel_as_on(&mut conn, &names, &member, &tag, &key, label).await
                })
                .await?
            }
        };
        if relabelled {
            Ok(())
        } else {
            Err(Error::lost(
                lease,
                "the Redis key expired, was released, or is held by another owner",
            ))
        }
    }

    /// Deletes the lock on `key` behind its holder's back (never the fencing counter, so the
    /// next token is still greater), with every shared or permit holder of the key, and wakes
    /// its waiters. Returns whether a lock (or a mode's tag) was deleted. The holders find out
    /// at their next extend or release.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have deleted the lock.
    async fn evict(&self, key: &str) -> Result<bool> {
        let names = self.names(key);
        self.run("evict", |mut conn| async move {
            evict_on(&mut conn, &names).await
        })
        .await
    }

    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        let names = self.names(key);
        self.run("status", |mut conn| async move {
            status_on(&mut conn, &names).await
        })
        .await
    }

    /// The keys under the prefix, as [`RedisStore::stored_keys`] counts them.
    ///
    /// # Errors
    /// As [`RedisStore::stored_keys`]: [`Error::Unsupported`] on a Redis Cluster.
    ///
    /// # Cancel safety
    /// Reads only; dropping the future loses nothing.
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        let keys = self.stored_keys().await?;
        Ok(Some(PerKeyState::new(keys, "keys under the prefix")))
    }

    /// A note when the eviction check could not tell
    /// ([`EvictionCheck::Unknown`](crate::EvictionCheck::Unknown)) or has not answered yet.
    fn diagnostics(&self) -> Vec<String> {
        crate::eviction::notes([(self.config().redacted(), self.eviction_check())])
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.inner.config)
            .field("waited_channels", &self.inner.subscriber.channels())
            .field("eviction", &self.inner.eviction.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::LockStore;

    /// A holder's label key lives and goes with the holder, in every mode and both layouts:
    /// the granting script writes it with the holder's TTL, extend renews it, release and evict
    /// delete it, and an unlabelled lease writes none (status then reports no label).
    #[tokio::test]
    async fn a_label_key_lives_and_goes_with_its_holder() {
        let url = test_servers::shared::redis().url();
        let mut admin = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("admin");
        let ttl = Duration::from_secs(30);
        let label_of = |admin: &redis::aio::MultiplexedConnection, key: String| {
            let mut admin = admin.clone();
            async move {
                let (label, left): (Option<String>, i64) = redis::pipe()
                    .get(&key)
                    .pttl(&key)
                    .query_async(&mut admin)
                    .await
                    .expect("GET, PTTL");
                (label, left)
            }
        };
        for options in ["", "&layout=plain"] {
            let config = RedisConfig::from_url(&format!("{url}?prefix=label-test:{options}"))
                .expect("config");
            let store = RedisStore::connect(config).await.expect("connect");
            for mode in [Mode::Exclusive, Mode::Shared, Mode::permits(2)] {
                let key = format!("{}:{mode}", OwnerId::random());
                let names = store.names(&key);
                let request = AcquireRequest::new(&key, ttl).mode(mode).label("worker 7");
                let lease = store.acquire_request(request).await.expect("labelled");
                let (label, left) = label_of(&admin, names.label(lease.owner())).await;
                assert_eq!(label.as_deref(), Some("worker 7"), "{options} {mode}");
                assert!(
                    left > 25_000 && left <= 30_000,
                    "{options} {mode}: {left} ms"
                );
                // As if the grant were older: the extend renews the label with the holder.
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(names.label(lease.owner()))
                    .arg(5_000)
                    .query_async(&mut admin)
                    .await
                    .expect("PEXPIRE");
                store.extend(&lease).await.expect("extend");
                let (_, left) = label_of(&admin, names.label(lease.owner())).await;
                assert!(left > 25_000, "{options} {mode}: renewed to {left} ms");
                assert_eq!(
                    store.release(&lease).await.expect("release"),
                    ReleaseOutcome::Released
                );
                let (label, _) = label_of(&admin, names.label(lease.owner())).await;
                assert_eq!(label, None, "{options} {mode}: the release left the label");

                let plain = store.try_acquire_as(&key, ttl, mode).await.expect("plain");
                let (label, _) = label_of(&admin, names.label(plain.owner())).await;
                assert_eq!(
                    label, None,
                    "{options} {mode}: an unlabelled lease wrote one"
                );
                let unlabelled = match store.status(&key).await.expect("status") {
                    KeyStatus::Held { label, .. } => label.is_none(),
                    KeyStatus::Shared { holders, .. } => holders.iter().all(|h| h.label.is_none()),
                    _ => false,
                };
                assert!(
                    unlabelled,
                    "{options} {mode}: an unlabelled holder has a label"
                );
                let _ = store.release(&plain).await.expect("release");

                let lease = store
                    .acquire_request(AcquireRequest::new(&key, ttl).mode(mode).label("evicted"))
                    .await
                    .expect("labelled");
                assert!(store.evict(&key).await.expect("evict"));
                let (label, _) = label_of(&admin, names.label(lease.owner())).await;
                assert_eq!(label, None, "{options} {mode}: the evict left the label");
            }
        }
    }

    #[tokio::test]
    async fn each_name_is_the_key_names_field() {
        for (layout, url) in [
            (Layout::Fencelock, "redis://127.0.0.1:1?prefix=p:"),
            (Layout::Plain, "redis://127.0.0.1:1?prefix=p:&layout=plain"),
        ] {
            let config = RedisConfig::from_url(url).expect("url");
            assert_eq!(config.layout, layout);
            let store = RedisStore::connect_lazy(config).expect("lazy handle");
            for key in ["jobs/nightly", "{x", "a}b", "100%", "}", "%7D"] {
                let names = store.names(key);
                let name = |which| store.name(key, which).to_string();
                assert_eq!(name(Name::Lock), names.lock, "{key:?}");
                assert_eq!(name(Name::Fence), names.fence, "{key:?}");
                assert_eq!(name(Name::Channel), names.channel, "{key:?}");
            }
        }
    }
}
