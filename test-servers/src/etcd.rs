//! `etcd` members on free loopback ports: a single server or a static cluster.

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::process::{self, log_marker, start_error, Proc, TempDir};
use crate::{Error, Result};

const ENV_URL: &str = "LOCK_TEST_ETCD_URL";

/// Raft timing for tests: fast elections, and a minimum lease TTL of 1 s.
const HEARTBEAT_MS: u32 = 10;
const ELECTION_TIMEOUT_MS: u32 = 100;

/// How long [`EtcdCluster::leader`] waits for the members to agree.
const LEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Timeout of one HTTP request to a member.
const HTTP_TIMEOUT: Duration = Duration::from_millis(500);

/// A single-member etcd server for tests (or an external server named by
/// `LOCK_TEST_ETCD_URL`).
///
/// Started with `--heartbeat-interval=10 --election-timeout=100`, so the
/// minimum lease TTL is 1 s. Dropping it kills the process and removes its
/// temporary directory (data and log).
#[derive(Debug)]
pub struct EtcdServer {
    endpoints: Vec<String>,
    cluster: Option<EtcdCluster>,
    /// Set by [`EtcdServer::start_with_auth`].
    auth: Option<Auth>,
}

/// Credentials of a server started with authentication on.
struct Auth {
    etcdctl: PathBuf,
    /// The JWT signing keys (dropped after the member is killed: `EtcdServer` drops `cluster`
    /// first).
    _keys: TempDir,
    /// Every user's password is `{user}-{nonce}`: unique per server, so a test can look for it
    /// in error text.
    nonce: String,
}

impl Auth {
    fn password(&self, user: &str) -> String {
        format!("{user}-{}", self.nonce)
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("etcdctl", &self.etcdctl)
            .field("passwords", &"***")
            .finish()
    }
}

impl EtcdServer {
    /// Starts a fresh single-member server and waits until `/health` reports
    /// `"health":"true"` (or returns a handle to `LOCK_TEST_ETCD_URL`, which
    /// may be `etcd://h:p[,h:p...]`, `http://h:p` or `h:p`).
    ///
    /// Fails with [`Error::MissingBinary`] if `etcd` is not installed.
    pub fn start() -> Result<Self> {
        if let Some(url) = crate::external_url(ENV_URL) {
            let endpoints = parse_endpoints(&url);
            if endpoints.is_empty() {
                return Err(Error::InvalidArgument(format!("{ENV_URL}={url:?}")));
            }
            return Ok(EtcdServer {
                endpoints,
                cluster: None,
                auth: None,
            });
        }
        let cluster = EtcdCluster::start(1)?;
        Ok(EtcdServer {
            endpoints: cluster.endpoints(),
            cluster: Some(cluster),
            auth: None,
        })
    }

    /// The administrator of a server started by [`start_with_auth`](Self::start_with_auth)
    /// (role `root`).
    pub const ROOT_USER: &'static str = "root";
    /// The least-privilege user of [`start_with_auth`](Self::start_with_auth).
    pub const LIMITED_USER: &'static str = "locks";
    /// The role of [`LIMITED_USER`](Self::LIMITED_USER): `readwrite` on the store's prefix,
    /// nothing else.
    pub const LIMITED_ROLE: &'static str = "fencelock";

