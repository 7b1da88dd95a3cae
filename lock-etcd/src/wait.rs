//! The wait state machine: a queued entry waits for every older entry to go (an exclusive
//! request, watching its predecessor's deletion and, in [`Layout::Fencelock`], its own entry
//! for a handoff mark) or until its entry may be marked granted (a shared or permit request,
//! watching the older entries its grant depends on), keeping its own etcd lease alive
//! meanwhile. Every call goes through the client layer ([`crate::client`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, KeyValue, WatchFilterType, WatchOptions, WatchResponse};
use fencelock_core::{raw::drift, Error, Instant, Mode, Result};
use tokio::time::{sleep_until, timeout_at};

use crate::client::{Connection, Resend};
use crate::config::Layout;
use crate::handoff::{self, Successor};
use crate::modes::{self, Decision, EntryMode, Seen};
use crate::offset;
use crate::txn::{self, answered_at};
use crate::watcher::Watching;

/// How long a waiter whose predecessor was itself waiting puts off the read that closes the
/// gap between its read of the queue and its watches (see `Waiter::watch_deletion`). Most
/// waits behind a waiter end by a handoff before it, so the read is usually never sent; a
/// deletion missed in the gap delays the wake-up by this much (etcd's own catch-up of a watch
/// started in the past runs every 100 ms).
const GAP_CHECK_DELAY: Duration = Duration::from_millis(50);

/// What one renewal of a waiter's lease told.
enum Renewed {
    Confirmed,
    Unconfirmed,
    Ended,
}

pub(crate) enum Waited {
    /// The read at store revision `answered_at` found no predecessor and our entry alive (or,
    /// for a shared or permit request, the transaction that marked it granted, with the
    /// permit's slot).
    Holder {
        confirmed_at: Instant,
        answered_at: i64,
        slot: Option<u32>,
        /// An exclusive holder's successors, for its release to hand the lock to.
        successors: Vec<Successor>,
    },
    TimedOut,
    LeaseEnded,
    /// A request without a wait found the key held in a mode that excludes it.
    Busy,
    /// The key's permits are held with another limit.
    Mismatch {
        held: u32,
    },
}

/// A queued entry waiting for every older entry to go, keeping its own lease alive meanwhile.
pub(crate) struct Waiter<'a> {
    pub(crate) etcd: &'a Arc<Connection>,
    pub(crate) dir: &'a str,
    pub(crate) entry: &'a str,
    pub(crate) lease_id: i64,
    pub(crate) revision: i64,
    pub(crate) ttl: Duration,
    /// When the last renewal (or the grant) that etcd confirmed was sent.
    pub(crate) confirmed_at: Instant,
    pub(crate) deadline: Instant,
}

