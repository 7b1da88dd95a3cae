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

/// A page a store's query read in key order, at most `limit` stored keys: the keys (a stored key
/// that is not UTF-8, such as a raw lock id's, names none) and, when the query filled the page,
/// the cursor after its last row, whatever that row held ([`stored_after`] reads it back).
pub fn read_page(stored: Vec<Vec<u8>>, limit: usize) -> (Vec<String>, Option<ListCursor>) {
    let next = stored
        .last()
        .filter(|_| stored.len() == limit)
        .map(|last| ListCursor(hex(last)));
    let names = stored
        .into_iter()
        .filter_map(|key| String::from_utf8(key).ok())
        .collect();
    (names, next)
}

/// The stored key a cursor from [`read_page`] is after (empty for the first page).
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) naming `"from"` for a cursor that is not
/// one of these.
pub fn stored_after(from: Option<&ListCursor>) -> Result<Vec<u8>> {
    let Some(from) = from else {
        return Ok(Vec::new());
    };
    let text = from.position();
    let bad = || crate::Error::invalid("from", "is not a cursor of this store's listing");
    if text.len() % 2 != 0 {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|at| {
            text.get(at..at + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A page of `names`, every name a store has under the prefix in any order: those after
/// `from`, sorted, at most `limit`, and a cursor after the last when more are left.
pub fn page_of(
    names: impl IntoIterator<Item = String>,
    from: Option<&ListCursor>,
    limit: usize,
) -> (Vec<String>, Option<ListCursor>) {
    let mut names: Vec<String> = names
        .into_iter()
        .filter(|name| from.is_none_or(|from| name.as_str() > from.position()))
        .collect();
    names.sort_unstable();
    let more = names.len() > limit;
    names.truncate(limit);
    let next = names
        .last()
        .filter(|_| more)
        .map(|last| ListCursor(last.clone()));
    (names, next)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_page_of_rows_that_are_no_keys_still_continues() {
        // A raw lock id's row holds 8 bytes that need not be UTF-8.
        let raw = vec![0xff, 0, 0, 0, 0, 0, 0, 1];
        let (names, next) = read_page(vec![raw.clone()], 1);
        assert!(names.is_empty());
        assert_eq!(stored_after(next.as_ref()).unwrap(), raw);
        let (names, next) = read_page(vec![b"a".to_vec(), b"b".to_vec()], 3);
        assert_eq!(names, ["a", "b"]);
        assert_eq!(next, None, "a page the query did not fill is the last");
        assert_eq!(stored_after(None).unwrap(), Vec::<u8>::new());
        assert!(stored_after(Some(&ListCursor::new("zz"))).is_err());
    }

    #[test]
    fn a_page_of_names_is_sorted_after_its_cursor() {
        let names = ["c", "a", "d", "b"].map(String::from);
        let (first, next) = page_of(names.clone(), None, 2);
        assert_eq!(first, ["a", "b"]);
        let (second, next) = page_of(names, next.as_ref(), 2);
        assert_eq!(second, ["c", "d"]);
        assert_eq!(next, None);
    }
}
