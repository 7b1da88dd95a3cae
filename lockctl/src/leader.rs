//! `lockctl leader NAME [--watch] [--json]`: an election's leader, once or as it changes.

use std::process::ExitCode;

use fencelock::{DynLockStore, Leader, LockStoreExt};
use tokio::signal::unix::{signal, SignalKind};

use crate::status::json_string;

/// The exit code of `lockctl leader` when nobody leads.
pub(crate) const NO_LEADER: u8 = 1;

pub(crate) async fn leader(store: DynLockStore, name: &str, watch: bool, json: bool) -> ExitCode {
    let election = store.election(name);
    if !watch {
        return match election.leader().await {
            Ok(leader) => {
                println!("{}", line(name, leader.as_ref(), json));
                if leader.is_some() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(NO_LEADER)
                }
            }
            Err(error) => crate::fail(&error),
        };
    }
    let Ok(mut interrupt) = signal(SignalKind::interrupt()) else {
        eprintln!("lockctl: cannot install signal handlers");
        return ExitCode::from(crate::exit::SOFTWARE);
    };
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        eprintln!("lockctl: cannot install signal handlers");
        return ExitCode::from(crate::exit::SOFTWARE);
    };
    let mut observer = election.observe();
    loop {
        let next = tokio::select! {
            next = observer.next() => next,
            _ = interrupt.recv() => return ExitCode::SUCCESS,
            _ = terminate.recv() => return ExitCode::SUCCESS,
        };
        match next {
            Ok(leader) => println!("{}", line(name, leader.as_ref(), json)),
            Err(error) => return crate::fail(&error),
        }
    }
}

/// One line: `NAME: led by "VALUE" (term T, 4.2s left)` or `NAME: no leader`; with `json`,
/// `{"election", "leader"}` and, when led, `"value"`, `"term"`, `"remaining_ms"` (`null`
/// where the store cannot tell).
fn line(name: &str, leader: Option<&Leader>, json: bool) -> String {
    match (leader, json) {
        (None, false) => format!("{name}: no leader"),
        (Some(leader), false) => {
            let mut parts = vec![format!("term {}", leader.term)];
            if let Some(remaining) = leader.remaining {
                parts.push(format!("{:.1}s left", remaining.as_secs_f64()));
            }
            let value = leader.value.as_deref().map_or_else(
                || "a leader the store does not name".to_owned(),
                json_string,
            );
            format!("{name}: led by {value} ({})", parts.join(", "))
        }
        (leader, true) => {
            #[derive(serde::Serialize)]
            struct LeaderLine<'a> {
                election: &'a str,
                leader: bool,
                #[serde(flatten)]
                current: Option<&'a Leader>,
            }
            crate::to_json_line(&LeaderLine {
                election: name,
                leader: leader.is_some(),
                current: leader,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use fencelock::MemoryStore;

    use super::*;

    #[tokio::test]
    async fn a_leader_is_printed_with_its_value_and_term_and_nobody_is_no_leader() {
        let store: DynLockStore = Arc::new(MemoryStore::new());
        assert_eq!(line("jobs", None, false), "jobs: no leader");
        assert_eq!(
            line("jobs", None, true),
            r#"{"election":"jobs","leader":false}"#
        );
        let leading = store
            .election("jobs")
            .ttl(Duration::from_secs(10))
            .campaign("host-a:80")
            .await
            .unwrap();
        let leader = store.election("jobs").leader().await.unwrap().unwrap();
        let text = line("jobs", Some(&leader), false);
        assert!(
            text.starts_with(&format!(
                r#"jobs: led by "host-a:80" (term {}, "#,
                leading.term()
            )),
            "{text}"
        );
        let json = line("jobs", Some(&leader), true);
        assert!(
            json.starts_with(&format!(
                r#"{{"election":"jobs","leader":true,"value":"host-a:80","term":{},"remaining_ms":"#,
                leading.term()
            )),
            "{json}"
        );
        assert_eq!(
            leading.resign().await.unwrap(),
            fencelock::ReleaseOutcome::Released
        );
    }
}
