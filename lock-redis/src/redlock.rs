//! [`RedlockStore`]: Redlock over N independent Redis masters, with fencing tokens that stay
//! strictly increasing when the granting majority changes.
//!
//! Each node runs the single-node store's scripts ([`acquire_on`], [`release_on`],
//! [`extend_on`], [`evict_on`], [`status_on`]) on its own [`RedisStore`] connection; this file
//! adds the `redlock://` config, the fan-out with quorum counting, and the one script Redlock
//! needs on top: raising a node's fence to the token handed out.
//!
//! The argument for the tokens and its assumptions are in the crate docs (`# Redlock`).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_core::validate::{check_key, check_request, check_wait};
use lock_core::{
    Acquire, Capabilities, Error, Extend, Instant, KeyStatus, Lease, LockStore, OwnerId, Release,
    ReleaseOutcome, Result,
};
use redis::aio::ConnectionManager;
use redis::Script;
use tokio::time::{sleep, sleep_until, timeout};
use url::Url;

use crate::config::{bad_url, parse_bool};
use crate::error::redis_error;
use crate::eviction::{risk_of, EvictionCheck};
use crate::store::{acquire_on, evict_on, extend_on, release_on, status_on, Attempt, KeyNames};
use crate::{RedisConfig, RedisStore, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, WAIT_CAP};
use lock_core::url::parse_timeout;

// ---- Lua ------------------------------------------------------------------------------------

/// Raise: set the fence to ARGV[1] if it is below that, else report the fence. Atomic: the
/// read and the write run as one script, so a concurrent mint is either before (and raised)
/// or after. KEYS[1] is the fence key. Returns 0 if the fence now holds ARGV[1], or the fence
/// it found at or above ARGV[1] (the caller then asks again with more).
pub(crate) const RAISE_LUA: &str = r"
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return 0
end
return fence
";

static RAISE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_LUA));

/// What one node's raise found.
#[derive(Debug, Clone, Copy)]
enum Raise {
    /// The fence was below the token and now holds it.
    Raised,
    /// The fence was already at this value, at or above the token.
    Ahead(u64),
}

/// Raises one node's fence to `token`, unless it is already there or beyond.
async fn raise_on(conn: &mut ConnectionManager, names: &KeyNames, token: u64) -> Result<Raise> {
    let found: i64 = RAISE
        .key(&names.fence)
        .arg(token)
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error("raise", e))?;
    match u64::try_from(found) {
        Ok(0) => Ok(Raise::Raised),
        Ok(fence) => Ok(Raise::Ahead(fence)),
        Err(_) => Err(Error::Store {
            message: format!("raise: the script answered {found}, not a fence"),
            source: None,
        }),
    }
}

/// How many raise rounds one acquisition tries before giving up: each round that finds a
/// fence ahead asks for one more than it, so only concurrent raises can make it take more.
const RAISE_ROUNDS: usize = 8;

// ---- config ---------------------------------------------------------------------------------

/// The default bound on one node's answer: well below any sensible TTL, since a lease's
/// validity shrinks by the time the quorum takes.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);
/// The default clock drift factor: the margin is `ttl × factor + 2 ms`.
pub(crate) const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The default number of retries after a failed round (no quorum, a split vote).
pub(crate) const DEFAULT_RETRY_COUNT: u32 = 3;
/// The default upper bound of the random delay before a retry.
pub(crate) const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);
/// The fewest nodes a Redlock config accepts.
pub(crate) const MIN_NODES: usize = 3;

const OPTIONS: &[&str] = &[
    "prefix",
    "connect_timeout",
    "command_timeout",
    "drift_factor",
    "retry_count",
    "retry_jitter",
    "allow_eviction",
];

/// Where the Redlock nodes are and how the store behaves, from a URL.
///
/// ```text
/// redlock://[[user]:password@]host:port,host:port,host:port[,…][/db][?option=value&…]
/// ```
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `prefix` | `fencelock:` | prepended to every key name, as for `redis://` |
/// | `connect_timeout` | `5s` | bound on opening one node's connection |
/// | `command_timeout` | `250ms` | bound on one node's answer (per-node timeout); a slower node counts as failed for that round |
/// | `drift_factor` | `0.01` | the validity margin is `ttl × drift_factor + 2 ms` (never less than lock-core's 1% + 2 ms); from 0 to 0.5 |
/// | `retry_count` | `3` | retries after a round without a quorum (a split vote, too many nodes failing); at most 100 |
/// | `retry_jitter` | `100ms` | a retry waits a random 1 ms to this long, so contenders fall out of step |
/// | `allow_eviction` | `false` | `true` skips the check that no node can evict a held lock (`maxmemory` with a policy other than `noeviction`), accepting that risk knowingly, as for `redis://` |
///
/// At least three nodes, each `host:port` (port 6379 if omitted), none listed twice; the
/// credentials and database apply to every node. Timeouts read `5`, `5s` or `250ms`. Unknown
/// options are rejected. `Debug` and `Display` never show the password.
#[derive(Clone)]
pub struct RedlockConfig {
    nodes: Vec<RedisConfig>,
    labels: Vec<String>,
    redacted: String,
    drift_factor: f64,
    retry_count: u32,
    retry_jitter: Duration,
}