impl Waiter<'_> {
    /// Waits for every older entry to go. `seen`: a read of the queue already made (by the
    /// enqueue), used instead of a first one.
    pub(crate) async fn run(mut self, seen: Option<Found>) -> Result<Waited> {
        let period = (self.ttl / 3).max(Duration::from_millis(100));
        // A read made already (by the enqueue, or while watching, raced against a handoff),
        // used instead of a new one.
        let mut read_meanwhile: Option<Found> = seen;
        loop {
            // Renew alongside the check, so the lease handed out is measured from now; unless
            // the last confirmed renewal is recent (the grant, or a renewal moments ago), which
            // then measures it, a little earlier.
            let (sent_at, renew) = self.renewal(period);
            let pending = read_meanwhile.take();
            let read = async {
                match pending {
                    Some(found) => Ok(found),
                    None => self.predecessor().await,
                }
            };
            let (renewed, found) = tokio::join!(renew, read);
            let found = found?;
            match self.renewed(renewed, sent_at)? {
                Renewed::Ended => return Ok(Waited::LeaseEnded),
                _ if !found.ours => {
                    tracing::debug!(entry = self.entry, "queued entry vanished while waiting");
                    return Ok(Waited::LeaseEnded);
                }
                Renewed::Confirmed | Renewed::Unconfirmed => {}
            }
            let Some(predecessor) = found.predecessor else {
                // Measured from the last confirmed renewal: this one, or an earlier one if this
                // one got no answer.
                return Ok(Waited::Holder {
                    confirmed_at: self.confirmed_at,
                    answered_at: found.answered_at,
                    slot: None,
                    successors: found.successors,
                });
            };
            if Instant::now() >= self.deadline {
                return Ok(Waited::TimedOut);
            }
            match self
                .watch_deletion(
                    predecessor,
                    found.answered_at,
                    found.predecessor_waits,
                    period,
                )
                .await?
            {
                Woken::Look => {}
                Woken::Read(found) => read_meanwhile = Some(found),
                Woken::Done(outcome) => return Ok(outcome),
                Woken::HandedOff {
                    answered_at,
                    successors,
                } => {
                    // The mark proves our entry the oldest, alive on our lease, at
                    // `answered_at`. Renew first only if the last confirmed renewal is old, so
                    // the lease handed out is measured as after a read.
                    if Instant::now() >= self.confirmed_at + period / 2 {
                        let sent_at = Instant::now();
                        let renewed = self.etcd.renew(self.lease_id).await;
                        if let Renewed::Ended = self.renewed(renewed, sent_at)? {
                            return Ok(Waited::LeaseEnded);
                        }
                    }
                    return Ok(Waited::Holder {
                        confirmed_at: self.confirmed_at,
                        answered_at,
                        slot: None,
                        successors,
                    });
                }
            }
        }
    }

    /// The renewal to send alongside a read, and the instant it measures the lease from: now,
    /// or, when the last confirmed renewal is recent (within half a renewal `period`), no
    /// request and that renewal's instant.
    fn renewal(
        &self,
        period: Duration,
    ) -> (
        Instant,
        impl std::future::Future<Output = Result<bool>> + '_,
    ) {
        let now = Instant::now();
        let recent = now < self.confirmed_at + period / 2;
        let from = if recent { self.confirmed_at } else { now };
        let renew = async move {
            if recent {
                Ok(true)
            } else {
                self.etcd.renew(self.lease_id).await
            }
        };
        (from, renew)
    }

    /// Settles one renewal sent at `sent_at`. A renewal that got no answer is tolerated while
    /// the last confirmed one still covers the lease (the cluster may be electing a leader);
    /// past that, the lease may have expired: the waiter queues again.
    fn renewed(&mut self, renewed: Result<bool>, sent_at: Instant) -> Result<Renewed> {
        match renewed {
            Ok(true) => {
                self.confirmed_at = sent_at;
                Ok(Renewed::Confirmed)
            }
            Ok(false) => {
                tracing::debug!(entry = self.entry, "queued lease ended while waiting");
                Ok(Renewed::Ended)
            }
            Err(error) if error.is_retryable() => {
                let covered_until = self.confirmed_at + self.ttl.saturating_sub(drift(self.ttl));
                if Instant::now() < covered_until {
                    tracing::debug!(%error, "renewal unconfirmed; trying again");
                    Ok(Renewed::Unconfirmed)
                } else {
                    Ok(Renewed::Ended)
                }
            }
            Err(error) => Err(error),
        }
    }

    /// `step`'s outcome, or `None` if the wait's deadline came first (`step` is dropped).
    async fn by_deadline<T>(&self, step: impl Future<Output = Result<T>>) -> Result<Option<T>> {
        match timeout_at(self.deadline, step).await {
            Ok(outcome) => outcome.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Creates `watches` on the handle's stream (see [`Connection::watch`]) and waits for etcd
    /// to confirm each, within the command timeout and the wait's deadline.
    async fn create_watches(
        &self,
        what: &'static str,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        quiet_after: bool,
    ) -> Result<Created> {
        let count = watches.len();
        let limit = self.etcd.config().command_timeout;
        let Some(mut stream) = self
            .by_deadline(self.etcd.watch(what, watches, quiet_after))
            .await?
        else {
            return Ok(Created::TimedOut);
        };
        // Each watch delivers every event after the revision its creation reply names.
        let (mut created, mut covered_after) = (0, 0);
        let confirm_by = (Instant::now() + limit).min(self.deadline);
        while created < count {
            match timeout_at(confirm_by, stream.message()).await {
                Ok(Some(message)) if message.created() && !message.canceled() => {
                    created += 1;
                    let from = message.header().map_or(i64::MAX, |h| h.revision());
                    covered_after = covered_after.max(from);
                }
                // An event before every watch exists, a refused watch or a broken stream.
                Ok(_) => return Ok(Created::Look),
                Err(_) if confirm_by == self.deadline => return Ok(Created::TimedOut),
                Err(_) => return Err(unconfirmed_watch(&stream, limit)),
            }
        }
        Ok(Created::Watching {
            stream,
            covered_after,
        })
    }

    /// Whether releases may hand the lock to this waiter (see [`crate::handoff`]).
    fn takes_handoffs(&self) -> bool {
        self.etcd.config().layout == Layout::Fencelock
    }

    async fn predecessor(&self) -> Result<Found> {
        read_predecessor(
            self.etcd,
            self.dir,
            self.entry,
            self.revision,
            self.lease_id,
            self.takes_handoffs(),
        )
        .await
    }

    /// Waits until `predecessor` is deleted, or (in [`Layout::Fencelock`]) a release hands
    /// us the lock, renewing our lease every `period`.
    ///
    /// Two watches on the handle's stream (see [`crate::watcher`]): the predecessor's
    /// deletions, and our own entry's puts (a handoff mark). Neither sends anything once the
    /// wait is over (the predecessor is gone, or a later deletion of it is one stray message;
    /// our entry is put only by a mark), so their cancellation goes out with the next wait's
    /// creations. Our own entry's deletion is not watched: it is the end of our lease (which
    /// the renewal every `period` finds) or an operator's delete (which the read after the
    /// predecessor's deletion finds, as a release hands off only to an entry still there).
    /// Both start from the current revision, not from the revision the
    /// queue was read at: etcd serves a watch from a past revision as "unsynced", catching it
    /// up only every 100 ms, which would delay the wake-up. The gap between the read and the
    /// watches is closed by reading the predecessor again once they exist (a handoff in that
    /// gap deleted the predecessor too, so the read after it finds us first). When the
    /// predecessor was certainly waiting at the read (`predecessor_waits`), that read is put off
    /// by [`GAP_CHECK_DELAY`], and skipped if the wait ends first: such a predecessor leaves
    /// within the gap only if it gives up, its lease ends, or it is granted and released
    /// within one round trip, and a deletion missed then only delays us, by at most that.
    ///
    /// When the predecessor's deletion arrives, the queue is read again at once; a handoff mark
    /// of the same transaction (its event goes out on the other watch, in either order) that
    /// arrives before that read's answer ends the wait without it.
    async fn watch_deletion(
        &mut self,
        predecessor: Vec<u8>,
        read_at: i64,
        predecessor_waits: bool,
        period: Duration,
    ) -> Result<Woken> {
        let watches = self.deletion_watches(&predecessor);
        let (mut stream, covered_after) = match self
            .create_watches("watch the predecessor", watches, true)
            .await?
        {
            Created::Watching {
                stream,
                covered_after,
            } => (stream, covered_after),
            Created::Look => return Ok(Woken::Look),
            Created::TimedOut => return Ok(Woken::Done(Waited::TimedOut)),
        };
        // Nothing written between the read and the watches: they miss nothing since the read.
        let mut gap_check = None;
        if covered_after > read_at {
            if predecessor_waits {
                gap_check = Some(Instant::now() + GAP_CHECK_DELAY);
            } else if let Some(woken) = self.check_gap(&predecessor, covered_after).await? {
                return Ok(woken);
            }
        }
        let mut next_renewal = self.confirmed_at + period;
        // The read sent on the predecessor's deletion, while a handoff may still arrive.
        let mut reading: Option<QueueRead> = None;
        loop {
            tokio::select! {
                message = stream.message() => {
                    let woken = self
                        .on_message(message, &mut stream, &predecessor, &mut reading)
                        .await;
                    if let Some(woken) = woken {
                        return Ok(woken);
                    }
                }
                found = async {
                    match reading.as_mut() {
                        Some(read) => read.await,
                        None => std::future::pending().await,
                    }
                }, if reading.is_some() => return Ok(Woken::Read(found?)),
                () = sleep_until(gap_check.unwrap_or(self.deadline)),
                    if gap_check.is_some() && reading.is_none() =>
                {
                    gap_check = None;
                    if let Some(woken) = self.check_gap(&predecessor, covered_after).await? {
                        return Ok(woken);
                    }
                }
                () = sleep_until(next_renewal), if reading.is_none() => {
                    match self.renew_while_watching(period).await? {
                        Some(next) => next_renewal = next,
                        None => return Ok(Woken::Done(Waited::LeaseEnded)),
                    }
                }
                () = sleep_until(self.deadline) => return Ok(Woken::Done(Waited::TimedOut)),
            }
        }
    }

    /// The watches of [`watch_deletion`](Self::watch_deletion): `predecessor`'s deletions,
    /// and where releases hand the lock on, our own entry's puts (a handoff mark).
    fn deletion_watches(&self, predecessor: &[u8]) -> Vec<(Vec<u8>, WatchOptions)> {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut watches = vec![(predecessor.to_vec(), options)];
        if self.takes_handoffs() {
            let options = WatchOptions::new().with_filters([WatchFilterType::NoDelete]);
            watches.push((self.entry.as_bytes().to_vec(), options));
        }
        watches
    }

    /// Takes in one message of the wait's watches: `Some` ends the wait (the stream ended or
    /// broke, a watch was cancelled, or our own entry's event decides it). On `predecessor`'s
    /// deletion, unless a handoff mark right behind it decides, starts the queue's read in
    /// `reading`.
    async fn on_message(
        &self,
        message: Option<WatchResponse>,
        stream: &mut Watching,
        predecessor: &[u8],
        reading: &mut Option<QueueRead>,
    ) -> Option<Woken> {
        // Ended or broken: re-list, which also tells whether etcd answers.
        let Some(message) = message else {
            return Some(Woken::Look);
        };
        if message.canceled() || message.compact_revision() > 0 {
            tracing::debug!(
                compact_revision = message.compact_revision(),
                reason = message.cancel_reason(),
                "watch cancelled; re-listing the queue"
            );
            return Some(Woken::Look);
        }
        if let Some(woken) = self.own_event(&message) {
            return Some(woken);
        }
        let deleted = message.events().iter().any(|event| {
            event.event_type() == EventType::Delete
                && event.kv().is_some_and(|kv| kv.key() == predecessor)
        });
        if deleted && reading.is_none() {
            if let Some(woken) = self.handoff_behind(stream).await {
                return Some(woken);
            }
            *reading = Some(self.read_queue());
        }
        None
    }

    /// A handoff's mark, of the same transaction as the predecessor's deletion, goes out on
    /// the other watch right behind its event: if it is here already (or once the
    /// connection's task has run), no read. `Some`: what came next ends the wait.
    async fn handoff_behind(&self, stream: &mut Watching) -> Option<Woken> {
        for peek in 0..2 {
            if peek > 0 {
                tokio::task::yield_now().await;
            }
            match stream.ready() {
                Ok(None) => continue,
                Ok(Some(next)) if !next.canceled() && next.compact_revision() == 0 => {
                    return self.own_event(&next);
                }
                _ => return Some(Woken::Look),
            }
        }
        None
    }

    /// The queue's read after the predecessor's deletion, owning what it reads, so that it
    /// runs while the watches are still read (a handoff mark may yet make it moot).
    fn read_queue(&self) -> QueueRead {
        let (etcd, dir, entry) = (
            self.etcd.clone(),
            self.dir.to_owned(),
            self.entry.to_owned(),
        );
        let (revision, lease_id) = (self.revision, self.lease_id);
        let successors = self.takes_handoffs();
        Box::pin(async move {
            read_predecessor(&etcd, &dir, &entry, revision, lease_id, successors).await
        })
    }

    /// Renews our lease while watching: when the next renewal is due (a `period` after a
    /// confirmed one, a quarter of it after an unconfirmed one), or `None` if the lease ended.
    async fn renew_while_watching(&mut self, period: Duration) -> Result<Option<Instant>> {
        let sent_at = Instant::now();
        let renewed = self.etcd.renew(self.lease_id).await;
        Ok(match self.renewed(renewed, sent_at)? {
            Renewed::Ended => None,
            Renewed::Confirmed => Some(sent_at + period),
            Renewed::Unconfirmed => Some(Instant::now() + period / 4),
        })
    }
}

impl Waiter<'_> {
    /// Closes the gap between a read of the queue and watches created at revision `at`:
    /// `None` if `predecessor` was still there then (keep watching), otherwise how the wait
    /// goes on (read again, or its deadline came first).
    async fn check_gap(&self, predecessor: &[u8], at: i64) -> Result<Option<Woken>> {
        Ok(
            match self.by_deadline(self.still_there(predecessor, at)).await? {
                None => Some(Woken::Done(Waited::TimedOut)),
                Some(false) => Some(Woken::Look),
                Some(true) => None,
            },
        )
    }

    /// Whether `predecessor` (older than our entry) still existed at store revision `at` or
    /// later, so no deletion of it up to `at` was missed. A serializable read (no consensus
    /// round) answers when the member it reaches has applied `at`, as the member that
    /// created the watches at `at` has; a lagging member's answer is checked by a
    /// linearizable read instead. An entry of that name created after ours is not our
    /// predecessor: it counts as gone.
    async fn still_there(&self, predecessor: &[u8], at: i64) -> Result<bool> {
        let read = |options: GetOptions| {
            self.etcd
                .get("read the predecessor again", predecessor, options)
        };
        let mut answer = read(GetOptions::new().with_keys_only().with_serializable()).await?;
        if answer.header().map_or(0, |h| h.revision()) < at {
            answer = read(GetOptions::new().with_keys_only()).await?;
        }
        Ok(answer
            .kvs()
            .iter()
            .any(|kv| kv.create_revision() < self.revision))
    }

    /// What an event on our own entry in `message` means: a handoff mark (on our entry, with
    /// its create revision and lease) hands us the lock; a deletion (not watched for now, but
    /// it would mean this) sends us to read the queue (which finds our entry gone). Anything
    /// else: `None`.
    fn own_event(&self, message: &etcd_client::WatchResponse) -> Option<Woken> {
        for event in message.events() {
            let Some(kv) = event.kv().filter(|kv| kv.key() == self.entry.as_bytes()) else {
                continue;
            };
            if event.event_type() == EventType::Delete {
                return Some(Woken::Look);
            }
            if kv.create_revision() != self.revision || kv.lease() != self.lease_id {
                continue;
            }
            if let Some(successors) = handoff::parse_mark(kv.value()) {
                tracing::trace!(entry = self.entry, "handed the lock by a release");
                return Some(Woken::HandedOff {
                    answered_at: kv.mod_revision(),
                    successors,
                });
            }
        }
        None
    }
}

