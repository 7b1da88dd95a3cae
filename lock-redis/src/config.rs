//! [`RedisConfig`]: where the server is and how the store names its keys, from a URL.
//!
//! The parsing pieces (timeouts, credentials, redaction, one node's connection info) are
//! `pub(crate)` so the `redlock://` parser builds each of its nodes the same way.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fencelock_core::raw::url::{parse_window, read_options, redact, OptionDoc, UrlOption};
use fencelock_core::{
    limits::MAX_TTL,
    raw::validate::{check_retention, DEFAULT_RETENTION},
};
use fencelock_core::{Error, Result};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use url::Url;

/// `redis://`: one server.
pub(crate) const REDIS_SCHEME: &str = "redis";
/// `rediss://`: one server over TLS (crate feature `tls`).
pub(crate) const REDIS_TLS_SCHEME: &str = "rediss";
/// `redis+cluster://`: a Redis Cluster.
const REDIS_CLUSTER_SCHEME: &str = "redis+cluster";
/// `redis+sentinel://`: the master a Redis Sentinel deployment names.
const REDIS_SENTINEL_SCHEME: &str = "redis+sentinel";
/// `rediss+sentinel://`: the same over TLS, to the sentinels and to the master (crate feature
/// `tls`).
const REDIS_SENTINEL_TLS_SCHEME: &str = "rediss+sentinel";
/// The port of a sentinel that the URL does not give one.
const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// The URL schemes of one Redis server: its descriptor's, and the ones
/// [`RedisConfig::from_url`] accepts for one server.
pub const REDIS_URL_SCHEMES: &[&str] = &[REDIS_SCHEME, REDIS_TLS_SCHEME];
/// The URL schemes of a Redis Cluster: its descriptor's, and the one
/// [`RedisConfig::from_url`] accepts for a Cluster.
pub const REDIS_CLUSTER_URL_SCHEMES: &[&str] = &[REDIS_CLUSTER_SCHEME];
/// The URL schemes of a Redis Sentinel deployment: its descriptor's, and the one
/// [`RedisConfig::from_url`] accepts for Sentinel.
pub const REDIS_SENTINEL_URL_SCHEMES: &[&str] = &[REDIS_SENTINEL_SCHEME, REDIS_SENTINEL_TLS_SCHEME];
/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "fencelock:";
/// The default bound on opening a connection (TCP connect and handshake).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on one command's round trip.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;
/// TTLs travel as whole milliseconds (`PX`, `PEXPIRE`), rounded up; the bounds are
/// fencelock-core's ([`fencelock_core::limits::MIN_TTL`] to [`fencelock_core::limits::MAX_TTL`]).
pub(crate) const TTL_GRANULARITY: Duration = Duration::from_millis(1);

/// The default bound on the replicas' acknowledgement (`WAIT`) when `min_replicas` is set.
pub(crate) const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_millis(500);

/// A Redis Cluster's seed nodes.
#[derive(Clone)]
pub(crate) struct ClusterSettings {
    /// The seed nodes, in URL order.
    pub(crate) nodes: Vec<ConnectionInfo>,
}

/// The sentinels of a Redis Sentinel deployment and the name they know the master by.
#[derive(Clone)]
pub(crate) struct SentinelSettings {
    /// The sentinels, in URL order, with their own credentials.
    pub(crate) sentinels: Vec<ConnectionInfo>,
    /// The master's name (`sentinel monitor NAME …`).
    pub(crate) master: String,
}

/// How a lock is named in Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// `layout=fencelock`, the default: the lock is `{prefix}{{key}}:lock`, next to its fence
    /// and release channel under one Cluster hash tag.
    #[default]
    Fencelock,
    /// `layout=plain`: the lock is exactly `key`, holding the owner id, taken by `SET NX PX` and
    /// released by compare-and-delete, as redis-py's `Lock`, redsync, node-redlock and most
    /// single-node clients do, so they and fencelock exclude each other on the same key. The
    /// fence and the channel keep fencelock's names (the prefix applies only to them). See the
    /// crate docs, `# Next to other Redis lock clients`.
    Plain,
}

