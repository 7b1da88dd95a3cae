//! From a (fence table, namespace, key) triple to PostgreSQL's 64-bit advisory lock space.
//!
//! # The hash, lock-id scheme 2
//! `lock_id = i64::from_be_bytes(SHA-256(input)[0..8])` where `input` is
//!
//! ```text
//! 0x02                      the scheme's version byte
//! len(schema) as u32 BE     the fence table's schema, as configured (case matters)
//! schema bytes
//! len(table) as u32 BE      the fence table's name
//! table bytes
//! len(namespace) as u32 BE  so ("ab", "c") and ("a", "bc") differ
//! namespace bytes           UTF-8
//! key bytes                 UTF-8, any byte including NUL
//! ```
//!
//! The fence table is part of the input because the lock and its fencing counter must come as
//! a pair: two handles that exclude each other must bump one counter. Scheme 1 hashed only
//! (namespace, key), so handles with different `table=` or `schema=` took one lock but kept
//! two counters, and a lease through the second table could get a smaller token than the one
//! before it. Under scheme 2 they never contend, like two namespaces.
//!
//! The scheme is recorded in the database (see the crate docs, "Upgrading the lock-id
//! scheme"): stores of two schemes would lock different ids for one key, so a store refuses a
//! fence table that records another scheme. [`lock_id`] pins the scheme and the unit tests hold
//! test vectors.
//!
//! Two keys may hash to one id (the chance for any two keys is 2⁻⁶⁴). That is *false
//! contention*, never a safety problem: the two keys then exclude each other, and each keeps its
//! own fencing counter (the fence table is keyed by the key itself, not the id).

use fencelock_core::OwnerId;
use sha2::{Digest, Sha256};

/// The lock-id scheme this build uses: the version byte of the hash documented in this module,
/// and the version a fence table records.
pub const LOCK_ID_SCHEME: u8 = 2;

/// The token scheme this build uses and a fence table records (constraint
/// `fencelock_fence_scheme_3`): a token is `max(counter + 1, the server's clock in µs since the
/// Unix epoch)`, read in the statement that mints it, so tokens continue from another store's
/// after a swap and idle rows may be removed. Fence scheme 2 floored tokens at the bumping
/// transaction's id; fence scheme 1 (earlier builds, which recorded nothing) minted plain
/// counters. See the crate docs, "Per-key state" and "Tokens across a swap of stores".
pub const FENCE_SCHEME: u8 = 3;

