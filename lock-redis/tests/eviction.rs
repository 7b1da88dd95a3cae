//! A server that may evict keys (`maxmemory` with a policy other than `noeviction`) could
//! delete a held lock: the stores refuse it unless the URL accepts the risk, read the settings
//! from `INFO memory` where `CONFIG` is not allowed, and go on (saying so) where neither is.

mod common;

use std::time::Duration;

use common::{admin, admin_query, with_options};
use fencelock_core::{Error, LockStore, ReleaseOutcome};
use fencelock_redis::{
    EvictionCheck, EvictionRisk, RedisConfig, RedisStore, RedlockConfig, RedlockStore,
};
use test_servers::RedisServer;

const TTL: Duration = Duration::from_secs(10);
const EVICTING: &[&str] = &["--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru"];
const NOT_EVICTING: &[&str] = &["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"];
const NO_CONFIG: &[&str] = &["--rename-command", "CONFIG", ""];

fn server(args: &[&str]) -> RedisServer {
    RedisServer::start_with_args(args).unwrap_or_else(|e| panic!("{e}"))
}

fn config(url: &str, options: &str) -> RedisConfig {
    // Generous timeouts: other test processes may load this machine.
    let url = with_options(url, "connect_timeout=30s&command_timeout=10s");
    RedisConfig::from_url(&with_options(&url, options)).expect("config")
}

/// The eviction refusal behind `error`: a non-retryable `Error::Store` with a typed source.
fn refusal(error: &Error) -> (&str, &EvictionRisk) {
    let Error::Store { message, .. } = error else {
        panic!("expected Error::Store, got {error:?}");
    };
    assert!(!error.is_retryable(), "configuration is not retryable");
    let risk = std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<EvictionRisk>())
        .unwrap_or_else(|| panic!("no EvictionRisk source: {error:?}"));
    (message, risk)
}

