//! [`EtcdConfig`]: where the cluster is and how the store uses it, from a URL.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fencelock_core::raw::url::{
    client_identity, percent_decode, percent_encode, query_pairs, read_options, OptionDoc,
    TlsFiles, TlsTarget, UrlOption,
};
use fencelock_core::{Error, Result};

/// `etcd://`: plain connections.
const SCHEME: &str = "etcd";
/// `etcds://`: TLS connections (crate feature `tls`).
const TLS_SCHEME: &str = "etcds";
/// The URL schemes this store answers to: its descriptor's, and the ones
/// [`EtcdConfig::from_url`] accepts.
pub const URL_SCHEMES: &[&str] = &[SCHEME, TLS_SCHEME];
/// The default key prefix: every key this store writes starts with it.
pub const DEFAULT_PREFIX: &str = "fencelock/";
/// The default bound on connecting and on the first round trip that proves the cluster answers.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on one request (a grant, a transaction, a keep-alive, a read).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The client port etcd listens on when a URL names none.
pub const DEFAULT_PORT: u16 = 2379;
/// The shortest TTL this store accepts: etcd leases are whole seconds.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// TTLs travel as whole seconds (etcd leases), rounded up.
pub(crate) const TTL_GRANULARITY: Duration = Duration::from_secs(1);

/// How a lock's queue is named in etcd's key space.
///
/// Both layouts run the same algorithm (the oldest entry under the queue's directory holds the
/// lock, each waiter watches its predecessor); they differ in the names, and so in who else
/// sees the queue, and in what the fencing token is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// `layout=fencelock`, the default: entries `{prefix}{escaped key}/{lease id in hex}`, the
    /// prefix's token offset `{prefix}~offset` plus the holder entry's create revision as the
    /// token, at the client's clock in µs like every other store's (crate docs, *Tokens across
    /// a swap*). Seen only by fencelock clients.
    #[default]
    Fencelock,
    /// `layout=etcd`: entries `{prefix}{key}/{lease id in hex}`, exactly the names of etcd's
    /// `concurrency.Mutex`, `etcdctl lock` and the server's `Lock` RPC, so those clients and
    /// fencelock exclude each other and share one fair queue. The key is not escaped and the
    /// prefix defaults to empty: the lock `jobs/nightly` is `etcdctl lock jobs/nightly`. The
    /// token is the store revision of the reply that granted the lock, the number
    /// `etcdctl lock` exports as `ETCD_LOCK_REV`: raw revisions, outside the guarantee that
    /// tokens keep growing across a swap of stores.
    Etcd,
}

