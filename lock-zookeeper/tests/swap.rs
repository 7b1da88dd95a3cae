//! Clock-floored tokens in the default layout (token = the prefix's token offset in force at
//! the lock node's czxid + that czxid), as `docs/swaps.md` asks of every store: the first token
//! on a fresh prefix is above the clock, tokens grow across grants, idle granules and handles
//! and stay within a granule of the clock, `status` names them, `layout=curator` and
//! `layout=kazoo` keep the raw czxid, and an offset node of another scheme is refused. Against
//! test-servers' shared standalone ZooKeeper.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock_core::{Error, KeyStatus, LockStore, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::ZookeeperEnsemble;
use tokio::time::sleep;

/// The longest TTL the test server allows (its `maxSessionTimeout`).
const TTL: Duration = test_servers::zookeeper::MAX_SESSION_TIMEOUT;
/// ZooKeeper's granule: a grant's token is above the clock read before it, less this.
const GRANULE_MICROS: u64 = 100_000;

fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as u64
}

fn url() -> String {
    ZookeeperEnsemble::shared_standalone().url()
}

async fn handle(prefix: &str, options: &str) -> ZookeeperStore {
    common::store(&url(), &format!("&prefix={prefix}{options}")).await
}

async fn status_token(store: &ZookeeperStore, key: &str) -> Option<u64> {
    match store.status(key).await.expect("status") {
        KeyStatus::Held { token, .. } => token,
        other => panic!("held, but status says {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_token_on_a_fresh_prefix_is_above_the_clock() {
    let store = handle(&common::fresh_prefix("floor-first"), "").await;
    let before = clock_micros();
    let lease = store.try_acquire("k", TTL).await.expect("a free key");
    let after = clock_micros();
    let token = lease.fencing_token();
    assert!(token > before, "token {token} below the clock {before} µs");
    // The lead over the clock is the writes committed since the raise's hint: a few here.
    assert!(
        token < after + 1_000_000,
        "token {token} far ahead of {after} µs"
    );
    assert_eq!(status_token(&store, "k").await, Some(token));
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_across_grants_idle_granules_and_handles() {
    let prefix = common::fresh_prefix("floor-grow");
    let store = handle(&prefix, "").await;
    let other = handle(&prefix, "").await;
    let mut last = 0;
    for i in 0..6 {
        if i % 2 == 1 {
            // Idle for two granules: the clock has left the offset behind.
            sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
        }
        // Alternate handles (and keys): the other handle's view of the offset is stale.
        let (store, key) = if i % 3 == 2 {
            (&other, "j")
        } else {
            (&store, "k")
        };
        let clock = clock_micros();
        let lease = store.try_acquire(key, TTL).await.expect("a free key");
        let token = lease.fencing_token();
        assert!(token > last, "grant {i}: token {token} after {last}");
        assert!(
            token + GRANULE_MICROS > clock,
            "grant {i}: token {token} a granule behind the clock {clock} µs"
        );
        assert_eq!(status_token(store, key).await, Some(token), "grant {i}");
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        last = token;
    }

    // A grant after a wait, the offset raised meanwhile by another key's grant: status still
    // names the waiter's token (the offset node keeps the earlier offsets).
    let holder = store.try_acquire("k", TTL).await.expect("a free key");
    let waiter = tokio::spawn({
        let store = handle(&prefix, "").await;
        async move {
            let lease = store.acquire("k", TTL, Duration::from_secs(30)).await;
            (store, lease)
        }
    });
    sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
    let raiser = other.try_acquire("j", TTL).await.expect("a free key");
    assert!(raiser.fencing_token() > holder.fencing_token());
    assert_eq!(
        store.release(&holder).await.expect("release"),
        ReleaseOutcome::Released
    );
    let (waiting, waited) = waiter.await.expect("the waiter");
    let waited = waited.expect("granted");
    assert!(waited.fencing_token() > holder.fencing_token());
    assert_eq!(
        status_token(&store, "k").await,
        Some(waited.fencing_token())
    );
    for (store, lease) in [(&waiting, waited), (&other, raiser)] {
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interop_layouts_keep_the_raw_czxid() {
    let raw = common::raw(&url()).await;
    for layout in ["curator", "kazoo"] {
        let prefix = common::fresh_prefix(&format!("floor-{layout}"));
        let store = handle(&prefix, &format!("&layout={layout}")).await;
        let lease = store.try_acquire("k", TTL).await.expect("a free key");
        let path = store.config().lock_path("k");
        let children = raw.list_children(&path).await.expect("list");
        assert_eq!(children.len(), 1, "{layout}: {children:?}");
        let stat = raw
            .check_stat(&format!("{path}/{}", children[0]))
            .await
            .expect("stat")
            .expect("the lock node");
        assert_eq!(lease.fencing_token(), stat.czxid as u64, "{layout}");
        assert_eq!(status_token(&store, "k").await, Some(stat.czxid as u64));
        // No offset node: these layouts never read or write one.
        assert_eq!(
            raw.check_stat(&format!("{prefix}/~offset"))
                .await
                .expect("stat"),
            None,
            "{layout}"
        );
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_of_another_scheme_is_refused() {
    let prefix = common::fresh_prefix("floor-odd");
    let raw = common::raw(&url()).await;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    raw.mkdir(&prefix, &persistent).await.expect("prefix");
    raw.create(&format!("{prefix}/~offset"), b"v2:9999", &persistent)
        .await
        .expect("offset");
    let store = handle(&prefix, "").await;
    match store.try_acquire("k", TTL).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("token offset"), "{message}")
        }
        other => panic!("expected the offset refused, got {other:?}"),
    }
    // Nothing stays queued.
    sleep(Duration::from_millis(200)).await;
    let container = store.config().lock_path("k");
    let left = raw.list_children(&container).await.unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// Creates of one prefix race for its token offset. Behind a relay that delays each way by
/// [`RACE_DELAY`], a create's next plan is more than a granule past the raise it lost to (its
/// failed answer and the offset's read again are two round trips of at least
/// 2 × `RACE_DELAY` each), so each of its tries needs a raise of its own and loses to any
/// create raising first: of [`RACERS`] creates, each round grants one. Every loss is another
/// create's progress, so none may end the create: all are granted, in up to `RACERS` rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_racing_for_the_token_offset_are_all_granted() {
    use std::sync::Arc;
    use test_servers::FreezableRelay;
    /// More than the tries a create has for other failures (8).
    const RACERS: usize = 12;
    /// Half a granule and more each way: two round trips outlast the granule.
    const RACE_DELAY: Duration = Duration::from_millis(30);
    let server = ZookeeperEnsemble::shared_standalone();
    let relay = FreezableRelay::start(&server.endpoints()[0]).expect("a relay");
    let prefix = format!("/swap-race-{}", fencelock_core::OwnerId::random());
    // Room for every round: `RACERS` rounds of a few round trips each.
    let url = format!("zookeeper://{}", relay.address());
    let options = format!("&prefix={prefix}&command_timeout=60");
    let store = Arc::new(common::store(&url, &options).await);
    relay.set_delay(RACE_DELAY);
    let mut racers = tokio::task::JoinSet::new();
    for i in 0..RACERS {
        let store = store.clone();
        racers.spawn(async move { store.try_acquire(&format!("race-{i}"), TTL).await });
    }
    let mut leases = Vec::new();
    while let Some(granted) = racers.join_next().await {
        leases.push(
            granted
                .expect("a racer")
                .expect("granted, the offset's race lost or won"),
        );
    }
    relay.set_delay(Duration::ZERO);
    for lease in &leases {
        assert_eq!(
            store.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}
