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
//! throughput with 16 tasks on distinct keys against 16 raw connections doing the same, handoff
//! latency with 8 waiters on one key (against raw waiters that bump the fence durably after
//! `pg_advisory_lock`, and against the bare `pg_advisory_lock` handoff), the peers' protocol
//! (8 contenders on one key, each holding 1 ms and pausing 30 ms after each release: the
//! acquire latency's p50, mean and p99, ours against the raw blocking `pg_advisory_lock`, a
//! session per contender, in interleaved rounds, target each ≤ 1.2×; then, in rounds of their
//! own, the floor in that protocol: the lock and an unsynced fence upsert as one statement
//! against the bare lock), and 500 leases held at
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
use sqlx::{Connection, PgConnection, Row};
use tokio::time::Instant;

const ITERATIONS: usize = 2000;
const ROUNDS: usize = 20;
const TASKS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 8;
const HANDOFFS: usize = 400;
const HELD: usize = 500;
const HELD_TTL: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(30);

/// The raw floor: the same three steps as an acquire + release, as plain statements.
const RAW_TRY: &str = "SELECT pg_try_advisory_lock($1)";
const RAW_BUMP: &str = "INSERT INTO public.fencelock_fence AS f
        (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at)
    VALUES ('bench-raw', $2, $1, 2, 3, floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8,
            'raw', pg_backend_pid(), 0, clock_timestamp())
    ON CONFLICT (namespace, key) DO UPDATE
       SET token = GREATEST(f.token + 1, EXCLUDED.token)
    RETURNING f.token";
const RAW_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
/// The blocking lock and the fence upsert as one statement: a grant's least work, one round
/// trip (on a session with synchronous_commit = off, as our grants at the clock commit).
const RAW_LOCK_AND_BUMP: &str = "WITH lock AS MATERIALIZED (SELECT pg_advisory_lock($1) AS locked)
    INSERT INTO public.fencelock_fence AS f
        (namespace, key, lock_id, lock_id_scheme, fence_scheme, token, owner, holder_pid, ttl_ms, updated_at)
    SELECT 'bench-raw', $2, $1, 2, 3, floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8,
           'raw', pg_backend_pid(), 0, clock_timestamp()
      FROM lock
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

