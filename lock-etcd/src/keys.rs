//! Where a lock lives in etcd's key space.
//!
//! A lock on `key` is a queue directory; each acquisition puts one entry in it on its own etcd
//! lease. The entry with the lowest create revision holds the lock; the others wait in
//! create-revision order. [`Layout::Fencelock`]: the directory `{prefix}{escaped key}/`.
//! [`Layout::Etcd`]: the directory `{prefix}{key}/`. In both, an exclusive entry is
//! `{dir}{lease id in hex}`, as etcd's `concurrency.Mutex` names them (`NewMutex(session, pfx)`
//! puts `fmt.Sprintf("%s%x", pfx + "/", session.Lease())`).
//!
//! Named by lease, not by acquisition: a handle reuses a released lock's etcd lease for its
//! next one, and so the entry's name. etcd keeps every name a range has had in its index until
//! a compaction, and a range read sorted by create revision (every read of a queue) visits
//! each; a name per acquisition would slow a busy key's every read without bound on a cluster
//! that never compacts. Older builds named [`Layout::Fencelock`] entries `{dir}{owner id}`;
//! those are still read ([`entry_owner`], [`crate::handoff`]).
//!
//! The owner id of an acquisition is its entry's lease and create revision ([`owner`]), which
//! no other acquisition of the cluster has, so [`entry_owner`] reads it back from any entry.
//!
//! A holder's label: in [`Layout::Etcd`], its entry's value, as etcd's `concurrency.Election`
//! keeps a leader's value. In [`Layout::Fencelock`] an entry's value is its mode and grant
//! (rewritten by the marks of [`crate::modes`] and [`crate::handoff`], which another client
//! writes), so the label has a key of its own beside the queue, on the entry's lease, named as
//! the entry is: `{prefix}{escaped key}%labels/{lease id in hex}`.

use crate::config::Layout;

/// The queue directory of `key` in `layout`.
pub(crate) fn dir(layout: Layout, prefix: &str, key: &str) -> String {
    match layout {
        Layout::Fencelock => queue_dir(prefix, key),
        Layout::Etcd => mutex_dir(prefix, key),
    }
}

/// The owner id of the acquisition whose entry is on etcd lease `lease_id` and was created at
/// store revision `created`: the lease in the high 64 bits, the revision in the low. A lease
/// carries one entry at a time and revisions only grow, so no two acquisitions share one.
pub(crate) fn owner(lease_id: i64, created: i64) -> fencelock_core::OwnerId {
    // Two's-complement bits: etcd grants neither a negative lease nor a negative revision.
    let (lease, created) = (u128::from(lease_id as u64), u128::from(created as u64));
    fencelock_core::OwnerId::from(lease << 64 | created)
}

/// etcd's `Mutex` directory: the name as given, then `/`. Not escaped, so that it is byte for
/// byte the directory `etcdctl lock {key}` uses; as with etcd's own clients, the queue of `a`
/// then also holds the entries of `a/b` (false contention, never two holders).
pub(crate) fn mutex_dir(prefix: &str, key: &str) -> String {
    format!("{prefix}{key}/")
}

/// The lease id in lower-case hex, as Go's `%x` prints an `int64`.
pub(crate) fn lease_name(lease_id: i64) -> String {
    if lease_id < 0 {
        // etcd never grants a negative id; written as Go would, so both sides still agree.
        format!("-{:x}", lease_id.unsigned_abs())
    } else {
        format!("{lease_id:x}")
    }
}

