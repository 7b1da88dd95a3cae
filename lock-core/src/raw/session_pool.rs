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

    /// For background work (removing idle rows): the most recently used idle session that
    /// `usable` accepts, but only while another one stays idle, so the next operation still
    /// finds one (those `usable` refuses are closed first). A release that starts such work has
    /// just given its session back; taking that one would make the next acquire open a
    /// connection.
    pub fn take_spare(&self, usable: impl Fn(&S) -> bool) -> Option<S> {
        let mut idle = self.idle_list();
        idle.retain(|session| usable(session));
        if idle.len() > 1 {
            idle.pop()
        } else {
            None
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

/// The session a held lease's lock lives on, which every statement about the lease (extend,
/// relabel, release) runs on, one at a time.
///
/// A statement runs with the session out of its slot, which it gets back only with a whole
/// answer: a statement future dropped mid-answer drops the session, which frees the lock,
/// rather than leave a connection that may be mid-packet for the next statement (SQL clients'
/// connections are not cancel-safe mid-read).
#[derive(Debug)]
pub struct LeaseSession<S> {
    slot: tokio::sync::Mutex<Option<S>>,
}

/// What a statement on a [`LeaseSession`] found.
#[derive(Debug)]
pub enum Answer<T> {
    /// A whole answer: the session stays for the next statement.
    Kept(T),
    /// The session must end (the server ended it, it no longer holds the lock, it is not the
    /// session it was): it is dropped, which frees whatever it held, and later statements find
    /// the lease gone.
    Ended(Error),
    /// The statement failed, the session is intact: it stays.
    Failed(Error),
}

impl<S> LeaseSession<S> {
    /// The lease's session.
    pub fn new(session: S) -> Self {
        LeaseSession {
            slot: tokio::sync::Mutex::new(Some(session)),
        }
    }

    /// Runs `statement` on the session: [`Answer::Kept`]'s value, or the error of
    /// [`Answer::Ended`] or [`Answer::Failed`]; `gone()` if the session had already ended or
    /// been taken for the release.
    ///
    /// # Errors
    /// `gone()`, or the statement's.
    ///
    /// # Cancel safety
    /// Dropping the future before the statement has the session changes nothing; after, it
    /// drops the session (which frees the lock), and later statements get `gone()`.
    pub async fn run<T>(
        &self,
        gone: impl FnOnce() -> Error,
        statement: impl AsyncFnOnce(&mut S) -> Answer<T>,
    ) -> Result<T> {
        let mut slot = self.slot.lock().await;
        let Some(mut session) = slot.take() else {
            return Err(gone());
        };
        match statement(&mut session).await {
            Answer::Kept(value) => {
                *slot = Some(session);
                Ok(value)
            }
            Answer::Ended(error) => Err(error),
            Answer::Failed(error) => {
                *slot = Some(session);
                Err(error)
            }
        }
    }

    /// Takes the session for good (a release): `None` if it had ended or was taken already.
    ///
    /// # Cancel safety
    /// Waits only for a statement in flight; dropping the future takes nothing.
    pub async fn take(&self) -> Option<S> {
        self.slot.lock().await.take()
    }
}

/// What an extend's confirmation on the lease's own session found: whether the statement
/// ran on the lease's session (`same_session`: a multiplexing proxy may send it to another,
/// `proxy` says so) and whether that session still holds the lock. Confirms the lease from
/// `sent_at` and keeps the session, or ends it, after `forget` (the store stops watching the
/// session); a session that no longer holds the lock holds nothing once closed either.
pub fn confirmed(
    lease: &crate::Lease,
    sent_at: crate::Instant,
    same_session: bool,
    still_held: bool,
    proxy: &'static str,
    forget: impl FnOnce(),
) -> Answer<()> {
    if !same_session {
        forget();
        return Answer::Ended(Error::lost(lease, proxy));
    }
    if !still_held {
        forget();
        return Answer::Ended(Error::lost(lease, "its session no longer holds the lock"));
    }
    crate::raw::LeaseExt::confirm(lease, sent_at);
    Answer::Kept(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose close is counted: closing a lease's session frees its lock.
    struct Conn(Arc<AtomicUsize>);

    impl Drop for Conn {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn gone() -> Error {
        Error::invalid("lease", "gone")
    }

    #[test]
    fn a_spare_session_leaves_one_idle_for_the_next_operation() {
        let pool = SessionPool::default();
        let any = |_: &u32| true;
        assert_eq!(pool.take_spare(any), None);
        pool.keep_idle(1, 4);
        assert_eq!(pool.take_spare(any), None, "the only idle session stays");
        assert_eq!(pool.idle_count(), 1);
        pool.keep_idle(2, 4);
        assert_eq!(pool.take_spare(any), Some(2), "the most recently used one");
        assert_eq!(pool.idle_count(), 1);
        // An unusable session is closed and does not count as the one left idle.
        pool.keep_idle(3, 4);
        assert_eq!(pool.take_spare(|s| *s != 1), None);
        assert_eq!(pool.take_idle(any), Some(3));
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_session_is_kept_only_with_a_whole_answer() {
        let closed = Arc::new(AtomicUsize::new(0));
        let lease = LeaseSession::new(Conn(closed.clone()));
        assert_eq!(
            lease.run(gone, async |_| Answer::Kept(7)).await.ok(),
            Some(7)
        );
        let failed = lease
            .run(gone, async |_| {
                Answer::<()>::Failed(Error::invalid("x", "failed"))
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(
            closed.load(Ordering::SeqCst),
            0,
            "kept and failed keep the session"
        );

        let stalled = lease.run(gone, async |_| {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Answer::Kept(())
        });
        assert!(tokio::time::timeout(Duration::from_millis(10), stalled)
            .await
            .is_err());
        assert_eq!(
            closed.load(Ordering::SeqCst),
            1,
            "dropped mid-answer: closed"
        );
        assert!(lease.run(gone, async |_| Answer::Kept(())).await.is_err());
        assert!(lease.take().await.is_none());

        let ended = LeaseSession::new(Conn(closed.clone()));
        let answer = ended
            .run(gone, async |_| {
                Answer::<()>::Ended(Error::invalid("x", "ended"))
            })
            .await;
        assert!(answer.is_err());
        assert_eq!(closed.load(Ordering::SeqCst), 2, "ended: closed");
        assert!(ended.take().await.is_none());
    }
}
