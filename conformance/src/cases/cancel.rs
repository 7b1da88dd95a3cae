//! Cancellation: a dropped acquire or waiter leaves nothing held; a dead holder frees its key.

use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use super::support::released;
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) async fn cancelled_acquire_leaves_nothing_held_past_ttl(ctx: Ctx) -> CaseResult {
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

pub(super) async fn dropped_waiter_never_acquires_later(ctx: Ctx) -> CaseResult {
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

pub(super) async fn dead_holder_frees_the_key_on_disconnect(ctx: Ctx) -> CaseResult {
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
