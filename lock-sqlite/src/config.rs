//! [`SqliteConfig`]: which database file and how the store uses it, from a URL.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use fencelock_core::raw::url::{
    parse_window, percent_decode, query_pairs, read_options, OptionDoc, UrlOption,
};
use fencelock_core::{
    limits::MAX_TTL,
    raw::validate::{check_retention, DEFAULT_RETENTION},
};
use fencelock_core::{Error, Result};

/// `sqlite://`, this store's one scheme.
const SCHEME: &str = "sqlite";
/// The URL schemes this store answers to: its descriptor's, and the one
/// [`SqliteConfig::from_url`] accepts.
pub const URL_SCHEMES: &[&str] = &[SCHEME];
/// The default name of the lock table.
pub const DEFAULT_TABLE: &str = "fencelock_locks";
/// The default bound on one statement, including its wait for SQLite's write lock while other
/// connections write (SQLite's `busy_timeout`).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on opening the database and preparing it.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How far the host's wall clock may step back (an NTP step, an operator's `date`) without
/// letting a token run ahead of it through a row's removal: the `max_skew` of the retention
/// bound, [`min_retention`]. A constant, not a URL option: one host has one clock, and removal
/// stays sound whatever the clock does (the floor table), so only the runahead depends on it.
pub const MAX_CLOCK_STEP_BACK: Duration = Duration::from_secs(1);
/// The clock granule of a token: the wall clock is read in whole microseconds.
pub const TOKEN_GRANULE: Duration = Duration::from_micros(1);
/// The clock floor is read just before the acquire statement is sent, the expiry the removal
/// measures from a moment earlier: this covers the gap (microseconds in practice).
const READ_MARGIN: Duration = Duration::from_millis(1);
/// The shortest TTL this store accepts. An acquire may end in a durable commit (an `fsync`,
/// milliseconds on a disk: with `durable_grants=true`, or a token ahead of the clock), which a
/// shorter lease would spend most of its life on.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Where the database file is and how the store uses it. Build it with
/// [`SqliteConfig::from_url`] or [`SqliteConfig::new`].
///
/// # The URL
/// ```text
/// sqlite://PATH[?table=NAME&command_timeout=T&connect_timeout=T&retention=W&max_ttl=W&durable_grants=B]
/// ```
/// Everything between `sqlite://` and the first `?` is the file's path, percent-decoded and
/// otherwise taken as it is: there is no host part. So a third slash makes the path absolute
/// and two slashes leave it relative to the working directory, as in sqlx's own SQLite URLs:
///
/// | URL | file |
/// | --- | --- |
/// | `sqlite:///var/lib/myapp/locks.db` | `/var/lib/myapp/locks.db` |
/// | `sqlite://locks.db` | `./locks.db` |
/// | `sqlite://run/locks.db` | `./run/locks.db` (`run` is a directory, not a host) |
/// | `sqlite:///tmp/my%20locks.db?table=job_locks` | `/tmp/my locks.db`, table `job_locks` |
///
/// `sqlite:PATH` (one colon, no slashes) is accepted here as well, though not by `fencelock`'s
/// `connect` or `lockctl`, which pick the store by `scheme://`. `~` is not expanded. A `#` must
/// be written `%23`, a `?` in the path `%3F`. The file and its missing parent directories are
/// created. `:memory:` and `mode=memory` are refused: an in-memory database lives in one
/// process, which is what `memory://` is for.
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `table` | `fencelock_locks` | the lock table's name (`[A-Za-z_][A-Za-z0-9_]*`) |
/// | `command_timeout` | `5s` | bound on one statement, its wait for SQLite's write lock included |
/// | `connect_timeout` | `5s` | bound on opening the database file |
/// | `retention` | `7d` | how long a key's row stays after its last lease expired (below) |
/// | `max_ttl` | `24h` | the longest TTL the handle grants (at most 24 h) |
/// | `durable_grants` | `false` | `true`: every commit is synced to disk before it answers (below) |
///
/// `retention` (default `7d`; `ms`, `s`, `m`, `h`, `d`) is how long a key's row stays after its
/// last lease expired before it may be removed; it must exceed `max_ttl` (default and at most
/// `24h`), the longest TTL the handle grants, and be at least [`min_retention`] (1002 ms: a
/// token granule, 1 µs, plus [`MAX_CLOCK_STEP_BACK`] plus 1 ms, whole ms rounded up), so a key's
/// next token after its row went is the clock's, not ahead of it. See the crate docs,
/// "Per-key state".
///
/// `durable_grants` (default `false`): `true` opens the store's connections with `synchronous =
/// FULL`, so every commit (acquire, release, extend) `fsync`s the WAL before it answers. By
/// default they run at `NORMAL`, which `fsync`s only at checkpoints, and only an acquire whose
/// token ran ahead of the wall clock `fsync`s the WAL before it answers. See the crate docs,
/// "Crashes and the clock", for what that assumes of the clock.
#[derive(Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    pub(crate) path: PathBuf,
    pub(crate) table: String,
    pub(crate) command_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) retention: Duration,
    pub(crate) max_ttl: Duration,
    pub(crate) durable_grants: bool,
}

