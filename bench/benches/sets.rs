//! Several keys at once: `lock_all` on sets of 1, 4 and 16 keys against the user's alternative,
//! taking the same keys one by one in a loop (in byte order, as `lock_all` does, so the loop
//! cannot deadlock either), on Redis, PostgreSQL and SQLite.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench sets
//! cargo bench -p fencelock-bench --bench sets -- sqlite      # only that store
//! ```
//!
//! Per store, started by test-servers just before its part (SQLite: a file of its own):
//!
//! - uncontended, p50 of a whole take + release of the set: `lock_all` (one guard, every key
//!   kept alive) against the loop of `lock(key)` guards, and the raw floor, the same number of
//!   bare `try_acquire` + `release` cycles with nothing kept alive;
//! - contended: two tasks on two handles take the same set over and over for 2 s, `lock_all`
//!   in opposite orders of the keys given, the loop in byte order; sets per second.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{DynLockStore, LockStoreExt};
use fencelock_bench::{micros, Samples, Table};

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Takes + releases timed per figure.
const ITERATIONS: usize = 200;
/// The sizes of the sets.
const SIZES: [usize; 3] = [1, 4, 16];
/// How long each contended figure runs.
const CONTENDED: Duration = Duration::from_secs(2);
/// Long enough never to run out during a take.
const TTL: Duration = Duration::from_secs(30);
/// Each contended take waits at most this long.
const WAIT: Duration = Duration::from_secs(10);

fn keys(store: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("bench-set-{store}-{n}-{i:02}"))
        .collect()
}

/// One `lock_all` take + release of `keys`.
async fn take_set(store: &DynLockStore, keys: &[String]) -> fencelock::Result<()> {
    let set = store.lock_all(keys).ttl(TTL).wait(WAIT).await?;
    set.release().await.map(drop)
}

/// The user's loop: each key's guard in byte order, then each released.
async fn take_loop(store: &DynLockStore, keys: &[String]) -> fencelock::Result<()> {
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    let mut guards = Vec::with_capacity(sorted.len());
    for key in sorted {
        guards.push(store.lock(key).ttl(TTL).wait(WAIT).await?);
    }
    for guard in guards.into_iter().rev() {
        let _ = guard.release().await?;
    }
    Ok(())
}

/// The floor: a bare try_acquire + release per key, nothing kept alive.
async fn take_raw(store: &DynLockStore, keys: &[String]) -> fencelock::Result<()> {
    for key in keys {
        let lease = store.try_acquire(key, TTL).await?;
        let _ = store.release(&lease).await?;
    }
    Ok(())
}

/// `ITERATIONS` timed takes of `keys`, each the way `how` takes them.
async fn time(
    store: &DynLockStore,
    keys: &[String],
    how: fn(DynLockStore, Vec<String>) -> Take,
) -> fencelock::Result<Samples> {
    fencelock_bench::time_each(ITERATIONS, |_| how(store.clone(), keys.to_vec())).await
}

async fn uncontended(store: &DynLockStore, name: &str, table: &mut Table) -> BenchResult<()> {
    for n in SIZES {
        let keys = keys(name, n);
        let raw = time(store, &keys, take_raw_owned).await?;
        let looped = time(store, &keys, take_loop_owned).await?;
        let set = time(store, &keys, take_set_owned).await?;
        table
            .latency(
                format!("{n} keys, raw try_acquire + release each p50"),
                raw.p50(),
            )
            .ratio(1.0, None);
        table
            .latency(format!("{n} keys, lock(key) one by one p50"), looped.p50())
            .ratio(micros(looped.p50()) / micros(raw.p50()), None);
        table
            .latency(format!("{n} keys, lock_all p50"), set.p50())
            .ratio(micros(set.p50()) / micros(looped.p50()), None);
    }
    Ok(())
}

type Take = std::pin::Pin<Box<dyn std::future::Future<Output = fencelock::Result<()>> + Send>>;

fn take_raw_owned(store: DynLockStore, keys: Vec<String>) -> Take {
    Box::pin(async move { take_raw(&store, &keys).await })
}

fn take_loop_owned(store: DynLockStore, keys: Vec<String>) -> Take {
    Box::pin(async move { take_loop(&store, &keys).await })
}

fn take_set_owned(store: DynLockStore, keys: Vec<String>) -> Take {
    Box::pin(async move { take_set(&store, &keys).await })
}

async fn contended(url: &str, name: &str, table: &mut Table) -> BenchResult<()> {
    for n in [4, 16] {
        let keys = keys(&format!("{name}-contended"), n);
        let reversed: Vec<String> = keys.iter().rev().cloned().collect();
        let handles = [
            fencelock::connect(url).await?,
            fencelock::connect(url).await?,
        ];
        let handles = Arc::new(handles);
        let sets = Arc::new([keys.clone(), reversed]);
        let (h, s) = (handles.clone(), sets.clone());
        let set_rate = fencelock_bench::throughput(2, CONTENDED, move |task, _| {
            take_set_owned(h[task].clone(), s[task].clone())
        })
        .await?;
        let (h, s) = (handles.clone(), sets.clone());
        let loop_rate = fencelock_bench::throughput(2, CONTENDED, move |task, _| {
            take_loop_owned(h[task].clone(), s[task].clone())
        })
        .await?;
        table
            .rate(
                format!("{n} keys, 2 contenders, lock(key) one by one"),
                loop_rate,
            )
            .ratio(1.0, None);
        table
            .rate(format!("{n} keys, 2 contenders, lock_all"), set_rate)
            .ratio(set_rate / loop_rate, None);
    }
    Ok(())
}

#[path = "servers/mod.rs"]
mod servers;

#[tokio::main]
async fn main() -> BenchResult<()> {
    let asked: Vec<String> = fencelock_bench::args().collect();
    let stores: Vec<&str> = ["redis", "postgres", "sqlite"]
        .into_iter()
        .filter(|store| asked.is_empty() || asked.iter().any(|a| a == store))
        .collect();
    let started = std::time::Instant::now();
    for name in stores {
        let running = servers::start(name, "sets")?;
        let store = fencelock::connect(&running.url).await?;
        println!("{name} at {}", fencelock::redact(&running.url));
        let mut table = Table::default();
        uncontended(&store, name, &mut table).await?;
        contended(&running.url, name, &mut table).await?;
        print!("{table}");
        println!();
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!(
        "(took {} s; load average after: {})",
        started.elapsed().as_secs(),
        load.join(" ")
    );
    Ok(())
}
