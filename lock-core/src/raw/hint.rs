//! A store position (etcd's revision, ZooKeeper's zxid) a handle saw in an answer, and when the
//! request that showed it was sent: what a clock-floored token raise counts from, while it is
//! fresh.

use std::time::Duration;

use crate::Instant;

/// The position shown by the most recently sent request's answer. The most recently sent
/// request's answer wins, whether higher or lower: no maximum, so after a restore took the
/// store's positions back, a fresh answer brings the hint down with them.
#[derive(Debug, Default, Clone, Copy)]
pub struct PositionHint {
    latest: Option<(i64, Instant)>,
}

impl PositionHint {
    /// Notes `position`, shown by an answer to a request sent at `sent_at`.
    pub fn note(&mut self, position: i64, sent_at: Instant) {
        if self.latest.is_none_or(|(_, at)| at <= sent_at) {
            self.latest = Some((position, sent_at));
        }
    }

    /// The hint, if its request was sent at most `max_age` before `now`.
    pub fn fresh(&self, now: Instant, max_age: Duration) -> Option<i64> {
        self.latest
            .filter(|(_, at)| now.saturating_duration_since(*at) <= max_age)
            .map(|(position, _)| position)
    }
}
