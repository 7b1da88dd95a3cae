//! The etcd store against the raw requests it is built on, and against etcd's own lock service
//! (`etcd-client`'s `lock()` / `unlock()`, the Go `concurrency.Mutex` run inside the server),
//! measured in one run from one client.
//!
//! ```sh
//! cargo run --release -p fencelock-etcd --example bench
//! ```
//!
//! Starts its own single-member server with test-servers, or uses `LOCK_BENCH_URL` if set.
//! Prints one table: the raw round trips (a read, a write), the raw floor (lease grant + txn
//! put + delete, the same client), our try_acquire + release cycle and its ratio (and the same
//! cycle as a permit of a semaphore of 4 and as a shared lease, where the store keeps them), etcd's
//! lock/unlock cycle, throughput on distinct keys, handoff latency with 8 waiters on one key
//! (ours and etcd's lock service, in alternating rounds, over the raw floor of a delete seen by
//! another client's watch), and 1,000 locks held with keep-alive on one handle.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use fencelock_conformance::bench::{
    cycle_into, handoff, handoff_between, hold_kept_alive, lock_throughput, micros as us,
    server_or_env, throughput, time_each, Contender, Handoff, ModeCycles, Samples, Table,
};
use fencelock_core::DynLockStore;
use fencelock_etcd::{EtcdConfig, EtcdStore};
use tokio::time::Instant;

const ITERATIONS: usize = 600;
const ROUNDS: usize = 10;
const TASKS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(2);
const WAITERS: usize = 8;
const HANDOFFS: usize = 200;
const HANDOFF_ROUNDS: usize = 4;
const HELD: usize = 1000;
const HELD_TTL: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(30);

fn raw_error(what: &'static str) -> impl Fn(etcd_client::Error) -> fencelock_core::Error {
    move |e| fencelock_core::Error::store(what, e)
}

/// The raw floor: the same three writes an acquire + release needs, as plain requests.
async fn raw_cycle(client: &mut Client, key: &str) -> fencelock_core::Result<()> {
    let lease = client
        .lease_grant(30, None)
        .await
        .map_err(raw_error("raw grant"))?
        .id();
    let put = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let answer = client.txn(put).await.map_err(raw_error("raw txn put"))?;
    if !answer.succeeded() {
        return Err(fencelock_core::Error::Busy { key: key.into() });
    }
    client
        .delete(key, None)
        .await
        .map_err(raw_error("raw delete"))?;
    Ok(())
}

/// etcd's own lock service: grant, `lock` (the server runs the Go mutex recipe), `unlock`.
async fn peer_cycle(client: &mut Client, name: &str) -> fencelock_core::Result<()> {
    let lease = client
        .lease_grant(30, None)
        .await
        .map_err(raw_error("peer grant"))?
        .id();
    let locked = client
        .lock(name, Some(LockOptions::new().with_lease(lease)))
        .await
        .map_err(raw_error("peer lock"))?;
    client
        .unlock(locked.key())
        .await
        .map_err(raw_error("peer unlock"))?;
    Ok(())
}

/// The physical floor under any handoff through etcd: one client deletes a key, another
/// client's watch (its own connection) sees the deletion. Every handoff, ours or the lock
/// service's, pays at least this: a Raft write and one event to another process.
async fn raw_handoff_floor(
    endpoints: &[String],
    samples: usize,
) -> fencelock_core::Result<Samples> {
    let mut writer = Client::connect(endpoints, None)
        .await
        .map_err(raw_error("floor connect"))?;
    let mut watcher = Client::connect(endpoints, None)
        .await
        .map_err(raw_error("floor connect"))?;
    let key = "bench/raw/handoff";
    let mut stream = watcher
        .watch(
            key,
            Some(
                etcd_client::WatchOptions::new()
                    .with_filters([etcd_client::WatchFilterType::NoPut]),
            ),
        )
        .await
        .map_err(raw_error("floor watch"))?;
    stream.message().await.map_err(raw_error("floor watch"))?;
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        writer
            .put(key, "", None)
            .await
            .map_err(raw_error("floor put"))?;
        let started = Instant::now();
        let (deleted, event) = tokio::join!(writer.delete(key, None), stream.message());
        deleted.map_err(raw_error("floor delete"))?;
        event.map_err(raw_error("floor event"))?;
        out.push(started.elapsed());
    }
    Ok(Samples::new(out))
}

/// Samples pooled from several rounds.
fn pooled(rounds: &[Samples]) -> Samples {
    let mut all = Vec::new();
    for round in rounds {
        let n = round.len();
        all.extend((0..n).map(|i| round.quantile(i as f64 / (n.max(2) - 1) as f64)));
    }
    Samples::new(all)
}

/// A waiter of etcd's lock service, for the handoff of `fencelock_conformance::bench::handoff`: its own
/// client and lease, `lock` until granted, `unlock`.
struct PeerWaiter {
    client: Client,
    lease: i64,
    name: String,
}

