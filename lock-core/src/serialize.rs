//! `serde::Serialize` for the values a caller prints or stores (the `serde` feature): a lease's
//! public fields, a mode, a key's status and its holders, a listing and its rows, an
//! election's leader. Durations are
//! whole milliseconds (`remaining_ms`, `ttl_ms`), owner ids their hex text, and a field the
//! store cannot tell is `null`. Written by hand: a lease holds store state and a revocation
//! that are not data, and each shape is the one `lockctl --json` prints.

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::{HeldKey, HolderStatus, KeyStatus, Leader, Lease, ListCursor, Listing, Mode, OwnerId};

fn millis(duration: Option<std::time::Duration>) -> Option<u128> {
    duration.map(|d| d.as_millis())
}

/// `"mode"` (`exclusive`, `shared`, `permit`) and, for permits, `"limit"`.
fn mode_entries<M: SerializeMap>(map: &mut M, mode: Mode) -> Result<(), M::Error> {
    match mode {
        Mode::Exclusive => map.serialize_entry("mode", "exclusive"),
        Mode::Shared => map.serialize_entry("mode", "shared"),
        Mode::Permit { limit } => {
            map.serialize_entry("mode", "permit")?;
            map.serialize_entry("limit", &limit)
        }
    }
}

/// `{"mode": "exclusive"}`, `{"mode": "shared"}` or `{"mode": "permit", "limit": N}`.
impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        mode_entries(&mut map, *self)?;
        map.end()
    }
}

/// Its hex text, as it prints.
impl Serialize for OwnerId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// `slot`, `token`, `owner`, `remaining_ms`, `label`.
impl Serialize for HolderStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("slot", &self.slot)?;
        map.serialize_entry("token", &self.token)?;
        map.serialize_entry("owner", &self.owner)?;
        map.serialize_entry("remaining_ms", &millis(self.remaining))?;
        map.serialize_entry("label", &self.label)?;
        map.end()
    }
}

/// `{"held": false}`; held exclusively, `"held"`, `"mode"`, `"token"`, `"owner"`,
/// `"remaining_ms"`, `"label"`; held shared or by permits, `"held"`, the mode's entries,
/// `"count"` and `"holders"`.
impl Serialize for KeyStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self {
            KeyStatus::Held {
                owner,
                token,
                remaining,
                label,
                ..
            } => {
                map.serialize_entry("held", &true)?;
                mode_entries(&mut map, Mode::Exclusive)?;
                map.serialize_entry("token", token)?;
                map.serialize_entry("owner", owner)?;
                map.serialize_entry("remaining_ms", &millis(*remaining))?;
                map.serialize_entry("label", label)?;
            }
            KeyStatus::Shared {
                mode,
                count,
                holders,
            } => {
                map.serialize_entry("held", &true)?;
                mode_entries(&mut map, *mode)?;
                map.serialize_entry("count", count)?;
                map.serialize_entry("holders", holders)?;
            }
            _ => map.serialize_entry("held", &false)?,
        }
        map.end()
    }
}

/// `key`, then the status's entries (as `lockctl ls --json` prints a line).
impl Serialize for HeldKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            key: &'a str,
            #[serde(flatten)]
            status: &'a KeyStatus,
        }
        Line {
            key: &self.key,
            status: &self.status,
        }
        .serialize(serializer)
    }
}

/// Its position's text.
impl Serialize for ListCursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.position())
    }
}

/// `keys` and `next` (`null` on the last page).
impl Serialize for Listing {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("keys", &self.keys)?;
        map.serialize_entry("next", &self.next)?;
        map.end()
    }
}

/// `value`, `term`, `remaining_ms`.
impl Serialize for Leader {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("value", &self.value)?;
        map.serialize_entry("term", &self.term)?;
        map.serialize_entry("remaining_ms", &millis(self.remaining))?;
        map.end()
    }
}

/// `key`, `owner`, `fencing_token`, the mode's entries, `slot`, `label`, `ttl_ms` and
/// `remaining_ms` (of its local validity, when serialized).
impl Serialize for Lease {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("key", self.key())?;
        map.serialize_entry("owner", &self.owner())?;
        map.serialize_entry("fencing_token", &self.fencing_token())?;
        mode_entries(&mut map, self.mode())?;
        map.serialize_entry("slot", &self.slot())?;
        map.serialize_entry("label", &self.label().as_deref())?;
        map.serialize_entry("ttl_ms", &self.ttl().as_millis())?;
        map.serialize_entry("remaining_ms", &self.remaining().as_millis())?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn json(value: &impl Serialize) -> String {
        serde_json::to_string(value).expect("serializes")
    }

    #[test]
    fn each_value_has_the_shape_lockctl_prints() {
        assert_eq!(json(&KeyStatus::Free), r#"{"held":false}"#);
        let held = KeyStatus::Held {
            owner: None,
            token: Some(7),
            remaining: Some(Duration::from_millis(1500)),
            label: Some("host-a".into()),
        };
        assert_eq!(
            json(&held),
            r#"{"held":true,"mode":"exclusive","token":7,"owner":null,"remaining_ms":1500,"label":"host-a"}"#
        );
        assert_eq!(json(&Mode::permits(4)), r#"{"mode":"permit","limit":4}"#);
        let leader = Leader {
            value: None,
            term: 9,
            remaining: None,
        };
        assert_eq!(
            json(&leader),
            r#"{"value":null,"term":9,"remaining_ms":null}"#
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_serializes_its_public_fields() {
        use crate::{LockStore, MemoryStore};
        let store = MemoryStore::new();
        let lease = store
            .try_acquire("k", Duration::from_secs(10))
            .await
            .expect("free");
        let text = json(&lease);
        assert!(
            text.starts_with(&format!(
                r#"{{"key":"k","owner":"{}","fencing_token":{},"mode":"exclusive","slot":null,"label":null,"ttl_ms":10000,"remaining_ms":"#,
                lease.owner(),
                lease.fencing_token()
            )),
            "{text}"
        );
    }
}