impl Layout {
    /// The name in the URL's `layout=` option.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Fencelock => "fencelock",
            Layout::Plain => "plain",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to reach one Redis server and where the store keeps its keys.
///
/// Built from a URL by [`RedisConfig::from_url`]:
///
/// ```text
/// redis[s]://[[user]:password@]host[:port][/db][?option=value&…]
/// ```
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `prefix` | `fencelock:` | prepended to every key name; at most 256 bytes, no `{` or `}` (they would move the Cluster hash tag) |
/// | `layout` | `fencelock` | `plain`: the lock is exactly the key, as `SET NX PX` clients (redis-py's `Lock`, redsync, node-redlock) name it, so they and fencelock exclude each other; single server only (see [`Layout`]) |
/// | `connect_timeout` | `5s` | bound on opening a connection: `10` (seconds), `2s` or `250ms`; never zero |
/// | `command_timeout` | `5s` | bound on one command's round trip; past it the call fails with the retryable [`Error::Unavailable`] |
/// | `allow_eviction` | `false` | `true` skips the check that the server cannot evict a held lock (`maxmemory` set with a policy other than `noeviction`), accepting that risk knowingly; see the crate docs (`# Eviction`) |
/// | `retention` | `7d` | a key's fence expires this long after its last acquire (`ms`, `s`, `m`, `h`, `d`); must exceed `max_ttl`; see the crate docs (`# Per-key state`) |
/// | `max_ttl` | `24h` | the longest TTL this handle grants (at most 24 h) |
/// | `tls_ca` | the system's roots | `rediss://` and `rediss+sentinel://` only: a PEM file of the CA certificates that may sign the server's certificate |
/// | `tls_cert`, `tls_key` | none | `rediss://` and `rediss+sentinel://` only, both or neither: PEM files of the client certificate and its key, for a server that requires one (`tls-auth-clients yes`) |
/// | `min_replicas` | `0` | `redis+cluster://` and `redis+sentinel://` only: replicas that must acknowledge an acquire or extend (`WAIT`) before it counts, 0 to 16; see the crate docs (*Redis Cluster*) |
/// | `replica_timeout` | `500ms` | `redis+cluster://` and `redis+sentinel://` only: bound on that acknowledgement, below `command_timeout` |
/// | `sentinel_user` | none | `redis+sentinel://` only: the user the sentinels are asked as (their own ACL) |
/// | `sentinel_password` | none | `redis+sentinel://` only: the sentinels' own password (`requirepass` on the sentinels); never printed |
///
/// The port defaults to 6379 and the database to 0. `rediss://` (TLS) needs the crate feature
/// `tls`. Unknown options are rejected. `Debug` and `Display` never show the password.
///
/// A Redis Cluster is `redis+cluster://[[user]:password@]host:port[,host:port…][?…]` (the seed
/// nodes), and the master of a Redis Sentinel deployment
/// `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/MASTER[/db][?…]` (the
/// sentinels, port 26379 unless given, and the name they know the master by; the user and
/// password are the master's; `rediss+sentinel://` for TLS to the sentinels and the master):
/// see the crate docs, *Redis Cluster* and *Redis Sentinel*.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) connection: ConnectionInfo,
    redacted: String,
    pub(crate) prefix: String,
    pub(crate) layout: Layout,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) allow_eviction: bool,
    pub(crate) retention: Duration,
    pub(crate) max_ttl: Duration,
    /// `Some` for `redis+cluster://`.
    pub(crate) cluster: Option<ClusterSettings>,
    /// `Some` for `redis+sentinel://`.
    pub(crate) sentinel: Option<SentinelSettings>,
    /// How many replicas must acknowledge an acquire (`WAIT`) before its lease is handed out
    /// (Cluster and Sentinel only).
    pub(crate) min_replicas: u32,
    /// How long that acknowledgement may take.
    pub(crate) replica_timeout: Duration,
}

impl RedisConfig {
    /// Parses a `redis://`, `rediss://`, `redis+cluster://` or `redis+sentinel://` URL (see the
    /// type's docs for the options).
    ///
    /// Fails with [`Error::InvalidInput`] naming `"url"` for a malformed URL, another scheme,
    /// a bad database number, an unknown or malformed option, or `rediss://` without the `tls`
    /// feature. The message never contains the password.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for any URL this parser refuses,
    /// as above (a TLS file that cannot be read or used included).
    pub fn from_url(url: &str) -> Result<Self> {
        fencelock_core::raw::url::check_userinfo_encoded(url)?;
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        if scheme.eq_ignore_ascii_case(REDIS_CLUSTER_SCHEME) {
            return Self::from_cluster_url(url);
        }
        if scheme.eq_ignore_ascii_case(REDIS_SENTINEL_SCHEME) {
            return Self::from_sentinel_url(url, false);
        }
        if scheme.eq_ignore_ascii_case(REDIS_SENTINEL_TLS_SCHEME) {
            return Self::from_sentinel_url(url, true);
        }
        if scheme.eq_ignore_ascii_case("rediss+cluster") {
            return Err(bad_url(
                "rediss+cluster:// (a Redis Cluster over TLS) is not supported yet".into(),
            ));
        }
        Self::parse(url, Topology::Single)
    }

    /// `redis+cluster://[[user]:password@]host:port[,host:port…][?option=value&…]`: the seed
    /// nodes, parsed one by one as `redis://` nodes, with the options of the first.
    fn from_cluster_url(url: &str) -> Result<Self> {
        let list = HostList::split(url, "node")?;
        let seeds = list.urls()?;
        let shape = format!(
            "{REDIS_SCHEME}://{}{}{}",
            list.userinfo,
            list.first(),
            list.tail
        );
        let mut config = Self::parse(&shape, Topology::Cluster(seeds))?;
        config.redacted = list.redacted();
        config.check()?;
        if config.connection.redis_settings().db() != 0 {
            return Err(bad_url("a Redis Cluster has only database 0".into()));
        }
        Ok(config)
    }

    /// `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/MASTER[/db][?option=value&…]`:
    /// the sentinels (port 26379 unless given), the master's name, and the options; the user
    /// and password are the master's, the sentinels' own are options. With `tls`
    /// (`rediss+sentinel://`) both the sentinels and the master are reached over TLS, with the
    /// same TLS options.
    fn from_sentinel_url(url: &str, tls: bool) -> Result<Self> {
        let list = HostList::split(url, "sentinel")?;
        let (path, query) = match list.tail.find(['?', '#']) {
            Some(at) => list.tail.split_at(at),
            None => (list.tail, ""),
        };
        let mut segments = path.trim_start_matches('/').splitn(2, '/');
        let master = segments.next().unwrap_or_default();
        if master.is_empty() {
            return Err(bad_url(
                "redis+sentinel:// needs the master's name after the hosts \
                 (redis+sentinel://host:26379/NAME)"
                    .into(),
            ));
        }
        let master = fencelock_core::raw::url::percent_decode(master).ok_or_else(|| {
            bad_url("the master's name is not valid percent-encoded UTF-8".into())
        })?;
        let db = segments
            .next()
            .map(|db| format!("/{db}"))
            .unwrap_or_default();
        let single = if tls { REDIS_TLS_SCHEME } else { REDIS_SCHEME };
        let shape = format!("{single}://{}{}{db}{query}", list.userinfo, list.first());
        let mut config = Self::parse(&shape, Topology::Sentinel(list.urls()?, master))?;
        config.redacted = list.redacted();
        config.check()?;
        Ok(config)
    }

