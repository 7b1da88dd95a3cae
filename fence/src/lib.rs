//! Resource-side fencing for fencelock: the protected resource refuses a holder whose lease
//! was superseded, even when that holder still believes it holds the lock.
//!
//! A lock cannot stop a paused process (GC, swap, a stopped VM) from waking after its lease
//! ended and writing. The resource must check the lease's fencing token, and the check must
//! cover the whole critical section, not just the final write. Checking only at the write
//! (`UPDATE … WHERE fence < $token`) loses updates in a read-modify-write:
//!
//! 1. the new holder B takes the lock and reads;
//! 2. the stale holder A wakes and writes: the resource has not seen B's token yet, so the
//!    write is accepted;
//! 3. B writes a value computed from before A's write, and A's update is gone.
//!
//! There are two safe shapes:
//!
//! - **One step**: the new value does not depend on an earlier read by the holder (the
//!   database computes it, `SET value = value + 1`, or it is simply set). Check and write in
//!   one atomic step that admits a token *at least* the highest seen and records it.
//! - **Claim, then write**: the holder *claims* the resource with its token when it reads
//!   (every lower token is refused from then on), and writes only while the resource still
//!   carries that token. A stale holder's write in the window above is then refused. Inside
//!   one database transaction, `SELECT … FOR UPDATE` with the token check is the other
//!   correct form.
//!
//! Tokens are unique per lease, so admitting an equal token lets the current holder claim and
//! write as often as it likes, while every superseded holder is refused.
//!
//! # Resources (one cargo feature each, so only the client you use is compiled)
//!
//! | feature | type | one step | claim, then write |
//! | --- | --- | --- | --- |
//! | `postgres` | `FencedTable`: a row, through sqlx | `upsert` (the fenced insert) | `claim`, `write` |
//! | `redis` | `FencedKey`: a key and its fence key, one Lua script per step | `set` | `claim`, `write` |
//! | `file` | `FencedFile`: a file replaced atomically, its token beside it, under `flock` | `replace` | `claim`, `write` |
//!
//! In one process, [`fencelock_core::FenceGate`] is the same check (`claim`, `write`, and `update`
//! for one step). [`pattern`] holds the plain
//! SQL of the fencing pattern (docs/fencing.md), which the tests run as written.
//!
//! # Refusals
//!
//! A refused step returns [`Error::StaleToken`] `{ token, highest }` when the resource carries
//! a greater token: the lease was superseded, so stop. A write whose token is *greater* than
//! the resource's claim never claimed it (a bug in the caller, not a race) and is refused as
//! [`Error::InvalidInput`] with `what = "fencing token"`. Nothing is written on a refusal.
#![warn(missing_docs)]

use fencelock_core::Error;

pub mod pattern;

#[cfg(feature = "file")]
pub mod file;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
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
