//! The MySQL/MariaDB store against the raw SQL it is built on, measured in one run from one
//! client.
//!
//! ```sh
//! cargo bench -p fencelock-bench --bench mysql
//! ```
//!
//! Starts its own MariaDB with test-servers, or uses `LOCK_BENCH_URL` if set. Prints one table:
//! the raw floor (the same client running `GET_LOCK` + the fence upsert + `RELEASE_LOCK` as
//! three plain statements) and our acquire + release cycle, as a ratio; throughput with 16
//! tasks on distinct keys against 16 raw connections doing the same; the handoff to another of
//! 8 waiters against the raw `GET_LOCK` handoff (waiters blocked in `GET_LOCK`, then the
//! upsert) and against the bare `GET_LOCK` handoff (no fence write), with the floor a durable
//! commit puts under the latter ratio; and 300 leases held at once with keep-alive on one
//! handle.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_bench::{
    cycle, cycle_into, handoff_between, handoff_to_another, hold_kept_alive, lock_throughput,
    micros as us, server_or_env, throughput, time_each, Contender, Handoff, ModeCycles, Samples,
    Table,
};
use fencelock_core::DynLockStore;
use fencelock_mysql::{MysqlConfig, MysqlStore};
use sqlx::{Connection, MySqlConnection, Row};
use tokio::time::Instant;

const ITERATIONS: usize = 2000;
const ROUNDS: usize = 20;
const TASKS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 8;
const HANDOFFS: usize = 300;
/// Rounds the handoffs of ours and of the raw floor alternate in.
const HANDOFF_ROUNDS: usize = 3;
/// How long each holder keeps the key in the handoff runs, so the others are parked in their
/// wait when the release comes.
const HOLD: Duration = Duration::from_millis(2);
const HELD: usize = 300;
const HELD_TTL: Duration = Duration::from_secs(2);
const TTL: Duration = Duration::from_secs(30);

/// The raw floor: the same three steps as an acquire + release, as plain statements. The
/// upsert returns the token as ours does (LAST_INSERT_ID(expr) in the reply).
const RAW_TRY: &str = "SELECT GET_LOCK(?, 0)";
const RAW_WAIT: &str = "SELECT GET_LOCK(?, 60)";
/// The token is clock-floored as ours is (fence scheme 3: the server's clock in µs).
const RAW_BUMP: &str = "INSERT INTO {fence}
        (namespace, `key`, lock_name, lock_id_scheme, token, owner, holder_id, ttl_ms, updated_at,
         fence_scheme)
    VALUES ('bench-raw', ?, ?, 2, LAST_INSERT_ID({clock}), 'raw', CONNECTION_ID(), 0, NOW(6), 3)
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {clock}))";
/// The server's clock in µs since the Unix epoch, as the store reads it.
const RAW_CLOCK: &str =
    "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS UNSIGNED)";
const RAW_RELEASE: &str = "SELECT RELEASE_LOCK(?)";

fn raw_failed(e: sqlx::Error) -> fencelock_core::Error {
    fencelock_core::Error::store("raw statement", e)
}

/// One raw connection and the statements it runs on one lock name: the lock, then the fence
/// upsert unless `bump` is `None` (the bare `GET_LOCK` handoff).
struct Raw {
    conn: MySqlConnection,
    name: String,
    bump: Option<Arc<str>>,
}

impl Raw {
    async fn open(url: &str, name: String, bump: &Arc<str>) -> Result<Raw, sqlx::Error> {
        Ok(Raw {
            conn: MySqlConnection::connect(url).await?,
            name,
            bump: Some(bump.clone()),
        })
    }

    async fn bare(url: &str, name: String) -> Result<Raw, sqlx::Error> {
        Ok(Raw {
            conn: MySqlConnection::connect(url).await?,
            name,
            bump: None,
        })
    }

    async fn upsert(&mut self) -> fencelock_core::Result<()> {
        let Some(bump) = &self.bump else {
            return Ok(());
        };
        sqlx::query(bump)
            .bind(self.name.as_bytes())
            .bind(&self.name)
            .execute(&mut self.conn)
            .await
            .map(drop)
            .map_err(raw_failed)
    }

