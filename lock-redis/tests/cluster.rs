//! The whole conformance suite on a real Redis Cluster (3 masters, each with a replica) started
//! by test-servers, one per test binary, through `redis+cluster://`; and acquires whose reply
//! is lost, which the Cluster client sends again (`# Redis Cluster`, *Resent requests*).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::ReleaseOutcome;
use fencelock_core::{DynLockStore, Error, KeyStatus, LockStore, Mode};
use fencelock_redis::{RedisConfig, RedisStore};
use test_servers::{closed_ports, RedisCluster, RedisServer};

/// The binary's one cluster, started by the first case that needs it.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisServer::start_cluster(3, 1).expect("a Redis Cluster"))
}

struct ClusterFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for ClusterFactory {
    async fn handle(&self) -> DynLockStore {
        let store = common::store(&self.url, "").await;
        assert!(store.config().is_cluster());
        Arc::new(store)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let ports = closed_ports(3);
        let url = format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?connect_timeout=1s&command_timeout=1s",
            ports[0], ports[1], ports[2]
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

fencelock_conformance::conformance_tests!(async {
    let url = tokio::task::spawn_blocking(|| cluster().url())
        .await
        .expect("cluster start");
    Arc::new(ClusterFactory { url })
});

// ---- resent requests ------------------------------------------------------------------------

const TTL: Duration = Duration::from_secs(30);

/// A relay to one master that loses a reply on demand, as a network failing after a request
/// went out does: once [`lose_grant`](Self::lose_grant) named a key, the next script whose
/// request names that key's fence (an acquire) reaches the master and runs, and the grant it
/// answers is dropped and both connections closed; the Cluster client then reconnects and
/// sends the request again. Every other byte passes, except that replies to `CLUSTER SLOTS`
/// name the relay in the master's place and list no replicas, so a client seeded with the
/// relay alone sends that master's slots through it and never falls back to a replica (the
/// cluster itself is not changed: other handles go direct).
struct LosesReplies {
    port: u16,
    state: Arc<Mutex<Armed>>,
}

#[derive(Default)]
struct Armed {
    /// The fence names (`{key}:fence`) whose next grant is to be lost.
    armed: Vec<String>,
    /// Those whose grant was lost.
    lost: Vec<String>,
}

impl LosesReplies {
    fn start(master: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let state = Arc::new(Mutex::new(Armed::default()));
        let shared = state.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let state = shared.clone();
                thread::spawn(move || relay(client, master, port, &state));
            }
        });
        LosesReplies { port, state }
    }

    /// `redis+cluster://` seeded with the relay alone, with `options`; the eviction check is
    /// off (it routes by the addresses a random node lists, which name the master, not us).
    fn url(&self, options: &str) -> String {
        format!(
            "redis+cluster://127.0.0.1:{}?allow_eviction=true&connect_timeout=30s&{options}",
            self.port
        )
    }

    fn lose_grant(&self, key: &str) {
        self.armed().armed.push(fence(key));
    }

    fn lost(&self, key: &str) -> bool {
        self.armed().lost.contains(&fence(key))
    }

    fn armed(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn fence(key: &str) -> String {
    format!("{{{key}}}:fence")
}

/// One client connection through the relay: requests go up as they are; a reply goes down
/// unless it is the grant of an armed acquire (then both sides are closed) or a `CLUSTER SLOTS`
/// reply (rewritten by [`through_relay`]).
fn relay(client: TcpStream, master: u16, port: u16, state: &Arc<Mutex<Armed>>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", master)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut up_from), Ok(mut up_to)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    // What the next reply answers: an armed acquire (its fence name) or `CLUSTER SLOTS`.
    let pending: Arc<Mutex<Option<Pending>>> = Arc::default();
    let (up_state, up_pending) = (state.clone(), pending.clone());
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = up_from.read(&mut buf) {
            let request = &buf[..n];
            let next = if contains(request, b"SLOTS") {
                Some(Pending::Slots)
            } else if contains(request, b"EVAL") {
                let state = up_state.lock().unwrap_or_else(PoisonError::into_inner);
                let armed = state.armed.iter().find(|f| contains(request, f.as_bytes()));
                armed.cloned().map(Pending::Acquire)
            } else {
                None
            };
            if next.is_some() {
                *up_pending.lock().unwrap_or_else(PoisonError::into_inner) = next;
            }
            if up_to.write_all(request).is_err() {
                break;
            }
        }
        let _ = up_from.shutdown(Shutdown::Both);
        let _ = up_to.shutdown(Shutdown::Both);
    });
    let (mut down_from, mut down_to) = (server, client);
    let mut buf = vec![0u8; 64 * 1024];
    // A `CLUSTER SLOTS` reply read so far, until it parses whole.
    let mut slots = Vec::new();
    while let Ok(n @ 1..) = down_from.read(&mut buf) {
        let reply = &buf[..n];
        let answers = pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let sent = match answers {
            Some(Pending::Acquire(armed)) if is_grant(reply) => {
                let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                state.armed.retain(|f| *f != armed);
                state.lost.push(armed);
                break;
            }
            Some(Pending::Slots) => {
                slots.extend_from_slice(reply);
                match Resp::parse(&slots) {
                    Some((whole, used)) if used == slots.len() => {
                        slots.clear();
                        down_to.write_all(&through_relay(whole, master, port).to_bytes())
                    }
                    _ => {
                        *pending.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some(Pending::Slots);
                        Ok(())
                    }
                }
            }
            _ => down_to.write_all(reply),
        };
        if sent.is_err() {
            break;
        }
    }
    let _ = down_from.shutdown(Shutdown::Both);
    let _ = down_to.shutdown(Shutdown::Both);
}

