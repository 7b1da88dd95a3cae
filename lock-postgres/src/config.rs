//! [`PostgresConfig`]: where the server is and how the store uses it, from a URL.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fencelock_core::raw::url::{
    check_identifier, check_scheme, client_identity, read_options, redact, OptionDoc,
    TableStoreOptions, TlsFiles, TlsTarget, UrlOption,
};
use fencelock_core::raw::validate::check_retention;
use fencelock_core::{Error, Result};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use url::Url;

use crate::keys::Space;
use crate::sql;

/// The URL schemes this store answers to: its descriptor's, and the ones
/// [`PostgresConfig::from_url`] accepts.
pub const URL_SCHEMES: &[&str] = &["postgres", "postgresql"];
/// The default namespace: keys of stores with different namespaces (or fence tables) never
/// contend.
pub const DEFAULT_NAMESPACE: &str = fencelock_core::raw::url::DEFAULT_NAMESPACE;
/// The default schema of the fence table.
pub const DEFAULT_SCHEMA: &str = "public";
/// The default name of the fence table.
pub const DEFAULT_TABLE: &str = fencelock_core::raw::url::DEFAULT_TABLE;
/// The default bound on opening one connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = fencelock_core::raw::url::DEFAULT_CONNECT_TIMEOUT;
/// The default bound on one statement that does not wait for a lock.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = fencelock_core::raw::url::DEFAULT_COMMAND_TIMEOUT;
/// The default number of idle connections a store keeps for reuse.
pub const DEFAULT_MAX_IDLE: usize = fencelock_core::raw::url::DEFAULT_MAX_IDLE;
/// The shortest TTL this store accepts. A shorter lease would spend most of its life on the
/// round trips and the durable commit of its own acquire. TTLs travel as whole milliseconds
/// (the server's timers), rounded up.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// The granule `G` of the clock floor under every token: tokens are the server's clock in
/// whole microseconds (see the crate docs, "Tokens across a swap of stores").
pub const TOKEN_GRANULE: Duration = Duration::from_micros(1);
/// The default bound on how far the server's clock may step back (`max_skew`): the floor under
/// the retention window (see [`PostgresConfig`]).
pub const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(1);
/// The gap the smallest retention window leaves beyond a granule and `max_skew`.
const FLOOR_MARGIN: Duration = Duration::from_millis(1);

/// The query-string options sqlx understands; anything else is rejected, so a typo such as
/// `namepsace=` cannot silently put locks in the default namespace.
const SQLX_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// How to reach PostgreSQL and where to keep the fencing counters.
///
/// Built from a URL by [`PostgresConfig::from_url`]:
///
/// ```text
/// postgres[ql]://[user[:password]@]host[:port]/database?option=value&…
/// ```
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `sslmode` | `prefer` | as in libpq: `disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full`; the last three need the crate feature `tls` |
/// | `user`, `password`, `host`, `port`, `dbname`, `application_name`, `options`, `sslrootcert`, `sslcert`, `sslkey` | | as in libpq (parsed by sqlx) |
/// | `tls_ca` | | PEM file of the CA that signs the server's certificate (the name the Redis and etcd stores use); implies `sslmode=verify-full` unless `sslmode` is given |
/// | `tls_cert`, `tls_key` | | PEM files of a client certificate and its key, for a server that asks for one; given together |
/// | `namespace` | `default` | 1–63 bytes, no NUL; part of every key's lock id |
/// | `schema` | `public` | schema of the fence table (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes); part of every key's lock id |
/// | `table` | `fencelock_fence` | name of the fence table (same rule); created if missing (see `create_table`); part of every key's lock id |
/// | `create_table` | `true` | `false`: never create the schema or the fence table; `connect` fails (not retryable) if the table is missing, so a role without `CREATE` never tries. An administrator creates it with [`PostgresConfig::fence_table_ddl`] |
/// | `connect_timeout` | `5s` | bound on opening one connection: `10` (seconds, as in libpq), `2s` or `250ms` |
/// | `command_timeout` | `10s` | bound on one statement that does not wait for a lock |
/// | `max_idle` | `16` | idle connections kept for reuse; `0` closes each one after use |
/// | `retention` | `7d` | a key's fence row is removed once it has not been bumped for this long (`ms`, `s`, `m`, `h`, `d`); must exceed `max_ttl` and be at least one clock granule (1 µs) plus `max_skew` plus 1 ms, whole ms rounded up (see below); see the crate docs (`# Per-key state`) |
/// | `max_ttl` | `24h` | the longest TTL this handle grants (at most 24 h) |
/// | `max_skew` | `1s` | how far the server's clock may step back, as this deployment promises (an NTP step, a failover to a server whose clock is behind); the floor under the retention window, see below |
/// | `durable_grants` | `false` | `true`: every grant waits for its fence write to be flushed (`synchronous_commit = on`). By default only a grant whose token ran ahead of the server's clock does; one whose token is the clock reading commits with `synchronous_commit = off`, safe while the clock assumption in the crate docs ("Crashes and the clock") holds |
///
/// The `tls_*` files are read when the URL is parsed (a missing file, or one without a PEM
/// block, is [`Error::InvalidInput`] naming the option) and are never printed; each is refused
/// next to its libpq twin (`sslrootcert`, `sslcert`, `sslkey`) and with `sslmode=disable`.
///
/// Unknown options are rejected. `Debug` and `Display` never show the password.
///
/// **The smallest retention window** is one clock granule plus `max_skew` plus 1 ms
/// ([`min_retention`](Self::min_retention), 1002 ms with the default skew):
/// [`from_url`](Self::from_url) refuses a shorter one, naming the smallest allowed, since a row
/// removed sooner could let a key's next token repeat one. `max_skew` is the deployment's
/// promise about its clock. Why: `docs/design/retention-window.md`.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) connect: PgConnectOptions,
    redacted: String,
    pub(crate) schema: String,
    pub(crate) max_skew: Duration,
    /// Whether every grant commits durably (`durable_grants`), not only those ahead of the clock.
    pub(crate) durable_grants: bool,
    /// The options every table store reads alike.
    pub(crate) options: TableStoreOptions,
}

