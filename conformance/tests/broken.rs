//! The suite proves it can fail: each deliberately broken store below breaks one guarantee, and
//! the case that guards that guarantee must fail against it. The same store without a flaw
//! passes the whole suite, so each failure is the flaw's doing. The keep-alive cases are also
//! run with broken keep-alives (fencelock-core's, fed through a wrapper that changes what it sees).
//!
//! The broken stores keep time on tokio's clock, as the memory store they copy or wrap does, so
//! each test runs on a paused clock and its TTLs pass in no real time; each flaw fails the same
//! case on it as in real time.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_conformance::{async_trait, run_all, run_case, Outcome, StoreFactory};
use fencelock_core::limits::MAX_PERMITS;
use fencelock_core::raw::{self, drift, AcquireRequest, LeaseExt};
use fencelock_core::{
    Capabilities, DynLockStore, Error, KeepAlive, KeyStatus, Lease, ListCursor, Listing, LockStore,
    MemoryStore, Mode, OwnerId, PerKeyState, ReleaseOutcome, Result,
};
use tokio::time::{sleep, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    None,
    /// Release deletes the key whoever holds it.
    OwnerBlindRelease,
    /// The token restarts at 1 whenever the key is free.
    TokensNotMonotonic,
    /// Extend re-creates an expired or missing lease.
    ExtendResurrects,
    /// Leases never expire.
    TtlIgnored,
    /// Acquire checks, yields, then sets: two contenders can both win.
    RacyCheckThenSet,
    /// Waiters only look again when the holder's lease would expire.
    WaitersNeverWoken,
    /// Extend always says yes, so the lost signal can never fire.
    ExtendAlwaysSucceeds,
    /// Keys and TTLs are not validated: the store is a `LockStore` of its own
    /// ([`Unchecked`]), not a `raw::Store` whose requests fencelock-core checks.
    NoValidation,
    /// Extend renews the key for 60% of the TTL while the lease's deadline moves by all of it.
    ExtendRenewsForLess,
    /// Keys are stored by their first 256 bytes.
    KeysTruncated,
    /// Waiters poll every 500 ms although the store declares notified waits.
    NotifiedWaitPolls,
    /// Declares a retention window of [`RETENTION`] and restarts the token of a key not
    /// acquired for that long, as a store that drops its counter with no floor would.
    TokensRestartAfterRetention,
    /// The waiting path measures the lease's local deadline from the start of the wait, not
    /// from the granting attempt: a lease granted after waiting longer than its TTL comes back
    /// with its deadline already passed. Handed out [`Unchecked`], as fencelock-core refuses
    /// such a lease for every `raw::Store`.
    DeadlineFromWaitStart,
    /// Release says `Released` and leaves the lease in place until its TTL.
    ReleaseKeepsTheKey,
    /// The listing's query ignores the prefix: every key the store holds is listed.
    ListIgnoresPrefix,
    /// A page's cursor points past the page's last name, so the next page skips one.
    ListPagesSkipOne,
    /// The lease's local deadline, granted or extended, is measured from a clock read 50 ms
    /// after the request was sent, as a store that reads its clock after a slow step would: it
    /// runs past the store's.
    DeadlineReadLate,
}

/// The retention window [`Flaw::TokensRestartAfterRetention`] declares.
const RETENTION: Duration = Duration::from_secs(1);

/// How the factory's keep-alive is broken, for the keep-alive cases. The broken keep-alives are
/// fencelock-core's, fed through a wrapper that changes what it sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepAliveFlaw {
    None,
    /// A transient (retryable) extend failure is taken as the loss of the lease.
    TransientFailureIsFatal,
    /// After a transient failure the next attempt comes a whole extend period later: the
    /// failure is held back for a quarter of the TTL (a whole period of a keep-alive that extends
    /// every quarter, less than one that extends every third) before it is reported.
    RetriesAfterAWholePeriod,
    /// Every other extend is skipped (reported done, store not asked, deadline not moved), so
    /// the store hears from the keep-alive twice a period apart: still in time to keep the
    /// lease, too late to learn promptly that it is gone.
    ExtendsTooSeldom,
}

#[derive(Default)]
struct State {
    holders: HashMap<String, (OwnerId, u64, Instant)>,
    tokens: HashMap<String, u64>,
    last_acquired: HashMap<String, Instant>,
}

#[derive(Debug, Clone)]
struct FlawedStore {
    flaw: Flaw,
    reachable: bool,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("State")
    }
}

