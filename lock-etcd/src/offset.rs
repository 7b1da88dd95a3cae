//! Clock-floored tokens in [`Layout::Fencelock`](crate::Layout::Fencelock): a lease's token is
//! `O + create revision`, with `O` the prefix's one *offset*, kept in the key
//! `{prefix}~offset`, only ever raised, and read in the transaction that creates the entry.
//! The same transaction raises it from the client's clock when `O` plus the revision has
//! fallen more than [`GRANULE`] behind that clock. See the crate docs (*Tokens across a swap*)
//! for why tokens stay strictly increasing and what a swap between stores needs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock_core::{Error, Result};

/// etcd's granule `G`: a grant's token is at least the client's clock (µs since the epoch,
/// read before the enqueue is sent) minus this. A raise costs one more key in the enqueue's
/// transaction, at most about once per granule per busy prefix.
pub(crate) const GRANULE: Duration = Duration::from_millis(100);

/// The oldest a revision hint may be (counted from when the request that showed it was sent)
/// for a raise to count from it without asking etcd first. The tokens after a raise lead the
/// clock read before the enqueue by the revisions written between the hint and the entry: at
/// most `W × (HINT_AGE + command timeout)`, `W` the cluster's write rate (see the crate docs).
pub(crate) const HINT_AGE: Duration = Duration::from_secs(1);

/// A store revision no later than the next write's, and when it was current: the hint a raise
/// counts from. Fed only with linearizable answers (writes, linearizable reads), whose
/// revision is at least the store's revision when their request was sent; a serializable read
/// may come from a member that lags by any amount.
pub(crate) type RevisionHint = fencelock_core::raw::hint::PositionHint;

/// The offset's name under a prefix. No queue directory of the same prefix is it or holds it:
/// directories end in `/` and this name holds none. Another prefix's directory may (prefixes
/// that nest): a queue entry without a lease is refused as foreign.
const OFFSET_NAME: &str = "~offset";

/// The digits an offset is written with: zero-padded, so etcd's byte-wise value comparison is
/// the numbers' order (a raise compares in the transaction).
const DIGITS: usize = 19;

/// Offsets stay below this (the year 146,000 in µs), so `O + revision` stays below 2^63, as
/// PostgreSQL `int8` and SQLite `INTEGER` need.
const MAX_OFFSET: u64 = 1 << 62;

/// The offset key of `prefix`.
pub(crate) fn key(prefix: &str) -> String {
    format!("{prefix}{OFFSET_NAME}")
}

/// An offset as stored.
pub(crate) fn encode(offset: u64) -> String {
    format!("{offset:0DIGITS$}")
}

/// A stored offset. Anything but [`DIGITS`] digits is refused: a later scheme's marker (which
/// should sort above every digit string, so no raise of this build overwrites it) or a hand
/// edit.
pub(crate) fn parse(key: &str, value: &[u8]) -> Result<u64> {
    let number = std::str::from_utf8(value)
        .ok()
        .filter(|text| text.len() == DIGITS && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse::<u64>().ok())
        .filter(|offset| *offset <= MAX_OFFSET);
    number.ok_or_else(|| Error::Store {
        message: format!(
            "the token offset {key} holds {:?}, which this build does not read: a later \
             fencelock build's scheme, or an edit by hand; use the build that wrote it, or \
             another prefix",
            String::from_utf8_lossy(value)
        ),
        source: None,
    })
}

/// The client's clock in µs since the Unix epoch (0 before it: no raise).
pub(crate) fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// The raise an enqueue carries: put `target` if the stored offset is below `below`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Raise {
    pub(crate) key: String,
    /// Stored offsets below this are raised: `clock − G − hint`, so a grant without a raise
    /// has `O + revision > clock − G` (its revision is above the hint).
    pub(crate) below: String,
    /// `clock − hint`: a grant with the raise has `O + revision > clock`.
    pub(crate) target: String,
}

/// The raise for a client clock of `clock` µs and a store revision `hint` at most the
/// enqueue's own. Fails for a clock past [`MAX_OFFSET`].
pub(crate) fn raise(prefix: &str, clock: u64, hint: i64) -> Result<Raise> {
    let hint = u64::try_from(hint).unwrap_or(0);
    let target = clock.saturating_sub(hint);
    if target > MAX_OFFSET {
        return Err(Error::Store {
            message: format!(
                "the client's clock reads {clock} µs since the epoch, past any date a token \
                 offset may take"
            ),
            source: None,
        });
    }
    let granule = u64::try_from(GRANULE.as_micros()).unwrap_or(u64::MAX);
    Ok(Raise {
        key: key(prefix),
        below: encode(target.saturating_sub(granule)),
        target: encode(target),
    })
}

/// The token of an entry created at `revision` while the offset was `offset`.
pub(crate) fn token(offset: u64, revision: i64) -> Result<u64> {
    u64::try_from(revision)
        .ok()
        .and_then(|revision| offset.checked_add(revision))
        .filter(|token| *token < 1 << 63)
        .ok_or_else(|| Error::Store {
            message: format!("offset {offset} plus revision {revision} is no token below 2^63"),
            source: None,
        })
}