    fn parse(url: &str, topology: Topology) -> Result<Self> {
        let parsed = Url::parse(url).map_err(|e| bad_url(format!("not a URL: {e}")))?;
        let tls = match parsed.scheme() {
            REDIS_SCHEME => false,
            REDIS_TLS_SCHEME => true,
            other => {
                return Err(bad_url(format!(
                    "the scheme must be redis://, rediss://, redis+cluster:// or \
                     redis+sentinel://, not {other}://"
                )))
            }
        };
        let redacted = redact(parsed.as_str());
        check_tls(tls)?;
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad_url(format!("{redacted}: no host")))?;
        // `[::1]` comes back with its brackets; the socket address wants the bare address.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let (user, password) = credentials(&parsed)?;
        let db = parse_db(parsed.path(), &redacted)?;

        let config = RedisConfig {
            connection: node_info(
                host,
                parsed.port().unwrap_or(6379),
                user.as_deref(),
                password.as_deref(),
                db,
                tls,
            )?,
            redacted,
            prefix: DEFAULT_PREFIX.to_owned(),
            layout: Layout::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            allow_eviction: false,
            retention: DEFAULT_RETENTION,
            max_ttl: MAX_TTL,
            cluster: None,
            sentinel: None,
            min_replicas: 0,
            replica_timeout: DEFAULT_REPLICA_TIMEOUT,
        };
        let mut parsing = Parsing {
            config,
            tls_files: TlsFiles::default(),
            sentinel_user: None,
            sentinel_password: None,
        };
        read_options(
            parsed.query_pairs(),
            &options(topology.kind()),
            &mut parsing,
            |_, _, _| false,
            "",
        )?;
        let Parsing {
            mut config,
            tls_files,
            sentinel_user,
            sentinel_password,
        } = parsing;
        check_retention(config.retention, config.max_ttl)?;
        config.connection = tls_files.apply(config.connection, tls)?;
        match topology {
            Topology::Single => {}
            Topology::Cluster(seeds) => {
                let (user, password) = (user.as_deref(), password.as_deref());
                let nodes = hosts_info(&seeds, 6379, user, password, tls, &tls_files)?;
                config.cluster = Some(ClusterSettings { nodes });
            }
            Topology::Sentinel(hosts, master) => {
                let (user, password) = (sentinel_user.as_deref(), sentinel_password.as_deref());
                let sentinels = hosts_info(
                    &hosts,
                    DEFAULT_SENTINEL_PORT,
                    user,
                    password,
                    tls,
                    &tls_files,
                )?;
                config.sentinel = Some(SentinelSettings { sentinels, master });
            }
        }
        Ok(config)
    }

    /// Whether this config names a Redis Cluster (`redis+cluster://`).
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// The master's name, if this config names a Redis Sentinel deployment
    /// (`redis+sentinel://`).
    pub fn sentinel_master(&self) -> Option<&str> {
        self.sentinel.as_ref().map(|s| s.master.as_str())
    }

    /// How many replicas must acknowledge an acquire before its lease is handed out
    /// (`min_replicas`; 0, the default, and always on one server: no acknowledgement).
    pub fn min_replicas(&self) -> u32 {
        self.min_replicas
    }

    /// How long the replicas' acknowledgement may take (`replica_timeout`).
    pub fn replica_timeout(&self) -> Duration {
        self.replica_timeout
    }

    /// The shortest TTL a request may ask for beyond fencelock-core's minimum: with
    /// `min_replicas`, twice `replica_timeout`, since the acknowledgement (`WAIT`) may take up
    /// to `replica_timeout` after the grant and a shorter lease could be expired on arrival.
    pub(crate) fn acknowledged_min_ttl(&self) -> Option<Duration> {
        (self.min_replicas() > 0).then(|| self.replica_timeout().saturating_mul(2))
    }

    /// Refuses a request whose TTL is below [`Self::acknowledged_min_ttl`] with
    /// [`Error::InvalidInput`] on the `"ttl"`, naming the rule.
    pub(crate) fn check_acknowledged_ttl(&self, ttl: Duration) -> Result<()> {
        match self.acknowledged_min_ttl() {
            Some(least) if ttl < least => Err(Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} is below twice replica_timeout ({least:?}): with min_replicas the \
                     replicas' acknowledgement (WAIT) may take up to replica_timeout ({:?}) \
                     after the grant, and the lease would be expired on arrival",
                    self.replica_timeout()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The prefix of every key name this store writes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How locks are named in Redis.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The rules across settings, checked when the URL is read and again by `connect` and
    /// `connect_lazy`, since a builder (`with_layout`, `with_command_timeout`) may break one
    /// afterwards: on a Cluster, no plain layout, and the replicas' acknowledgement bounded
    /// below one command.
    pub(crate) fn check(&self) -> Result<()> {
        if self.cluster.is_none() && self.sentinel.is_none() {
            return Ok(());
        }
        if self.cluster.is_some() && self.layout == Layout::Plain {
            return Err(bad_url(
                "layout=plain is for one server: on a Cluster the plain lock key and the fence \
                 would hash to different slots"
                    .into(),
            ));
        }
        if self.replica_timeout >= self.command_timeout {
            return Err(bad_url(format!(
                "replica_timeout ({:?}) must be below command_timeout ({:?}): the \
                 acknowledgement runs within one command",
                self.replica_timeout, self.command_timeout
            )));
        }
        Ok(())
    }

    /// Sets the layout (the `layout` option). On a Cluster the plain layout is refused by
    /// `connect` and `connect_lazy`.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The bound on opening a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The bound on one command's round trip.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Whether the store skips the eviction check, accepting that Redis may evict a held lock.
    pub fn allow_eviction(&self) -> bool {
        self.allow_eviction
    }

    /// Sets the `allow_eviction` option.
    pub fn with_allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// How long a key's fence outlives its last acquire.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The longest TTL this handle grants.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// Sets the retention window and the longest TTL together (the `retention` and `max_ttl`
    /// options): fails with [`Error::InvalidInput`] unless `max_ttl` is at most 24 h and
    /// `retention` exceeds it.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a `max_ttl` of zero or above
    /// 24 h, or a `retention` not above it.
    pub fn with_retention(mut self, retention: Duration, max_ttl: Duration) -> Result<Self> {
        if max_ttl.is_zero() || max_ttl > MAX_TTL {
            return Err(bad_url(format!(
                "max_ttl must be above zero and at most {MAX_TTL:?}, not {max_ttl:?}"
            )));
        }
        check_retention(retention, max_ttl)?;
        self.retention = retention;
        self.max_ttl = max_ttl;
        Ok(self)
    }

    /// Sets the key prefix (same rules as the `prefix` option).
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a prefix the `prefix` option
    /// refuses.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        self.prefix = check_prefix(prefix)?;
        Ok(self)
    }

    /// Sets the bound on opening a connection.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the bound on one command's round trip. On a Cluster, one at or below
    /// `replica_timeout` is refused by `connect` and `connect_lazy`.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted)
            .field("prefix", &self.prefix)
            .field("layout", &self.layout)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("allow_eviction", &self.allow_eviction)
            .field("retention", &self.retention)
            .field("max_ttl", &self.max_ttl)
            .field("min_replicas", &self.min_replicas())
            .finish()
    }
}

