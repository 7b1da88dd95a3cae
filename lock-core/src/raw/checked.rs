//! The contract enforced once: every [`Store`] is a [`LockStore`], through this one impl.

use async_trait::async_trait;
use tracing::Instrument;

use super::validate::{
    check_granted, check_key, check_label, check_list, check_mode, check_ttl, check_wait,
};
use super::{AcquireRequest, Store};
use crate::{
    Capabilities, Error, Instant, KeyStatus, Lease, ListCursor, Listing, LockStore, Mode,
    PerKeyState, ReleaseOutcome, Result,
};

#[async_trait]
impl<S: Store> LockStore for S {
    fn capabilities(&self) -> Capabilities {
        Store::capabilities(self)
    }

    async fn acquire_request(&self, request: AcquireRequest<'_>) -> Result<Lease> {
        acquire_checked(self, request, Store::acquire(self, &request)).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let span = tracing::debug_span!(
            "release",
            store = Store::name(self),
            key = lease.key(),
            token = lease.fencing_token()
        );
        let result = Store::release(self, lease).instrument(span).await;
        match &result {
            Ok(outcome) => tracing::debug!(key = lease.key(), ?outcome, "released"),
            Err(error) => tracing::debug!(key = lease.key(), %error, "release failed"),
        }
        result
    }

    async fn extend(&self, lease: &Lease) -> Result<()> {
        let span = tracing::trace_span!(
            "extend",
            store = Store::name(self),
            key = lease.key(),
            token = lease.fencing_token()
        );
        let result = Store::extend(self, lease).instrument(span).await;
        match &result {
            Ok(()) => tracing::trace!(key = lease.key(), "extended"),
            Err(error) => tracing::debug!(key = lease.key(), %error, "extend failed"),
        }
        result
    }

    async fn relabel(&self, lease: &Lease, label: &str) -> Result<()> {
        check_label("label", label)?;
        let span = tracing::debug_span!(
            "relabel",
            store = Store::name(self),
            key = lease.key(),
            token = lease.fencing_token()
        );
        let result = Store::relabel(self, lease, label).instrument(span).await;
        match &result {
            Ok(()) => {
                lease.set_label(Some(label));
                tracing::debug!(key = lease.key(), label, "relabelled");
            }
            Err(error) => tracing::debug!(key = lease.key(), %error, "relabel failed"),
        }
        result
    }

    async fn status(&self, key: &str) -> Result<KeyStatus> {
        check_key(key)?;
        Store::status(self, key).await
    }

    async fn next_status(&self, key: &str, seen: &KeyStatus, until: Instant) -> Result<KeyStatus> {
        check_key(key)?;
        Store::next_status(self, key, seen, until).await
    }

    async fn list(&self, prefix: &str, from: Option<&ListCursor>, limit: usize) -> Result<Listing> {
        check_list(prefix, limit)?;
        Store::list(self, prefix, from, limit).await
    }

    async fn evict(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        Store::evict(self, key).await
    }

    async fn per_key_state(&self) -> Result<Option<PerKeyState>> {
        Store::per_key_state(self).await
    }

    fn diagnostics(&self) -> Vec<String> {
        Store::diagnostics(self)
    }

    fn lease_env(&self, lease: &Lease) -> Vec<(String, String)> {
        Store::lease_env(self, lease)
    }
}

/// The contract's checks around an acquire, as every [`Store`] gets them around
/// [`Store::acquire`]: the request before `attempt` is first polled, the grant after (a lease
/// already expired is released and refused, `Busy` after a wait becomes `WaitTimedOut`), the
/// span and the outcome's log line. For a store's own acquire methods beyond the contract's
/// (PostgreSQL's raw lock ids), so they keep the contract too; `request.key` names what is
/// locked in messages.
///
/// # Errors
/// Those of the checks, then `attempt`'s, as [`Store::acquire`] describes them.
///
/// # Cancel safety
/// As `attempt`'s.
pub async fn acquire_checked<S, F>(
    store: &S,
    request: AcquireRequest<'_>,
    attempt: F,
) -> Result<Lease>
where
    S: Store + ?Sized,
    F: std::future::Future<Output = Result<Lease>>,
{
    let span = acquire_span(Store::name(store), &request);
    acquire(store, request, attempt).instrument(span).await
}

/// The checks around `attempt`: the request first, the grant after.
async fn acquire<S, F>(store: &S, request: AcquireRequest<'_>, attempt: F) -> Result<Lease>
where
    S: Store + ?Sized,
    F: std::future::Future<Output = Result<Lease>>,
{
    let capabilities = Store::capabilities(store);
    check_key(request.key)?;
    Store::check(store, &request)?;
    check_ttl(request.ttl, &capabilities)?;
    check_mode(request.mode, &capabilities)?;
    if let Some(wait) = request.wait {
        check_wait(wait)?;
    }
    if let Some(label) = request.label {
        check_label("label", label)?;
    }
    let started = Instant::now();
    let result = match attempt.await {
        Ok(lease) => {
            lease.set_label(request.label);
            check_granted(store, lease).await
        }
        Err(Error::Busy { key }) if request.wait.is_some() => Err(Error::WaitTimedOut {
            key,
            waited: started.elapsed(),
        }),
        Err(error) => Err(error),
    };
    let waited_ms = request.wait.map(|_| started.elapsed().as_millis() as u64);
    match &result {
        Ok(lease) => tracing::debug!(token = lease.fencing_token(), waited_ms, "acquired"),
        Err(error) => tracing::debug!(%error, waited_ms, "not acquired"),
    }
    result
}

/// The span of an acquire, named as the four ways of asking for one were before they were one
/// request: `try_acquire`, `acquire`, `try_acquire_as`, `acquire_as`.
fn acquire_span(store: &'static str, request: &AcquireRequest<'_>) -> tracing::Span {
    let AcquireRequest {
        key,
        ttl,
        mode,
        wait,
        ..
    } = *request;
    match (wait, mode) {
        (None, Mode::Exclusive) => tracing::debug_span!("try_acquire", store, key, ?ttl),
        (Some(wait), Mode::Exclusive) => {
            tracing::debug_span!("acquire", store, key, ?ttl, ?wait)
        }
        (None, mode) => tracing::debug_span!("try_acquire_as", store, key, ?ttl, %mode),
        (Some(wait), mode) => tracing::debug_span!("acquire_as", store, key, ?ttl, ?wait, %mode),
    }
}
