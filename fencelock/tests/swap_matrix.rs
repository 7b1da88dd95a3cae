//! Swapping stores keeps a fenced resource working (docs/swaps.md): for every
//! ordered pair (A, B) of the nine default-layout stores, a file fenced under A accepts the
//! first write of B's first lease once the pair's delay D has passed since A's last grant, and
//! A's again after the way back, with tokens strictly increasing all along.
//!
//! D comes from the stores' constants, never from this machine: `D(A → B) = skew +
//! runahead(A) + G(B)`, where on one host the skew is 0 ([`delay`]). A second test runs a swap
//! to a Redis master whose clock is 2 s behind (test-servers' clock shim): accepted after
//! `skew + G`; before that the resource refuses B's lower token, which is safe.
//!
//! `cargo nextest run -p fencelock --all-features -E 'binary(swap_matrix)'`
#![cfg(all(
    feature = "redis",
    feature = "etcd",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "zookeeper"
))]

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock::{DynLockStore, Error, ErrorKind, ReleaseOutcome};
use fencelock_fence::FencedFile;
use test_servers::{
    EtcdServer, MariadbServer, PostgresServer, RedisCluster, RedisSentinel, RedisServer,
    ZookeeperEnsemble,
};
use tokio::time::{sleep_until, Instant};

/// Long enough that no lease of these tests expires while it is used.
const TTL: Duration = Duration::from_secs(10);

/// The granule of Redis's mint: `TIME` in whole µs (lock-redis/src/script.rs, `mint_lua!`).
const REDIS_GRANULE: Duration = Duration::from_micros(1);

/// Redlock rounds each node's clock down to 2^18 µs (`TOKEN_GRANULE`,
/// lock-redis/src/redlock/config.rs).
const REDLOCK_GRANULE: Duration = Duration::from_micros(1 << 18);

/// MariaDB's `NOW(6)`, in whole µs (`TOKEN_GRANULE`, lock-mysql/src/config.rs).
const MYSQL_GRANULE: Duration = Duration::from_micros(1);

/// etcd's token, `offset + create revision`, is at least the client's clock minus this: the
/// offset is raised when it falls further behind (`GRANULE`, lock-etcd/src/offset.rs).
const ETCD_GRANULE: Duration = Duration::from_millis(100);

/// How far etcd's tokens can lead the clock of the client that raised the offset: by the
/// revisions written since the store revision the raise counted from, at most W × (A + T),
/// W the cluster's revision rate, A the hint's age bound (1 s) and T the command timeout
/// (5 s) (lock-etcd's README, "Tokens across a swap"). This test's etcd serves this test
/// alone, a few hundred writes in all, far below the 50,000 revisions (50 ms) allowed here.
const ETCD_RUNAHEAD: Duration = Duration::from_millis(50);

/// How far ZooKeeper's tokens, `offset + czxid`, can lead the clock of the client that raised
/// the offset: by the transactions the ensemble committed since the zxid the raise counted
/// from, at most W × (A + T) as for etcd (lock-zookeeper's README, "Tokens across a swap"),
/// plus 2^32 µs within 72 minutes of a leader election. This test's standalone server serves
/// this test alone (no election, a few hundred transactions), far below the 50,000 (50 ms)
/// allowed here. Its granule is `fencelock_zookeeper::TOKEN_GRANULE` (100 ms).
const ZOOKEEPER_RUNAHEAD: Duration = Duration::from_millis(50);

/// A strict inequality in µs: one more.
const MICROSECOND: Duration = Duration::from_micros(1);

/// The nine stores in their default layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Redis,
    Redlock,
    Cluster,
    Sentinel,
    Etcd,
    Postgres,
    Mysql,
    Sqlite,
    Zookeeper,
}

