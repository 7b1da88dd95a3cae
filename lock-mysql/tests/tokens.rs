//! Fence scheme 3: a token is `max(counter + 1, the server's clock in µs)`, so it follows the
//! clock a resource fenced under another store saw (docs/swaps.md), and still grows per key.

mod common;

use std::time::Duration;

use common::unix_micros;
use fencelock_core::{LockStore, ReleaseOutcome};
use fencelock_mysql::MysqlStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_the_servers_clock_in_micros_read_during_the_acquire() {
    let store = MysqlStore::connect(common::config("table=tokens"))
        .await
        .expect("connect");
    let mut last = 0;
    for round in 0..3 {
        let before = unix_micros();
        let lease = store
            .try_acquire("job", Duration::from_secs(5))
            .await
            .expect("acquire");
        let after = unix_micros();
        let token = lease.fencing_token();
        // The test server runs on this host, on its clock: the server reads it inside the
        // call, so between the two readings (as long as the clock does not step back).
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
