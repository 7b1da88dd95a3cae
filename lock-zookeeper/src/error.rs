//! ZooKeeper client errors as [`fencelock_core::Error`]: which ones a caller may retry.

use fencelock_core::Error;
use zookeeper_client as zk;

/// Transport trouble, a timeout, a throttled request and a session that ended (the handle
/// opens a new one next time) are retryable; everything else is not. The client reports a
/// connection it dropped for silence ("no response from connection in 320ms") and socket
/// errors as `Custom`: transport trouble too.
pub(crate) fn is_retryable(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::NoHosts
            | zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::Throttled
            | zk::Error::ClientClosed
            | zk::Error::NotReadOnly
            | zk::Error::Custom(_)
    )
}

/// Maps the client library's error, kept as the source: retryable ones become
/// [`Error::Unavailable`], the rest [`Error::Store`] (a refused ACL says which right).
pub(crate) fn client_error(what: &str, error: zk::Error) -> Error {
    if matches!(error, zk::Error::AuthFailed) {
        return Error::store(
            format!(
                "{what}: ZooKeeper refused the URL's credentials ({error}): with auth=sasl, the \
                 user and password must be those of a user_<name> in the server's JAAS Server \
                 section (DigestLoginModule)"
            ),
            error,
        );
    }
    if matches!(error, zk::Error::NoAuth) {
        return Error::store(
            format!(
                "{what}: ZooKeeper refused it ({error}): the URL's user needs READ and CREATE on \
                 the prefix, and all rights on the nodes under it, which the store creates for \
                 that user only; another user's (or no user's) nodes are refused (see the \
                 crate docs, ACLs and authentication)"
            ),
            error,
        );
    }
    Error::from_client(what, error, is_retryable)
}

/// A request that did not answer within the command timeout.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> Error {
    Error::Unavailable {
        message: format!("{what}: ZooKeeper did not answer within {timeout:?}"),
        source: None,
    }
}
