//! The etcd store against the raw requests it is built on, and against etcd's own lock service
//! (`etcd-client`'s `lock()` / `unlock()`, the Go `concurrency.Mutex` run inside the server),
//! measured in one run from one client.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench etcd
//! ```
//!
//! Starts its own single-member server with test-servers, or uses `LOCK_BENCH_URL` if set.
//! Prints one table: the raw round trips (a read, a write), the raw floor (lease grant + txn
//! put + delete, the same client), our try_acquire + release cycle and its ratio (and the same
//! cycle as a permit of a semaphore of 4 and as a shared lease, where the store keeps them), etcd's
//! lock/unlock cycle (a lease granted each time, and on a kept lease, as our store keeps idle leases), throughput on distinct keys, handoff latency with 8 waiters on one key
//! (ours and etcd's lock service, in alternating rounds, over the raw floor of a delete seen by
//! another client's watch, with the CPU each spends per handoff, client and server), the same
//! handoff one waiter at a time on a quiet machine, the peers' protocol (8 contenders on one
//! key, each holding 1 ms and pausing 30 ms after each release: the acquire latency's p50,
//! mean and p99, ours against etcd's `lock()` in interleaved rounds, target each ≤ 1.0×, with
//! a recipe floor (`RecipeWaiter`: etcd's queue recipe with our requests by hand) in the same
//! rounds, and the release-to-grant
//! handoff of the same rounds, all of them and those to a contender asking since the
//! holder's grant), and
//! 10,000 locks held with keep-alive on one handle (TTL 10 s, three TTLs), with the client
//! memory per lock, the client's connections and the server's keep-alive streams.
//!
//! `ETCD_BENCH_HELD=N` holds N locks instead of 10,000; `ETCD_BENCH_RECIPE=plain` runs the
//! recipe's own requests as the protocol's floor instead of ours.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp,
};
use fencelock_bench::{
    cycle_into, handoff, handoff_between, lock_throughput, micros as us, server_or_env,
    store_contenders, throughput, time_each, Contender, Handoff, ModeCycles, PeersProtocol,
    Samples, Table, PEERS_CONTENDERS,
};
use fencelock_core::DynLockStore;
use fencelock_etcd::{EtcdConfig, EtcdStore};
use tokio::time::Instant;

mod scale;

#[global_allocator]
static ALLOCATOR: scale::CountingAllocator = scale::CountingAllocator;

const ITERATIONS: usize = 600;
const ROUNDS: usize = 10;
const TASKS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(2);
const WAITERS: usize = 8;
const HANDOFFS: usize = 800;
const HANDOFF_ROUNDS: usize = 8;
const HELD: usize = 10_000;
const HELD_TTL: Duration = Duration::from_secs(10);
/// Acquires in flight while taking the held locks.
const HELD_IN_FLIGHT: usize = 32;
/// Handoffs measured one at a time, each kind.
const QUIET_HANDOFFS: usize = 40;
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
    peer_kept_cycle(client, name, lease).await
}

/// etcd's own lock service on a lease granted once and kept, as a long-lived client (and our
/// store, which keeps idle leases) uses it: `lock`, `unlock`.
async fn peer_kept_cycle(
    client: &mut Client,
    name: &str,
    lease: i64,
) -> fencelock_core::Result<()> {
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

/// Our cycle's two requests written by hand on a kept lease: the enqueue transaction (the token
/// offset's raise, a comparison that finds it raised; the entry's put on the lease; the entry
/// read back, the queue's head, its two newest entries and the offset), then the entry's
/// delete if it exists (a transaction, as a release's). What a fenced, offset-raised queue
/// entry costs the server, without our client.
async fn fenced_floor_cycle(
    client: &mut Client,
    dir: &str,
    lease: i64,
) -> fencelock_core::Result<()> {
    let offset = "bench/fenced/~offset";
    let entry = format!("{dir}entry");
    let raise = |below: &str| {
        let create = Txn::new()
            .when([Compare::version(offset, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(offset, below, None)]);
        Txn::new()
            .when([Compare::value(offset, CompareOp::Less, below)])
            .and_then([TxnOp::put(offset, below, None)])
            .or_else([TxnOp::txn(create)])
    };
    let sorted = |order, limit| {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, order)
            .with_limit(limit)
    };
    let enqueue = Txn::new().and_then([
        TxnOp::txn(raise("0000000000000000001")),
        TxnOp::put(
            entry.as_str(),
            "",
            Some(PutOptions::new().with_lease(lease)),
        ),
        TxnOp::get(entry.as_str(), Some(GetOptions::new().with_keys_only())),
        TxnOp::get(dir, Some(sorted(SortOrder::Ascend, 1))),
        TxnOp::get(dir, Some(sorted(SortOrder::Descend, 2))),
        TxnOp::get(offset, None),
    ]);
    client
        .txn(enqueue)
        .await
        .map_err(raw_error("fenced floor enqueue"))?;
    let delete = Txn::new()
        .when([Compare::create_revision(
            entry.as_str(),
            CompareOp::Greater,
            0,
        )])
        .and_then([TxnOp::delete(entry.as_str(), None)]);
    client
        .txn(delete)
        .await
        .map_err(raw_error("fenced floor delete"))?;
    Ok(())
}

/// The physical floor under any handoff through etcd: one client deletes a key, another
/// client's watch (its own connection) sees the deletion, timed until the event arrives.
/// Every handoff, ours or the lock service's, pays at least this: a Raft write and one event
/// to another process.
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
        let seen = async {
            let event = stream.message().await;
            (event, started.elapsed())
        };
        let (deleted, (event, seen_after)) = tokio::join!(writer.delete(key, None), seen);
        deleted.map_err(raw_error("floor delete"))?;
        event.map_err(raw_error("floor event"))?;
        out.push(seen_after);
    }
    Ok(Samples::new(out))
}

