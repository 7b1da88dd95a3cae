//! Leader election: one leader at a time, growing terms, handover on resign and on loss, no
//! candidate left behind, observers that see every leader in order, and the term as a fence.

use std::future::pending;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::limits::{MAX_KEY_LEN, MAX_LABEL_LEN};
use fencelock_core::raw;
use fencelock_core::{
    DynLockStore, Election, Error, FenceGate, Leader, Leadership, Lease, LockStore, LockStoreExt,
    ReleaseOutcome,
};
use tokio::time::{sleep, timeout, Instant};

use crate::runner::{CaseResult, Failure};
use crate::Ctx;

/// The election `name` of this case on `store`, with the suite's keep-alive TTL.
fn election(ctx: &Ctx, store: &DynLockStore, name: &str) -> Election {
    store.election(&ctx.key(name)).ttl(ctx.timing.hold_ttl)
}

/// Campaigns, failing the case if it takes longer than `bound`.
async fn lead(election: &Election, value: &str, bound: Duration) -> Result<Leadership, Failure> {
    timeout(bound, election.campaign(value))
        .await
        .map_err(|_| {
            Failure(format!(
                "a campaign with nobody leading took over {bound:?}"
            ))
        })?
        .map_err(|e| Failure(format!("a campaign failed: {e}")))
}

/// How soon after a change an observer must see it: a notified store's wake bound, a polled
/// one's poll interval on top.
fn observe_bound(ctx: &Ctx) -> Duration {
    if ctx.capabilities.notified_status {
        ctx.timing.notified_wake_median
    } else {
        ctx.capabilities.status_poll + ctx.timing.notified_wake_median
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn resigned(leadership: Leadership, what: &str) -> CaseResult {
    let outcome = leadership.resign().await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "{what}: resign reported {outcome:?}"
    );
    Ok(())
}

/// Marks a candidate's work as leading while it lives.
struct Leading(Arc<AtomicBool>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

pub(super) async fn one_leader_at_a_time_among_candidates(ctx: Ctx) -> CaseResult {
    const CANDIDATES: usize = 3;
    const TERMS: usize = 9;
    let gate = Arc::new(FenceGate::new());
    let leading = Arc::new(AtomicBool::new(false));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let overlap = Arc::new(AtomicBool::new(false));
    let mut servers = Vec::new();
    for i in 0..CANDIDATES {
        let store = ctx.handle().await;
        let election = election(&ctx, &store, "one-leader");
        let (gate, leading, terms, overlap) = (
            gate.clone(),
            leading.clone(),
            terms.clone(),
            overlap.clone(),
        );
        servers.push(tokio::spawn(async move {
            let value = format!("candidate {i}");
            election
                .serve(&value, |term| {
                    let (gate, leading, terms, overlap) = (
                        gate.clone(),
                        leading.clone(),
                        terms.clone(),
                        overlap.clone(),
                    );
                    async move {
                        if leading.swap(true, Ordering::SeqCst) {
                            overlap.store(true, Ordering::SeqCst);
                        }
                        // Cleared however the work ends: a work dropped half-way (its
                        // leadership lost, or its task aborted at the case's end) has stopped
                        // leading too.
                        let _leading = Leading(leading.clone());
                        let token = term.fencing_token();
                        let fenced = gate.claim(token).is_ok();
                        sleep(Duration::from_millis(20)).await;
                        let written = gate.write(token, || ()).is_ok();
                        terms
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((token, fenced && written));
                    }
                })
                .await
        }));
    }
    let started = Instant::now();
    let enough = loop {
        let count = terms.lock().unwrap_or_else(PoisonError::into_inner).len();
        if count >= TERMS || started.elapsed() > ctx.timing.case_limit / 2 {
            break count >= TERMS;
        }
        sleep(Duration::from_millis(20)).await;
    };
    for server in &servers {
        server.abort();
    }
    for server in servers {
        if let Ok(Err(error)) = server.await {
            return Err(Failure(format!("a candidate's serve loop ended: {error}")));
        }
    }
    let terms = terms.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ensure!(
        enough,
        "{CANDIDATES} candidates served only {} terms in {:?}",
        terms.len(),
        ctx.timing.case_limit / 2
    );
    ensure!(
        !overlap.load(Ordering::SeqCst),
        "two candidates led at the same time"
    );
    ensure!(
        terms.iter().all(|(_, fenced)| *fenced),
        "a leader's write was refused by the gate: its term was not above the one before ({terms:?})"
    );
    ensure!(
        terms.windows(2).all(|w| w[0].0 < w[1].0),
        "terms did not grow from one leader to the next: {terms:?}"
    );
    Ok(())
}

pub(super) async fn terms_grow_across_leaders(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.store.clone(), ctx.handle().await);
    let bound = ctx.timing.case_limit / 4;
    let first = lead(&election(&ctx, &a, "terms"), "a", bound).await?;
    let t1 = first.term();
    resigned(first, "first leader").await?;
    let second = lead(&election(&ctx, &b, "terms"), "b", bound).await?;
    let t2 = second.term();
    drop(second); // resigns in the background
                  // A leader that stops extending without resigning: its term ends at its TTL.
    let cut: DynLockStore = Arc::new(CutOff(ctx.handle().await));
    let short = cut.election(&ctx.key("terms")).ttl(ctx.timing.short_ttl);
    let third = lead(&short, "a", bound).await?;
    let t3 = third.term();
    sleep(third.lease().ttl() + ctx.timing.slack).await;
    let fourth = lead(&election(&ctx, &b, "terms"), "b", bound).await?;
    let t4 = fourth.term();
    resigned(fourth, "fourth leader").await?;
    drop(third);
    ensure!(
        t1 < t2 && t2 < t3 && t3 < t4,
        "terms of four leaders in turn are {t1}, {t2}, {t3}, {t4}: not strictly growing"
    );
    Ok(())
}

pub(super) async fn resign_hands_over_within_the_wake_bound(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.store.clone(), ctx.handle().await);
    let bound = ctx.timing.case_limit / 4;
    let mut handovers = Vec::new();
    for round in 0..5 {
        let leader = lead(&election(&ctx, &a, "resign"), "a", bound).await?;
        let next = tokio::spawn({
            let election = election(&ctx, &b, "resign");
            async move {
                let leadership = election.campaign("b").await;
                (Instant::now(), leadership)
            }
        });
        sleep(Duration::from_millis(100)).await;
        ensure!(
            !next.is_finished(),
            "round {round}: a second candidate led while the first did"
        );
        let sent = Instant::now();
        resigned(leader, "leader").await?;
        let (led_at, next) = timeout(bound, next)
            .await
            .map_err(|_| {
                Failure(format!(
                    "round {round}: no candidate led {bound:?} after a resign"
                ))
            })?
            .map_err(|e| Failure(format!("a candidate panicked: {e}")))?;
        let next = next?;
        let handover = led_at - sent;
        ensure!(
            handover <= ctx.timing.wake_bound,
            "round {round}: the next candidate led {handover:?} after the resign"
        );
        handovers.push(handover);
        resigned(next, "next leader").await?;
    }
    if ctx.capabilities.notified_wait {
        let median = median(handovers.clone());
        ensure!(
            median <= ctx.timing.notified_wake_median,
            "a store with notified waits handed over in a median of {median:?} ({handovers:?})"
        );
    }
    Ok(())
}

