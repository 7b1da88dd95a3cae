//! Pieces every store's URL parser needs, so every store's URL reads its
//! options the same way and prints without passwords.

use std::time::Duration;

use crate::{Error, Result};

/// A timeout option: `5` (seconds), `5s` or `250ms`; never zero. `what` names the option in the
/// error, which is [`Error::InvalidInput`] on the `"url"`.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a value that is not a positive
/// number of seconds or milliseconds.
pub fn parse_timeout(what: &str, value: &str) -> Result<Duration> {
    let parsed = if let Some(ms) = value.strip_suffix("ms") {
        ms.parse().ok().map(Duration::from_millis)
    } else {
        value
            .strip_suffix('s')
            .unwrap_or(value)
            .parse()
            .ok()
            .map(Duration::from_secs)
    };
    match parsed {
        Some(timeout) if !timeout.is_zero() => Ok(timeout),
        _ => Err(Error::invalid(
            "url",
            format!(
                "{what} must be a positive number of seconds (`5`, `5s`) or milliseconds \
                 (`500ms`), not {value:?}"
            ),
        )),
    }
}

/// A long window (a retention, a maximum TTL): a whole number followed by `ms`, `s`, `m`, `h`
/// or `d` (`7d`, `36h`, `90s`); a bare number is seconds; never zero. `what` names the option in
/// the error, which is [`Error::InvalidInput`] on the `"url"`.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a value that is not a positive whole
/// number with a known unit, or that overflows.
pub fn parse_window(what: &str, value: &str) -> Result<Duration> {
    let units: [(&str, u64); 5] = [
        ("ms", 1),
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];
    let (digits, millis_per) = units
        .iter()
        .find_map(|(unit, per)| value.strip_suffix(unit).map(|d| (d, *per)))
        .unwrap_or((value, 1_000));
    let parsed = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per))
        .map(Duration::from_millis);
    match parsed {
        Some(window) if !window.is_zero() => Ok(window),
        _ => Err(Error::invalid(
            "url",
            format!(
                "{what} must be a positive whole number of ms, s, m, h or d (`7d`, `90s`), \
                 not {value:?}"
            ),
        )),
    }
}

/// Reads the PEM file at `path` that the TLS option `option` (`tls_ca`, `tls_cert`, `tls_key`)
/// names, as a store does when it parses its URL, so a missing or wrong file fails then.
/// `label` is the block the file must hold: `"CERTIFICATE"`, `"PRIVATE KEY"` (which
/// `EC PRIVATE KEY` and `RSA PRIVATE KEY` match too), or `""` for a block of any kind.
///
/// The error is [`Error::InvalidInput`] on the `"url"`; it names the option and the path, never
/// the contents (a key file's contents are secret).
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) when the file cannot be read or holds no
/// block of the `label` asked for.
pub fn read_pem(option: &str, path: &str, label: &str) -> Result<Vec<u8>> {
    let contents = std::fs::read(path)
        .map_err(|e| Error::invalid("url", format!("{option}: cannot read {path:?}: {e}")))?;
    let holds_block = String::from_utf8_lossy(&contents).lines().any(|line| {
        line.trim_end()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|found| found.ends_with(label))
    });
    if !holds_block {
        let block = if label.is_empty() {
            "PEM block".to_owned()
        } else {
            format!("PEM {label} block")
        };
        return Err(Error::invalid(
            "url",
            format!("{option}: {path:?} holds no {block}"),
        ));
    }
    Ok(contents)
}

/// The client certificate and its key (the `tls_cert` and `tls_key` options), given together
/// or not at all: `Some` for both, `None` for neither, and [`Error::InvalidInput`] on the
/// `"url"` for one without the other.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a certificate without a key or a key
/// without a certificate.
pub fn client_identity<T>(cert: Option<T>, key: Option<T>) -> Result<Option<(T, T)>> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        _ => Err(Error::invalid(
            "url",
            "tls_cert and tls_key go together: give both or neither",
        )),
    }
}