impl PostgresConfig {
    /// Parses a `postgres://` or `postgresql://` URL (see the type's docs for the options).
    ///
    /// Fails with [`Error::InvalidInput`] naming `"url"` for a malformed URL, another scheme, an
    /// unknown or malformed option, a retention window not above `max_ttl` or below
    /// [`min_retention`](Self::min_retention), or `sslmode=require` (and stricter) without the
    /// `tls` feature. The message never contains the password.
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

        let config = PostgresConfig {
            connect: PgConnectOptions::new_without_pgpass(),
            redacted,
            schema: DEFAULT_SCHEMA.to_owned(),
            max_skew: DEFAULT_MAX_SKEW,
            durable_grants: false,
            options: TableStoreOptions::new(63),
        };
        let mut parsing = Parsing {
            config,
            tls: TlsFiles::default(),
            passed_on: Vec::new(),
        };
        read_options(
            parsed.query_pairs(),
            &options(),
            &mut parsing,
            |parsing, name, value| {
                let known = SQLX_OPTIONS.contains(&name) || is_options_entry(name);
                if known {
                    parsing.passed_on.push((name.to_owned(), value.to_owned()));
                }
                known
            },
            &format!("the libpq options {}", SQLX_OPTIONS.join(", ")),
        )?;
        let Parsing {
            mut config,
            tls,
            passed_on,
        } = parsing;
        check_retention(config.options.retention, config.options.max_ttl)?;
        check_clock_floor(config.options.retention, config.max_skew)?;

        let sslmode_given = passed_on
            .iter()
            .any(|(name, _)| matches!(&**name, "sslmode" | "ssl-mode"));
        check_tls(&tls, &passed_on)?;

