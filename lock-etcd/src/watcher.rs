//! One watch stream per store handle, shared by every wait of it.
//!
//! A waiter used to open a watch stream of its own for each wait. A stream costs the client a
//! new HTTP/2 stream and etcd two goroutines and a stream setup; creating and cancelling
//! watches on a stream that is already open costs far less (`bench/benches/etcd-handoff-cost.rs`
//! `stream` against `shared`: 99k against 53k client instructions, 470 against 360 µs of etcd
//! CPU, per wait with two watches). So a handle keeps one stream, as etcd's Go client does.
//!
//! One task owns the stream. A wait registers its watches ([`Watcher::watch`]) and reads the
//! stream's messages for them, and only them, from a [`Watching`], in the order etcd sent
//! them; dropping the `Watching` cancels its watches. etcd answers a stream's watch creations
//! one by one, in the order they were sent (the reply to a refused one included), and sends
//! no event of a watch before its creation reply: so the task matches each creation reply to
//! the oldest creation it sent, and learns the watch id etcd assigned there. (etcd 3.4 also
//! takes a watch id from the client; relying on the order works on every version.)
//!
//! The stream is opened by the first wait that finds none, with that wait's first watch as its
//! first request (the client library's way to open one). It closes when it breaks, when etcd
//! ends it (a member that lost its leader ends it: the client requires a leader), after
//! [`IDLE_CLOSE`] with no watch on it, when a wait saw no creation reply in time
//! ([`Watching::close_stream`]), and when etcd refuses a creation (a reply both created and
//! cancelled). A stream's auth token is the one it was opened with: once that token is stale
//! (users or roles changed, or a JWT expired), etcd refuses every later creation on it
//! ("revision of auth store is old", "permission denied"), while the handle's other requests
//! go on with a fresh token; kept open, the stream would refuse each wait's watches again at
//! every try (`tests/least_privilege.rs` counted 1,085 watch requests in 2 s of one wait).
//! When the stream closes, every `Watching` on it ends ([`Watching::message`] answers
//! `None`), and its waiter reads the queue again, as it does after any broken watch; the next
//! wait opens another stream, with the client's current token.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use etcd_client::{
    WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream, WatchStream,
};
use tokio::sync::mpsc;

/// How long a stream with no watch on it stays open.
pub(crate) const IDLE_CLOSE: Duration = Duration::from_secs(30);

/// How long the cancellations of a finished wait's watches may wait to go out with the next
/// wait's creations. etcd's CPU goes by the exchanges on a stream more than by the watches in
/// each: one exchange that cancels two watches and creates two costs it about 150 µs less
/// than two exchanges (`bench/benches/etcd-handoff-cost.rs`, `shared` against `merged`), and the client
/// about 65 µs less. The waits end with watches that send nothing more (see
/// `Waiter::watch_deletion`), so a late cancellation costs etcd only the memory of a watcher.
const CANCEL_DELAY: Duration = Duration::from_secs(1);

/// What a wait asks of the stream's task.
enum Request {
    /// Create `watches` (key and options each) and send their messages to `messages`.
    Watch {
        id: u64,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        messages: mpsc::UnboundedSender<WatchResponse>,
        /// How many of `watches` were sent already (as the request that opened the stream).
        sent: usize,
    },
    /// The wait `id` is over: cancel its watches, with the next creations if `defer`.
    Done { id: u64, defer: bool },
    /// A creation went unanswered: close the stream (every wait on it reads again) rather than
    /// keep a stuck one; the next wait opens another.
    Close,
}

