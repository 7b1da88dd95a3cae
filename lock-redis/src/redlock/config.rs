//! [`RedlockConfig`]: the nodes, the quorum and the retry policy, from a `redlock://` URL.

use std::fmt;
use std::time::Duration;

use fencelock_core::raw::url::{read_options, OptionDoc, UrlOption};
use fencelock_core::{
    limits::MAX_TTL,
    raw::validate::{check_retention, DEFAULT_RETENTION},
};
use fencelock_core::{Error, Result};
use url::Url;

use crate::config::{
    bad_url, parse_max_ttl, RedisConfig, TlsFiles, TlsHolder, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PREFIX, REDIS_SCHEME, REDIS_TLS_SCHEME,
};

/// `redlock://`, Redlock's one scheme.
const REDLOCK_SCHEME: &str = "redlock";
/// The URL schemes of Redlock: its descriptor's, and the one [`RedlockConfig::from_url`]
/// accepts.
pub const REDLOCK_URL_SCHEMES: &[&str] = &[REDLOCK_SCHEME];

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
/// The clock granule of a node's mint: `max(fence + 1, TIME µs rounded down to a multiple of
/// this)`, 2^18 µs (about 0.26 s), so nodes whose clocks read the same granule mint the same
/// token (the crate docs, `# Redlock`, say why).
pub(crate) const TOKEN_GRANULE: Duration = Duration::from_micros(1 << 18);
/// The default bound on the difference between any two nodes' clocks (`max_skew`).
pub(crate) const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(1);
/// A node writes its fence's expiry from the clock its script started at, and mints from the
/// `TIME` the script reads a little later: this covers the gap (microseconds in practice).
const EXPIRY_MARGIN: Duration = Duration::from_millis(1);

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
/// | `drift_factor` | `0.01` | the validity margin is `ttl × drift_factor + 2 ms` (never less than fencelock-core's 1% + 2 ms); from 0 to 0.5 |
/// | `retry_count` | `3` | retries after a round without a quorum (a split vote, too many nodes failing); at most 100 |
/// | `retry_jitter` | `100ms` | a retry waits a random 1 ms to this long, so contenders fall out of step |
/// | `allow_eviction` | `false` | `true` skips the check that no node can evict a held lock (`maxmemory` with a policy other than `noeviction`), accepting that risk knowingly, as for `redis://` |
/// | `retention` | `7d` | each node's fence expires this long after its last acquire or raise; must exceed `max_ttl`, as for `redis://`, and be at least one clock granule (2^18 µs) plus `max_skew` plus 1 ms, whole ms rounded up (see below) |
/// | `max_ttl` | `24h` | the longest TTL this handle grants |
/// | `max_skew` | `1s` | the largest difference between any two nodes' clocks this deployment promises (`ms`, `s`, `m`, `h`, `d`); the floor under the retention window, see below |
/// | `tls` | `false` | `true`: every node is reached as `rediss://` (needs the crate feature `tls`) |
/// | `tls_ca`, `tls_cert`, `tls_key` | | as for `rediss://`, for every node; need `tls=true` |
///
/// At least three nodes, each `host:port` (port 6379 if omitted), none listed twice; the
/// credentials and database apply to every node. Timeouts read `5`, `5s` or `250ms`. Unknown
/// options are rejected. `Debug` and `Display` never show the password.
///
/// **The smallest retention window** is one token granule (2^18 µs) plus `max_skew` plus
/// 1 ms, 1264 ms with the default skew: [`from_url`](Self::from_url) refuses a shorter one,
/// naming the smallest allowed, since a node whose fence expired sooner could hand out the same
/// token twice. `max_skew` is the deployment's promise about its nodes' clocks. Why:
/// `docs/design/retention-window.md`.
#[derive(Clone)]
pub struct RedlockConfig {
    /// Each node's single-server config, in URL order.
    pub(super) nodes: Vec<RedisConfig>,
    labels: Vec<String>,
    redacted: String,
    drift_factor: f64,
    retry_count: u32,
    retry_jitter: Duration,
    max_skew: Duration,
}

