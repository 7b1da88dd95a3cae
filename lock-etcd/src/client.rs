//! The client layer: the handle's connection to etcd and the calls the store and its waits
//! send (transactions, reads, a lease's grant, renewal, revoke and remaining TTL, watches),
//! each bounded by the command timeout, sent again where that is safe, and with etcd's errors
//! mapped to the crate's. The keep-alive and watch streams it uses run as tasks of their own
//! ([`crate::renewer`], [`crate::watcher`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, GetResponse, KeyValue, Txn, TxnResponse, WatchOptions,
};
use fencelock_core::raw::ttl::whole_secs;
use fencelock_core::{Error, Instant, Result};
use tokio::time::{sleep, timeout, timeout_at};

use crate::config::EtcdConfig;
use crate::error::{
    self, client_certificate_required, client_error, is_old_auth_revision, is_retryable,
    name_the_right, never_sent, ClosedConnections, Right,
};
use crate::offset;
use crate::renewer::Renewer;
use crate::watcher::{Watcher, Watching};

/// HTTP/2 pings keep idle connections checked; etcd refuses pings more often than every 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// A store handle's connection to etcd, shared by its clones, its waits and its background
/// revokes.
pub(crate) struct Connection {
    client: Client,
    config: EtcdConfig,
    renewer: Renewer,
    /// The handle's one watch stream, shared by its waits.
    watcher: Watcher,
    /// How many times this handle fetched a fresh auth token after etcd called its token older
    /// than the auth store; the lock lets one request fetch it for every request that saw the
    /// same old token.
    auth_refreshes: AtomicU64,
    auth_refresh: tokio::sync::Mutex<()>,
    /// The hint a raise of the token offset counts from (see [`offset::RevisionHint`]).
    revision_seen: Mutex<offset::RevisionHint>,
}

impl Connection {
    /// Connects to `config`'s endpoints and starts the handle's keep-alive task; the first
    /// call proves the cluster answers. With a user name, the client authenticates here (one
    /// round trip, within the connect timeout).
    ///
    /// # Cancel safety
    /// Dropping the future closes whatever connection it had opened; nothing is written.
    pub(crate) async fn open(config: EtcdConfig) -> Result<Connection> {
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
        Ok(Connection {
            client,
            config,
            renewer,
            watcher: Watcher::default(),
            auth_refreshes: AtomicU64::new(0),
            auth_refresh: tokio::sync::Mutex::new(()),
            revision_seen: Mutex::default(),
        })
    }