impl PeerWaiter {
    async fn connect(endpoints: &[String], name: &str) -> fencelock_core::Result<Self> {
        let mut client = Client::connect(endpoints, None)
            .await
            .map_err(raw_error("peer connect"))?;
        let lease = client
            .lease_grant(60, None)
            .await
            .map_err(raw_error("peer grant"))?
            .id();
        Ok(PeerWaiter {
            client,
            lease,
            name: name.to_owned(),
        })
    }
}

#[async_trait]
impl Contender for PeerWaiter {
    /// The key `lock` created, which `unlock` deletes.
    type Held = Vec<u8>;

    async fn take(&mut self) -> fencelock_core::Result<Vec<u8>> {
        let locked = self
            .client
            .lock(
                self.name.as_str(),
                Some(LockOptions::new().with_lease(self.lease)),
            )
            .await
            .map_err(raw_error("peer lock"))?;
        Ok(locked.key().to_vec())
    }

    async fn give_back(&mut self, key: Vec<u8>) -> fencelock_core::Result<()> {
        self.client
            .unlock(key)
            .await
            .map(drop)
            .map_err(raw_error("peer unlock"))
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (_server, url) = server_or_env(test_servers::EtcdServer::start, |s| s.url())?;
    let config = EtcdConfig::from_url(&url)?;
    println!("etcd store benchmark against {config}");
    let endpoints = config.endpoints().to_vec();
    let store = EtcdStore::connect(config.clone()).await?;
    let dyn_store: DynLockStore = Arc::new(store.clone());
    let mut raw = Client::connect(&endpoints, None).await?;
    let status = raw.status().await?;
    println!(
        "server etcd {}, db {} KiB, raft term {}\n",
        status.version(),
        status.db_size() / 1024,
        status.raft_term()
    );

    // Raw round trips with the same client library: a linearizable read, a write.
    raw.put("bench/raw/read", "x", None).await?;
    let raw_read = time_each(ITERATIONS, |_| {
        let mut raw = raw.clone();
        async move {
            raw.get("bench/raw/read", None)
                .await
                .map(drop)
                .map_err(raw_error("raw get"))
        }
    })
    .await?;
    let raw_write = time_each(ITERATIONS, |_| {
        let mut raw = raw.clone();
        async move {
            raw.put("bench/raw/write", "x", None)
                .await
                .map(drop)
                .map_err(raw_error("raw put"))
        }
    })
    .await?;

    // The raw floor, our cycle and etcd's lock/unlock in alternating rounds, so all three see
    // the same machine load; each warmed up first. Ours also as a semaphore permit and as a
    // shared lease, where the store keeps them.
    let mut modes = ModeCycles::new(&dyn_store.capabilities());
    modes.warm_up(&dyn_store, "bench:cycle", TTL, 50).await?;
    for _ in 0..50 {
        raw_cycle(&mut raw, "bench/raw/cycle").await?;
        let lease = dyn_store.try_acquire("bench:cycle", TTL).await?;
        let _ = dyn_store.release(&lease).await?;
        peer_cycle(&mut raw, "bench/peer/cycle").await?;
    }
    let (mut raw_samples, mut our_samples, mut peer_samples) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for _ in 0..ITERATIONS / ROUNDS {
            let started = Instant::now();
            raw_cycle(&mut raw, "bench/raw/cycle").await?;
            raw_samples.push(started.elapsed());
        }
        cycle_into(
            &dyn_store,
            "bench:cycle",
            TTL,
            ITERATIONS / ROUNDS,
            &mut our_samples,
        )
        .await?;
        modes
            .round(&dyn_store, "bench:cycle", TTL, ITERATIONS / ROUNDS)
            .await?;
        for _ in 0..ITERATIONS / ROUNDS {
            let started = Instant::now();
            peer_cycle(&mut raw, "bench/peer/cycle").await?;
            peer_samples.push(started.elapsed());
        }
    }
    let raw_floor = Samples::new(raw_samples);
    let ours = Samples::new(our_samples);
    let peer = Samples::new(peer_samples);

    // Throughput: 16 tasks on distinct keys, raw floor and ours, one connection each side.
    let raw_rate = throughput(TASKS, RUN_FOR, {
        let raw = raw.clone();
        move |task, _| {
            let mut raw = raw.clone();
            async move { raw_cycle(&mut raw, &format!("bench/raw/throughput/{task}")).await }
        }
    })
    .await?;
    let our_rate =
        lock_throughput(dyn_store.clone(), "bench:throughput:", TTL, TASKS, RUN_FOR).await?;