impl RedlockConfig {
    /// Parses a `redlock://` URL (see the type's docs for the options).
    ///
    /// Fails with [`Error::InvalidInput`] naming `"url"` for another scheme, fewer than three
    /// nodes, a node listed twice, a bad host, port or database, or an unknown or malformed
    /// option. The message never contains the password.
    pub fn from_url(url: &str) -> Result<Self> {
        lock_core::url::check_userinfo_encoded(url)?;
        let Some(rest) = url.strip_prefix("redlock://") else {
            let scheme = url.split_once("://").map_or("(none)", |(s, _)| s);
            return Err(bad_url(format!(
                "the scheme must be redlock://, not {scheme}://"
            )));
        };
        // The host list ends at the path, query or fragment; userinfo ends at its last `@`.
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        // The url crate cannot parse a host list: it parses the rest around one placeholder.
        let shape = Url::parse(&format!("redlock://{userinfo}nodes.invalid{tail}"))
            .map_err(|e| bad_url(format!("not a URL: {e}")))?;
        let shown_userinfo = match (shape.username(), shape.password()) {
            (user, Some(_)) => format!("{user}:***@"),
            _ => userinfo.to_owned(),
        };
        let redacted = format!("redlock://{shown_userinfo}{hosts}{tail}");
        let path = tail.split(['?', '#']).next().unwrap_or("");

        let mut prefix = DEFAULT_PREFIX.to_owned();
        let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        let mut command_timeout = DEFAULT_NODE_TIMEOUT;
        let mut drift_factor = DEFAULT_DRIFT_FACTOR;
        let mut retry_count = DEFAULT_RETRY_COUNT;
        let mut retry_jitter = DEFAULT_RETRY_JITTER;
        let mut allow_eviction = false;
        for (name, value) in shape.query_pairs() {
            match &*name {
                "prefix" => prefix = value.into_owned(),
                "connect_timeout" => connect_timeout = parse_timeout("connect_timeout", &value)?,
                "command_timeout" => command_timeout = parse_timeout("command_timeout", &value)?,
                "drift_factor" => drift_factor = parse_drift_factor(&value)?,
                "retry_count" => retry_count = parse_retry_count(&value)?,
                "retry_jitter" => retry_jitter = parse_timeout("retry_jitter", &value)?,
                "allow_eviction" => allow_eviction = parse_bool("allow_eviction", &value)?,
                unknown => {
                    return Err(bad_url(format!(
                        "unknown option {unknown:?}; redlock:// reads {}",
                        OPTIONS.join(", ")
                    )))
                }
            }
        }

        let mut nodes = Vec::new();
        let mut labels: Vec<String> = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(bad_url(format!(
                    "{redacted}: an empty node in the host list"
                )));
            }
            let node = RedisConfig::from_url(&format!("redis://{userinfo}{host}{path}"))?
                .with_prefix(&prefix)?
                .with_connect_timeout(connect_timeout)
                .with_command_timeout(command_timeout)
                .with_allow_eviction(allow_eviction);
            let label = node_label(&node);
            if labels.contains(&label) {
                return Err(bad_url(format!(
                    "{redacted}: node {label} is listed twice; it would count twice towards the quorum"
                )));
            }
            labels.push(label);
            nodes.push(node);
        }
        if nodes.len() < MIN_NODES {
            return Err(bad_url(format!(
                "{redacted}: Redlock needs at least {MIN_NODES} independent nodes, not {}",
                nodes.len()
            )));
        }
        Ok(RedlockConfig {
            nodes,
            labels,
            redacted,
            drift_factor,
            retry_count,
            retry_jitter,
        })
    }

    /// How many nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Each node as `host:port`, in URL order.
    pub fn nodes(&self) -> &[String] {
        &self.labels
    }

    /// The prefix of every key name this store writes.
    pub fn prefix(&self) -> &str {
        self.nodes[0].prefix()
    }

    /// The bound on opening one node's connection.
    pub fn connect_timeout(&self) -> Duration {
        self.nodes[0].connect_timeout()
    }

    /// The bound on one node's answer.
    pub fn command_timeout(&self) -> Duration {
        self.nodes[0].command_timeout()
    }

    /// Whether the store skips the eviction check on every node.
    pub fn allow_eviction(&self) -> bool {
        self.nodes[0].allow_eviction()
    }

    /// The clock drift factor.
    pub fn drift_factor(&self) -> f64 {
        self.drift_factor
    }

    /// Retries after a round without a quorum.
    pub fn retry_count(&self) -> u32 {
        self.retry_count
    }

    /// The upper bound of the random delay before a retry.
    pub fn retry_jitter(&self) -> Duration {
        self.retry_jitter
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The margin taken off a lease's validity: `ttl × drift_factor + 2 ms`, never less than
    /// lock-core's [`drift`](lock_core::drift).
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor)
            .saturating_add(Duration::from_millis(2))
            .max(lock_core::drift(ttl))
    }
}

