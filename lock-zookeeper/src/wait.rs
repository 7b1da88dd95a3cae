//! The queue of one acquisition: its ephemeral sequential lock node, whose turn it is, and
//! the wait for the predecessor (Curator's `InterProcessMutex` recipe: each waiter watches only
//! the node just before its own, so a release wakes one waiter, never a herd).

use std::sync::Arc;

use fencelock_core::{Error, OwnerId, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::keys;
use crate::session::{Failure, Session};

/// How many times a create is tried again after the container vanished under it (swept as
/// empty between our creating it and the child's create: ZooKeeper answers `NoNode`).
const CREATE_ATTEMPTS: usize = 8;

/// Where the acquisition's node stands in its queue.
pub(crate) enum Turn {
    /// It is the oldest node: it holds the lock.
    Holder,
    /// It waits; the name of the node just before it.
    Behind(String),
}

/// One acquisition's lock node. Until [`disarm`](Self::disarm)ed (the lease is granted, or the
/// node removed), dropping it deletes the node from a spawned task: an acquire that is
/// cancelled or fails leaves nothing queued.
pub(crate) struct Enqueued {
    pub(crate) session: Arc<Session>,
    pub(crate) container: String,
    owner: OwnerId,
    /// The node's path and stat once its create was answered.
    pub(crate) node: Option<(String, zk::Stat)>,
    armed: bool,
}

impl Enqueued {
    /// Creates the lock node of `owner` under `container` (the key's container node, made
    /// first if missing, and the prefix above it).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind: the returned guard is made before the create
    /// is sent, and its drop deletes whatever node of `owner` the container holds.
    pub(crate) async fn create(
        session: Arc<Session>,
        prefix: &str,
        container: String,
        owner: OwnerId,
    ) -> Result<Self> {
        let mut entry = Enqueued {
            session,
            container,
            owner,
            node: None,
            armed: true,
        };
        entry.create_node(prefix).await?;
        Ok(entry)
    }

    async fn create_node(&mut self, prefix: &str) -> Result<()> {
        let lock_node = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let container_node = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        let name = keys::node_prefix(&self.container, self.owner);
        let client = &self.session.client;
        for _ in 0..CREATE_ATTEMPTS {
            // Armed before the create is sent: a drop from here on cleans up.
            match self
                .session
                .call(
                    "creating a lock node",
                    client.create(&name, &[], &lock_node),
                )
                .await
            {
                Ok((stat, sequence)) => {
                    self.node = Some((format!("{name}{sequence}"), stat));
                    return Ok(());
                }
                Err(Failure::NoNode) => {}
                Err(other) => return Err(other.into_error("creating a lock node")),
            }
            // The key's container is missing (never made, or swept as empty): make it.
            match self
                .session
                .call(
                    "creating a key's container node",
                    client.create(&self.container, &[], &container_node),
                )
                .await
            {
                Ok(_) | Err(Failure::NodeExists) => {}
                Err(Failure::NoNode) => {
                    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    let made = self
                        .session
                        .call("creating the prefix", client.mkdir(prefix, &persistent))
                        .await;
                    if let Err(failure) = made {
                        return Err(failure.into_error("creating the prefix"));
                    }
                }
                Err(other) => return Err(other.into_error("creating a key's container node")),
            }
        }
        Err(Error::Unavailable {
            message: format!(
                "the container node {:?} vanished under {CREATE_ATTEMPTS} creates in a row",
                self.container
            ),
            source: None,
        })
    }

    /// The node's path.
    pub(crate) fn path(&self) -> &str {
        self.node.as_ref().map_or("", |(path, _)| path.as_str())
    }

    /// Where the node stands now, read after the call (so after our create and every grant
    /// and release the server had applied when it answered).
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the node is gone (its session ended, or an operator deleted
    /// it), and the request's errors.
    ///
    /// # Cancel safety
    /// Read-only.
    pub(crate) async fn turn(&self) -> Result<Turn> {
        let what = "listing a key's lock nodes";
        let children = match self
            .session
            .call(what, self.session.client.list_children(&self.container))
            .await
        {
            Ok(children) => children,
            Err(Failure::NoNode) => Vec::new(),
            Err(other) => return Err(other.into_error(what)),
        };
        let queue = keys::queue(children);
        let ours = self.path().rsplit('/').next().unwrap_or("");
        let Some(at) = queue.iter().position(|(_, name)| name == ours) else {
            return Err(Error::Unavailable {
                message: format!(
                    "the lock node {} vanished while it queued (its session ended, or it was \
                     deleted)",
                    self.path()
                ),
                source: None,
            });
        };
        Ok(match at {
            0 => Turn::Holder,
            _ => Turn::Behind(queue[at - 1].1.clone()),
        })
    }

    /// Waits until the node `predecessor` (in the same container) changes or is gone, or
    /// `until` passes, whichever is first.
    ///
    /// # Cancel safety
    /// Cancel safe: the watch is dropped with the future.
    pub(crate) async fn wait_for(&self, predecessor: &str, until: Instant) -> Result<()> {
        let what = "watching the lock node ahead";
        let path = format!("{}/{predecessor}", self.container);
        let (stat, watcher) = match self
            .session
            .call(what, self.session.client.check_and_watch_stat(&path))
            .await
        {
            Ok(answer) => answer,
            Err(Failure::NoNode) => return Ok(()),
            Err(other) => return Err(other.into_error(what)),
        };
        if stat.is_none() {
            return Ok(());
        }
        tokio::select! {
            _ = watcher.changed() => {}
            () = tokio::time::sleep_until(until) => {}
            () = self.session.ended() => {}
        }
        Ok(())
    }

    /// Deletes the node, as a waiter that gives up does.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the guard armed: its drop deletes the node.
    pub(crate) async fn remove(mut self) {
        let what = "deleting a lock node";
        let path = self.path().to_owned();
        match self
            .session
            .call(what, self.session.client.delete(&path, None))
            .await
        {
            Ok(()) | Err(Failure::NoNode) => self.armed = false,
            Err(Failure::NodeExists) | Err(Failure::Other(_)) => {}
        }
    }

    /// Hands the node over to the lease: no longer deleted on drop.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Enqueued {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the node goes with the session
        };
        let (session, container, owner) =
            (self.session.clone(), self.container.clone(), self.owner);
        let path = self.node.as_ref().map(|(path, _)| path.clone());
        runtime.spawn(async move {
            let client = &session.client;
            let path = match path {
                Some(path) => Some(path),
                // The create may be in flight: a list sent after it sees its node.
                None => session
                    .call(
                        "listing a key's lock nodes",
                        client.list_children(&container),
                    )
                    .await
                    .ok()
                    .and_then(|children| {
                        children.into_iter().find(|name| keys::made_by(name, owner))
                    })
                    .map(|name| format!("{container}/{name}")),
            };
            if let Some(path) = path {
                let _ = session
                    .call("deleting a lock node", client.delete(&path, None))
                    .await;
            }
        });
    }
}