        let mut for_sqlx = parsed.clone();
        if passed_on.is_empty() {
            for_sqlx.set_query(None);
        } else {
            for_sqlx.query_pairs_mut().clear().extend_pairs(passed_on);
        }
        config.connect = PgConnectOptions::from_str(for_sqlx.as_str())
            .map_err(|e| bad(format!("{}: {e}", config.redacted)))?;
        config.connect = apply_tls(tls, config.connect, sslmode_given)?;
        if requires_tls(config.connect.get_ssl_mode()) && !cfg!(feature = "tls") {
            return Err(bad(
                "sslmode=require, verify-ca and verify-full need fencelock-postgres's `tls` feature"
                    .into(),
            ));
        }
        if config.connect.get_application_name().is_none() {
            config.connect = config.connect.application_name("fencelock");
        }
        Ok(config)
    }

    /// The namespace hashed into every key.
    pub fn namespace(&self) -> &str {
        &self.options.namespace
    }

    /// The fence table as `"schema"."table"`.
    pub fn fence_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.options.table)
    }

    /// Whether the store creates the schema and the fence table when they are missing (the
    /// default). See [`PostgresConfig::with_create_table`].
    pub fn create_table(&self) -> bool {
        self.options.create_table
    }

    /// `false`: the store never creates the schema or the fence table (URL option
    /// `create_table=false`), so a role without `CREATE` never tries; with the table missing,
    /// `connect` (or a lazy handle's first operation) fails with a non-retryable
    /// [`Error::Store`] that names the table and [`PostgresConfig::fence_table_ddl`].
    pub fn with_create_table(mut self, create: bool) -> Self {
        self.options.create_table = create;
        self
    }

    /// The statement that creates the fence table, for an administrator who creates it ahead
    /// of time (the store then needs no `CREATE` privilege). The table records lock-id scheme
    /// [`LOCK_ID_SCHEME`](crate::LOCK_ID_SCHEME).
    pub fn fence_table_ddl(&self) -> String {
        sql::fence_table_ddl(&self.fence_table())
    }

    /// The SQL that moves a fence table made by a lock-id scheme 1 store (one that records no
    /// scheme) to scheme [`LOCK_ID_SCHEME`](crate::LOCK_ID_SCHEME), keeping every counter. One
    /// transaction (`BEGIN; … COMMIT;`), for `psql` or [`sqlx::raw_sql`]. Run it only once every
    /// store of the older scheme using this table has stopped: see the crate docs, "Upgrading
    /// the lock-id scheme". Afterwards an older store's acquire fails on this table.
    pub fn lock_id_scheme_upgrade_sql(&self) -> String {
        sql::upgrade_from_scheme_1(&self.fence_table())
    }

    /// The SQL that moves a fence table of lock-id scheme
    /// [`LOCK_ID_SCHEME`](crate::LOCK_ID_SCHEME) whose counters were minted by an earlier build
    /// (fence scheme 1, plain counters; or fence scheme 2, transaction-id floors) to fence
    /// scheme [`FENCE_SCHEME`](crate::FENCE_SCHEME), keeping every counter: the next token of
    /// each key jumps once, upward, to the server's clock. One transaction, for `psql` or
    /// [`sqlx::raw_sql`]; no table rewrite. Run it only once every older store using this table
    /// has stopped: see the crate docs, "Per-key state". Afterwards an older store's acquire
    /// fails on this table (a constraint violation) instead of minting.
    pub fn fence_scheme_upgrade_sql(&self) -> String {
        sql::upgrade_fence_scheme(&self.fence_table())
    }

    /// The SQL that lets a fence table made before semaphore permits existed record a
    /// semaphore's limit: `ALTER TABLE … ADD COLUMN IF NOT EXISTS permit_limit integer`
    /// (nullable, no default: no table rewrite; older stores keep working beside it). Until it
    /// ran, permit requests fail with a non-retryable [`Error::Store`] naming it; exclusive and
    /// shared leases need nothing. Needs the table's owner. See the crate docs, "Shared leases
    /// and semaphore permits".
    pub fn permits_upgrade_sql(&self) -> String {
        sql::add_permit_limit(&self.fence_table())
    }

    /// The SQL that lets a fence table made before holder labels keep them:
    /// `ALTER TABLE … ADD COLUMN IF NOT EXISTS label text` (nullable, no default: no rewrite).
    /// A store that may create the table runs it itself; with `create_table=false`, or without
    /// the table's ownership, labels stay on the lease and `status` shows none until an
    /// administrator ran it.
    pub fn label_column_ddl(&self) -> String {
        sql::add_label(&self.fence_table())
    }

    /// How long a key's fence row outlives its last bump.
    pub fn retention(&self) -> Duration {
        self.options.retention
    }

    /// The longest TTL this handle grants.
    pub fn max_ttl(&self) -> Duration {
        self.options.max_ttl
    }

    /// How far the server's clock may step back, as the deployment promises (`max_skew`).
    pub fn max_skew(&self) -> Duration {
        self.max_skew
    }

    /// Whether every grant waits for its fence write to be flushed (URL option
    /// `durable_grants=true`). `false` by default: only a grant whose token ran ahead of the
    /// server's clock does (see the crate docs, "Crashes and the clock").
    pub fn durable_grants(&self) -> bool {
        self.durable_grants
    }

    /// `true`: every grant waits for its fence write to be flushed, as URL option
    /// `durable_grants=true` says.
    pub fn with_durable_grants(mut self, durable: bool) -> Self {
        self.durable_grants = durable;
        self
    }

    /// The smallest retention window this configuration allows: one [`TOKEN_GRANULE`] plus
    /// [`max_skew`](Self::max_skew) plus 1 ms, rounded up to a whole ms (windows are whole
    /// ms). Idle rows are removed only once the clock is this far past their token.
    pub fn min_retention(&self) -> Duration {
        min_retention(self.max_skew)
    }

    /// The lock space of this configuration: the fence table and the namespace, which together
    /// with the key make the lock id.
    pub(crate) fn space(&self) -> Space<'_> {
        Space {
            schema: &self.schema,
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

impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted)
            .field("namespace", &self.options.namespace)
            .field("fence_table", &self.fence_table())
            .field("connect_timeout", &self.options.connect_timeout)
            .field("command_timeout", &self.options.command_timeout)
            .field("max_idle", &self.options.max_idle)
            .field("retention", &self.options.retention)
            .field("max_ttl", &self.options.max_ttl)
            .field("max_skew", &self.max_skew)
            .field("durable_grants", &self.durable_grants)
            .field("create_table", &self.options.create_table)
            .finish()
    }
}

