//! Where a lock lives in ZooKeeper's tree, in each [`Layout`].
//!
//! The lock on `key` is the znode `{prefix}/{escaped key}`; each acquisition creates one
//! ephemeral sequential child in it, named by the layout (ZooKeeper appends the 10-digit
//! sequence number). The oldest contender holds the lock; the others wait in the layout's order.
//!
//! - [`Layout::Fencelock`]: `{owner id}-lock-{sequence}` for an exclusive lease,
//!   `{owner id}-shared-lock-{sequence}` for a reader and `{owner id}-permit{limit}-lock-{sequence}`
//!   for a permit of a semaphore of `limit` ([`NodeMode`]), all in one queue ordered by the
//!   sequence number as a 32-bit serial number, so across its wrap (names without one are left
//!   out).
//! - [`Layout::Curator`]: `_c_{uuid}-lock-{sequence}` (Curator's protected-mode name), and, as
//!   Curator's `StandardLockInternalsDriver` does, *every* child sorted by the text after its
//!   last `lock-` (the whole name if it has none), as text even past the sequence's wrap.
//! - [`Layout::Kazoo`]: `{uuid hex}__lock__{sequence}`; as kazoo's `WriteLock`, the contenders
//!   are the children matching `(__lock__|__rlock__)(-?\d{10})$`, sorted by that sequence text.

use fencelock_core::{Mode, OwnerId};

use crate::layout::Layout;

/// What separates the owner id from the sequence number in a lock node's name (Curator's).
const LOCK_NAME: &str = "-lock-";
/// Curator's sort marker: it sorts by the text after the last occurrence.
const CURATOR_SORT: &str = "lock-";
/// Curator's protected-mode prefix.
const CURATOR_PROTECTED: &str = "_c_";
/// kazoo's exclusive (and write) lock node name, and its read lock's.
const KAZOO_LOCK: &str = "__lock__";
const KAZOO_READ: &str = "__rlock__";

/// The container node of `key`: `{prefix}/{escaped key}`.
pub(crate) fn container(prefix: &str, key: &str) -> String {
    format!("{prefix}/{}", escape(key))
}