/// What a waiter's read of the queue found: the newest entry older than its own, whether its
/// own is still there, the store revision both were read at, and (when asked) the exclusive
/// entries right behind its own, for a release to hand the lock to.
pub(crate) struct Found {
    pub(crate) predecessor: Option<Vec<u8>>,
    /// Whether the predecessor was certainly waiting at the read (an exclusive entry behind
    /// the head); `false` when not known.
    pub(crate) predecessor_waits: bool,
    pub(crate) ours: bool,
    pub(crate) answered_at: i64,
    pub(crate) successors: Vec<Successor>,
}

/// The queue's read sent on the predecessor's deletion ([`Waiter::read_queue`]).
type QueueRead = std::pin::Pin<Box<dyn Future<Output = Result<Found>> + Send>>;

/// What creating a wait's watches came to.
enum Created {
    /// Every watch exists; together they deliver every event after revision `covered_after`.
    Watching {
        stream: Watching,
        covered_after: i64,
    },
    /// An event came before every watch existed, a watch was refused, or the stream broke:
    /// read the queue again.
    Look,
    /// The wait's deadline came first.
    TimedOut,
}

/// How a wait for the predecessor ended.
enum Woken {
    /// Read the queue again.
    Look,
    /// The queue was read again already (after the predecessor's deletion).
    Read(Found),
    /// A release handed us the lock at store revision `answered_at`, and these successors.
    HandedOff {
        answered_at: i64,
        successors: Vec<Successor>,
    },
    Done(Waited),
}

