//! A cron guard: the same job is scheduled on every host, and the host that gets the lock runs
//! it; the others find the key held and exit at once, successfully. The job stops if the lease
//! is lost, and the lock is released when it ends (or expires at its TTL if this process dies).
//!
//! ```sh
//! LOCK_URL=sqlite:///tmp/locks.db cargo run -p fencelock --features sqlite --example cron_guard
//! LOCK_URL=redis://127.0.0.1:6379 cargo run -p fencelock --features redis --example cron_guard -- nightly-report
//! ```

use std::process::ExitCode;
use std::time::Duration;

use fencelock::{ErrorKind, LockStoreExt, ReleaseOutcome};

#[tokio::main]
async fn main() -> ExitCode {
    let job = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nightly-report".into());
    let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
    match guarded(&url, &job).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("{job}: running on another host; nothing to do");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{job}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the job if this host gets its lock: `Ok(false)` when another host holds it.
async fn guarded(url: &str, job: &str) -> fencelock::Result<bool> {
    let store = fencelock::connect(url).await?;
    // No wait: a held key means the job is running elsewhere right now.
    let guard = match store.lock(job).ttl(Duration::from_secs(60)).await {
        Ok(guard) => guard,
        Err(error) if error.kind() == ErrorKind::Contended => return Ok(false),
        Err(error) => return Err(error),
    };
    // The guard keeps the lease alive while the job runs and cancels it if the lease is lost.
    guard.run(run_job(job, guard.fencing_token())).await?;
    if guard.release().await? == ReleaseOutcome::Lost {
        eprintln!("{job}: the lease ran out before the release; another host may have run it too");
    }
    Ok(true)
}

/// The job itself; the token goes to whatever it writes, so a stale run is refused there.
async fn run_job(job: &str, token: u64) {
    println!("{job}: running under fencing token {token}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}
