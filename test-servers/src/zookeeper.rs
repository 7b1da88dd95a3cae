//! ZooKeeper (Debian's `zookeeper` package, 3.8, Java) on free loopback ports: a standalone
//! server or an ensemble, each member started as
//! `java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.quorum.QuorumPeerMain
//! zoo.cfg`, the class and class path `/usr/share/zookeeper/bin/zkEnv.sh` names (the jar's
//! manifest lists the rest of the class path).
//!
//! Settings for short tests: `tickTime` of [`TICK`], `minSessionTimeout` and
//! `maxSessionTimeout` set explicitly ([`MIN_SESSION_TIMEOUT`], [`MAX_SESSION_TIMEOUT`]),
//! `forceSync=yes` (a write is acknowledged only once fsynced: the fencing argument across a
//! restart depends on it), the admin server off, and containers swept every
//! [`CONTAINER_SWEEP`] (the Java system property `znode.container.checkIntervalMs`; 60 s by
//! default).
//!
//! [`ZookeeperEnsemble::start_secure`] starts a standalone server with TLS on a
//! `secureClientPort` (Netty, PEM files of [`TestCa`]) and SASL DIGEST-MD5 users, beside its
//! plain client port.
//!
//! [`ZookeeperEnsemble::start_with_quorum_relays`] starts an ensemble whose members reach one
//! another's quorum ports through a [`FreezableRelay`] each, so one member can be cut off from
//! the quorum ([`ZookeeperEnsemble::isolate`]) or kept behind it
//! ([`ZookeeperEnsemble::delay_quorum`]) while its clients stay connected to it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::process::{self, log_marker, start_error, Proc, TempDir};
use crate::tls::PerCert;
use crate::{Error, FreezableRelay, Result, ServerCert, TestCa};

/// The server's jar, as `zkEnv.sh`'s `CLASSPATH` names it.
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// slf4j's simple binding, so the server logs to its stderr (our log file); optional.
const LOG_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codecs (Debian's `libnetty-java`, a dependency of `zookeeper`), which the
/// `secureClientPort`'s Netty server needs and `zookeeper.jar`'s manifest does not list.
const NETTY_CODEC_JAR: &str = "/usr/share/java/netty-codec.jar";
/// The main class `zkServer.sh` runs (`ZOOMAIN` in `zkEnv.sh`).
const MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// The Debian package the server comes from (it depends on a Java runtime).
const PACKAGE: &str = "zookeeper";

/// The servers' `tickTime`: the unit of ZooKeeper's timeouts, and the granule to which the
/// server rounds a session's expiry up.
pub const TICK: Duration = Duration::from_millis(100);
/// `minSessionTimeout` (2 ticks, ZooKeeper's default ratio): a client asking for less gets this.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(200);
/// `maxSessionTimeout` (600 ticks, above lockctl's default TTL of 30 s): a client asking for
/// more gets this.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);
/// `syncLimit`, in ticks: a follower that hears nothing from its leader for this long stops
/// serving its clients (1 s here), and the leader drops it.
pub const SYNC_LIMIT_TICKS: u32 = 10;
/// `initLimit`, in ticks: how long a follower joining its leader waits for it (5 s here), and a
/// new leader for a quorum of followers.
pub const INIT_LIMIT_TICKS: u32 = 50;
/// How often the servers sweep empty container nodes (`znode.container.checkIntervalMs`).
pub const CONTAINER_SWEEP: Duration = Duration::from_secs(1);
/// How many members [`ZookeeperEnsemble::shared_ensemble`] has: the smallest ensemble that
/// survives losing one.
pub const ENSEMBLE_MEMBERS: usize = 3;

/// The SASL DIGEST-MD5 users (name, password) of every server
/// [`ZookeeperEnsemble::shared_secure`] starts.
pub const SASL_USERS: &[(&str, &str)] = &[("app", "app-sasl-secret"), ("other", "other-secret")];

/// How long [`ZookeeperEnsemble::leader`] waits for a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one four-letter-word exchange.
const WORD_TIMEOUT: Duration = Duration::from_millis(500);

/// A ZooKeeper standalone server or ensemble on loopback, each member with its own free
/// client (and quorum and election) ports, data directory and log, in one temporary directory.
/// Dropping it kills every member and removes the directory.
#[derive(Debug)]
pub struct ZookeeperEnsemble {
    // Dropped (killed) before `dir` is removed.
    members: Vec<Member>,
    /// With [`start_with_quorum_relays`](Self::start_with_quorum_relays): the relay each member
    /// reaches each other member's quorum port through.
    quorum_relays: Vec<QuorumRelay>,
    java: PathBuf,
    class_path: String,
    /// The `secureClientPort` of a standalone server started with TLS.
    secure_port: Option<u16>,
    /// JVM options beyond the common ones (the JAAS file of SASL).
    jvm_options: Vec<String>,
    dir: TempDir,
}

/// TLS and SASL of a standalone server started by [`ZookeeperEnsemble::start_secure`].
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// A `secureClientPort` (Netty) presenting this certificate of `ca`, trusting `ca` for
    /// client certificates (`ssl.clientAuth=need` with [`ServerCert::RequireClientCert`],
    /// `want` otherwise); none without.
    pub tls: Option<ServerCert>,
    /// Users (name, password) of the JAAS `Server` section (`DigestLoginModule`), with
    /// `SASLAuthenticationProvider` as an auth provider; no SASL when empty.
    pub sasl_users: Vec<(String, String)>,
}