/// The default namespace of [`TableStoreOptions`]: keys of stores with different namespaces (or
/// fence tables) never contend.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The default name of the fence table of [`TableStoreOptions`].
pub const DEFAULT_TABLE: &str = "fencelock_fence";
/// One URL option a store reads, declared once: its name, its default as the docs write it,
/// one line of docs, and the parser that applies a value to the store's parse state `C`.
///
/// A store lists its declarations in one place and reads its query with [`read_options`]; the
/// same list answers [`StoreKind::options`](crate::StoreKind::options), which the docs' tests
/// check every table of options against.
pub struct UrlOption<C> {
    name: &'static str,
    default: &'static str,
    doc: &'static str,
    read: Reader<C>,
}

/// How a declaration reads its value: with a parser of its own, or one of the common forms
/// into a field of the parse state.
enum Reader<C> {
    Custom(fn(&mut C, &str) -> Result<()>),
    Timeout(fn(&mut C) -> &mut Duration),
    Window(fn(&mut C) -> &mut Duration),
    Flag(fn(&mut C) -> &mut bool),
}

impl<C> Clone for Reader<C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Reader<C> {}

impl<C> UrlOption<C> {
    /// Option `name`, whose value `read` applies (or refuses with
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) naming the option); `default` as the
    /// docs write it, empty when there is none.
    pub const fn new(
        name: &'static str,
        default: &'static str,
        doc: &'static str,
        read: fn(&mut C, &str) -> Result<()>,
    ) -> Self {
        UrlOption {
            name,
            default,
            doc,
            read: Reader::Custom(read),
        }
    }

    /// A timeout read with [`parse_timeout`] into the field `field` finds.
    pub const fn timeout(
        name: &'static str,
        default: &'static str,
        doc: &'static str,
        field: fn(&mut C) -> &mut Duration,
    ) -> Self {
        UrlOption {
            name,
            default,
            doc,
            read: Reader::Timeout(field),
        }
    }

    /// A window read with [`parse_window`] into the field `field` finds.
    pub const fn window(
        name: &'static str,
        default: &'static str,
        doc: &'static str,
        field: fn(&mut C) -> &mut Duration,
    ) -> Self {
        UrlOption {
            name,
            default,
            doc,
            read: Reader::Window(field),
        }
    }

    /// A switch read with [`parse_bool`] into the field `field` finds.
    pub const fn flag(
        name: &'static str,
        default: &'static str,
        doc: &'static str,
        field: fn(&mut C) -> &mut bool,
    ) -> Self {
        UrlOption {
            name,
            default,
            doc,
            read: Reader::Flag(field),
        }
    }

    /// Applies `value` to `state`, or refuses it naming the option.
    fn read(&self, state: &mut C, value: &str) -> Result<()> {
        match self.read {
            Reader::Custom(read) => return read(state, value),
            Reader::Timeout(field) => *field(state) = parse_timeout(self.name, value)?,
            Reader::Window(field) => *field(state) = parse_window(self.name, value)?,
            Reader::Flag(field) => *field(state) = parse_bool(self.name, value)?,
        }
        Ok(())
    }

    /// The option's name, as the URL spells it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// What the docs say of it: name, default and its line of docs.
    pub fn describe(&self) -> OptionDoc {
        OptionDoc {
            name: self.name,
            default: self.default,
            doc: self.doc,
        }
    }
}

// Derived impls would ask `C: Clone`; a declaration is plain data whatever `C` is.
impl<C> Clone for UrlOption<C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for UrlOption<C> {}

impl<C> std::fmt::Debug for UrlOption<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.describe().fmt(f)
    }
}

/// A URL option as the docs describe it: what [`StoreKind::options`](crate::StoreKind::options)
/// lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OptionDoc {
    /// The option's name, as the URL spells it.
    pub name: &'static str,
    /// Its default as the docs write it (`5s`, `true`); empty when there is none.
    pub default: &'static str,
    /// One line saying what it does.
    pub doc: &'static str,
}