enum Pending {
    Acquire(String),
    Slots,
}

/// The RESP2 values a `CLUSTER SLOTS` reply is made of.
#[derive(Debug)]
enum Resp {
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Resp>),
}

impl Resp {
    /// The value at the start of `bytes` and its length, `None` until it is all there.
    fn parse(bytes: &[u8]) -> Option<(Resp, usize)> {
        let line_end = bytes.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&bytes[1..line_end]).ok()?;
        let rest = line_end + 2;
        match bytes.first()? {
            b':' => Some((Resp::Int(line.parse().ok()?), rest)),
            b'$' => {
                let len: usize = line.parse().ok()?;
                let body = bytes.get(rest..rest + len)?.to_vec();
                bytes.get(rest + len..rest + len + 2)?;
                Some((Resp::Bulk(body), rest + len + 2))
            }
            b'*' => {
                let mut used = rest;
                let mut items = Vec::new();
                for _ in 0..line.parse::<usize>().ok()? {
                    let (item, len) = Resp::parse(&bytes[used..])?;
                    items.push(item);
                    used += len;
                }
                Some((Resp::Array(items), used))
            }
            _ => None,
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        match self {
            Resp::Int(n) => format!(":{n}\r\n").into_bytes(),
            Resp::Bulk(body) => {
                let mut out = format!("${}\r\n", body.len()).into_bytes();
                out.extend_from_slice(body);
                out.extend_from_slice(b"\r\n");
                out
            }
            Resp::Array(items) => {
                let mut out = format!("*{}\r\n", items.len()).into_bytes();
                for item in items {
                    out.extend(item.to_bytes());
                }
                out
            }
        }
    }
}

