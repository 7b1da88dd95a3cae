//! The cases. Each proves one guarantee of the contract and names it.

use std::future::pending;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::validate::{MAX_KEY_LEN, MAX_WAIT};
use lock_core::{
    drift, with_lock, Acquire, Capabilities, DynLockStore, Error, Extend, FenceGate, KeyStatus,
    Lease, LockOptions, LockStore, Release, ReleaseOutcome,
};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::runner::{Case, CaseResult, Failure};
use crate::Ctx;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($msg)+)));
        }
    };
}

macro_rules! cases {
    ($($name:ident $(if $applies:expr)?),* $(,)?) => {
        /// Every case of the suite, in the order [`run_all`](crate::run_all) runs them.
        pub static CASES: &[Case] = &[
            $(Case {
                name: stringify!($name),
                applies: cases!(@applies $($applies)?),
                run: |ctx| Box::pin($name(ctx)),
            }),*
        ];
    };
    (@applies) => { |_: &Capabilities| true };
    (@applies $applies:expr) => { $applies };
}

/// The case list, written once: calls `$callback! { $($prefix)* case, case if applies, … }` with
/// every case in suite order, each optionally followed by `if` and a `fn(&Capabilities) -> bool`
/// saying when it applies. [`CASES`] and [`conformance_tests!`](crate::conformance_tests) are
/// both generated from it, so adding a case is one line here (and its `async fn`).
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_case {
    ($callback:path $(, $($prefix:tt)*)?) => {
        $callback! {
            $($($prefix)*)?
            try_acquire_grants_a_free_key,
            try_acquire_on_a_held_key_is_busy,
            acquire_is_exclusive_under_contention,
            waiting_acquire_gets_the_key_after_release,
            wait_times_out_within_its_bound,
            zero_wait_makes_one_attempt,
            waiter_is_woken_promptly_after_release,
            notified_waiter_gets_a_released_key_within_150_ms if |c: &Capabilities| c.notified_wait,
            waiter_gets_the_key_when_the_holder_expires,
            many_waiters_all_get_the_lock,
            fair_queue_serves_the_oldest_waiter_first if |c: &Capabilities| c.fair_queue,
            release_of_a_held_lease_reports_released,
            release_by_non_owner_is_rejected,
            release_after_expiry_reports_lost,
            second_release_reports_lost,
            extend_keeps_a_lease_past_its_first_ttl,
            extend_after_expiry_fails_and_does_not_resurrect,
            extend_by_a_stale_lease_is_rejected,
            extend_moves_the_local_deadline,
            extend_keeps_the_key_until_the_new_local_deadline,
            local_deadline_is_conservative,
            expiry_frees_the_key,
            tokens_increase_sequentially,
            tokens_increase_after_expiry,
            tokens_increase_across_handles,
            tokens_increase_under_contention,
            independent_keys_do_not_contend,
            keys_are_data_not_code,
            similar_keys_are_distinct,
            long_keys_are_distinct_over_their_whole_length,
            max_length_key_is_accepted,
            over_long_key_is_rejected,
            empty_key_is_rejected,
            zero_ttl_is_rejected,
            ttl_outside_store_bounds_is_rejected,
            absurd_wait_is_rejected,
            keep_alive_holds_a_lease_over_five_ttls,
            keep_alive_survives_transient_extend_failures,
            lost_signal_fires_within_a_third_of_the_ttl_of_a_forget,
            lost_signal_fires_before_store_expiry_when_extends_stall,
            with_lock_cancels_its_body_on_loss,
            with_lock_releases_at_the_end,
            cancelled_acquire_leaves_nothing_held_past_ttl,
            dropped_waiter_never_acquires_later,
            dead_holder_frees_the_key_on_disconnect if |c: &Capabilities| c.frees_on_disconnect,
            unreachable_store_gives_a_retryable_error,
            status_reports_the_holder,
        }
    };
}

crate::__for_each_case!(cases);

// ---- helpers --------------------------------------------------------------------------------

fn expect_busy(result: lock_core::Result<Lease>, what: &str) -> CaseResult {
    match result {
        Err(Error::Busy { .. }) => Ok(()),
        Ok(lease) => Err(Failure(format!(
            "{what}: the key was granted (token {}) while another lease held it",
            lease.fencing_token()
        ))),
        Err(other) => Err(Failure(format!("{what}: expected Busy, got {other}"))),
    }
}

fn expect_invalid(result: lock_core::Result<Lease>, input: &str, what: &str) -> CaseResult {
    match result {
        Err(Error::InvalidInput { what: field, rule }) => {
            ensure!(
                field == input,
                "{what}: the error named {field:?} ({rule}) instead of {input:?}"
            );
            ensure!(
                !rule.is_empty(),
                "{what}: the error does not say which rule"
            );
            Ok(())
        }
        Ok(_) => Err(Failure(format!("{what}: the request was accepted"))),
        Err(other) => Err(Failure(format!(
            "{what}: expected InvalidInput for {input}, got {other}"
        ))),
    }
}

fn expect_lost(result: lock_core::Result<()>, what: &str) -> CaseResult {
    match result {
        Err(Error::LeaseLost { .. }) => Ok(()),
        Ok(()) => Err(Failure(format!("{what}: extend succeeded"))),
        Err(other) => Err(Failure(format!("{what}: expected LeaseLost, got {other}"))),
    }
}

async fn released(store: &DynLockStore, lease: &Lease, what: &str) -> CaseResult {
    let outcome = store.release(lease).await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "{what}: release of a held lease reported {outcome:?}"
    );
    Ok(())
}

/// Sleeps until `lease`'s key has certainly expired in the store.
async fn outlive(ctx: &Ctx, lease: &Lease) {
    sleep(lease.ttl() + ctx.timing.slack).await;
}

/// A store wrapper whose extend never answers: a holder cut off from the store.
#[derive(Debug)]
struct Stalled(DynLockStore);