    /// The configuration the handle was built from.
    pub(crate) fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Proves the cluster answers, with one read of the prefix (count only), or with the empty
    /// prefix, of the member's status.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    pub(crate) async fn probe(&self) -> Result<()> {
        let prefix = self.config.prefix().to_owned();
        if prefix.is_empty() {
            // etcd refuses a read of the empty key; the member's status needs no key
            // permission either.
            let client = &self.client;
            self.call("connect", Resend::Probe, || {
                let mut maintenance = client.maintenance_client();
                async move { maintenance.status().await }
            })
            .await?;
        } else {
            let client = &self.client;
            self.call("connect", Resend::Probe, || {
                let (mut kv, key) = (client.kv_client(), prefix.clone());
                let options = GetOptions::new().with_count_only();
                async move { kv.get(key, Some(options)).await }
            })
            .await
            .map_err(|error| {
                name_the_right(error, "connect", &prefix, Right::ReadWrite, &prefix)
            })?;
        }
        Ok(())
    }

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
        let limit = self.config.command_timeout;
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(5);
        let mut closed = ClosedConnections::default();
        loop {
            let token = self.auth_refreshes.load(Ordering::SeqCst);
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
                && self.config.lacks_client_cert()
                && closed.count(&error)
            {
                return Err(client_certificate_required(what, error));
            }
            let again = match resend {
                _ if is_old_auth_revision(&error) && self.config.user.is_some() => {
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
        let _one_at_a_time = self.auth_refresh.lock().await;
        if self.auth_refreshes.load(Ordering::SeqCst) != seen {
            return Ok(());
        }
        tracing::debug!("etcd's auth store changed; fetching a fresh token");
        self.client.refresh_token().await?;
        self.auth_refreshes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    pub(crate) async fn txn(
        &self,
        what: &'static str,
        resend: Resend,
        txn: Txn,
    ) -> Result<TxnResponse> {
        let client = &self.client;
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
        self.revision_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .note(revision, sent_at);
    }

    /// A store revision no later than the next write's, and at least the store's revision at
    /// most [`offset::HINT_AGE`] before now (or, read now, before the read was sent): the last
    /// one an answer showed, if fresh enough, otherwise a linearizable read's (a serializable
    /// one may come from a member lagging by any amount, and a raise from an old revision puts
    /// tokens ahead of the clock by every revision written since).
    pub(crate) async fn revision_hint(&self) -> Result<i64> {
        let seen = self
            .revision_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fresh(Instant::now(), offset::HINT_AGE);
        if let Some(revision) = seen {
            return Ok(revision);
        }
        let key = offset::key(self.config.prefix());
        let client = &self.client;
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

    pub(crate) async fn kv_get(
        &self,
        what: &'static str,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Result<Vec<KeyValue>> {
        let key = key.into();
        let client = &self.client;
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
    pub(crate) async fn watch(
        &self,
        what: &'static str,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        quiet_after: bool,
    ) -> Result<Watching> {
        // Waiting for another wait that is opening the stream counts against the command
        // timeout too, so waits queued behind a failing open fail one timeout later, not one
        // per wait ahead of them.
        let limit = self.config.command_timeout;
        let opening = match timeout(limit, self.watcher.watch(watches, quiet_after)).await {
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
        let client = &self.client;
        let stream = self
            .call(what, Resend::Transient, || {
                let (mut watches, key, options) =
                    (client.watch_client(), key.clone(), options.clone());
                async move { watches.watch(key, Some(options)).await }
            })
            .await?;
        Ok(opening.adopt(stream))
    }

    pub(crate) async fn revoke(&self, what: &'static str, lease_id: i64) -> Result<()> {
        let client = &self.client;
        self.call(what, Resend::Transient, || {
            let mut leases = client.lease_client();
            async move { leases.revoke(lease_id).await }
        })
        .await
        .map(drop)
    }

    /// Grants an etcd lease of `ttl` rounded up to whole seconds; returns its id and the TTL
    /// etcd granted (etcd may raise it to its own minimum).
    pub(crate) async fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let seconds = whole_secs(ttl);
        let requested = i64::try_from(seconds)
            .map_err(|_| Error::invalid("ttl", format!("{ttl:?} is too long for etcd")))?;
        let client = &self.client;
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

    /// What is left of etcd lease `lease_id` (`None` for no lease, or one that is gone).
    pub(crate) async fn remaining(&self, lease_id: i64) -> Result<Option<Duration>> {
        if lease_id == 0 {
            return Ok(None);
        }
        let client = &self.client;
        let ttl = self
            .call("read the holder's lease", Resend::Transient, || {
                let mut leases = client.lease_client();
                async move { leases.time_to_live(lease_id, None).await }
            })
            .await?
            .ttl();
        Ok(u64::try_from(ttl).ok().map(Duration::from_secs))
    }

    /// Renews etcd lease `lease_id` once over the handle's keep-alive stream (see
    /// [`Renewer::renew`]): `Ok(true)` if etcd renewed it, `Ok(false)` if etcd no longer knows
    /// it, a retryable error if no answer came within the command timeout.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the answer; the renewal may still happen.
    pub(crate) async fn renew(&self, lease_id: i64) -> Result<bool> {
        self.renewer.renew(lease_id).await
    }

    /// Reads `key` with `options`, sent again after any retryable failure, without noting the
    /// answer's revision for a raise of the token offset: for a read that may be serializable
    /// (see `saw_revision`).
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    pub(crate) async fn get(
        &self,
        what: &'static str,
        key: &[u8],
        options: GetOptions,
    ) -> Result<GetResponse> {
        let client = &self.client;
        self.call(what, Resend::Transient, move || {
            let (mut kv, key, options) = (client.kv_client(), key.to_vec(), options.clone());
            async move { kv.get(key, Some(options)).await }
        })
        .await
    }
}

/// When [`Connection::call`] may send a request again.
#[derive(Clone, Copy)]
pub(crate) enum Resend {
    /// After any retryable failure: the request is safe to apply twice.
    Transient,
    /// Only if it certainly reached no member.
    IfUnsent,
    /// As `Transient`, for the request that proves a new handle can talk to the cluster: with
    /// TLS and no client certificate, connections closed at their first request several times
    /// in a row end it as a missing client certificate (see `ClosedConnections`).
    Probe,
}
