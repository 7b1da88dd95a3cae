//! What the cases share: expected-error checks, a checked release, waiting out a TTL, and the
//! fenced contention that the acquire and token cases both run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_core::{DynLockStore, Error, FenceGate, KeyStatus, Lease, Mode, ReleaseOutcome};
use tokio::time::{sleep, Instant};

use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) fn expect_busy(result: fencelock_core::Result<Lease>, what: &str) -> CaseResult {
    match result {
        Err(Error::Busy { .. }) => Ok(()),
        Ok(lease) => Err(Failure(format!(
            "{what}: the key was granted (token {}) while another lease held it",
            lease.fencing_token()
        ))),
        Err(other) => Err(Failure(format!("{what}: expected Busy, got {other}"))),
    }
}

pub(super) fn expect_invalid<T>(
    result: fencelock_core::Result<T>,
    input: &str,
    what: &str,
) -> CaseResult {
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

pub(super) fn expect_lost(result: fencelock_core::Result<()>, what: &str) -> CaseResult {
    match result {
        Err(Error::LeaseLost { .. }) => Ok(()),
        Ok(()) => Err(Failure(format!("{what}: extend succeeded"))),
        Err(other) => Err(Failure(format!("{what}: expected LeaseLost, got {other}"))),
    }
}

pub(super) async fn released(store: &DynLockStore, lease: &Lease, what: &str) -> CaseResult {
    let outcome = store.release(lease).await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "{what}: release of a held lease reported {outcome:?}"
    );
    Ok(())
}

/// A lease of the short TTL on `key`, with the instant its granted request was sent. A grant
/// that a loaded machine delivers after so short a TTL ran out is refused as `Unavailable`
/// (retryable: the contract releases it rather than hand out an expired lease), so the
/// request is sent again, up to five times, as a program would.
pub(super) async fn short_lease(ctx: &Ctx, key: &str) -> Result<(Lease, Instant), Error> {
    let mut tries = 1;
    loop {
        let sent = Instant::now();
        match ctx.store.try_acquire(key, ctx.timing.short_ttl).await {
            Err(Error::Unavailable { .. }) if tries < 5 => tries += 1,
            result => return result.map(|lease| (lease, sent)),
        }
    }
}

/// Sleeps until `lease`'s key has certainly expired in the store.
pub(super) async fn outlive(ctx: &Ctx, lease: &Lease) {
    sleep(lease.ttl() + ctx.timing.slack).await;
}

/// Runs `tasks` holders over two handles, each doing a read-modify-write of a fenced counter
/// inside the lock; returns the tokens in the order their holders entered.
pub(super) async fn contend(ctx: &Ctx, key: &str, tasks: usize) -> Result<Vec<u64>, Failure> {
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

/// Checks that `lease` holds its key in `mode`, with a slot below the limit exactly for a
/// permit.
pub(super) fn expect_mode(lease: &Lease, mode: Mode, what: &str) -> CaseResult {
    ensure!(
        lease.mode() == mode,
        "{what}: a lease asked as {mode} says it is held as {}",
        lease.mode()
    );
    match (mode, lease.slot()) {
        (Mode::Permit { limit }, Some(slot)) => ensure!(
            slot < limit,
            "{what}: a permit of {limit} has slot {slot}, outside 0..{limit}"
        ),
        (Mode::Permit { .. }, None) => {
            return Err(Failure(format!("{what}: a permit carries no slot")))
        }
        (_, Some(slot)) => {
            return Err(Failure(format!(
                "{what}: a {mode} lease carries slot {slot}; only permits have slots"
            )))
        }
        (_, None) => {}
    }
    Ok(())
}

/// Takes `key` in `mode` with one attempt and checks the lease's mode.
pub(super) async fn take(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    mode: Mode,
    what: &str,
) -> Result<Lease, Failure> {
    let lease = store.try_acquire_as(key, ttl, mode).await.map_err(|e| {
        Failure(format!(
            "{what}: try_acquire_as({mode}) of a key that admits it: {e}"
        ))
    })?;
    expect_mode(&lease, mode, what)?;
    Ok(lease)
}

/// Checks what `status` says of a key held in `mode` by `leases` (and nothing else): the mode,
/// at least `leases.len()` holders (exactly, for permits, which a store must count), and for
/// each holder it names, a token and slot of one of `leases`. A store without `status` passes.
pub(super) async fn expect_held_together(
    store: &DynLockStore,
    key: &str,
    mode: Mode,
    leases: &[&Lease],
    what: &str,
) -> CaseResult {
    let status = match store.status(key).await {
        Err(Error::Unsupported { .. }) => return Ok(()),
        other => other?,
    };
    let KeyStatus::Shared {
        mode: held_as,
        count,
        holders,
    } = status
    else {
        return Err(Failure(format!(
            "{what}: a key held by {} leases in {mode} has the status {status:?}",
            leases.len()
        )));
    };
    ensure!(
        held_as == mode,
        "{what}: a key held in {mode} has the status of one held in {held_as}"
    );
    let expected = u32::try_from(leases.len()).unwrap_or(u32::MAX);
    match mode {
        Mode::Permit { .. } => ensure!(
            count == expected,
            "{what}: the status counts {count} permits where {expected} are held"
        ),
        _ => ensure!(
            count >= expected,
            "{what}: the status counts {count} holders where {expected} hold the key"
        ),
    }
    ensure!(
        holders.is_empty() || holders.len() == count as usize,
        "{what}: the status counts {count} holders but lists {}",
        holders.len()
    );
    for holder in &holders {
        let Some(token) = holder.token else { continue };
        let Some(lease) = leases.iter().find(|l| l.fencing_token() == token) else {
            return Err(Failure(format!(
                "{what}: the status lists a holder with token {token}, none of the leases' {:?}",
                leases.iter().map(|l| l.fencing_token()).collect::<Vec<_>>()
            )));
        };
        ensure!(
            holder.owner.is_none_or(|owner| owner == lease.owner()),
            "{what}: the status names another owner for token {token}"
        );
        ensure!(
            holder.slot.is_none() || holder.slot == lease.slot(),
            "{what}: the status puts token {token} in slot {:?}, the lease in {:?}",
            holder.slot,
            lease.slot()
        );
    }
    Ok(())
}
