//! From a (fence table, namespace, key) triple to a `GET_LOCK` name.
//!
//! # The hash, lock-id scheme 2
//! `lock_name = "fencelock2:" + lowercase hex of SHA-256(input)[0..20]` (51 characters, within
//! MySQL's limit of 64), where `input` is
//!
//! ```text
//! 0x02                        the scheme's version byte
//! len(database) as u32 BE     the fence table's database, as configured (case matters)
//! database bytes
//! len(table) as u32 BE        the fence table's name
//! table bytes
//! len(namespace) as u32 BE    so ("ab", "c") and ("a", "bc") differ
//! namespace bytes             UTF-8
//! key bytes                   UTF-8, any byte including NUL
//! ```
//!
//! This is the layout of the PostgreSQL store's lock-id scheme 2, and it carries the same number: the
//! fence table is part of the lock, so a lock and its fencing counter always come as a pair,
//! and handles on two fence tables never contend (like two namespaces). This store never had
//! a scheme 1. `GET_LOCK` names are server-wide, across databases, which is why the database
//! is part of the input.
//!
//! The scheme is recorded in the fence table's comment (see the crate docs, "Lock-id
//! scheme"): stores of two schemes would lock different names for one key, so a store refuses
//! a fence table that records another scheme. [`lock_name`] pins the scheme and the unit tests
//! hold test vectors.
//!
//! Two keys may hash to one name (the chance for any two keys is 2⁻¹⁶⁰). That is *false
//! contention*, never a safety problem: the two keys then exclude each other, and each keeps its
//! own fencing counter (the fence table is keyed by the key itself, not the name).

use sha2::{Digest, Sha256};

/// The lock-id scheme this build uses: the version byte of the hash documented in this module,
/// and the version a fence table records.
pub const LOCK_ID_SCHEME: u8 = 2;

/// What every lock name of this scheme starts with.
const PREFIX: &str = "fencelock2:";

/// How many bytes of the digest the name keeps.
const DIGEST_BYTES: usize = 20;