impl FromStr for PostgresConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

/// Refuses a `tls_*` option next to its libpq twin (which one would win is not obvious), and a
/// client certificate without its key or the other way round.
fn check_tls(tls: &TlsFiles, passed_on: &[(String, String)]) -> Result<()> {
    let given = |names: &[&str]| passed_on.iter().any(|(n, _)| names.contains(&&**n));
    let twins: [(&str, bool, &[&str]); 3] = [
        (
            "tls_ca",
            tls.ca.is_some(),
            &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        ),
        ("tls_cert", tls.cert.is_some(), &["sslcert", "ssl-cert"]),
        ("tls_key", tls.key.is_some(), &["sslkey", "ssl-key"]),
    ];
    for (ours, set, theirs) in twins {
        if set && given(theirs) {
            return Err(Error::invalid(
                "url",
                format!("{ours} and {} name the same file; give one", theirs[0]),
            ));
        }
    }
    client_identity(tls.cert.as_ref(), tls.key.as_ref())?;
    Ok(())
}

/// The `tls_*` files applied to sqlx's options after it parsed the rest; a CA alone implies
/// `verify-full` unless `sslmode` was given.
fn apply_tls(
    tls: TlsFiles,
    mut connect: PgConnectOptions,
    sslmode_given: bool,
) -> Result<PgConnectOptions> {
    let any = tls.ca.is_some() || tls.cert.is_some();
    if any && matches!(connect.get_ssl_mode(), PgSslMode::Disable) {
        return Err(Error::invalid(
            "url",
            "tls_ca, tls_cert and tls_key need TLS, and sslmode=disable turns it off",
        ));
    }
    if let Some(ca) = tls.ca {
        connect = connect.ssl_root_cert_from_pem(ca);
        if !sslmode_given {
            // A CA is named to check the server against it: check the host name too.
            connect = connect.ssl_mode(PgSslMode::VerifyFull);
        }
    }
    if let (Some(cert), Some(key)) = (tls.cert, tls.key) {
        connect = connect
            .ssl_client_cert_from_pem(cert)
            .ssl_client_key_from_pem(key);
    }
    Ok(connect)
}

/// The smallest retention window for a server clock that steps back at most `max_skew`: a
/// granule plus `max_skew` plus [`FLOOR_MARGIN`], rounded up to a whole ms.
fn min_retention(max_skew: Duration) -> Duration {
    fencelock_core::raw::validate::clock_floor_retention(TOKEN_GRANULE, max_skew, FLOOR_MARGIN)
}

