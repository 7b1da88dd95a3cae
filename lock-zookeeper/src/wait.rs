//! The queue of one acquisition: its ephemeral sequential lock node, whose turn it is, and
//! the wait for the node it waits on (Curator's `InterProcessMutex` and
//! `InterProcessReadWriteLock` recipes: each waiter watches one node, so a release wakes the
//! waiters it lets in, never a herd).
//!
//! Every mode's nodes are in the key's one queue ([`Mode`]; the mode is in the node's name,
//! [`keys::node_mode`]):
//! - an exclusive node holds when it is the oldest, and watches the node just before it;
//! - a reader holds when no older node is anything but a reader and the newest older reader
//!   is *marked* (its data written, version 1, once it was granted; so, by induction, every
//!   older reader is). It watches the oldest older node that is not a reader (Curator's
//!   reader), or that newest older reader until it is marked;
//! - a permit of `L` holds when every older node is a marked permit of `L` and there are
//!   fewer than `L` of them; it takes the lowest slot none of them occupies, and its mark
//!   records it. It watches the node just before it, and once that node is a marked permit
//!   (so the `L` oldest nodes hold) the container's children, as the one waiter at the head.
//!
//! A node is granted only once every older node is gone or was granted before it, so grants
//! follow the sequence, and so `czxid` order, in every mode.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fencelock_core::{Error, Mode, OwnerId, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::cleanup;
use crate::data;
use crate::keys;
use crate::layout::Layout;
use crate::offset::{self, Offsets, TokenState};
use crate::session::{Failure, MultiFailure, Session};

/// How many times a create is tried again after the container vanished under it (swept as
/// empty between our creating it and the child's create: ZooKeeper answers `NoNode`), its
/// answer was lost, or its token fell behind the clock. A try that lost a race for the token
/// offset (another create raised or made it first) counts for none: each such loss is another
/// create's progress, and a busy prefix whose round trips outlast the granule loses one race
/// per create ahead of it. Those are tried again for up to one command timeout instead.
const CREATE_ATTEMPTS: usize = 8;

/// Where the acquisition's node stands in its queue.
pub(crate) enum Turn {
    /// It may hold: the oldest node (exclusive), or a reader or permit its mode lets in (a
    /// permit with the slot it takes). A reader or permit is granted once [`Enqueued::mark`]
    /// wrote its mark.
    Holder { slot: Option<u32> },
    /// It waits until the node `name` changes or is gone. `version`: the node's data version
    /// as the turn read it, so a change made before the watch was set ends the wait at once.
    /// `compatible`: the node it waits on is a compatible request between its grant and its
    /// mark, so a request without a wait waits for it all the same (briefly).
    Wait {
        name: String,
        version: Option<i32>,
        compatible: bool,
    },
    /// A permit behind `older` marked permits, as many as the limit: it waits until the
    /// container's children change.
    Full { older: usize },
    /// A permit of `requested` with an older *marked* permit of another limit (`held`) ahead:
    /// refused.
    LimitMismatch { held: u32, requested: u32 },
}

/// A lock node's mark as read: its data version (1 and up once marked) and its data.
struct Marked {
    version: i32,
    data: Vec<u8>,
}

impl Marked {
    /// The mark a read of a lock node's data answered (`None`: the node is gone).
    fn read(
        answer: std::result::Result<(Vec<u8>, zk::Stat), Failure>,
        what: &str,
    ) -> Result<Option<Self>> {
        match answer {
            Ok((data, stat)) => Ok(Some(Marked {
                version: stat.version,
                data,
            })),
            Err(Failure::NoNode) => Ok(None),
            Err(other) => Err(other.into_error(what)),
        }
    }
}

/// Where and how an acquisition creates its node.
pub(crate) struct Place<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) layout: Layout,
    pub(crate) acls: zk::Acls<'static>,
    /// The handle's view of the prefix's token offset ([`Layout::Fencelock`] only).
    pub(crate) tokens: Option<&'a Mutex<TokenState>>,
}

/// What every try of [`Enqueued::create_floored`] writes with: the nodes its `multi` creates,
/// and the handle's view of the token offset.
struct Floored<'a> {
    tokens: &'a Mutex<TokenState>,
    lock_node: zk::CreateOptions<'static>,
    offset_node: zk::CreateOptions<'static>,
    offset_path: String,
    /// The lock node's path short of its sequence number.
    name: String,
    /// The lock node's data.
    data: Vec<u8>,
}

