//! Input rules shared by every store: this crate checks every request against them before a
//! store is asked (see [`raw`](crate::raw)); a store checks its own configuration with
//! [`check_retention`] and [`clock_floor_retention`].

use std::time::Duration;

use crate::limits::{MAX_KEY_LEN, MAX_LABEL_LEN, MAX_PERMITS, MAX_WAIT};
use crate::raw::Store;
use crate::{Capabilities, Error, Lease, Mode, Result};

/// How long a store keeps the state of a key no one holds (its fencing counter), by default:
/// seven days, well beyond [`MAX_TTL`](crate::limits::MAX_TTL). See [`check_retention`].
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// A key is 1 to [`MAX_KEY_LEN`] bytes of UTF-8. Any character is allowed; stores treat keys as
/// data, never as code.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for an empty key or one over
/// [`MAX_KEY_LEN`] bytes.
pub(crate) fn check_key(key: &str) -> Result<()> {
    check_key_named("key", key)
}

/// [`check_key`] for a key that the caller knows by another name (an election's name).
pub(crate) fn check_key_named(field: &'static str, key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes long; the maximum is {MAX_KEY_LEN} bytes",
                key.len()
            ),
        ));
    }
    Ok(())
}

/// A listing's prefix is at most [`MAX_KEY_LEN`] bytes (empty: every key); its limit is 1 to
/// [`MAX_LIST_LIMIT`](crate::MAX_LIST_LIMIT).
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a longer prefix or a limit outside
/// those bounds.
pub(crate) fn check_list(prefix: &str, limit: usize) -> Result<()> {
    if prefix.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            "prefix",
            format!(
                "is {} bytes long; the maximum is {MAX_KEY_LEN} bytes",
                prefix.len()
            ),
        ));
    }
    if limit == 0 || limit > crate::MAX_LIST_LIMIT {
        return Err(Error::invalid(
            "limit",
            format!("{limit} is outside 1..={}", crate::MAX_LIST_LIMIT),
        ));
    }
    Ok(())
}

/// A holder label is 1 to [`MAX_LABEL_LEN`] bytes of UTF-8, without control characters (a
/// label is printed on one line by `lockctl status` and stored as text by every store).
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for an empty label, one over
/// [`MAX_LABEL_LEN`] bytes, or one with a control character.
pub(crate) fn check_label(field: &'static str, label: &str) -> Result<()> {
    if label.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes long; the maximum is {MAX_LABEL_LEN} bytes",
                label.len()
            ),
        ));
    }
    if label.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// A TTL lies between the store's [`Capabilities::min_ttl`] and [`Capabilities::max_ttl`].
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a zero TTL or one outside the store's
/// bounds.
pub(crate) fn check_ttl(ttl: Duration, capabilities: &Capabilities) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid("ttl", "must be greater than zero"));
    }
    if ttl < capabilities.min_ttl {
        return Err(Error::invalid(
            "ttl",
            format!(
                "{ttl:?} is below this store's minimum of {:?}",
                capabilities.min_ttl
            ),
        ));
    }
    if ttl > capabilities.max_ttl {
        return Err(Error::invalid(
            "ttl",
            format!(
                "{ttl:?} is above this store's maximum of {:?}",
                capabilities.max_ttl
            ),
        ));
    }
    Ok(())
}

/// A retention window must exceed the longest TTL the store grants (`max_ttl`), so the state of
/// a key is never dropped while a lease on it may still be valid: fails with
/// [`Error::InvalidInput`] on the `"url"` otherwise.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) when `retention` does not exceed `max_ttl`.
pub fn check_retention(retention: Duration, max_ttl: Duration) -> Result<()> {
    if retention <= max_ttl {
        return Err(Error::invalid(
            "url",
            format!("retention ({retention:?}) must exceed the maximum TTL ({max_ttl:?})"),
        ));
    }
    Ok(())
}

/// The shortest retention window a store whose tokens are floored at a clock
/// (`max(previous + 1, clock)`, see the workspace's `docs/swaps.md`) accepts: one token
/// `granule`, plus `max_skew` (how far the clock may step back, or two nodes' clocks differ),
/// plus `margin` (the store's gap between the clock its fence's idleness counts from and the
/// one its token was floored by), rounded up to a whole ms (windows are whole ms). A fence
/// removed after a shorter window could let the clock alone mint a token it minted before.
pub fn clock_floor_retention(granule: Duration, max_skew: Duration, margin: Duration) -> Duration {
    let bound = granule.saturating_add(max_skew).saturating_add(margin);
    Duration::from_millis(u64::try_from(bound.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX))
}

/// A wait bound is at most [`MAX_WAIT`]; zero means one attempt.
///
/// # Errors
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a wait above [`MAX_WAIT`].
pub(crate) fn check_wait(wait: Duration) -> Result<()> {
    if wait > MAX_WAIT {
        return Err(Error::invalid(
            "wait",
            format!("{wait:?} is above the maximum of {MAX_WAIT:?}"),
        ));
    }
    Ok(())
}