    async fn lock(&mut self, statement: &str) -> fencelock_core::Result<()> {
        let granted: Option<i64> = sqlx::query(statement)
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(raw_failed)?;
        if granted != Some(1) {
            return Err(fencelock_core::Error::Busy {
                key: self.name.clone(),
            });
        }
        self.upsert().await
    }

    async fn unlock(&mut self) -> fencelock_core::Result<()> {
        sqlx::query(RAW_RELEASE)
            .bind(&self.name)
            .execute(&mut self.conn)
            .await
            .map(drop)
            .map_err(raw_failed)
    }

    async fn cycle(&mut self) -> fencelock_core::Result<()> {
        self.lock(RAW_TRY).await?;
        self.unlock().await
    }
}

/// A raw connection as a waiter in `fencelock_bench::handoff_between`: it blocks in
/// `GET_LOCK`, then bumps the fence as a separate statement.
#[async_trait]
impl Contender for Raw {
    type Held = ();

    async fn take(&mut self) -> fencelock_core::Result<()> {
        self.lock(RAW_WAIT).await
    }

    async fn give_back(&mut self, (): ()) -> fencelock_core::Result<()> {
        self.unlock().await
    }
}

/// What every scenario shares: the server's URL, our store, an admin connection, the fence
/// upsert as this server's table needs it, and one raw connection.
struct Bench {
    url: String,
    config: MysqlConfig,
    ours: DynLockStore,
    admin: MySqlConnection,
    bump: Arc<str>,
    /// Shared with each timed call through a mutex (uncontended).
    raw: Arc<tokio::sync::Mutex<Raw>>,
}

/// The raw round trip and the fence upsert alone, which later rows are measured against.
struct RoundTrips {
    select_one: Samples,
    raw_upsert: Samples,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let (_server, url) = server_or_env(test_servers::MariadbServer::start, |s| s.url())?;
    let mut bench = Bench::connect(url).await?;
    let mut table = Table::default();
    let round_trips = bench.raw_round_trips(&mut table).await?;
    let raw_floor = bench.uncontended_cycles(&mut table).await?;
    bench.throughput(&mut table).await?;
    bench.handoff(&mut table, &round_trips).await?;
    bench.held_leases(&mut table).await?;
    println!("{table}");
    println!(
        "samples: {ITERATIONS} cycles each, {HANDOFFS} handoffs each; raw SELECT 1 p99 {:.1} µs, raw floor p99 {:.1} µs",
        us(round_trips.select_one.p99()),
        us(raw_floor.p99())
    );
    Ok(())
}

