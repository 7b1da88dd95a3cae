//! Several keys at once (`lock_all`): all or none, in one order, kept and lost together.

use std::collections::HashSet;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_core::{DynLockStore, Error, LockStoreExt, ReleaseOutcome};
use tokio::time::{sleep, timeout, Instant};

use super::support::released;
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

/// Whether `key` is free, as a caller other than the set's finds it: a fresh handle's one
/// attempt (released at once), not `status`, which a store may not answer.
async fn free(ctx: &Ctx, key: &str) -> Result<bool, Error> {
    let store = ctx.handle().await;
    match store.try_acquire(key, ctx.timing.long_ttl).await {
        Ok(lease) => {
            let _ = store.release(&lease).await?;
            Ok(true)
        }
        Err(Error::Busy { .. }) => Ok(false),
        Err(other) => Err(other),
    }
}

/// Waits up to `bound` for every key of `keys` to be free; the ones still held after it.
async fn held_after(ctx: &Ctx, keys: &[String], bound: Duration) -> Result<Vec<String>, Error> {
    let until = Instant::now() + bound;
    loop {
        let mut held = Vec::new();
        for key in keys {
            if !free(ctx, key).await? {
                held.push(key.clone());
            }
        }
        if held.is_empty() || Instant::now() >= until {
            return Ok(held);
        }
        sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn overlapping_sets_in_opposite_orders_both_finish_and_never_share_a_key(
    ctx: Ctx,
) -> CaseResult {
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|k| ctx.key(&format!("set-{k}")))
        .collect();
    let reversed: Vec<String> = keys.iter().rev().cloned().collect();
    let holding: Arc<Mutex<HashSet<String>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let rounds = 3;
    let (ttl, wait) = (ctx.timing.long_ttl, ctx.timing.long_ttl * 2);
    let mut tasks = Vec::new();
    for set in [keys.clone(), reversed] {
        let store: DynLockStore = ctx.handle().await;
        let (holding, overlaps) = (holding.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let guard = store.lock_all(&set).ttl(ttl).wait(wait).await?;
                for key in &set {
                    if !holding
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(key.clone())
                    {
                        overlaps
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(key.clone());
                    }
                }
                sleep(Duration::from_millis(20)).await;
                for key in &set {
                    holding
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(key);
                }
                if guard.release().await? == ReleaseOutcome::Lost {
                    let lost = "(a lease ran out before its release)".to_owned();
                    overlaps
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(lost);
                }
            }
            Ok::<(), Error>(())
        }));
    }
    // Both sets finish well within their waits unless they wait for each other in a cycle.
    let bound = wait * 2 + ctx.timing.slack;
    for task in tasks {
        match timeout(bound, task).await {
            Err(_) => {
                return Err(Failure(format!(
                    "two sets over the same keys in opposite orders did not finish within {bound:?}"
                )))
            }
            Ok(Err(panicked)) => return Err(Failure(format!("a set's task panicked: {panicked}"))),
            Ok(Ok(result)) => result?,
        }
    }
    let overlaps = overlaps
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    ensure!(
        overlaps.is_empty(),
        "two sets held a common key at once: {overlaps:?}"
    );
    Ok(())
}

pub(super) async fn a_set_whose_last_key_is_busy_leaves_none_of_its_keys_held(
    ctx: Ctx,
) -> CaseResult {
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|k| ctx.key(&format!("busy-set-{k}")))
        .collect();
    let holder = ctx.store.try_acquire(&keys[2], ctx.timing.long_ttl).await?;
    let store = ctx.handle().await;
    let wait = Duration::from_millis(300);
    match store
        .lock_all(&keys)
        .ttl(ctx.timing.long_ttl)
        .wait(wait)
        .await
    {
        Err(Error::WaitTimedOut { key, waited }) => {
            ensure!(
                key == keys[2],
                "the timeout names {key:?}, not the busy key"
            );
            ensure!(
                waited >= wait,
                "the set gave up after {waited:?}, before its {wait:?}"
            );
        }
        Err(other) => return Err(Failure(format!("expected WaitTimedOut, got {other}"))),
        Ok(_) => return Err(Failure("a set with a held key was granted".into())),
    }
    // The release is awaited before the error returns: the first keys are free at once.
    for key in &keys[..2] {
        ensure!(
            free(&ctx, key).await?,
            "{key:?} was left held by a set that could not be had"
        );
    }
    released(&ctx.store, &holder, "the busy key's holder").await
}

pub(super) async fn the_loss_of_one_key_ends_the_set(ctx: Ctx) -> CaseResult {
    let keys: Vec<String> = ["a", "b"]
        .iter()
        .map(|k| ctx.key(&format!("lost-set-{k}")))
        .collect();
    let ttl = ctx.timing.hold_ttl;
    let set = ctx.store.lock_all(&keys).ttl(ttl).await?;
    let lease = set
        .leases()
        .find(|lease| lease.key() == keys[1])
        .cloned()
        .ok_or_else(|| Failure("the set has no lease of its second key".into()))?;
    ctx.factory.forget(&lease).await;
    // As a single guard's: the loss is seen within a third of the TTL of the forget.
    let bound = ttl / 3 + ctx.timing.loss_detection_slack;
    let outcome = timeout(bound, set.run(std::future::pending::<()>())).await;
    match outcome {
        Err(_) => {
            return Err(Failure(format!(
                "the set did not end within {bound:?} of the loss of one of its keys"
            )))
        }
        Ok(Ok(())) => unreachable!("pending work never finishes"),
        Ok(Err(error)) => ensure!(
            error.to_string().contains(&keys[1]),
            "the loss does not name the key lost: {error}"
        ),
    }
    ensure!(
        set.lost_key() == Some(keys[1].as_str()),
        "lost_key says {:?}",
        set.lost_key()
    );
    let outcome = set.release().await?;
    ensure!(
        outcome == ReleaseOutcome::Lost,
        "the release of a set with a lost key says {outcome:?}"
    );
    ensure!(
        free(&ctx, &keys[0]).await?,
        "the release of a lost set left its other key held"
    );
    Ok(())
}

pub(super) async fn a_dropped_set_acquire_leaves_nothing_held(ctx: Ctx) -> CaseResult {
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|k| ctx.key(&format!("dropped-set-{k}")))
        .collect();
    let holder = ctx.store.try_acquire(&keys[2], ctx.timing.long_ttl).await?;
    let store = ctx.handle().await;
    // Dropped while it waits for the last key, with the first two taken and kept alive.
    let attempt = store
        .lock_all(&keys)
        .ttl(ctx.timing.long_ttl)
        .wait(ctx.timing.long_ttl);
    if timeout(Duration::from_millis(300), attempt.into_future())
        .await
        .is_ok()
    {
        return Err(Failure(
            "a set with a held key finished its wait early".into(),
        ));
    }
    // The keys it took are released in the background, long before their TTL.
    let held = held_after(&ctx, &keys[..2], ctx.timing.wake_bound).await?;
    ensure!(
        held.is_empty(),
        "a dropped set acquire left {held:?} held {:?} after the drop (TTL {:?})",
        ctx.timing.wake_bound,
        ctx.timing.long_ttl
    );
    released(&ctx.store, &holder, "the busy key's holder").await?;
    ensure!(
        free(&ctx, &keys[2]).await?,
        "the dropped set took its last key after all"
    );
    Ok(())
}
