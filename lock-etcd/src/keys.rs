//! Where a lock lives in etcd's key space.
//!
//! A lock on `key` is a queue directory; each acquisition puts one entry in it on its own etcd
//! lease. The entry with the lowest create revision holds the lock; the others wait in
//! create-revision order. [`Layout::Fencelock`]: the directory `{prefix}{escaped key}/`, the
//! entry `{dir}{owner id}`. [`Layout::Etcd`]: the directory `{prefix}{key}/`, the entry
//! `{dir}{lease id in hex}`, as etcd's `concurrency.Mutex` names them (`NewMutex(session, pfx)`
//! puts `fmt.Sprintf("%s%x", pfx + "/", session.Lease())`).
//!
//! A holder's label: in [`Layout::Etcd`], its entry's value, as etcd's `concurrency.Election`
//! keeps a leader's value. In [`Layout::Fencelock`] an entry's value is its mode and grant
//! (rewritten by the marks of [`crate::modes`] and [`crate::handoff`], which another client
//! writes), so the label has a key of its own beside the queue, on the entry's lease:
//! `{prefix}{escaped key}%labels/{owner id}`.

use crate::config::Layout;

/// The queue directory of `key` in `layout`.
pub(crate) fn dir(layout: Layout, prefix: &str, key: &str) -> String {
    match layout {
        Layout::Fencelock => queue_dir(prefix, key),
        Layout::Etcd => mutex_dir(prefix, key),
    }
}

/// The queue entry of one acquisition in `layout`, holding the etcd lease `lease_id`.
pub(crate) fn entry(
    layout: Layout,
    dir: &str,
    owner: fencelock_core::OwnerId,
    lease_id: i64,
) -> String {
    match layout {
        Layout::Fencelock => entry_key(dir, owner),
        Layout::Etcd => mutex_entry(dir, lease_id),
    }
}

/// etcd's `Mutex` directory: the name as given, then `/`. Not escaped, so that it is byte for
/// byte the directory `etcdctl lock {key}` uses; as with etcd's own clients, the queue of `a`
/// then also holds the entries of `a/b` (false contention, never two holders).
pub(crate) fn mutex_dir(prefix: &str, key: &str) -> String {
    format!("{prefix}{key}/")
}

