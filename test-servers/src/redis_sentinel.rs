//! A Redis Sentinel deployment on free loopback ports: one master, two replicas and three
//! sentinels, see [`RedisServer::start_sentinel`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::clock_shim;
use crate::process::{self, log_marker, start_error, wait_ready, Proc, TempDir};
use crate::{Error, RedisServer, Result};

/// The name the sentinels monitor the master under.
pub const SENTINEL_MASTER_NAME: &str = "fencelock";
/// How long a sentinel waits for an answer before it calls the master down
/// (`down-after-milliseconds`): short, so a failover takes seconds, yet many sentinel pings
/// (one a second) long, so a loaded machine does not fail the master over by itself.
pub const DOWN_AFTER: Duration = Duration::from_millis(2000);
/// `failover-timeout`: a sentinel tries the same master's failover again after twice this.
const FAILOVER_TIMEOUT_MS: u32 = 4000;

/// What a [`RedisSentinel`] is started with beyond its shape.
#[derive(Clone, Debug, Default)]
pub struct SentinelOptions {
    /// The replicas' wall clock this far (whole seconds) behind this host's, as for
    /// [`RedisCluster::start_with_replica_clock_back`](crate::RedisCluster::start_with_replica_clock_back):
    /// a promoted replica then has a clock behind the old master's.
    pub replica_clock_back: Option<Duration>,
    /// The data nodes' password (`requirepass`, and `masterauth` for the replicas).
    pub password: Option<String>,
    /// The sentinels' own password (`requirepass` on each sentinel).
    pub sentinel_password: Option<String>,
    /// Every node and sentinel speaks TLS to clients and to each other, with these files;
    /// each keeps a plain-text port for test-servers' own checks and queries.
    pub tls: Option<SentinelTls>,
}

/// The files of a TLS deployment (see [`SentinelOptions::tls`]).
#[derive(Clone, Debug)]
pub struct SentinelTls {
    /// The CA that signed the certificate, which the nodes trust.
    pub ca: PathBuf,
    /// The certificate every node and sentinel presents.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl SentinelTls {
    /// `ca`'s server certificate (SAN `127.0.0.1`).
    pub fn from_ca(ca: &crate::TestCa) -> Self {
        SentinelTls {
            ca: ca.ca_file(),
            cert: ca.server_cert(),
            key: ca.server_key(),
        }
    }
}

/// A Redis Sentinel deployment for tests: a master and two replicas (`redis-server`) and three
/// sentinels (`redis-sentinel`) monitoring it as [`SENTINEL_MASTER_NAME`] with a quorum of 2,
/// each a child process on a free port of 127.0.0.1, in its own directory, without persistence.
/// Always local.
///
/// The constructors return once both replicas' links to the master are up and every sentinel
/// knows the two replicas and the two other sentinels (so a failover can be agreed on).
///
/// Dropping it kills every process and removes their directories.
#[derive(Debug)]
pub struct RedisSentinel {
    data: Vec<Node>,
    sentinels: Vec<Node>,
    server: PathBuf,
    sentinel: PathBuf,
    cli: PathBuf,
    options: SentinelOptions,
}

#[derive(Debug)]
struct Node {
    // Dropped (killed) before `dir` is removed.
    proc: Proc,
    /// The port the node is known by: the TLS port of a TLS deployment.
    port: u16,
    /// The plain-text port test-servers itself queries (`port` without TLS).
    plain: u16,
    log: PathBuf,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a Sentinel deployment (one master, two replicas, three sentinels) with default
    /// [`SentinelOptions`]. Needs `redis-server`, `redis-sentinel` and `redis-cli` (Debian:
    /// `redis-server`, `redis-sentinel`, `redis-tools`); a missing one is
    /// [`Error::MissingBinary`].
    pub fn start_sentinel() -> Result<RedisSentinel> {
        RedisSentinel::start(SentinelOptions::default())
    }
}