impl Layout {
    /// The name in the URL's `layout=` option.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Fencelock => "fencelock",
            Layout::Etcd => "etcd",
        }
    }

    /// The prefix a URL without `prefix=` gets: [`DEFAULT_PREFIX`], or empty for
    /// [`Layout::Etcd`] (where the lock's name is the whole of etcd's own prefix).
    pub fn default_prefix(self) -> &'static str {
        match self {
            Layout::Fencelock => DEFAULT_PREFIX,
            Layout::Etcd => "",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to reach etcd and where to keep the locks.
///
/// Built from a URL by [`EtcdConfig::from_url`]:
///
/// ```text
/// etcd://[user:password@]host:port[,host:port…][/][?option=value&…]
/// etcds://…   (TLS, needs the crate feature `tls`)
/// ```
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `prefix` | `fencelock/` (empty with `layout=etcd`) | prefix of every key this store writes. Prefixes must not nest (one starting with another): the inner prefix's token offset `{prefix}~offset` would lie in a queue of the outer one, whose acquires then fail with `Error::Store` (see the crate docs, *Tokens across a swap*). Empty is refused except with `layout=etcd` |
/// | `layout` | `fencelock` | `etcd` names each lock exactly as etcd's `concurrency.Mutex` and `etcdctl lock` do, so they exclude each other (see [`Layout`]) |
/// | `connect_timeout` | `5s` | bound on connecting (and on the first round trip of [`EtcdStore::connect`](crate::EtcdStore::connect)): `5` (seconds), `5s` or `250ms` |
/// | `command_timeout` | `5s` | bound on one request to the cluster, same forms |
/// | `tls_ca` | the webpki roots | `etcds://` only: a PEM file of the CA certificates that may sign the members' certificates |
/// | `tls_cert`, `tls_key` | none | `etcds://` only, both or neither: PEM files of the client certificate and its key, for members started with `--client-cert-auth` |
///
/// The TLS files are read when the URL is parsed; their contents never appear in `Debug`,
/// `Display` or an error.
///
/// A host without a port gets etcd's client port 2379; IPv6 hosts are written `[::1]:2379`.
/// The user name and password may be percent-encoded. Unknown options are rejected. `Debug` and
/// `Display` never show the password.
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) user: Option<(String, String)>,
    /// `None`: the layout's default prefix.
    prefix: Option<String>,
    pub(crate) layout: Layout,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    /// `tls_ca=`: the PEM text of the trusted CAs.
    tls_ca: Option<Vec<u8>>,
    /// `tls_cert=` and `tls_key=`: the PEM texts of the client certificate and its key.
    tls_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl EtcdConfig {
    /// Parses an `etcd://` or `etcds://` URL (see the type's docs for the options).
    ///
    /// Fails with [`Error::InvalidInput`] naming `"url"` for another scheme, a malformed host
    /// list, an unknown or malformed option, or `etcds://` without the `tls` feature. The
    /// message never contains the password.
    pub fn from_url(url: &str) -> Result<Self> {
        fencelock_core::raw::url::check_userinfo_encoded(url)?;
        let bad = |rule: String| Error::invalid("url", rule);
        let (scheme, rest) = url.split_once("://").unwrap_or(("(none)", url));
        let tls = match scheme {
            SCHEME => false,
            TLS_SCHEME => true,
            _ => {
                return Err(bad(format!(
                    "the scheme must be etcd:// or etcds://, not {scheme}://"
                )))
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(bad("etcds:// needs fencelock-etcd's `tls` feature".into()));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('/') || authority.contains('#') {
            return Err(bad(
                "an etcd URL has no path: etcd://[user:pass@]host:port[,host:port…][?options]"
                    .into(),
            ));
        }
        // The password may contain '@' only percent-encoded, so the last '@' ends the userinfo.
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let user = match userinfo {
            None => None,
            Some(userinfo) => {
                let (name, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let name = percent_decode(name).ok_or_else(|| {
                    bad("the user name is not valid percent-encoded UTF-8".into())
                })?;
                let password = percent_decode(password)
                    .ok_or_else(|| bad("the password is not valid percent-encoded UTF-8".into()))?;
                if name.is_empty() {
                    return Err(bad("the user name is empty".into()));
                }
                Some((name, password))
            }
        };
        let endpoints = hosts
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>>>()?;

        let config = EtcdConfig {
            endpoints,
            tls,
            user,
            prefix: None,
            layout: Layout::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            tls_ca: None,
            tls_identity: None,
        };
        let mut parsing = Parsing {
            config,
            tls: TlsFiles::default(),
        };
        read_options(
            query_pairs(query.unwrap_or(""))?,
            &options(),
            &mut parsing,
            |_, _, _| false,
            "",
        )?;
        let Parsing { mut config, tls } = parsing;
        config.tls_ca = tls.ca;
        config.tls_identity = client_identity(tls.cert, tls.key)?;
        // Checked after every option, since `layout=` may come after `prefix=`.
        if config.prefix().is_empty() && config.layout == Layout::Fencelock {
            return Err(bad(
                "prefix must not be empty (only layout=etcd, where the lock's name is etcd's own prefix, allows it)".into(),
            ));
        }
        Ok(config)
    }

    /// The client endpoints, `host:port` each.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Whether the connection uses TLS (`etcds://`).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The user name, if the URL names one.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(name, _)| name.as_str())
    }

    /// The prefix of every key this store writes: the `prefix=` option, or the layout's
    /// default ([`Layout::default_prefix`]).
    pub fn prefix(&self) -> &str {
        self.prefix
            .as_deref()
            .unwrap_or_else(|| self.layout.default_prefix())
    }

    /// How locks are named in etcd's key space.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The bound on connecting.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The bound on one request.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Sets the key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Sets the layout; a prefix not set explicitly follows it ([`Layout::default_prefix`]).
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets the bound on connecting.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the bound on one request.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The client's TLS settings for `etcds://`: the `tls_ca` CAs (or the webpki roots) and
    /// the `tls_cert`/`tls_key` identity.
    #[cfg(feature = "tls")]
    pub(crate) fn tls_options(&self) -> etcd_client::TlsOptions {
        let mut options = etcd_client::TlsOptions::new();
        options = match &self.tls_ca {
            Some(pem) => options.ca_certificate(etcd_client::Certificate::from_pem(pem)),
            None => options.with_enabled_roots(),
        };
        if let Some((cert, key)) = &self.tls_identity {
            options = options.identity(etcd_client::Identity::from_pem(cert, key));
        }
        options
    }

    /// Whether this is TLS without a client certificate: a member that requires one
    /// (`--client-cert-auth`) closes every connection.
    pub(crate) fn lacks_client_cert(&self) -> bool {
        self.tls && self.tls_identity.is_none()
    }

    /// The endpoints as the client library wants them: `http://host:port` or `https://…`.
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }

    /// The URL with the password replaced by `***` and the options in their parsed form.
    pub fn redacted(&self) -> String {
        let scheme = if self.tls { TLS_SCHEME } else { SCHEME };
        let user = match &self.user {
            Some((name, _)) => format!("{}:***@", percent_encode(name)),
            None => String::new(),
        };
        format!(
            "{scheme}://{user}{}?prefix={}&layout={}&connect_timeout={}ms&command_timeout={}ms",
            self.endpoints.join(","),
            percent_encode(self.prefix()),
            self.layout,
            self.connect_timeout.as_millis(),
            self.command_timeout.as_millis()
        )
    }
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("user", &self.user())
            .field("password", &self.user.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix())
            .field("layout", &self.layout)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("tls_ca", &self.tls_ca.as_ref().map(|_| "(PEM)"))
            .field("tls_identity", &self.tls_identity.as_ref().map(|_| "(PEM)"))
            .finish()
    }
}