/// Refuses a retention window below [`min_retention`] (see [`PostgresConfig`]'s docs), naming
/// the smallest window allowed. Run after `check_retention`.
fn check_clock_floor(retention: Duration, max_skew: Duration) -> Result<()> {
    let least = min_retention(max_skew);
    if retention >= least {
        return Ok(());
    }
    Err(Error::invalid(
        "url",
        format!(
            "retention ({retention:?}) is too short: a key whose fence row was removed restarts \
             at the server's clock, which must then be past its last token although the clock \
             may step back by max_skew ({max_skew:?}); the smallest window allowed is {}ms (a \
             granule of {TOKEN_GRANULE:?} plus max_skew plus 1 ms), or promise a smaller \
             max_skew",
            least.as_millis()
        ),
    ))
}

/// A URL being read: the config it makes, the TLS files it names and the options it passes on
/// to sqlx.
#[derive(Debug)]
struct Parsing {
    config: PostgresConfig,
    tls: TlsFiles,
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

/// Every URL option this store reads itself (sqlx reads the libpq ones it is passed).
fn options() -> Vec<UrlOption<Parsing>> {
    let mut options = TableStoreOptions::declared();
    options.extend([
        UrlOption::new(
            "schema",
            DEFAULT_SCHEMA,
            "schema of the fence table; part of every key's lock id",
            |p: &mut Parsing, v| {
                p.config.schema = check_identifier("schema", v, 63)?;
                Ok(())
            },
        ),
        UrlOption::window(
            "max_skew",
            "1s",
            "how far the server's clock may step back, as this deployment promises",
            |p: &mut Parsing| &mut p.config.max_skew,
        ),
        UrlOption::flag(
            "durable_grants",
            "false",
            "`true`: every grant waits for its fence write to be flushed",
            |p: &mut Parsing| &mut p.config.durable_grants,
        ),
    ]);
    options.extend(TlsFiles::declared());
    options
}

/// What [`PostgresConfig::from_url`] reads, for the store's descriptor.
pub(crate) fn option_docs() -> Vec<OptionDoc> {
    options().iter().map(UrlOption::describe).collect()
}

fn is_options_entry(name: &str) -> bool {
    name.starts_with("options[") && name.ends_with(']')
}

fn requires_tls(mode: PgSslMode) -> bool {
    matches!(
        mode,
        PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_default_is_the_parser_s_own() {
        let fresh = || Parsing {
            config: PostgresConfig::from_url("postgres://u@h/db").expect("parses"),
            tls: TlsFiles::default(),
            passed_on: Vec::new(),
        };
        assert_eq!(
            fencelock_core::raw::url::defaults_that_differ(&options(), fresh),
            Vec::<&str>::new()
        );
    }
    use fencelock_core::limits::MAX_TTL;

    fn rule(url: &str) -> String {
        match PostgresConfig::from_url(url) {
            Err(Error::InvalidInput { what: "url", rule }) => rule,
            other => panic!("{url}: expected an invalid url, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_defaults_and_options() {
        let cases: &[(&str, &str, &str, &str, u16, Duration)] = &[
            (
                "postgres://u@127.0.0.1:5433/db",
                "default",
                "\"public\".\"fencelock_fence\"",
                "127.0.0.1",
                5433,
                DEFAULT_CONNECT_TIMEOUT,
            ),
            (
                "postgresql://u:pw@h/db?namespace=billing&schema=locks&table=fence_v1&connect_timeout=2",
                "billing",
                "\"locks\".\"fence_v1\"",
                "h",
                5432,
                Duration::from_secs(2),
            ),
            (
                "postgres://h/db?connect_timeout=250ms&sslmode=disable&application_name=x",
                "default",
                "\"public\".\"fencelock_fence\"",
                "h",
                5432,
                Duration::from_millis(250),
            ),
            (
                "postgres://h:1/db?namespace=%F0%9F%94%92%20space",
                "🔒 space",
                "\"public\".\"fencelock_fence\"",
                "h",
                1,
                DEFAULT_CONNECT_TIMEOUT,
            ),
        ];
        for (url, namespace, table, host, port, connect_timeout) in cases {
            let config = PostgresConfig::from_url(url).unwrap();
            assert_eq!(config.namespace(), *namespace, "{url}");
            assert_eq!(config.fence_table(), *table, "{url}");
            assert_eq!(config.connect.get_host(), *host, "{url}");
            assert_eq!(config.connect.get_port(), *port, "{url}");
            assert_eq!(config.connect_timeout(), *connect_timeout, "{url}");
        }
    }

    #[test]
    fn our_options_are_not_passed_to_sqlx() {
        let config = PostgresConfig::from_url(
            "postgres://u@h/db?namespace=n&max_idle=0&command_timeout=3s&sslmode=disable",
        )
        .unwrap();
        assert_eq!(config.max_idle(), 0);
        assert_eq!(config.command_timeout(), Duration::from_secs(3));
        assert!(matches!(config.connect.get_ssl_mode(), PgSslMode::Disable));
        assert!(config
            .fence_table_ddl()
            .starts_with("CREATE TABLE IF NOT EXISTS \"public\".\"fencelock_fence\""));
        assert_eq!(config.connect.get_database(), Some("db"));
        assert_eq!(config.connect.get_username(), "u");
        assert_eq!(config.connect.get_application_name(), Some("fencelock"));
    }

    #[test]
    fn durable_grants_defaults_to_false_and_is_read_from_the_url_or_set() {
        assert!(!PostgresConfig::from_url("postgres://u@h/db")
            .unwrap()
            .durable_grants());
        let config = PostgresConfig::from_url("postgres://u@h/db?durable_grants=true").unwrap();
        assert!(config.durable_grants());
        assert!(format!("{config:?}").contains("durable_grants: true"));
        assert!(!config.with_durable_grants(false).durable_grants());
        let refused = PostgresConfig::from_url("postgres://u@h/db?durable_grants=yes")
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("durable_grants must be true or false"),
            "{refused}"
        );
    }

    #[test]
    fn create_table_defaults_to_true_and_is_read_from_the_url_or_set() {
        let config = PostgresConfig::from_url("postgres://u@h/db").unwrap();
        assert!(config.create_table());
        let config = PostgresConfig::from_url("postgres://u@h/db?create_table=false").unwrap();
        assert!(!config.create_table());
        assert!(format!("{config:?}").contains("create_table: false"));
        assert!(config.with_create_table(true).create_table());
        let config = PostgresConfig::from_url("postgres://u@h/db?create_table=true").unwrap();
        assert!(!config.with_create_table(false).create_table());
    }

    #[test]
    fn passwords_never_print() {
        for url in [
            "postgres://user:s3cr%40t@h/db",
            "postgresql://user@h/db?password=s3cr%40t",
            "postgres://user:s3cr%40t@h/db?password=s3cr%40t&namespace=n",
        ] {
            let config = PostgresConfig::from_url(url).unwrap();
            for shown in [
                config.to_string(),
                format!("{config:?}"),
                config.redacted().to_owned(),
            ] {
                assert!(!shown.contains("s3cr"), "{shown}");
                assert!(shown.contains("***"), "{shown}");
            }
        }
        let shown = PostgresConfig::from_url("postgres://user:pw@h/db")
            .unwrap()
            .to_string();
        assert_eq!(shown, "postgres://user:***@h/db");
        // A rejected URL does not echo the password either.
        let message = rule("postgres://user:s3cret@h/db?namepsace=x");
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[test]
    fn retention_defaults_to_seven_days_and_must_exceed_the_max_ttl() {
        let config = PostgresConfig::from_url("postgres://u@h/db").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(7 * 86_400));
        assert_eq!(config.max_ttl(), MAX_TTL);
        let config =
            PostgresConfig::from_url("postgres://u@h/db?retention=2s&max_ttl=1s&sslmode=disable")
                .unwrap();
        assert_eq!(config.retention(), Duration::from_secs(2));
        assert_eq!(config.max_ttl(), Duration::from_secs(1));
        assert!(format!("{config:?}").contains("retention: 2s"));
        let config = PostgresConfig::from_url("postgres://u@h/db?retention=30d").unwrap();
        assert_eq!(config.retention(), Duration::from_secs(30 * 86_400));
        assert!(rule("postgres://u@h/db?retention=1d").contains("must exceed the maximum TTL"));
        assert!(rule("postgres://u@h/db?retention=1s&max_ttl=1s").contains("must exceed"));
        assert!(rule("postgres://u@h/db?retention=1y").contains("retention must be"));
        assert!(rule("postgres://u@h/db?max_ttl=25h").contains("at most 24h"));
    }

    #[test]
    fn bad_urls_are_invalid_input_naming_the_rule() {
        assert!(rule("redis://h").contains("postgres://"));
        assert!(rule("not a url").contains("not a URL"));
        assert!(rule("postgres://h/db?namepsace=x").contains("unknown option \"namepsace\""));
        assert!(rule("postgres://h/db?namespace=").contains("namespace"));
        assert!(rule(&format!("postgres://h/db?namespace={}", "n".repeat(64))).contains("63"));
        assert!(rule("postgres://h/db?table=x;drop").contains("table"));
        assert!(rule("postgres://h/db?schema=%22x%22").contains("schema"));
        assert!(rule("postgres://h/db?table=1x").contains("table"));
        assert!(rule("postgres://h/db?connect_timeout=0").contains("connect_timeout"));
        assert!(rule("postgres://h/db?connect_timeout=soon").contains("connect_timeout"));
        assert!(rule("postgres://h/db?max_idle=-1").contains("max_idle"));
        assert!(
            rule("postgres://h/db?create_table=no").contains("create_table must be true or false")
        );
        assert!(rule("postgres://h/db?create_table=").contains("create_table"));
        assert!(rule("postgres://h/db?sslmode=sometimes").contains("postgres://h/db"));
    }

    /// A file holding `contents` in this test process's own directory under the temp dir.
    fn file(name: &str, contents: &str) -> String {
        let dir = std::env::temp_dir().join(format!("lock-postgres-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_str().unwrap().to_owned()
    }

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nKEYMATERIAL\n-----END PRIVATE KEY-----\n";

    #[test]
    fn tls_options_map_to_libpq_files_and_imply_verify_full() {
        let ca = file("ca.pem", PEM);
        let cert = file("client.pem", PEM);
        let key = file("client.key", KEY);
        let config = PostgresConfig::from_url(&format!("postgres://u@h/db?tls_ca={ca}"));
        if !cfg!(feature = "tls") {
            assert!(matches!(config, Err(Error::InvalidInput { .. })));
            return;
        }
        let config = config.unwrap();
        assert!(matches!(
            config.connect.get_ssl_mode(),
            PgSslMode::VerifyFull
        ));
        // An sslmode given in the URL wins over the implied verify-full.
        let config =
            PostgresConfig::from_url(&format!("postgres://u@h/db?sslmode=verify-ca&tls_ca={ca}"))
                .unwrap();
        assert!(matches!(config.connect.get_ssl_mode(), PgSslMode::VerifyCa));
        // A client certificate alone does not change sslmode.
        let config = PostgresConfig::from_url(&format!(
            "postgres://u@h/db?sslmode=require&tls_cert={cert}&tls_key={key}"
        ))
        .unwrap();
        assert!(matches!(config.connect.get_ssl_mode(), PgSslMode::Require));
        for shown in [config.to_string(), format!("{config:?}")] {
            assert!(!shown.contains("KEYMATERIAL"), "{shown}");
        }
    }

    #[test]
    fn bad_tls_options_are_invalid_input_naming_the_option() {
        let ca = file("ca2.pem", PEM);
        let cert = file("client2.pem", PEM);
        let key = file("client2.key", KEY);
        let not_pem = file("not.pem", "KEYMATERIAL without a header");
        let missing = format!("{ca}.missing");
        assert!(rule(&format!("postgres://h/db?tls_ca={missing}")).contains("tls_ca: cannot read"));
        let message = rule(&format!(
            "postgres://h/db?tls_key={not_pem}&tls_cert={cert}"
        ));
        assert!(
            message.contains("tls_key") && message.contains("no PEM block"),
            "{message}"
        );
        assert!(!message.contains("KEYMATERIAL"), "{message}");
        assert!(rule(&format!("postgres://h/db?tls_cert={cert}")).contains("go together"));
        assert!(rule(&format!("postgres://h/db?tls_key={key}")).contains("go together"));
        assert!(
            rule(&format!("postgres://h/db?tls_ca={ca}&sslrootcert={ca}")).contains("sslrootcert")
        );
        assert!(rule(&format!(
            "postgres://h/db?tls_cert={cert}&tls_key={key}&sslkey={key}"
        ))
        .contains("sslkey"));
        assert!(
            rule(&format!("postgres://h/db?tls_ca={ca}&sslmode=disable"))
                .contains("sslmode=disable")
        );
    }

    #[test]
    fn strict_sslmodes_need_the_tls_feature() {
        let result = PostgresConfig::from_url("postgres://h/db?sslmode=require");
        if cfg!(feature = "tls") {
            assert!(result.is_ok());
        } else {
            assert!(rule("postgres://h/db?sslmode=verify-full").contains("`tls` feature"));
        }
    }
}
