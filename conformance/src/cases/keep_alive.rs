//! Keep-alive, the lost signal and `with_lock`.

use std::future::pending;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw;
use fencelock_core::{with_lock, DynLockStore, Error, Lease, LockStore, LockStoreExt};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use super::support::{expect_busy, outlive, released, short_lease};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

/// A store wrapper whose extend never answers: a holder cut off from the store. Everything
/// else is forwarded.
#[derive(Debug)]
struct Stalled(DynLockStore);

#[async_trait]
impl raw::Wrapper for Stalled {
    fn inner(&self) -> &dyn LockStore {
        &*self.0
    }

    async fn extend(&self, _: &Lease) -> fencelock_core::Result<()> {
        pending().await
    }
}

/// A wrapper for a keep-alive: its first `failures` extends fail with a retryable
/// error without reaching the store (a transient outage), later ones are forwarded, and every
/// confirmed extend is counted on a watch channel so a case can act right after one.
#[derive(Debug)]
struct WatchedExtends {
    store: DynLockStore,
    failures_left: AtomicU32,
    confirmed: watch::Sender<u32>,
}

impl WatchedExtends {
    fn failing_first(store: DynLockStore, failures: u32) -> Self {
        WatchedExtends {
            store,
            failures_left: AtomicU32::new(failures),
            confirmed: watch::Sender::new(0),
        }
    }

    /// Sees each extend the store confirms from now on.
    fn confirmed(&self) -> watch::Receiver<u32> {
        self.confirmed.subscribe()
    }
}

#[async_trait]
impl raw::Wrapper for WatchedExtends {
    fn inner(&self) -> &dyn LockStore {
        &*self.store
    }

    async fn extend(&self, lease: &Lease) -> fencelock_core::Result<()> {
        let fail = self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(Error::Unavailable {
                message: "a transient failure injected by the conformance suite".into(),
                source: None,
            });
        }
        self.store.extend(lease).await?;
        self.confirmed.send_modify(|count| *count += 1);
        Ok(())
    }
}

pub(super) async fn keep_alive_holds_a_lease_over_five_ttls(ctx: Ctx) -> CaseResult {
    let key = ctx.key("keep-alive");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.hold_ttl).await?;
    let held = ctx.factory.keep_alive(ctx.store.clone(), lease);
    for _ in 0..5 {
        sleep(held.lease().ttl()).await;
        ensure!(
            !held.is_lost(),
            "keep-alive lost the lease: {:?}",
            held.lost_reason()
        );
        expect_busy(
            other.try_acquire(&key, ctx.timing.long_ttl).await,
            "while kept alive",
        )?;
    }
    let lease = held.stop().await;
    released(&ctx.store, &lease, "kept-alive lease").await
}

/// How many extends in a row [`keep_alive_survives_transient_extend_failures`] fails.
///
/// Three, so that the case tells a keep-alive that retries soon after a failure from one that
/// waits a whole extend period: with a period of a third of the TTL the first attempt is at
/// TTL/3 and whole-period retries come at 2·TTL/3 and TTL, past the local deadline; with a
/// period of a quarter they come at TTL/2, 3·TTL/4 and TTL, again past it. Retries a quarter
/// period apart make the fourth attempt near 0.6·TTL, well before the deadline. Two failures
/// would let a quarter-TTL keep-alive that waits a whole period pass (its third attempt, at
/// 3·TTL/4, succeeds).
const TRANSIENT_FAILURES: u32 = 3;

/// A keep-alive survives extends that fail with a retryable error and then recover: the lost
/// signal stays quiet and the key stays held (past the grant's expiry and the recovering
/// extend's) until the keep-alive is stopped. See [`TRANSIENT_FAILURES`] for why three
/// failures in a row prove that retries come soon enough. The TTL is
/// [`Timing::hold_ttl`](crate::Timing), so the retries' margin stays wide on a loaded machine.
pub(super) async fn keep_alive_survives_transient_extend_failures(ctx: Ctx) -> CaseResult {
    let key = ctx.key("transient");
    let other = ctx.handle().await;
    let lease = ctx.store.try_acquire(&key, ctx.timing.hold_ttl).await?;
    let flaky = Arc::new(WatchedExtends::failing_first(
        ctx.store.clone(),
        TRANSIENT_FAILURES,
    ));
    let mut confirmed = flaky.confirmed();
    let held = ctx.factory.keep_alive(flaky, lease.clone());
    let gave_up = || {
        Failure(format!(
            "the keep-alive gave up after {TRANSIENT_FAILURES} transient extend failures: {}",
            held.lost_reason().unwrap_or_default()
        ))
    };
    tokio::select! {
        biased;
        () = held.lost() => return Err(gave_up()),
        recovered = timeout(lease.ttl(), confirmed.changed()) => match recovered {
            Ok(Ok(())) => {}
            _ => {
                return Err(Failure(format!(
                    "no extend was confirmed within a TTL of {:?} despite the store recovering",
                    lease.ttl()
                )))
            }
        },
    }
    // One more TTL: the key is then held neither by the grant nor by the recovering extend,
    // only by a keep-alive that kept going.
    sleep(lease.ttl()).await;
    ensure!(!held.is_lost(), "{}", gave_up().0);
    expect_busy(
        other.try_acquire(&key, ctx.timing.long_ttl).await,
        "a TTL after the keep-alive recovered",
    )?;
    let lease = held.stop().await;
    released(&ctx.store, &lease, "kept-alive lease").await
}

