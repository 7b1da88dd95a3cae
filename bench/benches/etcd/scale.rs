//! The scale row: many locks held at once on one handle, each kept alive, with what they cost
//! the client (memory, connections) and how many keep-alive streams the server saw.

use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::Samples;
use fencelock_core::{KeepAlive, LockStore};
use futures_util::{stream, StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

pub(crate) use fencelock_bench::{
    connections_to, cpu_time, live_bytes, rss_bytes, CountingAllocator,
};

/// gRPC streams of `method` the etcd member at `endpoint` (host:port, plain text) has
/// started and finished so far, from its `/metrics`; `None` if it cannot be read.
pub(crate) async fn streams(endpoint: &str, method: &str) -> Option<(u64, u64)> {
    let fetch = async {
        let mut socket = tokio::net::TcpStream::connect(endpoint).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
        socket.write_all(request.as_bytes()).await.ok()?;
        let mut body = String::new();
        socket.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    let body = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()??;
    let count = |metric: &str| -> Option<u64> {
        let label = format!("grpc_method=\"{method}\"");
        body.lines()
            .filter(|l| l.starts_with(metric) && l.contains(&label))
            .map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<Option<f64>>()
            .map(|v| v as u64)
    };
    Some((
        count("grpc_server_started_total")?,
        count("grpc_server_handled_total")?,
    ))
}

/// What [`hold`] saw.
pub(crate) struct Held {
    pub count: usize,
    pub lost: usize,
    pub acquired_in: Duration,
    /// Bytes allocated and not freed, and resident set growth, per held lock (the lease, its
    /// keep-alive task, and whatever the handle keeps for it).
    pub heap_per_lock: f64,
    pub rss_per_lock: f64,
    /// Client TCP connections to etcd: before the handle existed, and the least and most
    /// while the locks were held.
    pub connections_before: Option<usize>,
    pub connections: Option<(u64, u64)>,
    /// Keep-alive streams open on the server (started less finished): before the handle
    /// existed, the least and most while the locks were held, and how many were started from
    /// before the handle existed until the end of the hold.
    pub streams_open_before: Option<u64>,
    pub streams_open: Option<(u64, u64)>,
    pub streams_started: Option<u64>,
    /// Keep-alive streams started on the server while the locks were held (the most started
    /// count sampled less the least): a handle that keeps one stream for every lease starts
    /// none. A stream of an earlier part of the run that closes meanwhile changes the open
    /// count, not this.
    pub streams_started_while_held: Option<u64>,
    pub watch_streams_open: Option<(u64, u64)>,
    /// One more lock's extend, repeated while the others are kept alive.
    pub extends: Samples,
    /// Those extends that failed in a way the keep-alive retries (no answer in time).
    pub extends_failed: usize,
}

/// Acquires `count` locks (`{prefix}{i}`, `in_flight` at a time) with `ttl` on a handle
/// `connect` makes, each kept alive by a [`KeepAlive`], holds them for three TTLs while
/// sampling connections and streams (and extending one more lock), counts those lost, and
/// releases them.
pub(crate) async fn hold<S, F, Fut>(
    connect: F,
    prefix: &str,
    count: usize,
    ttl: Duration,
    in_flight: usize,
    ports: &[u16],
    metrics: Option<&str>,
) -> fencelock_core::Result<Held>
where
    S: LockStore + 'static,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = fencelock_core::Result<S>>,
{
    let keep_alive_streams = || async {
        match metrics {
            Some(endpoint) => streams(endpoint, "LeaseKeepAlive").await,
            None => None,
        }
    };
    let watch_streams = || async {
        match metrics {
            Some(endpoint) => streams(endpoint, "Watch").await,
            None => None,
        }
    };
    // Connections that earlier parts of the run dropped close asynchronously.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let connections_before = connections_to(ports);
    let streams_before = keep_alive_streams().await;
    let store = Arc::new(connect().await?);
    // Warm up: the connection and the keep-alive stream exist before the baseline.
    let warm = store.try_acquire(&format!("{prefix}warm"), ttl).await?;
    let warm_kept = KeepAlive::start(store.clone(), warm);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (heap_before, rss_before) = (live_bytes(), rss_bytes());

    let started = Instant::now();
    let kept: Vec<KeepAlive> = stream::iter(0..count)
        .map(|i| {
            let store = store.clone();
            let key = format!("{prefix}{i}");
            async move {
                let lease = store.try_acquire(&key, ttl).await?;
                Ok::<_, fencelock_core::Error>(KeepAlive::start(store, lease))
            }
        })
        .buffered(in_flight)
        .try_collect()
        .await?;
    let acquired_in = started.elapsed();
    let (heap_after, rss_after) = (live_bytes(), rss_bytes());

    // Three TTLs: sample connections and streams every half second, and extend one more lock.
    let probe = store
        .try_acquire(&format!("{prefix}probe"), Duration::from_secs(30))
        .await?;
    /// The least and the most of the values seen so far.
    type Range = Option<(u64, u64)>;
    let (mut connections, mut open, mut watches): (Range, Range, Range) = (None, None, None);
    let mut started_while_held: Range = None;
    let widen =
        |range: Range, v: u64| Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
    let (mut extends, mut extends_failed) = (Vec::new(), 0);
    let until = Instant::now() + ttl * 3;
    let mut next_sample = Instant::now();
    while Instant::now() < until {
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(500);
            if let Some(c) = connections_to(ports) {
                connections = widen(connections, c as u64);
            }
            if let Some((s, h)) = keep_alive_streams().await {
                open = widen(open, s.saturating_sub(h));
                started_while_held = widen(started_while_held, s);
            }
            if let Some((s, h)) = watch_streams().await {
                watches = widen(watches, s.saturating_sub(h));
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
    let started_after = keep_alive_streams().await.map(|(started, _)| started);
    let _ = store.release(&probe).await?;

    let leases: Vec<_> = stream::iter(kept).then(KeepAlive::stop).collect().await;
    stream::iter(leases)
        .map(|lease| {
            let store = store.clone();
            async move { store.release(&lease).await.map(drop) }
        })
        .buffer_unordered(in_flight)
        .try_collect::<Vec<()>>()
        .await?;
    let _ = store.release(&warm_kept.stop().await).await?;

    let per = |before: f64, after: f64| (after - before) / count.max(1) as f64;
    Ok(Held {
        count,
        lost,
        acquired_in,
        heap_per_lock: per(heap_before as f64, heap_after as f64),
        rss_per_lock: per(rss_before as f64, rss_after as f64),
        connections_before,
        connections,
        streams_open: open,
        streams_open_before: streams_before.map(|(s, h)| s.saturating_sub(h)),
        streams_started: started_after
            .zip(streams_before)
            .map(|(after, (before, _))| after.saturating_sub(before)),
        streams_started_while_held: started_while_held.map(|(lo, hi)| hi - lo),
        watch_streams_open: watches,
        extends: Samples::new(extends),
        extends_failed,
    })
}
