//! Least privilege on etcd, against a real member with authentication on
//! (`test_servers::EtcdServer::start_with_auth`):
//!
//! - the conformance suite (all but the five cases of [`LEFT_OUT`]) as the user `locks`, whose
//!   only role grants `readwrite` on the store's prefix `fencelock/` (every key the default
//!   layout writes is under it: the queue directories `fencelock/{escaped key}/` and their
//!   entries; leases need no permission). The suite's `forget` evicts through a handle of
//!   that same user;
//! - users that lack the prefix, or have `read` only, get a non-retryable `Error::Store` that
//!   names the operation, the key it touched and the right the user needs, never a password;
//! - a handle goes on working after users or roles change (the member uses JWT tokens, which
//!   etcd refuses once the auth store has changed since they were issued).

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::EtcdFactory;
use fencelock_conformance::StoreFactory;
use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use fencelock_etcd::{EtcdConfig, EtcdStore, DEFAULT_PREFIX};
use test_servers::EtcdServer;

/// The member with authentication on, shared by every test of this file.
fn server() -> &'static EtcdServer {
    static SERVER: OnceLock<EtcdServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        EtcdServer::start_with_auth(DEFAULT_PREFIX).expect("etcd with authentication")
    })
}

/// `outsider`: `readwrite` on `elsewhere/` only, nothing under the store's prefix.
fn outsider() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        server()
            .add_user("outsider", &[("readwrite", "elsewhere/")])
            .expect("user outsider")
    })
}

/// `reader`: `read` on the store's prefix, no `write`.
fn reader() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        server()
            .add_user("reader", &[("read", DEFAULT_PREFIX)])
            .expect("user reader")
    })
}

fn limited() -> String {
    server()
        .limited_url()
        .expect("a server with authentication")
}

/// The password in an `etcd://user:password@…` URL.
fn password(url: &str) -> String {
    let userinfo = url.split_once("://").expect("a URL").1;
    let userinfo = userinfo.split_once('@').expect("a user").0;
    userinfo.split_once(':').expect("a password").1.to_owned()
}

const TTL: Duration = Duration::from_secs(30);

fn key(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("least-privilege-{test}-{nanos:08x}")
}

/// `error` is the non-retryable refusal that names `needles` (the operation, the key, the
/// right) and shows no password of this server's users.
fn assert_refused(error: &Error, needles: &[&str]) {
    assert!(
        matches!(error, Error::Store { .. }) && !error.is_retryable(),
        "a missing right is not retryable: {error:?}"
    );
    let text = error.to_string();
    for needle in needles.iter().chain(&["etcd refused: permission denied"]) {
        assert!(text.contains(needle), "{needle:?} is not in: {text}");
    }
    let passwords = [
        password(&limited()),
        password(reader()),
        password(outsider()),
        password(&server().root_url().expect("root")),
    ];
    for shown in [text, format!("{error:?}")] {
        for secret in &passwords {
            assert!(
                !shown.contains(secret.as_str()),
                "a password shows: {shown}"
            );
        }
    }
}

/// Every case but the slow ones that send no request the others do not send as this user
/// (new cases join by themselves), as the user whose only right is readwrite on `fencelock/`;
/// the suite's `forget` evicts through that user's handle too. Left out: the cases that only
/// hold a lease over several TTLs (`HOLD_CASES`, 4 to 15 s each), and the one that uses the
/// unreachable handle, which has no user (`unreachable_store_gives_a_retryable_error`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_as_the_limited_user() {
    let mut left_out = fencelock_conformance::HOLD_CASES.to_vec();
    left_out.push("unreachable_store_gives_a_retryable_error");
    let factory: Arc<dyn StoreFactory> = Arc::new(EtcdFactory { url: limited() });
    fencelock_conformance::expect_cases_except(factory, 4, &left_out).await;
}