impl Kind {
    /// How far below the clock a fresh mint may be: the clock is floored to this.
    fn granule(self) -> Duration {
        match self {
            Kind::Redis | Kind::Cluster | Kind::Sentinel => REDIS_GRANULE,
            Kind::Redlock => REDLOCK_GRANULE,
            Kind::Etcd => ETCD_GRANULE,
            Kind::Postgres => fencelock::fencelock_postgres::TOKEN_GRANULE,
            Kind::Mysql => MYSQL_GRANULE,
            Kind::Sqlite => fencelock::fencelock_sqlite::TOKEN_GRANULE,
            Kind::Zookeeper => fencelock::fencelock_zookeeper::TOKEN_GRANULE,
        }
    }

    /// How far this store's tokens can run ahead of its clock when every clock is this host's
    /// and none steps back: grants of one key within one µs (`previous + 1`) would, but each key
    /// here is granted once per store between waits of at least D. Redlock's raises lead by the
    /// skew between its nodes, 0 on one host; etcd's offset by the revisions written since its
    /// raise counted ([`ETCD_RUNAHEAD`]), ZooKeeper's by the transactions
    /// ([`ZOOKEEPER_RUNAHEAD`]).
    fn runahead_on_one_host(self) -> Duration {
        match self {
            Kind::Etcd => ETCD_RUNAHEAD,
            Kind::Zookeeper => ZOOKEEPER_RUNAHEAD,
            _ => Duration::ZERO,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Redis => "redis",
            Kind::Redlock => "redlock",
            Kind::Cluster => "cluster",
            Kind::Sentinel => "sentinel",
            Kind::Etcd => "etcd",
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
            Kind::Sqlite => "sqlite",
            Kind::Zookeeper => "zookeeper",
        })
    }
}

/// D(A → B): B's first grant at least this long after A's last one mints a greater token.
/// `lag` is how far B's clock runs behind A's (0 on one host); a strict inequality, so one µs
/// more.
fn delay(from: Kind, to: Kind, lag: Duration) -> Duration {
    lag + from.runahead_on_one_host() + to.granule() + MICROSECOND
}

/// A scratch directory under the system's temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("fencelock-{name}-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every server of the matrix, kept alive as long as the stores are used.
struct Servers {
    _redis: RedisServer,
    _redlock: Vec<RedisServer>,
    _cluster: RedisCluster,
    _sentinel: RedisSentinel,
    _etcd: EtcdServer,
    _postgres: PostgresServer,
    _mariadb: MariadbServer,
    _zookeeper: ZookeeperEnsemble,
    urls: Vec<(Kind, String)>,
}

/// Starts the eight servers at once (each start blocks a thread until its server answers).
async fn start_servers(sqlite_url: String) -> Servers {
    fn start<T: Send + 'static>(
        what: &'static str,
        f: impl FnOnce() -> test_servers::Result<T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        tokio::task::spawn_blocking(move || f().unwrap_or_else(|e| panic!("{what}: {e}")))
    }
    let redis = start("redis-server", RedisServer::start);
    let redlock = start("three Redlock masters", || RedisServer::start_many(3));
    let cluster = start("a Redis Cluster", || RedisServer::start_cluster(3, 0));
    let sentinel = start("a Redis Sentinel deployment", RedisServer::start_sentinel);
    let etcd = start("etcd", EtcdServer::start);
    let postgres = start("postgresql", PostgresServer::start);
    let mariadb = start("mariadb", MariadbServer::start);
    let zookeeper = start("zookeeper", ZookeeperEnsemble::start_standalone);
    let (redis, redlock, cluster, sentinel, etcd, postgres, mariadb, zookeeper) =
        tokio::try_join!(redis, redlock, cluster, sentinel, etcd, postgres, mariadb, zookeeper)
            .expect("join");
    let hosts: Vec<String> = redlock
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let urls = vec![
        (Kind::Redis, redis.url()),
        // Generous: the per-node default (250 ms) is for nodes that answer, and other test
        // processes load this machine; the swaps, not Redlock's timeouts, are under test.
        (
            Kind::Redlock,
            format!("redlock://{}?command_timeout=2s", hosts.join(",")),
        ),
        (Kind::Cluster, cluster.url()),
        (Kind::Sentinel, sentinel.url()),
        (Kind::Etcd, etcd.url()),
        (Kind::Postgres, postgres.url()),
        (Kind::Mysql, mariadb.url()),
        (Kind::Sqlite, sqlite_url),
        (Kind::Zookeeper, zookeeper.url()),
    ];
    Servers {
        _redis: redis,
        _redlock: redlock,
        _cluster: cluster,
        _sentinel: sentinel,
        _etcd: etcd,
        _postgres: postgres,
        _mariadb: mariadb,
        _zookeeper: zookeeper,
        urls,
    }
}