/// Reads each `(name, value)` query pair with the declaration of its name in `options`. A name
/// none declares goes to `other`, which keeps a client library's own option and answers `false`
/// for one it does not know either: that is refused, naming every option `options` declares and
/// then `library` (`"the libpq options host, port"`, empty for none).
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"`: the first value a
/// declaration refuses, or the first unknown option.
pub fn read_options<C, N, V>(
    pairs: impl IntoIterator<Item = (N, V)>,
    options: &[UrlOption<C>],
    state: &mut C,
    mut other: impl FnMut(&mut C, &str, &str) -> bool,
    library: &str,
) -> Result<()>
where
    N: AsRef<str>,
    V: AsRef<str>,
{
    for (name, value) in pairs {
        let (name, value) = (name.as_ref(), value.as_ref());
        match options.iter().find(|option| option.name == name) {
            Some(option) => option.read(state, value)?,
            None if other(state, name, value) => {}
            None => {
                let names: Vec<&str> = options.iter().map(UrlOption::name).collect();
                let and_library = if library.is_empty() {
                    String::new()
                } else {
                    format!(" and {library}")
                };
                return Err(Error::invalid(
                    "url",
                    format!(
                        "unknown option {name:?}; this store reads {}{and_library}",
                        names.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The `(name, value)` pairs of a URL's query (the part after `?`), each percent-decoded
/// with `+` as a space, for [`read_options`].
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"` for a name or value that
/// is not valid percent-encoded UTF-8.
pub fn query_pairs(query: &str) -> Result<Vec<(String, String)>> {
    let decode = |text: &str| {
        percent_decode(&text.replace('+', " ")).ok_or_else(|| {
            Error::invalid(
                "url",
                format!("option {text:?} is not valid percent-encoded UTF-8"),
            )
        })
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(name)?, decode(value)?))
        })
        .collect()
}

/// For a store's tests: the options whose declared default, read into the state `fresh`
/// makes, changes it (compared by `Debug`), so that the docs' defaults are the parser's own. A
/// default the docs describe in words (one that does not parse) is left out.
pub fn defaults_that_differ<C: std::fmt::Debug>(
    options: &[UrlOption<C>],
    fresh: impl Fn() -> C,
) -> Vec<&'static str> {
    let before = format!("{:?}", fresh());
    options
        .iter()
        .filter(|option| !option.default.is_empty())
        .filter(|option| {
            let mut state = fresh();
            option.read(&mut state, option.default).is_ok() && format!("{state:?}") != before
        })
        .map(UrlOption::name)
        .collect()
}

/// The default bound on opening one connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on one statement that does not wait for a lock.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The default number of idle connections a store keeps for reuse.
pub const DEFAULT_MAX_IDLE: usize = 16;

/// The options the stores that keep their fencing counters in a server's table (PostgreSQL,
/// MySQL) read alike from their URL, with this module's parsers and the same messages. A store
/// lists their [`declared`](Self::declared) options with its own and reads the query with
/// [`read_options`].
#[derive(Clone, Debug)]
pub struct TableStoreOptions {
    /// `namespace`: 1–63 bytes, no NUL.
    pub namespace: String,
    /// `table`: the fence table's name, a plain identifier.
    pub table: String,
    /// `connect_timeout`: the bound on opening one connection.
    pub connect_timeout: Duration,
    /// `command_timeout`: the bound on one statement that does not wait for a lock.
    pub command_timeout: Duration,
    /// `max_idle`: idle connections kept for reuse.
    pub max_idle: usize,
    /// `retention`: how long a fence row outlives its last bump.
    pub retention: Duration,
    /// `max_ttl`: the longest TTL the handle grants, at most [`MAX_TTL`](crate::limits::MAX_TTL).
    pub max_ttl: Duration,
    /// `create_table`: whether the store creates a missing fence table.
    pub create_table: bool,
    /// The longest `table` name the store accepts, in bytes.
    table_max_len: usize,
}

impl AsMut<TableStoreOptions> for TableStoreOptions {
    fn as_mut(&mut self) -> &mut TableStoreOptions {
        self
    }
}

impl TableStoreOptions {
    /// The defaults (this module's `DEFAULT_…`, a retention of
    /// [`DEFAULT_RETENTION`](crate::raw::validate::DEFAULT_RETENTION), a maximum TTL of
    /// [`MAX_TTL`](crate::limits::MAX_TTL), tables created when missing), for a store whose
    /// table names are at most `table_max_len` bytes.
    pub fn new(table_max_len: usize) -> Self {
        TableStoreOptions {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            max_idle: DEFAULT_MAX_IDLE,
            retention: crate::raw::validate::DEFAULT_RETENTION,
            max_ttl: crate::limits::MAX_TTL,
            create_table: true,
            table_max_len,
        }
    }

    /// The declarations of these options, for a store whose parse state `C` holds them.
    pub fn declared<C: AsMut<TableStoreOptions>>() -> Vec<UrlOption<C>> {
        fn set<C: AsMut<TableStoreOptions>>(state: &mut C) -> &mut TableStoreOptions {
            state.as_mut()
        }
        vec![
            UrlOption::new(
                "namespace",
                DEFAULT_NAMESPACE,
                "1–63 bytes, no NUL; part of every key's lock id",
                |c: &mut C, v| {
                    set(c).namespace = check_namespace(v)?;
                    Ok(())
                },
            ),
            UrlOption::new(
                "table",
                DEFAULT_TABLE,
                "the fence table's name, a plain identifier",
                |c: &mut C, v| {
                    let options = set(c);
                    options.table = check_identifier("table", v, options.table_max_len)?;
                    Ok(())
                },
            ),
            UrlOption::flag(
                "create_table",
                "true",
                "`false`: never create a missing fence table",
                |c: &mut C| &mut set(c).create_table,
            ),
            UrlOption::timeout(
                "connect_timeout",
                "5s",
                "bound on opening one connection",
                |c: &mut C| &mut set(c).connect_timeout,
            ),
            UrlOption::timeout(
                "command_timeout",
                "10s",
                "bound on one statement that does not wait for a lock",
                |c: &mut C| &mut set(c).command_timeout,
            ),
            UrlOption::new(
                "max_idle",
                "16",
                "idle connections kept for reuse",
                |c: &mut C, v| {
                    set(c).max_idle = v.parse().map_err(|_| {
                        Error::invalid("url", format!("max_idle must be a whole number, not {v:?}"))
                    })?;
                    Ok(())
                },
            ),
            UrlOption::window(
                "retention",
                "7d",
                "how long a fence row outlives its last bump",
                |c: &mut C| &mut set(c).retention,
            ),
            UrlOption::new(
                "max_ttl",
                "24h",
                "the longest TTL the handle grants (at most 24 h)",
                |c: &mut C, v| {
                    let max_ttl = parse_window("max_ttl", v)?;
                    if max_ttl > crate::limits::MAX_TTL {
                        return Err(Error::invalid(
                            "url",
                            format!("max_ttl must be at most 24h, not {v:?}"),
                        ));
                    }
                    set(c).max_ttl = max_ttl;
                    Ok(())
                },
            ),
        ]
    }
}

/// The PEM contents of the `tls_ca`, `tls_cert` and `tls_key` options, read (with
/// [`read_pem`]) when the URL is parsed; the store applies them to its driver's options.
#[derive(Default)]
pub struct TlsFiles {
    /// `tls_ca`: the CA that signs the server's certificate.
    pub ca: Option<Vec<u8>>,
    /// `tls_cert`: a client certificate.
    pub cert: Option<Vec<u8>>,
    /// `tls_key`: the client certificate's key.
    pub key: Option<Vec<u8>>,
}

/// Names which files were given, never their contents (a key is a secret).
impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("cert", &self.cert.is_some())
            .field("key", &self.key.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// The declarations of `tls_ca`, `tls_cert` and `tls_key`, each read with [`read_pem`]
    /// (for the labels [`TlsTarget::PEM_LABELS`] names), for a store whose parse state `C`
    /// holds them.
    pub fn declared<C: TlsTarget>() -> Vec<UrlOption<C>> {
        fn file<C: TlsTarget>(state: &C, at: usize, value: &str) -> Result<Option<Vec<u8>>> {
            let name = ["tls_ca", "tls_cert", "tls_key"][at];
            if !state.wants_tls() {
                let [plain, tls] = C::SCHEMES;
                return Err(Error::invalid(
                    "url",
                    format!("{name} needs {tls}://, not {plain}://"),
                ));
            }
            Ok(Some(read_pem(name, value, C::PEM_LABELS[at])?))
        }
        vec![
            UrlOption::new(
                "tls_ca",
                "",
                "PEM file of the CA that signs the server's certificate",
                |c: &mut C, v| {
                    c.as_mut().ca = file(c, 0, v)?;
                    Ok(())
                },
            ),
            UrlOption::new(
                "tls_cert",
                "",
                "PEM file of a client certificate, given with `tls_key`",
                |c: &mut C, v| {
                    c.as_mut().cert = file(c, 1, v)?;
                    Ok(())
                },
            ),
            UrlOption::new(
                "tls_key",
                "",
                "PEM file of the client certificate's key",
                |c: &mut C, v| {
                    c.as_mut().key = file(c, 2, v)?;
                    Ok(())
                },
            ),
        ]
    }
}

/// A store's URL parse state that reads [`TlsFiles`].
pub trait TlsTarget: AsMut<TlsFiles> {
    /// The PEM block each file must hold (`tls_ca`, `tls_cert`, `tls_key`); empty for any.
    const PEM_LABELS: [&'static str; 3] = ["", "", ""];

    /// The store's plain scheme and its TLS one, for the refusal of a TLS file on a URL of the
    /// plain one (see [`wants_tls`](Self::wants_tls)).
    const SCHEMES: [&'static str; 2] = ["", ""];

    /// Whether the URL asked for TLS, so its TLS files are read; a store whose TLS is chosen
    /// by its scheme says no for the plain one. The default: always.
    fn wants_tls(&self) -> bool {
        true
    }
}

/// `true` or `false`, nothing else: `1`, `yes` or an empty value is refused rather than guessed.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"` for any other value, naming
/// the option `what`.
pub fn parse_bool(what: &str, value: &str) -> Result<bool> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Error::invalid(
            "url",
            format!("{what} must be true or false, not {value:?}"),
        )),
    }
}

/// A namespace: 1 to 63 bytes without NUL.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"` for any other value.
pub fn check_namespace(value: &str) -> Result<String> {
    if value.is_empty() || value.len() > 63 || value.contains('\0') {
        return Err(Error::invalid(
            "url",
            format!("namespace must be 1 to 63 bytes without NUL, not {value:?}"),
        ));
    }
    Ok(value.to_owned())
}

/// A schema or table name, which is spliced into SQL (identifiers cannot be bind parameters):
/// only a plain identifier, `[A-Za-z_][A-Za-z0-9_]*` of at most `max_len` bytes, is accepted,
/// and the store always quotes it.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"` for any other value, naming
/// the option `what`.
pub fn check_identifier(what: &str, value: &str, max_len: usize) -> Result<String> {
    let mut chars = value.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !starts_well || !rest_ok || value.len() > max_len {
        return Err(Error::invalid(
            "url",
            format!(
                "{what} must match [A-Za-z_][A-Za-z0-9_]* and be at most {max_len} bytes, not \
                 {value:?}"
            ),
        ));
    }
    Ok(value.to_owned())
}

/// Refuses a URL whose scheme is not one of `schemes`, naming them (`a:// or b://` for
/// `["a", "b"]`).
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"` for another scheme.
pub fn check_scheme(scheme: &str, schemes: &[&str]) -> Result<()> {
    if schemes.contains(&scheme) {
        return Ok(());
    }
    let named: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
    Err(Error::invalid(
        "url",
        format!("the scheme must be {}, not {scheme}://", named.join(" or ")),
    ))
}

/// One endpoint of a URL's list of servers, `host:port`, `host` (then `default_port`),
/// `[v6]:port` or `[v6]`, as `host:port`. `what` names an endpoint in the messages ("endpoint",
/// "server"); a host holds no whitespace, `@`, `%`, `?`, nor any of `forbidden`.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) on the `"url"` for an empty host, an
/// unclosed `[`, a character a host cannot hold, or a port that is not 1 to 65535.
pub fn parse_endpoint(
    text: &str,
    default_port: u16,
    what: &str,
    forbidden: &[char],
) -> Result<String> {
    let bad = |rule: String| Error::invalid("url", rule);
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| bad(format!("host {text:?} opens '[' without closing it")))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| bad(format!("host {text:?}: expected ':port' after ']'")))?,
            ),
        };
        (format!("[{v6}]"), port)
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (text.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(bad(format!(
            "every {what} needs a host (host:port, separated by commas), got {text:?}"
        )));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '@' | '%' | '?') || forbidden.contains(&c))
    {
        return Err(bad(format!(
            "host {host:?} contains a character hosts cannot"
        )));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad(format!("port {port:?} of {host} is not 1 to 65535")))?,
    };
    Ok(format!("{host}:{port}"))
}

