//! The PostgreSQL store against the raw SQL it is built on, measured in one run from one client.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench postgres
//! ```
//!
//! Starts its own server with test-servers, or uses `LOCK_BENCH_URL` if set. Prints one table:
//! the raw floor (the same client running `pg_try_advisory_lock` + the fence upsert +
//! `pg_advisory_unlock` as three plain statements), our acquire + release cycle and its ratio
//! (and the same cycle as a permit of a semaphore of 4 and as a shared lease, where the store
//! keeps them),
//! sqlx's `PgAdvisoryLock` cycle (no fencing token), throughput with 16 tasks on distinct keys
//! against 16 raw connections doing the same, handoff latency with 8 waiters on one key
//! (against raw waiters that bump the fence durably after `pg_advisory_lock`, the bare
//! `pg_advisory_lock` handoff, sqlx's `PgAdvisoryLock`, and the fenced floor: the lock and an
//! unsynced fence upsert as one statement, in rounds alternating with ours, target ours ≤ 1.1×
//! it), the peers' protocol (8 contenders on one key, each holding 1 ms and pausing 30 ms after
//! each release: the acquire latency's p50, mean and p99 and the release-to-grant handoff, ours
//! against sqlx's `PgAdvisoryLock`, a session per contender, and the fenced floor, in
//! interleaved rounds; target ours ≤ 1.1× the fenced floor), and 500 leases held at
//! once with keep-alive on one store handle, with the connection count.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_bench::{
    cycle, cycle_into, handoff, handoff_between, hold_kept_alive, lock_throughput, micros as us,
    server_or_env, store_contenders, throughput, time_each, Contender, Handoff, ModeCycles,
    PeersProtocol, Samples, Table, PEERS_CONTENDERS,
};
use fencelock_core::DynLockStore;
use fencelock_postgres::{PostgresConfig, PostgresStore};
use sqlx::postgres::{PgAdvisoryLock, PgAdvisoryLockGuard, PgAdvisoryLockKey};
use sqlx::{Connection, PgConnection, Row};
use tokio::time::Instant;

#[path = "postgres_common/floor.rs"]
mod floor;
use floor::{RAW_LOCK_AND_BUMP, RAW_UNLOCK};

const ITERATIONS: usize = 2000;
const ROUNDS: usize = 20;
const TASKS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 8;
const HANDOFFS: usize = 400;
/// Rounds the handoff of ours and of the fenced floor alternate in.
const HANDOFF_ROUNDS: usize = 4;
const HELD: usize = 500;
const HELD_TTL: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(30);
/// The peer in the peers' protocol.
const SQLX_PEER: &str = "sqlx PgAdvisoryLock";
/// The floor in the peers' protocol: a grant's least work.
const FENCED_FLOOR: &str = "the fenced floor";

/// The raw floor: the same three steps as an acquire + release, as plain statements.
const RAW_TRY: &str = "SELECT pg_try_advisory_lock($1)";
const RAW_BUMP: &str = "INSERT INTO public.fencelock_fence AS f
        (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at)
    VALUES ('bench-raw', $2, $1, 2, 3, floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8,
            'raw', pg_backend_pid(), 0, clock_timestamp())
    ON CONFLICT (namespace, key) DO UPDATE
       SET token = GREATEST(f.token + 1, EXCLUDED.token)
    RETURNING f.token";

async fn raw_cycle(conn: &mut PgConnection, id: i64) -> fencelock_core::Result<()> {
    let locked: bool = sqlx::query(RAW_TRY)
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .map_err(raw_failed)?;
    if !locked {
        return Err(fencelock_core::Error::Busy {
            key: id.to_string(),
        });
    }
    sqlx::query(RAW_BUMP)
        .bind(id)
        .bind(id.to_be_bytes().to_vec())
        .fetch_one(&mut *conn)
        .await
        .map_err(raw_failed)?;
    sqlx::query(RAW_UNLOCK)
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .map_err(raw_failed)?;
    Ok(())
}