#[async_trait]
impl Acquire for Stalled {
    async fn try_acquire(&self, key: &str, ttl: Duration) -> lock_core::Result<Lease> {
        self.0.try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> lock_core::Result<Lease> {
        self.0.acquire(key, ttl, wait).await
    }
}

#[async_trait]
impl Release for Stalled {
    async fn release(&self, lease: &Lease) -> lock_core::Result<ReleaseOutcome> {
        self.0.release(lease).await
    }
}

#[async_trait]
impl Extend for Stalled {
    async fn extend(&self, _: &Lease) -> lock_core::Result<()> {
        pending().await
    }
}

#[async_trait]
impl LockStore for Stalled {
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

/// An extend-only wrapper for a keep-alive: its first `failures` extends fail with a retryable
/// error without reaching the store (a transient outage), later ones are forwarded, and every
/// confirmed extend is counted on a watch channel so a case can act right after one.
#[derive(Debug)]
struct WatchedExtends {
    store: DynLockStore,
    failures_left: AtomicU32,
    confirmed: watch::Sender<u32>,
}

impl WatchedExtends {
    fn failing_first(store: DynLockStore, failures: u32) -> Self {
        WatchedExtends {
            store,
            failures_left: AtomicU32::new(failures),
            confirmed: watch::Sender::new(0),
        }
    }

