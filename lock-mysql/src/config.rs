//! [`MysqlConfig`]: where the server is and how the store uses it, from a URL.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fencelock_core::raw::url::{
    check_scheme, client_identity, read_options, redact, OptionDoc, TableStoreOptions, TlsFiles,
    TlsTarget, UrlOption,
};
use fencelock_core::raw::validate::check_retention;
use fencelock_core::{Error, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use url::Url;

use crate::keys::Space;
use crate::sql;

/// `mysql://`, the scheme sqlx's MySQL driver reads.
const MYSQL_SCHEME: &str = "mysql";
/// The URL schemes this store answers to: its descriptor's, and the ones
/// [`MysqlConfig::from_url`] accepts.
pub const URL_SCHEMES: &[&str] = &[MYSQL_SCHEME, "mariadb"];
/// The default namespace: keys of stores with different namespaces (or fence tables) never
/// contend.
pub const DEFAULT_NAMESPACE: &str = fencelock_core::raw::url::DEFAULT_NAMESPACE;
/// The default name of the fence table (in the URL's database).
pub const DEFAULT_TABLE: &str = fencelock_core::raw::url::DEFAULT_TABLE;
/// The default bound on opening one connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = fencelock_core::raw::url::DEFAULT_CONNECT_TIMEOUT;
/// The default bound on one statement that does not wait for a lock.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = fencelock_core::raw::url::DEFAULT_COMMAND_TIMEOUT;
/// The default number of idle connections a store keeps for reuse.
pub const DEFAULT_MAX_IDLE: usize = fencelock_core::raw::url::DEFAULT_MAX_IDLE;
/// The shortest TTL this store accepts: the server's idle timeout (`wait_timeout`) counts
/// whole seconds, so TTLs are rounded up to whole seconds and one second is the least.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// How far the server's wall clock may step back (an NTP step, an operator's `date`) without
/// letting a token run ahead of it through a row's removal: the `max_skew` of the retention
/// bound, [`min_retention`]. A constant, not a URL option: one server's clock mints every token
/// and measures every row's idleness, and removal stays sound whatever that clock does (the
/// floor table), so only the runahead depends on it.
pub const MAX_CLOCK_STEP_BACK: Duration = Duration::from_secs(1);
/// The clock granule of a token: the server's clock is read in whole microseconds.
pub const TOKEN_GRANULE: Duration = Duration::from_micros(1);
/// The design's margin between the clock reading a row's idleness counts from and the one its
/// token was floored by; here both are the one statement's start (`NOW(6)`, `UTC_TIMESTAMP(6)`).
const READ_MARGIN: Duration = Duration::from_millis(1);

/// The longest fence table name: the floor table's adds "_floor", and MySQL names are at most
/// 64 bytes.
const TABLE_MAX_LEN: usize = 58;

/// The query-string options passed on to the sqlx driver unchanged; anything else is
/// rejected, so a typo such as `namepsace=` cannot silently put locks in the default namespace.
const SQLX_OPTIONS: &[&str] = &["charset", "collation", "statement-cache-capacity"];

/// How to reach MySQL or MariaDB and where to keep the fencing counters.
///
/// Built from a URL by [`MysqlConfig::from_url`]:
///
/// ```text
/// mysql://[user[:password]@]host[:port]/database?option=value&…
/// mariadb://…   (the same)
/// ```
///
/// The database is required: it holds the fence table.
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `sslmode` | `prefer` (`verify-full` with `tls_ca`) | `disable`, `prefer`, `require`, `verify-ca`, `verify-full` (the names of the PostgreSQL store; MySQL's `DISABLED` … `VERIFY_IDENTITY` are accepted too); the last three need the crate feature `tls` |
/// | `sslrootcert`, `sslcert`, `sslkey` | | CA certificate, client certificate and key files (read by sqlx when it connects) |
/// | `tls_ca` | | PEM file of the CA that signs the server's certificate (the name the other stores use); implies `sslmode=verify-full` (MySQL's `VERIFY_IDENTITY`) unless `sslmode` is given |
/// | `tls_cert`, `tls_key` | | PEM files of a client certificate and its key, for a server that asks for one; given together |
/// | `charset`, `collation`, `statement-cache-capacity` | | as in sqlx |
/// | `namespace` | `default` | 1–63 bytes, no NUL; part of every key's lock name |
/// | `table` | `fencelock_fence` | the fence table in the URL's database (`[A-Za-z_][A-Za-z0-9_]*`, at most 58 bytes, so its floor table `<table>_floor` fits MySQL's 64); created if missing (see `create_table`); part of every key's lock name |
/// | `create_table` | `true` | `false`: never create the fence table or its floor table; `connect` fails (not retryable) if either is missing, so a user without `CREATE` never tries. An administrator creates them with [`MysqlConfig::fence_table_ddl`] and [`MysqlConfig::floor_table_ddl`] |
/// | `connect_timeout` | `5s` | bound on opening one connection: `10` (seconds), `2s` or `250ms` |
/// | `command_timeout` | `10s` | bound on one statement that does not wait for a lock |
/// | `max_idle` | `16` | idle connections kept for reuse; `0` closes each one after use |
/// | `retention` | `7d` | a key's fence row may be removed once it has not been bumped for this long and nobody holds the key (`ms`, `s`, `m`, `h`, `d`); must exceed `max_ttl` and be at least [`min_retention`], 1002 ms (a token granule of 1 µs, plus [`MAX_CLOCK_STEP_BACK`], plus 1 ms, whole ms rounded up); see the crate docs ("Per-key state") |
/// | `max_ttl` | `24h` | the longest TTL this handle grants (at most 24 h) |
///
/// The `tls_*` files are read when the URL is parsed (a missing file, or one without a PEM
/// block, is [`Error::InvalidInput`] naming the option) and are never printed; each is refused
/// next to its twin (`sslrootcert`, `sslcert`, `sslkey`) and with `sslmode=disable`.
///
/// Unknown options are rejected. `Debug` and `Display` never show the password.
#[derive(Clone)]
pub struct MysqlConfig {
    pub(crate) connect: MySqlConnectOptions,
    redacted: String,
    pub(crate) database: String,
    /// The options every table store reads alike.
    pub(crate) options: TableStoreOptions,
}

impl MysqlConfig {
    /// Parses a `mysql://` or `mariadb://` URL (see the type's docs for the options).
    ///
    /// Fails with [`Error::InvalidInput`] naming `"url"` for a malformed URL, another scheme, a
    /// missing or malformed database name, an unknown or malformed option, or `sslmode=require`
    /// (and stricter) without the `tls` feature. The message never contains the password.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for any URL this parser refuses,
    /// as above (a TLS file that cannot be read included).
    pub fn from_url(url: &str) -> Result<Self> {
        fencelock_core::raw::url::check_userinfo_encoded(url)?;
        let bad = |rule: String| Error::invalid("url", rule);
        let parsed = Url::parse(url).map_err(|e| bad(format!("not a URL: {e}")))?;
        check_scheme(parsed.scheme(), URL_SCHEMES)?;
        let redacted = redact(parsed.as_str());
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad(format!("{redacted}: the URL names no host")));
        }
        let database = parsed.path().trim_start_matches('/');
        let database = check_database(
            &fencelock_core::raw::url::percent_decode(database).ok_or_else(|| {
                bad(format!(
                    "{redacted}: the database name is not valid percent-encoded UTF-8"
                ))
            })?,
        )?;

        let config = MysqlConfig {
            connect: MySqlConnectOptions::new(),
            redacted,
            database,
            options: TableStoreOptions::new(TABLE_MAX_LEN),
        };
        let mut parsing = Parsing {
            config,
            tls: TlsFiles::default(),
            ssl_mode: None,
            passed_on: Vec::new(),
        };
        read_options(
            parsed.query_pairs(),
            &options(),
            &mut parsing,
            |parsing, name, value| {
                let known = SQLX_OPTIONS.contains(&name);
                if known {
                    parsing.passed_on.push((name.to_owned(), value.to_owned()));
                }
                known
            },
            &format!("the sqlx options {}", SQLX_OPTIONS.join(", ")),
        )?;
        let Parsing {
            mut config,
            tls,
            ssl_mode,
            passed_on,
        } = parsing;
        check_retention(config.options.retention, config.options.max_ttl)?;
        check_clock_retention(config.options.retention)?;
        check_tls(&tls, &passed_on, ssl_mode)?;
        let ssl_mode = ssl_mode.unwrap_or(if tls.ca.is_some() {
            // A CA is named to check the server against it: check the host name too.
            MySqlSslMode::VerifyIdentity
        } else {
            MySqlSslMode::Preferred
        });
        if requires_tls(ssl_mode) && !cfg!(feature = "tls") {
            return Err(bad(
                "sslmode=require, verify-ca and verify-full need fencelock-mysql's `tls` feature"
                    .into(),
            ));
        }

        let mut for_sqlx = parsed.clone();
        // sqlx reads host, port, user, password and database from any scheme; say mysql.
        let _ = for_sqlx.set_scheme(MYSQL_SCHEME);
        if passed_on.is_empty() {
            for_sqlx.set_query(None);
        } else {
            for_sqlx.query_pairs_mut().clear().extend_pairs(passed_on);
        }
        config.connect = MySqlConnectOptions::from_str(for_sqlx.as_str())
            .map_err(|e| bad(format!("{}: {e}", config.redacted)))?
            .ssl_mode(ssl_mode);
        config.connect = apply_tls(tls, config.connect);
        Ok(config)
    }

    /// The namespace hashed into every key.
    pub fn namespace(&self) -> &str {
        &self.options.namespace
    }

    /// The fence table as `` `database`.`table` ``.
    pub fn fence_table(&self) -> String {
        format!("`{}`.`{}`", self.database, self.options.table)
    }

    /// The floor table beside the fence table, `` `database`.`table_floor` ``: one row, the
    /// highest token of any removed fence row.
    pub fn floor_table(&self) -> String {
        format!("`{}`.`{}_floor`", self.database, self.options.table)
    }

    /// The statements that create the floor table and its one row, for an administrator who
    /// creates the tables ahead of time (with [`MysqlConfig::fence_table_ddl`]).
    pub fn floor_table_ddl(&self) -> String {
        sql::floor_table_ddl(&self.floor_table())
    }

    /// The statements that upgrade a fence table of fence scheme 1 or 2 (an earlier build's,
    /// which the store refuses) to fence scheme 3: they put the `fence_scheme` column checked
    /// to be 3 in place of the old one, add the floor table where it is missing and record the
    /// scheme in the table's comment. Counters are kept, so each key's next token is
    /// `max(counter + 1, clock)`: one jump, upward, to the server's clock. Run them once (with
    /// the `mysql` client, or any that takes several statements) after stopping every store of
    /// the older build: from then on that build refuses the table and cannot write a fence
    /// row, so it never mints there. Running them again changes nothing.
    pub fn fence_scheme_upgrade_sql(&self) -> String {
        sql::upgrade_to_fence_scheme_3(&self.database, &self.options.table)
    }

    /// How long a fence row stays after its last bump (while nobody holds its key).
    pub fn retention(&self) -> Duration {
        self.options.retention
    }

    /// The longest TTL this handle grants.
    pub fn max_ttl(&self) -> Duration {
        self.options.max_ttl
    }

    /// Whether the store creates the fence table and its floor table when they are missing
    /// (the default). See [`MysqlConfig::with_create_table`].
    pub fn create_table(&self) -> bool {
        self.options.create_table
    }

    /// `false`: the store never creates the fence table or its floor table (URL option
    /// `create_table=false`), so a user without `CREATE` never tries; with either missing,
    /// `connect` (or a lazy handle's first operation) fails with a non-retryable
    /// [`Error::Store`] that names the table and [`MysqlConfig::fence_table_ddl`] or
    /// [`MysqlConfig::floor_table_ddl`].
    pub fn with_create_table(mut self, create: bool) -> Self {
        self.options.create_table = create;
        self
    }

    /// The statement that creates the fence table, for an administrator who creates it ahead
    /// of time (the store then needs no `CREATE` privilege). The table records lock-id scheme
    /// [`LOCK_ID_SCHEME`](crate::LOCK_ID_SCHEME) in its comment.
    pub fn fence_table_ddl(&self) -> String {
        sql::fence_table_ddl(&self.fence_table())
    }

    /// The statement that adds the `label` column (holder labels) to a fence table made before
    /// labels, for an administrator of a store with `create_table=false`; a store that may
    /// create the table adds the column itself. Until it is there, labels stay on the lease
    /// and `status` shows none.
    pub fn label_column_ddl(&self) -> String {
        sql::label_column_ddl(&self.fence_table())
    }

    /// The lock space of this configuration: the fence table and the namespace, which together
    /// with the key make the lock name.
    pub(crate) fn space(&self) -> Space<'_> {
        Space {
            database: &self.database,
            table: &self.options.table,
            namespace: &self.options.namespace,
        }
    }

    /// The bound on opening one connection.
    pub fn connect_timeout(&self) -> Duration {
        self.options.connect_timeout
    }

    /// The bound on one statement that does not wait for a lock.
    pub fn command_timeout(&self) -> Duration {
        self.options.command_timeout
    }

    /// How many idle connections a store keeps for reuse.
    pub fn max_idle(&self) -> usize {
        self.options.max_idle
    }

    /// Sets the bound on opening one connection.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }

    /// Sets the bound on one statement that does not wait for a lock.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.options.command_timeout = timeout;
        self
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

