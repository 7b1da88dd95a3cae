//! [`ZookeeperConfig`]: where the ensemble is and how the store uses it, from a URL.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fencelock_core::raw::url::{
    client_identity, percent_decode, percent_encode, query_pairs, read_options, OptionDoc,
    TlsFiles, TlsTarget, UrlOption,
};
use fencelock_core::{Error, Result};

use crate::keys;
use crate::layout::Layout;

/// `zookeeper://`: plain connections.
const SCHEME: &str = "zookeeper";
/// `zookeepers://`: TLS connections to the servers' `secureClientPort` (crate feature `tls`),
/// named as the other stores' TLS schemes are (the plain scheme and an `s`).
const TLS_SCHEME: &str = "zookeepers";
/// The URL schemes this store answers to: its descriptor's, and the ones
/// [`ZookeeperConfig::from_url`] accepts.
pub const URL_SCHEMES: &[&str] = &[SCHEME, TLS_SCHEME];
/// The default prefix: the znode under which every key's container node lives.
pub const DEFAULT_PREFIX: &str = "/fencelock";
/// The default bound on establishing a session.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on one request (a create, a read, a delete).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The client port ZooKeeper listens on when a URL names none.
pub const DEFAULT_PORT: u16 = 2181;

/// How the URL's user authenticates a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Auth {
    /// `auth=digest`, the default: ZooKeeper's `digest` scheme (`addauth digest user:password`);
    /// the store's nodes get the ACL `digest:user:{hash}:cdrwa`.
    #[default]
    Digest,
    /// `auth=sasl`: SASL `DIGEST-MD5` against the user of the server's JAAS `Server` section
    /// (`DigestLoginModule`); the store's nodes get the ACL `sasl:user:cdrwa`. A wrong password
    /// fails the connect.
    Sasl,
}

impl Auth {
    /// The name in the URL's `auth=` option.
    pub fn as_str(self) -> &'static str {
        match self {
            Auth::Digest => "digest",
            Auth::Sasl => "sasl",
        }
    }
}

/// How to reach ZooKeeper and where to keep the locks.
///
/// Built from a URL by [`ZookeeperConfig::from_url`]:
///
/// ```text
/// zookeeper://[user:password@]host:port[,host:port…][/chroot][?option=value&…]
/// zookeepers://…   (TLS to the secureClientPort, needs the crate feature `tls`)
/// ```
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `prefix` | `/fencelock` | the znode (inside the chroot) under which each key's container node lives; an absolute ZooKeeper path, created (persistent) if missing |
/// | `layout` | `fencelock` | `fencelock`, `curator` or `kazoo`: the znode names and queue order, see [`Layout`]; the lock on a key is the znode `{prefix}/{escaped key}` in every layout ([`ZookeeperConfig::lock_path`]) |
/// | `connect_timeout` | `5s` | bound on establishing a session: `5` (seconds), `5s` or `250ms` |
/// | `command_timeout` | `5s` | bound on one request to the ensemble, same forms |
/// | `auth` | `digest` | how the user authenticates: `digest` (ZooKeeper's digest scheme) or `sasl` (SASL DIGEST-MD5), see [`Auth`]; needs a user |
/// | `tls_ca` | none: required | `zookeepers://` only: a PEM file of the CA certificates that may sign the servers' certificates (the client has no default roots) |
/// | `tls_cert`, `tls_key` | none | `zookeepers://` only, both or neither: PEM files of the client certificate and its key, for servers with `ssl.clientAuth=need` |
///
/// The user name and password, if given, authenticate every session (`auth=`), and every
/// node the store creates gets the ACL `auth::cdrwa` (all rights for that user only,
/// ZooKeeper's `CREATOR_ALL_ACL`); without a user, nodes get `world:anyone:cdrwa` (see the
/// crate docs, *ACLs and authentication*). Over TLS the server's certificate must be signed
/// by `tls_ca` and name the host of the URL (an IP address against an IP SAN). The TLS files
/// are read when the URL is parsed; their contents never appear in `Debug`, `Display` or an
/// error. A host without a port gets 2181; IPv6 hosts are written `[::1]:2181`. Unknown
/// options are rejected. `Debug` and `Display` never show the password.
#[derive(Clone)]
pub struct ZookeeperConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) chroot: String,
    pub(crate) user: Option<(String, String)>,
    pub(crate) auth: Auth,
    /// `zookeepers://`.
    pub(crate) tls: bool,
    /// `tls_ca=`: the PEM text of the trusted CAs.
    pub(crate) tls_ca: Option<Vec<u8>>,
    /// `tls_cert=` and `tls_key=`: the PEM texts of the client certificate and its key.
    pub(crate) tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) prefix: String,
    pub(crate) layout: Layout,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

