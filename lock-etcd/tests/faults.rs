//! Faults against real etcd servers, each test with its own: a killed leader, a holder cut off
//! from the cluster (its keep-alives stall), a stopped cluster, an operator's eviction, a
//! dropped waiter, a wait that runs out, the watches a handle's waits leave behind, and a kill
//! right after a grant ahead of the clock.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{metric, store};
use etcd_client::GetOptions;
use fencelock_core::{Error, KeepAlive, LockStore, Mode, ReleaseOutcome};
use fencelock_etcd::{EtcdConfig, EtcdStore};
use test_servers::{closed_ports, EtcdCluster, EtcdServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout, Instant};

/// Everything in the queue directory of `key` under the default prefix.
async fn entries(url: &str, key: &str) -> usize {
    let endpoints: Vec<String> = url
        .trim_start_matches("etcd://")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("a raw client");
    client
        .get(
            format!("fencelock/{key}/"),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count the queue")
        .count() as usize
}

/// A TCP relay between a client and etcd that can be frozen: while frozen it moves no bytes,
/// as if the holder's machine stalled or the network dropped everything.
struct FreezableRelay {
    port: u16,
    frozen: Arc<AtomicBool>,
}

impl FreezableRelay {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let gate = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, gate.clone()));
                tokio::spawn(pump(server_read, client_write, gate.clone()));
            }
        });
        FreezableRelay { port, frozen }
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a freeze are held back until the thaw.
        while frozen.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_keeps_the_lease_or_signals_its_loss() {
    let mut cluster = EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.url();
    let holder = Arc::new(store(&url, "&command_timeout=2").await);
    let other = store(&url, "&command_timeout=2").await;
    let key = "faults:leader";
    let ttl = Duration::from_secs(3);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    // A waiter queued across the election: it keeps its place and gets the key next.
    let waiter = tokio::spawn({
        let waiter = store(&url, "&command_timeout=2").await;
        async move {
            let next = waiter.acquire(key, ttl, Duration::from_secs(60)).await;
            (next, waiter)
        }
    });
    sleep(Duration::from_millis(300)).await;

    let leader = cluster.leader().expect("a leader");
    cluster.kill(leader).expect("kill the leader");
    let killed_at = Instant::now();

    // Three TTLs later: either the lease survived the election (kept alive all along), or the
    // holder was told. Never both "held" in its own view and taken by someone else.
    sleep(ttl * 3).await;
    let bound = Duration::from_secs(30);
    if kept.is_lost() {
        println!(
            "the lease was lost across the election: {:?}",
            kept.lost_reason()
        );
    } else {
        println!(
            "the lease survived the election ({:?} after the kill)",
            killed_at.elapsed()
        );
        assert!(!waiter.is_finished(), "the waiter got a key still held");
        let tried = timeout(bound, other.try_acquire(key, ttl))
            .await
            .expect("try_acquire after the election hung");
        assert!(
            matches!(tried, Err(Error::Busy { .. })),
            "the surviving lease's key was not busy: {tried:?}"
        );
        let lease = kept.stop().await;
        // Requests the balancer sends towards the dead member are refused at connect and sent
        // again: with a minority down, every request still succeeds.
        let mut failures = Vec::new();
        for _ in 0..30 {
            if let Err(error) = holder.extend(&lease).await {
                failures.push(error.to_string());
            }
        }
        assert!(
            failures.is_empty(),
            "extends failed with a member down: {failures:?}"
        );
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    let (next, waiter) = timeout(bound, waiter)
        .await
        .expect("the queued waiter hung after the election")
        .unwrap();
    let next = next.expect("the queued waiter gets the key");
    assert!(next.fencing_token() > lease.fencing_token());
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_is_told_first_and_the_next_holder_gets_a_greater_token() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let relay = FreezableRelay::start(server.endpoint()).await;
    let holder = Arc::new(store(&relay.url(), "&command_timeout=1").await);
    let other = store(&server.url(), "").await;
    let key = "faults:stalled";
    let ttl = Duration::from_secs(2);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    sleep(ttl / 2).await;
    assert!(!kept.is_lost(), "{:?}", kept.lost_reason());

    // The holder's keep-alives stop reaching etcd; it still runs, so it can notice.
    relay.freeze(true);
    let waiter = tokio::spawn(async move {
        let next = other.acquire(key, ttl, ttl * 5).await;
        (next, Instant::now(), other)
    });
    timeout(ttl * 2, kept.lost())
        .await
        .expect("the lost signal fires within the TTL of the stall");
    let lost_at = Instant::now();
    // The signal is due at the local deadline; generous for a loaded machine's scheduling.
    assert!(
        lost_at <= lease.valid_until() + Duration::from_millis(500),
        "the lost signal came {:?} after the local deadline",
        lost_at - lease.valid_until()
    );
    let (next, acquired_at, other) = waiter.await.unwrap();
    let next = next.expect("the next holder gets the key once etcd expires the lease");
    assert!(
        acquired_at > lease.valid_until(),
        "the next holder got the key {:?} before the stalled holder's deadline, when its lost \
         signal is due",
        lease.valid_until() - acquired_at
    );
    assert!(next.fencing_token() > lease.fencing_token());

    // The holder reconnects: its lease is gone and it cannot act on its successor.
    relay.freeze(false);
    let lease = kept.stop().await;
    let extended = timeout(Duration::from_secs(20), async {
        loop {
            match holder.extend(&lease).await {
                Err(error) if error.is_retryable() => sleep(Duration::from_millis(200)).await,
                other => return other,
            }
        }
    })
    .await
    .expect("extend after the thaw hung");
    assert!(
        matches!(extended, Err(Error::LeaseLost { .. })),
        "{extended:?}"
    );
    assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_cluster_gives_a_retryable_error_within_the_timeout() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let command_timeout = Duration::from_secs(1);
    let store = store(&url, "&command_timeout=1").await;
    let key = "faults:stopped";
    let ttl = Duration::from_secs(30);
    let lease = store.try_acquire(key, ttl).await.unwrap();
    // Released and evicted while the cluster is stopped: those requests may still be carried
    // out when it resumes, so they act on a lease of their own, not on the one checked after.
    let spare_key = "faults:spare";
    let spare = store.try_acquire(spare_key, ttl).await.unwrap();

    server.pause().expect("SIGSTOP etcd");
    // Generous: the bound is the timeout, plus scheduling on a loaded machine.
    let bound = command_timeout * 2 + Duration::from_secs(2);
    macro_rules! unavailable_in_time {
        ($what:expr, $op:expr) => {{
            let started = Instant::now();
            let result = timeout(bound * 2, $op)
                .await
                .unwrap_or_else(|_| panic!("{} hung on a stopped cluster", $what));
            let elapsed = started.elapsed();
            match result {
                Err(error) => assert!(
                    error.is_retryable(),
                    "{}: a non-retryable error: {error}",
                    $what
                ),
                Ok(value) => panic!("{}: succeeded on a stopped cluster: {value:?}", $what),
            }
            assert!(elapsed <= bound, "{} took {elapsed:?}", $what);
        }};
    }
    unavailable_in_time!("try_acquire", store.try_acquire("faults:other", ttl));
    unavailable_in_time!(
        "acquire",
        store.acquire("faults:other", ttl, Duration::from_secs(5))
    );
    unavailable_in_time!("extend", store.extend(&lease));
    unavailable_in_time!("release", store.release(&spare));
    unavailable_in_time!("status", store.status(key));
    unavailable_in_time!("evict", store.evict(spare_key));
    let config =
        EtcdConfig::from_url(&format!("{url}?connect_timeout=1&command_timeout=1")).unwrap();
    unavailable_in_time!("connect", EtcdStore::connect(config));

    // Back: the lease (30 s) is still there and still ours.
    server.resume().expect("SIGCONT etcd");
    let extended = timeout(Duration::from_secs(20), async {
        loop {
            match store.extend(&lease).await {
                Err(error) if error.is_retryable() => sleep(Duration::from_millis(200)).await,
                other => return other,
            }
        }
    })
    .await
    .expect("extend after the resume hung");
    extended.expect("the lease survived the stop");
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_one_lock_loses_only_that_lock() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let holder = Arc::new(store(&url, "").await);
    let operator = store(&url, "").await;
    let ttl = Duration::from_secs(2);
    let evicted = holder.try_acquire("faults:evicted", ttl).await.unwrap();
    let kept = holder.try_acquire("faults:kept", ttl).await.unwrap();
    let evicted = KeepAlive::start(holder.clone(), evicted);
    let kept = KeepAlive::start(holder.clone(), kept);

    assert!(operator.evict("faults:evicted").await.unwrap());
    assert!(
        !operator.evict("faults:nobody").await.unwrap(),
        "evicting a free key deleted something"
    );
    timeout(ttl * 2, evicted.lost())
        .await
        .expect("the evicted lock's lost signal fires");
    let next = operator
        .try_acquire("faults:evicted", ttl)
        .await
        .expect("an evicted key is free at once");
    assert!(next.fencing_token() > evicted.lease().fencing_token());
    assert_eq!(
        operator.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );

    // The other lock of the same handle and TTL is untouched, over two TTLs.
    sleep(ttl * 2).await;
    assert!(!kept.is_lost(), "{:?}", kept.lost_reason());
    assert!(matches!(
        operator.try_acquire("faults:kept", ttl).await,
        Err(Error::Busy { .. })
    ));
    let kept = kept.stop().await;
    assert_eq!(
        holder.release(&kept).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_leaves_no_queue_entry_behind() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let key = "faults:dropped";
    let ttl = Duration::from_secs(30);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire(key, ttl, ttl).await.map(drop) });
    sleep(Duration::from_millis(500)).await;
    assert_eq!(entries(&url, key).await, 2, "the waiter is queued");
    waiting.abort();
    let _ = waiting.await;

    // The spawned revoke deletes the entry long before its 30 s lease would expire.
    let started = Instant::now();
    while entries(&url, key).await != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the dropped waiter's entry is still queued"
        );
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(entries(&url, key).await, 0);
}

