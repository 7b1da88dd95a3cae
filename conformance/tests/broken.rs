//! The suite proves it can fail: each deliberately broken store below breaks one guarantee, and
//! the case that guards that guarantee must fail against it. The same store without a flaw
//! passes the whole suite, so each failure is the flaw's doing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use conformance::{async_trait, run_all, run_case, Outcome, StoreFactory};
use lock_core::validate::{check_request, check_wait};
use lock_core::{
    Acquire, Capabilities, DynLockStore, Error, Extend, Lease, LockStore, OwnerId, Release,
    ReleaseOutcome, Result,
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
    /// Keys and TTLs are not validated.
    NoValidation,
}

#[derive(Default)]
struct State {
    holders: HashMap<String, (OwnerId, u64, Instant)>,
    tokens: HashMap<String, u64>,
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

    fn live(&self, key: &str, now: Instant) -> Option<(OwnerId, u64, Instant)> {
        self.state()
            .holders
            .get(key)
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
        let mut state = self.state();
        if self.flaw != Flaw::RacyCheckThenSet {
            if let Some((_, _, expires)) = state.holders.get(key).copied() {
                if expires > sent_at {
                    return Ok(Err(expires));
                }
            }
        }
        let token = state.tokens.entry(key.to_owned()).or_insert(0);
        *token += 1;
        let token = *token;
        let owner = OwnerId::random();
        let expires = self.expiry(sent_at, ttl);
        state
            .holders
            .insert(key.to_owned(), (owner, token, expires));
        Ok(Ok(Lease::new(key, owner, token, ttl, sent_at)))
    }

    fn validate(&self, key: &str, ttl: Duration) -> Result<()> {
        if self.flaw == Flaw::NoValidation {
            return Ok(());
        }
        check_request(key, ttl, &self.capabilities())
    }
}

#[async_trait]
impl Acquire for FlawedStore {
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        self.validate(key, ttl)?;
        self.attempt(key, ttl).await?.map_err(|_| Error::Busy {
            key: key.to_owned(),
        })
    }

    async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Lease> {
        self.validate(key, ttl)?;
        check_wait(wait)?;
        let started = Instant::now();
        let deadline = started + wait;
        loop {
            let expires = match self.attempt(key, ttl).await? {
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
            let next = if self.flaw == Flaw::WaitersNeverWoken {
                expires
            } else {
                now + Duration::from_millis(5)
            };
            tokio::time::sleep_until(next.min(deadline)).await;
        }
    }
}

#[async_trait]
impl Release for FlawedStore {
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.check()?;
        let now = Instant::now();
        let mut state = self.state();
        let ours = state
            .holders
            .get(lease.key())
            .is_some_and(|(owner, _, expires)| *owner == lease.owner() && *expires > now);
        if ours || self.flaw == Flaw::OwnerBlindRelease {
            state.holders.remove(lease.key());
            if self.flaw == Flaw::TokensNotMonotonic {
                state.tokens.remove(lease.key());
            }
        }
        Ok(if ours {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Lost
        })
    }
}

#[async_trait]
impl Extend for FlawedStore {
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.check()?;
        let sent_at = Instant::now();
        if self.flaw == Flaw::ExtendAlwaysSucceeds {
            lease.confirm(sent_at);
            return Ok(());
        }
        let expires = self.expiry(sent_at, lease.ttl());
        let mut state = self.state();
        let ours = state
            .holders
            .get(lease.key())
            .is_some_and(|(owner, _, at)| *owner == lease.owner() && *at > sent_at);
        if ours || self.flaw == Flaw::ExtendResurrects {
            state.holders.insert(
                lease.key().to_owned(),
                (lease.owner(), lease.fencing_token(), expires),
            );
            lease.confirm(sent_at);
            Ok(())
        } else {
            Err(Error::lost(lease, "not held"))
        }
    }
}

#[async_trait]
impl LockStore for FlawedStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
    }
}

struct FlawedFactory(FlawedStore);

#[async_trait]
impl StoreFactory for FlawedFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(self.0.clone())
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        Arc::new(FlawedStore {
            reachable: false,
            ..self.0.clone()
        })
    }

    async fn forget(&self, lease: &Lease) {
        self.0.state().holders.remove(lease.key());
    }
}

fn factory(flaw: Flaw) -> Arc<FlawedFactory> {
    Arc::new(FlawedFactory(FlawedStore {
        flaw,
        reachable: true,
        state: Arc::default(),
    }))
}

async fn assert_caught(flaw: Flaw, case: &str) {
    match run_case(case, factory(flaw)).await {
        Outcome::Failed(failure) => println!("{flaw:?} caught by {case}: {failure}"),
        other => panic!("the suite did not catch {flaw:?}: {case} ended {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flawless_store_passes_the_whole_suite() {
    let report = run_all(factory(Flaw::None), 8).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_blind_release_is_caught() {
    assert_caught(Flaw::OwnerBlindRelease, "release_by_non_owner_is_rejected").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_restart_are_caught() {
    assert_caught(Flaw::TokensNotMonotonic, "tokens_increase_sequentially").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_that_resurrects_is_caught() {
    assert_caught(
        Flaw::ExtendResurrects,
        "extend_after_expiry_fails_and_does_not_resurrect",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_ttl_is_caught() {
    assert_caught(Flaw::TtlIgnored, "expiry_frees_the_key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racy_check_then_set_acquire_is_caught() {
    assert_caught(
        Flaw::RacyCheckThenSet,
        "acquire_is_exclusive_under_contention",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_woken_only_at_expiry_are_caught() {
    assert_caught(
        Flaw::WaitersNeverWoken,
        "waiter_is_woken_promptly_after_release",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_signal_that_never_fires_is_caught() {
    assert_caught(
        Flaw::ExtendAlwaysSucceeds,
        "lost_signal_fires_when_the_store_forgets_the_lease",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_input_validation_is_caught() {
    assert_caught(Flaw::NoValidation, "empty_key_is_rejected").await;
    assert_caught(Flaw::NoValidation, "zero_ttl_is_rejected").await;
}
