//! The client layer: one ZooKeeper session, its negotiated timeout, and the requests sent on
//! it (retried across a dropped connection where that is safe, their errors mapped). The
//! leases that live on a session, and the task that revokes them when it is lost, are in
//! `loss`.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use fencelock_core::{Error, Result};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::config::{Auth, ZookeeperConfig};
use crate::error::{client_error, is_retryable, timed_out};
use crate::heard::Heard;
use crate::loss::{watch_state, SessionLeases};

/// One ZooKeeper session of a handle.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// The timeout the server negotiated when the session opened: its leases' TTL. A
    /// reconnection that negotiates less ends the session (`loss`).
    pub(crate) timeout: Duration,
    command_timeout: Duration,
    /// The leases that live on the session, revoked by its loss watcher.
    pub(crate) leases: Arc<SessionLeases>,
    /// When an acquisition last took the session or a lease on it went away: the handle
    /// closes a session nothing has used for a while.
    last_used: Mutex<Instant>,
    /// Cancelled on drop, so the loss watcher ends with the session.
    dropped: CancellationToken,
    /// The session's answered requests, from which a lease's deadline is dated.
    heard: Arc<Heard>,
    /// How long a follower may hold the session's activity before its leader hears of it, once
    /// the handle knows the server's limits ([`start_heartbeat`](Self::start_heartbeat)).
    report: OnceLock<Duration>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.client.session_id())
            .field("timeout", &self.timeout)
            .field("ended", &self.is_ended())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// The bound on one request to the ensemble (the URL's `command_timeout`).
    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Opens a session asking for `requested` as its timeout, within the connect timeout, and
    /// starts the task that watches its state.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-open session; nothing is held on it yet.
    pub(crate) async fn open(config: &ZookeeperConfig, requested: Duration) -> Result<Arc<Self>> {
        let what = "opening a ZooKeeper session";
        let opened = Instant::now();
        // The client gives one connection attempt 2/5 of the requested timeout, which may be
        // short: attempts are repeated (from the first server again) until the connect timeout.
        let deadline = Instant::now() + config.connect_timeout;
        let mut pause = Duration::from_millis(10);
        #[cfg(feature = "tls")]
        let tls = match config.tls {
            true => {
                crate::tls::install_crypto_provider();
                Some(crate::tls::options(config)?)
            }
            false => None,
        };
        // Over TLS, the first failed attempt is followed by one handshake of the store's own,
        // which names a refusal the client reports as a lost connection.
        #[cfg(feature = "tls")]
        let mut probe = config.tls;
        let client = loop {
            let mut connector = zk::Client::connector()
                .with_session_timeout(requested)
                .with_fail_eagerly();
            match (&config.user, config.auth) {
                (Some((user, password)), Auth::Digest) => {
                    connector =
                        connector.with_auth("digest", format!("{user}:{password}").as_bytes());
                }
                (Some((user, password)), Auth::Sasl) => {
                    connector = connector
                        .with_sasl(zk::SaslOptions::digest_md5(user.clone(), password.clone()));
                }
                (None, _) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let connecting = async {
                #[cfg(feature = "tls")]
                if let Some(tls) = &tls {
                    return connector
                        .with_tls(tls.clone())
                        .secure_connect(&config.connect_string())
                        .await;
                }
                connector.connect(&config.connect_string()).await
            };
            match tokio::time::timeout(left, connecting).await {
                Err(_) => return Err(timed_out(what, config.connect_timeout)),
                Ok(Ok(client)) => break client,
                Ok(Err(error)) if is_retryable(&error) && Instant::now() + pause < deadline => {
                    #[cfg(feature = "tls")]
                    if std::mem::take(&mut probe) {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if let Some(refusal) = crate::tls::refusal(config, left).await {
                            return Err(refusal);
                        }
                    }
                    tracing::debug!(%error, "{what}: retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Ok(Err(error)) => return Err(client_error(what, error)),
            }
        };
        let session = Arc::new(Session {
            timeout: client.session_timeout(),
            command_timeout: config.command_timeout,
            leases: Arc::new(SessionLeases::new(client.session_id())),
            last_used: Mutex::new(Instant::now()),
            dropped: CancellationToken::new(),
            heard: Arc::new(Heard::new(opened, config.command_timeout * 2)),
            report: OnceLock::new(),
            client,
        });
        tokio::spawn(watch_state(
            session.leases.clone(),
            session.client.state_watcher(),
            session.dropped.clone(),
            session.timeout,
        ));
        Ok(session)
    }

    /// Starts the session's heartbeat: a read every half of `report` (the longest a follower
    /// may hold the session's activity before its leader hears of it, `Limits::report_delay`),
    /// so that an operation always finds a request answered a little over `report` before it,
    /// which the leader has provably heard of ([`heard_by`](Self::heard_by)).
    pub(crate) fn start_heartbeat(&self, report: Duration) {
        if self.report.set(report).is_err() {
            return;
        }
        tokio::spawn(heartbeat(
            self.client.clone(),
            self.heard.clone(),
            self.dropped.clone(),
            (report / 2).max(Duration::from_millis(1)),
        ));
    }

    /// The latest moment the ensemble's leader provably heard of this session at or after,
    /// for an operation whose forwarded request (a write, a `sync`) was sent after `at` and
    /// answered: a lease confirmed by that operation is valid until this moment plus its TTL,
    /// less the drift. See `heard`.
    pub(crate) fn heard_by(&self, at: Instant) -> Instant {
        let report = self.report.get().copied().unwrap_or(Duration::MAX);
        self.heard.by(at, report)
    }

    /// Marks the session used now.
    pub(crate) fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// How long ago the session was last [`touch`](Self::touch)ed (or opened).
    pub(crate) fn unused_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    /// Whether the session is lost: no lease may be granted on it.
    pub(crate) fn is_ended(&self) -> bool {
        self.leases.is_ended()
    }

    /// Completes once the session is lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn ended(&self) {
        self.leases.ended().await
    }

    /// Whether ZooKeeper ended the session for good (expired, closed, authentication
    /// refused): its nodes are gone or going, and no request on it can succeed.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(
            self.client.state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        )
    }

    /// Runs a request that may be sent again (a read, a `sync`, a watch, a delete of one path,
    /// a create that tolerates `NodeExists`), its error mapped: a connection the client dropped
    /// (it gives up on a server after 2/5 of the session timeout without a byte, 80 ms on a
    /// 200 ms session, which a loaded machine reaches) is retried on the reconnected session
    /// until the command timeout, as long as ZooKeeper has not ended the session.
    ///
    /// A delete retried after its first answer was lost may be answered `NoNode` for a node it
    /// deleted itself: callers read `NoNode` as "gone", never as "deleted by this call".
    ///
    /// # Cancel safety
    /// Each attempt is sent when `request` makes it; dropping the future only stops waiting.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, mut request: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, zk::Error>>,
    {
        let deadline = Instant::now() + self.command_timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            let sent = Instant::now();
            let left = deadline.saturating_duration_since(sent);
            match tokio::time::timeout(left, request()).await {
                Err(_) => return Err(Failure::Other(timed_out(what, self.command_timeout))),
                Ok(Ok(answer)) => {
                    self.heard.answered(sent, Instant::now());
                    return Ok(answer);
                }
                Ok(Err(error))
                    if is_retryable(&error)
                        && !self.is_terminal()
                        && Instant::now() + pause < deadline =>
                {
                    tracing::debug!(%error, "{what}: retrying on the session");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Ok(answer) => return answer.map_err(|error| Failure::of(what, error)),
            }
        }
    }

    /// Runs a request that must not be sent twice (a sequential create), within the command
    /// timeout, its error mapped. A transport error leaves it unknown whether it was applied
    /// ([`Session::unsettled`]).
    ///
    /// # Cancel safety
    /// The request is sent when `request` is made; dropping the future only stops waiting for
    /// its answer.
    pub(crate) async fn call_once<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.command_timeout, request).await {
            Err(_) => Err(Failure::Other(timed_out(what, self.command_timeout))),
            Ok(answer) => answer.map_err(|error| Failure::of(what, error)),
        }
    }

    /// Commits a `multi` within the command timeout; a failed operation keeps its index and
    /// the server's answer.
    ///
    /// # Cancel safety
    /// The request is sent when `request` is made; dropping the future only stops waiting for
    /// its answer (the multi is applied whole or not at all).
    pub(crate) async fn commit(
        &self,
        what: &str,
        request: impl Future<Output = Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>>,
    ) -> Result<Vec<zk::MultiWriteResult>, MultiFailure> {
        match tokio::time::timeout(self.command_timeout, request).await {
            Err(_) => Err(MultiFailure::Other(timed_out(what, self.command_timeout))),
            Ok(Ok(results)) => Ok(results),
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
                Err(MultiFailure::Op(index, source))
            }
            Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                Err(MultiFailure::Other(client_error(what, source)))
            }
        }
    }

    /// Whether a failed request that must not be sent twice may still have been applied: a
    /// transport error on a session ZooKeeper has not ended.
    pub(crate) fn unsettled(&self, error: &Error) -> bool {
        error.is_retryable() && !self.is_terminal()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

/// Reads the root every `period` until the session is dropped or ended, recording each
/// answer in `heard`. A read a follower serves itself: cheap, and enough, since what dates a
/// deadline is a request answered before a forwarded one (`heard`).
async fn heartbeat(
    client: zk::Client,
    heard: Arc<Heard>,
    dropped: CancellationToken,
    period: Duration,
) {
    loop {
        tokio::select! {
            () = dropped.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        if matches!(
            client.state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        ) {
            return;
        }
        let sent = Instant::now();
        if let Ok(Ok(_)) = tokio::time::timeout(period * 4, client.check_stat("/")).await {
            heard.answered(sent, Instant::now());
        }
    }
}

/// A request's failure: the answers callers act on, or the mapped error.
#[derive(Debug)]
pub(crate) enum Failure {
    NoNode,
    NodeExists,
    /// A versioned write found another version (a relabel's compare-and-set).
    BadVersion,
    Other(Error),
}

/// A `multi`'s failure: an operation the server refused (its index and answer), or the
/// mapped error of the request.
#[derive(Debug)]
pub(crate) enum MultiFailure {
    Op(usize, zk::Error),
    Other(Error),
}

impl Failure {
    fn of(what: &str, error: zk::Error) -> Self {
        match error {
            zk::Error::NoNode => Failure::NoNode,
            zk::Error::NodeExists => Failure::NodeExists,
            zk::Error::BadVersion => Failure::BadVersion,
            error => Failure::Other(client_error(what, error)),
        }
    }

    /// The failure as an error, `what` naming the request for the answers callers act on.
    pub(crate) fn into_error(self, what: &str) -> Error {
        match self {
            Failure::Other(error) => error,
            other => Error::store(format!("{what}: unexpected answer {other:?}"), "ZooKeeper"),
        }
    }
}
