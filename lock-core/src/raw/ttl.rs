//! TTLs in the units a store's server counts: whole milliseconds (Redis `PX`, PostgreSQL's
//! timers) or whole seconds (etcd leases). Always rounded up, so the server never keeps a lease
//! shorter than the TTL its local deadline was computed from.

use std::time::Duration;

/// `ttl` in whole milliseconds, rounded up; `u64::MAX` for a TTL longer than that.
pub fn whole_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// `ttl` in whole seconds, rounded up; `u64::MAX` for a TTL longer than that.
pub fn whole_secs(ttl: Duration) -> u64 {
    ttl.as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(whole_millis(Duration::ZERO), 0);
        assert_eq!(whole_millis(Duration::from_nanos(1)), 1);
        assert_eq!(whole_millis(Duration::from_millis(10)), 10);
        assert_eq!(whole_millis(Duration::from_micros(10_001)), 11);
        assert_eq!(whole_millis(Duration::from_micros(1_500)), 2);
        assert_eq!(whole_millis(Duration::from_secs(86_400)), 86_400_000);
        assert_eq!(whole_millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(whole_secs(Duration::ZERO), 0);
        assert_eq!(whole_secs(Duration::from_secs(1)), 1);
        assert_eq!(whole_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(whole_secs(Duration::from_nanos(1)), 1);
        assert_eq!(whole_secs(Duration::from_secs(86_400)), 86_400);
        assert_eq!(whole_secs(Duration::MAX), u64::MAX);
    }
}