/// A connected store and the kind it is.
#[derive(Clone)]
struct Store {
    kind: Kind,
    store: DynLockStore,
}

/// Connects as a user would: an `Unavailable` answer is retried (a Cluster client may not have
/// a connection to a node promoted a moment ago yet), within a bound far above a failover's
/// settling (the cluster reported `cluster_state:ok` before this is called).
async fn connect(kind: Kind, url: &str) -> Store {
    const RETRY_FOR: Duration = Duration::from_secs(15);
    let started = Instant::now();
    loop {
        match fencelock::connect(url).await {
            Ok(store) => return Store { kind, store },
            Err(e) if e.kind() == ErrorKind::Unavailable && started.elapsed() < RETRY_FOR => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("connect to {kind} ({}): {e}", fencelock::redact(url)),
        }
    }
}

/// One grant: its token, and the moment the acquire returned (the grant happened before it).
struct Grant {
    token: u64,
    returned: Instant,
}

/// Takes `key` under `store`, fences `file` with the token as a user does (claim at the read,
/// then write while the claim holds) and releases. The error says which step failed.
async fn fenced_write(
    store: &Store,
    key: &str,
    file: &FencedFile,
    previous: Option<u64>,
) -> Result<Grant, String> {
    let lease = store
        .store
        .try_acquire(key, TTL)
        .await
        .map_err(|e| format!("{} refused the acquire: {e}", store.kind))?;
    let returned = Instant::now();
    let token = lease.fencing_token();
    let written = write(file, token, format!("{} {token}\n", store.kind)).await;
    let released = store.store.release(&lease).await;
    let grew = match previous {
        Some(previous) if token <= previous => Err(format!(
            "{}'s token {token} is not above the last one, {previous}",
            store.kind
        )),
        _ => Ok(()),
    };
    grew.and(
        written.map_err(|e| format!("the resource refused {}'s token {token}: {e}", store.kind)),
    )?;
    match released {
        Ok(ReleaseOutcome::Released) => {}
        other => return Err(format!("{}'s release: {other:?}", store.kind)),
    }
    Ok(Grant { token, returned })
}

/// Claims `file` for `token` (every lower token refused from then on) and writes `contents`
/// while the claim holds, off the runtime's threads (the file fence blocks on `flock`).
async fn write(file: &FencedFile, token: u64, contents: String) -> fencelock::Result<()> {
    let file = file.clone();
    tokio::task::spawn_blocking(move || {
        file.claim(token)?;
        file.write(token, contents)
    })
    .await
    .expect("the file fence's task")
}

/// One round trip's outcome: the swap there (A → B) and the swap back (B → A), each the token
/// whose write the resource accepted or what failed.
struct RoundTrip {
    a: Kind,
    b: Kind,
    there: Result<u64, String>,
    back: Result<u64, String>,
}

impl RoundTrip {
    /// The failed swaps, each named with its round trip.
    fn failures(&self) -> Vec<String> {
        let (a, b) = (self.a, self.b);
        let mut failed = Vec::new();
        if let Err(e) = &self.there {
            failed.push(format!("{a} → {b} (there, of {a} → {b} → {a}): {e}"));
        }
        if let Err(e) = &self.back {
            failed.push(format!("{b} → {a} (back, of {a} → {b} → {a}): {e}"));
        }
        failed
    }
}

