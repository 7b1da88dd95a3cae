//! The one error type of the contract.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A boxed error kept as the `source` of [`Error::Unavailable`] and [`Error::Store`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every fallible operation of fencelock returns this error.
///
/// The variants are the decisions a caller can make: fix the input, try again later, stop
/// working under a lease that is gone, or report a store fault. Use [`Error::is_retryable`]
/// rather than matching when the only question is "may I try again?", and [`Error::kind`]
/// when the question is what to do.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use fencelock_core::{Error, ErrorKind, LockStore, MemoryStore};
///
/// let store = MemoryStore::new();
/// let _held = store.try_acquire("report", Duration::from_secs(10)).await.unwrap();
/// match store.try_acquire("report", Duration::from_secs(10)).await {
///     Err(error) if error.kind() == ErrorKind::Contended => {
///         assert!(matches!(error, Error::Busy { .. }));
///         assert!(error.is_retryable()); // someone else holds it: try later, or wait
///     }
///     other => panic!("{other:?}"),
/// }
/// let invalid = store.try_acquire("", Duration::from_secs(10)).await.unwrap_err();
/// assert_eq!(invalid.kind(), ErrorKind::InvalidInput); // fix the call; a retry cannot help
/// # }
/// ```
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
    ///
    /// Said once: when a [`LockGuard`](crate::LockGuard), [`KeepAlive`](crate::KeepAlive) or
    /// [`with_lock`](crate::with_lock) turns a store's answer into this error, the store's own
    /// `LeaseLost` is passed on as it was (its reason, its source), and any other error the
    /// store gave (an extend refused as [`Error::Store`], say) is kept, typed, as the
    /// [`source`](std::error::Error::source): downcast it to [`Error`] to match its kind.
    #[error("lease on {key:?} with fencing token {token} is lost: {reason}")]
    LeaseLost {
        /// The key of the lost lease.
        key: String,
        /// The fencing token of the lost lease.
        token: u64,
        /// Why the lease is known or assumed to be lost.
        reason: String,
        /// The store's error that made it lost, if one did.
        #[source]
        source: Option<SharedError>,
    },

    /// [`with_lock`](crate::with_lock)'s body ran to completion, but the release found the
    /// lease already gone (it expired or was taken while the body was finishing): the work may
    /// have overlapped another holder's. Not retryable, since running the body again may repeat
    /// work that was done. The body's output is kept: take it with [`Error::take_output`].
    #[error("lease on {key:?} with fencing token {token} was lost before the finished body's release: {reason}")]
    LostAfterBody {
        /// The key of the lost lease.
        key: String,
        /// The fencing token of the lost lease.
        token: u64,
        /// Why the lease is known to be lost.
        reason: String,
        /// The body's output.
        output: BodyOutput,
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

    /// A semaphore permit was asked with a limit other than the one the key's permits are
    /// held with. Ask with the same limit, or wait until the key is free to set a new one.
    #[error(
        "`{key}` is held as a semaphore of {held} permits; this request asked for {requested}"
    )]
    LimitMismatch {
        /// The key.
        key: String,
        /// The limit the key's permits are held with.
        held: u32,
        /// The limit the request asked for.
        requested: u32,
    },

    /// The store cannot do this at all (for example report a key's status).
    #[error("{operation} is not supported by this store")]
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
    },
}