impl FromStr for RedisConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

pub(crate) fn bad_url(rule: String) -> Error {
    Error::invalid("url", rule)
}

/// A URL being read: the config it makes, the TLS files it names and, for
/// `redis+sentinel://`, the sentinels' own credentials.
#[derive(Debug)]
struct Parsing {
    config: RedisConfig,
    tls_files: TlsFiles,
    sentinel_user: Option<String>,
    sentinel_password: Option<String>,
}

/// What a URL names besides its first host.
enum Topology {
    /// One server.
    Single,
    /// A Cluster's seed nodes.
    Cluster(Vec<Url>),
    /// The sentinels and the master's name.
    Sentinel(Vec<Url>, String),
}

/// Which options a URL reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Single,
    Cluster,
    Sentinel,
}

impl Topology {
    fn kind(&self) -> Kind {
        match self {
            Topology::Single => Kind::Single,
            Topology::Cluster(_) => Kind::Cluster,
            Topology::Sentinel(..) => Kind::Sentinel,
        }
    }
}

/// Every URL option `redis://` reads, and those of `redis+cluster://` or `redis+sentinel://`.
fn options(kind: Kind) -> Vec<UrlOption<Parsing>> {
    let mut options = vec![
        UrlOption::new(
            "prefix",
            DEFAULT_PREFIX,
            "prepended to every key name; at most 256 bytes, no `{` or `}`",
            |p: &mut Parsing, v| {
                p.config.prefix = check_prefix(v)?;
                Ok(())
            },
        ),
        UrlOption::new(
            "layout",
            "fencelock",
            "`plain`: the lock is exactly the key, as `SET NX PX` clients name it",
            |p: &mut Parsing, v| {
                p.config.layout = match v {
                    "fencelock" => Layout::Fencelock,
                    "plain" => Layout::Plain,
                    other => {
                        return Err(bad_url(format!(
                            "layout must be fencelock or plain, not {other:?}"
                        )))
                    }
                };
                Ok(())
            },
        ),
        UrlOption::timeout(
            "connect_timeout",
            "5s",
            "bound on opening a connection",
            |p: &mut Parsing| &mut p.config.connect_timeout,
        ),
        UrlOption::timeout(
            "command_timeout",
            "5s",
            "bound on one command's round trip",
            |p: &mut Parsing| &mut p.config.command_timeout,
        ),
        UrlOption::flag(
            "allow_eviction",
            "false",
            "`true` skips the check that the server cannot evict a held lock",
            |p: &mut Parsing| &mut p.config.allow_eviction,
        ),
        UrlOption::window(
            "retention",
            "7d",
            "a key's fence expires this long after its last acquire",
            |p: &mut Parsing| &mut p.config.retention,
        ),
        UrlOption::new(
            "max_ttl",
            "24h",
            "the longest TTL this handle grants (at most 24 h)",
            |p: &mut Parsing, v| {
                p.config.max_ttl = parse_max_ttl(v)?;
                Ok(())
            },
        ),
    ];
    options.extend(TlsFiles::declared());
    if kind == Kind::Sentinel {
        options.extend([
            UrlOption::new(
                "sentinel_user",
                "",
                "the user the sentinels are asked as (their own ACL)",
                |p: &mut Parsing, v| {
                    p.sentinel_user = Some(v.to_owned());
                    Ok(())
                },
            ),
            UrlOption::new(
                "sentinel_password",
                "",
                "the sentinels' own password (`requirepass` on the sentinels)",
                |p: &mut Parsing, v| {
                    p.sentinel_password = Some(v.to_owned());
                    Ok(())
                },
            ),
        ]);
    }
    if kind != Kind::Single {
        options.extend([
            UrlOption::new(
                "min_replicas",
                "0",
                "replicas that must acknowledge an acquire (`WAIT`) before it is handed out",
                |p: &mut Parsing, v| {
                    p.config.min_replicas =
                        v.parse().ok().filter(|n| *n <= 16).ok_or_else(|| {
                            bad_url(format!(
                                "min_replicas must be a whole number from 0 to 16, not {v:?}"
                            ))
                        })?;
                    Ok(())
                },
            ),
            UrlOption::timeout(
                "replica_timeout",
                "500ms",
                "bound on the replicas' acknowledgement",
                |p: &mut Parsing| &mut p.config.replica_timeout,
            ),
        ]);
    }
    options
}