#[tokio::test]
async fn the_limited_user_really_is_limited_to_its_prefix() {
    // The same user on a prefix its role does not grant: connecting (a read of the prefix)
    // is refused, naming the prefix and the right.
    let config = EtcdConfig::from_url(&format!("{}?prefix=other%2F", limited())).expect("url");
    let error = EtcdStore::connect(config)
        .await
        .expect_err("connected outside the granted prefix");
    assert_refused(
        &error,
        &[
            "connect on other/",
            "the user needs readwrite on the prefix other/",
        ],
    );
}

#[tokio::test]
async fn a_user_without_the_prefix_is_refused_at_connect() {
    let config = EtcdConfig::from_url(outsider()).expect("url");
    let error = EtcdStore::connect(config)
        .await
        .expect_err("connected without rights on the prefix");
    assert_refused(
        &error,
        &[
            "connect on fencelock/",
            "the user needs readwrite on the prefix fencelock/",
            "etcdctl role grant-permission ROLE --prefix=true readwrite fencelock/",
        ],
    );
}

#[tokio::test]
async fn a_user_without_the_prefix_cannot_read_a_status_or_extend() {
    let key = key("outsider");
    let holder = common::store(&limited(), "").await;
    let lease = holder.try_acquire(&key, TTL).await.expect("acquire");
    // connect_lazy skips the read that would refuse it at once.
    let config = EtcdConfig::from_url(outsider()).expect("url");
    let outsider = EtcdStore::connect_lazy(config).await.expect("lazy connect");
    let dir = format!("{DEFAULT_PREFIX}{key}/");

    let error = outsider
        .status(&key)
        .await
        .expect_err("status without read");
    assert_refused(
        &error,
        &[
            &format!("status on {dir}"),
            "the user needs read on the prefix fencelock/",
        ],
    );
    let error = outsider
        .extend(&lease)
        .await
        .expect_err("extend without read");
    assert_refused(
        &error,
        &[
            &format!("extend on {dir}"),
            "the user needs read on the prefix fencelock/",
        ],
    );
    assert_eq!(
        holder.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn a_read_only_user_is_refused_every_write_naming_readwrite() {
    let key = key("reader");
    let dir = format!("{DEFAULT_PREFIX}{key}/");
    let reader = common::store(reader(), "").await;
    let readwrite = "the user needs readwrite on the prefix fencelock/";

    let error = reader
        .try_acquire(&key, TTL)
        .await
        .expect_err("try_acquire without write");
    assert_refused(&error, &[&format!("try_acquire on {dir}"), readwrite]);
    let error = reader
        .acquire(&key, TTL, Duration::from_secs(1))
        .await
        .expect_err("acquire without write");
    assert_refused(&error, &[&format!("acquire on {dir}"), readwrite]);

    // A lock held by the limited user: the reader sees it, but can neither release nor
    // evict it, and it stays held.
    let holder = common::store(&limited(), "").await;
    let lease = holder.try_acquire(&key, TTL).await.expect("acquire");
    match reader.status(&key).await.expect("status needs read only") {
        KeyStatus::Held { token, .. } => assert_eq!(token, Some(lease.fencing_token())),
        other => panic!("the reader sees {other:?}"),
    }
    reader.extend(&lease).await.expect("extend needs read only");
    let error = reader
        .release(&lease)
        .await
        .expect_err("release without write");
    assert_refused(&error, &[&format!("release on {dir}"), readwrite]);
    let error = reader.evict(&key).await.expect_err("evict without write");
    assert_refused(&error, &[&format!("evict on {dir}"), readwrite]);
    assert!(
        matches!(
            holder.status(&key).await.expect("status"),
            KeyStatus::Held { .. }
        ),
        "the refused release or evict freed the lock"
    );
    assert_eq!(
        holder.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn in_the_etcd_layout_the_right_is_named_on_the_locks_own_name() {
    // `layout=etcd` with the empty prefix: the lock `jobs/{key}` is the directory
    // `jobs/{key}/`, which the limited user's role does not grant.
    let key = format!("jobs/{}", key("layout"));
    let store = common::store(&limited(), "&layout=etcd").await;
    let error = store
        .try_acquire(&key, TTL)
        .await
        .expect_err("acquire outside the granted prefix");
    assert_refused(
        &error,
        &[
            &format!("try_acquire on {key}/"),
            &format!("the user needs readwrite on the prefix {key}/"),
        ],
    );
}

#[tokio::test]
async fn a_handle_keeps_working_after_users_or_roles_change() {
    // Any change to users or roles makes etcd refuse every token issued before it ("revision
    // of auth store is old"), which etcd-client's own refresh does not handle: the store
    // fetches a fresh token and sends the refused request again.
    let key = key("auth-change");
    let store = common::store(&limited(), "").await;
    let lease = store.try_acquire(&key, TTL).await.expect("acquire");
    server()
        .add_user("newcomer", &[("read", "newcomer/")])
        .expect("user newcomer");
    store.extend(&lease).await.expect("extend after the change");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    let again = store.try_acquire(&key, TTL).await.expect("acquire again");
    assert_eq!(
        store.release(&again).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_go_on_when_users_or_roles_change_while_they_watch() {
    // A handle's waits share one watch stream, which keeps the token it was opened with. Once
    // users or roles change, etcd refuses every watch created on that stream ("revision of
    // auth store is old"), while the handle's other requests go on with a fresh token. The store closes the stream at the
    // first refusal: every wait reads again and watches on a new stream. Without that, a wait
    // that started after the change asks for its watch again and again, each time refused,
    // until its predecessor leaves. Its own server, so that its request counts are this
    // test's alone.
    const WAIT: Duration = Duration::from_secs(40);
    const PROMPT: Duration = Duration::from_secs(15);
    const WATCH_REQUESTS: &str = "grpc_server_msg_received_total{grpc_method=\"Watch\",\
        grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}";
    let server = EtcdServer::start_with_auth(DEFAULT_PREFIX).expect("etcd with authentication");
    let url = server.limited_url().expect("the limited user");
    let endpoint = server.endpoint();
    let (first, second) = (key("change-while-waiting-1"), key("change-while-waiting-2"));
    let holder = common::store(&url, "").await;
    let waiting = Arc::new(common::store(&url, "").await);
    let held_first = holder
        .try_acquire(&first, TTL)
        .await
        .expect("hold the first key");
    let held_second = holder
        .try_acquire(&second, TTL)
        .await
        .expect("hold the second key");
    let wait_for = |key: String| {
        let waiting = waiting.clone();
        tokio::spawn(async move { waiting.acquire(&key, TTL, WAIT).await })
    };
    // The first wait opens the handle's watch stream.
    let mut first_wait = wait_for(first.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    server
        .add_user("newcomer", &[("read", "newcomer/")])
        .expect("a new user");
    // The second wait's first watch is asked for on the stream opened before the change.
    let before = common::metric(&endpoint, WATCH_REQUESTS).await;
    let mut second_wait = wait_for(second.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = common::metric(&endpoint, WATCH_REQUESTS).await - before;
    assert!(
        !first_wait.is_finished() && !second_wait.is_finished(),
        "both keys are held, so both wait"
    );
    // Refused once, then a new stream: the two waits' watches (two each) on it, and the
    // cancellations of the first wait's watches on the old one at most.
    assert!(
        asked <= 8.0,
        "{asked} watch requests in 2 s of waiting: a refused watch is asked for again and again"
    );
    assert_eq!(
        holder
            .release(&held_first)
            .await
            .expect("release the first"),
        ReleaseOutcome::Released
    );
    let granted = tokio::time::timeout(PROMPT, &mut first_wait)
        .await
        .expect("the first wait hears of the release, not only at its bound")
        .expect("join")
        .expect("the first wait is granted");
    assert_eq!(
        holder
            .release(&held_second)
            .await
            .expect("release the second"),
        ReleaseOutcome::Released
    );
    let granted_second = tokio::time::timeout(PROMPT, &mut second_wait)
        .await
        .expect("the second wait hears of the release")
        .expect("join")
        .expect("the second wait is granted");
    for lease in [granted, granted_second] {
        assert_eq!(
            waiting.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}