/// etcd's `Mutex` entry: the lease id in lower-case hex, as Go's `%x` prints an `int64`.
pub(crate) fn mutex_entry(dir: &str, lease_id: i64) -> String {
    if lease_id < 0 {
        // etcd never grants a negative id; written as Go would, so both sides still agree.
        format!("{dir}-{:x}", lease_id.unsigned_abs())
    } else {
        format!("{dir}{lease_id:x}")
    }
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

/// The key of the label of the acquisition `owner` in label directory `labels`.
pub(crate) fn label_key(labels: &str, owner: fencelock_core::OwnerId) -> String {
    format!("{labels}{owner}")
}

/// The owner id a label key of `labels` names, if it is one.
pub(crate) fn label_owner(labels: &str, key: &[u8]) -> Option<fencelock_core::OwnerId> {
    let rest = key.strip_prefix(labels.as_bytes())?;
    fencelock_core::OwnerId::parse(std::str::from_utf8(rest).ok()?)
}

/// A stored label as `status` reports it: a value that is not UTF-8 (put by another client)
/// has each invalid sequence replaced by U+FFFD; the empty value is no label.
pub(crate) fn label_text(value: &[u8]) -> Option<String> {
    (!value.is_empty()).then(|| String::from_utf8_lossy(value).into_owned())
}

/// The queue entry of one acquisition.
pub(crate) fn entry_key(dir: &str, owner: fencelock_core::OwnerId) -> String {
    format!("{dir}{owner}")
}

/// Where readers' entries are named in a queue directory: `{dir}~r/{owner id}`. Owner ids are
/// hexadecimal, so every other entry of the directory (exclusive `{dir}{owner id}`, permits
/// `{dir}~p/{owner id}`) sorts before `{dir}~r/`: a reader reads the range `[dir, dir~r/)`
/// for the writers older than itself, as etcd's `RWMutex` recipe reads its `write` keys.
const SHARED_NAMES: &str = "~r/";
/// Where permits' entries are named: `{dir}~p/{owner id}` (inside the writers' range).
const PERMIT_NAMES: &str = "~p/";

/// The queue entry of one acquisition in `mode` (in [`Layout::Fencelock`], the only layout
/// that keeps modes).
pub(crate) fn mode_entry(
    dir: &str,
    owner: fencelock_core::OwnerId,
    mode: fencelock_core::Mode,
) -> String {
    match mode {
        fencelock_core::Mode::Shared => format!("{dir}{SHARED_NAMES}{owner}"),
        fencelock_core::Mode::Permit { .. } => format!("{dir}{PERMIT_NAMES}{owner}"),
        _ => entry_key(dir, owner),
    }
}

/// The readers' part of `dir`: `[start, end)`, every entry in it a reader's.
pub(crate) fn shared_range(dir: &str) -> (String, String) {
    (format!("{dir}{SHARED_NAMES}"), format!("{dir}~r0"))
}

/// The end of the writers' part of `dir`, `[dir, end)`: every entry that is not a reader's.
pub(crate) fn not_shared_end(dir: &str) -> String {
    format!("{dir}{SHARED_NAMES}")
}

/// The owner id at the end of an entry of `dir`, if it is one.
pub(crate) fn entry_owner(dir: &str, entry: &[u8]) -> Option<fencelock_core::OwnerId> {
    let rest = entry.strip_prefix(dir.as_bytes())?;
    let rest = rest
        .strip_prefix(SHARED_NAMES.as_bytes())
        .or_else(|| rest.strip_prefix(PERMIT_NAMES.as_bytes()))
        .unwrap_or(rest);
    fencelock_core::OwnerId::parse(std::str::from_utf8(rest).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::OwnerId;

    #[test]
    fn no_queue_is_a_prefix_of_another_keys_entries() {
        let keys = ["a", "a/b", "a%2Fb", "a/", "", "/", "%", "a%", "ключ/🔒"];
        for a in keys {
            for b in keys {
                if a == b {
                    continue;
                }
                let entry = entry_key(&queue_dir("p/", b), OwnerId::from(7));
                assert!(
                    !entry.starts_with(&queue_dir("p/", a)),
                    "the queue of {a:?} would contain the entries of {b:?}"
                );
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
        let owner = OwnerId::random();
        for a in keys {
            let labels = labels_dir(&queue_dir("p/", a));
            let label = label_key(&labels, owner);
            assert_eq!(label_owner(&labels, label.as_bytes()), Some(owner));
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
    fn the_etcd_layout_names_entries_as_etcds_mutex_does() {
        // `etcdctl lock jobs/nightly` on lease 0x694d77aa9e3b1d5c puts this key.
        let dir = dir(Layout::Etcd, "", "jobs/nightly");
        assert_eq!(dir, "jobs/nightly/");
        assert_eq!(
            entry(Layout::Etcd, &dir, OwnerId::from(7), 0x694d_77aa_9e3b_1d5c),
            "jobs/nightly/694d77aa9e3b1d5c"
        );
        assert_eq!(mutex_entry("k/", 10), "k/a");
        assert_eq!(mutex_entry("k/", -10), "k/-a");
        assert_eq!(mutex_dir("locks/", "a%/b"), "locks/a%/b/");
        // Its entries carry no owner id.
        assert_eq!(entry_owner(&dir, b"jobs/nightly/694d77aa9e3b1d5c"), None);
    }

    #[test]
    fn the_owner_comes_back_from_the_entry() {
        let dir = queue_dir("fencelock/", "nul\u{0}inside");
        let owner = OwnerId::random();
        let entry = entry_key(&dir, owner);
        assert_eq!(entry_owner(&dir, entry.as_bytes()), Some(owner));
        assert_eq!(entry_owner(&dir, b"elsewhere"), None);
        for mode in [
            fencelock_core::Mode::Shared,
            fencelock_core::Mode::permits(3),
        ] {
            let entry = mode_entry(&dir, owner, mode);
            assert_eq!(entry_owner(&dir, entry.as_bytes()), Some(owner));
        }
    }

    #[test]
    fn readers_are_named_apart_from_every_other_entry() {
        let dir = queue_dir("fencelock/", "k");
        let (start, end) = shared_range(&dir);
        let writers_end = not_shared_end(&dir);
        let owners = [
            OwnerId::from(0),
            OwnerId::from(u128::MAX),
            OwnerId::random(),
        ];
        for owner in owners {
            let reader = mode_entry(&dir, owner, fencelock_core::Mode::Shared);
            assert!(reader >= start && reader < end, "{reader}");
            for other in [
                mode_entry(&dir, owner, fencelock_core::Mode::permits(2)),
                mode_entry(&dir, owner, fencelock_core::Mode::Exclusive),
            ] {
                assert!(other >= dir && other < writers_end, "{other}");
            }
        }
    }
}
