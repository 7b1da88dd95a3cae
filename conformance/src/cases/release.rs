//! Releasing: compare-and-delete, so only the holder releases and a lost lease says so.

use fencelock_core::ReleaseOutcome;

use super::support::{expect_busy, outlive, released, short_lease};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) async fn release_of_a_held_lease_reports_released(ctx: Ctx) -> CaseResult {
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

pub(super) async fn release_by_non_owner_is_rejected(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale-release");
    let other = ctx.handle().await;
    let (stale, _) = short_lease(&ctx, &key).await?;
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

pub(super) async fn release_after_expiry_reports_lost(ctx: Ctx) -> CaseResult {
    let key = ctx.key("release-expired");
    let (lease, _) = short_lease(&ctx, &key).await?;
    outlive(&ctx, &lease).await;
    let outcome = ctx.store.release(&lease).await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "release after expiry reported {outcome:?}"
    );
    Ok(())
}

pub(super) async fn second_release_reports_lost(ctx: Ctx) -> CaseResult {
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
