//! The fencelock conformance suite: one set of cases every lock store must pass.
//!
//! Each case proves one guarantee of the [`fencelock_core`] contract against a live store and fails
//! with a message naming the broken guarantee. A store's capabilities decide the timings and
//! which few cases apply (a fair queue, freeing on disconnect); nothing is skipped otherwise.
//! The suite's own tests run it against deliberately broken stores to prove that it can fail.
//!
//! # Running the suite against your own store
//!
//! 1. Implement [`StoreFactory`]: fresh handles to your store and a handle that cannot reach
//!    it. Making the store forget a lease behind its holder's back defaults to the store's
//!    own [`LockStore::evict`](fencelock_core::LockStore::evict); override `forget` only for a
//!    store without eviction.
//! 2. Generate one `#[tokio::test]` per case with [`conformance_tests!`], or call [`run_all`]
//!    and print the [`Report`].
//!
//! ```ignore
//! use std::sync::Arc;
//! use fencelock_conformance::{async_trait, StoreFactory};
//! use fencelock_core::DynLockStore;
//!
//! struct MyFactory { url: String }
//!
//! #[async_trait]
//! impl StoreFactory for MyFactory {
//!     async fn handle(&self) -> DynLockStore {
//!         Arc::new(MyStore::connect(&self.url).await.expect("connect"))
//!     }
//!     async fn unreachable_handle(&self) -> DynLockStore {
//!         Arc::new(MyStore::connect("my://127.0.0.1:1").await.expect("lazy connect"))
//!     }
//! }
//!
//! fencelock_conformance::conformance_tests!(async { Arc::new(MyFactory { url: my_test_server_url() }) });
//! ```
//!
//! Each case uses keys under a random prefix, so one server serves concurrent cases.
#![warn(missing_docs)]

pub mod bench;
mod cases;
mod context;
mod factory;
mod macros;
mod memory;
mod probe;
mod runner;

pub use async_trait::async_trait;
pub use cases::CASES;
pub use context::{Ctx, Timing};
pub use factory::StoreFactory;
pub use memory::MemoryFactory;
pub use runner::{
    expect_cases_except, expect_transport_cases, run_all, run_case, run_matching, Case, CaseReport,
    CaseResult, Failure, Outcome, Report, HOLD_CASES, TRANSPORT_CASES,
};
