//! Redis errors as [`fencelock_core::Error`]: which ones a caller may retry.

use fencelock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Whether the server could not be reached or asked us to come back later, as opposed to a
/// reply the contract does not allow. A refused TLS handshake (a certificate from another CA
/// or for another host, a missing client certificate, a peer that does not speak TLS) is not:
/// retrying cannot fix a certificate.
pub(crate) fn is_unavailable(error: &RedisError) -> bool {
    if is_tls_refusal(error) {
        return false;
    }
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
        // A long-running script (BUSY) blocks every client until it ends; a full memory (OOM)
        // or a failed snapshot (MISCONF) refuses writes until an operator acts, while the
        // locks already held stay in place: a keep-alive must retry, not declare them lost.
        || matches!(error.code(), Some("BUSY" | "OOM" | "MISCONF"))
}

/// Whether `error` carries a `rustls::Error`. The redis crate reports a failed handshake as
/// an I/O error behind an `Arc` (its `source` is the `Arc` itself), and
/// `std::io::Error::source` skips the error it wraps, so both are opened by hand.
#[cfg(feature = "tls")]
fn is_tls_refusal(error: &RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(mut current) = next {
        if let Some(shared) = current.downcast_ref::<Shared>() {
            current = &**shared;
        }
        if current.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return true;
            }
        }
        next = current.source();
    }
    false
}

#[cfg(not(feature = "tls"))]
fn is_tls_refusal(_: &RedisError) -> bool {
    false
}

/// The driver's error as ours: retryable when the server was unreachable or busy.
pub(crate) fn redis_error(what: &str, error: RedisError) -> Error {
    Error::from_client(what, error, is_unavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_retryable_and_protocol_errors_are_not() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(redis_error("x", refused).is_retryable());
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(redis_error("x", loading).is_retryable());
        let wrong = RedisError::from((ErrorKind::UnexpectedReturnType, "bad"));
        assert!(!redis_error("x", wrong).is_retryable());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_refused_tls_handshake_is_not_retryable() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let error = redis_error("x", RedisError::from(refused));
        assert!(matches!(error, Error::Store { .. }), "{error:?}");
    }
}
