//! Lock modes ([`Mode`]): semaphore permits never exceed their limit, come free on release
//! and expiry (an extend revives none), refuse another limit on both paths and are owner-only;
//! readers hold together, each for its own TTL, and `status` counts them exactly; a writer
//! excludes everyone (its own handle's reader too), is served while readers keep arriving, and
//! keeps readers out no longer once dropped; a writer's release wakes waiting readers; tokens
//! grow across every mode; and a store refuses the modes it does not declare.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_core::raw::LeaseExt;
use fencelock_core::{
    limits::MAX_PERMITS, DynLockStore, Error, FenceGate, KeyStatus, Lease, Mode, OwnerId,
    ReleaseOutcome,
};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use super::support::{
    expect_busy, expect_held_together, expect_invalid, expect_lost, expect_mode, outlive, released,
    take,
};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

/// Awaits a task a case spawned; a panic is a failure.
async fn joined<T>(task: JoinHandle<T>, what: &str) -> Result<T, Failure> {
    task.await
        .map_err(|e| Failure(format!("{what} panicked: {e}")))
}

/// Holders of a key counted by the case itself: a holder counts itself in after its grant
/// and out before its release is sent, so the count never exceeds what the store holds.
#[derive(Default)]
struct Holders {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Holders {
    fn enter(&self) -> usize {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        now
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    /// Leaves only if another holder stays counted, so the key is never left free by this one.
    fn leave_if_not_last(&self) -> bool {
        self.now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n >= 2).then(|| n - 1)
            })
            .is_ok()
    }

    fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// What the contenders of [`permits_never_exceed_the_limit_under_contention`] share.
struct Semaphore {
    limit: u32,
    holders: Holders,
    /// Which slots a counted holder occupies.
    occupied: Vec<AtomicBool>,
    /// One gate per slot: a slot's tokens only grow.
    gates: Vec<FenceGate>,
    tokens: Mutex<Vec<u64>>,
}

impl Semaphore {
    /// Counts `lease` in, checks its slot and token, holds it for `hold` (after waiting, with
    /// `wait_for_limit`, until the limit was reached once or that bound passed), and counts it
    /// out.
    async fn hold(
        &self,
        lease: &Lease,
        hold: Duration,
        wait_for_limit: Option<Duration>,
    ) -> CaseResult {
        let mode = Mode::permits(self.limit);
        expect_mode(lease, mode, "a contender")?;
        let token = lease.fencing_token();
        let slot = lease.slot().unwrap_or(u32::MAX);
        let Some(occupied) = self.occupied.get(slot as usize) else {
            return Err(Failure(format!("slot {slot} is out of range")));
        };
        let holding = self.holders.enter();
        let checked = self.check_in(occupied, slot, token, holding);
        if checked.is_ok() {
            if let Some(bound) = wait_for_limit {
                // The first holders wait (boundedly) for the limit to be reached once, so the
                // case sees a full semaphore however slowly the store hands permits over.
                let started = Instant::now();
                while self.holders.most() < self.limit as usize && started.elapsed() < bound {
                    sleep(Duration::from_millis(5)).await;
                }
            }
            sleep(hold).await;
            occupied.store(false, Ordering::SeqCst);
        }
        self.holders.leave();
        checked
    }

    fn check_in(&self, occupied: &AtomicBool, slot: u32, token: u64, holding: usize) -> CaseResult {
        ensure!(
            holding <= self.limit as usize,
            "{holding} permits of a semaphore of {} were held at once",
            self.limit
        );
        ensure!(
            !occupied.swap(true, Ordering::SeqCst),
            "two permits held at once both occupy slot {slot}"
        );
        if let Err(stale) = self.gates[slot as usize].claim(token) {
            occupied.store(false, Ordering::SeqCst);
            return Err(Failure(format!(
                "slot {slot}'s tokens went backwards: {stale}"
            )));
        }
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(token);
        Ok(())
    }
}

/// 12 contenders over 4 handles take permits of a semaphore of 3 in a loop. The case's own
/// count of holders never exceeds 3 and reaches it; concurrent holders occupy distinct slots
/// below the limit, each slot's tokens grow, and no two grants share a token.
pub(super) async fn permits_never_exceed_the_limit_under_contention(ctx: Ctx) -> CaseResult {
    const LIMIT: u32 = 3;
    const HANDLES: usize = 4;
    const TASKS_PER_HANDLE: usize = 3;
    const ROUNDS: usize = 3;
    let key = ctx.key("permits-contention");
    let mode = Mode::permits(LIMIT);
    let semaphore = Arc::new(Semaphore {
        limit: LIMIT,
        holders: Holders::default(),
        occupied: (0..LIMIT).map(|_| AtomicBool::new(false)).collect(),
        gates: (0..LIMIT).map(|_| FenceGate::new()).collect(),
        tokens: Mutex::new(Vec::new()),
    });
    let mut handles = vec![ctx.store.clone()];
    for _ in 1..HANDLES {
        handles.push(ctx.handle().await);
    }
    let (ttl, wait) = (ctx.timing.long_ttl, ctx.timing.case_limit / 2);
    let reach_bound = ctx.timing.wake_bound;
    let mut tasks = Vec::new();
    for task in 0..HANDLES * TASKS_PER_HANDLE {
        let store = handles[task % HANDLES].clone();
        let (key, semaphore) = (key.clone(), semaphore.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let lease = store
                    .acquire_as(&key, ttl, wait, mode)
                    .await
                    .map_err(|e| Failure(format!("contender {task}, round {round}: {e}")))?;
                let first = (round == 0).then_some(reach_bound);
                let held = semaphore
                    .hold(&lease, Duration::from_millis(10), first)
                    .await;
                let outcome = store.release(&lease).await;
                held?;
                let outcome = outcome?;
                ensure!(
                    outcome == ReleaseOutcome::Released,
                    "contender {task}: the release of a held permit reported {outcome:?}"
                );
            }
            Ok::<_, Failure>(())
        }));
    }
    let mut failure = None;
    for task in tasks {
        if let Err(error) = joined(task, "a contender").await.and_then(|r| r) {
            failure.get_or_insert(error);
        }
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    let most = semaphore.holders.most();
    ensure!(
        most == LIMIT as usize,
        "at most {most} of {LIMIT} permits were held at once by {} contenders: the semaphore \
         never filled, so the case proves nothing",
        HANDLES * TASKS_PER_HANDLE
    );
    let mut tokens = semaphore
        .tokens
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let granted = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    ensure!(
        tokens.len() == granted,
        "{granted} permits were granted with only {} distinct tokens",
        tokens.len()
    );
    Ok(())
}