impl fmt::Display for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("url", &self.redacted)
            .field("namespace", &self.options.namespace)
            .field("fence_table", &self.fence_table())
            .field("connect_timeout", &self.options.connect_timeout)
            .field("command_timeout", &self.options.command_timeout)
            .field("max_idle", &self.options.max_idle)
            .field("retention", &self.options.retention)
            .field("max_ttl", &self.options.max_ttl)
            .field("create_table", &self.options.create_table)
            .finish()
    }
}

impl FromStr for MysqlConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

/// Refuses a `tls_*` option next to its twin (which one would win is not obvious), a
/// client certificate without its key or the other way round, and `tls_*` with TLS off.
/// `passed_on` holds the twins under sqlx's names (`ssl-ca`, `ssl-cert`, `ssl-key`).
fn check_tls(
    tls: &TlsFiles,
    passed_on: &[(String, String)],
    ssl_mode: Option<MySqlSslMode>,
) -> Result<()> {
    let given = |name: &str| passed_on.iter().any(|(n, _)| n == name);
    let twins = [
        ("tls_ca", tls.ca.is_some(), "ssl-ca", "sslrootcert"),
        ("tls_cert", tls.cert.is_some(), "ssl-cert", "sslcert"),
        ("tls_key", tls.key.is_some(), "ssl-key", "sslkey"),
    ];
    for (ours, set, sqlx_name, theirs) in twins {
        if set && given(sqlx_name) {
            return Err(Error::invalid(
                "url",
                format!("{ours} and {theirs} name the same file; give one"),
            ));
        }
    }
    client_identity(tls.cert.as_ref(), tls.key.as_ref())?;
    let any = tls.ca.is_some() || tls.cert.is_some();
    if any && matches!(ssl_mode, Some(MySqlSslMode::Disabled)) {
        return Err(Error::invalid(
            "url",
            "tls_ca, tls_cert and tls_key need TLS, and sslmode=disable turns it off",
        ));
    }
    Ok(())
}

