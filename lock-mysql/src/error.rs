//! sqlx errors and statement timeouts as [`fencelock_core::Error`]: which ones a caller may retry,
//! and which mean the session (and the lock it held) is gone.

use std::future::Future;
use std::time::Duration;

use fencelock_core::Error;
use sqlx::mysql::MySqlDatabaseError;
use tokio::time::timeout;

/// Server error numbers this store tells apart.
pub(crate) mod number {
    /// Too many connections (`max_connections` reached).
    pub(crate) const TOO_MANY_CONNECTIONS: u16 = 1040;
    /// Access denied: a wrong user name or password, or an account requirement (`REQUIRE SSL`,
    /// `X509`, …) the connection does not meet; the server does not say which.
    pub(crate) const ACCESS_DENIED: u16 = 1045;
    /// The server is shutting down.
    pub(crate) const SERVER_SHUTDOWN: u16 = 1053;
    /// `KILL` named a connection id that does not exist.
    pub(crate) const UNKNOWN_THREAD: u16 = 1094;
    /// An InnoDB row lock wait timed out.
    pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// InnoDB chose this transaction as a deadlock victim.
    pub(crate) const DEADLOCK: u16 = 1213;
    /// MariaDB: the connection was killed.
    pub(crate) const CONNECTION_KILLED: u16 = 1927;
    /// MySQL 8: the client was disconnected by the server because of inactivity.
    pub(crate) const CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
}

/// Why a statement on a session failed.
pub(crate) enum Fault {
    /// No answer within the bound: the session is in an unknown state and must be closed.
    TimedOut(Duration),
    /// The server or the connection reported an error.
    Sql(sqlx::Error),
}

impl Fault {
    /// Whether the session is gone (connection broken, or the server ended it: idle timeout,
    /// `KILL`, shutdown). Its lock is then gone too.
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

    /// The server's error number, if it sent one.
    pub(crate) fn number(&self) -> Option<u16> {
        match self {
            Fault::Sql(e) => error_number(e),
            Fault::TimedOut(_) => None,
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

/// The server's error number of a database error.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(e) => e
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

fn sql_session_is_dead(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        _ => matches!(
            error_number(error),
            Some(
                number::CONNECTION_KILLED
                    | number::SERVER_SHUTDOWN
                    | number::CLIENT_INTERACTION_TIMEOUT
            )
        ),
    }
}

/// A failed statement as a contract error: retryable when the server could not be reached,
/// is shutting down or out of connections, or a row lock could not be had in time; a store
/// error otherwise.
pub(crate) fn sql_error(what: &str, error: sqlx::Error) -> Error {
    Error::from_client(what, error, is_retryable)
}

fn is_retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(e) => {
            e.code().is_some_and(|state| state.starts_with("08"))
                || matches!(
                    error_number(error),
                    Some(
                        number::TOO_MANY_CONNECTIONS
                            | number::SERVER_SHUTDOWN
                            | number::LOCK_WAIT_TIMEOUT
                            | number::DEADLOCK
                            | number::CONNECTION_KILLED
                            | number::CLIENT_INTERACTION_TIMEOUT
                    )
                )
        }
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

/// A failed connect to `whom` (the redacted URL) as a contract error: a configuration the
/// driver refuses, a TLS failure (not retryable), a refused login (not retryable, with the
/// causes the server's `Access denied` leaves out), or else as [`sql_error`].
pub(crate) fn connect_error(whom: &str, error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::Configuration(e) => Error::invalid("url", format!("{whom}: {e}")),
        sqlx::Error::Tls(_) => Error::store(format!("TLS with {whom} failed: {error}"), error),
        sqlx::Error::Io(ref io) if is_tls_refusal(io) => {
            Error::store(format!("TLS with {whom} failed: {error}"), error)
        }
        ref denied if error_number(denied) == Some(number::ACCESS_DENIED) => Error::store(
            format!(
                "connecting to {whom}: {error} (the server says this both for a wrong user name \
                 or password and for an account whose REQUIRE clause the connection does not \
                 meet: REQUIRE SSL needs TLS (sslmode or tls_ca); REQUIRE X509, ISSUER or \
                 SUBJECT need a client certificate (tls_cert and tls_key))"
            ),
            error,
        ),
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
        let error = connect_error("mysql://h/db", sqlx::Error::Io(refused));
        assert!(
            matches!(error, Error::Store { .. }) && !error.is_retryable(),
            "{error:?}"
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(connect_error("mysql://h/db", sqlx::Error::Io(reset)).is_retryable());
    }
}
