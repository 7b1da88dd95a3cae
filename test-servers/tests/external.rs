//! Environment-driven behaviour: external servers and missing binaries.
//!
//! One test only, because it changes process-wide environment variables.

use test_servers::{Error, EtcdServer, PostgresServer, RedisServer};

#[test]
fn external_urls_and_missing_binaries() {
    // A missing binary is an error naming the Debian package, never a skip.
    let path = std::env::var_os("PATH");
    std::env::set_var("PATH", "/nonexistent");
    let err = RedisServer::start_many(1).unwrap_err();
    assert!(
        matches!(&err, Error::MissingBinary { binary, package }
            if binary == "redis-server" && package == "redis-server"),
        "{err}"
    );
    let err = EtcdServer::start().unwrap_err();
    assert!(
        matches!(&err, Error::MissingBinary { package, .. } if package == "etcd-server"),
        "{err}"
    );
    match path {
        Some(p) => std::env::set_var("PATH", p),
        None => std::env::remove_var("PATH"),
    }

    // External servers: handles without processes; faults are unsupported.
    std::env::set_var("LOCK_TEST_REDIS_URL", "redis://redis.invalid:7000");
    std::env::set_var(
        "LOCK_TEST_ETCD_URL",
        "etcd://etcd-a.invalid:2379,etcd-b.invalid:2379",
    );
    std::env::set_var(
        "LOCK_TEST_POSTGRES_URL",
        "postgres://u:p@pg.invalid:5433/db",
    );

    let mut redis = RedisServer::start().unwrap();
    assert!(redis.is_external());
    assert_eq!(redis.url(), "redis://redis.invalid:7000");
    assert_eq!(redis.port(), 7000);
    assert_eq!(redis.pid(), None);
    assert!(matches!(redis.pause(), Err(Error::Unsupported(_))));
    assert!(matches!(redis.resume(), Err(Error::Unsupported(_))));
    assert!(matches!(redis.kill(), Err(Error::Unsupported(_))));
    assert!(matches!(redis.restart(), Err(Error::Unsupported(_))));

    let mut etcd = EtcdServer::start().unwrap();
    assert!(etcd.is_external());
    assert_eq!(etcd.endpoint(), "etcd-a.invalid:2379");
    assert_eq!(etcd.url(), "etcd://etcd-a.invalid:2379,etcd-b.invalid:2379");
    assert!(matches!(etcd.pause(), Err(Error::Unsupported(_))));
    assert!(matches!(etcd.kill(), Err(Error::Unsupported(_))));
    assert!(matches!(etcd.restart(), Err(Error::Unsupported(_))));

    let mut pg = PostgresServer::start().unwrap();
    assert!(pg.is_external());
    assert_eq!(pg.url(), "postgres://u:p@pg.invalid:5433/db");
    assert_eq!(pg.port(), 5433);
    assert!(matches!(pg.pause(), Err(Error::Unsupported(_))));
    assert!(matches!(pg.kill(), Err(Error::Unsupported(_))));
    assert!(matches!(pg.restart(), Err(Error::Unsupported(_))));
    assert!(matches!(pg.crash_and_restart(), Err(Error::Unsupported(_))));

    // start_many always starts its own servers.
    let own = RedisServer::start_many(1).unwrap();
    assert!(!own[0].is_external());
    assert!(own[0].url().starts_with("redis://127.0.0.1:"));
}