impl FlawedStore {
    /// The instant a lease's local deadline is measured from, for a request sent at
    /// `sent_at`: that instant, or 50 ms later under [`Flaw::DeadlineReadLate`].
    fn deadline_read_at(&self, sent_at: Instant) -> Instant {
        match self.flaw {
            Flaw::DeadlineReadLate => sent_at + Duration::from_millis(50),
            _ => sent_at,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self) -> Result<()> {
        if self.reachable {
            Ok(())
        } else {
            Err(Error::Unavailable {
                message: "switched off".into(),
                source: None,
            })
        }
    }

    /// The name the store keeps `key` under.
    fn slot<'k>(&self, key: &'k str) -> &'k str {
        match self.flaw {
            Flaw::KeysTruncated => key.get(..256).unwrap_or(key),
            _ => key,
        }
    }

    fn live(&self, key: &str, now: Instant) -> Option<(OwnerId, u64, Instant)> {
        self.state()
            .holders
            .get(self.slot(key))
            .copied()
            .filter(|(_, _, expires)| *expires > now)
    }

    fn expiry(&self, now: Instant, ttl: Duration) -> Instant {
        if self.flaw == Flaw::TtlIgnored {
            now + Duration::from_secs(24 * 3600)
        } else {
            now + ttl
        }
    }

    /// One attempt; on failure returns when the holder's lease expires.
    async fn attempt(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Result<std::result::Result<Lease, Instant>> {
        self.check()?;
        let sent_at = Instant::now();
        if self.flaw == Flaw::RacyCheckThenSet {
            if let Some((_, _, expires)) = self.live(key, sent_at) {
                return Ok(Err(expires));
            }
            sleep(Duration::from_millis(1)).await;
        }
        let slot = self.slot(key);
        let mut state = self.state();
        if self.flaw != Flaw::RacyCheckThenSet {
            if let Some((_, _, expires)) = state.holders.get(slot).copied() {
                if expires > sent_at {
                    return Ok(Err(expires));
                }
            }
        }
        if self.flaw == Flaw::TokensRestartAfterRetention {
            let idle = state.last_acquired.get(slot).map(|at| sent_at - *at);
            if idle.is_some_and(|idle| idle > RETENTION) {
                state.tokens.remove(slot);
            }
            state.last_acquired.insert(slot.to_owned(), sent_at);
        }
        let token = state.tokens.entry(slot.to_owned()).or_insert(0);
        *token += 1;
        let token = *token;
        let owner = OwnerId::random();
        let expires = self.expiry(sent_at, ttl);
        state
            .holders
            .insert(slot.to_owned(), (owner, token, expires));
        Ok(Ok(Lease::new(
            key,
            owner,
            token,
            ttl,
            self.deadline_read_at(sent_at),
        )))
    }

    async fn wait_for(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        let started = Instant::now();
        let deadline = started + wait;
        loop {
            let expires = match self.attempt(key, ttl).await? {
                Ok(lease) if self.flaw == Flaw::DeadlineFromWaitStart => {
                    return Ok(Lease::new(
                        key,
                        lease.owner(),
                        lease.fencing_token(),
                        ttl,
                        started,
                    ))
                }
                Ok(lease) => return Ok(lease),
                Err(expires) => expires,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::WaitTimedOut {
                    key: key.to_owned(),
                    waited: now - started,
                });
            }
            let next = match self.flaw {
                Flaw::WaitersNeverWoken => expires,
                Flaw::NotifiedWaitPolls => now + Duration::from_millis(500),
                _ => now + Duration::from_millis(5),
            };
            tokio::time::sleep_until(next.min(deadline)).await;
        }
    }
}

#[async_trait]
impl raw::Store for FlawedStore {
    fn name(&self) -> &'static str {
        "flawed"
    }

    fn capabilities(&self) -> Capabilities {
        // Waiters poll every 5 ms, as prompt as a notification.
        let capabilities = Capabilities::new()
            .with_notified_wait(true)
            .with_listing(true);
        match self.flaw {
            Flaw::TokensRestartAfterRetention => capabilities
                .with_max_ttl(Duration::from_millis(500))
                .with_retention(RETENTION),
            _ => capabilities,
        }
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let (key, ttl) = (request.key, request.ttl);
        match request.wait {
            None => self.attempt(key, ttl).await?.map_err(|_| Error::Busy {
                key: key.to_owned(),
            }),
            Some(wait) => self.wait_for(key, ttl, wait).await,
        }
    }

    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        self.check()?;
        let mut names: Vec<String> = self
            .state()
            .holders
            .keys()
            .filter(|key| self.flaw == Flaw::ListIgnoresPrefix || key.starts_with(prefix))
            .filter(|key| from.is_none_or(|from| key.as_str() > from.position()))
            .cloned()
            .collect();
        names.sort_unstable();
        // The flawed cursor is the next page's first name, which the next page then skips.
        let skipped = names.get(limit).cloned();
        let more = names.len() > limit;
        names.truncate(limit);
        let next = match (more, names.last()) {
            (true, Some(_)) if self.flaw == Flaw::ListPagesSkipOne => skipped.map(ListCursor::new),
            (true, Some(last)) => Some(ListCursor::new(last.as_str())),
            _ => None,
        };
        raw::held_among(self, names, next).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.check()?;
        let now = Instant::now();
        let slot = self.slot(lease.key());
        let mut state = self.state();
        let ours = state
            .holders
            .get(slot)
            .is_some_and(|(owner, _, expires)| *owner == lease.owner() && *expires > now);
        if ours && self.flaw == Flaw::ReleaseKeepsTheKey {
            return Ok(ReleaseOutcome::Released);
        }
        if ours || self.flaw == Flaw::OwnerBlindRelease {
            state.holders.remove(slot);
            if self.flaw == Flaw::TokensNotMonotonic {
                state.tokens.remove(slot);
            }
        }
        Ok(if ours {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        })
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.check()?;
        let sent_at = Instant::now();
        if self.flaw == Flaw::ExtendAlwaysSucceeds {
            lease.confirm(sent_at);
            return Ok(());
        }
        let renewal = match self.flaw {
            Flaw::ExtendRenewsForLess => lease.ttl() * 3 / 5,
            _ => lease.ttl(),
        };
        let expires = self.expiry(sent_at, renewal);
        let slot = self.slot(lease.key());
        let mut state = self.state();
        let ours = state
            .holders
            .get(slot)
            .is_some_and(|(owner, _, at)| *owner == lease.owner() && *at > sent_at);
        if ours || self.flaw == Flaw::ExtendResurrects {
            state.holders.insert(
                slot.to_owned(),
                (lease.owner(), lease.fencing_token(), expires),
            );
            lease.confirm(self.deadline_read_at(sent_at));
            Ok(())
        } else {
            Err(Error::lost(lease, "not held"))
        }
    }
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        self.check()?;
        Ok(match self.live(key, Instant::now()) {
            Some((owner, token, expires)) => KeyStatus::Held {
                owner: Some(owner),
                token: Some(token),
                remaining: Some(expires - Instant::now()),
                label: None,
            },
            None => KeyStatus::Free,
        })
    }
}

/// A store that is a `LockStore` of its own, as one written by hand against the contract
/// would be: its requests skip fencelock-core's checks, so a flaw in what those checks
/// guarantee (input validation, validity left on every lease, declared modes) can be shown
/// caught by the suite.
#[derive(Debug, Clone)]
struct Unchecked<S>(S);