/// Whether a queue entry's value shows it was put by a client that mints raw revisions: an
/// older fencelock build or etcd's own lock clients, whose exclusive entries hold the empty
/// value (this build's hold `exclusive`).
pub(crate) fn put_by_raw_minter(value: &[u8]) -> bool {
    value.is_empty()
}

/// The error for a queue entry `entry` put by a client that mints raw revisions.
pub(crate) fn raw_minter_found(prefix: &str, entry: &[u8]) -> Error {
    Error::Store {
        message: format!(
            "the queue entry {} has the empty value an older fencelock build (before \
             clock-floored tokens) or etcd's own lock clients put: they mint raw revisions, \
             smaller than this build's tokens, so resources would refuse their leases after \
             this build's. Stop or upgrade every such client of prefix {prefix:?} first (the \
             crate docs, *Tokens across a swap*, say how a prefix switches over)",
            String::from_utf8_lossy(entry)
        ),
        source: None,
    }
}

/// Whether a queue entry is foreign: every lock entry lives on an etcd lease (this build's,
/// an older one's, etcd's own clients'), so a key without one is another prefix's token offset
/// (prefixes that nest) or a key written by hand. It would head its queue forever.
pub(crate) fn is_foreign(lease: i64) -> bool {
    lease == 0
}

/// The error for `entry`, a key without a lease in the queue directory `dir`.
pub(crate) fn foreign_found(prefix: &str, dir: &str, entry: &[u8]) -> Error {
    let entry = String::from_utf8_lossy(entry);
    let nested = entry
        .strip_suffix(OFFSET_NAME)
        .filter(|nested| nested.starts_with(dir))
        .map(|nested| format!(", the token offset of the prefix {nested:?}"))
        .unwrap_or_default();
    Error::Store {
        message: format!(
            "the queue {dir:?} holds {entry:?}, a key on no etcd lease{nested}: prefixes nest \
             (the prefix {prefix:?} and one starting with {dir:?}) or it was written by hand. \
             It never leaves, so this lock is refused rather than waited for; give each \
             prefix its own subtree (no prefix may start with another), and never delete a \
             token offset"
        ),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::Instant;

    #[test]
    fn offsets_compare_as_their_values_do() {
        let samples = [0, 1, 9, 10, 1_795_755_901_367_913, MAX_OFFSET];
        for a in samples {
            assert_eq!(parse("k", encode(a).as_bytes()).unwrap(), a);
            for b in samples {
                assert_eq!(encode(a).cmp(&encode(b)), a.cmp(&b), "{a} and {b}");
            }
        }
    }

    #[test]
    fn a_value_of_another_scheme_is_refused() {
        for odd in [
            &b""[..],
            b"12",
            b"x000000000000000000",
            b"9999999999999999999",
        ] {
            assert!(
                matches!(parse("k", odd), Err(Error::Store { .. })),
                "{odd:?}"
            );
        }
    }

    #[test]
    fn a_hint_is_dated_by_when_its_request_was_sent() {
        let now = Instant::now();
        let mut hint = RevisionHint::default();
        hint.note(100, now - 2 * HINT_AGE);
        // Answered just now, but to a request sent long ago: as old as the request.
        assert_eq!(hint.fresh(now, HINT_AGE), None);
        hint.note(100, now - HINT_AGE / 2);
        assert_eq!(hint.fresh(now, HINT_AGE), Some(100));
        // A late answer to an older request neither replaces nor re-dates it.
        hint.note(500, now - HINT_AGE);
        assert_eq!(hint.fresh(now + HINT_AGE * 3 / 4, HINT_AGE), None);
    }

    #[test]
    fn a_lower_revision_from_a_later_request_replaces_the_hint() {
        // A snapshot restore took the revisions back: the hint follows, so it never exceeds
        // the next entry's revision (a raise from it would put tokens below the clock).
        let now = Instant::now();
        let mut hint = RevisionHint::default();
        hint.note(1_000, now);
        hint.note(400, now + HINT_AGE / 10);
        assert_eq!(hint.fresh(now + HINT_AGE / 5, HINT_AGE), Some(400));
    }

    #[test]
    fn a_raise_lifts_tokens_past_the_clock_and_triggers_only_a_granule_behind() {
        let clock = 1_795_755_901_367_913;
        let lift = raise("p/", clock, 1_000).unwrap();
        let target: u64 = lift.target.parse().unwrap();
        let below: u64 = lift.below.parse().unwrap();
        // The next revision is above the hint: its token is above the clock.
        assert!(token(target, 1_001).unwrap() > clock);
        // Without a raise, O >= below: a later revision's token is within G of the clock.
        assert!(token(below, 1_001).unwrap() + GRANULE.as_micros() as u64 > clock);
        assert!(raise("p/", u64::MAX, 1).is_err());
        assert!(token(MAX_OFFSET, i64::MAX).is_err());
    }
}
