//! Extending and expiring: compare-and-expire, no resurrection, a conservative local deadline,
//! and no lease returned with its deadline already passed.

use std::time::Duration;

use fencelock_core::{raw::drift, DynLockStore, Error, KeyStatus, Lease, Mode};
use tokio::time::{sleep, sleep_until, Instant};

use super::support::{expect_busy, expect_lost, outlive, released, short_lease};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) async fn extend_keeps_a_lease_past_its_first_ttl(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.hold_ttl).await?;
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

pub(super) async fn extend_after_expiry_fails_and_does_not_resurrect(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend-expired");
    let (lease, _) = short_lease(&ctx, &key).await?;
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

pub(super) async fn extend_by_a_stale_lease_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale-extend");
    let other = ctx.handle().await;
    let (stale, _) = short_lease(&ctx, &key).await?;
    outlive(&ctx, &stale).await;
    let current = other.try_acquire(&key, ctx.timing.hold_ttl).await?;
    expect_lost(ctx.store.extend(&stale).await, "a stale lease's extend")?;
    other.extend(&current).await?;
    released(&other, &current, "successor").await
}

/// An extend sent while a third of the lease's validity has passed moves its local deadline,
/// measured from before the extend was sent. The TTL is [`Timing::hold_ttl`](crate::Timing)
/// and the wait a third of the validity the grant left (not of the TTL): a grant answered late
/// on a loaded machine leaves less, and an extend sent after the deadline proves nothing.
///
/// The store's renewal starts no earlier than the call, so a deadline past `sent_at + ttl`
/// could outlive it. A store reads its clock after `sent_at`, by less than the drift margin
/// unless the machine stalled the call: one extend within it in three shows the deadline is
/// measured from the request (as `local_deadline_is_conservative` does for grants), and a
/// store that measures from later fails all three.
pub(super) async fn extend_moves_the_local_deadline(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend-deadline");
    let lease = ctx.store.try_acquire(&key, ctx.timing.hold_ttl).await?;
    let first = lease.valid_until();
    sleep(first.saturating_duration_since(Instant::now()) / 3).await;
    let mut late = Vec::new();
    loop {
        let sent_at = Instant::now();
        ctx.store.extend(&lease).await?;
        let moved = lease.valid_until();
        ensure!(moved > first, "extend did not move the local deadline");
        let latest = sent_at + lease.ttl();
        if moved <= latest {
            break;
        }
        late.push(moved - latest);
        ensure!(
            late.len() < 3,
            "the new deadline is {late:?} later than the extend's sending + TTL, in three extends: \
             it is not measured from before the extend was sent"
        );
    }
    released(&ctx.store, &lease, "extended lease").await
}

