//! The shared subscriber and the URL's effects, against one real redis-server: one pub/sub
//! connection per handle however many waiters, one subscription per key, given up after
//! the wait, survival of a killed pub/sub connection; prefixes, databases and credentials.

mod common;

use std::time::Duration;

use common::{admin, admin_query, store};
use fencelock_conformance::eventually;
use fencelock_core::{Error, LockStore, ReleaseOutcome};
use fencelock_redis::{RedisConfig, RedisStore};
use test_servers::{shared, RedisServer};
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(60);

fn channel(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}:released")
}

async fn subscribers(admin: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: (String, i64) =
        admin_query(admin, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    reply.1
}

/// How many pub/sub connections the server has.
async fn pubsub_clients(admin: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = admin_query(
        admin,
        redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub"),
    )
    .await;
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// A server of the test's own, for tests that count or kill connections.
fn own_server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_handle_share_one_pubsub_connection_and_one_subscription_per_key() {
    let server = own_server();
    let url = server.url();
    let prefix = "shared-subscriber:";
    let holder = store(&url, &format!("prefix={prefix}")).await;
    let waiter = store(&url, &format!("prefix={prefix}")).await;
    let mut admin = admin(&url).await;
    let keys: [&'static str; 3] = ["a", "b", "c"];
    let mut held = Vec::new();
    for key in keys {
        held.push(holder.try_acquire(key, TTL).await.unwrap());
    }
    assert_eq!(pubsub_clients(&mut admin).await, 0);
    // Two waiters per key, all on one handle.
    let mut waiting = Vec::new();
    for key in keys.into_iter().chain(keys) {
        let waiter = waiter.clone();
        waiting.push(tokio::spawn(async move {
            let lease = waiter.acquire(key, TTL, TTL).await?;
            waiter.release(&lease).await
        }));
    }
    assert!(
        eventually!(Duration::from_secs(10), {
            let mut all = true;
            for key in keys {
                all &= subscribers(&mut admin, &channel(prefix, key)).await == 1;
            }
            all
        }),
        "each key's channel has exactly one subscriber"
    );
    assert_eq!(
        pubsub_clients(&mut admin).await,
        1,
        "six waiters, one pub/sub connection"
    );
    for lease in &held {
        assert_eq!(
            holder.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    for waiting in waiting {
        let outcome = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("every waiter got its key well before the holder's TTL")
            .expect("waiter task");
        assert_eq!(outcome.unwrap(), ReleaseOutcome::Released);
    }
    assert!(
        eventually!(Duration::from_secs(10), {
            let mut none = true;
            for key in keys {
                none &= subscribers(&mut admin, &channel(prefix, key)).await == 0;
            }
            none
        }),
        "the subscriptions are given up once nobody waits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_that_never_waits_subscribes_to_nothing() {
    let url = shared::redis().url();
    let prefix = "never-waits:";
    let store = store(&url, &format!("prefix={prefix}")).await;
    let mut admin = admin(&url).await;
    let before: Vec<String> = admin_query(
        &mut admin,
        redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{prefix}*")),
    )
    .await;
    for _ in 0..3 {
        let lease = store.try_acquire("k", TTL).await.unwrap();
        // A zero wait is one attempt, even on a held key: no subscription either.
        assert!(matches!(
            store.acquire("k", TTL, Duration::ZERO).await,
            Err(Error::WaitTimedOut { .. })
        ));
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    let after: Vec<String> = admin_query(
        &mut admin,
        redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{prefix}*")),
    )
    .await;
    assert!(before.is_empty() && after.is_empty(), "{after:?}");
    assert!(
        format!("{store:?}").contains("waited_channels: 0"),
        "{store:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_the_key_though_its_pubsub_connection_was_killed() {
    let server = own_server();
    let url = server.url();
    let prefix = "killed-subscriber:";
    let holder = store(&url, &format!("prefix={prefix}")).await;
    let waiter = store(&url, &format!("prefix={prefix}")).await;
    let mut admin = admin(&url).await;
    let key = "k";
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let next = waiter.acquire(key, TTL, TTL).await;
        (waiter, next, started.elapsed())
    });
    assert!(
        eventually!(Duration::from_secs(10), {
            subscribers(&mut admin, &channel(prefix, key)).await == 1
        }),
        "the waiter subscribed"
    );
    // Kill the waiter's pub/sub connection (the only one on this server).
    let _: i64 = admin_query(
        &mut admin,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
    )
    .await;
    assert!(
        eventually!(Duration::from_secs(10), {
            subscribers(&mut admin, &channel(prefix, key)).await == 1
        }),
        "the subscriber reconnected and subscribed again"
    );
    sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (waiter, next, waited) = waiting.await.expect("waiter task");
    let next = next.expect("the waiter gets the key");
    // Far below the holder's 60 s TTL: woken by the release, or at worst by its capped sleep.
    assert!(
        released_at.elapsed() < Duration::from_secs(10),
        "the waiter took the key {:?} after the release (waited {waited:?})",
        released_at.elapsed()
    );
    assert!(next.fencing_token() > lease.fencing_token());
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_and_databases_separate_locks() {
    let url = shared::redis().url();
    let key = "same-key";
    let a = store(&url, "prefix=tenant-a:").await;
    let b = store(&url, "prefix=tenant-b:").await;
    let db1 = store(&format!("{url}/1"), "prefix=tenant-a:").await;
    let from_a = a.try_acquire(key, TTL).await.unwrap();
    let from_b = b
        .try_acquire(key, TTL)
        .await
        .expect("another prefix does not contend");
    let from_db1 = db1
        .try_acquire(key, TTL)
        .await
        .expect("another database does not contend");
    assert!(matches!(
        store(&url, "prefix=tenant-a:")
            .await
            .try_acquire(key, TTL)
            .await,
        Err(Error::Busy { .. })
    ));
    let mut admin = admin(&format!("{url}/1")).await;
    let owner: String = admin_query(
        &mut admin,
        redis::cmd("GET").arg("tenant-a:{same-key}:lock"),
    )
    .await;
    assert_eq!(
        owner,
        from_db1.owner().to_string(),
        "db 1 holds the lock under its prefix"
    );
    for (store, lease) in [(&a, &from_a), (&b, &from_b), (&db1, &from_db1)] {
        assert_eq!(
            store.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_the_url_are_used_and_never_shown() {
    let url = shared::redis().url();
    let mut admin = admin(&url).await;
    let _: () = admin_query(
        &mut admin,
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locker")
            .arg("on")
            .arg(">s3cr@t+pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all"),
    )
    .await;
    let port = url.rsplit(':').next().expect("a port");
    let good = format!("redis://locker:s3cr%40t+pw@127.0.0.1:{port}?connect_timeout=30s");
    let store = RedisStore::connect(RedisConfig::from_url(&good).unwrap())
        .await
        .expect("the ACL user connects");
    let lease = store.try_acquire("credentials", TTL).await.unwrap();
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let shown = format!("{store:?}");
    assert!(!shown.contains("s3cr"), "{shown}");

    let bad = format!("redis://locker:wrong-s3cret@127.0.0.1:{port}?connect_timeout=30s");
    let refused = RedisStore::connect(RedisConfig::from_url(&bad).unwrap()).await;
    match refused {
        Err(error) => {
            let message = format!("{error} {error:?}");
            assert!(!message.contains("wrong-s3cret"), "{message}");
            assert!(
                !error.is_retryable(),
                "a wrong password is not retryable: {error}"
            );
        }
        Ok(store) => panic!("a wrong password connected: {store:?}"),
    }
}

/// With the `tls` feature, `rediss://` really speaks TLS: against a plain-text server the
/// handshake fails with an error (no panic for want of a crypto provider, no plain-text
/// fallback).
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_against_a_plain_text_server_fails_cleanly() {
    let url = shared::redis().url().replace("redis://", "rediss://");
    let config =
        RedisConfig::from_url(&format!("{url}?connect_timeout=1s&command_timeout=1s")).unwrap();
    match RedisStore::connect(config).await {
        Err(Error::Unavailable { .. } | Error::Store { .. }) => {}
        other => panic!("TLS to a plain-text server: {other:?}"),
    }
}