/// What a caller can do about an [`Error`], for a `match`: every variant of [`Error`] belongs
/// to exactly one kind ([`Error::kind`]), and new variants will join one of these kinds, or a
/// new kind (the enum is `#[non_exhaustive]`: keep a `_` arm).
///
/// ```
/// use fencelock_core::{Error, ErrorKind};
///
/// fn next_step(error: &Error) -> &'static str {
///     match error.kind() {
///         ErrorKind::Contended => "someone else holds the key: try later, or skip this run",
///         ErrorKind::Unavailable => "the store did not answer: retry with backoff",
///         ErrorKind::LeaseLost | ErrorKind::StaleToken => "stop: another holder may be working",
///         _ => "report it: the call or the store's set-up must change",
///     }
/// }
///
/// let busy = Error::Busy { key: "nightly".into() };
/// assert_eq!(next_step(&busy), "someone else holds the key: try later, or skip this run");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another lease holds the key: [`Error::Busy`] from a single attempt,
    /// [`Error::WaitTimedOut`] from a wait that ran out. Try later, wait longer, or skip the
    /// work; the store is healthy.
    Contended,
    /// The store could not be reached, did not answer in time, or could not grant the TTL in
    /// time ([`Error::Unavailable`]). Retry with backoff; nothing is known to have changed.
    Unavailable,
    /// The lease is gone, or must be assumed gone ([`Error::LeaseLost`], and
    /// [`Error::LostAfterBody`] for a lease lost while a finished body was being released).
    /// Stop the work it protected: another holder may have the key.
    LeaseLost,
    /// A resource refused a token no greater than one it had accepted ([`Error::StaleToken`]):
    /// this writer's lease was superseded. Stop; do not retry the write.
    StaleToken,
    /// The call broke a documented rule: a bad key, TTL, wait, URL or permit limit
    /// ([`Error::InvalidInput`]), or permits asked with another limit than the key's holders
    /// use ([`Error::LimitMismatch`]). Retrying the same call cannot succeed.
    InvalidInput,
    /// The store cannot do this at all ([`Error::Unsupported`]): a lock mode it does not keep,
    /// `status` or `evict` where it has none. Pick another store or another call.
    Unsupported,
    /// The store answered with something the contract does not allow: a protocol or server
    /// error, missing rights, a table of another layout ([`Error::Store`]). Not retryable
    /// without a change to the store or its set-up.
    Store,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Contended => "contended",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::LeaseLost => "lease lost",
            ErrorKind::StaleToken => "stale token",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Store => "store error",
        })
    }
}

impl Error {
    /// The kind of this error: what the caller can do about it (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Busy { .. } | Error::WaitTimedOut { .. } => ErrorKind::Contended,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::LeaseLost { .. } | Error::LostAfterBody { .. } => ErrorKind::LeaseLost,
            Error::StaleToken { .. } => ErrorKind::StaleToken,
            Error::InvalidInput { .. } | Error::LimitMismatch { .. } => ErrorKind::InvalidInput,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Store { .. } => ErrorKind::Store,
        }
    }

    /// Whether the same call may succeed later without any change by the caller: exactly the
    /// kinds [`ErrorKind::Contended`] (the lock was busy) and [`ErrorKind::Unavailable`] (the
    /// store did not answer). A retry loop that must tell contention from an outage matches
    /// on [`Error::kind`] instead.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::Busy { .. } | Error::WaitTimedOut { .. }
        )
    }

    /// Whether this error says the lease is gone (as opposed to unconfirmed).
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. } | Error::LostAfterBody { .. })
    }

    /// The output of a body that finished under a lease lost before its release
    /// ([`Error::LostAfterBody`]), if it has type `T` and was not taken before.
    pub fn take_output<T: Send + 'static>(&self) -> Option<T> {
        match self {
            Error::LostAfterBody { output, .. } => output.take(),
            _ => None,
        }
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

    /// A store client's `error` during `what`, kept as the source, with the message
    /// `"{what}: {error}"`: [`Error::Unavailable`] when `retryable(&error)` says the store could
    /// not be reached or asked to be tried later, [`Error::Store`] otherwise. Each store passes
    /// its own client's classification; the split and the message are the same in every store.
    pub fn from_client<E>(what: &str, error: E, retryable: impl FnOnce(&E) -> bool) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let message = format!("{what}: {error}");
        if retryable(&error) {
            Error::unavailable(message, error)
        } else {
            Error::store(message, error)
        }
    }

    /// A fenced resource's refusal of a step under `token` when its claim is `claim`, the same
    /// in [`FenceGate`](crate::FenceGate) and every resource of the `fencelock-fence` crate:
    /// [`Error::StaleToken`] when `token` is lower (a newer holder claimed: stop), and
    /// [`Error::InvalidInput`] (`what = "fencing token"`) when it is greater, since that token
    /// never claimed the resource (a bug in the caller, not a race: claim before writing).
    pub fn fence_refused(token: u64, claim: u64) -> Self {
        if claim < token {
            Error::invalid(
                "fencing token",
                format!(
                    "token {token} never claimed this resource (its claim is {claim}): claim before writing"
                ),
            )
        } else {
            Error::StaleToken {
                token,
                highest: claim,
            }
        }
    }

    /// An [`Error::LeaseLost`] for `lease`.
    pub fn lost(lease: &crate::Lease, reason: impl Into<String>) -> Self {
        Error::LeaseLost {
            key: lease.key().to_owned(),
            token: lease.fencing_token(),
            reason: reason.into(),
            source: None,
        }
    }
}