impl FromStr for EtcdConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

/// A URL being read: the config it makes and the TLS files it names.
#[derive(Debug)]
struct Parsing {
    config: EtcdConfig,
    tls: TlsFiles,
}

impl AsMut<TlsFiles> for Parsing {
    fn as_mut(&mut self) -> &mut TlsFiles {
        &mut self.tls
    }
}

impl TlsTarget for Parsing {
    const SCHEMES: [&'static str; 2] = [SCHEME, TLS_SCHEME];

    fn wants_tls(&self) -> bool {
        self.config.tls
    }
}

/// Every URL option this store reads.
fn options() -> Vec<UrlOption<Parsing>> {
    let mut options = vec![
        UrlOption::new(
            "prefix",
            "fencelock/",
            "prefix of every key this store writes; prefixes must not nest",
            |p: &mut Parsing, v| {
                p.config.prefix = Some(v.to_owned());
                Ok(())
            },
        ),
        UrlOption::new(
            "layout",
            "fencelock",
            "`etcd`: each lock named as etcd's `concurrency.Mutex` names it",
            |p: &mut Parsing, v| {
                p.config.layout = match v {
                    "fencelock" => Layout::Fencelock,
                    "etcd" => Layout::Etcd,
                    other => {
                        return Err(Error::invalid(
                            "url",
                            format!("layout must be fencelock or etcd, not {other:?}"),
                        ))
                    }
                };
                Ok(())
            },
        ),
        UrlOption::timeout(
            "connect_timeout",
            "5s",
            "bound on connecting",
            |p: &mut Parsing| &mut p.config.connect_timeout,
        ),
        UrlOption::timeout(
            "command_timeout",
            "5s",
            "bound on one request to the cluster",
            |p: &mut Parsing| &mut p.config.command_timeout,
        ),
    ];
    options.extend(TlsFiles::declared());
    options
}

/// What [`EtcdConfig::from_url`] reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options().iter().map(UrlOption::describe).collect()
}

