//! One program, any store: the store is chosen by `LOCK_URL`, never by code.
//!
//! ```sh
//! LOCK_URL=memory:// cargo run -p fencelock --example swap
//! LOCK_URL=redis://127.0.0.1:6379 cargo run -p fencelock --features redis --example swap
//! LOCK_URL=sqlite:///tmp/swap/locks.db cargo run -p fencelock --features sqlite --example swap
//! ```
//!
//! It takes a lock, extends it, proves a second handle is refused, releases it, takes it
//! again under `with_lock`, and checks that the second token is greater than the first.

use std::time::Duration;

use fencelock::{with_lock, Error, LockStoreExt, ReleaseOutcome};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    let store = fencelock::connect(&url).await?;
    let other = fencelock::connect(&url).await?;
    let key = format!("swap-example:{}", std::process::id());
    let ttl = store.capabilities().granted_ttl(Duration::from_secs(5));
    println!("store: {}", fencelock::redact(&url));

    let lease = store.try_acquire(&key, ttl).await?;
    store.extend(&lease).await?;
    let refused = matches!(other.try_acquire(&key, ttl).await, Err(Error::Busy { .. }));
    let released = store.release(&lease).await?;
    println!(
        "first lease: token {}, second handle refused: {refused}, release: {released:?}",
        lease.fencing_token()
    );

    let token = with_lock(other.lock(&key).ttl(ttl), |next| async move {
        Ok::<_, Error>(next.fencing_token())
    })
    .await?;
    println!("with_lock on the second handle: token {token}");

    if refused && released == ReleaseOutcome::Released && token > lease.fencing_token() {
        println!("ok");
        Ok(())
    } else {
        Err(Error::Store {
            message: "the store broke the contract in the swap example".into(),
            source: None,
        })
    }
}
