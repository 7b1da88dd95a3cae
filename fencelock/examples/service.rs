//! The job of a service, as the README shows it: connect by URL, wait for the lock, work while
//! it is held (stopping if it is lost), hand the fencing token to the resource, release.
//!
//! ```sh
//! cargo run -p fencelock --features fence-file --example service              # memory://
//! LOCK_URL=sqlite:///tmp/locks.db cargo run -p fencelock --features sqlite,fence-file --example service
//! ```
//!
//! The README shows this file from its first `use` on, and `tests/service_example.rs` checks
//! that it still does.

// `tests/service_example.rs` also runs `main`, as a module's function.
#![allow(unreachable_pub, missing_docs)]

use std::time::Duration;

use fencelock::fence::FencedFile;
use fencelock::LockStoreExt;

#[tokio::main]
pub async fn main() -> fencelock::Result<()> {
    let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
    let store = fencelock::connect(&url).await?;

    // Wait up to 10 s for the key; the guard keeps the lease alive until it is released.
    let wait = Duration::from_secs(10);
    let guard = store.lock("nightly-export").wait(wait).await?;
    let token = guard.fencing_token();

    // The work stops at its next await if the lease is lost (an error of kind LeaseLost), and
    // the resource refuses a holder whose lease ran out while it was paused.
    let report = FencedFile::new(std::env::temp_dir().join("nightly-export.txt"));
    guard.run(export(&report, token)).await??;

    println!("release: {:?}", guard.release().await?);
    Ok(())
}

/// Claims the report with the token when it reads, and writes only while that claim holds.
async fn export(report: &FencedFile, token: u64) -> fencelock::Result<()> {
    let previous = report.claim_async(token).await?.unwrap_or_default();
    let mut lines = String::from_utf8_lossy(&previous).into_owned();
    lines.push_str(&format!("exported under fencing token {token}\n"));
    report.write_async(token, lines).await
}
