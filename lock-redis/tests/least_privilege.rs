//! fencelock-redis as a Redis ACL user with only the rights it needs: the
//! conformance suite (all but the cases that only hold a lease over several TTLs) passes as
//! that user, every right in the list is used (a user without it is refused something, as the
//! server's ACL LOG shows), nothing outside the list is used, and a refused operation is a
//! non-retryable `Error::Store` that names the operation and the right.
//!
//! Redlock's waiter queue needs `EXISTS` and the sorted-set commands, which its scripts call
//! under `pcall`: a user without them still locks (`redlock_locks_without_the_queue_rights`).
//!
//! The user has the README's "Minimal rights" line without `+config|get`, so the eviction check
//! reads `INFO memory` (tests/eviction.rs checks that path against evicting servers), plus the
//! sorted-set commands of shared leases and permits for the suite's mode cases.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fencelock_conformance::{async_trait, eventually, StoreFactory};
use fencelock_core::{DynLockStore, Error, LockStore};
use fencelock_redis::{EvictionCheck, RedisConfig, RedisStore};
use test_servers::{closed_ports, RedisServer};

/// The least-privilege user and its password (which no error text may show).
const USER: &str = "locks";
const PASSWORD: &str = "lp-Secret-3f9c";

/// Commands the store needs, as ACL rules: the README's list without `+config|get`.
const RIGHTS: &[&str] = &[
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+set",
    "+get",
    "+del",
    "+pexpire",
    "+pttl",
    "+time",
    "+publish",
    "+info",
];

/// The sorted-set commands that shared and permit modes and the marks of waiting writers add
/// (the crate docs, `# Server requirements`). A user without them takes exclusive locks: the
/// waiting script writes its mark under `pcall`, refused but tolerated.
const SORTED_SET_RIGHTS: &[&str] = &[
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zremrangebyscore",
    "+zcard",
    "+zscore",
];

/// Keys and channels under the default prefix `fencelock:`.
const KEYS: &str = "~fencelock:*";
const CHANNELS: &str = "&fencelock:*";

const TTL: Duration = Duration::from_secs(10);

/// `ACL SETUSER user` rules: `password`, one key pattern, one channel pattern, no command but
/// `rights`.
fn rules<'a>(
    password: &'a str,
    keys: &'a str,
    channels: &'a str,
    rights: &[&'a str],
) -> Vec<&'a str> {
    let mut rules = vec![
        "on",
        password,
        "resetkeys",
        keys,
        "resetchannels",
        channels,
        "-@all",
    ];
    rules.extend_from_slice(rights);
    rules
}

fn password_rule() -> String {
    format!(">{PASSWORD}")
}

/// A fresh local server (always ours: ACL users are changed) with `user` set up by `rules`.
fn server_with(users: &[(&str, Vec<&str>)]) -> RedisServer {
    let server = RedisServer::start_with_args(&["--acllog-max-len", &ACL_LOG_LEN.to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    for (user, rules) in users {
        server
            .acl_setuser(user, rules)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    server
}

/// One server per test process for the conformance cases, with the least-privilege user of
/// every mode: the listed rights and the sorted-set ones (the suite takes shared leases and
/// permits too; without those rights they fail, naming the command).
fn shared_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let password = password_rule();
        let rights = [RIGHTS, SORTED_SET_RIGHTS].concat();
        server_with(&[(USER, rules(&password, KEYS, CHANNELS, &rights))])
    })
}

struct LeastPrivilegeFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for LeastPrivilegeFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(common::store(&self.url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let url = format!(
            "redis://{USER}:{PASSWORD}@127.0.0.1:{}?connect_timeout=1s&command_timeout=1s",
            closed_ports(1)[0]
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }

    // `forget` stays the default, `evict` through a fresh handle: the evict script needs only
    // DEL and PUBLISH, which the user has, so no admin connection is needed.
}

/// The suite, every handle logged in as the least-privilege user, four cases at a time. Left
/// out: the cases that only hold a lease over several TTLs (`HOLD_CASES`, 4 to 15 s each: they
/// send no request the others do not send), as `tests/conformance.rs` runs them; and the
/// listing cases, which need `SCAN`, a right beyond locking's (the crate docs, `# Server
/// requirements`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_as_the_least_privilege_user() {
    let factory = Arc::new(LeastPrivilegeFactory {
        url: shared_server().url_as(USER, PASSWORD),
    });
    let listing = [
        "a_listing_shows_exactly_the_held_keys_under_its_prefix",
        "a_listing_pages_through_every_held_key",
    ];
    let left_out = [fencelock_conformance::HOLD_CASES, &listing].concat();
    fencelock_conformance::expect_cases_except(factory, 4, &left_out).await;
}

