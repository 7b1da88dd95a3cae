//! `lockctl stats [--json]`: how much per-key state the store holds, where it can tell.

use std::process::ExitCode;

use fencelock::DynLockStore;

/// What a store holds for keys no one holds, as far as it can tell.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PerKeyState {
    /// The store, as people call it.
    pub store: &'static str,
    /// How many items it holds now, if it can count them.
    pub count: Option<u64>,
    /// What an item is.
    pub unit: &'static str,
}

pub(crate) async fn stats(store: DynLockStore, url: &str, json: bool) -> ExitCode {
    let state = match per_key_state(&store, url).await {
        Ok(state) => state,
        Err(error) => return crate::fail(&error),
    };
    let retention = store.capabilities().retention;
    if json {
        let none = || "null".to_owned();
        println!(
            "{{\"store\":\"{}\",\"per_key_state\":{},\"unit\":\"{}\",\"retention_ms\":{}}}",
            state.store,
            state.count.map_or_else(none, |n| n.to_string()),
            state.unit,
            retention.map_or_else(none, |r| r.as_millis().to_string()),
        );
    } else {
        println!("{}", describe(&state, retention));
    }
    ExitCode::SUCCESS
}

/// One line for people.
pub(crate) fn describe(state: &PerKeyState, retention: Option<std::time::Duration>) -> String {
    let count = match state.count {
        Some(n) => format!("{n} {}", state.unit),
        None => format!("{} (not counted)", state.unit),
    };
    match retention {
        Some(r) => format!(
            "{}: per-key state {count}, each kept {} after its key's last acquire",
            state.store,
            human(r)
        ),
        None => format!("{}: per-key state {count}", state.store),
    }
}

fn human(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s => format!("{s}s"),
    }
}

/// What the store counts through the contract, under the name of the store `url` names, or
/// "not counted" where it does not count.
async fn per_key_state(store: &DynLockStore, url: &str) -> fencelock::Result<PerKeyState> {
    Ok(match store.per_key_state().await? {
        Some(state) => PerKeyState {
            store: fencelock::store_for(url).map_or("this store", |kind| kind.name),
            count: Some(state.count),
            unit: state.unit,
        },
        None => PerKeyState {
            store: "this store",
            count: None,
            unit: "keys",
        },
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_line_names_the_count_and_the_window() {
        let state = PerKeyState {
            store: "redis",
            count: Some(12),
            unit: "keys under the prefix",
        };
        assert_eq!(
            describe(&state, Some(Duration::from_secs(7 * 86_400))),
            "redis: per-key state 12 keys under the prefix, each kept 7d after its key's last acquire"
        );
        let state = PerKeyState {
            store: "this store",
            count: None,
            unit: "keys",
        };
        assert_eq!(
            describe(&state, None),
            "this store: per-key state keys (not counted)"
        );
    }
}
