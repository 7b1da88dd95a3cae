//! `zookeepers://` against a standalone server with a `secureClientPort` (Netty, PEM files of
//! test-servers' throwaway CA): a lease over TLS with a token, in a process where nothing
//! installed a rustls crypto provider; a server signed by another CA, one whose certificate
//! names another host, and one that wants a client certificate the URL lacks, refused at once with a non-retryable error naming the
//! handshake; a client certificate opening the server that requires one.
#![cfg(feature = "tls")]

mod common;

use std::time::{Duration, Instant};

use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use fencelock_zookeeper::{ZookeeperConfig, ZookeeperStore};
use test_servers::{ServerCert, TestCa, ZookeeperEnsemble};

const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;
/// Far above a handshake: a refusal that took this long was a retry loop, not a verdict.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

fn tls_url(cert: ServerCert) -> String {
    ZookeeperEnsemble::shared_secure(cert)
        .tls_url()
        .expect("a TLS port")
}

/// Connects to `url` (with `?` options) and returns the refusal: a non-retryable
/// [`Error::Store`] naming the TLS handshake, well before the connect timeout.
async fn refused(url: &str) -> String {
    let config = ZookeeperConfig::from_url(&format!(
        "{url}&connect_timeout={}",
        CONNECT_TIMEOUT.as_secs()
    ))
    .expect("config");
    let started = Instant::now();
    let error = match ZookeeperStore::connect(config).await {
        Ok(_) => panic!("{url}: connected"),
        Err(error) => error,
    };
    assert!(
        matches!(error, Error::Store { .. }) && !error.is_retryable(),
        "a TLS refusal must not be retryable: {error:?}"
    );
    assert!(
        started.elapsed() < CONNECT_TIMEOUT / 2,
        "{:?}",
        started.elapsed()
    );
    let text = error.to_string();
    assert!(text.contains("TLS handshake"), "{text}");
    text
}

/// Set in the child process [`a_lease_over_tls_has_a_token_in_a_process_without_a_provider`]
/// runs itself in.
const ALONE: &str = "LOCK_ZOOKEEPER_TLS_ALONE";

/// A lease with a token over TLS in a process where nothing installed a rustls crypto provider
/// (the store installs one). Other tests of this binary connect over TLS too, and the test
/// harness may run them in this process first (`cargo test` runs a binary's tests as threads of
/// one process; nextest gives each its own), so the test runs itself again in a child process
/// of its own, which runs nothing else.
#[test]
fn a_lease_over_tls_has_a_token_in_a_process_without_a_provider() {
    const NAME: &str = "a_lease_over_tls_has_a_token_in_a_process_without_a_provider";
    if std::env::var_os(ALONE).is_none() {
        let status = std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([NAME, "--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .status()
            .expect("run the test in a process of its own");
        assert!(
            status.success(),
            "the test in a process of its own: {status}"
        );
        return;
    }
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let url = TestCa::shared().with_ca_option(&tls_url(ServerCert::Valid));
        let store = common::store(&url, &format!("&prefix={}", common::fresh_prefix("tls"))).await;
        assert!(store.config().is_tls());
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        let lease = store.try_acquire("k", TTL).await.expect("acquire over TLS");
        assert!(lease.fencing_token() > 0);
        assert!(matches!(
            store.status("k").await.expect("status"),
            KeyStatus::Held { token: Some(token), .. } if token == lease.fencing_token()
        ));
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_signed_by_another_ca_is_refused() {
    let ca = TestCa::shared();
    let text = refused(&format!(
        "{}?{}",
        tls_url(ServerCert::Valid),
        ca.other_ca_option()
    ))
    .await;
    assert!(
        text.contains("UnknownIssuer") && text.contains("tls_ca"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_for_another_host_is_refused() {
    let url = TestCa::shared().with_ca_option(&tls_url(ServerCert::Elsewhere));
    let text = refused(&url).await;
    assert!(text.contains("not valid for name"), "{text}");
}

/// The plain port closes the connection at the TLS client's hello, as a server going down
/// might: not a verdict, so the connect is retried until its timeout, and fails retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_against_a_plain_port_fails_at_the_connect_timeout() {
    let plain = ZookeeperEnsemble::shared_secure(ServerCert::Valid).url();
    let url = TestCa::shared().with_ca_option(&plain.replacen("zookeeper://", "zookeepers://", 1));
    let config = ZookeeperConfig::from_url(&format!("{url}&connect_timeout=1")).expect("config");
    match ZookeeperStore::connect(config).await {
        Err(error @ Error::Unavailable { .. }) => assert!(error.is_retryable()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_a_client_certificate_takes_one_and_refuses_none() {
    let ca = TestCa::shared();
    let url = ca.with_ca_option(&tls_url(ServerCert::RequireClientCert));
    let with_cert = format!("{url}&{}", ca.client_cert_options());
    let store = common::store(&with_cert, "").await;
    let lease = store.try_acquire("k", TTL).await.expect("acquire");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );

    let text = refused(&url).await;
    assert!(
        text.contains("client certificate") && text.contains("tls_cert"),
        "{text}"
    );
}

#[test]
fn tls_options_need_zookeepers_a_ca_and_come_in_pairs() {
    let ca = TestCa::shared().ca_file().display().to_string();
    let key = TestCa::shared().client_key().display().to_string();
    for (url, needle) in [
        (format!("zookeeper://h:1?tls_ca={ca}"), "zookeepers://"),
        ("zookeepers://h:1".to_owned(), "tls_ca"),
        (
            format!("zookeepers://h:1?tls_ca={ca}&tls_cert={ca}"),
            "both or neither",
        ),
        (format!("zookeepers://h:1?tls_ca={key}"), "CERTIFICATE"),
        (
            "zookeepers://h:1?tls_ca=/nonexistent/ca.pem".to_owned(),
            "tls_ca",
        ),
    ] {
        match ZookeeperConfig::from_url(&url) {
            Err(Error::InvalidInput { what: "url", rule }) => {
                assert!(rule.contains(needle), "{url}: {rule}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    let config = ZookeeperConfig::from_url(&format!("zookeepers://h:1?tls_ca={ca}")).unwrap();
    for shown in [config.to_string(), format!("{config:?}")] {
        assert!(!shown.contains("BEGIN"), "{shown}");
    }
    assert!(config.to_string().starts_with("zookeepers://h:1?"));
}