impl RedisSentinel {
    /// As [`RedisServer::start_sentinel`], with `options`.
    pub fn start(options: SentinelOptions) -> Result<Self> {
        let server = crate::redis::server_binary()?;
        let sentinel = process::find_binary("redis-sentinel", "redis-sentinel")?;
        let cli = process::find_binary("redis-cli", "redis-tools")?;
        let tls = options.tls.is_some();
        let ports = process::free_ports(if tls { 12 } else { 6 })?;
        // Under TLS each node's second port is its plain-text one.
        let plain = |i: usize| if tls { ports[6 + i] } else { ports[i] };
        let mut deployment = RedisSentinel {
            data: Vec::new(),
            sentinels: Vec::new(),
            server,
            sentinel,
            cli,
            options,
        };
        for (i, port) in ports[..3].iter().copied().enumerate() {
            let mut node = Node::new("redis-sentinel-data", port, plain(i))?;
            let master = (i > 0).then_some(ports[0]);
            node.launch_data(&deployment.server, master, &deployment.options)?;
            deployment.data.push(node);
        }
        deployment.wait_linked(Duration::from_secs(30))?;
        for (i, port) in ports[3..6].iter().copied().enumerate() {
            let mut node = Node::new("redis-sentinel", port, plain(3 + i))?;
            node.launch_sentinel(&deployment.sentinel, ports[0], &deployment.options)?;
            deployment.sentinels.push(node);
        }
        deployment.wait_known(Duration::from_secs(30))?;
        Ok(deployment)
    }

