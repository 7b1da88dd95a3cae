//! Instructions per lock cycle, for `valgrind --tool=callgrind`: `n` sequential cycles of one
//! contender on a current-thread runtime, against `LOCK_BENCH_URL` or a server test-servers
//! starts (not traced: callgrind follows no child).
//!
//! ```text
//! scripts/bench.sh --build postgres-cycle-cost
//! valgrind --tool=callgrind target/bench/bin/postgres-cycle-cost wait 500
//! valgrind --tool=callgrind target/bench/bin/postgres-cycle-cost wait 1500
//! ```
//! The difference of the two totals over 1000 is one cycle's cost on the client, start-up
//! excluded. For the server's side, start `postgres` itself under `valgrind --tool=callgrind
//! --callgrind-out-file=cg.%p` (each forked backend writes its own file), point
//! `LOCK_BENCH_URL` at it, and take the largest file of each run the same way. Contenders:
//! `ours` (`try_acquire` + `release` through `DynLockStore`, as the bench times it), `wait`
//! (`acquire` with a wait: the statement a waiter runs, whose part after the lock is on a
//! handoff's path), `sqlx` (sqlx's `PgAdvisoryLock`, no fencing token) and `floor` (the bench's
//! fenced floor by hand: the blocking lock and the fence upsert as one statement on a session
//! with `synchronous_commit = off`, then the unlock).
//!
//! Measured so (PostgreSQL 15.18), instructions per cycle, server / client: sqlx 49k / 20.2k,
//! floor 191k / 21.6k, ours 251k / 45.8k, wait 244k / 46.0k (286k before its statement stopped
//! computing the time it waited, which the client measures, and stopped resetting
//! `lock_timeout` by hand; 249k before it settled its TTL and its commit before the wait and
//! returned its row from the bump itself). What ours adds to the floor on the server is the
//! contract's: the TTL armed and the commit chosen per grant (`set_config` calls of about 7k
//! each, and the transaction's end over every setting, `AtEOXact_GUC`, 3.5k), the
//! transaction-to-session lock step, a plan of more nodes to start; on the client, the lease
//! and its checks, the key's hash (3.5k) and a statement of more parameters and columns.
//!
//! A handoff waits only for the part of a grant after the lock. To count it apart, add
//! `--dump-after=pg_advisory_xact_lock_int8 --dump-after=pg_advisory_lock_int8
//! --dump-before=pq_startmsgread` to the server's callgrind: each backend then writes one file
//! per protocol message and one at the lock's grant, and the files from the grant to the
//! `Sync` after it (the commit) are that part. Measured so: `wait` 115k (the bump with the
//! session's take 83k, the reply and the executor's end 17k, the portal's drop 3k, the commit
//! 12k with 3.5k of it `AtEOXact_GUC`), `floor` 100k (89k, 3k, 8k).

#[path = "postgres_common/floor.rs"]
mod floor;

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use fencelock_bench::server_or_env;
use fencelock_core::DynLockStore;
use fencelock_postgres::{PostgresConfig, PostgresStore};
use floor::{RAW_LOCK_AND_BUMP, RAW_UNLOCK};
use sqlx::postgres::{PgAdvisoryLock, PgAdvisoryLockKey};
use sqlx::{Connection, PgConnection};

const TTL: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = fencelock_bench::args();
    let which = args.next().unwrap_or_else(|| "ours".into());
    let n: usize = args.next().map_or(Ok(1000), |n| n.parse())?;
    let (_server, url) = server_or_env(test_servers::PostgresServer::start, |s| s.url())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match which.as_str() {
            "ours" | "wait" => {
                let config = PostgresConfig::from_url(&url)?;
                let ours: DynLockStore = Arc::new(PostgresStore::connect(config).await?);
                for _ in 0..n {
                    let lease = if which == "ours" {
                        ours.try_acquire("cycle", TTL).await?
                    } else {
                        ours.acquire("cycle", TTL, Duration::from_secs(5)).await?
                    };
                    let _ = ours.release(&lease).await?;
                }
            }
            "sqlx" => {
                let lock = PgAdvisoryLock::with_key(PgAdvisoryLockKey::BigInt(424_243));
                let mut conn = Some(PgConnection::connect(&url).await?);
                for _ in 0..n {
                    let taken = conn.take().ok_or("no connection")?;
                    let guard = lock
                        .try_acquire(taken)
                        .await?
                        .left()
                        .ok_or("the sqlx cycle found the key held")?;
                    conn = Some(guard.release_now().await?);
                }
            }
            "floor" => {
                let mut conn = PgConnection::connect(&url).await?;
                sqlx::query("SET synchronous_commit = off")
                    .execute(&mut conn)
                    .await?;
                // The table as the store makes it.
                let config = PostgresConfig::from_url(&url)?;
                drop(PostgresStore::connect(config).await?);
                for _ in 0..n {
                    sqlx::query(RAW_LOCK_AND_BUMP)
                        .bind(424_244i64)
                        .bind(b"cycle".as_slice())
                        .fetch_one(&mut conn)
                        .await?;
                    sqlx::query(RAW_UNLOCK)
                        .bind(424_244i64)
                        .fetch_one(&mut conn)
                        .await?;
                }
            }
            other => {
                return Err(format!("unknown contender {other}: ours, wait, sqlx or floor").into())
            }
        }
        Ok::<_, Box<dyn Error>>(())
    })
}