#[async_trait]
impl<S: raw::Store> LockStore for Unchecked<S> {
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
    async fn status(&self, key: &str) -> Result<KeyStatus> {
        raw::Store::status(&self.0, key).await
    }
    async fn evict(&self, key: &str) -> Result<bool> {
        raw::Store::evict(&self.0, key).await
    }
    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        raw::Store::relabel(&self.0, lease, label).await
    }
    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        raw::Store::next_status(&self.0, key, seen, until).await
    }
    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        raw::Store::per_key_state(&self.0).await
    }
    fn diagnostics(&self) -> Vec<String> {
        raw::Store::diagnostics(&self.0)
    }
    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        raw::Store::lease_env(&self.0, lease)
    }
}

/// The store as the suite gets it: [`Unchecked`] for the flaws of what fencelock-core checks.
fn handed_out<S: raw::Store>(store: S, unchecked: bool) -> DynLockStore {
    if unchecked {
        Arc::new(Unchecked(store))
    } else {
        Arc::new(store)
    }
}

struct FlawedFactory {
    store: FlawedStore,
    keep_alive: KeepAliveFlaw,
}

impl FlawedFactory {
    /// Whether the flaw is in what fencelock-core checks for every `raw::Store`.
    fn unchecked(&self) -> bool {
        matches!(
            self.store.flaw,
            Flaw::NoValidation | Flaw::DeadlineFromWaitStart
        )
    }
}

#[async_trait]
impl StoreFactory for FlawedFactory {
    async fn handle(&self) -> DynLockStore {
        handed_out(self.store.clone(), self.unchecked())
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let store = FlawedStore {
            reachable: false,
            ..self.store.clone()
        };
        handed_out(store, self.unchecked())
    }

    async fn forget(&self, lease: &Lease) {
        let slot = self.store.slot(lease.key()).to_owned();
        self.store.state().holders.remove(&slot);
    }

    fn keep_alive(&self, store: Arc<dyn LockStore>, lease: Lease) -> KeepAlive {
        match self.keep_alive {
            KeepAliveFlaw::None => KeepAlive::start(store, lease),
            flaw => KeepAlive::start(
                Arc::new(BrokenExtends {
                    store,
                    flaw,
                    calls: AtomicU32::new(0),
                }),
                lease,
            ),
        }
    }
}

/// What a broken keep-alive makes of the extends it sends.
#[derive(Debug)]
struct BrokenExtends {
    store: Arc<dyn LockStore>,
    flaw: KeepAliveFlaw,
    calls: AtomicU32,
}

#[async_trait]
impl raw::Wrapper for BrokenExtends {
    fn inner(&self) -> &dyn LockStore {
        &*self.store
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.flaw == KeepAliveFlaw::ExtendsTooSeldom && call % 2 == 1 {
            return Ok(());
        }
        match (self.store.extend(lease).await, self.flaw) {
            (Err(error), KeepAliveFlaw::TransientFailureIsFatal) if error.is_retryable() => Err(
                Error::lost(lease, format!("gave up on a transient failure: {error}")),
            ),
            (Err(error), KeepAliveFlaw::RetriesAfterAWholePeriod) if error.is_retryable() => {
                sleep(lease.ttl() / 4).await;
                Err(error)
            }
            (result, _) => result,
        }
    }
}

fn factory(flaw: Flaw) -> Arc<FlawedFactory> {
    factory_with(flaw, KeepAliveFlaw::None)
}

fn factory_with(flaw: Flaw, keep_alive: KeepAliveFlaw) -> Arc<FlawedFactory> {
    Arc::new(FlawedFactory {
        store: FlawedStore {
            flaw,
            reachable: true,
            state: Arc::default(),
        },
        keep_alive,
    })
}

async fn assert_caught(flaw: Flaw, case: &str) {
    assert_caught_in(factory(flaw), &format!("{flaw:?}"), case).await;
}