impl RedlockConfig {
    /// Parses a `redlock://` URL (see the type's docs for the options).
    ///
    /// Fails with [`Error::InvalidInput`] naming `"url"` for another scheme, fewer than three
    /// nodes, a node listed twice, a bad host, port or database, or an unknown or malformed
    /// option. The message never contains the password.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for any URL this parser refuses,
    /// as above.
    pub fn from_url(url: &str) -> Result<Self> {
        fencelock_core::raw::url::check_userinfo_encoded(url)?;
        let (scheme, rest) = url.split_once("://").unwrap_or(("(none)", url));
        if scheme != REDLOCK_SCHEME {
            return Err(bad_url(format!(
                "the scheme must be redlock://, not {scheme}://"
            )));
        }
        // The host list ends at the path, query or fragment; userinfo ends at its last `@`.
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        // The url crate cannot parse a host list: it parses the rest around one placeholder.
        let shape = Url::parse(&format!("{REDLOCK_SCHEME}://{userinfo}nodes.invalid{tail}"))
            .map_err(|e| bad_url(format!("not a URL: {e}")))?;
        let shown_userinfo = match (shape.username(), shape.password()) {
            (user, Some(_)) => format!("{user}:***@"),
            _ => userinfo.to_owned(),
        };
        let redacted = format!("{REDLOCK_SCHEME}://{shown_userinfo}{hosts}{tail}");
        let path = tail.split(['?', '#']).next().unwrap_or("");

        let mut parsing = Parsing::default();
        read_options(
            shape.query_pairs(),
            &options(),
            &mut parsing,
            |_, _, _| false,
            "",
        )?;
        let Parsing {
            prefix,
            connect_timeout,
            command_timeout,
            drift_factor,
            retry_count,
            retry_jitter,
            allow_eviction,
            retention,
            max_ttl,
            max_skew,
            tls,
            tls_files,
        } = parsing;
        check_retention(retention, max_ttl)?;
        check_granule(retention, max_skew)?;

        let mut nodes = Vec::new();
        let mut labels: Vec<String> = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(bad_url(format!(
                    "{redacted}: an empty node in the host list"
                )));
            }
            let scheme = if tls { REDIS_TLS_SCHEME } else { REDIS_SCHEME };
            let query = tls_files.query();
            let query = query
                .strip_prefix('&')
                .map_or(String::new(), |q| format!("?{q}"));
            let node_url = format!("{scheme}://{userinfo}{host}{path}{query}");
            let node = RedisConfig::from_url(&node_url)?
                .with_prefix(&prefix)?
                .with_connect_timeout(connect_timeout)
                .with_command_timeout(command_timeout)
                .with_allow_eviction(allow_eviction)
                .with_retention(retention, max_ttl)?;
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
            max_skew,
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

    /// How long each node's fence outlives its last acquire or raise.
    pub fn retention(&self) -> Duration {
        self.nodes[0].retention()
    }

    /// The longest TTL this handle grants.
    pub fn max_ttl(&self) -> Duration {
        self.nodes[0].max_ttl()
    }

