//! How a TTL maps to a ZooKeeper session: the server's limits as the handle learned them, the
//! granule a TTL is rounded up to, the delay a follower may hold a session's activity before
//! the leader hears of it, and the refusals of the TTLs a session cannot carry.
//!
//! Only the leader expires sessions, no earlier than the negotiated timeout `S` after it last
//! refreshed one (`SessionTrackerImpl.touchSession`, `ExpiryQueue.update`). It refreshes a
//! session a follower serves only when the follower's reply to its ping, every half tick,
//! lists it (`Learner.ping`, the `PING` case of `LearnerHandler`): the requests a follower
//! forwards do not refresh it (`LeaderZooKeeperServer.submitLearnerRequest`). So an extend's
//! `sync` can return before the leader hears of it, and the leader's last refresh may be
//! half a tick and the session's idle gap older; a follower cut off right then lets the
//! leader give the key away early (`tests/follower_cut.rs` saw 150 ms on a 1 s TTL).
//!
//! A lease's deadline is therefore dated from a request the leader has provably heard of
//! (`heard`): the follower writes its ping replies and the requests it forwards on one
//! connection, which the leader reads in order, so once a forwarded request (the create, a
//! `sync`, a mark) is answered, every request answered [`Limits::report_delay`] before it was
//! sent was in a ping reply the leader read. A lease on a session of timeout `S` is valid
//! locally until that request's `sent_at + S − drift(S)` and no longer: its TTL is `S`. Each
//! TTL, rounded up to the granule, gets a session of its own asked for at exactly that
//! timeout. `docs/design/zookeeper-follower-lease.md` has the whole argument.
//!
//! The shortest TTL is twice the server's `minSessionTimeout` (four ticks at ZooKeeper's
//! default ratio), not the minimum itself: the client gives a connection up after 2/5 of its
//! session without a byte, and the loss signal fires 0.35 of it later, 80 ms and 66 ms on a
//! session of two 100 ms ticks, which a loaded machine's scheduling reaches (revoking leases
//! that were fine); and the server's expiry rounding keeps a dead holder's key up to two ticks
//! past the session, as long again as a two-tick TTL, at most half of one of four ticks.

use std::time::Duration;

use fencelock_core::{Error, Result};

/// The server's session limits, learned when the handle connects, and the granule they give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// The shortest session the server grants: its `minSessionTimeout` (or the handle's probe,
    /// on a server whose minimum is lower). Half the shortest TTL.
    pub(crate) min: Duration,
    /// The longest session the server grants: its `maxSessionTimeout`.
    pub(crate) max: Duration,
    /// What a TTL is rounded up to: the server's tick as estimated from its minimum (ZooKeeper's
    /// default `minSessionTimeout` is two ticks; the client does not learn the tick itself).
    pub(crate) granule: Duration,
}

impl Limits {
    /// The limits from the timeouts the server negotiated for a session asked at less than its
    /// minimum (`min`) and one asked at more than its maximum (`max`).
    pub(crate) fn negotiated(min: Duration, max: Duration) -> Self {
        let granule = (min / 2).max(Duration::from_millis(1));
        Limits {
            min,
            max: max.max(min),
            granule,
        }
    }

    /// The longest a follower may hold a session's activity before its leader hears of it:
    /// the leader pings every half tick, and this is a whole tick as the handle estimates it,
    /// the granule (at ZooKeeper's default `minSessionTimeout` of two ticks, two ping periods;
    /// at any minimum of one tick or more, one at least). See the module docs.
    pub(crate) fn report_delay(&self) -> Duration {
        self.granule
    }

    /// The shortest TTL: twice the server's minimum (see the module docs).
    pub(crate) fn min_ttl(&self) -> Duration {
        self.min * 2
    }

    /// The longest TTL: the longest multiple of the granule the server keeps a session for.
    pub(crate) fn max_ttl(&self) -> Duration {
        let steps = self.max.as_nanos() / self.granule.as_nanos();
        self.granule * u32::try_from(steps).unwrap_or(u32::MAX)
    }

    /// The most sessions a handle keeps for leases: one per granule from the shortest TTL to
    /// the longest, `(max_ttl − min_ttl) / granule + 1`.
    pub(crate) fn max_sessions(&self) -> u64 {
        let span = self.max_ttl().saturating_sub(self.min_ttl());
        let steps = span.as_nanos() / self.granule.as_nanos();
        u64::try_from(steps).unwrap_or(u64::MAX).saturating_add(1)
    }

