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
//! This is the layout of fencelock-postgres's lock-id scheme 2, and it carries the same number: the
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

/// The comment a fence table of scheme `scheme` carries.
pub(crate) fn scheme_comment(scheme: u8) -> String {
    format!("fencelock fence table, lock-id scheme {scheme}")
}

/// The lock space of one store handle: its fence table and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Space<'a> {
    pub(crate) database: &'a str,
    pub(crate) table: &'a str,
    pub(crate) namespace: &'a str,
}

/// Accepts a fence table whose comment records this build's lock-id scheme, and refuses any
/// other with a message that says what to do.
pub(crate) fn check_recorded_scheme(
    fence_table: &str,
    comment: &str,
) -> fencelock_core::Result<()> {
    if comment == scheme_comment(LOCK_ID_SCHEME) {
        return Ok(());
    }
    let recorded = comment
        .strip_prefix("fencelock fence table, lock-id scheme ")
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let message = match recorded {
        Some(scheme) => format!(
            "the fence table {fence_table} records lock-id scheme {scheme}, and this fencelock-mysql \
             uses scheme {LOCK_ID_SCHEME}: stores of different schemes lock different names for \
             one key and would not exclude each other; run every store on {fence_table} at one \
             scheme"
        ),
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
    fn only_this_builds_recorded_scheme_is_accepted() {
        assert!(check_recorded_scheme("`d`.`t`", &scheme_comment(2)).is_ok());
        for (comment, says) in [
            ("", "records no lock-id scheme"),
            ("orders of the day", "records no lock-id scheme"),
            (
                "fencelock fence table, lock-id scheme 3",
                "records lock-id scheme 3,",
            ),
            (
                "fencelock fence table, lock-id scheme 1",
                "records lock-id scheme 1,",
            ),
        ] {
            match check_recorded_scheme("`d`.`t`", comment) {
                Err(fencelock_core::Error::Store { message, .. }) => {
                    assert!(message.contains(says), "{message}");
                    assert!(message.contains("`d`.`t`"), "{message}");
                }
                other => panic!("{comment:?}: expected a store error, got {other:?}"),
            }
        }
    }
}