/// A semaphore of 2, full: a third request is busy, and a waiter gets the released permit's
/// slot within the wake bound of its release. A permit whose TTL ran out is free again.
pub(super) async fn released_and_expired_permits_are_free_again_and_wake_a_waiter(
    ctx: Ctx,
) -> CaseResult {
    let key = ctx.key("permits-free-again");
    let mode = Mode::permits(2);
    let long = ctx.timing.long_ttl;
    let other = ctx.handle().await;
    let first = take(&ctx.store, &key, long, mode, "the first permit").await?;
    let second = take(&other, &key, long, mode, "the second permit").await?;
    ensure!(
        first.slot() != second.slot(),
        "two permits held at once share slot {:?}",
        first.slot()
    );
    expect_held_together(
        &ctx.store,
        &key,
        mode,
        &[&first, &second],
        "a full semaphore",
    )
    .await?;
    expect_busy(
        ctx.handle().await.try_acquire_as(&key, long, mode).await,
        "a third permit of 2",
    )?;
    let waiter_store = ctx.handle().await;
    let waiter = tokio::spawn({
        let key = key.clone();
        async move {
            let lease = waiter_store.acquire_as(&key, long, long, mode).await;
            (lease, Instant::now(), waiter_store)
        }
    });
    sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiter.is_finished(),
        "a waiter for a permit returned while both were held"
    );
    released(&ctx.store, &first, "the first permit").await?;
    let released_at = Instant::now();
    let bound = ctx.timing.wake_bound;
    let (next, woke_at, waiter_store) = timeout(bound * 2, waiter)
        .await
        .map_err(|_| {
            Failure(format!(
                "a permit waiter still waited {:?} after a permit was released: it was not \
                 woken, or the release freed nothing",
                bound * 2
            ))
        })?
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?;
    let next = next?;
    let delay = woke_at.saturating_duration_since(released_at);
    ensure!(
        delay <= bound,
        "the waiter took {delay:?} to get a released permit"
    );
    expect_mode(&next, mode, "the waiter")?;
    ensure!(
        next.slot() == first.slot(),
        "the waiter got slot {:?} while slot {:?} was the free one",
        next.slot(),
        first.slot()
    );
    ensure!(
        next.fencing_token() > second.fencing_token(),
        "the waiter's token {} is not greater than the earlier permits' {} and {}",
        next.fencing_token(),
        first.fencing_token(),
        second.fencing_token()
    );
    released(&waiter_store, &next, "the waiter's permit").await?;
    released(&other, &second, "the second permit").await?;

    // Expiry: a permit whose TTL ran out frees its slot. The third handle is opened first and
    // the short permit taken last, so the short TTL covers only the third attempt; a grant
    // answered after the short permit's local deadline is the expiry this part checks next,
    // not a third permit beside two (a loaded machine can take longer than a short TTL).
    let third = ctx.handle().await;
    let kept = take(&other, &key, long, mode, "a long permit").await?;
    let short = take(
        &ctx.store,
        &key,
        ctx.timing.short_ttl,
        mode,
        "a short permit",
    )
    .await?;
    match third.try_acquire_as(&key, long, mode).await {
        Ok(early) if short.is_expired() => {
            released(
                &third,
                &early,
                "a permit granted once the short one expired",
            )
            .await?;
        }
        result => expect_busy(result, "a third permit of 2 before the short one expired")?,
    }
    outlive(&ctx, &short).await;
    let after = ctx
        .handle()
        .await
        .try_acquire_as(&key, long, mode)
        .await
        .map_err(|e| {
            Failure(format!(
                "a permit whose TTL ran out still holds its slot: {e}"
            ))
        })?;
    expect_mode(&after, mode, "the permit after an expiry")?;
    ensure!(
        after.slot() == short.slot(),
        "after an expiry the permit got slot {:?}; the expired one had {:?}",
        after.slot(),
        short.slot()
    );
    released(&ctx.store, &after, "the permit after an expiry").await?;
    released(&other, &kept, "the long permit").await
}

/// One key's leases in every mode the store keeps, taken over two handles one after another
/// (the key freed between modes), carry strictly growing tokens; a reader that waited for a
/// writer gets a token greater than the writer's.
pub(super) async fn tokens_increase_across_permits_and_modes(ctx: Ctx) -> CaseResult {
    let key = ctx.key("tokens-modes");
    let long = ctx.timing.long_ttl;
    let handles = [ctx.store.clone(), ctx.handle().await];
    let mut last = 0;
    let mut seen = Vec::new();
    let mut next = |lease: &Lease, what: &str| -> CaseResult {
        seen.push(format!("{what} {}", lease.fencing_token()));
        ensure!(
            lease.fencing_token() > last,
            "{what} got token {} after {last} (in order: {})",
            lease.fencing_token(),
            seen.join(", ")
        );
        last = lease.fencing_token();
        Ok(())
    };
    let writer = take(&handles[0], &key, long, Mode::Exclusive, "a writer").await?;
    next(&writer, "a writer")?;
    released(&handles[0], &writer, "the writer").await?;
    if ctx.capabilities.shared {
        let first = take(&handles[1], &key, long, Mode::Shared, "a reader").await?;
        next(&first, "a reader")?;
        let second = take(&handles[0], &key, long, Mode::Shared, "a second reader").await?;
        next(&second, "a second reader")?;
        released(&handles[1], &first, "the reader").await?;
        released(&handles[0], &second, "the second reader").await?;
        let writer = take(&handles[1], &key, long, Mode::Exclusive, "a writer").await?;
        next(&writer, "a writer after readers")?;
        let reader = tokio::spawn({
            let (store, key) = (handles[0].clone(), key.clone());
            async move { store.acquire_as(&key, long, long, Mode::Shared).await }
        });
        sleep(Duration::from_millis(100)).await;
        released(&handles[1], &writer, "the writer").await?;
        let reader = joined(reader, "a waiting reader").await??;
        expect_mode(&reader, Mode::Shared, "a reader that waited")?;
        next(&reader, "a reader that waited for the writer")?;
        released(&handles[0], &reader, "the reader that waited").await?;
    }
    if ctx.capabilities.permits {
        let mode = Mode::permits(2);
        let first = take(&handles[0], &key, long, mode, "a permit").await?;
        next(&first, "a permit")?;
        let second = take(&handles[1], &key, long, mode, "a second permit").await?;
        next(&second, "a second permit")?;
        released(&handles[0], &first, "the first permit").await?;
        let third = take(&handles[0], &key, long, mode, "a permit in a freed slot").await?;
        next(&third, "a permit in a freed slot")?;
        released(&handles[1], &second, "the second permit").await?;
        released(&handles[0], &third, "the permit in the freed slot").await?;
        let writer = take(&handles[1], &key, long, Mode::Exclusive, "a writer").await?;
        next(&writer, "a writer after permits")?;
        released(&handles[1], &writer, "the last writer").await?;
    }
    Ok(())
}