impl ZookeeperConfig {
    /// Parses a `zookeeper://` or `zookeepers://` URL (see the type's docs for the options).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `"url"` for another scheme, a malformed host list or
    /// chroot, an unknown or malformed option, `zookeepers://` without the `tls` feature or
    /// without `tls_ca`, a TLS option on `zookeeper://`, a TLS file that cannot be read, or
    /// `auth=sasl` without a user. The message never contains the password.
    pub fn from_url(url: &str) -> Result<Self> {
        fencelock_core::raw::url::check_userinfo_encoded(url)?;
        let bad = |rule: String| Error::invalid("url", rule);
        let (scheme, rest) = url.split_once("://").unwrap_or(("(none)", url));
        let tls = if scheme.eq_ignore_ascii_case(SCHEME) {
            false
        } else if scheme.eq_ignore_ascii_case(TLS_SCHEME) {
            true
        } else {
            return Err(bad(format!(
                "the scheme must be {SCHEME}:// or {TLS_SCHEME}:// (TLS), not {scheme}://"
            )));
        };
        if tls && !cfg!(feature = "tls") {
            return Err(bad(format!(
                "{TLS_SCHEME}:// needs fencelock-zookeeper's `tls` feature (the facade's and \
                 lockctl's `tls`)"
            )));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        if rest.contains('#') {
            return Err(bad("a zookeeper URL has no fragment".into()));
        }
        let (authority, chroot) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        let chroot = parse_chroot(chroot)?;
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
                if name.is_empty() || name.contains(':') {
                    return Err(bad(
                        "the user name is empty or holds a ':' (digest auth is user:password)"
                            .into(),
                    ));
                }
                Some((name, password))
            }
        };
        let endpoints = hosts
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>>>()?;
        let config = ZookeeperConfig {
            endpoints,
            chroot,
            user,
            auth: Auth::Digest,
            tls,
            tls_ca: None,
            tls_identity: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            layout: Layout::Fencelock,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
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
        if config.tls && config.tls_ca.is_none() {
            return Err(bad(format!(
                "{TLS_SCHEME}:// needs tls_ca=PATH, the PEM file of the CA that signs the \
                 servers' certificates (the ZooKeeper client has no default roots)"
            )));
        }
        if config.auth == Auth::Sasl && config.user.is_none() {
            return Err(bad(
                "auth=sasl needs a user: zookeeper://user:password@host:port?auth=sasl".into(),
            ));
        }
        Ok(config)
    }

    /// The client endpoints, `host:port` each.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The chroot every path is under (`""` for none, else `/a/b`).
    pub fn chroot(&self) -> &str {
        &self.chroot
    }

