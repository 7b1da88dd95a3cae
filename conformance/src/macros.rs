//! One `#[tokio::test]` per case.

/// Generates one `#[tokio::test]` per conformance case, so a failure names its case.
///
/// The argument is an expression that evaluates (inside each test's runtime) to a future of
/// `Arc<impl StoreFactory>`; share one real server between the tests (in this workspace,
/// `test_servers::shared`) and build connections in the future. The tests are generated from
/// the same list as [`CASES`](crate::CASES), so a new case needs no edit here or in a store's
/// test file.
///
/// ```ignore
/// fencelock_conformance::conformance_tests!(async { std::sync::Arc::new(MyFactory::new()) });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__for_each_case!($crate::__conformance_tests, $factory;);
    };
}

/// The callback of [`conformance_tests!`] for the case list: one `#[tokio::test]` per case,
/// whether it applies or not (the runner reports a case that does not apply as such).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($factory:expr; $($group:ident { $($case:ident $(if $applies:expr)?),* $(,)? })*) => {
        $($(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