    /// Starts a fresh local single member (never `LOCK_TEST_ETCD_URL`) with authentication
    /// on and JWT auth tokens (`--auth-token=jwt,…,sign-method=RS256`, as etcd advises for
    /// production; the RSA key is made with `openssl`, Debian package `openssl`): a token
    /// carries the auth store's revision, so after any change to users or roles etcd refuses
    /// every older token until its client fetches a new one. Set up with `etcdctl` (Debian
    /// package `etcd-client`) before auth is enabled, so no step needs credentials:
    ///
    /// ```sh
    /// etcdctl user add root --interactive=false --new-user-password=…
    /// etcdctl role add fencelock
    /// etcdctl role grant-permission fencelock --prefix=true readwrite PREFIX
    /// etcdctl user add locks --interactive=false --new-user-password=…
    /// etcdctl user grant-role locks fencelock
    /// etcdctl auth enable
    /// ```
    ///
    /// (`etcdctl auth enable` gives `root` the `root` role.) The user
    /// [`LIMITED_USER`](Self::LIMITED_USER) has the role [`LIMITED_ROLE`](Self::LIMITED_ROLE)
    /// only, which may read and write the keys under `prefix` and nothing else; see
    /// [`limited_url`](Self::limited_url) and [`root_url`](Self::root_url). [`url`](Self::url)
    /// carries no user: etcd refuses its requests.
    ///
    /// Fails with [`Error::MissingBinary`] if `etcd`, `etcdctl` or `openssl` is not
    /// installed.
    pub fn start_with_auth(prefix: &str) -> Result<Self> {
        let etcdctl = process::find_binary("etcdctl", "etcd-client")?;
        let openssl = process::find_binary("openssl", "openssl")?;
        let keys = TempDir::new("etcd-jwt", 0, None)?;
        let (private, public) = (keys.path().join("jwt.key"), keys.path().join("jwt.pub"));
        for args in [
            vec![
                "genrsa".as_ref(),
                "-out".as_ref(),
                private.as_os_str(),
                "2048".as_ref(),
            ],
            vec![
                "rsa".as_ref(),
                "-in".as_ref(),
                private.as_os_str(),
                "-pubout".as_ref(),
                "-out".as_ref(),
                public.as_os_str(),
            ],
        ] {
            let output = Command::new(&openssl).args(&args).output()?;
            if !output.status.success() {
                return Err(Error::Start {
                    server: "etcd's JWT key (openssl)".into(),
                    reason: format!("openssl {:?} failed", args[0]),
                    log_tail: String::from_utf8_lossy(&output.stderr).into_owned(),
                });
            }
        }
        let token = format!(
            "--auth-token=jwt,pub-key={},priv-key={},sign-method=RS256,ttl=10m",
            public.display(),
            private.display()
        );
        let cluster = EtcdCluster::start_with_args(1, vec![token])?;
        let server = EtcdServer {
            endpoints: cluster.endpoints(),
            cluster: Some(cluster),
            auth: Some(Auth {
                etcdctl,
                _keys: keys,
                nonce: nonce(),
            }),
        };
        let (root, limited, role) = (Self::ROOT_USER, Self::LIMITED_USER, Self::LIMITED_ROLE);
        server.etcdctl(
            None,
            &["user", "add", root, "--interactive=false"],
            Some(root),
        )?;
        server.etcdctl(None, &["role", "add", role], None)?;
        let grant = [
            "role",
            "grant-permission",
            role,
            "--prefix=true",
            "readwrite",
            prefix,
        ];
        server.etcdctl(None, &grant, None)?;
        let add = ["user", "add", limited, "--interactive=false"];
        server.etcdctl(None, &add, Some(limited))?;
        server.etcdctl(None, &["user", "grant-role", limited, role], None)?;
        server.etcdctl(None, &["auth", "enable"], None)?;
        Ok(server)
    }

    /// `etcd://locks:PASSWORD@127.0.0.1:PORT`: the least-privilege user of
    /// [`start_with_auth`](Self::start_with_auth); `None` without authentication.
    pub fn limited_url(&self) -> Option<String> {
        self.user_url(Self::LIMITED_USER)
    }

    /// `etcd://root:PASSWORD@127.0.0.1:PORT`: the administrator of a server started by
    /// [`start_with_auth`](Self::start_with_auth); `None` without authentication.
    pub fn root_url(&self) -> Option<String> {
        self.user_url(Self::ROOT_USER)
    }

    /// `etcd://USER:PASSWORD@127.0.0.1:PORT` for a user of this server (one made by
    /// [`start_with_auth`](Self::start_with_auth) or [`add_user`](Self::add_user)); `None`
    /// without authentication.
    pub fn user_url(&self, user: &str) -> Option<String> {
        let auth = self.auth.as_ref()?;
        Some(format!(
            "etcd://{user}:{}@{}",
            auth.password(user),
            self.endpoints.join(",")
        ))
    }

