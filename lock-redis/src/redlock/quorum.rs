//! Counting nodes' answers against the quorum, and [`QuorumError`], which says why there was
//! none.

use std::fmt;

use fencelock_core::Result;

use crate::eviction::{risk_of, EvictionRisk};

/// Why a Redlock operation found no quorum: each node's answer or failure, in URL order. It is
/// the `source` of the [`Error::Unavailable`](fencelock_core::Error::Unavailable) or
/// [`Error::Store`](fencelock_core::Error::Store) such an operation returns;
/// reach it with `std::error::Error::source` and `downcast_ref::<QuorumError>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumError {
    quorum: usize,
    nodes: Vec<(String, String)>,
}

impl QuorumError {
    /// Each node (`labels`, in URL order) with its answer shown by `show`, its error, or "no
    /// answer yet".
    pub(super) fn from_answers<T>(
        quorum: usize,
        labels: &[String],
        answers: &Answers<T>,
        show: impl Fn(&T) -> String,
    ) -> Self {
        let nodes = labels
            .iter()
            .zip(answers)
            .map(|(label, answer)| {
                let reason = match answer {
                    Some(Ok(value)) => show(value),
                    Some(Err(error)) => error.to_string(),
                    None => "no answer yet".to_owned(),
                };
                (label.clone(), reason)
            })
            .collect();
        QuorumError { quorum, nodes }
    }

    /// How many nodes had to agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Each node (`host:port`) with what it answered or why it failed.
    pub fn nodes(&self) -> &[(String, String)] {
        &self.nodes
    }
}

impl fmt::Display for QuorumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reasons: Vec<String> = self
            .nodes
            .iter()
            .map(|(node, reason)| format!("{node}: {reason}"))
            .collect();
        write!(
            f,
            "no quorum of {} out of {} nodes ({})",
            self.quorum,
            self.nodes.len(),
            reasons.join("; ")
        )
    }
}

impl std::error::Error for QuorumError {}

/// Each node's answer, `None` for a node that had not answered when the outcome was decided
/// (its request still runs to its own timeout in the background).
pub(super) type Answers<T> = Vec<Option<Result<T>>>;

pub(super) fn count<T>(answers: &Answers<T>, pick: impl Fn(&T) -> bool) -> usize {
    answers
        .iter()
        .filter(|a| matches!(a, Some(Ok(value)) if pick(value)))
        .count()
}

/// The first node's eviction refusal among `answers`.
pub(super) fn evicting<T>(answers: &Answers<T>) -> Option<&EvictionRisk> {
    answers.iter().find_map(|a| match a {
        Some(Err(error)) => risk_of(error),
        _ => None,
    })
}

pub(super) fn failures<T>(answers: &Answers<T>) -> usize {
    answers.iter().filter(|a| matches!(a, Some(Err(_)))).count()
}

pub(super) fn answered<T>(answers: &Answers<T>) -> usize {
    answers.iter().filter(|a| a.is_some()).count()
}
