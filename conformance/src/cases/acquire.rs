//! Acquiring: one attempt on a free or held key, and exclusion under contention.

use tokio::time::Instant;

use super::support::{contend, expect_busy, released};
use crate::runner::CaseResult;
use crate::Ctx;

pub(super) async fn try_acquire_grants_a_free_key(ctx: Ctx) -> CaseResult {
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

pub(super) async fn try_acquire_on_a_held_key_is_busy(ctx: Ctx) -> CaseResult {
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

pub(super) async fn acquire_is_exclusive_under_contention(ctx: Ctx) -> CaseResult {
    contend(&ctx, &ctx.key("contention"), 32).await.map(drop)
}