/// The handle's watch stream, if one is open: the way to its task.
#[derive(Default)]
pub(crate) struct Watcher {
    open: tokio::sync::Mutex<Option<mpsc::UnboundedSender<Request>>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// One wait's watches on the handle's stream. Dropping it cancels them.
pub(crate) struct Watching {
    id: u64,
    /// Whether these watches send nothing more once the wait is over, so their cancellation
    /// may wait for the next creations ([`CANCEL_DELAY`]).
    quiet_after: bool,
    messages: mpsc::UnboundedReceiver<WatchResponse>,
    task: mpsc::UnboundedSender<Request>,
}

impl Watching {
    /// The next message for these watches, in the order etcd sent them: a creation reply per
    /// watch, in the order they were asked for, each before any event of its own watch (an
    /// event of the first may come before the creation reply of the second); `None` once the
    /// stream broke or ended.
    ///
    /// # Cancel safety
    /// Cancel safe: a message not returned stays for the next call.
    pub(crate) async fn message(&mut self) -> Option<WatchResponse> {
        self.messages.recv().await
    }

    /// Closes the stream these watches are on, for every wait on it: etcd did not answer on
    /// it in time.
    pub(crate) fn close_stream(&self) {
        let _ = self.task.send(Request::Close);
    }

    /// A message already here, without waiting: `Ok(None)` if there is none yet, `Err(())` if
    /// the stream broke or ended.
    pub(crate) fn ready(&mut self) -> Result<Option<WatchResponse>, ()> {
        match self.messages.try_recv() {
            Ok(message) => Ok(Some(message)),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => Err(()),
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.task.send(Request::Done {
            id: self.id,
            defer: self.quiet_after,
        });
    }
}

impl Watcher {
    /// Registers `watches` (at least one) on the open stream; if none is open, the lock on
    /// opening one, held (see [`Opening`]). `quiet_after`: the watches send nothing more once
    /// the wait is over (or only rarely), so their cancellation may be deferred.
    ///
    /// # Cancel safety
    /// Dropping the future registers nothing.
    pub(crate) async fn watch(
        &self,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        quiet_after: bool,
    ) -> Result<Watching, Opening<'_>> {
        let open = self.open.lock().await;
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(task) = open.as_ref() else {
            return Err(Opening {
                open,
                id,
                watches,
                quiet_after,
            });
        };
        let (messages, received) = mpsc::unbounded_channel();
        let request = Request::Watch {
            id,
            watches,
            messages,
            sent: 0,
        };
        match task.send(request) {
            Ok(()) => Ok(Watching {
                id,
                quiet_after,
                messages: received,
                task: task.clone(),
            }),
            // The stream's task has ended: open another.
            Err(mpsc::error::SendError(request)) => {
                let watches = match request {
                    Request::Watch { watches, .. } => watches,
                    Request::Done { .. } | Request::Close => Vec::new(),
                };
                Err(Opening {
                    open,
                    id,
                    watches,
                    quiet_after,
                })
            }
        }
    }
}

/// A wait that found no stream open, holding the lock on opening one: other waits of the
/// handle wait for it. Open the stream with [`Opening::first`] as its first request, then
/// [`Opening::adopt`] it.
pub(crate) struct Opening<'w> {
    open: tokio::sync::MutexGuard<'w, Option<mpsc::UnboundedSender<Request>>>,
    id: u64,
    watches: Vec<(Vec<u8>, WatchOptions)>,
    quiet_after: bool,
}

impl Opening<'_> {
    /// The first watch, to open the stream with.
    pub(crate) fn first(&self) -> Option<&(Vec<u8>, WatchOptions)> {
        self.watches.first()
    }

    /// Hands the stream just opened (with the first watch sent) to a task of its own, which
    /// sends the other watches.
    pub(crate) fn adopt(mut self, stream: WatchStream) -> Watching {
        let (task, requests) = mpsc::unbounded_channel();
        let (messages, received) = mpsc::unbounded_channel();
        let (sender, responses) = stream.split();
        let first = Request::Watch {
            id: self.id,
            watches: std::mem::take(&mut self.watches),
            messages,
            sent: 1,
        };
        // Queued before the task starts, so it is the first request the task handles.
        let _ = task.send(first);
        tokio::spawn(run(sender, responses, requests));
        *self.open = Some(task.clone());
        Watching {
            id: self.id,
            quiet_after: self.quiet_after,
            messages: received,
            task,
        }
    }
}

