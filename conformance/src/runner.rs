//! Running cases: one at a time with a name (for `#[tokio::test]`), or all with a report.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::Capabilities;
use tokio::time::Instant;

use crate::{Ctx, StoreFactory};

/// Why a case failed, in words that name the broken guarantee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl From<fencelock_core::Error> for Failure {
    fn from(error: fencelock_core::Error) -> Self {
        Failure(format!("unexpected error: {error}"))
    }
}

/// What a case returns.
pub type CaseResult = Result<(), Failure>;

type CaseFuture = Pin<Box<dyn Future<Output = CaseResult> + Send>>;

/// One conformance case.
#[derive(Clone, Copy)]
pub struct Case {
    /// The behaviour it proves, as a test name.
    pub name: &'static str,
    /// Whether the case applies to a store with these capabilities.
    pub applies: fn(&Capabilities) -> bool,
    pub(crate) run: fn(Ctx) -> CaseFuture,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Passed,
    /// It failed, panicked or ran past its time limit.
    Failed(Failure),
    /// The store's capabilities say the case does not apply; the reason names the capability.
    NotApplicable,
}

/// One line of a [`Report`].
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// The case's name.
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it ran.
    pub elapsed: Duration,
}

/// The result of [`run_all`].
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One entry per case, in suite order.
    pub cases: Vec<CaseReport>,
}

impl Report {
    /// Whether no case failed.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases
            .iter()
            .filter(|case| matches!(case.outcome, Outcome::Failed(_)))
    }

    /// The outcome of the case called `name`.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.cases
            .iter()
            .find(|case| case.name == name)
            .map(|case| &case.outcome)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.cases.iter().map(|c| c.name.len()).max().unwrap_or(4);
        writeln!(f, "{:<width$}  {:<6}  {:>9}", "case", "result", "time")?;
        for case in &self.cases {
            let (result, detail) = match &case.outcome {
                Outcome::Passed => ("pass", String::new()),
                Outcome::NotApplicable => ("n/a", String::new()),
                Outcome::Failed(failure) => ("FAIL", format!("  {failure}")),
            };
            writeln!(
                f,
                "{:<width$}  {:<6}  {:>7}ms{detail}",
                case.name,
                result,
                case.elapsed.as_millis()
            )?;
        }
        let failed = self.failures().count();
        let passed = self
            .cases
            .iter()
            .filter(|c| c.outcome == Outcome::Passed)
            .count();
        write!(f, "{passed} passed, {failed} failed")
    }
}

/// Runs the case called `name` against the factory's store, with a time limit derived from the
/// store's capabilities. A panic inside the case is a failure, not a crash.
///
/// # Cancel safety
/// Dropping the future detaches the case's task, which runs on to its end (or the runtime's
/// shutdown); its outcome is lost, and leases it holds expire at their TTLs.
pub async fn run_case(name: &str, factory: Arc<dyn StoreFactory>) -> Outcome {
    match crate::CASES.iter().find(|case| case.name == name) {
        Some(case) => run_one(case, factory).await.0,
        None => Outcome::Failed(Failure(format!("no conformance case is called {name:?}"))),
    }
}

/// Runs every case, `parallel` at a time, and reports each.
///
/// # Cancel safety
/// As [`run_matching`].
pub async fn run_all(factory: Arc<dyn StoreFactory>, parallel: usize) -> Report {
    run_matching(factory, parallel, |_| true).await
}

/// Runs the cases whose name `select` accepts, `parallel` at a time, and reports each (the
/// others are left out of the report).
///
/// # Cancel safety
/// Dropping the future loses the report; cases already started run on, detached, to their
/// end (or the runtime's shutdown), and leases they hold expire at their TTLs.
pub async fn run_matching(
    factory: Arc<dyn StoreFactory>,
    parallel: usize,
    select: impl Fn(&str) -> bool,
) -> Report {
    use futures_util::stream::{self, StreamExt};
    let cases = stream::iter(crate::CASES.iter().filter(|case| select(case.name)))
        .map(|case| {
            let factory = factory.clone();
            async move {
                let (outcome, elapsed) = run_one(case, factory).await;
                CaseReport {
                    name: case.name,
                    outcome,
                    elapsed,
                }
            }
        })
        .buffered(parallel.max(1))
        .collect()
        .await;
    Report { cases }
}