impl<'a> Floored<'a> {
    /// The lock node `entry` creates under `place`, and the offset node of its prefix.
    fn new(entry: &Enqueued, place: &Place<'_>, tokens: &'a Mutex<TokenState>) -> Self {
        Floored {
            tokens,
            lock_node: zk::CreateMode::EphemeralSequential.with_acls(place.acls),
            offset_node: zk::CreateMode::Persistent.with_acls(place.acls),
            offset_path: offset::path(place.prefix),
            name: keys::node_prefix(entry.layout, &entry.container, entry.owner, entry.mode),
            data: data::created(entry.label.as_deref()),
        }
    }

    /// The handle's token state, locked for one statement's use (never across an await);
    /// a poisoned lock still holds a usable state.
    fn state(&self) -> MutexGuard<'a, TokenState> {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock node a committed `multi` created (its path and stat), told from the offset
    /// node's create by its path, and the stat of a write of the same `multi`, whose `mzxid`
    /// is the transaction's zxid.
    fn created_of(
        &self,
        results: Vec<zk::MultiWriteResult>,
    ) -> Result<(String, zk::Stat, Option<zk::Stat>)> {
        let mut written = None;
        let mut created = None;
        for result in results {
            match result {
                zk::MultiWriteResult::Create { path, stat } if path != self.offset_path => {
                    created = Some((path, stat))
                }
                zk::MultiWriteResult::Create { stat, .. }
                | zk::MultiWriteResult::SetData { stat } => written = Some(stat),
                _ => {}
            }
        }
        let Some((path, stat)) = created else {
            return Err(Error::store(
                "a lock node's multi answered without its create",
                "ZooKeeper",
            ));
        };
        Ok((path, stat, written))
    }

    /// The token offset as a committed `multi` left it: as `known` if the `multi` only checked
    /// it, else as it raised (to `target`) or created it, in force from `czxid`.
    fn offsets_after(
        &self,
        known: Option<Offsets>,
        target: Option<u64>,
        czxid: i64,
    ) -> Result<Offsets> {
        match (known, target) {
            (Some(known), None) => Ok(known),
            (known, target) => {
                let data = match &known {
                    Some(known) => known.raised(target.unwrap_or(known.current)),
                    None => target.unwrap_or(0).to_string().into_bytes(),
                };
                let version = known.as_ref().map_or(0, |k| k.version + 1);
                Offsets::parse(&self.offset_path, &data, czxid, version)
            }
        }
    }
}

/// When a try's `multi` is sent, and the offset raise it carries.
struct Raise {
    /// When the `multi` was sent: the zxid hint its `czxid` gives is dated from it.
    sent_at: Instant,
    /// The clock (microseconds) read right before it was sent, which the token must not fall
    /// a granule behind.
    clock: u64,
    /// What the `multi` raises the offset to (`None`: no raise is needed, or no hint known).
    target: Option<u64>,
}

/// What a try's `multi` came to, short of an error that ends the create.
enum Committed {
    /// It was applied: its results.
    Done(Vec<zk::MultiWriteResult>),
    /// It failed on what it names, mended meanwhile: try again.
    Again(&'static str),
    /// Another create changed the token offset first: read it again and try again.
    Raced,
    /// Its answer was lost, and every node of ours deleted: try again, replacing none.
    Afresh,
}

/// One acquisition's lock node. Until [`disarm`](Self::disarm)ed (the lease is granted, or the
/// node removed), dropping it deletes the node from a spawned task: an acquire that is
/// cancelled or fails leaves nothing queued.
pub(crate) struct Enqueued {
    pub(crate) session: Arc<Session>,
    pub(crate) container: String,
    layout: Layout,
    owner: OwnerId,
    mode: Mode,
    /// The holder's label: the node's data from its create, and after a reader's or permit's
    /// mark (`data`).
    label: Option<String>,
    /// The node's path and `czxid` once its create was answered.
    pub(crate) node: Option<(String, i64)>,
    /// The node's fencing token: its `czxid`, plus the offset in force at it in
    /// [`Layout::Fencelock`].
    pub(crate) token: u64,
    /// The container's children as listed right behind the node's create, for the first
    /// [`turn`](Self::turn) (`None`: that listing failed, or was used).
    listing: Option<Vec<String>>,
    armed: bool,
}

impl Enqueued {
    /// Creates the lock node of `owner` under `container` (the key's container node, made
    /// first if missing, and the prefix above it), holding `label` as its data.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind: the returned guard is made before the create
    /// is sent, and its drop deletes whatever node of `owner` the container holds.
    pub(crate) async fn create(
        session: Arc<Session>,
        place: &Place<'_>,
        container: String,
        owner: OwnerId,
        mode: Mode,
        label: Option<&str>,
    ) -> Result<Self> {
        let mut entry = Enqueued {
            session,
            container,
            layout: place.layout,
            owner,
            mode,
            label: label.map(str::to_owned),
            node: None,
            token: 0,
            listing: None,
            armed: true,
        };
        match place.tokens {
            Some(tokens) => entry.create_floored(place, tokens).await?,
            None => entry.create_plain(place).await?,
        }
        Ok(entry)
    }