/// An [`Error`] shared by every [`Error::LeaseLost`] built from one loss (a guard's `run` may
/// report it more than once). It derefs to the [`Error`], and as a
/// [`source`](std::error::Error::source) it is the [`Error`] itself, so
/// `source.downcast_ref::<Error>()` finds it.
#[derive(Debug, Clone)]
pub struct SharedError(Arc<Error>);

impl SharedError {
    /// Shares `error`.
    pub fn new(error: Error) -> Self {
        SharedError(Arc::new(error))
    }

    /// What `thiserror` calls for a source: the shared error itself rather than this wrapper,
    /// so a caller downcasts to [`Error`].
    fn as_dyn_error(&self) -> &(dyn std::error::Error + 'static) {
        &*self.0
    }
}

impl std::ops::Deref for SharedError {
    type Target = Error;
    fn deref(&self) -> &Error {
        &self.0
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// The output of a finished body, kept in [`Error::LostAfterBody`]. It prints as its type's
/// name only, so an error message never shows the caller's data.
pub struct BodyOutput {
    value: Mutex<Option<Box<dyn Any + Send>>>,
    type_name: &'static str,
}

impl BodyOutput {
    /// Keeps `value`.
    pub fn new<T: Send + 'static>(value: T) -> Self {
        BodyOutput {
            value: Mutex::new(Some(Box::new(value))),
            type_name: std::any::type_name::<T>(),
        }
    }

    /// Takes the value out if it has type `T` and is still there.
    pub fn take<T: Send + 'static>(&self) -> Option<T> {
        let mut value = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        if !value.as_ref()?.is::<T>() {
            return None;
        }
        value.take()?.downcast().ok().map(|boxed| *boxed)
    }
}

impl fmt::Debug for BodyOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BodyOutput<{}>", self.type_name)
    }
}

/// `Result` with fencelock's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every variant, with the kind it must have.
    fn every_variant() -> Vec<(Error, ErrorKind)> {
        vec![
            (Error::Busy { key: "k".into() }, ErrorKind::Contended),
            (
                Error::WaitTimedOut {
                    key: "k".into(),
                    waited: Duration::from_secs(1),
                },
                ErrorKind::Contended,
            ),
            (
                Error::Unavailable {
                    message: "down".into(),
                    source: None,
                },
                ErrorKind::Unavailable,
            ),
            (
                Error::LeaseLost {
                    key: "k".into(),
                    token: 1,
                    reason: "expired".into(),
                    source: None,
                },
                ErrorKind::LeaseLost,
            ),
            (
                Error::LostAfterBody {
                    key: "k".into(),
                    token: 1,
                    reason: "expired".into(),
                    output: BodyOutput::new(()),
                },
                ErrorKind::LeaseLost,
            ),
            (
                Error::StaleToken {
                    token: 1,
                    highest: 2,
                },
                ErrorKind::StaleToken,
            ),
            (Error::invalid("ttl", "zero"), ErrorKind::InvalidInput),
            (
                Error::LimitMismatch {
                    key: "k".into(),
                    held: 2,
                    requested: 3,
                },
                ErrorKind::InvalidInput,
            ),
            (
                Error::Unsupported {
                    operation: "status",
                },
                ErrorKind::Unsupported,
            ),
            (
                Error::Store {
                    message: "bad".into(),
                    source: None,
                },
                ErrorKind::Store,
            ),
        ]
    }

    #[test]
    fn every_variant_has_the_kind_a_caller_acts_on() {
        for (error, kind) in every_variant() {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn retryable_is_exactly_contended_or_unavailable() {
        for (error, kind) in every_variant() {
            assert_eq!(
                error.is_retryable(),
                matches!(kind, ErrorKind::Contended | ErrorKind::Unavailable),
                "{error:?}"
            );
            assert_eq!(
                error.is_lease_lost(),
                kind == ErrorKind::LeaseLost,
                "{error:?}"
            );
        }
    }

    #[test]
    fn client_errors_are_unavailable_only_when_the_store_says_retryable() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let error = Error::from_client("acquire", refused(), |_| true);
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        assert!(error.is_retryable());
        assert_eq!(
            error.to_string(),
            format!("store unavailable: acquire: {}", refused())
        );
        let source = std::error::Error::source(&error).expect("the client's error is kept");
        assert!(source.downcast_ref::<std::io::Error>().is_some());

        let error = Error::from_client("release", refused(), |_| false);
        assert!(matches!(error, Error::Store { .. }), "{error:?}");
        assert!(!error.is_retryable());
        assert_eq!(
            error.to_string(),
            format!("store error: release: {}", refused())
        );
        assert!(std::error::Error::source(&error).is_some());
    }
}