/// The advisory lock id of `key` in `namespace`, for the fence table `schema.table` (lock-id
/// scheme 2, see the module docs).
pub fn lock_id(schema: &str, table: &str, namespace: &str, key: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update([LOCK_ID_SCHEME]);
    // Schema, table and namespace are at most 63 bytes (checked by the config), so each length
    // fits in a u32.
    for part in [schema, table, namespace] {
        hasher.update((part.len() as u32).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The `(classid, objid)` pair under which `pg_locks` shows a single-`bigint` advisory lock
/// (`objsubid` is 1 for these).
pub fn pg_locks_ids(lock_id: i64) -> (u32, u32) {
    let bits = lock_id as u64;
    ((bits >> 32) as u32, bits as u32)
}

/// The advisory locks a key's shared leases and semaphore permits use next to its lock `M`
/// (see the crate docs, "Shared leases and semaphore permits"). Each id is
/// `i64::from_be_bytes(SHA-256("fencelock-mode\0" || M as 8 bytes BE || role || index as u32
/// BE)[0..8])`, so it never aliases a key's own lock id except by a 2⁻⁶⁴ chance (false
/// contention, as for two keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModeLocks {
    /// Taken per transaction by every shared or permit acquire of the key: serialises their
    /// checks.
    pub(crate) gate: i64,
    /// Held shared by every reader: the readers' group.
    pub(crate) readers: i64,
    /// Held shared by every permit holder: the permits' group.
    pub(crate) permits: i64,
    /// Held, next to the key's lock held exclusively, by a reader or permit waiter whose turn
    /// the queue granted: it marks that exclusive hold as a waiter's, not a lease.
    pub(crate) turn: i64,
    main: i64,
}

impl ModeLocks {
    pub(crate) fn of(main: i64) -> Self {
        ModeLocks {
            gate: derived_id(main, b"gate", 0),
            readers: derived_id(main, b"readers", 0),
            permits: derived_id(main, b"permits", 0),
            turn: derived_id(main, b"turn", 0),
            main,
        }
    }

    /// The lock of permit slot `slot`.
    pub(crate) fn slot(&self, slot: u32) -> i64 {
        derived_id(self.main, b"slot", slot)
    }

    /// The locks of slots `0..limit`, in slot order.
    pub(crate) fn slots(&self, limit: u32) -> Vec<i64> {
        (0..limit).map(|slot| self.slot(slot)).collect()
    }
}

fn derived_id(main: i64, role: &[u8], index: u32) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"fencelock-mode\0");
    hasher.update(main.to_be_bytes());
    hasher.update(role);
    hasher.update(index.to_be_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The lock space of one store handle: its fence table and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Space<'a> {
    pub(crate) schema: &'a str,
    pub(crate) table: &'a str,
    pub(crate) namespace: &'a str,
}

/// Accepts a fence table whose recorded lock-id schemes (the suffixes of its
/// `fencelock_lock_id_scheme_<n>` constraints) are exactly this build's, and refuses any other
/// with a message that says what to do.
pub(crate) fn check_recorded_scheme(
    fence_table: &str,
    recorded: &[String],
) -> fencelock_core::Result<()> {
    let ours = LOCK_ID_SCHEME.to_string();
    if recorded.len() == 1 && recorded[0] == ours {
        return Ok(());
    }
    let message = if recorded.is_empty() {
        format!(
            "the fence table {fence_table} records no lock-id scheme: an older fencelock-postgres \
             made it and uses lock-id scheme 1, whose lock ids do not exclude this version's \
             (scheme {ours}); stop every store that uses {fence_table}, then run \
             PostgresConfig::lock_id_scheme_upgrade_sql() once (crate docs: \"Upgrading the \
             lock-id scheme\")"
        )
    } else {
        format!(
            "the fence table {fence_table} records lock-id scheme {}, and this fencelock-postgres \
             uses scheme {ours}: stores of different schemes lock different ids for one key and \
             would not exclude each other; run every store on {fence_table} at one scheme",
            recorded.join(" and ")
        )
    };
    Err(fencelock_core::Error::Store {
        message,
        source: None,
    })
}

/// Accepts a fence table that records exactly this build's token scheme ([`FENCE_SCHEME`]),
/// and refuses one made by an earlier build (plain counters, or transaction-id floors, which a
/// key whose row was removed would restart below this build's clock-floored tokens) with a
/// message that says what to do.
pub(crate) fn check_recorded_fence_scheme(
    fence_table: &str,
    recorded: &[String],
) -> fencelock_core::Result<()> {
    let ours = FENCE_SCHEME.to_string();
    if recorded.len() == 1 && recorded[0] == ours {
        return Ok(());
    }
    let older = match recorded {
        [] => Some("records no fence scheme: an older fencelock-postgres made it and mints plain counters"),
        [two] if two == "2" => Some(
            "records fence scheme 2: an older fencelock-postgres mints its tokens from transaction ids",
        ),
        _ => None,
    };
    let message = match older {
        Some(what) => format!(
            "the fence table {fence_table} {what}, far below this version's tokens (fence scheme \
             {ours}: the server's clock in µs), so a key whose row was removed would restart \
             below them; stop every store that uses {fence_table}, then run \
             PostgresConfig::fence_scheme_upgrade_sql() once (counters kept, tokens jump once, \
             upward, to the clock; crate docs: \"Per-key state\")"
        ),
        None => format!(
            "the fence table {fence_table} records fence scheme {}, and this fencelock-postgres \
             uses scheme {ours}: run every store on {fence_table} at one scheme",
            recorded.join(" and ")
        ),
    };
    Err(fencelock_core::Error::Store {
        message,
        source: None,
    })
}

/// What a lease locks: a hashed key, or a raw id given by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The advisory lock id.
    pub(crate) lock_id: i64,
    /// The fence row's namespace: the configured one, or `""` for raw ids.
    pub(crate) namespace: String,
    /// The fence row's key bytes: the key, or the raw id in big-endian order.
    pub(crate) fence_key: Vec<u8>,
    /// The key shown on the lease.
    pub(crate) display: String,
    /// The holder's label the grant writes into the fence row, if any.
    pub(crate) label: Option<String>,
}