    /// Sees each extend the store confirms from now on.
    fn confirmed(&self) -> watch::Receiver<u32> {
        self.confirmed.subscribe()
    }
}

#[async_trait]
impl Extend for WatchedExtends {
    async fn extend(&self, lease: &Lease) -> lock_core::Result<()> {
        let fail = self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(Error::Unavailable {
                message: "a transient failure injected by the conformance suite".into(),
                source: None,
            });
        }
        self.store.extend(lease).await?;
        self.confirmed.send_modify(|count| *count += 1);
        Ok(())
    }
}

// ---- acquire --------------------------------------------------------------------------------

async fn try_acquire_grants_a_free_key(ctx: Ctx) -> CaseResult {
    let key = ctx.key("free");
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    ensure!(lease.key() == key, "the lease names key {:?}", lease.key());
    ensure!(
        lease.ttl() >= ctx.timing.long_ttl,
        "the lease's TTL {:?} is shorter than requested",
        lease.ttl()
    );
    ensure!(lease.fencing_token() > 0, "the fencing token is 0");
    released(&ctx.store, &lease, "after try_acquire").await
}

async fn try_acquire_on_a_held_key_is_busy(ctx: Ctx) -> CaseResult {
    let key = ctx.key("busy");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let started = Instant::now();
    expect_busy(
        other.try_acquire(&key, ctx.timing.long_ttl).await,
        "other handle",
    )?;
    expect_busy(
        ctx.store.try_acquire(&key, ctx.timing.long_ttl).await,
        "same handle",
    )?;
    ensure!(
        started.elapsed() < ctx.timing.wake_bound,
        "try_acquire waited {:?} instead of making one attempt",
        started.elapsed()
    );
    released(&ctx.store, &lease, "holder").await
}

/// Runs `tasks` holders over two handles, each doing a read-modify-write of a fenced counter
/// inside the lock; returns the tokens in the order their holders entered.
async fn contend(ctx: &Ctx, key: &str, tasks: usize) -> Result<Vec<u64>, Failure> {
    let handles = [ctx.store.clone(), ctx.handle().await];
    let value = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(FenceGate::new());
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for i in 0..tasks {
        let store = handles[i % 2].clone();
        let (key, value, inside, gate, order) = (
            key.to_owned(),
            value.clone(),
            inside.clone(),
            gate.clone(),
            order.clone(),
        );
        let (ttl, wait) = (ctx.timing.long_ttl, ctx.timing.case_limit / 2);
        joins.push(tokio::spawn(async move {
            let lease = store.acquire(&key, ttl, wait).await?;
            let overlapped = inside.swap(true, Ordering::SeqCst);
            // Claim at the read, write only while the claim holds: the fencing pattern.
            let claimed = gate.claim(lease.fencing_token());
            let seen = value.load(Ordering::SeqCst);
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(lease.fencing_token());
            sleep(Duration::from_millis(2)).await;
            let written = gate.write(lease.fencing_token(), || {
                value.store(seen + 1, Ordering::SeqCst)
            });
            let fenced = claimed.and(written);
            inside.store(false, Ordering::SeqCst);
            let outcome = store.release(&lease).await?;
            Ok::<_, Error>((overlapped, fenced.is_err(), outcome))
        }));
    }
    for join in joins {
        let (overlapped, stale, outcome) = join
            .await
            .map_err(|e| Failure(format!("a contender panicked: {e}")))??;
        ensure!(!overlapped, "two contenders held the key at the same time");
        ensure!(
            !stale,
            "a holder's token was not greater than its predecessor's"
        );
        ensure!(
            outcome == ReleaseOutcome::Released,
            "a holder's release reported {outcome:?}"
        );
    }
    let total = value.load(Ordering::SeqCst);
    ensure!(
        total == tasks as u64,
        "the fenced counter is {total} after {tasks} exclusive increments"
    );
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(order)
}

async fn acquire_is_exclusive_under_contention(ctx: Ctx) -> CaseResult {
    contend(&ctx, &ctx.key("contention"), 32).await.map(drop)
}

async fn waiting_acquire_gets_the_key_after_release(ctx: Ctx) -> CaseResult {
    let key = ctx.key("wait-release");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let waiter = tokio::spawn({
        let (key, ttl, wait) = (key.clone(), ctx.timing.long_ttl, ctx.timing.long_ttl);
        async move { other.acquire(&key, ttl, wait).await }
    });
    sleep(Duration::from_millis(100)).await;
    ensure!(
        !waiter.is_finished(),
        "the waiter returned while the key was held"
    );
    released(&ctx.store, &lease, "holder").await?;
    let next = waiter
        .await
        .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
    ensure!(
        next.fencing_token() > lease.fencing_token(),
        "the waiter's token is not greater"
    );
    released(&ctx.store, &next, "waiter").await
}

async fn wait_times_out_within_its_bound(ctx: Ctx) -> CaseResult {
    let key = ctx.key("wait-bound");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let wait = Duration::from_millis(700);
    let started = Instant::now();
    let result = other.acquire(&key, ctx.timing.long_ttl, wait).await;
    let elapsed = started.elapsed();
    match result {
        Err(Error::WaitTimedOut { waited, .. }) => {
            ensure!(
                elapsed >= wait,
                "gave up early, after {elapsed:?} of {wait:?}"
            );
            ensure!(waited >= wait, "reports waiting {waited:?} of {wait:?}");
            ensure!(
                elapsed <= wait + ctx.timing.slack,
                "returned {elapsed:?} after a wait bound of {wait:?}"
            );
        }
        Ok(_) => return Err(Failure("granted while the key was held".into())),
        Err(other) => return Err(Failure(format!("expected WaitTimedOut, got {other}"))),
    }
    released(&ctx.store, &lease, "holder").await
}

async fn zero_wait_makes_one_attempt(ctx: Ctx) -> CaseResult {
    let key = ctx.key("zero-wait");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let started = Instant::now();
    match other
        .acquire(&key, ctx.timing.long_ttl, Duration::ZERO)
        .await
    {
        Err(Error::WaitTimedOut { .. } | Error::Busy { .. }) => {}
        Ok(_) => return Err(Failure("granted while the key was held".into())),
        Err(other) => return Err(Failure(format!("expected WaitTimedOut, got {other}"))),
    }
    ensure!(
        started.elapsed() < ctx.timing.wake_bound,
        "a zero wait took {:?}",
        started.elapsed()
    );
    released(&ctx.store, &lease, "holder").await?;
    let lease = other
        .acquire(&key, ctx.timing.long_ttl, Duration::ZERO)
        .await?;
    released(&other, &lease, "zero-wait acquire of a free key").await
}

async fn waiter_is_woken_promptly_after_release(ctx: Ctx) -> CaseResult {
    let key = ctx.key("wake");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let waiter = tokio::spawn({
        let (key, ttl, wait) = (key.clone(), ctx.timing.long_ttl, ctx.timing.long_ttl);
        async move {
            let lease = other.acquire(&key, ttl, wait).await;
            (lease, Instant::now(), other)
        }
    });
    sleep(Duration::from_millis(300)).await;
    released(&ctx.store, &lease, "holder").await?;
    let released_at = Instant::now();
    let (next, woke_at, other) = timeout(ctx.timing.wake_bound * 2, waiter)
        .await
        .map_err(|_| {
            Failure(format!(
                "the waiter still waited {:?} after the release (TTL {:?}): it was not woken",
                ctx.timing.wake_bound * 2,
                ctx.timing.long_ttl
            ))
        })?
        .map_err(|e| Failure(format!("waiter panicked: {e}")))?;
    let next = next?;
    let delay = woke_at.saturating_duration_since(released_at);
    ensure!(
        delay <= ctx.timing.wake_bound,
        "the waiter took {delay:?} to get a released key"
    );
    released(&other, &next, "waiter").await
}

/// A store that declares notified waits hands a released key to a parked waiter within
/// [`Timing::notified_wake_median`](crate::Timing) at the median of five handoffs, a bound
/// only a notification meets (a poller every 500 ms needs 250 ms at the median of random
/// phases); the median keeps one slow handoff on a loaded machine from failing the case. Each
/// handoff is timed from before the release is sent to the waiter holding the key.
async fn notified_waiter_gets_a_released_key_within_150_ms(ctx: Ctx) -> CaseResult {
    let key = ctx.key("notified");
    let ttl = ctx.timing.long_ttl;
    let handles = [ctx.store.clone(), ctx.handle().await];
    let mut holder = handles[0].try_acquire(&key, ttl).await?;
    let mut handoffs = Vec::new();
    for round in 0..5 {
        let (from, to) = (&handles[round % 2], handles[(round + 1) % 2].clone());
        let waiter = tokio::spawn({
            let key = key.clone();
            async move {
                let lease = to.acquire(&key, ttl, ttl).await;
                (lease, Instant::now())
            }
        });
        // Long enough for the waiter to be parked on its notification.
        sleep(Duration::from_millis(150)).await;
        ensure!(
            !waiter.is_finished(),
            "handoff {round}: the waiter returned while the key was held"
        );
        let sent_at = Instant::now();
        released(from, &holder, "holder").await?;
        let (next, granted_at) = timeout(ctx.timing.wake_bound * 2, waiter)
            .await
            .map_err(|_| {
                Failure(format!(
                    "handoff {round}: the waiter still waited {:?} after the release",
                    ctx.timing.wake_bound * 2
                ))
            })?
            .map_err(|e| Failure(format!("waiter panicked: {e}")))?;
        holder = next?;
        handoffs.push(granted_at.saturating_duration_since(sent_at));
    }
    released(&handles[1], &holder, "last waiter").await?;
    handoffs.sort_unstable();
    let median = handoffs[handoffs.len() / 2];
    let bound = ctx.timing.notified_wake_median;
    ensure!(
        median <= bound,
        "the store declares notified waits, but the median of 5 handoffs took {median:?} \
         (all: {handoffs:?}); a notification hands a released key over within {bound:?}"
    );
    Ok(())
}

async fn waiter_gets_the_key_when_the_holder_expires(ctx: Ctx) -> CaseResult {
    let key = ctx.key("wait-expiry");
    let other = ctx.handle().await;
    let started = Instant::now();
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    let next = other
        .acquire(&key, ctx.timing.long_ttl, ctx.timing.long_ttl)
        .await?;
    let elapsed = started.elapsed();
    ensure!(
        elapsed + Duration::from_millis(5) >= lease.ttl(),
        "the waiter got the key after {elapsed:?}, before the holder's TTL {:?}",
        lease.ttl()
    );
    ensure!(
        elapsed <= lease.ttl() + ctx.timing.slack + ctx.timing.wake_bound,
        "the waiter got an expired key only after {elapsed:?}"
    );
    ensure!(
        next.fencing_token() > lease.fencing_token(),
        "token did not increase"
    );
    released(&other, &next, "waiter").await
}

async fn many_waiters_all_get_the_lock(ctx: Ctx) -> CaseResult {
    let key = ctx.key("many-waiters");
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let store = ctx.handle().await;
        let (key, ttl, wait) = (key.clone(), ctx.timing.long_ttl, ctx.timing.long_ttl);
        waiters.push(tokio::spawn(async move {
            let lease = store.acquire(&key, ttl, wait).await?;
            sleep(Duration::from_millis(5)).await;
            let outcome = store.release(&lease).await?;
            Ok::<_, Error>((lease.fencing_token(), outcome))
        }));
    }
    sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    released(&ctx.store, &lease, "holder").await?;
    let mut tokens = Vec::new();
    for waiter in waiters {
        let (token, outcome) = waiter
            .await
            .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
        ensure!(
            outcome == ReleaseOutcome::Released,
            "a waiter's release reported {outcome:?}"
        );
        tokens.push(token);
    }
    ensure!(
        started.elapsed() <= ctx.timing.wake_bound * 8,
        "8 waiters took {:?} to pass the lock along",
        started.elapsed()
    );
    tokens.sort_unstable();
    tokens.dedup();
    ensure!(tokens.len() == 8, "waiters shared a token: {tokens:?}");
    Ok(())
}

