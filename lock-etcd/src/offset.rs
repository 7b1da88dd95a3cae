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

/// The oldest store revision a handle raises from without asking etcd first. The raise puts
/// `O = clock − hint`, so the tokens after it lead the clock by the revisions written since the
/// hint: at most the cluster's writes in this long plus a round trip (50 ms at the 50,000
/// writes/s etcd reaches at best).
pub(crate) const HINT_AGE: Duration = Duration::from_secs(1);

/// The offset's name under a prefix. No lock's queue directory is it or holds it: directories
/// end in `/` and escaped keys hold none.
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

#[cfg(test)]
mod tests {
    use super::*;

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
