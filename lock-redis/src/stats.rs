//! How much per-key state the server holds for a store: the keys under its prefix.

use fencelock_core::{raw, Error, ListCursor, Listing, Result};
use redis::cluster_async::ClusterConnection;

use crate::cluster::Conn;
use crate::error::redis_error;
use crate::keys::{glob_escape, Listed};
use crate::store::RedisStore;

/// Keys one `SCAN` step asks for: large enough that a million keys take a thousand steps.
const SCAN_COUNT: u64 = 1_000;

impl RedisStore {
    /// Counts the live keys under this store's prefix (`SCAN … MATCH prefix*`, which skips
    /// expired keys): one fence per key acquired within the retention window, plus one lock
    /// per held key. Each step is bounded by the command timeout; the walk takes one step per
    /// thousand keys in the database and other clients' writes meanwhile may be counted or
    /// not. For operators (`lockctl stats`), not for a lock holder.
    ///
    /// # Errors
    /// [`Unsupported`](fencelock_core::ErrorKind::Unsupported) on a Redis Cluster;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when a `SCAN` step gets no answer
    /// within the command timeout or the connection fails;
    /// [`Store`](fencelock_core::ErrorKind::Store) for another Redis error (a user's ACL without
    /// `SCAN`, say).
    ///
    /// # Cancel safety
    /// Reads only; dropping the future loses nothing.
    pub async fn stored_keys(&self) -> Result<u64> {
        if self.config().is_cluster() {
            return Err(fencelock_core::Error::Unsupported {
                operation: "counting the stored keys of a Redis Cluster",
            });
        }
        let pattern = format!("{}*", glob_escape(self.config().prefix()));
        let mut conn = self.connection();
        let limit = self.config().command_timeout();
        let mut cursor = 0u64;
        let mut count = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let step = scan.query_async::<(u64, Vec<redis::Value>)>(&mut conn);
            let (next, batch) = tokio::time::timeout(limit, step)
                .await
                .map_err(|_| Error::Unavailable {
                    message: format!("counting keys: no answer within {limit:?}"),
                    source: None,
                })?
                .map_err(|e| redis_error("counting keys", e))?;
            count += batch.len() as u64;
            if next == 0 {
                return Ok(count);
            }
            cursor = next;
        }
    }

    /// One `SCAN` step over the names of the keys held under `prefix` (see [`Listed`]), from
    /// `from`'s `SCAN` cursor, `limit` names examined, then each key's status.
    pub(crate) async fn list_page(
        &self,
        prefix: &str,
        from: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Listing> {
        if let Conn::Cluster(conn) = self.connection() {
            return self.list_cluster_page(&conn, prefix, from, limit).await;
        }
        let cursor = match from {
            None => 0u64,
            Some(from) => from
                .position()
                .parse()
                .map_err(|_| Error::invalid("from", "is not a cursor of this store's listing"))?,
        };
        let (names, next) = self.scan_names(prefix, cursor, limit).await?;
        let next = (next != 0).then(|| ListCursor::new(next.to_string()));
        raw::held_among(self, names, next).await
    }

    /// A page on a Cluster: one `SCAN` step on every master whose walk is not done; the cursor
    /// is each master's `host:port=cursor`, `;`-separated. A key whose slot moves to another
    /// master mid-listing may be listed twice.
    async fn list_cluster_page(
        &self,
        conn: &ClusterConnection,
        prefix: &str,
        from: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Listing> {
        let bad = || Error::invalid("from", "is not a cursor of this store's listing");
        let walks = match from {
            None => None,
            Some(from) => Some(
                from.position()
                    .split(';')
                    .map(|walk| {
                        let (node, cursor) = walk.rsplit_once('=')?;
                        let (host, port) = node.rsplit_once(':')?;
                        Some((host.to_owned(), port.parse().ok()?, cursor.parse().ok()?))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?,
            ),
        };
        let listed = Listed::new(self.config().layout(), self.config().prefix());
        let bound = self.config().command_timeout();
        let pattern = listed.pattern(prefix);
        let step = crate::cluster::scan_masters(conn, &pattern, walks, limit);
        let (found, left) =
            tokio::time::timeout(bound, step)
                .await
                .map_err(|_| Error::Unavailable {
                    message: format!("list: no answer within {bound:?}"),
                    source: None,
                })??;
        let names = found
            .iter()
            .filter_map(|name| listed.key_of(name))
            .collect();
        let next = (!left.is_empty()).then(|| {
            let walks: Vec<String> = left
                .iter()
                .map(|(host, port, cursor)| format!("{host}:{port}={cursor}"))
                .collect();
            ListCursor::new(walks.join(";"))
        });
        raw::held_among(self, names, next).await
    }

    /// One `SCAN` step from `cursor` over the held keys' names under `prefix`: the keys they
    /// name, and the next `SCAN` cursor (0 once the walk is done).
    pub(crate) async fn scan_names(
        &self,
        prefix: &str,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<String>, u64)> {
        let listed = Listed::new(self.config().layout(), self.config().prefix());
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(listed.pattern(prefix))
            .arg("COUNT")
            .arg(limit);
        let mut conn = self.connection();
        let bound = self.config().command_timeout();
        let step = scan.query_async::<(u64, Vec<String>)>(&mut conn);
        let (next, batch) = tokio::time::timeout(bound, step)
            .await
            .map_err(|_| Error::Unavailable {
                message: format!("list: no answer within {bound:?}"),
                source: None,
            })?
            .map_err(|e| redis_error("list", e))?;
        let names = batch
            .iter()
            .filter_map(|name| listed.key_of(name))
            .collect();
        Ok((names, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_in_the_prefix_match_only_themselves() {
        assert_eq!(glob_escape("fencelock:"), "fencelock:");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }
}