    /// The user name of the authentication, if the URL names one.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(name, _)| name.as_str())
    }

    /// How the user authenticates (`auth=`).
    pub fn auth(&self) -> Auth {
        self.auth
    }

    /// Whether the connections use TLS (`zookeepers://`).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The znode under which each key's container lives.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The znode names and queue order.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The znode a key's lock nodes live under, `{prefix}/{escaped key}` (inside the chroot):
    /// the path a Curator `InterProcessMutex` or a kazoo `Lock` names to share the lock with
    /// [`Layout::Curator`] or [`Layout::Kazoo`]. The escape keeps `[A-Za-z0-9_:,=+@-]` and
    /// writes every other byte as `%XX`.
    pub fn lock_path(&self, key: &str) -> String {
        keys::container(&self.prefix, key)
    }

    /// Sets the layout.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The bound on establishing a session.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The bound on one request.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Sets the prefix.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a prefix that is not an absolute ZooKeeper path.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        self.prefix = parse_prefix(prefix)?;
        Ok(self)
    }

    /// Sets the bound on establishing a session.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the bound on one request.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The ACL of every node the store creates: all rights for the URL's user only
    /// (`auth::cdrwa`, which the server turns into that user's `digest:` or `sasl:` id), or
    /// for anyone without a user.
    pub(crate) fn acls(&self) -> zookeeper_client::Acls<'static> {
        match self.user {
            Some(_) => zookeeper_client::Acls::creator_all(),
            None => zookeeper_client::Acls::anyone_all(),
        }
    }

    /// The connect string the client wants: `h:p,h:p[/chroot]`.
    pub(crate) fn connect_string(&self) -> String {
        format!("{}{}", self.endpoints.join(","), self.chroot)
    }

    /// The URL with the password replaced by `***` and the options in their parsed form (the
    /// TLS files are not in it: they were read when the URL was parsed).
    pub fn redacted(&self) -> String {
        let scheme = if self.tls { TLS_SCHEME } else { SCHEME };
        let user = match &self.user {
            Some((name, _)) => format!("{}:***@", percent_encode(name)),
            None => String::new(),
        };
        let auth = match (&self.user, self.auth) {
            (Some(_), Auth::Sasl) => format!("&auth={}", self.auth.as_str()),
            _ => String::new(),
        };
        format!(
            "{scheme}://{user}{}{}?prefix={}&layout={}&connect_timeout={}ms&command_timeout={}ms{auth}",
            self.endpoints.join(","),
            self.chroot,
            percent_encode(&self.prefix),
            self.layout.as_str(),
            self.connect_timeout.as_millis(),
            self.command_timeout.as_millis()
        )
    }
}

impl fmt::Display for ZookeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// A URL being read: the config it makes and the TLS files it names.
#[derive(Debug)]
struct Parsing {
    config: ZookeeperConfig,
    tls: TlsFiles,
}

impl AsMut<TlsFiles> for Parsing {
    fn as_mut(&mut self) -> &mut TlsFiles {
        &mut self.tls
    }
}

impl TlsTarget for Parsing {
    const PEM_LABELS: [&'static str; 3] = ["CERTIFICATE", "CERTIFICATE", "PRIVATE KEY"];

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
            DEFAULT_PREFIX,
            "the znode under which each key's container node lives",
            |p: &mut Parsing, v| {
                p.config.prefix = parse_prefix(v)?;
                Ok(())
            },
        ),
        UrlOption::new(
            "layout",
            "fencelock",
            "`fencelock`, `curator` or `kazoo`: the znode names and queue order",
            |p: &mut Parsing, v| {
                p.config.layout = Layout::parse(v).ok_or_else(|| {
                    Error::invalid(
                        "url",
                        format!("layout must be fencelock, curator or kazoo, not {v:?}"),
                    )
                })?;
                Ok(())
            },
        ),
        UrlOption::timeout(
            "connect_timeout",
            "5s",
            "bound on establishing a session",
            |p: &mut Parsing| &mut p.config.connect_timeout,
        ),
        UrlOption::timeout(
            "command_timeout",
            "5s",
            "bound on one request to the ensemble",
            |p: &mut Parsing| &mut p.config.command_timeout,
        ),
        UrlOption::new(
            "auth",
            "digest",
            "`digest` or `sasl` (SASL DIGEST-MD5): how the user authenticates",
            |p: &mut Parsing, v| {
                p.config.auth = match v {
                    "digest" => Auth::Digest,
                    "sasl" => Auth::Sasl,
                    other => {
                        return Err(Error::invalid(
                            "url",
                            format!("auth must be digest or sasl, not {other:?}"),
                        ))
                    }
                };
                Ok(())
            },
        ),
    ];
    options.extend(TlsFiles::declared());
    options
}

