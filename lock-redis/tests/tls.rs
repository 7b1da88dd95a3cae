//! Redis over TLS, against redis-server's own `--tls-port` with a throwaway CA from
//! test-servers: the whole conformance suite over `rediss://` with `tls_ca=`, Redlock over three
//! TLS nodes, and the failures (wrong CA, host name mismatch, TLS against plain text, missing
//! client certificate) clear and without the password.
#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::{DynLockStore, Error, LockStore};
use fencelock_redis::{RedisConfig, RedisStore, RedlockConfig, RedlockStore};
use test_servers::{closed_ports, ServerCert, TestCa, TlsRedis};

const SECRET: &str = "tls-test-hunter2";

/// `rediss://` to `cert`'s server with `tls_option` (a `tls_ca=…`).
fn tls_url(cert: ServerCert, tls_option: &str) -> String {
    format!("{}?{tls_option}", TlsRedis::shared(cert).tls_url())
}

struct TlsFactory;

#[async_trait]
impl StoreFactory for TlsFactory {
    async fn handle(&self) -> DynLockStore {
        let url = tls_url(ServerCert::Valid, &TestCa::shared().ca_option());
        Arc::new(common::store(&url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let url = format!(
            "rediss://127.0.0.1:{}?connect_timeout=1s&command_timeout=1s&{}",
            closed_ports(1)[0],
            TestCa::shared().ca_option()
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
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
async fn a_client_certificate_opens_a_server_that_requires_one() {
    let url = format!(
        "{}&{}",
        tls_url(ServerCert::RequireClientCert, &TestCa::shared().ca_option()),
        TestCa::shared().client_cert_options()
    );
    let store = common::store(&url, "").await;
    let lease = store
        .try_acquire("mtls", Duration::from_secs(5))
        .await
        .expect("acquire over mTLS");
    let _ = store.release(&lease).await.expect("release");
}

#[tokio::test]
async fn redlock_runs_over_three_tls_nodes() {
    let nodes: Vec<TlsRedis> = (0..3)
        .map(|_| TlsRedis::start(TestCa::shared(), ServerCert::Valid).expect("TLS node"))
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.tls_port()))
        .collect();
    let url = format!(
        "redlock://{}?tls=true&{}&connect_timeout=30s",
        hosts.join(","),
        TestCa::shared().ca_option()
    );
    let store = RedlockStore::connect(RedlockConfig::from_url(&url).expect("config"))
        .await
        .expect("connect over TLS");
    let lease = store
        .try_acquire("redlock-tls", Duration::from_secs(5))
        .await
        .expect("acquire on a TLS quorum");
    assert!(matches!(
        store
            .try_acquire("redlock-tls", Duration::from_secs(5))
            .await,
        Err(Error::Busy { .. })
    ));
    let _ = store.release(&lease).await.expect("release");
}

/// Connects to `url` (with the password in it) and returns the error, which must be the
/// non-retryable [`Error::Store`] (retrying cannot fix a certificate) and must not show the
/// password.
async fn refused(url: &str) -> Error {
    let url = common::with_options(url, "connect_timeout=5s");
    let url = url.replacen("rediss://", &format!("rediss://:{SECRET}@"), 1);
    let error = match RedisStore::connect(RedisConfig::from_url(&url).expect("config")).await {
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
    let error = refused(&tls_url(
        ServerCert::Valid,
        &TestCa::shared().other_ca_option(),
    ))
    .await;
    let text = error.to_string();
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_server_certificate_for_another_host_is_refused() {
    let error = refused(&tls_url(
        ServerCert::Elsewhere,
        &TestCa::shared().ca_option(),
    ))
    .await;
    let text = error.to_string();
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_tls_client_against_a_plain_text_server_is_refused() {
    let plain = TlsRedis::shared(ServerCert::Valid)
        .plain_url()
        .replace("redis://", "rediss://");
    let error = refused(&TestCa::shared().with_ca_option(&plain)).await;
    assert!(!error.to_string().is_empty());
}

#[tokio::test]
async fn a_missing_client_certificate_is_refused() {
    let error = refused(&tls_url(
        ServerCert::RequireClientCert,
        &TestCa::shared().ca_option(),
    ))
    .await;
    assert!(!error.to_string().is_empty());
}

#[test]
fn tls_options_need_rediss_and_come_in_pairs() {
    let ca = TestCa::shared().ca_file().display().to_string();
    // A file that exists but holds no certificate.
    let not_pem = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let expect = |parsed: fencelock_core::Result<()>, url: &str, needle: &str| match parsed {
        Err(Error::InvalidInput { what: "url", rule }) => {
            assert!(rule.contains(needle), "{url}: {rule}")
        }
        other => panic!("{url}: {other:?}"),
    };
    for (url, needle) in [
        (format!("redis://h:1?tls_ca={ca}"), "rediss://"),
        (format!("rediss://h:1?tls_cert={ca}"), "both or neither"),
        (
            "rediss://h:1?tls_ca=/nonexistent/ca.pem".to_owned(),
            "tls_ca",
        ),
        (format!("rediss://h:1?tls_ca={not_pem}"), "PEM"),
    ] {
        expect(RedisConfig::from_url(&url).map(|_| ()), &url, needle);
    }
    let url = format!("redlock://a:1,b:2,c:3?tls_ca={ca}");
    expect(RedlockConfig::from_url(&url).map(|_| ()), &url, "rediss://");
    let url = format!("redlock://a:1,b:2,c:3?tls=true&tls_ca={ca}");
    assert!(RedlockConfig::from_url(&url).is_ok(), "{url}");
}

// ---- Redis Sentinel over TLS ------------------------------------------------------------

mod sentinel {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use fencelock_conformance::{async_trait, StoreFactory};
    use fencelock_core::{DynLockStore, Error, LockStore, ReleaseOutcome};
    use fencelock_redis::{RedisConfig, RedisStore};
    use test_servers::{closed_ports, RedisSentinel, SentinelOptions, SentinelTls, TestCa};

    fn tls_options() -> SentinelOptions {
        SentinelOptions {
            tls: Some(SentinelTls::from_ca(TestCa::shared())),
            ..SentinelOptions::default()
        }
    }

    /// The binary's TLS deployment for the transport cases.
    fn deployment() -> &'static RedisSentinel {
        static DEPLOYMENT: OnceLock<RedisSentinel> = OnceLock::new();
        DEPLOYMENT.get_or_init(|| RedisSentinel::start(tls_options()).expect("a TLS deployment"))
    }

    struct SentinelTlsFactory {
        url: String,
    }

    #[async_trait]
    impl StoreFactory for SentinelTlsFactory {
        async fn handle(&self) -> DynLockStore {
            Arc::new(super::common::store(&self.url, "").await)
        }

        async fn unreachable_handle(&self) -> DynLockStore {
            let ports = closed_ports(2);
            let url = format!(
                "rediss+sentinel://127.0.0.1:{},127.0.0.1:{}/fencelock?connect_timeout=1s&command_timeout=1s&{}",
                ports[0],
                ports[1],
                TestCa::shared().ca_option()
            );
            Arc::new(
                RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                    .expect("lazy handle"),
            )
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_transport_cases_pass_on_sentinel_over_tls() {
        let url = tokio::task::spawn_blocking(|| deployment().url())
            .await
            .expect("deployment");
        assert!(url.starts_with("rediss+sentinel://"), "{url}");
        fencelock_conformance::expect_transport_cases(Arc::new(SentinelTlsFactory { url })).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failover_over_tls_is_followed() {
        let deployment = tokio::task::spawn_blocking(|| RedisSentinel::start(tls_options()))
            .await
            .expect("join")
            .expect("a TLS deployment");
        let store = super::common::store(&deployment.url(), "").await;
        let ttl = Duration::from_secs(30);
        let before = store
            .try_acquire("tls-failover", ttl)
            .await
            .expect("acquire");
        let (new, deployment) = tokio::task::spawn_blocking(move || {
            (
                deployment.failover().expect("SENTINEL FAILOVER"),
                deployment,
            )
        })
        .await
        .expect("join");
        let mut left = 300;
        let released = loop {
            match store.release(&before).await {
                Err(Error::Unavailable { .. }) if left > 0 => {
                    left -= 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answer => break answer.expect("release on the new master"),
            }
        };
        assert_eq!(released, ReleaseOutcome::Released);
        let after = store
            .try_acquire("tls-failover", ttl)
            .await
            .expect("acquire again");
        assert!(after.fencing_token() > before.fencing_token());
        let on_new = tokio::task::spawn_blocking(move || {
            deployment
                .query(new, &["EXISTS", "fencelock:{tls-failover}:lock"])
                .expect("EXISTS")
        })
        .await
        .expect("join");
        assert_eq!(on_new.trim(), "1", "the grant is on the new master");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinels_whose_certificate_another_ca_signed_are_refused_in_one_line() {
        let url = tokio::task::spawn_blocking(|| deployment().url())
            .await
            .expect("deployment");
        let ca = TestCa::shared();
        let url = url.replace(&ca.ca_option(), &ca.other_ca_option());
        let error = RedisStore::connect(
            RedisConfig::from_url(&format!("{url}&connect_timeout=5s")).expect("config"),
        )
        .await
        .map(drop)
        .expect_err("another CA");
        assert!(
            matches!(error, Error::Store { .. }),
            "not retryable: {error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("every sentinel refused"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}
