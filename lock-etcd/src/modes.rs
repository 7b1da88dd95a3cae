//! Shared leases and semaphore permits ([`Mode`]) in a key's queue: what an entry's value
//! says, and when a waiting entry is granted.
//!
//! Every entry of a key, in any mode, is in the key's one queue directory, ordered by create
//! revision, and the exclusive lock's algorithm is unchanged: an exclusive entry holds when it
//! is the oldest. A shared or permit entry is put *waiting* and holds once a transaction
//! *marks* it granted (rewrites its value, keeping its create revision and lease) after a read
//! at one revision found it may:
//! - a reader: no older entry that is not a reader, and the newest older reader marked
//!   (so, by induction, every older reader);
//! - a permit of `L`: every older entry a marked permit of `L`, fewer than `L` of them; it
//!   takes the lowest slot none of them occupies.
//!
//! So grants happen in create-revision order, and the token (the create revision) grows with
//! every grant in any mode: an entry is granted only once every older entry is gone or was
//! granted before it (marked, or for an exclusive entry, gone).

use fencelock_core::Mode;

/// The value of an exclusive entry until a handoff marks it. Older builds (and etcd's own lock
/// clients) put the empty value, which still reads as exclusive; it also tells such an entry
/// apart ([`crate::offset::put_by_raw_minter`]).
const EXCLUSIVE: &str = "exclusive";
/// The value of a reader's entry while it waits.
const SHARED_WAITING: &str = "shared waiting";
/// The value of a granted reader's entry.
const SHARED: &str = "shared";

/// What an entry's value says about it. Exclusive entries have the value `exclusive` (the
/// empty value if an older build or etcd's own clients put them), or a handoff mark once a
/// release handed them the lock ([`crate::handoff`]); anything this module cannot
/// read counts as exclusive, which blocks every other request (never a grant next to an entry
/// it does not understand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryMode {
    Exclusive,
    Shared { granted: bool },
    Permit { limit: u32, slot: Option<u32> },
}

impl EntryMode {
    pub(crate) fn parse(value: &[u8]) -> EntryMode {
        let Ok(value) = std::str::from_utf8(value) else {
            return EntryMode::Exclusive;
        };
        match value {
            SHARED => return EntryMode::Shared { granted: true },
            SHARED_WAITING => return EntryMode::Shared { granted: false },
            _ => {}
        }
        let mut words = value.split(' ');
        let (Some("permit"), Some(limit)) = (words.next(), words.next()) else {
            return EntryMode::Exclusive;
        };
        let Ok(limit) = limit.parse::<u32>() else {
            return EntryMode::Exclusive;
        };
        match (words.next(), words.next(), words.next()) {
            (Some("waiting"), None, None) => EntryMode::Permit { limit, slot: None },
            (Some("slot"), Some(slot), None) => match slot.parse::<u32>() {
                Ok(slot) => EntryMode::Permit {
                    limit,
                    slot: Some(slot),
                },
                Err(_) => EntryMode::Exclusive,
            },
            _ => EntryMode::Exclusive,
        }
    }

    /// The value that records this entry.
    pub(crate) fn value(self) -> String {
        match self {
            EntryMode::Exclusive => EXCLUSIVE.into(),
            EntryMode::Shared { granted: true } => SHARED.into(),
            EntryMode::Shared { granted: false } => SHARED_WAITING.into(),
            EntryMode::Permit { limit, slot: None } => format!("permit {limit} waiting"),
            EntryMode::Permit {
                limit,
                slot: Some(slot),
            } => format!("permit {limit} slot {slot}"),
        }
    }

    /// The waiting entry of a request in `mode`.
    pub(crate) fn waiting(mode: Mode) -> EntryMode {
        match mode {
            Mode::Shared => EntryMode::Shared { granted: false },
            Mode::Permit { limit } => EntryMode::Permit { limit, slot: None },
            _ => EntryMode::Exclusive,
        }
    }

    /// Whether a transaction marked this entry granted (an exclusive entry is granted by
    /// being the oldest, never marked).
    pub(crate) fn granted(self) -> bool {
        match self {
            EntryMode::Exclusive => false,
            EntryMode::Shared { granted } => granted,
            EntryMode::Permit { slot, .. } => slot.is_some(),
        }
    }

    /// The lease mode of a granted entry.
    pub(crate) fn mode(self) -> Mode {
        match self {
            EntryMode::Exclusive => Mode::Exclusive,
            EntryMode::Shared { .. } => Mode::Shared,
            EntryMode::Permit { limit, .. } => Mode::permits(limit),
        }
    }
}

/// An entry as a waiter read it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) key: Vec<u8>,
    pub(crate) mode: EntryMode,
    pub(crate) modified: i64,
}

/// What a waiting shared or permit entry does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Mark the entry granted with this value; a permit's slot.
    Grant { mark: EntryMode, slot: Option<u32> },
    /// Granted permits of the key have another limit.
    Mismatch { held: u32 },
    /// Wait for a change to one of these older entries. `pending`: what blocks are only
    /// compatible requests between their queueing and their grant, which settle at once.
    Blocked { watch: Vec<Vec<u8>>, pending: bool },
}

/// A reader's decision from the newest older entry that is not a reader and the newest older
/// reader.
pub(crate) fn decide_shared(not_shared: Option<&Seen>, shared: Option<&Seen>) -> Decision {
    if let Some(writer) = not_shared {
        return Decision::Blocked {
            watch: vec![writer.key.clone()],
            pending: false,
        };
    }
    match shared.map(|s| s.mode) {
        None | Some(EntryMode::Shared { granted: true }) => Decision::Grant {
            mark: EntryMode::Shared { granted: true },
            slot: None,
        },
        Some(EntryMode::Shared { granted: false }) => Decision::Blocked {
            watch: shared.map(|s| vec![s.key.clone()]).unwrap_or_default(),
            pending: true,
        },
        // Something under the readers' names that is no reader: treat it as a writer.
        Some(_) => Decision::Blocked {
            watch: shared.map(|s| vec![s.key.clone()]).unwrap_or_default(),
            pending: false,
        },
    }
}

