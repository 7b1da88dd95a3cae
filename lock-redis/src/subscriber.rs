//! [`ReleaseSubscriber`]: one pub/sub connection per store handle, shared by all its waiters.
//!
//! A waiter registers the key's release channel ([`ReleaseSubscriber::listen`]); the first
//! waiter on a channel makes the background task SUBSCRIBE, the last one to leave makes it
//! UNSUBSCRIBE. Commands reach the task in the order the waiter counts changed (they are sent
//! under the map's lock), so a subscribe is never overtaken by an older unsubscribe. A message
//! wakes every waiter of its channel. When the connection drops the task reconnects,
//! subscribes again to every channel still waited on and wakes all waiters, since a release
//! may have been missed meanwhile.
//!
//! Nothing here is needed for safety: waiters also retry when the holder's TTL runs out and
//! at least every [`WAIT_CAP`](crate::WAIT_CAP), so a lost message costs a bounded delay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::{sleep, timeout};

use crate::sentinel::SentinelConn;

/// The pub/sub side of one store handle.
pub(crate) struct ReleaseSubscriber {
    shared: Arc<SubscriberState>,
}

/// What the subscriber and its listeners share.
struct SubscriberState {
    /// Where to subscribe.
    source: Source,
    /// The index of the client to try next.
    next: std::sync::atomic::AtomicUsize,
    connect_timeout: Duration,
    command_timeout: Duration,
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    // Started with the first waiter: a handle that never waits opens no second connection.
    commands: OnceLock<mpsc::UnboundedSender<Command>>,
    /// Whether a refused SUBSCRIBE was logged already.
    refusal_logged: std::sync::atomic::AtomicBool,
}

struct Channel {
    wake: Notify,
    /// Changed only under the map's lock.
    waiters: std::sync::atomic::AtomicUsize,
    /// True once the server confirmed the subscription on the current connection.
    subscribed: watch::Sender<bool>,
    /// The last message on the channel that was not empty (a Redlock waiter's channel
    /// carries the grants a release made it), kept until a newer one replaces it.
    last: Mutex<Option<Vec<u8>>>,
}

/// The servers a subscriber connects to.
enum Source {
    /// Tried in turn: one for a single server; every seed node of a Cluster, where PUBLISH
    /// reaches every node.
    Fixed(Vec<redis::Client>),
    /// The master a Sentinel deployment names now (its replicas would do as well: PUBLISH is
    /// replicated, but the master is the one server the store knows).
    Sentinel(SentinelConn),
}

enum Command {
    Subscribe(String),
    Unsubscribe(String),
}

/// One waiter's registration on a channel; dropping it gives the registration up.
pub(crate) struct Listener {
    shared: Arc<SubscriberState>,
    name: String,
    channel: Arc<Channel>,
}

impl ReleaseSubscriber {
    pub(crate) fn new(
        clients: Vec<redis::Client>,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        Self::with_source(Source::Fixed(clients), connect_timeout, command_timeout)
    }

    /// A subscriber on the master the sentinels name, asked again at every reconnect.
    pub(crate) fn on_master_of(
        conn: SentinelConn,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        Self::with_source(Source::Sentinel(conn), connect_timeout, command_timeout)
    }

    fn with_source(source: Source, connect_timeout: Duration, command_timeout: Duration) -> Self {
        ReleaseSubscriber {
            shared: Arc::new(SubscriberState {
                source,
                next: 0.into(),
                connect_timeout,
                command_timeout,
                channels: Mutex::default(),
                commands: OnceLock::new(),
                refusal_logged: false.into(),
            }),
        }
    }

