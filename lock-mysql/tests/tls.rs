//! MariaDB over TLS, against servers started with `ssl_ca`, `ssl_cert`, `ssl_key`
//! and a throwaway CA from test-servers, whose users get in only over TLS (`REQUIRE SSL`) or
//! only with a client certificate (`REQUIRE X509`): the conformance suite over `tls_ca=`
//! (sslmode=verify-full implied) but for the cases that wait out several TTLs, the server's
//! own view that the store's session is encrypted, a client certificate, and the failures
//! (wrong CA, host name mismatch, TLS against plain text, missing client certificate) clear,
//! not retryable and without the password.
#![cfg(feature = "tls")]

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use fencelock_conformance::{async_trait, run_case, Outcome, StoreFactory, CASES};
use fencelock_core::{DynLockStore, Error, LockStore};
use fencelock_mysql::{MysqlConfig, MysqlStore};
use futures_util::stream::{self, StreamExt};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::{ConnectOptions, MySqlConnection};
use test_servers::{closed_ports, shared, MariadbServer, ServerCert, TestCa};

/// The password put into the URL of the plain-text server (whose user has none: the
/// connection is refused before the password matters).
const SECRET: &str = "tls-test-hunter2";

/// The URL of the `Valid` server's user that must present a client certificate.
fn client_cert_url() -> String {
    MariadbServer::shared_tls(ServerCert::Valid)
        .client_cert_url()
        .expect("a TLS server has a client-certificate user")
}

/// The password in `url`, which no error may show.
fn password(url: &str) -> String {
    let url = url::Url::parse(url).expect("URL");
    let password = url.password().expect("a password in the URL");
    assert!(password.len() >= 8, "too short to search for: {password:?}");
    password.to_owned()
}

/// A store on `url` (which has options already), with a generous connect timeout: other test
/// processes may load this machine.
async fn store(url: &str) -> MysqlStore {
    let url = format!("{url}&connect_timeout=30");
    MysqlStore::connect(MysqlConfig::from_url(&url).expect("config"))
        .await
        .expect("connect")
}

struct TlsFactory;

