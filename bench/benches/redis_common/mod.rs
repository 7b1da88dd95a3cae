//! What the two Redis benchmarks (`bench.rs`, `redlock_bench.rs`) share: the `rslock` peer
//! behind our traits and its handoff rows, the raw client's error, version and subscription
//! helpers, and this process's CPU time.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_bench::{micros, Samples, Table};
use fencelock_core::raw::{AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, KeyStatus, Lease, LockStore, OwnerId, PerKeyState, ReleaseOutcome,
};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

/// Maps a raw client's error to a store error naming `what` failed.
pub(crate) fn failed(what: &'static str) -> impl Fn(redis::RedisError) -> fencelock_core::Error {
    move |e| fencelock_core::Error::store(what, e)
}

/// A raw pub/sub connection of `client` subscribed to `channel`, as its stream of messages.
pub(crate) async fn raw_subscription(
    client: &redis::Client,
    channel: &str,
) -> fencelock_core::Result<impl futures_util::Stream<Item = redis::Msg>> {
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .map_err(failed("raw subscriber"))?;
    pubsub
        .subscribe(channel)
        .await
        .map_err(failed("SUBSCRIBE"))?;
    Ok(pubsub.into_on_message())
}

/// This process's user + system CPU in µs, from `/proc/self/stat` (every thread; Linux only,
/// in clock ticks, 10 ms at the usual 100 Hz: about 1% of a round's CPU); 0 elsewhere.
pub(crate) fn client_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|t| t.parse::<f64>().ok()).sum()
    });
    ticks * 1e6 / 100.0
}

/// The server's `redis_version`, from `INFO server`.
pub(crate) async fn server_version(conn: &ConnectionManager) -> redis::RedisResult<String> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn.clone())
        .await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .to_owned())
}

/// The rows of rslock's handoff: its p50, as a ratio over `ours` (the target being ours at
/// least ten times better), and its p99.
pub(crate) fn rslock_handoff_rows(
    table: &mut Table,
    waiters: usize,
    ours: &Samples,
    rslock: &Samples,
) {
    let better = micros(rslock.p50()) / micros(ours.p50());
    table
        .latency(
            format!("rslock handoff p50, {waiters} waiters"),
            rslock.p50(),
        )
        .ratio(better, Some(("ours ≥ 10× better", better >= 10.0)));
    table.latency(
        format!("rslock handoff p99, {waiters} waiters"),
        rslock.p99(),
    );
}

/// `rslock` (a Redlock crate, on one node or several) behind our traits, so the same
/// measurement loops run on it. It has no fencing token (the lease says 0) and its unlock
/// reports nothing (release always says `Released`); its waiting acquire is its own retry loop.
/// A `LockStore` by hand, not a `raw::Store`, so the peer's figures carry none of our checks.
#[derive(Debug)]
pub(crate) struct Rslock {
    manager: rslock::LockManager,
}

impl Rslock {
    /// A lock manager on the servers at `urls`.
    pub(crate) fn new(urls: Vec<String>) -> Self {
        Rslock {
            manager: rslock::LockManager::new(urls),
        }
    }
}

impl Rslock {
    async fn try_once(&self, key: &str, ttl: Duration) -> fencelock_core::Result<Lease> {
        let sent_at = Instant::now();
        match self.manager.lock(key.as_bytes(), ttl).await {
            Ok(lock) => Ok(Lease::with_store_state(
                key,
                OwnerId::random(),
                0,
                ttl,
                sent_at,
                lock,
            )),
            Err(_) => Err(fencelock_core::Error::Busy {
                key: key.to_owned(),
            }),
        }
    }

    async fn wait_for(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> fencelock_core::Result<Lease> {
        let sent_at = Instant::now();
        match tokio::time::timeout(wait, self.manager.acquire_no_guard(key.as_bytes(), ttl)).await {
            Ok(Ok(lock)) => Ok(Lease::with_store_state(
                key,
                OwnerId::random(),
                0,
                ttl,
                sent_at,
                lock,
            )),
            Ok(Err(e)) => Err(fencelock_core::Error::Store {
                message: format!("rslock: {e}"),
                source: None,
            }),
            Err(_) => Err(fencelock_core::Error::WaitTimedOut {
                key: key.to_owned(),
                waited: wait,
            }),
        }
    }
}

#[async_trait]
impl LockStore for Rslock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
    }

    async fn acquire_request(&self, request: AcquireRequest<'_>) -> fencelock_core::Result<Lease> {
        match request.wait {
            None => self.try_once(request.key, request.ttl).await,
            Some(wait) => self.wait_for(request.key, request.ttl, wait).await,
        }
    }

    async fn release(&self, lease: &Lease) -> fencelock_core::Result<ReleaseOutcome> {
        if let Some(lock) = lease.store_state::<rslock::Lock>() {
            self.manager.unlock(lock).await;
        }
        Ok(ReleaseOutcome::Released)
    }

    async fn extend(&self, _: &Lease) -> fencelock_core::Result<()> {
        Err(fencelock_core::Error::Unsupported {
            operation: "extend in this benchmark adapter",
        })
    }

    async fn status(&self, _: &str) -> fencelock_core::Result<KeyStatus> {
        Err(fencelock_core::Error::Unsupported {
            operation: "status",
        })
    }

    async fn evict(&self, _: &str) -> fencelock_core::Result<bool> {
        Err(fencelock_core::Error::Unsupported { operation: "evict" })
    }

    async fn relabel(&self, _: &Lease, _: &str) -> fencelock_core::Result<()> {
        Err(fencelock_core::Error::Unsupported {
            operation: "relabel",
        })
    }

    async fn next_status(
        &self,
        _: &str,
        _: &KeyStatus,
        _: fencelock_core::Instant,
    ) -> fencelock_core::Result<KeyStatus> {
        Err(fencelock_core::Error::Unsupported {
            operation: "status",
        })
    }

    async fn per_key_state(&self) -> fencelock_core::Result<Option<PerKeyState>> {
        Ok(None)
    }

    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }

    fn lease_env(&self, _: &Lease) -> Vec<(String, String)> {
        Vec::new()
    }
}