async fn fair_queue_serves_the_oldest_waiter_first(ctx: Ctx) -> CaseResult {
    let key = ctx.key("fair");
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let store = ctx.handle().await;
        let (key, ttl, order) = (key.clone(), ctx.timing.long_ttl, order.clone());
        waiters.push(tokio::spawn(async move {
            let lease = store.acquire(&key, ttl, ttl).await?;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(i);
            store.release(&lease).await.map(drop)
        }));
        sleep(Duration::from_millis(250)).await;
    }
    released(&ctx.store, &lease, "holder").await?;
    for waiter in waiters {
        waiter
            .await
            .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
    }
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        order == [0, 1, 2, 3],
        "waiters were served in the order {order:?}"
    );
    Ok(())
}

// ---- release --------------------------------------------------------------------------------

async fn release_of_a_held_lease_reports_released(ctx: Ctx) -> CaseResult {
    let key = ctx.key("release");
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    released(&ctx.store, &lease, "holder").await?;
    let again = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await;
    let again = again.map_err(|e| Failure(format!("the key is not free after release: {e}")))?;
    released(&ctx.store, &again, "next holder").await
}

async fn release_by_non_owner_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale-release");
    let other = ctx.handle().await;
    let stale = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    outlive(&ctx, &stale).await;
    let current = other.try_acquire(&key, ctx.timing.long_ttl).await?;
    let outcome = ctx.store.release(&stale).await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "a stale lease's release reported {outcome:?}"
    );
    expect_busy(
        ctx.handle()
            .await
            .try_acquire(&key, ctx.timing.long_ttl)
            .await,
        "after a stale release the successor must still hold the key",
    )?;
    released(&other, &current, "successor").await
}

async fn release_after_expiry_reports_lost(ctx: Ctx) -> CaseResult {
    let key = ctx.key("release-expired");
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    outlive(&ctx, &lease).await;
    let outcome = ctx.store.release(&lease).await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "release after expiry reported {outcome:?}"
    );
    Ok(())
}

async fn second_release_reports_lost(ctx: Ctx) -> CaseResult {
    let key = ctx.key("release-twice");
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    released(&ctx.store, &lease, "first release").await?;
    let outcome = ctx.store.release(&lease).await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "a second release reported {outcome:?}"
    );
    Ok(())
}

// ---- extend ---------------------------------------------------------------------------------

async fn extend_keeps_a_lease_past_its_first_ttl(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    for _ in 0..4 {
        sleep(lease.ttl() / 2).await;
        ctx.store.extend(&lease).await?;
    }
    // Two TTLs after the grant, the lease is held only thanks to the extends.
    expect_busy(
        other.try_acquire(&key, ctx.timing.long_ttl).await,
        "after extends past the first TTL",
    )?;
    released(&ctx.store, &lease, "extended lease").await
}

async fn extend_after_expiry_fails_and_does_not_resurrect(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend-expired");
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    outlive(&ctx, &lease).await;
    expect_lost(ctx.store.extend(&lease).await, "extend after expiry")?;
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("the failed extend resurrected the lease: {e}")))?;
    released(&ctx.store, &next, "next holder").await
}

async fn extend_by_a_stale_lease_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale-extend");
    let other = ctx.handle().await;
    let stale = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    outlive(&ctx, &stale).await;
    let current = other.try_acquire(&key, ctx.timing.short_ttl).await?;
    expect_lost(ctx.store.extend(&stale).await, "a stale lease's extend")?;
    other.extend(&current).await?;
    released(&other, &current, "successor").await
}

async fn extend_moves_the_local_deadline(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend-deadline");
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    let first = lease.valid_until();
    sleep(lease.ttl() / 3).await;
    let sent_at = Instant::now();
    ctx.store.extend(&lease).await?;
    let second = lease.valid_until();
    ensure!(second > first, "extend did not move the local deadline");
    ensure!(
        second <= sent_at + lease.ttl() - drift(lease.ttl()) + Duration::from_millis(1),
        "the new deadline is not measured from before the extend was sent"
    );
    released(&ctx.store, &lease, "extended lease").await
}

/// After an extend the store keeps the key until at least the holder's new local deadline: a
/// tenth of the TTL before it (and past the grant's own expiry) another handle finds the key
/// busy. A store that renews for less than the TTL while the lease's deadline moves by the whole
/// TTL lets others take a key its holder believes it holds. A one-second TTL at least keeps the
/// margin to the store's real expiry (a tenth of the TTL plus the drift) wide on a loaded
/// machine.
async fn extend_keeps_the_key_until_the_new_local_deadline(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend-holds");
    let other = ctx.handle().await;
    let ttl = ctx
        .capabilities
        .granted_ttl(ctx.timing.short_ttl.max(Duration::from_secs(1)));
    let lease = ctx.store.try_acquire(&key, ttl).await?;
    sleep(lease.ttl() / 2).await;
    ctx.store.extend(&lease).await?;
    // Half a TTL after the grant, so this is past the grant's own expiry.
    sleep_until(lease.valid_until() - lease.ttl() / 10).await;
    let asked_at = Instant::now();
    match other.try_acquire(&key, ttl).await {
        Err(Error::Busy { .. }) => {}
        Ok(taken) => {
            let _ = other.release(&taken).await;
            // Only a request sent before the deadline proves anything; a sleep that overran
            // the deadline on a stalled machine proves nothing either way.
            ensure!(
                asked_at >= lease.valid_until(),
                "another handle took the key {:?} before the holder's local deadline after an \
                 extend: the extend renewed the key for less than its TTL {:?}",
                lease.valid_until() - asked_at,
                lease.ttl()
            );
            tracing::warn!("the check ran after the local deadline; nothing was proved");
            return Ok(());
        }
        Err(other) => return Err(Failure(format!("expected Busy, got {other}"))),
    }
    // The release may land just past the store's expiry on a slow machine; either answer is
    // fine here, other cases check release.
    let _ = ctx.store.release(&lease).await?;
    Ok(())
}

