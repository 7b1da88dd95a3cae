//! The label and election cases can fail: each flaw below breaks one guarantee an election
//! rests on, in a wrapper around the memory store, and the case that guards it must fail. The
//! wrapper without a flaw passes every label and election case. Paused clock, as `broken.rs`.
//!
//! Not breakable by a store, so not here: `bad_election_input_is_refused_and_leaves_nothing`
//! (the election checks its name and value itself before any store is asked) and the label
//! checks of `bad_labels_are_refused_and_nothing_is_held`, which a store that skips
//! fencelock-core's checks breaks (`UncheckedLabels` below).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_conformance::{async_trait, run_case, Outcome, StoreFactory, CASES};
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, DynLockStore, Error, Instant, KeyStatus, Lease, LockStore, MemoryStore, OwnerId,
    PerKeyState, ReleaseOutcome, Result,
};
use tokio::time::sleep;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    None,
    /// Status reports no labels, though the store says it keeps them.
    LabelsNotKept,
    /// Relabel answers Ok and changes nothing.
    RelabelIgnored,
    /// Relabel replaces the key's label whoever asks, a stale lease included.
    RelabelIgnoresOwner,
    /// A held key is granted again: two leaders.
    NotExclusive,
    /// Every lease of a key carries the same token.
    TokensRepeat,
    /// A release reaches the store only after 3 s.
    SlowRelease,
    /// The store keeps a lease ten times its TTL: a leader that stops extending is replaced late.
    KeepsPastTtl,
    /// An extend answers Ok without asking the store: an evicted leader never learns.
    ExtendNeverAsks,
    /// A dropped waiter goes on waiting in the background and takes the key.
    DroppedWaiterWaitsOn,
    /// Status answers what it read first, for 5 s.
    StaleStatus,
    /// `next_status` answers only at its deadline.
    NextStatusNeverWakes,
}

/// Which case catches which flaw.
const CAUGHT: &[(Flaw, &str)] = &[
    (Flaw::LabelsNotKept, "status_reports_each_holders_label"),
    (Flaw::LabelsNotKept, "leader_reports_the_value"),
    (Flaw::RelabelIgnored, "a_proclaimed_value_reaches_observers"),
    (
        Flaw::RelabelIgnoresOwner,
        "relabel_replaces_the_label_and_is_owner_only",
    ),
    (Flaw::NotExclusive, "one_leader_at_a_time_among_candidates"),
    (Flaw::TokensRepeat, "terms_grow_across_leaders"),
    (
        Flaw::TokensRepeat,
        "an_evicted_leader_is_replaced_and_its_term_is_fenced",
    ),
    (Flaw::SlowRelease, "resign_hands_over_within_the_wake_bound"),
    (Flaw::SlowRelease, "a_dropped_leadership_resigns"),
    (
        Flaw::KeepsPastTtl,
        "a_cut_off_leader_is_replaced_within_its_ttl",
    ),
    (
        Flaw::ExtendNeverAsks,
        "an_evicted_leader_is_replaced_and_its_term_is_fenced",
    ),
    (
        Flaw::DroppedWaiterWaitsOn,
        "a_dropped_campaign_leaves_no_candidate",
    ),
    (
        Flaw::StaleStatus,
        "leader_of_an_election_nobody_leads_is_none",
    ),
    (
        Flaw::NextStatusNeverWakes,
        "observers_see_every_leader_in_term_order",
    ),
];

/// The groups whose every case a flaw here must catch.
const GROUPS: &[&str] = &["labels", "election"];

/// Cases of those groups no store can break (see the module docs), or broken by
/// `UncheckedLabels` only.
const UNBREAKABLE: &[&str] = &[
    "bad_election_input_is_refused_and_leaves_nothing",
    "bad_labels_are_refused_and_nothing_is_held",
];

/// What every handle of one flawed store shares.
#[derive(Debug, Default)]
struct Shared {
    /// `RelabelIgnoresOwner`: the label of each key, whoever set it.
    labels: Mutex<HashMap<String, String>>,
    /// `StaleStatus`: the first status read of each key, and when.
    statuses: Mutex<HashMap<String, (Instant, KeyStatus)>>,
    /// `NotExclusive`: tokens for the leases granted on a held key.
    extra_tokens: AtomicU64,
}

#[derive(Debug)]
struct Flawed {
    memory: MemoryStore,
    flaw: Flaw,
    shared: Arc<Shared>,
}

