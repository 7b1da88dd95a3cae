//! The resource-side half of fencing.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// A resource-side fence: accepts a fencing token only if it is greater than every token it
/// accepted before, so a writer whose lease was superseded is refused even if it still believes
/// it holds the lock.
///
/// This is the in-process form. In a database keep the highest token next to the data and make
/// the check part of the write itself:
///
/// ```sql
/// UPDATE accounts
///    SET balance = $balance, fence = $token
///  WHERE id = $id AND fence < $token;
/// -- 0 rows updated: the token is stale, the write is refused.
/// ```
///
/// Tokens from different keys, or from different stores, must not share a gate.
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicU64,
}

impl FenceGate {
    /// A gate that has accepted nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `token` if it is greater than every token accepted so far; otherwise
    /// [`Error::StaleToken`].
    pub fn admit(&self, token: u64) -> Result<()> {
        self.highest
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |highest| {
                (token > highest).then_some(token)
            })
            .map(|_| ())
            .map_err(|highest| Error::StaleToken { token, highest })
    }

    /// The highest token accepted so far (0 if none).
    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_greater_tokens_are_admitted() {
        let gate = FenceGate::new();
        assert!(gate.admit(5).is_ok());
        assert!(matches!(
            gate.admit(5),
            Err(Error::StaleToken {
                token: 5,
                highest: 5
            })
        ));
        assert!(gate.admit(4).is_err());
        assert!(gate.admit(6).is_ok());
        assert_eq!(gate.highest(), 6);
    }
}