async fn local_deadline_is_conservative(ctx: Ctx) -> CaseResult {
    let key = ctx.key("deadline");
    let before = Instant::now();
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    // The store's expiry starts no earlier than `before`, so a deadline past `before + ttl`
    // could outlive the store's.
    let latest = before + lease.ttl();
    ensure!(
        lease.valid_until() <= latest,
        "the local deadline is {:?} later than the request time + TTL",
        lease.valid_until() - latest
    );
    ensure!(
        lease.valid_until() + drift(lease.ttl()) <= Instant::now() + lease.ttl(),
        "the local deadline keeps no drift margin"
    );
    if let Ok(KeyStatus::Held {
        remaining: Some(remaining),
        ..
    }) = ctx.store.status(&key).await
    {
        ensure!(
            lease.remaining() <= remaining + ctx.capabilities.ttl_granularity,
            "the holder believes it has {:?} left, the store says {remaining:?}",
            lease.remaining()
        );
    }
    released(&ctx.store, &lease, "holder").await
}

async fn expiry_frees_the_key(ctx: Ctx) -> CaseResult {
    let key = ctx.key("expiry");
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    outlive(&ctx, &lease).await;
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("the key is still held after its TTL: {e}")))?;
    released(&ctx.store, &next, "next holder").await
}

// ---- fencing tokens -------------------------------------------------------------------------

async fn tokens_increase_sequentially(ctx: Ctx) -> CaseResult {
    let key = ctx.key("tokens-seq");
    let mut last = 0;
    for _ in 0..10 {
        let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
        ensure!(
            lease.fencing_token() > last,
            "token {} after {last}",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        released(&ctx.store, &lease, "holder").await?;
    }
    Ok(())
}

async fn tokens_increase_after_expiry(ctx: Ctx) -> CaseResult {
    let key = ctx.key("tokens-expiry");
    let first = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    outlive(&ctx, &first).await;
    let second = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    ensure!(
        second.fencing_token() > first.fencing_token(),
        "token {} after an expired {}",
        second.fencing_token(),
        first.fencing_token()
    );
    released(&ctx.store, &second, "holder").await
}

async fn tokens_increase_across_handles(ctx: Ctx) -> CaseResult {
    let key = ctx.key("tokens-handles");
    let handles = [ctx.store.clone(), ctx.handle().await, ctx.handle().await];
    let mut last = 0;
    for round in 0..9 {
        let store = &handles[round % 3];
        let lease = store.try_acquire(&key, ctx.timing.long_ttl).await?;
        ensure!(
            lease.fencing_token() > last,
            "token {} from handle {} after {last}",
            lease.fencing_token(),
            round % 3
        );
        last = lease.fencing_token();
        released(store, &lease, "holder").await?;
    }
    Ok(())
}

async fn tokens_increase_under_contention(ctx: Ctx) -> CaseResult {
    let order = contend(&ctx, &ctx.key("tokens-contention"), 16).await?;
    ensure!(
        order.windows(2).all(|w| w[0] < w[1]),
        "tokens in the order holders entered: {order:?}"
    );
    Ok(())
}

// ---- keys -----------------------------------------------------------------------------------

async fn independent_keys_do_not_contend(ctx: Ctx) -> CaseResult {
    let a = ctx
        .store
        .try_acquire(&ctx.key("a"), ctx.timing.long_ttl)
        .await?;
    let b = ctx
        .handle()
        .await
        .try_acquire(&ctx.key("b"), ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("a lease on one key blocked another key: {e}")))?;
    released(&ctx.store, &a, "a").await?;
    released(&ctx.store, &b, "b").await
}