/// A `CLUSTER SLOTS` reply with each range's replicas left out and the master on `master`
/// named by the relay's `port`.
fn through_relay(slots: Resp, master: u16, port: u16) -> Resp {
    let Resp::Array(ranges) = slots else {
        return slots;
    };
    let ranges = ranges
        .into_iter()
        .map(|range| match range {
            Resp::Array(mut fields) if fields.len() >= 3 => {
                fields.truncate(3);
                if let Resp::Array(node) = &mut fields[2] {
                    if let Some(Resp::Int(p)) = node.get_mut(1) {
                        if *p == i64::from(master) {
                            *p = i64::from(port);
                        }
                    }
                }
                Resp::Array(fields)
            }
            other => other,
        })
        .collect();
    Resp::Array(ranges)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether an acquire script's reply is a grant: the exclusive script's token (an integer or
/// its digits), a waiter's `{1, token}`, a shared or permit `{1, token, slot}`.
fn is_grant(reply: &[u8]) -> bool {
    matches!(reply.first(), Some(b':' | b'$'))
        || reply.starts_with(b"*2\r\n:1\r\n")
        || reply.starts_with(b"*3\r\n:1\r\n")
}

/// The cluster's first master, its replica (`ports()[3]`: test-servers lists the replicas of
/// master `i` after the masters, in order), and a key of each `stem` that master serves.
fn first_master(stems: &[&str]) -> (u16, u16, Vec<String>) {
    let cluster = cluster();
    let (master, replica) = (cluster.ports()[0], cluster.ports()[3]);
    let keys = stems
        .iter()
        .map(|stem| {
            (0..200)
                .map(|i| format!("resent-{stem}-{i}"))
                .find(|key| {
                    let slot = cluster.keyslot(&fence(key)).expect("slot");
                    cluster.master_of_slot(slot).expect("master") == master
                })
                .unwrap_or_else(|| panic!("no key of 200 lives on the master on {master}"))
        })
        .collect();
    (master, replica, keys)
}

async fn on_first_master(stems: &'static [&'static str]) -> (u16, u16, Vec<String>) {
    tokio::task::spawn_blocking(|| first_master(stems))
        .await
        .expect("cluster start")
}

/// `GET name` on the master, `None` for no value.
fn get(master: u16, name: &str) -> Option<String> {
    let value = cluster().query(master, &["GET", name]).expect("GET");
    Some(value.trim().to_owned()).filter(|v| !v.is_empty())
}

fn zcard(master: u16, name: &str) -> u64 {
    let count = cluster().query(master, &["ZCARD", name]).expect("ZCARD");
    count.trim().parse().expect("a count")
}

/// An exclusive acquire whose grant's reply is lost is sent again by the Cluster client; the
/// resend finds the lock its first run set and answers a lease with the token the fence holds,
/// which releases the key. Before, the resend answered `Busy`, and the key stayed locked by
/// nobody's lease until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_an_exclusive_acquire_is_resent_and_answered_with_the_lease() {
    let (master, _, keys) = on_first_master(&["exclusive"]).await;
    let key = &keys[0];
    let relay = LosesReplies::start(master);
    let store = common::store(&relay.url("command_timeout=3s"), "").await;
    relay.lose_grant(key);
    let lease = store.try_acquire(key, TTL).await;
    assert!(relay.lost(key), "the grant's reply was not lost: {lease:?}");
    let lease = lease.expect("the resend answers a lease");
    let stored = get(master, &format!("fencelock:{}", fence(key)));
    assert_eq!(stored, Some(lease.fencing_token().to_string()));
    let owner = get(master, &format!("fencelock:{{{key}}}:lock"));
    assert_eq!(owner, Some(lease.owner().to_string()));
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = store.try_acquire(key, TTL).await.expect("the key is free");
    let _ = store.release(&next).await;
}

/// The same for a waiter's attempt (the script that marks waiting writers): the resend answers
/// the lease at once. Before, it answered "held" (by its own first run) and the waiter waited
/// out that lock's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_a_waiting_acquire_is_resent_and_answered_with_the_lease() {
    let (master, _, keys) = on_first_master(&["waiting"]).await;
    let key = keys[0].clone();
    let relay = LosesReplies::start(master);
    let store = common::store(&relay.url("command_timeout=3s"), "").await;
    let direct = common::store(&cluster().url(), "command_timeout=3s").await;
    let holder = direct
        .try_acquire(&key, TTL)
        .await
        .expect("the first holder");
    let wait = Duration::from_secs(20);
    let waiter = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { store.acquire(&key, TTL, wait).await }
    });
    // Its second attempt on marks it as a waiting writer: from then on it runs the waiter's script.
    let writers = format!("fencelock:{{{key}}}:writers");
    let started = Instant::now();
    while zcard(master, &writers) == 0 {
        assert!(started.elapsed() < wait, "the waiter never marked itself");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.lose_grant(&key);
    let released = direct
        .release(&holder)
        .await
        .expect("release the first holder");
    assert_eq!(released, ReleaseOutcome::Released);
    let lease = waiter.await.expect("join");
    assert!(
        relay.lost(&key),
        "the grant's reply was not lost: {lease:?}"
    );
    let lease = lease.expect("the resend answers a lease");
    assert!(lease.fencing_token() > holder.fencing_token());
    assert_eq!(
        zcard(master, &writers),
        0,
        "a granted waiter leaves no mark"
    );
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A shared acquire whose reply is lost: the resend answers the same reader's lease and adds no
/// second reader, so once it is released a writer gets the key. Before, the resend added a
/// reader nobody held, which kept writers out until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_a_shared_acquire_is_resent_and_adds_one_reader() {
    let (master, _, keys) = on_first_master(&["shared"]).await;
    let key = &keys[0];
    let relay = LosesReplies::start(master);
    let store = common::store(&relay.url("command_timeout=3s"), "").await;
    relay.lose_grant(key);
    let lease = store.try_acquire_as(key, TTL, Mode::Shared).await;
    assert!(relay.lost(key), "the grant's reply was not lost: {lease:?}");
    let lease = lease.expect("the resend answers a lease");
    let holders = format!("fencelock:{{{key}}}:holders");
    assert_eq!(zcard(master, &holders), 1, "one reader, not two");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(store.status(key).await.expect("status"), KeyStatus::Free);
    let writer = store
        .try_acquire(key, TTL)
        .await
        .expect("a writer gets the key");
    let _ = store.release(&writer).await;
}