impl SqliteConfig {
    /// A configuration for the database file at `path`, with the defaults.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteConfig {
            path: path.into(),
            table: DEFAULT_TABLE.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            retention: DEFAULT_RETENTION,
            max_ttl: MAX_TTL,
            durable_grants: false,
        }
    }

    /// Parses a `sqlite://` URL (see [`SqliteConfig`] for the grammar).
    ///
    /// Fails with [`Error::InvalidInput`] on the `"url"` naming the rule: another scheme, an
    /// empty path, an in-memory database, an unknown option, a bad table name or timeout.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for any URL this parser refuses,
    /// as above (a retention window not above `max_ttl` or below [`min_retention`] included).
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .split_once(':')
            .filter(|(scheme, _)| *scheme == SCHEME)
            .map(|(_, rest)| rest.strip_prefix("//").unwrap_or(rest))
            .ok_or_else(|| {
                Error::invalid(
                    "url",
                    format!("a SQLite URL starts with sqlite://, not {url:?}"),
                )
            })?;
        if rest.contains('#') {
            return Err(Error::invalid(
                "url",
                "a '#' in a SQLite URL must be percent-encoded as %23",
            ));
        }
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let path = percent_decode(path).ok_or_else(|| {
            Error::invalid(
                "url",
                format!("the path {path:?} is not valid percent-encoded UTF-8"),
            )
        })?;
        if path.is_empty() {
            return Err(Error::invalid(
                "url",
                "the path of the database file is empty: sqlite:///abs/path.db or sqlite://rel/path.db",
            ));
        }
        if path == ":memory:" || path.starts_with("file:") {
            return Err(Error::invalid(
                "url",
                format!(
                    "{path:?} is not a file path: this store shares locks between processes \
                     through a file; use memory:// for locks within one process"
                ),
            ));
        }
        let pairs = query_pairs(query)?;
        if pairs
            .iter()
            .any(|(name, value)| name == "mode" && value == "memory")
        {
            return Err(Error::invalid(
                "url",
                "mode=memory is not a shared file: use memory:// for locks within one process",
            ));
        }
        let mut config = SqliteConfig::new(path);
        read_options(pairs, &options(), &mut config, |_, _, _| false, "")?;
        check_retention(config.retention, config.max_ttl)?;
        check_clock_retention(config.retention)?;
        Ok(config)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name of the lock table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The bound on one statement, including its wait for SQLite's write lock.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The bound on opening and preparing the database.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long a key's row stays after its last lease expired before it may be removed.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The longest TTL this handle grants.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// Whether every commit `fsync`s the WAL (`synchronous = FULL`, URL option
    /// `durable_grants=true`). `false` by default: only an acquire whose token ran ahead of the
    /// wall clock does (see the crate docs, "Crashes and the clock").
    pub fn durable_grants(&self) -> bool {
        self.durable_grants
    }

    /// `true`: every commit `fsync`s the WAL, as URL option `durable_grants=true` says.
    pub fn with_durable_grants(mut self, durable: bool) -> Self {
        self.durable_grants = durable;
        self
    }

    /// Sets the retention window and the longest TTL; the window must exceed `max_ttl`, which
    /// is at most 24 h, and be at least [`min_retention`] ([`Error::InvalidInput`] otherwise).
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a `max_ttl` above 24 h, or a
    /// `retention` not above it or below [`min_retention`].
    pub fn with_retention(mut self, retention: Duration, max_ttl: Duration) -> Result<Self> {
        self.max_ttl = check_max_ttl(max_ttl)?;
        check_retention(retention, max_ttl)?;
        check_clock_retention(retention)?;
        self.retention = retention;
        Ok(self)
    }

    /// The statements that upgrade this configuration's lock table from fence scheme 1 or 2
    /// (an earlier build's, which the store refuses to use) to fence scheme 3, in one
    /// transaction: counters are kept, so each key's next token is `max(counter + 1, clock)`,
    /// one jump upward to the clock. Run them once, with `sqlite3 locks.db`, after stopping
    /// every process of the older build: afterwards its acquires fail (the table checks
    /// `fence_scheme = 3`), so it cannot mint a token there. Running them on a table of
    /// scheme 3 changes nothing.
    pub fn fence_scheme_upgrade_sql(&self) -> String {
        crate::sql::upgrade_to_fence_scheme_3(&self.table)
    }

    /// Sets the lock table's name: `[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes, not starting
    /// with `sqlite_` (SQLite reserves those).
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a name that breaks these
    /// rules.
    pub fn with_table(mut self, table: &str) -> Result<Self> {
        self.table = check_table(table)?;
        Ok(self)
    }

    /// Sets the bound on one statement.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Sets the bound on opening and preparing the database.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