/// A store handle whose extends never answer: a leader cut off from the store.
#[derive(Debug)]
struct CutOff(DynLockStore);

#[async_trait]
impl raw::Wrapper for CutOff {
    fn inner(&self) -> &dyn LockStore {
        &*self.0
    }

    async fn extend(&self, _: &Lease) -> fencelock_core::Result<()> {
        pending().await
    }
}

pub(super) async fn a_cut_off_leader_is_replaced_within_its_ttl(ctx: Ctx) -> CaseResult {
    let cut: DynLockStore = Arc::new(CutOff(ctx.handle().await));
    let other = ctx.handle().await;
    let bound = ctx.timing.case_limit / 4;
    let leader = lead(&election(&ctx, &cut, "cut-off"), "cut off", bound).await?;
    let deadline = leader.lease().valid_until();
    let granted_by = Instant::now();
    let next = tokio::spawn({
        let election = election(&ctx, &other, "cut-off");
        async move {
            let leadership = election.campaign("next").await;
            (Instant::now(), leadership)
        }
    });
    timeout(leader.lease().ttl() + ctx.timing.slack, leader.lost())
        .await
        .map_err(|_| Failure("a leader whose extends hang never learned it lost".into()))?;
    let lost_at = Instant::now();
    ensure!(
        lost_at <= deadline + ctx.timing.loss_detection_slack,
        "the cut-off leader learned of its loss {:?} after its local deadline",
        lost_at - deadline
    );
    let limit = leader.lease().ttl() + ctx.timing.wake_bound + ctx.timing.slack;
    let (led_at, next) = timeout(limit, next)
        .await
        .map_err(|_| {
            Failure(format!(
                "no candidate led within {limit:?} of a cut-off leader's grant (TTL {:?})",
                leader.lease().ttl()
            ))
        })?
        .map_err(|e| Failure(format!("a candidate panicked: {e}")))?;
    let next = next?;
    ensure!(
        led_at >= deadline,
        "the next candidate led {:?} before the cut-off leader's local deadline",
        deadline - led_at
    );
    ensure!(
        led_at - granted_by <= limit,
        "the next candidate led {:?} after the cut-off leader's grant",
        led_at - granted_by
    );
    ensure!(
        next.term() > leader.term(),
        "the new term is not above the old"
    );
    drop(leader);
    resigned(next, "next leader").await
}

