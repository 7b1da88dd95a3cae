//! Where a lock lives in etcd's key space.
//!
//! A lock on `key` is a queue directory `{prefix}{escaped key}/`; each acquisition puts one
//! entry `{prefix}{escaped key}/{owner id}` on its own etcd lease. The entry with the lowest
//! create revision holds the lock; the others wait in create-revision order.

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

/// The queue entry of one acquisition.
pub(crate) fn entry_key(dir: &str, owner: lock_core::OwnerId) -> String {
    format!("{dir}{owner}")
}

/// The owner id at the end of an entry of `dir`, if it is one.
pub(crate) fn entry_owner(dir: &str, entry: &[u8]) -> Option<lock_core::OwnerId> {
    let rest = entry.strip_prefix(dir.as_bytes())?;
    lock_core::OwnerId::parse(std::str::from_utf8(rest).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::OwnerId;

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
    fn the_owner_comes_back_from_the_entry() {
        let dir = queue_dir("fencelock/", "nul\u{0}inside");
        let owner = OwnerId::random();
        let entry = entry_key(&dir, owner);
        assert_eq!(entry_owner(&dir, entry.as_bytes()), Some(owner));
        assert_eq!(entry_owner(&dir, b"elsewhere"), None);
    }
}
