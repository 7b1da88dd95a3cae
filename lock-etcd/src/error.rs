//! etcd client errors as [`fencelock_core::Error`]: which ones a caller may retry, which
//! requests certainly reached no member (so may be sent again whatever they do), which right a
//! refused operation lacks, and when a closed connection means a missing client certificate.

use fencelock_core::Error;

/// Whether the request failed before reaching any member: the connection could not be opened.
/// Such a request can be sent again whatever it does.
pub(crate) fn never_sent(error: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        let text = current.to_string();
        if text.contains("tcp connect error") || text.contains("Connection refused") {
            return true;
        }
        source = current.source();
    }
    false
}

/// Transport trouble and etcd's "try again" codes are retryable; everything else is not.
pub(crate) fn is_retryable(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    if is_tls_refusal(error) {
        return false;
    }
    match error {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        E::GRpcStatus(status) => RETRYABLE_GRPC_CODES.contains(&(status.code() as i32)),
        _ => false,
    }
}

/// Whether the TLS handshake was refused for good: a member certificate from another CA or
/// for another host, or a member that does not speak TLS. tonic reports these as gRPC
/// `Unavailable` with rustls's text, so the text decides. (A missing client certificate looks
/// like any dropped connection, see [`closed_at_first_request`].)
fn is_tls_refusal(error: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        let text = current.to_string();
        if text.contains("invalid peer certificate") || text.contains("tls handshake eof") {
            return true;
        }
        source = current.source();
    }
    false
}

/// Maps the client library's error, kept as the source: retryable ones become
/// [`Error::Unavailable`], the rest [`Error::Store`].
pub(crate) fn client_error(what: &str, error: etcd_client::Error) -> Error {
    Error::from_client(what, error, is_retryable)
}

/// gRPC's `PermissionDenied` (fixed by the gRPC spec): etcd's "permission denied", a user
/// whose roles do not grant the key range a request touches.
const PERMISSION_DENIED: i32 = 7;

/// gRPC's `Cancelled` (fixed by the gRPC spec): tonic's code for a request whose connection
/// closed before the answer.
const CANCELLED: i32 = 1;

/// Whether etcd refused the request for a permission its user lacks. etcd's answer names
/// neither the key nor the right, so [`name_the_right`] adds them per operation.
pub(crate) fn is_permission_denied(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.code() as i32 == PERMISSION_DENIED)
}

/// Whether etcd refused a request because its auth token predates the latest change to users,
/// roles or permissions ("etcdserver: revision of auth store is old", any `etcdctl user add`
/// or `role grant-permission` causes it). etcd checks this before it applies anything, so the
/// request may be sent again with a fresh token; etcd-client's own refresh covers only
/// expired tokens, as etcd's Go client does not.
pub(crate) fn is_old_auth_revision(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.message().contains("revision of auth store is old"))
}

/// The right on a key range that an operation needs (etcd's `read`, `readwrite`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Right {
    Read,
    ReadWrite,
}

impl Right {
    fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::ReadWrite => "readwrite",
        }
    }
}

/// If `error` is etcd's "permission denied" (an [`Error::Store`] made by [`client_error`]),
/// rewrites it to name the `operation`, the key (or prefix) it `touched`, and the `right` the
/// user needs on `grant_on`, with the `etcdctl` command that grants it; keeps the client's
/// error as the source. Every other error is returned as it is.
pub(crate) fn name_the_right(
    error: Error,
    operation: &str,
    touched: &str,
    right: Right,
    grant_on: &str,
) -> Error {
    let Error::Store {
        message,
        source: Some(source),
    } = error
    else {
        return error;
    };
    let Some(client) = source
        .downcast_ref::<etcd_client::Error>()
        .filter(|client| is_permission_denied(client))
    else {
        return Error::Store {
            message,
            source: Some(source),
        };
    };
    // `client_error` wrote "{step}: {client error}": the step is what was sent.
    let step = message
        .strip_suffix(&format!(": {client}"))
        .filter(|step| *step != operation)
        .map(|step| format!(" ({step})"))
        .unwrap_or_default();
    let (touched, grant_on, right) = (
        touched.escape_debug(),
        grant_on.escape_debug(),
        right.as_str(),
    );
    Error::Store {
        message: format!(
            "{operation} on {touched}{step}: etcd refused: permission denied; the user needs \
             {right} on the prefix {grant_on} (etcdctl role grant-permission ROLE \
             --prefix=true {right} {grant_on})"
        ),
        source: Some(source),
    }
}

/// Whether tonic reports the request's connection as closed before an answer came: gRPC
/// `Cancelled` over hyper's "connection closed". A member that requires a client certificate
/// (`--client-cert-auth`) closes a TLS 1.3 connection that has none in exactly this way, once
/// the client sends its first request (the client finished its side of the handshake before
/// the member checked for a certificate, so no handshake error is seen); but so would a member
/// that dropped the connection for any other reason at that moment. One such error is
/// therefore retryable; see [`ClosedConnections`].
pub(crate) fn closed_at_first_request(error: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    if status.code() as i32 != CANCELLED {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(current) = source {
        if current.to_string().contains("connection closed") {
            return true;
        }
        source = current.source();
    }
    false
}

/// How many fresh connections in a row must be closed at their first request, with TLS and
/// no client certificate, before connecting reports a missing client certificate.
pub(crate) const CLOSED_CONNECTIONS: u32 = 3;

/// Counts connections closed at their first request while connecting (see
/// [`closed_at_first_request`]); any other outcome starts the count again.
#[derive(Debug, Default)]
pub(crate) struct ClosedConnections {
    in_a_row: u32,
}

impl ClosedConnections {
    /// Counts `error`; `true` once [`CLOSED_CONNECTIONS`] connections in a row were closed at
    /// their first request: then the member closes every TLS connection without a client
    /// certificate, which is what `--client-cert-auth` does, not a passing fault.
    pub(crate) fn count(&mut self, error: &etcd_client::Error) -> bool {
        if closed_at_first_request(error) {
            self.in_a_row += 1;
        } else {
            self.in_a_row = 0;
        }
        self.in_a_row >= CLOSED_CONNECTIONS
    }
}

/// The non-retryable error for a member that closed every TLS connection without a client
/// certificate during `what`.
pub(crate) fn client_certificate_required(what: &str, error: etcd_client::Error) -> Error {
    Error::store(
        format!(
            "{what}: etcd closed {CLOSED_CONNECTIONS} TLS connections in a row at their first \
             request; the member may require a client certificate (--client-cert-auth): give \
             tls_cert and tls_key"
        ),
        error,
    )
}

/// gRPC's "try again" codes (the numbers are fixed by the gRPC spec): Cancelled, Unknown
/// (tonic's transport failures), DeadlineExceeded, ResourceExhausted (etcd's "too many
/// requests"), Aborted and Unavailable (etcd's "no leader", "leader changed", "timed out").
const RETRYABLE_GRPC_CODES: [i32; 6] = [1, 2, 4, 8, 10, 14];