async fn assert_caught_in(factory: Arc<FlawedFactory>, flaw: &str, case: &str) {
    match run_case(case, factory).await {
        Outcome::Failed(failure) => println!("{flaw} caught by {case}: {failure}"),
        other => panic!("the suite did not catch {flaw}: {case} ended {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_flawless_store_passes_the_whole_suite() {
    let report = run_all(factory(Flaw::None), 8).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test(start_paused = true)]
async fn a_listing_that_ignores_its_prefix_is_caught() {
    assert_caught(
        Flaw::ListIgnoresPrefix,
        "a_listing_shows_exactly_the_held_keys_under_its_prefix",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_listing_whose_pages_skip_a_key_is_caught() {
    assert_caught(
        Flaw::ListPagesSkipOne,
        "a_listing_pages_through_every_held_key",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn sets_that_share_a_key_through_a_racy_acquire_are_caught() {
    assert_caught(
        Flaw::RacyCheckThenSet,
        "overlapping_sets_in_opposite_orders_both_finish_and_never_share_a_key",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_release_that_keeps_the_key_is_caught_by_the_sets() {
    for case in [
        "a_set_whose_last_key_is_busy_leaves_none_of_its_keys_held",
        "a_dropped_set_acquire_leaves_nothing_held",
    ] {
        assert_caught(Flaw::ReleaseKeepsTheKey, case).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_set_that_outlives_a_lost_key_is_caught() {
    assert_caught(
        Flaw::ExtendAlwaysSucceeds,
        "the_loss_of_one_key_ends_the_set",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn owner_blind_release_is_caught() {
    assert_caught(Flaw::OwnerBlindRelease, "release_by_non_owner_is_rejected").await;
}

#[tokio::test(start_paused = true)]
async fn tokens_that_restart_are_caught() {
    assert_caught(Flaw::TokensNotMonotonic, "tokens_increase_sequentially").await;
}

#[tokio::test(start_paused = true)]
async fn tokens_that_restart_after_the_retention_window_are_caught() {
    assert_caught(
        Flaw::TokensRestartAfterRetention,
        "tokens_increase_after_the_retention_window",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn extend_that_resurrects_is_caught() {
    assert_caught(
        Flaw::ExtendResurrects,
        "extend_after_expiry_fails_and_does_not_resurrect",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn ignored_ttl_is_caught() {
    assert_caught(Flaw::TtlIgnored, "expiry_frees_the_key").await;
}

#[tokio::test(start_paused = true)]
async fn racy_check_then_set_acquire_is_caught() {
    assert_caught(
        Flaw::RacyCheckThenSet,
        "acquire_is_exclusive_under_contention",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn waiters_woken_only_at_expiry_are_caught() {
    assert_caught(
        Flaw::WaitersNeverWoken,
        "waiter_is_woken_promptly_after_release",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_signal_that_never_fires_is_caught() {
    assert_caught(
        Flaw::ExtendAlwaysSucceeds,
        "lost_signal_fires_within_a_third_of_the_ttl_of_a_forget",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn missing_input_validation_is_caught() {
    assert_caught(Flaw::NoValidation, "empty_key_is_rejected").await;
    assert_caught(Flaw::NoValidation, "zero_ttl_is_rejected").await;
}

#[tokio::test(start_paused = true)]
async fn extend_that_renews_for_less_than_the_ttl_is_caught() {
    assert_caught(
        Flaw::ExtendRenewsForLess,
        "extend_keeps_the_key_until_the_new_local_deadline",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn truncated_keys_are_caught() {
    assert_caught(
        Flaw::KeysTruncated,
        "long_keys_are_distinct_over_their_whole_length",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn polling_behind_a_notified_wait_claim_is_caught() {
    assert_caught(
        Flaw::NotifiedWaitPolls,
        "notified_waiter_gets_a_released_key_within_150_ms",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_local_deadline_read_after_the_request_is_caught() {
    assert_caught(Flaw::DeadlineReadLate, "local_deadline_is_conservative").await;
    assert_caught(Flaw::DeadlineReadLate, "extend_moves_the_local_deadline").await;
}

#[tokio::test(start_paused = true)]
async fn leases_returned_with_their_deadline_passed_are_caught() {
    assert_caught(
        Flaw::DeadlineFromWaitStart,
        "every_returned_lease_has_validity_left",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_that_extends_too_seldom_to_notice_a_loss_is_caught() {
    assert_caught_in(
        factory_with(Flaw::None, KeepAliveFlaw::ExtendsTooSeldom),
        "a keep-alive that asks the store every two periods",
        "lost_signal_fires_within_a_third_of_the_ttl_of_a_forget",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_that_gives_up_on_a_transient_failure_is_caught() {
    assert_caught_in(
        factory_with(Flaw::None, KeepAliveFlaw::TransientFailureIsFatal),
        "a keep-alive that takes a transient failure as fatal",
        "keep_alive_survives_transient_extend_failures",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_that_retries_a_whole_period_later_is_caught() {
    assert_caught_in(
        factory_with(Flaw::None, KeepAliveFlaw::RetriesAfterAWholePeriod),
        "a keep-alive that retries a whole period after a failure",
        "keep_alive_survives_transient_extend_failures",
    )
    .await;
}

/// How [`ModeStore`] breaks the lock modes of the memory store it wraps: one flaw per modes
/// case, each breaking the guarantee that case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModeFlaw {
    None,
    /// A semaphore of `L` grants `L + 1` permits.
    PermitsOverLimit,
    /// A shared request is taken as an exclusive one, so readers exclude each other.
    ReadersExcludeEachOther,
    /// An exclusive request on a key held by readers is granted as one more reader.
    WriterJoinsReaders,
    /// A waiting exclusive request polls `try_acquire` without registering as a waiting
    /// writer, so a stream of readers starves it.
    WritersStarve,
    /// Shared and permit leases carry tokens from a counter of their own per key, from 1,
    /// below the exclusive leases' tokens.
    TokensOfOtherModesRestart,
    /// A permit's release that finds the lease gone frees another permit of the key instead.
    OwnerBlindPermitRelease,
    /// A request with another limit is granted a permit of the held limit.
    LimitMismatchGranted,
    /// A permit waiter waits in a detached task, which takes a permit after its caller's
    /// future was dropped.
    DetachedPermitWaiter,
    /// A permit's release reports `Released` and frees nothing: the permit stays until its TTL.
    PermitReleaseFreesNothing,
    /// The capabilities declare no shared leases and no permits, yet both are granted (by a
    /// store handed out [`Unchecked`], as fencelock-core refuses undeclared modes).
    UndeclaredModesGranted,
    /// Limits outside `1..=MAX_PERMITS` are clamped into it instead of refused (by a store
    /// handed out [`Unchecked`], as fencelock-core refuses them).
    PermitLimitUnchecked,
    /// A waiting request with another limit is granted a permit of the held limit (a single
    /// attempt is refused, as it should be).
    WaitingLimitMismatchGranted,
    /// An exclusive request on a handle whose own readers are the key's only holders is
    /// granted as one more of them, as a store with one database session per handle whose
    /// session lock re-enters would.
    WriterJoinsItsOwnHandlesReaders,
    /// An extend of an expired permit takes a new permit for the lease and reports success.
    ExtendRevivesExpiredPermits,
    /// `status` of a key held by readers counts one reader more than there are, and lists
    /// none.
    StatusOverCountsReaders,
    /// A reader that joins others is kept only until the earliest expiry among them: the
    /// readers are all forgotten then.
    ReadersExpireWithTheEarliest,
    /// A waiting writer marks the key, keeping new readers out, and unmarks it only when its
    /// wait ends: a writer dropped mid-wait keeps readers out for good.
    DroppedWriterKeepsReadersOut,
    /// Waiting readers ignore releases: they look again only when the writer's TTL runs out.
    ReadersWokenOnlyAtExpiry,
    /// A waiting shared or permit request polls `try_acquire` without a place in the queue, so
    /// a later request of another mode passes it.
    ReadersAndPermitsWaitUnqueued,
}

/// A [`MemoryStore`] with one [`ModeFlaw`]; exclusive leases are the memory store's own.
#[derive(Debug, Clone)]
struct ModeStore {
    inner: MemoryStore,
    flaw: ModeFlaw,
    /// For [`ModeFlaw::TokensOfOtherModesRestart`]: the per-key counter of the other modes,
    /// and the memory store's lease behind each lease handed out, by owner; for
    /// [`ModeFlaw::DroppedWriterKeepsReadersOut`], the writers' marks.
    other_modes: Arc<Mutex<OtherModes>>,
    /// For [`ModeFlaw::WriterJoinsItsOwnHandlesReaders`]: the owners of the readers granted
    /// through this handle (each handle has its own).
    handle_readers: Arc<Mutex<HashSet<OwnerId>>>,
}

#[derive(Default)]
struct OtherModes {
    counters: HashMap<String, u64>,
    real: HashMap<OwnerId, Lease>,
    /// How many waiting writers marked each key.
    writer_marks: HashMap<String, usize>,
}

impl std::fmt::Debug for OtherModes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtherModes")
    }
}

impl ModeStore {
    fn new(inner: MemoryStore, flaw: ModeFlaw) -> Self {
        ModeStore {
            inner,
            flaw,
            other_modes: Arc::default(),
            handle_readers: Arc::default(),
        }
    }

    /// The memory store as the contract's trait object (inside the `raw::Store` impl, the
    /// memory store's own `raw::Store` methods would be candidates too).
    fn memory(&self) -> &dyn LockStore {
        &self.inner
    }

    /// Another handle to the same store.
    fn new_handle(&self) -> Self {
        ModeStore {
            handle_readers: Arc::default(),
            ..self.clone()
        }
    }

    /// Adds `by` to the writers' marks on `key`.
    fn mark(&self, key: &str, by: isize) {
        let mut other_modes = self.other_modes();
        let marks = other_modes.writer_marks.entry(key.to_owned()).or_insert(0);
        *marks = marks.saturating_add_signed(by);
    }

    fn marked(&self, key: &str) -> bool {
        self.other_modes()
            .writer_marks
            .get(key)
            .is_some_and(|marks| *marks > 0)
    }

    /// Whether `key` is held by readers only, every one of them granted through this handle.
    async fn held_by_own_readers(&self, key: &str) -> Result<bool> {
        let KeyStatus::Shared {
            mode: Mode::Shared,
            holders,
            ..
        } = self.inner.status(key).await?
        else {
            return Ok(false);
        };
        let own = self
            .handle_readers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(holders
            .iter()
            .all(|holder| holder.owner.is_some_and(|owner| own.contains(&owner))))
    }

    /// For [`ModeFlaw::ReadersExpireWithTheEarliest`]: forgets the key's readers when the
    /// earliest of those `reader` joined expires.
    async fn expire_with_the_earliest(&self, reader: &Lease) -> Result<()> {
        let KeyStatus::Shared { holders, .. } = self.inner.status(reader.key()).await? else {
            return Ok(());
        };
        let earliest = holders
            .iter()
            .filter(|holder| holder.owner != Some(reader.owner()))
            .filter_map(|holder| holder.remaining)
            .min();
        if let Some(earliest) = earliest {
            let (inner, key) = (self.inner.clone(), reader.key().to_owned());
            tokio::spawn(async move {
                sleep(earliest).await;
                let _ = inner.evict(&key).await;
            });
        }
        Ok(())
    }

    fn other_modes(&self) -> std::sync::MutexGuard<'_, OtherModes> {
        self.other_modes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The mode the memory store is asked for instead of `mode`.
    fn asked(&self, mode: Mode) -> Mode {
        match (self.flaw, mode) {
            (ModeFlaw::PermitsOverLimit, Mode::Permit { limit }) if limit > 0 => {
                Mode::permits(limit + 1)
            }
            (ModeFlaw::ReadersExcludeEachOther, Mode::Shared) => Mode::Exclusive,
            (ModeFlaw::PermitLimitUnchecked, Mode::Permit { limit }) => {
                Mode::permits(limit.clamp(1, MAX_PERMITS))
            }
            _ => mode,
        }
    }

    /// The memory store's `lease`, granted for a request in `mode`, as the caller sees it.
    fn granted(&self, lease: Lease, mode: Mode) -> Lease {
        if self.flaw == ModeFlaw::WriterJoinsItsOwnHandlesReaders && mode == Mode::Shared {
            self.handle_readers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(lease.owner());
        }
        let slot = match (self.flaw, mode) {
            // The extra permit shares a slot below the limit, as a store whose slots wrap would.
            (ModeFlaw::PermitsOverLimit, Mode::Permit { limit }) => {
                lease.slot().map(|s| s.checked_rem(limit).unwrap_or(s))
            }
            _ => lease.slot(),
        };
        if self.flaw != ModeFlaw::TokensOfOtherModesRestart || mode == Mode::Exclusive {
            return if (lease.mode(), lease.slot()) == (mode, slot) {
                lease
            } else {
                lease.in_mode(mode, slot)
            };
        }
        let mut other_modes = self.other_modes();
        let counter = other_modes
            .counters
            .entry(lease.key().to_owned())
            .or_insert(0);
        *counter += 1;
        let seen = Lease::new(
            lease.key(),
            lease.owner(),
            *counter,
            lease.ttl(),
            Instant::now() - (lease.ttl() - lease.remaining()),
        )
        .in_mode(mode, slot);
        other_modes.real.insert(lease.owner(), lease);
        seen
    }

    /// The memory store's lease behind `lease`.
    fn real(&self, lease: &Lease) -> Lease {
        self.other_modes()
            .real
            .get(&lease.owner())
            .cloned()
            .unwrap_or_else(|| lease.clone())
    }

    /// One attempt in `mode`, flaws included.
    async fn try_in(&self, key: &str, ttl: Duration, mode: Mode) -> Result<Lease> {
        let busy = || Error::Busy {
            key: key.to_owned(),
        };
        if self.flaw == ModeFlaw::DroppedWriterKeepsReadersOut
            && mode == Mode::Shared
            && self.marked(key)
        {
            return Err(busy());
        }
        let result = self.inner.try_acquire_as(key, ttl, self.asked(mode)).await;
        let result = match (self.flaw, result) {
            (ModeFlaw::WriterJoinsReaders, Err(Error::Busy { .. })) if mode == Mode::Exclusive => {
                match self.inner.status(key).await? {
                    KeyStatus::Shared {
                        mode: Mode::Shared, ..
                    } => self.inner.try_acquire_as(key, ttl, Mode::Shared).await,
                    _ => Err(Error::Busy {
                        key: key.to_owned(),
                    }),
                }
            }
            (ModeFlaw::LimitMismatchGranted, Err(Error::LimitMismatch { held, .. })) => {
                self.inner
                    .try_acquire_as(key, ttl, Mode::permits(held))
                    .await
            }
            (ModeFlaw::WriterJoinsItsOwnHandlesReaders, Err(Error::Busy { .. }))
                if mode == Mode::Exclusive =>
            {
                if self.held_by_own_readers(key).await? {
                    self.inner.try_acquire_as(key, ttl, Mode::Shared).await
                } else {
                    Err(busy())
                }
            }
            (_, result) => result,
        };
        let lease = self.granted(result?, mode);
        if self.flaw == ModeFlaw::ReadersExpireWithTheEarliest && mode == Mode::Shared {
            self.expire_with_the_earliest(&lease).await?;
        }
        Ok(lease)
    }

    /// A waiting acquire in `mode`, flaws included.
    async fn wait_in(&self, key: &str, ttl: Duration, wait: Duration, mode: Mode) -> Result<Lease> {
        match (self.flaw, mode) {
            (ModeFlaw::WritersStarve | ModeFlaw::WriterJoinsReaders, Mode::Exclusive)
            | (ModeFlaw::ReadersAndPermitsWaitUnqueued, Mode::Shared | Mode::Permit { .. }) => {
                let started = Instant::now();
                loop {
                    match self.try_in(key, ttl, mode).await {
                        Err(Error::Busy { .. }) => {}
                        other => return other,
                    }
                    if started.elapsed() >= wait {
                        return Err(Error::WaitTimedOut {
                            key: key.to_owned(),
                            waited: started.elapsed(),
                        });
                    }
                    sleep(Duration::from_millis(5)).await;
                }
            }
            (ModeFlaw::DetachedPermitWaiter, Mode::Permit { .. }) => {
                let (inner, key) = (self.inner.clone(), key.to_owned());
                let task =
                    tokio::spawn(async move { inner.acquire_as(&key, ttl, wait, mode).await });
                task.await
                    .map_err(|e| Error::store("the waiting task failed", e))?
            }
            (
                ModeFlaw::LimitMismatchGranted | ModeFlaw::WaitingLimitMismatchGranted,
                Mode::Permit { .. },
            ) => match self.inner.acquire_as(key, ttl, wait, mode).await {
                Err(Error::LimitMismatch { held, .. }) => {
                    let lease = self
                        .inner
                        .acquire_as(key, ttl, wait, Mode::permits(held))
                        .await?;
                    Ok(self.granted(lease, mode))
                }
                other => other,
            },
            (ModeFlaw::WriterJoinsItsOwnHandlesReaders, Mode::Exclusive) => {
                match self.try_in(key, ttl, mode).await {
                    Err(Error::Busy { .. }) => {
                        let lease = self.inner.acquire_as(key, ttl, wait, mode).await?;
                        Ok(self.granted(lease, mode))
                    }
                    other => other,
                }
            }
            (ModeFlaw::DroppedWriterKeepsReadersOut, Mode::Exclusive) => {
                self.mark(key, 1);
                let result = self.inner.acquire_as(key, ttl, wait, mode).await;
                // Unmarked only here: a future dropped while it waits never gets here.
                self.mark(key, -1);
                Ok(self.granted(result?, mode))
            }
            (ModeFlaw::DroppedWriterKeepsReadersOut, Mode::Shared) => {
                let started = Instant::now();
                while self.marked(key) {
                    if started.elapsed() >= wait {
                        return Err(Error::WaitTimedOut {
                            key: key.to_owned(),
                            waited: started.elapsed(),
                        });
                    }
                    sleep(Duration::from_millis(5)).await;
                }
                let left = wait.saturating_sub(started.elapsed());
                let lease = self.inner.acquire_as(key, ttl, left, mode).await?;
                Ok(self.granted(lease, mode))
            }
            (ModeFlaw::ReadersWokenOnlyAtExpiry, Mode::Shared) => {
                let started = Instant::now();
                let deadline = started + wait;
                loop {
                    match self.try_in(key, ttl, mode).await {
                        Err(Error::Busy { .. }) => {}
                        other => return other,
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::WaitTimedOut {
                            key: key.to_owned(),
                            waited: now - started,
                        });
                    }
                    // Asleep until the writer's TTL runs out: its release wakes nobody.
                    let next = match self.inner.status(key).await? {
                        KeyStatus::Held {
                            remaining: Some(remaining),
                            ..
                        } => now + remaining,
                        _ => now + Duration::from_millis(5),
                    };
                    tokio::time::sleep_until(next.min(deadline)).await;
                }
            }
            _ => {
                let lease = self
                    .inner
                    .acquire_as(key, ttl, wait, self.asked(mode))
                    .await?;
                let lease = self.granted(lease, mode);
                if self.flaw == ModeFlaw::ReadersExpireWithTheEarliest && mode == Mode::Shared {
                    self.expire_with_the_earliest(&lease).await?;
                }
                Ok(lease)
            }
        }
    }

    /// The permit of `key` that `status` lists as held by `lease`'s owner and token, or any
    /// other held one when `anyone`.
    async fn held_permit(&self, lease: &Lease, anyone: bool) -> Result<Option<Lease>> {
        let KeyStatus::Shared { holders, .. } = self.inner.status(lease.key()).await? else {
            return Ok(None);
        };
        Ok(holders.into_iter().find_map(|holder| {
            let (owner, token) = (holder.owner?, holder.token?);
            let ours = owner == lease.owner() && token == lease.fencing_token();
            (ours || anyone).then(|| {
                Lease::new(lease.key(), owner, token, lease.ttl(), Instant::now())
                    .in_mode(lease.mode(), holder.slot)
            })
        }))
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl raw::Store for ModeStore {
    fn name(&self) -> &'static str {
        "mode-flawed"
    }

    fn capabilities(&self) -> Capabilities {
        // Its leases carry no labels: the mode flaws are about modes.
        let capabilities = self.memory().capabilities().with_labels(false);
        match self.flaw {
            ModeFlaw::UndeclaredModesGranted => capabilities.with_shared(false).with_permits(false),
            _ => capabilities,
        }
    }

    fn check(&self, _: &AcquireRequest<'_>) -> Result<()> {
        Ok(())
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        let AcquireRequest {
            key,
            ttl,
            mode,
            wait,
            ..
        } = *request;
        match wait {
            None => self.try_in(key, ttl, mode).await,
            Some(wait) => self.wait_in(key, ttl, wait, mode).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let permit = matches!(lease.mode(), Mode::Permit { .. });
        match self.flaw {
            ModeFlaw::TokensOfOtherModesRestart => self.memory().release(&self.real(lease)).await,
            ModeFlaw::PermitReleaseFreesNothing if permit => {
                Ok(match self.held_permit(lease, false).await? {
                    Some(_) => ReleaseOutcome::Released,
                    None => ReleaseOutcome::Lost,
                })
            }
            ModeFlaw::OwnerBlindPermitRelease if permit => {
                match self.memory().release(lease).await? {
                    ReleaseOutcome::Lost => match self.held_permit(lease, true).await? {
                        Some(someone) => self.memory().release(&someone).await,
                        None => Ok(ReleaseOutcome::Lost),
                    },
                    released => Ok(released),
                }
            }
            _ => self.memory().release(lease).await,
        }
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        if self.flaw == ModeFlaw::TokensOfOtherModesRestart {
            let real = self.real(lease);
            self.memory().extend(&real).await?;
            lease.confirm(real.valid_until() - (lease.ttl() - drift(lease.ttl())));
            return Ok(());
        }
        let permit = matches!(lease.mode(), Mode::Permit { .. });
        match self.memory().extend(lease).await {
            Err(Error::LeaseLost { .. })
                if self.flaw == ModeFlaw::ExtendRevivesExpiredPermits
                    && permit
                    && lease.is_expired() =>
            {
                let sent_at = Instant::now();
                self.inner
                    .try_acquire_as(lease.key(), lease.ttl(), lease.mode())
                    .await?;
                lease.confirm(sent_at);
                Ok(())
            }
            result => result,
        }
    }

    /// Not declared (the mode cases never list).
    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        let _ = (prefix, from, limit);
        Err(Error::Unsupported { operation: "list" })
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        match (self.flaw, self.memory().status(key).await?) {
            (
                ModeFlaw::StatusOverCountsReaders,
                KeyStatus::Shared {
                    mode: Mode::Shared,
                    count,
                    ..
                },
            ) => Ok(KeyStatus::Shared {
                mode: Mode::Shared,
                count: count + 1,
                holders: Vec::new(),
            }),
            (_, status) => Ok(status),
        }
    }

    async fn evict(&self, key: &str) -> Result<bool> {
        self.memory().evict(key).await
    }

    async fn relabel(&self, _: &Lease, _: &str) -> Result<()> {
        Err(Error::Unsupported {
            operation: "relabel",
        })
    }

    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        self.memory().next_status(key, seen, until).await
    }

    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        self.memory().per_key_state().await
    }

    fn diagnostics(&self) -> Vec<String> {
        self.memory().diagnostics()
    }

    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        self.memory().lease_env(lease)
    }
}

struct ModeFactory {
    store: ModeStore,
}

impl ModeFactory {
    /// Whether the flaw is in what fencelock-core checks for every `raw::Store` (the modes
    /// a store declares, the permit limit's range).
    fn unchecked(&self) -> bool {
        matches!(
            self.store.flaw,
            ModeFlaw::UndeclaredModesGranted | ModeFlaw::PermitLimitUnchecked
        )
    }
}

#[async_trait]
impl StoreFactory for ModeFactory {
    async fn handle(&self) -> DynLockStore {
        handed_out(self.store.new_handle(), self.unchecked())
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let inner = MemoryStore::new();
        inner.set_reachable(false);
        handed_out(ModeStore::new(inner, self.store.flaw), self.unchecked())
    }
}

fn mode_factory(flaw: ModeFlaw) -> Arc<ModeFactory> {
    Arc::new(ModeFactory {
        store: ModeStore::new(MemoryStore::new(), flaw),
    })
}

/// The modes cases, which the flawless [`ModeStore`] passes and each [`ModeFlaw`] fails one of.
const MODE_CASES: &[&str] = &[
    "permits_never_exceed_the_limit_under_contention",
    "released_and_expired_permits_are_free_again_and_wake_a_waiter",
    "tokens_increase_across_permits_and_modes",
    "readers_hold_together",
    "a_writer_excludes_readers_and_writers",
    "a_waiting_writer_is_served_while_readers_keep_arriving",
    "permit_release_and_extend_are_owner_only",
    "a_different_limit_is_refused_while_permits_are_held",
    "a_dropped_permit_waiter_never_takes_a_permit_later",
    "unsupported_modes_are_refused",
    "a_waiting_request_with_a_different_limit_is_refused",
    "a_writer_is_refused_next_to_a_reader_of_its_own_handle",
    "extend_does_not_revive_an_expired_permit",
    "status_counts_exactly_the_readers_held",
    "each_reader_keeps_the_key_for_its_own_ttl",
    "a_dropped_waiting_writer_stops_keeping_readers_out",
    "notified_readers_get_a_released_key_within_150_ms",
    "a_fair_queue_keeps_its_order_across_modes",
];

/// Each flaw and the modes case that catches it.
const MODE_FLAWS: &[(ModeFlaw, &str)] = &[
    (
        ModeFlaw::PermitsOverLimit,
        "permits_never_exceed_the_limit_under_contention",
    ),
    (
        ModeFlaw::PermitReleaseFreesNothing,
        "released_and_expired_permits_are_free_again_and_wake_a_waiter",
    ),
    (
        ModeFlaw::TokensOfOtherModesRestart,
        "tokens_increase_across_permits_and_modes",
    ),
    (ModeFlaw::ReadersExcludeEachOther, "readers_hold_together"),
    (
        ModeFlaw::WriterJoinsReaders,
        "a_writer_excludes_readers_and_writers",
    ),
    (
        ModeFlaw::WritersStarve,
        "a_waiting_writer_is_served_while_readers_keep_arriving",
    ),
    (
        ModeFlaw::OwnerBlindPermitRelease,
        "permit_release_and_extend_are_owner_only",
    ),
    (
        ModeFlaw::LimitMismatchGranted,
        "a_different_limit_is_refused_while_permits_are_held",
    ),
    (
        ModeFlaw::DetachedPermitWaiter,
        "a_dropped_permit_waiter_never_takes_a_permit_later",
    ),
    (
        ModeFlaw::UndeclaredModesGranted,
        "unsupported_modes_are_refused",
    ),
    (
        ModeFlaw::PermitLimitUnchecked,
        "unsupported_modes_are_refused",
    ),
    (
        ModeFlaw::WaitingLimitMismatchGranted,
        "a_waiting_request_with_a_different_limit_is_refused",
    ),
    (
        ModeFlaw::WriterJoinsItsOwnHandlesReaders,
        "a_writer_is_refused_next_to_a_reader_of_its_own_handle",
    ),
    (
        ModeFlaw::ExtendRevivesExpiredPermits,
        "extend_does_not_revive_an_expired_permit",
    ),
    (
        ModeFlaw::StatusOverCountsReaders,
        "status_counts_exactly_the_readers_held",
    ),
    (
        ModeFlaw::ReadersExpireWithTheEarliest,
        "each_reader_keeps_the_key_for_its_own_ttl",
    ),
    (
        ModeFlaw::DroppedWriterKeepsReadersOut,
        "a_dropped_waiting_writer_stops_keeping_readers_out",
    ),
    (
        ModeFlaw::ReadersWokenOnlyAtExpiry,
        "notified_readers_get_a_released_key_within_150_ms",
    ),
    (
        ModeFlaw::ReadersAndPermitsWaitUnqueued,
        "a_fair_queue_keeps_its_order_across_modes",
    ),
];

async fn assert_mode_flaw_caught(flaw: ModeFlaw) {
    let cases: Vec<&str> = MODE_FLAWS
        .iter()
        .filter(|(f, _)| *f == flaw)
        .map(|(_, case)| *case)
        .collect();
    assert!(!cases.is_empty(), "{flaw:?} names no case that catches it");
    for case in cases {
        assert_caught_in_modes(mode_factory(flaw), &format!("{flaw:?}"), case).await;
    }
}

async fn assert_caught_in_modes(factory: Arc<ModeFactory>, flaw: &str, case: &str) {
    match run_case(case, factory).await {
        Outcome::Failed(failure) => println!("{flaw} caught by {case}: {failure}"),
        other => panic!("the suite did not catch {flaw}: {case} ended {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_flawless_mode_store_passes_every_modes_case() {
    use futures_util::future::join_all;
    let outcomes =
        join_all(MODE_CASES.iter().map(|case| async move {
            (*case, run_case(case, mode_factory(ModeFlaw::None)).await)
        }))
        .await;
    for (case, outcome) in outcomes {
        assert_eq!(outcome, Outcome::Passed, "{case}");
    }
}

#[test]
fn every_modes_case_catches_a_mode_flaw() {
    for case in MODE_CASES {
        assert!(
            fencelock_conformance::CASES.iter().any(|c| c.name == *case),
            "no conformance case is called {case}"
        );
        assert!(
            MODE_FLAWS.iter().any(|(_, caught_by)| caught_by == case),
            "no broken store proves that {case} can fail"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn permits_over_the_limit_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::PermitsOverLimit).await;
}

#[tokio::test(start_paused = true)]
async fn a_permit_release_that_frees_nothing_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::PermitReleaseFreesNothing).await;
}

#[tokio::test(start_paused = true)]
async fn tokens_of_shared_and_permit_leases_below_the_writers_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::TokensOfOtherModesRestart).await;
}

#[tokio::test(start_paused = true)]
async fn readers_that_exclude_each_other_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::ReadersExcludeEachOther).await;
}

#[tokio::test(start_paused = true)]
async fn a_writer_granted_next_to_readers_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::WriterJoinsReaders).await;
}

#[tokio::test(start_paused = true)]
async fn readers_and_permits_waiting_outside_the_queue_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::ReadersAndPermitsWaitUnqueued).await;
}

#[tokio::test(start_paused = true)]
async fn writers_starved_by_readers_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::WritersStarve).await;
}

#[tokio::test(start_paused = true)]
async fn owner_blind_permit_release_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::OwnerBlindPermitRelease).await;
}

#[tokio::test(start_paused = true)]
async fn a_silently_granted_limit_mismatch_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::LimitMismatchGranted).await;
}

#[tokio::test(start_paused = true)]
async fn a_permit_waiter_that_outlives_its_future_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::DetachedPermitWaiter).await;
}

#[tokio::test(start_paused = true)]
async fn modes_granted_without_being_declared_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::UndeclaredModesGranted).await;
}

#[tokio::test(start_paused = true)]
async fn unchecked_permit_limits_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::PermitLimitUnchecked).await;
}

#[tokio::test(start_paused = true)]
async fn a_limit_mismatch_granted_on_the_waiting_path_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::WaitingLimitMismatchGranted).await;
}

#[tokio::test(start_paused = true)]
async fn a_writer_granted_next_to_its_own_handles_reader_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::WriterJoinsItsOwnHandlesReaders).await;
}

#[tokio::test(start_paused = true)]
async fn an_extend_that_revives_an_expired_permit_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::ExtendRevivesExpiredPermits).await;
}

#[tokio::test(start_paused = true)]
async fn a_status_that_over_counts_readers_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::StatusOverCountsReaders).await;
}

#[tokio::test(start_paused = true)]
async fn readers_kept_only_until_the_earliest_expiry_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::ReadersExpireWithTheEarliest).await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_writer_that_keeps_readers_out_is_caught() {
    assert_mode_flaw_caught(ModeFlaw::DroppedWriterKeepsReadersOut).await;
}

#[tokio::test(start_paused = true)]
async fn readers_woken_only_at_the_writers_expiry_are_caught() {
    assert_mode_flaw_caught(ModeFlaw::ReadersWokenOnlyAtExpiry).await;
}
