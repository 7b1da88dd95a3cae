//! The scale row: 10,000 leases held at once from one `RedisStore` handle, TTL 10 s,
//! each kept alive by a `KeepAlive`, for three TTLs; none may be lost, and the handle's TCP
//! connections to the server stay the same in number throughout. Prints the client memory per
//! held lease: live heap bytes (a counting global allocator) and resident set growth, both
//! measured with the leases held against before any was acquired, divided by their number.
//!
//! `cargo bench -p fencelock-bench --bench redis-scale` (a fresh `redis-server` from
//! test-servers); `-- --cluster` runs it on a Redis Cluster of 3 masters with a replica each;
//! `FENCELOCK_LEASES=N` holds N leases instead of 10,000.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::{
    connections_to, hold_kept_alive, live_bytes, rss_bytes, CountingAllocator, Table,
};
use fencelock_core::{LockStore, ReleaseOutcome};
use fencelock_redis::{RedisConfig, RedisStore};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const TTL: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn Error>> {
    let cluster_mode = std::env::args().any(|a| a == "--cluster");
    let count: usize = match std::env::var("FENCELOCK_LEASES") {
        Ok(n) => n.parse()?,
        Err(_) => 10_000,
    };
    // Kept until the end: dropping them stops the servers.
    let (_server, _cluster, url, ports) = if cluster_mode {
        let cluster = test_servers::RedisServer::start_cluster(3, 1)?;
        let (url, ports) = (cluster.url(), cluster.ports());
        (None, Some(cluster), url, ports)
    } else {
        let server = test_servers::RedisServer::start()?;
        let (url, ports) = (server.url(), vec![server.port()]);
        (Some(server), None, url, ports)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&url, &ports, count, cluster_mode))
}

async fn run(url: &str, ports: &[u16], count: usize, cluster: bool) -> Result<(), Box<dyn Error>> {
    let config = RedisConfig::from_url(url)?.with_prefix("scale:")?;
    println!("Redis scale benchmark against {config}: {count} leases, TTL {TTL:?}, held 3 TTLs");
    let store = Arc::new(RedisStore::connect(config).await?);
    // One lease first, so the connections a handle opens lazily are open before counting.
    let warm = store.try_acquire("scale-warm", TTL).await?;
    store.extend(&warm).await?;
    let _ = store.release(&warm).await?;

    let connections_before = connections_to(ports).unwrap_or(0);
    let (live_before, rss_before) = (live_bytes(), rss_bytes());

    // Connections sampled every 250 ms while the leases are acquired and held.
    let stop = Arc::new(AtomicBool::new(false));
    let (fewest, most) = (
        Arc::new(AtomicUsize::new(usize::MAX)),
        Arc::new(AtomicUsize::new(0)),
    );
    let sampler = tokio::spawn({
        let (stop, fewest, most, ports) =
            (stop.clone(), fewest.clone(), most.clone(), ports.to_vec());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let n = connections_to(&ports).unwrap_or(0);
                fewest.fetch_min(n, Ordering::Relaxed);
                most.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });

    let mut held = hold_kept_alive(&store, "scale-", count, TTL).await?;
    let (live_held, rss_held) = (live_bytes(), rss_bytes());
    stop.store(true, Ordering::Relaxed);
    sampler.await?;
    let lost = held.lost();

    // Every lease must still be the store's: its release finds it held.
    let mut released = 0;
    for keep in held.kept.drain(..) {
        let lease = keep.stop().await;
        if store.release(&lease).await? == ReleaseOutcome::Released {
            released += 1;
        }
    }
    let connections_after = connections_to(ports).unwrap_or(0);
    let (fewest, most) = (
        fewest.load(Ordering::Relaxed).min(connections_before),
        most.load(Ordering::Relaxed).max(connections_before),
    );

    let n = count as f64;
    let heap_per = (live_held - live_before) as f64 / n;
    let rss_per = rss_held.saturating_sub(rss_before) as f64 / n;
    let what = if cluster { "Redis Cluster" } else { "Redis" };
    let mut table = Table::default();
    table
        .push(
            format!("{what}: leases lost over 3 TTLs, of {count}"),
            format!("{lost}"),
        )
        .target = Some(("none lost".into(), lost == 0));
    table
        .push(
            "  released while still held".to_owned(),
            format!("{released}"),
        )
        .target = Some(("all".into(), released == count));
    table
        .push(
            "  TCP connections to the server(s), fewest–most".to_owned(),
            format!("{fewest}–{most}"),
        )
        .target = Some((
        "constant".into(),
        fewest == most && connections_after == most,
    ));
    table.push(
        "  acquiring them, one at a time".to_owned(),
        format!("{:.2} s", held.acquired_in.as_secs_f64()),
    );
    table.latency("  extend p50 while they are kept alive", held.extends.p50());
    table.latency("  extend p99 while they are kept alive", held.extends.p99());
    table.push(
        "  client heap per held lease".to_owned(),
        format!("{heap_per:.0} B"),
    );
    table.push(
        "  client RSS growth per held lease".to_owned(),
        format!("{rss_per:.0} B"),
    );
    print!("{table}");
    Ok(())
}
