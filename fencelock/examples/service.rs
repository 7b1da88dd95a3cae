//! The job of a service, as the README shows it: connect by URL, wait for the lock, work while
//! it is held (stopping if it is lost), hand the fencing token to the resource, release.
//!
//! ```sh
//! cargo run -p fencelock --example service                                                   # memory://
//! LOCK_URL=sqlite:///tmp/locks.db cargo run -p fencelock --features sqlite --example service  # a SQLite file
//! ```

use std::time::Duration;

use fencelock::LockStoreExt;

#[tokio::main]
pub async fn main() -> fencelock::Result<()> {
    let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
    let store = fencelock::connect(&url).await?;

    // Waits up to 10 s for the key; the guard keeps the lease alive until it is released.
    let guard = store
        .lock("nightly-export")
        .wait(Duration::from_secs(10))
        .await?;
    let token = guard.fencing_token();
    // The work stops at its next await if the lease is lost (an error of kind LeaseLost).
    guard
        .run(async {
            // Every write to the protected resource carries `token`.
            println!("exporting under fencing token {token}");
        })
        .await?;
    println!("release: {:?}", guard.release().await?);
    Ok(())
}