/// Keys full of characters that mean something to Lua, SQL, shells, globs and hash tags.
fn hostile_keys() -> Vec<String> {
    [
        "ключ 🔒 鍵",
        "with spaces and\ttabs\nand newlines",
        "quotes ' \" `",
        "'; DROP TABLE locks; --",
        "redis.call('FLUSHALL')",
        "]] .. os.exit() .. [[",
        "{hash}{tags}",
        "*?[a-z]\\",
        "%_$1:/\\",
        "nul\u{0}inside",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn keys_are_data_not_code(ctx: Ctx) -> CaseResult {
    let other = ctx.handle().await;
    let mut leases = Vec::new();
    for suffix in hostile_keys() {
        let key = ctx.key(&suffix);
        let lease = ctx
            .store
            .try_acquire(&key, ctx.timing.long_ttl)
            .await
            .map_err(|e| Failure(format!("key {key:?} was not acquired: {e}")))?;
        ensure!(
            lease.key() == key,
            "the lease renamed {key:?} to {:?}",
            lease.key()
        );
        expect_busy(
            other.try_acquire(&key, ctx.timing.long_ttl).await,
            &format!("key {key:?}"),
        )?;
        leases.push(lease);
    }
    for lease in &leases {
        released(&ctx.store, lease, lease.key()).await?;
    }
    Ok(())
}

async fn similar_keys_are_distinct(ctx: Ctx) -> CaseResult {
    let mut leases = Vec::new();
    for suffix in ["k", "k ", "K", "k\u{0}", "{k}", "k*", "k?", "k:", "k\\"] {
        let key = ctx.key(suffix);
        let lease = ctx
            .store
            .try_acquire(&key, ctx.timing.long_ttl)
            .await
            .map_err(|e| Failure(format!("key {key:?} collided with a similar key: {e}")))?;
        leases.push(lease);
    }
    for lease in &leases {
        released(&ctx.store, lease, lease.key()).await?;
    }
    Ok(())
}

/// Keys of 1,000 bytes that differ only in their last byte, or only in one byte in the middle,
/// are distinct locks: a store that truncates or hashes a prefix of the key would make them
/// collide.
async fn long_keys_are_distinct_over_their_whole_length(ctx: Ctx) -> CaseResult {
    const LEN: usize = 1_000;
    let prefix = ctx.key("");
    let body = LEN - prefix.len() - 1;
    let half = body / 2;
    let keys = [
        format!("{prefix}{}a", "x".repeat(body)),
        format!("{prefix}{}b", "x".repeat(body)),
        format!(
            "{prefix}{}y{}a",
            "x".repeat(half),
            "x".repeat(body - half - 1)
        ),
    ];
    let other = ctx.handle().await;
    let mut leases = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        debug_assert_eq!(key.len(), LEN);
        let lease = ctx
            .store
            .try_acquire(key, ctx.timing.long_ttl)
            .await
            .map_err(|e| {
                Failure(format!(
                    "{LEN}-byte key {i} collided with one that differs only in one byte: {e}"
                ))
            })?;
        ensure!(lease.key() == key, "the lease renamed {LEN}-byte key {i}");
        expect_busy(
            other.try_acquire(key, ctx.timing.long_ttl).await,
            &format!("{LEN}-byte key {i}"),
        )?;
        leases.push(lease);
    }
    for lease in &leases {
        released(&ctx.store, lease, "a long key").await?;
    }
    Ok(())
}

async fn max_length_key_is_accepted(ctx: Ctx) -> CaseResult {
    let prefix = ctx.key("");
    let key = format!("{prefix}{}", "é".repeat((MAX_KEY_LEN - prefix.len()) / 2));
    let key = format!("{key}{}", "x".repeat(MAX_KEY_LEN - key.len()));
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    expect_busy(
        ctx.handle()
            .await
            .try_acquire(&key, ctx.timing.long_ttl)
            .await,
        "a maximum-length key",
    )?;
    released(&ctx.store, &lease, "max-length key").await
}

async fn over_long_key_is_rejected(ctx: Ctx) -> CaseResult {
    let key = "x".repeat(MAX_KEY_LEN + 1);
    expect_invalid(
        ctx.store.try_acquire(&key, ctx.timing.long_ttl).await,
        "key",
        "a key one byte over the maximum",
    )?;
    expect_invalid(
        ctx.store
            .acquire(&key, ctx.timing.long_ttl, Duration::from_secs(1))
            .await,
        "key",
        "a waiting acquire of an over-long key",
    )
}

async fn empty_key_is_rejected(ctx: Ctx) -> CaseResult {
    expect_invalid(
        ctx.store.try_acquire("", ctx.timing.long_ttl).await,
        "key",
        "an empty key",
    )
}

// ---- TTL and wait validation ----------------------------------------------------------------

async fn zero_ttl_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("zero-ttl");
    expect_invalid(
        ctx.store.try_acquire(&key, Duration::ZERO).await,
        "ttl",
        "a zero TTL",
    )?;
    let lease = ctx
        .store
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("a rejected request left the key held: {e}")))?;
    released(&ctx.store, &lease, "holder").await
}

async fn ttl_outside_store_bounds_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("ttl-bounds");
    let below = ctx.capabilities.min_ttl / 2;
    expect_invalid(
        ctx.store.try_acquire(&key, below).await,
        "ttl",
        &format!("a TTL of {below:?}, below the store's minimum"),
    )?;
    for ttl in [
        ctx.capabilities.max_ttl + Duration::from_secs(1),
        Duration::MAX,
    ] {
        expect_invalid(
            ctx.store.try_acquire(&key, ttl).await,
            "ttl",
            &format!("a TTL of {ttl:?}, above the store's maximum"),
        )?;
    }
    let lease = ctx
        .store
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("a rejected request left the key held: {e}")))?;
    released(&ctx.store, &lease, "holder").await
}

async fn absurd_wait_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("wait-bounds");
    let started = Instant::now();
    expect_invalid(
        ctx.store
            .acquire(&key, ctx.timing.long_ttl, MAX_WAIT + Duration::from_secs(1))
            .await,
        "wait",
        "a wait above the maximum",
    )?;
    ensure!(
        started.elapsed() < ctx.timing.wake_bound,
        "rejecting a bad wait took {:?}",
        started.elapsed()
    );
    Ok(())
}

// ---- keep-alive and loss --------------------------------------------------------------------

async fn keep_alive_holds_a_lease_over_five_ttls(ctx: Ctx) -> CaseResult {
    let key = ctx.key("keep-alive");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    let held = ctx.factory.keep_alive(ctx.store.clone(), lease);
    for _ in 0..5 {
        sleep(held.lease().ttl()).await;
        ensure!(
            !held.is_lost(),
            "keep-alive lost the lease: {:?}",
            held.lost_reason()
        );
        expect_busy(
            other.try_acquire(&key, ctx.timing.long_ttl).await,
            "while kept alive",
        )?;
    }
    let lease = held.stop();
    released(&ctx.store, &lease, "kept-alive lease").await
}

/// How many extends in a row [`keep_alive_survives_transient_extend_failures`] fails.
///
/// Three, so that the case tells a keep-alive that retries soon after a failure from one that
/// waits a whole extend period: with a period of a third of the TTL the first attempt is at
/// TTL/3 and whole-period retries come at 2·TTL/3 and TTL, past the local deadline; with a
/// period of a quarter they come at TTL/2, 3·TTL/4 and TTL, again past it. Retries a quarter
/// period apart make the fourth attempt near 0.6·TTL, well before the deadline. Two failures
/// would let a quarter-TTL keep-alive that waits a whole period pass (its third attempt, at
/// 3·TTL/4, succeeds).
const TRANSIENT_FAILURES: u32 = 3;

