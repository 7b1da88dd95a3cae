//! The connection of a `redis+sentinel://` store: the master the sentinels name, confirmed by
//! `ROLE` on the very connection that then carries the commands (Sentinel's client
//! guidelines), and found again after a failover.
//!
//! The redis crate's `sentinel` feature is not used: its lookup has no bound of its own per
//! sentinel and takes the sentinels' answers in order (one hung sentinel stalls it), it checks
//! `ROLE` on a connection of its own and hands back a client that opens another one (the role
//! may change in between), and it reports an unknown master and unreachable sentinels alike as
//! its last error.
//!
//! The master is asked again (one discovery at a time, shared by the commands waiting on it)
//! when a sentinel announces a new one (`+switch-master`, listened to on one sentinel at a
//! time from the first discovery on), after the connection to it fails or is closed (Sentinel
//! closes clients when it demotes or promotes a server), after a command is refused with
//! `READONLY` (the server is a replica now; the command did not run and is sent once more to
//! the master found), and after a command got no answer within the command timeout (a master
//! paused or cut off, which the sentinels may have replaced meanwhile).
//!
//! The announcement matters most: after `SENTINEL FAILOVER`, or a failover while the old
//! master was only cut off, the old master keeps taking writes until the sentinels demote it
//! (seconds later), and a store still writing there would see its writes lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, RedisFuture, Value};
use tokio::time::{timeout, Instant};

use crate::config::SentinelSettings;

/// How long discovery waits before asking again when the server the sentinels name is not a
/// master yet (a failover in progress).
const ASK_AGAIN: Duration = Duration::from_millis(100);

/// The master of a Sentinel deployment, found on first use and again after a failover; clones
/// share it.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    shared: Arc<Shared>,
}

struct Shared {
    settings: SentinelSettings,
    /// The master's connection settings but its address (user, password, database, TLS).
    node: ConnectionInfo,
    connect_timeout: Duration,
    command_timeout: Duration,
    current: Mutex<Option<Current>>,
    /// Held by the one discovery in flight.
    discovery: tokio::sync::Mutex<()>,
    /// Whether the `+switch-master` listener was started.
    listening: std::sync::atomic::AtomicBool,
    /// Counts the connections made, so a failure forgets only the connection it met.
    generation: AtomicU64,
    /// Counts the `+switch-master` announcements for the master: a discovery during which
    /// one came asks again, since the sentinels it asked may have named the old master.
    switches: AtomicU64,
}

#[derive(Clone)]
struct Current {
    conn: MultiplexedConnection,
    info: ConnectionInfo,
    generation: u64,
}

/// What one sentinel said of the master.
enum Named {
    At(String, u16),
    Unknown,
    /// It could not be reached or did not answer in time: worth asking again.
    Failed(String),
    /// It refused this client (credentials, TLS, not a sentinel): asking again cannot help.
    Refused(String),
}

impl SentinelConn {
    pub(crate) fn new(
        settings: SentinelSettings,
        node: ConnectionInfo,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        SentinelConn {
            shared: Arc::new(Shared {
                settings,
                node,
                connect_timeout,
                command_timeout,
                current: Mutex::new(None),
                discovery: tokio::sync::Mutex::new(()),
                listening: std::sync::atomic::AtomicBool::new(false),
                generation: AtomicU64::new(0),
                switches: AtomicU64::new(0),
            }),
        }
    }

    /// A client for the master now (found first if need be), for the pub/sub connection.
    pub(crate) async fn master_client(&self) -> redis::RedisResult<redis::Client> {
        let current = self.current().await?;
        redis::Client::open(current.info)
    }

    /// The connection to the master, found first if there is none.
    async fn current(&self) -> redis::RedisResult<Current> {
        if let Some(current) = self.shared.lock().clone() {
            return Ok(current);
        }
        let _one = self.shared.discovery.lock().await;
        // Another caller may have found it while this one waited.
        if let Some(current) = self.shared.lock().clone() {
            return Ok(current);
        }
        if !self.shared.listening.swap(true, Ordering::SeqCst) {
            tokio::spawn(listen_for_switches(Arc::downgrade(&self.shared)));
        }
        loop {
            let seen = self.shared.switches.load(Ordering::SeqCst);
            let (conn, info) = self.discover().await?;
            // Checked under the lock the announcement takes: a switch announced during the
            // discovery means the sentinels asked may have named the old master.
            let mut slot = self.shared.lock();
            if self.shared.switches.load(Ordering::SeqCst) != seen {
                continue;
            }
            let generation = self.shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
            let current = Current {
                conn,
                info,
                generation,
            };
            *slot = Some(current.clone());
            return Ok(current);
        }
    }

    /// The generation of the connection in use now (0: none), for [`Self::forget`].
    pub(crate) fn generation(&self) -> u64 {
        self.shared.lock().as_ref().map_or(0, |c| c.generation)
    }

    /// Forgets the connection of `generation`, if it is still the current one: the next
    /// command asks the sentinels again.
    pub(crate) fn forget(&self, generation: u64) {
        self.shared.forget_if(|c| c.generation == generation);
    }

