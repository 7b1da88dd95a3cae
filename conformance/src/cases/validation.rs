//! TTLs and waits are checked before anything is sent.

use std::time::Duration;

use fencelock_core::limits::MAX_WAIT;
use tokio::time::Instant;

use super::support::{expect_invalid, released};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) async fn zero_ttl_is_rejected(ctx: Ctx) -> CaseResult {
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

pub(super) async fn ttl_outside_store_bounds_is_rejected(ctx: Ctx) -> CaseResult {
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

pub(super) async fn absurd_wait_is_rejected(ctx: Ctx) -> CaseResult {
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