/// `host:port`, `host` (port 2379), `[v6]:port` or `[v6]`.
fn parse_host(text: &str) -> Result<String> {
    fencelock_core::raw::url::parse_endpoint(text, DEFAULT_PORT, "endpoint", &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        let fresh = || Parsing {
            config: EtcdConfig::from_url("etcd://h:2379").expect("parses"),
            tls: TlsFiles::default(),
        };
        assert_eq!(
            fencelock_core::raw::url::defaults_that_differ(&options(), fresh),
            Vec::<&str>::new()
        );
    }

    fn rule(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_defaults_and_options() {
        let config = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(config.endpoints(), ["127.0.0.1:2379"]);
        assert_eq!(config.prefix(), DEFAULT_PREFIX);
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.command_timeout(), DEFAULT_COMMAND_TIMEOUT);
        assert!(!config.is_tls());
        assert_eq!(config.user(), None);
        assert_eq!(config.endpoint_urls(), ["http://127.0.0.1:2379"]);

        let config = EtcdConfig::from_url(
            "etcd://app:pw@10.0.0.1:1,10.0.0.2,[::1]:3/?prefix=locks%2Fbilling%2F&connect_timeout=2&command_timeout=250ms",
        )
        .unwrap();
        assert_eq!(
            config.endpoints(),
            ["10.0.0.1:1", "10.0.0.2:2379", "[::1]:3"]
        );
        assert_eq!(config.user(), Some("app"));
        assert_eq!(config.prefix(), "locks/billing/");
        assert_eq!(config.connect_timeout(), Duration::from_secs(2));
        assert_eq!(config.command_timeout(), Duration::from_millis(250));

        let config =
            EtcdConfig::from_url("etcd://u%40corp:p%40ss%3Aw@h:1?command_timeout=7s").unwrap();
        assert_eq!(config.user(), Some("u@corp"));
        assert_eq!(
            config.user.as_ref().map(|(_, p)| p.as_str()),
            Some("p@ss:w")
        );
        assert_eq!(config.command_timeout(), Duration::from_secs(7));
    }

    #[test]
    fn passwords_never_print() {
        let config = EtcdConfig::from_url("etcd://user:s3cr%40t@h:1,h:2?prefix=p/").unwrap();
        for shown in [config.to_string(), format!("{config:?}"), config.redacted()] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert!(config
            .to_string()
            .starts_with("etcd://user:***@h:1,h:2?prefix=p/"));
        // A rejected URL does not echo the password either.
        let message = rule("etcd://user:s3cret@h:1?prefx=x");
        assert!(!message.contains("s3cret"), "{message}");
        let message = rule("etcd://user:s3cret@h:99999");
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("redis://h:1").contains("etcd://"));
        assert!(rule("h:1").contains("etcd://"));
        assert!(rule("etcd://h:1?prefx=x").contains("unknown option \"prefx\""));
        assert!(rule("etcd://h:1?prefix=").contains("prefix"));
        assert!(rule("etcd://h:1,,h:2").contains("host"));
        assert!(rule("etcd://").contains("host"));
        assert!(rule("etcd://h:0").contains("port"));
        assert!(rule("etcd://h:x").contains("port"));
        assert!(rule("etcd://[::1").contains("'['"));
        assert!(rule("etcd://h:1/path").contains("no path"));
        assert!(rule("etcd://h:1?connect_timeout=0").contains("connect_timeout"));
        assert!(rule("etcd://h:1?command_timeout=soon").contains("command_timeout"));
        assert!(rule("etcd://:pw@h:1").contains("user name"));
    }

    #[test]
    fn the_etcd_layout_defaults_to_an_empty_prefix() {
        let config = EtcdConfig::from_url("etcd://h:1?layout=etcd").unwrap();
        assert_eq!(config.layout(), Layout::Etcd);
        assert_eq!(config.prefix(), "");
        // The empty prefix is allowed in this layout, in either order of the options.
        for url in [
            "etcd://h:1?prefix=&layout=etcd",
            "etcd://h:1?layout=etcd&prefix=",
        ] {
            assert_eq!(EtcdConfig::from_url(url).unwrap().prefix(), "", "{url}");
        }
        let config = EtcdConfig::from_url("etcd://h:1?layout=etcd&prefix=locks%2F").unwrap();
        assert_eq!(config.prefix(), "locks/");
        let config = EtcdConfig::from_url("etcd://h:1?layout=fencelock").unwrap();
        assert_eq!(
            (config.layout(), config.prefix()),
            (Layout::Fencelock, DEFAULT_PREFIX)
        );
        // A prefix not set explicitly follows the layout; one set explicitly stays.
        let built = EtcdConfig::from_url("etcd://h:1").unwrap();
        assert_eq!(built.clone().with_layout(Layout::Etcd).prefix(), "");
        assert_eq!(
            built.with_prefix("p/").with_layout(Layout::Etcd).prefix(),
            "p/"
        );
        // The redacted form names the layout and parses back to the same config.
        let shown = EtcdConfig::from_url("etcd://h:1?layout=etcd")
            .unwrap()
            .redacted();
        assert!(shown.contains("prefix=&layout=etcd"), "{shown}");
        let again = EtcdConfig::from_url(&shown).unwrap();
        assert_eq!((again.layout(), again.prefix()), (Layout::Etcd, ""));
    }

    #[test]
    fn bad_layouts_are_rejected() {
        assert!(rule("etcd://h:1?layout=redis").contains("fencelock or etcd"));
        assert!(rule("etcd://h:1?layout=").contains("fencelock or etcd"));
        assert!(rule("etcd://h:1?layout=fencelock&prefix=").contains("layout=etcd"));
    }

    #[test]
    fn tls_urls_need_the_tls_feature() {
        let result = EtcdConfig::from_url("etcds://h:1");
        if cfg!(feature = "tls") {
            let config = result.unwrap();
            assert!(config.is_tls());
            assert_eq!(config.endpoint_urls(), ["https://h:1"]);
        } else {
            assert!(rule("etcds://h:1").contains("`tls` feature"));
        }
    }

    #[test]
    fn timeouts_parse_like_every_store() {
        let timeout = |value: &str| {
            EtcdConfig::from_url(&format!("etcd://h:1?connect_timeout={value}"))
                .map(|c| c.connect_timeout())
        };
        assert_eq!(timeout("5").unwrap(), Duration::from_secs(5));
        assert_eq!(timeout("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(timeout("250ms").unwrap(), Duration::from_millis(250));
        assert!(timeout("0ms").is_err());
        assert!(timeout("-1").is_err());
        assert!(timeout("").is_err());
    }
}
