#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

use fencelock_core::Error;

pub mod pattern;

#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

#[cfg(feature = "file")]
pub use file::FencedFile;
#[cfg(feature = "postgres")]
pub use postgres::{FencedTable, FencedWrite, TableNames};
#[cfg(feature = "redis")]
pub use redis::FencedKey;

/// The error for a step under `token` refused by a resource whose claim is `fence`: the same
/// as [`FenceGate`](fencelock_core::FenceGate)'s ([`Error::fence_refused`]).
#[cfg_attr(
    not(any(feature = "file", feature = "postgres", feature = "redis")),
    allow(dead_code)
)]
fn refused(token: u64, fence: u64) -> Error {
    Error::fence_refused(token, fence)
}
