//! Issue 16's scale row: 10,000 leases held at once from one `RedisStore` handle, TTL 10 s,
//! each kept alive by a `KeepAlive`, for three TTLs; none may be lost, and the handle's TCP
//! connections to the server stay the same in number throughout. Prints the client memory per
//! held lease: live heap bytes (a counting global allocator) and resident set growth, both
//! measured with the leases held against before any was acquired, divided by their number.
//!
//! `cargo run --release -p fencelock-redis --example scale` (a fresh `redis-server` from
//! test-servers); `-- --cluster` runs it on a Redis Cluster of 3 masters with a replica each;
//! `FENCELOCK_LEASES=N` holds N leases instead of 10,000.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_conformance::bench::{hold_kept_alive, Table};
use fencelock_core::{Acquire, Extend, Release, ReleaseOutcome};
use fencelock_redis::{RedisConfig, RedisStore};

/// The system allocator, counting the bytes live at any moment.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const TTL: Duration = Duration::from_secs(10);

/// This process's resident set, in bytes (`VmRSS` in `/proc/self/status`); 0 if unreadable.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("VmRSS:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        })
        .map_or(0, |kb| kb * 1024)
}

/// This process's established TCP connections to any of `ports` on the loopback: its socket
/// inodes (`/proc/self/fd`) looked up in `/proc/self/net/tcp` and `tcp6`.
fn connections(ports: &[u16]) -> usize {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let port = remote
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == "01" && port.is_some_and(|p| ports.contains(&p)) && inodes.contains(*inode)
            {
                count += 1;
            }
        }
    }
    count
}

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

    let connections_before = connections(ports);
    let (live_before, rss_before) = (LIVE.load(Ordering::Relaxed), rss());

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
                let n = connections(&ports);
                fewest.fetch_min(n, Ordering::Relaxed);
                most.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });

    let mut held = hold_kept_alive(&store, "scale-", count, TTL).await?;
    let (live_held, rss_held) = (LIVE.load(Ordering::Relaxed), rss());
    stop.store(true, Ordering::Relaxed);
    sampler.await?;
    let lost = held.lost();

    // Every lease must still be the store's: its release finds it held.
    let mut released = 0;
    for keep in held.kept.drain(..) {
        let lease = keep.stop();
        if store.release(&lease).await? == ReleaseOutcome::Released {
            released += 1;
        }
    }
    let connections_after = connections(ports);
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