/// The `tls_*` files applied to sqlx's options after it parsed the rest.
fn apply_tls(tls: TlsFiles, mut connect: MySqlConnectOptions) -> MySqlConnectOptions {
    if let Some(ca) = tls.ca {
        connect = connect.ssl_ca_from_pem(ca);
    }
    if let (Some(cert), Some(key)) = (tls.cert, tls.key) {
        connect = connect
            .ssl_client_cert_from_pem(cert)
            .ssl_client_key_from_pem(key);
    }
    connect
}

/// The PostgreSQL store's `sslmode` names, and MySQL's own.
/// A URL being read: the config it makes, the TLS files and `sslmode` it names and the
/// options it passes on to sqlx.
#[derive(Debug)]
struct Parsing {
    config: MysqlConfig,
    tls: TlsFiles,
    ssl_mode: Option<MySqlSslMode>,
    passed_on: Vec<(String, String)>,
}

impl AsMut<TableStoreOptions> for Parsing {
    fn as_mut(&mut self) -> &mut TableStoreOptions {
        &mut self.config.options
    }
}

impl AsMut<TlsFiles> for Parsing {
    fn as_mut(&mut self) -> &mut TlsFiles {
        &mut self.tls
    }
}

impl TlsTarget for Parsing {}

/// Every URL option this store reads itself (sqlx reads the few it is passed).
fn options() -> Vec<UrlOption<Parsing>> {
    /// A libpq-style name for one of sqlx's own options, passed on under sqlx's name.
    fn pass_on(parsing: &mut Parsing, name: &str, value: &str) {
        parsing.passed_on.push((name.to_owned(), value.to_owned()));
    }
    let mut options = TableStoreOptions::declared();
    options.extend([
        UrlOption::new(
            "sslmode",
            "prefer (verify-full with `tls_ca`)",
            "`disable`, `prefer`, `require`, `verify-ca`, `verify-full` (or MySQL's names)",
            |p: &mut Parsing, v| {
                p.ssl_mode = Some(parse_ssl_mode(v)?);
                Ok(())
            },
        ),
        UrlOption::new(
            "sslrootcert",
            "",
            "as `tls_ca`, passed to sqlx as `ssl-ca`",
            |p: &mut Parsing, v| {
                pass_on(p, "ssl-ca", v);
                Ok(())
            },
        ),
        UrlOption::new(
            "sslcert",
            "",
            "as `tls_cert`, passed to sqlx as `ssl-cert`",
            |p: &mut Parsing, v| {
                pass_on(p, "ssl-cert", v);
                Ok(())
            },
        ),
        UrlOption::new(
            "sslkey",
            "",
            "as `tls_key`, passed to sqlx as `ssl-key`",
            |p: &mut Parsing, v| {
                pass_on(p, "ssl-key", v);
                Ok(())
            },
        ),
    ]);
    options.extend(TlsFiles::declared());
    options
}

