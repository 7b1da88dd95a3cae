//! The scale row: many leases held at once from one handle, each kept alive, with the sessions
//! and connections they take and what they cost the client in memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_bench::Samples;
use fencelock_core::{Error, KeepAlive, LockStore, ReleaseOutcome, Result};
use fencelock_zookeeper::{ZookeeperConfig, ZookeeperStore};
use tokio::time::Instant;

pub(crate) use fencelock_bench::{connections_to, live_bytes, rss_bytes, CountingAllocator};

/// What [`hold`] saw.
pub(crate) struct Held {
    pub count: usize,
    pub lost: usize,
    /// Releases that found their lease already gone, after the hold.
    pub gone_at_release: usize,
    pub acquired_in: Duration,
    /// Bytes allocated and not freed, and resident set growth, per lease (the lease, its
    /// keep-alive and deadline tasks, and whatever the handle keeps for it).
    pub heap_per_lease: f64,
    pub rss_per_lease: f64,
    /// The handle's sessions (their negotiated timeouts) while the leases were held.
    pub sessions: Vec<Duration>,
    /// Client TCP connections to the servers: before the handle existed, and the least and
    /// most while the leases were held.
    pub connections_before: Option<usize>,
    pub connections: Option<(usize, usize)>,
    /// One more lease's extend, repeated while the others are kept alive.
    pub extends: Samples,
    /// Those extends that failed in a way the keep-alive retries.
    pub extends_failed: usize,
}

/// Acquires `count` leases (`{prefix}{i}`, `in_flight` at a time) with `ttl` on a handle of
/// its own, each kept alive by a [`KeepAlive`], holds them for three TTLs while sampling the
/// client's connections to `ports` (and extending one more lease of the same TTL), counts
/// those lost, and releases them.
pub(crate) async fn hold(
    config: &ZookeeperConfig,
    prefix: &str,
    count: usize,
    ttl: Duration,
    in_flight: usize,
    ports: &[u16],
) -> Result<Held> {
    // Connections that earlier parts of the run dropped close asynchronously.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let connections_before = connections_to(ports);
    let store = Arc::new(ZookeeperStore::connect(config.clone()).await?);
    // Warm up: the lease's session exists before the baseline.
    let warm = store.try_acquire(&format!("{prefix}warm"), ttl).await?;
    let warm_kept = KeepAlive::start(store.clone(), warm);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (heap_before, rss_before) = (live_bytes(), rss_bytes());

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let kept = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let mut takers = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (store, next, kept, prefix) =
            (store.clone(), next.clone(), kept.clone(), prefix.to_owned());
        takers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, Error>(());
                }
                let lease = store.try_acquire(&format!("{prefix}{i}"), ttl).await?;
                let keep = KeepAlive::start(store.clone(), lease);
                kept.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(keep);
            }
        });
    }
    while let Some(taken) = takers.join_next().await {
        taken.map_err(|e| Error::store("a taking task failed", e))??;
    }
    let kept: Vec<KeepAlive> =
        std::mem::take(&mut *kept.lock().unwrap_or_else(PoisonError::into_inner));
    let acquired_in = started.elapsed();
    let (heap_after, rss_after) = (live_bytes(), rss_bytes());

    // Three TTLs: sample the connections every half second, and extend one more lease.
    let probe = store.try_acquire(&format!("{prefix}probe"), ttl).await?;
    let mut connections: Option<(usize, usize)> = None;
    let (mut extends, mut extends_failed) = (Vec::new(), 0);
    let until = Instant::now() + ttl * 3;
    let mut next_sample = Instant::now();
    while Instant::now() < until {
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(500);
            if let Some(c) = connections_to(ports) {
                connections = Some(connections.map_or((c, c), |(lo, hi)| (lo.min(c), hi.max(c))));
            }
        }
        let sent = Instant::now();
        match store.extend(&probe).await {
            Ok(()) => extends.push(sent.elapsed()),
            // Counted, not fatal: a keep-alive retries these too.
            Err(error) if error.is_retryable() => extends_failed += 1,
            Err(error) => return Err(error),
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let lost = kept.iter().filter(|k| k.is_lost()).count();
    let sessions = store.session_timeouts().await;
    let _ = store.release(&probe).await?;

    let mut leases = Vec::with_capacity(kept.len());
    for kept in kept {
        leases.push(kept.stop().await);
    }
    let leases = Arc::new(Mutex::new(leases));
    let gone = Arc::new(AtomicUsize::new(0));
    let mut releasers = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (store, leases, gone) = (store.clone(), leases.clone(), gone.clone());
        releasers.spawn(async move {
            loop {
                let next = leases.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let Some(lease) = next else {
                    return Ok::<_, Error>(());
                };
                if store.release(&lease).await? == ReleaseOutcome::Lost {
                    gone.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(released) = releasers.join_next().await {
        released.map_err(|e| Error::store("a releasing task failed", e))??;
    }
    let _ = store.release(&warm_kept.stop().await).await?;

    let per = |before: f64, after: f64| (after - before) / count.max(1) as f64;
    Ok(Held {
        count,
        lost,
        gone_at_release: gone.load(Ordering::Relaxed),
        acquired_in,
        heap_per_lease: per(heap_before as f64, heap_after as f64),
        rss_per_lease: per(rss_before as f64, rss_after as f64),
        sessions,
        connections_before,
        connections,
        extends: Samples::new(extends),
        extends_failed,
    })
}