/// Whether `name` (an entry's name past its directory and mode) is a [`lease_name`]: at most
/// 16 hex digits, after a `-` for a negative id. An owner id (older builds' names) has 32.
pub(crate) fn is_lease_name(name: &str) -> bool {
    let digits = name.strip_prefix('-').unwrap_or(name);
    (1..=16).contains(&digits.len())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The queue directory of `key`. `%` and `/` are escaped (`%25`, `%2F`) so no directory is a
/// prefix of another key's entries: `a` and `a/b` never share a queue.
pub(crate) fn queue_dir(prefix: &str, key: &str) -> String {
    let mut dir = String::with_capacity(prefix.len() + key.len() + 1);
    dir.push_str(prefix);
    for c in key.chars() {
        match c {
            '%' => dir.push_str("%25"),
            '/' => dir.push_str("%2F"),
            c => dir.push(c),
        }
    }
    dir.push('/');
    dir
}

/// Where a listing of the keys that start with `key_prefix` reads: the etcd keys from
/// [`listing_start`] up to (not including) [`range_end`] of it.
pub(crate) fn listing_start(layout: Layout, prefix: &str, key_prefix: &str) -> String {
    let dir = dir(layout, prefix, key_prefix);
    // The directory without its `/`: the queues of every key that starts with `key_prefix`.
    dir.strip_suffix('/').unwrap_or(&dir).to_owned()
}

/// The first key after every key that starts with `start`, as etcd's `WithPrefix` computes
/// it: the last byte below 0xff raised by one, the bytes after it dropped; `\0` (the end of
/// the key space) when every byte is 0xff.
pub(crate) fn range_end(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The key whose queue holds etcd key `name`, if it is a queue entry: in [`Layout::Fencelock`]
/// the escaped name up to the first `/` (a label key's `%labels` directory and the token
/// offset are none); in [`Layout::Etcd`] the name up to its last `/`.
pub(crate) fn key_of_entry(layout: Layout, prefix: &str, name: &[u8]) -> Option<String> {
    let rest = std::str::from_utf8(name.strip_prefix(prefix.as_bytes())?).ok()?;
    match layout {
        Layout::Fencelock => {
            let (escaped, _) = rest.split_once('/')?;
            if escaped.ends_with(LABELS.trim_end_matches('/')) {
                return None;
            }
            // Only `%` and `/` are escaped, so the name decodes exactly.
            fencelock_core::raw::url::percent_decode(escaped)
        }
        Layout::Etcd => rest.rsplit_once('/').map(|(key, _)| key.to_owned()),
    }
}

/// Where the labels of a [`queue_dir`]'s holders are kept: the directory's name without its
/// final `/`, then `%labels/`. No queue directory holds it, nor is it one: in an escaped key
/// every `%` is followed by `25` or `2F`, never by `l`.
const LABELS: &str = "%labels/";

/// The label directory beside queue directory `dir` ([`Layout::Fencelock`]).
pub(crate) fn labels_dir(dir: &str) -> String {
    format!("{}{LABELS}", dir.strip_suffix('/').unwrap_or(dir))
}

/// The key of the label of the acquisition on etcd lease `lease_id` in label directory
/// `labels`.
pub(crate) fn label_key(labels: &str, lease_id: i64) -> String {
    format!("{labels}{}", lease_name(lease_id))
}

/// The name of a label key of `labels`: the [`entry_name`] of the entry it labels.
pub(crate) fn label_name<'k>(labels: &str, key: &'k [u8]) -> Option<&'k str> {
    std::str::from_utf8(key.strip_prefix(labels.as_bytes())?).ok()
}

/// A stored label as `status` reports it: a value that is not UTF-8 (put by another client)
/// has each invalid sequence replaced by U+FFFD; the empty value is no label.
pub(crate) fn label_text(value: &[u8]) -> Option<String> {
    (!value.is_empty()).then(|| String::from_utf8_lossy(value).into_owned())
}

/// Where readers' entries are named in a queue directory: `{dir}~r/{lease id in hex}`. Lease
/// ids (and older builds' owner ids) are hexadecimal, so every other entry of the directory
/// (exclusive `{dir}{lease id}`, permits `{dir}~p/{lease id}`) sorts before `{dir}~r/`: a
/// reader reads the range `[dir, dir~r/)` for the writers older than itself, as etcd's
/// `RWMutex` recipe reads its `write` keys.
const SHARED_NAMES: &str = "~r/";
/// Where permits' entries are named: `{dir}~p/{lease id in hex}` (inside the writers' range).
const PERMIT_NAMES: &str = "~p/";