impl Flawed {
    fn inner(&self) -> &dyn LockStore {
        &self.memory
    }

    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl raw::Wrapper for Flawed {
    fn inner(&self) -> &dyn LockStore {
        &self.memory
    }

    fn name(&self) -> &'static str {
        "election-flawed"
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        match self.flaw {
            Flaw::DroppedWaiterWaitsOn if request.wait.is_some() => {
                // The wait runs in a task of its own, which a dropped future does not stop.
                let memory = self.memory.clone();
                let (key, ttl, wait) = (request.key.to_owned(), request.ttl, request.wait);
                let label = request.label.map(str::to_owned);
                let task = tokio::spawn(async move {
                    let mut asked = AcquireRequest::new(&key, ttl);
                    asked.wait = wait;
                    asked.label = label.as_deref();
                    memory.acquire_request(asked).await
                });
                task.await
                    .map_err(|e| Error::unavailable("the waiting task failed", e))?
            }
            // One attempt, waiting or not, and a lease all the same when the key is held.
            Flaw::NotExclusive => match self.inner().acquire_request(once(request)).await {
                Err(Error::Busy { .. }) => {
                    let token =
                        u64::MAX / 2 + self.shared.extra_tokens.fetch_add(1, Ordering::SeqCst);
                    Ok(Lease::new(
                        request.key,
                        OwnerId::random(),
                        token,
                        request.ttl,
                        Instant::now(),
                    ))
                }
                other => other,
            },
            Flaw::TokensRepeat => {
                let lease = self.inner().acquire_request(*request).await?;
                let sent_at = lease.valid_until() + raw::drift(lease.ttl()) - lease.ttl();
                let (key, owner, ttl) = (lease.key().to_owned(), lease.owner(), lease.ttl());
                Ok(Lease::with_store_state(&key, owner, 7, ttl, sent_at, lease))
            }
            Flaw::KeepsPastTtl => {
                let mut longer = *request;
                longer.ttl = request.ttl * 10;
                let lease = self.inner().acquire_request(longer).await?;
                let sent_at = lease.valid_until() + raw::drift(lease.ttl()) - lease.ttl();
                let (key, owner, token) =
                    (lease.key().to_owned(), lease.owner(), lease.fencing_token());
                Ok(Lease::with_store_state(
                    &key,
                    owner,
                    token,
                    request.ttl,
                    sent_at,
                    lease,
                ))
            }
            Flaw::RelabelIgnoresOwner => {
                let lease = self.inner().acquire_request(*request).await?;
                let mut labels = Self::lock(&self.shared.labels);
                match request.label {
                    Some(label) => labels.insert(request.key.to_owned(), label.to_owned()),
                    None => labels.remove(request.key),
                };
                Ok(lease)
            }
            _ => self.inner().acquire_request(*request).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        if self.flaw == Flaw::SlowRelease {
            sleep(Duration::from_secs(3)).await;
        }
        self.inner().release(own(lease)).await
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        if self.flaw == Flaw::ExtendNeverAsks {
            lease.confirm(Instant::now());
            return Ok(());
        }
        let inner = own(lease);
        let sent_at = Instant::now();
        self.inner().extend(inner).await?;
        lease.confirm(sent_at);
        Ok(())
    }

    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        match self.flaw {
            Flaw::RelabelIgnored => Ok(()),
            Flaw::RelabelIgnoresOwner => {
                Self::lock(&self.shared.labels).insert(lease.key().to_owned(), label.to_owned());
                Ok(())
            }
            _ => self.inner().relabel(own(lease), label).await,
        }
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        if self.flaw == Flaw::StaleStatus {
            let cached = Self::lock(&self.shared.statuses)
                .get(key)
                .filter(|(at, _)| at.elapsed() < Duration::from_secs(5))
                .map(|(_, status)| status.clone());
            if let Some(status) = cached {
                return Ok(status);
            }
            let status = self.inner().status(key).await?;
            Self::lock(&self.shared.statuses)
                .insert(key.to_owned(), (Instant::now(), status.clone()));
            return Ok(status);
        }
        let status = self.inner().status(key).await?;
        Ok(match (self.flaw, status) {
            (
                Flaw::LabelsNotKept,
                KeyStatus::Held {
                    owner,
                    token,
                    remaining,
                    ..
                },
            ) => KeyStatus::Held {
                owner,
                token,
                remaining,
                label: None,
            },
            (
                Flaw::LabelsNotKept,
                KeyStatus::Shared {
                    mode,
                    count,
                    mut holders,
                },
            ) => {
                for holder in &mut holders {
                    holder.label = None;
                }
                KeyStatus::Shared {
                    mode,
                    count,
                    holders,
                }
            }
            (
                Flaw::RelabelIgnoresOwner,
                KeyStatus::Held {
                    owner,
                    token,
                    remaining,
                    ..
                },
            ) => {
                let label = Self::lock(&self.shared.labels).get(key).cloned();
                KeyStatus::Held {
                    owner,
                    token,
                    remaining,
                    label,
                }
            }
            (_, status) => status,
        })
    }

    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        if self.flaw == Flaw::NextStatusNeverWakes {
            tokio::time::sleep_until(until).await;
            return raw::Store::status(self, key).await;
        }
        // Polled through this wrapper's own status, so its flaws show there too.
        loop {
            let status = raw::Store::status(self, key).await?;
            if !status.same_holders(seen) || Instant::now() >= until {
                return Ok(status);
            }
            sleep(Duration::from_millis(10)).await;
        }
    }

    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Ok(None)
    }
}

/// `request` as one attempt.
fn once<'a>(request: &AcquireRequest<'a>) -> AcquireRequest<'a> {
    let mut once = *request;
    once.wait = None;
    once
}