/// One `ACL LOG` entry: why (`command`, `key`, `channel`), where (`toplevel`, `lua`), what
/// (the command, key or channel), whose, and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Denial {
    reason: String,
    context: String,
    object: String,
    username: String,
    count: i64,
}

/// How many `ACL LOG` entries the servers keep and the tests read (`ACL LOG` alone gives 10).
const ACL_LOG_LEN: usize = 1_000;

/// The server's `ACL LOG`, newest first.
async fn acl_log(server: &RedisServer) -> Vec<Denial> {
    let mut admin = common::admin(&server.url()).await;
    let entries: Vec<std::collections::HashMap<String, redis::Value>> =
        common::admin_query(&mut admin, redis::cmd("ACL").arg("LOG").arg(ACL_LOG_LEN)).await;
    let text = |entry: &std::collections::HashMap<String, redis::Value>, field: &str| match entry
        .get(field)
    {
        Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        other => panic!("ACL LOG field {field}: {other:?}"),
    };
    entries
        .iter()
        .map(|entry| Denial {
            reason: text(entry, "reason"),
            context: text(entry, "context"),
            object: text(entry, "object"),
            username: text(entry, "username"),
            count: match entry.get("count") {
                Some(redis::Value::Int(count)) => *count,
                other => panic!("ACL LOG count: {other:?}"),
            },
        })
        .collect()
}

async fn denials_of(server: &RedisServer, user: &str) -> Vec<Denial> {
    let mut denials = acl_log(server).await;
    denials.retain(|d| d.username == user);
    denials
}

/// What one pass over every operation saw: the errors (operation, error) and the eviction check.
#[derive(Debug, Default)]
struct Seen {
    errors: Vec<(&'static str, Error)>,
    eviction: Option<EvictionCheck>,
}

/// Every operation of the store as `url`'s user on `key`: connect, acquire, extend, status, a
/// waiter that subscribes while the key is held, release (which wakes it), evict of the
/// waiter's lock, and the waiter leaving (unsubscribe). Errors are collected, not raised.
async fn every_operation(server: &RedisServer, url: &str, key: &str) -> Seen {
    let mut seen = Seen::default();
    let url = common::with_options(url, "connect_timeout=30s&command_timeout=10s");
    let store = match RedisStore::connect(RedisConfig::from_url(&url).expect("config")).await {
        Ok(store) => Arc::new(store),
        Err(error) => {
            seen.errors.push(("connect", error));
            return seen;
        }
    };
    seen.eviction = store.eviction_check().cloned();
    let lease = match store.try_acquire(key, TTL).await {
        Ok(lease) => lease,
        Err(error) => {
            seen.errors.push(("acquire", error));
            return seen;
        }
    };
    if let Err(error) = store.extend(&lease).await {
        seen.errors.push(("extend", error));
    }
    if let Err(error) = store.status(key).await {
        seen.errors.push(("status", error));
    }
    let waiter = tokio::spawn({
        let (store, key) = (store.clone(), key.to_owned());
        async move { store.acquire(&key, TTL, Duration::from_secs(2)).await }
    });
    // The waiter is in its wait once the server saw its SUBSCRIBE (or refused it), or it gave
    // up (its first attempt failed).
    let mut admin = common::admin(&server.url()).await;
    let channel = format!("fencelock:{{{key}}}:released");
    let user = url_user(&url);
    let in_wait = eventually!(Duration::from_secs(10), {
        let (_, subscribers): (String, i64) =
            common::admin_query(&mut admin, redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel)).await;
        subscribers > 0
            || waiter.is_finished()
            || denials_of(server, &user)
                .await
                .iter()
                .any(|d| d.object == "subscribe" || d.object == channel)
    });
    assert!(in_wait, "{key}: the waiter never got into its wait");
    if let Err(error) = store.release(&lease).await {
        seen.errors.push(("release", error));
    }
    match waiter.await.expect("waiter task") {
        Ok(_lease) => {
            if let Err(error) = store.evict(key).await {
                seen.errors.push(("evict", error));
            }
        }
        Err(error) => seen.errors.push(("wait", error)),
    }
    seen
}

