//! The bounds every store keeps: a request outside them is refused with
//! [`Error::InvalidInput`](crate::Error::InvalidInput) before any store is asked. A store may
//! narrow the TTL bounds ([`Capabilities`](crate::Capabilities)).

use std::time::Duration;

/// The longest key, in bytes of UTF-8. A key is 1 to this many bytes; any character is allowed,
/// and stores treat keys as data, never as code.
pub const MAX_KEY_LEN: usize = 1024;
/// The shortest TTL any store accepts; a store may ask for more.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The longest TTL any store accepts: one day. Longer work keeps a shorter lease alive instead.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest a waiting acquire may wait: one day.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);
/// The most permits a semaphore may have: a store keeps one entry per permit, so the limit
/// bounds the work of every operation on the key.
pub const MAX_PERMITS: u32 = 1024;
/// The longest holder label ([`LockRequest::label`](crate::LockRequest::label)), in bytes of
/// UTF-8: room for a host, a process id and an address, and small enough for every store to
/// keep beside its holder.
pub const MAX_LABEL_LEN: usize = 256;
