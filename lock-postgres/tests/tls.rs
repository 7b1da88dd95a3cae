//! PostgreSQL over TLS, against a server with `ssl = on` and a throwaway CA from
//! test-servers: the whole conformance suite over `tls_ca=` (sslmode=verify-full implied), a
//! client certificate against `clientcert=verify-ca`, and the failures (wrong CA, host name
//! mismatch, TLS against plain text, missing client certificate) clear, not retryable and
//! without the password.
#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::{DynLockStore, Error, LockStore};
use fencelock_postgres::{PostgresConfig, PostgresStore};
use test_servers::{closed_ports, shared, PostgresServer, ServerCert, TestCa};

const SECRET: &str = "tls-test-hunter2";

struct TlsFactory;

#[async_trait]
impl StoreFactory for TlsFactory {
    async fn handle(&self) -> DynLockStore {
        let url =
            TestCa::shared().with_ca_option(&PostgresServer::shared_tls(ServerCert::Valid).url());
        Arc::new(common::store(&url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres?connect_timeout=1&command_timeout=1&{}",
            closed_ports(1)[0],
            TestCa::shared().ca_option()
        );
        Arc::new(PostgresStore::connect_lazy(
            PostgresConfig::from_url(&url).expect("config"),
        ))
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
async fn the_session_really_is_encrypted() {
    let url = TestCa::shared().with_ca_option(&PostgresServer::shared_tls(ServerCert::Valid).url());
    let mut admin = common::admin(&url).await;
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut admin)
        .await
        .expect("pg_stat_ssl");
    assert!(ssl, "the connection is plain text");
}

#[tokio::test]
async fn a_client_certificate_opens_a_server_that_requires_one() {
    let url = format!(
        "{}&{}",
        TestCa::shared()
            .with_ca_option(&PostgresServer::shared_tls(ServerCert::RequireClientCert).url()),
        TestCa::shared().client_cert_options()
    );
    let store = common::store(&url, "").await;
    let lease = store
        .try_acquire("mtls", Duration::from_secs(5))
        .await
        .expect("acquire over mTLS");
    let _ = store.release(&lease).await.expect("release");
}

/// Connects to `url` (with a password added) and returns the error, which must be the
/// non-retryable [`Error::Store`] (retrying cannot fix a certificate) and must not show the
/// password.
async fn refused(url: &str) -> Error {
    let url = url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{SECRET}@"),
        1,
    );
    let url = format!("{url}&connect_timeout=10");
    let error = match PostgresStore::connect(PostgresConfig::from_url(&url).expect("config")).await
    {
        Ok(_) => panic!("{url}: connected"),
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
async fn a_server_signed_by_another_ca_is_refused() {
    let url = format!(
        "{}?{}",
        &PostgresServer::shared_tls(ServerCert::Valid).url(),
        TestCa::shared().other_ca_option()
    );
    let text = refused(&url).await.to_string();
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_server_certificate_for_another_host_is_refused() {
    let url =
        TestCa::shared().with_ca_option(&PostgresServer::shared_tls(ServerCert::Elsewhere).url());
    let text = refused(&url).await.to_string();
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn tls_against_a_plain_text_server_is_refused() {
    let url = TestCa::shared().with_ca_option(&shared::postgres().url());
    let text = refused(&url).await.to_string();
    assert!(text.contains("TLS"), "{text}");
}

#[tokio::test]
async fn a_missing_client_certificate_is_refused() {
    let url = TestCa::shared()
        .with_ca_option(&PostgresServer::shared_tls(ServerCert::RequireClientCert).url());
    let text = refused(&url).await.to_string();
    assert!(text.contains("certificate"), "{text}");
}