    /// `redis+sentinel://[:password@]127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/fencelock`, with
    /// `sentinel_password=` when the sentinels have one; `rediss+sentinel://…&tls_ca=…` for a
    /// TLS deployment.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let auth = match &self.options.password {
            Some(password) => format!(":{password}@"),
            None => String::new(),
        };
        let scheme = if self.options.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let mut options = Vec::new();
        if let Some(password) = &self.options.sentinel_password {
            options.push(format!("sentinel_password={password}"));
        }
        if let Some(tls) = &self.options.tls {
            options.push(format!("tls_ca={}", tls.ca.display()));
        }
        let mut url = format!(
            "{scheme}://{auth}{}/{SENTINEL_MASTER_NAME}",
            hosts.join(",")
        );
        if !options.is_empty() {
            url.push('?');
            url.push_str(&options.join("&"));
        }
        url
    }

    /// The data nodes' ports, the first master first.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(|node| node.port).collect()
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|node| node.port).collect()
    }

    /// The master's port as the first running sentinel names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn master(&self) -> Result<u16> {
        let sentinel = self.running_sentinel()?;
        self.named_by(sentinel.port).ok_or_else(|| {
            Error::InvalidArgument(format!("the sentinel on {} names no master", sentinel.port))
        })
    }

    /// The first sentinel that runs and is not paused.
    fn running_sentinel(&self) -> Result<&Node> {
        self.sentinels
            .iter()
            .find(|node| node.proc.is_running() && !node.proc.is_paused())
            .ok_or_else(|| Error::NotRunning("every sentinel".into()))
    }

    /// The master's port as the sentinel on `port` names it, if it answers.
    fn named_by(&self, port: u16) -> Option<u16> {
        let answer = self
            .query_sentinel(
                port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER_NAME],
            )
            .ok()?;
        answer.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until every running sentinel names a master other than `old` and that node says
    /// `ROLE` master; returns its port. Fails after `bound`.
    pub fn wait_master_other_than(&self, old: u16, bound: Duration) -> Result<u16> {
        let started = Instant::now();
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .filter(|node| node.proc.is_running() && !node.proc.is_paused())
                .map(|node| self.named_by(node.port))
                .collect();
            if let Some(Some(new)) = named.first().copied() {
                let agreed = named.iter().all(|port| *port == Some(new));
                if new != old && agreed && self.role(new).is_ok_and(|r| r == "master") {
                    return Ok(new);
                }
            }
            if started.elapsed() > bound {
                return Err(Error::InvalidArgument(format!(
                    "the sentinels name {named:?} as master {bound:?} after a failover from {old}"
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until a failover from `old` to `new` is over for a client that asks one replica to
    /// acknowledge each write (`WAIT 1`): `old` no longer says `ROLE` master (a node left
    /// running believes it is one until the sentinels demote it, and its replicas have moved),
    /// and `new` has a replica online (`INFO replication` lists one with `state=online`).
    /// Fails after `bound`.
    pub fn wait_failover_settled(&self, old: u16, new: u16, bound: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let demoted = self.role(old).map_or(true, |role| role != "master");
            let info = self
                .query(new, &["INFO", "replication"])
                .unwrap_or_default();
            let online = info
                .lines()
                .any(|l| l.trim().starts_with("slave") && l.contains("state=online"));
            if demoted && online {
                return Ok(());
            }
            if started.elapsed() > bound {
                return Err(Error::InvalidArgument(format!(
                    "{bound:?} after a failover from {old} to {new}: {}",
                    if demoted {
                        "the new master has no replica online"
                    } else {
                        "the old master still says it is one"
                    }
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `SENTINEL FAILOVER` on the first running sentinel (a failover without agreement, the
    /// master need not be down), then waits until the sentinels name the new master.
    pub fn failover(&self) -> Result<u16> {
        let old = self.master()?;
        let sentinel = self.running_sentinel()?;
        let answer = self.query_sentinel(
            sentinel.port,
            &["SENTINEL", "FAILOVER", SENTINEL_MASTER_NAME],
        )?;
        if answer.trim() != "OK" {
            return Err(Error::InvalidArgument(format!(
                "SENTINEL FAILOVER answered {answer:?}"
            )));
        }
        self.wait_master_other_than(old, Duration::from_secs(30))
    }

    /// The first line of the node's `ROLE`: `master`, `slave` or `sentinel`.
    pub fn role(&self, port: u16) -> Result<String> {
        let answer = self.query(port, &["ROLE"])?;
        Ok(answer.lines().next().unwrap_or_default().trim().to_owned())
    }

    /// Kills the node (data node or sentinel) on `port` (`SIGKILL`); it stays down.
    pub fn kill(&mut self, port: u16) -> Result<()> {
        self.node_mut(port)?.proc.kill();
        Ok(())
    }

    /// Starts the killed node on `port` again: a data node empty, as a replica of the master
    /// the sentinels name now (they would make it one anyway); a sentinel from its own config
    /// file, which it rewrote with what it knew.
    pub fn restart(&mut self, port: u16) -> Result<()> {
        let master = if self.data.iter().any(|node| node.port == port) {
            Some(self.master()?)
        } else {
            None
        };
        let (server, sentinel) = (self.server.clone(), self.sentinel.clone());
        let options = self.options.clone();
        let node = self.node_mut(port)?;
        if node.proc.is_running() {
            return Err(Error::InvalidArgument(format!(
                "the node on {port} is running: kill it first"
            )));
        }
        match master {
            Some(master) => node.launch_data(&server, Some(master), &options),
            None => node.relaunch_sentinel(&sentinel, &options),
        }
    }

    /// Freezes the node on `port` (`SIGSTOP`) until [`resume`](Self::resume).
    pub fn pause(&self, port: u16) -> Result<()> {
        self.node(port)?
            .proc
            .pause(&format!("sentinel deployment node 127.0.0.1:{port}"))
    }

    /// Lets a paused node run again (`SIGCONT`).
    pub fn resume(&self, port: u16) -> Result<()> {
        self.node(port)?
            .proc
            .resume(&format!("sentinel deployment node 127.0.0.1:{port}"))
    }

    /// The process id of the node on `port`, while it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.node(port).ok().and_then(|node| node.proc.pid())
    }

    /// Runs one command with `redis-cli` on the data node on `port` (with the data nodes'
    /// password) and returns its output as [`RedisCluster::query`](crate::RedisCluster::query)
    /// does.
    pub fn query(&self, port: u16, args: &[&str]) -> Result<String> {
        self.cli_on(port, self.options.password.as_deref(), args)
    }

    /// As [`query`](Self::query), on a sentinel (with the sentinels' password).
    pub fn query_sentinel(&self, port: u16, args: &[&str]) -> Result<String> {
        self.cli_on(port, self.options.sentinel_password.as_deref(), args)
    }

    fn cli_on(&self, port: u16, password: Option<&str>, args: &[&str]) -> Result<String> {
        // A node's plain-text port, where it has one of its own.
        let plain = self.node(port).map_or(port, |node| node.plain);
        let mut command = Command::new(&self.cli);
        command.args(["-h", "127.0.0.1", "-p", &plain.to_string()]);
        if let Some(password) = password {
            command.env("REDISCLI_AUTH", password);
        }
        let output = command.args(args).output()?;
        if !output.status.success() {
            return Err(Error::InvalidArgument(format!(
                "redis-cli on {port} {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Waits until both replicas report `master_link_status:up`.
    fn wait_linked(&self, bound: Duration) -> Result<()> {
        let started = Instant::now();
        for node in &self.data[1..] {
            while !self
                .query(node.port, &["INFO", "replication"])
                .is_ok_and(|info| info.lines().any(|l| l.trim() == "master_link_status:up"))
            {
                if started.elapsed() > bound {
                    return Err(start_error(
                        "the Sentinel deployment",
                        format!(
                            "the replica on {} has no link up after {bound:?}",
                            node.port
                        ),
                        &node.log,
                    ));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Waits until every sentinel knows both replicas and both other sentinels.
    fn wait_known(&self, bound: Duration) -> Result<()> {
        let started = Instant::now();
        for node in &self.sentinels {
            loop {
                let answer =
                    self.query_sentinel(node.port, &["SENTINEL", "MASTER", SENTINEL_MASTER_NAME]);
                let fields: Vec<String> = answer
                    .map(|a| a.lines().map(|l| l.trim().to_owned()).collect())
                    .unwrap_or_default();
                let field = |name: &str| {
                    fields
                        .iter()
                        .position(|f| f == name)
                        .and_then(|i| fields.get(i + 1))
                        .cloned()
                };
                let known = field("num-slaves").as_deref() == Some("2")
                    && field("num-other-sentinels").as_deref() == Some("2");
                if known {
                    break;
                }
                if started.elapsed() > bound {
                    return Err(start_error(
                        "the Sentinel deployment",
                        format!(
                            "the sentinel on {} knows {:?} replicas and {:?} other sentinels \
                             after {bound:?}",
                            node.port,
                            field("num-slaves"),
                            field("num-other-sentinels")
                        ),
                        &node.log,
                    ));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    fn node(&self, port: u16) -> Result<&Node> {
        self.data
            .iter()
            .chain(&self.sentinels)
            .find(|node| node.port == port || node.plain == port)
            .ok_or_else(|| Error::InvalidArgument(format!("no sentinel deployment node on {port}")))
    }

    fn node_mut(&mut self, port: u16) -> Result<&mut Node> {
        self.data
            .iter_mut()
            .chain(&mut self.sentinels)
            .find(|node| node.port == port || node.plain == port)
            .ok_or_else(|| Error::InvalidArgument(format!("no sentinel deployment node on {port}")))
    }
}

impl Node {
    fn new(kind: &str, port: u16, plain: u16) -> Result<Self> {
        let dir = TempDir::new(kind, port, None)?;
        let log = dir.path().join("redis.log");
        Ok(Node {
            proc: Proc::none(),
            port,
            plain,
            log,
            dir,
        })
    }

    /// A data node: the master, or with `master` one of its replicas.
    fn launch_data(
        &mut self,
        binary: &Path,
        master: Option<u16>,
        options: &SentinelOptions,
    ) -> Result<()> {
        let what = format!("sentinel deployment data node on 127.0.0.1:{}", self.port);
        log_marker(&self.log, &format!("starting {what}"));
        let mut command = Command::new(binary);
        command
            .arg("--port")
            .arg(self.plain.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--daemonize", "no"])
            // A replica's first full sync starts at once, not 5 s later (7.0's default).
            .args(["--repl-diskless-sync-delay", "0"])
            .current_dir(self.dir.path());
        if let Some(password) = &options.password {
            command.args(["--requirepass", password, "--masterauth", password]);
        }
        if let Some(tls) = &options.tls {
            command.args(["--tls-port", &self.port.to_string()]);
            command.arg("--tls-cert-file").arg(&tls.cert);
            command.arg("--tls-key-file").arg(&tls.key);
            command.arg("--tls-ca-cert-file").arg(&tls.ca);
            command.args(["--tls-replication", "yes", "--tls-auth-clients", "no"]);
        }
        if let Some(master) = master {
            command.args(["--replicaof", "127.0.0.1", &master.to_string()]);
            if let Some(back) = options.replica_clock_back {
                clock_shim::set_back(&mut command, back)?;
            }
        }
        self.proc = Proc::spawn(command, &self.log)?;
        let port = self.plain;
        let password = options.password.clone();
        wait_ready(&mut self.proc, &what, &self.log, || {
            answers(port, password.as_deref())
        })
    }

    /// A sentinel of the master on `master`, from a config file of its own (sentinels rewrite
    /// theirs).
    fn launch_sentinel(
        &mut self,
        binary: &Path,
        master: u16,
        options: &SentinelOptions,
    ) -> Result<()> {
        let what = format!("redis-sentinel on 127.0.0.1:{}", self.port);
        log_marker(&self.log, &format!("starting {what}"));
        let name = SENTINEL_MASTER_NAME;
        let mut config = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
             sentinel monitor {name} 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {name} 2\n",
            port = self.plain,
            dir = self.dir.path().display(),
            down = DOWN_AFTER.as_millis(),
        );
        if let Some(password) = &options.password {
            config.push_str(&format!("sentinel auth-pass {name} {password}\n"));
        }
        if let Some(password) = &options.sentinel_password {
            config.push_str(&format!(
                "requirepass {password}\nsentinel sentinel-pass {password}\n"
            ));
        }
        if let Some(tls) = &options.tls {
            config.push_str(&format!(
                "tls-port {}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                 tls-replication yes\ntls-auth-clients no\n",
                self.port,
                tls.cert.display(),
                tls.key.display(),
                tls.ca.display()
            ));
        }
        std::fs::write(self.dir.path().join("sentinel.conf"), config)?;
        self.relaunch_sentinel(binary, options)
    }

    /// Starts the sentinel from the config file in its directory.
    fn relaunch_sentinel(&mut self, binary: &Path, options: &SentinelOptions) -> Result<()> {
        let what = format!("redis-sentinel on 127.0.0.1:{}", self.port);
        let file = self.dir.path().join("sentinel.conf");
        let mut command = Command::new(binary);
        command.arg(&file).current_dir(self.dir.path());
        self.proc = Proc::spawn(command, &self.log)?;
        let port = self.plain;
        let password = options.sentinel_password.clone();
        wait_ready(&mut self.proc, &what, &self.log, || {
            answers(port, password.as_deref())
        })
    }
}

/// True if the server on `port` answers `PING` (after `AUTH` with `password`).
fn answers(port: u16, password: Option<&str>) -> bool {
    match password {
        None => crate::redis::ping(port),
        Some(password) => crate::redis::ping_as(port, password),
    }
}