impl Bench {
    /// Connects our store, the admin and the raw connections, and prints the header.
    async fn connect(url: String) -> Result<Self, Box<dyn Error>> {
        let config = MysqlConfig::from_url(&url)?;
        println!("MySQL/MariaDB store benchmark against {config}");
        let store = MysqlStore::connect(config.clone()).await?;
        let ours: DynLockStore = Arc::new(store.clone());
        let bump: Arc<str> = RAW_BUMP
            .replace("{fence}", &config.fence_table())
            .replace("{clock}", RAW_CLOCK)
            .into();
        let mut admin = MySqlConnection::connect(&url).await?;
        let row = sqlx::query(
            "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), \
             CAST(@@max_connections AS SIGNED)",
        )
        .fetch_one(&mut admin)
        .await?;
        let (version, flush, max_connections): (String, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        println!(
            "server {version}, innodb_flush_log_at_trx_commit = {flush}, max_connections = {max_connections}\n"
        );
        let raw = Arc::new(tokio::sync::Mutex::new(
            Raw::open(&url, "bench-raw:cycle".into(), &bump).await?,
        ));
        Ok(Bench {
            url,
            config,
            ours,
            admin,
            bump,
            raw,
        })
    }

    /// Raw round trips on one connection: `SELECT 1`, and the fence upsert alone (one
    /// durable commit, innodb_flush_log_at_trx_commit = 1).
    async fn raw_round_trips(&self, table: &mut Table) -> fencelock_core::Result<RoundTrips> {
        let select_one = time_each(ITERATIONS, |_| {
            let raw = self.raw.clone();
            async move {
                sqlx::query("SELECT 1")
                    .fetch_one(&mut raw.lock().await.conn)
                    .await
                    .map(drop)
                    .map_err(raw_failed)
            }
        })
        .await?;
        let raw_upsert = time_each(ITERATIONS, |_| {
            let raw = self.raw.clone();
            async move { raw.lock().await.upsert().await }
        })
        .await?;
        table.latency("raw round trip (SELECT 1) p50", select_one.p50());
        Ok(RoundTrips {
            select_one,
            raw_upsert,
        })
    }

    /// The raw floor and our cycle in alternating rounds, so both see the same machine load;
    /// warmed up first. Ours also as a semaphore permit and as a shared lease, where the store
    /// keeps them. Returns the raw floor.
    async fn uncontended_cycles(&self, table: &mut Table) -> fencelock_core::Result<Samples> {
        let ours = &self.ours;
        cycle(ours, "bench:cycle", TTL, 100).await?;
        let mut modes = ModeCycles::new(&ours.capabilities());
        modes.warm_up(ours, "bench:cycle", TTL, 100).await?;
        let (mut raw_samples, mut our_samples) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let mut raw = self.raw.lock().await;
            for _ in 0..ITERATIONS / ROUNDS {
                let started = Instant::now();
                raw.cycle().await?;
                raw_samples.push(started.elapsed());
            }
            drop(raw);
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
        // No Rust lock library for MariaDB: the bare GET_LOCK + RELEASE_LOCK cycle (no fence
        // write) stands in for a peer's.
        let mut bare = Raw::bare(&self.url, "bench-raw:bare-cycle".into())
            .await
            .map_err(raw_failed)?;
        let mut bare_samples = Vec::with_capacity(ITERATIONS);
        for i in 0..ITERATIONS + 100 {
            let started = Instant::now();
            bare.cycle().await?;
            if i >= 100 {
                bare_samples.push(started.elapsed());
            }
        }
        let bare_cycles = Samples::new(bare_samples);

        table.latency(
            "raw floor: GET_LOCK + fence upsert + RELEASE_LOCK p50",
            raw_floor.p50(),
        );
        table
            .latency(
                "bare GET_LOCK + RELEASE_LOCK p50 (no fence write; stands in for a peer)",
                bare_cycles.p50(),
            )
            .ratio(us(bare_cycles.p50()) / us(raw_floor.p50()), None);
        let ratio = us(our_cycles.p50()) / us(raw_floor.p50());
        table
            .latency("ours: try_acquire + release p50", our_cycles.p50())
            .ratio(ratio, Some(("≤ 1.2× raw floor", ratio <= 1.2)));
        table.latency("ours: try_acquire + release p99", our_cycles.p99());
        modes.rows(table, "ours: ", Some(raw_floor.p50()), None);
        Ok(raw_floor)
    }

    /// Throughput: 16 tasks on distinct keys, raw (one connection per task) and ours (one
    /// handle).
    async fn throughput(&self, table: &mut Table) -> Result<(), Box<dyn Error>> {
        let mut raw_conns = Vec::new();
        for task in 0..TASKS {
            raw_conns.push(Arc::new(tokio::sync::Mutex::new(
                Raw::open(
                    &self.url,
                    format!("bench-raw:throughput:{task}"),
                    &self.bump,
                )
                .await?,
            )));
        }
        let raw_rate = throughput(TASKS, RUN_FOR, move |task, _| {
            let conn = raw_conns[task].clone();
            async move { conn.lock().await.cycle().await }
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

    /// Handoff to another of 8 waiters on one key: raw connections (with the fence upsert,
    /// then bare), then our handles.
    async fn handoff(
        &self,
        table: &mut Table,
        round_trips: &RoundTrips,
    ) -> Result<(), Box<dyn Error>> {
        // The bare GET_LOCK handoff: no fence write, so no durable commit.
        let mut bare_waiters = Vec::new();
        for _ in 0..WAITERS {
            bare_waiters.push(Raw::bare(&self.url, "bench-raw:bare-handoff".into()).await?);
        }
        let bare_handoffs =
            handoff_between(bare_waiters, HANDOFFS, Handoff::ToAnother { hold: HOLD }).await?;
        let mut handles: Vec<DynLockStore> = Vec::new();
        for _ in 0..WAITERS {
            handles.push(Arc::new(MysqlStore::connect(self.config.clone()).await?));
        }
        // Ours and the raw handoff with the fence write (the floor: a wake-up, then a durable
        // commit) in alternating rounds, so both see the same load.
        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..HANDOFF_ROUNDS {
            let per_round = HANDOFFS / HANDOFF_ROUNDS;
            let mut raw_waiters = Vec::new();
            for _ in 0..WAITERS {
                raw_waiters
                    .push(Raw::open(&self.url, "bench-raw:handoff".into(), &self.bump).await?);
            }
            raw.push(
                handoff_between(raw_waiters, per_round, Handoff::ToAnother { hold: HOLD }).await?,
            );
            ours.push(
                handoff_to_another(handles.clone(), "bench:handoff", TTL, HOLD, per_round).await?,
            );
        }
        let (handoffs, raw_handoffs) = (Samples::merged(ours), Samples::merged(raw));
        handoff_rows(table, round_trips, &raw_handoffs, &bare_handoffs, &handoffs);
        Ok(())
    }

    /// 300 leases held at once on one handle, kept alive, with the connections they take.
    async fn held_leases(&mut self, table: &mut Table) -> Result<(), Box<dyn Error>> {
        let held_store = Arc::new(MysqlStore::connect(self.config.clone()).await?);
        let mut held = hold_kept_alive(&held_store, "bench:held:", HELD, HELD_TTL).await?;
        let lost = held.lost();
        let store_connections = held_store.open_connections();
        let store_idle = held_store.idle_connections();
        let server_connections: i64 =
            sqlx::query("SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.PROCESSLIST")
                .fetch_one(&mut self.admin)
                .await?
                .get(0);
        held.release(&*held_store).await?;

        table
            .push(
                format!("{HELD} leases held with keep-alive, TTL {HELD_TTL:?}, for 3 TTLs"),
                format!("{lost} lost"),
            )
            .target = Some((format!("{HELD} held, none lost"), lost == 0));
        table.push(
            "  connections: this handle's (held + idle) / all on the server",
            format!(
                "{} + {store_idle} / {server_connections}",
                store_connections - store_idle
            ),
        );
        table.push(
            format!("  time to acquire {HELD} (one at a time)"),
            format!("{:.0} ms", held.acquired_in.as_secs_f64() * 1e3),
        );
        table.latency("  extend p50 while they are kept alive", held.extends.p50());
        table.latency("  extend p99 while they are kept alive", held.extends.p99());
        Ok(())
    }
}

/// The handoff rows: ours against the raw handoff with the fence upsert and against the bare
/// one, and the floor a durable commit puts under the latter ratio.
fn handoff_rows(
    table: &mut Table,
    round_trips: &RoundTrips,
    raw_handoffs: &Samples,
    bare_handoffs: &Samples,
    handoffs: &Samples,
) {
    let raw_upsert = &round_trips.raw_upsert;
    table.latency(
        format!("raw handoff to another p50, {WAITERS} waiters (GET_LOCK + upsert)"),
        raw_handoffs.p50(),
    );
    let handoff_ratio = us(handoffs.p50()) / us(raw_handoffs.p50());
    table
        .latency(
            format!("ours: handoff to another p50, {WAITERS} waiters"),
            handoffs.p50(),
        )
        .ratio(
            handoff_ratio,
            Some((
                "≤ 1.1× raw handoff, the floor (same rounds)",
                handoff_ratio <= 1.1,
            )),
        );
    table.latency(
        format!("ours: handoff to another p99, {WAITERS} waiters"),
        handoffs.p99(),
    );
    table.latency(
        "raw fence upsert alone (durable commit) p50",
        raw_upsert.p50(),
    );
    let bare_ratio = us(handoffs.p50()) / us(bare_handoffs.p50());
    table
        .latency(
            format!(
                "raw handoff to another p50, {WAITERS} waiters (GET_LOCK alone, no fence write)"
            ),
            bare_handoffs.p50(),
        )
        .ratio(bare_ratio, None);
    // Every grant here waits for a durable commit (MariaDB has no per-session way to skip the
    // log flush), so ours cannot be faster than a bare handoff plus that commit.
    let floor = (us(bare_handoffs.p50()) + us(raw_upsert.p50())) / us(bare_handoffs.p50());
    table.push(
        "  floor: (bare GET_LOCK handoff + durable upsert) / bare handoff",
        format!("{floor:.2}×"),
    );
}
