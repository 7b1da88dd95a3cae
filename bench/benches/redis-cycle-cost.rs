//! Instructions per lock cycle, for `valgrind --tool=callgrind`: `n` sequential cycles of one
//! contender on a current-thread runtime against the server at `REDIS_URL`.
//!
//! ```text
//! scripts/bench.sh --build redis-cycle-cost
//! valgrind --tool=callgrind target/bench/bin/redis-cycle-cost ours 1000
//! valgrind --tool=callgrind target/bench/bin/redis-cycle-cost ours 3000
//! ```
//! The difference of the two totals over 2000 is one cycle's cost on the client, start-up
//! excluded; run the server itself under callgrind the same way for its side. Contenders:
//! `ours` (the store through `DynLockStore`, as the bench times it), `shared` (ours, a shared
//! lease), and the bench's fenced
//! floors by hand with the same client (`common/floor.rs`): `floor` (the fenced floor's two scripts)
//! and `durable` (tokens that survive the loss of the counter); and the unfenced peers: `raw`
//! (the bench's raw cycle, `SET NX PX` then compare-and-delete by `EVALSHA`) and `rslock`.
//!
//! Measured so (Redis 7.0.15; server: the counters zeroed after 200 cycles, `callgrind_control
//! -z`, then 2000), instructions per cycle, server / client: raw 34.2k / 29.8k, rslock 34.5k /
//! 42.1k, floor 63.8k / 31.9k, durable 83.0k, ours 84.5k / 32.5k. The server's gap to rslock
//! is the fencing itself: the acquire as a script, the mint (`TIME` 7k, the fence's
//! `SET … PX … GET` 10.5k, the clock's digits and compare 3k) and the release's `PUBLISH`
//! (3.7k with no subscriber, less than any check for one: `PUBSUB NUMSUB` first cost 3.1k more).
// Only `Rslock` is used here; the rest of `common` is the benches'.
#[allow(dead_code)]
#[path = "redis_common/mod.rs"]
mod common;
#[path = "redis_common/floor.rs"]
mod floor;

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use common::Rslock;
use fencelock_core::raw::ttl::whole_millis;
use fencelock_core::{DynLockStore, Mode, OwnerId};
use fencelock_redis::{RedisConfig, RedisStore};

const TTL: Duration = Duration::from_secs(30);

/// The bench's compare-and-delete, the raw cycle's release.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = fencelock_bench::args();
    let which = args.next().unwrap_or_else(|| "ours".into());
    let n: usize = args.next().map_or(Ok(1000), |n| n.parse())?;
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL to a Redis server")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match which.as_str() {
            "ours" | "shared" => {
                let config = RedisConfig::from_url(&url)?.with_prefix("cost:")?;
                let ours: DynLockStore = Arc::new(RedisStore::connect(config).await?);
                for _ in 0..n {
                    let lease = if which == "ours" {
                        ours.try_acquire("cycle", TTL).await?
                    } else {
                        ours.try_acquire_as("shared", TTL, Mode::Shared).await?
                    };
                    let _ = ours.release(&lease).await?;
                }
            }
            "floor" | "durable" => {
                let client = redis::Client::open(url.as_str())?;
                let mut conn = redis::aio::ConnectionManager::new(client).await?;
                let floor = if which == "floor" {
                    floor::Floor::new()
                } else {
                    floor::Floor::durable()
                };
                for _ in 0..n {
                    floor.cycle(&mut conn, "cycle", TTL).await?;
                }
            }
            "raw" => {
                let client = redis::Client::open(url.as_str())?;
                let mut conn = redis::aio::ConnectionManager::new(client).await?;
                let release = redis::Script::new(COMPARE_AND_DELETE);
                for _ in 0..n {
                    let owner = OwnerId::random().to_string();
                    let set: Option<String> = redis::cmd("SET")
                        .arg("raw:cycle")
                        .arg(&owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(whole_millis(TTL))
                        .query_async(&mut conn)
                        .await?;
                    let released: i64 = release
                        .key("raw:cycle")
                        .arg(&owner)
                        .invoke_async(&mut conn)
                        .await?;
                    if set.is_none() || released != 1 {
                        return Err("the raw cycle found the key held".into());
                    }
                }
            }
            "rslock" => {
                let rslock: DynLockStore = Arc::new(Rslock::new(vec![url.clone()]));
                for _ in 0..n {
                    let lease = rslock.try_acquire("rslock:cycle", TTL).await?;
                    let _ = rslock.release(&lease).await?;
                }
            }
            other => {
                return Err(format!(
                    "unknown contender {other}: ours, shared, floor, durable, raw or rslock"
                )
                .into())
            }
        }
        Ok::<_, Box<dyn Error>>(())
    })
}