/// A 128-bit id as a UUID's text (`8-4-4-4-12` lowercase hex digits).
fn uuid(owner: OwnerId) -> String {
    let hex = owner.to_string();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// What a reader's node name says between the owner id and [`LOCK_NAME`].
const SHARED_TAG: &str = "shared";
/// What a permit's node name says there, followed by its limit.
const PERMIT_TAG: &str = "permit";

/// The name a lock node of `owner` in `mode` starts with (ZooKeeper appends the sequence
/// number). The interop layouts know only exclusive leases.
fn name_prefix(layout: Layout, owner: OwnerId, mode: Mode) -> String {
    match (layout, mode) {
        (Layout::Curator, _) => format!("{CURATOR_PROTECTED}{}{LOCK_NAME}", uuid(owner)),
        (Layout::Kazoo, _) => format!("{owner}{KAZOO_LOCK}"),
        (_, Mode::Shared) => format!("{owner}-{SHARED_TAG}{LOCK_NAME}"),
        (_, Mode::Permit { limit }) => format!("{owner}-{PERMIT_TAG}{limit}{LOCK_NAME}"),
        _ => format!("{owner}{LOCK_NAME}"),
    }
}

/// The path a lock node of `owner` in `mode` is created with (ZooKeeper appends the sequence
/// number).
pub(crate) fn node_prefix(layout: Layout, container: &str, owner: OwnerId, mode: Mode) -> String {
    format!("{container}/{}", name_prefix(layout, owner, mode))
}

/// The mode a lock node's name says ([`Layout::Fencelock`]; every node of the interop layouts
/// is exclusive). A name this store cannot read counts as exclusive: it blocks every other
/// request, so nothing is granted next to a node it does not understand.
pub(crate) fn node_mode(layout: Layout, name: &str) -> Mode {
    if layout != Layout::Fencelock {
        return Mode::Exclusive;
    }
    let Some((head, _)) = name.rsplit_once(LOCK_NAME) else {
        return Mode::Exclusive;
    };
    let Some((_, tag)) = head.split_once('-') else {
        return Mode::Exclusive;
    };
    if tag == SHARED_TAG {
        return Mode::Shared;
    }
    match tag.strip_prefix(PERMIT_TAG).map(str::parse::<u32>) {
        Some(Ok(limit)) if (1..=fencelock_core::limits::MAX_PERMITS).contains(&limit) => {
            Mode::Permit { limit }
        }
        _ => Mode::Exclusive,
    }
}

/// The sequence number of a lock node's name in the fencelock layout, `None` for a name this
/// store did not make. ZooKeeper appends the container's count of child creates, a Java `int`,
/// as `%010d`: past `2147483647` it wraps to `-2147483648` (11 characters), then `-000000001`.
fn sequence(name: &str) -> Option<i32> {
    let (_, digits) = name.rsplit_once(LOCK_NAME)?;
    digits.parse().ok()
}

/// Where the oldest of `sequences` starts in 32-bit serial order (RFC 1982): just after the
/// widest gap between them around the circle. While a container's live nodes were made within
/// fewer than 2^31 creates of each other, that gap is the only one wider than half the circle,
/// so a node made after the counter wrapped still sorts after every older one.
fn serial_start(sequences: &mut [u32]) -> u32 {
    sequences.sort_unstable();
    let (Some(&first), Some(&last)) = (sequences.first(), sequences.last()) else {
        return 0;
    };
    let mut start = first;
    let mut widest = first.wrapping_sub(last);
    for pair in sequences.windows(2) {
        let gap = pair[1] - pair[0];
        if gap > widest {
            (start, widest) = (pair[1], gap);
        }
    }
    start
}

/// kazoo's contender sequence: the `-?\d{10}` that ends the name right after `__lock__` or
/// `__rlock__`.
fn kazoo_sequence(name: &str) -> Option<&str> {
    let digits = name.len().checked_sub(10)?;
    let (head, tail) = name.split_at_checked(digits)?;
    if !tail.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (head, sequence) = match head.strip_suffix('-') {
        Some(head) => (head, &name[digits - 1..]),
        None => (head, tail),
    };
    (head.ends_with(KAZOO_LOCK) || head.ends_with(KAZOO_READ)).then_some(sequence)
}

/// The owner id a lock node's name starts with.
pub(crate) fn owner(layout: Layout, name: &str) -> Option<OwnerId> {
    match layout {
        Layout::Curator => {
            let rest = name.strip_prefix(CURATOR_PROTECTED)?;
            let uuid = rest.get(..36)?;
            rest[36..].starts_with(LOCK_NAME).then_some(())?;
            OwnerId::parse(&uuid.replace('-', ""))
        }
        Layout::Kazoo => OwnerId::parse(name.get(..32)?),
        _ => {
            let head = name.split_once(LOCK_NAME)?.0;
            OwnerId::parse(head.split_once('-').map_or(head, |(owner, _)| owner))
        }
    }
}

/// Whether the lock node `name` was made by `owner` (in any mode).
pub(crate) fn made_by(layout: Layout, name: &str, owner: OwnerId) -> bool {
    match layout {
        Layout::Fencelock => sequence(name).is_some() && self::owner(layout, name) == Some(owner),
        _ => name.starts_with(&name_prefix(layout, owner, Mode::Exclusive)),
    }
}

/// The contenders of a container, oldest first, in the layout's order.
pub(crate) fn queue(layout: Layout, children: Vec<String>) -> Vec<String> {
    match layout {
        Layout::Curator => {
            let mut queue: Vec<(String, String)> = children
                .into_iter()
                .map(|name| {
                    let key = match name.rfind(CURATOR_SORT) {
                        Some(at) => name[at + CURATOR_SORT.len()..].to_owned(),
                        None => name.clone(),
                    };
                    (key, name)
                })
                .collect();
            queue.sort();
            queue.into_iter().map(|(_, name)| name).collect()
        }
        Layout::Kazoo => {
            let mut queue: Vec<(String, String)> = children
                .into_iter()
                .filter_map(|name| Some((kazoo_sequence(&name)?.to_owned(), name)))
                .collect();
            queue.sort();
            queue.into_iter().map(|(_, name)| name).collect()
        }
        _ => {
            let mut queue: Vec<(u32, String)> = children
                .into_iter()
                .filter_map(|name| Some((sequence(&name)?.cast_unsigned(), name)))
                .collect();
            let mut sequences: Vec<u32> = queue.iter().map(|(sequence, _)| *sequence).collect();
            let start = serial_start(&mut sequences);
            queue.sort_by_key(|(sequence, _)| sequence.wrapping_sub(start));
            queue.into_iter().map(|(_, name)| name).collect()
        }
    }
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

/// The key a container node's name escapes ([`escape`] undone), if it is one.
pub(crate) fn unescape(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_undoes_escape() {
        for key in ["a/b", "%2F", "é", "..", "\u{0}x", "jobs:nightly"] {
            assert_eq!(unescape(&escape(key)).as_deref(), Some(key));
        }
        assert_eq!(unescape("%4"), None);
    }

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
        let prefix = node_prefix(Layout::Fencelock, "/fencelock/k", owner, Mode::Exclusive);
        assert_eq!(
            prefix,
            "/fencelock/k/00000000000000000000000000000abc-lock-"
        );
        let name = "00000000000000000000000000000abc-lock-0000000042";
        assert_eq!(sequence(name), Some(42));
        assert_eq!(owner_of(Layout::Fencelock, name), Some(owner));
        assert!(made_by(Layout::Fencelock, name, owner));
        assert!(!made_by(Layout::Fencelock, name, OwnerId::from(1u128)));
        assert_eq!(sequence("junk"), None);
        assert_eq!(node_mode(Layout::Fencelock, name), Mode::Exclusive);
        for mode in [Mode::Shared, Mode::permits(3), Mode::permits(1024)] {
            let path = node_prefix(Layout::Fencelock, "/k", owner, mode);
            let name = format!("{}0000000007", &path[3..]);
            assert_eq!(sequence(&name), Some(7));
            assert_eq!(node_mode(Layout::Fencelock, &name), mode, "{name}");
            assert_eq!(owner_of(Layout::Fencelock, &name), Some(owner));
            assert!(made_by(Layout::Fencelock, &name, owner));
            assert!(!made_by(Layout::Fencelock, &name, OwnerId::from(1u128)));
            assert_eq!(node_mode(Layout::Curator, &name), Mode::Exclusive);
        }
        let odd = format!("{owner}-permit0-lock-0000000001");
        assert_eq!(node_mode(Layout::Fencelock, &odd), Mode::Exclusive);
        let odd = format!("{owner}-writer-lock-0000000001");
        assert_eq!(node_mode(Layout::Fencelock, &odd), Mode::Exclusive);
        let queue = queue(
            Layout::Fencelock,
            vec![
                "b-lock-0000000002".into(),
                "junk".into(),
                "a-lock-0000000001".into(),
                "c-lock-0000000010".into(),
            ],
        );
        assert_eq!(
            queue,
            [
                "a-lock-0000000001",
                "b-lock-0000000002",
                "c-lock-0000000010"
            ]
        );
    }

    /// ZooKeeper's `%010d` of the container's 32-bit count of creates, around its wrap:
    /// `2147483647`, then `-2147483648`, `-2147483647`, …, `-000000001`, `0000000000`.
    fn suffix(sequence: i32) -> String {
        format!("{sequence:010}")
    }

    #[test]
    fn negative_sequences_parse_as_zookeeper_formats_them() {
        assert_eq!(suffix(-1), "-000000001");
        assert_eq!(suffix(i32::MIN), "-2147483648");
        assert_eq!(suffix(-999_999_999), "-999999999");
        for made in [
            i32::MAX,
            i32::MIN,
            i32::MIN + 1,
            -1_000_000_000,
            -999_999_999,
            -1,
            0,
        ] {
            for tag in ["", "-shared", "-permit3"] {
                let name = format!("0abc{tag}-lock-{}", suffix(made));
                assert_eq!(sequence(&name), Some(made), "{name}");
            }
        }
        // Nothing ZooKeeper appends: left out of the queue, never a panic.
        for odd in [
            "a-lock-",
            "a-lock--",
            "a-lock-2147483648",
            "a-lock--2147483649",
        ] {
            assert_eq!(sequence(odd), None, "{odd}");
        }
    }

    #[test]
    fn a_node_created_after_the_sequence_wraps_queues_behind_the_older_ones() {
        // Nodes made in this order (each listing order tried), in every mode, with a name
        // that is not a lock node beside them.
        let in_creation_order = |made: &[i32]| {
            let tags = ["", "-shared", "-permit2"];
            let oldest_first: Vec<String> = made
                .iter()
                .enumerate()
                .map(|(i, &s)| format!("{i:x}{}-lock-{}", tags[i % 3], suffix(s)))
                .collect();
            for rotation in 0..oldest_first.len() {
                let mut children = oldest_first.clone();
                children.rotate_left(rotation);
                children.push("junk".into());
                assert_eq!(
                    queue(Layout::Fencelock, children),
                    oldest_first,
                    "{made:?} listed from {rotation}"
                );
            }
        };
        // The holder made just before the count passed 2^31 - 1, the waiters after it.
        in_creation_order(&[i32::MAX - 1, i32::MAX, i32::MIN, i32::MIN + 1]);
        in_creation_order(&[i32::MIN, i32::MIN + 7]);
        // Back across zero, through `-000000001`.
        in_creation_order(&[-2, -1, 0, 1]);
        in_creation_order(&[9, 10, 1_000_000]);
    }

    #[test]
    fn the_interop_layouts_keep_their_peers_order_at_the_wrap() {
        // Curator and kazoo compare the suffix as text: a node made after the wrap sorts
        // first there, and both sides of a path must agree, so so does ours.
        let curator = queue(
            Layout::Curator,
            vec![
                format!("_c_a-lock-{}", suffix(i32::MAX)),
                format!("_c_b-lock-{}", suffix(i32::MIN)),
            ],
        );
        assert_eq!(curator[0], format!("_c_b-lock-{}", suffix(i32::MIN)));
        // kazoo's pattern wants ten digits after an optional sign: `-000000001` is no
        // contender there, nor here.
        let kazoo = queue(
            Layout::Kazoo,
            vec![
                format!("a__lock__{}", suffix(i32::MAX)),
                format!("b__lock__{}", suffix(i32::MIN)),
                format!("c__lock__{}", suffix(-1)),
            ],
        );
        assert_eq!(
            kazoo,
            [
                format!("b__lock__{}", suffix(i32::MIN)),
                format!("a__lock__{}", suffix(i32::MAX))
            ]
        );
    }

    #[test]
    fn curator_names_and_order_are_curators() {
        let owner = OwnerId::from(0x0a790800_566f_4571_9f78_7fdbc02d965b_u128);
        assert_eq!(
            node_prefix(Layout::Curator, "/l", owner, Mode::Shared),
            "/l/_c_0a790800-566f-4571-9f78-7fdbc02d965b-lock-"
        );
        let ours = "_c_0a790800-566f-4571-9f78-7fdbc02d965b-lock-0000000003";
        assert_eq!(owner_of(Layout::Curator, ours), Some(owner));
        assert!(made_by(Layout::Curator, ours, owner));
        // Every child counts, sorted by the text after the last "lock-".
        let order = queue(
            Layout::Curator,
            vec![
                ours.into(),
                "_c_89dc88e2-5257-45d8-9847-869e80803205-lock-0000000001".into(),
                "x-lock-0000000002".into(),
            ],
        );
        assert_eq!(
            order[0],
            "_c_89dc88e2-5257-45d8-9847-869e80803205-lock-0000000001"
        );
        assert_eq!(order[1], "x-lock-0000000002");
        assert_eq!(order[2], ours);
    }

    #[test]
    fn kazoo_names_and_order_are_kazoos() {
        let owner = OwnerId::from(0xeccf96f0d16c4a06bb6f7362197bfc5a_u128);
        assert_eq!(
            node_prefix(Layout::Kazoo, "/l", owner, Mode::Exclusive),
            "/l/eccf96f0d16c4a06bb6f7362197bfc5a__lock__"
        );
        let ours = "eccf96f0d16c4a06bb6f7362197bfc5a__lock__0000000004";
        assert_eq!(owner_of(Layout::Kazoo, ours), Some(owner));
        assert!(made_by(Layout::Kazoo, ours, owner));
        let order = queue(
            Layout::Kazoo,
            vec![
                ours.into(),
                "aa__rlock__0000000002".into(),
                "lease_holder".into(),
                "bb__lock__0000000001".into(),
                "_c_89dc88e2-5257-45d8-9847-869e80803205-lock-0000000000".into(),
            ],
        );
        assert_eq!(
            order,
            ["bb__lock__0000000001", "aa__rlock__0000000002", ours]
        );
    }

    fn owner_of(layout: Layout, name: &str) -> Option<OwnerId> {
        owner(layout, name)
    }
}
