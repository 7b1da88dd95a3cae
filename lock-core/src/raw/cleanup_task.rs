//! For store implementers: the background task a release starts when a removal of idle per-key
//! state is due on a [`CleanupSchedule`] (see [`crate::raw::cleanup`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::raw::cleanup::{interval, CleanupSchedule};
use crate::Result;

/// Spawns `run(owner)` on the current tokio runtime if a run is due on `owner`'s schedule for a
/// `retention` window, and marks the run done when it ends. Never waits; outside a runtime it
/// starts nothing. The run returns how many rows it removed, logged at debug level, as is an
/// error (the next due run tries again).
pub fn spawn_if_due<S, F, Fut>(
    owner: &Arc<S>,
    schedule: fn(&S) -> &CleanupSchedule,
    retention: Duration,
    run: F,
) where
    S: Send + Sync + 'static,
    F: FnOnce(Arc<S>) -> Fut,
    Fut: Future<Output = Result<u64>> + Send + 'static,
{
    if !schedule(owner).claim(interval(retention)) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        schedule(owner).done();
        return;
    };
    let running = run(owner.clone());
    let owner = owner.clone();
    runtime.spawn(async move {
        match running.await {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(removed, "removed idle fence rows"),
            Err(error) => tracing::debug!(%error, "could not remove idle fence rows; next time"),
        }
        schedule(&owner).done();
    });
}