impl Target {
    pub(crate) fn hashed(space: &Space<'_>, key: &str) -> Self {
        Target {
            lock_id: lock_id(space.schema, space.table, space.namespace, key),
            namespace: space.namespace.to_owned(),
            fence_key: key.as_bytes().to_vec(),
            display: key.to_owned(),
            label: None,
        }
    }

    /// The target, its grant labelled `label`.
    pub(crate) fn labelled(mut self, label: Option<&str>) -> Self {
        self.label = label.map(str::to_owned);
        self
    }

    /// The label as the fence row keeps it, behind its owner's id: a row bumped by a build
    /// that writes no label keeps the one before, which is then not the new holder's.
    pub(crate) fn stored_label(&self, owner: OwnerId) -> Option<String> {
        self.label.as_ref().map(|label| format!("{owner}:{label}"))
    }

    /// Raw ids keep their fence rows under the empty namespace, which no configuration may
    /// use, so they never share a counter with a hashed key. A raw id is the same lock whatever
    /// the fence table; its leases through different tables are ordered by the server's clock,
    /// which every token is floored at (see `bump_fence!`).
    pub(crate) fn raw(lock_id: i64) -> Self {
        Target {
            lock_id,
            namespace: String::new(),
            fence_key: lock_id.to_be_bytes().to_vec(),
            display: raw_key_name(lock_id),
            label: None,
        }
    }
}