fn raw_failed(e: sqlx::Error) -> fencelock_core::Error {
    fencelock_core::Error::store("raw statement", e)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (_server, url) = server_or_env(test_servers::PostgresServer::start, |s| s.url())?;
    let config = PostgresConfig::from_url(&url)?;
    println!("PostgreSQL store benchmark against {config}");
    let store = PostgresStore::connect(config.clone()).await?;
    let dyn_store: DynLockStore = Arc::new(store.clone());
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

    // Raw round trips on one connection.
    // One connection, shared with each timed call through a mutex (uncontended).
    let raw = Arc::new(tokio::sync::Mutex::new(PgConnection::connect(&url).await?));
    let select_one = time_each(ITERATIONS, |_| {
        let raw = raw.clone();
        async move {
            sqlx::query("SELECT 1")
                .fetch_one(&mut *raw.lock().await)
                .await
                .map(drop)
                .map_err(|e| fencelock_core::Error::store("SELECT 1", e))
        }
    })
    .await?;
    let raw_upsert = time_each(ITERATIONS, |_| {
        let raw = raw.clone();
        async move {
            sqlx::query(RAW_BUMP)
                .bind(434_343_i64)
                .bind(434_343_i64.to_be_bytes().to_vec())
                .fetch_one(&mut *raw.lock().await)
                .await
                .map(drop)
                .map_err(|e| fencelock_core::Error::store("raw upsert", e))
        }
    })
    .await?;
    // The same upsert committed without waiting for the WAL flush, as our grants at the clock
    // commit: on a connection whose session says synchronous_commit = off.
    let mut unsynced = PgConnection::connect(&url).await?;
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut unsynced)
        .await?;
    let unsynced = Arc::new(tokio::sync::Mutex::new(unsynced));
    let unsynced_upsert = time_each(ITERATIONS, |_| {
        let unsynced = unsynced.clone();
        async move {
            sqlx::query(RAW_BUMP)
                .bind(434_344_i64)
                .bind(434_344_i64.to_be_bytes().to_vec())
                .fetch_one(&mut *unsynced.lock().await)
                .await
                .map(drop)
                .map_err(|e| fencelock_core::Error::store("raw unsynced upsert", e))
        }
    })
    .await?;
    let connects = time_each(50, |_| {
        let url = url.clone();
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
    // The raw floor and our cycle (the loop of `fencelock_bench::cycle`) in alternating
    // rounds, so both see the same machine load; warmed up first.
    // Ours also as a semaphore permit and as a shared lease, where the store keeps them.
    cycle(&dyn_store, "bench:cycle", TTL, 100).await?;
    let mut modes = ModeCycles::new(&dyn_store.capabilities());
    modes.warm_up(&dyn_store, "bench:cycle", TTL, 100).await?;
    let (mut raw_samples, mut our_samples) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut conn = raw.lock().await;
        for _ in 0..ITERATIONS / ROUNDS {
            let started = Instant::now();
            raw_cycle(&mut conn, 424_242).await?;
            raw_samples.push(started.elapsed());
        }
        drop(conn);
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
    }
    let raw_floor = Samples::new(raw_samples);
    let ours = Samples::new(our_samples);
    // The per-entity pattern: a key never locked before in every cycle (its fence row is
    // inserted, then removed in the background once idle for the retention window).
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let new_keys = time_each(ITERATIONS, |i| {
        let (store, key) = (dyn_store.clone(), format!("bench:new-key:{run}:{i}"));
        async move {
            let lease = store.try_acquire(&key, TTL).await?;
            store.release(&lease).await.map(drop)
        }
    })
    .await?;

    // Throughput: 16 tasks on distinct keys, raw (one connection per task) and ours (one handle).
    let mut raw_conns = Vec::new();
    for _ in 0..TASKS {
        raw_conns.push(Arc::new(tokio::sync::Mutex::new(
            PgConnection::connect(&url).await?,
        )));
    }
    let raw_rate = throughput(TASKS, RUN_FOR, move |task, _| {
        let conn = raw_conns[task].clone();
        async move { raw_cycle(&mut *conn.lock().await, 1_000_000 + task as i64).await }
    })
    .await?;
    let our_rate =
        lock_throughput(dyn_store.clone(), "bench:throughput:", TTL, TASKS, RUN_FOR).await?;

    // Handoff: 8 waiters on one key, raw connections and then our handles.
    let mut raw_waiters = Vec::new();
    for _ in 0..WAITERS {
        raw_waiters.push(RawWaiter {
            conn: PgConnection::connect(&url).await?,
            id: 5_555_555,
            bump: true,
            one_statement: false,
        });
    }
    let raw_handoffs = handoff_between(raw_waiters, HANDOFFS, Handoff::AnyWaiter).await?;
    let mut bare_waiters = Vec::new();
    for _ in 0..WAITERS {
        bare_waiters.push(RawWaiter {
            conn: PgConnection::connect(&url).await?,
            id: 5_555_556,
            bump: false,
            one_statement: false,
        });
    }
    let bare_handoffs = handoff_between(bare_waiters, HANDOFFS, Handoff::AnyWaiter).await?;
    let mut handles: Vec<DynLockStore> = Vec::new();
    for _ in 0..WAITERS {
        handles.push(Arc::new(PostgresStore::connect(config.clone()).await?));
    }
    let handoffs = handoff(handles.clone(), "bench:handoff", TTL, HANDOFFS).await?;

    // The peers' protocol (8 contenders on one key, hold 1 ms, pause 30 ms): ours against the
    // raw blocking pg_advisory_lock (a session per contender), in interleaved rounds.
    let mut bare_contenders = Vec::new();
    for _ in 0..PEERS_CONTENDERS {
        bare_contenders.push(RawWaiter {
            conn: PgConnection::connect(&url).await?,
            id: 5_555_557,
            bump: false,
            one_statement: false,
        });
    }
    let protocol = PeersProtocol::HARNESS
        .run(
            store_contenders(
                handles[..PEERS_CONTENDERS].to_vec(),
                "bench:protocol",
                TTL,
                Duration::from_secs(60),
            ),
            bare_contenders,
        )
        .await?;
    drop(handles);
    // The floor in the same protocol: a grant's least work (the blocking lock and an unsynced
    // fence upsert, one statement) against the bare lock, in rounds of their own. The floor
    // computed from the back-to-back upsert below understates it: after each 30 ms pause the
    // backend runs the upsert cold, several times slower than back to back.
    let (mut fenced_contenders, mut bare_again) = (Vec::new(), Vec::new());
    for _ in 0..PEERS_CONTENDERS {
        let mut conn = PgConnection::connect(&url).await?;
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut conn)
            .await?;
        fenced_contenders.push(RawWaiter {
            conn,
            id: 5_555_558,
            bump: true,
            one_statement: true,
        });
        bare_again.push(RawWaiter {
            conn: PgConnection::connect(&url).await?,
            id: 5_555_559,
            bump: false,
            one_statement: false,
        });
    }
    let protocol_floor = PeersProtocol {
        rounds: PeersProtocol::HARNESS.rounds / 2,
        ..PeersProtocol::HARNESS
    }
    .run(fenced_contenders, bare_again)
    .await?;

    // 500 leases held at once on one handle, kept alive.
    let held_store = Arc::new(PostgresStore::connect(config.clone()).await?);
    let mut held = hold_kept_alive(&held_store, "bench:held:", HELD, HELD_TTL).await?;
    let lost = held.lost();
    let store_connections = held_store.open_connections();
    let store_idle = held_store.idle_connections();
    let server_connections: i64 =
        sqlx::query("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fencelock'")
            .fetch_one(&mut admin)
            .await?
            .get(0);
    let busy: i64 =
        sqlx::query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
            .fetch_one(&mut admin)
            .await?
            .get(0);
    let memory = held_session_memory(&mut admin).await;
    held.release(&*held_store).await?;

    let mut table = Table::default();
    table.latency("raw round trip (SELECT 1) p50", select_one.p50());
    table.latency(
        "raw floor: try_lock + fence upsert + unlock p50",
        raw_floor.p50(),
    );
    let ratio = us(ours.p50()) / us(raw_floor.p50());
    table
        .latency("ours: try_acquire + release p50", ours.p50())
        .ratio(ratio, Some(("≤ 1.2× raw floor", ratio <= 1.2)));
    table.latency("ours: try_acquire + release p99", ours.p99());
    modes.rows(&mut table, "ours: ", Some(raw_floor.p50()), None);
    table
        .latency("ours: a new key per cycle p50", new_keys.p50())
        .ratio(us(new_keys.p50()) / us(raw_floor.p50()), None);
    table
        .latency("ours: a new key per cycle p99", new_keys.p99())
        .ratio(us(new_keys.p99()) / us(raw_floor.p99()), None);
    table.rate(format!("raw floor, {TASKS} tasks, distinct keys"), raw_rate);
    table
        .rate(format!("ours, {TASKS} tasks, distinct keys"), our_rate)
        .ratio(our_rate / raw_rate, None);
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
    let bare_ratio = us(handoffs.p50()) / us(bare_handoffs.p50());
    table
        .latency(
            format!("raw handoff p50, {WAITERS} waiters (pg_advisory_lock alone, no fence write)"),
            bare_handoffs.p50(),
        )
        .ratio(
            bare_ratio,
            Some((
                "ours ≤ 1.2× bare pg_advisory_lock handoff",
                bare_ratio <= 1.2,
            )),
        );
    table.latency(
        "raw fence upsert alone, synchronous_commit = off p50",
        unsynced_upsert.p50(),
    );
    // A grant writes the fence (unsynced at the clock), so it cannot be faster than a bare
    // handoff plus that write; the bare handoff's own round trip already carries the reply.
    let floor_over =
        |bare: Duration| (us(bare) + us(unsynced_upsert.p50()) - us(select_one.p50())) / us(bare);
    let floor = floor_over(bare_handoffs.p50());
    table.push(
        "  floor: (bare handoff + unsynced upsert − 1 round trip) / bare handoff",
        format!("{floor:.2}×"),
    );
    let floor = us(select_one.p50()) + us(raw_upsert.p50());
    table.push(
        "handoff p50 / (1 round trip + 1 durable upsert)",
        format!("{:.2}", us(handoffs.p50()) / floor),
    );
    protocol.rows(&mut table, "pg_advisory_lock", 1.2);
    // As for the handoff: a grant also writes the fence (unsynced at the clock).
    let floor = floor_over(protocol.peer.p50());
    table.push(
        "  floor, p50: (that + unsynced upsert − 1 round trip) / that",
        format!("{floor:.2}×"),
    );
    // Measured in the protocol (its own rounds): the lock and an unsynced upsert, one statement.
    for (stat, floor, bare) in [
        ("p50", protocol_floor.ours.p50(), protocol_floor.peer.p50()),
        (
            "mean",
            protocol_floor.ours.mean(),
            protocol_floor.peer.mean(),
        ),
    ] {
        table
            .latency(
                format!("  floor in the protocol, {stat}: pg_advisory_lock + unsynced upsert, one statement"),
                floor,
            )
            .ratio(us(floor) / us(bare), None);
    }
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
    table.latency("  opening one connection p50", connects.p50());
    println!("{table}");
    println!(
        "samples: {} cycles each, {HANDOFFS} handoffs; raw SELECT 1 p99 {:.1} µs, raw floor p99 {:.1} µs",
        ITERATIONS,
        us(select_one.p99()),
        us(raw_floor.p99())
    );
    Ok(())
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