/// What [`ZookeeperConfig::from_url`] reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options().iter().map(UrlOption::describe).collect()
}

impl fmt::Debug for ZookeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperConfig")
            .field("endpoints", &self.endpoints)
            .field("chroot", &self.chroot)
            .field("user", &self.user())
            .field("password", &self.user.as_ref().map(|_| "***"))
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca.as_ref().map(|_| "(PEM)"))
            .field("tls_identity", &self.tls_identity.as_ref().map(|_| "(PEM)"))
            .field("prefix", &self.prefix)
            .field("layout", &self.layout)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}

impl FromStr for ZookeeperConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

/// A ZooKeeper path: absolute, no empty, `.` or `..` segment, no trailing `/` (but `/`
/// itself), no control character.
fn valid_path(path: &str) -> bool {
    path == "/"
        || (path.starts_with('/')
            && path[1..]
                .split('/')
                .all(|segment| !matches!(segment, "" | "." | ".."))
            && !path.chars().any(char::is_control))
}

/// The chroot after the hosts: empty, or a ZooKeeper path (percent-decoded).
fn parse_chroot(text: &str) -> Result<String> {
    let decoded = percent_decode(text)
        .ok_or_else(|| Error::invalid("url", "the chroot is not valid percent-encoded UTF-8"))?;
    if decoded.is_empty() || decoded == "/" {
        return Ok(String::new());
    }
    let decoded = decoded.strip_suffix('/').unwrap_or(&decoded).to_owned();
    if !valid_path(&decoded) {
        return Err(Error::invalid(
            "url",
            format!("the chroot {decoded:?} is not a ZooKeeper path (/a/b)"),
        ));
    }
    Ok(decoded)
}

/// The `prefix=` option: an absolute ZooKeeper path other than `/`.
fn parse_prefix(prefix: &str) -> Result<String> {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    if prefix.is_empty() || !valid_path(prefix) {
        return Err(Error::invalid(
            "url",
            format!("prefix must be an absolute ZooKeeper path other than / (such as /fencelock), not {prefix:?}"),
        ));
    }
    Ok(prefix.to_owned())
}