/// A → B → A on a fresh key and file: A fences, B's first lease writes D(A → B) after A's
/// grant, A's writes again D(B → A) after B's.
async fn round_trip(a: Store, b: Store, dir: PathBuf) -> RoundTrip {
    let key = format!("swap-{}-{}", a.kind, b.kind);
    let file = FencedFile::new(dir.join(&key));
    let first = match fenced_write(&a, &key, &file, None).await {
        Ok(grant) => grant,
        Err(e) => {
            let e = format!("fencing the resource under {} failed: {e}", a.kind);
            return RoundTrip {
                a: a.kind,
                b: b.kind,
                there: Err(e.clone()),
                back: Err(e),
            };
        }
    };
    sleep_until(first.returned + delay(a.kind, b.kind, Duration::ZERO)).await;
    let there = fenced_write(&b, &key, &file, Some(first.token)).await;
    let (last, since) = match &there {
        Ok(grant) => (grant.token, grant.returned),
        // The resource kept A's claim; the way back still starts after B's attempt.
        Err(_) => (first.token, Instant::now()),
    };
    sleep_until(since + delay(b.kind, a.kind, Duration::ZERO)).await;
    let back = fenced_write(&a, &key, &file, Some(last)).await;
    RoundTrip {
        a: a.kind,
        b: b.kind,
        there: there.map(|g| g.token),
        back: back.map(|g| g.token),
    }
}

/// Every ordered pair of the nine stores, A → B → A, all pairs at once (each on its own key
/// and file): every first write after a swap is accepted and every token grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_swap_between_two_stores_keeps_the_fenced_resource_working() {
    let scratch = Scratch::new("swap-matrix");
    let sqlite_url = format!("sqlite://{}", scratch.path().join("locks.db").display());
    let started = std::time::Instant::now();
    let servers = start_servers(sqlite_url).await;
    let mut stores = Vec::new();
    for (kind, url) in &servers.urls {
        stores.push(connect(*kind, url).await);
    }
    let servers_up = started.elapsed();

    let mut pairs = Vec::new();
    for a in &stores {
        for b in &stores {
            if a.kind != b.kind {
                let dir = scratch.path().to_path_buf();
                pairs.push(tokio::spawn(round_trip(a.clone(), b.clone(), dir)));
            }
        }
    }
    let mut trips = Vec::new();
    for pair in pairs {
        trips.push(pair.await.expect("a pair's task"));
    }
    let swaps_took = started.elapsed() - servers_up;

    let failed_there = trips.iter().filter(|t| t.there.is_err()).count();
    let failed: Vec<String> = trips.iter().flat_map(RoundTrip::failures).collect();
    println!(
        "{} round trips in {swaps_took:?} after {servers_up:?} of server start; \
         first swaps (A → B) failed: {failed_there} of {}; all swaps failed: {} of {}",
        trips.len(),
        trips.len(),
        failed.len(),
        2 * trips.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} swaps broke the fenced resource:\n{}",
        failed.len(),
        2 * trips.len(),
        failed.join("\n")
    );
    drop(stores);
    drop(servers);
}

/// How far a Redis master under the clock shim runs behind this host.
const SKEW: Duration = Duration::from_secs(2);

/// A key of the default layout whose fence lives on the master on `master`.
fn key_on(cluster: &RedisCluster, master: u16, stem: &str) -> String {
    for i in 0..1000 {
        let key = format!("{stem}-{i}");
        let slot = cluster
            .keyslot(&format!("fencelock:{{{key}}}:fence"))
            .expect("CLUSTER KEYSLOT");
        if cluster.master_of_slot(slot).expect("the slot's master") == master {
            return key;
        }
    }
    panic!("no key of 1000 lives on the master on {master}");
}

/// The wall clock of the node on `port` (`TIME`), in µs.
fn node_clock(cluster: &RedisCluster, port: u16) -> u64 {
    let answer = cluster.query(port, &["TIME"]).expect("TIME");
    let mut parts = answer.split_whitespace().map(|p| p.parse::<u64>());
    match (parts.next(), parts.next()) {
        (Some(Ok(s)), Some(Ok(us))) => s * 1_000_000 + us,
        _ => panic!("TIME answered {answer:?}"),
    }
}

