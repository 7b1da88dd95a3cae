//! The read-modify-write interleaving that loses an update when the fence is checked only at the
//! write, in process, on the memory store under tokio's paused clock.
//!
//! 1. A takes the lock and reads the counter; A pauses past its TTL.
//! 2. B takes the lock (a greater token) and reads the counter.
//! 3. A wakes and writes `read + 1`.
//! 4. B writes `read + 1`.

use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, FenceGate, LockStore, MemoryStore};
use tokio::sync::Mutex;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(1);

/// A counter and the gate that fences it.
#[derive(Default)]
struct Fenced {
    gate: FenceGate,
    value: Mutex<u64>,
    accepted: Mutex<u64>,
}

/// Runs the interleaving. `claim_at_read` chooses the fencing form: the claim at the read and
/// a write only while the claim holds, or a check at the write alone (`update`).
async fn interleave(claim_at_read: bool) -> (u64, u64, Vec<Result<(), Error>>) {
    let store = Arc::new(MemoryStore::new());
    let resource = Arc::new(Fenced::default());
    let read = |token: u64| {
        let resource = resource.clone();
        async move {
            if claim_at_read {
                resource.gate.claim(token)?;
            }
            Ok::<_, Error>(*resource.value.lock().await)
        }
    };
    let write = |token: u64, seen: u64| {
        let resource = resource.clone();
        async move {
            let mut value = resource.value.lock().await;
            let mut accepted = resource.accepted.lock().await;
            let apply = || {
                *value = seen + 1;
                *accepted += 1;
            };
            if claim_at_read {
                resource.gate.write(token, apply)
            } else {
                resource.gate.update(token, apply)
            }
        }
    };

    let a = store.try_acquire("counter", TTL).await.unwrap();
    let a_seen = read(a.fencing_token()).await.unwrap();
    sleep(TTL * 2).await; // A pauses past its TTL
    let b = store.try_acquire("counter", TTL).await.unwrap();
    assert!(b.fencing_token() > a.fencing_token());
    let b_seen = read(b.fencing_token()).await.unwrap();
    let a_write = write(a.fencing_token(), a_seen).await;
    let b_write = write(b.fencing_token(), b_seen).await;
    let value = *resource.value.lock().await;
    let accepted = *resource.accepted.lock().await;
    (value, accepted, vec![a_write, b_write])
}

#[tokio::test(start_paused = true)]
async fn a_check_at_the_write_alone_loses_an_update() {
    let (value, accepted, writes) = interleave(false).await;
    assert!(writes.iter().all(Result::is_ok), "{writes:?}");
    assert_eq!(accepted, 2);
    assert_eq!(value, 1, "two accepted increments, one lost");
}

#[tokio::test(start_paused = true)]
async fn a_claim_at_the_read_refuses_the_stale_write_and_loses_nothing() {
    let (value, accepted, writes) = interleave(true).await;
    assert!(
        matches!(writes[0], Err(Error::StaleToken { .. })),
        "{:?}",
        writes[0]
    );
    assert!(writes[1].is_ok(), "{:?}", writes[1]);
    assert_eq!(accepted, 1);
    assert_eq!(value, accepted, "every accepted increment counted");
}
