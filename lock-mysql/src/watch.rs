//! Finding out fast that the server ended a lease's session: the handle's
//! [`SessionWatch`](fencelock_core::raw::session_watch::SessionWatch) task looks up the sessions of
//! the held leases in `information_schema.PROCESSLIST` through [`Sessions`], and revokes the
//! [`LeaseExt::revocation`](fencelock_core::raw::LeaseExt::revocation) of each lease whose session is gone,
//! so [`KeepAlive`](fencelock_core::KeepAlive) reports the loss at once instead of at its next
//! extend. The task itself, shared with the PostgreSQL store, is in fencelock-core.

use async_trait::async_trait;
use fencelock_core::raw::session_watch::{LookUp, SessionWatch};
use sqlx::Row;

use crate::error::bounded;
use crate::session::{Checkout, Session, Sessions};
use crate::sql::{LIVE_SESSIONS, RESET_WAIT_TIMEOUT};

/// The leases one store handle watches.
pub(crate) type Watch = SessionWatch<Sessions>;

/// A lease's session on the server: its connection id, and the client address the server
/// shows for it, so an id handed to a new session after a restart is not mistaken for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Backend {
    pub(crate) id: i64,
    pub(crate) host: String,
}

#[async_trait]
impl LookUp for Sessions {
    type Identity = Backend;
    type Session = Session;

    /// The sessions among `looked_for` that the server lists, on `session` (opened if `None`).
    async fn live(
        &self,
        session: &mut Option<Session>,
        looked_for: &[Backend],
    ) -> Result<Vec<Backend>, String> {
        if session.is_none() {
            let Checkout {
                session: mut opened,
                ..
            } = self.checkout().await.map_err(|e| e.to_string())?;
            // An idle session may carry a short lease's TTL, shorter than the period between
            // two look-ups: the server would end it between them.
            if opened.wait_timeout.is_some() {
                bounded(
                    self.config.command_timeout(),
                    sqlx::query(RESET_WAIT_TIMEOUT).execute(&mut opened.conn),
                )
                .await
                .map_err(|fault| fault.describe())?;
                opened.wait_timeout = None;
            }
            *session = Some(opened);
        }
        let Some(conn) = session.as_mut().map(|s| &mut s.conn) else {
            return Err("no session".into());
        };
        // One bind for any number of sessions, so the statement is prepared once.
        let ids = looked_for
            .iter()
            .map(|b| b.id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let rows = bounded(
            self.config.command_timeout(),
            sqlx::query(LIVE_SESSIONS).bind(ids).fetch_all(conn),
        )
        .await
        .map_err(|fault| fault.describe())?;
        rows.iter()
            .map(|row| {
                Ok(Backend {
                    id: row.try_get("id")?,
                    host: row.try_get("host")?,
                })
            })
            .collect::<sqlx::Result<Vec<Backend>>>()
            .map_err(|e| e.to_string())
    }

    /// The session is live if the server lists its id with the same client address.
    fn is_live(&self, backend: &Backend, live: &[Backend]) -> bool {
        is_live(backend, live)
    }

    fn check_in(&self, session: Session) {
        self.checkin(session);
    }
}

fn is_live(backend: &Backend, live: &[Backend]) -> bool {
    live.contains(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_id_is_not_the_watched_session() {
        let session = |id: i64, host: &str| Backend {
            id,
            host: host.into(),
        };
        let watched = session(7, "127.0.0.1:40000");
        assert!(is_live(&watched, &[session(7, "127.0.0.1:40000")]));
        // After a restart the server hands id 7 to another client.
        assert!(!is_live(&watched, &[session(7, "127.0.0.1:40001")]));
        assert!(!is_live(&watched, &[session(8, "127.0.0.1:40000")]));
        assert!(!is_live(&watched, &[]));
    }
}
