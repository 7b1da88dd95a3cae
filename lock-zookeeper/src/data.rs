//! What a lock node's data holds: its holder's label, and in [`Layout::Fencelock`] a granted
//! reader's or permit's mark before it. A leaf, like `keys`.
//!
//! - An exclusive node (every node of the interop layouts) holds the label as it is, or
//!   nothing: what Curator's `LeaderSelector` keeps as its participant id and kazoo's
//!   `Election` as its identifier, so their leaders and ours read one another's values.
//! - A reader or permit is created holding its label, or nothing, and its mark replaces that:
//!   `shared` or `slot {n}` as before, followed by a newline and the label when it has one.
//!   A label holds no control character, so the first newline ends the mark. An unlabelled
//!   mark is byte for byte the one older builds write and read.
//!
//! [`Layout::Fencelock`]: crate::layout::Layout::Fencelock

use fencelock_core::Mode;

/// What a reader's mark says.
const SHARED_MARK: &str = "shared";
/// What a permit's mark says before its slot.
const SLOT_MARK: &str = "slot ";
/// What ends a mark that a label follows.
const AFTER_MARK: u8 = b'\n';

/// The data a lock node is created with: its label, or nothing.
pub(crate) fn created(label: Option<&str>) -> Vec<u8> {
    label.unwrap_or_default().as_bytes().to_vec()
}

/// The data of a granted lease's node in `mode`: an exclusive node's label, or a reader's or
/// permit's mark (a permit's with its `slot`) and then its label.
pub(crate) fn granted(mode: Mode, slot: Option<u32>, label: Option<&str>) -> Vec<u8> {
    let mark = match (mode, slot) {
        (Mode::Exclusive, _) => return created(label),
        (Mode::Permit { .. }, Some(slot)) => format!("{SLOT_MARK}{slot}"),
        _ => SHARED_MARK.to_owned(),
    };
    let mut data = mark.into_bytes();
    if let Some(label) = label {
        data.push(AFTER_MARK);
        data.extend_from_slice(label.as_bytes());
    }
    data
}

/// A granted reader's or permit's data split at its first newline: the mark, and the label
/// after it (`None`: unlabelled).
fn split(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == AFTER_MARK) {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (data, None),
    }
}

/// The slot a permit's mark records (`slot {n}`, a label after it or not).
pub(crate) fn parse_slot(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(split(data).0)
        .ok()?
        .strip_prefix(SLOT_MARK)?
        .parse()
        .ok()
}

/// The label a granted node's data holds (`None`: none, or empty). `marked`: the data is a
/// reader's or permit's mark, the label after its first newline. Data that is not UTF-8 (a
/// peer's: Curator's default node data is its host's address, and anyone may write any
/// bytes) is read lossily, each invalid sequence one U+FFFD, and reported whatever its length.
pub(crate) fn label(data: &[u8], marked: bool) -> Option<String> {
    let label = if marked { split(data).1? } else { data };
    (!label.is_empty()).then(|| String::from_utf8_lossy(label).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlabelled_data_is_what_older_builds_write() {
        assert_eq!(created(None), b"");
        assert_eq!(granted(Mode::Exclusive, None, None), b"");
        assert_eq!(granted(Mode::Shared, None, None), b"shared");
        assert_eq!(granted(Mode::permits(3), Some(2), None), b"slot 2");
        assert_eq!(parse_slot(b"slot 2"), Some(2));
        assert_eq!(label(b"shared", true), None);
        assert_eq!(label(b"slot 2", true), None);
        assert_eq!(label(b"", false), None);
    }

    #[test]
    fn labels_follow_the_mark() {
        let label_text = "host-a pid 4242 ✓";
        let exclusive = granted(Mode::Exclusive, None, Some(label_text));
        assert_eq!(exclusive, label_text.as_bytes());
        assert_eq!(label(&exclusive, false).as_deref(), Some(label_text));
        let reader = granted(Mode::Shared, None, Some(label_text));
        assert_eq!(reader, format!("shared\n{label_text}").as_bytes());
        assert_eq!(label(&reader, true).as_deref(), Some(label_text));
        let permit = granted(Mode::permits(3), Some(1), Some(label_text));
        assert_eq!(parse_slot(&permit), Some(1));
        assert_eq!(label(&permit, true).as_deref(), Some(label_text));
        assert_eq!(parse_slot(b"slot x\n1"), None);
    }

    #[test]
    fn a_peers_data_is_read_lossily() {
        assert_eq!(label(b"10.0.0.7", false).as_deref(), Some("10.0.0.7"));
        assert_eq!(
            label(b"id \xff\xfe end", false).as_deref(),
            Some("id \u{fffd}\u{fffd} end")
        );
        assert_eq!(label(b"shared\n\xc3", true).as_deref(), Some("\u{fffd}"));
    }
}