    // Handoff: 8 waiters on one key, each with its own handle (connection); ours and etcd's
    // lock service in alternating rounds, so both see the same machine load, and the raw
    // floor (a delete seen by another client's watch) between them.
    let mut handles: Vec<DynLockStore> = Vec::new();
    for _ in 0..WAITERS {
        handles.push(Arc::new(EtcdStore::connect(config.clone()).await?));
    }
    let (mut ours_rounds, mut peer_rounds, mut floor_rounds) = (Vec::new(), Vec::new(), Vec::new());
    // Each round on keys of its own: the waiters a round ends with are aborted, and whatever
    // they leave queued must not stand in front of the next round.
    for round in 0..HANDOFF_ROUNDS {
        let per_round = HANDOFFS / HANDOFF_ROUNDS;
        let key = format!("bench:handoff:{round}");
        ours_rounds.push(handoff(handles.clone(), &key, TTL, per_round).await?);
        let mut peers = Vec::new();
        for _ in 0..WAITERS {
            let name = format!("bench/peer/handoff/{round}");
            peers.push(PeerWaiter::connect(&endpoints, &name).await?);
        }
        peer_rounds.push(handoff_between(peers, per_round, Handoff::AnyWaiter).await?);
        floor_rounds.push(raw_handoff_floor(&endpoints, per_round).await?);
    }
    let handoffs = pooled(&ours_rounds);
    let peer_handoffs = pooled(&peer_rounds);
    let handoff_floor = pooled(&floor_rounds);

    // 1,000 locks held at once on one handle, each kept alive (one keep-alive stream).
    let held_store = Arc::new(EtcdStore::connect(config.clone()).await?);
    let mut held = hold_kept_alive(&held_store, "bench:held:", HELD, HELD_TTL).await?;
    let lost = held.lost();
    let held_entries = raw
        .get(
            "fencelock/bench:held:",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await?;
    let distinct_leases = held_entries
        .kvs()
        .iter()
        .map(|kv| kv.lease())
        .collect::<std::collections::HashSet<_>>()
        .len();
    let entries_held = held_entries.kvs().len();
    held.release(&*held_store).await?;

    let mut table = Table::default();
    table.latency("raw round trip: get p50", raw_read.p50());
    table.latency("raw round trip: put p50", raw_write.p50());
    table.latency(
        "raw floor: lease grant + txn put + delete p50",
        raw_floor.p50(),
    );
    let ratio = us(ours.p50()) / us(raw_floor.p50());
    table
        .latency("ours: try_acquire + release p50", ours.p50())
        .ratio(ratio, Some(("≤ 1.2× raw floor", ratio <= 1.2)));
    table.latency("ours: try_acquire + release p99", ours.p99());
    modes.rows(&mut table, "ours: ", Some(raw_floor.p50()), None);
    table
        .latency("peer: grant + lock() + unlock() p50", peer.p50())
        .ratio(us(peer.p50()) / us(raw_floor.p50()), None);
    table.latency("peer: grant + lock() + unlock() p99", peer.p99());
    table.rate(format!("raw floor, {TASKS} tasks, distinct keys"), raw_rate);
    table
        .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
        .ratio(our_rate / raw_rate, None);
    let handoff_reads = us(handoffs.p50()) / us(raw_read.p50());
    table
        .latency(format!("handoff p50, {WAITERS} waiters"), handoffs.p50())
        .ratio(
            handoff_reads,
            Some(("p50 ≤ 3 raw round trips (get)", handoff_reads <= 3.0)),
        );
    table.latency(format!("handoff p99, {WAITERS} waiters"), handoffs.p99());
    table.push(
        "handoff p50 in raw writes (put)",
        format!("{:.2}", us(handoffs.p50()) / us(raw_write.p50())),
    );
    table
        .latency(
            format!("peer handoff p50, {WAITERS} waiters (lock/unlock)"),
            peer_handoffs.p50(),
        )
        .ratio(us(peer_handoffs.p50()) / us(raw_read.p50()), None);
    table.latency(
        format!("peer handoff p99, {WAITERS} waiters (lock/unlock)"),
        peer_handoffs.p99(),
    );
    let versus_peer = us(handoffs.p50()) / us(peer_handoffs.p50());
    table
        .push("handoff p50 ours / peer", format!("{versus_peer:.2}"))
        .target = Some(("≤ 1.0× etcd's lock() handoff".into(), versus_peer <= 1.0));
    table
        .latency(
            "raw handoff floor: delete → another client's watch event p50",
            handoff_floor.p50(),
        )
        .ratio(us(handoffs.p50()) / us(handoff_floor.p50()), None);
    table
        .push(
            format!("{HELD} locks held with keep-alive, TTL {HELD_TTL:?}, for 3 TTLs"),
            format!("{lost} lost"),
        )
        .target = Some((format!("{HELD} held, none lost"), lost == 0));
    table.push(
        "  entries held / distinct etcd leases under them",
        format!("{entries_held} / {distinct_leases}"),
    );
    table.push(
        format!("  time to acquire {HELD} (one at a time)"),
        format!("{:.0} ms", held.acquired_in.as_secs_f64() * 1e3),
    );
    table.latency("  extend p50 while they are kept alive", held.extends.p50());
    table.latency("  extend p99 while they are kept alive", held.extends.p99());
    println!("{table}");
    println!(
        "samples: {ITERATIONS} cycles each, {HANDOFFS} handoffs; raw get p99 {:.1} µs, raw put p99 {:.1} µs, raw floor p99 {:.1} µs; keep-alive: one stream per handle",
        us(raw_read.p99()),
        us(raw_write.p99()),
        us(raw_floor.p99())
    );
    Ok(())
}