impl fmt::Display for SqliteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A path holds no secret; it is shown as the URL that names it (an absolute path
        // brings the third slash).
        let path = self.path.to_string_lossy();
        let path = path
            .replace('%', "%25")
            .replace('?', "%3F")
            .replace('#', "%23");
        write!(f, "{SCHEME}://{path}")?;
        let mut options = Vec::new();
        if self.table != DEFAULT_TABLE {
            options.push(format!("table={}", self.table));
        }
        if self.retention != DEFAULT_RETENTION {
            options.push(format!("retention={}ms", self.retention.as_millis()));
        }
        if self.max_ttl != MAX_TTL {
            options.push(format!("max_ttl={}ms", self.max_ttl.as_millis()));
        }
        if self.durable_grants {
            options.push("durable_grants=true".to_owned());
        }
        if !options.is_empty() {
            write!(f, "?{}", options.join("&"))?;
        }
        Ok(())
    }
}

impl fmt::Debug for SqliteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteConfig")
            .field("path", &self.path)
            .field("table", &self.table)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retention", &self.retention)
            .field("max_ttl", &self.max_ttl)
            .field("durable_grants", &self.durable_grants)
            .finish()
    }
}

/// Every URL option this store reads.
fn options() -> Vec<UrlOption<SqliteConfig>> {
    vec![
        UrlOption::new(
            "table",
            DEFAULT_TABLE,
            "the lock table's name, a plain identifier",
            |c: &mut SqliteConfig, v| {
                c.table = check_table(v)?;
                Ok(())
            },
        ),
        UrlOption::timeout(
            "command_timeout",
            "5s",
            "bound on one statement, its wait for SQLite's write lock included",
            |c: &mut SqliteConfig| &mut c.command_timeout,
        ),
        UrlOption::timeout(
            "connect_timeout",
            "5s",
            "bound on opening the database file",
            |c: &mut SqliteConfig| &mut c.connect_timeout,
        ),
        UrlOption::window(
            "retention",
            "7d",
            "a key's row is removed once it has not been granted for this long",
            |c: &mut SqliteConfig| &mut c.retention,
        ),
        UrlOption::new(
            "max_ttl",
            "24h",
            "the longest TTL this handle grants (at most 24 h)",
            |c: &mut SqliteConfig, v| {
                c.max_ttl = check_max_ttl(parse_window("max_ttl", v)?)?;
                Ok(())
            },
        ),
        UrlOption::flag(
            "durable_grants",
            "false",
            "`true`: every commit is synced to disk before it answers",
            |c: &mut SqliteConfig| &mut c.durable_grants,
        ),
    ]
}

/// What [`SqliteConfig::from_url`] reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options().iter().map(UrlOption::describe).collect()
}