/// After an extend the store keeps the key until at least the holder's new local deadline: a
/// tenth of the TTL before it (and past the grant's own expiry) another handle finds the key
/// busy. A store that renews for less than the TTL while the lease's deadline moves by the whole
/// TTL lets others take a key its holder believes it holds. The TTL is
/// [`Timing::hold_ttl`](crate::Timing), so the margin to the store's real expiry (a tenth of
/// the TTL plus the drift) stays wide on a loaded machine.
pub(super) async fn extend_keeps_the_key_until_the_new_local_deadline(ctx: Ctx) -> CaseResult {
    let key = ctx.key("extend-holds");
    let other = ctx.handle().await;
    let ttl = ctx.timing.hold_ttl;
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

pub(super) async fn local_deadline_is_conservative(ctx: Ctx) -> CaseResult {
    let key = ctx.key("deadline");
    // A handle that has taken a key before: the timed grant below is one request, not a
    // connection's set-up, which a store may do before it reads the clock.
    released(
        &ctx.store,
        &ctx.store
            .try_acquire(&ctx.key("deadline-warm"), ctx.timing.short_ttl)
            .await?,
        "warm-up",
    )
    .await?;
    // The store's expiry starts no earlier than `before`, so a deadline past `before + ttl`
    // could outlive the store's. A store reads its clock after `before`, by less than the drift
    // margin unless the machine stalled the call: one grant within it in three tries shows the
    // deadline is measured from the request, and a store that measures from later fails all.
    let mut late = Vec::new();
    let lease = loop {
        let (lease, before) = short_lease(&ctx, &key).await?;
        let latest = before + lease.ttl();
        if lease.valid_until() <= latest {
            break lease;
        }
        late.push(lease.valid_until() - latest);
        released(&ctx.store, &lease, "holder").await?;
        ensure!(
            late.len() < 3,
            "the local deadline is {late:?} later than the request time + TTL, in three grants"
        );
    };
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

/// Takes `key` in `mode` by the plain methods for an exclusive lease, the `_as` ones for the
/// others: one attempt without `wait`, a waiting acquire with it.
async fn grant(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    wait: Option<Duration>,
    mode: Mode,
) -> fencelock_core::Result<Lease> {
    match (mode, wait) {
        (Mode::Exclusive, None) => store.try_acquire(key, ttl).await,
        (Mode::Exclusive, Some(wait)) => store.acquire(key, ttl, wait).await,
        (mode, None) => store.try_acquire_as(key, ttl, mode).await,
        (mode, Some(wait)) => store.acquire_as(key, ttl, wait, mode).await,
    }
}

/// Checks that `lease`, just returned by `how`, is held in `mode` with validity left.
fn expect_validity_left(lease: &Lease, mode: Mode, how: &str) -> CaseResult {
    ensure!(
        lease.mode() == mode,
        "{how}: a lease asked as {mode} says it is held as {}",
        lease.mode()
    );
    ensure!(
        !lease.is_expired() && lease.remaining() > Duration::ZERO,
        "{how} returned a lease in {mode} (TTL {:?}) whose local deadline had passed {:?} \
         before the caller could use it",
        lease.ttl(),
        Instant::now().saturating_duration_since(lease.valid_until())
    );
    Ok(())
}

/// One mode of [`every_returned_lease_has_validity_left`].
async fn validity_left_in(ctx: &Ctx, mode: Mode, ttl: Duration) -> CaseResult {
    let name = match mode {
        Mode::Exclusive => "validity-exclusive",
        Mode::Shared => "validity-shared",
        _ => "validity-permit",
    };
    let key = ctx.key(name);
    let (other, waiter) = (ctx.handle().await, ctx.handle().await);
    let lease = grant(&ctx.store, &key, ttl, None, mode).await?;
    expect_validity_left(&lease, mode, "a single attempt")?;
    released(&ctx.store, &lease, "a lease from a single attempt").await?;
    let lease = grant(&ctx.store, &key, ttl, Some(ttl), mode).await?;
    expect_validity_left(&lease, mode, "a waiting acquire of a free key")?;
    released(&ctx.store, &lease, "a lease from a waiting acquire").await?;
    // A writer holds the key for longer than the waiter's TTL.
    let blocker = other.try_acquire(&key, ctx.timing.long_ttl).await?;
    let waited = tokio::spawn({
        let key = key.clone();
        let wait = ttl * 2 + ctx.timing.wake_bound;
        async move {
            let lease = grant(&waiter, &key, ttl, Some(wait), mode).await;
            (lease, waiter)
        }
    });
    sleep(ttl + ttl / 4).await;
    ensure!(
        !waited.is_finished(),
        "a waiting {mode} acquire returned while a writer held the key"
    );
    released(&other, &blocker, "the writer").await?;
    let (lease, waiter) = waited
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?;
    let lease = lease?;
    expect_validity_left(
        &lease,
        mode,
        "a waiting acquire that waited longer than its TTL",
    )?;
    released(&waiter, &lease, "a lease after a long wait").await
}

/// Every lease a store returns still has validity left (its local deadline is ahead, so its
/// holder may act on it), in every mode the store keeps: from a single attempt, from a waiting
/// acquire of a free key, and from one that waited longer than its own TTL (1 s, or the
/// store's shortest) for a writer to go, which is where a deadline measured from the start of
/// the wait, or a stall after the grant, would have it expire before it is returned.
pub(super) async fn every_returned_lease_has_validity_left(ctx: Ctx) -> CaseResult {
    let ttl = ctx
        .capabilities
        .granted_ttl(ctx.timing.short_ttl.max(Duration::from_secs(1)));
    let modes = [Mode::Exclusive, Mode::Shared, Mode::permits(2)]
        .into_iter()
        .filter(|mode| ctx.capabilities.supports(*mode));
    // The modes in parallel: each waits out one TTL.
    futures_util::future::try_join_all(modes.map(|mode| validity_left_in(&ctx, mode, ttl))).await?;
    Ok(())
}

pub(super) async fn expiry_frees_the_key(ctx: Ctx) -> CaseResult {
    let key = ctx.key("expiry");
    let (lease, _) = short_lease(&ctx, &key).await?;
    outlive(&ctx, &lease).await;
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("the key is still held after its TTL: {e}")))?;
    released(&ctx.store, &next, "next holder").await
}