/// The relay member `from` (an index) reaches member `to`'s quorum port through: a follower
/// `from` connects to its leader `to` there.
#[derive(Debug)]
struct QuorumRelay {
    from: usize,
    to: usize,
    relay: FreezableRelay,
}

#[derive(Debug)]
struct Member {
    proc: Proc,
    /// `myid`, 1-based.
    id: usize,
    client_port: u16,
    config: PathBuf,
    log: PathBuf,
}

impl Member {
    fn what(&self) -> String {
        format!(
            "zookeeper member {} on 127.0.0.1:{}",
            self.id, self.client_port
        )
    }

    /// The member's `Mode:` from `srvr` (`standalone`, `leader`, `follower`), `None` while it
    /// does not serve requests.
    fn mode(&self) -> Option<String> {
        let answer = four_letter_word(self.client_port, "srvr")?;
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .map(|mode| mode.trim().to_owned())
    }
}

impl ZookeeperEnsemble {
    /// Starts a standalone server (no `server.N` lines: ZooKeeper's standalone mode) and
    /// waits until it serves requests.
    ///
    /// Fails with [`Error::MissingBinary`] naming the package `zookeeper` if the server or a
    /// Java runtime is not installed.
    pub fn start_standalone() -> Result<Self> {
        Self::start(1)
    }

    /// Starts a standalone server with `security`'s TLS port (certificates of `ca`) and SASL
    /// users, beside its plain client port, and waits until both ports serve.
    ///
    /// Fails with [`Error::MissingBinary`] naming the package `zookeeper` if the server or a
    /// Java runtime is not installed.
    pub fn start_secure(ca: &TestCa, security: &Security) -> Result<Self> {
        Self::start_with(1, Some((ca, security)), false)
    }

    /// Starts an ensemble of `members` (1 is a standalone server) and waits until every
    /// member serves requests (an ensemble: one leader, the others following).
    ///
    /// Fails with [`Error::MissingBinary`] naming the package `zookeeper` if the server or a
    /// Java runtime is not installed.
    pub fn start(members: usize) -> Result<Self> {
        Self::start_with(members, None, false)
    }

