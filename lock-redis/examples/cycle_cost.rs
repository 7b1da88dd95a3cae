//! Instructions per lock cycle, for `valgrind --tool=callgrind`: `n` sequential cycles of one
//! contender on a current-thread runtime against the server at `REDIS_URL`.
//!
//! ```text
//! cargo build --release -p fencelock-redis --example cycle_cost
//! valgrind --tool=callgrind target/release/examples/cycle_cost ours 1000
//! valgrind --tool=callgrind target/release/examples/cycle_cost ours 3000
//! ```
//! The difference of the two totals over 2000 is one cycle's cost on the client, start-up
//! excluded; run the server itself under callgrind the same way for its side. Contenders:
//! `ours` (the store through `DynLockStore`, as the bench times it), `shared` (ours, a shared
//! lease), and the bench's fenced
//! floors by hand with the same client (`common/floor.rs`): `floor` (issue 16's two scripts)
//! and `durable` (tokens that survive the loss of the counter).
#[path = "common/floor.rs"]
mod floor;

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{DynLockStore, Mode};
use fencelock_redis::{RedisConfig, RedisStore};

const TTL: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
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
            other => {
                return Err(
                    format!("unknown contender {other}: ours, shared, floor or durable").into(),
                )
            }
        }
        Ok::<_, Box<dyn Error>>(())
    })
}
