//! The quickstart: acquire, extend, release and fencing tokens on the in-memory store.
//!
//! `cargo run -p fencelock-core --example quickstart` (no server needed).

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{
    with_lock, DynLockStore, Error, FenceGate, KeepAlive, LockStoreExt, MemoryStore,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let store: DynLockStore = Arc::new(MemoryStore::new());
    let ttl = Duration::from_secs(2);

    // Take the lock, renew it once, give it back.
    let lease = store.try_acquire("nightly-export", ttl).await?;
    println!(
        "acquired {:?} with fencing token {}",
        lease.key(),
        lease.fencing_token()
    );
    store.extend(&lease).await?;
    println!("extended: {:?} left", lease.remaining());

    // A second holder is refused while the first holds it.
    match store.try_acquire("nightly-export", ttl).await {
        Err(Error::Busy { key }) => println!("second try_acquire: {key:?} is busy"),
        other => panic!("expected Busy, got {other:?}"),
    }
    println!("released: {:?}", store.release(&lease).await?);

    // The resource refuses a superseded token. The holder claims the resource with its token
    // before it reads, and writes only while its claim is the latest.
    let gate = FenceGate::new();
    let mut counter = 0;
    let next = store.try_acquire("nightly-export", ttl).await?;
    println!(
        "next holder's token {} > {}",
        next.fencing_token(),
        lease.fencing_token()
    );
    gate.claim(next.fencing_token())?;
    let read = counter;
    match gate.write(lease.fencing_token(), || counter = 100) {
        Err(error) => println!("the old holder's write is refused: {error}"),
        Ok(()) => panic!("a stale token was admitted"),
    }
    gate.write(next.fencing_token(), || counter = read + 1)?;
    println!("the current holder's write landed: counter = {counter}");

    // Keep a lease alive for longer than its TTL.
    let held = KeepAlive::start(store.clone(), next);
    tokio::time::sleep(ttl * 2).await;
    println!("kept alive past two TTLs, lost: {}", held.is_lost());
    println!("released: {:?}", store.release(&held.stop().await).await?);

    // Or let with_lock do all of it.
    let token = with_lock(store.lock("nightly-export").ttl(ttl), |lease| async move {
        Ok::<_, Error>(lease.fencing_token())
    })
    .await?;
    println!("with_lock ran its body under token {token}");
    Ok(())
}
