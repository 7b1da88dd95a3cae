//! Clock-floored tokens in the default layout (token = the prefix's offset + the entry's create
//! revision): the first token on a prefix is at least the client's clock in µs, tokens grow
//! across grants in every mode and across idle periods (the offset is raised), `layout=etcd`
//! keeps raw revisions, and a queue used by a client that mints raw revisions (an older build,
//! etcd's own clients) or an offset of another scheme is refused. Against test-servers' shared
//! single-member etcd.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, GetOptions, PutOptions};
use fencelock_core::{Error, KeyStatus, LockStore, Mode, OwnerId, ReleaseOutcome};
use fencelock_etcd::EtcdStore;
use test_servers::shared;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(30);
/// etcd's granule: a grant's token is at least the clock read before it, less this.
const GRANULE_MICROS: u64 = 100_000;
/// Generous: other test processes may load this machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as u64
}

fn fresh_prefix(name: &str) -> String {
    format!("floor-{name}-{}/", OwnerId::random())
}

async fn handle(prefix: &str, options: &str) -> EtcdStore {
    common::store(&shared::etcd().url(), &format!("&prefix={prefix}{options}")).await
}

async fn raw() -> Client {
    Client::connect([shared::etcd().endpoint()], None)
        .await
        .expect("a raw client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_token_on_a_fresh_prefix_is_at_least_the_clock() {
    let store = handle(&fresh_prefix("first"), "").await;
    let before = clock_micros();
    let lease = store.try_acquire("k", TTL).await.expect("a free key");
    let after = clock_micros();
    let token = lease.fencing_token();
    assert!(token >= before, "token {token} below the clock {before} µs");
    // The lead over the clock is the revisions written since the raise's hint: a few here.
    assert!(
        token < after + 1_000_000,
        "token {token} far ahead of {after} µs"
    );
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_across_grants_in_every_mode_and_after_idle_periods() {
    let prefix = fresh_prefix("grow");
    let store = handle(&prefix, "").await;
    let mut last = 0;
    let modes = [
        Mode::Exclusive,
        Mode::Shared,
        Mode::permits(2),
        Mode::Exclusive,
        Mode::Shared,
    ];
    for (i, mode) in modes.into_iter().enumerate() {
        if i % 2 == 1 {
            // Idle for two granules: the clock has left the offset behind, and the next grant
            // raises it.
            sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
        }
        let clock = clock_micros();
        let lease = store
            .try_acquire_as("k", TTL, mode)
            .await
            .expect("a free key");
        let token = lease.fencing_token();
        assert!(token > last, "{mode}: token {token} after {last}");
        assert!(
            token + GRANULE_MICROS >= clock,
            "{mode}: token {token} more than a granule behind the clock {clock} µs"
        );
        let reported = match store.status("k").await.expect("status") {
            KeyStatus::Held { token, .. } => token,
            KeyStatus::Shared { holders, .. } => holders[0].token,
            other => panic!("{mode}: held, but status says {other:?}"),
        };
        assert_eq!(reported, Some(token), "{mode}: status names the token");
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        last = token;
    }

    // A grant after a wait (a handoff or a read), idle for a while behind the holder, and a
    // new handle (no revision seen yet: it reads one before raising).
    let holder = store.try_acquire("k", TTL).await.expect("a free key");
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { store.acquire("k", TTL, PATIENCE).await }
    });
    sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
    assert_eq!(
        store.release(&holder).await.expect("release"),
        ReleaseOutcome::Released
    );
    let waited = waiter.await.expect("the waiter").expect("granted");
    assert!(holder.fencing_token() > last);
    assert!(waited.fencing_token() > holder.fencing_token());
    assert_eq!(
        store.release(&waited).await.expect("release"),
        ReleaseOutcome::Released
    );
    sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
    let other = handle(&prefix, "").await;
    let clock = clock_micros();
    let lease = other.try_acquire("k", TTL).await.expect("a free key");
    assert!(lease.fencing_token() > waited.fencing_token());
    assert!(lease.fencing_token() + GRANULE_MICROS >= clock);
    assert_eq!(
        other.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_etcd_tokens_stay_raw_revisions() {
    let prefix = fresh_prefix("raw");
    let store = handle(&prefix, "&layout=etcd").await;
    let lease = store.try_acquire("k", TTL).await.expect("a free key");
    let mut client = raw().await;
    let now = client
        .get(prefix.as_str(), Some(GetOptions::new().with_count_only()))
        .await
        .expect("read the revision")
        .header()
        .expect("a header")
        .revision();
    // ETCD_LOCK_REV: the revision of the reply that granted the lock, not above the current one.
    assert!(
        lease.fencing_token() <= now as u64,
        "{} > {now}",
        lease.fencing_token()
    );
    let offset = client
        .get(
            format!("{prefix}~offset"),
            Some(GetOptions::new().with_count_only()),
        )
        .await
        .expect("count")
        .count();
    assert_eq!(offset, 0, "layout=etcd wrote a token offset");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// What an older build (or `etcdctl lock` on the same names) puts: an entry with the empty
/// value on a lease of its own. The new build refuses to queue next to it; once it is gone,
/// the prefix switches over, and the first token jumps above every revision, to the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_a_raw_revision_client_uses_is_refused_until_it_leaves() {
    let prefix = fresh_prefix("older");
    let store = handle(&prefix, "").await;
    let mut client = raw().await;
    let lease = client.lease_grant(30, None).await.expect("a lease").id();
    let entry = format!("{prefix}k/{}", OwnerId::random());
    let put = client
        .put(
            entry.as_str(),
            "",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("the older build's entry");
    let older_token = put.header().expect("a header").revision() as u64;

    match store.acquire("k", TTL, Duration::from_secs(1)).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("older fencelock build"), "{message}")
        }
        other => panic!("next to an older build's entry: {other:?}"),
    }
    // Our own entry is gone with its lease: only the older one is queued.
    let until = Instant::now() + PATIENCE;
    loop {
        let queued = client
            .get(
                format!("{prefix}k/"),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("count")
            .count();
        if queued == 1 {
            break;
        }
        assert!(Instant::now() < until, "{queued} entries stay queued");
        sleep(Duration::from_millis(20)).await;
    }

    client
        .lease_revoke(lease)
        .await
        .expect("the older build leaves");
    let clock = clock_micros();
    let lease = store.try_acquire("k", TTL).await.expect("a free key");
    assert!(lease.fencing_token() > older_token);
    // The refused enqueue raised the offset already (a raise only lifts): within a granule.
    assert!(lease.fencing_token() + GRANULE_MICROS >= clock);
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_of_another_scheme_is_refused() {
    let prefix = fresh_prefix("scheme");
    let mut client = raw().await;
    client
        .put(format!("{prefix}~offset"), "v3 1795755901367913", None)
        .await
        .expect("a later scheme's offset");
    let store = handle(&prefix, "").await;
    match store.try_acquire("k", TTL).await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("does not read"), "{message}")
        }
        other => panic!("next to another scheme's offset: {other:?}"),
    }
    let kept = client
        .get(format!("{prefix}~offset"), None)
        .await
        .expect("read the offset");
    assert_eq!(kept.kvs()[0].value(), b"v3 1795755901367913", "overwritten");
}