    /// The interop layouts: one create, the token its `czxid`.
    async fn create_plain(&mut self, place: &Place<'_>) -> Result<()> {
        let lock_node = zk::CreateMode::EphemeralSequential.with_acls(place.acls);
        let name = keys::node_prefix(self.layout, &self.container, self.owner, self.mode);
        let data = data::created(self.label.as_deref());
        let session = self.session.clone();
        let client = &session.client;
        let mut last = "";
        for _ in 0..CREATE_ATTEMPTS {
            // Armed before the create is sent: a drop from here on cleans up.
            let create = client.create(&name, &data, &lock_node);
            let (created, listed) = self
                .with_listing(self.session.call_once("creating a lock node", create))
                .await;
            match created {
                Ok((stat, sequence)) => {
                    let path = format!("{name}{sequence}");
                    let czxid = self.czxid_of(&path, &stat).await?;
                    self.token = offset::token(0, czxid)?;
                    self.node = Some((path, czxid));
                    self.listing = listed;
                    return Ok(());
                }
                Err(Failure::NoNode) => {
                    last = "the container vanished";
                    self.make_container(place).await?
                }
                Err(Failure::Other(error)) if self.session.unsettled(&error) => {
                    last = "the answer was lost";
                    self.settle(error).await?
                }
                Err(other) => return Err(other.into_error("creating a lock node")),
            }
        }
        Err(self.vanished(last))
    }

    /// [`Layout::Fencelock`]: the create is one `multi` with the token offset's check (or its
    /// raise, or its creation), so the offset in force at the node's `czxid` is known. Without
    /// a fresh zxid hint, and unless the offset is recent enough that no raise can be needed
    /// ([`offset::covers`]), a write of the container's data learns a zxid first
    /// ([`probe`](Self::probe)): the one lock node is then created with the raise it needs.
    /// A node made first and replaced would be seen by every reader meanwhile, as the key's
    /// holder with a token no lease has (a bare `czxid` on a fresh prefix), and an observer
    /// woken by it would keep reporting that token, the replacement having the same owner.
    /// Should a token still fall a granule behind the clock (the offset node not as this
    /// handle knew it), it is redone: the next `multi` raises the offset from this create's
    /// `czxid`, deletes this node and creates another.
    async fn create_floored(
        &mut self,
        place: &Place<'_>,
        tokens: &Mutex<TokenState>,
    ) -> Result<()> {
        let floored = Floored::new(self, place, tokens);
        let session = self.session.clone();
        let client = &session.client;
        // A node of ours whose token fell behind the clock: deleted by the next create.
        let mut replace: Option<String> = None;
        // Why the last try was redone, for the error if none settles.
        let mut last = "";
        let races_until = Instant::now() + self.session.command_timeout();
        let mut tries = 0;
        while tries < CREATE_ATTEMPTS {
            tries += 1;
            let known = self.known_offsets(&floored).await?;
            let raise = self.plan_raise(place, &floored, known.as_ref()).await?;
            let mut writer = client.new_multi_writer();
            self.stage(
                &floored,
                &mut writer,
                known.as_ref(),
                raise.target,
                replace.as_deref(),
            )?;
            let create_at = if replace.is_some() { 2 } else { 1 };
            let what = "creating a lock node";
            let commit = writer.commit();
            let (committed, listed) = self.with_listing(self.session.commit(what, commit)).await;
            let results = match self
                .committed(place, &floored, committed, create_at, what)
                .await?
            {
                Committed::Done(results) => results,
                Committed::Again(why) => {
                    last = why;
                    continue;
                }
                Committed::Raced if Instant::now() < races_until => {
                    last = "the token offset changed";
                    tries -= 1;
                    continue;
                }
                Committed::Raced => {
                    last = "the token offset changed, for a whole command timeout";
                    continue;
                }
                Committed::Afresh => {
                    last = "the answer was lost";
                    replace = None;
                    continue;
                }
            };
            let (path, token) = self.record(&floored, results, known, &raise).await?;
            if offset::behind(token, raise.clock) {
                last = "the token fell a granule behind the clock";
                replace = Some(path);
                continue;
            }
            self.token = token;
            self.listing = listed;
            return Ok(());
        }
        Err(self.vanished(last))
    }