/// Encodes every byte but ASCII letters, digits and `-._~/` as `%XX`: a user name or path
/// printed back into a URL.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes, as in a URL's user name and password (which keep `+` literally,
/// unlike a query string). `None` if an escape is malformed or the result is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Refuses a URL whose user name or password holds an unencoded `/`, `?` or `#`: such a
/// character ends the authority early, so a parser would read the rest of the password as a
/// path or an option and could echo it in an error. Detected as an `@` after the authority
/// where the authority already holds a `:`; the error shows nothing of the URL. (An `@` in an
/// option value after a `host:port` trips it too: percent-encode it as `%40`.)
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) when the user name or password holds an
/// unencoded `/`, `?` or `#`.
pub fn check_userinfo_encoded(url: &str) -> Result<()> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let spills =
        rest[..authority_end].contains(':') && rest.rfind('@').is_some_and(|at| at > authority_end);
    if spills {
        return Err(Error::invalid(
            "url",
            "the user name or password contains an unencoded '/', '?' or '#' (or an option \
             value an unencoded '@'): percent-encode it",
        ));
    }
    Ok(())
}

/// `url` with any password replaced by `***`, for messages and logs: the one in the userinfo
/// and a `password=` or `…_password=` query option (libpq accepts the first; a store may read
/// `sentinel_password`, say). Works on URLs with several hosts
/// (`scheme://a:1,b:2`), which `url::Url` cannot parse, and on text that is not a
/// URL at all (returned as it is).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let mut authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // A password with an unencoded `/`, `?` or `#` ends the authority early: if what looks
    // like a host and port is followed by an `@`, take everything up to the last `@` as the
    // userinfo. That may mask more than a password; it never shows one.
    if let Some(at) = rest.rfind('@') {
        if at > authority_end && rest[..authority_end].contains(':') {
            authority_end = rest[at..]
                .find(['/', '?', '#'])
                .map_or(rest.len(), |end| at + end);
        }
    }
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let password = if userinfo.contains(':') { ":***" } else { "" };
            format!("{user}{password}@{hosts}")
        }
        None => authority.to_owned(),
    };
    // The spill rule above can carry options into the authority (an `@` in an option value);
    // mask a `password=` option wherever it ended up.
    mask_password_options(&format!("{scheme}://{authority}{}", redact_query(tail)))
}