/// A permit's decision from every older entry of the key (oldest first).
pub(crate) fn decide_permit(limit: u32, older: &[Seen]) -> Decision {
    let mut used = Vec::with_capacity(older.len());
    let mut blocked = false;
    let mut pending = true;
    for entry in older {
        match entry.mode {
            EntryMode::Permit {
                limit: held,
                slot: Some(_),
            } if held != limit => return Decision::Mismatch { held },
            EntryMode::Permit {
                slot: Some(slot), ..
            } => used.push(slot),
            // Waiting permits, of this limit or (soon refused) of another.
            EntryMode::Permit { slot: None, .. } => blocked = true,
            EntryMode::Exclusive | EntryMode::Shared { .. } => {
                blocked = true;
                pending = false;
            }
        }
    }
    if older.len() >= limit as usize {
        blocked = true;
        pending = false;
    }
    if blocked {
        return Decision::Blocked {
            watch: older.iter().map(|e| e.key.clone()).collect(),
            pending,
        };
    }
    // Fewer than `limit` older entries, so one of `0..limit` is free.
    let slot = (0..limit).find(|slot| !used.contains(slot)).unwrap_or(0);
    Decision::Grant {
        mark: EntryMode::Permit {
            limit,
            slot: Some(slot),
        },
        slot: Some(slot),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(key: &str, mode: EntryMode) -> Seen {
        Seen {
            key: key.as_bytes().to_vec(),
            mode,
            modified: 1,
        }
    }

    fn permit(limit: u32, slot: Option<u32>) -> EntryMode {
        EntryMode::Permit { limit, slot }
    }

    #[test]
    fn values_round_trip_and_unknown_ones_count_as_exclusive() {
        for mode in [
            EntryMode::Exclusive,
            EntryMode::Shared { granted: true },
            EntryMode::Shared { granted: false },
            permit(3, None),
            permit(1024, Some(1023)),
        ] {
            assert_eq!(EntryMode::parse(mode.value().as_bytes()), mode);
        }
        for odd in [
            &b""[..],
            b"permit",
            b"permit x waiting",
            b"permit 3 slot",
            b"permit 3 slot -1",
            b"permit 3 waiting now",
            b"shared ",
            b"\xff",
        ] {
            assert_eq!(EntryMode::parse(odd), EntryMode::Exclusive, "{odd:?}");
        }
    }

    #[test]
    fn a_reader_waits_for_older_writers_and_for_older_readers_grant() {
        let writer = seen("w", EntryMode::Exclusive);
        let granted = seen("r1", EntryMode::Shared { granted: true });
        let waiting = seen("r2", EntryMode::Shared { granted: false });
        let grant = Decision::Grant {
            mark: EntryMode::Shared { granted: true },
            slot: None,
        };
        assert_eq!(decide_shared(None, None), grant);
        assert_eq!(decide_shared(None, Some(&granted)), grant);
        assert_eq!(
            decide_shared(Some(&writer), Some(&granted)),
            Decision::Blocked {
                watch: vec![b"w".to_vec()],
                pending: false
            }
        );
        assert_eq!(
            decide_shared(None, Some(&waiting)),
            Decision::Blocked {
                watch: vec![b"r2".to_vec()],
                pending: true
            }
        );
    }

    #[test]
    fn a_permit_is_granted_among_the_limit_oldest_in_the_lowest_free_slot() {
        assert_eq!(
            decide_permit(3, &[]),
            Decision::Grant {
                mark: permit(3, Some(0)),
                slot: Some(0)
            }
        );
        let older = [seen("a", permit(3, Some(0))), seen("b", permit(3, Some(2)))];
        assert_eq!(
            decide_permit(3, &older),
            Decision::Grant {
                mark: permit(3, Some(1)),
                slot: Some(1)
            }
        );
        let full = [
            seen("a", permit(3, Some(0))),
            seen("b", permit(3, Some(2))),
            seen("c", permit(3, Some(1))),
        ];
        assert!(matches!(
            decide_permit(3, &full),
            Decision::Blocked { pending: false, ref watch } if watch.len() == 3
        ));
    }

    #[test]
    fn a_permit_waits_for_older_waiters_and_other_modes_and_refuses_another_limit() {
        let pending = [seen("a", permit(3, Some(0))), seen("b", permit(3, None))];
        assert!(matches!(
            decide_permit(3, &pending),
            Decision::Blocked { pending: true, .. }
        ));
        let other_waiting = [seen("a", permit(5, None))];
        assert!(matches!(
            decide_permit(3, &other_waiting),
            Decision::Blocked { pending: true, .. }
        ));
        for mode in [EntryMode::Exclusive, EntryMode::Shared { granted: true }] {
            let behind = [seen("a", permit(3, Some(0))), seen("w", mode)];
            assert!(matches!(
                decide_permit(3, &behind),
                Decision::Blocked { pending: false, .. }
            ));
        }
        let held = [seen("a", permit(3, Some(0))), seen("b", permit(5, Some(0)))];
        assert_eq!(decide_permit(5, &held), Decision::Mismatch { held: 3 });
        assert_eq!(decide_permit(3, &held), Decision::Mismatch { held: 5 });
    }
}