    /// Starts an ensemble of `members` (at least two) in which each member reaches every other
    /// member's quorum port through a relay of its own (its `zoo.cfg` names the relay's port in
    /// the other member's `server.N` line; election ports are direct), and waits until every
    /// member serves requests. A follower's link to its leader, the one quorum connection
    /// it keeps, can then be cut ([`isolate`](Self::isolate)) or slowed
    /// ([`delay_quorum`](Self::delay_quorum)) while its clients stay connected to it.
    ///
    /// Fails with [`Error::MissingBinary`] naming the package `zookeeper` if the server or a
    /// Java runtime is not installed.
    pub fn start_with_quorum_relays(members: usize) -> Result<Self> {
        if members < 2 {
            return Err(Error::InvalidArgument(
                "quorum relays need an ensemble of at least two members".into(),
            ));
        }
        Self::start_with(members, None, true)
    }

    fn start_with(
        members: usize,
        security: Option<(&TestCa, &Security)>,
        quorum_relays: bool,
    ) -> Result<Self> {
        if members == 0 {
            return Err(Error::InvalidArgument(
                "a ZooKeeper ensemble needs at least one member".into(),
            ));
        }
        let java = process::find_binary("java", PACKAGE)?;
        if !Path::new(JAR).is_file() {
            return Err(Error::MissingBinary {
                binary: JAR.into(),
                package: PACKAGE.into(),
            });
        }
        let mut class_path = if Path::new(LOG_JAR).is_file() {
            format!("{JAR}:{LOG_JAR}")
        } else {
            JAR.to_owned()
        };
        // Netty's server (TLS) needs its codec, which the jar's manifest leaves out.
        if security.is_some() && Path::new(NETTY_CODEC_JAR).is_file() {
            class_path = format!("{class_path}:{NETTY_CODEC_JAR}");
        }
        let mut last_error = None;
        for _ in 0..process::START_ATTEMPTS {
            match Self::try_start(&java, &class_path, members, security, quorum_relays)? {
                Ok(ensemble) => return Ok(ensemble),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// The shared standalone server of this test process, started on first use, for tests
    /// that only lock and unlock (each on its own keys).
    ///
    /// # Panics
    /// If the server cannot be started.
    pub fn shared_standalone() -> &'static Self {
        static SERVER: OnceLock<Result<ZookeeperEnsemble, String>> = OnceLock::new();
        shared(&SERVER, || Self::start(1))
    }

    /// The shared standalone server of this test process with TLS presenting `cert` of
    /// [`TestCa::shared`] and the SASL users [`SASL_USERS`] ([`start_secure`](Self::start_secure)),
    /// one per `cert`, started on first use.
    ///
    /// # Panics
    /// If the server cannot be started.
    pub fn shared_secure(cert: ServerCert) -> &'static Self {
        static SERVERS: PerCert<ZookeeperEnsemble> = PerCert::new();
        SERVERS.get(cert, "zookeeper", |ca, cert| {
            let security = Security {
                tls: Some(cert),
                sasl_users: SASL_USERS
                    .iter()
                    .map(|(user, password)| (user.to_string(), password.to_string()))
                    .collect(),
            };
            Self::start_secure(ca, &security)
        })
    }

    /// The shared ensemble of [`ENSEMBLE_MEMBERS`] of this test process, started on first use.
    ///
    /// # Panics
    /// If the ensemble cannot be started.
    pub fn shared_ensemble() -> &'static Self {
        static ENSEMBLE: OnceLock<Result<ZookeeperEnsemble, String>> = OnceLock::new();
        shared(&ENSEMBLE, || Self::start(ENSEMBLE_MEMBERS))
    }