/// A raw connection as a waiter in `fencelock_bench::handoff_between`: it blocks in
/// `pg_advisory_lock`, then bumps the fence as a separate statement; the same measurement as
/// `fencelock_bench::handoff`.
struct RawWaiter {
    conn: PgConnection,
    id: i64,
    /// Whether it bumps the fence after the lock (`false`: the bare `pg_advisory_lock` handoff).
    bump: bool,
    /// Whether the lock and the bump are one statement ([`RAW_LOCK_AND_BUMP`]).
    one_statement: bool,
}

impl RawWaiter {
    /// `count` waiters on the key `id`, a connection each, taking the lock as a statement of
    /// its own.
    async fn connect_many(
        url: &str,
        count: usize,
        id: i64,
        bump: bool,
    ) -> Result<Vec<Self>, sqlx::Error> {
        let mut waiters = Vec::with_capacity(count);
        for _ in 0..count {
            waiters.push(RawWaiter {
                conn: PgConnection::connect(url).await?,
                id,
                bump,
                one_statement: false,
            });
        }
        Ok(waiters)
    }
}

#[async_trait]
impl Contender for RawWaiter {
    type Held = ();

    async fn take(&mut self) -> fencelock_core::Result<()> {
        if self.one_statement {
            return sqlx::query(RAW_LOCK_AND_BUMP)
                .bind(self.id)
                .bind(self.id.to_be_bytes().to_vec())
                .fetch_one(&mut self.conn)
                .await
                .map(drop)
                .map_err(raw_failed);
        }
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(self.id)
            .execute(&mut self.conn)
            .await
            .map_err(raw_failed)?;
        if self.bump {
            sqlx::query(RAW_BUMP)
                .bind(self.id)
                .bind(self.id.to_be_bytes().to_vec())
                .fetch_one(&mut self.conn)
                .await
                .map_err(raw_failed)?;
        }
        Ok(())
    }

    async fn give_back(&mut self, (): ()) -> fencelock_core::Result<()> {
        sqlx::query(RAW_UNLOCK)
            .bind(self.id)
            .execute(&mut self.conn)
            .await
            .map(drop)
            .map_err(raw_failed)
    }
}

/// sqlx's `PgAdvisoryLock` on a connection of its own: the lock a Rust user of PostgreSQL
/// would otherwise pick (a blocking `pg_advisory_lock`, no fencing token).
struct SqlxWaiter {
    /// Leaked once per waiter: the guard borrows its lock, and a contender's hold outlives
    /// any borrow of the waiter.
    lock: &'static PgAdvisoryLock,
    conn: Option<PgConnection>,
}

impl SqlxWaiter {
    async fn connect_many(url: &str, count: usize, id: i64) -> Result<Vec<Self>, sqlx::Error> {
        let mut waiters = Vec::with_capacity(count);
        for _ in 0..count {
            waiters.push(SqlxWaiter {
                lock: Box::leak(Box::new(PgAdvisoryLock::with_key(
                    PgAdvisoryLockKey::BigInt(id),
                ))),
                conn: Some(PgConnection::connect(url).await?),
            });
        }
        Ok(waiters)
    }

    fn conn(&mut self) -> fencelock_core::Result<PgConnection> {
        self.conn
            .take()
            .ok_or_else(|| fencelock_core::Error::store("sqlx waiter", "no connection"))
    }
}

#[async_trait]
impl Contender for SqlxWaiter {
    type Held = PgAdvisoryLockGuard<'static, PgConnection>;

    async fn take(&mut self) -> fencelock_core::Result<Self::Held> {
        let conn = self.conn()?;
        self.lock.acquire(conn).await.map_err(raw_failed)
    }

    async fn give_back(&mut self, held: Self::Held) -> fencelock_core::Result<()> {
        self.conn = Some(held.release_now().await.map_err(raw_failed)?);
        Ok(())
    }
}