pub(super) async fn an_evicted_leader_is_replaced_and_its_term_is_fenced(ctx: Ctx) -> CaseResult {
    let other = ctx.handle().await;
    let bound = ctx.timing.case_limit / 4;
    let leader = lead(&election(&ctx, &ctx.store, "evicted"), "old", bound).await?;
    let next = tokio::spawn({
        let election = election(&ctx, &other, "evicted");
        async move { election.campaign("new").await }
    });
    sleep(Duration::from_millis(100)).await;
    ctx.factory.forget(leader.lease()).await;
    let forgot = Instant::now();
    let limit = ctx.timing.wake_bound + ctx.timing.slack;
    let next = timeout(limit, next)
        .await
        .map_err(|_| Failure(format!("no candidate led within {limit:?} of an eviction")))?
        .map_err(|e| Failure(format!("a candidate panicked: {e}")))??;
    let gate = FenceGate::new();
    gate.update(next.term(), || ())
        .map_err(|e| Failure(format!("the gate refused the new leader: {e}")))?;
    ensure!(
        gate.update(leader.term(), || ()).is_err(),
        "a gate that saw term {} accepted the evicted leader's term {}",
        next.term(),
        leader.term()
    );
    let detect = leader.lease().ttl() / 3 + ctx.timing.loss_detection_slack;
    let left = detect.saturating_sub(forgot.elapsed());
    timeout(left, leader.lost()).await.map_err(|_| {
        Failure(format!(
            "the evicted leader did not learn it lost within {detect:?}"
        ))
    })?;
    ensure!(
        matches!(leader.resign().await?, ReleaseOutcome::Lost),
        "the evicted leader's resign released something"
    );
    resigned(next, "new leader").await
}

