//! The server's wall clock stepped while it runs (test-servers' clock shim): what the crate
//! docs' `# What is not` says a step does, within and beyond what keeps tokens growing.

mod common;

use std::time::Duration;

use common::{admin, admin_query, store};
use fencelock_core::{ErrorKind, LockStore, Mode, ReleaseOutcome};
use test_servers::RedisServer;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(10);
/// A step larger than every TTL here, so no holder's lease spans it unnoticed.
const STEP_MICROS: i64 = 60_000_000;

fn start() -> RedisServer {
    RedisServer::start_with_clock().unwrap_or_else(|e| panic!("{e}"))
}

/// One lease of `key` in `mode`, released; its token.
async fn cycle(store: &fencelock_redis::RedisStore, key: &str, mode: Mode) -> u64 {
    let lease = store.try_acquire_as(key, TTL, mode).await.expect("granted");
    assert_eq!(
        store.release(&lease).await.expect("released"),
        ReleaseOutcome::Released
    );
    lease.fencing_token()
}

/// Within: with the fence key intact, tokens grow in every mode whatever the clock does, a
/// minute back, then two forward.
#[tokio::test]
async fn tokens_grow_across_steps_of_the_server_clock_while_the_fence_key_lives() {
    let server = start();
    let store = store(&server.url(), "").await;
    let clock = server.clock().expect("a stepped clock");
    let key = "clock:within";
    let mut last = 0;
    for step in [0, -STEP_MICROS, 2 * STEP_MICROS] {
        clock.step_micros(step).expect("step");
        for mode in [Mode::Exclusive, Mode::Shared, Mode::permits(2)] {
            let token = cycle(&store, key, mode).await;
            assert!(
                token > last,
                "after a step of {step} µs, {mode} got {token}, not above {last}"
            );
            last = token;
        }
    }
}

/// Beyond: the step back the docs name, with the fence key lost (here deleted, as a restart
/// without persistence or an eviction would), mints a token smaller than one handed out.
#[tokio::test]
async fn a_step_back_with_the_fence_key_lost_mints_a_smaller_token() {
    let server = start();
    let store = store(&server.url(), "").await;
    let key = "clock:beyond";
    let before = cycle(&store, key, Mode::Exclusive).await;
    server
        .clock()
        .expect("a stepped clock")
        .step_micros(-STEP_MICROS)
        .expect("step");
    let mut conn = admin(&server.url()).await;
    let deleted: u64 = admin_query(
        &mut conn,
        redis::cmd("DEL").arg(format!("fencelock:{{{key}}}:fence")),
    )
    .await;
    assert_eq!(deleted, 1, "the fence key was there");
    let after = cycle(&store, key, Mode::Exclusive).await;
    assert!(
        after < before,
        "with the fence lost and the clock a minute back, {after} is not below {before}"
    );
    // Close to the clock a minute back: the token is the clock (µs), nothing else.
    let behind = before - after;
    assert!(
        (50_000_000..=70_000_000).contains(&behind),
        "{behind} µs behind"
    );
}

/// Beyond, for holders: a step forward by `s` frees a held lock `s` early (Redis expires keys
/// by its wall clock), while the holder's local deadline knows nothing of it. Another
/// client is granted the key long before the holder's deadline; its greater token is what
/// keeps the old holder's writes out.
#[tokio::test]
async fn a_step_forward_frees_a_held_lock_that_much_early() {
    let server = start();
    let holder = store(&server.url(), "").await;
    let other = store(&server.url(), "").await;
    let key = "clock:forward";
    let lease = holder.try_acquire(key, TTL).await.expect("granted");
    let step = TTL - Duration::from_secs(1);
    server
        .clock()
        .expect("a stepped clock")
        .step_micros(step.as_micros() as i64)
        .expect("step");
    let stepped = Instant::now();
    let taken = loop {
        match other.try_acquire(key, TTL).await {
            Ok(taken) => break taken,
            Err(e) if e.kind() == ErrorKind::Contended => sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
        assert!(
            stepped.elapsed() < TTL - step + Duration::from_secs(5),
            "the key was not freed early"
        );
    };
    assert!(
        lease.valid_until() > Instant::now() + Duration::from_secs(5),
        "the holder's local deadline is still far ahead"
    );
    assert!(taken.fencing_token() > lease.fencing_token());
}

/// Redlock on three masters under stepped clocks, with the shortest retention window there
/// is for the default `max_skew` (1 s): the fence keys expire, then every node's clock steps
/// back. By `max_skew` or less, the next token is still above the last (the window covers
/// it: the crate docs' `# Per-key state`, "On Redlock"); by three times it, the nodes mint a
/// smaller one, the failure a window below `G + max_skew + 1 ms` would allow.
mod redlock {
    use super::*;
    use fencelock_redis::{RedlockConfig, RedlockStore};

    /// The smallest window for `max_skew=1s`: the granule (2^18 µs), the skew and 1 ms.
    const WINDOW: &str = "retention=1300ms&max_ttl=1s";
    const PAST_WINDOW: Duration = Duration::from_millis(1600);

    async fn tokens_across_expiry_and_step(back: i64) -> (u64, u64) {
        let nodes: Vec<RedisServer> = (0..3).map(|_| start()).collect();
        let hosts: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let url = format!("redlock://{}?{WINDOW}", hosts.join(","));
        let store = RedlockStore::connect(RedlockConfig::from_url(&url).expect("config"))
            .await
            .expect("connect");
        let key = "clock:redlock";
        let lease = store
            .try_acquire(key, Duration::from_secs(1))
            .await
            .expect("granted");
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        sleep(PAST_WINDOW).await;
        for node in &nodes {
            node.clock()
                .expect("a stepped clock")
                .step_micros(-back)
                .expect("step");
        }
        let next = store
            .try_acquire(key, Duration::from_secs(1))
            .await
            .expect("granted");
        assert_eq!(
            store.release(&next).await.expect("release"),
            ReleaseOutcome::Released
        );
        (lease.fencing_token(), next.fencing_token())
    }

    #[tokio::test]
    async fn a_step_back_within_max_skew_after_the_fences_expired_keeps_tokens_growing() {
        let (first, second) = tokens_across_expiry_and_step(900_000).await;
        assert!(second > first, "{second} after {first}");
    }

    #[tokio::test]
    async fn a_step_back_beyond_max_skew_after_the_fences_expired_mints_a_smaller_token() {
        let (first, second) = tokens_across_expiry_and_step(3_000_000).await;
        assert!(second < first, "{second} after {first}");
    }
}