/// `count` waiters that take the lock and bump the fence in one statement
/// ([`RAW_LOCK_AND_BUMP`]) on sessions with synchronous_commit = off: a grant's least work.
async fn fenced_floor_waiters(
    url: &str,
    count: usize,
    id: i64,
) -> Result<Vec<RawWaiter>, sqlx::Error> {
    let mut waiters = Vec::with_capacity(count);
    for _ in 0..count {
        let mut conn = PgConnection::connect(url).await?;
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut conn)
            .await?;
        waiters.push(RawWaiter {
            conn,
            id,
            bump: true,
            one_statement: true,
        });
    }
    Ok(waiters)
}

fn raw_failed(e: sqlx::Error) -> fencelock_core::Error {
    fencelock_core::Error::store("raw statement", e)
}

/// What every scenario shares: the server's URL, our store, an admin connection and one raw
/// connection.
struct Bench {
    url: String,
    config: PostgresConfig,
    ours: DynLockStore,
    admin: PgConnection,
    /// Shared with each timed call through a mutex (uncontended).
    raw: Arc<tokio::sync::Mutex<PgConnection>>,
}

/// The raw round trips on one connection, the fence upsert alone (durable and unsynced) and
/// a connection's opening, which later scenarios are measured against.
struct RoundTrips {
    select_one: Samples,
    raw_upsert: Samples,
    unsynced_upsert: Samples,
    connects: Samples,
    /// The unsynced upsert's connection, left open for the rest of the run like the others.
    _unsynced: Arc<tokio::sync::Mutex<PgConnection>>,
}

impl RoundTrips {
    /// A grant writes the fence (unsynced at the clock), so it cannot be faster than a bare
    /// handoff plus that write; the bare handoff's own round trip already carries the reply.
    fn floor_over(&self, bare: Duration) -> f64 {
        (us(bare) + us(self.unsynced_upsert.p50()) - us(self.select_one.p50())) / us(bare)
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (_server, url) = server_or_env(test_servers::PostgresServer::start, |s| s.url())?;
    let mut bench = Bench::connect(url).await?;
    let mut table = Table::default();
    let round_trips = bench.raw_round_trips(&mut table).await?;
    let raw_floor = bench.uncontended_cycles(&mut table).await?;
    bench.throughput(&mut table).await?;
    let handles = bench.handoff(&mut table, &round_trips).await?;
    bench.versus_peer(&mut table, handles).await?;
    bench.held_leases(&mut table).await?;
    table.latency("  opening one connection p50", round_trips.connects.p50());
    println!("{table}");
    println!(
        "samples: {} cycles each, {HANDOFFS} handoffs; raw SELECT 1 p99 {:.1} µs, raw floor p99 {:.1} µs",
        ITERATIONS,
        us(round_trips.select_one.p99()),
        us(raw_floor.p99())
    );
    Ok(())
}

impl Bench {
    /// Connects our store, the admin and the raw connections, and prints the header.
    async fn connect(url: String) -> Result<Self, Box<dyn Error>> {
        let config = PostgresConfig::from_url(&url)?;
        println!("PostgreSQL store benchmark against {config}");
        let store = PostgresStore::connect(config.clone()).await?;
        let ours: DynLockStore = Arc::new(store.clone());
        let mut admin = PgConnection::connect(&url).await?;
        let version: String = sqlx::query("SHOW server_version")
            .fetch_one(&mut admin)
            .await?
            .get(0);
        let sync: String = sqlx::query(
            "SELECT current_setting('fsync') || '/' || current_setting('synchronous_commit')",
        )
        .fetch_one(&mut admin)
        .await?
        .get(0);
        println!("server {version}, fsync/synchronous_commit = {sync}\n");
        let raw = Arc::new(tokio::sync::Mutex::new(PgConnection::connect(&url).await?));
        Ok(Bench {
            url,
            config,
            ours,
            admin,
            raw,
        })
    }