impl FromStr for SqliteConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

/// The shortest retention window this store accepts: a token granule plus
/// [`MAX_CLOCK_STEP_BACK`] plus 1 ms, rounded up to a whole ms (windows are whole ms). A row
/// goes once its last expiry is that far behind, so the wall clock has passed its token by at
/// least this much less a step back, and the key's next token (`max(floor + 1, clock)`) is the
/// clock's. The crate docs, "Per-key state", make the argument.
pub fn min_retention() -> Duration {
    fencelock_core::raw::validate::clock_floor_retention(
        TOKEN_GRANULE,
        MAX_CLOCK_STEP_BACK,
        READ_MARGIN,
    )
}

/// Refuses a retention window below [`min_retention`], naming the smallest window allowed.
fn check_clock_retention(retention: Duration) -> Result<()> {
    let least = min_retention();
    if retention >= least {
        return Ok(());
    }
    Err(Error::invalid(
        "url",
        format!(
            "retention ({retention:?}) is too short: tokens are floored by the clock, and a row \
             removed less than one granule ({TOKEN_GRANULE:?}) plus the clock's largest step \
             back ({MAX_CLOCK_STEP_BACK:?}) plus 1 ms after its last lease lets the key's next \
             token run ahead of the clock; the smallest window allowed is {}ms",
            least.as_millis()
        ),
    ))
}

/// A longest TTL is at most [`MAX_TTL`].
fn check_max_ttl(max_ttl: Duration) -> Result<Duration> {
    if max_ttl > MAX_TTL {
        return Err(Error::invalid(
            "url",
            format!("max_ttl must be at most 24h, not {max_ttl:?}"),
        ));
    }
    Ok(max_ttl)
}