/// What `redis://` reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options(Kind::Single)
        .iter()
        .map(UrlOption::describe)
        .collect()
}

/// What `redis+cluster://` reads, for the store's descriptor.
pub(crate) fn cluster_option_docs() -> Vec<OptionDoc> {
    options(Kind::Cluster)
        .iter()
        .map(UrlOption::describe)
        .collect()
}

/// What `redis+sentinel://` reads, for the store's descriptor.
pub(crate) fn sentinel_option_docs() -> Vec<OptionDoc> {
    options(Kind::Sentinel)
        .iter()
        .map(UrlOption::describe)
        .collect()
}

/// The `max_ttl` option: a window of at most fencelock-core's 24 h.
pub(crate) fn parse_max_ttl(value: &str) -> Result<Duration> {
    let max_ttl = parse_window("max_ttl", value)?;
    if max_ttl > MAX_TTL {
        return Err(bad_url(format!(
            "max_ttl must be at most 24h, not {value:?}"
        )));
    }
    Ok(max_ttl)
}

/// `rediss://` is only accepted when the TLS code is compiled in.
pub(crate) fn check_tls(tls: bool) -> Result<()> {
    if tls && !cfg!(feature = "tls") {
        return Err(bad_url(
            "rediss:// (TLS) needs fencelock-redis's `tls` feature".into(),
        ));
    }
    Ok(())
}

/// The percent-decoded user name and password of `url`, each `None` when absent or empty.
pub(crate) fn credentials(url: &Url) -> Result<(Option<String>, Option<String>)> {
    let decode = |what: &str, raw: &str| {
        fencelock_core::raw::url::percent_decode(raw)
            .ok_or_else(|| bad_url(format!("the {what} is not valid percent-encoded UTF-8")))
    };
    let user = match url.username() {
        "" => None,
        raw => Some(decode("user name", raw)?),
    };
    let password = match url.password() {
        None | Some("") => None,
        Some(raw) => Some(decode("password", raw)?),
    };
    Ok((user, password))
}

/// A URL's parse state that holds [`TlsFiles`].
pub(crate) trait TlsHolder {
    /// Where the TLS options go.
    fn tls_files(&mut self) -> &mut TlsFiles;
}

impl TlsHolder for Parsing {
    fn tls_files(&mut self) -> &mut TlsFiles {
        &mut self.tls_files
    }
}

/// The `tls_ca`, `tls_cert` and `tls_key` options: file paths, read when the config is built
/// so a missing file fails at parse time, naming the option (file contents are never shown).
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<String>,
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
}

impl TlsFiles {
    /// The TLS options, for a parse state whose files `files` finds. Each takes a path,
    /// read when the config is built.
    pub(crate) fn declared<C: TlsHolder>() -> Vec<UrlOption<C>> {
        vec![
            UrlOption::new(
                "tls_ca",
                "",
                "PEM file of the CA certificates that may sign the server's certificate",
                |c: &mut C, v| {
                    c.tls_files().ca = Some(v.to_owned());
                    Ok(())
                },
            ),
            UrlOption::new(
                "tls_cert",
                "",
                "PEM file of the client certificate, given with `tls_key`",
                |c: &mut C, v| {
                    c.tls_files().cert = Some(v.to_owned());
                    Ok(())
                },
            ),
            UrlOption::new(
                "tls_key",
                "",
                "PEM file of the client certificate's key",
                |c: &mut C, v| {
                    c.tls_files().key = Some(v.to_owned());
                    Ok(())
                },
            ),
        ]
    }

