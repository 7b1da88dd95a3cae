#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod connect;
pub mod faults;
mod stores;

pub use connect::connect;
pub use fencelock_core::*;
pub use stores::{known_schemes, redact, store_for, KnownStore, KNOWN_STORES, STORES};
// Each store crate, re-exported by its line in the facade's one list (stores.rs); a build
// with no store feature re-exports none.
#[allow(unused_imports, unreachable_pub)]
pub use stores::*;

/// The resource side: a PostgreSQL row, a Redis key or a local file that refuses a superseded
/// holder's writes (the `fencelock-fence` crate), one feature each: `fence-postgres`,
/// `fence-redis`, `fence-file`.
#[cfg(any(
    feature = "fence-file",
    feature = "fence-postgres",
    feature = "fence-redis"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "fence-file",
        feature = "fence-postgres",
        feature = "fence-redis"
    )))
)]
pub use fencelock_fence as fence;

/// The workspace's pages, whose Rust blocks compile (and run, unless marked otherwise) as
/// doctests of this crate, so no page shows code that does not build. They use every store and
/// resource, so they are compiled with all of them (`--all-features`, as `scripts/test.sh`).
#[cfg(all(
    doctest,
    feature = "full",
    feature = "fence-file",
    feature = "fence-postgres",
    feature = "fence-redis"
))]
mod pages {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../CONTRIBUTING.md")]
    struct Contributing;
    #[doc = include_str!("../../lockctl/README.md")]
    struct Lockctl;
    #[doc = include_str!("../../nemesis/README.md")]
    struct Nemesis;
    #[doc = include_str!("../../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../../docs/election.md")]
    struct Election;
    #[doc = include_str!("../../docs/fencing.md")]
    struct Fencing;
    #[doc = include_str!("../../docs/interop.md")]
    struct Interop;
    #[doc = include_str!("../../docs/metrics.md")]
    struct Metrics;
    #[doc = include_str!("../../docs/modes.md")]
    struct Modes;
    #[doc = include_str!("../../docs/security.md")]
    struct Security;
    #[doc = include_str!("../../docs/stores.md")]
    struct Stores;
    #[doc = include_str!("../../docs/swaps.md")]
    struct Swaps;
}
