//! The nemesis's short profile, inside `cargo test`: a few faults on every store, each run
//! checked; and a deliberately broken store that the checker must catch.

use std::time::Duration;

use nemesis::faults::BROKEN_MEMORY;
use nemesis::{Fault, FaultProfile, Options};

fn options(stores: Vec<FaultProfile>, duration: Duration) -> Options {
    Options {
        url: None,
        stores,
        faults: None,
        duration,
        workers: 3,
        ttl: Duration::from_secs(1),
        hold_max: Duration::from_millis(100),
        seed: 22,
        resource_url: None,
        worker_binary: env!("CARGO_BIN_EXE_nemesis").into(),
        history_dir: Some(std::env::temp_dir().join("nemesis-short")),
        verbose: true,
    }
}

/// A memory store whose tokens start over when it restarts: the next holder's token is below
/// the resource's fence, so its claim is refused while it holds the lock by every measure
/// (no lost signal, deadline ahead, granted after the restart). Rule 3 must catch it.
#[test]
fn a_store_whose_tokens_restart_is_caught_as_an_unexplained_refusal() {
    let mut options = options(vec![BROKEN_MEMORY], Duration::from_secs(4));
    options.faults = Some(vec![Fault::StoreRestart]);
    let reports = nemesis::run(&options).unwrap_or_else(|e| panic!("{e}"));
    let report = &reports[0];
    println!("{}", nemesis::report::table(&reports));
    assert!(
        report.faults.iter().any(|f| f == "store-restart"),
        "no restart was injected: {:?}",
        report.faults
    );
    assert!(!report.verdict.is_safe());
    assert!(report.verdict.broke(3), "{:#?}", report.verdict.violations);
}

/// One store, about 10 s of faults: nothing unsafe accepted.
fn keeps_the_rules_under_a_short_run_of_faults(store: &str) {
    let profile = FaultProfile::parse(store).unwrap_or_else(|| panic!("{store}: no such store"));
    let reports = nemesis::run(&options(vec![profile], Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{}", nemesis::report::table(&reports));
    assert_eq!(reports.len(), 1, "one report per store asked for");
    for report in &reports {
        assert!(
            !report.faults.is_empty(),
            "{}: no fault injected",
            report.store
        );
        assert!(
            report.verdict.is_safe(),
            "{}: {:#?}",
            report.store,
            report.verdict.violations
        );
        assert!(
            report.verdict.total().writes_accepted > 0,
            "{}: no work done",
            report.store
        );
    }
}

/// One test per store, so that the test harness runs them side by side (each starts its own
/// servers and its own resource database): the short profile's wall time is about half of
/// running the nine one after another.
macro_rules! every_store {
    ($($name:ident => $store:literal,)*) => {
        $(
            #[test]
            fn $name() {
                keeps_the_rules_under_a_short_run_of_faults($store);
            }
        )*

        /// The list above covers every store the nemesis starts by itself.
        #[test]
        fn every_store_has_a_short_run() {
            let listed = [$($store),*];
            let started: Vec<&str> = FaultProfile::startable().map(|p| p.name()).collect();
            assert_eq!(listed.to_vec(), started);
        }
    };
}

every_store! {
    memory_keeps_the_rules_under_a_short_run_of_faults => "memory",
    redis_keeps_the_rules_under_a_short_run_of_faults => "redis",
    redis_sentinel_keeps_the_rules_under_a_short_run_of_faults => "redis-sentinel",
    redlock_keeps_the_rules_under_a_short_run_of_faults => "redlock",
    etcd_keeps_the_rules_under_a_short_run_of_faults => "etcd",
    postgres_keeps_the_rules_under_a_short_run_of_faults => "postgres",
    mysql_keeps_the_rules_under_a_short_run_of_faults => "mysql",
    sqlite_keeps_the_rules_under_a_short_run_of_faults => "sqlite",
    zookeeper_keeps_the_rules_under_a_short_run_of_faults => "zookeeper",
}
