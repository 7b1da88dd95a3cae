//! What a session's answered requests prove the ensemble's leader has heard of, so that a
//! lease's local deadline counts from a moment the leader's expiry provably counts from too.
//!
//! Only the leader expires sessions, and it refreshes a session served by a follower only when
//! that follower's reply to its next ping lists it (`docs/design/zookeeper-follower-lease.md`
//! has the path through ZooKeeper's source, and the proof). The follower writes those replies
//! and the requests it forwards (a `sync`, every write) on one connection, which the leader
//! reads in order: once a forwarded request is answered, the leader has read every ping reply
//! the follower wrote before it. A request answered at least `report` (the longest the
//! follower may wait for the leader's next ping) before that forwarded request was sent was
//! in one of those replies, so the leader refreshed the session after that request was sent.
//! The session's open counts too: the leader makes the session itself.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Answers closer together than this share one entry, dated from the later answer (which
/// only makes the earlier request count later): the log stays small under load.
const COALESCE: Duration = Duration::from_millis(1);

/// The answered requests of one session, oldest answer first.
#[derive(Debug)]
pub(crate) struct Heard {
    /// Before the session's open was sent: the leader made the session after it.
    opened: Instant,
    /// How long an entry is kept: past the longest an operation asks about.
    retain: Duration,
    log: Mutex<Log>,
}

#[derive(Debug)]
struct Log {
    /// `(answered, latest sent)`: when a request was answered, and the latest moment a
    /// request answered then or before was sent.
    entries: VecDeque<(Instant, Instant)>,
    /// The latest sent moment of the entries dropped as older than `retain`.
    dropped: Option<(Instant, Instant)>,
}

impl Heard {
    /// The log of a session whose open was sent after `opened`, keeping entries `retain`.
    pub(crate) fn new(opened: Instant, retain: Duration) -> Self {
        Heard {
            opened,
            retain,
            log: Mutex::new(Log {
                entries: VecDeque::new(),
                dropped: None,
            }),
        }
    }

    /// Records a request sent at `sent` and answered at `now`.
    pub(crate) fn answered(&self, sent: Instant, now: Instant) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let latest = log
            .entries
            .back()
            .map_or(sent, |&(_, latest)| latest.max(sent));
        match log.entries.back_mut() {
            Some(back) if now.saturating_duration_since(back.0) < COALESCE => *back = (now, latest),
            _ => log.entries.push_back((now, latest)),
        }
        while let Some(&front) = log.entries.front() {
            if now.saturating_duration_since(front.0) <= self.retain {
                break;
            }
            log.dropped = Some(front);
            log.entries.pop_front();
        }
    }

    /// The latest moment after which the leader has provably refreshed the session, for an
    /// operation whose forwarded request was sent after `at` and answered: the latest sent
    /// moment of a request answered at or before `at − report`, or the session's open.
    pub(crate) fn by(&self, at: Instant, report: Duration) -> Instant {
        let Some(cutoff) = at.checked_sub(report) else {
            return self.opened;
        };
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let within = log
            .entries
            .partition_point(|&(answered, _)| answered <= cutoff);
        let latest = match within {
            0 => log
                .dropped
                .filter(|&(answered, _)| answered <= cutoff)
                .map(|(_, latest)| latest),
            n => Some(log.entries[n - 1].1),
        };
        latest.map_or(self.opened, |latest| latest.max(self.opened))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn only_requests_answered_a_report_before_count() {
        let opened = Instant::now();
        let at = |t: u64| opened + ms(t);
        let heard = Heard::new(opened, ms(10_000));
        let report = ms(100);
        heard.answered(at(10), at(15));
        heard.answered(at(65), at(70));
        // Asked about an operation sent at 120 ms: only the first was answered 100 ms before.
        assert_eq!(heard.by(at(120), report), at(10));
        assert_eq!(heard.by(at(170), report), at(65));
        // Nothing answered early enough: the session's open.
        assert_eq!(heard.by(at(114), report), opened);
        assert_eq!(heard.by(at(50), report), opened);
    }

    #[test]
    fn a_request_answered_after_a_later_sent_one_does_not_move_the_moment_back() {
        let opened = Instant::now();
        let at = |t: u64| opened + ms(t);
        let heard = Heard::new(opened, ms(10_000));
        heard.answered(at(20), at(30));
        heard.answered(at(10), at(40));
        assert_eq!(heard.by(at(140), ms(100)), at(20));
    }

    #[test]
    fn answers_within_a_millisecond_share_an_entry_dated_from_the_later() {
        let opened = Instant::now();
        let at = |t: u64| opened + ms(t);
        let heard = Heard::new(opened, ms(10_000));
        heard.answered(at(10), at(20));
        heard.answered(at(15), at(20) + Duration::from_micros(500));
        assert_eq!(heard.log.lock().unwrap().entries.len(), 1);
        // The first alone was answered by 20 ms, but the entry counts both from the later.
        assert_eq!(heard.by(at(120), ms(100)), opened);
        assert_eq!(heard.by(at(121), ms(100)), at(15));
    }

    #[test]
    fn old_entries_are_dropped_but_still_count() {
        let opened = Instant::now();
        let at = |t: u64| opened + ms(t);
        let heard = Heard::new(opened, ms(1_000));
        heard.answered(at(10), at(10));
        heard.answered(at(2_010), at(2_010)); // drops the first
        assert_eq!(heard.log.lock().unwrap().entries.len(), 1);
        assert_eq!(heard.by(at(2_060), ms(100)), at(10));
        assert_eq!(heard.by(at(2_110), ms(100)), at(2_010));
    }
}
