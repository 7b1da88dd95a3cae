//! The contract's timing behaviour on the memory store, under tokio's paused clock: exact and
//! independent of the machine's speed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::raw::{self, AcquireRequest, LeaseExt};
use fencelock_core::{
    with_lock, DynLockStore, Error, ErrorKind, KeepAlive, KeyStatus, Lease, LockStore,
    LockStoreExt, MemoryStore, Mode, ReleaseOutcome, Result,
};
use tokio::time::{advance, sleep, Instant};

const TTL: Duration = Duration::from_secs(3);

/// Counts the extends that reach the memory store.
#[derive(Debug, Default)]
struct Counting {
    store: MemoryStore,
    extends: AtomicUsize,
}

#[async_trait]
impl raw::Wrapper for Counting {
    fn inner(&self) -> &dyn LockStore {
        &self.store
    }
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner().extend(lease).await
    }
}

#[tokio::test(start_paused = true)]
async fn keep_alive_extends_at_a_quarter_of_the_ttl() {
    let store = Arc::new(Counting::default());
    let lease = store.try_acquire("k", TTL).await.unwrap();
    let held = KeepAlive::start(store.clone(), lease);
    sleep(TTL * 10).await;
    assert!(!held.is_lost(), "{:?}", held.lost_reason());
    let extends = store.extends.load(Ordering::SeqCst);
    assert!((39..=41).contains(&extends), "{extends} extends in 10 TTLs");
    assert!(matches!(
        store.store.status("k").await.unwrap(),
        KeyStatus::Held { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn lost_fires_at_the_local_deadline_before_the_store_expires_the_lease() {
    let store = Arc::new(MemoryStore::new());
    let granted_at = Instant::now();
    let lease = store.try_acquire("k", TTL).await.unwrap();
    let held = KeepAlive::start(store.clone(), lease.clone());
    // The holder is cut off: every extend fails with a retryable error.
    store.set_reachable(false);
    held.lost().await;
    let lost_at = Instant::now();
    assert_eq!(lost_at, lease.valid_until());
    assert!(
        lost_at < granted_at + TTL,
        "lost fired after the store's expiry"
    );
    store.set_reachable(true);
    assert!(
        matches!(store.status("k").await.unwrap(), KeyStatus::Held { .. }),
        "the store had already expired the lease when the holder learnt of the loss"
    );
}

#[tokio::test(start_paused = true)]
async fn lost_fires_on_the_first_extend_after_the_store_forgets() {
    let store = Arc::new(MemoryStore::new());
    let lease = store.try_acquire("k", TTL).await.unwrap();
    let held = KeepAlive::start(store.clone(), lease);
    sleep(TTL / 2).await;
    store.evict("k").await.unwrap();
    let forgotten_at = Instant::now();
    held.lost().await;
    assert!(
        forgotten_at.elapsed() <= TTL / 3,
        "{:?}",
        forgotten_at.elapsed()
    );
    assert!(held.lost_error().unwrap().to_string().contains("lost"));
}

#[tokio::test(start_paused = true)]
async fn with_lock_cancels_its_body_when_the_lease_is_lost() {
    let store = Arc::new(MemoryStore::new());
    let result = with_lock(store.lock("k").ttl(TTL), |_lease| async {
        store.evict("k").await.unwrap();
        sleep(Duration::from_secs(3600)).await;
        Ok::<_, Error>("finished")
    })
    .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_acquire_gives_up_exactly_at_its_bound() {
    let store = MemoryStore::new();
    let _held = store
        .try_acquire("k", Duration::from_secs(60))
        .await
        .unwrap();
    let started = Instant::now();
    let result = store.acquire("k", TTL, Duration::from_secs(5)).await;
    match result {
        Err(Error::WaitTimedOut { waited, .. }) => {
            assert_eq!(waited, Duration::from_secs(5));
            assert_eq!(started.elapsed(), Duration::from_secs(5));
        }
        other => panic!("expected WaitTimedOut, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_key_at_the_instant_the_holder_expires() {
    let store = MemoryStore::new();
    let first = store.try_acquire("k", TTL).await.unwrap();
    let started = Instant::now();
    let second = store.acquire("k", TTL, TTL * 2).await.unwrap();
    assert_eq!(started.elapsed(), TTL);
    assert!(second.fencing_token() > first.fencing_token());
    assert_eq!(store.release(&first).await.unwrap(), ReleaseOutcome::Lost);
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_cannot_be_extended_back_to_life() {
    let store = MemoryStore::new();
    let lease = store.try_acquire("k", TTL).await.unwrap();
    advance(TTL).await;
    assert!(matches!(
        store.extend(&lease).await,
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(store.status("k").await.unwrap(), KeyStatus::Free);
}

/// Hands out leases whose validity is already mostly spent, as a slow acquire does (Redlock with
/// a large drift factor, a slow network, an etcd waiter that came back late); and answers
/// release as told.
#[derive(Debug, Default)]
struct Scripted {
    store: MemoryStore,
    /// The part of the TTL spent before the lease is handed out, in percent.
    spent_percent: u32,
    /// What release answers instead of asking the store.
    release: Option<fn() -> Result<ReleaseOutcome>>,
    /// What extend answers instead of asking the store.
    extend: Option<fn() -> Result<()>>,
}

#[async_trait]
impl raw::Wrapper for Scripted {
    fn inner(&self) -> &dyn LockStore {
        &self.store
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Lease> {
        if request.mode != Mode::Exclusive {
            return self.inner().acquire_request(*request).await;
        }
        let lease = self.inner().try_acquire(request.key, request.ttl).await?;
        let spent = request.ttl * self.spent_percent / 100;
        Ok(Lease::new(
            lease.key(),
            lease.owner(),
            lease.fencing_token(),
            lease.ttl(),
            Instant::now() - spent,
        ))
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        match self.release {
            Some(answer) => answer(),
            None => self.inner().release(lease).await,
        }
    }
    async fn extend(&self, lease: &Lease) -> Result<()> {
        match self.extend {
            Some(answer) => answer(),
            None => self.inner().extend(lease).await,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn keep_alive_keeps_a_lease_handed_out_with_little_validity() {
    // 75% of the TTL spent at hand-out: about a quarter is left, less than the first period of
    // a keep-alive that plans from the TTL alone.
    let store = Arc::new(Scripted {
        spent_percent: 75,
        ..Scripted::default()
    });
    let lease = store.try_acquire("k", TTL).await.unwrap();
    assert!(lease.remaining() < TTL / 3, "{:?}", lease.remaining());
    let held = KeepAlive::start(store.clone(), lease);
    sleep(TTL * 5).await;
    assert!(!held.is_lost(), "{:?}", held.lost_reason());
    assert!(held.lease().remaining() > TTL / 2);
}

#[tokio::test(start_paused = true)]
async fn lost_fires_at_once_when_the_store_revokes_the_lease() {
    let store = Arc::new(MemoryStore::new());
    let lease = store.try_acquire("k", TTL).await.unwrap();
    let held = KeepAlive::start(store.clone(), lease.clone());
    sleep(TTL / 10).await;
    let revoked_at = Instant::now();
    lease.revocation().revoke("the server ended its session");
    held.lost().await;
    assert_eq!(revoked_at.elapsed(), Duration::ZERO);
    let reason = held.lost_reason().unwrap();
    assert!(reason.contains("the server ended its session"), "{reason}");
}

#[tokio::test(start_paused = true)]
async fn with_lock_returns_the_output_when_the_release_cannot_be_done() {
    let store = Arc::new(Scripted {
        release: Some(|| {
            Err(Error::Unavailable {
                message: "the store is unreachable".into(),
                source: None,
            })
        }),
        ..Scripted::default()
    });
    let result = with_lock(store.lock("k").ttl(TTL), |_lease| async {
        Ok::<_, Error>("finished")
    })
    .await;
    assert_eq!(result.unwrap(), "finished");
}

#[tokio::test(start_paused = true)]
async fn with_lock_keeps_the_output_in_a_final_error_when_the_release_finds_the_lease_lost() {
    let store = Arc::new(Scripted {
        release: Some(|| Ok(ReleaseOutcome::Lost)),
        ..Scripted::default()
    });
    let result = with_lock(store.lock("k").ttl(TTL), |_lease| async {
        Ok::<_, Error>(String::from("the body's result"))
    })
    .await;
    let error = result.unwrap_err();
    assert!(matches!(error, Error::LostAfterBody { .. }), "{error:?}");
    assert!(!error.is_retryable(), "a retry would run the body twice");
    assert!(error.is_lease_lost());
    assert_eq!(error.take_output::<u32>(), None, "wrong type");
    let printed = format!("{error} {error:?}");
    assert!(!printed.contains("body's result"), "{printed}");
    assert_eq!(
        error.take_output::<String>().as_deref(),
        Some("the body's result")
    );
    assert_eq!(error.take_output::<String>(), None, "taken once");
}

/// Every message in `error`'s chain, outermost first.
fn chain(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut messages = vec![error.to_string()];
    let mut next = error.source();
    while let Some(cause) = next {
        messages.push(cause.to_string());
        next = cause.source();
    }
    messages
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_says_lost_once_with_the_stores_own_reason() {
    let store: DynLockStore = Arc::new(MemoryStore::new());
    let guard = store.lock("k").ttl(TTL).await.unwrap();
    store.evict("k").await.unwrap();
    let error = guard.run(std::future::pending::<()>()).await.unwrap_err();
    let messages = chain(&error).join(": ");
    assert_eq!(
        messages.matches("is lost").count(),
        1,
        "said more than once: {messages}"
    );
    assert!(
        messages.contains("expired or held by another owner"),
        "the store's reason is kept: {messages}"
    );
    assert_eq!(error.kind(), ErrorKind::LeaseLost);
}

#[tokio::test(start_paused = true)]
async fn an_extend_the_store_refuses_is_kept_typed_as_the_source() {
    let store = Arc::new(Scripted {
        extend: Some(|| {
            Err(Error::Store {
                message: "permission denied for the lock table".into(),
                source: None,
            })
        }),
        ..Scripted::default()
    });
    let lease = store.try_acquire("k", TTL).await.unwrap();
    let held = KeepAlive::start(store.clone(), lease);
    held.lost().await;
    let error = held.lost_error().expect("lost, so an error");
    assert_eq!(error.kind(), ErrorKind::LeaseLost);
    let source = std::error::Error::source(&error).expect("the store's error is the source");
    let typed = source
        .downcast_ref::<Error>()
        .expect("the source is fencelock's own Error");
    assert_eq!(typed.kind(), ErrorKind::Store);
    let messages = chain(&error);
    assert_eq!(
        messages.join(": ").matches("permission denied").count(),
        1,
        "{messages:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_lock_takes_what_connect_returns_and_a_mode() {
    let store: DynLockStore = Arc::new(MemoryStore::new());
    let request = store.lock("k").ttl(TTL).mode(Mode::Shared);
    let inner = store.clone();
    let (reader, writer) = with_lock(request, |lease| async move {
        assert_eq!(lease.mode(), Mode::Shared);
        let reader = inner.try_acquire_as("k", TTL, Mode::Shared).await;
        let writer = inner.try_acquire("k", TTL).await;
        Ok::<_, Error>((reader.is_ok(), writer.is_ok()))
    })
    .await
    .unwrap();
    assert!(reader, "a second reader shares the key");
    assert!(!writer, "a writer is kept out while the body reads");
}

#[tokio::test(start_paused = true)]
async fn with_lock_releases_when_the_body_fails_and_returns_its_error() {
    #[derive(Debug, PartialEq)]
    enum JobError {
        Lock(ErrorKind),
        Input(&'static str),
    }
    impl From<Error> for JobError {
        fn from(error: Error) -> Self {
            JobError::Lock(error.kind())
        }
    }
    let store = Arc::new(MemoryStore::new());
    let result: std::result::Result<(), JobError> =
        with_lock(store.lock("k").ttl(TTL), |_lease| async {
            Err(JobError::Input("half-way"))
        })
        .await;
    assert_eq!(result, Err(JobError::Input("half-way")));
    assert_eq!(store.status("k").await.unwrap(), KeyStatus::Free);
    store.try_acquire("k", TTL).await.expect("released at once");
    let busy: std::result::Result<(), JobError> =
        with_lock(store.lock("k"), |_lease| async { Ok(()) }).await;
    assert_eq!(busy, Err(JobError::Lock(ErrorKind::Contended)));
}

/// `with_lock`'s future can be spawned: it is `Send` for what `connect` returns and a `Send`
/// body and error.
#[test]
fn with_lock_on_a_dyn_store_is_send() {
    fn assert_send<T: Send>(_: T) {}
    let store: DynLockStore = Arc::new(MemoryStore::new());
    assert_send(with_lock(store.lock("k"), |lease| async move {
        Ok::<_, Error>(lease.fencing_token())
    }));
    assert_send(with_lock(store.lock("k"), |_lease| async {
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    }));
}

/// A task handed the guard's lost token cannot stop the keep-alive by cancelling it.
#[tokio::test(start_paused = true)]
async fn cancelling_a_handed_out_lost_token_stops_nothing() {
    let store: DynLockStore = Arc::new(MemoryStore::new());
    let guard = store.lock("k").ttl(TTL).await.unwrap();
    guard.lost_token().cancel();
    sleep(TTL * 3).await;
    assert!(!guard.is_lost(), "the keep-alive went on");
    assert!(guard.lease().remaining() > Duration::ZERO);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Records whether an extend was dropped before its answer: a SQL store's session is unfit
/// for the release that follows one (its connection may be mid-packet).
#[derive(Debug, Default)]
struct SlowExtends {
    store: MemoryStore,
    started: AtomicUsize,
    finished: AtomicUsize,
}

#[async_trait]
impl raw::Wrapper for SlowExtends {
    fn inner(&self) -> &dyn LockStore {
        &self.store
    }
    async fn extend(&self, lease: &Lease) -> Result<()> {
        self.started.fetch_add(1, Ordering::SeqCst);
        sleep(Duration::from_millis(200)).await;
        let answer = self.inner().extend(lease).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        answer
    }
}

/// Waits until an extend is in flight (the first, at a quarter of the TTL).
async fn extend_in_flight(store: &SlowExtends) {
    while store.started.load(Ordering::SeqCst) == 0 {
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.finished.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn stopping_a_keep_alive_lets_its_extend_in_flight_finish() {
    let store = Arc::new(SlowExtends::default());
    let lease = store.try_acquire("k", TTL).await.unwrap();
    let held = KeepAlive::start(store.clone(), lease);
    extend_in_flight(&store).await;
    let lease = held.stop().await;
    assert_eq!(
        store.finished.load(Ordering::SeqCst),
        1,
        "the extend was abandoned"
    );
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        store.started.load(Ordering::SeqCst),
        1,
        "it went on extending"
    );
}

#[tokio::test(start_paused = true)]
async fn a_guard_and_with_lock_release_after_their_extend_in_flight() {
    let store = Arc::new(SlowExtends::default());
    let guard = store.lock("k").ttl(TTL).await.unwrap();
    extend_in_flight(&store).await;
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        store.finished.load(Ordering::SeqCst),
        1,
        "the guard abandoned its extend"
    );

    let store = Arc::new(SlowExtends::default());
    let probe = store.clone();
    let result = with_lock(store.lock("k").ttl(TTL), |_lease| async move {
        extend_in_flight(&probe).await;
        Ok::<_, Error>(())
    })
    .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        store.finished.load(Ordering::SeqCst),
        1,
        "with_lock abandoned its extend"
    );
}