    /// The options as a query string (`&tls_ca=…`), for a Redlock node's URL.
    pub(crate) fn query(&self) -> String {
        [
            ("tls_ca", &self.ca),
            ("tls_cert", &self.cert),
            ("tls_key", &self.key),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            let value = value.as_deref()?;
            let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
            Some(format!("&{name}={encoded}"))
        })
        .collect()
    }

    /// `info` with the CA and client certificate attached; `info` itself when no option is set.
    pub(crate) fn apply(&self, info: ConnectionInfo, tls: bool) -> Result<ConnectionInfo> {
        if self.ca.is_none() && self.cert.is_none() && self.key.is_none() {
            return Ok(info);
        }
        if !tls {
            return Err(bad_url(
                "tls_ca, tls_cert and tls_key need a rediss:// (TLS) URL".into(),
            ));
        }
        fencelock_core::raw::url::client_identity(self.cert.as_ref(), self.key.as_ref())?;
        self.attach(info)
    }

    #[cfg(feature = "tls")]
    fn attach(&self, info: ConnectionInfo) -> Result<ConnectionInfo> {
        // The redis crate takes a file without a certificate as an empty trust store: ask for
        // the block each option needs.
        use fencelock_core::raw::url::read_pem;
        let root_cert = self
            .ca
            .as_deref()
            .map(|p| read_pem("tls_ca", p, "CERTIFICATE"))
            .transpose()?;
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem("tls_cert", cert, "CERTIFICATE")?,
                client_key: read_pem("tls_key", key, "PRIVATE KEY")?,
            }),
            _ => None,
        };
        let certificates = redis::TlsCertificates {
            client_tls,
            root_cert,
        };
        // The redis crate parses the PEM files here, so a malformed one fails at parse time.
        let client = redis::Client::build_with_tls(info, certificates).map_err(|e| {
            bad_url(format!(
                "tls_ca, tls_cert or tls_key is not a usable PEM file: {:?}",
                e.kind()
            ))
        })?;
        Ok(client.get_connection_info().clone())
    }

    #[cfg(not(feature = "tls"))]
    fn attach(&self, _info: ConnectionInfo) -> Result<ConnectionInfo> {
        Err(bad_url(
            "rediss:// (TLS) needs fencelock-redis's `tls` feature".into(),
        ))
    }
}

/// A URL with a comma-separated host list (`redis+cluster://`, `redis+sentinel://`), which
/// `url::Url` cannot parse: its parts, as written.
struct HostList<'a> {
    scheme: &'a str,
    /// `user:password@`, or empty.
    userinfo: &'a str,
    hosts: &'a str,
    /// The path, query and fragment.
    tail: &'a str,
}

impl<'a> HostList<'a> {
    /// Splits `url`, refusing an empty host (a `what`, in the message).
    fn split(url: &'a str, what: &str) -> Result<Self> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        if hosts.split(',').any(str::is_empty) {
            return Err(bad_url(format!(
                "an empty {what} in the {scheme}:// host list"
            )));
        }
        Ok(HostList {
            scheme,
            userinfo,
            hosts,
            tail,
        })
    }

    fn first(&self) -> &'a str {
        self.hosts.split(',').next().unwrap_or_default()
    }

    /// Each host as a URL of its own (host and port only).
    fn urls(&self) -> Result<Vec<Url>> {
        self.hosts
            .split(',')
            .map(|host| {
                Url::parse(&format!("{REDIS_SCHEME}://{host}"))
                    .map_err(|e| bad_url(format!("not a URL: {e}")))
            })
            .collect()
    }

    /// The URL as written, its password and password options masked.
    fn redacted(&self) -> String {
        let shown = redact(&format!(
            "{REDIS_SCHEME}://{}nodes.invalid{}",
            self.userinfo, self.tail
        ));
        let shown = shown
            .strip_prefix(&format!("{REDIS_SCHEME}://"))
            .unwrap_or_default();
        let (userinfo, tail) = shown.split_once("nodes.invalid").unwrap_or_default();
        format!("{}://{userinfo}{}{tail}", self.scheme, self.hosts)
    }
}

/// How the redis crate reaches each of `hosts` (a Cluster's seeds, the sentinels): database
/// 0, `default_port` where a host gives none, the credentials and TLS files given.
fn hosts_info(
    hosts: &[Url],
    default_port: u16,
    user: Option<&str>,
    password: Option<&str>,
    tls: bool,
    tls_files: &TlsFiles,
) -> Result<Vec<ConnectionInfo>> {
    hosts
        .iter()
        .map(|url| {
            let host = url
                .host_str()
                .filter(|h| !h.is_empty())
                .ok_or_else(|| bad_url(format!("{}: no host", redact(url.as_str()))))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = url.port().unwrap_or(default_port);
            let info = node_info(host, port, user, password, 0, tls)?;
            tls_files.apply(info, tls)
        })
        .collect()
}

/// `""`, `"/"` or `"/N"` with N a database number (0 to 2³¹).
pub(crate) fn parse_db(path: &str, redacted: &str) -> Result<i64> {
    let digits = path.trim_start_matches('/');
    if digits.is_empty() {
        return Ok(0);
    }
    digits
        .parse::<u32>()
        .ok()
        .filter(|db| *db <= i32::MAX as u32)
        .map(i64::from)
        .ok_or_else(|| {
            bad_url(format!(
                "{redacted}: the path must be a database number such as /0, not {path:?}"
            ))
        })
}

/// How the redis crate reaches one server.
pub(crate) fn node_info(
    host: &str,
    port: u16,
    user: Option<&str>,
    password: Option<&str>,
    db: i64,
    tls: bool,
) -> Result<ConnectionInfo> {
    let addr = if tls {
        ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_owned(), port)
    };
    let mut settings = RedisConnectionInfo::default().set_db(db);
    if let Some(user) = user {
        settings = settings.set_username(user);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    let info = addr
        .into_connection_info()
        .map_err(|e| bad_url(format!("{host}:{port}: {:?}", e.kind())))?;
    Ok(info.set_redis_settings(settings))
}

