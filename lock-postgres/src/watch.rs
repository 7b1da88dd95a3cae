//! Finding out fast that the server ended a lease's session: the handle's
//! [`SessionWatch`](fencelock_core::raw::session_watch::SessionWatch) task looks up the backends of
//! the held leases in `pg_stat_activity` through [`Sessions`], and revokes the
//! [`LeaseExt::revocation`](fencelock_core::raw::LeaseExt::revocation) of each lease whose backend is gone,
//! so [`KeepAlive`](fencelock_core::KeepAlive) reports the loss at once instead of at its next
//! extend. The task itself, shared with the MySQL store, is in fencelock-core.

use async_trait::async_trait;
use fencelock_core::raw::session_watch::{LookUp, SessionWatch};
use sqlx::Row;

use crate::error::bounded;
use crate::session::{Checkout, Session, Sessions};
use crate::sql::LIVE_BACKENDS;

/// The leases one store handle watches.
pub(crate) type Watch = SessionWatch<Sessions>;

/// The backend a lease's session runs on: its pid, and when it started (µs since the epoch,
/// if the server showed it), so a pid reused by a new backend is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Backend {
    pub(crate) pid: i32,
    pub(crate) started_us: Option<i64>,
}

#[async_trait]
impl LookUp for Sessions {
    type Identity = Backend;
    type Session = Session;

    /// The backends among `looked_for` that the server lists, on `session` (opened if `None`).
    async fn live(
        &self,
        session: &mut Option<Session>,
        looked_for: &[Backend],
    ) -> Result<Vec<Backend>, String> {
        if session.is_none() {
            let Checkout {
                session: opened, ..
            } = self.checkout().await.map_err(|e| e.to_string())?;
            *session = Some(opened);
        }
        let Some(conn) = session.as_mut().map(|s| &mut s.conn) else {
            return Err("no session".into());
        };
        let pids: Vec<i32> = looked_for.iter().map(|b| b.pid).collect();
        let rows = bounded(
            self.config.command_timeout(),
            sqlx::query(LIVE_BACKENDS).bind(pids).fetch_all(conn),
        )
        .await
        .map_err(|fault| fault.describe())?;
        rows.iter()
            .map(|row| {
                Ok(Backend {
                    pid: row.try_get("pid")?,
                    started_us: row.try_get("started_us")?,
                })
            })
            .collect::<sqlx::Result<Vec<Backend>>>()
            .map_err(|e| e.to_string())
    }

    /// The backend is live if the server lists its pid with the same start time (or without
    /// one).
    fn is_live(&self, backend: &Backend, live: &[Backend]) -> bool {
        is_live(backend, live)
    }

    fn check_in(&self, session: Session) {
        self.checkin(session);
    }
}

fn is_live(backend: &Backend, live: &[Backend]) -> bool {
    live.iter().any(|seen| {
        seen.pid == backend.pid
            && (seen.started_us.is_none()
                || backend.started_us.is_none()
                || seen.started_us == backend.started_us)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_pid_is_not_the_watched_backend() {
        let watched = Backend {
            pid: 7,
            started_us: Some(100),
        };
        let same = Backend {
            pid: 7,
            started_us: Some(100),
        };
        let reused = Backend {
            pid: 7,
            started_us: Some(200),
        };
        let hidden = Backend {
            pid: 7,
            started_us: None,
        };
        assert!(is_live(&watched, &[same]));
        assert!(!is_live(&watched, &[reused]));
        assert!(is_live(&watched, &[hidden]));
        assert!(!is_live(&watched, &[]));
    }
}
