//! Faults against real ZooKeeper servers: a killed leader, a stopped follower and a full restart
//! (each on an ensemble of its own), a holder cut off through a relay, and a holder process
//! killed with `SIGKILL` or frozen with `SIGSTOP` (on the shared standalone server, which they
//! leave as it was).
//!
//! Every bound comes from the crate docs' "TTLs, sessions and loss": a lease of TTL `t` lives on
//! a session of `t` rounded up to the tick, and is granted that TTL; a disconnected session's
//! leases are revoked [`loss_delay`] after the client sees the disconnection; a dead (or
//! frozen, or cut off) holder's session ends within its timeout plus two ticks.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::raw::LeaseExt;
use fencelock_core::{raw::drift, Error, KeepAlive, LockStore, ReleaseOutcome};
use fencelock_zookeeper::ZookeeperStore;
use test_servers::zookeeper::{MAX_SESSION_TIMEOUT, TICK};
use test_servers::{FreezableRelay, ZookeeperEnsemble};
use tokio::task::block_in_place;
use tokio::time::{sleep, timeout, Instant};

/// The leases of these tests, by the session each lives on (negotiated with test-servers'
/// `minSessionTimeout` of 200 ms and `maxSessionTimeout` of 10 s, `tickTime` 100 ms).
///
/// 9.9 s (the server's maximum less a tick): the longest session but one, so a holder has
/// nearly the longest [`loss_delay`] there is (3.4 s) to reconnect in while the ensemble
/// elects a leader; not the longest, which every handle asks for once when it connects (to
/// learn the server's maximum) and closes at once, but `cons` may still list.
const LONG_TTL: Duration = MAX_SESSION_TIMEOUT.saturating_sub(TICK);
/// 4 s: a session of 4 s.
const TTL: Duration = Duration::from_secs(4);
/// 2 s: a session of 2 s, for the handles that only look on (a timeout of their own, so
/// `cons` tells the holder's session from theirs).
const ONLOOKER_TTL: Duration = Duration::from_secs(2);

/// The negotiated session of a lease of `ttl`: `ttl` rounded up to the tick, the granule the
/// store estimates as half the server's `minSessionTimeout` (the crate docs' "a session per
/// TTL").
fn session_of(ttl: Duration) -> Duration {
    let ticks = ttl.as_nanos().div_ceil(TICK.as_nanos());
    let session = TICK * u32::try_from(ticks).expect("a TTL of the tests");
    assert!(session <= MAX_SESSION_TIMEOUT, "{ttl:?} is refused");
    session
}

/// How long after the client sees its connection drop a session's leases stay valid: the
/// crate's `loss_delay`, `0.35 × timeout − drift(timeout)`.
fn loss_delay(session: Duration) -> Duration {
    (session * 7 / 20).saturating_sub(drift(session))
}