    /// Adds (as `root`) a role `{user}-role` with `grants`, each `(permission, key prefix)`
    /// with `permission` one of `read`, `write`, `readwrite` (`etcdctl role grant-permission
    /// {user}-role --prefix=true PERMISSION PREFIX`), and a user `user` with that role only.
    /// Returns its URL, as [`user_url`](Self::user_url). Fails with [`Error::Unsupported`] on
    /// a server without authentication.
    pub fn add_user(&self, user: &str, grants: &[(&str, &str)]) -> Result<String> {
        if self.auth.is_none() {
            return Err(Error::Unsupported(format!(
                "add_user on the etcd server at {} (started without authentication)",
                self.endpoints[0]
            )));
        }
        let role = format!("{user}-role");
        let root = Some(Self::ROOT_USER);
        self.etcdctl(root, &["role", "add", &role], None)?;
        for (permission, prefix) in grants {
            let grant = [
                "role",
                "grant-permission",
                &role,
                "--prefix=true",
                permission,
                prefix,
            ];
            self.etcdctl(root, &grant, None)?;
        }
        self.etcdctl(
            root,
            &["user", "add", user, "--interactive=false"],
            Some(user),
        )?;
        self.etcdctl(root, &["user", "grant-role", user, &role], None)?;
        Ok(self.user_url(user).expect("a server with authentication"))
    }