/// One handoff with nothing else running: `first` holds `key`, `second` and `third` queue
/// behind it; `first` releases, so `second` is granted by its read of the queue and knows
/// `third` as its successor; the time measured is from `second`'s release (a handoff mark for
/// `third`) to `third`'s grant.
async fn quiet_handoff(handles: &[DynLockStore], key: &str) -> fencelock_core::Result<Duration> {
    let wait = Duration::from_secs(10);
    let first = handles[0].try_acquire(key, TTL).await?;
    let second = tokio::spawn({
        let (store, key) = (handles[1].clone(), key.to_owned());
        async move { store.acquire(&key, TTL, wait).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let third = tokio::spawn({
        let (store, key) = (handles[2].clone(), key.to_owned());
        async move {
            let lease = store.acquire(&key, TTL, wait).await;
            (Instant::now(), lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = handles[0].release(&first).await?;
    let second = joined(second.await)??;
    // Both parked in their watches.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let released_at = Instant::now();
    let _ = handles[1].release(&second).await?;
    let (granted_at, third) = joined(third.await)?;
    let _ = handles[2].release(&third?).await?;
    Ok(granted_at - released_at)
}

/// The same for etcd's lock service: one waiter parked in `lock()` (long enough for the
/// server's watch from a past revision to be synced, which etcd does every 100 ms), then the
/// holder's `unlock()`.
async fn quiet_peer_handoff(
    holder: &mut PeerWaiter,
    waiter: &mut PeerWaiter,
) -> fencelock_core::Result<Duration> {
    let held = holder.take().await?;
    let mut parked = PeerWaiter {
        client: waiter.client.clone(),
        lease: waiter.lease,
        name: waiter.name.clone(),
    };
    let wait = tokio::spawn(async move {
        let key = parked.take().await;
        (Instant::now(), key, parked)
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let released_at = Instant::now();
    holder.give_back(held).await?;
    let (granted_at, key, mut parked) = joined(wait.await)?;
    parked.give_back(key?).await?;
    Ok(granted_at - released_at)
}

/// The raw floor one sample at a time: a key put and watched, a pause, then its deletion
/// timed until another client's watch reports it.
struct QuietFloor {
    writer: Client,
    stream: etcd_client::WatchStream,
}

impl QuietFloor {
    const KEY: &'static str = "bench/raw/quiet";

    async fn connect(endpoints: &[String]) -> fencelock_core::Result<Self> {
        let writer = Client::connect(endpoints, None)
            .await
            .map_err(raw_error("floor connect"))?;
        let mut watcher = Client::connect(endpoints, None)
            .await
            .map_err(raw_error("floor connect"))?;
        let options =
            etcd_client::WatchOptions::new().with_filters([etcd_client::WatchFilterType::NoPut]);
        let mut stream = watcher
            .watch(Self::KEY, Some(options))
            .await
            .map_err(raw_error("floor watch"))?;
        stream.message().await.map_err(raw_error("floor watch"))?;
        Ok(QuietFloor { writer, stream })
    }

    async fn sample(&mut self) -> fencelock_core::Result<Duration> {
        self.writer
            .put(Self::KEY, "", None)
            .await
            .map_err(raw_error("floor put"))?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let stream = &mut self.stream;
        let seen = async {
            let event = stream.message().await;
            (event, started.elapsed())
        };
        let (deleted, (event, seen_after)) =
            tokio::join!(self.writer.delete(Self::KEY, None), seen);
        deleted.map_err(raw_error("floor delete"))?;
        event.map_err(raw_error("floor event"))?;
        Ok(seen_after)
    }
}

fn joined<T>(joined: Result<T, tokio::task::JoinError>) -> fencelock_core::Result<T> {
    joined.map_err(|e| fencelock_core::Error::Store {
        message: format!("a benchmark task failed: {e}"),
        source: None,
    })
}

/// CPU spent over some handoffs, client and server.
#[derive(Default)]
struct CpuSpent {
    client: Option<Duration>,
    server: Option<Duration>,
    handoffs: u32,
}

impl CpuSpent {
    fn add(
        &mut self,
        before: (Option<Duration>, Option<Duration>),
        after: (Option<Duration>, Option<Duration>),
        handoffs: usize,
    ) {
        let spent = |b: Option<Duration>, a: Option<Duration>, sum: Option<Duration>| {
            Some(sum.unwrap_or_default() + a?.saturating_sub(b?))
        };
        self.client = spent(before.0, after.0, self.client);
        self.server = spent(before.1, after.1, self.server);
        self.handoffs += u32::try_from(handoffs).unwrap_or(u32::MAX);
    }

    /// Client and server CPU per handoff together, in µs, where both were measured.
    fn total_per(&self) -> Option<f64> {
        let total = self.client? + self.server?;
        Some(us(total) / f64::from(self.handoffs.max(1)))
    }

    fn figure(&self) -> String {
        let per = |d: Option<Duration>| {
            d.map_or("not measured".into(), |d| {
                format!("{:.0} µs", us(d / self.handoffs.max(1)))
            })
        };
        format!("{} + {}", per(self.client), per(self.server))
    }
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

/// A waiter of etcd's lock service, for the handoff of `fencelock_bench::handoff`: its own
/// client and lease, `lock` until granted, `unlock`.
struct PeerWaiter {
    client: Client,
    lease: i64,
    name: String,
}

/// A client of its own and a lease kept for the whole run (60 s, past the protocol's rounds,
/// so not kept alive), for a contender written by hand; `who` names it in errors.
async fn client_with_lease(
    endpoints: &[String],
    who: &'static str,
) -> fencelock_core::Result<(Client, i64)> {
    let mut client = Client::connect(endpoints, None)
        .await
        .map_err(raw_error(who))?;
    let lease = client
        .lease_grant(60, None)
        .await
        .map_err(raw_error(who))?
        .id();
    Ok((client, lease))
}

impl PeerWaiter {
    async fn connect(endpoints: &[String], name: &str) -> fencelock_core::Result<Self> {
        let (client, lease) = client_with_lease(endpoints, "peer connect").await?;
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

/// The client-side floor of the peers' protocol: etcd's queue recipe (the steps of the Go
/// client's `concurrency.Mutex`) by hand on a kept lease. A take puts the contender's key and
/// reads the newest keys in one transaction; while an older key is there, it watches that
/// key's deletion (from the current revision, then reads it again to close the gap) and on the
/// deletion reads the newest older key again. The least a lock pays whose waiters are woken
/// over the network, as ours are when a release knows no successor to mark; etcd's `lock()`
/// runs the same wait inside the server.
///
/// `fenced` (the bench's floor): each request is ours written by hand, as the fenced floor of
/// the cycle writes them: the enqueue transaction (the offset's raise, the put, the entry, the
/// head, the two newest entries and the offset read), the release as a transaction on the
/// entry's existence, and after a deletion our read (the newest older entry, our own, the
/// entries behind ours), so it reads what our tokens are made of (the offset and the create
/// revision). Otherwise (`ETCD_BENCH_RECIPE=plain`) the recipe's own: a put and a read of the
/// two newest keys, a delete, one read, with nothing a token could be made of.
struct RecipeWaiter {
    client: Client,
    lease: i64,
    key: String,
    prefix: String,
    fenced: bool,
}

impl RecipeWaiter {
    /// The floor's name in the rows.
    fn name(fenced: bool) -> &'static str {
        if fenced {
            "fenced recipe floor"
        } else {
            "plain recipe floor"
        }
    }

    async fn connect(
        endpoints: &[String],
        prefix: &str,
        i: usize,
        fenced: bool,
    ) -> fencelock_core::Result<Self> {
        let (client, lease) = client_with_lease(endpoints, "floor connect").await?;
        Ok(RecipeWaiter {
            client,
            lease,
            key: format!("{prefix}{i:04}"),
            prefix: prefix.to_owned(),
            fenced,
        })
    }

    /// The enqueue: the key's put on the lease, then (in the same transaction, so after it)
    /// the newest keys; returns the put's revision, the new key's create revision, and the
    /// key right in front of it, if any.
    async fn enqueue(&mut self) -> fencelock_core::Result<(i64, Option<Vec<u8>>)> {
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2);
        let put = TxnOp::put(
            self.key.as_str(),
            "",
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let (txn, newest_at) = if self.fenced {
            let offset = "bench/fenced-recipe/~offset";
            let below = "0000000000000000001";
            let create = Txn::new()
                .when([Compare::version(offset, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(offset, below, None)]);
            let raise = Txn::new()
                .when([Compare::value(offset, CompareOp::Less, below)])
                .and_then([TxnOp::put(offset, below, None)])
                .or_else([TxnOp::txn(create)]);
            let head = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1);
            let txn = Txn::new().and_then([
                TxnOp::txn(raise),
                put,
                TxnOp::get(self.key.as_str(), Some(GetOptions::new().with_keys_only())),
                TxnOp::get(self.prefix.as_str(), Some(head)),
                TxnOp::get(self.prefix.as_str(), Some(newest)),
                TxnOp::get(offset, None),
            ]);
            (txn, 2)
        } else {
            let newest = newest.with_keys_only();
            let txn = Txn::new().and_then([put, TxnOp::get(self.prefix.as_str(), Some(newest))]);
            (txn, 0)
        };
        let answer = self
            .client
            .txn(txn)
            .await
            .map_err(raw_error("floor enqueue"))?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let older = gets(answer)
            .nth(newest_at)
            .and_then(|kvs| kvs.get(1).map(|kv| kv.key().to_vec()));
        Ok((revision, older))
    }

    /// The newest key of the queue older than `revision`, if any.
    async fn newest_older(&mut self, revision: i64) -> fencelock_core::Result<Option<Vec<u8>>> {
        let older = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(revision - 1)
            .with_limit(1)
            .with_keys_only();
        if !self.fenced {
            let answer = self
                .client
                .get(self.prefix.as_str(), Some(older))
                .await
                .map_err(raw_error("floor read"))?;
            return Ok(answer.kvs().first().map(|kv| kv.key().to_vec()));
        }
        let newer = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_min_create_revision(revision + 1)
            .with_limit(8)
            .with_keys_only();
        let txn = Txn::new().and_then([
            TxnOp::get(self.prefix.as_str(), Some(older)),
            TxnOp::get(self.key.as_str(), Some(GetOptions::new().with_keys_only())),
            TxnOp::get(self.prefix.as_str(), Some(newer)),
        ]);
        let answer = self
            .client
            .txn(txn)
            .await
            .map_err(raw_error("floor read"))?;
        Ok(gets(answer)
            .next()
            .and_then(|kvs| kvs.first().map(|kv| kv.key().to_vec())))
    }

    /// Waits for `older`'s deletion.
    async fn wait_deleted(&mut self, older: &[u8]) -> fencelock_core::Result<()> {
        let options =
            etcd_client::WatchOptions::new().with_filters([etcd_client::WatchFilterType::NoPut]);
        let mut stream = self
            .client
            .watch(older, Some(options))
            .await
            .map_err(raw_error("floor watch"))?;
        stream.message().await.map_err(raw_error("floor watch"))?;
        let there = self
            .client
            .get(older, Some(GetOptions::new().with_keys_only()))
            .await
            .map_err(raw_error("floor read"))?;
        if there.kvs().is_empty() {
            return Ok(());
        }
        loop {
            let Some(message) = stream.message().await.map_err(raw_error("floor event"))? else {
                return Ok(());
            };
            if !message.events().is_empty() || message.canceled() {
                return Ok(());
            }
        }
    }
}

/// The key-values of each read of a transaction's answer, in order.
fn gets(answer: etcd_client::TxnResponse) -> impl Iterator<Item = Vec<etcd_client::KeyValue>> {
    answer.op_responses().into_iter().filter_map(|op| match op {
        etcd_client::TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
        _ => None,
    })
}

#[async_trait]
impl Contender for RecipeWaiter {
    type Held = ();

    async fn take(&mut self) -> fencelock_core::Result<()> {
        let (revision, mut older) = self.enqueue().await?;
        while let Some(key) = older {
            self.wait_deleted(&key).await?;
            older = self.newest_older(revision).await?;
        }
        Ok(())
    }

    async fn give_back(&mut self, (): ()) -> fencelock_core::Result<()> {
        let key = self.key.as_str();
        let released = if self.fenced {
            let delete = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Greater, 0)])
                .and_then([TxnOp::delete(key, None)]);
            self.client.txn(delete).await.map(drop)
        } else {
            self.client.delete(key, None).await.map(drop)
        };
        released.map_err(raw_error("floor unlock"))
    }
}

/// What every scenario shares: the server, our store on it and a raw client of the same
/// library.
struct Bench {
    config: EtcdConfig,
    endpoints: Vec<String>,
    ours: DynLockStore,
    raw: Client,
    /// The server's process, whose CPU is read from /proc when it runs here.
    server_pid: Option<String>,
}

/// The raw round trips: a linearizable read, a write.
struct RoundTrips {
    read: Samples,
    write: Samples,
}

/// The raw floor, ours and etcd's lock/unlock cycles, timed in alternating rounds.
struct Cycles {
    raw_floor: Samples,
    ours: Samples,
    modes: ModeCycles,
    peer: Samples,
    peer_kept: Samples,
    fenced_floor: Samples,
}

/// The handoffs of ours, etcd's lock service and the raw floor, pooled over their rounds.
struct Handoffs {
    ours: Samples,
    peer: Samples,
    floor: Samples,
    ours_cpu: CpuSpent,
    peer_cpu: CpuSpent,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (server, url) = server_or_env(test_servers::EtcdServer::start, |s| s.url())?;
    let server_pid = server
        .as_ref()
        .and_then(|s| s.pid())
        .map(|pid| pid.to_string());
    let bench = Bench::connect(&url, server_pid).await?;
    let mut table = Table::default();
    let round_trips = bench.raw_round_trips(&mut table).await?;
    let raw_floor = bench.uncontended_cycles(&mut table).await?;
    bench.throughput(&mut table).await?;
    let handles = bench.handoff(&mut table, &round_trips).await?;
    bench.quiet_handoff(&mut table, &handles).await?;
    bench.versus_peer(&mut table, handles).await?;
    bench.held_leases(&mut table).await?;
    println!("{table}");
    println!(
        "samples: {ITERATIONS} cycles each, {HANDOFFS} handoffs; raw get p99 {:.1} µs, raw put p99 {:.1} µs, raw floor p99 {:.1} µs; keep-alive: one stream per handle",
        us(round_trips.read.p99()),
        us(round_trips.write.p99()),
        us(raw_floor.p99())
    );
    Ok(())
}

impl Bench {
    /// Connects our store and the raw client, and prints the header.
    async fn connect(url: &str, server_pid: Option<String>) -> Result<Self, Box<dyn Error>> {
        let config = EtcdConfig::from_url(url)?;
        println!("etcd store benchmark against {config}");
        let endpoints = config.endpoints().to_vec();
        let store = EtcdStore::connect(config.clone()).await?;
        let ours: DynLockStore = Arc::new(store.clone());
        let mut raw = Client::connect(&endpoints, None).await?;
        let status = raw.status().await?;
        println!(
            "server etcd {}, db {} KiB, raft term {}\n",
            status.version(),
            status.db_size() / 1024,
            status.raft_term()
        );
        Ok(Bench {
            config,
            endpoints,
            ours,
            raw,
            server_pid,
        })
    }

    fn server_cpu(&self) -> Option<Duration> {
        self.server_pid.as_deref().and_then(scale::cpu_time)
    }

    /// Raw round trips with the same client library: a linearizable read, a write.
    async fn raw_round_trips(&self, table: &mut Table) -> Result<RoundTrips, Box<dyn Error>> {
        let mut raw = self.raw.clone();
        raw.put("bench/raw/read", "x", None).await?;
        let read = time_each(ITERATIONS, |_| {
            let mut raw = raw.clone();
            async move {
                raw.get("bench/raw/read", None)
                    .await
                    .map(drop)
                    .map_err(raw_error("raw get"))
            }
        })
        .await?;
        let write = time_each(ITERATIONS, |_| {
            let mut raw = raw.clone();
            async move {
                raw.put("bench/raw/write", "x", None)
                    .await
                    .map(drop)
                    .map_err(raw_error("raw put"))
            }
        })
        .await?;
        table.latency("raw round trip: get p50", read.p50());
        table.latency("raw round trip: put p50", write.p50());
        Ok(RoundTrips { read, write })
    }

    /// The cycles of the raw floor, ours and etcd's lock/unlock; returns the raw floor's.
    async fn uncontended_cycles(&self, table: &mut Table) -> fencelock_core::Result<Samples> {
        let cycles = self.time_cycles().await?;
        cycles.rows(table);
        Ok(cycles.raw_floor)
    }

    /// The raw floor, our cycle and etcd's lock/unlock in alternating rounds, so all three see
    /// the same machine load; each warmed up first. Ours also as a semaphore permit and as a
    /// shared lease, where the store keeps them.
    async fn time_cycles(&self) -> fencelock_core::Result<Cycles> {
        let (mut raw, ours) = (self.raw.clone(), &self.ours);
        let mut modes = ModeCycles::new(&ours.capabilities());
        modes.warm_up(ours, "bench:cycle", TTL, 50).await?;
        let kept_lease = raw
            .lease_grant(TTL.as_secs() as i64 * 100, None)
            .await
            .map_err(raw_error("peer grant"))?
            .id();
        for _ in 0..50 {
            raw_cycle(&mut raw, "bench/raw/cycle").await?;
            let lease = ours.try_acquire("bench:cycle", TTL).await?;
            let _ = ours.release(&lease).await?;
            peer_cycle(&mut raw, "bench/peer/cycle").await?;
            peer_kept_cycle(&mut raw, "bench/peer/kept", kept_lease).await?;
            fenced_floor_cycle(&mut raw, "bench/fenced/q/", kept_lease).await?;
        }
        let mut fenced_samples = Vec::new();
        let (mut raw_samples, mut our_samples, mut peer_samples) =
            (Vec::new(), Vec::new(), Vec::new());
        let mut kept_samples = Vec::new();
        for _ in 0..ROUNDS {
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                raw_cycle(&mut raw, "bench/raw/cycle").await?;
                raw_samples.push(started.elapsed());
            }
            cycle_into(
                ours,
                "bench:cycle",
                TTL,
                ITERATIONS / ROUNDS,
                &mut our_samples,
            )
            .await?;
            modes
                .round(ours, "bench:cycle", TTL, ITERATIONS / ROUNDS)
                .await?;
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                peer_cycle(&mut raw, "bench/peer/cycle").await?;
                peer_samples.push(started.elapsed());
            }
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                peer_kept_cycle(&mut raw, "bench/peer/kept", kept_lease).await?;
                kept_samples.push(started.elapsed());
            }
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                fenced_floor_cycle(&mut raw, "bench/fenced/q/", kept_lease).await?;
                fenced_samples.push(started.elapsed());
            }
        }
        Ok(Cycles {
            raw_floor: Samples::new(raw_samples),
            ours: Samples::new(our_samples),
            modes,
            peer: Samples::new(peer_samples),
            peer_kept: Samples::new(kept_samples),
            fenced_floor: Samples::new(fenced_samples),
        })
    }

    /// Throughput: 16 tasks on distinct keys, raw floor and ours, one connection each side.
    async fn throughput(&self, table: &mut Table) -> fencelock_core::Result<()> {
        let raw_rate = throughput(TASKS, RUN_FOR, {
            let raw = self.raw.clone();
            move |task, _| {
                let mut raw = raw.clone();
                async move { raw_cycle(&mut raw, &format!("bench/raw/throughput/{task}")).await }
            }
        })
        .await?;
        let our_rate =
            lock_throughput(self.ours.clone(), "bench:throughput:", TTL, TASKS, RUN_FOR).await?;
        table.rate(format!("raw floor, {TASKS} tasks, distinct keys"), raw_rate);
        table
            .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
            .ratio(our_rate / raw_rate, None);
        Ok(())
    }

    /// Handoff with 8 waiters on one key, ours against etcd's lock service and the raw floor;
    /// returns our waiters' handles, for the later scenarios.
    async fn handoff(
        &self,
        table: &mut Table,
        round_trips: &RoundTrips,
    ) -> fencelock_core::Result<Vec<DynLockStore>> {
        let mut handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            handles.push(Arc::new(EtcdStore::connect(self.config.clone()).await?));
        }
        let handoffs = self.time_handoffs(&handles).await?;
        handoffs.rows(table, round_trips);
        Ok(handles)
    }

    /// Handoff: 8 waiters on one key, each with its own handle (connection); ours and etcd's
    /// lock service in alternating rounds, so both see the same machine load, and the raw
    /// floor (a delete seen by another client's watch) between them.
    async fn time_handoffs(&self, handles: &[DynLockStore]) -> fencelock_core::Result<Handoffs> {
        let client_cpu = || scale::cpu_time("self");
        let (mut ours_rounds, mut peer_rounds, mut floor_rounds) =
            (Vec::new(), Vec::new(), Vec::new());
        // CPU spent during each side's rounds: (client, server).
        let mut ours_cpu = CpuSpent::default();
        let mut peer_cpu = CpuSpent::default();
        // Each round on keys of its own: the waiters a round ends with are aborted, and whatever
        // they leave queued must not stand in front of the next round.
        for round in 0..HANDOFF_ROUNDS {
            let per_round = HANDOFFS / HANDOFF_ROUNDS;
            let key = format!("bench:handoff:{round}");
            let before = (client_cpu(), self.server_cpu());
            ours_rounds.push(handoff(handles.to_vec(), &key, TTL, per_round).await?);
            ours_cpu.add(before, (client_cpu(), self.server_cpu()), per_round);
            let mut peers = Vec::new();
            for _ in 0..WAITERS {
                let name = format!("bench/peer/handoff/{round}");
                peers.push(PeerWaiter::connect(&self.endpoints, &name).await?);
            }
            let before = (client_cpu(), self.server_cpu());
            peer_rounds.push(handoff_between(peers, per_round, Handoff::AnyWaiter).await?);
            peer_cpu.add(before, (client_cpu(), self.server_cpu()), per_round);
            floor_rounds.push(raw_handoff_floor(&self.endpoints, per_round).await?);
        }
        Ok(Handoffs {
            ours: pooled(&ours_rounds),
            peer: pooled(&peer_rounds),
            floor: pooled(&floor_rounds),
            ours_cpu,
            peer_cpu,
        })
    }

    /// The same handoffs one at a time, nothing else running: ours (a handoff mark), etcd's
    /// lock service, the raw floor, alternating.
    async fn quiet_handoff(
        &self,
        table: &mut Table,
        handles: &[DynLockStore],
    ) -> fencelock_core::Result<()> {
        let (mut quiet_ours, mut quiet_peer, mut quiet_floor) =
            (Vec::new(), Vec::new(), Vec::new());
        let mut holder = PeerWaiter::connect(&self.endpoints, "bench/peer/quiet").await?;
        let mut waiter = PeerWaiter::connect(&self.endpoints, "bench/peer/quiet").await?;
        let mut quiet = QuietFloor::connect(&self.endpoints).await?;
        for i in 0..QUIET_HANDOFFS {
            quiet_ours.push(quiet_handoff(handles, &format!("bench:quiet:{i}")).await?);
            quiet_peer.push(quiet_peer_handoff(&mut holder, &mut waiter).await?);
            quiet_floor.push(quiet.sample().await?);
        }
        let (quiet_ours, quiet_peer, quiet_floor) = (
            Samples::new(quiet_ours),
            Samples::new(quiet_peer),
            Samples::new(quiet_floor),
        );
        drop((holder, waiter, quiet));
        table
            .latency(
                "quiet handoff p50, one waiter at a time: ours (a mark)",
                quiet_ours.p50(),
            )
            .ratio(us(quiet_ours.p50()) / us(quiet_floor.p50()), None);
        table
            .latency("quiet handoff p50: lock service", quiet_peer.p50())
            .ratio(us(quiet_peer.p50()) / us(quiet_floor.p50()), None);
        table.latency("quiet handoff p50: raw floor", quiet_floor.p50());
        table.push(
            "quiet handoff p50 ours / lock service",
            format!("{:.2}", us(quiet_ours.p50()) / us(quiet_peer.p50())),
        );
        Ok(())
    }

    /// The peers' protocol (8 contenders on one key, hold 1 ms, pause 30 ms): ours against
    /// etcd's lock(), in interleaved rounds. Our handles are dropped after it.
    async fn versus_peer(
        &self,
        table: &mut Table,
        handles: Vec<DynLockStore>,
    ) -> fencelock_core::Result<()> {
        let mut peers = Vec::new();
        for _ in 0..PEERS_CONTENDERS {
            peers.push(PeerWaiter::connect(&self.endpoints, "bench/peer/protocol").await?);
        }
        let fenced = std::env::var("ETCD_BENCH_RECIPE").map_or(true, |recipe| recipe != "plain");
        let mut floor = Vec::new();
        for i in 0..PEERS_CONTENDERS {
            let prefix = "bench/floor/protocol/";
            floor.push(RecipeWaiter::connect(&self.endpoints, prefix, i, fenced).await?);
        }
        let ours_in_protocol = store_contenders(
            handles[..PEERS_CONTENDERS].to_vec(),
            "bench:protocol",
            TTL,
            Duration::from_secs(60),
        );
        let protocol = PeersProtocol::HARNESS
            .run_with_floor(ours_in_protocol, peers, floor)
            .await?;
        drop(handles);
        let floor = RecipeWaiter::name(fenced);
        protocol.rows_with_floor(table, "etcd's lock()", 1.0, floor);
        protocol.handoff_rows_with_floor(table, "etcd's lock()", Some(1.0), floor);
        Ok(())
    }

    /// Many locks held at once on one handle, each kept alive (one keep-alive stream).
    async fn held_leases(&self, table: &mut Table) -> fencelock_core::Result<()> {
        let held_count = std::env::var("ETCD_BENCH_HELD")
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(HELD);
        let ports: Vec<u16> = self
            .endpoints
            .iter()
            .filter_map(|e| e.rsplit(':').next()?.parse().ok())
            .collect();
        let metrics =
            (!self.config.to_string().starts_with("etcds:")).then(|| self.endpoints[0].clone());
        let held = scale::hold(
            || EtcdStore::connect(self.config.clone()),
            "bench:held:",
            held_count,
            HELD_TTL,
            HELD_IN_FLIGHT,
            &ports,
            metrics.as_deref(),
        )
        .await?;
        held_rows(table, &held);
        Ok(())
    }
}

impl Cycles {
    /// The cycle rows: the raw floor, ours and its modes, etcd's lock/unlock and the fenced
    /// floor, each against the raw floor.
    fn rows(&self, table: &mut Table) {
        let (raw_floor, ours) = (&self.raw_floor, &self.ours);
        let (peer, peer_kept, fenced_floor) = (&self.peer, &self.peer_kept, &self.fenced_floor);
        table.latency(
            "raw floor: lease grant + txn put + delete p50",
            raw_floor.p50(),
        );
        let ratio = us(ours.p50()) / us(raw_floor.p50());
        table
            .latency("ours: try_acquire + release p50", ours.p50())
            .ratio(ratio, Some(("≤ 1.2× raw floor", ratio <= 1.2)));
        table.latency("ours: try_acquire + release p99", ours.p99());
        self.modes
            .rows(table, "ours: ", Some(raw_floor.p50()), None);
        table
            .latency("peer: grant + lock() + unlock() p50", peer.p50())
            .ratio(us(peer.p50()) / us(raw_floor.p50()), None);
        table.latency("peer: grant + lock() + unlock() p99", peer.p99());
        table
            .latency(
                "peer on a kept lease: lock() + unlock() p50",
                peer_kept.p50(),
            )
            .ratio(us(peer_kept.p50()) / us(raw_floor.p50()), None);
        table.latency(
            "peer on a kept lease: lock() + unlock() p99",
            peer_kept.p99(),
        );
        let versus_kept = us(ours.p50()) / us(peer_kept.p50());
        table
            .latency(
                "fenced floor: our enqueue txn by hand + delete, kept lease p50",
                fenced_floor.p50(),
            )
            .ratio(us(fenced_floor.p50()) / us(raw_floor.p50()), None);
        let fenced_versus_kept = us(fenced_floor.p50()) / us(peer_kept.p50());
        table.push(
            "  fenced floor / lock() + unlock() on a kept lease",
            format!("{fenced_versus_kept:.2}"),
        );
        table.push(
            "  ours / fenced floor",
            format!("{:.2}", us(ours.p50()) / us(fenced_floor.p50())),
        );
        table
            .push(
                "cycle p50 ours / lock() + unlock() on a kept lease",
                format!("{versus_kept:.2}"),
            )
            .target = Some((
            if fenced_versus_kept > 1.0 {
                "≤ 1.0× etcd's lock() + unlock() (out of reach of the fenced floor in this run, above)"
                    .into()
            } else {
                "≤ 1.0× etcd's lock() + unlock()".into()
            },
            versus_kept <= 1.0,
        ));
    }
}

impl Handoffs {
    /// The handoff rows: ours and the lock service's against the raw round trips and each
    /// other, the raw floor, and the CPU each spends per handoff.
    fn rows(&self, table: &mut Table, round_trips: &RoundTrips) {
        let (handoffs, peer_handoffs) = (&self.ours, &self.peer);
        let handoff_reads = us(handoffs.p50()) / us(round_trips.read.p50());
        table
            .latency(format!("handoff p50, {WAITERS} waiters"), handoffs.p50())
            .ratio(
                handoff_reads,
                Some(("p50 ≤ 3 raw round trips (get)", handoff_reads <= 3.0)),
            );
        table.latency(format!("handoff p99, {WAITERS} waiters"), handoffs.p99());
        table.push(
            "handoff p50 in raw writes (put)",
            format!("{:.2}", us(handoffs.p50()) / us(round_trips.write.p50())),
        );
        table
            .latency(
                format!("peer handoff p50, {WAITERS} waiters (lock/unlock)"),
                peer_handoffs.p50(),
            )
            .ratio(us(peer_handoffs.p50()) / us(round_trips.read.p50()), None);
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
                self.floor.p50(),
            )
            .ratio(us(handoffs.p50()) / us(self.floor.p50()), None);
        table.push(
            "  CPU per handoff, ours: client + etcd",
            self.ours_cpu.figure(),
        );
        table.push(
            "  CPU per handoff, lock service: client + etcd",
            self.peer_cpu.figure(),
        );
        // The lock service's waiters wait inside the server; ours pay, per wait, the enqueue
        // transaction, a watch stream with two watches and (often) a re-read over the network.
        // On a machine whose cores the handoff loop saturates, latency follows this.
        if let Some((ours, peer)) = self.ours_cpu.total_per().zip(self.peer_cpu.total_per()) {
            table.push(
                "  extra CPU per handoff, ours − lock service (waits over the network)",
                format!("{:.0} µs", ours - peer),
            );
        }
    }
}

/// The rows of the locks held with keep-alive: none lost, the connections and streams they
/// need (constant), the memory per lock, and the extends while they are kept alive.
fn held_rows(table: &mut Table, held: &scale::Held) {
    let n = held.count;
    table
        .push(
            format!("{n} locks held with keep-alive on one handle, TTL {HELD_TTL:?}, for 3 TTLs"),
            format!("{} lost", held.lost),
        )
        .target = Some((format!("{n} held, none lost"), held.lost == 0));
    let constant = |range: Option<(u64, u64)>| match range {
        Some((lo, hi)) if lo == hi => format!("{lo} (constant)"),
        Some((lo, hi)) => format!("{lo}–{hi} (NOT constant)"),
        None => "not measured".into(),
    };
    table.push(
        "  client TCP connections to etcd while held",
        format!(
            "{}; {} before the handle",
            constant(held.connections),
            held.connections_before
                .map_or("not measured".into(), |c| c.to_string())
        ),
    );
    let measured = |c: Option<u64>| c.map_or("not measured".into(), |c| c.to_string());
    table.push(
        "  keep-alive streams open on the server while held",
        format!(
            "{}; {} before the handle, {} started by it, {} started while held",
            constant(held.streams_open),
            measured(held.streams_open_before),
            measured(held.streams_started),
            measured(held.streams_started_while_held),
        ),
    );
    table.push(
        "  watch streams open on the server while held",
        constant(held.watch_streams_open),
    );
    // The open count also falls when a stream of an earlier part of the run closes late; the
    // handle's own streams are constant when it started none while holding.
    let held_constant = held.connections.is_some_and(|(lo, hi)| lo == hi)
        && held.streams_started_while_held == Some(0);
    table
        .push(
            "  connections constant, no keep-alive stream started while held",
            if held_constant { "yes" } else { "no" }.into(),
        )
        .target = Some(("constant".into(), held_constant));
    table.push(
        "  client memory per held lock: heap live / RSS growth",
        format!("{:.0} B / {:.0} B", held.heap_per_lock, held.rss_per_lock),
    );
    table.push(
        format!("  time to acquire {n} ({HELD_IN_FLIGHT} in flight)"),
        format!("{:.0} ms", held.acquired_in.as_secs_f64() * 1e3),
    );
    table.latency("  extend p50 while they are kept alive", held.extends.p50());
    table.latency("  extend p99 while they are kept alive", held.extends.p99());
    table.push(
        "  extends of one more lock that failed and would be retried",
        format!(
            "{} of {}",
            held.extends_failed,
            held.extends.len() + held.extends_failed
        ),
    );
}