/// Reads the waiter's view of the queue (see [`Found`]) in one transaction.
async fn read_predecessor(
    etcd: &Connection,
    dir: &str,
    entry: &str,
    revision: i64,
    lease_id: i64,
    successors: bool,
) -> Result<Found> {
    let txn = txn::predecessor(dir, entry, revision, successors);
    let answer = etcd
        .txn("read the predecessor", Resend::Transient, txn)
        .await?;
    let mut reads = txn::gets(&answer).into_iter();
    let predecessor = reads.next().and_then(|kvs| kvs.into_iter().next());
    if let Some(foreign) = predecessor
        .as_ref()
        .filter(|kv| offset::is_foreign(kv.lease()))
    {
        return Err(offset::foreign_found(
            etcd.config().prefix(),
            dir,
            foreign.key(),
        ));
    }
    let predecessor = predecessor.map(|kv| kv.key().to_vec());
    let ours = reads.next().is_some_and(|kvs| {
        kvs.iter()
            .any(|kv| kv.create_revision() == revision && kv.lease() == lease_id)
    });
    let successors = reads
        .next()
        .map(|newer| handoff::successors(dir, &newer))
        .unwrap_or_default();
    Ok(Found {
        predecessor,
        predecessor_waits: false,
        ours,
        answered_at: answered_at(&answer)?,
        successors,
    })
}