pub(super) async fn a_dropped_campaign_leaves_no_candidate(ctx: Ctx) -> CaseResult {
    let other = ctx.handle().await;
    let bound = ctx.timing.case_limit / 4;
    let name = ctx.key("dropped-campaign");
    let leader = lead(
        &election(&ctx, &ctx.store, "dropped-campaign"),
        "leader",
        bound,
    )
    .await?;
    let campaign = tokio::spawn({
        let election = election(&ctx, &other, "dropped-campaign");
        async move { election.campaign("dropped").await.map(|l| l.term()) }
    });
    sleep(Duration::from_millis(200)).await;
    campaign.abort();
    ensure!(campaign.await.is_err(), "a candidate led while another did");
    resigned(leader, "leader").await?;
    // Nothing the dropped candidate left may take the election, now or within a wake bound.
    let third = ctx.handle().await;
    let started = Instant::now();
    while started.elapsed() < ctx.timing.wake_bound {
        match third.try_acquire(&name, ctx.timing.long_ttl).await {
            Ok(lease) => {
                let _ = third.release(&lease).await;
            }
            Err(Error::Busy { .. }) => {
                let leader = third.election(&name).leader().await?;
                return Err(Failure(format!(
                    "a dropped campaign left a candidate that took the election: {leader:?}"
                )));
            }
            Err(other) => return Err(other.into()),
        }
        sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub(super) async fn a_dropped_leadership_resigns(ctx: Ctx) -> CaseResult {
    let other = ctx.handle().await;
    let long = ctx
        .store
        .election(&ctx.key("dropped"))
        .ttl(ctx.timing.long_ttl);
    let leader = lead(&long, "dropped", ctx.timing.case_limit / 4).await?;
    let term = leader.term();
    drop(leader);
    let started = Instant::now();
    let next = election(&ctx, &other, "dropped")
        .campaign_for("next", ctx.timing.wake_bound)
        .await
        .map_err(|e| {
            Failure(format!(
                "a dropped leadership (TTL {:?}) was not resigned within {:?}: {e}",
                ctx.timing.long_ttl, ctx.timing.wake_bound
            ))
        })?;
    ensure!(
        next.term() > term,
        "the next term is not above the dropped one"
    );
    ensure!(
        started.elapsed() <= ctx.timing.wake_bound + ctx.timing.slack,
        "slow handover"
    );
    resigned(next, "next leader").await
}

/// Whether the store tells who holds a key: an election's leader and observers read it.
async fn has_status(ctx: &Ctx) -> Result<bool, Failure> {
    match ctx.store.status(&ctx.key("has-status")).await {
        Err(Error::Unsupported { .. }) => Ok(false),
        other => other.map(|_| true).map_err(Failure::from),
    }
}

pub(super) async fn leader_of_an_election_nobody_leads_is_none(ctx: Ctx) -> CaseResult {
    if !has_status(&ctx).await? {
        return Ok(());
    }
    let election = election(&ctx, &ctx.store, "nobody");
    let before = election.leader().await?;
    ensure!(
        before.is_none(),
        "a fresh election reports the leader {before:?}"
    );
    let leader = lead(&election, "someone", ctx.timing.case_limit / 4).await?;
    let during = election.leader().await?;
    ensure!(
        during.as_ref().is_some_and(|l| l.term == leader.term()),
        "while led in term {}, the election reports {during:?}",
        leader.term()
    );
    if let Some(Leader {
        remaining: Some(remaining),
        ..
    }) = &during
    {
        ensure!(
            *remaining <= leader.lease().ttl(),
            "the leader has {remaining:?} left of a {:?} lease",
            leader.lease().ttl()
        );
    }
    resigned(leader, "leader").await?;
    let after = election.leader().await?;
    ensure!(
        after.is_none(),
        "after the resign the election reports {after:?}"
    );
    Ok(())
}

pub(super) async fn leader_reports_the_value(ctx: Ctx) -> CaseResult {
    let election = election(&ctx, &ctx.handle().await, "value");
    let leader = lead(&election, "10.0.0.7:8080", ctx.timing.case_limit / 4).await?;
    ensure!(
        &*leader.value() == "10.0.0.7:8080",
        "the leadership's value is {:?}",
        leader.value()
    );
    let seen = ctx.store.election(election.name()).leader().await?;
    ensure!(
        seen.as_ref().and_then(|l| l.value.as_deref()) == Some("10.0.0.7:8080"),
        "another handle sees the leader {seen:?}"
    );
    resigned(leader, "leader").await
}

pub(super) async fn bad_election_input_is_refused_and_leaves_nothing(ctx: Ctx) -> CaseResult {
    let long_name = "n".repeat(MAX_KEY_LEN + 1);
    let long_value = "v".repeat(MAX_LABEL_LEN + 1);
    let name = ctx.key("bad-input");
    let cases: [(Election, &str, &str, &str); 5] = [
        (
            ctx.store.election(""),
            "v",
            "election name",
            "an empty name",
        ),
        (
            ctx.store.election(&long_name),
            "v",
            "election name",
            "an over-long name",
        ),
        (
            election(&ctx, &ctx.store, "bad-input"),
            "",
            "value",
            "an empty value",
        ),
        (
            election(&ctx, &ctx.store, "bad-input"),
            &long_value,
            "value",
            "an over-long value",
        ),
        (
            ctx.store.election(&name).ttl(Duration::ZERO),
            "v",
            "ttl",
            "a zero TTL",
        ),
    ];
    for (election, value, field, what) in cases {
        match timeout(ctx.timing.wake_bound, election.campaign(value)).await {
            Ok(Err(Error::InvalidInput { what: named, .. })) if named == field => {}
            Ok(Err(other)) => {
                return Err(Failure(format!(
                    "{what}: expected InvalidInput for {field}, got {other}"
                )))
            }
            Ok(Ok(_)) => return Err(Failure(format!("{what}: the campaign led"))),
            Err(_) => {
                return Err(Failure(format!(
                    "{what}: the campaign waited instead of refusing"
                )))
            }
        }
    }
    let lease = ctx
        .store
        .try_acquire(&name, ctx.timing.long_ttl)
        .await
        .map_err(|e| {
            Failure(format!(
                "after refused campaigns the election's key is not free: {e}"
            ))
        })?;
    let _ = ctx.store.release(&lease).await?;
    Ok(())
}

/// What an observer yielded, with when.
type Seen = Arc<Mutex<Vec<(Instant, Option<Leader>)>>>;

/// Collects what an observer yields, with when, until aborted.
fn watch(election: &Election) -> (tokio::task::JoinHandle<()>, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut observer = election.observe();
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            while let Ok(leader) = observer.next().await {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((Instant::now(), leader));
            }
        }
    });
    (task, seen)
}

