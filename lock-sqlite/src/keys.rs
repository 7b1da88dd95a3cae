//! How a key and a lease's identity are stored.
//!
//! A key is stored as the bytes of its UTF-8, a BLOB compared byte for byte, so keys that
//! differ anywhere in their 1,024 bytes are distinct rows and no character is special. The
//! owner id is its 32-hex-digit form ([`OwnerId`]'s `Display`), tokens are SQLite integers.

use fencelock_core::{Error, OwnerId, Result};

/// The key as stored.
pub(crate) fn stored_key(key: &str) -> &[u8] {
    key.as_bytes()
}

/// The owner as stored.
pub(crate) fn stored_owner(owner: OwnerId) -> String {
    owner.to_string()
}

/// A token read from the table: positive by construction, checked all the same since the
/// file may have been written by something else.
pub(crate) fn token_from_row(token: i64) -> Result<u64> {
    u64::try_from(token)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| Error::Store {
            message: format!("the lock table holds the token {token}, which is not positive"),
            source: None,
        })
}

/// A token as bound to a statement; a token above `i64::MAX` cannot be one of ours.
pub(crate) fn token_to_row(token: u64) -> Result<i64> {
    i64::try_from(token).map_err(|_| {
        Error::invalid(
            "lease",
            format!("token {token} was not minted by a SQLite store"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_outside_the_stored_range_are_refused() {
        assert_eq!(token_from_row(7).unwrap(), 7);
        assert!(token_from_row(0).is_err());
        assert!(token_from_row(-1).is_err());
        assert_eq!(token_to_row(7).unwrap(), 7);
        assert!(token_to_row(u64::MAX).is_err());
    }
}