/// Readers on three handles hold one key at once; a fourth that waits is granted at once;
/// `status` counts them; once all release, the key is free for a writer.
pub(super) async fn readers_hold_together(ctx: Ctx) -> CaseResult {
    let key = ctx.key("readers");
    let long = ctx.timing.long_ttl;
    let mut handles = Vec::new();
    let mut leases = Vec::new();
    for i in 0..3 {
        let store = ctx.handle().await;
        let what = format!("reader {i} next to {i} others");
        leases.push(take(&store, &key, long, Mode::Shared, &what).await?);
        handles.push(store);
    }
    let store = ctx.handle().await;
    let started = Instant::now();
    let waited = store
        .acquire_as(&key, long, long, Mode::Shared)
        .await
        .map_err(|e| Failure(format!("a waiting reader next to three readers: {e}")))?;
    ensure!(
        started.elapsed() < ctx.timing.wake_bound,
        "a waiting reader was granted only after {:?} next to readers",
        started.elapsed()
    );
    expect_mode(&waited, Mode::Shared, "a waiting reader")?;
    leases.push(waited);
    handles.push(store);
    let all: Vec<&Lease> = leases.iter().collect();
    expect_held_together(&ctx.store, &key, Mode::Shared, &all, "four readers").await?;
    for (store, lease) in handles.iter().zip(&leases) {
        released(store, lease, "a reader").await?;
    }
    let writer = take(
        &ctx.store,
        &key,
        long,
        Mode::Exclusive,
        "a writer after the readers",
    )
    .await?;
    released(&ctx.store, &writer, "the writer").await
}

/// While a writer holds, shared and exclusive requests from other handles are busy; while
/// readers hold, exclusive ones are. A writer that gave up waiting no longer keeps readers out.
pub(super) async fn a_writer_excludes_readers_and_writers(ctx: Ctx) -> CaseResult {
    let key = ctx.key("writer-excludes");
    let long = ctx.timing.long_ttl;
    let (a, b, c) = (ctx.store.clone(), ctx.handle().await, ctx.handle().await);
    let writer = take(&a, &key, long, Mode::Exclusive, "a writer").await?;
    for (store, name) in [(&b, "one handle"), (&c, "another handle")] {
        expect_busy(
            store.try_acquire_as(&key, long, Mode::Shared).await,
            &format!("a reader on {name} while a writer holds"),
        )?;
        expect_busy(
            store.try_acquire_as(&key, long, Mode::Exclusive).await,
            &format!("a second writer on {name}"),
        )?;
        expect_busy(
            store.try_acquire(&key, long).await,
            &format!("a plain try_acquire on {name} while a writer holds"),
        )?;
    }
    released(&a, &writer, "the writer").await?;
    let first = take(&b, &key, long, Mode::Shared, "a reader").await?;
    let second = take(&c, &key, long, Mode::Shared, "a second reader").await?;
    expect_busy(
        a.try_acquire_as(&key, long, Mode::Exclusive).await,
        "a writer while two readers hold",
    )?;
    expect_busy(
        a.try_acquire(&key, long).await,
        "a plain try_acquire while two readers hold",
    )?;
    match a
        .acquire_as(&key, long, Duration::from_millis(300), Mode::Exclusive)
        .await
    {
        Err(Error::WaitTimedOut { .. }) => {}
        Ok(lease) => {
            return Err(Failure(format!(
                "a waiting writer was granted (token {}) while two readers held",
                lease.fencing_token()
            )))
        }
        Err(other) => {
            return Err(Failure(format!(
                "a writer waiting on readers: expected WaitTimedOut, got {other}"
            )))
        }
    }
    let started = Instant::now();
    let third = ctx
        .handle()
        .await
        .acquire_as(&key, long, ctx.timing.wake_bound, Mode::Shared)
        .await
        .map_err(|e| {
            Failure(format!(
                "a writer that gave up waiting still keeps readers out: {e}"
            ))
        })?;
    tracing::debug!(after = ?started.elapsed(), "reader admitted after a writer gave up");
    expect_mode(&third, Mode::Shared, "a reader after a writer gave up")?;
    let third_store = ctx.handle().await;
    released(&third_store, &third, "the third reader").await?;
    released(&b, &first, "the reader").await?;
    released(&c, &second, "the second reader").await
}