/// `text` with the value of every `password=` or `…_password=` option (after a `?` or `&`, any
/// case) masked.
fn mask_password_options(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = lower[from..].find("password=") {
        let start = from + found;
        let value = start + "password=".len();
        from = value;
        // `password=` itself, or the end of a `…_password=` option (`sentinel_password`).
        let Some(name_start) = text[..start].rfind(['?', '&']).map(|at| at + 1) else {
            continue;
        };
        let stem = &text[name_start..start];
        let named = stem.is_empty()
            || (stem.ends_with('_')
                && stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        if !named {
            continue;
        }
        let end = text[value..]
            .find(['&', '#'])
            .map_or(text.len(), |e| value + e);
        out.push_str(&text[copied..value]);
        out.push_str("***");
        copied = end;
        from = end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Whether an option of this name holds a secret: `password`, or a name ending in
/// `_password` (`sentinel_password`), any case.
fn is_password_option(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "password" || lower.ends_with("_password")
}

/// The path, query and fragment with the value of every password option masked.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let (query, fragment) = query
        .split_once('#')
        .map_or((query, None), |(q, f)| (q, Some(f)));
    let options: Vec<String> = query
        .split('&')
        .map(|option| match option.split_once('=') {
            Some((name, _)) if is_password_option(name) => format!("{name}=***"),
            _ => option.to_owned(),
        })
        .collect();
    let fragment = fragment.map_or(String::new(), |f| format!("#{f}"));
    format!("{path}?{}{fragment}", options.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of its own under the system's temporary directory, holding `text`.
    fn pem_file(name: &str, text: &str) -> String {
        let path =
            std::env::temp_dir().join(format!("fencelock-core-url-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("UTF-8").to_owned()
    }

    #[test]
    fn a_pem_file_must_hold_a_block_of_the_label_asked_for() {
        let cert = pem_file(
            "cert.pem",
            "-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----\n",
        );
        let key = pem_file(
            "key.pem",
            "junk\n-----BEGIN EC PRIVATE KEY-----\nMHc=\n-----END EC PRIVATE KEY-----\n",
        );
        let text = pem_file("text.pem", "[package]\nname = \"x\"\n");
        assert!(read_pem("tls_ca", &cert, "CERTIFICATE").is_ok());
        assert!(read_pem("tls_ca", &cert, "").is_ok());
        assert!(read_pem("tls_key", &key, "PRIVATE KEY").is_ok());
        assert!(read_pem("tls_key", &key, "").is_ok());
        let rule = |option: &str, path: &str, label: &str| match read_pem(option, path, label) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{path}: {other:?}"),
        };
        assert_eq!(
            rule("tls_ca", &key, "CERTIFICATE"),
            format!("tls_ca: {key:?} holds no PEM CERTIFICATE block")
        );
        assert_eq!(
            rule("tls_cert", &text, ""),
            format!("tls_cert: {text:?} holds no PEM block")
        );
        let missing = "/nonexistent/fencelock/ca.pem";
        let message = rule("tls_ca", missing, "");
        assert!(
            message.starts_with(&format!("tls_ca: cannot read {missing:?}: ")),
            "{message}"
        );
        for path in [cert, key, text] {
            let _ = std::fs::remove_file(path);
        }
    }

    #[test]
    fn a_client_certificate_and_its_key_come_together() {
        assert_eq!(client_identity(Some(1), Some(2)).ok(), Some(Some((1, 2))));
        assert_eq!(client_identity::<u8>(None, None).ok(), Some(None));
        for (cert, key) in [(Some(1), None), (None, Some(2))] {
            match client_identity(cert, key) {
                Err(Error::InvalidInput { what: "url", rule }) => {
                    assert!(rule.contains("go together: give both or neither"), "{rule}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn windows_take_a_unit_from_milliseconds_to_days() {
        let ok = |v: &str| parse_window("retention", v).ok();
        assert_eq!(ok("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(ok("36h"), Some(Duration::from_secs(36 * 3_600)));
        assert_eq!(ok("5m"), Some(Duration::from_secs(300)));
        assert_eq!(ok("90s"), Some(Duration::from_secs(90)));
        assert_eq!(ok("90"), Some(Duration::from_secs(90)));
        assert_eq!(ok("1500ms"), Some(Duration::from_millis(1500)));
        for bad in [
            "",
            "0",
            "0d",
            "d",
            "-1d",
            "1.5h",
            "7w",
            "99999999999999999d",
        ] {
            let err = parse_window("retention", bad).unwrap_err().to_string();
            assert!(err.contains("retention"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn timeouts_take_seconds_or_milliseconds_and_never_zero() {
        assert_eq!(parse_timeout("t", "5").ok(), Some(Duration::from_secs(5)));
        assert_eq!(parse_timeout("t", "5s").ok(), Some(Duration::from_secs(5)));
        assert_eq!(
            parse_timeout("t", "250ms").ok(),
            Some(Duration::from_millis(250))
        );
        for bad in ["0", "0ms", "", "soon", "-1", "5m", "1.5s"] {
            let error = parse_timeout("connect_timeout", bad).unwrap_err();
            assert!(
                error.to_string().contains("connect_timeout"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn percent_escapes_decode_and_bad_ones_are_refused() {
        assert_eq!(percent_decode("p%40ss+w").as_deref(), Some("p@ss+w"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("✓"));
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%ff"), None);
    }

    #[test]
    fn unencoded_userinfo_is_refused_without_echoing_it() {
        for url in [
            "redis://u:hun?ter2@h:6379",
            "redlock://u:hu/nter2@a:1,b:2,c:3/0",
            "etcd://:hunter#2@a:1",
            "postgres://u:hunter2/x@h/db",
        ] {
            let error = check_userinfo_encoded(url).unwrap_err();
            assert!(!error.to_string().contains("hunter"), "{error}");
        }
        for url in [
            "redis://u:p%3Fw@h:6379/0?prefix=x",
            "redis://h/x?note=a@b",
            "etcd://a:1,b:2",
            "postgres://u@h/db",
            "memory://",
        ] {
            assert!(check_userinfo_encoded(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn passwords_never_survive_redaction() {
        let table = [
            ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
            ("redis://user:hunter2@h:6379", "redis://user:***@h:6379"),
            (
                "etcd://root:hunter2@a:1,b:2?prefix=x",
                "etcd://root:***@a:1,b:2?prefix=x",
            ),
            ("postgres://u:p%40ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("memory://", "memory://"),
            ("redis://h/x?note=a@b", "redis://h/x?note=a@b"),
            ("not a url", "not a url"),
            (
                "postgres://h/db?sslmode=require&password=hunter2&x=1",
                "postgres://h/db?sslmode=require&password=***&x=1",
            ),
            (
                "postgresql://h/db?PASSWORD=hunter2",
                "postgresql://h/db?PASSWORD=***",
            ),
            // Unencoded `?`, `/` and `#` in a password.
            ("redis://u:hun?ter2@h:6379", "redis://u:***@h:6379"),
            (
                "redlock://u:hu/nter2@a:1,b:2,c:3/0",
                "redlock://u:***@a:1,b:2,c:3/0",
            ),
            ("etcd://:hunter#2@a:1", "etcd://:***@a:1"),
            // An option whose name ends in `_password` (a Redis Sentinel's own password).
            (
                "scheme://:hunter2@a:1,b:2/m?sentinel_password=hunter2&x=1",
                "scheme://:***@a:1,b:2/m?sentinel_password=***&x=1",
            ),
            ("x://h?no_password_here=1", "x://h?no_password_here=1"),
            // An `@` in an option value moves the options into the authority.
            (
                "redis://h:1/0?note=@&password=hunter2",
                "redis://h:***@&password=***",
            ),
        ];
        for (url, expected) in table {
            assert_eq!(redact(url), expected);
            assert!(!redact(url).contains("hunter2"));
        }
    }

    /// `Ok(true)` for an option of the table stores' (read), `Ok(false)` for another.
    fn read_shared(options: &mut TableStoreOptions, name: &str, value: &str) -> Result<bool> {
        let mut known = true;
        read_options(
            [(name, value)],
            &TableStoreOptions::declared(),
            options,
            |_, _, _| {
                known = false;
                true
            },
            "",
        )?;
        Ok(known)
    }

    #[test]
    fn table_store_options_default_to_what_they_declare() {
        assert_eq!(
            defaults_that_differ(&TableStoreOptions::declared(), || TableStoreOptions::new(
                58
            )),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn an_unknown_option_is_refused_naming_the_declared_ones_and_the_library_s() {
        let mut options = TableStoreOptions::new(58);
        let declared = TableStoreOptions::declared();
        match read_options(
            [("nope", "1")],
            &declared,
            &mut options,
            |_, _, _| false,
            "the libpq options host, port",
        ) {
            Err(Error::InvalidInput { what: "url", rule }) => assert_eq!(
                rule,
                "unknown option \"nope\"; this store reads namespace, table, create_table, \
                 connect_timeout, command_timeout, max_idle, retention, max_ttl and the libpq \
                 options host, port"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn table_store_options_read_their_own_and_leave_the_rest() {
        let mut options = TableStoreOptions::new(58);
        assert!(read_shared(&mut options, "namespace", "billing").unwrap());
        assert!(read_shared(&mut options, "max_ttl", "1s").unwrap());
        assert!(!read_shared(&mut options, "sslmode", "disable").unwrap());
        assert_eq!(options.namespace, "billing");
        assert_eq!(options.max_ttl, Duration::from_secs(1));
        assert!(read_shared(&mut options, "table", &"t".repeat(58)).unwrap());
        let rule = |name: &str, value: &str| match read_shared(
            &mut TableStoreOptions::new(58),
            name,
            value,
        ) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{name}={value}: expected an invalid url, got {other:?}"),
        };
        assert!(rule("table", &"t".repeat(59)).contains("at most 58 bytes"));
        assert!(rule("max_ttl", "25h").contains("at most 24h"));
        assert!(rule("create_table", "yes").contains("must be true or false"));
        assert!(rule("max_idle", "-1").contains("max_idle"));
    }

    #[test]
    fn a_scheme_not_listed_is_refused_naming_the_listed_ones() {
        assert!(check_scheme("mysql", &["mysql", "mariadb"]).is_ok());
        match check_scheme("redis", &["postgres", "postgresql"]) {
            Err(Error::InvalidInput { rule, .. }) => assert_eq!(
                rule,
                "the scheme must be postgres:// or postgresql://, not redis://"
            ),
            other => panic!("{other:?}"),
        }
    }
}