/// What [`MysqlConfig::from_url`] reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options().iter().map(UrlOption::describe).collect()
}

fn parse_ssl_mode(value: &str) -> Result<MySqlSslMode> {
    Ok(match &*value.to_ascii_lowercase() {
        "disable" | "disabled" => MySqlSslMode::Disabled,
        "prefer" | "preferred" => MySqlSslMode::Preferred,
        "require" | "required" => MySqlSslMode::Required,
        "verify-ca" | "verify_ca" => MySqlSslMode::VerifyCa,
        "verify-full" | "verify_identity" => MySqlSslMode::VerifyIdentity,
        _ => {
            return Err(Error::invalid(
                "url",
                format!(
                "sslmode must be disable, prefer, require, verify-ca or verify-full, not {value:?}"
            ),
            ))
        }
    })
}

fn requires_tls(mode: MySqlSslMode) -> bool {
    matches!(
        mode,
        MySqlSslMode::Required | MySqlSslMode::VerifyCa | MySqlSslMode::VerifyIdentity
    )
}

/// The shortest retention window this store accepts: a token granule plus
/// [`MAX_CLOCK_STEP_BACK`] plus 1 ms, rounded up to a whole ms (windows are whole ms). A row
/// goes once the server's clock is that far past its last bump, so past its token, and the
/// key's next token (`max(floor + 1, clock)`) is the clock's. The crate docs, "Per-key state",
/// make the argument.
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
            "retention ({retention:?}) is too short: tokens are floored by the server's clock, \
             and a fence row removed less than one granule ({TOKEN_GRANULE:?}) plus the clock's \
             largest step back ({MAX_CLOCK_STEP_BACK:?}) plus 1 ms after its last bump lets the \
             key's next token run ahead of the clock; the smallest window allowed is {}ms",
            least.as_millis()
        ),
    ))
}

