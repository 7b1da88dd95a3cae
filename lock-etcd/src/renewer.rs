//! One keep-alive stream per store handle, renewing any of its leases.
//!
//! etcd's `LeaseKeepAlive` is a bidirectional stream whose requests each name a lease id, and
//! whose responses come back in order. One task owns the stream: callers send it a lease id and
//! get back whether the lease is still alive. The stream is opened on first use and reopened
//! after it breaks; a break fails the renewals in flight with a retryable error.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use fencelock_core::{Error, Result};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::{client_error, never_sent};

/// Is the lease still alive after this renewal?
type Reply = oneshot::Sender<Result<bool>>;

struct Renewal {
    lease_id: i64,
    reply: Reply,
}

/// What callers ask of the task.
enum Request {
    Renew(Renewal),
    /// A renewal went unanswered: etcd answers a stream's renewals one at a time, so one stuck
    /// renewal (a lease expired but not yet revoked, a member without a leader) holds up every
    /// other lease's. Reopen the stream rather than wait behind it.
    Reopen,
}

/// The handle's keep-alive stream. Dropping it ends the task and the stream.
pub(crate) struct Renewer {
    requests: mpsc::UnboundedSender<Request>,
    task: JoinHandle<()>,
    timeout: Duration,
}

impl Renewer {
    /// Starts the task on the current runtime; the stream opens on the first renewal.
    pub(crate) fn start(client: Client, timeout: Duration) -> Self {
        let (requests, received) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(client, received, timeout));
        Renewer {
            requests,
            task,
            timeout,
        }
    }

    /// Renews `lease_id` once: `Ok(true)` if etcd renewed it, `Ok(false)` if etcd no longer
    /// knows it (expired or revoked), a retryable error if no answer came within the timeout.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the answer; the renewal may still happen.
    pub(crate) async fn renew(&self, lease_id: i64) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Renew(Renewal { lease_id, reply }))
            .map_err(|_| unavailable("the keep-alive task has stopped"))?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(unavailable("the keep-alive stream dropped the renewal")),
            Err(_) => {
                let _ = self.requests.send(Request::Reopen);
                Err(unavailable(&format!(
                    "no keep-alive answer from etcd within {:?}",
                    self.timeout
                )))
            }
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn unavailable(message: &str) -> Error {
    Error::Unavailable {
        message: message.to_owned(),
        source: None,
    }
}

struct Open {
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    /// Renewals not yet handed to the stream, oldest first. The stream's buffer is small
    /// (100 requests); the task never waits on it, so it keeps reading answers while a burst
    /// of renewals (thousands of leases on one handle) waits here. Waiting on a full buffer
    /// instead could stall both ways: etcd stops reading requests while its answers go unread.
    unsent: VecDeque<Renewal>,
    /// Renewals sent and not yet answered, per lease, oldest first: etcd answers in order.
    pending: HashMap<i64, VecDeque<Reply>>,
}

enum Event {
    Request(Option<Request>),
    Response(Result<Option<(i64, bool)>, etcd_client::Error>),
    /// The oldest unsent renewal went into the stream (or the stream's sender is closed).
    Sent(bool),
}

async fn next_response(
    responses: Option<&mut LeaseKeepAliveStream>,
) -> Result<Option<(i64, bool)>, etcd_client::Error> {
    match responses {
        Some(responses) => responses
            .message()
            .await
            .map(|m| m.map(|r| (r.id(), r.ttl() > 0))),
        None => std::future::pending().await,
    }
}

/// Sends `keeper`'s renewal once the stream's buffer has room. Cancel safe: a send that loses
/// the race in `select!` has sent nothing (tokio's `Sender::send`).
async fn send_next(keeper: Option<LeaseKeeper>) -> bool {
    match keeper {
        Some(mut keeper) => keeper.keep_alive().await.is_ok(),
        None => std::future::pending().await,
    }
}