    /// Runs `etcdctl --endpoints=… ARGS` on a server started with authentication, as
    /// `as_user` if given (with its password), and with `--new-user-password=` the password of
    /// `new_user` if given; gives its standard output. No password appears in the error.
    fn etcdctl(
        &self,
        as_user: Option<&str>,
        args: &[&str],
        new_user: Option<&str>,
    ) -> Result<String> {
        let auth = self.auth.as_ref().ok_or_else(|| {
            Error::Unsupported("etcdctl on a server without authentication".into())
        })?;
        let mut cmd = Command::new(&auth.etcdctl);
        cmd.arg(format!("--endpoints={}", self.endpoints.join(",")))
            .arg("--dial-timeout=10s")
            .arg("--command-timeout=20s")
            .args(args)
            .stdin(Stdio::null());
        if let Some(user) = as_user {
            cmd.arg(format!("--user={user}"))
                .arg(format!("--password={}", auth.password(user)));
        }
        if let Some(user) = new_user {
            cmd.arg(format!("--new-user-password={}", auth.password(user)));
        }
        let output = cmd.output()?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        Err(Error::Etcd(format!(
            "`etcdctl {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }

    /// The client endpoint `127.0.0.1:PORT` (the first one, if external).
    pub fn endpoint(&self) -> String {
        self.endpoints[0].clone()
    }

    /// The URL form used by the store crates: `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints.join(","))
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        crate::url_port(&self.endpoints[0], 2379)
    }

    /// True if this handle points at a server given by `LOCK_TEST_ETCD_URL`.
    pub fn is_external(&self) -> bool {
        self.cluster.is_none()
    }

    /// The server's process id, `None` if external or killed.
    pub fn pid(&self) -> Option<u32> {
        self.cluster.as_ref().and_then(|c| c.pid(0))
    }

    /// Freezes the server (`SIGSTOP`).
    pub fn pause(&self) -> Result<()> {
        self.cluster("pause")?.pause(0)
    }

    /// Lets a paused server run again (`SIGCONT`).
    pub fn resume(&self) -> Result<()> {
        self.cluster("resume")?.resume(0)
    }

    /// Kills the server (`SIGKILL`) and reaps it; it stays down until
    /// [`restart`](Self::restart).
    pub fn kill(&mut self) -> Result<()> {
        self.cluster_mut("kill")?.kill(0)
    }

    /// Kills the server if it is running and starts it again on the same port
    /// with the same data directory (data survives), then waits until healthy.
    pub fn restart(&mut self) -> Result<()> {
        self.cluster_mut("restart")?.restart(0)
    }

    fn cluster(&self, op: &str) -> Result<&EtcdCluster> {
        self.cluster.as_ref().ok_or_else(|| {
            Error::Unsupported(format!("{op} on the etcd server at {}", self.endpoints[0]))
        })
    }

    fn cluster_mut(&mut self, op: &str) -> Result<&mut EtcdCluster> {
        let endpoint = &self.endpoints[0];
        self.cluster
            .as_mut()
            .ok_or_else(|| Error::Unsupported(format!("{op} on the etcd server at {endpoint}")))
    }
}

/// A static etcd cluster on loopback, each member with its own free peer and
/// client ports, data directory and log (all in one temporary directory).
///
/// Always started locally, whatever `LOCK_TEST_ETCD_URL` says. Dropping it
/// kills every member and removes the temporary directory.
#[derive(Debug)]
pub struct EtcdCluster {
    // Dropped (killed) before `dir` is removed.
    members: Vec<Member>,
    binary: PathBuf,
    initial_cluster: String,
    token: String,
    /// More `etcd` arguments for every member (authentication's token settings).
    extra_args: Vec<String>,
    dir: TempDir,
}

#[derive(Debug)]
struct Member {
    proc: Proc,
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    /// The raft member id, as reported by the member itself.
    id: u64,
}

impl Member {
    fn what(&self) -> String {
        format!(
            "etcd member {} on 127.0.0.1:{}",
            self.name, self.client_port
        )
    }

    /// `(member_id, leader)` from `/v3/maintenance/status`.
    fn status(&self) -> Option<(u64, u64)> {
        let body = http(self.client_port, "POST", "/v3/maintenance/status", "{}")?;
        let id = json_field(&body, "member_id").or_else(|| json_field(&body, "memberId"))?;
        let leader = json_field(&body, "leader").unwrap_or_default();
        Some((id.parse().ok()?, leader.parse().unwrap_or(0)))
    }
}

impl EtcdCluster {
    /// Starts a cluster of `members` members (static bootstrap,
    /// `--initial-cluster-state new`) and waits until every member is healthy.
    ///
    /// The installed etcd's version (as `"3.4.23"`), from `etcd --version`.
    pub fn version() -> Result<String> {
        let binary = process::find_binary("etcd", "etcd-server")?;
        let output = std::process::Command::new(binary)
            .arg("--version")
            .output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .find_map(|line| line.strip_prefix("etcd Version:"))
            .map(|version| version.trim().to_owned())
            .ok_or_else(|| Error::InvalidArgument(format!("etcd --version said {text:?}")))
    }

    /// Fails with [`Error::MissingBinary`] if `etcd` is not installed.
    pub fn start(members: usize) -> Result<Self> {
        Self::start_with_args(members, Vec::new())
    }

    /// [`start`](Self::start) with more `etcd` arguments for every member (kept for restarts).
    fn start_with_args(members: usize, extra_args: Vec<String>) -> Result<Self> {
        if members == 0 {
            return Err(Error::InvalidArgument(
                "an etcd cluster needs at least one member".into(),
            ));
        }
        let binary = process::find_binary("etcd", "etcd-server")?;
        let mut last_error = None;
        for _ in 0..process::START_ATTEMPTS {
            match Self::try_start(&binary, members, &extra_args)? {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// One start on fresh ports. The outer error is final; the inner one
    /// (a member exited early, e.g. a port was taken) is worth a retry.
    fn try_start(
        binary: &std::path::Path,
        n: usize,
        extra_args: &[String],
    ) -> Result<Result<Self>> {
        let ports = process::free_ports(2 * n)?;
        let dir = TempDir::new("etcd", ports[0], None)?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                proc: Proc::none(),
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.path().join(format!("m{i}.data")),
                log: dir.path().join(format!("m{i}.log")),
                id: 0,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = dir
            .path()
            .file_name()
            .map_or_else(|| "fencelock".into(), |n| n.to_string_lossy().into_owned());
        let mut cluster = EtcdCluster {
            members,
            binary: binary.to_path_buf(),
            initial_cluster,
            token,
            extra_args: extra_args.to_vec(),
            dir,
        };
        for i in 0..n {
            let m = &cluster.members[i];
            log_marker(&m.log, &format!("starting {}", m.what()));
            let cmd = cluster.command(i);
            cluster.members[i].proc = Proc::spawn(cmd, &cluster.members[i].log)?;
        }

        // Wait until every member is healthy (has a leader and serves reads).
        let start = Instant::now();
        let mut pending: Vec<usize> = (0..n).collect();
        let mut delay = Duration::from_millis(5);
        while !pending.is_empty() {
            for m in &mut cluster.members {
                if let Some(status) = m.proc.reap_if_exited() {
                    let reason = format!("it exited ({status}) before the cluster was ready");
                    return Ok(Err(start_error(&m.what(), reason, &m.log)));
                }
            }
            pending.retain(|&i| !healthy(cluster.members[i].client_port));
            if pending.is_empty() {
                break;
            }
            if start.elapsed() > process::READY_TIMEOUT {
                let m = &cluster.members[pending[0]];
                let reason = format!("not healthy after {:?}", process::READY_TIMEOUT);
                return Err(start_error(&m.what(), reason, &m.log));
            }
            thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(100));
        }

        // Learn each member's raft id, for `leader()`.
        for m in &mut cluster.members {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some((id, _)) = m.status() {
                    m.id = id;
                    break;
                }
                if Instant::now() > deadline {
                    let reason = "no answer to /v3/maintenance/status";
                    return Err(start_error(&m.what(), reason, &m.log));
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(Ok(cluster))
    }

    fn command(&self, i: usize) -> Command {
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new(&self.binary);
        cmd.arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", m.data_dir.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--heartbeat-interval={HEARTBEAT_MS}"))
            .arg(format!("--election-timeout={ELECTION_TIMEOUT_MS}"))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .args(&self.extra_args)
            .current_dir(self.dir.path());
        // etcd refuses to start on architectures it does not officially
        // support unless this names the architecture (GOARCH spelling).
        if std::env::var_os("ETCD_UNSUPPORTED_ARCH").is_none() {
            if let Some(goarch) = unsupported_goarch() {
                cmd.env("ETCD_UNSUPPORTED_ARCH", goarch);
            }
        }
        cmd
    }

    /// The client endpoints, `127.0.0.1:PORT`, one per member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The URL form used by the store crates: `etcd://h:p,h:p,h:p`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The number of members.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s process id, `None` if killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(|m| m.proc.pid())
    }

    /// The index of the current leader, as agreed by every member that is
    /// running and not paused. Waits up to 10 s for such an agreement on a
    /// leader that is itself running and not paused (e.g. while an election
    /// after pausing the old leader is under way).
    pub fn leader(&self) -> Result<usize> {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        let mut last = String::from("no member answered");
        loop {
            let live: Vec<&Member> = self
                .members
                .iter()
                .filter(|m| m.proc.is_running() && !m.proc.is_paused())
                .collect();
            let views: Vec<u64> = live
                .iter()
                .filter_map(|m| m.status())
                .map(|s| s.1)
                .collect();
            if let Some(&leader) = views.first() {
                last = format!("members report leaders {views:?}");
                let index = self.members.iter().position(|m| m.id == leader);
                if leader != 0 && views.iter().all(|&l| l == leader) {
                    if let Some(i) = index {
                        let m = &self.members[i];
                        if m.proc.is_running() && !m.proc.is_paused() {
                            return Ok(i);
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Etcd(format!(
                    "no agreed, live leader after {LEADER_TIMEOUT:?} ({last}; member ids {:?})",
                    self.members.iter().map(|m| m.id).collect::<Vec<_>>()
                )));
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

    /// Kills member `i` if it is running and starts it again with the same
    /// ports and data directory. If a quorum of members (counting this one)
    /// is running and not paused, waits until the member is healthy;
    /// otherwise only until it answers HTTP.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.member(i)?;
        self.members[i].proc.kill();
        let cmd = self.command(i);
        let m = &mut self.members[i];
        log_marker(&m.log, &format!("restarting {}", m.what()));
        m.proc = Proc::spawn(cmd, &m.log)?;
        let others_live = self
            .members
            .iter()
            .enumerate()
            .filter(|&(j, m)| j != i && m.proc.is_running() && !m.proc.is_paused())
            .count();
        let quorum = 2 * (others_live + 1) > self.members.len();
        let m = &mut self.members[i];
        let (what, port) = (m.what(), m.client_port);
        process::wait_ready(&mut m.proc, &what, &m.log, || {
            if quorum {
                healthy(port)
            } else {
                answers(port)
            }
        })
    }

    fn member(&self, i: usize) -> Result<&Member> {
        self.members.get(i).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "member index {i} out of range (cluster of {})",
                self.members.len()
            ))
        })
    }
}

/// A hard-to-guess text for this server's passwords (no randomness crate: the clock, the
/// process id and a counter, hashed).
fn nonce() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("pw{:016x}", hasher.finish())
}

/// GOARCH of this machine if etcd 3.4 needs `ETCD_UNSUPPORTED_ARCH` for it.
pub(crate) fn unsupported_goarch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => None,
        "aarch64" => Some("arm64"),
        "x86" => Some("386"),
        "arm" => Some("arm"),
        "powerpc64" if cfg!(target_endian = "little") => Some("ppc64le"),
        "powerpc64" => Some("ppc64"),
        "s390x" => Some("s390x"),
        "riscv64" => Some("riscv64"),
        "mips64" if cfg!(target_endian = "little") => Some("mips64le"),
        "mips64" => Some("mips64"),
        "loongarch64" => Some("loong64"),
        other => Some(other),
    }
}

/// True if the member on `port` reports `"health":"true"` on `/health`.
pub(crate) fn healthy(port: u16) -> bool {
    http(port, "GET", "/health", "")
        .and_then(|body| json_field(&body, "health"))
        .is_some_and(|h| h == "true")
}

/// True if the member on `port` answers HTTP at all (healthy or not).
fn answers(port: u16) -> bool {
    http_status(port, "GET", "/health", "").is_some()
}

/// Endpoints `h:p` from `etcd://h:p,h:p`, `http://h:p/` or `h:p,h:p`.
fn parse_endpoints(url: &str) -> Vec<String> {
    url.split(',')
        .map(|e| {
            let e = e.trim();
            let e = e.split_once("://").map_or(e, |(_, rest)| rest);
            e.trim_end_matches('/').to_string()
        })
        .filter(|e| !e.is_empty())
        .collect()
}

/// The body of a 200 response to an HTTP/1.0 request to 127.0.0.1:`port`.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    match http_status(port, method, path, body)? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// `(status, body)` of an HTTP/1.0 request (HTTP/1.0, so the response is
/// neither chunked nor kept alive).
fn http_status(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The value of the first `"key": value` in a JSON text, as a string
/// (quoted strings unquoted; numbers and literals as written).
fn json_field(json: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\"");
    let at = json.find(&pattern)? + pattern.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(quoted) = rest.strip_prefix('"') {
        return Some(quoted[..quoted.find('"')?].to_string());
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.')))
        .unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields() {
        let status = r#"{"header":{"cluster_id":"1","member_id":"10276657743932975437","raft_term":"2"},"version":"3.4.23","leader":"10276657743932975437","raftIndex": 4}"#;
        assert_eq!(
            json_field(status, "member_id").as_deref(),
            Some("10276657743932975437")
        );
        assert_eq!(
            json_field(status, "leader").as_deref(),
            Some("10276657743932975437")
        );
        assert_eq!(json_field(status, "raftIndex").as_deref(), Some("4"));
        assert_eq!(json_field(status, "nope"), None);
        assert_eq!(
            json_field(r#"{"health":"true","reason":""}"#, "health").as_deref(),
            Some("true")
        );
    }

    #[test]
    fn endpoints_from_urls() {
        assert_eq!(
            parse_endpoints("etcd://127.0.0.1:1,127.0.0.1:2"),
            ["127.0.0.1:1", "127.0.0.1:2"]
        );
        assert_eq!(parse_endpoints("http://h:2379/"), ["h:2379"]);
        assert_eq!(parse_endpoints("h:1, http://h:2"), ["h:1", "h:2"]);
    }
}