    /// The largest difference between two nodes' clocks the retention window allows for
    /// (`max_skew`).
    pub fn max_skew(&self) -> Duration {
        self.max_skew
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
    /// fencelock-core's [`drift`](fencelock_core::raw::drift).
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor)
            .saturating_add(Duration::from_millis(2))
            .max(fencelock_core::raw::drift(ttl))
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

/// The shortest retention window whose expiry cannot let a node mint a token again: a granule
/// plus `max_skew` plus [`EXPIRY_MARGIN`], rounded up to a whole ms (windows are whole ms).
pub(crate) fn min_retention(max_skew: Duration) -> Duration {
    fencelock_core::raw::validate::clock_floor_retention(TOKEN_GRANULE, max_skew, EXPIRY_MARGIN)
}

/// Refuses a retention window below [`min_retention`] (see the type's docs), naming the
/// smallest window allowed. Run after `check_retention`, so the window already exceeds
/// `max_ttl` and the smallest window allowed is this bound.
fn check_granule(retention: Duration, max_skew: Duration) -> Result<()> {
    let least = min_retention(max_skew);
    if retention >= least {
        return Ok(());
    }
    Err(bad_url(format!(
        "retention ({retention:?}) is too short for Redlock: a node's fence that expires less \
         than one clock granule ({TOKEN_GRANULE:?}) plus max_skew ({max_skew:?}) after its last \
         write lets its next mint repeat a token already handed out; the smallest window \
         allowed is {}ms",
        least.as_millis()
    )))
}

/// A URL being read: every option's value, the defaults until one is given.
#[derive(Debug)]
struct Parsing {
    prefix: String,
    connect_timeout: Duration,
    command_timeout: Duration,
    drift_factor: f64,
    retry_count: u32,
    retry_jitter: Duration,
    allow_eviction: bool,
    retention: Duration,
    max_ttl: Duration,
    max_skew: Duration,
    tls: bool,
    tls_files: TlsFiles,
}

impl Default for Parsing {
    fn default() -> Self {
        Parsing {
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_NODE_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            retry_count: DEFAULT_RETRY_COUNT,
            retry_jitter: DEFAULT_RETRY_JITTER,
            allow_eviction: false,
            retention: DEFAULT_RETENTION,
            max_ttl: MAX_TTL,
            max_skew: DEFAULT_MAX_SKEW,
            tls: false,
            tls_files: TlsFiles::default(),
        }
    }
}

impl TlsHolder for Parsing {
    fn tls_files(&mut self) -> &mut TlsFiles {
        &mut self.tls_files
    }
}

/// Every URL option `redlock://` reads.
fn options() -> Vec<UrlOption<Parsing>> {
    let mut options = vec![
        UrlOption::new(
            "prefix",
            DEFAULT_PREFIX,
            "prepended to every key name, as for `redis://`",
            |p: &mut Parsing, v| {
                p.prefix = v.to_owned();
                Ok(())
            },
        ),
        UrlOption::timeout(
            "connect_timeout",
            "5s",
            "bound on opening one node's connection",
            |p: &mut Parsing| &mut p.connect_timeout,
        ),
        UrlOption::timeout(
            "command_timeout",
            "250ms",
            "bound on one node's answer; a slower node counts as failed for that round",
            |p: &mut Parsing| &mut p.command_timeout,
        ),
        UrlOption::new(
            "drift_factor",
            "0.01",
            "the validity margin is `ttl × drift_factor + 2 ms`; from 0 to 0.5",
            |p: &mut Parsing, v| {
                p.drift_factor = parse_drift_factor(v)?;
                Ok(())
            },
        ),
        UrlOption::new(
            "retry_count",
            "3",
            "retries after a round without a quorum; at most 100",
            |p: &mut Parsing, v| {
                p.retry_count = parse_retry_count(v)?;
                Ok(())
            },
        ),
        UrlOption::timeout(
            "retry_jitter",
            "100ms",
            "a retry waits a random 1 ms to this long",
            |p: &mut Parsing| &mut p.retry_jitter,
        ),
        UrlOption::flag(
            "allow_eviction",
            "false",
            "`true` skips the check that no node can evict a held lock",
            |p: &mut Parsing| &mut p.allow_eviction,
        ),
        UrlOption::window(
            "retention",
            "7d",
            "each node's fence expires this long after its last acquire or raise",
            |p: &mut Parsing| &mut p.retention,
        ),
        UrlOption::new(
            "max_ttl",
            "24h",
            "the longest TTL this handle grants",
            |p: &mut Parsing, v| {
                p.max_ttl = parse_max_ttl(v)?;
                Ok(())
            },
        ),
        UrlOption::window(
            "max_skew",
            "1s",
            "the largest difference between any two nodes' clocks this deployment promises",
            |p: &mut Parsing| &mut p.max_skew,
        ),
        UrlOption::flag(
            "tls",
            "false",
            "`true`: every node is reached as `rediss://`",
            |p: &mut Parsing| &mut p.tls,
        ),
    ];
    options.extend(TlsFiles::declared());
    options
}

/// What `redlock://` reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options().iter().map(UrlOption::describe).collect()
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
            .field("retention", &self.retention())
            .field("max_ttl", &self.max_ttl())
            .field("max_skew", &self.max_skew)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        assert_eq!(
            fencelock_core::raw::url::defaults_that_differ(&options(), Parsing::default),
            Vec::<&str>::new()
        );
    }

    fn rule(url: &str) -> String {
        match RedlockConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn retention_applies_to_every_node_and_must_exceed_the_max_ttl() {
        let config = RedlockConfig::from_url("redlock://a,b,c").unwrap();
        assert_eq!(config.retention(), DEFAULT_RETENTION);
        assert_eq!(config.max_ttl(), MAX_TTL);
        let config = RedlockConfig::from_url("redlock://a,b,c?retention=3s&max_ttl=1s").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(3));
        for node in &config.nodes {
            assert_eq!(node.retention(), Duration::from_secs(3));
            assert_eq!(node.max_ttl(), Duration::from_secs(1));
        }
        assert!(rule("redlock://a,b,c?retention=1d").contains("must exceed the maximum TTL"));
        assert!(rule("redlock://a,b,c?retention=1s&max_ttl=1s").contains("must exceed"));
        assert!(rule("redlock://a,b,c?retention=soon").contains("retention must be"));
    }

    #[test]
    fn a_window_below_the_clock_granule_is_refused_naming_the_smallest() {
        // Seen: with this window two consecutive leases on one key got the same token.
        let refused = rule("redlock://a,b,c?retention=150ms&max_ttl=100ms");
        assert!(refused.contains("granule"), "{refused}");
        assert!(
            refused.contains("smallest window allowed is 1264ms"),
            "{refused}"
        );
        assert!(!refused.contains('\n'), "one line: {refused}");
        // The bound moves with the skew the URL promises, and is exact to the ms.
        let config =
            RedlockConfig::from_url("redlock://a,b,c?retention=274ms&max_ttl=100ms&max_skew=10ms")
                .unwrap();
        assert_eq!(config.max_skew(), Duration::from_millis(10));
        assert_eq!(min_retention(config.max_skew()), Duration::from_millis(274));
        let refused = rule("redlock://a,b,c?retention=273ms&max_ttl=100ms&max_skew=10ms");
        assert!(
            refused.contains("smallest window allowed is 274ms"),
            "{refused}"
        );
        assert_eq!(
            RedlockConfig::from_url("redlock://a,b,c")
                .unwrap()
                .max_skew(),
            DEFAULT_MAX_SKEW
        );
        assert!(rule("redlock://a,b,c?max_skew=0").contains("max_skew must be"));
        assert!(rule("redlock://a,b,c?max_skew=fast").contains("max_skew must be"));
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
            fencelock_core::raw::drift(Duration::from_secs(10)),
            "never less than fencelock-core's margin"
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