    /// Raw round trips on one connection: `SELECT 1`, the fence upsert (durable, then
    /// unsynced) and opening a connection.
    async fn raw_round_trips(&self, table: &mut Table) -> Result<RoundTrips, Box<dyn Error>> {
        let select_one = time_each(ITERATIONS, |_| {
            let raw = self.raw.clone();
            async move {
                sqlx::query("SELECT 1")
                    .fetch_one(&mut *raw.lock().await)
                    .await
                    .map(drop)
                    .map_err(|e| fencelock_core::Error::store("SELECT 1", e))
            }
        })
        .await?;
        let raw_upsert = upserts(&self.raw, 434_343, "raw upsert").await?;
        // The same upsert committed without waiting for the WAL flush, as our grants at the
        // clock commit: on a connection whose session says synchronous_commit = off.
        let mut unsynced = PgConnection::connect(&self.url).await?;
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut unsynced)
            .await?;
        let unsynced = Arc::new(tokio::sync::Mutex::new(unsynced));
        let unsynced_upsert = upserts(&unsynced, 434_344, "raw unsynced upsert").await?;
        let connects = time_each(50, |_| {
            let url = self.url.clone();
            async move {
                let conn = PgConnection::connect(&url)
                    .await
                    .map_err(|e| fencelock_core::Error::store("connect", e))?;
                conn.close()
                    .await
                    .map_err(|e| fencelock_core::Error::store("close", e))
            }
        })
        .await?;
        table.latency("raw round trip (SELECT 1) p50", select_one.p50());
        Ok(RoundTrips {
            select_one,
            raw_upsert,
            unsynced_upsert,
            connects,
            _unsynced: unsynced,
        })
    }

