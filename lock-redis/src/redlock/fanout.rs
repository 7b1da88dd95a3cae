//! Sending one request to every node at once, each in its own task under a bound, and
//! collecting the answers until the outcome is decided.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::Conn;
use fencelock_core::{Error, Result};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::timeout;

use super::quorum::Answers;
use crate::store::RedisStore;

/// One gate per node for the requests of one round: the first request holds its node's gate
/// from before its task starts until it is answered, and later ones wait for it.
pub(super) struct NodeOrder {
    gates: Vec<Arc<tokio::sync::Mutex<()>>>,
}

impl NodeOrder {
    pub(super) fn new(nodes: usize) -> NodeOrder {
        NodeOrder {
            gates: (0..nodes)
                .map(|_| Arc::new(tokio::sync::Mutex::new(())))
                .collect(),
        }
    }
}

/// Where a request stands in a round's [`NodeOrder`].
#[derive(Clone, Copy)]
pub(super) enum Turn {
    /// Goes first: takes the gate when the request is made, before it is first polled.
    First,
    /// Waits for the requests before it on the same node.
    After,
}

type NodeFuture<T> = std::pin::Pin<Box<dyn Future<Output = (usize, Result<T>)> + Send>>;

/// Requests sent to every node, answered in any order.
pub(super) struct FanOut<T> {
    pending: FuturesUnordered<NodeFuture<T>>,
    nodes: usize,
}

impl<T: Send + 'static> FanOut<T> {
    /// Collects answers until `decided` says the outcome is known or every node answered.
    /// Requests still unanswered then run on in one background task, to their answer or
    /// their bound, so a straggler's grant is still released in order.
    pub(super) async fn await_until(mut self, decided: impl Fn(&Answers<T>) -> bool) -> Answers<T> {
        let mut answers: Answers<T> = (0..self.nodes).map(|_| None).collect();
        while let Some((index, answer)) = self.pending.next().await {
            answers[index] = Some(answer);
            if decided(&answers) {
                break;
            }
        }
        if !self.pending.is_empty() {
            let mut rest = std::mem::take(&mut self.pending);
            tokio::spawn(async move { while rest.next().await.is_some() {} });
        }
        answers
    }

    /// Starts `op` on every node of `nodes` (or those `only` marks) at once, each under
    /// `bound`; the requests go out when [`await_until`](Self::await_until) first polls. With
    /// an `order`, each node's request waits for that node's earlier request in `order` to
    /// finish (or time out), so a cleanup never overtakes the grant it undoes (two tasks
    /// waiting on one reconnecting connection are otherwise polled in any order).
    pub(super) fn start<F, Fut>(
        nodes: &[RedisStore],
        what: &'static str,
        bound: Duration,
        order: Option<(&NodeOrder, Turn)>,
        only: Option<&[bool]>,
        op: F,
    ) -> Self
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let pending = nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| only.is_none_or(|only| only.get(*index) == Some(&true)))
            .map(|(index, node)| {
                let work = op(node.connection());
                let node = node.clone();
                // Taken here, before the task exists, so whatever comes after waits for it.
                let first = match order {
                    Some((order, Turn::First)) => order.gates[index].clone().try_lock_owned().ok(),
                    _ => None,
                };
                let after = match order {
                    Some((order, Turn::After)) => Some(order.gates[index].clone()),
                    _ => None,
                };
                // Polled by `await_until`, then by its background task: a request already
                // sent runs to its answer (or its timeout) even when the caller stops waiting.
                Box::pin(async move {
                    let _turn = match after {
                        Some(gate) => Some(gate.lock_owned().await),
                        None => first,
                    };
                    // A node is used only once it passed its eviction check (at once after
                    // the first pass); a node that may evict fails every request it gets.
                    let checked_work = async move {
                        node.checked_eviction().await?;
                        work.await
                    };
                    let answer = match timeout(bound, checked_work).await {
                        Ok(answer) => answer,
                        Err(_) => Err(Error::Unavailable {
                            message: format!("{what}: no answer within {bound:?}"),
                            source: None,
                        }),
                    };
                    (index, answer)
                }) as NodeFuture<T>
            })
            .collect();
        FanOut {
            pending,
            nodes: nodes.len(),
        }
    }
}
