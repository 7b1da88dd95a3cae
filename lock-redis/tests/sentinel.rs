//! The whole conformance suite on a real Redis Sentinel deployment (a master, two replicas,
//! three sentinels) started by test-servers, one per test binary, through `redis+sentinel://`;
//! and the URLs and deployments it must refuse in one clear line.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::{DynLockStore, Error, LockStore};
use fencelock_redis::{RedisConfig, RedisStore};
use test_servers::{closed_ports, RedisSentinel, SentinelOptions};

/// The binary's one deployment, started by the first case that needs it; its master and
/// sentinels have passwords, so every case also proves both are sent where they belong.
fn deployment() -> &'static RedisSentinel {
    static DEPLOYMENT: OnceLock<RedisSentinel> = OnceLock::new();
    DEPLOYMENT.get_or_init(|| {
        RedisSentinel::start(SentinelOptions {
            password: Some("data-secret".into()),
            sentinel_password: Some("sentinel-secret".into()),
            ..SentinelOptions::default()
        })
        .expect("a Sentinel deployment")
    })
}

async fn url() -> String {
    tokio::task::spawn_blocking(|| deployment().url())
        .await
        .expect("deployment start")
}

struct SentinelFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for SentinelFactory {
    async fn handle(&self) -> DynLockStore {
        let store = common::store(&self.url, "").await;
        assert_eq!(store.config().sentinel_master(), Some("fencelock"));
        Arc::new(store)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let ports = closed_ports(3);
        let url = format!(
            "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/fencelock?connect_timeout=1s&command_timeout=1s",
            ports[0], ports[1], ports[2]
        );
        Arc::new(
            RedisStore::connect_lazy(RedisConfig::from_url(&url).expect("config"))
                .expect("lazy handle"),
        )
    }
}

fencelock_conformance::conformance_tests!(async { Arc::new(SentinelFactory { url: url().await }) });

/// The one line a refused connect prints, as `lockctl` would.
async fn refusal(url: &str) -> Error {
    let config = RedisConfig::from_url(url).expect("config");
    match RedisStore::connect(config).await {
        Ok(_) => panic!("{url} connected"),
        Err(error) => error,
    }
}

#[test]
fn a_url_without_the_master_s_name_is_refused_naming_the_rule() {
    for url in [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://a:1,b:2/",
    ] {
        let error = RedisConfig::from_url(url).expect_err(url);
        assert!(error.to_string().contains("master's name"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_master_is_a_store_error_naming_it() {
    let url = url().await.replace("/fencelock?", "/no-such-master?");
    let error = refusal(&format!("{url}&connect_timeout=5s")).await;
    assert!(matches!(error, Error::Store { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("no master named \"no-such-master\""),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_are_unavailable_naming_each() {
    let ports = closed_ports(2);
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/fencelock?connect_timeout=1s",
        ports[0], ports[1]
    );
    let error = refusal(&url).await;
    assert!(error.is_retryable(), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("no sentinel answered"), "{text}");
    for port in ports {
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sentinel_password_is_refused_without_showing_it() {
    let url = url().await.replace(
        "sentinel_password=sentinel-secret",
        "sentinel_password=wrong-secret",
    );
    let error = refusal(&format!("{url}&connect_timeout=2s")).await;
    assert!(
        matches!(error, Error::Store { .. }),
        "not retryable: {error:?}"
    );
    let text = error.to_string();
    assert!(text.contains("every sentinel refused"), "{text}");
    assert!(!text.contains("wrong-secret"), "{text}");
}

/// A sentinel that names `port` as the master of every name: enough of the protocol for a
/// client's handshake and `SENTINEL GET-MASTER-ADDR-BY-NAME`.
fn lying_sentinel(port: u16) -> u16 {
    slow_lying_sentinel(port, Duration::ZERO)
}

/// [`lying_sentinel`], answering every `SENTINEL` command after its first `late` late.
fn slow_lying_sentinel(port: u16, late: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").port();
    let asked = Arc::new(AtomicBool::new(false));
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let asked = Arc::clone(&asked);
            thread::spawn(move || answer_as_sentinel(stream, port, &asked, late));
        }
    });
    address
}

fn answer_as_sentinel(stream: TcpStream, master: u16, asked: &AtomicBool, late: Duration) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        // One RESP array of bulk strings per command.
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            return;
        }
        let Ok(count) = header.trim().trim_start_matches('*').parse::<usize>() else {
            return;
        };
        let mut args = Vec::with_capacity(count);
        for _ in 0..count {
            let (mut length, mut value) = (String::new(), String::new());
            if reader.read_line(&mut length).is_err() || reader.read_line(&mut value).is_err() {
                return;
            }
            args.push(value.trim_end().to_ascii_uppercase());
        }
        let reply = match args.first().map(String::as_str) {
            Some("SENTINEL") => {
                if asked.swap(true, Ordering::SeqCst) {
                    thread::sleep(late);
                }
                let port = master.to_string();
                format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
            }
            _ => "+OK\r\n".to_owned(),
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// The replica the shared deployment's sentinels do not name as master.
async fn a_replica() -> u16 {
    tokio::task::spawn_blocking(|| {
        let deployment = deployment();
        let master = deployment.master().expect("master");
        deployment
            .data_ports()
            .into_iter()
            .find(|port| *port != master)
            .expect("a replica")
    })
    .await
    .expect("join")
}

/// Discovery asks again while the server named says it is a replica; the try the connect
/// timeout cuts short does not replace why the earlier ones were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cut_short_by_the_connect_timeout_keeps_the_earlier_refusal() {
    let replica = a_replica().await;
    // Every ask after the first outlasts the connect timeout.
    let sentinel = slow_lying_sentinel(replica, Duration::from_secs(5));
    let url =
        format!("redis+sentinel://:data-secret@127.0.0.1:{sentinel}/fencelock?connect_timeout=1s");
    let error = refusal(&url).await;
    let text = error.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{replica}")) && text.contains("ROLE slave"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_says_it_is_a_replica_is_refused() {
    let replica = a_replica().await;
    let sentinel = lying_sentinel(replica);
    let url =
        format!("redis+sentinel://:data-secret@127.0.0.1:{sentinel}/fencelock?connect_timeout=1s");
    let error = refusal(&url).await;
    assert!(error.is_retryable(), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{replica}")) && text.contains("ROLE slave"),
        "{text}"
    );
    assert!(!text.contains("data-secret"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_no_sentinel_is_named() {
    let master = tokio::task::spawn_blocking(|| deployment().master().expect("master"))
        .await
        .expect("join");
    let url = format!("redis+sentinel://:data-secret@127.0.0.1:{master}/fencelock?connect_timeout=2s&sentinel_password=data-secret");
    let error = refusal(&url).await;
    let text = error.to_string();
    assert!(text.contains("is not a sentinel"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handle_works_on_the_master_the_sentinels_name() {
    let url = url().await;
    let store = common::store(&url, "").await;
    let lease = store
        .try_acquire("where", Duration::from_secs(30))
        .await
        .expect("acquire");
    let master = tokio::task::spawn_blocking(|| deployment().master().expect("master"))
        .await
        .expect("join");
    let deployment = deployment();
    let on_master = deployment
        .query(master, &["EXISTS", "fencelock:{where}:lock"])
        .expect("EXISTS");
    assert_eq!(on_master.trim(), "1", "the lock is on the master");
    let released = store.release(&lease).await.expect("release");
    assert_eq!(released, fencelock_core::ReleaseOutcome::Released);
}