/// Three readers keep taking and releasing overlapping shared leases, each leaving only while
/// another holds (or after a patience of half a second), so without the writer policy the key
/// is never free. A writer that waits is granted within its wait, with no reader holding.
pub(super) async fn a_waiting_writer_is_served_while_readers_keep_arriving(ctx: Ctx) -> CaseResult {
    const READERS: usize = 3;
    let key = ctx.key("writer-not-starved");
    let long = ctx.timing.long_ttl;
    let patience = Duration::from_millis(500);
    let writer_wait = patience + ctx.timing.wake_bound * 2 + ctx.timing.slack;
    let holders = Arc::new(Holders::default());
    let grants = Arc::new(AtomicUsize::new(0));
    let writer_done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..READERS {
        let store = ctx.handle().await;
        let (key, holders, grants, done) = (
            key.clone(),
            holders.clone(),
            grants.clone(),
            writer_done.clone(),
        );
        readers.push(tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let lease = match store
                    .acquire_as(&key, long, writer_wait + patience, Mode::Shared)
                    .await
                {
                    Ok(lease) => lease,
                    Err(Error::WaitTimedOut { .. } | Error::Busy { .. }) => {
                        sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    Err(other) => return Err(Failure(format!("reader {i}: {other}"))),
                };
                holders.enter();
                grants.fetch_add(1, Ordering::SeqCst);
                let since = Instant::now();
                sleep(Duration::from_millis(20)).await;
                loop {
                    if holders.leave_if_not_last() {
                        break;
                    }
                    if done.load(Ordering::SeqCst) || since.elapsed() >= patience {
                        holders.leave();
                        break;
                    }
                    sleep(Duration::from_millis(2)).await;
                }
                let outcome = store.release(&lease).await?;
                ensure!(
                    outcome == ReleaseOutcome::Released,
                    "reader {i}: the release of a held shared lease reported {outcome:?}"
                );
            }
            Ok::<_, Failure>(())
        }));
    }
    // The writer comes once the readers are cycling.
    let started = Instant::now();
    while grants.load(Ordering::SeqCst) < READERS * 2 && started.elapsed() < ctx.timing.wake_bound {
        sleep(Duration::from_millis(5)).await;
    }
    let cycled = grants.load(Ordering::SeqCst);
    let writer_store = ctx.handle().await;
    let asked_at = Instant::now();
    let writer = writer_store
        .acquire_as(&key, long, writer_wait, Mode::Exclusive)
        .await;
    let waited = asked_at.elapsed();
    let readers_inside = holders.now();
    let served = match writer {
        Ok(lease) => {
            sleep(Duration::from_millis(20)).await;
            let outcome = writer_store.release(&lease).await;
            Ok((lease, outcome))
        }
        Err(error) => Err(error),
    };
    writer_done.store(true, Ordering::SeqCst);
    let mut failure = None;
    for reader in readers {
        if let Err(error) = joined(reader, "a reader").await.and_then(|r| r) {
            failure.get_or_insert(error);
        }
    }
    ensure!(
        cycled >= READERS * 2,
        "the readers took only {cycled} shared leases in {:?} before the writer came",
        ctx.timing.wake_bound
    );
    let (lease, outcome) = served.map_err(|e| {
        Failure(format!(
            "a writer waiting {writer_wait:?} was not served while readers kept arriving \
             ({} shared leases granted meanwhile): {e}",
            grants.load(Ordering::SeqCst) - cycled
        ))
    })?;
    ensure!(
        readers_inside == 0,
        "the writer was granted after {waited:?} while {readers_inside} readers held"
    );
    expect_mode(&lease, Mode::Exclusive, "the writer")?;
    ensure!(
        outcome? == ReleaseOutcome::Released,
        "the writer's release did not report Released"
    );
    match failure {
        Some(failure) => Err(failure),
        None => Ok(()),
    }
}

/// A lease forged with another owner, the permit's token and slot, cannot release or extend
/// the permit, which is still held afterwards; the same for a shared lease where the store
/// keeps them.
pub(super) async fn permit_release_and_extend_are_owner_only(ctx: Ctx) -> CaseResult {
    let key = ctx.key("permit-owner");
    let long = ctx.timing.long_ttl;
    let mode = Mode::permits(2);
    let other = ctx.handle().await;
    let permit = take(&ctx.store, &key, long, mode, "a permit").await?;
    let forged = Lease::new(
        &key,
        OwnerId::random(),
        permit.fencing_token(),
        long,
        Instant::now(),
    )
    .in_mode(mode, permit.slot());
    let outcome = other.release(&forged).await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "the release of a permit by another owner reported {outcome:?}"
    );
    expect_lost(
        other.extend(&forged).await,
        "an extend of a permit by another owner",
    )?;
    // Still held: of 2 permits one more is granted, then none.
    let second = take(&other, &key, long, mode, "the other permit").await?;
    ensure!(
        second.slot() != permit.slot(),
        "after a forged release the next permit took the held permit's slot {:?}",
        permit.slot()
    );
    expect_busy(
        other.try_acquire_as(&key, long, mode).await,
        "a third permit of 2 after a forged release",
    )?;
    ctx.store
        .extend(&permit)
        .await
        .map_err(|e| Failure(format!("the owner's extend after a forged one: {e}")))?;
    released(&ctx.store, &permit, "the owner's permit").await?;
    released(&other, &second, "the other permit").await?;
    if !ctx.capabilities.shared {
        return Ok(());
    }
    let reader = take(&ctx.store, &key, long, Mode::Shared, "a reader").await?;
    let forged = Lease::new(
        &key,
        OwnerId::random(),
        reader.fencing_token(),
        long,
        Instant::now(),
    )
    .in_mode(Mode::Shared, None);
    let outcome = other.release(&forged).await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "the release of a shared lease by another owner reported {outcome:?}"
    );
    expect_lost(
        other.extend(&forged).await,
        "an extend of a shared lease by another owner",
    )?;
    expect_busy(
        other.try_acquire_as(&key, long, Mode::Exclusive).await,
        "a writer after a forged release of the only reader",
    )?;
    released(&ctx.store, &reader, "the reader").await
}