/// The queue entry of one acquisition in `mode` on etcd lease `lease_id` (only
/// [`Layout::Fencelock`] keeps modes other than exclusive).
pub(crate) fn entry(dir: &str, lease_id: i64, mode: fencelock_core::Mode) -> String {
    let names = match mode {
        fencelock_core::Mode::Shared => SHARED_NAMES,
        fencelock_core::Mode::Permit { .. } => PERMIT_NAMES,
        _ => "",
    };
    format!("{dir}{names}{}", lease_name(lease_id))
}

/// The readers' part of `dir`: `[start, end)`, every entry in it a reader's.
pub(crate) fn shared_range(dir: &str) -> (String, String) {
    (format!("{dir}{SHARED_NAMES}"), format!("{dir}~r0"))
}

/// The end of the writers' part of `dir`, `[dir, end)`: every entry that is not a reader's.
pub(crate) fn not_shared_end(dir: &str) -> String {
    format!("{dir}{SHARED_NAMES}")
}

/// The name of an entry of `dir` past its directory and its mode's names: a lease id in hex,
/// or an older build's owner id. Its label key has the same name ([`label_key`]).
pub(crate) fn entry_name<'k>(dir: &str, entry: &'k [u8]) -> Option<&'k str> {
    let rest = entry.strip_prefix(dir.as_bytes())?;
    let rest = rest
        .strip_prefix(SHARED_NAMES.as_bytes())
        .or_else(|| rest.strip_prefix(PERMIT_NAMES.as_bytes()))
        .unwrap_or(rest);
    std::str::from_utf8(rest).ok()
}

