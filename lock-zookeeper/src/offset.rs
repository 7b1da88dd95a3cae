//! Clock-floored tokens in [`Layout::Fencelock`](crate::Layout::Fencelock): a lease's token is
//! `O(z) + z`, `z` its lock node's `czxid` and `O(z)` the prefix's *token offset* in force at
//! `z`. The offset lives in the persistent node `{prefix}/~offset` (no key's container can
//! have that name: a key's `~` is escaped), is only ever raised, and every create of a lock
//! node is one `multi` with a check of the offset node's version, or with the raise itself,
//! so the offset a node was created under is known exactly. A raise lifts the offset from the
//! client's clock when `O + h` has fallen more than [`TOKEN_GRANULE`] behind it, `h` a zxid this
//! handle saw committed at most [`HINT_AGE`] before. See the crate docs (*Tokens across a
//! swap*) for why tokens stay strictly increasing and what a swap between stores needs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock_core::{Error, Result};

/// ZooKeeper's granule `G`: a grant's token is above the client's clock (µs since the epoch,
/// read before the create is sent) minus this. A raise writes the offset node, at most about
/// once per granule on a busy prefix.
pub const TOKEN_GRANULE: Duration = Duration::from_millis(100);

/// The oldest a zxid hint may be (counted from when the create that showed it was sent) for a
/// raise to count from it. Without a fresh hint the create goes out with a check only, and is
/// redone with a raise (counting from its own `czxid`) if its token fell behind the clock.
pub(crate) const HINT_AGE: Duration = Duration::from_secs(1);

/// The offset node's name under the prefix.
const NAME: &str = "~offset";

/// How many earlier offsets the node keeps (for `status` of holders created before a raise).
const HISTORY: usize = 16;

/// Offsets stay below this (the year 146,000 in µs), so `O + czxid` stays below 2^63 for any
/// zxid of an epoch below 2^30.
const MAX_OFFSET: u64 = 1 << 62;

/// The offset node of `prefix`.
pub(crate) fn path(prefix: &str) -> String {
    format!("{prefix}/{NAME}")
}

/// Whether a child of the prefix is the offset node (not a key).
pub(crate) fn is_offset(name: &str) -> bool {
    name == NAME
}

/// The offset node as read: the offset in force from its `mzxid` on, and the earlier ones,
/// each with the zxid from which it was in force, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offsets {
    pub(crate) current: u64,
    /// The node's `mzxid`: the zxid of the write that set `current`.
    pub(crate) since: i64,
    /// The node's version, which every create checks.
    pub(crate) version: i32,
    pub(crate) earlier: Vec<(u64, i64)>,
}