    /// Registers a waiter on `channel`, subscribing if it is the first.
    pub(crate) fn listen(&self, channel: &str) -> Listener {
        let shared = &self.shared;
        let commands = shared.commands.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(run(Arc::downgrade(shared), receiver));
            sender
        });
        let mut channels = shared.lock();
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| {
                // The task owns the receiver until the last handle drops: a send cannot fail
                // while `shared` (which holds the sender) is alive.
                let _ = commands.send(Command::Subscribe(channel.to_owned()));
                Arc::new(Channel {
                    wake: Notify::new(),
                    waiters: 0.into(),
                    subscribed: watch::Sender::new(false),
                    last: Mutex::default(),
                })
            })
            .clone();
        entry
            .waiters
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Listener {
            shared: shared.clone(),
            name: channel.to_owned(),
            channel: entry,
        }
    }

    /// How many channels are waited on now.
    pub(crate) fn channels(&self) -> usize {
        self.shared.lock().len()
    }
}

impl SubscriberState {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Says once per handle, at warn level, that the server refused a SUBSCRIBE (an ACL
    /// without `+subscribe` or the channel): waits still work, by trying again.
    fn refused(&self, error: &redis::RedisError) {
        if crate::error::is_unavailable(error) {
            return;
        }
        if !self
            .refusal_logged
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                %error,
                "the server refused SUBSCRIBE to a release channel: waiters are not woken by \
                 releases and find them by trying again (at least every 250 ms); allow \
                 +subscribe and the channels under the prefix (&PREFIX*) for this user"
            );
        }
    }
}

impl Listener {
    /// Waits until the server confirmed the subscription, or `bound` passed.
    pub(crate) async fn subscribed(&self, bound: Duration) {
        let mut confirmed = self.channel.subscribed.subscribe();
        let _ = timeout(bound, confirmed.wait_for(|yes| *yes)).await;
    }

    /// Completes at the next release message on the channel (create and `enable` it before
    /// the attempt it follows, so a message during the attempt is not lost).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.channel.wake.notified()
    }

    /// The last message on the channel that was not empty, if any came while it was
    /// listened to (read it after [`notified`](Self::notified) completes, or before waiting).
    pub(crate) fn last_message(&self) -> Option<Vec<u8>> {
        self.channel
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _channels = self.shared.lock();
        let before = self
            .channel
            .waiters
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if before == 1 {
            if let Some(commands) = self.shared.commands.get() {
                let _ = commands.send(Command::Unsubscribe(self.name.clone()));
            }
        }
    }
}

/// The background task: owns the pub/sub connection, runs the commands in order, dispatches
/// messages. Ends when the last handle to the store is dropped.
async fn run(shared: Weak<SubscriberState>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let connected = connect(&strong).await;
        drop(strong);
        let (mut sink, mut messages) = match connected {
            Some(connection) => connection,
            None => {
                if !back_off(&shared, &mut commands, &mut backoff).await {
                    return;
                }
                continue;
            }
        };
        // Everything queued so far is covered by subscribing to the whole map below.
        while let Ok(command) = commands.try_recv() {
            if let Some(s) = shared.upgrade() {
                forget_unused(&s, command);
            }
        }
        if !resubscribe(&shared, &mut sink).await {
            // Backed off as a failed connect: a SUBSCRIBE the server refuses (an ACL without
            // `+subscribe` or the channel) would otherwise reconnect and retry at once, forever.
            if !back_off(&shared, &mut commands, &mut backoff).await {
                return;
            }
            continue;
        }
        backoff = Duration::from_millis(50);
        loop {
            tokio::select! {
                message = messages.next() => match message {
                    Some(message) => {
                        let Some(s) = shared.upgrade() else { return };
                        let channels = s.lock();
                        if let Some(channel) = channels.get(message.get_channel_name()) {
                            let payload = message.get_payload_bytes();
                            if !payload.is_empty() {
                                *channel.last.lock().unwrap_or_else(PoisonError::into_inner) =
                                    Some(payload.to_vec());
                            }
                            channel.wake.notify_waiters();
                        }
                    }
                    None => break,
                },
                command = commands.recv() => {
                    let Some(command) = command else { return };
                    let Some(s) = shared.upgrade() else { return };
                    if !execute(&s, &mut sink, command).await {
                        break;
                    }
                }
            }
        }
        tracing::debug!("the pub/sub connection dropped; reconnecting");
        if let Some(s) = shared.upgrade() {
            for channel in s.lock().values() {
                channel.subscribed.send_replace(false);
            }
        }
    }
}

