//! SASL DIGEST-MD5 (`auth=sasl`) against a standalone server with a JAAS `Server` section
//! (test-servers' `SASL_USERS`): the user works on a prefix an operator made with only READ
//! and CREATE for it, the nodes the store makes carry `sasl:user:cdrwa`, another SASL user is
//! refused on them, and a wrong password fails the connect with a non-retryable error that
//! never shows the password.

mod common;

use std::time::Duration;

use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use fencelock_zookeeper::{ZookeeperConfig, ZookeeperStore};
use test_servers::zookeeper::SASL_USERS;
use test_servers::{ServerCert, ZookeeperEnsemble};
use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission, SaslOptions};

const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;

/// `zookeeper://user:password@host:port?auth=sasl` on the server's plain port.
fn sasl_url(user: &str, password: &str) -> String {
    let url = ZookeeperEnsemble::shared_secure(ServerCert::Valid).url();
    let url = url.replacen(
        "zookeeper://",
        &format!("zookeeper://{user}:{password}@"),
        1,
    );
    format!("{url}?auth=sasl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_user_works_on_its_own_nodes_and_a_wrong_password_is_refused() {
    let (user, password) = SASL_USERS[0];
    let (other, other_password) = SASL_USERS[1];
    let server = ZookeeperEnsemble::shared_secure(ServerCert::Valid);
    let prefix = common::fresh_prefix("sasl");
    // The operator, authenticated as the user, makes the prefix with READ and CREATE for it.
    let operator = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_sasl(SaslOptions::digest_md5(user, password))
        .connect(&server.endpoints().join(","))
        .await
        .expect("the operator's client");
    let rights = [Acl::new(
        Permission::READ | Permission::CREATE,
        AuthId::new("auth", ""),
    )];
    operator
        .create(
            &prefix,
            &[],
            &CreateMode::Persistent.with_acls(Acls::new(&rights)),
        )
        .await
        .expect("the prefix");
    let (acls, _) = operator.get_acl(&prefix).await.expect("the prefix's ACL");
    assert_eq!((acls[0].scheme(), acls[0].id()), ("sasl", user), "{acls:?}");

    let app = common::store(&sasl_url(user, password), &format!("&prefix={prefix}")).await;
    let lease = app
        .try_acquire("k", TTL)
        .await
        .expect("the user takes a lock");
    assert!(matches!(
        app.status("k").await.expect("status"),
        KeyStatus::Held { token: Some(token), .. } if token == lease.fencing_token()
    ));
    let container = app.config().lock_path("k");
    for path in [container, format!("{prefix}/~offset")] {
        let (acls, _) = operator.get_acl(&path).await.expect("its ACL");
        assert_eq!(acls.len(), 1, "{path}: {acls:?}");
        assert_eq!((acls[0].scheme(), acls[0].id()), ("sasl", user), "{path}");
        assert_eq!(acls[0].permission(), Permission::ALL, "{path}");
    }

    let intruder = common::store(
        &sasl_url(other, other_password),
        &format!("&prefix={prefix}"),
    )
    .await;
    match intruder.try_acquire("k", TTL).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("READ and CREATE"), "{message}")
        }
        other => panic!("another SASL user's acquire: {other:?}"),
    }

    let wrong = "not-the-sasl-password";
    let config =
        ZookeeperConfig::from_url(&format!("{}&connect_timeout=30", sasl_url(user, wrong)))
            .expect("config");
    let started = std::time::Instant::now();
    let error = match ZookeeperStore::connect(config).await {
        Ok(_) => panic!("connected with a wrong password"),
        Err(error) => error,
    };
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(error, Error::Store { .. }) && !error.is_retryable(),
        "{error:?}"
    );
    for text in [error.to_string(), format!("{error:?}")] {
        assert!(!text.contains(wrong), "the password shows: {text}");
        assert!(text.contains("credentials"), "{text}");
    }

    assert_eq!(
        app.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}
