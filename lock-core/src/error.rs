//! The one error type of the contract.

use std::time::Duration;

/// A boxed error kept as the `source` of [`Error::Unavailable`] and [`Error::Store`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every fallible operation of fencelock returns this error.
///
/// The variants are the decisions a caller can make: fix the input, try again later, stop
/// working under a lease that is gone, or report a store fault. Use [`Error::is_retryable`]
/// rather than matching when the only question is "may I try again?".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key, TTL, wait bound or URL broke a documented rule; the message names the input and
    /// the rule. Retrying the same call cannot succeed.
    #[error("invalid {what}: {rule}")]
    InvalidInput {
        /// The input at fault: `"key"`, `"ttl"`, `"wait"`, `"url"`, ….
        what: &'static str,
        /// The rule it broke, in words.
        rule: String,
    },

    /// `try_acquire` found the key held by another lease.
    #[error("lock {key:?} is held by another owner")]
    Busy {
        /// The contended key.
        key: String,
    },

    /// A waiting `acquire` gave up: the key was still held when its wait bound ran out.
    #[error("lock {key:?} was still held after waiting {waited:?}")]
    WaitTimedOut {
        /// The contended key.
        key: String,
        /// How long the call waited.
        waited: Duration,
    },

    /// The lease is no longer held: it expired, the store forgot it, or another owner holds the
    /// key now. Work protected by the lease must stop.
    #[error("lease on {key:?} with fencing token {token} is lost: {reason}")]
    LeaseLost {
        /// The key of the lost lease.
        key: String,
        /// The fencing token of the lost lease.
        token: u64,
        /// Why the lease is known or assumed to be lost.
        reason: String,
    },

    /// A resource-side fence check refused a token no greater than one it already accepted:
    /// the writer's lease was superseded.
    #[error("fencing token {token} is stale: the resource already accepted {highest}")]
    StaleToken {
        /// The refused token.
        token: u64,
        /// The highest token the fence had accepted.
        highest: u64,
    },

    /// The store could not be reached or did not answer in time. Nothing is known to have
    /// changed; the call may be retried.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed, without secrets.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The store answered with something the contract does not allow (a protocol or server
    /// error). Not retryable without a change somewhere.
    #[error("store error: {message}")]
    Store {
        /// What failed, without secrets.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The store cannot do this at all (for example report a key's status).
    #[error("{operation} is not supported by this store")]
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
    },
}

impl Error {
    /// Whether the same call may succeed later without any change by the caller: the store was
    /// unreachable, or the lock was busy.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::Busy { .. } | Error::WaitTimedOut { .. }
        )
    }

    /// Whether this error says the lease is gone (as opposed to unconfirmed).
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// An [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, rule: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            rule: rule.into(),
        }
    }

    /// An [`Error::Unavailable`] keeping `source`.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::Store`] keeping `source`.
    pub fn store(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Store {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::LeaseLost`] for `lease`.
    pub fn lost(lease: &crate::Lease, reason: impl Into<String>) -> Self {
        Error::LeaseLost {
            key: lease.key().to_owned(),
            token: lease.fencing_token(),
            reason: reason.into(),
        }
    }
}

/// `Result` with fencelock's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
