//! `lockctl status KEY [--json]`.

use std::process::ExitCode;

use fencelock::{DynLockStore, KeyStatus};

pub async fn status(store: DynLockStore, key: &str, json: bool) -> ExitCode {
    let status = match store.status(key).await {
        Ok(status) => status,
        Err(error) => return crate::fail(&error),
    };
    if json {
        println!("{}", to_json(key, &status));
    } else {
        println!("{}", describe(key, &status));
    }
    // On stderr, so `--json` stays one object on stdout.
    for note in notes(&store) {
        eprintln!("lockctl: warning: {note}");
    }
    ExitCode::SUCCESS
}

/// What the store could not check about itself: today the Redis stores' eviction check when
/// the server allowed neither `CONFIG GET` nor `INFO`, or a Redlock node not checked yet.
fn notes(store: &DynLockStore) -> Vec<String> {
    #[cfg(feature = "redis")]
    {
        use fencelock::fencelock_redis::{EvictionCheck, RedisStore, RedlockStore};
        // downcast_ref sees through the metrics wrapper that connect may put around a store.
        let checks: Vec<(String, Option<&EvictionCheck>)> =
            if let Some(redis) = store.downcast_ref::<RedisStore>() {
                vec![(redis.config().redacted().to_owned(), redis.eviction_check())]
            } else if let Some(redlock) = store.downcast_ref::<RedlockStore>() {
                redlock
                    .eviction_checks()
                    .into_iter()
                    .map(|(node, check)| (node.to_owned(), check))
                    .collect()
            } else {
                Vec::new()
            };
        checks
            .into_iter()
            .filter_map(|(node, check)| match check {
                Some(unknown @ EvictionCheck::Unknown { .. }) => Some(format!("{node}: {unknown}")),
                None => Some(format!(
                    "{node}: eviction settings not checked yet (no answer so far)"
                )),
                Some(_) => None,
            })
            .collect()
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = store;
        Vec::new()
    }
}

/// One line for people.
pub fn describe(key: &str, status: &KeyStatus) -> String {
    match status {
        KeyStatus::Held {
            owner,
            token,
            remaining,
        } => {
            let mut parts = Vec::new();
            if let Some(token) = token {
                parts.push(format!("fencing token {token}"));
            }
            if let Some(owner) = owner {
                parts.push(format!("owner {owner}"));
            }
            if let Some(remaining) = remaining {
                parts.push(format!("{:.1}s left", remaining.as_secs_f64()));
            }
            format!("{key}: held ({})", parts.join(", "))
        }
        _ => format!("{key}: free"),
    }
}

fn to_json(key: &str, status: &KeyStatus) -> String {
    let mut fields = vec![format!("\"key\":{}", json_string(key))];
    match status {
        KeyStatus::Held {
            owner,
            token,
            remaining,
        } => {
            fields.push("\"held\":true".into());
            let none = || "null".to_owned();
            fields.push(format!(
                "\"token\":{}",
                token.map_or_else(none, |t| t.to_string())
            ));
            fields.push(format!(
                "\"owner\":{}",
                owner.map_or_else(none, |o| json_string(&o.to_string()))
            ));
            fields.push(format!(
                "\"remaining_ms\":{}",
                remaining.map_or_else(none, |r| r.as_millis().to_string())
            ));
        }
        _ => fields.push("\"held\":false".into()),
    }
    format!("{{{}}}", fields.join(","))
}

fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn json_escapes_keys_and_reports_fields() {
        let held = KeyStatus::Held {
            owner: None,
            token: Some(7),
            remaining: Some(Duration::from_millis(1500)),
        };
        assert_eq!(
            to_json("a\"b\n", &held),
            r#"{"key":"a\"b\u000a","held":true,"token":7,"owner":null,"remaining_ms":1500}"#
        );
        assert_eq!(
            to_json("k", &KeyStatus::Free),
            r#"{"key":"k","held":false}"#
        );
    }
}