/// A keep-alive survives extends that fail with a retryable error and then recover: the lost
/// signal stays quiet and the key stays held (past the grant's expiry and the recovering
/// extend's) until the keep-alive is stopped. See [`TRANSIENT_FAILURES`] for why three
/// failures in a row prove that retries come soon enough. A one-second TTL at least keeps the
/// retries' margin wide on a loaded machine.
async fn keep_alive_survives_transient_extend_failures(ctx: Ctx) -> CaseResult {
    let key = ctx.key("transient");
    let other = ctx.handle().await;
    let ttl = ctx
        .capabilities
        .granted_ttl(ctx.timing.short_ttl.max(Duration::from_secs(1)));
    let lease = ctx.store.try_acquire(&key, ttl).await?;
    let flaky = Arc::new(WatchedExtends::failing_first(
        ctx.store.clone(),
        TRANSIENT_FAILURES,
    ));
    let mut confirmed = flaky.confirmed();
    let held = ctx.factory.keep_alive(flaky, lease.clone());
    let gave_up = || {
        Failure(format!(
            "the keep-alive gave up after {TRANSIENT_FAILURES} transient extend failures: {}",
            held.lost_reason().unwrap_or_default()
        ))
    };
    tokio::select! {
        biased;
        () = held.lost() => return Err(gave_up()),
        recovered = timeout(lease.ttl(), confirmed.changed()) => match recovered {
            Ok(Ok(())) => {}
            _ => {
                return Err(Failure(format!(
                    "no extend was confirmed within a TTL of {:?} despite the store recovering",
                    lease.ttl()
                )))
            }
        },
    }
    // One more TTL: the key is then held neither by the grant nor by the recovering extend,
    // only by a keep-alive that kept going.
    sleep(lease.ttl()).await;
    ensure!(!held.is_lost(), "{}", gave_up().0);
    expect_busy(
        other.try_acquire(&key, ctx.timing.long_ttl).await,
        "a TTL after the keep-alive recovered",
    )?;
    let lease = held.stop();
    released(&ctx.store, &lease, "kept-alive lease").await
}

/// When the store forgets a kept-alive lease, the lost signal fires within a third of the TTL
/// (plus [`Timing::loss_detection_slack`](crate::Timing) for the extend's round trip), so a
/// holder learns of the loss long before its deadline. The forget lands right after a
/// confirmed extend, the worst moment: a keep-alive that extends at least every third of the
/// TTL meets the bound; one that learns of the loss only at its local deadline (a store that
/// reports a lost lease as a retryable error) or that extends every half TTL does not. The TTL
/// is at least three seconds, so the slack is small beside the bound.
async fn lost_signal_fires_within_a_third_of_the_ttl_of_a_forget(ctx: Ctx) -> CaseResult {
    let key = ctx.key("forgotten");
    let ttl = ctx
        .capabilities
        .granted_ttl(ctx.capabilities.min_ttl.max(Duration::from_secs(3)));
    let lease = ctx.store.try_acquire(&key, ttl).await?;
    let watched = Arc::new(WatchedExtends::failing_first(ctx.store.clone(), 0));
    let mut confirmed = watched.confirmed();
    let held = ctx.factory.keep_alive(watched, lease.clone());
    timeout(lease.ttl(), confirmed.changed())
        .await
        .map_err(|_| Failure(format!("no extend was confirmed within {:?}", lease.ttl())))?
        .map_err(|_| Failure(format!("the keep-alive stopped: {:?}", held.lost_reason())))?;
    ctx.factory.forget(&lease).await;
    let forgotten_at = Instant::now();
    let bound = lease.ttl() / 3 + ctx.timing.loss_detection_slack;
    timeout(bound, held.lost()).await.map_err(|_| {
        Failure(format!(
            "the lost signal did not fire within {bound:?} of the store forgetting the lease \
             (TTL {:?})",
            lease.ttl()
        ))
    })?;
    ensure!(
        held.lost_reason().is_some(),
        "the lost signal fired without a reason"
    );
    tracing::debug!(after = ?forgotten_at.elapsed(), "lost signal fired");
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await?;
    released(&ctx.store, &next, "next holder").await
}

async fn lost_signal_fires_before_store_expiry_when_extends_stall(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stalled");
    let requested = Instant::now();
    let lease = ctx.store.try_acquire(&key, ctx.timing.short_ttl).await?;
    let stalled: Arc<Stalled> = Arc::new(Stalled(ctx.store.clone()));
    let held = ctx.factory.keep_alive(stalled, lease.clone());
    let bound = lease.ttl() + ctx.timing.slack;
    timeout(bound, held.lost()).await.map_err(|_| {
        Failure(format!(
            "no lost signal within {bound:?} while extends hung"
        ))
    })?;
    let lost_at = Instant::now();
    let store_expiry = requested + lease.ttl();
    ensure!(
        lost_at <= lease.valid_until() + Duration::from_millis(100),
        "the lost signal fired {:?} after the local deadline",
        lost_at - lease.valid_until()
    );
    ensure!(
        lease.valid_until() < store_expiry,
        "the local deadline is not before the earliest possible store expiry"
    );
    outlive(&ctx, &lease).await;
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await?;
    released(&ctx.store, &next, "next holder").await
}

async fn with_lock_cancels_its_body_on_loss(ctx: Ctx) -> CaseResult {
    let key = ctx.key("with-lock-loss");
    let finished = Arc::new(AtomicBool::new(false));
    let options = LockOptions::new(ctx.timing.short_ttl);
    let factory = ctx.factory.clone();
    let body_finished = finished.clone();
    let bound = ctx.timing.short_ttl * 2 + ctx.timing.slack;
    let result = timeout(
        bound,
        with_lock(&*ctx.store, &key, options, |lease| async move {
            factory.forget(&lease).await;
            sleep(Duration::from_secs(3600)).await;
            body_finished.store(true, Ordering::SeqCst);
        }),
    )
    .await
    .map_err(|_| {
        Failure(format!(
            "with_lock still ran its body {bound:?} after the loss"
        ))
    })?;
    ensure!(
        !finished.load(Ordering::SeqCst),
        "the body ran to completion"
    );
    match result {
        Err(Error::LeaseLost { .. }) => Ok(()),
        Ok(()) => Err(Failure(
            "with_lock returned Ok after losing the lease".into(),
        )),
        Err(other) => Err(Failure(format!("expected LeaseLost, got {other}"))),
    }
}

