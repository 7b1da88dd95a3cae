//! The Redis store against the raw commands it is built on, and against the `rslock` crate,
//! measured in one run from one client machine.
//!
//! ```sh
//! cargo run --release -p fencelock-redis --example bench
//! ```
//!
//! Starts its own server with test-servers, or uses `LOCK_BENCH_URL` if set. Prints one table:
//! the raw round trips (`PING`, `SET NX PX`, `EVALSHA` of a compare-and-delete) on the same
//! kind of connection the store uses (a `ConnectionManager`); the raw cycle — `SET NX PX` then
//! compare-and-delete by `EVALSHA`, the plainest correct Redis lock, without fencing or
//! wake-ups — and our acquire + release cycle, exclusive, as a permit of a semaphore of 4 and
//! as a shared lease (where the store keeps those modes), timed in alternating rounds; throughput with 64
//! tasks on distinct keys, ours against the raw cycle, with the server's time per cycle;
//! handoff latency to another waiter with 8 waiters on one key (one store handle each), next to
//! its physical floor (a raw `PUBLISH` reaching a raw subscriber after the same idle time, plus
//! one round trip); and the same cycle and handoff for `rslock` on the same server.

mod common;

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use common::{failed, rslock_handoff_rows, server_version, Rslock};
use fencelock_conformance::bench::{
    cycle, cycle_into, handoff, handoff_to_another, lock_throughput, micros as us, server_or_env,
    throughput, time_each, ModeCycles, Samples, Table,
};
use fencelock_core::DynLockStore;
use fencelock_redis::{RedisConfig, RedisStore};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

const ITERATIONS: usize = 4000;
const ROUNDS: usize = 20;
const TASKS: usize = 64;
const RUN_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 8;
const HANDOFFS: usize = 1000;
const PEER_HANDOFFS: usize = 100;
/// How long each holder keeps the key in the handoff runs.
const HOLD: Duration = Duration::from_millis(5);
const TTL: Duration = Duration::from_secs(30);

/// Compare-and-delete, the release every correct Redis lock needs.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// `SET key raw-owner NX PX 30000`: `Some("OK")` if it set the key.
async fn set_nx(conn: &mut ConnectionManager, key: &str) -> fencelock_core::Result<Option<String>> {
    redis::cmd("SET")
        .arg(key)
        .arg("raw-owner")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .map_err(failed("SET NX PX"))
}

/// The raw cycle: the two round trips of the plainest correct Redis lock (no fencing token,
/// no wake-up): `SET key owner NX PX ttl`, then compare-and-delete by `EVALSHA`.
async fn raw_cycle(
    conn: &mut ConnectionManager,
    release: &redis::Script,
    key: &str,
) -> fencelock_core::Result<()> {
    if set_nx(conn, key).await?.is_none() {
        return Err(fencelock_core::Error::Busy {
            key: key.to_owned(),
        });
    }
    let deleted: i64 = release
        .key(key)
        .arg("raw-owner")
        .invoke_async(conn)
        .await
        .map_err(failed("EVALSHA compare-and-delete"))?;
    if deleted != 1 {
        return Err(fencelock_core::Error::Store {
            message: format!("raw release of {key} found another owner"),
            source: None,
        });
    }
    Ok(())
}

/// `SET NX PX` then a plain `DEL`: not a correct lock (it may delete a successor's key), only
/// the floor of two round trips of the cheapest commands.
async fn unsafe_cycle(conn: &mut ConnectionManager, key: &str) -> fencelock_core::Result<()> {
    let _ = set_nx(conn, key).await?;
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(failed("DEL"))?;
    Ok(())
}

