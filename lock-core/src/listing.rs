//! Which keys are held: a page of the held keys under a prefix, each with its holders, as
//! [`LockStore::list`](crate::LockStore::list) reports them.

use crate::{KeyStatus, LockStore, Result};

/// The most keys one page of a listing may ask for.
pub const MAX_LIST_LIMIT: usize = 1000;

/// One held key of a listing: its name and its status (mode, holders, tokens, labels, time
/// left), never [`KeyStatus::Free`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldKey {
    /// The key.
    pub key: String,
    /// Its holders, as [`LockStore::status`] reports them.
    pub status: KeyStatus,
}

/// Where a listing continues: give it to the next [`LockStore::list`] call of the same prefix.
/// Opaque: its text means something to the store that made it only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor(String);

impl ListCursor {
    /// A cursor at a store's own position (for store implementations).
    pub fn new(position: impl Into<String>) -> Self {
        ListCursor(position.into())
    }

    /// The store's position (for store implementations).
    pub fn position(&self) -> &str {
        &self.0
    }
}

/// A page of a listing: the held keys it found, sorted, and where the next page starts (`None`
/// once the store has no more). A page may hold fewer keys than asked, none even, and still
/// have a next one: the store read that many names, and some were free.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Listing {
    /// The held keys, sorted by their bytes.
    pub keys: Vec<HeldKey>,
    /// The next page's cursor, if there is one.
    pub next: Option<ListCursor>,
}

/// What every store's listing does after its own query: reads the status of each of `names`
/// (the keys its query found under the prefix, held or perhaps no longer), keeps the held
/// ones, sorted, and hands on the store's `next` position. A key released or expired between
/// the query and its status read is left out.
///
/// # Errors
/// The first status read's error, as it is.
///
/// # Cancel safety
/// Read-only; dropping the future loses nothing.
pub async fn held_among<S: LockStore + ?Sized>(
    store: &S,
    mut names: Vec<String>,
    next: Option<ListCursor>,
) -> Result<Listing> {
    names.sort_unstable();
    names.dedup();
    let mut keys = Vec::with_capacity(names.len());
    for key in names {
        match store.status(&key).await? {
            KeyStatus::Free => {}
            status => keys.push(HeldKey { key, status }),
        }
    }
    Ok(Listing { keys, next })
}
