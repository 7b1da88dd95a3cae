//! The connection a [`RedisStore`](crate::RedisStore) sends its scripts on: one server's
//! `ConnectionManager`, the redis crate's Redis Cluster client, which sends each script to
//! the master of its keys' slot (every script's keys share the key's hash tag, so one slot),
//! or the master a Sentinel deployment names ([`SentinelConn`]).
//!
//! On a Cluster or Sentinel with `min_replicas=N`, an acquire script goes out as a
//! two-command pipeline, the script and then `WAIT N timeout`, on the one connection to the
//! master: `WAIT` counts the writes of the connection that sends it, and a pipeline cannot be
//! split across connections, reconnects or a changed slot map, so the count covers this
//! script's writes (and any later write of the same connection, which only asks more).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, RedisFuture, Value};

use crate::error::redis_error;
use crate::eviction::{self, EvictionCheck};
use crate::sentinel::SentinelConn;

/// One server's connection, a Cluster's or a Sentinel deployment's master's; clones share it.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
    /// A Cluster or Sentinel connection whose commands are followed by `WAIT` (acquire
    /// scripts only).
    Acked(Acked),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            Conn::Sentinel(conn) => conn.req_packed_command(cmd),
            Conn::Acked(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Acked(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
            Conn::Sentinel(conn) => conn.get_db(),
            Conn::Acked(conn) => conn.get_db(),
        }
    }
}

/// A Cluster or Sentinel connection that follows every script with `WAIT replicas timeout` in
/// one pipeline to the script's master, and keeps the last `WAIT` answer where its creator
/// reads it.
#[derive(Clone)]
pub(crate) struct Acked {
    conn: Box<Conn>,
    replicas: u32,
    timeout: Duration,
    /// How many replicas acknowledged the last command's writes (and every earlier write of
    /// the connection); -1 before any answer.
    acked: Arc<AtomicI64>,
}

impl Acked {
    /// The connection, and where it leaves the count of acknowledging replicas.
    pub(crate) fn new(conn: Conn, replicas: u32, timeout: Duration) -> (Self, Arc<AtomicI64>) {
        let acked = Arc::new(AtomicI64::new(-1));
        let conn = Acked {
            conn: Box::new(conn),
            replicas,
            timeout,
            acked: acked.clone(),
        };
        (conn, acked)
    }
}

impl ConnectionLike for Acked {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // Only a command with keys goes with WAIT to its slot's master; others (`SCRIPT LOAD`
        // after `NOSCRIPT`, which the Cluster client sends to every master) go as they are.
        let script = matches!(
            cmd.args_iter().next(),
            Some(redis::Arg::Simple(name))
                if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")
        );
        if !script {
            return self.conn.req_packed_command(cmd);
        }
        Box::pin(async move {
            let sent_on = match &*self.conn {
                Conn::Sentinel(sentinel) => sentinel.generation(),
                _ => 0,
            };
            let mut pipeline = redis::pipe();
            pipeline.add_command(cmd.clone());
            pipeline
                .cmd("WAIT")
                .arg(self.replicas)
                .arg(self.timeout.as_millis().max(1) as u64);
            // Routed by the script's keys: WAIT has none.
            let mut values = self.conn.req_packed_commands(&pipeline, 0, 2).await?;
            if values.len() != 2 {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the script and WAIT pipeline answered the wrong number of replies",
                )));
            }
            let wait = values.pop().unwrap_or(Value::Nil);
            let reply = values.pop().unwrap_or(Value::Nil);
            let acked = match wait {
                Value::Int(n) => n,
                _ => -1,
            };
            self.acked.store(acked, Ordering::SeqCst);
            // A master whose replicas do not acknowledge may be one the sentinels replaced
            // (they move its replicas to the new master): ask them again next time.
            if let Conn::Sentinel(sentinel) = &*self.conn {
                if acked < i64::from(self.replicas) {
                    sentinel.forget(sent_on);
                }
            }
            reply.extract_error()
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A Cluster connection whose every command goes to one node, by address.
struct OnNode {
    conn: ClusterConnection,
    host: String,
    port: u16,
}

impl ConnectionLike for OnNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        });
        Box::pin(async move {
            self.conn
                .route_command(cmd.clone(), routing)
                .await?
                .extract_error()
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The masters of the Cluster as `CLUSTER SLOTS` lists them (host and port of each slot
/// range's first node), each once.
async fn masters(conn: &mut ClusterConnection) -> Result<Vec<(String, u16)>> {
    let slots = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|e| redis_error("eviction check: CLUSTER SLOTS", e))?;
    let mut found: Vec<(String, u16)> = Vec::new();
    let Value::Array(ranges) = slots else {
        return Err(Error::Store {
            message: "eviction check: CLUSTER SLOTS answered something other than a list".into(),
            source: None,
        });
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(Value::SimpleString(text)) => text.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            continue;
        };
        let Ok(port) = u16::try_from(*port) else {
            continue;
        };
        if !found.iter().any(|(h, p)| *h == host && *p == port) {
            found.push((host, port));
        }
    }
    if found.is_empty() {
        return Err(Error::Unavailable {
            message: "eviction check: CLUSTER SLOTS lists no master".into(),
            source: None,
        });
    }
    Ok(found)
}

/// The eviction check on every master of the Cluster (the crate docs, `# Eviction`): refused
/// if any may evict; `Unknown` if any could not tell; else the first master's settings.
pub(crate) async fn check_eviction(
    conn: &ClusterConnection,
    redacted: &str,
) -> Result<EvictionCheck> {
    let mut conn = conn.clone();
    let mut first = None;
    let mut unknown = None;
    for (host, port) in masters(&mut conn).await? {
        let node = format!("{redacted} (master {host}:{port})");
        let mut on_node = OnNode {
            conn: conn.clone(),
            host,
            port,
        };
        match eviction::check(&mut on_node, &node).await? {
            found @ EvictionCheck::Unknown { .. } => unknown = unknown.or(Some(found)),
            found => first = first.or(Some(found)),
        }
    }
    Ok(unknown.or(first).unwrap_or(EvictionCheck::Allowed))
}

/// One `SCAN` step with `MATCH pattern` on each master of `walks` (`host`, `port`, `SCAN`
/// cursor; every master from its start when `None`): the names found, and the walks not yet
/// done with their next cursors.
pub(crate) async fn scan_masters(
    conn: &ClusterConnection,
    pattern: &str,
    walks: Option<Vec<(String, u16, u64)>>,
    limit: usize,
) -> Result<(Vec<String>, Vec<(String, u16, u64)>)> {
    let mut conn = conn.clone();
    let walks = match walks {
        Some(walks) => walks,
        None => masters(&mut conn)
            .await?
            .into_iter()
            .map(|(host, port)| (host, port, 0))
            .collect(),
    };
    let mut names = Vec::new();
    let mut left = Vec::new();
    for (host, port, cursor) in walks {
        let mut on_node = OnNode {
            conn: conn.clone(),
            host: host.clone(),
            port,
        };
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut on_node)
            .await
            .map_err(|e| redis_error("list: SCAN on a master", e))?;
        names.extend(found);
        if next != 0 {
            left.push((host, port, next));
        }
    }
    Ok((names, left))
}
