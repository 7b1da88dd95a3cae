//! etcd over TLS, against a member with a throwaway CA from test-servers: the whole
//! conformance suite over `etcds://` with `tls_ca=`, a client certificate against
//! `--client-cert-auth`, and the failures (wrong CA, host name mismatch, TLS against plain
//! text, missing client certificate) non-retryable and without the password.
#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::{DynLockStore, Error};
use fencelock_etcd::{EtcdConfig, EtcdStore};
use test_servers::{closed_ports, shared, ServerCert, TestCa, TlsEtcd};

const SECRET: &str = "tls-test-hunter2";

struct TlsFactory;

#[async_trait]
impl StoreFactory for TlsFactory {
    async fn handle(&self) -> DynLockStore {
        let url = TlsEtcd::shared(ServerCert::Valid).tls_url();
        Arc::new(common::store(&TestCa::shared().with_ca_option(&url), "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let config = EtcdConfig::from_url(&TestCa::shared().with_ca_option(&format!(
            "etcds://127.0.0.1:{}?connect_timeout=1&command_timeout=1",
            closed_ports(1)[0]
        )))
        .expect("config");
        Arc::new(EtcdStore::connect_lazy(config).await.expect("lazy connect"))
    }
}

/// A substantial subset of the suite over TLS: every operation once
/// (`fencelock_conformance::TRANSPORT_CASES`); the whole suite runs in plain text in
/// `tests/conformance.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transport_cases_pass_over_tls() {
    fencelock_conformance::expect_transport_cases(Arc::new(TlsFactory)).await;
}

#[tokio::test]
async fn a_client_certificate_opens_a_member_that_requires_one() {
    let url = format!(
        "{}&{}",
        TestCa::shared().with_ca_option(&TlsEtcd::shared(ServerCert::RequireClientCert).tls_url()),
        TestCa::shared().client_cert_options()
    );
    let store = common::store(&url, "").await;
    assert!(store.config().is_tls());
}

/// Connects to `url` (`etcds://host:port?tls_ca=…`, given a user and password here) and
/// returns the error: the non-retryable [`Error::Store`] (retrying cannot fix a certificate),
/// without the password.
async fn refused(url: &str) -> Error {
    let url = url.replacen("://", &format!("://root:{SECRET}@"), 1);
    let config = EtcdConfig::from_url(&format!("{url}&connect_timeout=5")).expect("config");
    let error = match EtcdStore::connect(config).await {
        Ok(_) => panic!("connected"),
        Err(error) => error,
    };
    for text in [error.to_string(), format!("{error:?}")] {
        assert!(!text.contains(SECRET), "the password shows: {text}");
    }
    assert!(
        matches!(error, Error::Store { .. }) && !error.is_retryable(),
        "a TLS refusal must not be retryable: {error:?}"
    );
    error
}

#[tokio::test]
async fn a_member_signed_by_another_ca_is_refused() {
    let url = TlsEtcd::shared(ServerCert::Valid).tls_url();
    refused(&format!("{url}?{}", TestCa::shared().other_ca_option())).await;
}

#[tokio::test]
async fn a_member_certificate_for_another_host_is_refused() {
    let url = TlsEtcd::shared(ServerCert::Elsewhere).tls_url();
    refused(&TestCa::shared().with_ca_option(&url)).await;
}

#[tokio::test]
async fn a_tls_client_against_a_plain_text_member_is_refused() {
    let url = shared::etcd().url().replacen("etcd://", "etcds://", 1);
    refused(&TestCa::shared().with_ca_option(&url)).await;
}

/// A member started with `--client-cert-auth` closes a TLS 1.3 connection without a client
/// certificate at its first request, which tonic reports as a cancelled request on a closed
/// connection, like any dropped connection. Connecting tells them apart by repetition: three
/// fresh connections in a row closed that way, with no `tls_cert` configured, are a
/// non-retryable `Error::Store` that names the missing certificate. With a user, the first
/// request is the authentication; without one, the probe read.
#[tokio::test]
async fn a_missing_client_certificate_is_refused_naming_it() {
    let url = TlsEtcd::shared(ServerCert::RequireClientCert).tls_url();
    for user in [true, false] {
        let url = if user {
            url.replacen("://", &format!("://root:{SECRET}@"), 1)
        } else {
            url.clone()
        };
        let url = TestCa::shared().with_ca_option(&format!("{url}?connect_timeout=5"));
        let config = EtcdConfig::from_url(&url).expect("config");
        let Err(error) = EtcdStore::connect(config).await else {
            panic!("connected without a client certificate")
        };
        for text in [error.to_string(), format!("{error:?}")] {
            assert!(!text.contains(SECRET), "the password shows: {text}");
        }
        assert!(
            matches!(error, Error::Store { .. }) && !error.is_retryable(),
            "a missing client certificate must not be retryable (user: {user}): {error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains("may require a client certificate") && text.contains("tls_cert"),
            "user: {user}: {text}"
        );
    }
}

#[test]
fn tls_options_need_etcds_and_come_in_pairs() {
    let ca = TestCa::shared().ca_file().display().to_string();
    let not_pem = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    for (url, needle) in [
        (format!("etcd://h:1?tls_ca={ca}"), "etcds://"),
        (format!("etcds://h:1?tls_cert={ca}"), "both or neither"),
        (
            "etcds://h:1?tls_ca=/nonexistent/ca.pem".to_owned(),
            "tls_ca",
        ),
        (format!("etcds://h:1?tls_ca={not_pem}"), "PEM"),
    ] {
        match EtcdConfig::from_url(&url) {
            Err(Error::InvalidInput { what: "url", rule }) => {
                assert!(rule.contains(needle), "{url}: {rule}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}