async fn with_lock_releases_at_the_end(ctx: Ctx) -> CaseResult {
    let key = ctx.key("with-lock");
    let other = ctx.handle().await;
    let inner_key = key.clone();
    let token = with_lock(
        &*ctx.store,
        &key,
        LockOptions::new(ctx.timing.long_ttl),
        |lease| async move {
            let busy = other.try_acquire(&inner_key, Duration::from_secs(5)).await;
            (lease.fencing_token(), busy.is_err(), other)
        },
    )
    .await?;
    let (token, was_busy, other) = token;
    ensure!(was_busy, "the key was not held while the body ran");
    ensure!(token > 0, "the body saw token 0");
    let next = other
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("with_lock did not release: {e}")))?;
    released(&other, &next, "next holder").await
}

// ---- cancellation ---------------------------------------------------------------------------

async fn cancelled_acquire_leaves_nothing_held_past_ttl(ctx: Ctx) -> CaseResult {
    let key = ctx.key("cancelled");
    let ttl = ctx.timing.short_ttl;
    let cutoffs = [0u64, 50, 100, 200, 400, 800, 1_600, 3_200, 10_000];
    for cutoff in cutoffs {
        let store = ctx.handle().await;
        let attempt = timeout(Duration::from_micros(cutoff), store.try_acquire(&key, ttl)).await;
        if let Ok(Ok(lease)) = attempt {
            // It completed before the cut-off: ours to release.
            let _ = store.release(&lease).await;
        }
    }
    // A waiter dropped mid-wait.
    let holder = ctx.store.try_acquire(&key, ttl).await;
    let waiter = ctx.handle().await;
    let _ = timeout(
        Duration::from_millis(50),
        waiter.acquire(&key, ttl, ttl * 4),
    )
    .await;
    if let Ok(holder) = holder {
        let _ = ctx.store.release(&holder).await;
    }
    sleep(ttl + ctx.timing.slack).await;
    let lease = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| {
            Failure(format!(
                "a cancelled acquire left the key held past its TTL: {e}"
            ))
        })?;
    released(&ctx.store, &lease, "holder after cancellations").await
}

async fn dropped_waiter_never_acquires_later(ctx: Ctx) -> CaseResult {
    let key = ctx.key("dropped-waiter");
    let holder = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    let waiter_store = ctx.handle().await;
    let waiter = tokio::spawn({
        let (key, ttl) = (key.clone(), ctx.timing.long_ttl);
        let store = waiter_store.clone();
        async move { store.acquire(&key, ttl, ttl).await }
    });
    sleep(Duration::from_millis(300)).await;
    waiter.abort();
    let _ = waiter.await;
    released(&ctx.store, &holder, "holder").await?;
    sleep(Duration::from_millis(500)).await;
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| {
            Failure(format!(
                "a dropped waiter took the key in the background: {e}"
            ))
        })?;
    released(&ctx.store, &next, "next holder").await
}

async fn dead_holder_frees_the_key_on_disconnect(ctx: Ctx) -> CaseResult {
    let key = ctx.key("disconnect");
    let doomed = ctx.handle().await;
    let lease = doomed.try_acquire(&key, ctx.timing.long_ttl).await?;
    drop(lease);
    drop(doomed);
    let started = Instant::now();
    let wait = ctx.timing.slack + ctx.timing.wake_bound;
    let next = ctx
        .store
        .acquire(&key, ctx.timing.long_ttl, wait)
        .await
        .map_err(|e| {
            Failure(format!(
                "the key was not freed within {wait:?} of its holder disconnecting: {e}"
            ))
        })?;
    tracing::debug!(after = ?started.elapsed(), "freed on disconnect");
    released(&ctx.store, &next, "next holder").await
}

// ---- faults and diagnostics -----------------------------------------------------------------

async fn unreachable_store_gives_a_retryable_error(ctx: Ctx) -> CaseResult {
    let key = ctx.key("unreachable");
    let bound = Duration::from_secs(20);
    let store = ctx.factory.unreachable_handle().await;
    let started = Instant::now();
    let tried = timeout(bound, store.try_acquire(&key, ctx.timing.long_ttl))
        .await
        .map_err(|_| {
            Failure(format!(
                "try_acquire on an unreachable store hung {bound:?}"
            ))
        })?;
    match tried {
        Err(error) if error.is_retryable() => {}
        Err(error) => return Err(Failure(format!("a non-retryable error: {error}"))),
        Ok(_) => return Err(Failure("an unreachable store granted a lease".into())),
    }
    let waited = timeout(
        bound,
        store.acquire(&key, ctx.timing.long_ttl, Duration::from_millis(500)),
    )
    .await
    .map_err(|_| Failure(format!("acquire on an unreachable store hung {bound:?}")))?;
    match waited {
        Err(error) if error.is_retryable() => {}
        Err(error) => return Err(Failure(format!("a non-retryable error: {error}"))),
        Ok(_) => return Err(Failure("an unreachable store granted a lease".into())),
    }
    tracing::debug!(after = ?started.elapsed(), "unreachable store answered");
    Ok(())
}

async fn status_reports_the_holder(ctx: Ctx) -> CaseResult {
    let key = ctx.key("status");
    match ctx.store.status(&key).await {
        Err(Error::Unsupported { .. }) => return Ok(()),
        Ok(KeyStatus::Free) => {}
        other => return Err(Failure(format!("a fresh key's status is {other:?}"))),
    }
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    match ctx.store.status(&key).await? {
        KeyStatus::Held { token, .. } => ensure!(
            token.is_none_or(|t| t == lease.fencing_token()),
            "status names token {token:?} for a lease with {}",
            lease.fencing_token()
        ),
        other => return Err(Failure(format!("a held key's status is {other:?}"))),
    }
    released(&ctx.store, &lease, "holder").await?;
    let after = ctx.store.status(&key).await?;
    ensure!(
        after == KeyStatus::Free,
        "a released key's status is {after:?}"
    );
    Ok(())
}
