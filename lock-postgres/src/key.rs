//! From a (namespace, key) pair to PostgreSQL's 64-bit advisory lock space.
//!
//! # The hash, version 1
//! `lock_id = i64::from_be_bytes(SHA-256(input)[0..8])` where `input` is
//!
//! ```text
//! 0x01                      the version byte of this scheme
//! len(namespace) as u32 BE  so ("ab", "c") and ("a", "bc") differ
//! namespace bytes           UTF-8
//! key bytes                 UTF-8, any byte including NUL
//! ```
//!
//! The scheme is stable: a change would make two versions of this crate lock different ids for
//! one key, so a new scheme gets a new version byte and is opt-in. [`lock_id`] pins it and the
//! unit tests hold test vectors.
//!
//! Two keys may hash to one id (the chance for any two keys is 2⁻⁶⁴). That is *false
//! contention*, never a safety problem: the two keys then exclude each other, and each keeps its
//! own fencing counter (the fence table is keyed by the key itself, not the id).

use sha2::{Digest, Sha256};

/// The version byte of the hash scheme documented in this module.
pub const HASH_VERSION: u8 = 1;

/// The advisory lock id of `key` in `namespace` (hash scheme version 1, see the module docs).
pub fn lock_id(namespace: &str, key: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update([HASH_VERSION]);
    // Namespaces are at most 63 bytes (checked by the config), so the length fits in a u32.
    hasher.update((namespace.len() as u32).to_be_bytes());
    hasher.update(namespace.as_bytes());
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
}

impl Target {
    pub(crate) fn hashed(namespace: &str, key: &str) -> Self {
        Target {
            lock_id: lock_id(namespace, key),
            namespace: namespace.to_owned(),
            fence_key: key.as_bytes().to_vec(),
            display: key.to_owned(),
        }
    }

    /// Raw ids keep their fence rows under the empty namespace, which no configuration may
    /// use, so they never share a counter with a hashed key.
    pub(crate) fn raw(lock_id: i64) -> Self {
        Target {
            lock_id,
            namespace: String::new(),
            fence_key: lock_id.to_be_bytes().to_vec(),
            display: raw_key_name(lock_id),
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

    #[test]
    fn hash_v1_test_vectors_never_change() {
        // Pinned (computed independently with Python's hashlib): changing these values breaks
        // every deployed lock.
        assert_eq!(
            lock_id("default", "nightly-export"),
            -7_853_899_317_936_053_717
        );
        assert_eq!(lock_id("default", "k\u{0}"), 1_418_000_564_283_776_819);
        assert_eq!(
            lock_id("billing", "nightly-export"),
            -4_831_355_121_944_174_380
        );
    }

    #[test]
    fn namespace_and_key_boundaries_do_not_alias() {
        assert_ne!(lock_id("ab", "c"), lock_id("a", "bc"));
        assert_ne!(lock_id("ns", "k"), lock_id("ns", "k\u{0}"));
        assert_ne!(lock_id("ns", "k"), lock_id("ns", "K"));
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
        let hashed = Target::hashed("default", "pg_advisory_lock(42)");
        assert_ne!(hashed.lock_id, 42);
        assert_eq!(hashed.namespace, "default");
    }
}
