//! Redis errors as [`lock_core::Error`]: which ones a caller may retry.

use lock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Whether the server could not be reached or asked us to come back later, as opposed to a
/// reply the contract does not allow.
pub(crate) fn is_unavailable(error: &RedisError) -> bool {
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
}
