//! The whole suite against the in-memory reference store. The store keeps time on tokio's
//! clock, as every case does, so each test runs on a paused clock: its TTLs pass in no real
//! time.

use std::sync::Arc;

use fencelock_conformance::MemoryFactory;

fencelock_conformance::conformance_tests!(paused: async { Arc::new(MemoryFactory::new()) });

#[tokio::test(start_paused = true)]
async fn the_memory_store_passes_the_whole_suite_in_one_run() {
    let report = fencelock_conformance::run_all(Arc::new(MemoryFactory::new()), 8).await;
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert!(fencelock_conformance::CASES.len() >= 30);
}