/// The physical floor of a notified handoff: after the same idle `HOLD` as the handoff runs,
/// the time from sending a `PUBLISH` to a raw subscriber connection receiving the message.
/// Both ends wake from idle here, as a parked waiter and a holder that worked a while do.
async fn raw_notify(client: &redis::Client, samples: usize) -> fencelock_core::Result<Samples> {
    use futures_util::StreamExt;
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .map_err(failed("raw subscriber"))?;
    pubsub
        .subscribe("raw:notify")
        .await
        .map_err(failed("SUBSCRIBE"))?;
    let mut messages = pubsub.into_on_message();
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(failed("raw publisher"))?;
    let mut taken = Vec::with_capacity(samples);
    let mut publish_command = redis::cmd("PUBLISH");
    publish_command.arg("raw:notify").arg("");
    for _ in 0..samples {
        tokio::time::sleep(HOLD).await;
        let sent = Instant::now();
        let publish = publish_command.query_async::<i64>(&mut conn);
        let received = async {
            messages.next().await;
            Instant::now()
        };
        let (published, received) = tokio::join!(publish, received);
        published.map_err(failed("PUBLISH"))?;
        taken.push(received - sent);
    }
    Ok(Samples::new(taken))
}

/// Microseconds the server spent in commands since the last `CONFIG RESETSTAT`, from
/// `INFO commandstats`.
async fn server_usec(conn: &mut ConnectionManager) -> fencelock_core::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(failed("INFO commandstats"))?;
    Ok(info
        .lines()
        .filter(|l| !l.starts_with("cmdstat_info") && !l.starts_with("cmdstat_config"))
        .filter_map(|l| l.split("usec=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|usec| usec.parse::<u64>().ok())
        .sum())
}

async fn reset_stats(conn: &mut ConnectionManager) -> fencelock_core::Result<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(conn)
        .await
        .map_err(failed("CONFIG RESETSTAT"))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (_server, url) = server_or_env(test_servers::RedisServer::start, |s| s.url())?;
    let config = RedisConfig::from_url(&url)?.with_prefix("bench:")?;
    println!("Redis store benchmark against {config}");
    let store = RedisStore::connect(config.clone()).await?;
    let ours: DynLockStore = Arc::new(store.clone());

    // The raw client: the same connection type as the store's, with the same timeouts.
    let client = redis::Client::open(url.as_str())?;
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(Some(config.command_timeout()));
    let raw = ConnectionManager::new_with_config(client.clone(), manager_config.clone()).await?;
    let version = server_version(&raw).await?;
    println!(
        "server {version}, {} cores, load average {} (other work on this machine skews every figure)\n",
        num_cpus(),
        load_average()
    );

    // Raw round trips.
    let ping = time_each(ITERATIONS, |_| {
        let mut raw = raw.clone();
        async move {
            redis::cmd("PING")
                .query_async::<String>(&mut raw)
                .await
                .map(drop)
                .map_err(failed("PING"))
        }
    })
    .await?;
    let set_nx = time_each(ITERATIONS, |i| {
        let mut raw = raw.clone();
        async move {
            redis::cmd("SET")
                .arg(format!("raw:set:{i}"))
                .arg("x")
                .arg("NX")
                .arg("PX")
                .arg(1_000)
                .query_async::<Option<String>>(&mut raw)
                .await
                .map(drop)
                .map_err(failed("SET NX PX"))
        }
    })
    .await?;
    let compare_and_delete = redis::Script::new(COMPARE_AND_DELETE);
    let evalsha = time_each(ITERATIONS, |i| {
        let (mut raw, script) = (raw.clone(), compare_and_delete.clone());
        async move {
            script
                .key(format!("raw:evalsha:{i}"))
                .arg("nobody")
                .invoke_async::<i64>(&mut raw)
                .await
                .map(drop)
                .map_err(failed("EVALSHA"))
        }
    })
    .await?;

    // The raw cycles and ours in alternating rounds, so all see the same machine load; ours
    // also as a semaphore permit and as a shared lease, where the store keeps them.
    cycle(&ours, "cycle", TTL, 200).await?;
    let mut modes = ModeCycles::new(&ours.capabilities());
    modes.warm_up(&ours, "cycle", TTL, 200).await?;
    let (mut raw_samples, mut unsafe_samples, mut our_samples) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut raw_conn = raw.clone();
    for _ in 0..ROUNDS {
        for _ in 0..ITERATIONS / ROUNDS {
            let started = Instant::now();
            raw_cycle(&mut raw_conn, &compare_and_delete, "raw:cycle").await?;
            raw_samples.push(started.elapsed());
        }
        for _ in 0..ITERATIONS / ROUNDS {
            let started = Instant::now();
            unsafe_cycle(&mut raw_conn, "raw:unsafe-cycle").await?;
            unsafe_samples.push(started.elapsed());
        }
        cycle_into(&ours, "cycle", TTL, ITERATIONS / ROUNDS, &mut our_samples).await?;
        modes
            .round(&ours, "cycle", TTL, ITERATIONS / ROUNDS)
            .await?;
    }
    let raw_cycles = Samples::new(raw_samples);
    let unsafe_cycles = Samples::new(unsafe_samples);
    let our_cycles = Samples::new(our_samples);
    // The per-entity pattern: a key never locked before in every cycle (its fence is created,
    // then left to expire after the retention window).
    let run = run_id();
    let our_new_keys = time_each(ITERATIONS, |i| {
        let (ours, key) = (ours.clone(), format!("new-key:{run}:{i}"));
        async move {
            let lease = ours.try_acquire(&key, TTL).await?;
            ours.release(&lease).await.map(drop)
        }
    })
    .await?;

    // Throughput: 64 tasks on distinct keys over one multiplexed connection each way, with the
    // server's own time per cycle from INFO commandstats.
    let mut admin = raw.clone();
    reset_stats(&mut admin).await?;
    let raw_started = Instant::now();
    let raw_rate = throughput(TASKS, RUN_FOR, {
        let (raw, script) = (raw.clone(), compare_and_delete.clone());
        move |task, _| {
            let (mut raw, script) = (raw.clone(), script.clone());
            async move { raw_cycle(&mut raw, &script, &format!("raw:throughput:{task}")).await }
        }
    })
    .await?;
    let raw_server_us =
        server_usec(&mut admin).await? as f64 / (raw_rate * raw_started.elapsed().as_secs_f64());
    reset_stats(&mut admin).await?;
    let our_started = Instant::now();
    let our_rate = lock_throughput(ours.clone(), "throughput:", TTL, TASKS, RUN_FOR).await?;
    let our_server_us =
        server_usec(&mut admin).await? as f64 / (our_rate * our_started.elapsed().as_secs_f64());

    // Handoff: 8 waiters on one key, one store handle (two connections) each.
    let mut handles: Vec<DynLockStore> = Vec::new();
    for _ in 0..WAITERS {
        handles.push(Arc::new(RedisStore::connect(config.clone()).await?));
    }
    let notify = raw_notify(&client, 500).await?;
    let handoffs = handoff_to_another(handles.clone(), "handoff", TTL, HOLD, HANDOFFS).await?;
    let reacquiring = handoff(handles, "handoff-any", TTL, HANDOFFS).await?;

    // The peer: rslock on the same server, one LockManager per waiter.
    let peer: DynLockStore = Arc::new(Rslock::new(vec![url.clone()]));
    let peer_cycles = cycle(&peer, "rslock:cycle", TTL, ITERATIONS / 4).await?;
    let peer_new_keys = time_each(ITERATIONS / 4, |i| {
        let (peer, key) = (peer.clone(), format!("rslock:new-key:{run}:{i}"));
        async move {
            let lease = peer.try_acquire(&key, TTL).await?;
            peer.release(&lease).await.map(drop)
        }
    })
    .await?;
    let mut peer_handles: Vec<DynLockStore> = Vec::new();
    for _ in 0..WAITERS {
        peer_handles.push(Arc::new(Rslock::new(vec![url.clone()])));
    }
    let peer_handoffs =
        handoff_to_another(peer_handles, "rslock:handoff", TTL, HOLD, PEER_HANDOFFS).await?;

    let rtt = set_nx.p50();
    let mut table = Table::default();
    table.latency("raw PING p50", ping.p50());
    table.latency("raw SET NX PX p50 (the raw round trip)", rtt);
    table.latency("raw EVALSHA compare-and-delete p50", evalsha.p50());
    table.latency("raw cycle: SET NX PX + EVALSHA p50", raw_cycles.p50());
    table.latency("raw cycle p99", raw_cycles.p99());
    table
        .latency("SET NX PX + DEL (unsafe floor) p50", unsafe_cycles.p50())
        .ratio(us(unsafe_cycles.p50()) / us(raw_cycles.p50()), None);
    let cycle_ratio = us(our_cycles.p50()) / us(raw_cycles.p50());
    table
        .latency("ours: try_acquire + release p50", our_cycles.p50())
        .ratio(
            cycle_ratio,
            Some(("≤ 1.15× the raw cycle", cycle_ratio <= 1.15)),
        );
    table
        .latency("ours: try_acquire + release p99", our_cycles.p99())
        .ratio(us(our_cycles.p99()) / us(raw_cycles.p99()), None);
    modes.rows(
        &mut table,
        "ours: ",
        Some(raw_cycles.p50()),
        Some(raw_cycles.p99()),
    );
    table
        .latency("ours: a new key per cycle p50", our_new_keys.p50())
        .ratio(us(our_new_keys.p50()) / us(raw_cycles.p50()), None);
    table
        .latency("ours: a new key per cycle p99", our_new_keys.p99())
        .ratio(us(our_new_keys.p99()) / us(raw_cycles.p99()), None);
    table.rate(format!("raw cycle, {TASKS} tasks, distinct keys"), raw_rate);
    let rate_ratio = our_rate / raw_rate;
    table
        .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
        .ratio(rate_ratio, Some(("≥ 0.8× raw", rate_ratio >= 0.8)));
    table.push(
        "  server time per cycle: raw / ours",
        format!("{raw_server_us:.1} / {our_server_us:.1} µs"),
    );
    let handoff_rtts = us(handoffs.p50()) / us(rtt);
    table
        .latency(format!("handoff p50, {WAITERS} waiters"), handoffs.p50())
        .ratio(
            handoff_rtts,
            Some(("p50 ≤ 3 raw round trips", handoff_rtts <= 3.0)),
        );
    table
        .latency(format!("handoff p99, {WAITERS} waiters"), handoffs.p99())
        .ratio(us(handoffs.p99()) / us(rtt), None);
    table.latency("  raw PUBLISH → subscriber after idle p50", notify.p50());
    let floor = us(notify.p50()) + us(rtt);
    table.push(
        "  handoff p50 / (that + 1 raw round trip)",
        format!("{:.2}", us(handoffs.p50()) / floor),
    );
    table
        .latency(
            "  releaser may re-take (fencelock_conformance::bench) p50",
            reacquiring.p50(),
        )
        .ratio(us(reacquiring.p50()) / us(rtt), None);
    table
        .latency("rslock: lock + unlock p50", peer_cycles.p50())
        .ratio(us(peer_cycles.p50()) / us(raw_cycles.p50()), None);
    table.latency("rslock: lock + unlock p99", peer_cycles.p99());
    table
        .latency("rslock: a new key per cycle p50", peer_new_keys.p50())
        .ratio(us(peer_new_keys.p50()) / us(raw_cycles.p50()), None);
    table.push(
        "  ours / rslock, a new key per cycle p50",
        format!("{:.2}", us(our_new_keys.p50()) / us(peer_new_keys.p50())),
    );
    rslock_handoff_rows(&mut table, WAITERS, &handoffs, &peer_handoffs);
    println!("{table}");
    println!(
        "ratios: cycle rows to the raw cycle; handoff rows to the raw SET NX PX round trip; \
         the rslock handoff row is rslock's p50 over ours. Handoffs go to another waiter \
         (the releaser waits for the next grant before contending again), except the \
         \"releaser may re-take\" row."
    );
    println!("load average at the end: {}", load_average());
    println!(
        "samples: {ITERATIONS} round trips and cycles each, {} rslock cycles, \
         {HANDOFFS} handoffs ({PEER_HANDOFFS} for rslock), throughput over {RUN_FOR:?} each",
        ITERATIONS / 4
    );
    Ok(())
}

/// A tag for this run's keys, so "a new key per cycle" is new on a server used before.
fn run_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The 1, 5 and 15 minute load averages, where Linux tells them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