/// A three-member ensemble of the test's own (it kills, stops or restarts members).
async fn own_ensemble() -> ZookeeperEnsemble {
    tokio::task::spawn_blocking(|| ZookeeperEnsemble::start(3))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The member that serves the one session of `timeout` (none while it reconnects).
fn member_of(ensemble: &ZookeeperEnsemble, timeout: Duration) -> Option<usize> {
    match block_in_place(|| ensemble.members_serving_timeout(timeout))[..] {
        [member] => Some(member),
        _ => None,
    }
}

/// A handle holding `key` for `ttl` on a session served by a member `wanted` accepts.
/// The client picks a server at random, so handles are made until one lands there (each
/// has a chance of one in three, or better: fifty tries all missing is below 10⁻⁸).
async fn holder_on(
    ensemble: &ZookeeperEnsemble,
    key: &str,
    ttl: Duration,
    wanted: impl Fn(usize) -> bool,
) -> (Arc<ZookeeperStore>, fencelock_core::Lease, usize) {
    let session = session_of(ttl);
    for _ in 0..50 {
        let holder = Arc::new(common::store(&ensemble.url(), "").await);
        let lease = holder.try_acquire(key, ttl).await.expect("a free key");
        assert_eq!(holder.session_timeouts().await.last(), Some(&session));
        let member = member_of(ensemble, session).expect("one member serves the holder's session");
        if wanted(member) {
            return (holder, lease, member);
        }
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        // The lease holds its session too.
        drop((holder, lease));
        // The dropped client closes its session: wait until no member lists it any more.
        let started = Instant::now();
        while !block_in_place(|| ensemble.members_serving_timeout(session)).is_empty() {
            assert!(
                started.elapsed() < session * 2,
                "a dropped handle's session is still served"
            );
            sleep(TICK).await;
        }
    }
    panic!("no handle of 50 had its session served by the member wanted");
}

/// Retries `attempt` while the store answers `Unavailable` (a handle's short sessions
/// reconnecting after a fault), for up to `within`.
async fn retrying<T, F, Fut>(within: Duration, mut attempt: F) -> fencelock_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fencelock_core::Result<T>>,
{
    let until = Instant::now() + within;
    loop {
        match attempt().await {
            Err(error) if error.is_retryable() && Instant::now() < until => sleep(TICK).await,
            answer => return answer,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_keeps_the_holders_lock_and_tokens_keep_growing() {
    let mut ensemble = own_ensemble().await;
    let key = "faults:leader";
    let leader = block_in_place(|| ensemble.leader()).expect("a leader");
    // The holder's session is on the leader, so the kill makes it move to another server.
    let (holder, lease, member) = holder_on(&ensemble, key, LONG_TTL, |m| m == leader).await;
    assert_eq!(member, leader);
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    let other = common::store(&ensemble.url(), "").await;

    block_in_place(|| ensemble.kill(leader)).expect("kill the leader");
    let killed_at = Instant::now();
    let session = session_of(LONG_TTL);
    // The client sees the connection reset at once; the lease lives while it reconnects
    // within the loss delay, which the election must leave it.
    let moved = loop {
        if let Some(to) = member_of(&ensemble, session) {
            break to;
        }
        assert!(
            !kept.is_lost(),
            "the lease was lost {:?} after the leader's kill: {:?}",
            killed_at.elapsed(),
            kept.lost_reason()
        );
        assert!(
            killed_at.elapsed() < loss_delay(session) + TICK * 2,
            "the holder's session found no server within the loss delay"
        );
        sleep(TICK / 2).await;
    };
    println!(
        "the holder's session moved from member {leader} to member {moved} {:?} after the kill",
        killed_at.elapsed()
    );
    assert_ne!(moved, leader);
    // Held across the election, by the store's word and the holder's.
    let tried = retrying(session, || other.try_acquire(key, ONLOOKER_TTL)).await;
    assert!(matches!(tried, Err(Error::Busy { .. })), "{tried:?}");
    holder
        .extend(&lease)
        .await
        .expect("the lease survived the election");
    let after = retrying(session, || {
        other.try_acquire("faults:leader:after", ONLOOKER_TTL)
    })
    .await
    .expect("a grant from the new leader");
    assert!(after.fencing_token() > lease.fencing_token());
    assert_eq!(
        other.release(&after).await.unwrap(),
        ReleaseOutcome::Released
    );

    // The old leader back, as a follower: nothing changes for the holder.
    block_in_place(|| ensemble.restart(leader)).expect("restart the old leader");
    assert!(!kept.is_lost(), "{:?}", kept.lost_reason());
    let lease = kept.stop().await;
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let next = retrying(session, || other.try_acquire(key, ONLOOKER_TTL))
        .await
        .expect("the released key");
    assert!(next.fencing_token() > after.fencing_token());
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A holder whose server is frozen hears nothing from it: the client gives the connection up
/// and reconnects to a live server. If the shuffled server list puts the frozen one first, that
/// attempt waits out its connection timeout (2/5 of the session) and the loss delay passes:
/// the lease is revoked, and the key is let in to another only once the ensemble expires the
/// session. Either way no one else is granted the key while the holder's lease is valid, and
/// the ensemble (two of three) keeps serving everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_follower_leaves_the_store_serving_and_its_holder_moves_or_is_told_first() {
    let ensemble = own_ensemble().await;
    let key = "faults:follower";
    let leader = block_in_place(|| ensemble.leader()).expect("a leader");
    let (holder, lease, follower) = holder_on(&ensemble, key, TTL, |m| m != leader).await;
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    let lost = kept.lost_token();
    let lost_at = tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    });
    // The onlookers reach the two live members only.
    let live: Vec<String> = ensemble
        .endpoints()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != follower)
        .map(|(_, endpoint)| endpoint)
        .collect();
    let live_url = format!("zookeeper://{}", live.join(","));
    let other = common::store(&live_url, "").await;
    let waiter = Arc::new(common::store(&live_url, "").await);
    let waiting = tokio::spawn(async move {
        let next = waiter.acquire(key, ONLOOKER_TTL, TTL * 4).await;
        let granted_at = Instant::now();
        // Kept alive: it may be granted seconds before the test looks (the holder's session
        // expiring early in the stop).
        let next = next.map(|lease| KeepAlive::start(waiter.clone(), lease));
        (next, granted_at, waiter)
    });

    block_in_place(|| ensemble.pause(follower)).expect("SIGSTOP the follower");
    let stopped_at = Instant::now();
    // The store keeps working on the other two: grants, with growing tokens, and releases.
    let mut last = lease.fencing_token();
    let session = session_of(TTL);
    while stopped_at.elapsed() < session * 2 {
        let granted = retrying(session, || {
            other.try_acquire("faults:follower:other", ONLOOKER_TTL)
        })
        .await
        .expect("the two live members serve");
        assert!(granted.fencing_token() > last);
        last = granted.fencing_token();
        assert_eq!(
            other.release(&granted).await.unwrap(),
            ReleaseOutcome::Released
        );
        sleep(TICK).await;
    }
    let kept_through = !kept.is_lost();
    println!(
        "with its server stopped for {:?}, the holder {} (session now on {:?})",
        stopped_at.elapsed(),
        if kept_through {
            "moved and kept its lock".to_owned()
        } else {
            format!("was told its lease was lost: {:?}", kept.lost_reason())
        },
        member_of(&ensemble, session)
    );
    block_in_place(|| ensemble.resume(follower)).expect("SIGCONT the follower");
    let lease = kept.stop().await;

    if kept_through {
        // Still held: the waiter is still queued, and the holder acts and releases.
        assert!(!waiting.is_finished(), "the waiter got a key still held");
        lost_at.abort();
        holder.extend(&lease).await.expect("the lease is held");
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    let (next, granted_at, waiter) = timeout(TTL * 4, waiting)
        .await
        .expect("the waiter is served")
        .expect("join");
    let next = next.expect("the next holder gets the key").stop().await;
    assert!(next.fencing_token() > lease.fencing_token());
    if !kept_through {
        // Told first: the signal came before the ensemble let the next holder in.
        let lost_at = lost_at.await.expect("the lost signal's instant");
        assert!(
            lost_at < granted_at,
            "the next holder was granted {:?} before the lost signal",
            lost_at - granted_at
        );
        assert_eq!(holder.release(&lease).await.unwrap(), ReleaseOutcome::Lost);
    }
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_is_told_before_the_server_lets_the_next_holder_in() {
    let server = ZookeeperEnsemble::shared_standalone();
    let relay = FreezableRelay::start(&server.endpoints()[0]).expect("a relay");
    let holder = Arc::new(common::store(&format!("zookeeper://{}", relay.address()), "").await);
    let other = common::store(&server.url(), "").await;
    let key = "faults:cut";
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    let kept = KeepAlive::start(holder.clone(), lease.clone());
    let lost = kept.lost_token();
    let lost_at = tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    });
    let waiting = tokio::spawn(async move {
        let next = other.acquire(key, TTL, TTL * 4).await;
        (next, Instant::now(), other)
    });
    sleep(TTL / 4).await;
    assert!(!kept.is_lost(), "{:?}", kept.lost_reason());

    // The holder's connection goes silent both ways; it runs on, so it can notice.
    relay.freeze(true);
    let frozen_at = Instant::now();
    let (next, granted_at, other) = timeout(TTL * 4, waiting)
        .await
        .expect("the waiter is served once the ensemble expires the holder's session")
        .expect("join");
    let next = next.expect("the next holder gets the key");
    let lost_at = timeout(TTL, lost_at)
        .await
        .expect("the lost signal fires")
        .expect("join");
    println!(
        "cut off: lost signal {:?} and next grant {:?} after the freeze (session {:?})",
        lost_at - frozen_at,
        granted_at - frozen_at,
        session_of(TTL)
    );
    assert!(
        lost_at < granted_at,
        "the next holder was granted {:?} before the lost signal",
        lost_at - granted_at
    );
    // Freed by the session's expiry: the holder's deadline task cannot reach the server. Its
    // last heartbeat came before the freeze, so within the session plus two ticks of it, and a
    // tick more for the waiter's own turn (as for a killed holder, below).
    assert!(
        granted_at <= frozen_at + session_of(TTL) + TICK * 3,
        "the key was freed only {:?} after the freeze",
        granted_at - frozen_at
    );
    assert!(next.fencing_token() > lease.fencing_token());

    // Back: the holder's session is gone, and with it the lease.
    relay.freeze(false);
    let lease = kept.stop().await;
    assert!(matches!(
        holder.extend(&lease).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        holder.try_acquire(key, TTL).await,
        Err(Error::Busy { .. })
    ));
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// The release of a lease whose session the ensemble expired: its node went with the session,
/// so the lease is lost, and the release says so (the contract's `ReleaseOutcome::Lost`), not
/// that the store is unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_its_session_expired_reports_lost() {
    let server = ZookeeperEnsemble::shared_standalone();
    let relay = FreezableRelay::start(&server.endpoints()[0]).expect("a relay");
    let holder = common::store(&format!("zookeeper://{}", relay.address()), "").await;
    let other = common::store(&server.url(), "").await;
    let key = "faults:expired-release";
    let lease = holder.try_acquire(key, TTL).await.unwrap();
    relay.freeze(true);
    // Expired once the ensemble lets the next holder in.
    let next = other
        .acquire(key, TTL, TTL * 4)
        .await
        .expect("the next holder gets the key once the session expires");
    timeout(TTL, lease.revocation().revoked())
        .await
        .expect("the lease is revoked");
    relay.freeze(false);
    let released = holder.release(&lease).await;
    assert!(
        matches!(released, Ok(ReleaseOutcome::Lost)),
        "the release of a lease whose session expired gave {released:?}"
    );
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Every member killed with `SIGKILL` and started again, right after a grant whose token is
/// ahead of the clock (the token offset set far ahead by hand, as a swap from a store that was
/// ahead leaves it): that grant's write was acknowledged only once a quorum had synced it
/// (`forceSync=yes`), so the next token is above it, not a clock reading below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_ensemble_keeps_tokens_growing() {
    let mut ensemble = own_ensemble().await;
    let store = common::store(&ensemble.url(), "").await;
    let mut before = 0;
    for key in ["faults:restart:a", "faults:restart:b", "faults:restart:a"] {
        let lease = store.try_acquire(key, TTL).await.unwrap();
        assert!(lease.fencing_token() > before);
        before = lease.fencing_token();
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // A year ahead of every token so far (which follow the clock in µs).
    let ahead = before + 365 * 24 * 3600 * 1_000_000;
    let raw = common::raw(&ensemble.url()).await;
    let offset = format!("{}/~offset", fencelock_zookeeper::DEFAULT_PREFIX);
    raw.set_data(&offset, ahead.to_string().as_bytes(), None)
        .await
        .expect("set the token offset ahead by hand");
    drop(raw);
    let lease = store.try_acquire("faults:restart:b", TTL).await.unwrap();
    assert!(
        lease.fencing_token() > ahead,
        "{:#x} after the offset {ahead:#x}",
        lease.fencing_token()
    );
    before = lease.fencing_token();
    drop(store);

    block_in_place(|| ensemble.restart_all()).expect("kill and restart every member");
    let store = common::store(&ensemble.url(), "").await;
    for key in ["faults:restart:a", "faults:restart:c"] {
        let lease = retrying(TTL, || store.try_acquire(key, TTL))
            .await
            .expect("a grant after the restart");
        assert!(
            lease.fencing_token() > before,
            "{key}: {:#x} after {before:#x}",
            lease.fencing_token()
        );
        before = lease.fencing_token();
        assert_eq!(
            store.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// The child process's role, its store URL and its output file.
const ROLE: &str = "LOCK_ZOOKEEPER_CHILD";
const URL: &str = "LOCK_ZOOKEEPER_URL";
const OUT: &str = "LOCK_ZOOKEEPER_OUT";
const KILLED_KEY: &str = "faults:killed";

/// Not a test: the child processes' entry point. Does nothing unless the test that started
/// the process set `LOCK_ZOOKEEPER_CHILD`. As `hold`, it takes [`KILLED_KEY`] for [`TTL`],
/// keeps it alive, writes its token and its session timeout to the output file, and waits
/// to be killed.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "hold");
    let url = std::env::var(URL).expect("LOCK_ZOOKEEPER_URL");
    let out = std::env::var(OUT).expect("LOCK_ZOOKEEPER_OUT");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let store = Arc::new(common::store(&url, "").await);
        let lease = store
            .try_acquire(KILLED_KEY, TTL)
            .await
            .expect("a free key");
        let _kept = KeepAlive::start(store.clone(), lease.clone());
        let session = store
            .session_timeouts()
            .await
            .last()
            .copied()
            .expect("a session");
        let line = format!("{} {}\n", lease.fencing_token(), session.as_millis());
        std::fs::write(&out, line).expect("write the output");
        sleep(Duration::from_secs(120)).await;
    });
}

/// Starts this test binary again as a child process in `role`.
fn spawn_child(role: &str, url: &str, out: &Path) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(URL, url)
        .env(OUT, out)
        .spawn()
        .expect("the child process starts")
}

/// Waits for the child's line (its token and its session timeout, in ms).
async fn child_line(child: &mut Child, out: &Path) -> (u64, Duration) {
    let started = Instant::now();
    let line = loop {
        match std::fs::read_to_string(out) {
            Ok(text) if text.ends_with('\n') => break text,
            _ => {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "the child never held the key"
                );
                if let Some(status) = child.try_wait().expect("try_wait") {
                    panic!("the child exited before holding the key: {status}");
                }
                sleep(TICK / 2).await;
            }
        }
    };
    let _ = std::fs::remove_file(out);
    let (token, session) = line
        .trim()
        .split_once(' ')
        .and_then(|(t, s)| Some((t.parse::<u64>().ok()?, s.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("the child wrote {line:?}"));
    (token, Duration::from_millis(session))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_key_within_its_session_timeout() {
    let url = ZookeeperEnsemble::shared_standalone().url();
    let out =
        std::env::temp_dir().join(format!("lock-zookeeper-killed-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let mut child = spawn_child("hold", &url, &out);
    let (token, session) = child_line(&mut child, &out).await;
    assert_eq!(session, session_of(TTL));

    let waiter = common::store(&url, "").await;
    let waiting = tokio::spawn(async move {
        let next = waiter.acquire(KILLED_KEY, TTL, TTL * 4).await;
        (next, Instant::now(), waiter)
    });
    // Queued behind the child's node before the kill.
    sleep(TICK * 2).await;
    assert!(!waiting.is_finished());
    child.kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    let _ = child.wait();

    let (next, granted_at, waiter) = timeout(TTL * 4, waiting)
        .await
        .expect("the waiter is served")
        .expect("join");
    let next = next.expect("the next holder gets the key");
    let freed_after = granted_at - killed_at;
    println!("the killed holder's key was granted again {freed_after:?} after the kill");
    // The crate docs' bound: the session timeout plus two ticks after the last heartbeat
    // (which came before the kill), and a tick more for the waiter's own turn (the
    // notification, a sync and a read on a loopback server).
    assert!(
        freed_after <= session + TICK * 3,
        "the key was free only {freed_after:?} after its holder died (session {session:?})"
    );
    assert!(next.fencing_token() > token);
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// The contract's holder pauses: a holder process frozen (`SIGSTOP`) keeps its key until its
/// lease's local deadline, as on every store; past it the next holder gets the key. The lease
/// was asked for after the child started, so its deadline is at least the start plus the TTL
/// less its drift. A store whose session is shorter than the lease's TTL fails it: on a
/// session of half the TTL, the ensemble expired it (and gave the key away) about 1.6 s into
/// the pause, while the frozen holder's lease was valid for at least 2 s more (nemesis's
/// `pause` found it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_process_keeps_its_key_until_its_lease_deadline() {
    let url = ZookeeperEnsemble::shared_standalone().url();
    let out =
        std::env::temp_dir().join(format!("lock-zookeeper-paused-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let spawned_at = Instant::now();
    let mut child = spawn_child("hold", &url, &out);
    let (token, session) = child_line(&mut child, &out).await;
    assert_eq!(session, session_of(TTL));
    let _ = std::fs::remove_file(&out);
    let stopped = Command::new("kill")
        .args(["-STOP", &child.id().to_string()])
        .status()
        .expect("kill -STOP runs");
    assert!(stopped.success(), "SIGSTOP the holder: {stopped}");
    let waiter = common::store(&url, "").await;
    let next = waiter.acquire(KILLED_KEY, TTL, TTL * 4).await;
    let granted_at = Instant::now();
    child.kill().expect("SIGKILL the holder");
    let _ = child.wait();
    let next = next.expect("the next holder gets the key");
    let deadline_at_least = spawned_at + TTL - drift(TTL);
    assert!(
        granted_at >= deadline_at_least,
        "the key was granted {:?} before the frozen holder's lease deadline (at the earliest)",
        deadline_at_least - granted_at
    );
    assert!(next.fencing_token() > token);
    assert_eq!(
        waiter.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}
