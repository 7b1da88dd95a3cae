//! Handing an exclusive lock to the next waiter inside the release transaction
//! ([`Layout::Fencelock`](crate::Layout::Fencelock) only).
//!
//! A holder that knows its **successor** (the oldest entry newer than its own, as a read at
//! one revision listed it) releases with one transaction that deletes its own entry and, if
//! the successor's entry still exists with the create revision and the lease that read saw,
//! rewrites the successor's value to a *handoff mark* on that same lease. The waiter watches
//! its own entry next to its predecessor; the mark's put event, on that one watch, is its
//! grant, without another read. See the crate docs (*Handoff*) for why that is the oldest live
//! entry and why a waiter whose entry or lease vanished never receives one.
//!
//! The mark also carries the successors after the marked one, from the same read, so the new
//! holder can hand off in turn: each hop uses one, and a grant after a read lists them afresh.

use etcd_client::KeyValue;

/// How many successors a read lists (and a mark passes on, less the one it marks).
pub(crate) const MAX_SUCCESSORS: i64 = 8;

/// The first word of a handoff mark. Any other value of an exclusive entry is no mark.
const MARK: &str = "handoff";

/// An exclusive entry newer than a holder's, as one read listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Successor {
    /// The entry's name in its queue directory: its lease id in hex (an older build's entry:
    /// its owner id).
    pub(crate) name: String,
    /// Its create revision when read.
    pub(crate) created: i64,
    /// The etcd lease it was on.
    pub(crate) lease_id: i64,
}

impl Successor {
    /// The entry's key in `dir`.
    pub(crate) fn key(&self, dir: &str) -> String {
        format!("{dir}{}", self.name)
    }
}

/// Whether `name` (an entry's key past its directory) is an exclusive entry's: a lease id in
/// hex, or an older build's owner id (32 hexadecimal digits). Readers' and permits' entries
/// (`~r/…`, `~p/…`) are not. (An older build sees no exclusive entry in a lease-named one:
/// its release then hands off to none, and its waiter reads after a deletion, both safe.)
fn exclusive_name(name: &str) -> bool {
    crate::keys::is_lease_name(name)
        || (name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The name of `key` in queue directory `dir` if it is an exclusive entry's (not a reader's
/// or a permit's).
fn exclusive_entry_name<'k>(dir: &str, key: &'k [u8]) -> Option<&'k str> {
    let name = std::str::from_utf8(key.strip_prefix(dir.as_bytes())?).ok()?;
    exclusive_name(name).then_some(name)
}

/// Whether `key` is an exclusive entry of queue directory `dir` (not a reader's or a
/// permit's).
pub(crate) fn is_exclusive_entry(dir: &str, key: &[u8]) -> bool {
    exclusive_entry_name(dir, key).is_some()
}

/// The successors of a holder from the entries of `dir` newer than its own, oldest first, as
/// one read returned them: the leading run of exclusive entries (a reader or a permit next in
/// line is granted its own way, by its own mark, never by a handoff).
pub(crate) fn successors(dir: &str, newer: &[KeyValue]) -> Vec<Successor> {
    newer
        .iter()
        .map_while(|kv| {
            exclusive_entry_name(dir, kv.key()).map(|name| Successor {
                name: name.to_owned(),
                created: kv.create_revision(),
                lease_id: kv.lease(),
            })
        })
        .collect()
}

/// The mark written into the entry a release hands the lock to, carrying the successors after
/// it: `handoff {name}/{create revision}/{lease id} …`.
pub(crate) fn mark(after: &[Successor]) -> String {
    let mut value = String::from(MARK);
    for next in after {
        value.push_str(&format!(
            " {}/{}/{}",
            next.name, next.created, next.lease_id
        ));
    }
    value
}

/// The successors a handoff mark carries; `None` if `value` is no mark. A malformed list
/// item ends the list (the holder then releases without handing off, which is always safe).
pub(crate) fn parse_mark(value: &[u8]) -> Option<Vec<Successor>> {
    let value = std::str::from_utf8(value).ok()?;
    let mut words = value.split(' ');
    if words.next() != Some(MARK) {
        return None;
    }
    Some(
        words
            .map_while(|item| {
                let mut parts = item.split('/');
                let name = parts.next().filter(|name| exclusive_name(name))?;
                let created = parts.next()?.parse().ok()?;
                let lease_id = parts.next()?.parse().ok()?;
                parts.next().is_none().then(|| Successor {
                    name: name.to_owned(),
                    created,
                    lease_id,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::EntryMode;
    use fencelock_core::Mode;

    fn successor(lease_id: i64, created: i64) -> Successor {
        Successor {
            name: crate::keys::lease_name(lease_id),
            created,
            lease_id,
        }
    }

    /// An older build's entry, named by its owner id.
    fn older(n: u128, created: i64, lease_id: i64) -> Successor {
        Successor {
            name: fencelock_core::OwnerId::from(n).to_string(),
            created,
            lease_id,
        }
    }

    #[test]
    fn a_mark_carries_the_successors_after_it() {
        let after = vec![
            successor(77, 10),
            older(1, 11, 78),
            older(u128::MAX, 12, -5),
            successor(-5, 13),
        ];
        let value = mark(&after);
        assert_eq!(parse_mark(value.as_bytes()), Some(after));
        assert_eq!(parse_mark(b"handoff"), Some(vec![]));
        // A mark is an exclusive entry to everyone reading modes.
        assert_eq!(EntryMode::parse(value.as_bytes()), EntryMode::Exclusive);
    }

    #[test]
    fn only_a_mark_is_a_mark() {
        for value in [
            &b""[..],
            b"shared",
            b"shared waiting",
            b"permit 3 waiting",
            b"permit 3 slot 1",
            b"handoffs",
            b"\xff",
        ] {
            assert_eq!(parse_mark(value), None, "{value:?}");
        }
        // A malformed item ends the list there.
        let good = successor(5, 4);
        let value = format!(
            "{} ~r/{} {}/x/1",
            mark(std::slice::from_ref(&good)),
            good.name,
            good.name
        );
        assert_eq!(parse_mark(value.as_bytes()), Some(vec![good]));
    }

    #[test]
    fn only_a_lease_or_owner_named_entry_is_exclusive() {
        let dir = crate::keys::queue_dir("fencelock/", "k");
        let exclusive = crate::keys::entry(&dir, 0x694d_77aa_9e3b_1d5c, Mode::Exclusive);
        let older = format!("{dir}{}", fencelock_core::OwnerId::from(9));
        for entry in [&exclusive, &older] {
            assert!(is_exclusive_entry(&dir, entry.as_bytes()), "{entry}");
            assert!(!is_exclusive_entry("fencelock/other/", entry.as_bytes()));
        }
        for mode in [Mode::Shared, Mode::permits(2)] {
            let entry = crate::keys::entry(&dir, 0x694d_77aa_9e3b_1d5c, mode);
            assert!(!is_exclusive_entry(&dir, entry.as_bytes()), "{entry}");
        }
        for names in ["~r/", "~p/"] {
            let older = format!("{dir}{names}{}", fencelock_core::OwnerId::from(9));
            assert!(!is_exclusive_entry(&dir, older.as_bytes()), "{older}");
        }
    }

    #[test]
    fn readers_and_permits_are_no_successors() {
        let dir = crate::keys::queue_dir("fencelock/", "k");
        assert!(exclusive_name(&crate::keys::lease_name(9)));
        for mode in [Mode::Shared, Mode::permits(2)] {
            let entry = crate::keys::entry(&dir, 9, mode);
            assert!(!exclusive_name(&entry[dir.len()..]), "{entry}");
        }
    }
}