    /// One start on fresh ports. The outer error is final; the inner one (a member exited
    /// early, e.g. a port was taken) is worth a retry.
    fn try_start(
        java: &Path,
        class_path: &str,
        n: usize,
        security: Option<(&TestCa, &Security)>,
        quorum_relays: bool,
    ) -> Result<Result<Self>> {
        let ports = process::free_ports(3 * n + usize::from(security.is_some()))?;
        let dir = TempDir::new("zookeeper", ports[0], None)?;
        let (secure, jvm_options) = match security {
            Some((ca, security)) => {
                let (text, options) = secure_settings(dir.path(), ca, security, ports[3 * n])?;
                (Some((text, ports[3 * n])), options)
            }
            None => (None, Vec::new()),
        };
        let mut relays = Vec::new();
        if quorum_relays {
            for from in 0..n {
                for to in (0..n).filter(|&to| to != from) {
                    // Patient: a follower that reaches a new leader before it listens waits, as
                    // it would retry a refused connect; a closed one restarts the election.
                    let quorum = format!("127.0.0.1:{}", ports[3 * to + 1]);
                    let relay = FreezableRelay::start_patient(&quorum)?;
                    relays.push(QuorumRelay { from, to, relay });
                }
            }
        }
        // Member `from`'s `server.N` lines: its own quorum port, and each other member's as it
        // reaches it (through its relay, if any).
        let servers = |from: usize| -> String {
            (0..n)
                .filter(|_| n > 1)
                .map(|to| {
                    let quorum = relays
                        .iter()
                        .find(|r| r.from == from && r.to == to)
                        .map_or(ports[3 * to + 1], |r| r.relay.port());
                    format!(
                        "server.{}=127.0.0.1:{}:{}\n",
                        to + 1,
                        quorum,
                        ports[3 * to + 2]
                    )
                })
                .collect()
        };
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let data = dir.path().join(format!("m{}.data", i + 1));
            std::fs::create_dir_all(&data)?;
            std::fs::write(data.join("myid"), format!("{}\n", i + 1))?;
            let config = dir.path().join(format!("m{}.cfg", i + 1));
            let mut text = config_text(&data, ports[3 * i], &servers(i));
            if let Some((secure, _)) = &secure {
                text.push_str(secure);
            }
            std::fs::write(&config, text)?;
            members.push(Member {
                proc: Proc::none(),
                id: i + 1,
                client_port: ports[3 * i],
                config,
                log: dir.path().join(format!("m{}.log", i + 1)),
            });
        }
        let mut ensemble = ZookeeperEnsemble {
            members,
            quorum_relays: relays,
            java: java.to_path_buf(),
            class_path: class_path.to_owned(),
            secure_port: secure.map(|(_, port)| port),
            jvm_options,
            dir,
        };
        for i in 0..n {
            let m = &ensemble.members[i];
            log_marker(&m.log, &format!("starting {}", m.what()));
            let cmd = ensemble.command(i);
            ensemble.members[i].proc = Proc::spawn(cmd, &ensemble.members[i].log)?;
        }
        Ok(ensemble.await_serving()?.map(|()| ensemble))
    }

    /// Waits until the ensemble serves requests ([`serving`](Self::serving)). The outer error
    /// is final (not serving within the ready timeout); the inner one says a member exited.
    fn await_serving(&mut self) -> Result<Result<()>> {
        let start = Instant::now();
        let mut delay = Duration::from_millis(20);
        loop {
            for m in &mut self.members {
                if let Some(status) = m.proc.reap_if_exited() {
                    let reason = format!("it exited ({status}) before the ensemble was ready");
                    return Ok(Err(start_error(&m.what(), reason, &m.log)));
                }
            }
            if self.serving() {
                return Ok(Ok(()));
            }
            if start.elapsed() > process::READY_TIMEOUT {
                let m = &self.members[0];
                let reason = format!("not serving after {:?}", process::READY_TIMEOUT);
                return Err(start_error(&m.what(), reason, &m.log));
            }
            thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(100));
        }
    }

    /// Whether every running, unpaused member serves requests and, in an ensemble, exactly one
    /// of them leads.
    fn serving(&self) -> bool {
        let modes: Vec<Option<String>> = self
            .members
            .iter()
            .filter(|m| m.proc.is_running() && !m.proc.is_paused())
            .map(Member::mode)
            .collect();
        if modes.iter().any(Option::is_none) {
            return false;
        }
        // The secure port opens after the plain one.
        if let Some(port) = self.secure_port {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            if TcpStream::connect_timeout(&addr, WORD_TIMEOUT).is_err() {
                return false;
            }
        }
        self.members.len() == 1
            || modes
                .iter()
                .filter(|m| m.as_deref() == Some("leader"))
                .count()
                == 1
    }

    fn command(&self, i: usize) -> Command {
        let m = &self.members[i];
        let mut cmd = Command::new(&self.java);
        cmd.arg("-cp")
            .arg(&self.class_path)
            // A small, quickly started JVM: the tests start several.
            .args([
                "-Xms16m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg("-Djava.net.preferIPv4Stack=true")
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg(format!(
                "-Dznode.container.checkIntervalMs={}",
                CONTAINER_SWEEP.as_millis()
            ))
            // Quorum connections to a member that is down give up after 1 s, not 5 s, so an
            // election after a kill is quick.
            .arg("-Dzookeeper.cnxTimeout=1000")
            .args(&self.jvm_options)
            .arg(MAIN)
            .arg(&m.config)
            .current_dir(self.dir.path());
        cmd
    }

    /// The client endpoints, `127.0.0.1:PORT`, one per member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The URL form the store crate reads: `zookeeper://h:p[,h:p…]`.
    pub fn url(&self) -> String {
        format!("zookeeper://{}", self.endpoints().join(","))
    }

    /// `zookeepers://127.0.0.1:SECURE_PORT` of a server started with TLS
    /// ([`start_secure`](Self::start_secure)), no options; `None` without TLS.
    pub fn tls_url(&self) -> Option<String> {
        self.secure_port
            .map(|port| format!("zookeepers://127.0.0.1:{port}"))
    }

    /// The number of members.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s process id, `None` if killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(|m| m.proc.pid())
    }

    /// The index of the member that leads (0 for a standalone server), waiting up to 20 s for
    /// a running, unpaused member to say `Mode: leader`.
    pub fn leader(&self) -> Result<usize> {
        if self.members.len() == 1 {
            return Ok(0);
        }
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            let leader = self.members.iter().position(|m| {
                m.proc.is_running() && !m.proc.is_paused() && m.mode().as_deref() == Some("leader")
            });
            if let Some(i) = leader {
                return Ok(i);
            }
            if Instant::now() > deadline {
                return Err(Error::Start {
                    server: "a ZooKeeper ensemble".into(),
                    reason: format!("no member leads after {LEADER_TIMEOUT:?}"),
                    log_tail: process::log_tail(&self.members[0].log),
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes member `i` (`SIGSTOP`).
    pub fn pause(&self, i: usize) -> Result<()> {
        let m = self.member(i)?;
        m.proc.pause(&m.what())
    }

    /// Lets a paused member `i` run again (`SIGCONT`).
    pub fn resume(&self, i: usize) -> Result<()> {
        let m = self.member(i)?;
        m.proc.resume(&m.what())
    }

    /// Kills member `i` (`SIGKILL`) and reaps it; it stays down until
    /// [`restart`](Self::restart).
    pub fn kill(&mut self, i: usize) -> Result<()> {
        self.member(i)?;
        self.members[i].proc.kill();
        Ok(())
    }

    /// Kills member `i` if it is running and starts it again with the same ports and data
    /// directory, then waits until it serves requests (which in an ensemble needs a quorum
    /// running).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.member(i)?;
        self.members[i].proc.kill();
        let cmd = self.command(i);
        let m = &mut self.members[i];
        log_marker(&m.log, &format!("restarting {}", m.what()));
        m.proc = Proc::spawn(cmd, &m.log)?;
        let port = m.client_port;
        let what = m.what();
        process::wait_ready(&mut m.proc, &what, &m.log, || {
            four_letter_word(port, "srvr").is_some_and(|a| a.contains("Mode: "))
        })
    }

    /// [`restart`](Self::restart)s member `i` with `max` as its `maxSessionTimeout`: a client
    /// that reconnects to it negotiates its session again, and gets at most `max`.
    pub fn restart_with_max_session_timeout(&mut self, i: usize, max: Duration) -> Result<()> {
        let config = self.member(i)?.config.clone();
        let text: String = std::fs::read_to_string(&config)?
            .lines()
            .map(|line| match line.starts_with("maxSessionTimeout=") {
                true => format!("maxSessionTimeout={}\n", max.as_millis()),
                false => format!("{line}\n"),
            })
            .collect();
        std::fs::write(&config, text)?;
        self.restart(i)
    }

    /// Kills every member (`SIGKILL`) and starts them all again with the same ports and data
    /// directories, then waits until the ensemble serves requests: a full restart, which
    /// [`restart`](Self::restart) of one member at a time cannot do (a member alone has no
    /// quorum, so it never serves).
    pub fn restart_all(&mut self) -> Result<()> {
        for m in &mut self.members {
            m.proc.kill();
        }
        for i in 0..self.members.len() {
            let cmd = self.command(i);
            let m = &mut self.members[i];
            log_marker(
                &m.log,
                &format!("restarting {} (the whole ensemble)", m.what()),
            );
            m.proc = Proc::spawn(cmd, &m.log)?;
        }
        self.await_serving()?
    }

    /// The members with a client connection whose negotiated session timeout is `timeout`
    /// (the `to=` of each connection `cons` lists): where a client's session is served, when
    /// its timeout is the only one of its length.
    pub fn members_serving_timeout(&self, timeout: Duration) -> Vec<usize> {
        let needle = format!(",to={},", timeout.as_millis());
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.proc.is_running() && !m.proc.is_paused())
            .filter(|(_, m)| {
                four_letter_word(m.client_port, "cons").is_some_and(|cons| cons.contains(&needle))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Cuts member `i` off from the quorum (`true`: every quorum relay to and from it frozen,
    /// so a follower hears nothing more from its leader, nor the leader from it, while the
    /// member's own clients stay connected to it) or mends the cut (`false`). The member
    /// notices after [`SYNC_LIMIT_TICKS`] ticks and stops serving its clients until it rejoins.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on an ensemble started without quorum relays.
    pub fn isolate(&self, i: usize, isolated: bool) -> Result<()> {
        for relay in self.quorum_relays_of(i)? {
            relay.freeze(isolated);
        }
        Ok(())
    }

    /// Delays every byte of member `i`'s quorum traffic by `delay` each way (zero: none), so
    /// a follower applies each commit `delay` after its leader sent it, and every request it
    /// forwards reaches the leader `delay` late.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on an ensemble started without quorum relays.
    pub fn delay_quorum(&self, i: usize, delay: Duration) -> Result<()> {
        for relay in self.quorum_relays_of(i)? {
            relay.set_delay(delay);
        }
        Ok(())
    }

    /// The relays of member `i`'s quorum traffic: those it reaches the others through, and
    /// those they reach it through.
    fn quorum_relays_of(&self, i: usize) -> Result<impl Iterator<Item = &FreezableRelay>> {
        self.member(i)?;
        if self.quorum_relays.is_empty() {
            return Err(Error::Unsupported(
                "this ensemble was started without quorum relays (start_with_quorum_relays)".into(),
            ));
        }
        Ok(self
            .quorum_relays
            .iter()
            .filter(move |r| r.from == i || r.to == i)
            .map(|r| &r.relay))
    }

    /// Whether member `i` serves its clients now (`srvr` names its mode): a member cut off
    /// from the quorum stops once it notices, and serves again once it has rejoined.
    pub fn is_serving(&self, i: usize) -> bool {
        self.members.get(i).is_some_and(|m| m.mode().is_some())
    }

    /// The requests member `i` has received from its clients and not yet answered (`mntr`'s
    /// `zk_outstanding_requests`); `None` while it does not answer.
    pub fn outstanding_requests(&self, i: usize) -> Option<u64> {
        let m = self.members.get(i)?;
        four_letter_word(m.client_port, "mntr")?
            .lines()
            .find_map(|line| line.strip_prefix("zk_outstanding_requests"))
            .and_then(|value| value.trim().parse().ok())
    }

    fn member(&self, i: usize) -> Result<&Member> {
        self.members.get(i).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "member index {i} out of range (ensemble of {})",
                self.members.len()
            ))
        })
    }
}

/// `zoo.cfg` of one member.
fn config_text(data: &Path, client_port: u16, servers: &str) -> String {
    format!(
        "tickTime={tick}\n\
         initLimit={INIT_LIMIT_TICKS}\n\
         syncLimit={SYNC_LIMIT_TICKS}\n\
         dataDir={data}\n\
         clientPort={client_port}\n\
         clientPortAddress=127.0.0.1\n\
         minSessionTimeout={min}\n\
         maxSessionTimeout={max}\n\
         forceSync=yes\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr,mntr,ruok,cons,conf\n\
         maxClientCnxns=0\n\
         {servers}",
        tick = TICK.as_millis(),
        data = data.display(),
        min = MIN_SESSION_TIMEOUT.as_millis(),
        max = MAX_SESSION_TIMEOUT.as_millis(),
    )
}

/// The `zoo.cfg` lines and JVM options of `security` on a standalone server whose secure port
/// is `port`, writing the PEM key store and the JAAS file into `dir`.
///
/// ZooKeeper 3.8 reads PEM key and trust stores (`ssl.*.type=PEM`), the key store holding the
/// private key and the certificate in one file. `zoo.cfg` keys it does not know (`ssl.*`,
/// `serverCnxnFactory`, `authProvider.N`) become the `zookeeper.`-prefixed system properties
/// the server reads.
fn secure_settings(
    dir: &Path,
    ca: &TestCa,
    security: &Security,
    port: u16,
) -> Result<(String, Vec<String>)> {
    let mut text = String::new();
    let mut options = Vec::new();
    if let Some(cert) = security.tls {
        let (crt, key) = cert.files(ca);
        let key_store = dir.join("server-keystore.pem");
        let mut pem = std::fs::read(&key)?;
        pem.extend(std::fs::read(&crt)?);
        std::fs::write(&key_store, pem)?;
        let client_auth = if cert.requires_client_cert() {
            "need"
        } else {
            "want"
        };
        text.push_str(&format!(
            "secureClientPort={port}\n\
             secureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={key_store}\n\
             ssl.keyStore.type=PEM\n\
             ssl.trustStore.location={trust}\n\
             ssl.trustStore.type=PEM\n\
             ssl.clientAuth={client_auth}\n",
            key_store = key_store.display(),
            trust = ca.ca_file().display(),
        ));
    }
    if !security.sasl_users.is_empty() {
        let users: String = security
            .sasl_users
            .iter()
            .map(|(user, password)| format!("\n    user_{user}=\"{password}\""))
            .collect();
        let jaas = dir.join("jaas.conf");
        std::fs::write(
            &jaas,
            format!(
                "Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required{users};\n}};\n"
            ),
        )?;
        text.push_str(
            "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n",
        );
        options.push(format!(
            "-Djava.security.auth.login.config={}",
            jaas.display()
        ));
    }
    Ok((text, options))
}

/// The answer to a four-letter word (`srvr`, `mntr`) from the member on `port`.
fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, WORD_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(WORD_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(WORD_TIMEOUT)).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// The ensemble in `cell`, started by `start` on first use; the first start's error otherwise.
fn shared(
    cell: &'static OnceLock<Result<ZookeeperEnsemble, String>>,
    start: impl FnOnce() -> Result<ZookeeperEnsemble>,
) -> &'static ZookeeperEnsemble {
    match cell.get_or_init(|| start().map_err(|e| e.to_string())) {
        Ok(ensemble) => ensemble,
        Err(error) => panic!("{error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standalone_config_has_no_server_lines() {
        let text = config_text(Path::new("/d"), 7, "");
        assert!(text.contains("clientPort=7\n"), "{text}");
        assert!(text.contains("forceSync=yes\n"), "{text}");
        let max = format!("maxSessionTimeout={}\n", MAX_SESSION_TIMEOUT.as_millis());
        assert!(text.contains(&max), "{text}");
        assert!(!text.contains("server."), "{text}");
    }
}