    /// Asks the sentinels for the master and connects to it, until it says it is the master
    /// or the connect timeout passed.
    async fn discover(&self) -> redis::RedisResult<(MultiplexedConnection, ConnectionInfo)> {
        let deadline = Instant::now() + self.shared.connect_timeout;
        // The last refusal of a try that finished: a try the deadline cut short only says
        // "timed out", which would hide why the earlier ones were refused.
        let mut earlier = None;
        let said = |refusal, earlier: Option<redis::RedisError>| match earlier {
            Some(earlier) if Instant::now() >= deadline => earlier,
            _ => refusal,
        };
        loop {
            let (host, port) = match self.ask_sentinels(deadline).await {
                Ok(named) => named,
                Err(refusal) => return Err(said(refusal, earlier)),
            };
            let info = self.shared.node.clone().set_addr(with_address(
                self.shared.node.addr(),
                host.clone(),
                port,
            ));
            let refusal = match self.connect_master(&info, deadline).await {
                Ok(conn) => return Ok((conn, info)),
                Err(refusal) => said(refusal, earlier.take()),
            };
            if Instant::now() + ASK_AGAIN >= deadline {
                return Err(refusal);
            }
            earlier = Some(refusal);
            tokio::time::sleep(ASK_AGAIN).await;
        }
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME` on every sentinel at once: the first address named.
    async fn ask_sentinels(&self, deadline: Instant) -> redis::RedisResult<(String, u16)> {
        let settings = &self.shared.settings;
        let mut asked: FuturesUnordered<_> = settings
            .sentinels
            .iter()
            .map(|sentinel| ask(sentinel, &settings.master, deadline))
            .collect();
        let mut unknown = 0;
        let (mut failures, mut refusals) = (Vec::new(), Vec::new());
        while let Some(named) = asked.next().await {
            match named {
                Named::At(host, port) => return Ok((host, port)),
                Named::Unknown => unknown += 1,
                Named::Failed(why) => failures.push(why),
                Named::Refused(why) => refusals.push(why),
            }
        }
        let master = &settings.master;
        if unknown > 0 {
            return Err(redis::RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "unknown master",
                format!(
                    "{unknown} of {} sentinels know no master named {master:?} (check the \
                     name after the hosts in the URL)",
                    settings.sentinels.len()
                ),
            )));
        }
        if failures.is_empty() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "Redis Sentinel",
                format!(
                    "every sentinel refused this client for master {master:?}: {}",
                    refusals.join("; ")
                ),
            )));
        }
        failures.extend(refusals);
        Err(unavailable(format!(
            "no sentinel answered for master {master:?}: {}",
            failures.join("; ")
        )))
    }

    /// A connection to the server at `info` that says `ROLE` master, by `deadline`.
    async fn connect_master(
        &self,
        info: &ConnectionInfo,
        deadline: Instant,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let address = address_of(info);
        let master = &self.shared.settings.master;
        let left = deadline.saturating_duration_since(Instant::now());
        let connected = timeout(left, async {
            let mut conn = connect_within(info, left).await?;
            let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
            Ok::<_, redis::RedisError>((conn, role))
        })
        .await;
        let (conn, role) = match connected {
            Ok(Ok(found)) => found,
            Ok(Err(error)) if !crate::error::is_unavailable(&error) => return Err(error),
            Ok(Err(error)) => {
                return Err(unavailable(format!(
                    "the sentinels name {address} as master {master:?}, which cannot be \
                     reached: {error}"
                )))
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "the sentinels name {address} as master {master:?}, which does not answer \
                     ROLE in time"
                )))
            }
        };
        match first_word(&role).as_deref() {
            Some("master") => Ok(conn),
            other => Err(unavailable(format!(
                "the sentinels name {address} as master {master:?}, but it says ROLE {}",
                other.unwrap_or("(no answer)")
            ))),
        }
    }

    /// Runs `send` on the master's connection under the command timeout; on a sign that the
    /// master moved, forgets the connection, and on `READONLY` sends once more.
    async fn send<'a, T, F>(&'a self, send: F) -> redis::RedisResult<T>
    where
        F: Fn(MultiplexedConnection) -> RedisFuture<'a, T> + 'a,
    {
        let mut again = true;
        loop {
            let current = self.current().await?;
            let mut abandoned = Abandoned::new(self, current.generation);
            let answer = timeout(self.shared.command_timeout, send(current.conn)).await;
            abandoned.disarm();
            let error = match answer {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) => error,
                Err(_) => {
                    self.forget(current.generation);
                    return Err(unavailable(format!(
                        "no answer from the master within {:?}",
                        self.shared.command_timeout
                    )));
                }
            };
            let read_only = error.kind()
                == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                || error.code() == Some("READONLY");
            if read_only || error.is_io_error() || error.is_connection_dropped() {
                self.forget(current.generation);
            }
            if read_only && std::mem::take(&mut again) {
                continue;
            }
            return Err(error);
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets the current connection if `stale` says so of it.
    fn forget_if(&self, stale: impl FnOnce(&Current) -> bool) {
        let mut current = self.lock();
        if current.as_ref().is_some_and(stale) {
            tracing::debug!(
                master = self.settings.master,
                "asking the sentinels for the master again"
            );
            *current = None;
        }
    }
}

/// Listens for `+switch-master` on one sentinel at a time (the next one when a connection
/// fails), and forgets the connection to a master the sentinels replaced. Ends with the last
/// handle.
async fn listen_for_switches(shared: std::sync::Weak<Shared>) {
    let mut next = 0usize;
    loop {
        let (sentinel, bound) = match shared.upgrade() {
            Some(s) => {
                let sentinels = &s.settings.sentinels;
                let sentinel = sentinels[next % sentinels.len().max(1)].clone();
                (sentinel, s.connect_timeout)
            }
            None => return,
        };
        next = next.wrapping_add(1);
        let connected = timeout(bound, async {
            let mut pubsub = redis::Client::open(sentinel)?.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        let Ok(Ok(pubsub)) = connected else {
            tokio::time::sleep(ASK_AGAIN * 5).await;
            continue;
        };
        let mut messages = pubsub.into_on_message();
        // A switch is checked for every time a message comes; the weak handle is upgraded
        // only then, so a listener does not keep a dropped store alive.
        loop {
            let message = tokio::select! {
                message = messages.next() => message,
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if shared.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
            };
            let Some(message) = message else { break };
            let Some(s) = shared.upgrade() else { return };
            let payload: String = message.get_payload().unwrap_or_default();
            // `<name> <old-ip> <old-port> <new-ip> <new-port>`
            let fields: Vec<&str> = payload.split_whitespace().collect();
            if let [name, _, _, ip, port] = fields[..] {
                if name == s.settings.master {
                    let new = format!("{ip}:{port}");
                    let mut slot = s.lock();
                    s.switches.fetch_add(1, Ordering::SeqCst);
                    if slot.as_ref().is_some_and(|c| address_of(&c.info) != new) {
                        tracing::debug!(
                            master = name,
                            "+switch-master: asking the sentinels again"
                        );
                        *slot = None;
                    }
                }
            }
        }
    }
}

/// Forgets the connection when a command on it is dropped unanswered late: the caller's own
/// timer, as long as ours, started before this command was sent (after a discovery, perhaps),
/// so it fires up to that long before the full command timeout has passed here. Half of it
/// tells such a drop from a caller's early cancel; a wrong guess costs one discovery.
struct Abandoned<'a> {
    conn: &'a SentinelConn,
    generation: u64,
    sent: Instant,
    armed: bool,
}

impl<'a> Abandoned<'a> {
    fn new(conn: &'a SentinelConn, generation: u64) -> Self {
        Abandoned {
            conn,
            generation,
            sent: Instant::now(),
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed && self.sent.elapsed() >= self.conn.shared.command_timeout / 2 {
            self.conn.forget(self.generation);
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.send(move |mut conn| Box::pin(async move { conn.req_packed_command(cmd).await }))
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.send(move |mut conn| {
                Box::pin(async move { conn.req_packed_commands(pipeline, offset, count).await })
            })
            .await
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.node.redis_settings().db()
    }
}

/// A connection to `info`, its connect bounded by `left` (the caller bounds what follows).
async fn connect_within(
    info: &ConnectionInfo,
    left: Duration,
) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(left))
        .set_response_timeout(None);
    redis::Client::open(info.clone())?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// What one sentinel says of `master`, by `deadline`.
async fn ask(sentinel: &ConnectionInfo, master: &str, deadline: Instant) -> Named {
    let address = address_of(sentinel);
    let left = deadline.saturating_duration_since(Instant::now());
    let asked = timeout(left, async {
        let mut conn = connect_within(sentinel, left).await?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    })
    .await;
    match asked {
        Ok(Ok(Some((host, port)))) => Named::At(host, port),
        Ok(Ok(None)) => Named::Unknown,
        Ok(Err(error)) if error.to_string().contains("unknown command") => Named::Refused(format!(
            "{address} is not a sentinel (it does not know the SENTINEL command)"
        )),
        Ok(Err(error)) if !crate::error::is_unavailable(&error) => {
            Named::Refused(format!("{address}: {error}"))
        }
        Ok(Err(error)) => Named::Failed(format!("{address}: {error}")),
        Err(_) => Named::Failed(format!("{address}: no answer in time")),
    }
}

/// `addr` moved to `host:port`, TLS settings kept.
fn with_address(addr: &ConnectionAddr, host: String, port: u16) -> ConnectionAddr {
    match addr {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    }
}

/// `host:port` of a TCP address, for messages.
fn address_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => format!("{other:?}"),
    }
}

/// The first element of a `ROLE` reply.
fn first_word(role: &Value) -> Option<String> {
    let Value::Array(fields) = role else {
        return None;
    };
    match fields.first()? {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// A retryable error with `detail`.
fn unavailable(detail: String) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "Redis Sentinel", detail))
}
