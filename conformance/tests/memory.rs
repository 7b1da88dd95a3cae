//! The whole suite against the in-memory reference store.

use std::sync::Arc;

use fencelock_conformance::MemoryFactory;

fencelock_conformance::conformance_tests!(async { Arc::new(MemoryFactory::new()) });

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_passes_the_whole_suite_in_one_run() {
    let report = fencelock_conformance::run_all(Arc::new(MemoryFactory::new()), 8).await;
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert!(fencelock_conformance::CASES.len() >= 30);
}
