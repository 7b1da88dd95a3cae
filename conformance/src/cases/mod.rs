//! The cases, one file per group, and the list of them. Each case proves one guarantee of the
//! contract and names it.
//!
//! Adding a case is one edit beyond writing its `pub(super) async fn` in its group's file: a
//! line in the list of [`__for_each_case!`](crate::__for_each_case), from which both [`CASES`]
//! and the tests of [`conformance_tests!`](crate::conformance_tests) are generated.

use fencelock_core::Capabilities;

use crate::runner::Case;

/// Returns a [`Failure`](crate::Failure) with the message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}

mod acquire;
mod cancel;
mod election;
mod extend;
mod faults;
mod keep_alive;
mod keys;
mod labels;
mod listing;
mod modes;
mod release;
mod sets;
mod support;
mod tokens;
mod validation;
mod wait;

/// The case list, written once, in suite order and grouped by the module that holds each case:
/// calls `$callback! { $($prefix)* group { case, case if applies, … } … }`. A case that applies
/// only to some stores is followed by `if` and a `fn(&Capabilities) -> bool`. [`CASES`] and
/// [`conformance_tests!`](crate::conformance_tests) are both generated from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_case {
    ($callback:path $(, $($prefix:tt)*)?) => {
        $callback! {
            $($($prefix)*)?
            acquire {
                try_acquire_grants_a_free_key,
                try_acquire_on_a_held_key_is_busy,
                acquire_is_exclusive_under_contention,
            }
            wait {
                waiting_acquire_gets_the_key_after_release,
                wait_times_out_within_its_bound,
                zero_wait_makes_one_attempt,
                waiter_is_woken_promptly_after_release,
                notified_waiter_gets_a_released_key_within_150_ms if |c: &Capabilities| c.notified_wait,
                waiter_gets_the_key_when_the_holder_expires,
                many_waiters_all_get_the_lock,
                fair_queue_serves_the_oldest_waiter_first if |c: &Capabilities| c.fair_queue,
            }
            release {
                release_of_a_held_lease_reports_released,
                release_by_non_owner_is_rejected,
                release_after_expiry_reports_lost,
                second_release_reports_lost,
            }
            extend {
                extend_keeps_a_lease_past_its_first_ttl,
                extend_after_expiry_fails_and_does_not_resurrect,
                extend_by_a_stale_lease_is_rejected,
                extend_moves_the_local_deadline,
                extend_keeps_the_key_until_the_new_local_deadline,
                local_deadline_is_conservative,
                every_returned_lease_has_validity_left,
                expiry_frees_the_key,
            }
            tokens {
                tokens_increase_sequentially,
                tokens_increase_after_expiry,
                tokens_increase_across_handles,
                tokens_increase_under_contention,
                tokens_increase_after_the_retention_window if |c: &Capabilities| c.retention.is_some_and(|r| r.as_secs() <= 10),
            }
            keys {
                independent_keys_do_not_contend,
                keys_are_data_not_code,
                similar_keys_are_distinct,
                long_keys_are_distinct_over_their_whole_length,
                max_length_key_is_accepted,
                over_long_key_is_rejected,
                empty_key_is_rejected,
            }
            validation {
                zero_ttl_is_rejected,
                ttl_outside_store_bounds_is_rejected,
                absurd_wait_is_rejected,
            }
            keep_alive {
                keep_alive_holds_a_lease_over_five_ttls,
                keep_alive_survives_transient_extend_failures,
                lost_signal_fires_within_a_third_of_the_ttl_of_a_forget,
                lost_signal_fires_before_store_expiry_when_extends_stall,
                with_lock_cancels_its_body_on_loss,
                with_lock_releases_at_the_end,
            }
            cancel {
                cancelled_acquire_leaves_nothing_held_past_ttl,
                dropped_waiter_never_acquires_later,
                dead_holder_frees_the_key_on_disconnect if |c: &Capabilities| c.frees_on_disconnect,
            }
            faults {
                unreachable_store_gives_a_retryable_error,
                status_reports_the_holder,
            }
            modes {
                permits_never_exceed_the_limit_under_contention if |c: &Capabilities| c.permits,
                released_and_expired_permits_are_free_again_and_wake_a_waiter if |c: &Capabilities| c.permits,
                tokens_increase_across_permits_and_modes if |c: &Capabilities| c.permits || c.shared,
                readers_hold_together if |c: &Capabilities| c.shared,
                status_counts_exactly_the_readers_held if |c: &Capabilities| c.shared,
                each_reader_keeps_the_key_for_its_own_ttl if |c: &Capabilities| c.shared,
                notified_readers_get_a_released_key_within_150_ms if |c: &Capabilities| c.shared && c.notified_wait,
                a_writer_excludes_readers_and_writers if |c: &Capabilities| c.shared,
                a_writer_is_refused_next_to_a_reader_of_its_own_handle if |c: &Capabilities| c.shared,
                a_dropped_waiting_writer_stops_keeping_readers_out if |c: &Capabilities| c.shared,
                a_waiting_writer_is_served_while_readers_keep_arriving if |c: &Capabilities| c.shared,
                permit_release_and_extend_are_owner_only if |c: &Capabilities| c.permits,
                a_different_limit_is_refused_while_permits_are_held if |c: &Capabilities| c.permits,
                a_waiting_request_with_a_different_limit_is_refused if |c: &Capabilities| c.permits,
                extend_does_not_revive_an_expired_permit if |c: &Capabilities| c.permits,
                a_dropped_permit_waiter_never_takes_a_permit_later if |c: &Capabilities| c.permits,
                a_fair_queue_keeps_its_order_across_modes if |c: &Capabilities| c.fair_queue && (c.shared || c.permits),
                unsupported_modes_are_refused,
            }
            listing {
                a_listing_shows_exactly_the_held_keys_under_its_prefix if |c: &Capabilities| c.listing,
                a_listing_pages_through_every_held_key if |c: &Capabilities| c.listing,
                bad_listing_input_is_refused if |c: &Capabilities| c.listing,
            }
            sets {
                overlapping_sets_in_opposite_orders_both_finish_and_never_share_a_key,
                a_set_whose_last_key_is_busy_leaves_none_of_its_keys_held,
                the_loss_of_one_key_ends_the_set,
                a_dropped_set_acquire_leaves_nothing_held,
            }
            labels {
                status_reports_each_holders_label if |c: &Capabilities| c.labels,
                relabel_replaces_the_label_and_is_owner_only if |c: &Capabilities| c.labels,
                bad_labels_are_refused_and_nothing_is_held,
            }
            election {
                one_leader_at_a_time_among_candidates,
                terms_grow_across_leaders,
                resign_hands_over_within_the_wake_bound,
                a_cut_off_leader_is_replaced_within_its_ttl,
                an_evicted_leader_is_replaced_and_its_term_is_fenced,
                a_dropped_campaign_leaves_no_candidate,
                a_dropped_leadership_resigns,
                leader_of_an_election_nobody_leads_is_none,
                leader_reports_the_value if |c: &Capabilities| c.labels,
                bad_election_input_is_refused_and_leaves_nothing,
                observers_see_every_leader_in_term_order,
                a_proclaimed_value_reaches_observers if |c: &Capabilities| c.labels,
            }
        }
    };
}

/// The callback that builds [`CASES`] from the list.
macro_rules! cases {
    ($($group:ident { $($case:ident $(if $applies:expr)?),* $(,)? })*) => {
        /// Every case of the suite, in the order [`run_all`](crate::run_all) runs them.
        ///
        /// Every case keeps time on tokio's clock alone (`tokio::time`'s `Instant`, sleeps and
        /// timeouts; no `std::time::Instant`, threads or blocking waits), so against a store that
        /// does too it runs unchanged on a paused clock
        /// ([`conformance_tests!`](crate::conformance_tests)`(paused: …)`): the in-memory store
        /// and the suite's broken stores run it in no real time.
        pub static CASES: &[Case] = &[
            $($(Case {
                name: stringify!($case),
                applies: cases!(@applies $($applies)?),
                run: |ctx| Box::pin($group::$case(ctx)),
            }),*),*
        ];
    };
    (@applies) => { |_: &Capabilities| true };
    (@applies $applies:expr) => { $applies };
}

crate::__for_each_case!(cases);