/// A mode the store keeps ([`Capabilities::supports`], else
/// [`Error::Unsupported`]) with a limit of 1 to [`MAX_PERMITS`] permits.
///
/// # Errors
/// [`Unsupported`](crate::ErrorKind::Unsupported) for a mode the store does not keep;
/// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a permit limit outside
/// `1..=`[`MAX_PERMITS`].
pub(crate) fn check_mode(mode: Mode, capabilities: &Capabilities) -> Result<()> {
    if !capabilities.supports(mode) {
        return Err(unsupported_mode(mode));
    }
    if let Mode::Permit { limit } = mode {
        if limit == 0 || limit > MAX_PERMITS {
            return Err(Error::invalid(
                "permits",
                format!("{limit} is outside 1..={MAX_PERMITS}"),
            ));
        }
    }
    Ok(())
}

/// What a store does with every lease it was granted, before it returns it: a lease whose local
/// deadline has already passed is released and refused with [`Error::Unavailable`], so no
/// caller ever starts work under a lease it must already assume gone.
///
/// The deadline is counted from before the granting request was sent, so it passes in transit
/// only when the grant's round trip took nearly the whole TTL: a stalled network, a replica
/// acknowledgement (Redis `min_replicas`), or a pause of the client between the reply and this
/// check. Such a store cannot grant this TTL in time right now, which is what `Unavailable`
/// says; the caller may retry, perhaps with a longer TTL.
///
/// # Errors
/// [`Unavailable`](crate::ErrorKind::Unavailable) when the lease's local deadline has passed
/// (the lease is released first; a failed release is only logged).
///
/// # Cancel safety
/// Dropping the future while it releases an expired lease leaves that lease to expire at its
/// TTL, which by the holder's own reckoning has already passed.
pub(crate) async fn check_granted<S: Store + ?Sized>(store: &S, lease: Lease) -> Result<Lease> {
    if !lease.is_expired() {
        return Ok(lease);
    }
    refuse_expired(store, lease).await
}

/// The cold half of [`check_granted`], kept out of every acquire's future.
#[cold]
fn refuse_expired<'a, S: Store + ?Sized>(
    store: &'a S,
    lease: Lease,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Lease>> + Send + 'a>> {
    Box::pin(async move {
        // Best effort: if the release fails, the lease expires at its TTL, which has passed here.
        let released = Store::release(store, &lease).await;
        tracing::warn!(
            key = lease.key(),
            token = lease.fencing_token(),
            ttl = ?lease.ttl(),
            ?released,
            "a lease was granted after its local deadline; released, not returned"
        );
        Err(Error::Unavailable {
            message: format!(
                "the lease on {:?} (fencing token {}) was granted after its local deadline: its \
                 TTL of {:?} ran out before the store's reply was read; it was released",
                lease.key(),
                lease.fencing_token(),
                lease.ttl()
            ),
            source: None,
        })
    })
}

/// The refusal of a mode a store does not keep.
pub(crate) fn unsupported_mode(mode: Mode) -> Error {
    Error::Unsupported {
        operation: match mode {
            Mode::Exclusive => "the exclusive mode",
            Mode::Shared => "the shared mode (reader-writer locks)",
            Mode::Permit { .. } => "the permit mode (semaphores)",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_TTL;

    #[test]
    fn keys_follow_the_documented_rules() {
        assert!(check_key("a").is_ok());
        assert!(check_key("ключ 'x' \"y\" ; DROP TABLE t; -- redis.call('del')").is_ok());
        assert!(check_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        let err = check_key(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err();
        assert!(err.to_string().contains("maximum is 1024 bytes"), "{err}");
        let err = check_key("").unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
    }

    #[test]
    fn ttls_follow_the_store_bounds() {
        let caps = Capabilities::new().with_min_ttl(Duration::from_secs(1));
        assert!(check_ttl(Duration::ZERO, &caps).is_err());
        assert!(check_ttl(Duration::from_millis(999), &caps).is_err());
        assert!(check_ttl(Duration::from_secs(1), &caps).is_ok());
        assert!(check_ttl(MAX_TTL, &caps).is_ok());
        assert!(check_ttl(MAX_TTL + Duration::from_millis(1), &caps).is_err());
        assert!(check_ttl(Duration::MAX, &caps).is_err());
        assert!(check_wait(Duration::MAX).is_err());
        assert!(check_wait(Duration::ZERO).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_granted_after_its_deadline_is_released_and_refused() {
        let store = crate::MemoryStore::new();
        let ttl = Duration::from_secs(1);
        let lease = crate::LockStore::try_acquire(&store, "k", ttl)
            .await
            .unwrap();
        let lease = check_granted(&store, lease).await.unwrap();
        // The reply "arrives" after the whole TTL less the drift margin.
        tokio::time::advance(ttl - crate::raw::drift(ttl)).await;
        let err = check_granted(&store, lease.clone()).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(
            err.to_string().contains("granted after its local deadline"),
            "{err}"
        );
        // Released at once, not left to its TTL: the key is free while the store still kept it.
        let next = crate::LockStore::try_acquire(&store, "k", ttl)
            .await
            .unwrap();
        assert!(next.fencing_token() > lease.fencing_token());
    }
}