/// While permits of 3 are held, a request for 5 fails with `LimitMismatch { held: 3,
/// requested: 5 }` (and an exclusive one is busy); once the key is free, 5 is the limit.
pub(super) async fn a_different_limit_is_refused_while_permits_are_held(ctx: Ctx) -> CaseResult {
    let key = ctx.key("permit-limit");
    let long = ctx.timing.long_ttl;
    let other = ctx.handle().await;
    let three = take(&ctx.store, &key, long, Mode::permits(3), "a permit of 3").await?;
    let expect_mismatch = |result, held, requested| {
        expect_limit_mismatch(result, &key, held, requested, "try_acquire_as")
    };
    expect_mismatch(
        other.try_acquire_as(&key, long, Mode::permits(5)).await,
        3,
        5,
    )?;
    expect_busy(
        other.try_acquire_as(&key, long, Mode::Exclusive).await,
        "a writer while a permit is held",
    )?;
    let second = take(&other, &key, long, Mode::permits(3), "a second permit of 3").await?;
    released(&ctx.store, &three, "the permit of 3").await?;
    expect_mismatch(
        other.try_acquire_as(&key, long, Mode::permits(5)).await,
        3,
        5,
    )?;
    released(&other, &second, "the second permit of 3").await?;
    let five = take(
        &other,
        &key,
        long,
        Mode::permits(5),
        "a permit of 5 on a free key",
    )
    .await?;
    expect_mismatch(
        ctx.store.try_acquire_as(&key, long, Mode::permits(3)).await,
        5,
        3,
    )?;
    released(&other, &five, "the permit of 5").await
}

/// Checks that `result`, the answer to a request (by `how`) for `requested` permits of `key`
/// while its permits are held with a limit of `held`, is `LimitMismatch` naming both.
fn expect_limit_mismatch(
    result: fencelock_core::Result<Lease>,
    key: &str,
    held: u32,
    requested: u32,
    how: &str,
) -> CaseResult {
    match result {
        Err(Error::LimitMismatch {
            key: k,
            held: h,
            requested: r,
        }) => {
            ensure!(k == key, "{how}: the limit mismatch names key {k:?}");
            ensure!(
                (h, r) == (held, requested),
                "{how}: a request for {requested} permits next to {held} reported held {h}, \
                 requested {r}"
            );
            Ok(())
        }
        Ok(lease) => Err(Failure(format!(
            "{how}: a request for {requested} permits was granted (slot {:?}) while the key's \
             permits are held with a limit of {held}",
            lease.slot()
        ))),
        Err(error) => Err(Failure(format!(
            "{how}: a request for {requested} permits next to {held}: expected LimitMismatch, \
             got {error}"
        ))),
    }
}

/// A permit waiter dropped mid-wait never takes a permit afterwards: once a permit is
/// released, it is there for the next request.
pub(super) async fn a_dropped_permit_waiter_never_takes_a_permit_later(ctx: Ctx) -> CaseResult {
    let key = ctx.key("permit-dropped-waiter");
    let long = ctx.timing.long_ttl;
    let mode = Mode::permits(2);
    let other = ctx.handle().await;
    let first = take(&ctx.store, &key, long, mode, "a permit").await?;
    let second = take(&other, &key, long, mode, "a second permit").await?;
    let waiter = tokio::spawn({
        let (store, key) = (ctx.handle().await, key.clone());
        async move { store.acquire_as(&key, long, long, mode).await }
    });
    sleep(Duration::from_millis(300)).await;
    waiter.abort();
    let _ = waiter.await;
    released(&ctx.store, &first, "the first permit").await?;
    sleep(Duration::from_millis(500)).await;
    let next = ctx
        .handle()
        .await
        .try_acquire_as(&key, long, mode)
        .await
        .map_err(|e| {
            Failure(format!(
                "a dropped waiter took the released permit in the background: {e}"
            ))
        })?;
    expect_mode(&next, mode, "the permit after a dropped waiter")?;
    released(&ctx.store, &next, "the permit after a dropped waiter").await?;
    released(&other, &second, "the second permit").await
}

/// A mode the capabilities do not declare is refused with `Unsupported` by both acquires and
/// takes nothing; where permits are kept, limits of 0 and above `MAX_PERMITS` are invalid.
pub(super) async fn unsupported_modes_are_refused(ctx: Ctx) -> CaseResult {
    let key = ctx.key("modes-refused");
    let long = ctx.timing.long_ttl;
    let caps = &ctx.capabilities;
    for mode in [Mode::Shared, Mode::permits(2)] {
        if caps.supports(mode) {
            continue;
        }
        for waits in [false, true] {
            let result = if waits {
                ctx.store
                    .acquire_as(&key, long, Duration::from_millis(100), mode)
                    .await
            } else {
                ctx.store.try_acquire_as(&key, long, mode).await
            };
            let how = if waits {
                "acquire_as"
            } else {
                "try_acquire_as"
            };
            match result {
                Err(Error::Unsupported { .. }) => {}
                Ok(lease) => {
                    return Err(Failure(format!(
                        "{how}({mode}) was granted (token {}) by a store whose capabilities \
                         do not declare it",
                        lease.fencing_token()
                    )))
                }
                Err(other) => {
                    return Err(Failure(format!(
                        "{how}({mode}) on a store without it: expected Unsupported, got {other}"
                    )))
                }
            }
        }
    }
    if caps.permits {
        for limit in [0, MAX_PERMITS + 1] {
            expect_invalid(
                ctx.store
                    .try_acquire_as(&key, long, Mode::permits(limit))
                    .await,
                "permits",
                &format!("a semaphore of {limit} permits"),
            )?;
        }
    }
    let lease = take(
        &ctx.store,
        &key,
        long,
        Mode::Exclusive,
        "a writer after refused requests",
    )
    .await?;
    released(&ctx.store, &lease, "the writer").await
}

/// The waiting path refuses another limit as the single attempt does: next to one permit of
/// 2, and next to a full semaphore of 2, `acquire_as` for 5 fails with `LimitMismatch { held:
/// 2, requested: 5 }`, neither granted a permit of the held limit nor left waiting until it
/// times out (its wait is half a second).
pub(super) async fn a_waiting_request_with_a_different_limit_is_refused(ctx: Ctx) -> CaseResult {
    let key = ctx.key("permit-limit-waiting");
    let long = ctx.timing.long_ttl;
    let wait = Duration::from_millis(500);
    let (other, third) = (ctx.handle().await, ctx.handle().await);
    let first = take(&ctx.store, &key, long, Mode::permits(2), "a permit of 2").await?;
    expect_limit_mismatch(
        other.acquire_as(&key, long, wait, Mode::permits(5)).await,
        &key,
        2,
        5,
        "acquire_as next to one permit of 2",
    )?;
    let second = take(&third, &key, long, Mode::permits(2), "a second permit of 2").await?;
    expect_limit_mismatch(
        other.acquire_as(&key, long, wait, Mode::permits(5)).await,
        &key,
        2,
        5,
        "acquire_as next to a full semaphore of 2",
    )?;
    released(&ctx.store, &first, "the first permit of 2").await?;
    released(&third, &second, "the second permit of 2").await
}