fn url_user(url: &str) -> String {
    let (_, rest) = url.split_once("://").expect("scheme");
    let (user, _) = rest.split_once(':').expect("user");
    user.to_owned()
}

/// Asserts that every ACL refusal among `errors` is a non-retryable `Error::Store` naming its
/// operation and `names` (case-insensitive), without the password; gives how many there were.
fn refusals_name(errors: &[(&'static str, Error)], names: &str, case: &str) -> usize {
    let mut refusals = 0;
    for (op, error) in errors {
        let text = format!("{error} {error:?}");
        assert!(!text.contains(PASSWORD), "{case}: password in {text}");
        match error {
            // What follows from a refusal elsewhere (a release that failed leaves the key held).
            Error::Busy { .. } | Error::WaitTimedOut { .. } => continue,
            Error::Store { message, .. } => {
                let operation = match *op {
                    "wait" => "acquire: ".to_owned(),
                    "connect" => "connecting to redis://".to_owned(),
                    op => format!("{op}: "),
                };
                assert!(
                    message.starts_with(&operation),
                    "{case}: {op} does not name its operation: {message}"
                );
                assert!(
                    message.to_lowercase().contains(&names.to_lowercase()),
                    "{case}: {op} does not name {names:?}: {message}"
                );
                assert!(!error.is_retryable(), "{case}: {op} retryable: {error:?}");
                refusals += 1;
            }
            other => panic!("{case}: {op} failed with {other:?}, not a Store error"),
        }
    }
    refusals
}

/// With exactly the listed rights, every exclusive operation works, and the server refused
/// nothing but `CONFIG GET` (the eviction check then reads `INFO memory`) and the sorted-set
/// writes of a waiting writer's mark (under `pcall`); with the sorted-set rights added, nothing
/// but `CONFIG GET`. The lists are complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listed_rights_cover_every_operation() {
    let password = password_rule();
    let with_sorted_sets = [RIGHTS, SORTED_SET_RIGHTS].concat();
    let server = server_with(&[
        (USER, rules(&password, KEYS, CHANNELS, RIGHTS)),
        (
            "with-sorted-sets",
            rules(&password, KEYS, CHANNELS, &with_sorted_sets),
        ),
    ]);
    let url = server.url_as(USER, PASSWORD);
    for (user, tolerated) in [
        (USER, SORTED_SET_RIGHTS),
        ("with-sorted-sets", &[] as &[&str]),
    ] {
        let seen = every_operation(&server, &server.url_as(user, PASSWORD), user).await;
        assert!(seen.errors.is_empty(), "{user}: {:?}", seen.errors);
        match &seen.eviction {
            Some(EvictionCheck::CannotEvict(settings)) => {
                assert_eq!(settings.read_with(), "INFO memory")
            }
            other => panic!("{user}: expected CannotEvict through INFO memory, got {other:?}"),
        }
        let denials = denials_of(&server, user).await;
        let expected = |d: &Denial| {
            (d.context == "toplevel" && d.object == "config|get")
                || (d.context == "lua" && tolerated.contains(&format!("+{}", d.object).as_str()))
        };
        assert!(
            denials.iter().all(|d| d.reason == "command" && expected(d)),
            "{user}: refused beyond the CONFIG GET fallback and the tolerated: {denials:?}"
        );
    }

    // `lockctl stats` counts keys with SCAN, which the list leaves out: refused, naming it.
    let store = common::store(&url, "").await;
    let error = store.stored_keys().await.expect_err("SCAN is not granted");
    assert!(!error.is_retryable(), "{error:?}");
    assert!(error.to_string().contains("'scan'"), "{error}");
}

/// Each listed right is needed: a user without it is refused (the ACL LOG names the right) and
/// every operation that failed for it is a non-retryable `Error::Store` naming the operation
/// and the right. A key or channel pattern that misses the prefix is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_right_is_needed_and_its_absence_is_named() {
    struct Case {
        user: String,
        rules: Vec<&'static str>,
        /// The ACL LOG entry's reason and object that the missing right causes.
        denied: (&'static str, String),
        /// What the refused operations' errors name, if any operation fails.
        named: Option<&'static str>,
    }
    let password: &'static str = Box::leak(password_rule().into_boxed_str());
    let mut cases: Vec<Case> = RIGHTS
        .iter()
        .map(|right| {
            let command = right.trim_start_matches('+');
            let named = match command {
                // Waits fall back to retrying; the eviction check to Unknown.
                "subscribe" | "unsubscribe" | "info" => None,
                "evalsha" | "script|load" | "ping" => Some(command),
                // Called inside a script: named in capitals with the line that calls it.
                _ => Some(Box::leak(command.to_uppercase().into_boxed_str()) as &str),
            };
            let others: Vec<&str> = RIGHTS.iter().copied().filter(|r| r != right).collect();
            Case {
                user: format!("without-{}", command.replace('|', "-")),
                rules: rules(password, KEYS, CHANNELS, &others),
                denied: ("command", command.to_owned()),
                named,
            }
        })
        .collect();
    cases.push(Case {
        user: "other-keys".into(),
        rules: rules(password, "~other:*", CHANNELS, RIGHTS),
        denied: ("key", "fencelock:{other-keys}:lock".into()),
        named: Some("keys"),
    });
    cases.push(Case {
        user: "other-channels".into(),
        rules: rules(password, KEYS, "&other:*", RIGHTS),
        denied: ("channel", "fencelock:{other-channels}:released".into()),
        named: Some("channels under the store's prefix"),
    });
    let users: Vec<(&str, Vec<&str>)> = cases
        .iter()
        .map(|c| (c.user.as_str(), c.rules.clone()))
        .collect();
    let server = Arc::new(server_with(&users));

    // Without SCRIPT LOAD a user runs only scripts that are loaded already: this case goes
    // first, alone, before anyone has loaded them.
    let (first, rest): (Vec<Case>, Vec<Case>) = cases
        .into_iter()
        .partition(|c| c.user == "without-script-load");
    let mut runs = Vec::new();
    for batch in [first, rest] {
        let mut tasks = Vec::new();
        for case in batch {
            let server = server.clone();
            tasks.push(tokio::spawn(async move {
                let url = server.url_as(&case.user, PASSWORD);
                let seen = every_operation(&server, &url, &case.user).await;
                (case, seen)
            }));
        }
        for task in tasks {
            runs.push(task.await.expect("case task"));
        }
    }

    for (case, seen) in runs {
        let user = &case.user;
        let (reason, object) = &case.denied;
        // The waiter's UNSUBSCRIBE is sent as it leaves, after the operations returned.
        let logged = eventually!(
            Duration::from_secs(10),
            denials_of(&server, user)
                .await
                .iter()
                .any(|d| d.reason == *reason && d.object == *object)
        );
        assert!(
            logged,
            "{user}: the server never refused {reason} {object:?}: {:?} {seen:?}",
            acl_log(&server).await
        );
        match case.named {
            Some(names) => assert!(
                refusals_name(&seen.errors, names, user) > 0,
                "{user}: no operation failed: {seen:?}"
            ),
            None => assert!(seen.errors.is_empty(), "{user}: {:?}", seen.errors),
        }
        if object == "info" {
            match &seen.eviction {
                Some(EvictionCheck::Unknown { reason }) => {
                    assert!(reason.contains("'info'"), "{reason}")
                }
                other => panic!("{user}: expected Unknown, got {other:?}"),
            }
        }
    }
}

/// A user without `+subscribe` still gets a key released while it waits (by trying again), and
/// its handle backs off between refused SUBSCRIBEs instead of reconnecting at once: it once
/// sent thousands a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscribe_is_retried_with_backoff() {
    let password = password_rule();
    let others: Vec<&str> = RIGHTS
        .iter()
        .copied()
        .filter(|r| *r != "+subscribe")
        .collect();
    let server = server_with(&[(USER, rules(&password, KEYS, CHANNELS, &others))]);
    let url = server.url_as(USER, PASSWORD);
    let holder = common::store(&url, "").await;
    let waiter = Arc::new(common::store(&url, "").await);
    let key = "rights/no-subscribe";
    let lease = holder.try_acquire(key, TTL).await.expect("acquire");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(key, TTL, Duration::from_secs(30)).await }
    });
    // Wait through two seconds of refused SUBSCRIBEs (at most ten with the backoff of 50 ms
    // doubling to 1 s; thousands without it), then release.
    assert!(
        eventually!(
            Duration::from_secs(10),
            denials_of(&server, USER)
                .await
                .iter()
                .any(|d| d.object == "subscribe")
        ),
        "SUBSCRIBE was never refused"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "the waiter stopped waiting");
    let _ = holder.release(&lease).await.expect("release");
    let lease = waiting
        .await
        .expect("waiter task")
        .expect("the waiter gets the key by trying again");
    let _ = waiter.release(&lease).await.expect("release");
    let subscribes: i64 = denials_of(&server, USER)
        .await
        .iter()
        .filter(|d| d.object == "subscribe")
        .map(|d| d.count)
        .sum();
    assert!(
        (1..=40).contains(&subscribes),
        "{subscribes} refused SUBSCRIBEs in about two seconds"
    );
}