/// The table name is spliced into SQL (identifiers cannot be bound), so only plain identifiers
/// are accepted, and they are always quoted.
fn check_table(value: &str) -> Result<String> {
    let mut chars = value.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    let reserved = value.to_ascii_lowercase().starts_with("sqlite_");
    if !starts_well || !rest_ok || value.len() > 63 || reserved {
        return Err(Error::invalid(
            "url",
            format!(
                "table must match [A-Za-z_][A-Za-z0-9_]*, be at most 63 bytes and not start \
                 with sqlite_, not {value:?}"
            ),
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        assert_eq!(
            fencelock_core::raw::url::defaults_that_differ(&options(), || SqliteConfig::new(
                "/x/locks.db"
            )),
            Vec::<&str>::new()
        );
    }

    fn rule(url: &str) -> String {
        match SqliteConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn paths_are_absolute_with_three_slashes_and_relative_with_two() {
        let table: &[(&str, &str)] = &[
            (
                "sqlite:///var/lib/myapp/locks.db",
                "/var/lib/myapp/locks.db",
            ),
            ("sqlite://locks.db", "locks.db"),
            ("sqlite://run/locks.db", "run/locks.db"),
            ("sqlite://localhost/locks.db", "localhost/locks.db"),
            ("sqlite://./locks.db", "./locks.db"),
            ("sqlite://../up/locks.db", "../up/locks.db"),
            ("sqlite:locks.db", "locks.db"),
            ("sqlite:/abs/locks.db", "/abs/locks.db"),
            ("sqlite:///tmp/my%20locks.db", "/tmp/my locks.db"),
            ("sqlite:///tmp/a%3Fb%23c.db", "/tmp/a?b#c.db"),
            ("sqlite:///tmp/%E2%9C%93.db?table=t", "/tmp/✓.db"),
        ];
        for (url, path) in table {
            let config = SqliteConfig::from_url(url).unwrap();
            assert_eq!(config.path(), Path::new(path), "{url}");
        }
    }

    #[test]
    fn options_set_the_table_and_the_timeouts() {
        let config = SqliteConfig::from_url(
            "sqlite:///x.db?table=job_locks&command_timeout=250ms&connect_timeout=2",
        )
        .unwrap();
        assert_eq!(config.table(), "job_locks");
        assert_eq!(config.command_timeout(), Duration::from_millis(250));
        assert_eq!(config.connect_timeout(), Duration::from_secs(2));
        let config = SqliteConfig::from_url("sqlite:///x.db").unwrap();
        assert_eq!(config.table(), DEFAULT_TABLE);
        assert_eq!(config.command_timeout(), DEFAULT_COMMAND_TIMEOUT);
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.to_string(), "sqlite:///x.db");
        assert_eq!(
            SqliteConfig::from_url("sqlite://rel/x.db?table=t")
                .unwrap()
                .to_string(),
            "sqlite://rel/x.db?table=t"
        );
    }

    #[test]
    fn durable_grants_defaults_to_false_and_round_trips_through_the_url() {
        assert!(!SqliteConfig::from_url("sqlite:///x.db")
            .unwrap()
            .durable_grants());
        let config = SqliteConfig::from_url("sqlite:///x.db?durable_grants=true").unwrap();
        assert!(config.durable_grants());
        assert_eq!(config.to_string(), "sqlite:///x.db?durable_grants=true");
        assert_eq!(SqliteConfig::from_url(&config.to_string()).unwrap(), config);
        assert!(!config.with_durable_grants(false).durable_grants());
        assert!(rule("sqlite:///x.db?durable_grants=1").contains("durable_grants must be true"));
    }

    #[test]
    fn retention_defaults_to_seven_days_and_must_exceed_the_max_ttl() {
        let config = SqliteConfig::from_url("sqlite:///x.db").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(7 * 86_400));
        assert_eq!(config.max_ttl(), MAX_TTL);
        let config = SqliteConfig::from_url("sqlite:///x.db?retention=2s&max_ttl=1s").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(2));
        assert_eq!(config.max_ttl(), Duration::from_secs(1));
        assert_eq!(
            config.to_string(),
            "sqlite:///x.db?retention=2000ms&max_ttl=1000ms"
        );
        assert_eq!(SqliteConfig::from_url(&config.to_string()).unwrap(), config);
        assert!(rule("sqlite:///x.db?retention=1d").contains("must exceed the maximum TTL"));
        assert!(rule("sqlite:///x.db?retention=1s&max_ttl=1s").contains("must exceed"));
        assert!(rule("sqlite:///x.db?max_ttl=25h").contains("at most 24h"));
        assert!(SqliteConfig::new("x.db")
            .with_retention(Duration::from_secs(1), Duration::from_secs(2))
            .is_err());
    }

    #[test]
    fn a_window_below_a_granule_plus_the_clock_step_plus_1_ms_is_refused() {
        assert_eq!(min_retention(), Duration::from_millis(1002));
        let refused = rule("sqlite:///x.db?retention=1001ms&max_ttl=100ms");
        assert!(
            refused.contains("smallest window allowed is 1002ms"),
            "{refused}"
        );
        let config = SqliteConfig::from_url("sqlite:///x.db?retention=1002ms&max_ttl=100ms")
            .expect("the smallest window");
        assert_eq!(config.retention(), Duration::from_millis(1002));
        assert!(SqliteConfig::new("x.db")
            .with_retention(Duration::from_millis(1001), Duration::from_millis(100))
            .is_err());
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("postgres://h/db").contains("sqlite://"));
        assert!(rule("sqlite://").contains("empty"));
        assert!(rule("sqlite://?table=t").contains("empty"));
        assert!(rule("sqlite://:memory:").contains("memory://"));
        assert!(rule("sqlite:///x.db?mode=memory").contains("memory://"));
        assert!(rule("sqlite://file:x.db").contains("not a file path"));
        assert!(rule("sqlite:///x.db#frag").contains("%23"));
        assert!(rule("sqlite:///x.db?tabel=t").contains("unknown option \"tabel\""));
        assert!(rule("sqlite:///x.db?table=a;drop").contains("table"));
        assert!(rule("sqlite:///x.db?table=sqlite_master").contains("sqlite_"));
        assert!(rule("sqlite:///x.db?table=1x").contains("table"));
        assert!(rule(&format!("sqlite:///x.db?table={}", "t".repeat(64))).contains("63"));
        assert!(rule("sqlite:///x.db?command_timeout=0").contains("command_timeout"));
        assert!(rule("sqlite:///x.db?connect_timeout=soon").contains("connect_timeout"));
        assert!(rule("sqlite:///x%zz.db").contains("percent"));
    }
}
