//! The one task a dropped or failed acquisition leaves: deleting its lock nodes, found by the
//! owner prefix of their names, so nothing it queued blocks the waiters behind it.

use std::sync::Arc;

use fencelock_core::{OwnerId, Result};

use crate::keys;
use crate::layout::Layout;
use crate::session::{Failure, Session};

/// Deletes, from a spawned task, `known` and every node of `owner` in `container` (a create
/// may be in flight, or its answer lost). Without a runtime the nodes go with the session.
pub(crate) fn spawn(
    session: Arc<Session>,
    container: String,
    layout: Layout,
    owner: OwnerId,
    known: Option<String>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        if let Err(error) = delete_nodes(&session, &container, layout, owner, known).await {
            tracing::debug!(%error, container, "deleting a dropped acquisition's nodes failed; they go with the session");
        }
    });
}

/// Deletes `known` and every node of `owner` in `container`, as a list sent after a `sync`
/// sees them.
///
/// # Cancel safety
/// Each delete is sent when it is made; dropping the future may leave some nodes.
pub(crate) async fn delete_nodes(
    session: &Session,
    container: &str,
    layout: Layout,
    owner: OwnerId,
    known: Option<String>,
) -> Result<()> {
    let client = &session.client;
    let mut paths: Vec<String> = known.into_iter().collect();
    // A create whose answer was lost may still commit, and the session may have reconnected
    // to a server that has not applied it yet: the leader answers the sync after it.
    match session.call("syncing", || client.sync(container)).await {
        Ok(()) | Err(Failure::NoNode) => {}
        Err(other) => return Err(other.into_error("syncing")),
    }
    let what = "listing a key's lock nodes";
    match session.call(what, || client.list_children(container)).await {
        Ok(children) => paths.extend(
            children
                .into_iter()
                .filter(|name| keys::made_by(layout, name, owner))
                .map(|name| format!("{container}/{name}")),
        ),
        Err(Failure::NoNode) => {}
        Err(other) => return Err(other.into_error(what)),
    }
    paths.sort();
    paths.dedup();
    let what = "deleting a lock node";
    for path in paths {
        match session.call(what, || client.delete(&path, None)).await {
            Ok(()) | Err(Failure::NoNode) => {}
            Err(other) => return Err(other.into_error(what)),
        }
    }
    Ok(())
}