/// A handle that holds a key's only reader is refused a writer as any other handle is: both
/// single attempts are busy and a waiting one times out (a store with one database session per
/// handle must not let the session's own shared lock admit its exclusive request). The other
/// way round, the writer's own handle is refused a reader.
pub(super) async fn a_writer_is_refused_next_to_a_reader_of_its_own_handle(ctx: Ctx) -> CaseResult {
    let key = ctx.key("own-reader");
    let long = ctx.timing.long_ttl;
    let store = ctx.handle().await;
    let reader = take(&store, &key, long, Mode::Shared, "a reader").await?;
    expect_busy(
        store.try_acquire_as(&key, long, Mode::Exclusive).await,
        "try_acquire_as(exclusive) on the handle that holds the only reader",
    )?;
    expect_busy(
        store.try_acquire(&key, long).await,
        "try_acquire on the handle that holds the only reader",
    )?;
    match store
        .acquire_as(&key, long, Duration::from_millis(300), Mode::Exclusive)
        .await
    {
        Err(Error::WaitTimedOut { .. }) => {}
        Ok(lease) => {
            return Err(Failure(format!(
                "acquire_as(exclusive) on the handle that holds the only reader was granted \
                 (token {}) next to that reader",
                lease.fencing_token()
            )))
        }
        Err(other) => {
            return Err(Failure(format!(
                "acquire_as(exclusive) on the handle that holds the only reader: expected \
                 WaitTimedOut, got {other}"
            )))
        }
    }
    released(&store, &reader, "the reader").await?;
    let writer = take(&store, &key, long, Mode::Exclusive, "a writer").await?;
    expect_busy(
        store.try_acquire_as(&key, long, Mode::Shared).await,
        "a reader on the handle that holds the writer",
    )?;
    released(&store, &writer, "the writer").await
}

/// An extend after a permit's TTL ran out fails with `LeaseLost` and takes nothing: the only
/// permit of a semaphore of 1 is there for the next request. The same for a reader where the
/// store keeps them (a writer gets the key).
pub(super) async fn extend_does_not_revive_an_expired_permit(ctx: Ctx) -> CaseResult {
    let (permit_key, reader_key) = (ctx.key("revive-permit"), ctx.key("revive-reader"));
    let (short, long) = (ctx.timing.short_ttl, ctx.timing.long_ttl);
    let mode = Mode::permits(1);
    let other = ctx.handle().await;
    let permit = take(&ctx.store, &permit_key, short, mode, "a short permit").await?;
    let reader = if ctx.capabilities.shared {
        Some(
            take(
                &ctx.store,
                &reader_key,
                short,
                Mode::Shared,
                "a short reader",
            )
            .await?,
        )
    } else {
        None
    };
    // Both were taken before this sleep starts.
    outlive(&ctx, &permit).await;
    expect_lost(
        ctx.store.extend(&permit).await,
        "an extend of an expired permit",
    )?;
    let next = other
        .try_acquire_as(&permit_key, long, mode)
        .await
        .map_err(|e| {
            Failure(format!(
                "after a failed extend of the expired only permit of 1, the next request: {e} \
                 (the extend revived it)"
            ))
        })?;
    expect_mode(&next, mode, "the permit after an expired one")?;
    released(&other, &next, "the permit after an expired one").await?;
    let Some(reader) = reader else {
        return Ok(());
    };
    expect_lost(
        ctx.store.extend(&reader).await,
        "an extend of an expired reader",
    )?;
    let writer = other
        .try_acquire_as(&reader_key, long, Mode::Exclusive)
        .await
        .map_err(|e| {
            Failure(format!(
                "after a failed extend of the expired only reader, a writer: {e} (the extend \
                 revived it)"
            ))
        })?;
    released(&other, &writer, "the writer after an expired reader").await
}

/// Checks that `status` of `key` counts exactly the readers `leases` and nothing else, and that
/// a store that lists holders lists each of them: `lists` remembers whether it listed any
/// before (a store that listed its readers once lists them every time). `false` where the
/// store has no `status`.
async fn expect_readers_counted(
    store: &DynLockStore,
    key: &str,
    leases: &[&Lease],
    lists: &mut Option<bool>,
    what: &str,
) -> Result<bool, Failure> {
    let status = match store.status(key).await {
        Err(Error::Unsupported { .. }) => return Ok(false),
        other => other?,
    };
    let expected = u32::try_from(leases.len()).unwrap_or(u32::MAX);
    let KeyStatus::Shared {
        mode: Mode::Shared,
        count,
        holders,
    } = status
    else {
        return Err(Failure(format!(
            "{what}: a key held by {expected} readers has the status {status:?}"
        )));
    };
    ensure!(
        count == expected,
        "{what}: the status counts {count} readers where {expected} hold the key"
    );
    let listed_before = *lists.get_or_insert(!holders.is_empty());
    ensure!(
        holders.len() == count as usize || (holders.is_empty() && !listed_before),
        "{what}: the status counts {count} readers and lists {} (it listed readers before)",
        holders.len()
    );
    let mut named = Vec::new();
    for holder in &holders {
        let Some(token) = holder.token else { continue };
        ensure!(
            leases.iter().any(|l| l.fencing_token() == token),
            "{what}: the status lists a reader with token {token}, none of the held readers' {:?}",
            leases.iter().map(|l| l.fencing_token()).collect::<Vec<_>>()
        );
        ensure!(
            !named.contains(&token),
            "{what}: the status lists the reader with token {token} twice"
        );
        named.push(token);
    }
    Ok(true)
}

