//! etcd client errors as [`fencelock_core::Error`]: which ones a caller may retry, and which
//! requests certainly reached no member (so may be sent again whatever they do).

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
/// like any dropped connection, "operation was canceled", and stays retryable.)
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

/// gRPC's "try again" codes (the numbers are fixed by the gRPC spec): Cancelled, Unknown
/// (tonic's transport failures), DeadlineExceeded, ResourceExhausted (etcd's "too many
/// requests"), Aborted and Unavailable (etcd's "no leader", "leader changed", "timed out").
const RETRYABLE_GRPC_CODES: [i32; 6] = [1, 2, 4, 8, 10, 14];