/// Waits until `seen` has an item matching `wanted`, and gives its time.
async fn seen_at(
    seen: &Mutex<Vec<(Instant, Option<Leader>)>>,
    limit: Duration,
    wanted: impl Fn(&Option<Leader>) -> bool,
) -> Option<Instant> {
    let started = Instant::now();
    loop {
        let found = seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(_, leader)| wanted(leader))
            .map(|(at, _)| *at);
        if found.is_some() || started.elapsed() > limit {
            return found;
        }
        sleep(Duration::from_millis(5)).await;
    }
}

pub(super) async fn observers_see_every_leader_in_term_order(ctx: Ctx) -> CaseResult {
    if !has_status(&ctx).await? {
        return Ok(());
    }
    let observed = election(&ctx, &ctx.handle().await, "observed");
    let (task, seen) = watch(&observed);
    let bound = observe_bound(&ctx);
    let first = seen_at(&seen, ctx.timing.wake_bound, |l| l.is_none()).await;
    ensure!(
        first.is_some(),
        "an observer of an election nobody leads yielded nothing"
    );
    let mut delays = Vec::new();
    let mut terms = Vec::new();
    let handles = [ctx.store.clone(), ctx.handle().await];
    for round in 0..4 {
        let store = &handles[round % 2];
        let leader = lead(
            &election(&ctx, store, "observed"),
            &format!("leader {round}"),
            ctx.timing.case_limit / 4,
        )
        .await?;
        let led = Instant::now();
        let term = leader.term();
        terms.push(term);
        let at = seen_at(&seen, ctx.timing.wake_bound + bound, |l| {
            l.as_ref().is_some_and(|l| l.term == term)
        })
        .await
        .ok_or_else(|| Failure(format!("the observer never saw the leader of term {term}")))?;
        delays.push(at.saturating_duration_since(led));
        // Each leads for several bounds, so a coalescing observer must still see it.
        sleep(bound * 3).await;
        resigned(leader, "observed leader").await?;
    }
    sleep(bound * 2).await;
    task.abort();
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    // A term of 0 is one the store cannot tell yet (MySQL between a grant and its fence
    // bump): the observer's contract orders it by nothing.
    let yielded: Vec<u64> = seen
        .iter()
        .filter_map(|(_, l)| l.as_ref().map(|l| l.term))
        .filter(|&term| term != 0)
        .collect();
    ensure!(
        yielded.windows(2).all(|w| w[0] <= w[1]),
        "the observer yielded terms out of order: {yielded:?}"
    );
    for term in &terms {
        ensure!(
            yielded.contains(term),
            "the observer missed term {term} ({yielded:?})"
        );
    }
    ensure!(
        seen.last().is_some_and(|(_, l)| l.is_none()),
        "after the last resign the observer's last item is {:?}, not \"no leader\"",
        seen.last()
    );
    let median = median(delays.clone());
    ensure!(
        median <= bound,
        "observers saw a new leader in a median of {median:?} after it led ({delays:?}); the bound is {bound:?}"
    );
    Ok(())
}

pub(super) async fn a_proclaimed_value_reaches_observers(ctx: Ctx) -> CaseResult {
    let leading = election(&ctx, &ctx.store, "proclaim");
    let leader = lead(&leading, "v1", ctx.timing.case_limit / 4).await?;
    let (task, seen) = watch(&election(&ctx, &ctx.handle().await, "proclaim"));
    let term = leader.term();
    let limit = ctx.timing.wake_bound + observe_bound(&ctx);
    seen_at(&seen, limit, |l| {
        l.as_ref()
            .is_some_and(|l| l.term == term && l.value.as_deref() == Some("v1"))
    })
    .await
    .ok_or_else(|| Failure("the observer never saw the first value".into()))?;
    leader.proclaim("v2").await?;
    ensure!(
        &*leader.value() == "v2",
        "after proclaim the value is {:?}",
        leader.value()
    );
    seen_at(&seen, limit, |l| {
        l.as_ref()
            .is_some_and(|l| l.term == term && l.value.as_deref() == Some("v2"))
    })
    .await
    .ok_or_else(|| {
        Failure(format!(
            "the observer never saw the proclaimed value within {limit:?}"
        ))
    })?;
    let now = leading.leader().await?;
    ensure!(
        now.as_ref()
            .is_some_and(|l| l.term == term && l.value.as_deref() == Some("v2")),
        "after proclaim the election reports {now:?}"
    );
    task.abort();
    let lease = leader.lease().clone();
    resigned(leader, "leader").await?;
    let stale = ctx.store.relabel(&lease, "v3").await;
    ensure!(
        matches!(stale, Err(Error::LeaseLost { .. })),
        "a proclaim after resigning gave {stale:?}"
    );
    Ok(())
}