fn node_label(node: &RedisConfig) -> String {
    match node.connection.addr() {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

fn parse_drift_factor(value: &str) -> Result<f64> {
    match value.parse::<f64>() {
        Ok(factor) if (0.0..=0.5).contains(&factor) => Ok(factor),
        _ => Err(bad_url(format!(
            "drift_factor must be a number from 0 to 0.5 (such as 0.01), not {value:?}"
        ))),
    }
}

fn parse_retry_count(value: &str) -> Result<u32> {
    match value.parse::<u32>() {
        Ok(count) if count <= 100 => Ok(count),
        _ => Err(bad_url(format!(
            "retry_count must be a whole number from 0 to 100, not {value:?}"
        ))),
    }
}

impl fmt::Display for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("url", &self.redacted)
            .field("nodes", &self.labels)
            .field("prefix", &self.prefix())
            .field("connect_timeout", &self.connect_timeout())
            .field("command_timeout", &self.command_timeout())
            .field("drift_factor", &self.drift_factor)
            .field("retry_count", &self.retry_count)
            .field("retry_jitter", &self.retry_jitter)
            .field("allow_eviction", &self.allow_eviction())
            .finish()
    }
}

impl std::str::FromStr for RedlockConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

// ---- fan-out --------------------------------------------------------------------------------

/// Why a Redlock operation found no quorum: each node's answer or failure, in URL order. It is
/// the `source` of the [`Error::Unavailable`] or [`Error::Store`] such an operation returns;
/// reach it with `std::error::Error::source` and `downcast_ref::<QuorumError>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumError {
    quorum: usize,
    nodes: Vec<(String, String)>,
}

impl QuorumError {
    /// How many nodes had to agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Each node (`host:port`) with what it answered or why it failed.
    pub fn nodes(&self) -> &[(String, String)] {
        &self.nodes
    }
}

impl fmt::Display for QuorumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reasons: Vec<String> = self
            .nodes
            .iter()
            .map(|(node, reason)| format!("{node}: {reason}"))
            .collect();
        write!(
            f,
            "no quorum of {} out of {} nodes ({})",
            self.quorum,
            self.nodes.len(),
            reasons.join("; ")
        )
    }
}

impl std::error::Error for QuorumError {}

/// Each node's answer, `None` for a node that had not answered when the outcome was decided
/// (its request still runs to its own timeout in the background).
type Answers<T> = Vec<Option<Result<T>>>;

fn count<T>(answers: &Answers<T>, pick: impl Fn(&T) -> bool) -> usize {
    answers
        .iter()
        .filter(|a| matches!(a, Some(Ok(value)) if pick(value)))
        .count()
}

/// The first node's eviction refusal among `answers`.
fn evicting<T>(answers: &Answers<T>) -> Option<&crate::EvictionRisk> {
    answers.iter().find_map(|a| match a {
        Some(Err(error)) => risk_of(error),
        _ => None,
    })
}

fn failures<T>(answers: &Answers<T>) -> usize {
    answers.iter().filter(|a| matches!(a, Some(Err(_)))).count()
}

fn answered<T>(answers: &Answers<T>) -> usize {
    answers.iter().filter(|a| a.is_some()).count()
}

/// One gate per node for the requests of one round: the first request holds its node's gate
/// from before its task starts until it is answered, and later ones wait for it.
struct NodeOrder {
    gates: Vec<Arc<tokio::sync::Mutex<()>>>,
}

impl NodeOrder {
    fn new(nodes: usize) -> NodeOrder {
        NodeOrder {
            gates: (0..nodes)
                .map(|_| Arc::new(tokio::sync::Mutex::new(())))
                .collect(),
        }
    }
}

/// Where a request stands in a round's [`NodeOrder`].
#[derive(Clone, Copy)]
enum Turn {
    /// Goes first: takes the gate before its task is spawned.
    First,
    /// Waits for the requests before it on the same node.
    After,
}

// ---- the store ------------------------------------------------------------------------------

