//! One `#[tokio::test]` per case.

/// Generates one `#[tokio::test]` per conformance case, so a failure names its case.
///
/// The argument is an expression that evaluates (inside each test's runtime) to a future of
/// `Arc<impl StoreFactory>`; share one real server between the tests (in this workspace,
/// `test_servers::shared`) and build connections in the future. The tests are generated from
/// the same list as [`CASES`](crate::CASES), so a new case needs no edit here or in a store's
/// test file. Each test runs on a multi-thread runtime in real time.
///
/// ```ignore
/// fencelock_conformance::conformance_tests!(async { std::sync::Arc::new(MyFactory::new()) });
/// ```
///
/// `paused:` before the expression runs each test on a current-thread runtime whose clock
/// starts paused (`#[tokio::test(start_paused = true)]`): whenever every task waits on a timer,
/// tokio moves the clock to the next one, so TTLs and waits pass in no real time. Every case
/// keeps time on tokio's clock alone (see [`CASES`](crate::CASES)), so this is for a store that
/// does too and waits on nothing else, such as [`MemoryStore`](fencelock_core::MemoryStore)
/// and the suite's broken stores; the test crate needs tokio's `test-util` feature. A store
/// that waits on a server, a socket or a thread must run in real time: the paused clock would
/// jump past its timeouts while it waits.
///
/// ```ignore
/// fencelock_conformance::conformance_tests!(paused: async { Arc::new(MemoryFactory::new()) });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (paused: $factory:expr) => {
        $crate::__for_each_case!($crate::__conformance_tests, (start_paused = true) $factory;);
    };
    ($factory:expr) => {
        $crate::__for_each_case!(
            $crate::__conformance_tests,
            (flavor = "multi_thread", worker_threads = 2) $factory;
        );
    };
}

/// The callback of [`conformance_tests!`] for the case list: one `#[tokio::test]` per case, with
/// the runtime arguments in parentheses, whether it applies or not (the runner reports a case
/// that does not apply as such).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($runtime:tt $factory:expr; $($group:ident { $($case:ident $(if $applies:expr)?),* $(,)? })*) => {
        $($(
            #[tokio::test $runtime]
            async fn $case() {
                let factory = $factory.await;
                match $crate::run_case(stringify!($case), factory).await {
                    $crate::Outcome::Failed(failure) => panic!("{}: {}", stringify!($case), failure),
                    $crate::Outcome::Passed => {}
                    $crate::Outcome::NotApplicable => println!(
                        "{}: not applicable to this store's capabilities",
                        stringify!($case)
                    ),
                }
            }
        )*)*
    };
}

/// Evaluates the async condition every 20 ms until it holds or `limit` passes, in an async
/// context with tokio; gives whether it held. For tests that wait on a store's side effects
/// (a subscriber gone, a backend ended) without a fixed sleep.
///
/// ```ignore
/// assert!(fencelock_conformance::eventually!(Duration::from_secs(10), queue_len().await == 0));
/// ```
#[macro_export]
macro_rules! eventually {
    ($limit:expr, $condition:expr) => {{
        let started = ::tokio::time::Instant::now();
        loop {
            if $condition {
                break true;
            }
            if started.elapsed() > $limit {
                break false;
            }
            ::tokio::time::sleep(::std::time::Duration::from_millis(20)).await;
        }
    }};
}