    /// The token offset as this handle knows it, or as stored now when it knows none: the
    /// `multi` checks, raises or creates the offset node from it.
    async fn known_offsets(&self, floored: &Floored<'_>) -> Result<Option<Offsets>> {
        let cached = floored.state().known.clone();
        match cached {
            Some(known) => Ok(Some(known)),
            None => self.read_offset(&floored.offset_path).await,
        }
    }

    /// The raise a try's `multi` carries, with the instant and clock it is sent at: a zxid
    /// hint is probed first unless a fresh one is known or the offset covers the clock, so the
    /// one lock node created has the token it needs.
    async fn plan_raise(
        &self,
        place: &Place<'_>,
        floored: &Floored<'_>,
        known: Option<&Offsets>,
    ) -> Result<Raise> {
        let mut sent_at = Instant::now();
        let mut clock = offset::clock_micros();
        let mut hint = floored.state().hint.fresh(sent_at, offset::HINT_AGE);
        let covered = known.is_some_and(|k| offset::covers(k, clock));
        if hint.is_none() && !covered {
            let (zxid, probed_at) = self.probe(place).await?;
            floored.state().hint.note(zxid, probed_at);
            hint = Some(zxid);
            // The clock the raise lifts tokens past is read after the probe, right before
            // the create is sent.
            sent_at = Instant::now();
            clock = offset::clock_micros();
        }
        let target = match hint {
            Some(hint) => offset::raise(known.map(|k| k.current), clock, hint)?,
            None => None,
        };
        Ok(Raise {
            sent_at,
            clock,
            target,
        })
    }

    /// Stages a try's `multi`: the offset node's creation, raise or check (operation 0), the
    /// delete of the node it replaces if any, the lock node's create, and the container's
    /// write whose stat dates the transaction.
    fn stage(
        &self,
        floored: &Floored<'_>,
        writer: &mut zk::MultiWriter<'_>,
        known: Option<&Offsets>,
        target: Option<u64>,
        replace: Option<&str>,
    ) -> Result<()> {
        let offset_path = floored.offset_path.as_str();
        let staged = match (known, target) {
            (None, target) => {
                let data = target.unwrap_or(0).to_string();
                writer.add_create(offset_path, data.as_bytes(), &floored.offset_node)
            }
            (Some(known), Some(target)) => {
                writer.add_set_data(offset_path, &known.raised(target), Some(known.version))
            }
            (Some(known), None) => writer.add_check_version(offset_path, known.version),
        };
        let staged = staged.and_then(|()| match replace {
            Some(old) => writer.add_delete(old, None),
            None => Ok(()),
        });
        // The container's data written with the create: its stat carries the transaction's
        // zxid, the node's `czxid`, where the create's own answer may not (ZOOKEEPER-4026).
        // Nothing reads that data or checks the container's version.
        staged
            .and_then(|()| writer.add_create(&floored.name, &floored.data, &floored.lock_node))
            .and_then(|()| writer.add_set_data(&self.container, &[], None))
            .map_err(|error| crate::error::client_error("staging a lock node's create", error))
    }

    /// What a try's `multi` came to: its results, or what was mended before the next try (the
    /// offset to read again, the prefix or the container made, or after a lost answer every
    /// node of ours deleted); any other failure ends the create with its error.
    async fn committed(
        &mut self,
        place: &Place<'_>,
        floored: &Floored<'_>,
        committed: std::result::Result<Vec<zk::MultiWriteResult>, MultiFailure>,
        create_at: usize,
        what: &str,
    ) -> Result<Committed> {
        match committed {
            Ok(results) => Ok(Committed::Done(results)),
            Err(MultiFailure::Op(0, zk::Error::NoNode)) => {
                // The offset node (or the prefix) is missing.
                floored.state().known = None;
                self.make_prefix(place).await?;
                Ok(Committed::Again("the token offset was missing"))
            }
            Err(MultiFailure::Op(0, zk::Error::BadVersion | zk::Error::NodeExists)) => {
                floored.state().known = None; // raised or made meanwhile: read it again
                Ok(Committed::Raced)
            }
            Err(MultiFailure::Op(index, zk::Error::NoNode)) if index == create_at => {
                self.make_container(place).await?;
                Ok(Committed::Again("the container vanished"))
            }
            Err(MultiFailure::Op(index, error)) => Err(crate::error::client_error(
                &format!("{what} (operation {index} of its multi)"),
                error,
            )),
            Err(MultiFailure::Other(error)) if self.session.unsettled(&error) => {
                // Applied or not: our nodes go, the offset is read again, and it is redone.
                floored.state().known = None;
                self.settle(error).await?;
                Ok(Committed::Afresh)
            }
            Err(MultiFailure::Other(error)) => Err(error),
        }
    }