/// The database is spliced into SQL as the fence table's qualifier, quoted: letters, digits,
/// `_`, `$` and `-` (common in database names), never a backtick.
fn check_database(value: &str) -> Result<String> {
    let ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '-'));
    if value.is_empty() || value.len() > 64 || !ok {
        return Err(Error::invalid(
            "url",
            format!(
                "the URL's path must name the database that holds the fence table \
                 (letters, digits, _, $ and -, at most 64 bytes), not {value:?}"
            ),
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::limits::MAX_TTL;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        let fresh = || Parsing {
            config: MysqlConfig::from_url("mysql://u@h/db").expect("parses"),
            tls: TlsFiles::default(),
            ssl_mode: None,
            passed_on: Vec::new(),
        };
        assert_eq!(
            fencelock_core::raw::url::defaults_that_differ(&options(), fresh),
            Vec::<&str>::new()
        );
    }

    fn rule(url: &str) -> String {
        match MysqlConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_defaults_and_options() {
        let cases: &[(&str, &str, &str, &str, u16, Duration)] = &[
            (
                "mysql://u@127.0.0.1:3307/app",
                "default",
                "`app`.`fencelock_fence`",
                "127.0.0.1",
                3307,
                DEFAULT_CONNECT_TIMEOUT,
            ),
            (
                "mariadb://u:pw@h/my-app?namespace=billing&table=fence_v1&connect_timeout=2",
                "billing",
                "`my-app`.`fence_v1`",
                "h",
                3306,
                Duration::from_secs(2),
            ),
            (
                "mysql://h/db?connect_timeout=250ms&sslmode=disable&charset=utf8mb4",
                "default",
                "`db`.`fencelock_fence`",
                "h",
                3306,
                Duration::from_millis(250),
            ),
            (
                "mysql://h:1/db?namespace=%F0%9F%94%92%20space",
                "🔒 space",
                "`db`.`fencelock_fence`",
                "h",
                1,
                DEFAULT_CONNECT_TIMEOUT,
            ),
        ];
        for (url, namespace, table, host, port, connect_timeout) in cases {
            let config = MysqlConfig::from_url(url).unwrap();
            assert_eq!(config.namespace(), *namespace, "{url}");
            assert_eq!(config.fence_table(), *table, "{url}");
            assert_eq!(config.connect.get_host(), *host, "{url}");
            assert_eq!(config.connect.get_port(), *port, "{url}");
            assert_eq!(config.connect_timeout(), *connect_timeout, "{url}");
        }
    }

    #[test]
    fn our_options_are_not_passed_to_sqlx() {
        let config = MysqlConfig::from_url(
            "mysql://u@h/db?namespace=n&max_idle=0&command_timeout=3s&sslmode=disable",
        )
        .unwrap();
        assert_eq!(config.max_idle(), 0);
        assert_eq!(config.command_timeout(), Duration::from_secs(3));
        assert!(matches!(
            config.connect.get_ssl_mode(),
            MySqlSslMode::Disabled
        ));
        assert!(config
            .fence_table_ddl()
            .starts_with("CREATE TABLE IF NOT EXISTS `db`.`fencelock_fence`"));
        assert_eq!(config.connect.get_database(), Some("db"));
        assert_eq!(config.connect.get_username(), "u");
        for (mode, expected) in [
            ("prefer", MySqlSslMode::Preferred),
            ("DISABLED", MySqlSslMode::Disabled),
        ] {
            let config = MysqlConfig::from_url(&format!("mysql://h/db?sslmode={mode}")).unwrap();
            assert_eq!(
                format!("{:?}", config.connect.get_ssl_mode()),
                format!("{expected:?}")
            );
        }
    }

    #[test]
    fn passwords_never_print() {
        for url in [
            "mysql://user:s3cr%40t@h/db",
            "mariadb://user:s3cr%40t@h/db?namespace=n",
        ] {
            let config = MysqlConfig::from_url(url).unwrap();
            for shown in [
                config.to_string(),
                format!("{config:?}"),
                config.redacted().to_owned(),
            ] {
                assert!(!shown.contains("s3cr"), "{shown}");
                assert!(shown.contains("***"), "{shown}");
            }
        }
        let shown = MysqlConfig::from_url("mysql://user:pw@h/db")
            .unwrap()
            .to_string();
        assert_eq!(shown, "mysql://user:***@h/db");
        // A rejected URL does not echo the password either.
        for bad in [
            "mysql://user:s3cret@h/db?namepsace=x",
            "mysql://user:s3cret@h/",
            "mysql://user:s3cret@h/db?sslmode=sometimes",
        ] {
            let message = rule(bad);
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn retention_defaults_to_seven_days_and_must_exceed_the_max_ttl() {
        let config = MysqlConfig::from_url("mysql://u@h/db").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(7 * 86_400));
        assert_eq!(config.max_ttl(), MAX_TTL);
        let config = MysqlConfig::from_url("mysql://u@h/db?retention=2s&max_ttl=1s").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(2));
        assert_eq!(config.max_ttl(), Duration::from_secs(1));
        assert!(format!("{config:?}").contains("retention: 2s"));
        assert_eq!(config.floor_table(), "`db`.`fencelock_fence_floor`");
        assert!(rule("mysql://u@h/db?retention=1d").contains("must exceed the maximum TTL"));
        assert!(rule("mysql://u@h/db?retention=1s&max_ttl=1s").contains("must exceed"));
        assert!(rule("mysql://u@h/db?max_ttl=25h").contains("at most 24h"));
    }

    #[test]
    fn a_window_below_a_granule_plus_the_clock_step_plus_1_ms_is_refused() {
        assert_eq!(min_retention(), Duration::from_millis(1002));
        let refused = rule("mysql://u@h/db?retention=1001ms&max_ttl=100ms");
        assert!(
            refused.contains("smallest window allowed is 1002ms"),
            "{refused}"
        );
        let config = MysqlConfig::from_url("mysql://u@h/db?retention=1002ms&max_ttl=100ms")
            .expect("the smallest window");
        assert_eq!(config.retention(), Duration::from_millis(1002));
        assert!(rule(&format!("mysql://h/db?table={}", "t".repeat(59))).contains("58"));
        assert!(MysqlConfig::from_url(&format!("mysql://h/db?table={}", "t".repeat(58))).is_ok());
    }

    #[test]
    fn create_table_defaults_to_true_and_is_read_from_the_url_or_set() {
        let config = MysqlConfig::from_url("mysql://u@h/db").unwrap();
        assert!(config.create_table());
        let config = MysqlConfig::from_url("mysql://u@h/db?create_table=false").unwrap();
        assert!(!config.create_table());
        assert!(format!("{config:?}").contains("create_table: false"));
        assert!(config.with_create_table(true).create_table());
        let config = MysqlConfig::from_url("mysql://u@h/db?create_table=true").unwrap();
        assert!(!config.with_create_table(false).create_table());
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("postgres://h/db").contains("mysql://"));
        assert!(rule("not a url").contains("not a URL"));
        assert!(rule("mysql://h/db?namepsace=x").contains("unknown option \"namepsace\""));
        assert!(rule("mysql://h/db?namespace=").contains("namespace"));
        assert!(rule(&format!("mysql://h/db?namespace={}", "n".repeat(64))).contains("63"));
        assert!(rule("mysql://h/db?table=x;drop").contains("table"));
        assert!(rule("mysql://h/db?table=1x").contains("table"));
        assert!(rule("mysql://h/").contains("database"));
        assert!(rule("mysql://h").contains("database"));
        assert!(rule("mysql://h/d%60b").contains("database"));
        assert!(rule("mysql://h/db?connect_timeout=0").contains("connect_timeout"));
        assert!(rule("mysql://h/db?connect_timeout=soon").contains("connect_timeout"));
        assert!(rule("mysql://h/db?max_idle=-1").contains("max_idle"));
        assert!(rule("mysql://h/db?create_table=0").contains("create_table must be true or false"));
        assert!(rule("mysql://h/db?sslmode=sometimes").contains("sslmode"));
    }

    /// A file holding `contents` in this test process's own directory under the temp dir.
    fn file(name: &str, contents: &str) -> String {
        let dir = std::env::temp_dir().join(format!("lock-mysql-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_str().unwrap().to_owned()
    }

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nKEYMATERIAL\n-----END PRIVATE KEY-----\n";

    fn mode(config: &MysqlConfig) -> String {
        format!("{:?}", config.connect.get_ssl_mode())
    }

    #[test]
    fn tls_options_map_to_sqlx_pem_options_and_imply_verify_identity() {
        let ca = file("ca.pem", PEM);
        let cert = file("client.pem", PEM);
        let key = file("client.key", KEY);
        let config = MysqlConfig::from_url(&format!("mysql://u@h/db?tls_ca={ca}"));
        if !cfg!(feature = "tls") {
            assert!(rule(&format!("mysql://u@h/db?tls_ca={ca}")).contains("`tls` feature"));
            return;
        }
        let config = config.unwrap();
        assert_eq!(mode(&config), format!("{:?}", MySqlSslMode::VerifyIdentity));
        // The PEM's contents reached sqlx's options, not a path for it to read later.
        let shown = format!("{:?}", config.connect);
        assert!(shown.contains("ssl_ca: Some(Inline("), "{shown}");
        // An sslmode given in the URL wins over the implied verify-full, in either order.
        for url in [
            format!("mysql://u@h/db?sslmode=verify-ca&tls_ca={ca}"),
            format!("mysql://u@h/db?tls_ca={ca}&sslmode=VERIFY_CA"),
        ] {
            let config = MysqlConfig::from_url(&url).unwrap();
            assert_eq!(
                mode(&config),
                format!("{:?}", MySqlSslMode::VerifyCa),
                "{url}"
            );
        }
        // A client certificate alone does not change sslmode.
        let config = MysqlConfig::from_url(&format!(
            "mysql://u@h/db?sslmode=require&tls_cert={cert}&tls_key={key}"
        ))
        .unwrap();
        assert_eq!(mode(&config), format!("{:?}", MySqlSslMode::Required));
        for shown in [config.to_string(), format!("{config:?}")] {
            assert!(!shown.contains("KEYMATERIAL"), "{shown}");
        }
        let config =
            MysqlConfig::from_url(&format!("mysql://u@h/db?tls_cert={cert}&tls_key={key}"))
                .unwrap();
        assert_eq!(mode(&config), format!("{:?}", MySqlSslMode::Preferred));
    }

    #[test]
    fn bad_tls_options_are_invalid_input_naming_the_option() {
        let ca = file("ca2.pem", PEM);
        let cert = file("client2.pem", PEM);
        let key = file("client2.key", KEY);
        let not_pem = file("not.pem", "KEYMATERIAL without a header");
        let missing = format!("{ca}.missing");
        assert!(rule(&format!("mysql://h/db?tls_ca={missing}")).contains("tls_ca: cannot read"));
        let message = rule(&format!("mysql://h/db?tls_key={not_pem}&tls_cert={cert}"));
        assert!(
            message.contains("tls_key") && message.contains("no PEM block"),
            "{message}"
        );
        assert!(!message.contains("KEYMATERIAL"), "{message}");
        assert!(rule(&format!("mysql://h/db?tls_cert={cert}")).contains("go together"));
        assert!(rule(&format!("mysql://h/db?tls_key={key}")).contains("go together"));
        assert!(rule(&format!("mysql://h/db?tls_ca={ca}&sslrootcert={ca}")).contains("sslrootcert"));
        assert!(rule(&format!(
            "mysql://h/db?tls_cert={cert}&tls_key={key}&sslcert={cert}"
        ))
        .contains("sslcert"));
        assert!(rule(&format!(
            "mysql://h/db?tls_cert={cert}&tls_key={key}&sslkey={key}"
        ))
        .contains("sslkey"));
        assert!(
            rule(&format!("mysql://h/db?tls_ca={ca}&sslmode=disable")).contains("sslmode=disable")
        );
        assert!(rule(&format!(
            "mysql://h/db?sslmode=DISABLED&tls_cert={cert}&tls_key={key}"
        ))
        .contains("sslmode=disable"));
    }

    #[test]
    fn strict_sslmodes_need_the_tls_feature() {
        let result = MysqlConfig::from_url("mysql://h/db?sslmode=require");
        if cfg!(feature = "tls") {
            assert!(result.is_ok());
        } else {
            assert!(rule("mysql://h/db?sslmode=verify-full").contains("`tls` feature"));
        }
    }
}