/// A lock store over N ≥ 3 independent Redis masters (Redlock), with fencing tokens. See the
/// crate docs (`# Redlock`) for how it works, why its tokens only grow, and what it assumes.
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
        let source: Option<lock_core::BoxError> = Some(Box::new(quorum));
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

    /// The operator's "forget": deletes the lock on `key` on every node (never the fencing
    /// counters, so the next token is still greater) and wakes its waiters. Returns whether a
    /// lock was deleted on any node. The holder finds out at its next extend or release.
    ///
    /// Fails with [`Error::Unavailable`] naming each node's reason when fewer than a quorum
    /// answered; the nodes that did answer have deleted the lock.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lock deleted on some nodes and not others; the
    /// requests already sent still run.
    pub async fn evict(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let names = self.names(key);
        let answers = self
            .fan_out("evict", self.config().command_timeout(), move |mut conn| {
                let names = names.clone();
                async move { evict_on(&mut conn, &names).await }
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

    fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    fn names(&self, key: &str) -> KeyNames {
        KeyNames::new(self.config().prefix(), key)
    }

    /// Starts `op` on every node at once, each in its own task under `bound`.
    fn fan_out<T, F, Fut>(&self, what: &'static str, bound: Duration, op: F) -> FanOut<T>
    where
        T: Send + 'static,
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        self.fan_out_in_order(what, bound, None, op)
    }

    /// [`Self::fan_out`], where each node's request waits for that node's earlier request
    /// in `order` to finish (or time out), so a cleanup never overtakes the grant it undoes
    /// (two tasks waiting on one reconnecting connection are otherwise polled in any order).
    fn fan_out_in_order<T, F, Fut>(
        &self,
        what: &'static str,
        bound: Duration,
        order: Option<(&NodeOrder, Turn)>,
        op: F,
    ) -> FanOut<T>
    where
        T: Send + 'static,
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let pending = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let work = op(node.connection());
                let node = node.clone();
                // Taken here, before the task exists, so whatever comes after waits for it.
                let first = match order {
                    Some((order, Turn::First)) => order.gates[index].clone().try_lock_owned().ok(),
                    _ => None,
                };
                let after = match order {
                    Some((order, Turn::After)) => Some(order.gates[index].clone()),
                    _ => None,
                };
                // A task, so a request already sent runs to its answer (or its timeout) even
                // when the caller stops waiting: a straggler's lock is then released in order.
                let task = tokio::spawn(async move {
                    let _turn = match after {
                        Some(gate) => Some(gate.lock_owned().await),
                        None => first,
                    };
                    // A node is used only once it passed its eviction check (at once after
                    // the first pass); a node that may evict fails every request it gets.
                    let checked_work = async move {
                        node.checked_eviction().await?;
                        work.await
                    };
                    match timeout(bound, checked_work).await {
                        Ok(answer) => answer,
                        Err(_) => Err(Error::Unavailable {
                            message: format!("{what}: no answer within {bound:?}"),
                            source: None,
                        }),
                    }
                });
                Box::pin(async move {
                    let answer = task.await.unwrap_or_else(|e| {
                        Err(Error::Store {
                            message: format!("{what}: the node's task failed: {e}"),
                            source: None,
                        })
                    });
                    (index, answer)
                }) as NodeFuture<T>
            })
            .collect();
        FanOut {
            pending,
            nodes: self.inner.nodes.len(),
        }
    }

    /// Each node's answer or reason, as the typed source of a no-quorum error.
    fn no_quorum<T>(&self, answers: &Answers<T>, show: impl Fn(&T) -> String) -> QuorumError {
        let nodes = self
            .config()
            .nodes()
            .iter()
            .zip(answers)
            .map(|(label, answer)| {
                let reason = match answer {
                    Some(Ok(value)) => show(value),
                    Some(Err(error)) => error.to_string(),
                    None => "no answer yet".to_owned(),
                };
                (label.clone(), reason)
            })
            .collect();
        QuorumError {
            quorum: self.quorum(),
            nodes,
        }
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

    /// `sent_at` moved back by however much the configured drift exceeds lock-core's, so the
    /// lease's deadline (which lock-core computes with its own drift) keeps the larger margin.
    fn deadline_base(&self, sent_at: Instant, ttl: Duration) -> Option<Instant> {
        let extra = self
            .config()
            .drift(ttl)
            .saturating_sub(lock_core::drift(ttl));
        sent_at.checked_sub(extra)
    }

    /// A random delay of 1 ms to `retry_jitter`.
    fn jitter(&self) -> Duration {
        let most = self.config().retry_jitter.as_micros().max(1_001) as u64;
        Duration::from_micros(rand::random_range(1_000..=most))
    }

    /// Raises the fences of a quorum to one token, at least `floor`, and returns it: a quorum
    /// must have had its fence *below* the token, so the token is greater than every token a
    /// quorum raised to before (any two quorums share a node). A node found at or beyond the
    /// token makes the next round ask for one more than the highest fence found.
    async fn raise(&self, names: &KeyNames, floor: u64, bound: Duration) -> Result<u64> {
        let nodes = self.config().node_count();
        let quorum = self.quorum();
        let mut token = floor;
        for _ in 0..RAISE_ROUNDS {
            let raise_names = names.clone();
            let answers = self
                .fan_out("raise", bound, move |mut conn| {
                    let names = raise_names.clone();
                    async move { raise_on(&mut conn, &names, token).await }
                })
                .await_until(|a| {
                    count(a, |r| matches!(r, Raise::Raised)) >= quorum
                        || count(a, |r| matches!(r, Raise::Ahead(_))) > 0
                        || failures(a) > nodes - quorum
                })
                .await;
            if count(&answers, |r| matches!(r, Raise::Raised)) >= quorum {
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
                Some(fence) => token = token.max(fence.saturating_add(1)),
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

    /// One Redlock round: acquire on every node, and if a quorum granted in time, raise a
    /// quorum's fences to the maximum token. Anything short of that is released everywhere.
    async fn round(&self, key: &str, names: &KeyNames, ttl: Duration) -> Round {
        let nodes = self.config().node_count();
        let quorum = self.quorum();
        let owner = OwnerId::random();
        let bound = self.config().command_timeout().min(ttl);
        // Read before the first request is sent: validity counts from here.
        let sent_at = Instant::now();
        let acquire_names = names.clone();
        let order = NodeOrder::new(nodes);
        let answers = self
            .fan_out_in_order(
                "acquire",
                bound,
                Some((&order, Turn::First)),
                move |mut conn| {
                    let names = acquire_names.clone();
                    async move { acquire_on(&mut conn, &names, owner, ttl).await }
                },
            )
            .await_until(|a| {
                let granted = count(a, |x| matches!(x, Attempt::Granted { .. }));
                granted >= quorum || answered(a) - granted > nodes - quorum
            })
            .await;
        let granted = |a: &Attempt| matches!(a, Attempt::Granted { .. });
        let show = |a: &Attempt| match a {
            Attempt::Granted { token } => format!("granted with token {token}"),
            Attempt::Held { .. } => "held by another owner".to_owned(),
        };
        let valid_until = self
            .deadline_base(sent_at, ttl)
            .map(|base| base + ttl.saturating_sub(lock_core::drift(ttl)));

        let outcome = if count(&answers, granted) >= quorum {
            let minted = answers
                .iter()
                .filter_map(|a| match a {
                    Some(Ok(Attempt::Granted { token })) => Some(*token),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            let raised = self.raise(names, minted + 1, bound).await;
            match (raised, valid_until) {
                (Err(error), _) => Err(error),
                (Ok(token), Some(until)) if Instant::now() < until => {
                    let base = self.deadline_base(sent_at, ttl).unwrap_or(sent_at);
                    return Round::Granted(Lease::new(key, owner, token, ttl, base));
                }
                (Ok(_), _) => Err(Error::Unavailable {
                    message: format!(
                        "acquire: the quorum took {:?}, leaving no validity for a TTL of {ttl:?}",
                        sent_at.elapsed()
                    ),
                    source: None,
                }),
            }
        } else {
            Ok(())
        };

        // No lease: release on every node, including those that failed or have not answered
        // (each node's release waits for its acquire, so a late grant is released after it).
        // Wait for the nodes that granted, so our own leftovers do not block the retry.
        let granted_nodes: Vec<usize> = (0..nodes)
            .filter(|i| matches!(answers[*i], Some(Ok(Attempt::Granted { .. }))))
            .collect();
        let release_names = names.clone();
        self.fan_out_in_order(
            "release",
            bound,
            Some((&order, Turn::After)),
            move |mut conn| {
                let names = release_names.clone();
                async move { release_on(&mut conn, &names, owner).await }
            },
        )
        .await_until(|a| granted_nodes.iter().all(|i| a[*i].is_some()))
        .await;

        if let Err(error) = outcome {
            return Round::Failed(error);
        }
        if failures(&answers) > nodes - quorum {
            return Round::Failed(self.unavailable("acquire", &answers, show));
        }
        let held = count(&answers, |a| matches!(a, Attempt::Held { .. }));
        if held >= quorum {
            let expires_in = answers
                .iter()
                .filter_map(|a| match a {
                    Some(Ok(Attempt::Held { expires_in })) => *expires_in,
                    _ => None,
                })
                .min();
            Round::Held { expires_in }
        } else {
            Round::Contended
        }
    }
}

type NodeFuture<T> = std::pin::Pin<Box<dyn Future<Output = (usize, Result<T>)> + Send>>;

/// Requests sent to every node, answered in any order.
struct FanOut<T> {
    pending: FuturesUnordered<NodeFuture<T>>,
    nodes: usize,
}

impl<T> FanOut<T> {
    /// Collects answers until `decided` says the outcome is known or every node answered.
    async fn await_until(mut self, decided: impl Fn(&Answers<T>) -> bool) -> Answers<T> {
        let mut answers: Answers<T> = (0..self.nodes).map(|_| None).collect();
        while let Some((index, answer)) = self.pending.next().await {
            answers[index] = Some(answer);
            if decided(&answers) {
                break;
            }
        }
        answers
    }
}

#[async_trait]
impl Acquire for RedlockStore {
    /// One Redlock acquisition: a round, retried up to `retry_count` times after a random
    /// delay when it found no quorum but no clear holder (a split vote) or too many failed
    /// nodes. [`Error::Busy`] when a quorum of nodes holds the key for others (or contention
    /// outlasted the retries); the retryable [`Error::Unavailable`] naming each node's reason
    /// when no quorum could be reached.
    ///
    /// # Cancel safety
    /// Dropping the future after the requests were sent may leave a lease nobody knows of on
    /// some nodes: it expires at its TTL and blocks the key until then.
    #[tracing::instrument(
        level = "debug",
        name = "try_acquire",
        skip(self),
        fields(store = "redlock"),
        ret(level = "debug"),
        err(level = "debug")
    )]
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        let names = self.names(key);
        let mut retries = self.config().retry_count;
        loop {
            let last = match self.round(key, &names, ttl).await {
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

    /// Rounds until the wait runs out. While a quorum holds the key, the waiter listens on the
    /// key's release channel of every node (each node's store shares one pub/sub connection
    /// per handle) and tries again once a quorum of nodes published a release, when the
    /// holders' TTL runs out, and at least every [`WAIT_CAP`]; after a split vote or failed nodes it retries after a
    /// random delay. More than `retry_count` failed rounds in a row end the wait with the last
    /// error.
    ///
    /// # Cancel safety
    /// As for `try_acquire` while a round is in flight; dropped while waiting, nothing is
    /// held and the subscriptions are given up.
    #[tracing::instrument(
        level = "debug",
        name = "acquire",
        skip(self),
        fields(store = "redlock"),
        ret(level = "debug"),
        err(level = "debug")
    )]
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        check_request(key, ttl, &self.capabilities())?;
        check_wait(wait)?;
        let started = Instant::now();
        let deadline = started + wait;
        let names = self.names(key);
        let timed_out = |now: Instant| Error::WaitTimedOut {
            key: key.to_owned(),
            waited: now - started,
        };
        let quorum = self.quorum();
        let mut failed_rounds = 0;
        let nap = match self.round(key, &names, ttl).await {
            Round::Granted(lease) => return Ok(lease),
            Round::Held { .. } => Duration::ZERO,
            Round::Contended => self.jitter(),
            Round::Failed(error) => {
                failed_rounds += 1;
                if failed_rounds > self.config().retry_count || Instant::now() >= deadline {
                    return Err(error);
                }
                self.jitter()
            }
        };
        if Instant::now() >= deadline {
            return Err(timed_out(Instant::now()));
        }
        let listeners: Vec<_> = self
            .inner
            .nodes
            .iter()
            .map(|node| node.subscriber().listen(&names.channel))
            .collect();
        let confirm = WAIT_CAP.min(deadline.saturating_duration_since(Instant::now()));
        futures_util::future::join_all(listeners.iter().map(|l| l.subscribed(confirm))).await;
        if !nap.is_zero() {
            sleep_until((Instant::now() + nap).min(deadline)).await;
        }
        loop {
            // Registered before the round, so a release during the round is not missed.
            let mut notified: Vec<_> = listeners.iter().map(|l| Box::pin(l.notified())).collect();
            for wake in &mut notified {
                wake.as_mut().enable();
            }
            // Measured before the round: the holders' remaining TTL counts from here.
            let asked = Instant::now();
            let nap = match self.round(key, &names, ttl).await {
                Round::Granted(lease) => return Ok(lease),
                Round::Held { expires_in } => {
                    failed_rounds = 0;
                    // One millisecond past the PTTL, which the server rounds down.
                    expires_in
                        .map_or(WAIT_CAP, |left| left + Duration::from_millis(1))
                        .min(WAIT_CAP)
                }
                Round::Contended => {
                    failed_rounds = 0;
                    self.jitter()
                }
                Round::Failed(error) => {
                    failed_rounds += 1;
                    if failed_rounds > self.config().retry_count || Instant::now() >= deadline {
                        return Err(error);
                    }
                    self.jitter()
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(timed_out(now));
            }
            // Wake once a quorum of nodes published a release: after the first one alone,
            // the others usually still hold the key and the round would split.
            let mut released: FuturesUnordered<_> = notified.into_iter().collect();
            let quorum_released = async {
                for _ in 0..quorum {
                    released.next().await;
                }
            };
            tokio::select! {
                () = quorum_released => {}
                () = sleep_until((asked + nap).max(now).min(deadline)) => {}
            }
        }
    }
}

#[async_trait]
impl Release for RedlockStore {
    /// Compare-and-delete on every node. `Released` once a quorum deleted this owner's lock,
    /// `Lost` once so many nodes did not hold it that it cannot have been held by a quorum,
    /// and the retryable [`Error::Unavailable`] naming each node's reason when too many
    /// nodes failed to tell. Nodes still answering keep their request in flight, so the lock
    /// is deleted there too.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lease held on some nodes until its TTL; calling
    /// release again is safe.
    #[tracing::instrument(
        level = "debug",
        name = "release",
        skip_all,
        fields(store = "redlock", key = lease.key(), token = lease.fencing_token()),
        ret(level = "debug"), err(level = "debug")
    )]
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let (nodes, quorum) = (self.config().node_count(), self.quorum());
        let names = self.names(lease.key());
        let owner = lease.owner();
        let answers = self
            .fan_out(
                "release",
                self.config().command_timeout(),
                move |mut conn| {
                    let names = names.clone();
                    async move { release_on(&mut conn, &names, owner).await }
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
}

#[async_trait]
impl Extend for RedlockStore {
    /// Compare-and-expire on every node; succeeds once a quorum extended within the validity
    /// (`sent_at + ttl − drift`). [`Error::LeaseLost`] once so many nodes no longer hold it
    /// that no quorum can; the retryable [`Error::Unavailable`] otherwise.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease on some nodes; the local
    /// deadline only moves once a quorum's answers are read.
    #[tracing::instrument(
        level = "trace",
        name = "extend",
        skip_all,
        fields(store = "redlock", key = lease.key(), token = lease.fencing_token()),
        err(level = "debug")
    )]
    async fn extend(&self, lease: &Lease) -> Result<()> {
        let (nodes, quorum) = (self.config().node_count(), self.quorum());
        let names = self.names(lease.key());
        let (owner, ttl) = (lease.owner(), lease.ttl());
        let sent_at = Instant::now();
        let answers = self
            .fan_out(
                "extend",
                self.config().command_timeout().min(ttl),
                move |mut conn| {
                    let names = names.clone();
                    async move { extend_on(&mut conn, &names, owner, ttl).await }
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
                if Instant::now() < base + ttl.saturating_sub(lock_core::drift(ttl)) {
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
}

#[async_trait]
impl LockStore for RedlockStore {
    /// Millisecond TTLs, notified waits (each node's pub/sub), no fair queue, and a dead
    /// holder's lock lives until its TTL on every node.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_notified_wait(true)
            .with_frees_on_disconnect(false)
            .with_fair_queue(false)
            .with_ttl_granularity(Duration::from_millis(1))
    }

    /// `Held` when one owner holds the key on a quorum of nodes, with the token a quorum of
    /// them agrees on (else `None`) and the time until fewer than a quorum hold it; `Free`
    /// when a quorum answered and no owner holds a quorum; [`Error::Unavailable`] otherwise.
    ///
    /// # Cancel safety
    /// Read-only; dropping the future loses nothing.
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        check_key(key)?;
        let quorum = self.quorum();
        let names = self.names(key);
        let answers = self
            .fan_out(
                "status",
                self.config().command_timeout(),
                move |mut conn| {
                    let names = names.clone();
                    async move { status_on(&mut conn, &names).await }
                },
            )
            .await_until(|_| false)
            .await;
        let held: Vec<(Option<OwnerId>, Option<u64>, Option<Duration>)> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(KeyStatus::Held {
                    owner,
                    token,
                    remaining,
                })) => Some((*owner, *token, *remaining)),
                _ => None,
            })
            .collect();
        for (owner, _, _) in &held {
            let mine: Vec<_> = held.iter().filter(|(o, _, _)| o == owner).collect();
            if owner.is_none() || mine.len() < quorum {
                continue;
            }
            let token = mine
                .iter()
                .filter_map(|(_, t, _)| *t)
                .find(|t| mine.iter().filter(|(_, u, _)| *u == Some(*t)).count() >= quorum);
            let mut remaining: Vec<Duration> = mine.iter().filter_map(|(_, _, r)| *r).collect();
            remaining.sort_unstable_by(|a, b| b.cmp(a));
            return Ok(KeyStatus::Held {
                owner: *owner,
                token,
                remaining: remaining.get(quorum - 1).copied(),
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

    /// A node of the raise quorum whose fence is already at or beyond the token (another
    /// lease raised it while this one was being granted) makes the token go past that fence:
    /// the token must be taken from below on a quorum, not merely reached.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raise_goes_past_a_fence_already_at_or_beyond_the_token() {
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
        for (fence, expected) in [(1_000u64, 1_001u64), (10u64, 1_002u64)] {
            // Node 1 holds `fence`; node 2 is frozen, so nodes 0 and 1 are the only quorum.
            let mut admin = redis::Client::open(servers[1].url())
                .expect("client")
                .get_multiplexed_async_connection()
                .await
                .expect("admin");
            let current: Option<u64> = redis::cmd("GET")
                .arg(&names.fence)
                .query_async(&mut admin)
                .await
                .expect("GET");
            if current.is_none_or(|c| c < fence) {
                let _: () = redis::cmd("SET")
                    .arg(&names.fence)
                    .arg(fence)
                    .query_async(&mut admin)
                    .await
                    .expect("SET");
            }
            servers[2].pause().expect("SIGSTOP");
            let token = store
                .raise(&names, 10, Duration::from_secs(1))
                .await
                .expect("raise with a quorum up");
            servers[2].resume().expect("SIGCONT");
            // The first time node 1 is at 1000, ahead of 10; the second time it is at 1001
            // (raised by the first), so 10 must again go past it.
            assert_eq!(token, expected, "fence {fence}");
        }
    }

    fn rule(url: &str) -> String {
        match RedlockConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_defaults_and_options() {
        let config = RedlockConfig::from_url("redlock://127.0.0.1:7001,127.0.0.1:7002,h3").unwrap();
        assert_eq!(
            config.nodes(),
            ["127.0.0.1:7001", "127.0.0.1:7002", "h3:6379"]
        );
        assert_eq!(config.quorum(), 2);
        assert_eq!(config.prefix(), DEFAULT_PREFIX);
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.command_timeout(), DEFAULT_NODE_TIMEOUT);
        assert_eq!(config.drift_factor(), DEFAULT_DRIFT_FACTOR);
        assert_eq!(config.retry_count(), DEFAULT_RETRY_COUNT);
        assert_eq!(config.retry_jitter(), DEFAULT_RETRY_JITTER);
        assert!(
            !config.allow_eviction(),
            "the eviction check is on by default"
        );

        let config = RedlockConfig::from_url(
            "redlock://app:p%40ss@a:1,b:2,c:3,d:4,e:5/3?prefix=billing%3A&connect_timeout=2&command_timeout=50ms&drift_factor=0.05&retry_count=0&retry_jitter=20ms&allow_eviction=true",
        )
        .unwrap();
        assert!(config.allow_eviction());
        assert_eq!(config.node_count(), 5);
        assert_eq!(config.quorum(), 3);
        assert_eq!(config.prefix(), "billing:");
        assert_eq!(config.connect_timeout(), Duration::from_secs(2));
        assert_eq!(config.command_timeout(), Duration::from_millis(50));
        assert_eq!(config.drift_factor(), 0.05);
        assert_eq!(config.retry_count(), 0);
        assert_eq!(config.retry_jitter(), Duration::from_millis(20));
        for node in &config.nodes {
            let settings = node.connection.redis_settings();
            assert_eq!(settings.db(), 3);
            assert_eq!(settings.username(), Some("app"));
            assert_eq!(settings.password(), Some("p@ss"));
            assert_eq!(node.prefix(), "billing:");
            assert_eq!(node.command_timeout(), Duration::from_millis(50));
            assert!(
                node.allow_eviction(),
                "allow_eviction applies to every node"
            );
        }
        let config: RedlockConfig = "redlock://a,b,c?drift_factor=0".parse().unwrap();
        assert_eq!(
            config.drift(Duration::from_secs(10)),
            lock_core::drift(Duration::from_secs(10)),
            "never less than lock-core's margin"
        );
        let config: RedlockConfig = "redlock://a,b,c?drift_factor=0.1".parse().unwrap();
        assert_eq!(
            config.drift(Duration::from_secs(10)),
            Duration::from_millis(1002)
        );
    }

    #[test]
    fn passwords_never_print() {
        let config =
            RedlockConfig::from_url("redlock://user:s3cr%40t@a:1,b:2,c:3/2?prefix=p").unwrap();
        for shown in [
            config.to_string(),
            format!("{config:?}"),
            config.redacted().to_owned(),
        ] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert_eq!(
            config.to_string(),
            "redlock://user:***@a:1,b:2,c:3/2?prefix=p"
        );
        for url in [
            "redlock://user:s3cret@a,b,c?prefx=x",
            "redlock://user:s3cret@a,b/0",
            "redlock://user:s3cret@a,b,c/x",
            "redlock://user:s3cret@a,b,a",
            "redlock://user:s3cret@a,b,c?retry_count=x",
        ] {
            let message = rule(url);
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("redis://a,b,c").contains("redlock://"));
        assert!(rule("redlock://a:1,b:2").contains("at least 3"));
        assert!(rule("redlock://a,b,,c").contains("empty node"));
        assert!(rule("redlock://a:1,b,a:1").contains("listed twice"));
        assert!(rule("redlock://a,b,c?prefx=x").contains("unknown option \"prefx\""));
        assert!(rule("redlock://a,b,c?prefx=x").contains(
            "prefix, connect_timeout, command_timeout, drift_factor, retry_count, retry_jitter"
        ));
        assert!(rule("redlock://a,b,c?drift_factor=0.6").contains("drift_factor"));
        assert!(rule("redlock://a,b,c?drift_factor=-1").contains("drift_factor"));
        assert!(rule("redlock://a,b,c?retry_count=-1").contains("retry_count"));
        assert!(rule("redlock://a,b,c?retry_count=1000").contains("retry_count"));
        assert!(rule("redlock://a,b,c?retry_jitter=0").contains("retry_jitter"));
        assert!(rule("redlock://a,b,c?allow_eviction=1").contains("allow_eviction"));
        assert!(rule("redlock://a,b,c?command_timeout=soon").contains("command_timeout"));
        assert!(rule("redlock://a,b,c?prefix=%7B").contains("prefix"));
        assert!(rule("redlock://a,b,c/x").contains("database number"));
        assert!(rule("redlock://a,b:notaport,c").contains("URL"));
    }
}