/// A wait that runs out takes its entry out of the queue before it returns `WaitTimedOut`, in
/// every mode: the next request, on any handle, finds only the holder's entry in front of it
/// (the conformance case `a_writer_is_refused_next_to_a_reader_of_its_own_handle` saw a writer
/// refused, right after the reader it had waited on was released, by the entry of its own
/// handle's timed-out wait, whose revoke was left to a spawned task). The runtime has one
/// thread, so a revoke left to a spawned task would go out together with the read of the
/// queue, never before it.
#[tokio::test(flavor = "current_thread")]
async fn a_wait_that_runs_out_leaves_no_queue_entry_behind() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("a raw client");
    let key = "faults:ran-out";
    let queue = format!("fencelock/{key}/");
    let count = GetOptions::new().with_prefix().with_count_only();
    let ttl = Duration::from_secs(30);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    for mode in [Mode::Exclusive, Mode::Shared, Mode::permits(2)] {
        match waiter
            .acquire_as(key, ttl, Duration::from_millis(200), mode)
            .await
        {
            Err(Error::WaitTimedOut { .. }) => {}
            other => panic!("{mode}: a wait behind a writer: expected WaitTimedOut, got {other:?}"),
        }
        let queued = raw
            .get(queue.as_str(), Some(count.clone()))
            .await
            .expect("count the queue")
            .count();
        assert_eq!(
            queued, 1,
            "{mode}: a wait that ran out left its entry in the queue"
        );
    }
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Waits until the gauge `name` reads `value`.
async fn gauge_reaches(endpoint: &str, name: &str, value: f64, what: &str) {
    let started = Instant::now();
    loop {
        let now = metric(endpoint, name).await;
        if now == value {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: {name} is {now}, not {value}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_on_one_handle_share_one_watch_stream_and_leave_no_watch_behind() {
    const WATCHERS: &str = "etcd_debugging_mvcc_watcher_total";
    const STREAMS: &str = "etcd_debugging_mvcc_watch_stream_total";
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let (url, endpoint) = (server.url(), server.endpoint());
    let holder = store(&url, "").await;
    let waiter = store(&url, "").await;
    let ttl = Duration::from_secs(30);
    let held = [
        holder.try_acquire("watches:a", ttl).await.unwrap(),
        holder.try_acquire("watches:b", ttl).await.unwrap(),
    ];
    // Six waits on two keys from one handle (and its clones), each queued before the next:
    // each watches its predecessor and its own entry.
    let mut waits = Vec::new();
    for (i, key) in ["watches:a", "watches:b"]
        .iter()
        .cycle()
        .take(6)
        .enumerate()
    {
        let waiter = waiter.clone();
        waits.push(tokio::spawn(
            async move { waiter.acquire(key, ttl, ttl).await },
        ));
        let watches = 2.0 * (i + 1) as f64;
        gauge_reaches(&endpoint, WATCHERS, watches, "a wait's watches").await;
        assert_eq!(
            metric(&endpoint, STREAMS).await,
            1.0,
            "one stream for every wait"
        );
    }

    // A dropped wait cancels its two watches, and only those.
    waits.remove(2).abort();
    gauge_reaches(&endpoint, WATCHERS, 10.0, "the dropped wait's watches").await;

    // Each grant cancels the watches of the wait it ends; none is left once all are granted.
    for lease in &held {
        assert_eq!(
            holder.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    for wait in waits {
        let lease = timeout(ttl, wait).await.expect("granted").unwrap().unwrap();
        assert_eq!(
            waiter.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    gauge_reaches(&endpoint, WATCHERS, 0.0, "after every grant").await;
    assert_eq!(
        metric(&endpoint, STREAMS).await,
        1.0,
        "the stream stays open for the next wait"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_lease_revoked_behind_our_back_is_replaced() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let store = store(&url, "").await;
    let ttl = Duration::from_secs(30);
    // A released lock's lease stays with the handle for the next acquire with this TTL.
    let first = store.try_acquire("faults:idle", ttl).await.unwrap();
    assert_eq!(
        store.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );

    // Someone revokes every lease on the server, the idle one included.
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    sleep(Duration::from_millis(300)).await;
    let leases = raw.leases().await.unwrap();
    assert_eq!(
        leases.leases().len(),
        1,
        "the released lock's lease was not kept for reuse"
    );
    for lease in leases.leases() {
        raw.lease_revoke(lease.id()).await.unwrap();
    }

    // The next acquire finds the idle lease gone and grants a fresh one.
    let second = store.try_acquire("faults:idle", ttl).await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        store.try_acquire("faults:idle", ttl).await,
        Err(Error::Busy { .. })
    ));
    store
        .extend(&second)
        .await
        .expect("the fresh lease is alive");
    assert_eq!(
        store.release(&second).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_release_and_extend_never_touch_a_reused_lease() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let holder = store(&url, "").await;
    let other = store(&url, "").await;
    let ttl = Duration::from_secs(30);
    let first = holder.try_acquire("faults:reuse:a", ttl).await.unwrap();
    assert_eq!(
        holder.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    // The next lock of this handle with this TTL reuses the released lock's etcd lease.
    let second = holder.try_acquire("faults:reuse:b", ttl).await.unwrap();

    // The first lease, released, is used again by mistake: nothing reaches the shared lease.
    assert_eq!(holder.release(&first).await.unwrap(), ReleaseOutcome::Lost);
    assert!(matches!(
        holder.extend(&first).await,
        Err(Error::LeaseLost { .. })
    ));
    sleep(Duration::from_millis(300)).await;
    holder
        .extend(&second)
        .await
        .expect("the second lock is alive");
    assert!(matches!(
        other.try_acquire("faults:reuse:b", ttl).await,
        Err(Error::Busy { .. })
    ));
    assert_eq!(
        holder.release(&second).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_nothing_is_unavailable_within_the_connect_timeout() {
    let config = EtcdConfig::from_url(&format!(
        "etcd://127.0.0.1:{}?connect_timeout=1&command_timeout=5",
        closed_ports(1)[0]
    ))
    .unwrap();
    let started = Instant::now();
    let result = timeout(Duration::from_secs(10), EtcdStore::connect(config))
        .await
        .expect("connect hung");
    let elapsed = started.elapsed();
    match result {
        Err(error) => assert!(error.is_retryable(), "not retryable: {error}"),
        Ok(store) => panic!("connected to nothing: {store:?}"),
    }
    assert!(
        elapsed < Duration::from_secs(5),
        "connect took {elapsed:?} with a 1 s connect timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_key_across_a_compaction() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let holder = store(&url, "").await;
    let key = "faults:compacted";
    let ttl = Duration::from_secs(30);
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let waiter = store(&url, "").await;
        waiters.push(tokio::spawn(async move {
            let next = waiter.acquire(key, ttl, Duration::from_secs(30)).await?;
            let token = next.fencing_token();
            waiter.release(&next).await.map(|outcome| (token, outcome))
        }));
        sleep(Duration::from_millis(100)).await;
    }

    // Churn, then compact away every revision the waiters read the queue at.
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    for i in 0..20 {
        raw.put(format!("faults/churn/{i}"), "x", None)
            .await
            .unwrap();
    }
    let revision = raw
        .put("faults/churn/last", "x", None)
        .await
        .unwrap()
        .header()
        .expect("a header")
        .revision();
    raw.compact(
        revision,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();

    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let mut last = lease.fencing_token();
    for waiter in waiters {
        let (token, outcome) = timeout(Duration::from_secs(20), waiter)
            .await
            .expect("a waiter hung after the compaction")
            .unwrap()
            .expect("a waiter failed after the compaction");
        assert_eq!(outcome, ReleaseOutcome::Released);
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_the_url_authenticate() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let endpoint = server.endpoint();
    let mut raw = etcd_client::Client::connect([endpoint.clone()], None)
        .await
        .unwrap();
    raw.user_add("root", "s3cr@t", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.auth_enable().await.unwrap();

    let url = format!("etcd://root:s3cr%40t@{endpoint}");
    let holder = Arc::new(store(&url, "").await);
    let lease = holder
        .try_acquire("faults:auth", Duration::from_secs(2))
        .await
        .unwrap();
    // The keep-alive stream carries the token too: the lease outlives its TTL.
    let kept = KeepAlive::start(holder.clone(), lease);
    sleep(Duration::from_secs(5)).await;
    assert!(!kept.is_lost(), "{:?}", kept.lost_reason());
    let lease = kept.stop().await;
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );

    let wrong =
        EtcdConfig::from_url(&format!("etcd://root:n0t-1t@{endpoint}?connect_timeout=10")).unwrap();
    match EtcdStore::connect(wrong).await {
        Err(error) => {
            assert!(
                !error.is_retryable(),
                "a wrong password is retryable: {error}"
            );
            assert!(!error.to_string().contains("n0t-1t"), "{error}");
        }
        Ok(store) => panic!("a wrong password connected: {store:?}"),
    }
}

/// The server killed with `SIGKILL` right after a grant whose token is ahead of the clock (the
/// prefix's token offset set a year ahead by hand, as a swap from a store that was ahead leaves
/// it): etcd acknowledged that grant's write only once it was in its synced log, so the next
/// token after the restart is above it, not a clock reading below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_ahead_of_the_clock_survives_a_kill() {
    let mut server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let ttl = Duration::from_secs(30);
    let key = "faults:ahead";
    let holder = store(&url, "").await;
    let first = holder.try_acquire(key, ttl).await.unwrap();
    assert_eq!(
        holder.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    // A year ahead of the tokens so far (which follow the clock in µs).
    let ahead = first.fencing_token() + 365 * 24 * 3600 * 1_000_000;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("a raw client");
    let offset = format!("{}~offset", fencelock_etcd::DEFAULT_PREFIX);
    raw.put(offset, format!("{ahead:019}"), None)
        .await
        .expect("set the token offset ahead by hand");
    let lease = holder.try_acquire(key, ttl).await.unwrap();
    let granted = lease.fencing_token();
    assert!(granted > ahead, "{granted} after the offset {ahead}");
    drop((holder, raw));

    tokio::task::block_in_place(|| server.restart()).expect("kill and restart etcd");
    let store = store(&url, "").await;
    // The killed holder's lease outlives the restart: another key shows the next token.
    let next = store.try_acquire("faults:ahead:next", ttl).await.unwrap();
    assert!(
        next.fencing_token() > granted,
        "{} after {granted}, handed out before the kill",
        next.fencing_token()
    );
}