/// Redlock as a user with the listed rights but not `EXISTS` nor the sorted-set commands its
/// waiter queue uses: the queue's commands run under `pcall` (the crate docs, `# Redlock`), so
/// the user still locks, a waiter still gets the key once it is released (its wait
/// unordered, found by trying again), and tokens still grow. The ACL LOG shows the queue's
/// commands refused inside the scripts, so the fallback, not a user who happened to have the
/// rights, is what passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_locks_without_the_queue_rights() {
    use fencelock_redis::{RedlockConfig, RedlockStore};
    let password = password_rule();
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| server_with(&[(USER, rules(&password, KEYS, CHANNELS, RIGHTS))]))
        .collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!(
        "redlock://{USER}:{PASSWORD}@{}?connect_timeout=30s&command_timeout=10s",
        hosts.join(",")
    );
    let store = RedlockStore::connect(RedlockConfig::from_url(&url).expect("config"))
        .await
        .expect("connect as the user without the queue's rights");
    let key = "redlock-no-queue";

    let first = store.try_acquire(key, TTL).await.expect("try_acquire");
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { store.acquire(key, TTL, Duration::from_secs(60)).await }
    });
    // The waiter's round tried to enter the queue (ZADD, refused) on every node: it waits.
    for server in &servers {
        let entered = eventually!(
            Duration::from_secs(30),
            denials_of(server, USER)
                .await
                .iter()
                .any(|d| d.reason == "command" && d.object == "zadd" && d.context == "lua")
        );
        assert!(
            entered,
            "no refused ZADD from the waiter's round: {:?}",
            acl_log(server).await
        );
    }
    assert!(!waiter.is_finished(), "the waiter got a key that was held");
    assert_eq!(
        store.release(&first).await.expect("release"),
        fencelock_core::ReleaseOutcome::Released
    );
    let second = waiter
        .await
        .expect("waiter task")
        .expect("the waiter gets the key after the release");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{} after {}",
        second.fencing_token(),
        first.fencing_token()
    );
    assert_eq!(
        store.release(&second).await.expect("release"),
        fencelock_core::ReleaseOutcome::Released
    );
    // The release's wake of the queue's head ran under pcall too (EXISTS refused).
    for server in &servers {
        let denials = denials_of(server, USER).await;
        assert!(
            denials
                .iter()
                .any(|d| d.object == "exists" && d.context == "lua"),
            "{denials:?}"
        );
    }
}
