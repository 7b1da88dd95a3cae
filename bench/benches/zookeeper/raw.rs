//! The raw floor on the client library the store is built on (`zookeeper-client`): the least
//! a ZooKeeper lock does, as plain requests.

use std::time::Duration;

use fencelock_bench::Samples;
use fencelock_core::{Error, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

fn raw_error(what: &'static str) -> impl Fn(zk::Error) -> Error {
    move |e| Error::store(what, e)
}

/// A session of its own on `connect` (`host:port,…[/chroot]`).
pub(crate) async fn connect(connect: &str) -> Result<zk::Client> {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect)
        .await
        .map_err(raw_error("raw connect"))
}

/// Makes the persistent node `path` and its parents, if missing.
pub(crate) async fn ensure(client: &zk::Client, path: &str) -> Result<()> {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match client.mkdir(path, &persistent).await {
        Ok(()) | Err(zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(Error::store("raw mkdir", e)),
    }
}

/// The raw cycle floor: an ephemeral sequential node created under `parent` and deleted, the
/// two writes every ZooKeeper lock makes.
pub(crate) async fn cycle(client: &zk::Client, parent: &str) -> Result<()> {
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/n-");
    let (_, sequence) = client
        .create(&prefix, &[], &ephemeral)
        .await
        .map_err(raw_error("raw create"))?;
    client
        .delete(&format!("{prefix}{sequence}"), None)
        .await
        .map_err(raw_error("raw delete"))
}

/// The least a correct queue lock does uncontended, by hand: the create, a read of the queue
/// (is our node the oldest?), the delete. `pipelined` sends the create and the read together
/// (a session's requests are answered in order, so the read sees the create): one round trip
/// fewer than waiting for the create's answer first, as the store does.
pub(crate) async fn queue_cycle(client: &zk::Client, parent: &str, pipelined: bool) -> Result<()> {
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/n-");
    let (created, children) = if pipelined {
        // Sent in the order the calls are made, whatever order the futures are polled in.
        let create = client.create(&prefix, &[], &ephemeral);
        let list = client.list_children(parent);
        tokio::join!(create, list)
    } else {
        let created = client.create(&prefix, &[], &ephemeral).await;
        (created, client.list_children(parent).await)
    };
    let (_, sequence) = created.map_err(raw_error("raw create"))?;
    seen_then_deleted(client, parent, &format!("{prefix}{sequence}"), children).await
}

/// The end of a queue cycle: the listing sent behind the create must show the created node
/// (`path`), which is then deleted.
async fn seen_then_deleted(
    client: &zk::Client,
    parent: &str,
    path: &str,
    children: std::result::Result<Vec<String>, zk::Error>,
) -> Result<()> {
    let ours = path.rsplit('/').next().unwrap_or_default();
    if !children
        .map_err(raw_error("raw list"))?
        .iter()
        .any(|child| child == ours)
    {
        return Err(Error::Store {
            message: format!("raw list of {parent} did not see {ours}"),
            source: None,
        });
    }
    client
        .delete(path, None)
        .await
        .map_err(raw_error("raw delete"))
}

/// The fenced floor: [`queue_cycle`] pipelined, with the create sent as the store sends it in
/// its own layout, one `multi` that checks the token offset node's version and writes the
/// container's data (whose stat carries the create's zxid, which ZooKeeper before 3.8.1
/// leaves out of a create's answer inside a `multi`). What a fencing token costs a queue lock
/// on ZooKeeper: the same round trips, one heavier transaction. `offset` is a node of
/// version 0 (made by [`ensure`]).
pub(crate) async fn fenced_queue_cycle(
    client: &zk::Client,
    parent: &str,
    offset: &str,
) -> Result<()> {
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/n-");
    let mut writer = client.new_multi_writer();
    writer
        .add_check_version(offset, 0)
        .and_then(|()| writer.add_create(&prefix, &[], &ephemeral))
        .and_then(|()| writer.add_set_data(parent, &[], None))
        .map_err(raw_error("raw multi staging"))?;
    // Sent in the order the calls are made, whatever order the futures are polled in.
    let commit = writer.commit();
    let list = client.list_children(parent);
    let (committed, children) = tokio::join!(commit, list);
    let results = committed.map_err(|e| Error::store("raw multi", e))?;
    let created = match results.get(1) {
        Some(zk::MultiWriteResult::Create { path, .. }) => path.clone(),
        _ => {
            return Err(Error::Store {
                message: "raw multi answered without its create".into(),
                source: None,
            })
        }
    };
    seen_then_deleted(client, parent, &created, children).await
}

/// The raw handoff floor: one session deletes a node that another session watches; the time
/// from sending the delete to the watch event arriving. Every handoff through ZooKeeper pays
/// at least this: a write, and one notification to another session.
pub(crate) struct HandoffFloor {
    writer: zk::Client,
    watcher: zk::Client,
    path: String,
}

impl HandoffFloor {
    /// Two sessions of their own; the node is `{parent}/watched`.
    pub(crate) async fn connect(connect: &str, parent: &str) -> Result<Self> {
        let (writer, watcher) = (self::connect(connect).await?, self::connect(connect).await?);
        ensure(&writer, parent).await?;
        Ok(HandoffFloor {
            writer,
            watcher,
            path: format!("{parent}/watched"),
        })
    }

    /// One sample, the delete sent `idle` after the watch was set (zero: back to back).
    pub(crate) async fn sample(&mut self, idle: Duration) -> Result<Duration> {
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        self.writer
            .create(&self.path, &[], &ephemeral)
            .await
            .map_err(raw_error("raw create"))?;
        let watch = loop {
            let (stat, watch) = self
                .watcher
                .check_and_watch_stat(&self.path)
                .await
                .map_err(raw_error("raw watch"))?;
            if stat.is_some() {
                break watch;
            }
            // An ensemble member behind the create: catch up, and watch again.
            self.watcher
                .sync(&self.path)
                .await
                .map_err(raw_error("raw sync"))?;
        };
        if !idle.is_zero() {
            tokio::time::sleep(idle).await;
        }
        let started = Instant::now();
        let seen = async {
            let event = watch.changed().await;
            (event, started.elapsed())
        };
        let (deleted, (event, seen_after)) =
            tokio::join!(self.writer.delete(&self.path, None), seen);
        deleted.map_err(raw_error("raw delete"))?;
        if event.event_type != zk::EventType::NodeDeleted {
            return Err(Error::Store {
                message: format!("raw watch: {:?}, not the deletion", event.event_type),
                source: None,
            });
        }
        Ok(seen_after)
    }

    /// `samples` back-to-back samples.
    pub(crate) async fn run(&mut self, samples: usize) -> Result<Samples> {
        let mut out = Vec::with_capacity(samples);
        for _ in 0..samples {
            out.push(self.sample(Duration::ZERO).await?);
        }
        Ok(Samples::new(out))
    }
}