/// When the store forgets a kept-alive lease, the lost signal fires within a third of the TTL
/// (plus [`Timing::loss_detection_slack`](crate::Timing) for the extend's round trip), so a
/// holder learns of the loss long before its deadline. The forget lands right after a
/// confirmed extend, the worst moment: a keep-alive that extends at least every third of the
/// TTL meets the bound; one that learns of the loss only at its local deadline (a store that
/// reports a lost lease as a retryable error) or that extends every half TTL does not. The TTL
/// is at least three seconds, so the slack is small beside the bound.
pub(super) async fn lost_signal_fires_within_a_third_of_the_ttl_of_a_forget(
    ctx: Ctx,
) -> CaseResult {
    let key = ctx.key("forgotten");
    let ttl = ctx
        .capabilities
        .granted_ttl(ctx.capabilities.min_ttl.max(Duration::from_secs(3)));
    let lease = ctx.store.try_acquire(&key, ttl).await?;
    let watched = Arc::new(WatchedExtends::failing_first(ctx.store.clone(), 0));
    let mut confirmed = watched.confirmed();
    let held = ctx.factory.keep_alive(watched, lease.clone());
    timeout(lease.ttl(), confirmed.changed())
        .await
        .map_err(|_| Failure(format!("no extend was confirmed within {:?}", lease.ttl())))?
        .map_err(|_| Failure(format!("the keep-alive stopped: {:?}", held.lost_reason())))?;
    ctx.factory.forget(&lease).await;
    let forgotten_at = Instant::now();
    let bound = lease.ttl() / 3 + ctx.timing.loss_detection_slack;
    timeout(bound, held.lost()).await.map_err(|_| {
        Failure(format!(
            "the lost signal did not fire within {bound:?} of the store forgetting the lease \
             (TTL {:?})",
            lease.ttl()
        ))
    })?;
    ensure!(
        held.lost_reason().is_some(),
        "the lost signal fired without a reason"
    );
    tracing::debug!(after = ?forgotten_at.elapsed(), "lost signal fired");
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await?;
    released(&ctx.store, &next, "next holder").await
}

pub(super) async fn lost_signal_fires_before_store_expiry_when_extends_stall(
    ctx: Ctx,
) -> CaseResult {
    let key = ctx.key("stalled");
    let (lease, requested) = short_lease(&ctx, &key).await?;
    let stalled: Arc<Stalled> = Arc::new(Stalled(ctx.store.clone()));
    let held = ctx.factory.keep_alive(stalled, lease.clone());
    let bound = lease.ttl() + ctx.timing.slack;
    timeout(bound, held.lost()).await.map_err(|_| {
        Failure(format!(
            "no lost signal within {bound:?} while extends hung"
        ))
    })?;
    let lost_at = Instant::now();
    let store_expiry = requested + lease.ttl();
    ensure!(
        lost_at <= lease.valid_until() + Duration::from_millis(100),
        "the lost signal fired {:?} after the local deadline",
        lost_at - lease.valid_until()
    );
    ensure!(
        lease.valid_until() < store_expiry,
        "the local deadline is not before the earliest possible store expiry"
    );
    outlive(&ctx, &lease).await;
    let next = ctx
        .handle()
        .await
        .try_acquire(&key, ctx.timing.long_ttl)
        .await?;
    released(&ctx.store, &next, "next holder").await
}

pub(super) async fn with_lock_cancels_its_body_on_loss(ctx: Ctx) -> CaseResult {
    let key = ctx.key("with-lock-loss");
    let finished = Arc::new(AtomicBool::new(false));
    let request = ctx.store.lock(&key).ttl(ctx.timing.short_ttl);
    let factory = ctx.factory.clone();
    let body_finished = finished.clone();
    let bound = ctx.timing.short_ttl * 2 + ctx.timing.slack;
    let result = timeout(
        bound,
        with_lock(request, |lease| async move {
            factory.forget(&lease).await;
            sleep(Duration::from_secs(3600)).await;
            body_finished.store(true, Ordering::SeqCst);
            Ok::<_, Error>(())
        }),
    )
    .await
    .map_err(|_| {
        Failure(format!(
            "with_lock still ran its body {bound:?} after the loss"
        ))
    })?;
    ensure!(
        !finished.load(Ordering::SeqCst),
        "the body ran to completion"
    );
    match result {
        Err(Error::LeaseLost { .. }) => Ok(()),
        Ok(()) => Err(Failure(
            "with_lock returned Ok after losing the lease".into(),
        )),
        Err(other) => Err(Failure(format!("expected LeaseLost, got {other}"))),
    }
}

pub(super) async fn with_lock_releases_at_the_end(ctx: Ctx) -> CaseResult {
    let key = ctx.key("with-lock");
    let other = ctx.handle().await;
    let inner_key = key.clone();
    let request = ctx.store.lock(&key).ttl(ctx.timing.long_ttl);
    let token = with_lock(request, |lease| async move {
        let busy = other.try_acquire(&inner_key, Duration::from_secs(5)).await;
        Ok::<_, Error>((lease.fencing_token(), busy.is_err(), other))
    })
    .await?;
    let (token, was_busy, other) = token;
    ensure!(was_busy, "the key was not held while the body ran");
    ensure!(token > 0, "the body saw token 0");
    let next = other
        .try_acquire(&key, ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("with_lock did not release: {e}")))?;
    released(&other, &next, "next holder").await
}