    /// The raw floor and our cycle (the loop of `fencelock_bench::cycle`) in alternating
    /// rounds, so both see the same machine load; warmed up first. Ours also as a semaphore
    /// permit and as a shared lease, where the store keeps them, and on a new key per cycle.
    /// Returns the raw floor.
    async fn uncontended_cycles(&self, table: &mut Table) -> fencelock_core::Result<Samples> {
        let ours = &self.ours;
        cycle(ours, "bench:cycle", TTL, 100).await?;
        let mut modes = ModeCycles::new(&ours.capabilities());
        modes.warm_up(ours, "bench:cycle", TTL, 100).await?;
        let (mut raw_samples, mut our_samples) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let mut conn = self.raw.lock().await;
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                raw_cycle(&mut conn, 424_242).await?;
                raw_samples.push(started.elapsed());
            }
            drop(conn);
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
        }
        let raw_floor = Samples::new(raw_samples);
        let our_cycles = Samples::new(our_samples);
        let sqlx_cycles = self.sqlx_cycles().await?;
        let new_keys = self.new_key_per_cycle().await?;

        table.latency(
            "raw floor: try_lock + fence upsert + unlock p50",
            raw_floor.p50(),
        );
        let ratio = us(our_cycles.p50()) / us(raw_floor.p50());
        table
            .latency("ours: try_acquire + release p50", our_cycles.p50())
            .ratio(ratio, Some(("≤ 1.2× raw floor", ratio <= 1.2)));
        table.latency("ours: try_acquire + release p99", our_cycles.p99());
        table
            .latency(
                "sqlx PgAdvisoryLock: try_acquire + release_now p50 (no fencing token)",
                sqlx_cycles.p50(),
            )
            .ratio(us(sqlx_cycles.p50()) / us(raw_floor.p50()), None);
        table.push(
            "  ours / sqlx PgAdvisoryLock, cycle p50",
            format!("{:.2}", us(our_cycles.p50()) / us(sqlx_cycles.p50())),
        );
        modes.rows(table, "ours: ", Some(raw_floor.p50()), None);
        table
            .latency("ours: a new key per cycle p50", new_keys.p50())
            .ratio(us(new_keys.p50()) / us(raw_floor.p50()), None);
        table
            .latency("ours: a new key per cycle p99", new_keys.p99())
            .ratio(us(new_keys.p99()) / us(raw_floor.p99()), None);
        Ok(raw_floor)
    }

    /// sqlx's `PgAdvisoryLock`: `try_acquire` + `release_now` on one kept connection.
    async fn sqlx_cycles(&self) -> fencelock_core::Result<Samples> {
        let lock = PgAdvisoryLock::with_key(PgAdvisoryLockKey::BigInt(424_243));
        let mut conn = PgConnection::connect(&self.url).await.map_err(raw_failed)?;
        let mut samples = Vec::with_capacity(ITERATIONS);
        for i in 0..ITERATIONS + 100 {
            let started = Instant::now();
            let guard = match lock.try_acquire(conn).await.map_err(raw_failed)? {
                sqlx::Either::Left(guard) => guard,
                sqlx::Either::Right(_) => {
                    return Err(fencelock_core::Error::store(
                        "sqlx cycle",
                        "the key was held",
                    ))
                }
            };
            conn = guard.release_now().await.map_err(raw_failed)?;
            // The first hundred warm the connection up.
            if i >= 100 {
                samples.push(started.elapsed());
            }
        }
        Ok(Samples::new(samples))
    }

    /// The per-entity pattern: a key never locked before in every cycle (its fence row is
    /// inserted, then removed in the background once idle for the retention window).
    async fn new_key_per_cycle(&self) -> fencelock_core::Result<Samples> {
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        time_each(ITERATIONS, |i| {
            let (store, key) = (self.ours.clone(), format!("bench:new-key:{run}:{i}"));
            async move {
                let lease = store.try_acquire(&key, TTL).await?;
                store.release(&lease).await.map(drop)
            }
        })
        .await
    }

    /// Throughput: 16 tasks on distinct keys, raw (one connection per task) and ours (one
    /// handle).
    async fn throughput(&self, table: &mut Table) -> Result<(), Box<dyn Error>> {
        let mut raw_conns = Vec::new();
        for _ in 0..TASKS {
            raw_conns.push(Arc::new(tokio::sync::Mutex::new(
                PgConnection::connect(&self.url).await?,
            )));
        }
        let raw_rate = throughput(TASKS, RUN_FOR, move |task, _| {
            let conn = raw_conns[task].clone();
            async move { raw_cycle(&mut *conn.lock().await, 1_000_000 + task as i64).await }
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

    /// Handoff: 8 waiters on one key, raw connections and then our handles. Returns our
    /// handles, for the peers' protocol.
    async fn handoff(
        &self,
        table: &mut Table,
        round_trips: &RoundTrips,
    ) -> Result<Vec<DynLockStore>, Box<dyn Error>> {
        let raw_waiters = RawWaiter::connect_many(&self.url, WAITERS, 5_555_555, true).await?;
        let raw_handoffs = handoff_between(raw_waiters, HANDOFFS, Handoff::AnyWaiter).await?;
        let bare_waiters = RawWaiter::connect_many(&self.url, WAITERS, 5_555_556, false).await?;
        let bare_handoffs = handoff_between(bare_waiters, HANDOFFS, Handoff::AnyWaiter).await?;
        let sqlx_waiters = SqlxWaiter::connect_many(&self.url, WAITERS, 5_555_560).await?;
        let sqlx_handoffs = handoff_between(sqlx_waiters, HANDOFFS, Handoff::AnyWaiter).await?;
        let mut handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            handles.push(Arc::new(PostgresStore::connect(self.config.clone()).await?));
        }
        // Ours and the fenced floor in alternating rounds, so both see the same load.
        let (mut ours, mut floor) = (Vec::new(), Vec::new());
        for _ in 0..HANDOFF_ROUNDS {
            let per_round = HANDOFFS / HANDOFF_ROUNDS;
            let waiters = fenced_floor_waiters(&self.url, WAITERS, 5_555_561).await?;
            floor.push(handoff_between(waiters, per_round, Handoff::AnyWaiter).await?);
            ours.push(handoff(handles.clone(), "bench:handoff", TTL, per_round).await?);
        }
        let handoffs = Samples::merged(ours);
        let floor_handoffs = Samples::merged(floor);
        handoff_rows(
            table,
            round_trips,
            &raw_handoffs,
            &bare_handoffs,
            &handoffs,
            &floor_handoffs,
        );
        table
            .latency(
                format!("sqlx PgAdvisoryLock handoff p50, {WAITERS} waiters (no fencing token)"),
                sqlx_handoffs.p50(),
            )
            .ratio(us(handoffs.p50()) / us(sqlx_handoffs.p50()), None);
        Ok(handles)
    }

    /// The peers' protocol (8 contenders on one key, hold 1 ms, pause 30 ms): ours against
    /// sqlx's `PgAdvisoryLock` (a session per contender) and the fenced floor (the blocking
    /// lock and an unsynced fence upsert, one statement), in interleaved rounds. Our handles
    /// are dropped after it.
    async fn versus_peer(
        &self,
        table: &mut Table,
        handles: Vec<DynLockStore>,
    ) -> Result<(), Box<dyn Error>> {
        let sqlx_contenders =
            SqlxWaiter::connect_many(&self.url, PEERS_CONTENDERS, 5_555_557).await?;
        let floor_contenders = fenced_floor_waiters(&self.url, PEERS_CONTENDERS, 5_555_558).await?;
        let protocol = PeersProtocol::HARNESS
            .run_with_floor(
                store_contenders(
                    handles[..PEERS_CONTENDERS].to_vec(),
                    "bench:protocol",
                    TTL,
                    Duration::from_secs(60),
                ),
                sqlx_contenders,
                floor_contenders,
            )
            .await?;
        drop(handles);
        protocol.rows_with_floor(table, SQLX_PEER, 1.2, FENCED_FLOOR);
        if let Some(floor) = &protocol.floor {
            let ratio = us(protocol.ours.p50()) / us(floor.p50());
            table
                .push(
                    format!("  peers' protocol acquire p50 ours / {FENCED_FLOOR}"),
                    format!("{ratio:.2}"),
                )
                .ratio(
                    ratio,
                    Some((&format!("≤ 1.1× {FENCED_FLOOR}"), ratio <= 1.1)),
                );
        }
        protocol.handoff_rows(table, SQLX_PEER, None);
        Ok(())
    }

    /// 500 leases held at once on one handle, kept alive, with the connections they take.
    async fn held_leases(&mut self, table: &mut Table) -> Result<(), Box<dyn Error>> {
        let held_store = Arc::new(PostgresStore::connect(self.config.clone()).await?);
        let mut held = hold_kept_alive(&held_store, "bench:held:", HELD, HELD_TTL).await?;
        let lost = held.lost();
        let store_connections = held_store.open_connections();
        let store_idle = held_store.idle_connections();
        let server_connections: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fencelock'",
        )
        .fetch_one(&mut self.admin)
        .await?
        .get(0);
        let busy: i64 =
            sqlx::query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
                .fetch_one(&mut self.admin)
                .await?
                .get(0);
        let memory = held_session_memory(&mut self.admin).await;
        held.release(&*held_store).await?;

        table
            .push(
                format!("{HELD} leases held with keep-alive, TTL {HELD_TTL:?}, for 3 TTLs"),
                format!("{} lost", lost),
            )
            .target = Some((format!("{HELD} held, none lost"), lost == 0));
        table.push(
            "  connections: this handle's (held + idle) / all fencelock ones",
            format!(
                "{} + {store_idle} / {server_connections}",
                store_connections - store_idle
            ),
        );
        table.push("  advisory locks granted on the server", format!("{busy}"));
        table.push(
            format!("  time to acquire {HELD} (one at a time)"),
            format!("{:.0} ms", held.acquired_in.as_secs_f64() * 1e3),
        );
        table.latency("  extend p50 while they are kept alive", held.extends.p50());
        table.latency("  extend p99 while they are kept alive", held.extends.p99());
        table.push("  server memory per held session (PSS)", memory);
        Ok(())
    }
}