async fn run(client: Client, mut received: mpsc::UnboundedReceiver<Request>, timeout: Duration) {
    let mut open: Option<Open> = None;
    loop {
        let (responses, next) = match open.as_mut() {
            Some(stream) => {
                // The stream's sender is public (feature `pub-response-field`): a keeper for
                // any lease id writes to the same stream.
                let next = stream.unsent.front().map(|renewal| LeaseKeeper {
                    id: renewal.lease_id,
                    sender: stream.keeper.sender.clone(),
                });
                (Some(&mut stream.responses), next)
            }
            None => (None, None),
        };
        let event = tokio::select! {
            request = received.recv() => Event::Request(request),
            response = next_response(responses) => Event::Response(response),
            sent = send_next(next) => Event::Sent(sent),
        };
        match event {
            Event::Request(None) => return,
            Event::Request(Some(Request::Reopen)) => {
                if open.is_some() {
                    tracing::debug!("a renewal went unanswered; reopening the keep-alive stream");
                    fail_all(open.take(), "the keep-alive stream was stuck");
                }
            }
            Event::Request(Some(Request::Renew(renewal))) => match open.as_mut() {
                Some(stream) => stream.unsent.push_back(renewal),
                None => open = open_with(&client, renewal, timeout).await,
            },
            Event::Sent(true) => {
                if let Some(stream) = open.as_mut() {
                    if let Some(renewal) = stream.unsent.pop_front() {
                        stream
                            .pending
                            .entry(renewal.lease_id)
                            .or_default()
                            .push_back(renewal.reply);
                    }
                }
            }
            Event::Sent(false) => fail_all(open.take(), "the keep-alive stream closed"),
            Event::Response(Ok(Some((lease_id, alive)))) => {
                if let Some(stream) = open.as_mut() {
                    let reply = match stream.pending.entry(lease_id) {
                        // An emptied queue goes, or every lease ever renewed would stay.
                        Entry::Occupied(mut queue) => {
                            let reply = queue.get_mut().pop_front();
                            if queue.get().is_empty() {
                                queue.remove();
                            }
                            reply
                        }
                        Entry::Vacant(_) => None,
                    };
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(alive));
                    }
                }
            }
            Event::Response(Ok(None)) => fail_all(open.take(), "etcd ended the keep-alive stream"),
            Event::Response(Err(error)) => {
                tracing::debug!(%error, "keep-alive stream broke; reopening on the next renewal");
                fail_all(open.take(), "the keep-alive stream broke");
            }
        }
    }
}

/// Opens the stream with `renewal` as its first request (the client library's way to open it).
/// A member that refuses the connection is skipped: the open is tried again (the balancer may
/// pick another member) until the timeout.
async fn open_with(client: &Client, renewal: Renewal, timeout: Duration) -> Option<Open> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    let outcome = loop {
        let mut leases = client.lease_client();
        match tokio::time::timeout_at(deadline, leases.keep_alive(renewal.lease_id)).await {
            Ok(Err(error))
                if never_sent(&error) && tokio::time::Instant::now() + pause < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            outcome => break outcome,
        }
    };
    match outcome {
        Ok(Ok((keeper, responses))) => {
            let _ = renewal.reply.send(Ok(true));
            Some(Open {
                keeper,
                responses,
                unsent: VecDeque::new(),
                pending: HashMap::new(),
            })
        }
        // The library reads the first answer itself and reports TTL 0 as this error.
        Ok(Err(etcd_client::Error::LeaseKeepAliveError(message)))
            if message.contains("lease not found") =>
        {
            let _ = renewal.reply.send(Ok(false));
            None
        }
        Ok(Err(error)) => {
            let _ = renewal
                .reply
                .send(Err(client_error("open the keep-alive stream", error)));
            None
        }
        Err(_) => {
            let _ = renewal.reply.send(Err(unavailable(&format!(
                "opening the keep-alive stream took longer than {timeout:?}"
            ))));
            None
        }
    }
}

fn fail_all(open: Option<Open>, why: &str) {
    let Some(open) = open else { return };
    let unsent = open.unsent.into_iter().map(|renewal| renewal.reply);
    for reply in unsent.chain(open.pending.into_values().flatten()) {
        let _ = reply.send(Err(unavailable(why)));
    }
}
