//! A least-privilege user on test-servers' shared standalone ZooKeeper: digest auth from the
//! URL, a prefix an operator made with only READ and CREATE for that user, and every node the
//! store creates readable and writable by that user alone. The user works (acquire, status,
//! extend, evict, release, per-key state); another user, and a handle with no user, are
//! refused with `Error::Store` naming the rights.

mod common;

use std::time::Duration;

use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use test_servers::ZookeeperEnsemble;
use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission};

/// The longest TTL the test server allows (its `maxSessionTimeout`).
const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;

fn with_user(url: &str, user: &str) -> String {
    url.replacen("zookeeper://", &format!("zookeeper://{user}@"), 1)
}

fn refused<T: std::fmt::Debug>(what: &str, result: fencelock_core::Result<T>) {
    match result {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("READ and CREATE"), "{what}: {message}")
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_user_with_read_and_create_on_the_prefix_works_and_others_are_refused() {
    let url = ZookeeperEnsemble::shared_standalone().url();
    let prefix = common::fresh_prefix("acl");
    // The operator: authenticated as the user, makes the prefix with READ and CREATE for it.
    let config = fencelock_zookeeper::ZookeeperConfig::from_url(&url).expect("config");
    let operator = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_auth("digest", b"app:s3cret")
        .connect(&config.endpoints().join(","))
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

    let app = common::store(&with_user(&url, "app:s3cret"), &format!("&prefix={prefix}")).await;
    let lease = app
        .try_acquire("k", TTL)
        .await
        .expect("the user takes a lock");
    app.extend(&lease).await.expect("the user extends it");
    assert!(matches!(
        app.status("k").await.expect("status"),
        KeyStatus::Held { token: Some(token), .. } if token == lease.fencing_token()
    ));
    assert_eq!(
        app.per_key_state()
            .await
            .expect("per-key state")
            .map(|s| s.count),
        Some(1)
    );
    // The nodes it made are the user's alone.
    let container = app.config().lock_path("k");
    for path in [container.clone(), format!("{prefix}/~offset")] {
        let (acls, _) = operator.get_acl(&path).await.expect("its ACL");
        assert_eq!(acls.len(), 1, "{path}: {acls:?}");
        assert_eq!(acls[0].scheme(), "digest", "{path}");
        assert!(acls[0].id().starts_with("app:"), "{path}: {acls:?}");
        assert_eq!(acls[0].permission(), Permission::ALL, "{path}");
    }

    let other = common::store(&with_user(&url, "other:pw"), &format!("&prefix={prefix}")).await;
    refused("another user's acquire", other.try_acquire("k", TTL).await);
    refused("another user's status", other.status("k").await);
    refused("another user's evict", other.evict("k").await);
    let anonymous = common::store(&url, &format!("&prefix={prefix}")).await;
    refused(
        "an anonymous acquire",
        anonymous.try_acquire("j", TTL).await,
    );

    assert!(app.evict("k").await.expect("the user evicts"));
    let lease = app.try_acquire("k", TTL).await.expect("free again");
    assert_eq!(
        app.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}
