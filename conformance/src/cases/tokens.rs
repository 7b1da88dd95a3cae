//! Fencing tokens only grow: one after another, after an expiry, across handles, under
//! contention, and after the store dropped a key's state at the end of its retention window.

use tokio::time::sleep;

use super::support::{contend, outlive, released, short_lease};
use crate::runner::CaseResult;
use crate::Ctx;

pub(super) async fn tokens_increase_sequentially(ctx: Ctx) -> CaseResult {
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

pub(super) async fn tokens_increase_after_expiry(ctx: Ctx) -> CaseResult {
    let key = ctx.key("tokens-expiry");
    let (first, _) = short_lease(&ctx, &key).await?;
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

pub(super) async fn tokens_increase_across_handles(ctx: Ctx) -> CaseResult {
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

/// Runs for a store that declares a retention window of at most 10 s (its tests configure one):
/// a key left alone past the window, whose per-key state the store may have dropped, still gets
/// a greater token. Another key is locked and released after the window, for stores that clean
/// up as a side effect of their own traffic.
pub(super) async fn tokens_increase_after_the_retention_window(ctx: Ctx) -> CaseResult {
    let Some(retention) = ctx.capabilities.retention else {
        return Ok(());
    };
    let key = ctx.key("tokens-retention");
    let (first, _) = short_lease(&ctx, &key).await?;
    released(&ctx.store, &first, "holder").await?;
    sleep(retention + ctx.timing.slack).await;
    let other = ctx
        .store
        .try_acquire(&ctx.key("tokens-retention-other"), ctx.timing.short_ttl)
        .await?;
    released(&ctx.store, &other, "the other key's holder").await?;
    sleep(ctx.timing.slack).await;
    let (second, _) = short_lease(&ctx, &key).await?;
    ensure!(
        second.fencing_token() > first.fencing_token(),
        "token {} after {} and a retention window of {retention:?}",
        second.fencing_token(),
        first.fencing_token()
    );
    released(&ctx.store, &second, "holder").await
}

pub(super) async fn tokens_increase_under_contention(ctx: Ctx) -> CaseResult {
    let order = contend(&ctx, &ctx.key("tokens-contention"), 16).await?;
    ensure!(
        order.windows(2).all(|w| w[0] < w[1]),
        "tokens in the order holders entered: {order:?}"
    );
    Ok(())
}