/// What a shared or permit waiter read at one revision: the older entries its decision rests
/// on, whether its own entry is still there, and the revision.
struct ModeView {
    older: Vec<Seen>,
    decision: Decision,
    ours: bool,
}

impl ModeView {
    /// The older entries as read: any change to them (a delete, a mark) changes this.
    fn fingerprint(&self) -> Vec<(&[u8], i64)> {
        self.older
            .iter()
            .map(|seen| (seen.key.as_slice(), seen.modified))
            .collect()
    }
}

/// The most older entries a permit waiter watches at once (one watch each, over one stream);
/// past that it also reads the queue again at every renewal.
const MAX_WATCHED: usize = fencelock_core::limits::MAX_PERMITS as usize;

impl Waiter<'_> {
    /// Waits as a shared or permit request (`mode`), until its entry may be marked granted
    /// (see [`crate::modes`]), then marks it. With `without_wait`, returns [`Waited::Busy`] as
    /// soon as something other than a compatible request still settling its grant is in front.
    pub(crate) async fn run_mode(mut self, mode: Mode, without_wait: bool) -> Result<Waited> {
        let period = (self.ttl / 3).max(Duration::from_millis(100));
        loop {
            // As in `run`: renew alongside the read unless the last confirmed renewal is recent.
            let (sent_at, renew) = self.renewal(period);
            let (renewed, view) = tokio::join!(renew, self.mode_view(mode));
            let view = view?;
            match self.renewed(renewed, sent_at)? {
                Renewed::Ended => return Ok(Waited::LeaseEnded),
                _ if !view.ours => {
                    tracing::debug!(entry = self.entry, "queued entry vanished while waiting");
                    return Ok(Waited::LeaseEnded);
                }
                Renewed::Confirmed | Renewed::Unconfirmed => {}
            }
            match &view.decision {
                Decision::Grant { mark, slot } => {
                    let txn = txn::mark(self.entry, self.revision, mark.value(), self.lease_id);
                    // Safe to send twice: the same value on the same entry.
                    let answer = self
                        .etcd
                        .txn("record the grant", Resend::Transient, txn)
                        .await?;
                    if !answer.succeeded() {
                        return Ok(Waited::LeaseEnded);
                    }
                    return Ok(Waited::Holder {
                        confirmed_at: self.confirmed_at,
                        answered_at: answered_at(&answer)?,
                        slot: *slot,
                        successors: Vec::new(),
                    });
                }
                Decision::Mismatch { held } => return Ok(Waited::Mismatch { held: *held }),
                Decision::Blocked { pending, .. } if without_wait && !pending => {
                    return Ok(Waited::Busy)
                }
                Decision::Blocked { watch, .. } => {
                    if Instant::now() >= self.deadline {
                        return Ok(Waited::TimedOut);
                    }
                    let truncated = watch.len() > MAX_WATCHED;
                    // The newest older entries: those most likely to change next are the
                    // oldest, but a waiter that truncates re-reads at every renewal anyway.
                    let watched = &watch[watch.len().saturating_sub(MAX_WATCHED)..];
                    match self
                        .watch_changes(mode, watched, &view, truncated, period)
                        .await?
                    {
                        Some(outcome) => return Ok(outcome),
                        None => continue,
                    }
                }
            }
        }
    }

    /// Fails for a key on no lease among the older entries read (see [`offset::is_foreign`]).
    fn refuse_foreign(&self, older: &[KeyValue]) -> Result<()> {
        match older.iter().find(|kv| offset::is_foreign(kv.lease())) {
            Some(foreign) => Err(offset::foreign_found(
                self.etcd.config().prefix(),
                self.dir,
                foreign.key(),
            )),
            None => Ok(()),
        }
    }

    /// Reads what a `mode` request's grant depends on, at one revision.
    async fn mode_view(&self, mode: Mode) -> Result<ModeView> {
        let seen = |kv: &KeyValue| Seen {
            key: kv.key().to_vec(),
            mode: EntryMode::parse(kv.value()),
            modified: kv.mod_revision(),
        };
        let ours = |kvs: Option<Vec<KeyValue>>| {
            kvs.is_some_and(|kvs| {
                kvs.iter()
                    .any(|kv| kv.create_revision() == self.revision && kv.lease() == self.lease_id)
            })
        };
        match mode {
            Mode::Permit { limit } => {
                let txn = txn::permit_view(self.dir, self.entry, self.revision);
                let answer = self
                    .etcd
                    .txn("read the permits ahead", Resend::Transient, txn)
                    .await?;
                let mut reads = txn::gets(&answer).into_iter();
                let older = reads.next().unwrap_or_default();
                self.refuse_foreign(&older)?;
                let older: Vec<Seen> = older.iter().map(seen).collect();
                let decision = modes::decide_permit(limit, &older);
                Ok(ModeView {
                    older,
                    decision,
                    ours: ours(reads.next()),
                })
            }
            _ => {
                let txn = txn::reader_view(self.dir, self.entry, self.revision);
                let answer = self
                    .etcd
                    .txn("read the writers ahead", Resend::Transient, txn)
                    .await?;
                let mut reads = txn::gets(&answer).into_iter();
                let (writers, readers) = (reads.next(), reads.next());
                for kvs in [&writers, &readers].into_iter().flatten() {
                    self.refuse_foreign(kvs)?;
                }
                let first = |kvs: Option<Vec<KeyValue>>| kvs.and_then(|kvs| kvs.first().map(seen));
                let (writer, reader) = (first(writers), first(readers));
                let decision = modes::decide_shared(writer.as_ref(), reader.as_ref());
                Ok(ModeView {
                    older: writer.into_iter().chain(reader).collect(),
                    decision,
                    ours: ours(reads.next()),
                })
            }
        }
    }

    /// Watches `keys` (older entries only, never the newer ones) for any change, renewing our
    /// lease every `period`. `None`: read again (a change, a watch that ended or was
    /// cancelled, or, when `truncated`, a renewal). As in `watch_deletion`, the watches start
    /// at the current revision, and once they exist the view is read again: if it differs
    /// from `seen`, something changed in between.
    async fn watch_changes(
        &mut self,
        mode: Mode,
        keys: &[Vec<u8>],
        seen: &ModeView,
        truncated: bool,
        period: Duration,
    ) -> Result<Option<Waited>> {
        if keys.is_empty() {
            return Ok(None);
        }
        let watches = keys
            .iter()
            .map(|key| (key.clone(), WatchOptions::new()))
            .collect();
        let mut stream = match self
            .create_watches("watch the entries ahead", watches, false)
            .await?
        {
            Created::Watching { stream, .. } => stream,
            Created::Look => return Ok(None),
            Created::TimedOut => return Ok(Some(Waited::TimedOut)),
        };
        let Some(again) = self.by_deadline(self.mode_view(mode)).await? else {
            return Ok(Some(Waited::TimedOut));
        };
        if !again.ours || again.fingerprint() != seen.fingerprint() {
            return Ok(None);
        }
        let mut next_renewal = self.confirmed_at + period;
        loop {
            tokio::select! {
                message = stream.message() => {
                    let Some(message) = message else {
                        return Ok(None);
                    };
                    if message.canceled()
                        || message.compact_revision() > 0
                        || !message.events().is_empty()
                    {
                        return Ok(None);
                    }
                }
                () = sleep_until(next_renewal) => {
                    let sent_at = Instant::now();
                    let renewed = self.etcd.renew(self.lease_id).await;
                    next_renewal = match self.renewed(renewed, sent_at)? {
                        Renewed::Ended => return Ok(Some(Waited::LeaseEnded)),
                        Renewed::Confirmed if truncated => return Ok(None),
                        Renewed::Confirmed => sent_at + period,
                        Renewed::Unconfirmed => Instant::now() + period / 4,
                    };
                }
                () = sleep_until(self.deadline) => return Ok(Some(Waited::TimedOut)),
            }
        }
    }
}

/// etcd did not confirm the watches of `stream` within `limit`: the stream is closed for
/// every wait on it (the next wait opens another), and the wait fails as unavailable.
fn unconfirmed_watch(stream: &Watching, limit: Duration) -> Error {
    stream.close_stream();
    Error::Unavailable {
        message: format!("etcd did not confirm a watch within {limit:?}"),
        source: None,
    }
}
