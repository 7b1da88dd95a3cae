//! An unreachable store, and what `status` reports.

use std::time::Duration;

use fencelock_core::{Error, KeyStatus};
use tokio::time::{timeout, Instant};

use super::support::released;
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) async fn unreachable_store_gives_a_retryable_error(ctx: Ctx) -> CaseResult {
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

pub(super) async fn status_reports_the_holder(ctx: Ctx) -> CaseResult {
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
