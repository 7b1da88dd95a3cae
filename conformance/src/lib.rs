#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod cases;
mod context;
mod factory;
mod macros;
mod memory;
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
