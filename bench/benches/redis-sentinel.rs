//! The Redis store through `redis+sentinel://` against the same store on a plain `redis://`
//! URL of the same master, and the raw round trip to that master, measured in one run.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench redis-sentinel
//! ```
//!
//! Starts a Sentinel deployment with test-servers (a master, two replicas, three sentinels).
//! Prints one table: the raw `PING` to the master (a `ConnectionManager`, as the plain store
//! uses); the uncontended acquire + release cycle of both stores in alternating rounds, and of
//! `redis+sentinel://` with `min_replicas=1` (each grant followed by `WAIT`); and the peers'
//! protocol (8 contenders on one key, hold 1 ms, pause 30 ms: acquire latency p50, mean and
//! p99), Sentinel against plain in interleaved rounds, target each ≤ 1.1× (the same scripts
//! on the same server; the Sentinel connection adds a lock and a timer per command).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::{
    cycle_into, micros as us, store_contenders, time_each, PeersProtocol, Samples, Table,
    PEERS_CONTENDERS,
};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore};
use redis::aio::ConnectionManager;

const ITERATIONS: usize = 4000;
const ROUNDS: usize = 20;
const TTL: Duration = Duration::from_secs(30);

type BenchResult<T> = Result<T, Box<dyn Error>>;

async fn store(url: &str) -> BenchResult<DynLockStore> {
    let config = RedisConfig::from_url(url)?.with_prefix("bench:")?;
    Ok(Arc::new(RedisStore::connect(config).await?))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> BenchResult<()> {
    let deployment =
        tokio::task::spawn_blocking(test_servers::RedisServer::start_sentinel).await??;
    let master = deployment.master()?;
    let sentinel_url = deployment.url();
    let plain_url = format!("redis://127.0.0.1:{master}");
    println!("Redis Sentinel benchmark: {sentinel_url} against {plain_url}, its master");
    println!(
        "{} cores, load average {} (other work on this machine skews every figure)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut table = Table::default();
    let rtt = raw_round_trip(&plain_url, &mut table).await?;
    cycles(&sentinel_url, &plain_url, rtt, &mut table).await?;
    protocol(&sentinel_url, &plain_url, &mut table).await?;
    println!("{table}");
    Ok(())
}

/// `PING` to the master on the kind of connection the plain store uses.
async fn raw_round_trip(plain_url: &str, table: &mut Table) -> BenchResult<Duration> {
    let raw = ConnectionManager::new(redis::Client::open(plain_url)?).await?;
    let ping = time_each(ITERATIONS, |_| {
        let mut raw = raw.clone();
        async move {
            redis::cmd("PING")
                .query_async::<String>(&mut raw)
                .await
                .map(drop)
                .map_err(|e| fencelock_core::Error::store(format!("PING: {e}"), e))
        }
    })
    .await?;
    table.latency(
        "raw PING to the master p50 (the raw round trip)",
        ping.p50(),
    );
    Ok(ping.p50())
}

/// The uncontended cycle of each store, one round each in turn.
async fn cycles(
    sentinel_url: &str,
    plain_url: &str,
    rtt: Duration,
    table: &mut Table,
) -> BenchResult<()> {
    let acked_url = format!("{sentinel_url}?min_replicas=1&replica_timeout=300ms");
    let stores = [
        ("redis:// on the master", store(plain_url).await?),
        ("redis+sentinel://", store(sentinel_url).await?),
        (
            "redis+sentinel:// with min_replicas=1",
            store(&acked_url).await?,
        ),
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); stores.len()];
    for (i, (_, store)) in stores.iter().enumerate() {
        cycle_into(store, &format!("cycle-{i}"), TTL, 50, &mut Vec::new()).await?;
    }
    for _ in 0..ROUNDS {
        for (i, (_, store)) in stores.iter().enumerate() {
            let key = format!("cycle-{i}");
            cycle_into(store, &key, TTL, ITERATIONS / ROUNDS, &mut samples[i]).await?;
        }
    }
    let samples: Vec<Samples> = samples.into_iter().map(Samples::new).collect();
    let plain = samples[0].p50();
    for ((what, _), samples) in stores.iter().zip(&samples) {
        table
            .latency(format!("{what}: acquire + release p50"), samples.p50())
            .ratio(us(samples.p50()) / us(rtt), None);
        table.latency(format!("{what}: acquire + release p99"), samples.p99());
    }
    let ratio = us(samples[1].p50()) / us(plain);
    table.push(
        "  redis+sentinel:// / redis://, cycle p50",
        format!("{ratio:.2}"),
    );
    table.push(
        "  with min_replicas=1 / redis://, cycle p50 (the WAIT)",
        format!("{:.2}", us(samples[2].p50()) / us(plain)),
    );
    Ok(())
}

/// The peers' protocol, Sentinel against plain on the same master, in interleaved rounds.
async fn protocol(sentinel_url: &str, plain_url: &str, table: &mut Table) -> BenchResult<()> {
    let wait = Duration::from_secs(60);
    let (mut sentinel, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..PEERS_CONTENDERS {
        sentinel.push(store(sentinel_url).await?);
        plain.push(store(plain_url).await?);
    }
    let versus = PeersProtocol::HARNESS
        .run(
            store_contenders(sentinel, "protocol-sentinel", TTL, wait),
            store_contenders(plain, "protocol-plain", TTL, wait),
        )
        .await?;
    versus.rows(table, "redis:// on the master", 1.1);
    Ok(())
}