/// With `min_replicas`, the Cluster client resends the script and its `WAIT` on a fresh
/// connection, and `WAIT` counts only the writes of the connection it is sent on: one that has
/// written nothing is answered at once, by every replica, whatever they have received. So the
/// resend must write. With the master's replica holding the stream back, neither an exclusive
/// nor a permit resend is acknowledged, and both are refused (`Unavailable`) and released.
/// Before, the exclusive resend answered `Busy`, and the permit resend, which wrote nothing,
/// was acknowledged at once and handed out a lease no replica had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_a_resent_acquire_is_acknowledged_only_by_replicas_that_have_it() {
    let (master, replica, keys) = on_first_master(&["acked", "acked-permit"]).await;
    let url =
        |relay: &LosesReplies| relay.url("min_replicas=1&replica_timeout=300ms&command_timeout=3s");
    // One relay and handle per lost reply: a handle whose resend was redirected (`MOVED`)
    // may read a slot map that names the master itself.
    let (relay, permit_relay) = (LosesReplies::start(master), LosesReplies::start(master));
    let store = common::store(&url(&relay), "").await;
    let permit_store = common::store(&url(&permit_relay), "").await;
    // The replica acknowledges grants once its first sync is done (this case may run just
    // after the cluster started).
    let started = Instant::now();
    loop {
        match store.try_acquire(&keys[0], TTL).await {
            Ok(acked) => break drop(store.release(&acked).await),
            Err(Error::Unavailable { .. }) if started.elapsed() < Duration::from_secs(30) => {}
            Err(error) => panic!("no acknowledged grant: {error:?}"),
        }
    }

    // The replica applies no write until unpaused, so it acknowledges none (it answers reads,
    // so other handles of this cluster go on; the pause ends by itself after 10 s).
    let pause = cluster().query(replica, &["CLIENT", "PAUSE", "10000", "WRITE"]);
    assert_eq!(pause.expect("CLIENT PAUSE").trim(), "OK");
    relay.lose_grant(&keys[0]);
    let exclusive = store.try_acquire(&keys[0], TTL).await;
    permit_relay.lose_grant(&keys[1]);
    let permit = permit_store
        .try_acquire_as(&keys[1], TTL, Mode::permits(2))
        .await;
    let unpause = cluster().query(replica, &["CLIENT", "UNPAUSE"]);
    assert_eq!(unpause.expect("CLIENT UNPAUSE").trim(), "OK");

    for (what, relay, store, key, outcome) in [
        ("exclusive", &relay, &store, &keys[0], &exclusive),
        ("permit", &permit_relay, &permit_store, &keys[1], &permit),
    ] {
        assert!(
            relay.lost(key),
            "{what}: the grant's reply was not lost: {outcome:?}"
        );
        assert!(
            matches!(outcome, Err(Error::Unavailable { message, .. }) if message.contains("min_replicas")),
            "{what}: a resend no replica acknowledged must be refused: {outcome:?}"
        );
        // The refused grant was released.
        let status = store.status(key).await.expect("status");
        assert_eq!(status, KeyStatus::Free, "{what}");
    }
}