/// The memory store's lease inside one a flaw rebuilt, or the lease itself.
fn own(lease: &Lease) -> &Lease {
    lease.store_state::<Lease>().unwrap_or(lease)
}

struct Factory {
    memory: MemoryStore,
    flaw: Flaw,
    shared: Arc<Shared>,
}

#[async_trait]
impl StoreFactory for Factory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(Flawed {
            memory: self.memory.clone(),
            flaw: self.flaw,
            shared: self.shared.clone(),
        })
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let memory = MemoryStore::new();
        memory.set_reachable(false);
        Arc::new(memory)
    }
}

fn factory(flaw: Flaw) -> Arc<Factory> {
    Arc::new(Factory {
        memory: MemoryStore::new(),
        flaw,
        shared: Arc::default(),
    })
}

/// The cases of the label and election groups, by the case list's order.
fn guarded_cases() -> Vec<&'static str> {
    let first = CASES
        .iter()
        .position(|case| case.name == "status_reports_each_holders_label")
        .expect("the labels group");
    CASES[first..].iter().map(|case| case.name).collect()
}

#[tokio::test(start_paused = true)]
async fn the_flawless_wrapper_passes_every_label_and_election_case() {
    for case in guarded_cases() {
        match run_case(case, factory(Flaw::None)).await {
            Outcome::Passed => {}
            other => panic!("{case}: {other:?}"),
        }
    }
}

#[test]
fn every_label_and_election_case_catches_a_flaw() {
    let _ = GROUPS;
    for case in guarded_cases() {
        assert!(
            UNBREAKABLE.contains(&case) || CAUGHT.iter().any(|(_, caught)| *caught == case),
            "{case} catches no flaw here"
        );
    }
}

macro_rules! caught {
    ($($test:ident: $flaw:ident),* $(,)?) => {$(
        #[tokio::test(start_paused = true)]
        async fn $test() {
            let cases: Vec<&str> = CAUGHT
                .iter()
                .filter(|(flaw, _)| *flaw == Flaw::$flaw)
                .map(|(_, case)| *case)
                .collect();
            assert!(!cases.is_empty());
            for case in cases {
                match run_case(case, factory(Flaw::$flaw)).await {
                    Outcome::Failed(failure) => {
                        println!("{} caught by {case}: {failure}", stringify!($flaw))
                    }
                    other => panic!("{} not caught: {case} ended {other:?}", stringify!($flaw)),
                }
            }
        }
    )*};
}

caught! {
    labels_that_are_not_kept_are_caught: LabelsNotKept,
    a_relabel_that_changes_nothing_is_caught: RelabelIgnored,
    a_relabel_by_anyone_is_caught: RelabelIgnoresOwner,
    two_leaders_at_once_are_caught: NotExclusive,
    terms_that_repeat_are_caught: TokensRepeat,
    a_resign_that_reaches_the_store_late_is_caught: SlowRelease,
    a_leader_kept_past_its_ttl_is_caught: KeepsPastTtl,
    an_evicted_leader_that_never_learns_is_caught: ExtendNeverAsks,
    a_dropped_campaign_that_waits_on_is_caught: DroppedWaiterWaitsOn,
    a_stale_status_is_caught: StaleStatus,
    an_observer_that_is_never_woken_is_caught: NextStatusNeverWakes,
}

/// A store that is a `LockStore` by hand over the memory store, bypassing fencelock-core's
/// checks: labels of any length and content reach the store.
#[derive(Debug, Clone, Default)]
struct UncheckedLabels(MemoryStore);

#[async_trait]
impl LockStore for UncheckedLabels {
    fn capabilities(&self) -> Capabilities {
        raw::Store::capabilities(&self.0)
    }
    async fn acquire_request(&self, request: AcquireRequest<'_>) -> Result<Lease> {
        raw::Store::acquire(&self.0, &request).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        raw::Store::release(&self.0, lease).await
    }
    async fn extend(&self, lease: &Lease) -> Result<()> {
        raw::Store::extend(&self.0, lease).await
    }
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        raw::Store::relabel(&self.0, lease, label).await
    }
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        raw::Store::status(&self.0, key).await
    }
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        raw::Store::next_status(&self.0, key, seen, until).await
    }
    async fn evict(&self, key: &str) -> Result<bool> {
        raw::Store::evict(&self.0, key).await
    }
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Ok(None)
    }
    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }
    fn lease_env(&self, _: &Lease) -> Vec<(String, String)> {
        Vec::new()
    }
}

struct UncheckedFactory(UncheckedLabels);

#[async_trait]
impl StoreFactory for UncheckedFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(self.0.clone())
    }
    async fn unreachable_handle(&self) -> DynLockStore {
        let memory = MemoryStore::new();
        memory.set_reachable(false);
        Arc::new(memory)
    }
}

#[tokio::test(start_paused = true)]
async fn labels_a_store_does_not_check_are_caught() {
    let factory = Arc::new(UncheckedFactory(UncheckedLabels::default()));
    match run_case("bad_labels_are_refused_and_nothing_is_held", factory).await {
        Outcome::Failed(failure) => println!("unchecked labels caught: {failure}"),
        other => panic!("unchecked labels not caught: {other:?}"),
    }
}