/// `host:port`, `host` (port 2181), `[v6]:port` or `[v6]`.
fn parse_host(text: &str) -> Result<String> {
    fencelock_core::raw::url::parse_endpoint(text, DEFAULT_PORT, "server", &['/'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        let fresh = || Parsing {
            config: ZookeeperConfig::from_url("zookeeper://h:2181").expect("parses"),
            tls: TlsFiles::default(),
        };
        assert_eq!(
            fencelock_core::raw::url::defaults_that_differ(&options(), fresh),
            Vec::<&str>::new()
        );
    }

    fn rule(url: &str) -> String {
        match ZookeeperConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_defaults_and_options() {
        let config = ZookeeperConfig::from_url("zookeeper://127.0.0.1:2181").unwrap();
        assert_eq!(config.endpoints(), ["127.0.0.1:2181"]);
        assert_eq!(config.chroot(), "");
        assert_eq!(config.prefix(), DEFAULT_PREFIX);
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.command_timeout(), DEFAULT_COMMAND_TIMEOUT);
        assert_eq!(config.connect_string(), "127.0.0.1:2181");

        let config = ZookeeperConfig::from_url(
            "zookeeper://app:pw@10.0.0.1:1,10.0.0.2,[::1]:3/apps/billing?prefix=%2Flocks&connect_timeout=2&command_timeout=250ms",
        )
        .unwrap();
        assert_eq!(
            config.endpoints(),
            ["10.0.0.1:1", "10.0.0.2:2181", "[::1]:3"]
        );
        assert_eq!(config.chroot(), "/apps/billing");
        assert_eq!(config.user(), Some("app"));
        assert_eq!(config.prefix(), "/locks");
        assert_eq!(config.layout(), Layout::Fencelock);
        assert_eq!(config.connect_timeout(), Duration::from_secs(2));
        assert_eq!(config.command_timeout(), Duration::from_millis(250));
        assert_eq!(
            config.connect_string(),
            "10.0.0.1:1,10.0.0.2:2181,[::1]:3/apps/billing"
        );
        assert_eq!(
            ZookeeperConfig::from_url("zookeeper://h/")
                .unwrap()
                .chroot(),
            ""
        );
    }

    #[test]
    fn passwords_never_print() {
        let config = ZookeeperConfig::from_url("zookeeper://user:s3cr%40t@h:1,h:2/c").unwrap();
        for shown in [config.to_string(), format!("{config:?}"), config.redacted()] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert!(config
            .to_string()
            .starts_with("zookeeper://user:***@h:1,h:2/c?prefix=/fencelock"));
        let sasl = ZookeeperConfig::from_url("zookeeper://user:s3cr%40t@h:1?auth=sasl").unwrap();
        assert_eq!(sasl.auth(), Auth::Sasl);
        for shown in [sasl.to_string(), format!("{sasl:?}"), sasl.redacted()] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(
                shown.contains("***") && shown.to_lowercase().contains("sasl"),
                "{shown}"
            );
        }
        assert_eq!(
            ZookeeperConfig::from_url(&sasl.redacted()).unwrap().auth(),
            Auth::Sasl
        );
        let message = rule("zookeeper://user:s3cret@h:1?auth=sasl&tls_ca=/x");
        assert!(!message.contains("s3cret"), "{message}");
        let message = rule("zookeeper://user:s3cret@h:1?prefx=x");
        assert!(!message.contains("s3cret"), "{message}");
        let again = ZookeeperConfig::from_url(
            &ZookeeperConfig::from_url("zookeeper://h:1/c?prefix=/p")
                .unwrap()
                .redacted(),
        )
        .unwrap();
        assert_eq!((again.chroot(), again.prefix()), ("/c", "/p"));
        for layout in [Layout::Fencelock, Layout::Curator, Layout::Kazoo] {
            let url = format!("zookeeper://h:1?layout={}", layout.as_str());
            let config = ZookeeperConfig::from_url(&url).unwrap();
            assert_eq!(config.layout(), layout);
            assert_eq!(
                ZookeeperConfig::from_url(&config.redacted())
                    .unwrap()
                    .layout(),
                layout
            );
        }
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("etcd://h:1").contains("zookeeper://"));
        assert!(rule("h:1").contains("zookeeper://"));
        assert!(rule("zookeeper://h:1?prefx=x").contains("unknown option \"prefx\""));
        assert!(rule("zookeeper://h:1?prefix=").contains("prefix"));
        assert!(rule("zookeeper://h:1?prefix=locks").contains("prefix"));
        assert!(rule("zookeeper://h:1?prefix=/a/../b").contains("prefix"));
        assert!(rule("zookeeper://h:1,,h:2").contains("host"));
        assert!(rule("zookeeper://").contains("host"));
        assert!(rule("zookeeper://h:0").contains("port"));
        assert!(rule("zookeeper://h:x").contains("port"));
        assert!(rule("zookeeper://[::1").contains("'['"));
        assert!(rule("zookeeper://h:1/a//b").contains("chroot"));
        assert!(rule("zookeeper://h:1?connect_timeout=0").contains("connect_timeout"));
        assert!(rule("zookeeper://:pw@h:1").contains("user name"));
        assert!(rule("zookeeper://h:1?tls_ca=/x").contains("zookeepers://"));
        assert!(rule("zookeeper://h:1?auth=kerberos").contains("auth"));
        assert!(rule("zookeeper://h:1?auth=sasl").contains("needs a user"));
        assert!(rule("zookeeper://h:1?layout=etcd").contains("layout"));
    }

    #[test]
    fn tls_urls_need_the_tls_feature() {
        if cfg!(feature = "tls") {
            assert!(rule("zookeepers://h:1").contains("tls_ca"));
        } else {
            assert!(rule("zookeepers://h:1").contains("`tls` feature"));
        }
    }
}
