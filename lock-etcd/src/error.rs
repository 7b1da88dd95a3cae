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
/// for another host, a member that does not speak TLS, or a member's certificate alert (see
/// [`certificate_alert`]). tonic reports these as gRPC `Unavailable` or `Unknown` with
/// rustls's text, so the text decides. (A missing client certificate often looks like any
/// dropped connection instead, see [`closed_at_first_request`].)
fn is_tls_refusal(error: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        let text = current.to_string();
        if text.contains("invalid peer certificate") || text.contains("tls handshake eof") {
            return true;
        }
        source = current.source();
    }
    certificate_alert(error).is_some()
}

/// The TLS alerts with which a member refuses the client's certificate or its absence (as
/// rustls names them): settings, never a passing fault.
const CERTIFICATE_ALERTS: [&str; 7] = [
    "BadCertificate",
    "CertificateRequired",
    "UnsupportedCertificate",
    "CertificateRevoked",
    "CertificateExpired",
    "CertificateUnknown",
    "UnknownCA",
];

/// The certificate alert the member sent, if rustls reports one ("received fatal alert:
/// BadCertificate" is how a Go member refuses a TLS 1.3 client without a certificate, when the
/// alert arrives before the connection is seen closed).
fn certificate_alert(error: &etcd_client::Error) -> Option<&'static str> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        let text = current.to_string();
        if let Some((_, alert)) = text.split_once("received fatal alert: ") {
            let alert = alert.split(|c: char| !c.is_ascii_alphanumeric()).next()?;
            return CERTIFICATE_ALERTS.iter().copied().find(|a| *a == alert);
        }
        source = current.source();
    }
    None
}

/// Maps the client library's error, kept as the source: retryable ones become
/// [`Error::Unavailable`], the rest [`Error::Store`].
pub(crate) fn client_error(what: &str, error: etcd_client::Error) -> Error {
    Error::from_client(what, error, is_retryable)
}

/// Whether a request failed because an etcd lease it names is gone ("etcdserver: requested
/// lease not found"): an idle lease that ended while idle. Only that: the enqueue's other
/// refusals are [`Error::Store`] too, and a fresh lease would meet them again.
pub(crate) fn is_lease_not_found(error: &Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(current) = source {
        if let Some(etcd_client::Error::GRpcStatus(status)) = current.downcast_ref() {
            return status.message().contains("requested lease not found");
        }
        source = current.source();
    }
    false
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

/// Whether the connection was closed under the request: tonic's gRPC `Cancelled` over hyper's
/// "connection closed", or a write into it that failed with a broken pipe or a reset (which
/// of these depends on how far the request had got). A member that requires a client
/// certificate (`--client-cert-auth`) closes a TLS 1.3 connection that has none in exactly
/// this way at the client's first request: the client finished its side of the handshake
/// before the member checked for a certificate, so no handshake error is seen. But a member
/// that dropped the connection at that moment for any other reason looks the same, so one
/// such error is retryable; see [`ClosedConnections`].
pub(crate) fn closed_at_first_request(error: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    let cancelled = status.code() as i32 == CANCELLED;
    let mut source = std::error::Error::source(status);
    while let Some(current) = source {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                return true;
            }
        }
        if cancelled && current.to_string().contains("connection closed") {
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
    /// their first request (then the member closes every TLS connection without a client
    /// certificate, which is what `--client-cert-auth` does, not a passing fault), or at once
    /// for a certificate alert, which says so itself.
    pub(crate) fn count(&mut self, error: &etcd_client::Error) -> bool {
        if certificate_alert(error).is_some() {
            return true;
        }
        if closed_at_first_request(error) {
            self.in_a_row += 1;
        } else {
            self.in_a_row = 0;
        }
        self.in_a_row >= CLOSED_CONNECTIONS
    }
}

/// The non-retryable error for a member that refused (with a certificate alert) or closed
/// every TLS connection without a client certificate during `what`.
pub(crate) fn client_certificate_required(what: &str, error: etcd_client::Error) -> Error {
    let seen = match certificate_alert(&error) {
        Some(alert) => format!("etcd refused the TLS connection with the alert {alert}"),
        None => format!(
            "etcd closed {CLOSED_CONNECTIONS} TLS connections in a row at their first request"
        ),
    };
    Error::store(
        format!(
            "{what}: {seen}; the member may require a client certificate (--client-cert-auth): \
             give tls_cert and tls_key"
        ),
        error,
    )
}

/// gRPC's "try again" codes (the numbers are fixed by the gRPC spec): Cancelled, Unknown
/// (tonic's transport failures), DeadlineExceeded, ResourceExhausted (etcd's "too many
/// requests"), Aborted and Unavailable (etcd's "no leader", "leader changed", "timed out").
const RETRYABLE_GRPC_CODES: [i32; 6] = [1, 2, 4, 8, 10, 14];

#[cfg(test)]
mod tests {
    use super::*;
    use test_servers::shared;

    /// The idle-lease path grants afresh only for etcd's own "lease not found", not for the
    /// enqueue's other refusals (all [`Error::Store`]), which a fresh lease would meet again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_etcds_lease_not_found_counts_as_an_ended_lease() {
        let mut client = etcd_client::Client::connect([shared::etcd().endpoint()], None)
            .await
            .expect("a raw client");
        let lease = client.lease_grant(30, None).await.expect("a lease").id();
        client.lease_revoke(lease).await.expect("revoke");
        let put = client
            .put(
                "error-tests/ended",
                "",
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await
            .expect_err("a put on a revoked lease");
        let ended = client_error("enqueue", put);
        assert!(matches!(ended, Error::Store { .. }), "{ended:?}");
        assert!(is_lease_not_found(&ended), "{ended:?}");
        for other in [
            crate::offset::raw_minter_found("p/", b"p/k/x"),
            crate::offset::foreign_found("p/", "p/k/", b"p/k/~offset"),
            crate::offset::parse("p/~offset", b"v3").expect_err("another scheme"),
        ] {
            assert!(!is_lease_not_found(&other), "{other:?}");
        }
    }
}