async fn run_one(case: &Case, factory: Arc<dyn StoreFactory>) -> (Outcome, Duration) {
    let started = Instant::now();
    let ctx = Ctx::new(factory).await;
    if !(case.applies)(&ctx.capabilities) {
        return (Outcome::NotApplicable, started.elapsed());
    }
    let limit = ctx.timing.case_limit;
    let task = tokio::spawn((case.run)(ctx));
    let abort = task.abort_handle();
    let outcome = match tokio::time::timeout(limit, task).await {
        Ok(Ok(Ok(()))) => Outcome::Passed,
        Ok(Ok(Err(failure))) => Outcome::Failed(failure),
        Ok(Err(join)) => Outcome::Failed(Failure(format!("the case panicked: {join}"))),
        Err(_) => {
            abort.abort();
            Outcome::Failed(Failure(format!("the case hung for more than {limit:?}")))
        }
    };
    (outcome, started.elapsed())
}

/// A substantial subset of the suite that exercises every operation once over a new transport
/// or as a new user (TLS, a least-privilege account): acquire, contention, waiting and its
/// notification, release, extend, tokens, hostile and long keys, eviction and the lost signal,
/// dropped waiters, status, the unreachable handle and the lock modes. The whole suite runs in
/// each store's own `tests/conformance.rs`.
pub const TRANSPORT_CASES: &[&str] = &[
    "try_acquire_grants_a_free_key",
    "try_acquire_on_a_held_key_is_busy",
    "acquire_is_exclusive_under_contention",
    "waiting_acquire_gets_the_key_after_release",
    "notified_waiter_gets_a_released_key_within_150_ms",
    "release_of_a_held_lease_reports_released",
    "release_by_non_owner_is_rejected",
    "extend_moves_the_local_deadline",
    "tokens_increase_across_handles",
    "tokens_increase_under_contention",
    "keys_are_data_not_code",
    "max_length_key_is_accepted",
    "lost_signal_fires_within_a_third_of_the_ttl_of_a_forget",
    "dropped_waiter_never_acquires_later",
    "status_reports_the_holder",
    "unreachable_store_gives_a_retryable_error",
    "permits_never_exceed_the_limit_under_contention",
    "a_writer_excludes_readers_and_writers",
    "unsupported_modes_are_refused",
];

/// The cases that hold one lease over several [`hold_ttl`](crate::Timing::hold_ttl)s (3 s or
/// more each) and send no request the rest of the suite does not send: they extend over time,
/// by hand or by a keep-alive, whose own stalls and failures the case injects. A run that
/// proves the requests work as a new user may leave them out ([`expect_cases_except`]); they
/// are the slowest cases, 4 to 15 s each.
pub const HOLD_CASES: &[&str] = &[
    "keep_alive_holds_a_lease_over_five_ttls",
    "extend_keeps_a_lease_past_its_first_ttl",
    "extend_keeps_the_key_until_the_new_local_deadline",
    "keep_alive_survives_transient_extend_failures",
    "lost_signal_fires_before_store_expiry_when_extends_stall",
];

/// Runs [`TRANSPORT_CASES`] against the factory's store, four at a time, and panics with every
/// failure (a case the store does not declare counts as not applicable).
///
/// # Cancel safety
/// As [`run_matching`].
pub async fn expect_transport_cases(factory: Arc<dyn StoreFactory>) {
    expect_cases(factory, 4, TRANSPORT_CASES.len(), |name| {
        TRANSPORT_CASES.contains(&name)
    })
    .await;
}

/// Runs every case but those `left_out` names (new cases join by themselves), `parallel` at a
/// time, and panics with every failure. Each name left out must be a case of the suite.
///
/// # Cancel safety
/// As [`run_matching`].
pub async fn expect_cases_except(
    factory: Arc<dyn StoreFactory>,
    parallel: usize,
    left_out: &[&str],
) {
    for name in left_out {
        assert!(
            crate::CASES.iter().any(|case| case.name == *name),
            "{name}: no such conformance case"
        );
    }
    let expected = crate::CASES.len() - left_out.len();
    expect_cases(factory, parallel, expected, |name| {
        !left_out.contains(&name)
    })
    .await;
}

async fn expect_cases(
    factory: Arc<dyn StoreFactory>,
    parallel: usize,
    expected: usize,
    select: impl Fn(&str) -> bool,
) {
    let report = run_matching(factory, parallel, select).await;
    let failures: Vec<String> = report
        .failures()
        .map(|case| format!("{}: {:?}", case.name, case.outcome))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        report.cases.len(),
        failures.join("\n")
    );
    assert_eq!(report.cases.len(), expected, "{report}");
}
