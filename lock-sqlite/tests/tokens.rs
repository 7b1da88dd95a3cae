//! Fence scheme 3: a token is `max(counter + 1, wall clock in µs)`, so it follows the clock a
//! resource fenced under another store saw (docs/swaps.md), and still grows per key.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock_core::{LockStore, ReleaseOutcome};
use support::Scratch;

fn unix_micros() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    u64::try_from(since.as_micros()).expect("micros fit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_the_wall_clock_in_micros_read_during_the_acquire() {
    let dir = Scratch::new("tokens-clock");
    let store = support::store(&dir.db()).await;
    let mut last = 0;
    for round in 0..3 {
        let before = unix_micros();
        let lease = store
            .try_acquire("job", Duration::from_secs(5))
            .await
            .expect("acquire");
        let after = unix_micros();
        let token = lease.fencing_token();
        // The store reads the clock inside the call: between the two readings, as long as the
        // clock does not step back (a µs above `after` only if this key was granted faster).
        assert!(
            (before..=after).contains(&token),
            "round {round}: token {token} outside the clock's [{before}, {after}] µs"
        );
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}