/// `status` of a key held by readers counts exactly the readers holding it as they come and
/// go (1, 2, 3, then 2 after a release), lists each of them where the store lists holders, and
/// says the key is free once the last one released.
pub(super) async fn status_counts_exactly_the_readers_held(ctx: Ctx) -> CaseResult {
    let key = ctx.key("status-readers");
    let long = ctx.timing.long_ttl;
    let mut lists = None;
    let mut held = Vec::new();
    for i in 1..=3 {
        let store = ctx.handle().await;
        let lease = take(&store, &key, long, Mode::Shared, &format!("reader {i}")).await?;
        held.push((store, lease));
        let leases: Vec<&Lease> = held.iter().map(|(_, lease)| lease).collect();
        let what = ["one reader", "two readers", "three readers"][i - 1];
        if !expect_readers_counted(&ctx.store, &key, &leases, &mut lists, what).await? {
            // No status: nothing to count.
            for (store, lease) in &held {
                released(store, lease, "a reader").await?;
            }
            return Ok(());
        }
    }
    let (store, lease) = held.remove(1);
    released(&store, &lease, "the second reader").await?;
    let leases: Vec<&Lease> = held.iter().map(|(_, lease)| lease).collect();
    expect_readers_counted(
        &ctx.store,
        &key,
        &leases,
        &mut lists,
        "two readers after a third released",
    )
    .await?;
    for (store, lease) in &held {
        released(store, lease, "a reader").await?;
    }
    let status = ctx.store.status(&key).await?;
    ensure!(
        status == KeyStatus::Free,
        "every reader released, yet the status is {status:?}"
    );
    Ok(())
}

/// A reader holds the key for its own TTL, whatever the TTLs of the readers next to it: once a
/// short reader expired, a long one still holds, whether it joined the short one or the short
/// one joined it: a writer is busy, the long reader's extend succeeds and its release reports
/// `Released`.
pub(super) async fn each_reader_keeps_the_key_for_its_own_ttl(ctx: Ctx) -> CaseResult {
    let (short, long) = (ctx.timing.short_ttl, ctx.timing.long_ttl);
    let (a, b, other) = (ctx.handle().await, ctx.handle().await, ctx.handle().await);
    let joined_short = ctx.key("reader-ttl-joined-short");
    take(&a, &joined_short, short, Mode::Shared, "a short reader").await?;
    let long_after = take(&b, &joined_short, long, Mode::Shared, "a long reader").await?;
    let joined_long = ctx.key("reader-ttl-joined-long");
    let long_before = take(&b, &joined_long, long, Mode::Shared, "a long reader").await?;
    let last_short = take(&a, &joined_long, short, Mode::Shared, "a short reader").await?;
    // Both short readers were taken before this sleep starts.
    outlive(&ctx, &last_short).await;
    for (key, lease, what) in [
        (
            &joined_short,
            &long_after,
            "a long reader that joined a short one",
        ),
        (
            &joined_long,
            &long_before,
            "a long reader that a short one joined",
        ),
    ] {
        expect_busy(
            other.try_acquire_as(key, long, Mode::Exclusive).await,
            &format!("a writer after the short reader expired, next to {what}"),
        )?;
        b.extend(lease).await.map_err(|e| {
            Failure(format!(
                "{what}: its extend after the short reader expired: {e} (it was kept only \
                 until the short reader's expiry)"
            ))
        })?;
        released(&b, lease, what).await?;
    }
    Ok(())
}

/// A writer waiting behind a reader keeps new readers out; once its future is dropped it no
/// longer does: a new reader gets the key within the dropped writer's TTL plus the wake bound
/// (a dropped waiter stops keeping readers out and leaves nothing held past its TTL).
pub(super) async fn a_dropped_waiting_writer_stops_keeping_readers_out(ctx: Ctx) -> CaseResult {
    let key = ctx.key("dropped-writer");
    let (short, long) = (ctx.timing.short_ttl, ctx.timing.long_ttl);
    let reader = take(&ctx.store, &key, long, Mode::Shared, "a reader").await?;
    let writer_store = ctx.handle().await;
    let writer = tokio::spawn({
        let key = key.clone();
        async move {
            writer_store
                .acquire_as(&key, short, long, Mode::Exclusive)
                .await
        }
    });
    // The writer is waiting once a new reader is refused.
    let probe = ctx.handle().await;
    let started = Instant::now();
    loop {
        match probe.try_acquire_as(&key, long, Mode::Shared).await {
            Err(Error::Busy { .. }) => break,
            Ok(lease) => released(&probe, &lease, "a reader before the writer waited").await?,
            Err(other) => {
                return Err(Failure(format!(
                    "a reader next to a reader and a waiting writer: {other}"
                )))
            }
        }
        ensure!(
            started.elapsed() <= ctx.timing.wake_bound,
            "a writer waiting behind a reader did not keep new readers out within {:?}",
            ctx.timing.wake_bound
        );
        sleep(Duration::from_millis(20)).await;
    }
    ensure!(
        !writer.is_finished(),
        "the waiting writer returned while a reader held the key"
    );
    writer.abort();
    let _ = writer.await;
    let bound = short + ctx.timing.wake_bound;
    let dropped_at = Instant::now();
    let next = probe
        .acquire_as(&key, long, bound, Mode::Shared)
        .await
        .map_err(|e| {
            Failure(format!(
                "a writer dropped while it waited still kept readers out {bound:?} later (its \
                 TTL {short:?} plus the wake bound): {e}"
            ))
        })?;
    tracing::debug!(after = ?dropped_at.elapsed(), "reader admitted after a writer was dropped");
    expect_mode(&next, Mode::Shared, "a reader after a writer was dropped")?;
    released(&probe, &next, "the reader after the dropped writer").await?;
    released(&ctx.store, &reader, "the first reader").await
}

