//! The resource-side half of fencing.

use std::sync::{Mutex, PoisonError};

use crate::{Error, Result};

/// A resource-side fence for a resource in this process: it remembers the highest fencing token
/// that claimed the resource and refuses every lower one, so a writer whose lease was superseded
/// is refused even if it still believes it holds the lock.
///
/// A check made only at the write is not enough for a read-modify-write. A stale holder that
/// read, paused, and wrote *before* the new holder's first write would be accepted, and the new
/// holder would then write a value computed from before it: a lost update. So the gate has the
/// shape of the critical section:
///
/// 1. [`FenceGate::claim`] when the holder starts (before it reads). From then on every lower
///    token is refused, so a stale holder cannot write between this holder's read and write.
/// 2. [`FenceGate::write`] to apply a write, which runs only while this token is still the
///    latest claim, under the gate's lock, so no newer claim can interleave with it.
///
/// A write that does not depend on an earlier read (set a value, append a record) can use
/// [`FenceGate::update`], which claims and writes in one step.
///
/// Tokens are unique per lease, so a holder may claim and write as often as it likes; only
/// lower tokens are refused. In a database the same two steps are a claiming read
/// (`UPDATE … SET fence = $token WHERE id = $id AND fence <= $token RETURNING value`) and a
/// write that checks the claim (`UPDATE … SET value = $new WHERE id = $id AND fence = $token`);
/// see the fencing pattern (docs/fencing.md) and the `fencelock-fence` crate.
///
/// Tokens from different keys, or from different stores, must not share a gate.
///
/// ```
/// use fencelock_core::{Error, FenceGate};
///
/// let gate = FenceGate::new();
/// let mut balance = 100;
///
/// gate.claim(7)?;                          // holder 7 starts and reads
/// let read = balance;
/// assert!(gate.write(6, || balance = 0).is_err()); // a superseded holder is refused
/// gate.write(7, || balance = read + 1)?;   // holder 7's write lands
/// gate.write(7, || balance += 1)?;         // and so does its second one
/// assert_eq!(balance, 102);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: Mutex<u64>,
}

impl FenceGate {
    /// A gate that nothing has claimed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims the resource for `token`: accepted if `token` is at least the highest token
    /// claimed so far (the current holder may claim again), which then becomes the highest;
    /// otherwise [`Error::StaleToken`]. Call it before reading what a later write depends on.
    ///
    /// # Errors
    /// [`StaleToken`](crate::ErrorKind::StaleToken) when a greater token claimed already.
    pub fn claim(&self, token: u64) -> Result<()> {
        let mut highest = self.lock();
        if token < *highest {
            return Err(Error::StaleToken {
                token,
                highest: *highest,
            });
        }
        *highest = token;
        Ok(())
    }

    /// Runs `write` if `token` is still the latest claim, holding the gate's lock while it runs
    /// so that no newer claim can interleave; otherwise `write` is not run and the call returns
    /// [`Error::StaleToken`] if a newer token claimed, or [`Error::InvalidInput`] for a greater
    /// token that never claimed (call [`FenceGate::claim`] first), as every resource of the
    /// `fencelock-fence` crate does ([`Error::fence_refused`]).
    ///
    /// `write` must not call back into the same gate (it would deadlock).
    ///
    /// # Errors
    /// [`StaleToken`](crate::ErrorKind::StaleToken) when a greater token claimed since;
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a token greater than the latest
    /// claim (it never claimed).
    pub fn write<R>(&self, token: u64, write: impl FnOnce() -> R) -> Result<R> {
        let highest = self.lock();
        if token != *highest {
            return Err(Error::fence_refused(token, *highest));
        }
        Ok(write())
    }

    /// Claims and writes in one step: runs `write` under the gate's lock if `token` is at least
    /// the highest claim, which it then becomes; otherwise [`Error::StaleToken`]. For writes
    /// that do not depend on an earlier read.
    ///
    /// # Errors
    /// [`StaleToken`](crate::ErrorKind::StaleToken) when a greater token claimed already.
    pub fn update<R>(&self, token: u64, write: impl FnOnce() -> R) -> Result<R> {
        let mut highest = self.lock();
        if token < *highest {
            return Err(Error::StaleToken {
                token,
                highest: *highest,
            });
        }
        *highest = token;
        Ok(write())
    }

    /// The highest token claimed so far (0 if none).
    pub fn highest(&self) -> u64 {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        // The guarded value is a plain number, consistent even if a writer panicked.
        self.highest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_holder_may_claim_and_write_again() {
        let gate = FenceGate::new();
        gate.claim(5).unwrap();
        gate.claim(5).unwrap();
        assert_eq!(gate.write(5, || 1).unwrap(), 1);
        assert_eq!(gate.write(5, || 2).unwrap(), 2);
        gate.update(5, || ()).unwrap();
        assert_eq!(gate.highest(), 5);
    }

    #[test]
    fn lower_tokens_are_refused_with_the_highest_named() {
        let gate = FenceGate::new();
        gate.claim(5).unwrap();
        assert!(matches!(
            gate.claim(4),
            Err(Error::StaleToken {
                token: 4,
                highest: 5
            })
        ));
        assert!(gate.update(4, || ()).is_err());
        let mut ran = false;
        assert!(gate.write(4, || ran = true).is_err());
        assert!(!ran, "a refused write must not run");
        gate.claim(6).unwrap();
        assert_eq!(gate.highest(), 6);
    }

    #[test]
    fn a_write_is_refused_once_a_newer_holder_has_claimed() {
        let gate = FenceGate::new();
        gate.claim(5).unwrap();
        gate.claim(6).unwrap();
        assert!(matches!(
            gate.write(5, || ()),
            Err(Error::StaleToken {
                token: 5,
                highest: 6
            })
        ));
    }

    #[test]
    fn a_write_without_a_claim_is_refused_as_invalid_input() {
        let gate = FenceGate::new();
        gate.claim(3).unwrap();
        let mut ran = false;
        let error = gate.write(9, || ran = true).unwrap_err();
        assert!(
            matches!(
                error,
                Error::InvalidInput {
                    what: "fencing token",
                    ..
                }
            ),
            "the same refusal as the fence crate's resources: {error:?}"
        );
        assert!(!ran);
    }
}
