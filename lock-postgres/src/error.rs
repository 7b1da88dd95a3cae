//! sqlx errors and statement timeouts as [`fencelock_core::Error`]: which ones a caller may retry,
//! and which mean the session (and every lock it held) is gone.

use std::future::Future;
use std::time::Duration;

use fencelock_core::Error;
use sqlx::postgres::{PgDatabaseError, PgSeverity};
use tokio::time::timeout;

/// Why a statement on a session failed.
pub(crate) enum Fault {
    /// No answer within the bound: the session is in an unknown state and must be closed.
    TimedOut(Duration),
    /// The server or the connection reported an error.
    Sql(sqlx::Error),
}

impl Fault {
    /// Whether the session is gone (connection broken, or the server ended the backend: idle
    /// timeout, `pg_terminate_backend`, shutdown). Its session-level locks are then gone too.
    pub(crate) fn session_is_dead(&self) -> bool {
        match self {
            Fault::TimedOut(_) => true,
            Fault::Sql(e) => sql_session_is_dead(e),
        }
    }

    /// Whether the server or the network ended the session (not a timeout of ours): for a
    /// session reused from the idle list this means it died while idle, and a new session may
    /// try again.
    pub(crate) fn session_ended(&self) -> bool {
        matches!(self, Fault::Sql(e) if sql_session_is_dead(e))
    }

    /// The SQLSTATE, if the server sent one.
    pub(crate) fn code(&self) -> Option<String> {
        match self {
            Fault::Sql(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    pub(crate) fn into_error(self, what: &str) -> Error {
        match self {
            Fault::TimedOut(limit) => Error::Unavailable {
                message: format!("{what}: no answer within {limit:?}"),
                source: None,
            },
            Fault::Sql(e) => sql_error(what, e),
        }
    }

    /// Words for a lost-lease reason.
    pub(crate) fn describe(&self) -> String {
        match self {
            Fault::TimedOut(limit) => {
                format!("its session did not answer within {limit:?} and was closed")
            }
            Fault::Sql(e) => format!("its session ended: {e}"),
        }
    }
}

/// Runs a statement within `limit`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, Fault> {
    match timeout(limit, statement).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Fault::Sql(e)),
        Err(_) => Err(Fault::TimedOut(limit)),
    }
}

fn sql_session_is_dead(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(e) => e
            .try_downcast_ref::<PgDatabaseError>()
            .is_some_and(|e| matches!(e.severity(), PgSeverity::Fatal | PgSeverity::Panic)),
        _ => false,
    }
}

/// SQLSTATEs after which the same call may succeed later: the server is shutting down,
/// starting, out of connections, or the connection broke.
fn is_transient(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "57P05" | "53300" | "53400"
        )
}

/// What a concurrent `CREATE … IF NOT EXISTS` can fail with when another creator wins the race:
/// duplicate table, schema or type (the table's row type), or the catalog's unique index.
pub(crate) fn is_duplicate_object(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.code().is_some_and(|c| matches!(&*c, "42P07" | "42P06" | "42710" | "23505")))
}

/// A failed statement as a contract error: retryable when the server could not be reached
/// or is restarting, a store error otherwise. A missing privilege (SQLSTATE 42501, never
/// retryable) keeps the server's text, which names the table or schema, and adds which rights
/// the store needs.
pub(crate) fn sql_error(what: &str, error: sqlx::Error) -> Error {
    match missing_privilege_hint(what, &error) {
        Some(hint) => Error::store(format!("{what}: {error}; {hint}"), error),
        None => Error::from_client(what, error, is_retryable),
    }
}

/// What to grant after a "permission denied for table/schema/database" (42501) during `what`.
/// Other 42501 errors (ending another role's backend, a function) get no hint: the server's
/// text says it.
fn missing_privilege_hint(what: &str, error: &sqlx::Error) -> Option<&'static str> {
    let sqlx::Error::Database(e) = error else {
        return None;
    };
    let on_an_object = ["table", "schema", "database"].iter().any(|object| {
        e.message()
            .starts_with(&format!("permission denied for {object} "))
    });
    if e.code().as_deref() != Some("42501") || !on_an_object {
        return None;
    }
    Some(if what == CREATING_THE_FENCE_TABLE {
        "this role may not create the fence table: grant it CREATE on the schema (CREATE on the \
         database if the schema is missing too), or have an administrator run \
         PostgresConfig::fence_table_ddl() once and connect with create_table=false"
    } else {
        "the store needs USAGE on the fence table's schema and SELECT, INSERT, UPDATE and DELETE \
         on the fence table"
    })
}

/// The operation named in the error of a failed `CREATE SCHEMA` or `CREATE TABLE`.
pub(crate) const CREATING_THE_FENCE_TABLE: &str = "creating the fence table";

/// Whether the server could not be reached, or is restarting, out of connections or shutting
/// down: the same call may succeed later.
fn is_retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|c| is_transient(&c)),
        _ => false,
    }
}

/// Whether `io` carries a `rustls::Error`: sqlx reports a handshake the client refused (an
/// unknown issuer, a certificate for another host) as an I/O error, which a retry cannot fix.
#[cfg(feature = "tls")]
fn is_tls_refusal(io: &std::io::Error) -> bool {
    io.get_ref()
        .is_some_and(|inner| inner.is::<rustls::Error>())
}

#[cfg(not(feature = "tls"))]
fn is_tls_refusal(_: &std::io::Error) -> bool {
    false
}

/// A failed connect to `whom` (the redacted URL) as a contract error: a server older than 14,
/// a configuration the driver refuses, a TLS failure, or else as [`sql_error`].
pub(crate) fn connect_error(whom: &str, error: sqlx::Error) -> Error {
    if let sqlx::Error::Database(e) = &error {
        if e.code().as_deref() == Some("42704")
            && e.message().contains("client_connection_check_interval")
        {
            return Error::store(
                format!("{whom} is older than PostgreSQL 14; this store needs idle_session_timeout and client_connection_check_interval"),
                error,
            );
        }
    }
    match error {
        sqlx::Error::Configuration(e) => Error::invalid("url", format!("{whom}: {e}")),
        sqlx::Error::Tls(_) => Error::store(format!("TLS with {whom} failed: {error}"), error),
        sqlx::Error::Io(ref io) if is_tls_refusal(io) => {
            Error::store(format!("TLS with {whom} failed: {error}"), error)
        }
        other => sql_error(&format!("connecting to {whom}"), other),
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn a_refused_tls_handshake_is_not_retryable() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let error = connect_error("postgres://h/db", sqlx::Error::Io(refused));
        assert!(
            matches!(error, Error::Store { .. }) && !error.is_retryable(),
            "{error:?}"
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(connect_error("postgres://h/db", sqlx::Error::Io(reset)).is_retryable());
    }
}