/// Any bytes but `{` and `}` (which would change the Cluster hash tag), at most
/// [`MAX_PREFIX_LEN`] bytes.
pub(crate) fn check_prefix(value: &str) -> Result<String> {
    if value.len() > MAX_PREFIX_LEN || value.contains(['{', '}']) {
        return Err(bad_url(format!(
            "prefix must be at most {MAX_PREFIX_LEN} bytes without `{{` or `}}`, not {value:?}"
        )));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::raw::url::parse_timeout;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        for (url, kind) in [
            ("redis://h:6379", Kind::Single),
            ("redis+cluster://h:7000", Kind::Cluster),
            ("redis+sentinel://h:26379/m", Kind::Sentinel),
        ] {
            let fresh = || Parsing {
                config: RedisConfig::from_url(url).expect("parses"),
                tls_files: TlsFiles::default(),
                sentinel_user: None,
                sentinel_password: None,
            };
            assert_eq!(
                fencelock_core::raw::url::defaults_that_differ(&options(kind), fresh),
                Vec::<&str>::new()
            );
        }
    }

    fn rule(url: &str) -> String {
        match RedisConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn cluster_rules_hold_for_the_url_and_again_after_the_builders() {
        assert!(rule("redis+cluster://a:1,b:2?layout=plain").contains("layout=plain is for one"));
        assert!(
            rule("redis+cluster://a:1?replica_timeout=2s&command_timeout=2s")
                .contains("must be below command_timeout")
        );
        let config = RedisConfig::from_url("redis+cluster://a:1,b:2").unwrap();
        assert!(config.check().is_ok());
        let broken = [
            (
                config.clone().with_layout(Layout::Plain),
                "layout=plain is for one",
            ),
            (
                config.with_command_timeout(DEFAULT_REPLICA_TIMEOUT),
                "must be below command_timeout",
            ),
        ];
        for (config, needle) in broken {
            match crate::RedisStore::connect_lazy(config) {
                Err(Error::InvalidInput { rule, .. }) => assert!(rule.contains(needle), "{rule}"),
                other => panic!("expected {needle:?}, got {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn with_min_replicas_a_ttl_below_twice_the_replica_timeout_is_refused() {
        let config = RedisConfig::from_url(
            "redis+cluster://a:1?min_replicas=1&replica_timeout=400ms&command_timeout=1s",
        )
        .unwrap();
        assert_eq!(
            config.acknowledged_min_ttl(),
            Some(Duration::from_millis(800))
        );
        match config.check_acknowledged_ttl(Duration::from_millis(799)) {
            Err(Error::InvalidInput { what: "ttl", rule }) => {
                assert!(rule.contains("twice replica_timeout"), "{rule}");
                assert!(rule.contains("expired on arrival"), "{rule}");
            }
            other => panic!("expected the rule, got {other:?}"),
        }
        assert!(config
            .check_acknowledged_ttl(Duration::from_millis(800))
            .is_ok());
        // Without min_replicas nothing is waited for, so there is no such rule.
        for url in ["redis+cluster://a:1?replica_timeout=400ms", "redis://h"] {
            let config = RedisConfig::from_url(url).unwrap();
            assert_eq!(config.acknowledged_min_ttl(), None, "{url}");
            assert!(config
                .check_acknowledged_ttl(Duration::from_millis(10))
                .is_ok());
        }
    }

    fn tcp(config: &RedisConfig) -> (String, u16) {
        match config.connection.addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            other => panic!("not plain TCP: {other:?}"),
        }
    }

    #[test]
    fn the_layout_option_picks_plain_keys() {
        let config = RedisConfig::from_url("redis://h").unwrap();
        assert_eq!(config.layout(), Layout::Fencelock);
        let config = RedisConfig::from_url("redis://h?layout=plain").unwrap();
        assert_eq!(config.layout(), Layout::Plain);
        assert_eq!(config.prefix(), DEFAULT_PREFIX);
        let config = RedisConfig::from_url("redis://h?layout=fencelock").unwrap();
        assert_eq!(config.layout(), Layout::Fencelock);
        assert_eq!(config.with_layout(Layout::Plain).layout(), Layout::Plain);
        assert!(rule("redis://h?layout=cluster").contains("fencelock or plain"));
        assert!(rule("redis://h?layout=").contains("fencelock or plain"));
    }

    #[test]
    fn urls_parse_with_defaults_and_options() {
        let config = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert_eq!(tcp(&config), ("127.0.0.1".into(), 6379));
        assert_eq!(config.prefix(), DEFAULT_PREFIX);
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.command_timeout(), DEFAULT_COMMAND_TIMEOUT);
        assert_eq!(config.connection.redis_settings().db(), 0);
        assert_eq!(config.connection.redis_settings().username(), None);
        assert_eq!(config.connection.redis_settings().password(), None);
        assert!(
            !config.allow_eviction(),
            "the eviction check is on by default"
        );

        let config = RedisConfig::from_url(
            "redis://app:p%40ss+w&x=y@cache.internal:7000/3?prefix=billing%3A&connect_timeout=2&command_timeout=250ms",
        )
        .unwrap();
        assert_eq!(tcp(&config), ("cache.internal".into(), 7000));
        assert_eq!(config.prefix(), "billing:");
        assert_eq!(config.connect_timeout(), Duration::from_secs(2));
        assert_eq!(config.command_timeout(), Duration::from_millis(250));
        let settings = config.connection.redis_settings();
        assert_eq!(settings.db(), 3);
        assert_eq!(settings.username(), Some("app"));
        assert_eq!(settings.password(), Some("p@ss+w&x=y"));

        let config = RedisConfig::from_url("redis://:only-pw@[::1]:6380/?prefix=").unwrap();
        assert_eq!(tcp(&config), ("::1".into(), 6380));
        assert_eq!(config.prefix(), "");
        assert_eq!(config.connection.redis_settings().username(), None);
        assert_eq!(
            config.connection.redis_settings().password(),
            Some("only-pw")
        );
        assert_eq!(
            config.connect_timeout(),
            DEFAULT_CONNECT_TIMEOUT,
            "a missing option keeps its default"
        );
        let config: RedisConfig = "redis://h?command_timeout=7s".parse().unwrap();
        assert_eq!(config.command_timeout(), Duration::from_secs(7));
    }

    #[test]
    fn allow_eviction_is_true_or_false_and_nothing_else() {
        let allow = |url: &str| RedisConfig::from_url(url).unwrap().allow_eviction();
        assert!(allow("redis://h?allow_eviction=true"));
        assert!(!allow("redis://h?allow_eviction=false"));
        assert!(!allow("redis://h"));
        assert!(allow(
            "redis://h?prefix=p&allow_eviction=true&command_timeout=1s"
        ));
        for bad in ["", "1", "yes", "TRUE", "on"] {
            let message = rule(&format!("redis://h?allow_eviction={bad}"));
            assert!(
                message.contains("allow_eviction must be true or false"),
                "{message}"
            );
        }
        let config = RedisConfig::from_url("redis://h?allow_eviction=true").unwrap();
        assert!(format!("{config:?}").contains("allow_eviction: true"));
        assert!(!config.with_allow_eviction(false).allow_eviction());
    }

    #[test]
    fn retention_defaults_to_seven_days_and_must_exceed_the_max_ttl() {
        let config = RedisConfig::from_url("redis://h").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(7 * 86_400));
        assert_eq!(config.max_ttl(), MAX_TTL);
        let config = RedisConfig::from_url("redis://h?retention=2s&max_ttl=500ms").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(2));
        assert_eq!(config.max_ttl(), Duration::from_millis(500));
        let config = RedisConfig::from_url("redis://h?retention=36h").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(36 * 3_600));
        assert!(format!("{config:?}").contains("retention: 129600s"));
        // Not above the max TTL (24 h by default), a bad unit, zero, a max TTL over 24 h.
        assert!(rule("redis://h?retention=24h").contains("must exceed the maximum TTL"));
        assert!(rule("redis://h?retention=2s&max_ttl=2s").contains("must exceed"));
        assert!(rule("redis://h?retention=7w").contains("retention must be"));
        assert!(rule("redis://h?retention=0").contains("retention must be"));
        assert!(rule("redis://h?max_ttl=2d").contains("at most 24h"));
        assert!(config
            .clone()
            .with_retention(Duration::from_secs(1), Duration::from_secs(1))
            .is_err());
        let config = config
            .with_retention(Duration::from_secs(3), Duration::from_secs(1))
            .unwrap();
        assert_eq!(config.retention(), Duration::from_secs(3));
    }

    #[test]
    fn passwords_never_print() {
        let config = RedisConfig::from_url("redis://user:s3cr%40t@h:1/2?prefix=p").unwrap();
        for shown in [
            config.to_string(),
            format!("{config:?}"),
            config.redacted().to_owned(),
        ] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert_eq!(config.to_string(), "redis://user:***@h:1/2?prefix=p");
        // A rejected URL does not echo the password either.
        for url in [
            "redis://user:s3cret@h/db?prefx=x",
            "redis://user:s3cret@h/x",
            "redis://user:s3cret@h/0?command_timeout=0",
        ] {
            let message = rule(url);
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("postgres://h/db").contains("redis://"));
        assert!(rule("not a url").contains("not a URL"));
        assert!(rule("redis://h?prefx=a").contains("unknown option \"prefx\""));
        assert!(rule("redis://h?prefx=a").contains(
            "prefix, layout, connect_timeout, command_timeout, allow_eviction, retention, max_ttl"
        ));
        assert!(rule("redis://h?prefix=a%7Bb").contains("prefix"));
        assert!(rule(&format!("redis://h?prefix={}", "p".repeat(257))).contains("256"));
        assert!(rule("redis://h/x").contains("database number"));
        assert!(rule("redis://h/-1").contains("database number"));
        assert!(rule("redis://h/1/2").contains("database number"));
        assert!(rule("redis://h?connect_timeout=0").contains("connect_timeout"));
        assert!(rule("redis://h?connect_timeout=soon").contains("connect_timeout"));
        assert!(rule("redis://h?command_timeout=0ms").contains("command_timeout"));
        assert!(rule("redis:///0").contains("host"));
    }

    #[test]
    fn timeouts_accept_seconds_and_milliseconds() {
        assert_eq!(parse_timeout("t", "5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_timeout("t", "5s").unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_timeout("t", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        for bad in ["", "0", "0s", "0ms", "-1", "1.5s", "5m", "ms"] {
            assert!(parse_timeout("t", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rediss_needs_the_tls_feature() {
        let result = RedisConfig::from_url("rediss://user:pw@h:6380");
        if cfg!(feature = "tls") {
            let config = result.unwrap();
            assert!(matches!(
                config.connection.addr(),
                ConnectionAddr::TcpTls { port: 6380, .. }
            ));
        } else {
            assert!(rule("rediss://h").contains("`tls` feature"));
        }
    }
}