    /// Takes in the node a committed `multi` created: its `czxid` (the node is ours from
    /// here), the token offset the `multi` left, which the handle now knows with the zxid
    /// hint it gives, and the token at that `czxid`. Returns the node's path and token.
    async fn record(
        &mut self,
        floored: &Floored<'_>,
        results: Vec<zk::MultiWriteResult>,
        known: Option<Offsets>,
        raise: &Raise,
    ) -> Result<(String, u64)> {
        let (path, stat, written) = floored.created_of(results)?;
        // ZooKeeper before 3.8.1 answers a create inside a multi without its stat
        // (ZOOKEEPER-4026); the container's (or a raise's) stat has the same zxid (one
        // transaction).
        let czxid = match written.filter(|stat| !stat.is_invalid() && stat.mzxid > 0) {
            Some(written) if stat.is_invalid() => written.mzxid,
            _ => self.czxid_of(&path, &stat).await?,
        };
        self.node = Some((path.clone(), czxid));
        let offsets = floored.offsets_after(known, raise.target, czxid)?;
        let token = offset::token(offsets.at(czxid).unwrap_or(offsets.current), czxid)?;
        {
            let mut state = floored.state();
            state.hint.note(czxid, raise.sent_at);
            state.learn(offsets);
        }
        Ok((path, token))
    }

    /// Awaits `create`, a lock node's create (or its `multi`) already sent, together with a
    /// listing of the container sent right behind it on the same session: ZooKeeper answers a
    /// session's requests in order, so the listing sees the node if the create made it, and
    /// the first [`turn`](Self::turn) needs no round trip of its own. The listing is `None`
    /// if it failed (the create's answer decides what happens next; a turn then reads again).
    async fn with_listing<T>(&self, create: impl Future<Output = T>) -> (T, Option<Vec<String>>) {
        // The client sends a request when it is made, so this one leaves after the create.
        let list = self.session.client.list_children(&self.container);
        let list = self.session.call_once("listing a key's lock nodes", list);
        let (created, listed) = tokio::join!(create, list);
        (created, listed.ok())
    }

    /// After a create whose answer was lost (`error`: the connection dropped, the session
    /// lives on), deletes every node of this acquisition in the container, so the create can
    /// be sent again without leaving a second node queued. Curator's protected mode finds its
    /// node by the same kind of name prefix.
    async fn settle(&mut self, error: Error) -> Result<()> {
        tracing::debug!(%error, container = self.container, "a lock node's create went unanswered; removing what it may have made");
        self.node = None;
        cleanup::delete_nodes(
            &self.session,
            &self.container,
            self.layout,
            self.owner,
            None,
        )
        .await
    }

