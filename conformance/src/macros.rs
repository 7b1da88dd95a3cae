//! One `#[tokio::test]` per case.

/// Generates one `#[tokio::test]` per conformance case, so a failure names its case.
///
/// The argument is an expression that evaluates (inside each test's runtime) to a future of
/// `Arc<impl StoreFactory>`; share a real server between tests with a `static` and build
/// connections in the future.
///
/// ```ignore
/// conformance::conformance_tests!(async { std::sync::Arc::new(MyFactory::new()) });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!(
            $factory;
            try_acquire_grants_a_free_key,
            try_acquire_on_a_held_key_is_busy,
            acquire_is_exclusive_under_contention,
            waiting_acquire_gets_the_key_after_release,
            wait_times_out_within_its_bound,
            zero_wait_makes_one_attempt,
            waiter_is_woken_promptly_after_release,
            notified_waiter_gets_a_released_key_within_150_ms,
            waiter_gets_the_key_when_the_holder_expires,
            many_waiters_all_get_the_lock,
            fair_queue_serves_the_oldest_waiter_first,
            release_of_a_held_lease_reports_released,
            release_by_non_owner_is_rejected,
            release_after_expiry_reports_lost,
            second_release_reports_lost,
            extend_keeps_a_lease_past_its_first_ttl,
            extend_after_expiry_fails_and_does_not_resurrect,
            extend_by_a_stale_lease_is_rejected,
            extend_moves_the_local_deadline,
            extend_keeps_the_key_until_the_new_local_deadline,
            local_deadline_is_conservative,
            expiry_frees_the_key,
            tokens_increase_sequentially,
            tokens_increase_after_expiry,
            tokens_increase_across_handles,
            tokens_increase_under_contention,
            independent_keys_do_not_contend,
            keys_are_data_not_code,
            similar_keys_are_distinct,
            long_keys_are_distinct_over_their_whole_length,
            max_length_key_is_accepted,
            over_long_key_is_rejected,
            empty_key_is_rejected,
            zero_ttl_is_rejected,
            ttl_outside_store_bounds_is_rejected,
            absurd_wait_is_rejected,
            keep_alive_holds_a_lease_over_five_ttls,
            keep_alive_survives_transient_extend_failures,
            lost_signal_fires_within_a_third_of_the_ttl_of_a_forget,
            lost_signal_fires_before_store_expiry_when_extends_stall,
            with_lock_cancels_its_body_on_loss,
            with_lock_releases_at_the_end,
            cancelled_acquire_leaves_nothing_held_past_ttl,
            dropped_waiter_never_acquires_later,
            dead_holder_frees_the_key_on_disconnect,
            unreachable_store_gives_a_retryable_error,
            status_reports_the_holder,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($factory:expr; $($case:ident),* $(,)?) => {
        $(
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
        )*
        #[test]
        fn every_conformance_case_has_a_test() {
            let generated = [$(stringify!($case)),*];
            let missing: Vec<_> = $crate::CASES
                .iter()
                .map(|case| case.name)
                .filter(|name| !generated.contains(name))
                .collect();
            assert!(missing.is_empty(), "cases without a generated test: {missing:?}");
        }
    };
}

/// Evaluates the async condition every 20 ms until it holds or `limit` passes, in an async
/// context with tokio; gives whether it held. For tests that wait on a store's side effects
/// (a subscriber gone, a backend ended) without a fixed sleep.
///
/// ```ignore
/// assert!(conformance::eventually!(Duration::from_secs(10), queue_len().await == 0));
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