/// One acquire and release, proving the handle works.
async fn cycle(store: &dyn LockStore, key: &str) {
    let lease = store.try_acquire(key, TTL).await.expect("acquire");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn connect_is_refused_when_the_server_can_evict_a_held_lock() {
    let server = server(EVICTING);
    let error = RedisStore::connect(config(&server.url(), ""))
        .await
        .expect_err("a server that may evict locks is refused");
    let (message, risk) = refusal(&error);
    for part in [
        "maxmemory 8388608",
        "maxmemory-policy volatile-lru",
        "CONFIG GET",
        "evict a held lock",
        "noeviction",
        "allow_eviction=true",
        &format!("127.0.0.1:{}", server.port()),
    ] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
    assert!(risk.settings().can_evict());
}

#[tokio::test]
async fn allow_eviction_accepts_an_evicting_server_knowingly() {
    let server = server(EVICTING);
    let store = RedisStore::connect(config(&server.url(), "allow_eviction=true"))
        .await
        .expect("allow_eviction=true connects");
    assert_eq!(store.eviction_check(), Some(&EvictionCheck::Allowed));
    cycle(&store, "eviction:allowed").await;
}

#[tokio::test]
async fn a_memory_limit_with_noeviction_connects() {
    let server = server(NOT_EVICTING);
    let store = RedisStore::connect(config(&server.url(), ""))
        .await
        .expect("noeviction connects");
    match store.eviction_check() {
        Some(EvictionCheck::CannotEvict(settings)) => {
            assert_eq!(settings.maxmemory(), 8 * 1024 * 1024);
            assert_eq!(settings.policy(), "noeviction");
            assert_eq!(settings.read_with(), "CONFIG GET");
        }
        other => panic!("expected CannotEvict, got {other:?}"),
    }
    cycle(&store, "eviction:noeviction").await;
}

#[tokio::test]
async fn settings_come_from_info_memory_when_config_is_renamed() {
    let evicting = server(&[EVICTING, NO_CONFIG].concat());
    let error = RedisStore::connect(config(&evicting.url(), ""))
        .await
        .expect_err("refused through INFO memory");
    let (message, risk) = refusal(&error);
    assert!(message.contains("INFO memory"), "{message}");
    assert_eq!(risk.settings().policy(), "volatile-lru");
    assert_eq!(risk.settings().read_with(), "INFO memory");

    let safe = server(&[NOT_EVICTING, NO_CONFIG].concat());
    let store = RedisStore::connect(config(&safe.url(), ""))
        .await
        .expect("noeviction through INFO memory connects");
    match store.eviction_check() {
        Some(EvictionCheck::CannotEvict(settings)) => {
            assert_eq!(settings.read_with(), "INFO memory");
            assert_eq!(settings.policy(), "noeviction");
        }
        other => panic!("expected CannotEvict, got {other:?}"),
    }
}

#[tokio::test]
async fn a_user_without_config_and_info_goes_on_and_the_check_says_unknown() {
    let server = server(EVICTING);
    let mut admin = admin(&server.url()).await;
    let _: () = admin_query(
        &mut admin,
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locker")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-config")
            .arg("-info"),
    )
    .await;
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    let store = RedisStore::connect(config(&url, ""))
        .await
        .expect("an unknown risk does not refuse");
    match store.eviction_check() {
        Some(EvictionCheck::Unknown { reason }) => {
            assert!(reason.contains("CONFIG GET"), "{reason}");
            assert!(reason.contains("INFO memory"), "{reason}");
            assert!(!reason.contains("pw@"), "{reason}");
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    cycle(&store, "eviction:unknown").await;
}

#[tokio::test]
async fn a_lazy_handle_checks_at_first_use_and_writes_nothing_when_refused() {
    let server = server(EVICTING);
    let store = RedisStore::connect_lazy(config(&server.url(), "")).expect("lazy handle");
    assert_eq!(
        store.eviction_check(),
        None,
        "nothing is checked before first use"
    );
    let error = store
        .try_acquire("eviction:lazy", TTL)
        .await
        .expect_err("the first use is refused");
    refusal(&error);
    let mut admin = admin(&server.url()).await;
    let keys: Vec<String> = admin_query(&mut admin, redis::cmd("KEYS").arg("*")).await;
    assert!(keys.is_empty(), "a refused handle wrote {keys:?}");

    // An operator who fixes the server needs no new handle: a refusal is not remembered.
    let _: () = admin_query(
        &mut admin,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("noeviction"),
    )
    .await;
    cycle(&store, "eviction:lazy").await;
    assert!(matches!(
        store.eviction_check(),
        Some(EvictionCheck::CannotEvict(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_one_of_five_nodes_evicting_is_refused_naming_that_node() {
    let mut servers = RedisServer::start_many(4).unwrap_or_else(|e| panic!("{e}"));
    servers.insert(2, server(EVICTING));
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!(
        "redlock://{}?connect_timeout=30s&command_timeout=10s",
        hosts.join(",")
    );
    let error = RedlockStore::connect(RedlockConfig::from_url(&url).expect("config"))
        .await
        .expect_err("one evicting node refuses the store");
    let (message, risk) = refusal(&error);
    // The message starts with the whole redlock:// URL, then names the one node at fault.
    assert!(
        message.contains(&format!("redis://{}: Redis may evict", hosts[2])),
        "{message}"
    );
    assert!(
        message.contains("maxmemory-policy volatile-lru"),
        "{message}"
    );
    assert!(message.contains("allow_eviction=true"), "{message}");
    for (i, host) in hosts.iter().enumerate() {
        assert_eq!(
            risk.node().contains(host),
            i == 2,
            "{host}: {}",
            risk.node()
        );
    }

    let allowed = RedlockConfig::from_url(&format!("{url}&allow_eviction=true")).expect("config");
    let store = RedlockStore::connect(allowed)
        .await
        .expect("allow_eviction=true connects");
    assert!(store
        .eviction_checks()
        .iter()
        .all(|(_, check)| *check == Some(&EvictionCheck::Allowed)));
    cycle(&store, "eviction:redlock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_redlock_handle_never_uses_an_evicting_node() {
    let mut servers = RedisServer::start_many(2).unwrap_or_else(|e| panic!("{e}"));
    servers.push(server(EVICTING));
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!(
        "redlock://{}?connect_timeout=30s&command_timeout=10s",
        hosts.join(",")
    );
    let store = RedlockStore::connect_lazy(RedlockConfig::from_url(&url).expect("config"))
        .expect("lazy handle");
    // Two of three healthy nodes are a quorum: the lock works without the evicting node.
    cycle(&store, "eviction:lazy-redlock").await;
    let checks = store.eviction_checks();
    assert!(matches!(checks[0].1, Some(EvictionCheck::CannotEvict(_))));
    assert!(matches!(checks[1].1, Some(EvictionCheck::CannotEvict(_))));
    assert_eq!(
        checks[2],
        (hosts[2].as_str(), None),
        "the evicting node is refused"
    );
    let mut admin = admin(&servers[2].url()).await;
    let keys: Vec<String> = admin_query(&mut admin, redis::cmd("KEYS").arg("*")).await;
    assert!(keys.is_empty(), "the evicting node was written: {keys:?}");
}

/// The least-privilege ACL user of tests/least_privilege.rs (the README's "Minimal rights"
/// line without `+config|get`): its `CONFIG GET` is refused, so the check reads `INFO memory`,
/// refuses an evicting server and accepts a `noeviction` one.
#[tokio::test]
async fn a_least_privilege_user_reads_the_settings_from_info_memory() {
    const PASSWORD: &str = "lp-Secret-3f9c";
    let rules = [
        "on",
        &format!(">{PASSWORD}"),
        "resetkeys",
        "~fencelock:*",
        "resetchannels",
        "&fencelock:*",
        "-@all",
        "+evalsha",
        "+script|load",
        "+subscribe",
        "+unsubscribe",
        "+ping",
        "+set",
        "+get",
        "+del",
        "+incr",
        "+pexpire",
        "+pttl",
        "+time",
        "+publish",
        "+info",
    ];
    let evicting = server(EVICTING);
    evicting
        .acl_setuser("locks", &rules)
        .unwrap_or_else(|e| panic!("{e}"));
    let error = RedisStore::connect(config(&evicting.url_as("locks", PASSWORD), ""))
        .await
        .expect_err("an evicting server is refused through INFO memory");
    let (message, risk) = refusal(&error);
    assert!(message.contains("INFO memory"), "{message}");
    assert!(!message.contains("CONFIG GET"), "{message}");
    assert!(
        !format!("{error} {error:?}").contains(PASSWORD),
        "{error:?}"
    );
    assert_eq!(risk.settings().read_with(), "INFO memory");
    assert_eq!(risk.settings().policy(), "volatile-lru");
    assert_eq!(risk.settings().maxmemory(), 8 * 1024 * 1024);

    let safe = server(NOT_EVICTING);
    safe.acl_setuser("locks", &rules)
        .unwrap_or_else(|e| panic!("{e}"));
    let store = RedisStore::connect(config(&safe.url_as("locks", PASSWORD), ""))
        .await
        .expect("a noeviction server is accepted through INFO memory");
    match store.eviction_check() {
        Some(EvictionCheck::CannotEvict(settings)) => {
            assert_eq!(settings.read_with(), "INFO memory");
            assert_eq!(settings.policy(), "noeviction");
        }
        other => panic!("expected CannotEvict, got {other:?}"),
    }
    cycle(&store, "eviction:least-privilege").await;
}