    /// The prefix's token offset as stored now (`None`: not made yet).
    async fn read_offset(&self, path: &str) -> Result<Option<Offsets>> {
        let what = "reading the token offset";
        match self
            .session
            .call(what, || self.session.client.get_data(path))
            .await
        {
            Ok((data, stat)) => Ok(Some(Offsets::parse(path, &data, stat.mzxid, stat.version)?)),
            Err(Failure::NoNode) => Ok(None),
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// A created node's `czxid`: from the create's stat, or read (a server that answered
    /// without it).
    async fn czxid_of(&self, path: &str, stat: &zk::Stat) -> Result<i64> {
        if !stat.is_invalid() && stat.czxid > 0 {
            return Ok(stat.czxid);
        }
        let what = "reading a lock node";
        match self
            .session
            .call(what, || self.session.client.check_stat(path))
            .await
        {
            Ok(Some(stat)) => Ok(stat.czxid),
            Ok(None) | Err(Failure::NoNode) => Err(Error::Unavailable {
                message: format!("the lock node {path} vanished right after its create"),
                source: None,
            }),
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// A zxid committed after the call began, for a raise to count from, and when the write
    /// that showed it was sent: a write of the container's data (which nothing reads, and
    /// which every lock node's `multi` writes too), the container made first if missing. It
    /// creates no lock node, so no reader sees one that is not the one granted.
    async fn probe(&self, place: &Place<'_>) -> Result<(i64, Instant)> {
        let what = "writing a key's container node";
        for _ in 0..CREATE_ATTEMPTS {
            let sent_at = Instant::now();
            match self
                .session
                .call(what, || {
                    self.session.client.set_data(&self.container, &[], None)
                })
                .await
            {
                Ok(stat) => return Ok((stat.mzxid, sent_at)),
                Err(Failure::NoNode) => self.make_container(place).await?,
                Err(other) => return Err(other.into_error(what)),
            }
        }
        Err(self.vanished("the container vanished"))
    }

    /// Makes the prefix (persistent, with its ancestors) if missing.
    async fn make_prefix(&self, place: &Place<'_>) -> Result<()> {
        let persistent = zk::CreateMode::Persistent.with_acls(place.acls);
        let what = "creating the prefix";
        match self
            .session
            .call(what, || {
                self.session.client.mkdir(place.prefix, &persistent)
            })
            .await
        {
            Ok(()) | Err(Failure::NodeExists) => Ok(()),
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// Makes the key's node: a container (kazoo's layout: persistent, as kazoo makes it), and
    /// the prefix if that is missing too.
    async fn make_container(&self, place: &Place<'_>) -> Result<()> {
        let mode = match place.layout {
            Layout::Kazoo => zk::CreateMode::Persistent,
            _ => zk::CreateMode::Container,
        };
        let container_node = mode.with_acls(place.acls);
        let what = "creating a key's container node";
        match self
            .session
            .call(what, || {
                self.session
                    .client
                    .create(&self.container, &[], &container_node)
            })
            .await
        {
            Ok(_) | Err(Failure::NodeExists) => Ok(()),
            Err(Failure::NoNode) => self.make_prefix(place).await,
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// The error of a create that did not settle, naming why its `last` try was redone.
    fn vanished(&self, last: &str) -> Error {
        Error::Unavailable {
            message: format!(
                "the lock node's create under {:?} did not settle in {CREATE_ATTEMPTS} tries (the \
                 container vanished, the token offset changed, or the answer was lost, each \
                 time; the last time, {last})",
                self.container
            ),
            source: None,
        }
    }

    /// The node's path.
    pub(crate) fn path(&self) -> &str {
        self.node.as_ref().map_or("", |(path, _)| path.as_str())
    }

    /// Where the node stands now, read after the call (so after our create and every grant
    /// and release the server had applied when it answered); the first time, from the listing
    /// sent right behind the create, when there is one (a node that was not the oldest then
    /// may be now: its wait finds the node ahead gone, and it asks again), and afterwards
    /// behind a `sync`, which the leader answers: a grant after a wait is then dated, like
    /// one made at once, from a request forwarded to the leader (`limits`). A reader or permit
    /// also reads the marks of the older nodes its rule looks at.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the node is gone (its session ended, or an operator deleted
    /// it), and the requests' errors. A permit behind a marked permit of another limit is
    /// [`Turn::LimitMismatch`], which the caller turns into the key's error.
    ///
    /// # Cancel safety
    /// Read-only.
    pub(crate) async fn turn(&mut self) -> Result<Turn> {
        let what = "listing a key's lock nodes";
        let children = match self.listing.take() {
            Some(children) => children,
            None => {
                let client = &self.session.client;
                // Sent together: a session's requests are answered in order.
                let sync = self
                    .session
                    .call("syncing", || client.sync(&self.container));
                let list = self
                    .session
                    .call(what, || client.list_children(&self.container));
                let (synced, listed) = tokio::join!(sync, list);
                match synced {
                    Ok(()) | Err(Failure::NoNode) => {}
                    Err(other) => return Err(other.into_error("syncing")),
                }
                match listed {
                    Ok(children) => children,
                    Err(Failure::NoNode) => Vec::new(),
                    Err(other) => return Err(other.into_error(what)),
                }
            }
        };
        let queue = keys::queue(self.layout, children);
        let ours = self.path().rsplit('/').next().unwrap_or("");
        let Some(at) = queue.iter().position(|name| name == ours) else {
            return Err(Error::Unavailable {
                message: format!(
                    "the lock node {} vanished while it queued (its session ended, or it was \
                     deleted)",
                    self.path()
                ),
                source: None,
            });
        };
        let older = &queue[..at];
        match self.mode {
            Mode::Shared => self.reader_turn(older).await,
            Mode::Permit { limit } => self.permit_turn(older, limit).await,
            _ => Ok(match older.last() {
                None => Turn::Holder { slot: None },
                Some(predecessor) => Turn::Wait {
                    name: predecessor.clone(),
                    version: None,
                    compatible: false,
                },
            }),
        }
    }

    /// A reader's turn: Curator's reader rule (no older writer), and the newest older reader
    /// marked.
    async fn reader_turn(&self, older: &[String]) -> Result<Turn> {
        if let Some(writer) = older
            .iter()
            .find(|name| keys::node_mode(self.layout, name) != Mode::Shared)
        {
            return Ok(Turn::Wait {
                name: writer.clone(),
                version: None,
                compatible: false,
            });
        }
        let Some(newest) = older.last() else {
            return Ok(Turn::Holder { slot: None });
        };
        Ok(match self.marked(newest).await? {
            Some(marked) if marked.version > 0 => Turn::Holder { slot: None },
            found => Turn::Wait {
                name: newest.clone(),
                version: Some(found.map_or(-1, |m| m.version)),
                compatible: true,
            },
        })
    }

    /// A permit's turn: another limit marked ahead is refused; otherwise it holds once every
    /// older node is a marked permit of `limit` and fewer than `limit` of them, in the lowest
    /// slot none of them occupies.
    async fn permit_turn(&self, older: &[String], limit: u32) -> Result<Turn> {
        let Some(predecessor) = older.last() else {
            return Ok(Turn::Holder { slot: Some(0) });
        };
        let modes: Vec<Mode> = older
            .iter()
            .map(|name| keys::node_mode(self.layout, name))
            .collect();
        // The marks read: every other limit's (to refuse it), the predecessor's (to know
        // what to wait on), and, when the limit leaves room, every older node's (their slots).
        let same = modes.iter().all(|m| *m == Mode::Permit { limit });
        let room = same && older.len() < limit as usize;
        let wanted: Vec<usize> = (0..older.len())
            .filter(|&i| {
                room || i + 1 == older.len()
                    || matches!(modes[i], Mode::Permit { limit: other } if other != limit)
            })
            .collect();
        // Sent together (the client sends a request when it is made), awaited in order.
        let what = "reading a lock node's mark";
        let reads: Vec<_> = wanted
            .iter()
            .map(|&i| {
                let path = format!("{}/{}", self.container, older[i]);
                self.session
                    .call_once(what, self.session.client.get_data(&path))
            })
            .collect();
        let mut marks: Vec<(usize, Option<Marked>)> = Vec::with_capacity(wanted.len());
        for (&i, read) in wanted.iter().zip(reads) {
            marks.push((i, Marked::read(read.await, what)?));
        }
        for (i, mark) in &marks {
            if let (Mode::Permit { limit: held }, Some(mark)) = (modes[*i], mark) {
                if held != limit && mark.version > 0 {
                    return Ok(Turn::LimitMismatch {
                        held,
                        requested: limit,
                    });
                }
            }
        }
        let predecessor_mark = marks
            .iter()
            .find(|(i, _)| i + 1 == older.len())
            .and_then(|(_, mark)| mark.as_ref());
        let Some(predecessor_mark) = predecessor_mark else {
            // Gone since the listing: read the queue again.
            return Ok(Turn::Wait {
                name: predecessor.clone(),
                version: Some(-1),
                compatible: true,
            });
        };
        if !room {
            return Ok(if same && predecessor_mark.version > 0 {
                Turn::Full { older: older.len() }
            } else {
                Turn::Wait {
                    name: predecessor.clone(),
                    version: Some(predecessor_mark.version),
                    compatible: false,
                }
            });
        }
        let mut taken = Vec::with_capacity(marks.len());
        for (i, mark) in &marks {
            match mark {
                Some(mark) if mark.version > 0 => match data::parse_slot(&mark.data) {
                    Some(slot) => taken.push(slot),
                    None => {
                        return Err(Error::store(
                            format!(
                                "the permit node {}/{} is marked with no slot it can read",
                                self.container, older[*i]
                            ),
                            "ZooKeeper",
                        ))
                    }
                },
                // Granted but not yet marked (or gone): wait for it.
                found => {
                    return Ok(Turn::Wait {
                        name: older[*i].clone(),
                        version: Some(found.as_ref().map_or(-1, |m| m.version)),
                        compatible: true,
                    })
                }
            }
        }
        // Fewer than `limit` slots are taken, so one in `0..limit` is free.
        let slot = (0..limit).find(|slot| !taken.contains(slot)).unwrap_or(0);
        Ok(Turn::Holder { slot: Some(slot) })
    }

    /// The node `name`'s data and version (`None`: gone).
    async fn marked(&self, name: &str) -> Result<Option<Marked>> {
        let what = "reading a lock node's mark";
        let path = format!("{}/{name}", self.container);
        let read = self
            .session
            .call(what, || self.session.client.get_data(&path))
            .await;
        Marked::read(read, what)
    }

    /// Marks a reader's or permit's node granted (with its `slot`, and its label after the
    /// mark): the data newer requests wait for before they are granted themselves. Gives the
    /// node's data version after it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the node is gone, and the request's errors.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the guard armed: its drop deletes the node.
    pub(crate) async fn mark(&self, slot: Option<u32>) -> Result<i32> {
        let data = data::granted(self.mode, slot, self.label.as_deref());
        let what = "marking a lock node granted";
        let path = self.path().to_owned();
        match self
            .session
            .call(what, || self.session.client.set_data(&path, &data, None))
            .await
        {
            Ok(stat) => Ok(stat.version),
            Err(Failure::NoNode) => Err(Error::Unavailable {
                message: format!(
                    "the lock node {path} vanished while it was granted (its session ended, or \
                     it was deleted)"
                ),
                source: None,
            }),
            Err(other) => Err(other.into_error(what)),
        }
    }

    /// Waits until the node `name` (in the same container) changes or is gone, or `until`
    /// passes, whichever is first; at once if its data version is no longer `version`.
    ///
    /// # Cancel safety
    /// Cancel safe: the watch is dropped with the future.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        version: Option<i32>,
        until: Instant,
    ) -> Result<()> {
        let what = "watching the lock node ahead";
        let path = format!("{}/{name}", self.container);
        let (stat, watcher) = match self
            .session
            .call(what, || self.session.client.check_and_watch_stat(&path))
            .await
        {
            Ok(answer) => answer,
            Err(Failure::NoNode) => return Ok(()),
            Err(other) => return Err(other.into_error(what)),
        };
        let Some(stat) = stat else {
            return Ok(());
        };
        if version.is_some_and(|version| version != stat.version) {
            return Ok(());
        }
        self.woken(watcher, until).await;
        Ok(())
    }

    /// A permit at the head of the waiters: waits until the container's children change (a
    /// holder left), or `until` passes; at once if fewer than `older` nodes are ahead already.
    ///
    /// # Cancel safety
    /// Cancel safe: the watch is dropped with the future.
    pub(crate) async fn wait_children(&self, older: usize, until: Instant) -> Result<()> {
        let what = "watching a key's lock nodes";
        let (children, watcher) = match self
            .session
            .call(what, || {
                self.session.client.list_and_watch_children(&self.container)
            })
            .await
        {
            Ok(answer) => answer,
            Err(Failure::NoNode) => return Ok(()),
            Err(other) => return Err(other.into_error(what)),
        };
        let queue = keys::queue(self.layout, children);
        let ours = self.path().rsplit('/').next().unwrap_or("");
        if queue.iter().position(|name| name == ours) != Some(older) {
            return Ok(());
        }
        self.woken(watcher, until).await;
        Ok(())
    }

    /// Until `watcher` fires (its node or the container changed), `until` passes, or the
    /// session ends, whichever is first.
    async fn woken(&self, watcher: zk::OneshotWatcher, until: Instant) {
        tokio::select! {
            _ = watcher.changed() => {}
            () = tokio::time::sleep_until(until) => {}
            () = self.session.ended() => {}
        }
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
            .call(what, || self.session.client.delete(&path, None))
            .await
        {
            Ok(()) | Err(Failure::NoNode) => self.armed = false,
            Err(Failure::NodeExists | Failure::BadVersion | Failure::Other(_)) => {}
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
        let path = self.node.as_ref().map(|(path, _)| path.clone());
        cleanup::spawn(
            self.session.clone(),
            self.container.clone(),
            self.layout,
            self.owner,
            path,
        );
    }
}
