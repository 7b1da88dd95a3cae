//! What only a store does with a [`Lease`]: build it, confirm an extend, revoke it, and read
//! back the state it keeps in it.

use std::any::Any;
use std::time::Duration;

use crate::raw::Revocation;
use crate::{Instant, Mode, OwnerId};

/// A store's side of a [`Lease`](crate::Lease). Implemented for `Lease` only; bring it into scope
/// (`use fencelock_core::raw::LeaseExt`) to build leases with `Lease::new` and move their
/// deadlines with `lease.confirm(sent_at)`. Applications never need it: a lease they hold
/// changes only through its store.
///
/// ```compile_fail
/// # use fencelock_core::{Instant, Lease, OwnerId};
/// // Without the store author's trait in scope, nobody builds a lease…
/// let lease = Lease::new("k", OwnerId::random(), 1, std::time::Duration::from_secs(1), Instant::now());
/// ```
///
/// ```compile_fail
/// # async fn f(guard: fencelock_core::LockGuard) {
/// // …nor moves its deadline…
/// guard.lease().confirm(fencelock_core::Instant::now());
/// # }
/// ```
///
/// ```compile_fail
/// # fn f(lease: fencelock_core::Lease) {
/// // …nor revokes it.
/// lease.revocation().revoke("not mine to say");
/// # }
/// ```
pub trait LeaseExt: Sized + crate::lease::Sealed {
    /// A lease granted by a request sent at `sent_at`: its local deadline is
    /// `sent_at + ttl - drift(ttl)`.
    fn new(key: &str, owner: OwnerId, token: u64, ttl: Duration, sent_at: Instant) -> Self;

    /// Like [`LeaseExt::new`], carrying store-specific state (a held session, a lease id) that
    /// the store gets back with [`LeaseExt::store_state`]. The state is dropped with the last
    /// clone.
    fn with_store_state<T: Any + Send + Sync>(
        key: &str,
        owner: OwnerId,
        token: u64,
        ttl: Duration,
        sent_at: Instant,
        state: T,
    ) -> Self;

    /// Marks a lease just built as held in `mode`, with its permit `slot` (`Some` exactly for
    /// [`Mode::Permit`]). Call it before the lease is cloned (a clone keeps the lease as it
    /// was, and a debug build panics).
    #[must_use]
    fn in_mode(self, mode: Mode, slot: Option<u32>) -> Self;

    /// Records a confirmation by the store of a request sent at `sent_at`: the deadline moves
    /// to `sent_at + ttl - drift`, never backwards. What `extend` does once the store answered.
    fn confirm(&self, sent_at: Instant);

    /// The lease's revocation: the store calls [`Revocation::revoke`] when it learns by its own
    /// means that the lease is gone, before any extend would tell (PostgreSQL: the server ended
    /// the lease's session). A [`KeepAlive`](crate::KeepAlive) fires its lost signal as soon
    /// as that happens, with the store's reason.
    ///
    /// Keep the returned handle (never a clone of the lease, which may own a session) in
    /// whatever watches the store. Revoking releases nothing.
    fn revocation(&self) -> Revocation;

    /// The store-specific state given to [`LeaseExt::with_store_state`], if it has type `T`.
    fn store_state<T: Any + Send + Sync>(&self) -> Option<&T>;
}