/// `ITERATIONS` fence upserts of the key `id` on `conn`.
async fn upserts(
    conn: &Arc<tokio::sync::Mutex<PgConnection>>,
    id: i64,
    what: &'static str,
) -> fencelock_core::Result<Samples> {
    time_each(ITERATIONS, |_| {
        let conn = conn.clone();
        async move {
            sqlx::query(RAW_BUMP)
                .bind(id)
                .bind(id.to_be_bytes().to_vec())
                .fetch_one(&mut *conn.lock().await)
                .await
                .map(drop)
                .map_err(|e| fencelock_core::Error::store(what, e))
        }
    })
    .await
}

/// The handoff rows: the raw fence upsert, the raw handoffs and ours against them, and the
/// floor a fence write sets.
fn handoff_rows(
    table: &mut Table,
    round_trips: &RoundTrips,
    raw_handoffs: &Samples,
    bare_handoffs: &Samples,
    handoffs: &Samples,
    floor_handoffs: &Samples,
) {
    let (select_one, raw_upsert) = (&round_trips.select_one, &round_trips.raw_upsert);
    table.latency(
        "raw fence upsert alone (durable commit) p50",
        raw_upsert.p50(),
    );
    table.latency(
        format!("raw handoff p50, {WAITERS} waiters (pg_advisory_lock + upsert)"),
        raw_handoffs.p50(),
    );
    let handoff_rtts = us(handoffs.p50()) / us(select_one.p50());
    table
        .latency(format!("handoff p50, {WAITERS} waiters"), handoffs.p50())
        .ratio(
            handoff_rtts,
            Some(("p50 ≤ 3 raw round trips (SELECT 1)", handoff_rtts <= 3.0)),
        );
    table.latency(format!("handoff p99, {WAITERS} waiters"), handoffs.p99());
    table.push(
        "handoff p50 / raw handoff p50",
        format!("{:.2}", us(handoffs.p50()) / us(raw_handoffs.p50())),
    );
    table
        .latency(
            format!("raw handoff p50, {WAITERS} waiters (pg_advisory_lock alone, no fence write)"),
            bare_handoffs.p50(),
        )
        .ratio(us(handoffs.p50()) / us(bare_handoffs.p50()), None);
    table.latency(
        "raw fence upsert alone, synchronous_commit = off p50",
        round_trips.unsynced_upsert.p50(),
    );
    let floor = round_trips.floor_over(bare_handoffs.p50());
    table.push(
        "  floor by sum: (bare handoff + unsynced upsert − 1 round trip) / bare handoff",
        format!("{floor:.2}×"),
    );
    // Measured: the blocking lock and an unsynced fence upsert as one statement, in rounds
    // alternating with ours: the least a fenced grant costs here.
    let floor_ratio = us(handoffs.p50()) / us(floor_handoffs.p50());
    table
        .latency(
            format!("fenced floor handoff p50, {WAITERS} waiters: pg_advisory_lock + unsynced upsert, one statement"),
            floor_handoffs.p50(),
        )
        .ratio(
            floor_ratio,
            Some(("ours ≤ 1.1× this fenced floor (same rounds)", floor_ratio <= 1.1)),
        );
    table.push(
        "  fenced floor handoff p50 / bare handoff p50",
        format!("{:.2}×", us(floor_handoffs.p50()) / us(bare_handoffs.p50())),
    );
    let floor = us(select_one.p50()) + us(raw_upsert.p50());
    table.push(
        "handoff p50 / (1 round trip + 1 durable upsert)",
        format!("{:.2}", us(handoffs.p50()) / floor),
    );
}

/// Mean proportional set size of the store's backends, when the server runs on this machine.
async fn held_session_memory(admin: &mut PgConnection) -> String {
    let pids: Vec<i32> =
        match sqlx::query("SELECT pid FROM pg_stat_activity WHERE application_name = 'fencelock'")
            .fetch_all(&mut *admin)
            .await
        {
            Ok(rows) => rows.iter().map(|r| r.get(0)).collect(),
            Err(_) => return "n/a".into(),
        };
    let mut total_kb = 0u64;
    let mut counted = 0u64;
    for pid in &pids {
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        if let Some(kb) = rollup
            .lines()
            .find(|l| l.starts_with("Pss:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
        {
            total_kb += kb;
            counted += 1;
        }
    }
    if counted == 0 {
        "n/a (server not local)".into()
    } else {
        format!("{:.1} MiB", total_kb as f64 / counted as f64 / 1024.0)
    }
}
