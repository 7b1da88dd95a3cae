//! Where a lock lives in ZooKeeper's tree.
//!
//! The lock on `key` is the container node `{prefix}/{escaped key}`; each acquisition creates
//! one ephemeral sequential child `{owner id}-lock-{sequence}` in it. The child with the lowest
//! sequence number holds the lock; the others wait in sequence order (Curator's
//! `InterProcessMutex` recipe, which sorts by the text after the last `lock-`).

use fencelock_core::OwnerId;

/// What separates the owner id from the sequence number in a lock node's name (Curator's).
const LOCK_NAME: &str = "-lock-";

/// The container node of `key`: `{prefix}/{escaped key}`.
pub(crate) fn container(prefix: &str, key: &str) -> String {
    format!("{prefix}/{}", escape(key))
}

/// The path a lock node of `owner` is created with (ZooKeeper appends the sequence number).
pub(crate) fn node_prefix(container: &str, owner: OwnerId) -> String {
    format!("{container}/{owner}{LOCK_NAME}")
}

/// The sequence number of a lock node's name, `None` for a name this store did not make.
pub(crate) fn sequence(name: &str) -> Option<i64> {
    let (_, digits) = name.rsplit_once(LOCK_NAME)?;
    digits.parse().ok()
}

/// The owner id a lock node's name starts with.
pub(crate) fn owner(name: &str) -> Option<OwnerId> {
    OwnerId::parse(name.split_once(LOCK_NAME)?.0)
}

/// Whether the lock node `name` was made by `owner`.
pub(crate) fn made_by(name: &str, owner: OwnerId) -> bool {
    name.strip_prefix(&owner.to_string())
        .is_some_and(|rest| rest.starts_with(LOCK_NAME))
}

/// The lock nodes of a container, oldest first (those with no sequence number, which this
/// store never makes, left out).
pub(crate) fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut queue: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|name| Some((sequence(&name)?, name)))
        .collect();
    queue.sort();
    queue
}

/// `key` as one valid znode name: bytes outside `[A-Za-z0-9_:,=+@-]` (and so every `/`, `.`,
/// `%`, space and control character) become `%XX`. Injective (`%` is escaped, and the escape
/// of a byte is fixed), never empty, `.` or `..` (a dot is escaped), and holds none of the
/// characters ZooKeeper refuses in a path. A 1,024-byte key becomes at most 3,072 bytes.
pub(crate) fn escape(key: &str) -> String {
    let mut name = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"_:,=+@-".contains(&byte) {
            name.push(byte as char);
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_to_one_valid_name_each() {
        assert_eq!(escape("jobs:nightly"), "jobs:nightly");
        assert_eq!(escape("a/b"), "a%2Fb");
        assert_eq!(escape("."), "%2E");
        assert_eq!(escape(".."), "%2E%2E");
        assert_eq!(escape("%2F"), "%252F");
        assert_eq!(escape("\u{0}\u{1f}\u{7f}"), "%00%1F%7F");
        assert_eq!(escape("é"), "%C3%A9");
        let distinct = ["a/b", "a%2Fb", "a.b", "a b", "a", "A", ".", "..", "/", "%"];
        let names: std::collections::BTreeSet<String> =
            distinct.iter().map(|k| escape(k)).collect();
        assert_eq!(names.len(), distinct.len());
        for key in distinct {
            let name = escape(key);
            assert!(!name.is_empty() && name != "." && name != "..");
            assert!(!name.contains('/'));
            assert!(name.chars().all(|c| c.is_ascii_graphic()), "{name}");
        }
        assert_eq!(escape(&"\u{7ff}".repeat(512)).len(), 3 * 1024);
    }

    #[test]
    fn lock_node_names_parse() {
        let owner = OwnerId::from(0xabcu128);
        let prefix = node_prefix("/fencelock/k", owner);
        assert_eq!(
            prefix,
            "/fencelock/k/00000000000000000000000000000abc-lock-"
        );
        let name = "00000000000000000000000000000abc-lock-0000000042";
        assert_eq!(sequence(name), Some(42));
        assert_eq!(owner_of(name), Some(owner));
        assert!(made_by(name, owner));
        assert!(!made_by(name, OwnerId::from(1u128)));
        assert_eq!(sequence("junk"), None);
        let queue = queue(vec![
            "b-lock-0000000002".into(),
            "junk".into(),
            "a-lock-0000000001".into(),
            "c-lock-0000000010".into(),
        ]);
        let order: Vec<i64> = queue.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(order, [1, 2, 10]);
    }

    fn owner_of(name: &str) -> Option<OwnerId> {
        owner(name)
    }
}