/// One wait's watches, as the task keeps them.
struct Registration {
    messages: mpsc::UnboundedSender<WatchResponse>,
    /// The ids etcd assigned to the watches created so far.
    watch_ids: Vec<i64>,
    /// Creations sent and not yet answered.
    pending: usize,
    /// The wait is over: cancel each watch as its creation reply comes.
    done: bool,
}

/// A request not yet handed to the stream's buffer, oldest first.
enum Outgoing {
    Create(u64, Vec<u8>, WatchOptions),
    Cancel(i64),
}

async fn send_next(sender: &mut WatchRequestSender, next: Option<&Outgoing>) -> bool {
    match next {
        Some(Outgoing::Create(_, key, options)) => sender
            .watch(key.clone(), Some(options.clone()))
            .await
            .is_ok(),
        Some(Outgoing::Cancel(watch_id)) => sender.cancel(*watch_id).await.is_ok(),
        None => std::future::pending().await,
    }
}

enum Event {
    Request(Option<Request>),
    Response(Option<WatchResponse>),
    Sent(bool),
    Idle,
    /// The deferred cancellations are due.
    Cancel,
}

/// What the stream's task keeps between events: the waits and their watches, and the
/// requests not yet handed to the stream.
struct StreamState {
    waits: HashMap<u64, Registration>,
    by_watch: HashMap<i64, u64>,
    /// The wait each creation sent and not yet answered belongs to, oldest first.
    creating: VecDeque<u64>,
    /// Never waited on by `send_next`'s caller: the task keeps reading answers while a burst
    /// of requests waits here (waiting on a full buffer could stall both ways, as in the
    /// renewer).
    unsent: VecDeque<Outgoing>,
    /// Since when no wait has been on the stream (`None`: some wait is).
    idle_since: Option<tokio::time::Instant>,
    /// Watches of finished waits, to cancel with the next creations or by `cancel_by`.
    deferred: Vec<i64>,
    cancel_by: Option<tokio::time::Instant>,
}

impl StreamState {
    /// A stream just opened, with no wait on it yet: idle from now.
    fn new() -> Self {
        StreamState {
            waits: HashMap::new(),
            by_watch: HashMap::new(),
            creating: VecDeque::new(),
            unsent: VecDeque::new(),
            idle_since: Some(tokio::time::Instant::now()),
            deferred: Vec::new(),
            cancel_by: None,
        }
    }

    /// Queues the deferred cancellations to go out next (their delay is over, or creations
    /// are about to go out, which they join).
    fn cancel_deferred(&mut self) {
        self.unsent
            .extend(self.deferred.drain(..).map(Outgoing::Cancel));
        self.cancel_by = None;
    }

    /// Registers a wait's `watches`, the first `sent` of them already sent (as the request
    /// that opened the stream), and queues the creation of the others.
    fn watch(
        &mut self,
        id: u64,
        watches: Vec<(Vec<u8>, WatchOptions)>,
        messages: mpsc::UnboundedSender<WatchResponse>,
        sent: usize,
    ) {
        // Cancellations first: they and these creations go out together.
        self.cancel_deferred();
        for _ in 0..sent.min(watches.len()) {
            self.creating.push_back(id);
        }
        let pending = watches.len();
        for (key, options) in watches.into_iter().skip(sent) {
            self.unsent.push_back(Outgoing::Create(id, key, options));
        }
        self.waits.insert(
            id,
            Registration {
                messages,
                watch_ids: Vec::new(),
                pending,
                done: false,
            },
        );
        self.idle_since = None;
    }

    /// Ends the wait `id`: cancels its watches (later, with the next creations, if `defer`),
    /// drops its unsent creations, and forgets it once no creation of it is in flight.
    fn done(&mut self, id: u64, defer: bool) {
        let Some(wait) = self.waits.get_mut(&id) else {
            return;
        };
        for watch_id in wait.watch_ids.drain(..) {
            self.by_watch.remove(&watch_id);
            if defer {
                self.deferred.push(watch_id);
            } else {
                self.unsent.push_back(Outgoing::Cancel(watch_id));
            }
        }
        if !self.deferred.is_empty() && self.cancel_by.is_none() {
            self.cancel_by = Some(tokio::time::Instant::now() + CANCEL_DELAY);
        }
        // Creations still unsent are dropped; those in flight are cancelled on reply.
        let before = self.unsent.len();
        self.unsent
            .retain(|out| !matches!(out, Outgoing::Create(of, ..) if *of == id));
        wait.pending -= before - self.unsent.len();
        wait.done = true;
        if wait.pending == 0 {
            self.waits.remove(&id);
        }
    }