/// The `GET_LOCK` name of `key` in `namespace`, for the fence table `database.table` (lock-id
/// scheme 2, see the module docs).
pub fn lock_name(database: &str, table: &str, namespace: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update([LOCK_ID_SCHEME]);
    // Database, table and namespace are at most 64 bytes (checked by the config), so each
    // length fits in a u32.
    for part in [database, table, namespace] {
        hasher.update((part.len() as u32).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let mut name = String::with_capacity(PREFIX.len() + 2 * DIGEST_BYTES);
    name.push_str(PREFIX);
    for byte in &digest[..DIGEST_BYTES] {
        name.push(char::from(HEX[usize::from(byte >> 4)]));
        name.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    name
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The fence scheme this build writes and reads: tokens are `max(counter + 1, the server's clock
/// in µs)` (see the crate docs, "Fencing tokens"). Recorded in the fence table's comment and
/// as the CHECK on its `fence_scheme` column.
pub(crate) const FENCE_SCHEME: u8 = 3;

/// What every comment of a fencelock fence table starts with, before the lock-id scheme.
const COMMENT_PREFIX: &str = "fencelock fence table, lock-id scheme ";
/// What follows the lock-id scheme in a comment that records a fence scheme (3 and later;
/// builds of fence schemes 1 and 2 recorded none there).
const FENCE_SCHEME_INFIX: &str = ", fence scheme ";

/// The comment a fence table of lock-id scheme `scheme`, made by this build, carries.
pub(crate) fn scheme_comment(scheme: u8) -> String {
    format!("{COMMENT_PREFIX}{scheme}{FENCE_SCHEME_INFIX}{FENCE_SCHEME}")
}

/// The lock space of one store handle: its fence table and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Space<'a> {
    pub(crate) database: &'a str,
    pub(crate) table: &'a str,
    pub(crate) namespace: &'a str,
}

/// Accepts a fence table whose comment records this build's lock-id scheme and fence scheme,
/// and refuses any other with a message that says what to do. A comment without a fence
/// scheme is an earlier build's: fence scheme 2 if the table has the `fence_scheme` column
/// (`fence_scheme_column`), 1 if not.
pub(crate) fn check_recorded_scheme(
    fence_table: &str,
    comment: &str,
    fence_scheme_column: bool,
) -> fencelock_core::Result<()> {
    if comment == scheme_comment(LOCK_ID_SCHEME) {
        return Ok(());
    }
    fn number(n: &str) -> Option<&str> {
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(n)
    }
    let recorded = comment.strip_prefix(COMMENT_PREFIX).and_then(|rest| {
        match rest.split_once(FENCE_SCHEME_INFIX) {
            Some((lock_id, fence)) => Some((number(lock_id)?, Some(number(fence)?))),
            None => Some((number(rest)?, None)),
        }
    });
    let message = match recorded {
        Some((lock_id, _)) if lock_id != LOCK_ID_SCHEME.to_string() => format!(
            "the fence table {fence_table} records lock-id scheme {lock_id}, and this fencelock-mysql \
             uses scheme {LOCK_ID_SCHEME}: stores of different schemes lock different names for \
             one key and would not exclude each other; run every store on {fence_table} at one \
             scheme"
        ),
        Some((_, Some(fence))) if fence.parse::<u64>().is_ok_and(|f| f > u64::from(FENCE_SCHEME)) => {
            format!(
                "the fence table {fence_table} records fence scheme {fence}, which a later build \
                 made, and this fencelock-mysql uses scheme {FENCE_SCHEME}: run that build (this \
                 one cannot tell whether its tokens would be greater)"
            )
        }
        Some((_, fence)) => {
            let (records, tokens) = match fence {
                Some(fence) => (format!("fence scheme {fence}"), "whose tokens are not this build's"),
                None if fence_scheme_column => (
                    "fence scheme 2".to_owned(),
                    "whose tokens are plain counters, far below the clock (a resource fenced \
                     under another store would refuse them)",
                ),
                None => (
                    "no fence scheme".to_owned(),
                    "whose new rows start at 1 and would reuse tokens once rows are removed",
                ),
            };
            format!(
                "the fence table {fence_table} records {records}: an earlier build made it, \
                 {tokens}. Stop every store of that build and run \
                 MysqlConfig::fence_scheme_upgrade_sql() once (counters are kept; tokens jump \
                 once, upward, to the clock)"
            )
        }
        None => format!(
            "the table {fence_table} records no lock-id scheme (its comment is {comment:?}): it \
             was not made by fencelock-mysql; choose another table= or create it with \
             MysqlConfig::fence_table_ddl()"
        ),
    };
    Err(fencelock_core::Error::Store {
        message,
        source: None,
    })
}

/// What a lease locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The `GET_LOCK` name.
    pub(crate) lock_name: String,
    /// The fence row's namespace.
    pub(crate) namespace: String,
    /// The fence row's key bytes.
    pub(crate) fence_key: Vec<u8>,
    /// The key shown on the lease.
    pub(crate) display: String,
}

impl Target {
    pub(crate) fn hashed(space: &Space<'_>, key: &str) -> Self {
        Target {
            lock_name: lock_name(space.database, space.table, space.namespace, key),
            namespace: space.namespace.to_owned(),
            fence_key: key.as_bytes().to_vec(),
            display: key.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_2_test_vectors_never_change() {
        // Pinned (computed independently with Python's hashlib): changing these values breaks
        // every deployed lock.
        let vectors = [
            (
                ("fencelock", "fencelock_fence", "default", "nightly-export"),
                "fencelock2:57285d14c8d44599399c22cc890fce387e84fa04",
            ),
            (
                ("fencelock", "fencelock_fence", "default", "k\u{0}"),
                "fencelock2:51cbc7f02e2d01635ffa2464b175f73bf140d152",
            ),
            (
                ("fencelock", "fencelock_fence", "billing", "nightly-export"),
                "fencelock2:1b5df384b348a90d0af9fc1cfb8feb79068d526f",
            ),
            (
                ("app", "fence_v1", "billing", "nightly-export"),
                "fencelock2:49dc4fff227ebf2477b2e18eb98dee5764a6187a",
            ),
        ];
        for ((database, table, namespace, key), name) in vectors {
            assert_eq!(lock_name(database, table, namespace, key), name);
            assert!(name.len() <= 64, "MySQL refuses names over 64 characters");
        }
    }

    #[test]
    fn table_namespace_and_key_boundaries_do_not_alias() {
        let n = lock_name;
        assert_ne!(n("d", "t", "ab", "c"), n("d", "t", "a", "bc"));
        assert_ne!(n("d", "t", "ns", "k"), n("d", "t", "ns", "k\u{0}"));
        assert_ne!(n("d", "t", "ns", "k"), n("d", "t", "ns", "K"));
        // The fence table is part of the lock: another table or database is another lock.
        assert_ne!(n("d", "t", "ns", "k"), n("d", "u", "ns", "k"));
        assert_ne!(n("d", "t", "ns", "k"), n("e", "t", "ns", "k"));
        assert_ne!(n("d", "tn", "s", "k"), n("d", "t", "ns", "k"));
        assert_ne!(n("dt", "t", "ns", "k"), n("d", "tt", "ns", "k"));
    }

    #[test]
    fn only_this_builds_recorded_schemes_are_accepted() {
        assert_eq!(
            scheme_comment(2),
            "fencelock fence table, lock-id scheme 2, fence scheme 3"
        );
        assert!(check_recorded_scheme("`d`.`t`", &scheme_comment(2), true).is_ok());
        let before_scheme_3 = "fencelock fence table, lock-id scheme 2";
        for (comment, column, says) in [
            ("", true, "records no lock-id scheme"),
            ("orders of the day", true, "records no lock-id scheme"),
            (
                "fencelock fence table, lock-id scheme 2, fence scheme x",
                true,
                "records no lock-id scheme",
            ),
            (
                "fencelock fence table, lock-id scheme 3",
                true,
                "records lock-id scheme 3,",
            ),
            (
                "fencelock fence table, lock-id scheme 1, fence scheme 3",
                true,
                "records lock-id scheme 1,",
            ),
            (before_scheme_3, true, "records fence scheme 2:"),
            (before_scheme_3, false, "records no fence scheme:"),
            (
                "fencelock fence table, lock-id scheme 2, fence scheme 4",
                true,
                "records fence scheme 4, which a later build",
            ),
        ] {
            match check_recorded_scheme("`d`.`t`", comment, column) {
                Err(fencelock_core::Error::Store { message, .. }) => {
                    assert!(message.contains(says), "{comment:?}: {message}");
                    assert!(message.contains("`d`.`t`"), "{message}");
                }
                other => panic!("{comment:?}: expected a store error, got {other:?}"),
            }
        }
        match check_recorded_scheme("`d`.`t`", before_scheme_3, true) {
            Err(fencelock_core::Error::Store { message, .. }) => {
                assert!(message.contains("fence_scheme_upgrade_sql"), "{message}")
            }
            other => panic!("expected a store error, got {other:?}"),
        }
    }
}