/// The key a lease on raw id `lock_id` shows: `pg_advisory_lock(<id>)`.
pub fn raw_key_name(lock_id: i64) -> String {
    format!("pg_advisory_lock({lock_id})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: Space<'static> = Space {
        schema: "public",
        table: "fencelock_fence",
        namespace: "default",
    };

    #[test]
    fn scheme_2_test_vectors_never_change() {
        // Pinned (computed independently with Python's hashlib): changing these values breaks
        // every deployed lock.
        assert_eq!(
            lock_id("public", "fencelock_fence", "default", "nightly-export"),
            2_764_142_552_312_014_628
        );
        assert_eq!(
            lock_id("public", "fencelock_fence", "default", "k\u{0}"),
            3_430_480_870_861_049_295
        );
        assert_eq!(
            lock_id("public", "fencelock_fence", "billing", "nightly-export"),
            5_276_998_900_112_468_349
        );
        assert_eq!(
            lock_id("locks", "fence_v1", "billing", "nightly-export"),
            3_049_712_024_267_354_834
        );
    }

    #[test]
    fn table_namespace_and_key_boundaries_do_not_alias() {
        assert_ne!(lock_id("s", "t", "ab", "c"), lock_id("s", "t", "a", "bc"));
        assert_ne!(
            lock_id("s", "t", "ns", "k"),
            lock_id("s", "t", "ns", "k\u{0}")
        );
        assert_ne!(lock_id("s", "t", "ns", "k"), lock_id("s", "t", "ns", "K"));
        // The fence table is part of the lock: another table or schema is another lock.
        assert_ne!(lock_id("s", "t", "ns", "k"), lock_id("s", "u", "ns", "k"));
        assert_ne!(lock_id("s", "t", "ns", "k"), lock_id("r", "t", "ns", "k"));
        assert_ne!(lock_id("s", "tn", "s", "k"), lock_id("s", "t", "ns", "k"));
        assert_ne!(lock_id("st", "t", "ns", "k"), lock_id("s", "tt", "ns", "k"));
    }

    #[test]
    fn only_this_builds_recorded_scheme_is_accepted() {
        let check = |recorded: &[&str]| {
            let recorded: Vec<String> = recorded.iter().map(|s| s.to_string()).collect();
            check_recorded_scheme("\"s\".\"t\"", &recorded)
        };
        assert!(check(&["2"]).is_ok());
        for (recorded, says) in [
            (&[][..], "records no lock-id scheme"),
            (&["1"][..], "records lock-id scheme 1,"),
            (&["3"][..], "records lock-id scheme 3,"),
            (&["2", "3"][..], "records lock-id scheme 2 and 3,"),
        ] {
            match check(recorded) {
                Err(fencelock_core::Error::Store { message, .. }) => {
                    assert!(message.contains(says), "{message}");
                    assert!(message.contains("\"s\".\"t\""), "{message}");
                }
                other => panic!("{recorded:?}: expected a store error, got {other:?}"),
            }
        }
    }

    #[test]
    fn only_this_builds_fence_scheme_is_accepted_and_older_ones_name_the_upgrade() {
        let check = |recorded: &[&str]| {
            let recorded: Vec<String> = recorded.iter().map(|s| s.to_string()).collect();
            check_recorded_fence_scheme("\"s\".\"t\"", &recorded)
        };
        assert!(check(&["3"]).is_ok());
        for (recorded, says, upgrade) in [
            (&[][..], "records no fence scheme", true),
            (&["2"][..], "records fence scheme 2:", true),
            (&["4"][..], "records fence scheme 4,", false),
            (&["2", "3"][..], "records fence scheme 2 and 3,", false),
        ] {
            match check(recorded) {
                Err(fencelock_core::Error::Store { message, .. }) => {
                    assert!(message.contains(says), "{message}");
                    assert!(message.contains("\"s\".\"t\""), "{message}");
                    assert_eq!(
                        message.contains("fence_scheme_upgrade_sql"),
                        upgrade,
                        "{message}"
                    );
                    assert!(!message.contains("  "), "{message}");
                }
                other => panic!("{recorded:?}: expected a store error, got {other:?}"),
            }
        }
    }

    #[test]
    fn mode_locks_are_distinct_and_stable() {
        let main = lock_id("public", "fencelock_fence", "default", "nightly-export");
        let locks = ModeLocks::of(main);
        let mut ids = vec![main, locks.gate, locks.readers, locks.permits];
        ids.extend(locks.slots(4));
        let count = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), count);
        assert_eq!(ModeLocks::of(main), locks);
        assert_ne!(ModeLocks::of(main + 1).gate, locks.gate);
    }

    #[test]
    fn pg_locks_ids_split_the_id_like_postgres() {
        // Checked against pg_locks for pg_advisory_lock(-1234567890123).
        assert_eq!(
            pg_locks_ids(-1_234_567_890_123),
            (4_294_967_008, 2_382_691_125)
        );
        assert_eq!(pg_locks_ids(42), (0, 42));
    }

    #[test]
    fn raw_targets_use_the_reserved_namespace() {
        let raw = Target::raw(42);
        assert_eq!(raw.lock_id, 42);
        assert_eq!(raw.namespace, "");
        assert_eq!(raw.fence_key, 42i64.to_be_bytes());
        assert_eq!(raw.display, "pg_advisory_lock(42)");
        let hashed = Target::hashed(&DEFAULT, "pg_advisory_lock(42)");
        assert_ne!(hashed.lock_id, 42);
        assert_eq!(hashed.namespace, "default");
    }
}
