//! `lockctl status KEY [--json]`.

use std::process::ExitCode;

use fencelock::{DynLockStore, HolderStatus, KeyStatus, Mode};

pub(crate) async fn status(store: DynLockStore, key: &str, json: bool) -> ExitCode {
    let status = match store.status(key).await {
        Ok(status) => status,
        Err(error) => return crate::fail(&error),
    };
    if json {
        println!("{}", to_json(key, &status));
    } else {
        println!("{}", describe(key, &status));
        // A shared or permit key's holders, one line each under the summary.
        if let KeyStatus::Shared { holders, .. } = &status {
            for holder in holders {
                println!("  {}", describe_holder(holder));
            }
        }
    }
    // On stderr, so `--json` stays one object on stdout.
    for note in store.diagnostics() {
        eprintln!("lockctl: warning: {note}");
    }
    ExitCode::SUCCESS
}

/// One line for people.
pub(crate) fn describe(key: &str, status: &KeyStatus) -> String {
    match status {
        KeyStatus::Held {
            owner,
            token,
            remaining,
            label,
            ..
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
            if let Some(label) = label {
                parts.push(format!("by {}", json_string(label)));
            }
            format!("{key}: held ({})", parts.join(", "))
        }
        KeyStatus::Shared { mode, count, .. } => match mode {
            Mode::Shared => format!(
                "{key}: held shared by {count} reader{}",
                if *count == 1 { "" } else { "s" }
            ),
            Mode::Permit { limit } => format!("{key}: {count} of {limit} permits taken"),
            other => format!("{key}: held ({other}) by {count}"),
        },
        _ => format!("{key}: free"),
    }
}

/// One holder of a shared or permit key: its slot, token, owner and remaining TTL, as far as
/// the store tells them.
fn describe_holder(holder: &HolderStatus) -> String {
    let mut parts = Vec::new();
    if let Some(slot) = holder.slot {
        parts.push(format!("slot {slot}"));
    }
    if let Some(token) = holder.token {
        parts.push(format!("fencing token {token}"));
    }
    if let Some(owner) = holder.owner {
        parts.push(format!("owner {owner}"));
    }
    if let Some(remaining) = holder.remaining {
        parts.push(format!("{:.1}s left", remaining.as_secs_f64()));
    }
    if let Some(label) = &holder.label {
        parts.push(format!("by {}", json_string(label)));
    }
    if parts.is_empty() {
        "a holder (the store tells nothing more)".to_owned()
    } else {
        parts.join(", ")
    }
}

/// `{"key", "held"}`; when held also `"mode"` (`"exclusive"`, `"shared"` or `"permit"`, with
/// `"limit"` for permits). Exclusive: `"token"`, `"owner"`, `"remaining_ms"`, `"label"`.
/// Shared and permit: `"count"` and `"holders"`, each with `"slot"`, `"token"`, `"owner"`,
/// `"remaining_ms"`, `"label"`. A field the store cannot tell is `null`.
fn to_json(key: &str, status: &KeyStatus) -> String {
    #[derive(serde::Serialize)]
    struct KeyLine<'a> {
        key: &'a str,
        #[serde(flatten)]
        status: &'a KeyStatus,
    }
    crate::to_json_line(&KeyLine { key, status })
}

/// `text` quoted as a JSON string, as the text output quotes labels and values.
pub(crate) fn json_string(text: &str) -> String {
    crate::to_json_line(&text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn permits_and_readers_show_their_count_mode_and_holders() {
        let owner = fencelock::OwnerId::from(0xab_u128);
        let permits = KeyStatus::Shared {
            mode: Mode::permits(4),
            count: 2,
            holders: vec![
                HolderStatus::new(
                    Some(owner),
                    Some(9),
                    Some(2),
                    Some(Duration::from_millis(2500)),
                ),
                HolderStatus::new(None, None, None, None),
            ],
        };
        assert_eq!(describe("jobs", &permits), "jobs: 2 of 4 permits taken");
        assert_eq!(
            describe_holder(&permits_holders(&permits)[0]),
            format!("slot 2, fencing token 9, owner {owner}, 2.5s left")
        );
        assert_eq!(
            describe_holder(&permits_holders(&permits)[1]),
            "a holder (the store tells nothing more)"
        );
        assert_eq!(
            to_json("jobs", &permits),
            format!(
                concat!(
                    r#"{{"key":"jobs","held":true,"mode":"permit","limit":4,"count":2,"holders":["#,
                    r#"{{"slot":2,"token":9,"owner":"{}","remaining_ms":2500,"label":null}},"#,
                    r#"{{"slot":null,"token":null,"owner":null,"remaining_ms":null,"label":null}}]}}"#
                ),
                owner
            )
        );
        let readers = KeyStatus::Shared {
            mode: Mode::Shared,
            count: 3,
            holders: Vec::new(),
        };
        assert_eq!(describe("doc", &readers), "doc: held shared by 3 readers");
        assert_eq!(
            to_json("doc", &readers),
            r#"{"key":"doc","held":true,"mode":"shared","count":3,"holders":[]}"#
        );
        let reader = KeyStatus::Shared {
            mode: Mode::Shared,
            count: 1,
            holders: Vec::new(),
        };
        assert_eq!(describe("doc", &reader), "doc: held shared by 1 reader");
    }

    fn permits_holders(status: &KeyStatus) -> &[HolderStatus] {
        match status {
            KeyStatus::Shared { holders, .. } => holders,
            _ => &[],
        }
    }

    #[test]
    fn json_escapes_keys_and_reports_fields() {
        let held = KeyStatus::Held {
            owner: None,
            token: Some(7),
            remaining: Some(Duration::from_millis(1500)),
            label: None,
        };
        assert_eq!(
            to_json("a\"b\n", &held),
            r#"{"key":"a\"b\n","held":true,"mode":"exclusive","token":7,"owner":null,"remaining_ms":1500,"label":null}"#
        );
        let labelled = KeyStatus::Held {
            owner: None,
            token: Some(7),
            remaining: None,
            label: Some("host-a pid 42 \"x\"".into()),
        };
        assert_eq!(
            describe("k", &labelled),
            r#"k: held (fencing token 7, by "host-a pid 42 \"x\"")"#
        );
        assert!(to_json("k", &labelled).ends_with(r#","label":"host-a pid 42 \"x\""}"#));
        assert_eq!(
            to_json("k", &KeyStatus::Free),
            r#"{"key":"k","held":false}"#
        );
    }
}
