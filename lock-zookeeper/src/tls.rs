//! TLS to the servers' `secureClientPort` (`zookeepers://`): the client's settings, the process's
//! crypto provider, and the handshake that says why a connection was refused.
//!
//! The ZooKeeper client reports a refused handshake as a lost connection, like a server that is
//! down, and logs the reason at debug level only. So after a failed connect, [`refusal`] makes
//! one handshake of its own with the same CAs and identity: a certificate the client cannot
//! verify, or an alert from the server (no client certificate, an unknown CA), is an error that
//! retrying cannot fix, and says so.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;

/// rustls needs a process-wide crypto provider when more than one is compiled in (ring, which
/// the other stores use, and aws-lc-rs, the ZooKeeper client's default), and the client picks
/// none: install ring, unless the application installed one already.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is in place either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The client's TLS settings: the `tls_ca` CAs, the `tls_cert`/`tls_key` identity, and host
/// name verification (the client's default).
///
/// # Errors
/// [`Error::InvalidInput`] on the `"url"` for a file the client cannot use.
pub(crate) fn options(config: &ZookeeperConfig) -> Result<zk::TlsOptions> {
    let text = |option: &str, pem: &[u8]| -> Result<String> {
        String::from_utf8(pem.to_vec())
            .map_err(|_| Error::invalid("url", format!("{option}: the PEM file is not text")))
    };
    let unusable = |option: &str, error: zk::Error| {
        Error::invalid(
            "url",
            format!("{option}: the ZooKeeper client refuses it: {error}"),
        )
    };
    let mut options = zk::TlsOptions::new();
    if let Some(ca) = &config.tls_ca {
        options = options
            .with_pem_ca(&text("tls_ca", ca)?)
            .map_err(|e| unusable("tls_ca", e))?;
    }
    if let Some((cert, key)) = &config.tls_identity {
        options = options
            .with_pem_identity(&text("tls_cert", cert)?, &text("tls_key", key)?)
            .map_err(|e| unusable("tls_cert and tls_key", e))?;
    }
    Ok(options)
}

/// Why the servers refuse a TLS connection, if they do: one handshake with the first endpoint
/// that answers, within `timeout`, as an error retrying cannot fix ([`Error::Store`]). `None`
/// when no endpoint answers or the handshake succeeds (the failure was something else).
///
/// # Cancel safety
/// The handshake runs on a blocking thread, bounded by `timeout`; dropping the future only
/// stops waiting for it.
pub(crate) async fn refusal(config: &ZookeeperConfig, timeout: Duration) -> Option<Error> {
    let client = match client_config(config) {
        Ok(client) => client,
        Err(error) => return Some(error),
    };
    let endpoints = config.endpoints.clone();
    let probe = tokio::task::spawn_blocking(move || {
        endpoints.iter().find_map(|endpoint| {
            handshake(client.clone(), endpoint, timeout).map(|error| (endpoint.clone(), error))
        })
    });
    let (endpoint, error) = tokio::time::timeout(timeout, probe).await.ok()?.ok()??;
    let hint = match (&error, config.tls_identity.is_some()) {
        (rustls::Error::InvalidCertificate(_), _) => {
            "the server's certificate must be signed by tls_ca and name the URL's host"
        }
        (rustls::Error::AlertReceived(_), false) => {
            "the server refused the connection: it may require a client certificate \
             (ssl.clientAuth=need), which tls_cert and tls_key give"
        }
        (rustls::Error::AlertReceived(_), true) => {
            "the server refused the connection: it may not trust the CA of tls_cert"
        }
        _ => "check tls_ca, tls_cert and tls_key against the server's ssl.* settings",
    };
    Some(Error::store(
        format!(
            "opening a ZooKeeper session: the TLS handshake with {endpoint} failed ({error}): \
             {hint}"
        ),
        error,
    ))
}

/// The probe's rustls settings, from the same files as the client's (ring as the provider,
/// whatever the process's default).
fn client_config(config: &ZookeeperConfig) -> Result<Arc<rustls::ClientConfig>> {
    let invalid = |option: &str, error: &dyn std::fmt::Display| {
        Error::invalid("url", format!("{option}: {error}"))
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(config.tls_ca.as_deref().unwrap_or_default()) {
        let cert = cert.map_err(|e| invalid("tls_ca", &e))?;
        roots.add(cert).map_err(|e| invalid("tls_ca", &e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| invalid("TLS", &e))?
    .with_root_certificates(roots);
    let client = match &config.tls_identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| invalid("tls_cert", &e))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| invalid("tls_key", &e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| invalid("tls_cert and tls_key", &e))?
        }
    };
    Ok(Arc::new(client))
}

/// One handshake with `endpoint` (`host:port`, `[v6]:port`): the TLS error, if rustls or the
/// server refused it; `None` if it succeeded or the endpoint did not answer.
///
/// After the handshake it sends four bytes ZooKeeper reads as a request length above
/// `jute.maxbuffer` (and as no four-letter word): a server that accepted the connection closes
/// it, one that wants a client certificate (TLS 1.3 checks it after the handshake) sends its
/// alert instead. Either comes at once, so the read never waits for `timeout`.
fn handshake(
    client: Arc<rustls::ClientConfig>,
    endpoint: &str,
    timeout: Duration,
) -> Option<rustls::Error> {
    let (host, port) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let address = (host, port.parse::<u16>().ok()?)
        .to_socket_addrs()
        .ok()?
        .next()?;
    let tcp = TcpStream::connect_timeout(&address, timeout).ok()?;
    tcp.set_read_timeout(Some(timeout)).ok()?;
    tcp.set_write_timeout(Some(timeout)).ok()?;
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let connection = rustls::ClientConnection::new(client, name).ok()?;
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let tls_error = |error: std::io::Error| {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .cloned()
    };
    if let Err(error) = stream
        .write_all(&[0x7f, 0xff, 0xff, 0xff])
        .and_then(|()| stream.flush())
    {
        return tls_error(error);
    }
    let mut answer = Vec::new();
    Read::take(&mut stream, 64)
        .read_to_end(&mut answer)
        .err()
        .and_then(tls_error)
}