/// A holder's token stays what its grant said after another key's grant raised the offset:
/// `status` reads the offset as of the holder's entry's creation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_a_holders_token_after_the_offset_was_raised() {
    let store = handle(&fresh_prefix("status"), "").await;
    let held = store.try_acquire("held", TTL).await.expect("a free key");
    sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
    let later = store.try_acquire("later", TTL).await.expect("a free key");
    assert!(
        later.fencing_token() - held.fencing_token() > GRANULE_MICROS,
        "the offset was not raised between the two grants"
    );
    match store.status("held").await.expect("status") {
        KeyStatus::Held { token, .. } => assert_eq!(token, Some(held.fencing_token())),
        other => panic!("held, but status says {other:?}"),
    }
    assert_eq!(
        store.release(&held).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        store.release(&later).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Prefixes that nest: `{p}billing/~offset`, the inner prefix's token offset (on no lease, and
/// older than any later entry), sits in the queue of the outer prefix's lock `billing`, and
/// would head it forever. Acquires there fail with `Error::Store` within their wait, in every
/// mode and in `layout=etcd` (whose lock `{p}billing` is the same directory), and evict leaves
/// the offset alone (deleting it would let a later raise recreate it lower).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_prefixs_offset_in_a_queue_is_refused_not_waited_for_or_evicted() {
    let outer_prefix = fresh_prefix("nest");
    let inner = handle(&format!("{outer_prefix}billing/"), "").await;
    let lease = inner.try_acquire("k", TTL).await.expect("a free key");
    assert_eq!(
        inner.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    let offset_key = format!("{outer_prefix}billing/~offset");
    let mut client = raw().await;
    let offset_before = client.get(offset_key.as_str(), None).await.expect("read");
    assert_eq!(
        offset_before.kvs().len(),
        1,
        "the inner prefix has an offset"
    );

    let outer = handle(&outer_prefix, "").await;
    let etcd_layout = common::store(&shared::etcd().url(), "&layout=etcd&prefix=").await;
    let wait = Duration::from_secs(2);
    let etcd_key = format!("{outer_prefix}billing");
    for (store, key, mode) in [
        (&outer, "billing", Mode::Exclusive),
        (&outer, "billing", Mode::Shared),
        (&outer, "billing", Mode::permits(2)),
        (&etcd_layout, etcd_key.as_str(), Mode::Exclusive),
    ] {
        let started = Instant::now();
        match store.acquire_as(key, TTL, wait, mode).await {
            Err(Error::Store { message, .. }) => {
                assert!(message.contains("no etcd lease"), "{mode}: {message}");
                assert!(message.contains(&offset_key), "{mode}: {message}");
            }
            other => panic!("{key} {mode} behind a nested prefix's offset: {other:?}"),
        }
        assert!(
            started.elapsed() < wait,
            "{key} {mode}: refused only after the wait"
        );
    }
    match outer.status("billing").await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("no etcd lease"), "{message}")
        }
        other => panic!("status behind a nested prefix's offset: {other:?}"),
    }
    match outer.evict("billing").await {
        Err(Error::Store { message, .. }) => {
            assert!(message.contains("no etcd lease"), "{message}")
        }
        other => panic!("evict of a nested prefix's offset: {other:?}"),
    }
    let offset_after = client.get(offset_key.as_str(), None).await.expect("read");
    assert_eq!(
        offset_after
            .kvs()
            .first()
            .map(|kv| (kv.value(), kv.create_revision())),
        offset_before
            .kvs()
            .first()
            .map(|kv| (kv.value(), kv.create_revision())),
        "evict touched the offset"
    );
    // The inner prefix still mints above its earlier token.
    let again = inner.try_acquire("k", TTL).await.expect("a free key");
    assert!(again.fencing_token() > lease.fencing_token());
    assert_eq!(
        inner.release(&again).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// `status` reads the offset as acquire does: one of another scheme (here written while a lock
/// is held) is an `Error::Store`, not a holder without a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_refuses_an_offset_of_another_scheme() {
    let prefix = fresh_prefix("status-scheme");
    let store = handle(&prefix, "").await;
    let held = store.try_acquire("k", TTL).await.expect("a free key");
    let shared = store
        .try_acquire_as("s", TTL, Mode::Shared)
        .await
        .expect("a free key");
    let mut client = raw().await;
    client
        .put(format!("{prefix}~offset"), "v3 1795755901367913", None)
        .await
        .expect("a later scheme's offset");
    for key in ["k", "s"] {
        match store.status(key).await {
            Err(Error::Store { message, .. }) => {
                assert!(message.contains("does not read"), "{key}: {message}")
            }
            other => panic!("{key}: status over another scheme's offset: {other:?}"),
        }
    }
    assert_eq!(
        store.release(&held).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        store.release(&shared).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Readers granted across raises of the offset: `status` names each one's token (the offset
/// as of each entry's creation, one history read per raise between them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_each_readers_token_across_raises() {
    let store = handle(&fresh_prefix("status-readers"), "").await;
    let mut readers = Vec::new();
    for i in 0..3 {
        if i > 0 {
            // Past a granule, another key's grant raises the offset.
            sleep(Duration::from_micros(2 * GRANULE_MICROS)).await;
            let other = store.try_acquire("other", TTL).await.expect("a free key");
            assert_eq!(
                store.release(&other).await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        readers.push(
            store
                .try_acquire_as("s", TTL, Mode::Shared)
                .await
                .expect("a shared key"),
        );
    }
    let tokens: Vec<u64> = readers.iter().map(|lease| lease.fencing_token()).collect();
    assert!(
        tokens.windows(2).all(|w| w[1] - w[0] > GRANULE_MICROS),
        "the offset was not raised between the readers: {tokens:?}"
    );
    match store.status("s").await.expect("status") {
        KeyStatus::Shared { holders, .. } => {
            let reported: Vec<Option<u64>> = holders.iter().map(|holder| holder.token).collect();
            let expected: Vec<Option<u64>> = tokens.iter().copied().map(Some).collect();
            assert_eq!(reported, expected);
        }
        other => panic!("three readers, but status says {other:?}"),
    }
    for lease in &readers {
        assert_eq!(
            store.release(lease).await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}