fn host_clock() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// SQLite mints from this process's clock; a Redis Cluster shard's master runs 2 s behind it
/// (a replica under the clock shim, promoted). SQLite → Redis: right after SQLite's grant the
/// Redis token is below SQLite's and the resource refuses it (safe: the holder stops); once
/// D = skew + runahead(SQLite) + G(Redis) passed, B's first write is accepted. Redis → SQLite
/// needs no wait beyond G(SQLite): the clock it swaps to is ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_to_a_store_whose_clock_is_behind_is_accepted_once_the_skew_and_granule_passed() {
    let scratch = Scratch::new("swap-skew");
    let cluster = tokio::task::spawn_blocking(|| {
        let cluster = RedisCluster::start_with_replica_clock_back(3, 1, SKEW)?;
        let replica = cluster.replica_of(cluster.ports()[0])?;
        cluster.promote(replica)?;
        Ok::<_, test_servers::Error>((cluster, replica))
    })
    .await
    .expect("join");
    let (cluster, behind) = cluster.expect("a Redis Cluster with a master 2 s behind");
    // The node's TIME is read between two readings of this host's clock (a subprocess, slow
    // on a loaded machine): the lag is known to within half their gap.
    let host_before = host_clock();
    let node = node_clock(&cluster, behind);
    let host_after = host_clock();
    let uncertainty = (host_after - host_before) / 2;
    let lag = (host_before + uncertainty).saturating_sub(node);
    assert!(
        lag + uncertainty >= SKEW.as_micros() as u64 - 100_000,
        "the promoted master's clock is only {lag} µs (± {uncertainty} µs) behind this host's"
    );
    let key = key_on(&cluster, behind, "swap-skew");
    let redis = connect(Kind::Cluster, &cluster.url()).await;
    let sqlite = connect(
        Kind::Sqlite,
        &format!("sqlite://{}", scratch.path().join("locks.db").display()),
    )
    .await;
    let file = FencedFile::new(scratch.path().join(&key));

    let asked = Instant::now();
    let fenced = fenced_write(&sqlite, &key, &file, None)
        .await
        .expect("fencing under SQLite");

    // Before D: the shard's clock still reads below SQLite's token.
    let early = redis
        .store
        .try_acquire(&key, TTL)
        .await
        .expect("the key is free on Redis");
    let refused = write(&file, early.fencing_token(), "early".into()).await;
    let early_within_skew = asked.elapsed() < SKEW;
    let released = redis.store.release(&early).await;
    assert!(
        matches!(released, Ok(ReleaseOutcome::Released)),
        "{released:?}"
    );
    if early_within_skew {
        assert!(
            early.fencing_token() < fenced.token,
            "a clock {SKEW:?} behind minted {} over SQLite's {}",
            early.fencing_token(),
            fenced.token
        );
        assert!(
            matches!(refused, Err(Error::StaleToken { .. })),
            "the resource must refuse the lower token before D: {refused:?}"
        );
    } else {
        println!("the machine stalled past the skew: the early swap is not checked");
    }

    // After D: accepted.
    let d = delay(Kind::Sqlite, Kind::Cluster, SKEW);
    sleep_until(fenced.returned + d).await;
    let there = fenced_write(&redis, &key, &file, Some(fenced.token))
        .await
        .unwrap_or_else(|e| panic!("SQLite → Redis {SKEW:?} behind, after D = {d:?}: {e}"));

    // Back to the clock that is ahead: its granule only.
    let back_d = delay(Kind::Cluster, Kind::Sqlite, Duration::ZERO);
    sleep_until(there.returned + back_d).await;
    let back = fenced_write(&sqlite, &key, &file, Some(there.token))
        .await
        .unwrap_or_else(|e| panic!("Redis {SKEW:?} behind → SQLite after {back_d:?}: {e}"));
    println!(
        "tokens: SQLite {}, Redis {SKEW:?} behind early {} (refused), after D = {d:?} {}, SQLite again {}",
        fenced.token,
        early.fencing_token(),
        there.token,
        back.token
    );
}