impl Offsets {
    /// Reads the node's data: `current[ value:since…]`, decimal. Anything else is refused:
    /// a later scheme's node, or an edit by hand.
    pub(crate) fn parse(path: &str, data: &[u8], since: i64, version: i32) -> Result<Self> {
        let refused = || Error::Store {
            message: format!(
                "the token offset {path} holds {:?}, which this build does not read: a later \
                 fencelock build's scheme, or an edit by hand; use the build that wrote it, or \
                 another prefix (never delete or edit a token offset)",
                String::from_utf8_lossy(data)
            ),
            source: None,
        };
        let text = std::str::from_utf8(data).map_err(|_| refused())?;
        let mut fields = text.split(' ');
        let number = |text: &str| text.parse::<u64>().ok().filter(|v| *v <= MAX_OFFSET);
        let current = fields.next().and_then(number).ok_or_else(refused)?;
        let earlier = fields
            .map(|pair| {
                let (value, since) = pair.split_once(':')?;
                Some((number(value)?, since.parse::<i64>().ok()?))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(refused)?;
        Ok(Offsets {
            current,
            since,
            version,
            earlier,
        })
    }

    /// The offset in force at `zxid`, if the node still knows it.
    pub(crate) fn at(&self, zxid: i64) -> Option<u64> {
        if zxid >= self.since {
            return Some(self.current);
        }
        self.earlier
            .iter()
            .find(|(_, since)| *since <= zxid)
            .map(|(value, _)| *value)
    }

    /// The node's data after a raise to `target`: the current offset joins the history.
    pub(crate) fn raised(&self, target: u64) -> Vec<u8> {
        let mut text = target.to_string();
        let kept = std::iter::once((self.current, self.since)).chain(self.earlier.iter().copied());
        for (value, since) in kept.take(HISTORY) {
            text.push_str(&format!(" {value}:{since}"));
        }
        text.into_bytes()
    }
}

/// A zxid no later than the next create's, and when the request that showed it was sent.
pub(crate) type ZxidHint = fencelock_core::raw::hint::PositionHint;

/// What a handle knows of its prefix's offset: the node as last read or written (`None`:
/// read it first), and the freshest zxid it saw committed.
#[derive(Debug, Default)]
pub(crate) struct TokenState {
    pub(crate) known: Option<Offsets>,
    pub(crate) hint: ZxidHint,
}

impl TokenState {
    /// Keeps the offset node as a committed create left it, unless a later version is known:
    /// concurrent creates can finish out of order, and the older node would fail the next
    /// create's version check, costing it a read and a try.
    pub(crate) fn learn(&mut self, offsets: Offsets) {
        if self
            .known
            .as_ref()
            .is_none_or(|known| known.version <= offsets.version)
        {
            self.known = Some(offsets);
        }
    }
}

/// The client's clock in µs since the Unix epoch (0 before it).
pub(crate) fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

fn granule_micros() -> u64 {
    u64::try_from(TOKEN_GRANULE.as_micros()).unwrap_or(u64::MAX)
}

/// The raise a create carries for a clock of `clock` µs, offset `current` and a fresh hint
/// `hint`: `Some(clock − hint)` when `current < clock − G − hint`, so that a create without a
/// raise has `O + z > clock − G` (its `z` is above the hint) and one with it `O + z > clock`.
/// Fails for a clock past [`MAX_OFFSET`].
pub(crate) fn raise(current: Option<u64>, clock: u64, hint: i64) -> Result<Option<u64>> {
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
    Ok(match current {
        Some(current) if current >= target.saturating_sub(granule_micros()) => None,
        _ => Some(target),
    })
}

/// Whether a create checked against `known` (no raise) gets a token within a granule of a
/// clock of `clock` µs whatever zxid it commits at: that zxid is above `known.since` (the
/// check passes only while the node is as it was written then), so its token is above
/// `current + since`. Otherwise the create needs a fresh zxid hint to count a raise from.
pub(crate) fn covers(known: &Offsets, clock: u64) -> bool {
    matches!(raise(Some(known.current), clock, known.since), Ok(None))
}

/// Whether a token minted against a clock reading of `clock` µs has fallen a granule behind
/// it (the create is then redone with a raise).
pub(crate) fn behind(token: u64, clock: u64) -> bool {
    token.saturating_add(granule_micros()) <= clock
}

/// The token of a node created at `zxid` under the offset `offset`.
pub(crate) fn token(offset: u64, zxid: i64) -> Result<u64> {
    u64::try_from(zxid)
        .ok()
        .and_then(|zxid| offset.checked_add(zxid))
        .filter(|token| *token < 1 << 63)
        .ok_or_else(|| Error::Store {
            message: format!("offset {offset} plus czxid {zxid} is no token below 2^63"),
            source: None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::Instant;

    #[test]
    fn a_create_finishing_late_keeps_the_later_node_known() {
        let older = Offsets::parse("p", b"1000", 10, 3).unwrap();
        let newer = Offsets::parse("p", &older.raised(5000), 20, 4).unwrap();
        let mut state = TokenState::default();
        state.learn(newer.clone());
        state.learn(older.clone());
        assert_eq!(state.known.as_ref().map(|k| k.version), Some(4));
        state.known = None; // a raced create forgot it: the next committed one is kept
        state.learn(older);
        assert_eq!(state.known.as_ref().map(|k| k.version), Some(3));
        state.learn(newer);
        assert_eq!(state.known.as_ref().map(|k| k.version), Some(4));
    }

    #[test]
    fn the_node_keeps_earlier_offsets_with_the_zxid_they_began_at() {
        let first = Offsets::parse("p", b"1000", 10, 0).unwrap();
        assert_eq!(first.at(10), Some(1000));
        assert_eq!(first.at(9), None);
        let data = first.raised(5000);
        let second = Offsets::parse("p", &data, 20, 1).unwrap();
        assert_eq!(second.at(25), Some(5000));
        assert_eq!(second.at(15), Some(1000));
        assert_eq!(second.at(5), None);
        let mut many = second;
        for i in 0..40u64 {
            let data = many.raised(6000 + i);
            many = Offsets::parse("p", &data, 30 + i as i64, many.version + 1).unwrap();
        }
        assert_eq!(many.earlier.len(), HISTORY);
    }

    #[test]
    fn a_node_of_another_scheme_is_refused() {
        for odd in [&b""[..], b"x", b"1 2", b"1 2:x", b"9999999999999999999"] {
            assert!(
                matches!(Offsets::parse("p", odd, 1, 0), Err(Error::Store { .. })),
                "{odd:?}"
            );
        }
    }

    #[test]
    fn a_raise_lifts_tokens_past_the_clock_and_triggers_only_a_granule_behind() {
        let clock = 1_795_755_901_367_913;
        let hint = 4_294_967_396; // epoch 1
        let target = raise(None, clock, hint).unwrap().unwrap();
        assert!(token(target, hint + 1).unwrap() > clock);
        // Within a granule: no raise, and a later zxid's token is within G of the clock.
        let below = target - granule_micros();
        assert_eq!(raise(Some(below), clock, hint).unwrap(), None);
        assert!(!behind(token(below, hint + 1).unwrap(), clock));
        assert_eq!(raise(Some(below - 1), clock, hint).unwrap(), Some(target));
        assert!(behind(token(0, hint).unwrap(), clock));
        assert!(raise(None, u64::MAX, 1).is_err());
        assert!(token(MAX_OFFSET, i64::MAX).is_err());
    }

    #[test]
    fn an_offset_raised_within_a_granule_covers_any_later_create() {
        let clock: u64 = 1_795_755_901_367_913;
        let since: i64 = 4_294_967_396;
        let offset = clock - since as u64;
        let fresh = Offsets::parse("p", offset.to_string().as_bytes(), since, 1).unwrap();
        assert!(covers(&fresh, clock));
        assert!(covers(&fresh, clock + granule_micros()));
        assert!(!covers(&fresh, clock + granule_micros() + 1));
        // A node made with offset 0 covers nothing on a clock of today.
        let zero = Offsets::parse("p", b"0", 22, 0).unwrap();
        assert!(!covers(&zero, clock));
        assert!(!covers(&fresh, u64::MAX));
    }

    #[test]
    fn a_hint_is_dated_by_when_its_request_was_sent() {
        let now = Instant::now();
        let mut hint = ZxidHint::default();
        hint.note(100, now - 2 * HINT_AGE);
        assert_eq!(hint.fresh(now, HINT_AGE), None);
        hint.note(200, now - HINT_AGE / 2);
        assert_eq!(hint.fresh(now, HINT_AGE), Some(200));
        hint.note(500, now - HINT_AGE);
        assert_eq!(hint.fresh(now, HINT_AGE), Some(200));
    }
}
