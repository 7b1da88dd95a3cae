//! For store implementers whose leases each hold a server session of their own (PostgreSQL,
//! MySQL): the idle sessions a handle keeps for reuse, the count of those it has open, and the
//! bound on opening one.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::{Error, Result};

/// The idle sessions of one store handle, most recently used last, and how many sessions it
/// has open (idle, held by a lease, waiting or running a statement).
#[derive(Debug)]
pub struct SessionPool<S> {
    idle: Mutex<Vec<S>>,
    open: Arc<AtomicUsize>,
}

impl<S> Default for SessionPool<S> {
    fn default() -> Self {
        SessionPool {
            idle: Mutex::new(Vec::new()),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl<S> SessionPool<S> {
    /// Sessions open right now: each one holds an [`OpenCount`] from
    /// [`count_open`](Self::count_open) until it is dropped.
    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Idle sessions kept for reuse.
    pub fn idle_count(&self) -> usize {
        self.idle_list().len()
    }

    /// A token that counts one more open session until it is dropped; a session keeps it.
    pub fn count_open(&self) -> OpenCount {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenCount(self.open.clone())
    }

    /// The most recently used idle session that `usable` accepts, if any; those it refuses on
    /// the way are closed (dropped).
    pub fn take_idle(&self, usable: impl Fn(&S) -> bool) -> Option<S> {
        loop {
            let session = self.idle_list().pop()?;
            if usable(&session) {
                return Some(session);
            }
        }
    }

    /// Keeps `session` for reuse, unless `max_idle` sessions are kept already: then it is
    /// closed (dropped).
    pub fn keep_idle(&self, session: S, max_idle: usize) {
        let mut idle = self.idle_list();
        if idle.len() < max_idle {
            idle.push(session);
        }
    }

    /// Closes every idle session: after one of them turned out dead, the rest likely are too.
    pub fn discard_idle(&self) {
        let stale = std::mem::take(&mut *self.idle_list());
        drop(stale);
    }

    fn idle_list(&self) -> MutexGuard<'_, Vec<S>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counts one open session of a [`SessionPool`] for diagnostics; the count drops with it.
#[derive(Debug)]
pub struct OpenCount(Arc<AtomicUsize>);

impl Drop for OpenCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A session taken for one operation, and whether it came from the idle list (a reused
/// session may have died while idle, for example when the server restarted).
#[derive(Debug)]
pub struct Checkout<S> {
    /// The session.
    pub session: S,
    /// Whether it was idle before (`false`: opened for this operation).
    pub reused: bool,
}

/// Runs `opening` (a connect and the session's set-up) within the connect timeout `limit`;
/// `whom` (the redacted URL) names the server in the error.
///
/// # Errors
/// [`Unavailable`](crate::ErrorKind::Unavailable) when `opening` does not finish within `limit`;
/// otherwise whatever `opening` returns.
///
/// # Cancel safety
/// Dropping the future drops `opening`, and with it a half-opened connection.
pub async fn open_within<S>(
    limit: Duration,
    whom: &str,
    opening: impl Future<Output = Result<S>>,
) -> Result<S> {
    match tokio::time::timeout(limit, opening).await {
        Ok(result) => result,
        Err(_) => Err(Error::Unavailable {
            message: format!("no connection to {whom} within the connect timeout of {limit:?}"),
            source: None,
        }),
    }
}