/// The owner id of the acquisition that put `entry`, a key of `dir` on etcd lease `lease_id`
/// created at revision `created` ([`Layout::Fencelock`]): [`owner`] of the two if the entry
/// is named by that lease, the owner id in its name if an older build put it; `None` for any
/// other key.
pub(crate) fn entry_owner(
    dir: &str,
    entry: &[u8],
    lease_id: i64,
    created: i64,
) -> Option<fencelock_core::OwnerId> {
    let name = entry_name(dir, entry)?;
    if name == lease_name(lease_id) {
        return Some(owner(lease_id, created));
    }
    fencelock_core::OwnerId::parse(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::{Mode, OwnerId};

    /// An older build's name for an exclusive entry: `{dir}{owner id}`.
    fn older(dir: &str, owner: OwnerId) -> String {
        format!("{dir}{owner}")
    }

    #[test]
    fn no_queue_is_a_prefix_of_another_keys_entries() {
        let keys = ["a", "a/b", "a%2Fb", "a/", "", "/", "%", "a%", "ключ/🔒"];
        for a in keys {
            for b in keys {
                if a == b {
                    continue;
                }
                let dir = queue_dir("p/", b);
                for entry in [
                    entry(&dir, 7, Mode::Exclusive),
                    older(&dir, OwnerId::from(7)),
                ] {
                    assert!(
                        !entry.starts_with(&queue_dir("p/", a)),
                        "the queue of {a:?} would contain the entries of {b:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn no_label_key_is_in_a_queue_or_the_offset() {
        let keys = [
            "a",
            "a/b",
            "a%2Fb",
            "a%labels",
            "a%",
            "%",
            "",
            "/",
            "~offset",
            "ключ/🔒",
        ];
        for a in keys {
            let dir = queue_dir("p/", a);
            let labels = labels_dir(&dir);
            let label = label_key(&labels, 0x694d_77aa_9e3b_1d5c);
            // Named as the entry it labels.
            let entry = entry(&dir, 0x694d_77aa_9e3b_1d5c, Mode::Exclusive);
            assert_eq!(
                label_name(&labels, label.as_bytes()),
                entry_name(&dir, entry.as_bytes())
            );
            assert_ne!(label, crate::offset::key("p/"));
            for b in keys {
                assert!(
                    !label.starts_with(&queue_dir("p/", b)),
                    "the queue of {b:?} would contain the labels of {a:?}"
                );
                if a != b {
                    assert!(!label.starts_with(&labels_dir(&queue_dir("p/", b))));
                }
            }
        }
        assert_eq!(labels_dir(&queue_dir("p/", "jobs")), "p/jobs%labels/");
        assert_eq!(label_text(b""), None);
        assert_eq!(label_text(b"host-a").as_deref(), Some("host-a"));
        assert_eq!(label_text(b"a\xffb").as_deref(), Some("a\u{fffd}b"));
    }

    #[test]
    fn entries_are_named_as_etcds_mutex_names_them() {
        // `etcdctl lock jobs/nightly` on lease 0x694d77aa9e3b1d5c puts this key.
        let dir = dir(Layout::Etcd, "", "jobs/nightly");
        assert_eq!(dir, "jobs/nightly/");
        assert_eq!(
            entry(&dir, 0x694d_77aa_9e3b_1d5c, Mode::Exclusive),
            "jobs/nightly/694d77aa9e3b1d5c"
        );
        // The same name in a queue of this crate's layout, so a reused lease reuses it.
        let ours = queue_dir("fencelock/", "jobs/nightly");
        assert_eq!(
            entry(&ours, 0x694d_77aa_9e3b_1d5c, Mode::Exclusive),
            "fencelock/jobs%2Fnightly/694d77aa9e3b1d5c"
        );
        assert_eq!(entry("k/", 10, Mode::Exclusive), "k/a");
        assert_eq!(entry("k/", -10, Mode::Exclusive), "k/-a");
        assert_eq!(mutex_dir("locks/", "a%/b"), "locks/a%/b/");
        for lease in [1, 10, -10, i64::MAX, i64::MIN] {
            assert!(is_lease_name(&lease_name(lease)), "{lease}");
        }
        for name in [
            "",
            "-",
            "A",
            "+a",
            "0123456789abcdef0",
            &OwnerId::from(7).to_string(),
        ] {
            assert!(!is_lease_name(name), "{name:?}");
        }
    }

    #[test]
    fn the_owner_comes_back_from_the_entry() {
        let dir = queue_dir("fencelock/", "nul\u{0}inside");
        let (lease, created) = (0x694d_77aa_9e3b_1d5c, 41);
        let ours = owner(lease, created);
        for mode in [Mode::Exclusive, Mode::Shared, Mode::permits(3)] {
            let entry = entry(&dir, lease, mode);
            assert_eq!(
                entry_owner(&dir, entry.as_bytes(), lease, created),
                Some(ours)
            );
            // Another acquisition on the same lease, later: another owner.
            let next = entry_owner(&dir, entry.as_bytes(), lease, created + 5);
            assert!(next.is_some() && next != Some(ours), "{mode}");
            // A name of this lease on another lease was put by someone else.
            assert_eq!(
                entry_owner(&dir, entry.as_bytes(), lease + 1, created),
                None
            );
        }
        // An older build's entry names its owner.
        let theirs = OwnerId::random();
        let entry = older(&dir, theirs);
        assert_eq!(
            entry_owner(&dir, entry.as_bytes(), lease, created),
            Some(theirs)
        );
        assert_eq!(entry_owner(&dir, b"elsewhere", lease, created), None);
        // Owners of two leases, or two revisions, differ.
        assert_ne!(owner(1, 2), owner(2, 1));
        assert_ne!(owner(1, 2), owner(1, 3));
    }

    #[test]
    fn readers_are_named_apart_from_every_other_entry() {
        let dir = queue_dir("fencelock/", "k");
        let (start, end) = shared_range(&dir);
        let writers_end = not_shared_end(&dir);
        for lease in [1, 0xf, i64::MAX, -1] {
            let reader = entry(&dir, lease, Mode::Shared);
            assert!(reader >= start && reader < end, "{reader}");
            for other in [
                entry(&dir, lease, Mode::permits(2)),
                entry(&dir, lease, Mode::Exclusive),
            ] {
                assert!(other >= dir && other < writers_end, "{other}");
            }
        }
        for owner in [OwnerId::from(0), OwnerId::from(u128::MAX)] {
            let other = older(&dir, owner);
            assert!(other >= dir && other < writers_end, "{other}");
        }
    }
}