#[async_trait]
impl StoreFactory for TlsFactory {
    async fn handle(&self) -> DynLockStore {
        let url =
            TestCa::shared().with_ca_option(&MariadbServer::shared_tls(ServerCert::Valid).url());
        Arc::new(store(&url).await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let url = format!(
            "mysql://fencelock@127.0.0.1:{}/fencelock?connect_timeout=1&command_timeout=1&{}",
            closed_ports(1)[0],
            TestCa::shared().ca_option()
        );
        Arc::new(MysqlStore::connect_lazy(
            MysqlConfig::from_url(&url).expect("config"),
        ))
    }
}

/// Cases that run in plain text only (tests/conformance.rs): each waits out several TTLs (MySQL
/// TTLs are whole seconds) to check lease timing, which TLS does not change. Together they
/// would add about 12 s to this file; the cases that wait out one TTL still run here.
const PLAIN_TEXT_ONLY: &[&str] = &[
    "keep_alive_holds_a_lease_over_five_ttls",
    "extend_keeps_a_lease_past_its_first_ttl",
    "keep_alive_survives_transient_extend_failures",
    "lost_signal_fires_before_store_expiry_when_extends_stall",
    "extend_keeps_the_key_until_the_new_local_deadline",
];

/// Cases run at once, as the stores' own suites run (two test threads).
const PARALLEL: usize = 2;

/// Every other case of the suite (a new case joins by itself), over TLS with verify-full, as a
/// user the server lets in only over TLS (`REQUIRE SSL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_over_tls() {
    for name in PLAIN_TEXT_ONLY {
        assert!(
            CASES.iter().any(|case| case.name == *name),
            "{name}: no such conformance case"
        );
    }
    let factory: Arc<dyn StoreFactory> = Arc::new(TlsFactory);
    let outcomes: Vec<(&str, Outcome)> = stream::iter(CASES)
        .filter(|case| std::future::ready(!PLAIN_TEXT_ONLY.contains(&case.name)))
        .map(|case| {
            let factory = factory.clone();
            async move { (case.name, run_case(case.name, factory).await) }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(name, outcome)| match outcome {
            Outcome::Failed(failure) => Some(format!("{name}: {failure}")),
            _ => None,
        })
        .collect();
    assert!(failures.is_empty(), "over TLS:\n{}", failures.join("\n"));
    let passed = outcomes
        .iter()
        .filter(|(_, outcome)| *outcome == Outcome::Passed)
        .count();
    println!(
        "{passed} cases passed over TLS, {} not applicable, {} in plain text only",
        outcomes.len() - passed,
        PLAIN_TEXT_ONLY.len()
    );
    assert!(passed >= 30, "only {passed} cases passed");
}

/// A connection of the test's own (sqlx, TLS without verification) to `server`.
async fn admin(server: &MariadbServer) -> MySqlConnection {
    MySqlConnectOptions::from_str(&server.url())
        .expect("options")
        .ssl_mode(MySqlSslMode::Required)
        .connect()
        .await
        .expect("admin connection")
}

#[tokio::test]
async fn the_store_s_session_really_is_encrypted() {
    let server = MariadbServer::shared_tls(ServerCert::Valid);
    let store = store(&TestCa::shared().with_ca_option(&server.url())).await;
    let lease = store
        .try_acquire("encrypted", Duration::from_secs(30))
        .await
        .expect("acquire");
    // The server's view: the connection that holds the store's named lock, and its cipher.
    let mut admin = admin(server).await;
    let holder: Option<i64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(store.lock_name("encrypted"))
        .fetch_one(&mut admin)
        .await
        .expect("IS_USED_LOCK");
    let holder = holder.expect("the store's session holds its named lock");
    let cipher: Option<String> = sqlx::query_scalar(
        "SELECT s.VARIABLE_VALUE
           FROM performance_schema.status_by_thread s
           JOIN performance_schema.threads t ON t.THREAD_ID = s.THREAD_ID
          WHERE t.PROCESSLIST_ID = ? AND s.VARIABLE_NAME = 'Ssl_cipher'",
    )
    .bind(holder)
    .fetch_optional(&mut admin)
    .await
    .expect("status_by_thread");
    let cipher = cipher.expect("the holder's Ssl_cipher");
    assert!(
        !cipher.is_empty(),
        "the store's session {holder} is plain text"
    );
    let _ = store.release(&lease).await.expect("release");
}

#[tokio::test]
async fn a_client_certificate_opens_an_account_that_requires_one() {
    let url = format!(
        "{}&{}",
        TestCa::shared().with_ca_option(&client_cert_url()),
        TestCa::shared().client_cert_options()
    );
    let store = store(&url).await;
    let lease = store
        .try_acquire("mtls", Duration::from_secs(5))
        .await
        .expect("acquire over mTLS");
    let _ = store.release(&lease).await.expect("release");
}

/// Connects to `url` (which has a password) and returns the error text, after checking that
/// the error is the non-retryable [`Error::Store`] (retrying cannot fix a certificate) and does
/// not show the password.
async fn refused(url: &str) -> String {
    let secret = password(url);
    let url = format!("{url}&connect_timeout=10");
    let error = match MysqlStore::connect(MysqlConfig::from_url(&url).expect("config")).await {
        Ok(_) => panic!("{url}: connected"),
        Err(error) => error,
    };
    for text in [error.to_string(), format!("{error:?}")] {
        assert!(!text.contains(&secret), "the password shows: {text}");
    }
    assert!(
        matches!(error, Error::Store { .. }) && !error.is_retryable(),
        "a TLS refusal must not be retryable: {error:?}"
    );
    error.to_string()
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_refused() {
    let url = format!(
        "{}?{}",
        &MariadbServer::shared_tls(ServerCert::Valid).url(),
        TestCa::shared().other_ca_option()
    );
    let text = refused(&url).await;
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_server_certificate_for_another_host_is_refused() {
    let url =
        TestCa::shared().with_ca_option(&MariadbServer::shared_tls(ServerCert::Elsewhere).url());
    let text = refused(&url).await;
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn tls_against_a_plain_text_server_is_refused() {
    let url = shared::mariadb().url().replacen(
        "mysql://fencelock@",
        &format!("mysql://fencelock:{SECRET}@"),
        1,
    );
    let text = refused(&TestCa::shared().with_ca_option(&url)).await;
    assert!(text.contains("TLS"), "{text}");
}

#[tokio::test]
async fn a_missing_client_certificate_is_refused() {
    let url = TestCa::shared().with_ca_option(&client_cert_url());
    let text = refused(&url).await;
    assert!(text.contains("certificate"), "{text}");
}

/// The server enforces `REQUIRE SSL`, so the conformance suite above cannot have run in plain
/// text: the same user and password without TLS is refused.
#[tokio::test]
async fn plain_text_is_refused_by_an_account_that_requires_tls() {
    let url = format!(
        "{}?sslmode=disable",
        MariadbServer::shared_tls(ServerCert::Valid).url()
    );
    let text = refused(&url).await;
    assert!(text.contains("Access denied"), "{text}");
}
