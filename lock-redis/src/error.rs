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
        // A Cluster client that reaches no node (none of the seeds answers, the node of a slot
        // is down), or a slot moving during a failover or a resharding.
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
        )
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
///
/// A command the user's ACL refuses (`NOPERM`, which names the command, or says keys or
/// channels) is an [`Error::Store`], not retryable: asking again cannot grant a right, an
/// operator must change the ACL. The message keeps the server's text after the operation and
/// says so.
pub(crate) fn redis_error(what: &str, error: RedisError) -> Error {
    if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return Error::Store {
            message: format!(
                "{what}: {error} (the Redis user's ACL lacks a right fencelock needs: grant it)"
            ),
            source: Some(Box::new(error)),
        };
    }
    Error::from_client(what, error, is_unavailable)
}

/// The error of a script (`source` is its Lua text) run for `what`, as [`redis_error`], except
/// that a command the user's ACL refused inside the script is named. Redis 7.0 says only "The
/// user executing the script can't run this command or subcommand ... on @user_script:LINE"
/// (7.2 and later: "ACL failure in script: ..."), so the commands called on that line of the
/// script are named, with the right to grant. Not retryable, as any ACL refusal.
pub(crate) fn script_error(what: &str, source: &str, error: RedisError) -> Error {
    let Some(refusal) = script_refusal(source, &error) else {
        return redis_error(what, error);
    };
    Error::Store {
        message: format!("{what}: {refusal}: {error}"),
        source: Some(Box::new(error)),
    }
}

/// What the user's ACL refused inside a script, in words, if `error` is such a refusal.
fn script_refusal(source: &str, error: &RedisError) -> Option<String> {
    let detail = error.detail().unwrap_or_default();
    let text = format!("{} {detail}", error.code().unwrap_or_default());
    let denied = text.contains("The user executing the script can't")
        || text.contains("ACL failure in script");
    if !denied {
        return None;
    }
    // `@user_script:LINE` counts the script's lines from 1; the first line of ours is empty.
    let line: Option<usize> = text
        .split_once("@user_script:")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok());
    let commands: Vec<&str> = line
        .and_then(|line| source.lines().nth(line.checked_sub(1)?))
        .map(called_commands)
        .unwrap_or_default();
    let called = match commands.as_slice() {
        [] => "a command".to_owned(),
        [one] => (*one).to_owned(),
        many => many.join(" or "),
    };
    let at = line.map_or_else(String::new, |line| format!(" (line {line})"));
    let grant = if text.contains("channel") {
        format!("the channels under the store's prefix (&PREFIX*) for {called}")
    } else if text.contains("keys") {
        format!("the keys under the store's prefix (~PREFIX*) for {called}")
    } else {
        let mut rights: Vec<String> = commands
            .iter()
            .map(|c| format!("+{}", c.to_ascii_lowercase()))
            .collect();
        rights.dedup();
        if rights.is_empty() {
            "the commands the script calls".to_owned()
        } else {
            rights.join(" ")
        }
    };
    Some(format!(
        "the Redis user's ACL refused {called}, called by the script{at}: grant {grant}"
    ))
}

/// The commands a line of Lua calls, in order: the `X` of each `redis.call('X'`.
fn called_commands(line: &str) -> Vec<&str> {
    line.split("redis.call('")
        .skip(1)
        .filter_map(|rest| rest.split_once('\'').map(|(name, _)| name))
        .collect()
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

    #[test]
    fn an_acl_refusal_is_not_retryable_and_names_the_right() {
        let refused = RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "NOPERM",
            "this user has no permissions to run the 'evalsha' command".to_owned(),
        ));
        let error = redis_error("acquire", refused);
        assert!(!error.is_retryable());
        let message = store_message(&error);
        assert!(message.starts_with("acquire: "), "{message}");
        assert!(message.contains("'evalsha'"), "{message}");
    }

    fn store_message(error: &Error) -> &str {
        match error {
            Error::Store { message, .. } => message,
            other => panic!("expected Error::Store, got {other:?}"),
        }
    }

    #[test]
    fn a_refusal_inside_a_script_names_the_commands_of_its_line() {
        let source = "\nif redis.call('SET', KEYS[1]) then\n  return {redis.call('GET', KEYS[1]), \
                      redis.call('PTTL', KEYS[1])}\nend\n";
        let server_error = |detail: &str| {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                detail.to_owned(),
            ))
        };
        let refusal = |detail: &str| {
            let error = script_error("status", source, server_error(detail));
            assert!(!error.is_retryable());
            store_message(&error).to_owned()
        };
        let on_line_3 = refusal(
            "The user executing the script can't run this command or subcommand script: \
             7c47, on @user_script:3.",
        );
        assert!(on_line_3.starts_with("status: "), "{on_line_3}");
        assert!(on_line_3.contains("refused GET or PTTL"), "{on_line_3}");
        assert!(on_line_3.contains("grant +get +pttl"), "{on_line_3}");
        assert!(on_line_3.contains("(line 3)"), "{on_line_3}");
        assert!(
            on_line_3.contains("@user_script:3"),
            "the server's text stays"
        );
        let channel = refusal(
            "The user executing the script can't publish to the channel mentioned in the \
             command script: 766b, on @user_script:2.",
        );
        assert!(channel.contains("refused SET"), "{channel}");
        assert!(channel.contains("&PREFIX*"), "{channel}");
        // Another script error is the driver's, unchanged.
        let global = "ERR user_script:2: Script attempted to access nonexistent global";
        assert_eq!(refusal(global), format!("status: {}", server_error(global)));
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