    /// The session timeout a lease of `ttl` lives on, and the TTL it is granted: `ttl` rounded
    /// up to the granule.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a TTL below twice the server's minimum (the module docs say
    /// why; below the minimum itself the server would lengthen the session, keeping a dead
    /// holder's key past its TTL) or one whose session the server would shorten (its local
    /// deadline could not follow the TTL), naming the server's limits.
    pub(crate) fn session_for(&self, ttl: Duration) -> Result<Duration> {
        if ttl < self.min_ttl() {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} is below this store's minimum of {:?}: a lease lives on a ZooKeeper \
                     session of its TTL, of at least twice this server's minSessionTimeout \
                     (its limits: minSessionTimeout {:?}, maxSessionTimeout {:?})",
                    self.min_ttl(),
                    self.min,
                    self.max
                ),
            ));
        }
        let steps = ttl.as_nanos().div_ceil(self.granule.as_nanos());
        let session = u32::try_from(steps)
            .ok()
            .and_then(|steps| self.granule.checked_mul(steps))
            .filter(|session| *session <= self.max_ttl());
        session.ok_or_else(|| {
            Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} is above this store's maximum of {:?}: a lease lives on a ZooKeeper \
                     session of its TTL (rounded up to {:?}), and this server shortens every \
                     session to its maxSessionTimeout of {:?} (its limits: minSessionTimeout \
                     {:?}, maxSessionTimeout {:?})",
                    self.max_ttl(),
                    self.granule,
                    self.max,
                    self.min,
                    self.max
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// test-servers' server: `tickTime` 100 ms, sessions of 200 ms to 10 s.
    fn test_server() -> Limits {
        Limits::negotiated(ms(200), ms(10_000))
    }

    #[test]
    fn a_ttl_rounds_up_to_the_granule_and_gets_that_session() {
        let limits = test_server();
        assert_eq!(limits.granule, ms(100));
        for (ttl, session) in [
            (400, 400),
            (401, 500),
            (500, 500),
            (1_501, 1_600),
            (1_600, 1_600),
            (4_000, 4_000),
            (9_901, 10_000),
            (10_000, 10_000),
        ] {
            assert_eq!(
                limits.session_for(ms(ttl)).unwrap(),
                ms(session),
                "{ttl} ms"
            );
        }
    }

    #[test]
    fn ttls_outside_the_servers_limits_are_refused_naming_them() {
        let limits = test_server();
        for ttl in [ms(199), ms(399), ms(10_001), ms(60_000), Duration::MAX] {
            match limits.session_for(ttl) {
                Err(Error::InvalidInput { what: "ttl", rule }) => {
                    assert!(
                        rule.contains("minSessionTimeout 200ms")
                            && rule.contains("maxSessionTimeout 10s"),
                        "{rule}"
                    );
                }
                other => panic!("{ttl:?} gave {other:?}"),
            }
        }
        assert!(matches!(
            limits.session_for(ms(399)),
            Err(Error::InvalidInput { rule, .. }) if rule.contains("minimum of 400ms")
        ));
        assert!(matches!(
            limits.session_for(ms(60_000)),
            Err(Error::InvalidInput { rule, .. }) if rule.contains("maximum of 10s")
        ));
    }

    #[test]
    fn the_session_bound_counts_the_granules_between_the_limits() {
        // TTLs of 400 ms to 10 s by 100 ms: 97 sessions; ZooKeeper's defaults (tickTime 2 s,
        // sessions of 4 s to 40 s, so TTLs of 8 s to 40 s): 17.
        assert_eq!(test_server().max_sessions(), 97);
        assert_eq!(Limits::negotiated(ms(4_000), ms(40_000)).max_sessions(), 17);
        // A maximum off the granule: the longest TTL is the granule below it.
        let odd = Limits::negotiated(ms(200), ms(10_050));
        assert_eq!(odd.max_ttl(), ms(10_000));
        assert!(odd.session_for(ms(10_001)).is_err());
        // Every TTL in range maps to one of max_sessions() timeouts.
        let limits = test_server();
        let mut sessions: Vec<Duration> = (400..=10_000)
            .map(|t| limits.session_for(ms(t)).unwrap())
            .collect();
        sessions.dedup();
        assert_eq!(sessions.len() as u64, limits.max_sessions());
    }
}