    /// The oldest unsent request went into the stream's buffer: a creation now awaits its
    /// reply.
    fn sent(&mut self) {
        if let Some(Outgoing::Create(id, ..)) = self.unsent.pop_front() {
            self.creating.push_back(id);
        }
    }

    /// Hands a message from etcd to the wait it is for, learning the watch id of a creation
    /// reply (or cancelling it, for a wait that is over). `false`: etcd refused a creation,
    /// and the stream is to close.
    fn response(&mut self, message: WatchResponse) -> bool {
        let id = if message.created() {
            self.creating.pop_front()
        } else {
            self.by_watch.get(&message.watch_id()).copied()
        };
        if message.created() && message.canceled() {
            // Refused: the stream's token is stale (see the module docs). Every wait
            // then reads again, and watches on a new stream.
            tracing::debug!(
                reason = message.cancel_reason(),
                "etcd refused a watch; closing the handle's watch stream"
            );
            return false;
        }
        let Some((id, wait)) = id.and_then(|id| Some((id, self.waits.get_mut(&id)?))) else {
            return true;
        };
        if message.created() {
            wait.pending -= 1;
            if wait.done {
                self.unsent.push_back(Outgoing::Cancel(message.watch_id()));
            } else {
                wait.watch_ids.push(message.watch_id());
                self.by_watch.insert(message.watch_id(), id);
            }
        } else if message.canceled() {
            self.by_watch.remove(&message.watch_id());
            wait.watch_ids.retain(|w| *w != message.watch_id());
        }
        if wait.done {
            if wait.pending == 0 {
                self.waits.remove(&id);
            }
        } else {
            // A wait reads its messages until it drops its `Watching` (which ends
            // this registration), so they do not pile up; a send fails only if it was
            // dropped meanwhile.
            let _ = wait.messages.send(message);
        }
        true
    }

    /// Starts the idle count once the last wait left the stream.
    fn note_idle(&mut self) {
        if self.waits.is_empty() && self.idle_since.is_none() {
            self.idle_since = Some(tokio::time::Instant::now());
        }
    }
}

/// The stream's task: until the stream breaks or ends, or stays without a watch for
/// [`IDLE_CLOSE`]. Ending drops every wait's message sender, which ends its [`Watching`].
async fn run(
    mut sender: WatchRequestSender,
    mut responses: WatchResponseStream,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut state = StreamState::new();
    loop {
        let idle_until = state.idle_since.map(|since| since + IDLE_CLOSE);
        let event = tokio::select! {
            biased;
            request = requests.recv() => Event::Request(request),
            response = responses.message() => Event::Response(response.ok().flatten()),
            sent = send_next(&mut sender, state.unsent.front()) => Event::Sent(sent),
            () = sleep_until_some(state.cancel_by) => Event::Cancel,
            () = sleep_until_some(idle_until) => Event::Idle,
        };
        match event {
            Event::Request(None | Some(Request::Close))
            | Event::Response(None)
            | Event::Sent(false)
            | Event::Idle => return,
            Event::Request(Some(Request::Watch {
                id,
                watches,
                messages,
                sent,
            })) => state.watch(id, watches, messages, sent),
            Event::Request(Some(Request::Done { id, defer })) => state.done(id, defer),
            Event::Cancel => state.cancel_deferred(),
            Event::Sent(true) => state.sent(),
            Event::Response(Some(message)) => {
                if !state.response(message) {
                    return;
                }
            }
        }
        // After an event that left the waits as they were (an unknown wait's end, a message
        // for no wait), this changes nothing: an empty map always has its idle count started.
        state.note_idle();
    }
}

async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