/// Where the store declares notified waits, readers parked behind a writer are handed the key
/// by the writer's release, not by its expiry (its TTL is [`Timing::long_ttl`](crate::Timing)):
/// over five handoffs to two readers each, every reader holds within the wake bound of the
/// release and the median within [`Timing::notified_wake_median`](crate::Timing), timed from
/// before the release is sent.
pub(super) async fn notified_readers_get_a_released_key_within_150_ms(ctx: Ctx) -> CaseResult {
    let key = ctx.key("notified-readers");
    let ttl = ctx.timing.long_ttl;
    let writer_store = ctx.store.clone();
    let readers = [ctx.handle().await, ctx.handle().await];
    let mut handoffs = Vec::new();
    for round in 0..5 {
        let writer = take(&writer_store, &key, ttl, Mode::Exclusive, "a writer").await?;
        let waiters: Vec<_> = readers
            .iter()
            .map(|store| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(async move {
                    let lease = store.acquire_as(&key, ttl, ttl, Mode::Shared).await;
                    (lease, Instant::now())
                })
            })
            .collect();
        // Long enough for the readers to be parked on their notification.
        sleep(Duration::from_millis(150)).await;
        ensure!(
            waiters.iter().all(|w| !w.is_finished()),
            "handoff {round}: a reader returned while a writer held the key"
        );
        let sent_at = Instant::now();
        released(&writer_store, &writer, "the writer").await?;
        let mut leases = Vec::new();
        for waiter in waiters {
            // Past the wake bound the case has failed: no need to wait longer.
            let (lease, granted_at) = timeout(ctx.timing.wake_bound, waiter)
                .await
                .map_err(|_| {
                    Failure(format!(
                        "handoff {round}: a reader still waited {:?} after the writer's \
                         release (the writer's TTL is {ttl:?}): it was not woken",
                        ctx.timing.wake_bound
                    ))
                })?
                .map_err(|e| Failure(format!("a reader panicked: {e}")))?;
            let lease = lease?;
            expect_mode(&lease, Mode::Shared, "a reader that waited")?;
            handoffs.push(granted_at.saturating_duration_since(sent_at));
            leases.push(lease);
        }
        for (store, lease) in readers.iter().zip(&leases) {
            released(store, lease, "a reader").await?;
        }
    }
    handoffs.sort_unstable();
    let (median, slowest) = (handoffs[handoffs.len() / 2], handoffs[handoffs.len() - 1]);
    ensure!(
        slowest <= ctx.timing.wake_bound,
        "a reader took {slowest:?} to get a key its writer released (all: {handoffs:?})"
    );
    let bound = ctx.timing.notified_wake_median;
    ensure!(
        median <= bound,
        "the store declares notified waits, but the median of {} handoffs to waiting readers \
         took {median:?} (all: {handoffs:?}); a notification hands a released key over within \
         {bound:?}",
        handoffs.len()
    );
    Ok(())
}

/// One order of arrival the fair queue keeps: a lease in `held`, then a waiter in `first`,
/// then a request in `later` that conflicts with it.
struct Arrivals {
    held: Mode,
    first: Mode,
    later: Mode,
}

/// A fair queue keeps its order across modes: a waiter is granted before every conflicting
/// request that arrived after it, whatever the mode of either. A later request's single
/// attempt is refused while the waiter waits (even with a permit slot free, or next to
/// readers it could join), and a later waiter is granted after it. Run for every pair of the
/// modes the store declares in which a stream of one could keep the other waiting.
pub(super) async fn a_fair_queue_keeps_its_order_across_modes(ctx: Ctx) -> CaseResult {
    let caps = ctx.store.capabilities();
    let permits = Mode::permits(2);
    let mut orders = Vec::new();
    if caps.permits {
        orders.push(Arrivals {
            held: permits,
            first: Mode::Exclusive,
            later: permits,
        });
    }
    if caps.shared {
        orders.push(Arrivals {
            held: Mode::Exclusive,
            first: Mode::Shared,
            later: Mode::Exclusive,
        });
    }
    if caps.permits && caps.shared {
        orders.push(Arrivals {
            held: permits,
            first: Mode::Shared,
            later: permits,
        });
        orders.push(Arrivals {
            held: Mode::Shared,
            first: permits,
            later: Mode::Shared,
        });
        // A writer asked after a waiter of the other group queues behind it too.
        orders.push(Arrivals {
            held: Mode::Shared,
            first: permits,
            later: Mode::Exclusive,
        });
        orders.push(Arrivals {
            held: permits,
            first: Mode::Shared,
            later: Mode::Exclusive,
        });
    }
    for (i, order) in orders.iter().enumerate() {
        keeps_arrival_order(&ctx, &ctx.key(&format!("fair-modes-{i}")), order).await?;
    }
    Ok(())
}

async fn keeps_arrival_order(ctx: &Ctx, key: &str, order: &Arrivals) -> CaseResult {
    let Arrivals { held, first, later } = *order;
    let long = ctx.timing.long_ttl;
    // As the fair case does: long enough for a waiter to have its place before the next.
    let settle = Duration::from_millis(250);
    let served = Arc::new(Mutex::new(Vec::new()));
    let holder = take(&ctx.store, key, long, held, &format!("a {held} holder")).await?;
    let waiter = |store: DynLockStore, mode: Mode, name: &'static str| {
        let (key, served) = (key.to_owned(), served.clone());
        tokio::spawn(async move {
            let lease = store.acquire_as(&key, long, long, mode).await?;
            served
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(name);
            store.release(&lease).await.map(drop)
        })
    };
    let first_waiter = waiter(ctx.handle().await, first, "first");
    sleep(settle).await;
    let intruder = ctx.handle().await;
    let attempt = intruder.try_acquire_as(key, long, later).await;
    if let Ok(lease) = &attempt {
        let _ = intruder.release(lease).await;
    }
    expect_busy(
        attempt,
        &format!("a {later} request that arrived after a waiting {first} (the key held {held})"),
    )?;
    let later_waiter = waiter(ctx.handle().await, later, "later");
    sleep(settle).await;
    released(&ctx.store, &holder, "the holder").await?;
    for (task, what) in [
        (first_waiter, "the first waiter"),
        (later_waiter, "the later waiter"),
    ] {
        timeout(long, joined(task, what))
            .await
            .map_err(|_| Failure(format!("{what} was not granted within {long:?}")))??
            .map_err(|e| Failure(format!("{what}: {e}")))?;
    }
    let served = served
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    ensure!(
        served == ["first", "later"],
        "with the key held {held}, a waiting {first} and then a waiting {later} were served in \
         the order {served:?}"
    );
    Ok(())
}