/// Waits `backoff` (doubled for next time, up to 1 s) while draining commands, so channels
/// nobody waits on are dropped meanwhile. False if the store is gone.
async fn back_off(
    shared: &Weak<SubscriberState>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    backoff: &mut Duration,
) -> bool {
    tokio::select! {
        () = sleep(*backoff) => {}
        command = commands.recv() => match command {
            None => return false,
            Some(command) => if let Some(s) = shared.upgrade() { forget_unused(&s, command) },
        },
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(1));
    true
}

async fn connect(shared: &SubscriberState) -> Option<(PubSubSink, PubSubStream)> {
    let index = shared.next.load(std::sync::atomic::Ordering::Relaxed);
    let client = match &shared.source {
        Source::Fixed(clients) => clients.get(index % clients.len().max(1))?.clone(),
        Source::Sentinel(conn) => match conn.master_client().await {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "no master for the pub/sub connection");
                return None;
            }
        },
    };
    match timeout(shared.connect_timeout, client.get_async_pubsub()).await {
        Ok(Ok(pubsub)) => Some(pubsub.split()),
        Ok(Err(error)) => {
            // The next connect tries the next server (a Cluster's node may be down).
            shared
                .next
                .store(index.wrapping_add(1), std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(%error, "pub/sub connection failed");
            None
        }
        Err(_) => {
            shared
                .next
                .store(index.wrapping_add(1), std::sync::atomic::Ordering::Relaxed);
            tracing::debug!("pub/sub connection timed out");
            None
        }
    }
}

/// Subscribes to every channel in the map and wakes their waiters (a release may have gone
/// unseen while there was no connection). False if the connection failed.
async fn resubscribe(shared: &Weak<SubscriberState>, sink: &mut PubSubSink) -> bool {
    let Some(s) = shared.upgrade() else {
        return true;
    };
    let names: Vec<String> = s.lock().keys().cloned().collect();
    if !names.is_empty() {
        match timeout(s.command_timeout, sink.subscribe(&names)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                s.refused(&error);
                return false;
            }
            Err(_) => return false,
        }
    }
    // Only the channels this SUBSCRIBE named: one added meanwhile has its own command queued,
    // and marking it now would let its waiter miss a release sent before that command lands.
    let channels = s.lock();
    for channel in names.iter().filter_map(|name| channels.get(name)) {
        channel.subscribed.send_replace(true);
        channel.wake.notify_waiters();
    }
    true
}

/// Drops a channel's entry if an unsubscribe finds nobody waiting on it.
fn forget_unused(shared: &SubscriberState, command: Command) {
    if let Command::Unsubscribe(name) = command {
        let mut channels = shared.lock();
        if channels.get(&name).is_some_and(|c| idle(c)) {
            channels.remove(&name);
        }
    }
}

fn idle(channel: &Channel) -> bool {
    channel.waiters.load(std::sync::atomic::Ordering::SeqCst) == 0
}

/// Runs one command on the connection. False if the connection failed.
async fn execute(shared: &SubscriberState, sink: &mut PubSubSink, command: Command) -> bool {
    match command {
        Command::Subscribe(name) => {
            match timeout(shared.command_timeout, sink.subscribe(&name)).await {
                Ok(Ok(())) => {
                    if let Some(channel) = shared.lock().get(&name) {
                        channel.subscribed.send_replace(true);
                    }
                    true
                }
                Ok(Err(error)) => {
                    shared.refused(&error);
                    false
                }
                Err(_) => false,
            }
        }
        Command::Unsubscribe(name) => {
            {
                let mut channels = shared.lock();
                if !channels.get(&name).is_some_and(|c| idle(c)) {
                    // A new waiter came meanwhile and still needs the subscription.
                    return true;
                }
                channels.remove(&name);
            }
            matches!(
                timeout(shared.command_timeout, sink.unsubscribe(&name)).await,
                Ok(Ok(()))
            )
        }
    }
}
